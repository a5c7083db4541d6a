"""KV bytes per token of sliding-window / hybrid attention and MLA, from real config.json files
(tests/data/hf_configs, sources in its README), as the performance model's KV capacity uses them.

Hand formulas (docs/catalog-sources.md): a sequence of n tokens holds per-layer bytes x (full
layers x n + sliding layers x min(n, window)); MLA caches (kv_lora_rank + qk_rope_head_dim) x 2
bytes per layer, replicated on every tensor-parallel rank."""

from __future__ import annotations

from dataclasses import replace

import pytest

from coral_solver import catalog, perf
from coral_solver.hf_config import arch_from_config_json
from coral_solver.perf_model import kv_bytes_per_token_per_gpu
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "data" / "hf_configs"


@pytest.fixture(autouse=True)
def _fresh_registry(monkeypatch):
    monkeypatch.setattr(catalog, "_DERIVED", {})


def _derived(stem: str, **changes):
    import json

    config = dict(json.loads((CONFIGS / f"{stem}.json").read_text()), **changes)
    key = f"test/{stem}" + ("-changed" if changes else "")
    return catalog.register_derived(key, arch_from_config_json(config, key))


WINDOWS = [
    # stem, layers, sliding layers, window (as the model's config.json and modeling code say)
    ("gemma-2-2b-it", 26, 13, 4096),  # every other layer (modeling_gemma2.py)
    ("gemma-3-4b-it", 34, 29, 1024),  # 5 local : 1 global (sliding_window_pattern 6)
    ("gpt-oss-20b", 24, 12, 128),  # layer_types alternate sliding / full
    ("mistral-7b-v0.1", 32, 32, 4096),  # every layer slides
]


@pytest.mark.parametrize("stem, layers, sliding, window", WINDOWS)
def test_sliding_layers_hold_at_most_the_window_in_the_capacity(stem, layers, sliding, window):
    arch = _derived(stem)
    model = catalog.derived_model(arch.name)
    assert (arch.layers, model.sliding_layers, model.sliding_window) == (layers, sliding, window)
    per_layer = arch.kv_bytes_per_token / layers
    for context in (window // 2, window, 8000, 30000):
        held = per_layer * ((layers - sliding) * context + sliding * min(context, window))
        assert model.kv_bytes_at(context) == pytest.approx(held)
        # the capacity counted in tokens of this context: the same bytes, fewer per token
        cap = 1_000_000
        assert perf.kv_tokens_at(arch, cap, context) == pytest.approx(
            cap * arch.kv_bytes_per_token * context / held, abs=1)
    assert perf.kv_tokens_at(arch, 1_000_000, window) == 1_000_000  # within the window: no gain


@pytest.mark.parametrize("stem", ["llama-3.1-8b", "qwen3-8b", "deepseek-v2-lite", "phi-4"])
def test_no_sliding_layers_leave_the_capacity_alone(stem):
    arch = _derived(stem)
    assert perf.kv_tokens_at(arch, 123_456, 30_000) == 123_456


def test_a_catalogue_entry_keeps_its_full_figure():
    arch = catalog.model_arch("gpt-oss-20b")  # no config.json read: no layer schedule known
    assert perf.kv_tokens_at(arch, 123_456, 30_000) == 123_456


def test_a_kv_bound_stage_serves_more_when_half_its_layers_slide():
    """Gemma 2 with its window against the same config with the window switched off: where the
    KV cache binds (a 16 GB GPU, 8k-token sequences), the sliding one sustains more."""
    sliding = _derived("gemma-2-2b-it")
    full = _derived("gemma-2-2b-it", sliding_window=None)
    assert catalog.derived_model(full.name).sliding_layers == 0
    gpu = replace(catalog.gpu_spec("h100"), memory_gb=16.0)  # KV-bound: 2.6 GB weights + KV
    slo, mix = perf.Slo(ttft_s=60.0, tpot_s=0.5), perf.Mix(input_tokens=6000, output_tokens=2000)
    with_window = perf.stage_throughput(sliding, gpu, 1, sliding.layers, 1, slo, mix)
    without = perf.stage_throughput(full, gpu, 1, full.layers, 1, slo, mix)
    assert with_window > 1.1 * without > 0


def test_mla_caches_one_latent_per_layer_on_every_tp_rank():
    arch = _derived("deepseek-v2-lite")
    assert arch.kv_bytes_per_token == (512 + 64) * 27 * 2  # DeepSeek-V2 paper Table 1
    # not split over tensor-parallel ranks: every rank keeps the whole latent
    assert kv_bytes_per_token_per_gpu(arch, 8, arch.layers) == arch.kv_bytes_per_token
    gqa = _derived("llama-3.1-8b")
    assert kv_bytes_per_token_per_gpu(gqa, 8, gqa.layers) == gqa.kv_bytes_per_token / 8


def test_validate_shows_the_window_and_the_kv_bytes_at_the_mix(tmp_path):
    """What validate derived: a Gemma 2 of 26 layers, 13 sliding over 4096 tokens, at a
    6000 + 2000 token mix holds (13 x 8000 + 13 x 4096) / 8000 layers' worth per token."""
    import json
    import shutil

    from click.testing import CliRunner

    from coral_hpc.cli import cli

    folder = tmp_path / "models" / "gemma"
    folder.mkdir(parents=True)
    shutil.copy(CONFIGS / "gemma-2-2b-it.json", folder / "config.json")
    text = (REPO / "examples" / "university.yaml").read_text()
    text = text.replace("/scratch/shared/coral-hpc", str(tmp_path / "shared"))
    text = text.replace("~/.local/state/coral-hpc/lab-llm.db", str(tmp_path / "lab.db"))
    text = text[:text.index("\nmodels:")] + (
        f"\nmodels:\n  - name: gemma\n    source: {folder}\n"
        "    mix: {input_tokens: 6000, output_tokens: 2000}\n"
        "    demand: {requests_per_s: 0.1}\n    slo: {ttft_s: 60.0, tpot_s: 0.5}\n")
    path = tmp_path / "models.yaml"
    path.write_text(text)
    snapshot = REPO / "tests" / "data" / "plan" / "university-busy-snapshot.json"
    run = CliRunner().invoke(cli, ["validate", str(path), "--snapshot", str(snapshot), "--json"])
    fact = json.loads(run.stdout)["model_facts"][0]
    per_layer = 2 * 4 * 256 * 2
    assert (fact["sliding_layers"], fact["sliding_window"], fact["mix_tokens"]) == (13, 4096, 8000)
    assert fact["kv_bytes_per_token"] == 26 * per_layer
    assert fact["kv_bytes_per_token_at_mix"] == round(per_layer * (13 * 8000 + 13 * 4096) / 8000)
    shown = " ".join(CliRunner().invoke(cli, ["validate", str(path), "--snapshot",
                                              str(snapshot)]).output.split())
    assert ("gemma: 13 of 26 layers attend to a 4,096-token window: 80,511 KV bytes per token "
            "at this mix's 8,000 tokens") in shown
