"""Package layout that pyproject.toml cannot express alone.

- The solver lives in the top-level ``solver/`` folder as the import package ``coral_solver``
  (``solver/coral_solver``): the folder keeps the project's layout, the import name is the
  project's own (a top-level ``solver`` package would clash with another project's on the index).
- The top-level ``sbatch_templates/`` and ``profiles/`` folders ship *inside* the packages that
  read them (``coral_hpc.sbatch_templates`` and ``coral_solver.profiles``), so an installed wheel
  finds them without the checkout.

Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

SOLVER_ROOT = "solver"
DATA_PACKAGES = {
    "coral_hpc.sbatch_templates": "sbatch_templates",
    "coral_solver.profiles": "profiles",
}
SOLVER_PACKAGES = find_packages(where=SOLVER_ROOT, include=["coral_solver", "coral_solver.*"])

setup(
    packages=find_packages(include=["coral_hpc", "coral_hpc.*"])
    + SOLVER_PACKAGES
    + list(DATA_PACKAGES),
    package_dir={
        **{name: f"{SOLVER_ROOT}/{name.replace('.', '/')}" for name in SOLVER_PACKAGES},
        **DATA_PACKAGES,
    },
)
