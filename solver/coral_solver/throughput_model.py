"""The throughput model Stage 1 asks (:mod:`coral_solver.templates`): what it needs to know of
a model on a GPU type (:class:`ThroughputModel`), and the real one over the performance model
and the catalog (:class:`PerfThroughput`), whose :meth:`~PerfThroughput.fingerprint` keys the
cached template libraries.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Protocol

from coral_solver.types import ModelSpec, ObservedLengths, Template


class ThroughputModel(Protocol):
    """What Stage 1 needs to know about a model on a GPU type."""

    def layers(self, model: ModelSpec) -> int:
        """Transformer layers of the model."""

    def weight_gb(self, model: ModelSpec) -> float:
        """Weights as served, GB (the ρ × model size filter)."""

    def tp_degrees(self, model: ModelSpec, max_tp: int) -> list[int]:
        """Tensor-parallel degrees vLLM accepts for this model (head counts divisible)."""

    def runs_on(self, model: ModelSpec, gpu_type: str) -> bool:
        """Whether the engine can run the model on this GPU type at all (dtype, kernels)."""

    def throughput(self, model: ModelSpec, gpu_type: str, tp: int, layers: int,
                   stages: int) -> float:
        """Requests/s one stage sustains holding ``layers`` layers, within TTFT/S and TPOT/S."""

    def calibrated(self, model: ModelSpec, gpu_type: str) -> bool:
        """Whether the figures for this pair rest on measured data."""

    def fingerprint(self) -> str:
        """Changes whenever the throughput figures could change (cache key)."""


class PerfThroughput:
    """The real performance model (:mod:`coral_solver.perf` over :mod:`coral_solver.catalog`)."""

    #: its answers depend on a model's architecture, mix and SLO, never on its name: models
    #: alike in those share one Stage-1 library (:func:`coral_solver.templates._cache_key`). A
    #: throughput model without this attribute (a table keyed by model name) keeps one library
    #: per name.
    answers_by_architecture = True
    #: a stage never serves more for holding more layers: its step is dearer in every term and
    #: the capacity search never rates a dearer step higher (tests/unit/test_perf_monotone.py),
    #: so Stage 1 asks only the figures its search needs (:mod:`coral_solver.lazy_layouts`)
    monotone_in_layers = True

    def __init__(self) -> None:
        from coral_solver import (  # imported here: Stage 1 can run on a synthetic model
            catalog,
            perf,
        )

        self._catalog = catalog
        self._perf = perf

    def _arch(self, model: ModelSpec):
        return self._catalog.model_arch(model.arch)

    def _gpu(self, gpu_type: str):
        return self._catalog.gpu_spec(gpu_type)

    def _slo(self, model: ModelSpec):
        return self._perf.Slo(ttft_s=model.ttft_s, tpot_s=model.tpot_s)

    def _mix(self, model: ModelSpec):
        return self._perf.Mix(input_tokens=model.input_tokens, output_tokens=model.output_tokens)

    @staticmethod
    def _lengths(model: ModelSpec):
        """The length distribution a simulated capacity draws for the model, one place for
        aggregated and role replicas alike: a fixed-seed sample of its observed (prompt,
        output) pairs (:attr:`ModelSpec.lengths`, a trace's) when it has them, else its
        declared means, exponential (the stated distribution). Either way cut at
        ``max_model_len`` as the engine cuts them. The analytic figures never read this: they
        rest on the means (:meth:`_mix`)."""
        from coral_solver import simcap

        observed = model.lengths
        if observed is None:
            return simcap.Lengths.exponential(model.input_tokens, model.output_tokens,
                                              max_model_len=model.max_model_len)
        return _observed_lengths(observed, model.max_model_len)

    def layers(self, model: ModelSpec) -> int:
        return self._arch(model).layers

    def weight_gb(self, model: ModelSpec) -> float:
        return self._arch(model).weight_bytes / 1e9

    def tp_degrees(self, model: ModelSpec, max_tp: int) -> list[int]:
        return list(self._perf.valid_tp_degrees(self._arch(model), max_tp))

    def runs_on(self, model: ModelSpec, gpu_type: str) -> bool:
        try:
            gpu = self._gpu(gpu_type)
        except KeyError:
            return False
        return self._perf.engine_dtype(self._arch(model), gpu) is not None

    def throughput(self, model: ModelSpec, gpu_type: str, tp: int, layers: int,
                   stages: int) -> float:
        if not self.kv_fits(model, gpu_type, tp, layers):
            return 0.0
        if model.pooling:  # an embedding model: prompts/s within its latency per request
            from coral_solver import perf_pooling

            return float(perf_pooling.pooling_throughput(
                self._arch(model), self._gpu(gpu_type), tp, layers, stages, model.ttft_s,
                model.input_tokens))
        slo = self._slo(model)
        mix = self._mix(model)
        return float(
            self._perf.stage_throughput(
                self._arch(model), self._gpu(gpu_type), tp, layers, stages, slo, mix
            )
        )

    def calibrated(self, model: ModelSpec, gpu_type: str) -> bool:
        return bool(self._perf.is_calibrated(self._arch(model), self._gpu(gpu_type)))

    def mean_throughput(self, model: ModelSpec, gpu_type: str, tp: int, layers: int,
                        stages: int) -> float:
        """Requests/s one stage sustains on means alone (:func:`coral_solver.perf.
        mean_stage_throughput`): the optimistic figure the simulated capacity's search
        chooses layer splits and candidates by."""
        if not self.kv_fits(model, gpu_type, tp, layers):
            return 0.0
        slo = self._slo(model)
        mix = self._mix(model)
        return float(self._perf.mean_stage_throughput(
            self._arch(model), self._gpu(gpu_type), tp, layers, stages, slo, mix))

    def simulated_throughput(self, model: ModelSpec, template: Template, goal: float) -> float:
        """Requests/s one replica of ``template`` serves with ``goal`` of the model's requests
        within TTFT and TPOT, the whole replica simulated (:mod:`coral_solver.simcap`) for the
        model's length distribution (:meth:`_lengths`: its observed lengths, else its declared
        means drawn exponential)."""
        from coral_solver import simcap

        slo = self._slo(model)
        lengths = self._lengths(model)
        return float(simcap.template_capacity(
            model.arch, template.tp, tuple(s.gpu_type for s in template.stages),
            tuple(s.layers for s in template.stages), slo, lengths, goal))

    def kv_fits(self, model: ModelSpec, gpu_type: str, tp: int, layers: int) -> bool:
        """Whether one stage of ``layers`` layers holds one request of the model's
        ``max_model_len`` in its KV cache (vLLM refuses to start otherwise); True when the
        model sets none."""
        if model.max_model_len is None:
            return True
        capacity = self._perf.stage_kv_capacity_tokens(self._arch(model), self._gpu(gpu_type),
                                                       tp, layers)
        return capacity >= model.max_model_len

    def measured(self, model: ModelSpec, gpu_type: str, tp: int) -> bool:
        """Whether a measured single-stage point of (model, GPU type, TP) applies to the model's
        mix and SLO (so a one-stage template's figure is the measurement)."""
        if model.pooling:
            return False  # `coral-hpc profile` measures generation; embeddings are modelled
        slo = self._slo(model)
        mix = self._mix(model)
        return self._perf.has_measured_throughput(self._arch(model), self._gpu(gpu_type), tp,
                                                  slo, mix)

    def measured_phase(self, model: ModelSpec, gpu_type: str, tp: int, role: str) -> bool:
        """Whether a measured ``role`` point (``coral-hpc profile --roles``) of (model, GPU
        type, TP) applies to the model's mix and SLO (a one-stage ``role`` template's figure is
        then the measurement)."""
        if model.pooling:
            return False
        slo = self._slo(model)
        mix = self._mix(model)
        return self._perf.measured_phase_throughput(
            self._arch(model), self._gpu(gpu_type), tp, slo, mix, role) is not None

    def measured_pipelines(self, model: ModelSpec, tp: int
                           ) -> list[tuple[tuple[str, ...], tuple[int, ...], float]]:
        """(GPU type per stage, layers per stage, replica requests/s) of every measured pipeline
        of ``model`` at TP ``tp`` that served the model's mix within its SLO or a stricter one."""
        if model.pooling:
            return []
        arch = self._arch(model)
        slo = self._slo(model)
        mix = self._mix(model)
        out = []
        for (name, gpu, ptp), profiles in self._perf.measured_pipelines().items():
            if name != arch.name or ptp != tp:
                continue
            layouts = dict.fromkeys((self._perf.pipeline_stage_gpus(p), p.layer_partition)
                                    for p in profiles)
            for stage_gpus, split in layouts:
                found = self._perf.measured_pipeline_throughput(
                    arch, self._gpu(gpu), tp, split, slo, mix, stage_gpus)
                if found is not None:
                    out.append((stage_gpus, split, found[0]))
        return out

    def phase_throughput(self, model: ModelSpec, gpu_type: str, tp: int, layers: int,
                         stages: int, role: str) -> float:
        """Requests/s one stage of a prefill-only or decode-only replica sustains; 0.0 when
        the stage cannot hold one ``max_model_len`` request's KV (:meth:`kv_fits`): a
        prefill-only or decode-only vLLM checks it at start as any other does."""
        from coral_solver import perf_roles

        if not self.kv_fits(model, gpu_type, tp, layers):
            return 0.0
        slo = self._slo(model)
        mix = self._mix(model)
        return perf_roles.phase_throughput(self._arch(model), self._gpu(gpu_type), tp, layers,
                                           stages, slo, mix, role)

    def mean_phase_throughput(self, model: ModelSpec, gpu_type: str, tp: int, layers: int,
                              stages: int, role: str) -> float:
        """:meth:`phase_throughput` on means alone (:func:`coral_solver.perf_roles.
        mean_phase_throughput`): what the simulated capacity's search chooses a ``role``
        template's layer split and candidates by."""
        from coral_solver import perf_roles

        if not self.kv_fits(model, gpu_type, tp, layers):
            return 0.0
        slo = self._slo(model)
        mix = self._mix(model)
        return float(perf_roles.mean_phase_throughput(self._arch(model), self._gpu(gpu_type), tp,
                                                      layers, stages, slo, mix, role))

    def simulated_phase_throughput(self, model: ModelSpec, template: Template, goal: float,
                                   role: str) -> float:
        """Requests/s one ``role`` replica of ``template`` serves with ``goal`` of the model's
        requests within that role's SLO share, the whole replica simulated
        (:mod:`coral_solver.simcap_roles`), lengths as :meth:`simulated_throughput` draws them."""
        from coral_solver import simcap_roles

        slo = self._slo(model)
        lengths = self._lengths(model)
        return float(simcap_roles.role_template_capacity(
            model.arch, template.tp, tuple(s.gpu_type for s in template.stages),
            tuple(s.layers for s in template.stages), slo, lengths, goal, role))

    def kv_bytes_per_request(self, model: ModelSpec) -> float:
        """KV bytes one request moves from its prefill to its decode replica."""
        from coral_solver import perf_roles

        mix = self._mix(model)
        return perf_roles.kv_bytes_per_request(self._arch(model), mix)

    def fingerprint(self) -> str:
        import coral_replica_sim
        from coral_solver import (
            perf_fit,
            perf_model,
            perf_pooling,
            perf_queue,
            perf_roles,
            simcap,
            simcap_roles,
        )
        from coral_solver.resources import profiles_dir

        digest = hashlib.sha256()
        digest.update(Path(perf_roles.__file__).read_bytes())
        digest.update(Path(perf_pooling.__file__).read_bytes())
        # the analytic model's queueing side, the simulated capacity's search (Policy.capacity
        # "simulated") of aggregated and of prefill-only and decode-only templates, and the step
        # times they all price: the roofline's and the step model fitted to measured steps
        for module in (perf_queue, simcap, simcap_roles, perf_model, perf_fit):
            assert module.__file__ is not None  # plain source modules of this package
            digest.update(Path(module.__file__).read_bytes())
        # and the replica simulator it runs, every module of its package (a package's __file__
        # is its __init__.py), so a module added there keys the library too
        assert coral_replica_sim.__file__ is not None
        for path in sorted(Path(coral_replica_sim.__file__).parent.glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
        for path in sorted(profiles_dir().rglob("*")):
            if path.is_file():
                digest.update(str(path.relative_to(profiles_dir())).encode())
                digest.update(path.read_bytes())
        # measured profiles may live outside the package (a site's profiles_dir): a new or
        # changed measurement must invalidate the cached Stage-1 library
        for folder in getattr(self._perf, "measured_dirs", lambda: ())():
            for path in sorted(Path(folder).glob("*.yaml")) + sorted(
                    Path(folder).glob("pipelines/*.yaml")) + sorted(
                    Path(folder).glob("roles/*.yaml")):
                digest.update(str(path).encode())
                digest.update(path.read_bytes())
        # a configured KV space (vLLM's CPU VLLM_CPU_KVCACHE_SPACE) decides which stages fit
        kv_space: dict[str, int] = getattr(self._perf, "kv_space", dict)()
        digest.update(json.dumps(sorted(kv_space.items())).encode())
        for module in (self._perf, self._catalog):
            # both are plain source modules of this package, so they have a file
            assert module.__file__ is not None
            digest.update(Path(module.__file__).read_bytes())
        # this class's own reading of them (KV fit, which figure each question gets)
        digest.update(Path(__file__).read_bytes())
        return digest.hexdigest()


@functools.lru_cache(maxsize=64)
def _observed_lengths(observed: ObservedLengths, max_model_len: int | None):
    """:meth:`coral_solver.simcap.Lengths.sample` of the observed pairs, each cut at
    ``max_model_len`` as :meth:`~coral_solver.simcap.Lengths.exponential` cuts its draws (a
    prompt leaves one output token, an output what the prompt leaves), the source saying so.
    Memoised: Stage 1 asks it once per candidate template."""
    from coral_solver import simcap

    pairs = list(observed.pairs)
    source = observed.source
    if max_model_len is not None:
        prompts = [min(p, max_model_len - 1) for p, _ in pairs]
        pairs = [(p, min(o, max_model_len - p)) for p, (_, o) in zip(prompts, pairs)]
        source += f", cut at {max_model_len}"
    return simcap.Lengths.sample(pairs, f"observed({source})")
