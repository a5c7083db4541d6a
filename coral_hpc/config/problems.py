"""pydantic's validation errors as problem lines, one per problem, in the format of every config
error: ``file:line: field: message`` with what would be valid."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from coral_hpc.config.base import _FieldError
from coral_hpc.config.deployment import Deployment
from coral_hpc.config.locate import _dotted, _nearest_line
from coral_hpc.config.source import FieldLines, FieldPath


def _clean_loc(loc: FieldPath) -> FieldPath:
    """Drop pydantic's union-branch tags (``'function-after[...]'``, ``'venv'``) from a location."""
    cleaned: list[str | int] = []
    for part in loc:
        if isinstance(part, str) and ("[" in part or part in ("venv", "module", "apptainer")):
            if "[" in part:
                continue
            # discriminator tag of the engine environment union
            if cleaned and cleaned[-1] == "environment":
                continue
        cleaned.append(part)
    return tuple(cleaned)


def _valid_keys_hint(loc: FieldPath) -> str:
    """For an unknown key, list the keys that section accepts."""
    section = _section_model(loc[:-1])
    if section is None:
        return ""
    return f"; valid keys here: {', '.join(sorted(section.model_fields))}"


def _section_model(loc: FieldPath) -> type[BaseModel] | None:
    model: Any = Deployment
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = _first_model(field.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _first_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def _union_field(loc: FieldPath) -> FieldPath | None:
    """The location of the union field an error's branch tag (``"literal['auto']"``,
    ``'dict[str,float]'``) sits under, or None when the error is not from a union branch."""
    for index, part in enumerate(loc):
        if isinstance(part, str) and "[" in part:
            return _clean_loc(loc[:index])
    return None


def _one_error_per_union(errors: list[Any]) -> list[Any]:
    """pydantic reports a union field's failure once per branch, so a mapping with one bad
    value also got "Input should be 'auto'" (issue 29d). One error per problem: when the
    value was a mapping or list, the branches that wanted a plain word are dropped (the
    mapping's own errors say what is wrong); when every branch failed on the value itself,
    their expectations become one line ("Input should be a valid dictionary or 'billing'")."""
    by_field: dict[FieldPath, list[Any]] = {}
    for item in errors:
        field = _union_field(tuple(item["loc"]))
        if field is not None:
            by_field.setdefault(field, []).append(item)
    out = []
    for item in errors:
        field = _union_field(tuple(item["loc"]))
        group = by_field.get(field) if field is not None else None
        if field is None or group is None or len(group) < 2:
            out.append(item)
            continue
        if item is not group[0]:
            continue
        structured = [g for g in group if not (g["type"] == "literal_error"
                                              and isinstance(g["input"], (dict, list)))]
        if len(structured) < len(group):
            out.extend(structured)
            continue
        expected = [g["msg"].removeprefix("Input should be ") for g in group]
        merged = dict(group[0], loc=field,
                      msg="Input should be " + " or ".join(dict.fromkeys(expected)))
        out.append(merged)
    return out


def _problems_from(error: ValidationError, lines: FieldLines, path: str) -> list[str]:
    problems = []
    items = [(item, _clean_loc(tuple(item["loc"])))
             for item in _one_error_per_union(error.errors())]
    for item, loc in items:
        # pydantic adds "too short" for a list whose items failed: the item errors say it all
        if item["type"] == "too_short" and any(
            len(other) > len(loc) and other[: len(loc)] == loc for _, other in items
        ):
            continue
        message = item["msg"]
        ctx_error = (item.get("ctx") or {}).get("error")
        if isinstance(ctx_error, _FieldError):
            loc = loc + tuple(ctx_error.loc)
            message = str(ctx_error)
        elif message.startswith("Value error, "):
            message = message[len("Value error, ") :]
        if item["type"] == "extra_forbidden":
            message = f"unknown key '{loc[-1]}'{_valid_keys_hint(loc)}"
        elif item["type"] == "missing":
            message = "required field is missing"
        line = _nearest_line(lines, loc)
        problems.append(f"{path}:{line}: {_dotted(loc)}: {message}")
    # pydantic reports each union branch separately; keep each line once, in order
    return list(dict.fromkeys(problems))
