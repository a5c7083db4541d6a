"""Per-model demand the plan must serve: declared in ``models.yaml`` or measured at the gateway.

Units (../shared/ARCHITECTURE.md): requests per second of the model's own request mix.

- **Declared** demand (``requests_per_s`` or ``output_tokens_per_s``, converted on load) is used
  as written, with the declared mix.
- **Measured** demand (``demand: auto``) comes from the gateway's counters, which the daemon
  stores as per-interval deltas (:class:`coral_hpc.store.DemandInterval`). Requests the gateway
  turned away for lack of capacity count as demand too, or a model with no replica could never
  get one. Rates are smoothed by an exponentially weighted moving average whose weight follows
  each interval's length (so irregular scrapes weigh what they cover). The estimate is rebuilt
  from stored intervals each time — no hidden state — so a restarted daemon sees the same demand.
- The measured **mix** (mean prompt and generated tokens per served request) is rounded to
  buckets, because Stage-1 templates are cached per mix: a mix wobbling between 250 and 260
  tokens must not re-run Stage 1 or churn replicas.
- **What the plan is sized for** (``policy.plan_for``): the mean rate above (``mean``, the
  default), or ``pNN`` — the NNth percentile of the rate over short windows
  (``policy.demand_window_s``, 10 s by default) of the last re-plan interval
  (:attr:`~coral_hpc.config.PolicyConfig.demand_windows` windows): requests arrive in bursts,
  and a plan sized for the mean queues every burst. The gateway's meter counts arrivals per
  window (``serve``), ``coral-hpc simulate`` counts them in the trace. A measured model is
  sized for that percentile (never below its mean); a declared one for its declared rate times
  the measured percentile/mean ratio of its arrivals (the declared rate when none arrived).
  Until a window has been counted the plan is sized for the mean, and says so.
- Either way the plan is asked for ``sized rate × (1 + policy.demand_headroom)``.
- :func:`changed_models` says which models moved beyond ``policy.demand_change_threshold`` since
  the last plan, the trigger for an early re-plan.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from coral_hpc.config import Deployment, ModelConfig, PolicyConfig
from coral_hpc.store import DemandInterval

#: Below this rate (requests/s) two demands count as equal for change detection, so a model
#: idling between 0.001 and 0.002 req/s does not trigger re-plans by "doubling".
DEFAULT_CHANGE_FLOOR_RPS = 0.05


@dataclass(frozen=True)
class Mix:
    """Mean tokens per request: prompt (input) and generated (output)."""

    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Measured:
    """Smoothed gateway counters of one model."""

    requests_per_s: float  # served + rejected: what users asked for
    served_per_s: float
    rejected_per_s: float
    prompt_tokens_per_s: float
    generated_tokens_per_s: float
    until: float  # end of the newest interval seen

    @property
    def mix(self) -> Mix | None:
        """Mean tokens per served request, unrounded; None before any request was served."""
        if self.served_per_s <= 0:
            return None
        return Mix(
            input_tokens=max(1, round(self.prompt_tokens_per_s / self.served_per_s)),
            output_tokens=max(1, round(self.generated_tokens_per_s / self.served_per_s)),
        )


@dataclass(frozen=True)
class ArrivalWindows:
    """Arrivals of one model per short window, oldest first, closed windows only: as the
    gateway's meter counts them (``serve``) or the trace holds them (``simulate``)."""

    window_s: float
    counts: tuple[int, ...]
    end: float = 0.0  #: end of the newest window (wall clock in serve, trace time in simulate)


@dataclass(frozen=True)
class ModelDemand:
    """What the plan must serve for one model."""

    model: str
    requests_per_s: float  # the mean rate (declared or measured), before headroom
    planned_rps: float  # sized rate × (1 + headroom): the Stage-2 demand
    mix: Mix  # bucketed when measured
    source: Literal["declared", "measured", "unmeasured"]
    #: the measured mix before bucketing (None: declared or nothing served yet), so change
    #: detection can tell a mix that moved from one that wobbles across a bucket boundary
    measured_mix: Mix | None = None
    #: the rate the plan is sized for before headroom (``policy.plan_for``); None: the mean
    sized_rps: float | None = None
    #: why that rate, in words (``plan`` and ``status`` show it)
    basis: str = "the mean rate"

    @property
    def sized(self) -> float:
        """The rate sized for before headroom (the mean unless ``policy.plan_for`` says else)."""
        return self.requests_per_s if self.sized_rps is None else self.sized_rps


def rate_percentile(counts: Sequence[int], window_s: float, percentile: float) -> float | None:
    """The ``percentile`` (0 .. 100) of the per-window rates ``count / window_s``, requests/s;
    None without a window. An empty window is a rate of 0. Between two windows' rates the
    percentile is interpolated linearly (numpy's default method): p100 is the busiest window,
    p50 the median."""
    if window_s <= 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    if not 0 <= percentile <= 100:
        raise ValueError(f"percentile must be within 0 .. 100, got {percentile}")
    if not counts:
        return None
    ordered = sorted(counts)
    position = (len(ordered) - 1) * percentile / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    value = ordered[low] + (ordered[high] - ordered[low]) * (position - low)
    return value / window_s


def _sized(mean_rps: float, source: str, windows: ArrivalWindows | None,
           percentile: float | None, window_s: float) -> tuple[float, str]:
    """The rate to size for before headroom and why (see the module doc)."""
    if percentile is None:
        return mean_rps, "the mean rate"
    name = f"p{percentile:g}"
    if windows is not None and windows.window_s != window_s:
        return mean_rps, (f"the mean: the gateway counts {windows.window_s:g} s windows, not "
                          f"{window_s:g} s (restart it with this file)")
    if windows is None or not windows.counts:
        return mean_rps, "the mean: no window counted yet"
    n = len(windows.counts)
    rate = rate_percentile(windows.counts, window_s, percentile) or 0.0
    if source == "declared":
        window_mean = sum(windows.counts) / (n * window_s)
        if window_mean <= 0:
            return mean_rps, f"the declared rate: nothing arrived in the last {n} windows"
        factor = max(1.0, rate / window_mean)
        return mean_rps * factor, f"declared × {factor:.2f} ({name}/mean of {n} windows)"
    if rate < mean_rps:
        return mean_rps, f"the mean: above the {name} of {n} windows"
    return rate, f"the {name} of {n} windows"


def bucket_tokens(tokens: float) -> int:
    """Round a token count to the nearest bucket (in log space) of 1, 2, 3, 4, 6, 8, 12, 16, 24, …

    Buckets are powers of two and their 1.5× midpoints: every count lands within about ±20 % of
    its bucket, and Stage 1 sees few distinct mixes.
    """
    if tokens <= 1:
        return 1
    target = math.log(tokens)
    exponent = math.floor(math.log2(tokens))
    candidates = [2**exponent, 3 * 2 ** (exponent - 1) if exponent >= 1 else 1, 2 ** (exponent + 1)]
    return min(candidates, key=lambda c: (abs(math.log(c) - target), -c))


def measure(intervals: Iterable[DemandInterval], tau_s: float) -> dict[str, Measured]:
    """Smooth per-interval counter deltas into per-model rates (EWMA with time constant ``tau_s``).

    Intervals for the same model and the same ``[start, end)`` (one per API key) are summed
    first. Each interval moves the average towards its own rate by ``1 − exp(−length / tau_s)``;
    the first interval of a model sets it.
    """
    if tau_s <= 0:
        raise ValueError(f"tau_s must be > 0, got {tau_s}")
    per_span: dict[tuple[str, float, float], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for item in intervals:
        totals = per_span[(item.model, item.start, item.end)]
        # the gateway counts every arrival in `requests`, the rejected ones included
        totals[0] += max(0, item.requests - item.rejected)
        totals[1] += item.rejected
        totals[2] += item.prompt_tokens
        totals[3] += item.generated_tokens
    state: dict[str, list[float]] = {}
    until: dict[str, float] = {}
    for (model, start, end), (served, rejected, prompt, generated) in sorted(
        per_span.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])
    ):
        length = end - start
        if length <= 0:
            continue
        rates = [served / length, rejected / length, prompt / length, generated / length]
        if model not in state:
            state[model] = rates
        else:
            weight = 1.0 - math.exp(-length / tau_s)
            state[model] = [old + weight * (new - old) for old, new in zip(state[model], rates)]
        until[model] = end
    return {
        model: Measured(
            requests_per_s=served + rejected,
            served_per_s=served,
            rejected_per_s=rejected,
            prompt_tokens_per_s=prompt,
            generated_tokens_per_s=generated,
            until=until[model],
        )
        for model, (served, rejected, prompt, generated) in state.items()
    }


def model_demand(model: ModelConfig, measured: Measured | None, headroom: float,
                 windows: ArrivalWindows | None = None, percentile: float | None = None,
                 window_s: float = 10.0) -> ModelDemand:
    """The demand the plan serves for one model: declared, else measured, else zero; sized for
    the mean, or for ``percentile`` of the ``window_s`` rate counted in ``windows``.

    A model with ``demand: auto`` and no traffic yet has zero demand: the plan gives it
    ``min_replicas``; its first requests are rejected (503) and counted, which raises its demand.
    """
    declared_mix = Mix(model.mix.input_tokens, model.mix.output_tokens)
    raw_mix: Mix | None = None
    source: Literal["declared", "measured", "unmeasured"]
    if model.demand != "auto":
        rps, mix, source = float(model.demand_rps or 0.0), declared_mix, "declared"
    elif measured is None:
        rps, mix, source = 0.0, declared_mix, "unmeasured"
    else:
        raw_mix = measured.mix
        mix = (
            Mix(bucket_tokens(raw_mix.input_tokens), bucket_tokens(raw_mix.output_tokens))
            if raw_mix is not None
            else declared_mix
        )
        rps, source = measured.requests_per_s, "measured"
    sized, basis = _sized(rps, source, windows, percentile, window_s)
    return ModelDemand(model.name, rps, sized * (1.0 + headroom), mix, source, raw_mix,
                       sized_rps=sized, basis=basis)


def deployment_demand(
    deployment: Deployment, intervals: Iterable[DemandInterval], tau_s: float | None = None,
    windows: Mapping[str, ArrivalWindows] | None = None,
) -> dict[str, ModelDemand]:
    """Demand for every configured model, in configuration order.

    ``tau_s`` (the smoothing time constant) defaults to the re-plan interval: demand is averaged
    over about one planning period, long enough to ignore bursts the headroom absorbs, short
    enough that a plan follows a real change within a period or two. ``windows`` (by model)
    are the arrivals per short window a ``policy.plan_for`` percentile is taken of; only the
    newest ``policy.demand_windows`` of them count.
    """
    policy = deployment.policy
    tau = tau_s if tau_s is not None else policy.replan_interval_s
    measured = measure(intervals, tau)
    keep = policy.demand_windows
    out = {}
    for m in deployment.models:
        counted = (windows or {}).get(m.name)
        if counted is not None and len(counted.counts) > keep:
            counted = ArrivalWindows(counted.window_s, counted.counts[-keep:], counted.end)
        out[m.name] = model_demand(m, measured.get(m.name), policy.demand_headroom, counted,
                                   policy.plan_percentile, policy.demand_window_s)
    return out


def demand_basis(demand: Iterable[ModelDemand]) -> dict[str, dict[str, float | str]]:
    """Per model the mean rate, the rate sized for, the rate planned for (headroom included) and
    why, as plain data: what a stored plan keeps for ``coral-hpc status``."""
    return {d.model: {"mean_rps": round(d.requests_per_s, 6), "sized_rps": round(d.sized, 6),
                      "planned_rps": round(d.planned_rps, 6), "basis": d.basis}
            for d in demand}


def plan_for_words(policy: PolicyConfig) -> str:
    """``policy.plan_for`` in words, with its window: ``mean`` or ``p95 of the 10 s rate``."""
    if policy.plan_percentile is None:
        return "mean"
    return f"{policy.plan_for} of the {policy.demand_window_s:g} s rate"


def planned_for_lines(plan_for: str, basis: Mapping[str, str]) -> list[str]:
    """What each model was sized for and why, for ``plan`` and ``status``: one line when every
    model says the same, else one per model. ``plan_for``: :func:`plan_for_words`."""
    reasons = {name: why for name, why in basis.items() if why}
    if not reasons:
        return [f"sized for the {plan_for} (policy.plan_for)"]
    if len(set(reasons.values())) == 1:
        return [f"sized for {next(iter(reasons.values()))} (policy.plan_for: {plan_for})"]
    return [f"sized for (policy.plan_for: {plan_for}):"] + [
        f"  {name}: {why}" for name, why in reasons.items()]


def changed_models(
    planned: Mapping[str, ModelDemand],
    current: Mapping[str, ModelDemand],
    threshold: float,
    floor_rps: float = DEFAULT_CHANGE_FLOOR_RPS,
) -> list[str]:
    """Models whose demand moved by more than ``threshold`` (a fraction) since ``planned``, or
    whose mix moved to another bucket, or that appeared or disappeared.

    The change is relative to ``max(planned, floor_rps)``, and a model below ``floor_rps``
    before and after has not changed (its mix is a handful of requests): near-idle models do not
    flap. A new mix bucket counts only when the measured mean itself moved more than
    ``threshold`` from the planned bucket: a mean near a bucket boundary (the Azure code trace's
    28 output tokens sits at the 24/32 boundary) crosses it back and forth every few minutes,
    and at 50 models some model always did, so the daemon re-planned every minute
    (bench/results/scale_day.md).
    """
    changed = []
    for name in sorted(set(planned) | set(current)):
        old, new = planned.get(name), current.get(name)
        if old is None or new is None:
            changed.append(name)
            continue
        if old.planned_rps <= floor_rps and new.planned_rps <= floor_rps:
            continue
        base = max(old.planned_rps, floor_rps)
        if abs(new.planned_rps - old.planned_rps) / base > threshold or (
                old.mix != new.mix and mix_moved(old.mix, new.measured_mix or new.mix, threshold)):
            changed.append(name)
    return changed


def mix_moved(planned: Mix, now: Mix, threshold: float) -> bool:
    """True when either token count of ``now`` is more than ``threshold`` away from ``planned``."""
    return any(abs(n - p) / p > threshold
               for p, n in ((planned.input_tokens, now.input_tokens),
                            (planned.output_tokens, now.output_tokens)))
