"""The gateway's access log: one JSON line per request, saying who asked what of which replica,
and never what was asked or answered.

Where: ``<state_dir>/<deployment>/access/`` (folder 0700, files 0600; the gateway refuses to
start when others may write the folder), one file per UTC day the requests arrived,
``access-YYYY-MM-DD.jsonl``. Files whose day ended more than ``retention.access_log_days`` ago
are deleted, at start, when a new day's file is opened and hourly.

A line (keys in this order; ``null`` where a request never got that far)::

    {"time": "2026-05-01T12:00:00.123Z", "key": "alice", "lab": "astro", "method": "POST",
     "path": "/v1/chat/completions", "model": "qwen3-8b", "status": 200, "stream": false,
     "prompt_tokens": 21, "output_tokens": 87, "tokens_estimated": false, "latency_s": 0.8412,
     "replica": "r3", "job_id": "123456", "replica_url": "http://gpu-07:8301"}

``time`` is when the request head arrived; ``latency_s`` runs from then to the last byte of the
answer. ``key`` is the API key's *name* (``anonymous`` without a keys file, ``null`` when the key
was missing or wrong); ``lab`` is the key's ``lab=`` label in the keys file. ``status`` 499 means
the client went away before its answer was complete (nginx's convention).

The request path only appends a tuple to a queue; a writer thread formats and writes the lines
every :data:`FLUSH_INTERVAL_S` (a slow or hung shared filesystem never stalls a request). When the
writer falls :data:`MAX_PENDING` lines behind, further lines are dropped and counted (the log
says how many) rather than growing the gateway's memory.
"""

from __future__ import annotations

import calendar
import json
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from coral_hpc.atomic import PRIVATE_FILE_MODE, not_private_problem, private_dir
from coral_hpc.errors import PermanentError

log = logging.getLogger("coral_hpc.gateway")

#: the access log's folder inside a deployment's state folder
ACCESS_DIR_NAME = "access"
FILE_PREFIX = "access-"
FILE_SUFFIX = ".jsonl"
_FILE_RE = re.compile(r"^access-(\d{4})-(\d{2})-(\d{2})\.jsonl$")
FLUSH_INTERVAL_S = 0.5
MAX_PENDING = 100_000
PRUNE_INTERVAL_S = 3600.0
DAY_S = 86400.0

#: the fields of a line, in order; :meth:`AccessLog.record` takes one value per field after
#: ``time`` (epoch seconds, formatted by the writer)
FIELDS = ("time", "key", "lab", "method", "path", "model", "status", "stream", "prompt_tokens",
          "output_tokens", "tokens_estimated", "latency_s", "replica", "job_id", "replica_url",
          "error")


class AccessLogError(PermanentError):
    """The access log's folder cannot be used; the message names it and the fix."""


def file_for_day(folder: Path, day: str) -> Path:
    """The file of UTC day ``day`` (``YYYY-MM-DD``)."""
    return folder / f"{FILE_PREFIX}{day}{FILE_SUFFIX}"


class _Seconds:
    """UTC day and ``YYYY-MM-DDTHH:MM:SS`` of an epoch second, formatted once per second (the
    lines of a batch mostly share their seconds)."""

    __slots__ = ("second", "day", "prefix")

    def __init__(self) -> None:
        self.second = -1
        self.day = ""
        self.prefix = ""

    def of(self, epoch: float) -> tuple[str, str]:
        """(day, time with milliseconds) of ``epoch``."""
        whole = int(epoch)
        if whole != self.second:
            parts = time.gmtime(whole)
            self.second = whole
            self.day = time.strftime("%Y-%m-%d", parts)
            self.prefix = time.strftime("%Y-%m-%dT%H:%M:%S", parts)
        millis = min(int((epoch - whole) * 1000 + 0.5), 999)
        return self.day, f"{self.prefix}.{millis:03d}Z"


def _day_end(match: re.Match) -> float:
    """Epoch seconds at which the file's UTC day ended."""
    start = calendar.timegm((int(match.group(1)), int(match.group(2)), int(match.group(3)),
                             0, 0, 0))
    return start + DAY_S


def expired_files(folder: Path, keep_days: float, now: float) -> list[Path]:
    """Access-log files in ``folder`` whose day ended more than ``keep_days`` before ``now``."""
    cutoff = now - keep_days * DAY_S
    out = []
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    for name in names:
        match = _FILE_RE.match(name)
        if match and _day_end(match) < cutoff:
            out.append(folder / name)
    return out


class AccessLog:
    """The access log of one gateway (see the module docstring). :meth:`open` it, :meth:`record`
    one tuple per request, :meth:`close` it (which writes what is pending)."""

    def __init__(self, folder: Path, keep_days: float, clock: Callable[[], float] = time.time,
                 flush_interval_s: float = FLUSH_INTERVAL_S,
                 max_pending: int = MAX_PENDING) -> None:
        self.folder = Path(folder)
        self.keep_days = keep_days
        self.clock = clock
        self.flush_interval_s = flush_interval_s
        self.max_pending = max_pending
        # lines not written, counted apart by the thread that drops them (no shared +=)
        self._dropped_full = 0         # the queue was full (the request path's thread)
        self._dropped_failed = 0       # a write failed (the writer's)
        self._pending: deque[tuple] = deque()
        self._seconds = _Seconds()
        self._day: str | None = None
        self._fd: int | None = None
        self._last_prune = float("-inf")
        self._reported_dropped = 0
        self._lock = threading.Lock()  # one writer at a time (the thread, close, tests' flush)
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None

    @property
    def dropped(self) -> int:
        """Lines not written: the queue was full, or a write failed."""
        return self._dropped_full + self._dropped_failed

    # ------------------------------------------------------------------ lifecycle

    def open(self, start_thread: bool = True) -> None:
        """Create the folder (0700), refuse one others may write, prune, start the writer."""
        problem = not_private_problem(self.folder, "access-log folder")
        if problem is not None:
            raise AccessLogError(problem)
        try:
            private_dir(self.folder)
        except OSError as exc:
            raise AccessLogError(f"cannot create the access-log folder {self.folder}: "
                                 f"{exc.strerror or exc}") from None
        self.prune()
        if start_thread:
            self._thread = threading.Thread(target=self._run, name="access-log", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the writer and write every pending line."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        self.flush()
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd, self._day = None, None

    # ------------------------------------------------------------------ the request path

    def record(self, epoch: float, *values) -> None:
        """Queue one line: ``epoch`` (when the request arrived) then one value per field of
        :data:`FIELDS` after ``time``. Cheap: no formatting, no I/O."""
        if len(self._pending) >= self.max_pending:
            self._dropped_full += 1
            return
        self._pending.append((epoch, *values))

    # ------------------------------------------------------------------ the writer

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.flush_interval_s)
            try:
                self.flush()
            except Exception:  # pragma: no cover - flush logs its own I/O errors
                log.exception("access log writer failed")

    def flush(self) -> int:
        """Write every queued line to its day's file; returns how many were written."""
        with self._lock:
            written = 0
            batch: list[str] = []
            day = None
            pending = self._pending
            seconds = self._seconds
            dumps = json.dumps
            while pending:
                entry = pending.popleft()
                entry_day, stamp = seconds.of(entry[0])
                if day is not None and entry_day != day:
                    written += self._write(day, batch)
                    batch = []
                day = entry_day
                batch.append(dumps(dict(zip(FIELDS, (stamp, *entry[1:])))) + "\n")
            if batch and day is not None:
                written += self._write(day, batch)
            dropped = self.dropped
            if dropped != self._reported_dropped:
                log.warning("access log: %d line(s) dropped so far (the writer fell %d lines "
                            "behind, or writes failed)", dropped, self.max_pending)
                self._reported_dropped = dropped
            now = self.clock()
            if now - self._last_prune >= PRUNE_INTERVAL_S:
                self._prune_locked(now)
            return written

    def _write(self, day: str, lines: list[str]) -> int:
        try:
            fd = self._file(day)
            data = memoryview("".join(lines).encode())   # ASCII: json.dumps escapes the rest
            while data:
                done = os.write(fd, data)
                data = data[done:]
        except OSError as exc:
            self._dropped_failed += len(lines)
            log.error("access log: %d line(s) not written to %s: %s", len(lines),
                      file_for_day(self.folder, day), exc.strerror or exc)
            if self._fd is not None:
                os.close(self._fd)
                self._fd, self._day = None, None  # reopen at the next write
            return 0
        return len(lines)

    def _file(self, day: str) -> int:
        """The open descriptor of ``day``'s file (the previous day's closed, old files pruned)."""
        if self._fd is not None and day == self._day:
            return self._fd
        if self._fd is not None:
            os.close(self._fd)
            self._fd, self._day = None, None
        path = file_for_day(self.folder, day)
        private_dir(self.folder)   # removed under a running gateway: made again, private
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                     PRIVATE_FILE_MODE)
        os.fchmod(fd, PRIVATE_FILE_MODE)   # one left with another mode is made private
        self._fd, self._day = fd, day
        self._prune_locked(self.clock())
        return fd

    def prune(self) -> int:
        """Delete the files older than ``keep_days``; returns how many went."""
        with self._lock:
            return self._prune_locked(self.clock())

    def _prune_locked(self, now: float) -> int:
        self._last_prune = now
        removed = 0
        for path in expired_files(self.folder, self.keep_days, now):
            if path == file_for_day(self.folder, self._day or ""):
                continue  # the file being written (a clock far behind the requests' days)
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.error("access log: cannot remove %s: %s", path, exc.strerror or exc)
                continue
            removed += 1
        if removed:
            log.info("access log: removed %d file(s) older than %g days from %s", removed,
                     self.keep_days, self.folder)
        return removed
