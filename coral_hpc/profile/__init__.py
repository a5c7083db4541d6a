"""``coral-hpc profile``: measure the real engine in Slurm jobs and write measured profiles.

For each (model, partition) asked for, one replica job runs the engine through the ordinary
launch path (the partition's environment, the same entrypoint, readiness and drain as
``serve``), then this side measures it over HTTP: start-up time, KV capacity (vLLM's
``/metrics``), prefill and decode step times over batch sizes and lengths, and the most
requests/s that meet the model's SLO for its mix. Results are written as measured profiles
(:mod:`coral_solver.perf_profiles` schema) under the deployment's ``profiles_dir`` (default
``<state_dir>/<deployment>/profiles``), never into the installed package; ``plan`` and ``serve``
read them from there. A task whose result file exists is skipped (resumable, reused) unless
``force``. Pipelines (``pp`` > 1, a multi-node job of one partition) are measured the same way
and written under ``pipelines/``: the solver's per-stage schema does not describe them.
"""

from coral_hpc.profile.measure import EngineMeasurements, measure_engine
from coral_hpc.profile.run import ProfileTask, profile_tasks, run_profiles
from coral_hpc.profile.write import profile_path, write_profile

__all__ = [
    "EngineMeasurements", "ProfileTask", "measure_engine", "profile_path", "profile_tasks",
    "run_profiles", "write_profile",
]
