"""A day of a 1,000-node site in virtual time (issue 15 item 5): the site and its 50 models
(:mod:`.site`), a day of trace per model (:mod:`coral_hpc.simulate.day`), and the virtual-time
loop that re-plans through the daemon's planner and serves sampled windows with the sim
engine's scheduler (:mod:`.run`). Run it with ``python bench/scale_day.py``."""
