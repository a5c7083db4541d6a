"""Cost accounting from Slurm's own books (sacct, read through ``coral_hpc.slurm``).

- :mod:`~coral_hpc.accounting.usage`: records → runs → seconds inside a range, per time bin.
- :mod:`~coral_hpc.accounting.cost`: the deployment's prices applied (GPU-hours or billing).
- :mod:`~coral_hpc.accounting.predicted`: the plans' prediction and the difference in parts.
- :mod:`~coral_hpc.accounting.summary`: one :class:`CostReport` (table, ``--json``, ``--csv``).
- :mod:`~coral_hpc.accounting.report`: plots and the HTML page (matplotlib, imported lazily).
"""

from coral_hpc.accounting.summary import CostReport, build_report

__all__ = ["CostReport", "build_report"]
