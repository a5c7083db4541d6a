"""``examples/vllm-cpu.yaml`` planned disaggregated from a test: the example with its profiles
folder made absolute, ``disaggregation: "on"`` through a KV connector, and ``measured_only`` as
the test asks; ``plan --json`` of it on the recorded local-cluster snapshot."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result

REPO = Path(__file__).resolve().parents[2]
SNAPSHOT = REPO / "tests/data/plan/devcluster-snapshot.json"


def disaggregated_example(tmp_path: Path, measured_only: bool) -> Path:
    """Write the disaggregated copy of the example into ``tmp_path``; return its path."""
    text = (REPO / "examples" / "vllm-cpu.yaml").read_text()
    assert "  measured_only: true" in text, "examples/vllm-cpu.yaml no longer sets measured_only"
    text = text.replace("profiles_dir: vllm-cpu.profiles",
                        f"profiles_dir: {REPO / 'examples' / 'vllm-cpu.profiles'}")
    text = text.replace("  measured_only: true",
                        f"  measured_only: {'true' if measured_only else 'false'}\n"
                        '  disaggregation: "on"')
    text = text.replace("engine:\n  kind: vllm\n",
                        "engine:\n  kind: vllm\n  kv_connector: {name: NixlConnector}\n")
    path = tmp_path / "vllm-cpu.yaml"
    path.write_text(text)
    return path


def plan_json(path: Path) -> Result:
    """``coral-hpc plan PATH --json`` on the recorded local-cluster snapshot."""
    from coral_hpc.cli.plan import plan

    return CliRunner().invoke(plan, [str(path), "--json", "--snapshot", str(SNAPSHOT)])
