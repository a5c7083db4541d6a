"""The Coral paper's evaluation rebuilt on this project's solver (issue 13): setups as data
(:mod:`.setups`), trace-driven workloads (:mod:`.workload`), the event-based evaluation
(:mod:`.evaluate`). Run it with ``python bench/paper.py``."""
