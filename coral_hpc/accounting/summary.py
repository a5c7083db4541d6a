"""One cost report of a deployment over a range: usage priced, grouped, joined with tokens and
compared with the plans. Pure: everything it needs is passed in (records, token intervals, plans,
replica history, the clock), so tests feed it recorded sacct output and exact figures come out.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone, tzinfo
from typing import Any

from coral_hpc.accounting.cost import Pricing, Totals, group
from coral_hpc.accounting.predicted import Comparison, compare
from coral_hpc.accounting.usage import Run, Usage, day_bins, runs_from_records, usage
from coral_hpc.config import Deployment
from coral_hpc.slurm.snapshot import AccountingRecord
from coral_hpc.store import DemandInterval, PlanRecord, ReplicaRecord
from coral_hpc.types import JobTag

#: Version of the ``--json`` shape; bump when a field changes meaning or goes away.
JSON_VERSION = 1


@dataclass(frozen=True)
class CostReport:
    """Everything ``coral-hpc cost`` prints, in plain data."""

    deployment: str
    price_unit: str
    since: float
    until: float
    now: float
    runs: list[Run]
    usage: list[Usage]
    pricing: Pricing
    tz: tzinfo | None
    tokens: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    #: API key name → its lab (from the keys file; keys without one are absent)
    labs: dict[str, str] = field(default_factory=dict)
    comparison: Comparison | None = None
    warnings: list[str] = field(default_factory=list)

    # ----------------------------------------------------------------- groupings

    def day(self, piece: Usage) -> str:
        """ISO date of a slice's bin (in the report's time zone)."""
        return datetime.fromtimestamp(piece.bin_start, self.tz).date().isoformat()

    def total(self) -> Totals:
        return group(self.usage, self.pricing, lambda u: "all").get("all", Totals())

    def by_model(self) -> dict[str, Totals]:
        return group(self.usage, self.pricing, lambda u: u.run.model)  # type: ignore[return-value]

    def by_partition(self) -> dict[tuple[str, str], Totals]:
        return group(  # type: ignore[return-value]
            self.usage, self.pricing, lambda u: (u.run.partition, u.run.gpu_type)
        )

    def rows(self) -> dict[tuple[str, str, str, str], Totals]:
        """(model, partition, GPU type, day) → totals: the table's rows."""
        return group(  # type: ignore[return-value]
            self.usage,
            self.pricing,
            lambda u: (u.run.model, u.run.partition, u.run.gpu_type, self.day(u)),
        )

    def by_job(self) -> dict[tuple[str, float], Totals]:
        return group(self.usage, self.pricing, lambda u: (u.run.job_id, u.run.start))  # type: ignore[return-value]

    # ----------------------------------------------------------------- tokens

    def model_tokens(self) -> dict[str, tuple[int, int]]:
        out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for (model, _key), (prompt, generated) in self.tokens.items():
            out[model][0] += prompt
            out[model][1] += generated
        return {m: (p, g) for m, (p, g) in out.items()}

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` shape (see the module's README row and the CLI docstring)."""
        jobs_totals = self.by_job()
        return {
            "version": JSON_VERSION,
            "deployment": self.deployment,
            "price_unit": self.price_unit,
            "since": self._iso(self.since),
            "until": self._iso(self.until),
            "now": self._iso(self.now),
            "total": {**self.total().to_dict(), "runs": len(jobs_totals)},
            "rows": [
                {"model": m, "partition": p, "gpu_type": g, "day": d, **t.to_dict()}
                for (m, p, g, d), t in sorted(self.rows().items())
            ],
            "models": self._models_json(),
            "partitions": [
                {"partition": p, "gpu_type": g, **t.to_dict()}
                for (p, g), t in sorted(self.by_partition().items())
            ],
            "api_keys": self._api_keys_json(),
            **self._labs_json(),
            "jobs": self._jobs_json(jobs_totals),
            "plan_comparison": None if self.comparison is None else self.comparison.to_dict(),
            "warnings": self.warnings,
        }

    def _iso(self, epoch: float) -> str:
        return _iso(epoch, self.tz)

    def _models_json(self) -> list[dict[str, Any]]:
        """Per model: its totals, its tokens and its cost per million tokens."""
        models_totals = self.by_model()
        tokens = self.model_tokens()
        models = []
        for name in sorted(set(models_totals) | set(tokens)):
            totals = models_totals.get(name, Totals())
            prompt, generated = tokens.get(name, (0, 0))
            models.append(
                {
                    "model": name,
                    **totals.to_dict(),
                    "prompt_tokens": prompt,
                    "generated_tokens": generated,
                    "cost_per_million_tokens": _per_million(totals.cost, prompt + generated),
                    "cost_per_million_generated_tokens": _per_million(totals.cost, generated),
                }
            )
        return models

    def _api_keys_json(self) -> list[dict[str, Any]]:
        """Per API key and model: its tokens and its share of the model's cost by tokens."""
        models_totals = self.by_model()
        tokens = self.model_tokens()
        api_keys = []
        for (model, key), (prompt, generated) in sorted(self.tokens.items()):
            if not key:
                continue
            model_cost = models_totals.get(model, Totals()).cost
            model_prompt, model_generated = tokens[model]
            share = (prompt + generated) / max(1, model_prompt + model_generated)
            cost = None if model_cost is None else model_cost * share
            api_keys.append(
                {
                    "api_key": key,
                    "model": model,
                    "prompt_tokens": prompt,
                    "generated_tokens": generated,
                    "cost": cost,
                    "cost_per_million_tokens": _per_million(cost, prompt + generated),
                }
            )
        return api_keys

    def _labs_json(self) -> dict[str, Any]:
        """Chargeback: each lab's share of each model's booked cost, by the tokens its keys
        used (a model's idle capacity is paid by whoever used the model, in proportion); what
        no key used — models nobody called, or tokens of requests without a key — is
        ``unattributed_cost``. The labs' costs and it sum to the total."""
        labs: dict[str | None, dict[str, Any]] = {}
        for row in self._api_keys_json():
            lab = self.labs.get(row["api_key"])
            entry = labs.setdefault(lab, {"lab": lab, "api_keys": [], "prompt_tokens": 0,
                                          "generated_tokens": 0, "cost": 0.0})
            if row["api_key"] not in entry["api_keys"]:
                entry["api_keys"].append(row["api_key"])
            entry["prompt_tokens"] += row["prompt_tokens"]
            entry["generated_tokens"] += row["generated_tokens"]
            entry["cost"] = None if entry["cost"] is None or row["cost"] is None \
                else entry["cost"] + row["cost"]
        total = self.total().cost
        attributed = [e["cost"] for e in labs.values()]
        unattributed = (None if total is None or any(c is None for c in attributed)
                        else total - sum(attributed))
        ordered = sorted(labs.values(), key=lambda e: (e["lab"] is None, e["lab"] or ""))
        return {"labs": ordered, "unattributed_cost": unattributed}

    def _jobs_json(self, jobs_totals: dict[tuple[str, float], Totals]) -> list[dict[str, Any]]:
        """Per Slurm job run in the range: what it was and what it used."""
        return [
            {
                "job_id": run.job_id,
                "model": run.model,
                "replica_id": run.replica_id,
                "partition": run.partition,
                "gpu_type": run.gpu_type,
                "gpus": run.gpus,
                "billing": run.billing,
                "state": run.state,
                "start": self._iso(run.start),
                "end": None if run.end is None else self._iso(run.end),
                "running": run.end is None,
                "seconds_in_range": _seconds(self.usage, run),
                **jobs_totals[(run.job_id, run.start)].to_dict(),
            }
            for run in self.runs
            if (run.job_id, run.start) in jobs_totals
        ]


def build_report(
    deployment: Deployment,
    records: Iterable[AccountingRecord],
    since: float,
    until: float,
    now: float,
    *,
    demand: Sequence[DemandInterval] = (),
    plans: Sequence[PlanRecord] | None = None,
    replicas: Sequence[ReplicaRecord] = (),
    partition_gpu_types: Mapping[str, Sequence[str]] | None = None,
    tz: tzinfo | None = None,
    edges: Sequence[float] | None = None,
    owns: Callable[[JobTag], bool] | None = None,
    stops: Sequence[float] = (),
    labs: Mapping[str, str] | None = None,
) -> CostReport:
    """Price this deployment's sacct ``records`` over ``[since, until)`` (running jobs up to
    ``now``), split by day in ``tz`` (local by default) unless ``edges`` are given; join the
    token counts of ``demand`` intervals that end inside the range; compare with ``plans`` when
    given (None = no plan history available). ``owns`` keeps only this instance's jobs
    (:func:`coral_hpc.accounting.usage.runs_from_records`); ``stops`` are the times the
    deployment was brought down or its daemon stopped, where the plans' prediction pauses."""
    since, until, now = math.floor(since), math.floor(until), math.floor(now)
    if until <= since:
        raise ValueError(f"empty range: {_iso(since, tz)} to {_iso(until, tz)}")
    types = dict(partition_gpu_types or {})
    for part in deployment.cluster.partitions:
        if part.gpu_types and part.name not in types:
            types[part.name] = part.gpu_types
    runs = runs_from_records(records, deployment.deployment, types, owns)
    pricing = Pricing.from_deployment(deployment)
    pieces = usage(runs, since, until, now, edges if edges is not None else day_bins(since, until, tz))
    warnings = sorted({pricing.unpriced_reason(p) for p in pieces if pricing.cost(p) is None})
    tokens: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for interval in demand:
        # gateway counters are deltas reported at the interval's end
        if since < interval.end <= until:
            entry = tokens[(interval.model, interval.api_key)]
            entry[0] += interval.prompt_tokens
            entry[1] += interval.generated_tokens
    report = CostReport(
        deployment=deployment.deployment,
        price_unit=pricing.unit,
        since=since,
        until=until,
        now=now,
        runs=runs,
        usage=pieces,
        pricing=pricing,
        tz=tz,
        tokens={k: (v[0], v[1]) for k, v in tokens.items()},
        labs=dict(labs or {}),
        warnings=list(warnings),
    )
    if plans is not None:
        booked = report.total().cost or 0.0
        comparison = compare(booked, plans, replicas, since, until, now, stops)
        report = CostReport(**{**report.__dict__, "comparison": comparison})
    return report


def _seconds(pieces: Sequence[Usage], run: Run) -> int:
    return sum(p.seconds for p in pieces if p.run is run)


def _per_million(cost: float | None, tokens: int) -> float | None:
    return None if cost is None or tokens <= 0 else cost / tokens * 1_000_000


def _iso(epoch: float, tz: tzinfo | None) -> str:
    return datetime.fromtimestamp(epoch, tz or timezone.utc).astimezone(tz).isoformat()
