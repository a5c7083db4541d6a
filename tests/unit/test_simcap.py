"""Simulated capacity (coral_solver.simcap) and Stage 1's ``capacity: simulated``: a template's
throughput is the highest Poisson rate at which the goal share of its requests meets TTFT and
TPOT, the whole replica simulated."""

from __future__ import annotations

from pathlib import Path

import pytest

from coral_replica_sim.replica import Layout
from coral_solver import perf, simcap
from coral_solver.templates import PerfThroughput, _cache_key, build_library
from coral_solver.types import ModelSpec, Policy

# gpt-oss-20b, 1,024 in / 128 out, TTFT 0.5 s, TPOT 50 ms on two A10G in a pipeline: the
# analytic per-stage model rates the even split 0 (a prompt step, 61 ms, outlasts a stage's
# 25 ms TPOT share, so the short outputs its tail sums over miss; the simulation: ~1.3 req/s)
PIPE_MODEL = ModelSpec("oss", "gpt-oss-20b", 1024, 128, 0.5, 0.05)
PIPE = Layout("gpt-oss-20b", 1, ("a10g", "a10g"), (12, 12))
PIPE_SLO = perf.Slo(0.5, 0.05)


def test_exponential_lengths_have_the_declared_means_and_respect_max_model_len():
    lengths = simcap.Lengths.exponential(1024, 256, n=4000)
    mean_in = sum(lengths.prompt) / len(lengths.prompt)
    mean_out = sum(lengths.output) / len(lengths.output)
    assert mean_in == pytest.approx(1024, rel=0.05)
    assert mean_out == pytest.approx(256, rel=0.05)
    cut = simcap.Lengths.exponential(1024, 256, n=4000, max_model_len=2048)
    assert max(p + o for p, o in zip(cut.prompt, cut.output)) <= 2048
    assert min(cut.output) >= 1
    assert "cut at 2048" in cut.source


def test_sampled_lengths_keep_each_requests_pair():
    pairs = [(10, 1), (2000, 300), (50, 7)]
    lengths = simcap.Lengths.sample(pairs, "trace.csv", n=200)
    assert set(zip(lengths.prompt, lengths.output)) <= set(pairs)
    assert len(set(zip(lengths.prompt, lengths.output))) == 3
    with pytest.raises(ValueError, match="trace.csv"):
        simcap.Lengths.sample([], "trace.csv")


def test_the_search_finds_the_highest_rate_that_meets_the_goal():
    asked = []

    def judge(rate: float) -> simcap.Judged:
        asked.append(rate)
        met = 500 if rate <= 3.7 else 400
        return simcap.Judged(rate, 500, met, stopped=met < 475)

    found = simcap.capacity(PIPE, PIPE_SLO, simcap.Lengths.exponential(10, 10), 0.95,
                            start=20.0, judge=judge)
    assert 3.7 / (1 + simcap.REL_TOL) <= found <= 3.7
    assert any(3.7 < rate <= found * (1 + simcap.REL_TOL) for rate in asked)
    never = simcap.capacity(PIPE, PIPE_SLO, simcap.Lengths.exponential(10, 10), 0.95, start=1.0,
                            judge=lambda r: simcap.Judged(r, 500, 0, True))
    assert never == 0.0


def test_capacity_is_where_attainment_crosses_the_goal():
    """At the returned rate the simulated replica keeps >= 95 % of requests within both
    objectives; at a clearly higher rate (+10 %) it does not."""
    lengths = simcap.Lengths.exponential(1024, 256)
    layout = Layout("llama-3.1-8b", 1, ("a100",), (32,))
    slo = perf.Slo(2.0, 0.08)
    rate = simcap.capacity(layout, slo, lengths, 0.95)
    assert rate > 0
    at = simcap.attainment(layout, slo, lengths, rate, goal=0.0)
    above = simcap.attainment(layout, slo, lengths, rate * 1.1, goal=0.0)
    assert at.attainment >= 0.95
    assert above.attainment < 0.95
    # deterministic: the same arrivals and lengths every time
    assert simcap.attainment(layout, slo, lengths, rate, goal=0.0) == at


def test_a_pipeline_the_even_ttft_split_rates_zero_is_rated_by_its_simulation():
    tm = PerfThroughput()
    assert tm.throughput(PIPE_MODEL, "a10g", 1, 12, 2) == 0.0  # the analytic per-stage figure
    gpus = {"a10g": (1, 24.0)}
    analytic = build_library([PIPE_MODEL], gpus, Policy(max_tp=1, n_max=2), use_cache=False)
    assert not [t for t in analytic["oss"] if t.pp == 2]
    simulated = build_library([PIPE_MODEL], gpus,
                              Policy(max_tp=1, n_max=2, capacity="simulated"),
                              use_cache=False)["oss"]
    pipes = [t for t in simulated if t.pp == 2]
    assert len(pipes) == 1
    pipe = pipes[0]
    assert pipe.throughput > 0
    expected = simcap.template_capacity(
        "gpt-oss-20b", 1, ("a10g", "a10g"), tuple(s.layers for s in pipe.stages), PIPE_SLO,
        simcap.Lengths.exponential(1024, 128), 0.95)
    assert pipe.throughput == expected
    judged = simcap.attainment(Layout("gpt-oss-20b", 1, ("a10g", "a10g"),
                                      tuple(s.layers for s in pipe.stages)),
                               PIPE_SLO, simcap.Lengths.exponential(1024, 128), pipe.throughput,
                               goal=0.0)
    assert judged.attainment >= 0.95


def test_a_stricter_attainment_goal_never_rates_higher():
    lengths = simcap.Lengths.exponential(1024, 256)
    layout = Layout("llama-3.1-8b", 1, ("a100",), (32,))
    slo = perf.Slo(2.0, 0.08)
    loose = simcap.template_capacity("llama-3.1-8b", 1, ("a100",), (32,), slo, lengths, 0.9)
    strict = simcap.template_capacity("llama-3.1-8b", 1, ("a100",), (32,), slo, lengths, 0.99)
    assert 0 < strict <= loose
    assert simcap.attainment(layout, slo, lengths, strict, goal=0.0).attainment >= 0.99


def test_policy_capacity_is_checked_and_keys_the_cache():
    with pytest.raises(ValueError, match="capacity"):
        Policy(capacity="guess")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="slo_attainment"):
        Policy(slo_attainment=0.0)
    tm = PerfThroughput()
    gpus = {"a100": (8, 40.0)}
    model = ModelSpec("m", "llama-3.1-8b", 1024, 256, 2.0, 0.08)
    analytic = _cache_key(tm, model, gpus, Policy())
    assert analytic == _cache_key(tm, model, gpus, Policy(slo_attainment=0.9))  # unused there
    simulated = _cache_key(tm, model, gpus, Policy(capacity="simulated"))
    assert simulated != analytic
    assert simulated != _cache_key(tm, model, gpus, Policy(capacity="simulated",
                                                           slo_attainment=0.9))


def test_the_cache_key_reads_every_module_of_the_replica_simulator(files_read):
    """A simulated capacity is the replica simulator's answer, so an edit anywhere in its package
    (coral_replica_sim, beside the solver) must key a new Stage-1 library, not reuse a stale one."""
    import coral_replica_sim

    PerfThroughput().fingerprint()
    read = files_read
    assert coral_replica_sim.__file__ is not None
    package = {p.resolve() for p in Path(coral_replica_sim.__file__).parent.glob("*.py")}
    assert {"__init__.py", "batching.py", "replica.py"} <= {p.name for p in package}
    assert package <= read, sorted(p.name for p in package - read)
    simcap_file = simcap.__file__
    assert simcap_file is not None and Path(simcap_file).resolve() in read


def test_the_configuration_reaches_the_solver_policy():
    from coral_hpc.config import PolicyConfig

    with pytest.raises(ValueError):
        PolicyConfig(slo_attainment=1.5)
    with pytest.raises(ValueError):
        PolicyConfig(capacity="guess")
    assert PolicyConfig(capacity="simulated").capacity == "simulated"
    from coral_hpc.config import load_deployment
    from coral_hpc.plan.inputs import policy_of

    repo = __import__("pathlib").Path(__file__).resolve().parents[2]
    deployment = load_deployment(repo / "examples" / "models.yaml")
    assert policy_of(deployment).capacity == "analytic"
    chosen = deployment.model_copy(update={"policy": PolicyConfig(capacity="simulated",
                                                                  slo_attainment=0.9)})
    policy = policy_of(chosen)
    assert (policy.capacity, policy.slo_attainment) == ("simulated", 0.9)


class _Simulating:
    """A synthetic throughput model that 'simulates': a template serves a fixed, hashed share
    (30-100 %) of its mean-only figure, so the mean figure bounds it as the search assumes and
    a bigger template may beat a smaller one that beats it on means."""

    def __init__(self, table):
        self._table = table

    def __getattr__(self, name):
        return getattr(self._table, name)

    def mean_throughput(self, model, gpu_type, tp, layers, stages):
        return self._table.throughput(model, gpu_type, tp, layers, stages)

    def simulated_throughput(self, model, template, goal):
        import hashlib

        share = int(hashlib.sha256(template.id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        mean = min(self.mean_throughput(model, s.gpu_type, template.tp, s.layers, template.pp)
                   for s in template.stages)
        return mean * (0.3 + 0.7 * share)


@pytest.mark.parametrize("seed", range(4))
def test_skipping_candidates_loses_no_undominated_template_while_means_bound_simulation(seed):
    """Simulating only candidates that could beat what is already simulated gives the same
    library as simulating every candidate, whenever the mean figure bounds the simulated one."""
    from dataclasses import replace

    from coral_solver.joint import random_instance
    from coral_solver.templates import drop_dominated, model_templates, searched_templates
    from coral_solver.templates_sim import _MeanView

    inst = random_instance(seed)
    tm = _Simulating(inst.throughput)
    policy = replace(inst.policy, capacity="simulated")
    gpus = inst.cluster.gpu_types()
    for model in inst.models:
        every = [replace(t, throughput=tm.simulated_throughput(model, t, 0.95))
                 for t in searched_templates(_MeanView(tm), model, gpus, policy)]
        expected = drop_dominated([t for t in every if t.throughput > 0])
        got = model_templates(tm, model, gpus, policy)
        assert {(t.id, t.throughput) for t in got} == {(t.id, t.throughput) for t in expected}


def test_the_checker_rechecks_a_simulated_template_by_simulation():
    from dataclasses import replace

    from coral_solver.check import _check_template
    from coral_solver.joint import random_instance
    from coral_solver.templates import model_templates

    inst = random_instance(1)
    tm = _Simulating(inst.throughput)
    policy = replace(inst.policy, capacity="simulated")
    model = inst.models[0]
    library = model_templates(tm, model, inst.cluster.gpu_types(), policy)
    assert library
    for t in library:
        assert _check_template(t, model, tm, 1e-6, policy) == []
        inflated = replace(t, throughput=t.throughput * 1.1)
        assert "the replica simulated serves" in _check_template(inflated, model, tm, 1e-6,
                                                                 policy)[0]
