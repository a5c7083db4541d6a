#!/bin/bash
# coral-hpc engine launch: pipeline over 2 identical nodes (2 × a100 each),
# node rank 1 of 2 (headless worker), with vLLM's own multi-node flags.
# replica multinode-1 of llama-70b (template t-multinode), rendered by coral_hpc.launch.
# The API key (VLLM_API_KEY) and the Hugging Face token (HF_TOKEN) arrive in the environment only.
# environment: venv /shared/envs/vllm-0.33.0
set -eo pipefail
# `module` is a shell function that batch shells may lack: load the site's init script first.
if ! type module >/dev/null 2>&1; then
  for init in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh /usr/share/lmod/lmod/init/bash; do
    if [ -r "$init" ]; then . "$init"; break; fi
  done
fi
module load cuda/12.8
source /shared/envs/vllm-0.33.0/bin/activate
ENGINE=(vllm serve meta-llama/Llama-3.1-70B-Instruct)
export VLLM_PP_LAYER_PARTITION=40,40
FLAGS=(
  --served-model-name llama-70b
  --tensor-parallel-size 2
  --pipeline-parallel-size 2
  --dtype auto
  --max-model-len 8192
  --nnodes 2
  --node-rank 1
  --master-addr gpu-a100-01
  --master-port 24002
  --headless
  --shutdown-timeout 55
  --enable-prefix-caching
)
# SIGUSR2 (the daemon's drain and Slurm's walltime warning) reaches every process of the step: the
# engine ignores it and the entrypoint turns it into one SIGTERM to the API server, which drains.
trap '' USR2
exec "${ENGINE[@]}" "${FLAGS[@]}"
