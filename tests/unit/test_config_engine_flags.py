"""Issue 28 item 3: ``vllm_args`` and ``engine.args`` cannot set a flag the planner or launcher
owns, nor carry a secret. vLLM's argparse keeps the last value of a repeated flag, so before
this ``vllm_args: [--tensor-parallel-size, "4"]`` validated and silently replaced the planned TP,
and ``--api-key`` put the key in argv and in every rendered script."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from coral_hpc.cli import cli
from coral_hpc.config import engine_flag_problem, parse_deployment
from coral_hpc.errors import ConfigError
from tests.unit.test_config import BASE, _edit


@pytest.fixture(autouse=True)
def no_daemon(monkeypatch):
    """A refusal that does not happen must fail here, not start a daemon that submits jobs to
    whatever Slurm this machine reaches."""
    def started(*args, **kwargs):
        raise AssertionError("serve started the daemon instead of refusing")

    monkeypatch.setattr("coral_hpc.daemon.serve", started)


REFUSED = [
    "--tensor-parallel-size", "--tensor-parallel-size=4", "--tensor_parallel_size", "-tp",
    "-tp4", "--tensor-parallel", "--tensor", "--pipeline-parallel-size=2", "-pp", "--pipeline",
    "--host", "--host=0.0.0.0", "--port", "--port=9", "--po", "--uds", "--api-key",
    "--api-key=sk-1", "--api-k", "--API-KEY", "--kv-transfer-config", "--kv-transfer",
    "--served-model-name", "--served-model", "--sim-layers", "--config", "--hf-token",
    "--hf-tok", "--ssl-password", "--secret=x", "--access-token=y", "--master-port",
    "--node-rank", "--nnodes", "--headless",
]  # fmt: skip
ALLOWED = [
    "--max-num-seqs", "32", "--enforce-eager", "--max-num-batched-tokens=8192", "--tokenizer",
    "--enable-prefix-caching", "--kv-cache-dtype", "--config-format", "--ssl-keyfile",
    "--data-parallel-size", "-O3", "4", "--", "value-with--port",
]  # fmt: skip


@pytest.mark.parametrize("arg", REFUSED)
def test_planner_owned_or_secret_flag_is_refused(arg: str):
    assert engine_flag_problem(arg) is not None, arg


@pytest.mark.parametrize("arg", ALLOWED)
def test_ordinary_engine_args_stay_allowed(arg: str):
    assert engine_flag_problem(arg) is None, arg


def _with_vllm_args(args: str) -> str:
    return _edit(BASE, "    slo: {ttft_s: 2, tpot_s: 0.05}\n",
                 f"    slo: {{ttft_s: 2, tpot_s: 0.05}}\n    vllm_args: {args}\n")


@pytest.mark.parametrize(("args", "index", "phrase"), [
    ('["--api-key", "sk-123", "--tensor-parallel-size", "4"]', 0, "secret"),
    ('["--max-num-seqs", "8", "--tensor-parallel-size", "4"]', 2, "tensor parallelism"),
    ('["--tensor-parallel=4"]', 0, "abbreviates --tensor-parallel-size"),
    ('["--port=8001"]', 0, "port"),
])
def test_model_vllm_args_name_the_model_the_flag_and_why(args: str, index: int, phrase: str):
    with pytest.raises(ConfigError) as err:
        parse_deployment(_with_vllm_args(args), "m.yaml")
    (problem,) = err.value.problems
    assert problem.startswith(f"m.yaml:21: models[0].vllm_args[{index}]: model 'small' "), problem
    assert phrase in problem, problem
    assert "sk-123" not in problem  # the secret itself is never echoed


def test_engine_args_are_checked_too():
    text = _edit(BASE, "  kind: sim\n", '  kind: sim\n  args: ["--served-model-name=x"]\n')
    with pytest.raises(ConfigError) as err:
        parse_deployment(text, "m.yaml")
    (problem,) = err.value.problems
    assert "engine.args[0]" in problem and "--served-model-name" in problem, problem


def test_layer_partition_cannot_come_from_the_environment():
    text = _edit(BASE, "      price: {a100: 2.0}\n",
                 "      price: {a100: 2.0}\n      environment: {kind: venv, path: /opt/v, "
                 "env: {VLLM_PP_LAYER_PARTITION: '10,30'}}\n")
    with pytest.raises(ConfigError) as err:
        parse_deployment(text, "m.yaml")
    assert any("VLLM_PP_LAYER_PARTITION" in p for p in err.value.problems), err.value.problems


@pytest.mark.parametrize("command", [["validate"], ["plan", "--snapshot", "none.json"], ["serve"]])
def test_cli_exits_2_naming_file_model_and_flag(command: list[str], tmp_path: Path):
    text = _with_vllm_args('["--api-key", "sk-123"]')
    text = text.replace("/tmp/coral-state", str(tmp_path / "state"))
    text = text.replace("/tmp/coral.db", str(tmp_path / "db" / "coral.db"))
    path = tmp_path / "models.yaml"
    path.write_text(text)
    args = [command[0], str(path), *command[1:]]
    result = CliRunner().invoke(cli, args, catch_exceptions=True)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert f"{path}:21: models[0].vllm_args[0]: model 'small' may not set --api-key" \
        in result.output, result.output
    assert "sk-123" not in result.output
