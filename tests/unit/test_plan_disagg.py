"""`coral-hpc plan` on a disaggregated deployment: prefill and decode rows, each with its role."""

from __future__ import annotations

import json

from click.testing import CliRunner

from coral_hpc.cli.plan import plan as plan_command
from tests.conftest import REPO
from tests.fakes.slurm import recorded_snapshot

MODELS = REPO / "examples" / "models.yaml"


def _plan(tmp_path, policy_line: str, *args: str):
    text = MODELS.read_text().replace("policy:\n", f"policy:\n  {policy_line}\n", 1)
    models = tmp_path / "models.yaml"
    models.write_text(text)
    snapshot = tmp_path / "snapshot.json"
    snapshot.write_text(json.dumps(recorded_snapshot().to_dict()))
    run = CliRunner().invoke(plan_command, [str(models), "--snapshot", str(snapshot),
                                            "--cache-dir", str(tmp_path / "cache"), *args],
                                env={"COLUMNS": "200"})  # wide enough for every column
    assert run.exit_code == 0, run.output
    return run.stdout


def test_disaggregation_on_plans_prefill_and_decode_rows_per_model(tmp_path):
    data = json.loads(_plan(tmp_path, "disaggregation: on", "--json"))
    assert data["checker_problems"] == []
    roles: dict[str, set[str]] = {}
    for row in data["replicas"]:
        roles.setdefault(row["model"], set()).add(row["role"])
        assert f".{row['role']}." in row["template"]
    served = {m["name"]: m for m in data["models"]}
    # the two small models are served through prefill + decode pairs; the 70B model needs a
    # pipeline of nodes per phase and the five local nodes do not hold both (the plan says so)
    for model in ("qwen3-8b", "phi-4"):
        assert roles[model] == {"prefill", "decode"}
        assert served[model]["served"] >= served[model]["demand"] * (1 - 1e-6)
    assert data["mode"] == "scarce" and any("llama-70b" in b for b in data["binding"])
    table = _plan(tmp_path, "disaggregation: on")
    assert "prefill" in table and "decode" in table and "role" in table


def test_auto_never_plans_dearer_than_aggregated_only(tmp_path):
    auto = json.loads(_plan(tmp_path, "disaggregation: auto", "--json"))
    off = json.loads(_plan(tmp_path, "disaggregation: off", "--json"))
    assert auto["mode"] == off["mode"] == "optimal"
    assert auto["cost_per_hour"] <= off["cost_per_hour"] * (1 + 1e-9)


def test_disaggregation_off_keeps_every_row_aggregated(tmp_path):
    data = json.loads(_plan(tmp_path, "disaggregation: off", "--json"))
    assert {row["role"] for row in data["replicas"]} == {"both"}
