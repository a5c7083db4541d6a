"""``python -m tests.integration.serve_process CONFIG CANDIDATES_JSON``: :func:`coral_hpc.daemon.serve`
— gateway child process, info file, SIGTERM/SIGHUP handlers — in a process of its own, with the
rule-based planner of :mod:`tests.integration.serve_harness` limited to the models the current
``models.yaml`` configures (so a SIGHUP that adds a model is what lets its candidate be planned).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from coral_hpc.daemon import serve
from coral_hpc.plan.planner import PlanOutcome, PlanRequest
from tests.integration.serve_harness import PreferencePlanner, candidates_from_json


class ConfiguredPreferencePlanner(PreferencePlanner):
    """:class:`PreferencePlanner` over the candidates of configured models only."""

    def __call__(self, request: PlanRequest) -> PlanOutcome:
        configured = {m.name for m in request.deployment.models}
        return PreferencePlanner([c for c in self.candidates if c.model in configured])(request)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    planner = ConfiguredPreferencePlanner(candidates_from_json(Path(argv[1]).read_text()))
    serve(argv[0], planner, gateway_listen="127.0.0.1:0")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
