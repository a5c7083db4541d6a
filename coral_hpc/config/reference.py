"""The configuration reference, generated from the pydantic models of :mod:`coral_hpc.config`
(``scripts/config-reference`` writes it to docs/config-reference.md; a test keeps it in sync).
Not imported by the package itself: only the script and the tests need it.

One table per section, in the order a ``models.yaml`` reads: each key with its type, its default
(or *required*) and the field's own description — the models are the single source."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel

from coral_hpc.config.deployment import Deployment

HEADER = """# models.yaml reference

Generated from the pydantic models in `coral_hpc/config/` by `scripts/config-reference`; do not
edit by hand (a test fails when this page and the models disagree). `coral-hpc validate FILE`
checks a file against exactly these rules: unknown keys are refused, every error names the file,
line and field.

Units: a key ending in `_s` is in seconds, `_days` in days, `_mb` and `_gb` in megabytes and
gigabytes; `cluster.time_limit` is a Slurm time (`HH:MM:SS`, `D-HH:MM:SS`, or an integer number
of minutes). Demand and throughput are requests per second of the model's own mix
(`models[].mix`); `demand: {output_tokens_per_s: N}` is converted on load to N ÷
`mix.output_tokens` requests per second.

`demand: auto` means the demand is measured instead of declared: the gateway counts each model's
requests (those answered 503 for lack of a READY replica included) and their prompt and output
tokens, the daemon averages the rate over about one `policy.replan_interval_s`, and plans for it
with the measured mix. A model with no traffic yet is planned at `min_replicas`; its first
requests raise its demand and the next plan gives it replicas.

A model is named by its weights: `source:` is a folder on the shared filesystem or a Hugging
Face id, as vLLM takes it, and nothing else is needed. coral-hpc reads the model's own
`config.json` — from the folder (a relative one is taken beside this file, and replica
jobs are given that absolute path); for an id, from the
site's Hugging Face cache (`engine.hf_home`, else `<state_dir>/huggingface`; then
`HF_HUB_CACHE` or `HF_HOME`), `hub/models--ORG--NAME/snapshots/REV/config.json` with the
revision `refs/main` names; or from the
copy `coral-hpc stage` keeps in `<state_dir>/<deployment>/model-configs/`, so `validate` and
`plan` work on a host that cannot read the weights. From it come the layers, hidden size,
attention and KV heads, head size, FFN and expert widths, experts per token, vocabulary, context
length, dtype and quantization (AWQ, GPTQ, FP8, MXFP4): the weight bytes, the KV bytes per token
(grouped-query or DeepSeek's latent attention) and which GPU types can run it (no bf16 below
compute capability 8.0: a V100 serves an fp16 cast, or nothing for models vLLM refuses in fp16,
such as Gemma 2/3; FP8 MoE needs 8.9; AWQ 7.5; MXFP4 8.0). Llama, Mistral, Mixtral, Qwen 2/2.5/3,
Qwen MoE, Gemma 2/3, Phi-3/4, DeepSeek-V2/V3 and gpt-oss are read with their own rules; any
other `model_type` gets a dense estimate from the standard fields, which `validate` and `plan`
mark "generic estimate". A missing or unreadable `config.json`, or one without a field the
estimate needs, is refused naming the file and the field. `architecture:` overrides all this with
an entry of the built-in catalogue; an id the catalogue knows (e.g.
`meta-llama/Llama-3.1-8B-Instruct`) needs no `config.json`. `validate` and `plan` print, per
model, what they derived and which GPU types they leave out, and why.
"""


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config sections an annotation refers to (through Optional, tuples, unions)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        for model in _models_in(arg):
            if model not in found:
                found.append(model)
    return found


def _type_name(annotation: Any) -> str:
    """A short, YAML-minded name of a field's type."""
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return f"[{annotation.__name__}](#{annotation.__name__.lower()})"
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is tuple:
        return f"list of {_type_name(args[0])}"
    if origin is dict:
        return f"map of {_type_name(args[0])} → {_type_name(args[1])}"
    return str(annotation)


def _default(field: Any) -> str:
    if field.is_required():
        return "*required*"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(section defaults)"
    if value is None:
        return "null"
    if value in ((), {}):
        return "{}" if value == {} or field_type(field).startswith("map of") else "[]"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(map(str, value)) + "]"
    return f"`{value}`"


def _sections() -> list[tuple[str, type[BaseModel]]]:
    """(path, model) of every section, depth first from the top level."""
    out: list[tuple[str, type[BaseModel]]] = []
    seen: set[type[BaseModel]] = set()

    def walk(path: str, model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        out.append((path, model))
        for name, field in model.model_fields.items():
            many = typing.get_origin(field.annotation) is tuple
            for sub in _models_in(field.annotation):
                walk(f"{path}.{name}{'[]' if many else ''}".lstrip("."), sub)

    walk("", Deployment)
    return out


def render_reference() -> str:
    """The whole reference page as Markdown."""
    parts = [HEADER]
    for path, model in _sections():
        title = path or "top level"
        parts.append(f"\n## {model.__name__}\n\n`{title}` — {_doc(model)}\n")
        parts.append("| key | type | default | what it is |\n|---|---|---|---|")
        for name, field in model.model_fields.items():
            description = field_description(field).replace("|", "\\|").replace("\n", " ")
            parts.append(f"| `{name}` | {field_type(field)} | {_default(field)} | "
                         f"{description} |")
    return "\n".join(parts) + "\n"


def field_description(field: Any) -> str:
    """What the reference says a field is: its own description, else the docstring of the
    section it holds (``cluster``, ``policy``, ...)."""
    return field.description or "; ".join(_doc(sub) for sub in _models_in(field.annotation))


def field_type(field: Any) -> str:
    """The type as a models.yaml author writes it: a field stored in another shape than it is
    written (``env``: a mapping kept as sorted pairs) names it in ``json_schema_extra``."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    written = extra.get("yaml_type")
    return str(written) if written else _type_name(field.annotation)


def _doc(model: type[BaseModel]) -> str:
    return " ".join((model.__doc__ or "").split())
