"""Every value that reaches a rendered script, validated and quoted for where it lands.

Three contexts, one filter each (registered in :mod:`coral_hpc.launch.render`):

- ``q`` — a shell word: :func:`shlex.quote`, after refusing control characters (a newline inside
  quotes is one word to bash, but it would end an ``#SBATCH`` line or a comment).
- ``c`` — text inside a ``#`` comment: control characters are shown escaped (``\\n``), so the
  comment stays one line whatever the value (a newline in ``environment.path`` escaped a comment
  of the engine script and the next line ran: issue 16).
- ``ident`` — a shell variable name (``export NAME=``): ``[A-Za-z_][A-Za-z0-9_]*`` only.
- ``w`` — a bare Slurm word (partition, GRES, memory, account, QOS) where no quoting is possible
  (submitit writes its ``#SBATCH`` lines unquoted): only ``[A-Za-z0-9._:-]`` is accepted.

:func:`finalize` is Jinja's hook on every ``{{ ... }}``: it lets through what one of the filters
produced, and numbers; anything else — a template that forgets a filter, a string where a number
belongs (a tampered ``spec.json``) — raises :class:`UnsafeValue` instead of rendering.
"""

from __future__ import annotations

import math
import re
import shlex
import unicodedata
from typing import Any

from coral_hpc.errors import PermanentError

#: a Slurm name, or a word of them joined by ':' (``gpu:a100:2``): nothing a shell or sbatch's
#: option parser reads as anything but the word itself
_SLURM_WORD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_UNSAFE_CATEGORIES = {"Cc", "Zl", "Zp"}
_SHELL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class UnsafeValue(PermanentError):
    """A value cannot be written safely into a script in the context it would land in."""


class Rendered(str):
    """Text already validated and quoted for its context by one of the filters."""


def _unsafe_char(text: str) -> str | None:
    for char in text:
        if unicodedata.category(char) in _UNSAFE_CATEGORIES:
            return f"U+{ord(char):04X}"
    return None


def shell_word(value: Any) -> Rendered:
    """``value`` as one shell word; refuses control characters (newline, tab, NUL...)."""
    text = str(value)
    found = _unsafe_char(text)
    if found:
        raise UnsafeValue(
            f"{text!r} holds a control character ({found}); a script value is one line of text"
        )
    return Rendered(shlex.quote(text))


def comment_text(value: Any) -> Rendered:
    """``value`` for a ``#`` comment line: control and line-separator characters escaped."""
    out = []
    for char in str(value):
        if unicodedata.category(char) in _UNSAFE_CATEGORIES:
            out.append(char.encode("unicode_escape").decode("ascii"))
        else:
            out.append(char)
    return Rendered("".join(out))


def slurm_word(value: Any) -> Rendered:
    """``value`` as a bare Slurm word (partition, ``gpu:TYPE:N``, account, QOS): letters, digits,
    '.', '_', '-', ':', starting with a letter or digit; anything else raises
    :class:`UnsafeValue`."""
    text = str(value)
    if not _SLURM_WORD_RE.match(text):
        raise UnsafeValue(
            f"{text!r} is not a Slurm name (letters, digits, '.', '_', '-', ':'); it cannot be "
            "written into a batch script"
        )
    return Rendered(text)


def shell_name(value: Any) -> Rendered:
    """``value`` as a shell variable name (``export NAME=...``); anything else is refused."""
    text = str(value)
    if not _SHELL_NAME_RE.match(text):
        raise UnsafeValue(f"{text!r} is not a shell variable name ([A-Za-z_][A-Za-z0-9_]*)")
    return Rendered(text)


def finalize(value: Any) -> str:
    """Jinja's ``finalize``: quoted text and plain numbers render; anything else is refused."""
    if isinstance(value, Rendered):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    raise UnsafeValue(
        f"template value {value!r} is not quoted for its context: pass it through q (shell word), "
        "c (comment), w (Slurm name) or ident (variable name)"
    )
