"""``python -m coral_hpc.engine``: the sim engine server (see :mod:`coral_hpc.engine.sim`)."""

import sys

from coral_hpc.engine.sim import main

sys.exit(main())
