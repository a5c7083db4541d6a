"""Issue 16, Why-4b: hostile values rendered into every shipped template, and the scripts run with
bash as the job runs them: nothing injected runs, every value arrives as one word, no line is
added (comments and #SBATCH lines included), and what cannot be written safely is refused before
anything is submitted.

Before the fix a newline in ``environment.path`` escaped the engine script's comment line and the
next line ran.
"""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from coral_hpc.config import ApptainerEnvironment, ModuleEnvironment, VenvEnvironment
from coral_hpc.launch.quoting import UnsafeValue, comment_text
from coral_hpc.launch.render import render_engine_script, render_hetjob
from coral_hpc.launch.submit import check_renderable, submitit_parameters
from tests.unit.launch_cases import case_spec, golden_cases

#: every shell metacharacter; each `touch CANARYn` creates a file in the script's cwd if it runs
HOSTILE = (
    "v'$(touch CANARY1)\"`touch CANARY2`;touch CANARY3;|&>CANARY4 <x *?[a] ~ #h %j {a,b} "
    "\\ !x $HOME ${PATH} $'\\x41'"
)
EXEC_LINE = 'exec "${ENGINE[@]}" "${FLAGS[@]}"'


def _fake_tools(root: Path) -> Path:
    """`module`, `srun`: record their argv (NUL-separated) instead of doing anything."""
    bin_dir = root / "fakebin"
    bin_dir.mkdir()
    for tool in ("module", "srun"):
        path = bin_dir / tool
        path.write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" >> "$FAKE_LOG/{tool}.argv"\n')
        path.chmod(0o755)
    return bin_dir


def _hostile_spec(layout: str, env_kind: str, root: Path, value: str = HOSTILE):
    """The golden case with ``value`` in every free-text field that reaches a script."""
    venv = root / f"venv{value}"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "activate").write_text("export ACTIVATED=1\n")
    environment = {
        "venv": VenvEnvironment(path=str(venv), modules=(value,), env={"CORAL_X": value}),
        "module": ModuleEnvironment(modules=(value, "vllm/0.33.0")),
        "apptainer": ApptainerEnvironment(image=f"/img/{value}.sif", binds=(value,),
                                          modules=(value,)),
        "sim": None,
    }[env_kind]
    spec = case_spec(
        layout, env_kind,
        model_source=value,
        engine_args=(value, "--x"),
        dtype=value,
        sim_arch=value,
        python=f"/opt/{value}/python",
        state_path=str(root / f"state{value}"),
    )
    return replace(spec, stages=tuple(replace(s, environment=environment) for s in spec.stages))


def _run_bash(text: str, root: Path, name: str) -> subprocess.CompletedProcess:
    script = root / name
    script.write_text(text)
    (root / "log").mkdir(exist_ok=True)
    env = {"PATH": f"{root / 'fakebin'}:/usr/bin:/bin", "FAKE_LOG": str(root / "log"),
           "HOME": str(root)}
    return subprocess.run(["bash", str(script)], cwd=root, env=env, capture_output=True,
                          text=True, check=False, timeout=30)


def _argv(path: Path) -> list[str]:
    return path.read_text().split("\0")[:-1] if path.exists() else []


def _no_canary(root: Path) -> None:
    ran = sorted(p.name for p in root.iterdir() if p.name.startswith("CANARY"))
    assert not ran, f"injected commands ran: {ran}"


@pytest.mark.parametrize("layout,env_kind,rank", golden_cases())
def test_engine_scripts_run_nothing_injected(layout, env_kind, rank, tmp_path: Path):
    _fake_tools(tmp_path)
    spec = _hostile_spec(layout, env_kind, tmp_path)
    kwargs = {"port": 24001 if rank == 0 else None, "master_addr": f"h{HOSTILE}",
              "master_port": 24002}
    text = render_engine_script(spec, rank=rank, **kwargs)
    benign = render_engine_script(_hostile_spec(layout, env_kind, tmp_path, "plain"), rank=rank,
                                  **(kwargs | {"master_addr": "h"}))
    assert len(text.splitlines()) == len(benign.splitlines()), "a value added a line"
    sleeps = "exec sleep infinity" in text
    if not sleeps:
        assert text.rstrip().endswith(EXEC_LINE)
        text = text.replace(EXEC_LINE, 'printf "%s\\0" "${ENGINE[@]}" "${FLAGS[@]}" > argv.out')
    result = _run_bash(text.replace("exec sleep infinity", "true"), tmp_path, "engine.sh")
    assert result.returncode == 0, result.stderr
    _no_canary(tmp_path)
    if env_kind in ("venv", "module", "apptainer"):
        assert _argv(tmp_path / "log" / "module.argv")[:2] == ["load", HOSTILE]
    if sleeps:
        return
    argv = _argv(tmp_path / "argv.out")
    assert argv.count(HOSTILE) >= 1
    if env_kind == "sim":
        assert argv[:4] == [spec.python, "-m", "coral_hpc.engine.sim", HOSTILE]
        assert argv[argv.index("--sim-arch") + 1] == HOSTILE
    else:
        source_at = argv.index("serve") + 1
        assert argv[source_at] == HOSTILE
        assert argv[argv.index("--dtype") + 1] == HOSTILE
        if rank == 0:
            assert argv[-2:] == [HOSTILE, "--x"]  # engine args last, one word each
        if spec.pp > 1:
            assert argv[argv.index("--master-addr") + 1] == f"h{HOSTILE}"
    if env_kind == "apptainer":
        assert argv[:5] == ["apptainer", "exec", "--nv", "--bind", HOSTILE]
        assert argv[5] == f"/img/{HOSTILE}.sif"


@pytest.mark.parametrize("env_kind", ["venv", "module", "apptainer", "sim"])
def test_hetjob_script_runs_nothing_injected(env_kind, tmp_path: Path):
    _fake_tools(tmp_path)
    spec = _hostile_spec("hetero", env_kind, tmp_path)
    text = render_hetjob(spec, spec.spec_file)
    twin = _hostile_spec("hetero", env_kind, tmp_path, "plain")
    benign = render_hetjob(twin, twin.spec_file)
    assert len(text.splitlines()) == len(benign.splitlines()), "a value added a line"
    lines = text.splitlines()
    first_command = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert sum(ln.startswith("#SBATCH") for ln in lines) == sum(
        ln.startswith("#SBATCH") for ln in benign.splitlines())
    assert all(not ln.startswith("#SBATCH") for ln in lines[first_command:])
    result = _run_bash(text, tmp_path, "hetjob.sbatch")
    assert result.returncode == 0, result.stderr
    _no_canary(tmp_path)
    argv = _argv(tmp_path / "log" / "srun.argv")
    assert argv[-4:] == [spec.python, "-m", "coral_hpc.launch.entrypoint", str(spec.spec_file)]


BAD_SLURM_WORDS = ["a100\n#SBATCH --uid=0", "a100;touch CANARY", "a100 --x", "$(id)"]
#: (field, value): an empty account/QOS means "none" (no #SBATCH line), so it is not a case
SLURM_WORD_CASES = [(f, v) for f in ("partition", "gpu_type", "account", "qos")
                    for v in BAD_SLURM_WORDS + ([""] if f == "partition" else [])]


@pytest.mark.parametrize("field,value", SLURM_WORD_CASES, ids=repr)
def test_values_that_cannot_be_quoted_on_sbatch_lines_are_refused(field, value):
    """Partition, GPU type, account and QOS land bare on #SBATCH lines (submitit writes them
    unquoted): anything but a Slurm name is refused, for hetjobs and submitit alike."""
    def spec_with(layout):
        spec = case_spec(layout, "sim")
        if field in ("partition", "gpu_type"):
            return replace(spec, stages=tuple(replace(s, **{field: value}) for s in spec.stages))
        return replace(spec, **{field: value})

    with pytest.raises(UnsafeValue):
        render_hetjob(spec_with("hetero"), Path("/s/spec.json"))
    with pytest.raises(UnsafeValue):
        submitit_parameters(spec_with("single"))


@pytest.mark.parametrize("field", ["model_source", "dtype", "python", "sim_arch", "env_path",
                                   "engine_arg", "module", "state_path"])
def test_a_newline_anywhere_is_refused_before_submission(field, tmp_path: Path):
    """The defect of issue 16: a newline in environment.path ended the comment line and the next
    line ran. A line break cannot be written on one line in any context: refused at render time,
    which `submit_replica` does before anything reaches Slurm."""
    evil = "x\ntouch CANARY\n"
    spec = case_spec("single", "sim" if field == "sim_arch" else "venv")
    if field in ("env_path", "module"):
        fields = {"path": evil} if field == "env_path" else {"path": "/v", "modules": (evil,)}
        with pytest.raises(ValueError, match="control character"):
            VenvEnvironment(**fields)  # models.yaml (and spec.json) refuse it first
        env = VenvEnvironment.model_construct(kind="venv", **({"modules": ()} | fields))
        spec = replace(spec, stages=tuple(replace(s, environment=env) for s in spec.stages))
    elif field == "engine_arg":
        spec = replace(spec, engine_args=(evil,))
    else:
        spec = replace(spec, **{field: evil})
    with pytest.raises(UnsafeValue, match="control character"):
        check_renderable(spec)


def test_comments_keep_a_newline_visible_and_inert():
    assert comment_text("/x\ntouch CANARY\r\x1b[2J") == "/x\\ntouch CANARY\\r\\x1b[2J"
    assert "\n" not in comment_text("a\u2028b\x85c")


def test_a_string_where_a_number_belongs_is_refused():
    """Numbers render bare; a string there (a tampered spec.json) is refused, not written."""
    spec = replace(case_spec("single", "sim"), max_model_len="8192 $(touch CANARY)")
    with pytest.raises(UnsafeValue, match="not quoted"):
        render_engine_script(spec, rank=0, port=1)


def test_an_environment_variable_name_must_be_an_identifier():
    env = VenvEnvironment.model_construct(kind="venv", path="/v", modules=(),
                                          env=(("X;touch CANARY;Y", "1"),))
    spec = case_spec("single", "venv")
    spec = replace(spec, stages=tuple(replace(s, environment=env) for s in spec.stages))
    with pytest.raises(UnsafeValue, match="variable name"):
        check_renderable(spec)
