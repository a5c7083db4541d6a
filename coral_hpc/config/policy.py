"""The daemon's behaviour: the ``policy`` section (how it plans and reacts) and the
``retention`` section (what it keeps, and for how long)."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import Field, field_validator

from coral_hpc.config.base import _Frozen
from coral_hpc.config.scale import (
    DEFAULT_WAKE_TIMEOUT_S,
    WakeMode,
    idle_after_value,
    wake_timeout_value,
)

#: policy.solver besides ``highs``: ``pyomo:`` and a name Pyomo's SolverFactory may know
SOLVER_FORM = re.compile(r"pyomo:[A-Za-z][A-Za-z0-9_.-]{0,63}")
#: policy.plan_for besides ``mean``: ``p`` and a percentile, e.g. ``p95`` or ``p99.5``
PERCENTILE_FORM = re.compile(r"p(\d{1,3}(?:\.\d{1,2})?)")
#: A percentile of the short-window rate covers at least this many windows: of 20 windows the
#: 95th percentile lies between the two busiest; of fewer it is simply the busiest.
MIN_DEMAND_WINDOWS = 20
#: ... and at most this many: the gateway sends them all at every demand scrape (360 small
#: counts per model, an hour of 10-s windows), and an hour samples a day's burst shape.
MAX_DEMAND_WINDOWS = 360


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
    # The mean keeps today's cost; a percentile buys SLO attainment under bursty traffic for
    # capacity that idles between bursts (docs/how-it-works.md, "What the plan is sized for").
    plan_for: str = Field(
        default="mean",
        description="the arrival rate each model is sized for (before demand_headroom): mean, "
                    "or pNN — the NNth percentile (50 .. 100) of the rate over demand_window_s "
                    "windows, e.g. p95",
    )
    # 10 s: a few times the TTFT SLOs (1-5 s in examples/models.yaml and the paper's Table 3):
    # a burst shorter than an SLO drains within it, one lasting several SLOs does not. The
    # 10-s rate is the one issue 24's evaluation measured on the Azure traces.
    demand_window_s: float = Field(
        default=10.0, ge=1, le=600,
        description="plan_for pNN: the window (seconds) the short-window rate is counted over; "
                    "a few times the models' TTFT SLO",
    )
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
    # model (a layout nobody measured) is no candidate at all. Disaggregated, its prefill and
    # decode replicas are planned from role profiles (`coral-hpc profile --roles`).
    measured_only: bool = Field(
        default=False,
        description="Stage 1: plan only layouts whose throughput was measured (coral-hpc "
                    "profile; prefill and decode replicas: coral-hpc profile --roles); others "
                    "are no candidates",
    )

    # Scale to zero (docs/scale-to-zero.md): off unless the site sets a default or a model its own.
    idle_after: float | None = Field(
        default=None,
        description="default for models with min_replicas 0: with no request for this long "
                    "(e.g. 20m) a model's replicas drain and its next request wakes it; unset "
                    "or never = models keep their replicas")
    wake_timeout: float = Field(
        default=DEFAULT_WAKE_TIMEOUT_S,
        description="default: how long a request for a cold model is held while it wakes "
                    "(1s .. 1h); held streams get SSE comment lines meanwhile")
    wake: WakeMode = Field(
        default="hold",
        description="default: hold (a request for a cold model waits for its wake) or reject "
                    "(503 with Retry-After from Slurm's expected start plus the start-up time)")

    @field_validator("idle_after", mode="before")
    @classmethod
    def _idle_after(cls, value: Any) -> float | None:
        return idle_after_value(value) or None

    @field_validator("wake_timeout", mode="before")
    @classmethod
    def _wake_timeout(cls, value: Any) -> float | None:
        return wake_timeout_value(value)

    # Analytic by default: a model's library takes seconds (bench/results/stage1_speed.md),
    # where simulating a template costs seconds (a model's library minutes); either is built
    # once and cached. "simulated" rates each template by its whole
    # replica, all stages end to end, and rates pipelines that the analytic per-stage split
    # undervalues (docs/how-it-works.md, "What a template serves").
    capacity: Literal["analytic", "simulated"] = Field(
        default="analytic",
        description="Stage 1: a template's throughput from the analytic per-stage model, or "
                    "simulated: the highest Poisson rate at which slo_attainment of the "
                    "model's requests meet TTFT and TPOT, the whole replica simulated "
                    "(a prefill-only or decode-only replica: its share of them, KV hand-off "
                    "included), lengths drawn from the model's lengths.trace when given, else "
                    "exponential with its mix's means",
    )
    # 0.95: the attainment issue 24 and the paper (§5) judge plans by.
    slo_attainment: float = Field(
        default=0.95, gt=0, le=1,
        description="capacity simulated: the share of requests a template's rated "
                    "throughput keeps within both TTFT and TPOT",
    )

    @field_validator("solver")
    @classmethod
    def _solver_form(cls, value: str) -> str:
        if value != "highs" and not SOLVER_FORM.fullmatch(value):
            raise ValueError(f"{value!r} is not a solver: give 'highs' or 'pyomo:<name>', "
                             "<name> a Pyomo SolverFactory name (pyomo:gurobi, pyomo:cplex, "
                             "pyomo:scip, pyomo:appsi_highs)")
        return value

    @field_validator("plan_for", mode="before")
    @classmethod
    def _plan_for_number(cls, value: Any) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise ValueError(f"{value} is a number: write p{value:g} for that percentile of the "
                             "short-window rate, or mean")
        return value

    @field_validator("plan_for")
    @classmethod
    def _plan_for_form(cls, value: str) -> str:
        match = PERCENTILE_FORM.fullmatch(value)
        if value != "mean" and (match is None or not 50 <= float(match.group(1)) <= 100):
            raise ValueError(f"{value!r} is not a rate to plan for: give 'mean' or 'pNN', NN a "
                             "percentile from 50 to 100 of the rate over demand_window_s "
                             "windows (p95: the rate 95 % of windows stay below)")
        return value

    @property
    def plan_percentile(self) -> float | None:
        """The percentile ``plan_for`` names; None when it is ``mean``."""
        return None if self.plan_for == "mean" else float(self.plan_for[1:])

    @property
    def demand_windows(self) -> int:
        """How many ``demand_window_s`` windows a percentile covers: the last re-plan interval,
        at least :data:`MIN_DEMAND_WINDOWS` and at most :data:`MAX_DEMAND_WINDOWS` of them."""
        windows = math.ceil(self.replan_interval_s / self.demand_window_s - 1e-9)
        return max(MIN_DEMAND_WINDOWS, min(MAX_DEMAND_WINDOWS, windows))

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
