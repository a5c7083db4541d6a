#!/bin/bash
# coral-hpc engine launch: pipeline over 2 identical nodes (2 × a100 each),
# node rank 0 of 2 (head: serves the API), with vLLM's own multi-node flags.
# replica multinode-1 of llama-70b (template t-multinode), rendered by coral_hpc.launch.
# The API key (VLLM_API_KEY) and the Hugging Face token (HF_TOKEN) arrive in the environment only.
# environment: the sim engine (no GPU, no real inference), run by the daemon's python
set -eo pipefail
ENGINE=(/opt/coral/venv/bin/python -m coral_hpc.engine.sim meta-llama/Llama-3.1-70B-Instruct --sim-arch llama-3.1-70b --sim-gpu-types a100,a100 --sim-layers 40,40 --sim-drain-timeout 55)
export VLLM_PP_LAYER_PARTITION=40,40
FLAGS=(
  --served-model-name llama-70b
  --tensor-parallel-size 2
  --pipeline-parallel-size 2
  --dtype auto
  --max-model-len 8192
  --host 0.0.0.0
  --port 24001
)
# SIGUSR2 (the daemon's drain and Slurm's walltime warning) reaches every process of the step: the
# engine ignores it and the entrypoint turns it into one SIGTERM to the API server, which drains.
trap '' USR2
exec "${ENGINE[@]}" "${FLAGS[@]}"
