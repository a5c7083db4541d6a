"""Rendered scripts: compared line by line with golden files, parsed by `bash -n`, and run far
enough to see the exact argv the engine would get.

Regenerate the golden files after an intended template change with
``CORAL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_launch_render.py`` and review
the diff.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from submitit.slurm.slurm import _make_sbatch_string

from coral_hpc.config import VenvEnvironment
from coral_hpc.launch.render import render_engine_script, render_hetjob
from coral_hpc.launch.submit import submitit_parameters
from tests.unit.launch_cases import PYTHON, STATE, case_spec, golden_cases

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "launch"
UPDATE = os.environ.get("CORAL_UPDATE_GOLDEN") == "1"


def _render_case(layout: str, env_kind: str, rank: int) -> str:
    spec = case_spec(layout, env_kind)
    return render_engine_script(
        spec,
        rank=rank,
        port=24001 if rank == 0 else None,
        master_addr="gpu-a100-01" if spec.pp > 1 else None,
        master_port=24002 if spec.pp > 1 else None,
    )


def _compare(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with CORAL_UPDATE_GOLDEN=1 and review it"
    expected = path.read_text().splitlines()
    actual = text.splitlines()
    for number, (want, got) in enumerate(zip(expected, actual), start=1):
        assert got == want, f"{name}:{number}: expected {want!r}, rendered {got!r}"
    assert len(actual) == len(expected), f"{name}: {len(actual)} lines, golden has {len(expected)}"


def _bash_n(text: str, tmp_path: Path) -> None:
    script = tmp_path / "check.sh"
    script.write_text(text)
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("layout,env_kind,rank", golden_cases())
def test_engine_script_matches_golden_and_parses(layout, env_kind, rank, tmp_path):
    text = _render_case(layout, env_kind, rank)
    _compare(f"engine-{layout}-{env_kind}-rank{rank}.sh", text)
    _bash_n(text, tmp_path)


def test_every_golden_file_is_rendered_and_parses(tmp_path):
    rendered = {f"engine-{l}-{e}-rank{r}.sh" for l, e, r in golden_cases()}
    rendered |= {"hetjob-vllm.sbatch", "hetjob-sim.sbatch", "submitit-multinode.sbatch"}
    stored = {p.name for p in GOLDEN.iterdir()}
    assert stored == rendered, f"stale or missing golden files: {stored ^ rendered}"
    for path in GOLDEN.iterdir():
        _bash_n(path.read_text(), tmp_path)


@pytest.mark.parametrize("env_kind", ["apptainer", "sim"])
def test_hetjob_script_matches_golden(env_kind, tmp_path):
    spec = case_spec("hetero", env_kind)
    text = render_hetjob(spec, spec.spec_file)
    _compare(f"hetjob-{'sim' if env_kind == 'sim' else 'vllm'}.sbatch", text)
    _bash_n(text, tmp_path)
    lines = text.splitlines()
    # one component per stage, separated by `#SBATCH hetjob`, before the first command
    assert lines.count("#SBATCH hetjob") == 1
    assert "#SBATCH --partition=a100 --nodes=1 --ntasks-per-node=1 --gres=gpu:a100:2" in lines
    assert "#SBATCH --partition=v100 --nodes=1 --ntasks-per-node=1 --gres=gpu:v100:2" in lines
    assert "#SBATCH --no-requeue" in lines
    assert f"#SBATCH --comment='{spec.tag.comment()}'" in lines
    first_command = next(i for i, l in enumerate(lines) if l and not l.startswith("#"))
    assert all(not l.startswith("#SBATCH") for l in lines[first_command:])


def test_submitit_batch_script_matches_golden(tmp_path):
    """The script submitit will submit for a homogeneous two-node replica (submitit's own
    renderer, our parameters): tag, GRES, no requeue, one task per node."""
    spec = case_spec("multinode", "venv")
    params = submitit_parameters(spec)
    text = _make_sbatch_string(
        command=f"{PYTHON} -u -m submitit.core._submit {STATE}/logs",
        folder=f"{STATE}/logs",
        **params,
    )
    _compare("submitit-multinode.sbatch", text + "\n")
    lines = text.splitlines()
    for line in (
        "#SBATCH --gres=gpu:a100:2",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --no-requeue",
        "#SBATCH --signal=USR2@90",
        "#SBATCH --time=120",
        "#SBATCH --account=gpu-lab",
        "#SBATCH --qos=normal",
        f"#SBATCH --job-name={spec.tag.job_name()}",
    ):
        assert line in lines
    assert not any("wckey" in line for line in lines)


# ------------------------------------------------------------------ the argv the engine receives


def _engine_argv(text: str, tmp_path: Path, env: dict[str, str] | None = None) -> list[str]:
    """Run a rendered script with `exec` replaced by printing the command, one word per line."""
    marker = 'exec "${ENGINE[@]}" "${FLAGS[@]}"'
    assert text.rstrip().endswith(marker)
    script = tmp_path / "argv.sh"
    script.write_text(text.replace(marker, 'printf "%s\\0" "${ENGINE[@]}" "${FLAGS[@]}"'))
    result = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, check=False,
        env=env or {"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split("\0")[:-1]


def test_sim_head_gets_exact_argv_and_no_secret(tmp_path):
    spec = case_spec("hetero", "sim")
    argv = _engine_argv(render_engine_script(spec, rank=0, port=24001), tmp_path)
    assert argv == [
        PYTHON, "-m", "coral_hpc.engine.sim", "meta-llama/Llama-3.1-70B-Instruct",
        "--sim-arch", "llama-3.1-70b", "--sim-gpu-types", "a100,v100", "--sim-layers", "48,32",
        "--sim-drain-timeout", "55",
        "--served-model-name", "llama-70b", "--tensor-parallel-size", "2",
        "--pipeline-parallel-size", "2", "--dtype", "half", "--max-model-len", "8192",
        "--host", "0.0.0.0", "--port", "24001",
    ]  # fmt: skip


def test_hostile_values_stay_single_words(tmp_path):
    """Values with spaces, quotes and $(...) reach the engine as one argv word each and run
    nothing: every template value is shell-quoted."""
    canary = tmp_path / "ran"
    source = f"odd model $(touch {canary}) 'q' \"d\""
    spec = case_spec("single", "sim", model_source=source, engine_args=("--x=$(touch y)",))
    argv = _engine_argv(render_engine_script(spec, rank=0, port=24001), tmp_path)
    assert argv[3] == source
    assert not canary.exists()


def test_venv_worker_argv_joins_the_head_headless(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text("export ACTIVATED=1\n")
    # a venv without modules: this machine has no module system
    env = VenvEnvironment(path=str(venv))
    spec = case_spec("multinode", "venv")
    spec = replace(spec, stages=tuple(replace(s, environment=env) for s in spec.stages))
    text = render_engine_script(spec, rank=1, master_addr="head-node", master_port=24002)
    argv = _engine_argv(text, tmp_path)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct"]
    assert shlex.join(argv[3:]) == (
        "--served-model-name llama-70b --tensor-parallel-size 2 --pipeline-parallel-size 2 "
        "--dtype auto --max-model-len 8192 --nnodes 2 --node-rank 1 --master-addr head-node "
        "--master-port 24002 --headless --shutdown-timeout 55 --enable-prefix-caching"
    )
    assert "--port" not in argv  # a headless worker serves no API


def test_pipeline_needs_master_address():
    spec = case_spec("multinode", "module")
    with pytest.raises(ValueError, match="master_addr"):
        render_engine_script(spec, rank=0, port=24001)
    with pytest.raises(ValueError, match="rank 2"):
        render_engine_script(spec, rank=2, master_addr="h", master_port=1)
