"""The ``models`` section: each served model, its request mix, declared (or measured) demand
and latency targets."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from coral_hpc.config.base import _SAFE_NAME_RE, _against_file, _FieldError, _Frozen
from coral_hpc.config.engine_flags import engine_args_problems
from coral_hpc.config.scale import WakeMode, idle_after_value, wake_timeout_value
from coral_hpc.config.weights import is_local_path


class RequestMix(_Frozen):
    """Mean request shape of a model's traffic."""

    input_tokens: int = Field(gt=0, le=1_048_576, description="mean prompt tokens per request")
    output_tokens: int = Field(default=0, ge=0, le=1_048_576,
                               description="mean generated tokens per request; required for a "
                                           "model that generates, left out for an embedding "
                                           "model (it generates none)")


class Demand(_Frozen):
    """Declared demand: requests/s, or output tokens/s (converted on load)."""

    # Upper bounds far above any deployment (a million requests/s is ~thousands of GPUs per
    # model) that keep the Stage-2 coefficients within what HiGHS's tolerances resolve.
    requests_per_s: float | None = Field(
        default=None, ge=0, le=1e6, description="requests per second of the model's mix"
    )
    output_tokens_per_s: float | None = Field(
        default=None, ge=0, le=1e9,
        description="generated tokens per second; divided by mix.output_tokens on load",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Demand:
        given = [v is not None for v in (self.requests_per_s, self.output_tokens_per_s)]
        if sum(given) != 1:
            raise ValueError(
                "give exactly one of requests_per_s or output_tokens_per_s (or demand: auto)"
            )
        return self


class SLO(_Frozen):
    """Latency targets a template's throughput is measured under: time to first token and time
    per output token for a model that generates, one latency per request for an embedding
    model."""

    ttft_s: float | None = Field(default=None, gt=0, le=600,
                                 description="time to first token, seconds (a model that "
                                             "generates)")
    tpot_s: float | None = Field(default=None, gt=0, le=10,
                                 description="time per output token, seconds (a model that "
                                             "generates)")
    latency_ms: float | None = Field(
        default=None, gt=0, le=600_000,
        description="an embedding model's latency per request, milliseconds, from arrival to "
                    "its answer (it generates no tokens, so it has no TTFT or TPOT)")

    @model_validator(mode="after")
    def _one_kind(self) -> SLO:
        generating = self.ttft_s is not None or self.tpot_s is not None
        if generating and self.latency_ms is not None:
            raise ValueError("give ttft_s and tpot_s (a model that generates) or latency_ms (an "
                             "embedding model), not both")
        if self.latency_ms is None and (self.ttft_s is None or self.tpot_s is None):
            missing = "tpot_s" if self.ttft_s is not None else (
                "ttft_s" if self.tpot_s is not None else "ttft_s and tpot_s")
            raise ValueError(f"missing {missing}: a model that generates needs both ttft_s and "
                             "tpot_s; an embedding model gives latency_ms instead")
        return self

    @property
    def embedding(self) -> bool:
        """True for an embedding model's SLO (one latency per request)."""
        return self.latency_ms is not None

    @property
    def first_answer_s(self) -> float:
        """Seconds to the first answer: TTFT, or an embedding model's whole latency (its only
        answer)."""
        value = self.latency_ms / 1000.0 if self.latency_ms is not None else self.ttft_s
        assert value is not None  # _one_kind
        return value

    @property
    def per_token_s(self) -> float:
        """TPOT; an embedding model's latency (no token follows its answer, never binding)."""
        value = self.tpot_s if self.tpot_s is not None else self.first_answer_s
        assert value is not None  # _one_kind
        return value


#: Trace formats ``models[].lengths.trace`` reads, by suffix (the readers ``coral-hpc
#: simulate`` uses, :func:`coral_hpc.trace_files.load_rows`).
TRACE_SUFFIXES = {".csv": "an Azure LLM inference trace CSV (TIMESTAMP, ContextTokens, "
                          "GeneratedTokens)",
                  ".jsonl": "a Mooncake JSONL (timestamp, input_length, output_length)",
                  ".json": "a Mooncake JSONL (timestamp, input_length, output_length)"}


class RequestLengths(_Frozen):
    """Where the model's request lengths were observed: Stage 1's simulated capacity
    (policy.capacity: simulated) draws prompt and output lengths from them instead of
    exponential lengths with the mix's means."""

    trace: str = Field(
        min_length=1,
        description="a trace of the model's requests: an Azure LLM .csv or a Mooncake .jsonl "
                    "(a relative path is taken beside this file); its (prompt, output) pairs, "
                    "at most 2000 of them sampled with a fixed seed, are the lengths a "
                    "simulated capacity is judged on. The analytic capacity reads mix only")

    @field_validator("trace")
    @classmethod
    def _trace_file(cls, value: str, info: ValidationInfo) -> str:
        suffix = "." + value.rsplit(".", 1)[-1].lower() if "." in value else ""
        if suffix not in TRACE_SUFFIXES:
            raise ValueError(f"{value!r} is not a trace this reads: expected "
                             + " or ".join(sorted(set(TRACE_SUFFIXES.values())))
                             + ", named .csv or .jsonl")
        return _against_file(value, info) or value


class ModelConfig(_Frozen):
    """One served model."""

    name: str = Field(description="safe identifier: job names, URLs, file names")
    source: str = Field(
        min_length=1,
        description="Hugging Face id or folder on the shared FS, as vLLM takes it; its "
                    "config.json (from the folder, the site's HF cache, or the copy "
                    "`coral-hpc stage` keeps) tells the planner the model's architecture")
    architecture: str | None = Field(
        default=None,
        description="optional override: an entry of the built-in catalogue "
                    "(profiles/models.yaml) instead of the model's own config.json")
    task: Literal["generate", "embed"] | None = Field(
        default=None,
        description="what the model serves: `generate` (chat and completions) or `embed` "
                    "(/v1/embeddings, vLLM's pooling runner); unset = what its config.json "
                    "says (an `...Model` architecture such as BertModel or XLMRobertaModel "
                    "embeds, as vLLM decides). Set `embed` for a decoder checkpoint served as "
                    "an embedding model (Qwen3-Embedding ships Qwen3ForCausalLM)")
    mix: RequestMix
    demand: Demand | Literal["auto"] = Field(
        description="{requests_per_s: N} or {output_tokens_per_s: N}, or `auto`: measured at the "
        "gateway, averaged over about one policy.replan_interval_s, with the measured mix; a "
        "model with no traffic yet gets min_replicas, and its first requests, answered 503, "
        "count as demand",
    )
    slo: SLO
    # priorities weight served demand in the scarce objective: a ratio beyond 10^6 between two
    # models is below the solver's relative tolerance, so it could not be honoured anyway
    priority: float = Field(
        default=1.0, ge=1e-3, le=1000, description="weight when GPUs are scarce (0.001 .. 1000)"
    )
    min_replicas: int = Field(
        default=0, ge=0, le=10_000,
        description="replicas kept whatever the demand (queued when they cannot start now; "
                    "refused when the model's partitions could never hold them)",
    )
    max_replicas: int | None = Field(
        default=None, ge=0, le=10_000,
        description="replicas at most; unset = as many as the demand needs",
    )
    partitions: tuple[str, ...] = Field(default=(), description="allowed partitions; empty = all")
    gpu_types: tuple[str, ...] = Field(default=(), description="allowed GPU types; empty = all")
    max_model_len: int | None = Field(
        default=None, gt=0, le=1 << 24,
        description="context length in tokens (vLLM --max-model-len); only layouts whose KV "
                    "cache holds one such request are planned; unset = the model's own",
    )
    lengths: RequestLengths | None = Field(
        default=None,
        description="{trace: PATH}: the model's observed request lengths, which a simulated "
                    "capacity (policy.capacity: simulated) is judged on; unset = exponential "
                    "lengths with the mix's means. Not for an embedding model")
    # scale to zero (coral_hpc.config.scale): unset = the policy's default
    idle_after: float | None = Field(
        default=None,
        description="with no request for this long (e.g. 20m) the model's replicas drain and "
                    "give their GPUs back; its next request wakes it. never = keep them; unset "
                    "= policy.idle_after (for models with min_replicas 0)")
    wake_timeout: float | None = Field(
        default=None,
        description="how long a request for a cold model is held while it wakes (e.g. 5m); "
                    "unset = policy.wake_timeout")
    wake: WakeMode | None = Field(
        default=None,
        description="hold: a request for a cold model waits while it wakes; reject: it is "
                    "answered 503 with Retry-After at once (the wake starts either way); unset "
                    "= policy.wake")
    vllm_args: tuple[str, ...] = Field(
        default=(), description="extra vLLM arguments for this model, after engine.args; flags "
                                "the planner owns (TP, PP, host, port, served name, ...) and "
                                "secrets are refused")

    @field_validator("demand", mode="before")
    @classmethod
    def _demand_shape(cls, value: Any) -> Any:
        if not isinstance(value, dict) and value != "auto":
            raise ValueError(
                f"{value!r} is not a demand: use 'auto' (measured at the gateway), "
                "{requests_per_s: N} or {output_tokens_per_s: N}"
            )
        return value

    @field_validator("idle_after", mode="before")
    @classmethod
    def _idle_after(cls, value: Any) -> float | None:
        return idle_after_value(value)

    @field_validator("wake_timeout", mode="before")
    @classmethod
    def _wake_timeout(cls, value: Any) -> float | None:
        return wake_timeout_value(value)

    @field_validator("source")
    @classmethod
    def _folder_against_file(cls, value: str, info: ValidationInfo) -> str:
        # a folder is made absolute against the models.yaml beside it, as every path of the
        # file is: a replica job runs in its own working directory and would look elsewhere.
        # A Hugging Face id stays as written.
        if is_local_path(value):
            return _against_file(value, info) or value
        return value

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not _SAFE_NAME_RE.match(value):
            raise ValueError(
                f"{value!r} is not a safe name: use 1–63 lowercase letters, digits, '.', '_' or "
                "'-', starting with a letter or digit"
            )
        return value

    @model_validator(mode="after")
    def _planner_owned_flags(self) -> ModelConfig:
        for index, why in engine_args_problems(self.vllm_args)[:1]:
            raise _FieldError(("vllm_args", index),
                              f"model {self.name!r} may not set {why}; remove it")
        return self

    @model_validator(mode="after")
    def _replica_bounds(self) -> ModelConfig:
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas ({self.max_replicas}) is below min_replicas ({self.min_replicas})"
            )
        if self.idle_after and self.min_replicas > 0:
            raise _FieldError(("idle_after",),
                              f"model {self.name!r} keeps min_replicas {self.min_replicas} "
                              "whatever the demand, so it can never go idle to zero: set "
                              "min_replicas 0 (the default) or remove idle_after")
        return self

    @model_validator(mode="after")
    def _task_and_slo(self) -> ModelConfig:
        embedding = self.slo.embedding
        if self.task == "embed" and not embedding:
            raise _FieldError(("slo",), f"model {self.name!r} is an embedding model (task: "
                              "embed): its SLO is one latency per request, slo: {latency_ms: N}")
        if self.task == "generate" and embedding:
            raise _FieldError(("slo", "latency_ms"), f"model {self.name!r} generates (task: "
                              "generate): its SLO is {ttft_s: N, tpot_s: N}")
        if embedding and self.lengths is not None:
            raise _FieldError(("lengths",), f"model {self.name!r} is an embedding model: its "
                              "capacity does not depend on output lengths; drop lengths")
        if embedding and self.mix.output_tokens:
            raise _FieldError(("mix", "output_tokens"), f"model {self.name!r} is an embedding "
                              "model (slo: latency_ms): it generates no tokens; drop "
                              "mix.output_tokens")
        if not embedding and not self.mix.output_tokens:
            raise _FieldError(("mix", "output_tokens"), f"model {self.name!r} generates: give "
                              "mix.output_tokens, its mean generated tokens per request")
        if (embedding and self.demand != "auto"
                and self.demand.output_tokens_per_s is not None):
            raise _FieldError(("demand", "output_tokens_per_s"), f"model {self.name!r} is an "
                              "embedding model: it generates no tokens; give requests_per_s")
        return self

    @property
    def embedding(self) -> bool:
        """True for an embedding model (served by vLLM's pooling runner at /v1/embeddings):
        ``task: embed``, or an SLO of one latency per request. Once the model's config.json is
        read (:mod:`coral_hpc.model_archs`) the two agree or the configuration is refused."""
        return self.task == "embed" or self.slo.embedding

    @property
    def arch_key(self) -> str:
        """The key the performance model's catalogue knows this model by: ``architecture``
        when given, else the source, whose config.json the loader registered under it
        (:mod:`coral_hpc.config.weights`)."""
        return self.architecture or self.source

    @property
    def demand_rps(self) -> float | None:
        """Declared demand in requests/s of this model's mix; None when measured (auto)."""
        if self.demand == "auto":
            return None
        if self.demand.requests_per_s is not None:
            return self.demand.requests_per_s
        tokens_per_s = self.demand.output_tokens_per_s
        assert tokens_per_s is not None  # Demand holds exactly one of the two
        return tokens_per_s / self.mix.output_tokens
