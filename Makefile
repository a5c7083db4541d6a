# Two commands, as in the README, on a throwaway Debian/Ubuntu machine (as root: they install
# Slurm and start a local cluster):
#   make demo   install what is missing, create .venv, bring up the local Slurm cluster, run coral-hpc
#               on it: the main job on the embedded default (examples/models.yaml, the sim engine)
#   make test   the same set-up, then the whole test suite in lanes, each timed (scripts/test-lanes:
#               unit, beside it the cluster, its twin, vLLM's CPU build and test models, cached in
#               /var/cache/coral-hpc; e2e; then the real engine on the cluster in the background
#               while slow and integration run, integration on the twin)
#   make demo-vllm   make demo on the real engine (vLLM's CPU build, generated models)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CLUSTER := scripts/dev-cluster
export SLURM_CONF ?= /var/tmp/coral-dev-cluster/etc/slurm.conf

.PHONY: demo demo-vllm test test-serve-vllm test-replacement test-vllm vllm-env unit integration venv cluster cluster-down lint wheel-check clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py
	@$(PYTHON) -m venv --help >/dev/null 2>&1 && $(PYTHON) -c 'import ensurepip' 2>/dev/null || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv python3-pip; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

cluster:
	$(CLUSTER) up

cluster-down:
	$(CLUSTER) down
	$(CLUSTER) down --twin

demo: venv cluster
	@scripts/demo

# the real engine: vLLM's CPU build in a venv and the generated test models, both cached
# outside the repo (scripts/vllm-cpu-env, scripts/make-test-models; idempotent)
vllm-env:
	@$$(scripts/vllm-cpu-env)/bin/python scripts/make-test-models >/dev/null

demo-vllm: venv cluster vllm-env
	@scripts/demo-vllm

test: venv
	scripts/test-lanes

# serve examples/vllm-cpu.yaml on the real engine alone: profile this host's three layouts,
# plan, answers through the gateway, the SLO check under load, down (~10 min, part of
# `make test`)
test-serve-vllm: venv cluster vllm-env
	$(BIN)/python -m pytest tests/vllm/test_serve_vllm.py -q

# the real-engine replacement session alone (drain, scancel, walltime rotation with no READY
# gap; ~13 min, part of `make test`)
test-replacement: venv cluster vllm-env
	$(BIN)/python -m pytest tests/vllm/test_replace_vllm.py -q -m replacement

# the real-engine lane alone (marker vllm)
test-vllm: venv cluster vllm-env
	$(BIN)/python -m pytest tests/vllm -q -m vllm

unit: venv
	$(BIN)/python -m pytest tests/unit -q -n auto

integration: venv cluster
	$(BIN)/python -m pytest tests/integration -q -m slurm

# The layer contract (pyproject's [tool.importlinter]), ruff (line length included) and mypy on
# solver/ and the seams between packages ([tool.mypy]). CI runs it before the tests.
lint: venv
	$(BIN)/lint-imports
	$(BIN)/ruff check coral_hpc solver tests bench harness
	$(BIN)/mypy

wheel-check: venv
	scripts/wheel-check

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
