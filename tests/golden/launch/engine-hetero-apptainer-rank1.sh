#!/bin/bash
# coral-hpc engine launch: heterogeneous pipeline, stages 0=a100×2/48 layers, 1=v100×2/32 layers;
# node rank 1 of 2 (headless worker), with vLLM's own multi-node flags.
# replica hetero-1 of llama-70b (template t-hetero), rendered by coral_hpc.launch.
# The API key (VLLM_API_KEY) and the Hugging Face token (HF_TOKEN) arrive in the environment only.
# environment: apptainer image /shared/images/vllm-0.33.0.sif
set -eo pipefail
# `module` is a shell function that batch shells may lack: load the site's init script first.
if ! type module >/dev/null 2>&1; then
  for init in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh /usr/share/lmod/lmod/init/bash; do
    if [ -r "$init" ]; then . "$init"; break; fi
  done
fi
module load apptainer
# --nv maps the job's GPUs (CUDA_VISIBLE_DEVICES) into the container; the host environment,
# VLLM_API_KEY and HF_TOKEN included, passes through (no --cleanenv).
ENGINE=(apptainer exec --nv --bind /shared/hf-cache:/root/.cache/huggingface /shared/images/vllm-0.33.0.sif vllm serve meta-llama/Llama-3.1-70B-Instruct)
# Uneven layer split: stage i holds the i-th count, so faster GPUs carry more layers.
export VLLM_PP_LAYER_PARTITION=48,32
FLAGS=(
  --served-model-name llama-70b
  --tensor-parallel-size 2
  --pipeline-parallel-size 2
  --dtype half
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
