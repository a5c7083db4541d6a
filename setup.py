"""Package layout that pyproject.toml cannot express alone.

The top-level ``sbatch_templates/`` and ``profiles/`` folders ship *inside* the packages that read
them (``coral_hpc.sbatch_templates`` and ``solver.profiles``), so an installed wheel finds them
without the checkout. Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

DATA_PACKAGES = {"coral_hpc.sbatch_templates": "sbatch_templates", "solver.profiles": "profiles"}

setup(
    packages=find_packages(include=["coral_hpc", "coral_hpc.*", "solver", "solver.*"])
    + list(DATA_PACKAGES),
    package_dir=DATA_PACKAGES,
)
