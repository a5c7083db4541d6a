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
- Either way the plan is asked for ``demand × (1 + policy.demand_headroom)``.
- :func:`changed_models` says which models moved beyond ``policy.demand_change_threshold`` since
  the last plan, the trigger for an early re-plan.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from coral_hpc.config import Deployment, ModelConfig
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
class ModelDemand:
    """What the plan must serve for one model."""

    model: str
    requests_per_s: float  # estimate before headroom
    planned_rps: float  # estimate × (1 + headroom): the Stage-2 demand
    mix: Mix  # bucketed when measured
    source: Literal["declared", "measured", "unmeasured"]
    #: the measured mix before bucketing (None: declared or nothing served yet), so change
    #: detection can tell a mix that moved from one that wobbles across a bucket boundary
    measured_mix: Mix | None = None


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


def model_demand(model: ModelConfig, measured: Measured | None, headroom: float) -> ModelDemand:
    """The demand the plan serves for one model: declared, else measured, else zero.

    A model with ``demand: auto`` and no traffic yet has zero demand: the plan gives it
    ``min_replicas``; its first requests are rejected (503) and counted, which raises its demand.
    """
    declared_mix = Mix(model.mix.input_tokens, model.mix.output_tokens)
    if model.demand != "auto":
        rps = float(model.demand_rps or 0.0)
        return ModelDemand(model.name, rps, rps * (1.0 + headroom), declared_mix, "declared")
    if measured is None:
        return ModelDemand(model.name, 0.0, 0.0, declared_mix, "unmeasured")
    raw_mix = measured.mix
    mix = (
        Mix(bucket_tokens(raw_mix.input_tokens), bucket_tokens(raw_mix.output_tokens))
        if raw_mix is not None
        else declared_mix
    )
    rps = measured.requests_per_s
    return ModelDemand(model.name, rps, rps * (1.0 + headroom), mix, "measured", raw_mix)


def deployment_demand(
    deployment: Deployment, intervals: Iterable[DemandInterval], tau_s: float | None = None
) -> dict[str, ModelDemand]:
    """Demand for every configured model, in configuration order.

    ``tau_s`` (the smoothing time constant) defaults to the re-plan interval: demand is averaged
    over about one planning period, long enough to ignore bursts the headroom absorbs, short
    enough that a plan follows a real change within a period or two.
    """
    tau = tau_s if tau_s is not None else deployment.policy.replan_interval_s
    measured = measure(intervals, tau)
    headroom = deployment.policy.demand_headroom
    return {m.name: model_demand(m, measured.get(m.name), headroom) for m in deployment.models}


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
                old.mix != new.mix and _mix_moved(old.mix, new.measured_mix or new.mix, threshold)):
            changed.append(name)
    return changed


def _mix_moved(planned: Mix, now: Mix, threshold: float) -> bool:
    """True when either token count of ``now`` is more than ``threshold`` away from ``planned``."""
    return any(abs(n - p) / p > threshold
               for p, n in ((planned.input_tokens, now.input_tokens),
                            (planned.output_tokens, now.output_tokens)))
