"""The daemon's own Prometheus metrics (its own registry, served on its own port)."""

from __future__ import annotations

from collections import Counter as Tally

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from coral_hpc.engine.vllm_metrics import EngineLoad
from coral_hpc.reconcile.status import ReplicaState


class DaemonMetrics:
    """Replicas by state, plan cost, solve time, Slurm call latency and errors, cycle errors."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.replicas = Gauge("coral_replicas", "Replicas by model and state",
                              ["model", "state"], registry=self.registry)
        self.plan_cost = Gauge("coral_plan_cost_per_hour",
                               "Cost per hour of the current plan (deployment's unit)",
                               registry=self.registry)
        self.plan_replicas = Gauge("coral_plan_replicas", "Replicas the current plan asks for",
                                   ["model"], registry=self.registry)
        self.solve_seconds = Histogram("coral_plan_solve_seconds", "Planner wall time per plan",
                                       buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                                       registry=self.registry)
        self.plans = Counter("coral_plans_total", "Plans made", ["trigger"],
                             registry=self.registry)
        self.slurm_seconds = Histogram("coral_slurm_observe_seconds",
                                       "Wall time of one observe step (Slurm calls included)",
                                       buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30),
                                       registry=self.registry)
        self.slurm_errors = Counter("coral_slurm_errors_total", "Failed Slurm calls",
                                    ["step"], registry=self.registry)
        self.actions = Counter("coral_actions_total", "Actions applied", ["kind"],
                               registry=self.registry)
        self.loop_errors = Counter("coral_loop_errors_total", "Errors caught at a loop boundary",
                                   ["loop"], registry=self.registry)
        # scale to zero (coral_hpc.reconcile.idle): models going cold, wakes begun and ended
        self.scale_to_zero = Counter("coral_scale_to_zero_transitions_total",
                                     "Models scaled to zero that went cold, began to wake or "
                                     "became warm", ["model", "to"], registry=self.registry)
        self.demand = Gauge("coral_demand_rps", "Demand planned for (requests/s, with headroom)",
                            ["model"], registry=self.registry)

        # from the READY replicas' own /metrics (vLLM's names, coral_hpc.engine.vllm_metrics)
        engine = [
            ("requests_running", "Requests in the engines' running batches (READY replicas)"),
            ("requests_waiting", "Requests queued in the engines (READY replicas)"),
            ("kv_cache_usage", "KV-cache use of the model's most used READY replica, 0..1"),
            ("prompt_tokens", "Prompt tokens the live READY replicas' engines counted"),
            ("generation_tokens", "Tokens the live READY replicas' engines generated"),
            ("preemptions", "Preemptions the live READY replicas' engines counted"),
            ("replicas_scraped", "READY replicas whose engine /metrics answered"),
            ("replicas_unscraped", "READY replicas whose engine /metrics did not answer"),
        ]
        self.engine = {key: Gauge(f"coral_engine_{key}", doc, ["model"], registry=self.registry)
                       for key, doc in engine}

    def set_engine_loads(self, models: list[str],
                         loads: list[tuple[str, EngineLoad | None]]) -> None:
        """Replace the per-model engine gauges with the sums over the READY replicas' loads
        (zeros for a model with none; the KV use is the most used replica's)."""
        for model in models:
            mine = [load for name, load in loads if name == model]
            read = [load for load in mine if load is not None]
            values = {
                "requests_running": sum(x.running for x in read),
                "requests_waiting": sum(x.waiting for x in read),
                "kv_cache_usage": max((x.kv_cache_usage for x in read), default=0.0),
                "prompt_tokens": sum(x.prompt_tokens for x in read),
                "generation_tokens": sum(x.generation_tokens for x in read),
                "preemptions": sum(x.preemptions for x in read),
                "replicas_scraped": len(read), "replicas_unscraped": len(mine) - len(read),
            }
            for key, value in values.items():
                self.engine[key].labels(model).set(value)

    def set_replicas(self, models: list[str], states: list[tuple[str, ReplicaState]]) -> None:
        """Replace the replicas-by-state gauge with the current counts (zeros included)."""
        tally = Tally(states)
        for model in models:
            for state in ReplicaState:
                if state.live:
                    self.replicas.labels(model, state.value).set(tally.get((model, state), 0))
