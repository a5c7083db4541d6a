"""The sim engine's layout: command line, start-up checks against the catalog, step times from
coral_solver.perf, pipeline timing, token counting."""

from __future__ import annotations

import itertools

import pytest

from coral_hpc.engine.args import UsageError, parse_args
from coral_hpc.engine.sim import StartupError, prepare
from coral_hpc.engine.text import Filler, count_text_tokens, render_chat
from coral_replica_sim.replica import Layout, PipelineClock, StepModel, default_layer_split
from coral_solver import catalog, perf


# ---------------------------------------------------------------------- command line
def test_vllm_flags_are_read_with_vllm_names():
    a = parse_args(
        [
            "meta-llama/Llama-3.1-70B-Instruct",
            "--served-model-name",
            "llama70",
            "alias",
            "--tensor-parallel-size",
            "4",
            "--pipeline-parallel-size",
            "2",
            "--dtype",
            "half",
            "--max-model-len",
            "4096",
            "--host",
            "127.0.0.1",
            "--port",
            "9000",
            "--disable-log-requests",
            "--distributed-executor-backend",
            "ray",
            "--sim-gpu-types",
            "a100-80g,v100-32g",
            "--sim-layers",
            "50,30",
            "--sim-speed",
            "5",
        ],
        environ={},
    )
    assert (a.model, a.served_model_names, a.tp, a.pp) == (
        "meta-llama/Llama-3.1-70B-Instruct",
        ("llama70", "alias"),
        4,
        2,
    )
    assert (a.dtype, a.max_model_len, a.host, a.port) == ("half", 4096, "127.0.0.1", 9000)
    assert (a.gpu_types, a.layers, a.speed) == (("a100-80g", "v100-32g"), (50, 30), 5.0)
    assert a.arch == a.model  # resolved through the catalog's Hugging Face aliases


def test_one_gpu_type_applies_to_every_stage_and_env_split_is_read():
    a = parse_args(
        ["--model", "m", "-pp", "2", "--sim-gpu-types", "a100", "--sim-arch", "llama-3.1-8b"],
        environ={"VLLM_PP_LAYER_PARTITION": "20,12"},
    )
    assert a.gpu_types == ("a100", "a100") and a.layers == (20, 12)


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["m", "--sim-gpu-types", "a100,a100"], {}, "names 2 stages but --pipeline-parallel-size is 1"),
        (["m", "-pp", "2", "--sim-gpu-types", "a100", "--sim-layers", "32"], {}, "has 1 stages"),
        (["m", "-pp", "2", "--sim-gpu-types", "a100", "--sim-layers", "16,16"],
         {"VLLM_PP_LAYER_PARTITION": "20,12"}, "disagrees with VLLM_PP_LAYER_PARTITION"),
        (["m"], {}, "--sim-gpu-types is required"),
        (["--sim-gpu-types", "a100"], {}, "give the model name"),
        (["m", "--sim-gpu-types", "a100", "--sim-layers", "a,b"], {}, "comma-separated integers"),
        (["m", "--sim-gpu-types", "a100", "--max-num-seqs", "64", "--max-num-batched-tokens", "32"],
         {}, "must be ≥ --max-num-seqs"),
    ],
)  # fmt: skip
def test_inconsistent_command_lines_name_the_flag(argv, env, message):
    with pytest.raises(UsageError, match=message):
        parse_args(argv, environ=env)


def test_unknown_flag_and_bad_values_exit_2_like_vllm(capsys):
    for argv in (["m", "--sim-gpu-types", "a100", "--no-such-flag"],
                 ["m", "--sim-gpu-types", "a100", "--sim-speed", "0"],
                 ["m", "--sim-gpu-types", "a100", "--dtype", "int3"]):  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            parse_args(argv, environ={})
        assert exc.value.code == 2
    assert "--sim-speed" in capsys.readouterr().err


# ---------------------------------------------------------------------- start-up checks
def _prep(*argv: str, env: dict[str, str] | None = None):
    return prepare(parse_args(list(argv), environ=env or {}))


def test_prepare_sizes_the_kv_cache_from_perf_and_defaults_max_model_len_to_what_fits():
    p = _prep("llama-3.1-8b", "--sim-gpu-types", "a100", "--gpu-memory-utilization", "0.5")
    arch, gpu = catalog.model_arch("llama-3.1-8b"), catalog.gpu_spec("a100")
    expected = perf.kv_capacity_tokens(arch, gpu, 1, arch.layers, 0.5)
    assert p.kv_capacity_tokens == expected > 0
    assert p.max_model_len == min(arch.max_context, expected // 16 * 16)
    assert p.layout.layers == (arch.layers,)
    assert p.fingerprint.startswith("coral-sim:")


def test_pipeline_kv_capacity_is_the_tightest_stage():
    p = _prep("llama-3.1-70b", "-tp", "4", "-pp", "2", "--sim-gpu-types", "a100-80g,a100",
              "--sim-layers", "50,30")  # fmt: skip
    arch = catalog.model_arch("llama-3.1-70b")
    caps = [perf.kv_capacity_tokens(arch, catalog.gpu_spec(g), 4, n, 0.9)
            for g, n in (("a100-80g", 50), ("a100", 30))]  # fmt: skip
    assert p.kv_capacity_tokens == min(caps)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["no-such-model", "--sim-gpu-types", "a100"], "unknown model architecture"),
        (["llama-3.1-8b", "--sim-gpu-types", "a200"], "unknown GPU type"),
        (["llama-3.1-8b", "--sim-gpu-types", "v100", "--dtype", "bfloat16"], "--dtype=half"),
        (["llama-3.1-8b", "--sim-gpu-types", "a100", "-tp", "3"], "tensor parallel size"),
        (["llama-3.1-70b", "--sim-gpu-types", "v100"], "No available memory for the cache"),
        (["llama-3.1-8b", "--sim-gpu-types", "a100", "-pp", "2", "--sim-layers", "10,10"],
         "sums to 20"),
        (["llama-3.1-8b", "--sim-gpu-types", "a100", "--max-model-len", "200000"],
         "greater than the derived max_model_len"),
        (["llama-3.1-8b", "--sim-gpu-types", "a100", "--gpu-memory-utilization", "0.5",
          "--max-model-len", "120000"], "larger than the maximum number of tokens"),
    ],
)  # fmt: skip
def test_layouts_vllm_could_not_start_fail_with_its_reason(argv, message):
    with pytest.raises(StartupError, match=message):
        _prep(*argv)


# ---------------------------------------------------------------------- pipeline timing
@pytest.mark.parametrize(
    "layers, stages, split",
    [(32, 1, (32,)), (32, 2, (16, 16)), (33, 2, (17, 16)), (10, 4, (2, 3, 3, 2)), (80, 3, (27, 27, 26))],
)  # fmt: skip
def test_default_layer_split_matches_vllm_get_pp_indices(layers, stages, split):
    assert default_layer_split(layers, stages) == split
    assert sum(split) == layers


def test_stage_times_come_from_perf_per_stage():
    layout = Layout(arch="llama-3.1-8b", tp=1, gpu_types=("a100", "v100"), layers=(20, 12))
    model = StepModel(layout)
    arch = catalog.model_arch("llama-3.1-8b")
    times = model.stage_times(8, 256, 4000)
    # a two-stage pipeline: each stage pays its share of the engine overhead and its hand-off,
    # the same accounting coral_solver.perf.stage_throughput uses for the plan's promise
    assert times == (
        perf.step_latency_s(arch, catalog.gpu_spec("a100"), 1, 20, 8, 256, 4000, n_stages=2),
        perf.step_latency_s(arch, catalog.gpu_spec("v100"), 1, 12, 8, 256, 4000, n_stages=2),
    )
    assert all(t > 0 for t in times)


def test_pipeline_latency_is_the_sum_and_throughput_the_slowest_stage():
    clock = PipelineClock(2)
    # stage times 1 and 2: a batch takes 1 + 2 = 3 end to end...
    ends = [clock.reserve(0.0, (1.0, 2.0)) for _ in range(4)]
    assert ends[0] == 3.0
    # ...and further batches leave every 2 (the slow stage), not every 3.
    assert [b - a for a, b in itertools.pairwise(ends)] == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("stages", [2, 3])
def test_one_micro_batchs_prompt_stalls_every_micro_batch_of_the_ring(stages):
    """S micro-batches cycle through S stages (each waits for its own previous step, as vLLM's
    virtual engines do); every 10th round micro-batch 0 carries a prompt (0.2 s a stage instead of
    0.01). Every micro-batch follows the slow one through every stage, so each one's token gap
    grows by S x the prompt's extra time per prompt — the ring accounting that
    ``coral_solver.perf.PROMPTS_STALL_RING = True`` charges — not by its extra time once (what
    'each stage pays only its own micro-batch's prompts' would give)."""
    decode, prompt, every, rounds = 0.01, 0.2, 10, 200
    clock = PipelineClock(stages)
    ready = [0.0] * stages
    ends: list[list[float]] = [[] for _ in range(stages)]
    for r in range(rounds):
        for m in range(stages):
            t = prompt if m == 0 and r % every == 0 else decode
            ready[m] = clock.reserve(ready[m], [t] * stages)
            ends[m].append(ready[m])
    ring = stages * decode + stages * (prompt - decode) / every
    own = stages * decode + (prompt - decode) / every
    for m in range(stages):
        steady = ends[m][50:]
        gap = (steady[-1] - steady[0]) / (len(steady) - 1)
        assert gap == pytest.approx(ring, rel=0.05), (m, gap, ring, own)
        assert gap > own * 1.3


def test_a_lone_batch_on_an_idle_pipeline_starts_when_ready():
    clock = PipelineClock(1)
    assert clock.reserve(5.0, (0.5,)) == 5.5
    assert clock.reserve(10.0, (0.5,)) == 10.5


# ---------------------------------------------------------------------- text
def test_prompt_tokens_are_a_quarter_of_the_characters_at_least_one():
    assert count_text_tokens("") == 1
    assert count_text_tokens("abc") == 1
    assert count_text_tokens("x" * 401) == 100


def test_chat_rendering_counts_roles_and_text_parts():
    text = render_chat([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]},
    ])  # fmt: skip
    assert text == "system: be brief\nuser: hi\n"
    with pytest.raises(TypeError, match=r"messages\[0\]"):
        render_chat([{"content": "no role"}])


def test_filler_is_deterministic_per_prompt_and_starts_with_sim():
    a, b, c = Filler("p"), Filler("p"), Filler("q")
    wa = [a.next_token() for _ in range(30)]
    assert wa == [b.next_token() for _ in range(30)]
    assert wa != [c.next_token() for _ in range(30)]
    assert wa[0] == "sim "


def test_batch_times_bill_prompt_chunks_per_sequence_as_the_planner_does():
    """A step with four 2,048-token prompts: each chunk attends to half of itself, not to half of
    all 8,192 prompt tokens (the old one-long-chunk billing charged 4x the attention)."""
    from coral_replica_sim.batching import Batch, Sequence

    layout = Layout(arch="gpt-oss-20b", tp=2, gpu_types=("h100",), layers=(24,))
    model = StepModel(layout)
    prompts = tuple((Sequence(str(i), 2048, 8), 2048) for i in range(4))
    running = Sequence("d", 100, 8)
    running.computed = 500
    batch = Batch(engine=0, decode=(running,), prefill=prompts)
    arch, gpu = catalog.model_arch("gpt-oss-20b"), catalog.gpu_spec("h100")
    per_sequence = perf.step_latency_s(arch, gpu, 2, 24, 1, 4 * 2048, 501, prefill_ctx=1024.0)
    one_chunk = perf.step_latency_s(arch, gpu, 2, 24, 1, 4 * 2048, 501)  # ctx 4,096
    assert model.batch_times(batch) == (per_sequence,)
    assert per_sequence < 0.9 * one_chunk
