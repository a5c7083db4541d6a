"""The sim engine server: ``python -m coral_hpc.engine.sim MODEL --sim-gpu-types a100 ...``.

A stand-in for ``vllm serve`` on machines without GPUs: same flags, same OpenAI API and metrics,
latencies and KV capacity from :mod:`coral_solver.perf` for the replica's GPU types and layout, text
that is filler. It starts in well under a second.

Start-up checks mirror where vLLM itself fails to start (exit 1, one clear line on stderr): unknown
architecture or GPU type, a dtype or TP degree the GPU/model cannot run, a layer split that does
not add up, weights that leave no room for the KV cache, ``--max-model-len`` beyond the KV cache.
A port already in use exits 98 at once so a launcher can retry another port.

Shutdown: SIGTERM (or SIGINT) stops new requests (``/v1`` and ``/health`` answer 503), lets the
waiting and running requests finish within ``--sim-drain-timeout`` seconds (then aborts them),
and exits 0. A second signal during the drain skips the rest of the wait.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from coral_hpc.engine.api import ServedModel, SimAPI
from coral_hpc.engine.args import EXIT_BIND, EXIT_STARTUP, SimArgs, UsageError, parse_args
from coral_hpc.engine.disagg import KvTransfer
from coral_hpc.engine.metrics import EngineMetrics
from coral_hpc.engine.runner import SimEngine
from coral_replica_sim.batching import Scheduler
from coral_replica_sim.replica import Layout, StepModel, default_layer_split

if TYPE_CHECKING:  # the catalog is imported when the server prepares, not on --help
    from coral_solver.catalog import GpuSpec, ModelArch

PROG = "coral-sim"


class StartupError(Exception):
    """The replica cannot start with these arguments (vLLM would fail too); exit 1."""


@dataclass(frozen=True)
class Prepared:
    """Everything resolved from the command line before the server binds."""

    args: SimArgs
    layout: Layout
    step_model: StepModel
    kv_capacity_tokens: int
    max_model_len: int
    pooling: bool = False  # an embedding model: /v1/embeddings, no completions

    @property
    def fingerprint(self) -> str:
        """``system_fingerprint`` of every answer: says it is the sim and what it simulates."""
        lay = self.layout
        return (
            f"coral-sim:{lay.arch}:tp{lay.tp}:{'+'.join(lay.gpu_types)}:"
            f"{','.join(map(str, lay.layers))}"
        )


def prepare(args: SimArgs) -> Prepared:
    """Resolve the architecture, GPUs and layer split against the catalog and size the KV cache.

    Raises :class:`StartupError` with vLLM's reason when the layout could not start.
    """
    arch, gpus = _resolve(args)
    _check_tp(arch, args.tp)
    _check_gpus(arch, gpus, args.dtype)
    layers = _layer_split(arch, args)
    if args.runner == "generate" and arch.pooling:
        # vLLM's own refusal (vllm/config/model.py, ModelConfig._get_runner_type checks)
        raise StartupError("Embedding models do not support `--runner generate`. Use "
                           "`--runner pooling` or `--runner auto` for embedding models.")
    pooling = args.runner == "pooling" or (args.runner == "auto" and arch.pooling)
    layout = Layout(arch=arch.name, tp=args.tp, gpu_types=tuple(g.name for g in gpus),
                    layers=tuple(layers))  # fmt: skip
    step_model = StepModel(layout, args.gpu_memory_utilization)
    capacity = step_model.kv_capacity_tokens()
    usable = (capacity // args.block_size) * args.block_size
    if usable < args.block_size:
        raise StartupError(
            f"No available memory for the cache blocks: {arch.name} with TP {args.tp} on "
            f"{'+'.join(layout.gpu_types)} (layers {','.join(map(str, layers))}) leaves no room "
            f"for the KV cache at --gpu-memory-utilization {args.gpu_memory_utilization}"
        )
    return Prepared(args, layout, step_model, capacity, _max_model_len(arch, args, usable),
                    pooling)


def _resolve(args: SimArgs) -> tuple[ModelArch, list[GpuSpec]]:
    """The model's architecture and the replica's GPUs from the catalog (``--sim-catalog``
    first, when given; a model named by its weights is read from its ``config.json``)."""
    from coral_hpc.config.weights import WeightsError
    from coral_hpc.model_archs import ensure_arch
    from coral_solver import catalog  # the catalog reads profiles/ once, here

    if args.catalog:
        try:
            catalog.use_site_catalog(catalog.read_site_catalog(args.catalog))
        except catalog.CatalogError as exc:
            raise StartupError(f"--sim-catalog: {exc}") from None
    try:
        ensure_arch(args.arch)  # a model named by its weights: read its config.json (HF_HOME)
    except WeightsError as exc:
        raise StartupError(str(exc)) from None
    try:
        arch = catalog.model_arch(args.arch)
    except KeyError as exc:
        raise StartupError(f"{exc.args[0]} (give --sim-arch)") from None
    try:
        gpus = [catalog.gpu_spec(g) for g in args.gpu_types]
    except KeyError as exc:
        raise StartupError(f"--sim-gpu-types: {exc.args[0]}") from None
    return arch, gpus


def _check_tp(arch: ModelArch, tp: int) -> None:
    """vLLM's check: the attention and KV heads split evenly over the tensor-parallel ranks."""
    from coral_solver import perf

    if tp not in perf.valid_tp_degrees(arch, tp):
        raise StartupError(
            f"Total number of attention heads ({arch.q_heads}) and KV heads ({arch.kv_heads}) "
            f"must be divisible by (or divide) tensor parallel size ({tp}); valid for "
            f"{arch.name}: {perf.valid_tp_degrees(arch, 64)}"
        )


def _check_gpus(arch: ModelArch, gpus: list[GpuSpec], dtype: str) -> None:
    """Each GPU has kernels for the model's weights and, when asked for, bfloat16."""
    from coral_solver import catalog, perf

    for gpu in gpus:
        engine_dtype = perf.engine_dtype(arch, gpu)
        derived = catalog.derived_model(arch.name)
        if engine_dtype is None and derived is not None:  # from its config.json: its own reason
            raise StartupError(f"{arch.name} cannot run on {gpu.name}: "
                               f"{derived.support(gpu.compute_capability).reason}")
        if engine_dtype is None:
            raise StartupError(
                f"{arch.name} ({arch.quantization}) cannot run on {gpu.name} "
                f"(compute capability {gpu.compute_capability}): vLLM has no kernels for it"
            )
        if dtype == "bfloat16" and not gpu.bf16:
            raise StartupError(
                f"Bfloat16 is only supported on GPUs with compute capability of at least 8.0. "
                f"Your {gpu.name} GPU has compute capability {gpu.compute_capability}. You can "
                "use float16 instead by explicitly setting the `dtype` flag in CLI, for example: "
                "--dtype=half."
            )


def _layer_split(arch: ModelArch, args: SimArgs) -> tuple[int, ...]:
    """The layers of each pipeline stage: ``--sim-layers`` (which must add up to the model's),
    else vLLM's default split over ``--pipeline-parallel-size``."""
    if args.layers is None:
        try:
            return default_layer_split(arch.layers, args.pp)
        except ValueError as exc:
            raise StartupError(str(exc)) from None
    layers = args.layers
    if sum(layers) != arch.layers:
        raise StartupError(
            f"the layer split {','.join(map(str, layers))} sums to {sum(layers)} but "
            f"{arch.name} has {arch.layers} layers"
        )
    return layers


def _max_model_len(arch: ModelArch, args: SimArgs, usable: int) -> int:
    """``--max-model-len`` checked as vLLM checks it (the model's context, the KV cache's
    ``usable`` tokens), or what fits when not given."""
    if args.max_model_len is None:
        # vLLM would take the model's full context and fail when it exceeds the cache; the sim
        # takes what fits, so a bare command line always starts.
        return min(arch.max_context, usable)
    if args.max_model_len > arch.max_context:
        raise StartupError(
            f"User-specified max_model_len ({args.max_model_len}) is greater than the "
            f"derived max_model_len ({arch.max_context} in the model's config)"
        )
    if args.max_model_len > usable:
        raise StartupError(
            f"The model's max seq len ({args.max_model_len}) is larger than the maximum "
            f"number of tokens that can be stored in KV cache ({usable}). Try increasing "
            "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine."
        )
    return args.max_model_len


def _log(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


async def serve(prep: Prepared, api_key: str | None) -> int:
    """Run the server until SIGTERM/SIGINT and the drain are over; return the exit code."""
    args = prep.args
    scheduler, engine, api = _components(prep, api_key)
    runner = web.AppRunner(
        api.app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0
    )
    await runner.setup()
    host = args.host or "0.0.0.0"
    site = web.TCPSite(runner, host, args.port, reuse_port=False)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        _log(f"cannot bind {host}:{args.port}: {exc.strerror or exc}")
        return EXIT_BIND if exc.errno == errno.EADDRINUSE else EXIT_STARTUP
    port = runner.addresses[0][1]
    if args.kv_transfer is not None:
        api.kv = KvTransfer(args.kv_transfer, prep.layout.tp, args.block_size,
                            prep.step_model.kv_transfer_s,
                            host=args.host or socket.gethostname(), port=port)
    engine.start()
    stop, again = _stop_signals()
    _log(_serving_line(prep, f"http://{host}:{port}", scheduler.total_blocks))
    await stop.wait()
    await _shut_down(scheduler, engine, api, args.drain_timeout, again)
    await runner.cleanup()
    _log("stopped")
    return 0


def _components(prep: Prepared, api_key: str | None) -> tuple[Scheduler, SimEngine, SimAPI]:
    """The scheduler (KV cache and batches), the engine stepping it on the performance model,
    and the OpenAI API over both, with its metrics."""
    args = prep.args
    scheduler = Scheduler(
        kv_capacity_tokens=prep.kv_capacity_tokens,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_engines=prep.layout.stages,
    )
    info = {
        "arch": prep.layout.arch,
        "gpu_types": ",".join(prep.layout.gpu_types),
        "layers": ",".join(map(str, prep.layout.layers)),
        "tp": str(prep.layout.tp),
        "speed": repr(args.speed),
    }
    metrics = EngineMetrics(scheduler, args.served_model_names[0], info)
    engine = SimEngine(scheduler, prep.step_model.batch_times, args.speed, metrics)
    served = ServedModel(
        names=args.served_model_names,
        root=args.model,
        max_model_len=prep.max_model_len,
        default_max_tokens=args.default_max_tokens,
        fingerprint=prep.fingerprint,
    )
    api = SimAPI(engine, metrics, served, api_key, pooling=prep.pooling,
                 dims=prep.step_model.hidden)
    return scheduler, engine, api


def _stop_signals() -> tuple[asyncio.Event, asyncio.Event]:
    """Events set by SIGTERM/SIGINT: the first signal stops (``stop``), a second one during the
    drain skips the rest of its wait (``again``)."""
    stop, again = asyncio.Event(), asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        (again if stop.is_set() else stop).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    return stop, again


def _serving_line(prep: Prepared, url: str, total_blocks: int) -> str:
    """The line that says the server is up: that it is simulated, what and where it serves."""
    args = prep.args
    return (
        f"SIMULATED engine (no inference) serving {', '.join(args.served_model_names)}"
        f"{' (embeddings)' if prep.pooling else ''} on "
        f"{url} — {prep.fingerprint}, KV cache {total_blocks} blocks x "
        f"{args.block_size} tokens, max_model_len {prep.max_model_len}, speed x{args.speed}"
        + (f", KV connector {args.kv_transfer['kv_connector']} "
           f"({args.kv_transfer.get('kv_role', 'kv_both')})" if args.kv_transfer else "")
    )


async def _shut_down(scheduler: Scheduler, engine: SimEngine, api: SimAPI, drain_timeout: float,
                     again: asyncio.Event) -> None:
    """Refuse new requests, let those in flight finish within ``drain_timeout`` (or until
    ``again`` is set), abort the rest and stop the engine."""
    api.draining = True
    unfinished = scheduler.num_unfinished
    _log(f"draining: {unfinished} request(s) in flight, up to {drain_timeout:g}s")
    second = asyncio.create_task(again.wait())
    drain = asyncio.create_task(_drain(engine, api, drain_timeout))
    await asyncio.wait({drain, second}, return_when=asyncio.FIRST_COMPLETED)
    second.cancel()
    drained = drain.done() and drain.result()
    drain.cancel()
    if not drained:
        _log(f"drain incomplete: aborting {scheduler.num_unfinished} request(s)")
    await engine.stop()
    await api.wait_quiet(1.0)  # aborted handlers close their streams


async def _drain(engine: SimEngine, api: SimAPI, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    if not await engine.wait_idle(timeout):
        return False
    # every token is produced; let the handlers write their last chunks
    return await api.wait_quiet(max(0.0, deadline - loop.time()))


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        prep = prepare(args)
    except UsageError as exc:
        _log(f"error: {exc}")
        return 2
    except StartupError as exc:
        _log(f"cannot start: {exc}")
        return EXIT_STARTUP
    api_key = os.environ.get("VLLM_API_KEY") or None
    return asyncio.run(serve(prep, api_key))


if __name__ == "__main__":
    sys.exit(main())
