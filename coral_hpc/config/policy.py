"""The daemon's behaviour: the ``policy`` section (how it plans and reacts) and the
``retention`` section (what it keeps, and for how long)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from coral_hpc.config.base import _Frozen

#: policy.solver besides ``highs``: ``pyomo:`` and a name Pyomo's SolverFactory may know
SOLVER_FORM = re.compile(r"pyomo:[A-Za-z][A-Za-z0-9_.-]{0,63}")


class PolicyConfig(_Frozen):
    """How the daemon plans and reacts. Every field has a default that suits a real cluster."""

    replan_interval_s: float = Field(
        default=60.0, ge=1, le=86400, description="plan at least this often (1 s .. 1 day)"
    )
    # One observe cycle costs three Slurm calls (nodes, partitions, own jobs): every 6 s that is
    # 30 calls a minute, a load a shared slurmctld tolerates, and still a resubmission within
    # ~10 s of a drain or a failed job (bench/results/reaction.md). At least 1 s: at 0.3 s the
    # daemon sent ~19x the normal calls and submitted nothing, each cycle outrun by the next
    # (issue 16).
    poll_interval_s: float = Field(
        default=6.0, ge=1, le=3600, description="observe Slurm this often (1 s .. 1 h)"
    )
    demand_headroom: float = Field(default=0.2, ge=0, le=5, description="plan for demand × (1+h)")
    demand_change_threshold: float = Field(
        default=0.25, gt=0, le=100, description="re-plan early when demand moves by this fraction"
    )
    pending_timeout_s: float = Field(
        default=600.0, gt=0, le=7 * 86400, description="re-plan a pending replica"
    )
    walltime_lead_s: float = Field(
        default=900.0, ge=0, le=7 * 86400, description="start successors this early"
    )
    startup_time_s: float = Field(
        default=180.0, gt=0, le=86400, description="submit→READY until learnt"
    )
    crash_limit: int = Field(
        default=3, ge=1, le=1000, description="crashes before a template cools down"
    )
    crash_cooldown_s: float = Field(
        default=1800.0, gt=0, le=7 * 86400,
        description="a template with crash_limit crashes within this window is kept out of "
                    "plans this long",
    )
    # A first retry after a minute: a vLLM start that fails (a context its KV cache cannot hold,
    # a missing checkpoint) fails about a minute after submit (examples/vllm-cpu.profiles
    # README: "FAILED about a minute after submit"), so retrying sooner only repeats it.
    start_backoff_s: float = Field(
        default=60.0, gt=0, le=7 * 86400,
        description="a template whose replica failed at start (before READY) is kept out of "
                    "plans this long, twice as long after each further failed start in a row, "
                    "at most crash_cooldown_s",
    )
    n_max: int = Field(default=6, ge=1, le=16, description="Stage 1: nodes per template at most")
    rho: float = Field(default=12.0, gt=1, description="Stage 1: GPU memory ≤ ρ × model size")
    heterogeneous: bool = Field(default=True, description="allow stages on different GPU types")
    # At most a week: Slurm's backfill plans 1 day ahead by default (bf_window), so a start
    # estimate much further out is no estimate to plan capacity on.
    max_queue_wait_s: float = Field(
        default=1800.0, ge=0, le=7 * 86400,
        description="horizon: GPUs Slurm expects to give us within this count as available "
                    "(0 .. 7 days)",
    )

    max_tp: int = Field(default=8, ge=1, le=64,
                        description="Stage 1: largest tensor-parallel degree (1: pipelines only)")
    solver_time_limit_s: float = Field(
        default=10.0, gt=0, le=3600,
        description="Stage 2: time one solve may take; the best plan found by then is used",
    )
    solver_mip_gap: float = Field(
        default=1e-4, ge=0, lt=1,
        description="Stage 2: stop when the plan's cost is within this fraction of the optimum",
    )
    # HiGHS through its matrix interface is the fast path and ships with coral-hpc; a site with
    # a licensed solver (Gurobi, CPLEX, SCIP) names it through Pyomo: the same Stage-2 model,
    # built through Pyomo (slower) and solved by that solver (INSTALL.md, "Licensed solvers").
    # Whether the solver is installed here is checked when planning, not on load: `validate`
    # never imports Pyomo.
    solver: str = Field(
        default="highs",
        description="Stage 2's solver: highs (HiGHS, direct), or pyomo:NAME for any solver "
                    "Pyomo's SolverFactory drives (pyomo:gurobi, pyomo:cplex, pyomo:scip, "
                    "pyomo:appsi_highs)",
    )
    # Off by default: prefill and decode replicas need a KV connector the site has set up
    # (engine.kv_connector: a network connector on GPU nodes, or a shared directory) and each
    # request makes two hops; a site opts in. "auto" then lets Stage 2 pick per model whatever
    # is cheaper (aggregated, disaggregated or both); "on" plans prefill + decode replicas only.
    disaggregation: Literal["auto", "on", "off"] = Field(
        default="off", description="split prefill and decode onto separate replicas"
    )
    kv_fabric_gbs: float | None = Field(
        default=None, gt=0,
        description="GB/s the site's fabric carries for KV transfers in total; unset = no limit",
    )
    # An engine the analytic GPU model does not describe (vLLM's CPU build) is planned from
    # `coral-hpc profile`'s measurements alone: a template whose figure would come from the
    # model (a layout nobody measured) is no candidate at all.
    measured_only: bool = Field(
        default=False,
        description="Stage 1: plan only layouts whose throughput was measured (coral-hpc "
                    "profile); others are no candidates",
    )

    @field_validator("solver")
    @classmethod
    def _solver_form(cls, value: str) -> str:
        if value != "highs" and not SOLVER_FORM.fullmatch(value):
            raise ValueError(f"{value!r} is not a solver: give 'highs' or 'pyomo:<name>', "
                             "<name> a Pyomo SolverFactory name (pyomo:gurobi, pyomo:cplex, "
                             "pyomo:scip, pyomo:appsi_highs)")
        return value

    @field_validator("disaggregation", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: Any) -> Any:
        # YAML 1.1 (PyYAML) reads a bare on/off as a boolean: take it as the word it was
        if value is True:
            return "on"
        if value is False:
            return "off"
        return value


class RetentionConfig(_Frozen):
    """What the daemon keeps, and for how long. A daemon runs for months: without limits its
    logs, the replica folders on the shared filesystem and its database only grow."""

    log_max_mb: float = Field(
        default=20.0, gt=0,
        description="rotate the daemon's (serve --log-file) and the gateway's log at this size",
    )
    log_backups: int = Field(
        default=5, ge=1, description="rotated logs kept per log: at most (1 + this) × log_max_mb"
    )
    replica_files_days: float = Field(
        default=14.0, gt=0,
        description="remove an ended replica's folder, logs and rendezvous files after this "
                    "long (two weeks of post-mortems)",
    )
    events_days: float = Field(
        default=90.0, gt=0, description="keep `coral-hpc status` events this long"
    )
    history_days: float = Field(
        default=400.0, gt=0,
        description="keep plans, ended replicas, metered demand and token counts this long: a "
                    "year of `coral-hpc cost` and `report` (booked vs predicted, cost per token)",
    )
    demand_compact_after_days: float = Field(
        default=2.0, gt=0,
        description="merge per-scrape demand intervals older than this into hourly rows",
    )
    prune_interval_s: float = Field(
        default=3600.0, gt=0, description="apply these limits this often"
    )
    access_log_days: float = Field(
        default=90.0, gt=0,
        description="keep the gateway's access log (one file per UTC day under "
                    "<state_dir>/<deployment>/access/) this long",
    )
