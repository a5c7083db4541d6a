"""The shipped catalogue states where its figures come from inside the project
(docs/catalog-sources.md, and each file's own header), not in files outside it."""

from __future__ import annotations

from coral_solver import catalog
from coral_solver.resources import profiles_dir
from tests.conftest import REPO


def test_the_shipped_catalogue_states_its_sources_inside_the_project():
    """No catalogue file points outside the project for where its figures come from."""
    for path in sorted(profiles_dir().glob("*.yaml")) + [REPO / "tests" / "data" / "hf_configs"
                                                         / "README.md"]:
        assert "../shared" not in path.read_text(), path
    sources = (REPO / "docs" / "catalog-sources.md").read_text()
    for gpu in catalog.load_gpus():
        assert f"`{gpu}`" in sources, gpu
    for model in catalog.load_models():
        assert f"`{model}`" in sources, model
