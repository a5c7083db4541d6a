#!/bin/bash
# coral-hpc engine launch: single node, tensor parallel over 2 × a100
# replica single-1 of qwen3-8b (template t-single), rendered by coral_hpc.launch.
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
ENGINE=(vllm serve Qwen/Qwen3-8B)
FLAGS=(
  --served-model-name qwen3-8b
  --tensor-parallel-size 2
  --pipeline-parallel-size 1
  --dtype auto
  --max-model-len 8192
  --host 0.0.0.0
  --port 24001
  --shutdown-timeout 55
  --enable-prefix-caching
)
# SIGUSR2 (the daemon's drain and Slurm's walltime warning) reaches every process of the step: the
# engine ignores it and the entrypoint turns it into one SIGTERM to the API server, which drains.
trap '' USR2
exec "${ENGINE[@]}" "${FLAGS[@]}"
