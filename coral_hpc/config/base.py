"""What every section of ``models.yaml`` shares: the frozen pydantic base (unknown keys,
non-finite numbers and yes/no numbers refused), the checks every value gets (printable, one-line
text), safe names, and relative paths resolved against the file's folder."""

from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

#: Names end up in Slurm job names, URLs and file names: keep them to a safe alphabet.
SAFE_NAME = r"^[a-z0-9][a-z0-9._-]{0,62}$"
_SAFE_NAME_RE = re.compile(SAFE_NAME)
#: Unicode categories refused inside any value: control characters (newline, tab, ESC, NUL...)
#: and line/paragraph separators. A newline in a path escaped a comment line of a rendered
#: engine script (issue 16); values are single lines of printable text.
_FORBIDDEN_CATEGORIES = {"Cc", "Zl", "Zp"}


def _control_character(text: str) -> str | None:
    for char in text:
        if unicodedata.category(char) in _FORBIDDEN_CATEGORIES:
            return f"U+{ord(char):04X} {unicodedata.name(char, 'control character')}".strip()
    return None


def _check_text(value: Any) -> None:
    """Refuse control characters in every string, list item and mapping key of a field."""
    if isinstance(value, str):
        found = _control_character(value)
        if found:
            raise ValueError(
                f"contains a control character ({found}, e.g. a newline or tab); "
                "write the value on one line of printable text"
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key)
            _check_text(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_text(item)


def _admits(annotation: Any, kinds: tuple[type, ...]) -> bool:
    if annotation in kinds:
        return True
    return any(_admits(arg, kinds) for arg in getattr(annotation, "__args__", ()) or ())


def _against_file(value: str | None, info: ValidationInfo) -> str | None:
    """A relative path (``~`` expanded) made absolute against the folder of the models.yaml it
    was read from, so the same file means the same paths whatever the working directory."""
    base = (info.context or {}).get("base_dir")
    if value is None or base is None:
        return value  # parsed from text (or from a spec.json): kept as written
    path = Path(value).expanduser()
    return os.path.normpath(path if path.is_absolute() else Path(base) / path)


class _Frozen(BaseModel):
    """Every config section: immutable, unknown keys rejected, numbers finite (no .inf/.nan),
    no yes/no where a number is expected, no control characters in any text."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_yes_no_numbers(cls, data: Any) -> Any:
        # pydantic reads `priority: yes` as 1; a yes/no where a number belongs is a mistake
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name) if isinstance(name, str) else None
                if (isinstance(value, bool) and field and _admits(field.annotation, (int, float))
                        and not _admits(field.annotation, (bool,))):
                    raise _FieldError((name,), f"expected a number, got yes/no ({value})")
        return data

    @field_validator("*")
    @classmethod
    def _printable_text(cls, value: Any) -> Any:
        _check_text(value)
        return value


class _FieldError(ValueError):
    """A cross-field check that knows exactly which field is wrong."""

    def __init__(self, loc: tuple[str | int, ...], message: str):
        self.loc = loc
        super().__init__(message)
