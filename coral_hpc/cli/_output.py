"""Shared output helpers for CLI commands: JSON to stdout, tables and errors through rich.

Tables never cut a value. :func:`print_table` gives every column at least the width of its longest
unbreakable word (an id, a partition, a state, a number is one word), lets text columns wrap
between words, and — when even those widths do not fit the terminal — prints each row as a block
of ``column: value`` lines instead. ``--wide`` prints one line per row whatever the width.
Everything for people goes to stdout through rich; with ``--json`` only the JSON does (progress,
warnings and errors go to stderr).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import click
from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

console = Console()
err_console = Console(stderr=True)

# --------------------------------------------------------------------------- exit statuses

#: Done.
EXIT_OK = 0
#: Something coral-hpc or Slurm got wrong, not your input: the independent checker rejected a
#: plan (a solver bug), Slurm answered something unreadable, or an unexpected error. Report it.
EXIT_INTERNAL = 1
#: Invalid input (bad config, bad arguments, a deployment that cannot be satisfied as written —
#: the message names the file and field), or a second daemon for a deployment another daemon
#: serves (its lease, named by host and pid): nothing was submitted, cancelled or changed.
EXIT_INVALID = 2
#: Slurm, accounting or a port could not be reached or taken: try again later.
EXIT_UNAVAILABLE = 3
#: An engine job coral-hpc started to measure failed, or never answered ``/health``: not a
#: coral-hpc bug and not the file's fault as far as coral-hpc can tell; the job's log says why.
#: (Not 4: exit 4 once meant "another daemon serves this deployment", now 2; a script
#: written for that must not read an engine failure as it.)
EXIT_ENGINE_FAILED = 5

#: The exit statuses, as README's CLI table and every command's ``--help`` state them.
EXIT_STATUSES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "done"),
    (EXIT_INTERNAL, "a bug to report (checker rejected a plan, unreadable Slurm output)"),
    (EXIT_INVALID, "invalid input, named by file and field, or another daemon (host, pid) "
                   "already serves this deployment; nothing was changed"),
    (EXIT_UNAVAILABLE, "Slurm, accounting or a port unavailable: try again"),
    (EXIT_ENGINE_FAILED, "an engine job (coral-hpc profile) failed or never answered /health; "
                         "its log is named"),
)


def exit_status_epilog(columns: int | None = None) -> str:
    """The ``Exit status`` paragraph appended to every command's ``--help``, each entry wrapped
    (hanging under its text) to the width click gives the rest of the help: the terminal's, at
    most 80 columns (``columns`` overrides the terminal's). The paragraph is marked ``\\b`` so
    click keeps its lines as they are: unwrapped, one entry ran to 128 columns (issue 29d)."""
    import shutil
    import textwrap

    terminal = columns if columns is not None else shutil.get_terminal_size().columns
    # click's HelpFormatter: max(min(terminal, 80) - 2, 50) wide; the epilog is indented by 2
    width = max(min(terminal, 80) - 2, 50) - 2
    lines = []
    for code, text in EXIT_STATUSES:
        lines += textwrap.wrap(text, width=width, initial_indent=f"  {code}  ",
                               subsequent_indent=" " * (4 + len(str(code))))
    return "\b\nExit status:\n" + "\n".join(lines)


# --------------------------------------------------------------------------- plain output


def print_json(data: Any) -> None:
    """Write ``data`` as indented JSON on stdout (machine-readable output, no colour)."""
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def fail(lines: list[str] | str, status: int = EXIT_INVALID) -> NoReturn:
    """Print every line on stderr and exit with ``status``."""
    # plain writes: rich would wrap long lines, and error lines must stay grep-able
    for line in [lines] if isinstance(lines, str) else lines:
        sys.stderr.write(line + "\n")
    raise SystemExit(status)


def wide_option(function: Callable) -> Callable:
    """``--wide``: one line per table row, whatever the terminal's width."""
    return click.option("--wide", is_flag=True,
                        help="One line per table row, never folded (for wide terminals, grep).")(
        function)


# --------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class Column:
    """One table column. ``kind``: ``id`` (job and replica ids, endpoints: one line, never
    wrapped), ``num`` (right-aligned, never wrapped) or ``text`` (wraps between words)."""

    header: str
    kind: Literal["id", "num", "text"] = "text"


#: between two columns: one space of padding and the box's (blank) vertical line
_GAP = 2


def _table() -> Table:
    """The house style: a rule under the header, no outer edge, two spaces between columns —
    the most data an 80-column terminal can hold."""
    return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))


def _text(cell: Any) -> Text:
    # values are data, never rich markup: "a100[36]" must print as it is
    return cell if isinstance(cell, Text) else Text("" if cell is None else str(cell))


def _words(text: str) -> list[str]:
    return text.split() or [""]


def _min_width(column: Column, cells: Sequence[Text]) -> int:
    """The narrowest the column may get without cutting a word (or, for ids and numbers, a
    value). Headers wrap between their words."""
    header = max(len(w) for w in _words(column.header))
    if column.kind == "text":
        longest = max((len(w) for c in cells for w in _words(c.plain)), default=0)
    else:
        longest = max((len(c.plain) for c in cells), default=0)
    return max(header, longest, 1)


def _max_width(column: Column, cells: Sequence[Text]) -> int:
    return max([len(column.header)] + [len(c.plain) for c in cells] + [1])


def fit_widths(mins: Sequence[int], maxes: Sequence[int], available: int,
               wholes: Sequence[int] | None = None) -> list[int] | None:
    """Content widths for columns that fit ``available`` characters, or None when the minimums
    alone do not fit. Each column starts at its natural width (``maxes``); first headers wrap
    (down to ``wholes``: the width that keeps every value on one line), then values wrap between
    words (down to ``mins``) — always the column with the most room to give first."""
    widths = [max(lo, hi) for lo, hi in zip(mins, maxes)]
    if sum(mins) > available:
        return None
    stages = [[max(lo, w) for lo, w in zip(mins, wholes)]] if wholes is not None else []
    for floors in stages + [list(mins)]:
        while sum(widths) > available:
            slack = [w - f for w, f in zip(widths, floors)]
            index = max(range(len(widths)), key=lambda i: slack[i])
            if slack[index] <= 0:
                break
            widths[index] -= 1
    return widths


def render_table(columns: Sequence[Column], rows: Sequence[Sequence[Any]], *,
                 width: int, title: str | None = None, wide: bool = False) -> Any:
    """A rich renderable of the table for a ``width``-column terminal: a table whose values are
    all whole, or — when it cannot fit — one block of ``column: value`` lines per row."""
    cells = [[_text(c) for c in row] for row in rows]
    by_column = [[row[i] for row in cells] for i in range(len(columns))]
    mins = [_min_width(col, by_column[i]) for i, col in enumerate(columns)]
    maxes = [_max_width(col, by_column[i]) for i, col in enumerate(columns)]
    wholes = [max([len(c.plain) for c in by_column[i]] + [1]) for i in range(len(columns))]
    if wide:
        widths: list[int] | None = maxes
    else:
        available = width - _GAP * (len(columns) - 1)
        widths = fit_widths(mins, maxes, available, wholes)
    if widths is None:
        return _records(columns, cells, title)
    table = _table()
    for column, column_width in zip(columns, widths):
        # every width holds the column's longest unbreakable word, so wrapping never cuts one
        table.add_column(Text(column.header), width=column_width, no_wrap=wide, overflow="fold",
                         justify="right" if column.kind == "num" else "left")
    for row in cells:
        table.add_row(*row)
    if title:
        return Group(Text(title, style="bold"), table)
    return table


def _records(columns: Sequence[Column], cells: Sequence[Sequence[Text]],
             title: str | None) -> Group:
    """The folded form: the first column's value heads each block, the others follow indented.
    A line is never wrapped: only a single value wider than the terminal makes it run long,
    and then it stays one piece for the terminal (and copy and paste) to handle."""
    label = max(len(c.header) for c in columns[1:]) if len(columns) > 1 else 0
    lines = [Text(title, style="bold")] if title else []
    for row in cells:
        head = Text(f"{columns[0].header}: ", style="bold", no_wrap=True, overflow="ignore")
        lines.append(head.append_text(row[0]))
        for column, cell in zip(columns[1:], row[1:]):
            line = Text(f"  {column.header.rjust(label)}: ", no_wrap=True, overflow="ignore")
            lines.append(line.append_text(cell))
    return Group(*lines)


def print_table(columns: Sequence[Column], rows: Sequence[Sequence[Any]], *,
                title: str | None = None, wide: bool = False) -> None:
    """Print a table on stdout that reads whole at the terminal's width (``COLUMNS`` honoured;
    80 when stdout is not a terminal)."""
    renderable = render_table(columns, rows, width=console.width, title=title, wide=wide)
    if wide:
        natural = render_table(columns, rows, width=console.width, wide=True)
        total = sum(c.width or 0 for c in natural.columns) + _GAP * (len(natural.columns) - 1)
        Console(file=sys.stdout, width=max(total, console.width)).print(renderable)
    else:
        console.print(renderable, highlight=False, crop=False)


# --------------------------------------------------------------------------- progress

_progress_log = logging.getLogger("coral_hpc.stage1")


class Stage1Progress:
    """A ``progress(model, done, total)`` callback for Stage 1 (the planner calls it once per
    model and once with ``model == ""`` when done): a rich progress bar on stderr while Stage 1
    runs when stderr is a terminal, one log line per model otherwise — never on stdout. Usable
    for one ``plan`` and for every re-plan of ``serve``."""

    def __init__(self, terminal: bool | None = None) -> None:
        self.terminal = err_console.is_terminal if terminal is None else terminal
        self._bar: Any = None
        self._task: Any = None
        #: after the first whole pass, Stage 1 mostly reads its cache: a daemon's re-plans log
        #: their per-model lines at DEBUG instead of repeating them every epoch
        self._passes = 0

    def __call__(self, name: str, done: int, total: int) -> None:
        if not name:
            self._passes += 1
        if not self.terminal:
            if name:
                line = f"Stage 1: templates for {name} ({done + 1}/{total})"
                if logging.getLogger().handlers:
                    level = logging.INFO if self._passes == 0 else logging.DEBUG
                    _progress_log.log(level, "%s", line)
                else:
                    sys.stderr.write(line + "\n")
            return
        if name and self._bar is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(TextColumn("Stage 1 {task.description}"), BarColumn(),
                                 MofNCompleteColumn(), console=err_console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task("", total=total)
        if self._bar is not None:
            self._bar.update(self._task, total=total, completed=done,
                             description=f"templates: {name}" if name else "done")
            if not name:
                self.close()

    def close(self) -> None:
        """Stop the bar (if one runs)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


@contextmanager
def stage1_progress() -> Iterator[Stage1Progress]:
    """A :class:`Stage1Progress` that is closed however the planning ends."""
    progress = Stage1Progress()
    try:
        yield progress
    finally:
        progress.close()
