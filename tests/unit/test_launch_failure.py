"""Why a replica's job failed, read from its logs (issue 27: a long-context layout crashed at
start for want of KV cache and was resubmitted with no word of why). Recorded log:
tests/data/vllm/engine-kv-refusal-0.32.0-cpu.log, `vllm serve` of the CPU build (0.32.0) on
coral-tiny-llama-long with --max-model-len 600000 and VLLM_CPU_KVCACHE_SPACE=1: the engine core's
ValueError, then the API server's "Engine core initialization failed. See root cause above."."""

from __future__ import annotations

from pathlib import Path

from coral_hpc.launch.failure import failure_line, last_error_line

RECORDED = Path(__file__).resolve().parents[1] / "data/vllm/engine-kv-refusal-0.32.0-cpu.log"


def test_the_root_cause_not_the_wrapper_nor_a_warning():
    line = last_error_line(RECORDED.read_text().splitlines())
    assert line is not None
    assert line.startswith("ValueError: To serve at least one request with the model's max seq "
                           "len (600000), (1.14 GiB KV cache is needed, which is larger than the "
                           "available KV cache memory (1.0 GiB).")


def test_a_wrapper_alone_and_nothing_at_all():
    assert last_error_line(["RuntimeError: Engine core initialization failed. See root cause "
                            "above. Failed core proc(s): {}"]).startswith("RuntimeError")
    assert last_error_line(["(Worker pid=1) WARNING 12-03 06:27:31 [utils.py:597] fallback. "
                            "Exception: could not create a primitive", "INFO: ok"]) is None


def test_failure_line_reads_the_replicas_engine_log(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "r1.77.rank0.log").write_text(
        "ERROR coral: engine exited before answering /health (exit code 1); see x.engine.log\n")
    (logs / "r1.77.rank0.engine.log").write_text(RECORDED.read_text())
    (logs / "r2.78.rank0.engine.log").write_text("ValueError: another replica's\n")
    assert "1.14 GiB KV cache is needed" in failure_line(logs, "r1", "77")
    # no engine error: the entrypoint's summary
    (logs / "r1.77.rank0.engine.log").write_text("INFO starting\n")
    assert failure_line(logs, "r1", "77") == (
        "engine exited before answering /health (exit code 1); see x.engine.log")
    assert failure_line(logs, "r3", "79") is None
    assert failure_line(logs, "r1", None) is None
