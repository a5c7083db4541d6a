"""A site catalogue (models.yaml ``catalog:``): GPU types and model entries that add to or
override the shipped ones, without touching the installed package; bad entries named by file,
line and field (exit 2)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from coral_hpc.cli import cli
from coral_hpc.config import load_deployment
from coral_hpc.model_archs import derive_models
from coral_solver import catalog, perf
from coral_solver.catalog import CatalogError
from coral_solver.site_catalog import read_site_catalog
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "catalogs" / "site-catalog.yaml"
SNAPSHOT = REPO / "tests" / "data" / "plan" / "university-busy-snapshot.json"


@pytest.fixture(autouse=True)
def _shipped_only(monkeypatch):
    """Each test starts with the shipped catalogue alone; what it puts in force is gone after."""
    monkeypatch.setattr(catalog, "_SITE", None)
    monkeypatch.setattr(catalog, "_DERIVED", {})


def _write(tmp_path: Path, text: str, name: str = "site.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- reading the file -----------------------------------------------------------------------

def test_a_new_gpu_type_and_an_override_and_a_model_entry():
    shipped_a100 = catalog.gpu_spec("a100-80g")
    site = read_site_catalog(EXAMPLE)
    assert catalog.canonical_gpu_name("h100-nvl") is None  # not in force yet
    catalog.use_site_catalog(site)
    nvl = catalog.gpu_spec("H100_NVL")  # normalised as the shipped names are
    assert (nvl.memory_gb, nvl.mem_bw_gbs, nvl.compute_capability) == (94, 3900, 9.0)
    assert catalog.canonical_gpu_name("h100-94g") == "h100-nvl"  # its own aliases
    assert "h100-nvl" in catalog.load_gpus()
    a100 = catalog.gpu_spec("a100-80gb")  # a shipped alias still names the overridden type
    # only the fields given change; the rest are the shipped ones
    assert (a100.mem_bw_gbs, a100.interconnect, a100.link_bw_gbs) == (1935, "pcie", 64)
    assert (a100.memory_gb, a100.fp16_tflops, a100.calibrated) == (
        shipped_a100.memory_gb, shipped_a100.fp16_tflops, shipped_a100.calibrated)
    llama = catalog.model_arch("meta-llama/Llama-2-13b-chat-hf")
    assert llama.name == "llama-2-13b" and llama.kv_bytes_per_token == 2 * 40 * 40 * 128 * 2
    assert site.overridden == ("gpus.a100-80g",)
    # the shipped files are untouched: with no site catalogue the shipped figures come back
    catalog.use_site_catalog(None)
    assert catalog.gpu_spec("a100-80g") == shipped_a100
    assert catalog.canonical_gpu_name("h100-nvl") is None


def test_the_performance_model_reads_the_sites_figures():
    arch = catalog.model_arch("llama-3.1-8b")
    before = perf.kv_capacity_tokens(arch, catalog.gpu_spec("a100-80g"), 1, arch.layers)
    catalog.use_site_catalog(read_site_catalog(_write_site(
        "gpus:\n  a100-80g:\n    memory_gb: 40\n")))
    after = perf.kv_capacity_tokens(arch, catalog.gpu_spec("a100-80g"), 1, arch.layers)
    assert 0 < after < before / 2


def _write_site(text: str) -> Path:
    import tempfile

    folder = Path(tempfile.mkdtemp())
    return _write(folder, text)


def test_an_entry_named_by_a_shipped_alias_overrides_that_entry(tmp_path):
    site = read_site_catalog(_write(tmp_path, "gpus:\n  A100_80GB:\n    memory_gb: 81\n"))
    assert list(site.gpus) == ["a100-80g"] and site.gpus["a100-80g"].memory_gb == 81


BAD = [
    # text, what the message must say (file:line: ... field)
    ("gpus:\n  a100:\n    memory_gb: 94\n    mem_bw_gbs: fast\n",
     r"site\.yaml:4: entry 'a100': field 'mem_bw_gbs' = 'fast' is not a float"),
    ("gpus:\n  h100-nvl:\n    memory_gb: 94\n",
     r"site\.yaml:2: entry 'h100-nvl': missing field 'mem_bw_gbs'"),
    ("gpus:\n  a100:\n    interconnect: infiniband\n",
     r"site\.yaml:3: entry 'a100': interconnect 'infiniband' is not one of"),
    ("gpus:\n  a100:\n    memory_gbs: 40\n",
     r"site\.yaml:3: gpus\.a100\.memory_gbs: unknown field; valid: .*memory_gb"),
    ("gpus:\n  a100:\n    bf16: yes please\n",
     r"site\.yaml:3: entry 'a100': field 'bf16' = 'yes please' is not a bool"),
    ("gpus:\n  a100:\n    memory_gb: 0\n",
     r"site\.yaml:3: entry 'a100': field 'memory_gb' must be > 0"),
    ("gpus:\n  a100:\n    memory_gb: true\n",
     r"site\.yaml:3: entry 'a100': field 'memory_gb' = True is not a float"),
    ("models:\n  lab-13b:\n    layers: 40\n",
     r"site\.yaml:2: entry 'lab-13b': missing field 'quantization'"),
    ("models:\n  phi-4:\n    quantization: int3\n",
     r"site\.yaml:3: entry 'phi-4': quantization 'int3' is not one of"),
    ("models:\n  mixtral-8x7b:\n    active_experts: 9\n",
     r"site\.yaml:3: entry 'mixtral-8x7b': field 'active_experts' must be 1\.\.experts \(8\)"),
    ("tpus:\n  v5e: {}\n", r"site\.yaml:1: unknown section 'tpus'"),
    ("gpus: [a100]\n", r"site\.yaml:1: gpus: expected a mapping"),
    ("gpus:\n  a100: 40\n", r"site\.yaml:2: gpus\.a100: expected a mapping of fields"),
    ("gpus: {a100: {memory_gb: 40}\n", r"site\.yaml: not valid YAML"),
]


@pytest.mark.parametrize("text, message", BAD)
def test_a_bad_entry_is_named_by_file_line_and_field(tmp_path, text, message):
    with pytest.raises(CatalogError, match=message):
        read_site_catalog(_write(tmp_path, text))


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(CatalogError, match=r"nowhere\.yaml: file not found"):
        read_site_catalog(tmp_path / "nowhere.yaml")


# --- through models.yaml --------------------------------------------------------------------

def _models_yaml(tmp_path: Path, catalog_line: str | None, gpu: str = "h100-nvl") -> Path:
    """examples/university.yaml with its A100 partition holding ``gpu`` and, when given, a
    ``catalog:`` line; relative paths in it are beside the written file."""
    text = (REPO / "examples" / "university.yaml").read_text()
    text = text.replace("/scratch/shared/coral-hpc", str(tmp_path / "shared"))
    text = text.replace("~/.local/state/coral-hpc/lab-llm.db", str(tmp_path / "lab-llm.db"))
    text = text.replace("gpu_types: [a100-80g]", f"gpu_types: [{gpu}]")
    if catalog_line is not None:
        text = text.replace("\ncluster:\n", f"\n{catalog_line}\ncluster:\n", 1)
    folder = tmp_path / "site"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "models.yaml"
    path.write_text(text)
    return path


def _validate(path: Path, *extra: str):
    return CliRunner().invoke(cli, ["validate", str(path), "--snapshot", str(SNAPSHOT), *extra])


def test_validate_knows_a_site_gpu_type_only_through_the_catalogue(tmp_path):
    without = _validate(_models_yaml(tmp_path, None))
    assert without.exit_code == 2, without.output
    assert "GPU type 'h100-nvl' is not in the performance model's catalogue" in " ".join(
        without.output.split())
    path = _models_yaml(tmp_path, "catalog: site-catalog.yaml")  # relative: beside models.yaml
    shutil.copy(EXAMPLE, path.parent / "site-catalog.yaml")
    assert load_deployment(path).catalog == str(path.parent / "site-catalog.yaml")
    result = _validate(path, "--json")
    assert result.exit_code == 0, result.output
    facts = {f["name"]: f for f in json.loads(result.stdout)["model_facts"]}
    assert facts["llama-8b"]["gpu_dtypes"]["h100-nvl"] == "bfloat16"


def test_a_model_entry_of_the_site_catalogue_is_an_architecture(tmp_path):
    path = _models_yaml(tmp_path, "catalog: site-catalog.yaml", gpu="a100-80g")
    shutil.copy(EXAMPLE, path.parent / "site-catalog.yaml")
    text = path.read_text().replace("architecture: llama-3.1-8b", "architecture: llama-2-13b", 1)
    path.write_text(text)
    result = _validate(path, "--json")
    assert result.exit_code == 0, result.output
    facts = {f["name"]: f for f in json.loads(result.stdout)["model_facts"]}
    assert (facts["llama-8b"]["layers"], facts["llama-8b"]["weight_gb"]) == (40, 26.03)
    assert facts["llama-8b"]["derived_from"] == (
        f"architecture: llama-2-13b (site catalogue {path.parent / 'site-catalog.yaml'})")


def test_a_bad_catalogue_stops_validate_with_exit_2_naming_its_line(tmp_path):
    path = _models_yaml(tmp_path, "catalog: site-catalog.yaml")
    (path.parent / "site-catalog.yaml").write_text(
        "gpus:\n  h100-nvl:\n    memory_gb: ninety-four\n")
    result = _validate(path)
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.split())
    assert "catalog:" in flat
    assert (f"{path.parent / 'site-catalog.yaml'}:3: entry 'h100-nvl': field 'memory_gb' = "
            "'ninety-four' is not a float") in flat


def test_a_deployment_without_catalogue_puts_the_shipped_one_back(tmp_path):
    path = _models_yaml(tmp_path, "catalog: site-catalog.yaml")
    shutil.copy(EXAMPLE, path.parent / "site-catalog.yaml")
    assert derive_models(load_deployment(path)) == []
    assert catalog.canonical_gpu_name("h100-nvl") == "h100-nvl"
    plain = _models_yaml(tmp_path, None, gpu="a100-80g")
    assert derive_models(load_deployment(plain)) == []
    assert catalog.canonical_gpu_name("h100-nvl") is None
    assert catalog.gpu_spec("a100-80g").interconnect == "nvlink"


# --- the sim engine in a replica job reads the same catalogue ---------------------------------

def test_a_sim_replica_is_handed_the_catalogue_and_reads_it(tmp_path):
    from coral_hpc.engine.args import parse_args
    from coral_hpc.engine.sim import StartupError, prepare
    from coral_hpc.launch.render import render_engine_script
    from tests.unit.launch_cases import case_spec
    from tests.unit.test_launch_render import _engine_argv

    spec = case_spec("single", "sim", sim_catalog=str(EXAMPLE))
    argv = _engine_argv(render_engine_script(spec, rank=0, port=24001), tmp_path)
    assert argv[argv.index("--sim-catalog") + 1] == str(EXAMPLE)
    plain = _engine_argv(render_engine_script(case_spec("single", "sim"), rank=0, port=24001),
                         tmp_path)
    assert "--sim-catalog" not in plain  # no catalogue: the argv of before

    line = ["llama", "--sim-arch", "llama-3.1-8b", "--sim-gpu-types", "h100-nvl"]
    with pytest.raises(StartupError, match="unknown GPU type 'h100-nvl'"):
        prepare(parse_args(line))
    prepared = prepare(parse_args([*line, "--sim-catalog", str(EXAMPLE)]))
    assert prepared.kv_capacity_tokens > 0
    bad = _write(tmp_path, "gpus:\n  h100-nvl:\n    memory_gb: lots\n")
    with pytest.raises(StartupError, match=r"--sim-catalog: .*site\.yaml:3: entry 'h100-nvl'"):
        prepare(parse_args([*line, "--sim-catalog", str(bad)]))


# --- prices: `price: catalog` takes each GPU type's price from the site catalogue ------------

PRICES = ("gpus:\n  v100-32g:\n    price_per_gpu_hour: 1.0\n"
          "  a100-80g:\n    price_per_gpu_hour: 3.0\n")


def _priced_yaml(tmp_path: Path, price: str, catalogue: str | None = PRICES) -> Path:
    """examples/university.yaml with ``price`` for both partitions (and the catalogue)."""
    path = _models_yaml(tmp_path, "catalog: site-catalog.yaml" if catalogue else None,
                        gpu="a100-80g")
    text = path.read_text()
    for gpu in ("v100-32g", "a100-80g"):
        text = text.replace(f"gpu_types: [{gpu}]\n      price: billing",
                            f"gpu_types: [{gpu}]\n      price: {price.format(gpu=gpu)}")
    path.write_text(text)
    if catalogue:
        (path.parent / "site-catalog.yaml").write_text(catalogue)
    return path


def _plan(path: Path) -> dict:
    result = CliRunner().invoke(cli, ["plan", str(path), "--snapshot", str(SNAPSHOT), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_plan_priced_from_the_catalogue_costs_what_the_same_prices_in_models_yaml_cost(
        tmp_path):
    from_catalogue = _plan(_priced_yaml(tmp_path / "a", "catalog"))
    text_path = _priced_yaml(tmp_path / "b", "{{{gpu}: X}}", catalogue=None)
    text = text_path.read_text().replace("{v100-32g: X}", "{v100-32g: 1.0}")
    text_path.write_text(text.replace("{a100-80g: X}", "{a100-80g: 3.0}"))
    explicit = _plan(text_path)
    assert from_catalogue["cost_unit"] == explicit["cost_unit"] == "gpu_hour"
    assert from_catalogue["cost_per_hour"] == explicit["cost_per_hour"] > 0
    assert from_catalogue["replicas"] == explicit["replicas"]


def test_cost_prices_a_gpu_hour_from_the_catalogue(tmp_path):
    from coral_hpc.accounting.cost import Pricing

    pricing = Pricing.from_deployment(load_deployment(_priced_yaml(tmp_path, "catalog")))
    assert pricing.unit == "gpu_hour"
    assert pricing.gpu_hour_prices[("gpu-a100", "a100-80g")] == 3.0
    assert pricing.gpu_hour_prices[("gpu-v100", "v100-32g")] == 1.0


def test_price_catalog_without_a_catalogue_or_its_price_is_refused(tmp_path):
    result = _validate(_priced_yaml(tmp_path / "a", "catalog", catalogue=None))
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.split())
    assert "cluster.partitions[0].price: 'catalog' takes each GPU type's price_per_gpu_hour" in flat
    result = _validate(_priced_yaml(tmp_path / "b", "catalog",
                                    catalogue="gpus:\n  a100-80g:\n    price_per_gpu_hour: 3\n"))
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.split())
    assert ("cluster.partitions[0].price: 'catalog', but the site catalogue" in flat
            and "gives no price_per_gpu_hour for GPU type(s) ['v100-32g']" in flat)


@pytest.mark.parametrize("price, message", [
    ("-1", "must be within 0..10000, got -1"),
    ("1.0e+9", "must be within 0..10000, got 1e+09"),
    ("cheap", "= 'cheap' is not a float"),
])
def test_a_bad_catalogue_price_is_named_with_its_line(tmp_path, price, message):
    path = _write(tmp_path, f"gpus:\n  a100:\n    memory_gb: 40\n    price_per_gpu_hour: {price}\n")
    with pytest.raises(CatalogError, match=rf"site\.yaml:4: entry 'a100': field "
                                           rf"'price_per_gpu_hour' {re.escape(message)}"):
        read_site_catalog(path)
