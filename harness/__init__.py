"""Real local stacks that the tests and the benches both drive, and clean up after.

- :mod:`.daemon_setup`: a sim-engine models.yaml and the daemon ``serve`` builds, minus the
  gateway (the dev cluster's Slurm underneath);
- :mod:`.slurm_jobs`: what Slurm runs for a deployment, read independently, and the clean-up;
- :mod:`.busy_cluster`: the dev cluster made busy by another lab's jobs;
- :mod:`.gateway` and :mod:`.slo_stack`: a real gateway with stub replicas
  (:mod:`.openai_stub_server`) or with one sim engine per planned replica;
- :mod:`.wait`: waiting on an event, not the clock.

It is neither product (the wheel ships only ``coral_hpc`` and ``coral_solver``) nor a test or a
bench: ``tests/`` and ``bench/`` may each import it, never each other (the import contract in
pyproject.toml), and it imports neither.
"""
