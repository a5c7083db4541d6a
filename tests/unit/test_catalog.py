"""The GPU and model catalog: names, aliases, derived sizes, and clear errors on bad files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from coral_solver import catalog
from coral_solver.catalog import (
    CatalogError,
    gpu_memory_gb,
    gpu_spec,
    load_gpus,
    load_models,
    model_arch,
)
from coral_solver.resources import profiles_dir

REQUIRED_GPUS = {"v100", "v100-32g", "t4", "a10", "a10g", "l4", "l40s", "a40", "a100", "a100-80g",
                 "h100", "h200"}
REQUIRED_MODELS = {"llama-3.1-8b", "llama-3.1-70b", "qwen3-8b", "qwen3-32b", "qwen3-235b-a22b",
                   "phi-4", "gpt-oss-20b", "gpt-oss-120b", "mixtral-8x7b"}


def test_catalog_covers_the_required_gpus_and_models():
    assert REQUIRED_GPUS <= set(load_gpus())
    assert REQUIRED_MODELS <= set(load_models())


@pytest.mark.parametrize("alias, canonical", [
    ("a100-40g", "a100"), ("A100_40GB", "a100"), ("a100_80gb", "a100-80g"), ("H100", "h100"),
    ("v100-32gb", "v100-32g"),
])
def test_gpu_aliases_resolve(alias, canonical):
    assert gpu_spec(alias).name == canonical


def test_unknown_gpu_names_the_valid_ones():
    with pytest.raises(KeyError, match="a100-80g"):
        gpu_spec("rtx-9090")
    assert gpu_memory_gb("rtx-9090") is None
    assert gpu_memory_gb("a100_80gb") == 80
    assert gpu_memory_gb("v100") == 16


def test_model_lookup_by_hf_id_and_unknown():
    assert model_arch("meta-llama/Llama-3.1-8B-Instruct").name == "llama-3.1-8b"
    with pytest.raises(KeyError, match="phi-4"):
        model_arch("gpt-5")


def test_kv_bytes_and_weights_follow_the_dims():
    llama8 = model_arch("llama-3.1-8b")
    assert llama8.kv_bytes_per_token == 128 * 1024  # 2 x 32 layers x 8 heads x 128 x 2 B
    assert model_arch("llama-3.1-70b").kv_bytes_per_token == 320 * 1024
    # 8B: ~218 M params per layer (attention 42 M + MLP 176 M) at 2 B each
    assert llama8.weights_per_layer_bytes == pytest.approx(2 * 218.1e6, rel=0.02)
    # gpt-oss ships MXFP4 experts: the routed experts are most of a layer but < 0.6 B/param
    oss = model_arch("gpt-oss-120b")
    assert 0.9 < oss.expert_bytes_per_layer / oss.weights_per_layer_bytes < 1.0
    assert oss.weight_bytes < oss.params_b * 1e9  # under 1 byte per parameter
    assert not llama8.is_moe and oss.is_moe


def test_calibrated_flag_comes_from_calibration_file():
    gpus = load_gpus()
    assert gpus["a100"].calibrated
    assert not gpus["h200"].calibrated  # no public measurements of H200


def _copy_profiles(tmp_path: Path) -> Path:
    dest = tmp_path / "profiles"
    shutil.copytree(profiles_dir(), dest, ignore=shutil.ignore_patterns("measured"))
    return dest


def test_bad_field_names_file_entry_and_field(tmp_path):
    dest = _copy_profiles(tmp_path)
    text = (dest / "gpus.yaml").read_text().replace("mem_bw_gbs: 900", "mem_bw_gbs: fast", 1)
    (dest / "gpus.yaml").write_text(text)
    with pytest.raises(CatalogError, match=r"gpus\.yaml: entry 'v100': field 'mem_bw_gbs'"):
        load_gpus(dest)


def test_bad_interconnect_lists_valid_values(tmp_path):
    dest = _copy_profiles(tmp_path)
    text = (dest / "gpus.yaml").read_text().replace("interconnect: pcie", "interconnect: carrier-pigeon", 1)
    (dest / "gpus.yaml").write_text(text)
    with pytest.raises(CatalogError, match="nvlink"):
        load_gpus(dest)


def test_missing_model_field(tmp_path):
    dest = _copy_profiles(tmp_path)
    text = (dest / "models.yaml").read_text().replace("  vocab: 128256\n", "", 1)
    (dest / "models.yaml").write_text(text)
    with pytest.raises(CatalogError, match=r"'llama-3.1-8b': missing field 'vocab'"):
        catalog.load_models(dest)
