"""Package layout that pyproject.toml cannot express alone.

- The solver lives in the top-level ``solver/`` folder as the import package ``coral_solver``
  (``solver/coral_solver``), beside the replica simulator it shares with the sim engine
  (``solver/coral_replica_sim``): the folder keeps the project's layout, the import names are the
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
SOLVER_PACKAGES = find_packages(
    where=SOLVER_ROOT,
    include=["coral_solver", "coral_solver.*", "coral_replica_sim", "coral_replica_sim.*"],
)

setup(
    packages=find_packages(include=["coral_hpc", "coral_hpc.*"])
    + SOLVER_PACKAGES
    + list(DATA_PACKAGES),
    package_dir={
        **{name: f"{SOLVER_ROOT}/{name.replace('.', '/')}" for name in SOLVER_PACKAGES},
        **DATA_PACKAGES,
    },
)
