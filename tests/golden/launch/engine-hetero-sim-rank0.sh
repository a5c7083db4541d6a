#!/bin/bash
# coral-hpc engine launch: heterogeneous pipeline, stages 0=a100×2/48 layers, 1=v100×2/32 layers;
# node rank 0 of 2 (head: serves the API), with vLLM's own multi-node flags.
# replica hetero-1 of llama-70b (template t-hetero), rendered by coral_hpc.launch.
# The API key (VLLM_API_KEY) and the Hugging Face token (HF_TOKEN) arrive in the environment only.
# environment: the sim engine (no GPU, no real inference), run by the daemon's python
set -eo pipefail
ENGINE=(/opt/coral/venv/bin/python -m coral_hpc.engine.sim meta-llama/Llama-3.1-70B-Instruct --sim-arch llama-3.1-70b --sim-gpu-types a100,v100 --sim-layers 48,32 --sim-drain-timeout 55)
# Uneven layer split: stage i holds the i-th count, so faster GPUs carry more layers.
export VLLM_PP_LAYER_PARTITION=48,32
FLAGS=(
  --served-model-name llama-70b
  --tensor-parallel-size 2
  --pipeline-parallel-size 2
  --dtype half
  --max-model-len 8192
  --host 0.0.0.0
  --port 24001
)
# SIGUSR2 (the daemon's drain and Slurm's walltime warning) reaches every process of the step: the
# engine ignores it and the entrypoint turns it into one SIGTERM to the API server, which drains.
trap '' USR2
exec "${ENGINE[@]}" "${FLAGS[@]}"
