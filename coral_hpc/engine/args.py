"""Command line of the sim engine: the ``vllm serve`` flags coral-hpc passes, plus ``--sim-*``.

The sim accepts the vLLM flags the launcher uses with vLLM's names and meanings, so one launch
script serves both engines; a few more vLLM flags that only tune a real GPU are accepted and
ignored (listed in ``_IGNORED``). Unknown flags are an error, as in vLLM. The API key never comes
from argv: like vLLM, the server reads ``VLLM_API_KEY`` from its environment.

Sim-only flags:
  --sim-arch KEY            architecture in profiles/models.yaml (default: the model name, when it
                            is a known architecture or Hugging Face id)
  --sim-gpu-types a100,a100 GPU type per pipeline stage (one value = every stage)
  --sim-catalog FILE        a site catalogue (models.yaml catalog:): GPU types and architectures
                            beyond the shipped ones
  --sim-layers 40,40        layers per stage; also read from VLLM_PP_LAYER_PARTITION like vLLM;
                            default vLLM's even split
  --sim-speed 1.0           time runs this many times faster than the modelled GPU
  --sim-drain-timeout 30    seconds SIGTERM waits for in-flight requests before exiting
  --sim-default-max-tokens  max_tokens of a request that gives none (vLLM would fill the context)

``--runner pooling`` (with ``--convert embed`` for a decoder checkpoint) is vLLM's too: the
server then answers ``/v1/embeddings`` (one forward pass per request, the latency the planner's
pooling model gives) and not completions, as vLLM registers only the routes its runner serves.

``--kv-transfer-config JSON`` is vLLM's: with it the server takes part in disaggregated serving
(a request with ``kv_transfer_params.do_remote_decode`` is prefilled here and answered with the
``kv_transfer_params`` a decode replica needs; one with ``do_remote_prefill`` continues from KV a
prefill replica made), as vLLM's KV connectors do per request.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass

#: exit code when the port cannot be bound (EADDRINUSE on Linux): the launcher retries elsewhere
EXIT_BIND = 98
#: exit code when the layout cannot run (memory, TP, dtype, max-model-len), as vLLM fails at start
EXIT_STARTUP = 1

_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")

#: vLLM flags that only tune real GPUs/tokenizers: accepted (with an argument or as switches) and
#: ignored, so a launch line written for vLLM runs the sim unchanged.
_IGNORED_WITH_VALUE = (
    "--distributed-executor-backend", "--seed", "--swap-space",
    "--download-dir", "--tokenizer", "--revision", "--uvicorn-log-level", "--kv-cache-dtype",
    "--quantization", "--load-format", "--generation-config", "--data-parallel-size",
)  # fmt: skip
_IGNORED_SWITCHES = (
    "--trust-remote-code", "--disable-log-requests", "--disable-log-stats", "--enforce-eager",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--enable-chunked-prefill",
    "--disable-custom-all-reduce", "--disable-frontend-multiprocessing",
)  # fmt: skip


@dataclass(frozen=True)
class SimArgs:
    """Parsed command line (not yet checked against the catalog: see ``coral_hpc.engine.sim``)."""

    model: str
    served_model_names: tuple[str, ...]
    tp: int
    pp: int
    dtype: str
    max_model_len: int | None
    host: str | None
    port: int
    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    gpu_memory_utilization: float
    arch: str
    gpu_types: tuple[str, ...]
    layers: tuple[int, ...] | None
    speed: float
    drain_timeout: float
    default_max_tokens: int
    #: vLLM's --kv-transfer-config (kv_connector, kv_role, ...); None = no disaggregation
    kv_transfer: dict | None = None
    #: the site catalogue file (models.yaml ``catalog:``) the GPU types may come from
    catalog: str | None = None
    #: vLLM's --runner: 'pooling' serves /v1/embeddings only; 'auto' decides by architecture
    runner: str = "auto"


class UsageError(ValueError):
    """The command line is invalid; the message says which flag and what is valid."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = _positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535 (0 = any free port), got {value}")
    return value


def _int_list(text: str, flag: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise UsageError(
            f"{flag} {text!r}: expected comma-separated integers such as 40,40"
        ) from None
    if any(v < 1 for v in values):
        raise UsageError(f"{flag} {text!r}: every stage needs at least one layer")
    return values


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser (``python -m coral_hpc.engine.sim --help``)."""
    p = argparse.ArgumentParser(
        prog="python -m coral_hpc.engine.sim",
        description=(
            "coral-hpc's SIMULATED engine: speaks vLLM's OpenAI API with latencies from the "
            "performance model. It runs no model and its text is filler."
        ),
    )
    p.add_argument("model_tag", nargs="?", help="model name (as in `vllm serve MODEL`)")
    p.add_argument("--model", help="model name (alternative to the positional one)")
    p.add_argument("--served-model-name", nargs="+", help="name(s) the API answers to")
    p.add_argument("--tensor-parallel-size", "-tp", type=_positive_int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=_positive_int, default=1)
    p.add_argument("--dtype", choices=_DTYPES, default="auto")
    p.add_argument("--max-model-len", type=_positive_int, default=None)
    p.add_argument("--host", default=None, help="bind address (default: all interfaces)")
    p.add_argument("--port", type=_port, default=8000)
    p.add_argument("--max-num-seqs", type=_positive_int, default=256)
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=8192)
    p.add_argument("--block-size", type=_positive_int, default=16)
    p.add_argument(
        "--gpu-memory-utilization",
        type=_fraction,
        default=0.9,
        help="fraction of GPU memory for weights + KV cache (sizes the KV cache)",
    )
    # vLLM 0.32's runner flags: `--runner pooling` (and `--convert embed` for a decoder
    # checkpoint) serves an embedding model at /v1/embeddings instead of completions
    p.add_argument("--runner", choices=("auto", "generate", "pooling"), default="auto")
    p.add_argument("--convert", choices=("auto", "none", "embed", "classify"), default="auto")
    p.add_argument("--kv-transfer-config", default=None,
                   help="vLLM's KV connector config (JSON): serve disaggregated requests")
    for flag in _IGNORED_WITH_VALUE:
        p.add_argument(flag, help=argparse.SUPPRESS)
    for flag in _IGNORED_SWITCHES:
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    sim = p.add_argument_group("sim-only")
    sim.add_argument("--sim-arch", help="architecture key in profiles/models.yaml")
    sim.add_argument("--sim-gpu-types", help="GPU type per pipeline stage, e.g. a100,v100")
    sim.add_argument("--sim-catalog", help="a site catalogue (models.yaml catalog:) adding GPU "
                   "types and architectures to the shipped ones")
    sim.add_argument("--sim-layers", help="layers per stage, e.g. 40,40")
    sim.add_argument("--sim-speed", type=_positive_float, default=1.0)
    sim.add_argument("--sim-drain-timeout", type=_positive_float, default=30.0)
    sim.add_argument("--sim-default-max-tokens", type=_positive_int, default=256)
    return p


def parse_args(argv: list[str], environ: dict[str, str] | None = None) -> SimArgs:
    """Parse ``argv`` (without the program name). argparse errors exit 2; inconsistent values
    raise :class:`UsageError`."""
    env = os.environ if environ is None else environ
    ns = build_parser().parse_args(argv)
    model = _model_name(ns)
    pp = ns.pipeline_parallel_size
    gpu_types = _gpu_types(ns.sim_gpu_types, pp)
    layers = _layer_split(ns.sim_layers, env.get("VLLM_PP_LAYER_PARTITION"), pp)
    if ns.max_num_batched_tokens < ns.max_num_seqs:
        raise UsageError(
            f"--max-num-batched-tokens ({ns.max_num_batched_tokens}) must be ≥ "
            f"--max-num-seqs ({ns.max_num_seqs})"
        )
    kv_transfer = _kv_transfer(ns.kv_transfer_config) if ns.kv_transfer_config else None
    return SimArgs(
        model=model,
        served_model_names=tuple(ns.served_model_name or (model,)),
        tp=ns.tensor_parallel_size,
        pp=pp,
        dtype=ns.dtype,
        max_model_len=ns.max_model_len,
        host=ns.host,
        port=ns.port,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        block_size=ns.block_size,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        arch=ns.sim_arch or model,
        gpu_types=gpu_types,
        layers=layers,
        speed=ns.sim_speed,
        drain_timeout=ns.sim_drain_timeout,
        default_max_tokens=ns.sim_default_max_tokens,
        kv_transfer=kv_transfer,
        catalog=ns.sim_catalog,
        runner="pooling" if ns.convert in ("embed", "classify") else ns.runner,
    )


def _model_name(ns: argparse.Namespace) -> str:
    """The model, given as vLLM takes it: ``MODEL`` or ``--model`` (the same one when both)."""
    if ns.model_tag and ns.model and ns.model_tag != ns.model:
        raise UsageError(f"model given twice: {ns.model_tag!r} and --model {ns.model!r}")
    model = ns.model_tag or ns.model
    if not model:
        raise UsageError("give the model name: `python -m coral_hpc.engine.sim MODEL` or --model")
    return str(model)


def _gpu_types(text: str | None, pp: int) -> tuple[str, ...]:
    """``--sim-gpu-types``: one GPU type per pipeline stage (one name stands for every stage)."""
    if not text:
        raise UsageError(
            "--sim-gpu-types is required: the GPU type of each pipeline stage, e.g. a100"
        )
    gpu_types = tuple(g.strip() for g in text.split(","))
    if any(not g for g in gpu_types):
        raise UsageError(f"--sim-gpu-types {text!r}: empty GPU type")
    if len(gpu_types) == 1:
        gpu_types = gpu_types * pp
    if len(gpu_types) != pp:
        raise UsageError(
            f"--sim-gpu-types names {len(gpu_types)} stages but --pipeline-parallel-size is {pp}"
        )
    return gpu_types


def _layer_split(flag: str | None, env_split: str | None, pp: int) -> tuple[int, ...] | None:
    """The layers of each stage from ``--sim-layers`` and/or ``VLLM_PP_LAYER_PARTITION`` (vLLM
    reads the variable; both given must agree); None leaves the default split to the engine."""
    layers = _int_list(flag, "--sim-layers") if flag else None
    if env_split:
        env_layers = _int_list(env_split, "VLLM_PP_LAYER_PARTITION")
        if layers is not None and layers != env_layers:
            raise UsageError(
                f"--sim-layers {flag} disagrees with VLLM_PP_LAYER_PARTITION={env_split}"
            )
        layers = env_layers
    if layers is not None and len(layers) != pp:
        raise UsageError(
            f"the layer split {','.join(map(str, layers))} has {len(layers)} stages but "
            f"--pipeline-parallel-size is {pp}"
        )
    return layers


#: vLLM's kv_role values
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")


def _kv_transfer(text: str) -> dict:
    """``--kv-transfer-config``: a JSON object with ``kv_connector`` and a valid ``kv_role``."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--kv-transfer-config is not JSON: {exc}") from None
    if not isinstance(config, dict) or not isinstance(config.get("kv_connector"), str):
        raise UsageError("--kv-transfer-config must be a JSON object with a 'kv_connector' name")
    if config.get("kv_role", "kv_both") not in KV_ROLES:
        raise UsageError(f"--kv-transfer-config kv_role {config.get('kv_role')!r}: expected one "
                         f"of {', '.join(KV_ROLES)}")
    return config
