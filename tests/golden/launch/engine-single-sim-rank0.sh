#!/bin/bash
# coral-hpc engine launch: single node, tensor parallel over 2 × a100
# replica single-1 of qwen3-8b (template t-single), rendered by coral_hpc.launch.
# The API key (VLLM_API_KEY) and the Hugging Face token (HF_TOKEN) arrive in the environment only.
# environment: the sim engine (no GPU, no real inference), run by the daemon's python
set -eo pipefail
ENGINE=(/opt/coral/venv/bin/python -m coral_hpc.engine.sim Qwen/Qwen3-8B --sim-arch qwen3-8b --sim-gpu-types a100 --sim-layers 36 --sim-drain-timeout 55)
FLAGS=(
  --served-model-name qwen3-8b
  --tensor-parallel-size 2
  --pipeline-parallel-size 1
  --dtype auto
  --max-model-len 8192
  --host 0.0.0.0
  --port 24001
)
# SIGUSR2 (the daemon's drain and Slurm's walltime warning) reaches every process of the step: the
# engine ignores it and the entrypoint turns it into one SIGTERM to the API server, which drains.
trap '' USR2
exec "${ENGINE[@]}" "${FLAGS[@]}"
