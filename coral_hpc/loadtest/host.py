"""This host's CPU and its processes as /proc shows them: what else computed while a load phase
ran (a latency tail on a shared two-core host often comes from there, not from the engine)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Process", "busiest_processes", "host_cpu", "host_cpu_share", "host_cpu_ticks",
           "process_cpu_ticks", "processes"]


def host_cpu() -> str:
    """This host's CPU as the engine sees it: model name, cores, and whether it has AVX-512 with
    bf16 (vLLM's CPU build computes bf16 with oneDNN there, and falls back to plain torch
    matmuls without it: the same model runs several times slower)."""
    info = Path("/proc/cpuinfo").read_text()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                 if line.startswith("model name")), "unknown CPU")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines()
                      if line.startswith("flags")), []))
    isa = ("AVX-512 with bf16" if "avx512_bf16" in flags else
           "AVX-512, no bf16" if "avx512f" in flags else
           "AVX2, no AVX-512" if "avx2" in flags else "no AVX2")
    return f"{name}, {os.cpu_count()} cores, {isa}"


def host_cpu_ticks() -> tuple[int, int, int]:
    """(busy, stolen, total) clock ticks of the whole host so far, from /proc/stat. Stolen
    ticks are time the hypervisor ran another guest while this one had work: on a shared VM a
    latency tail can come from there, not from anything on this host."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields[:8]
    busy = user + nice + system + irq + softirq
    return busy, steal, busy + idle + iowait + steal


def host_cpu_share(before: tuple[int, int, int], after: tuple[int, int, int]) -> dict[str, float]:
    """The host's cores busy and the share of its time stolen between two
    :func:`host_cpu_ticks`."""
    busy, steal, total = (a - b for a, b in zip(after, before))
    return {"cores_busy": round((os.cpu_count() or 1) * busy / total, 2) if total else 0.0,
            "steal": round(steal / total, 3) if total else 0.0}


def process_cpu_ticks() -> dict[int, tuple[int, str]]:
    """Every process's CPU clock ticks so far (user + system) and its name and command line's
    start."""
    return {pid: (p.ticks, f"{p.name}: {p.cmdline[:100]}") for pid, p in processes().items()}


def busiest_processes(before: dict[int, tuple[int, str]], after: dict[int, tuple[int, str]],
                      seconds: float, top: int = 6) -> list[str]:
    """The ``top`` processes by cores used between two :func:`process_cpu_ticks`: who else
    computed while a phase ran (``0.85 1234 VLLM::Worker: ...``)."""
    hz = os.sysconf("SC_CLK_TCK")
    used = sorted(((ticks - before.get(pid, (0, ""))[0]) / hz / max(seconds, 1e-9), pid, name)
                  for pid, (ticks, name) in after.items())
    return [f"{cores:.2f} {pid} {name}" for cores, pid, name in reversed(used[-top:]) if cores > 0]


@dataclass(frozen=True)
class Process:
    """One process as /proc shows it."""

    parent: int
    ticks: int  # CPU clock ticks so far, user + system
    name: str  # /proc/PID/comm
    cmdline: str  # its arguments joined by spaces


def processes() -> dict[int, Process]:
    """Every process now, from /proc (one that ends while being read is left out)."""
    table: dict[int, Process] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            name = (proc / "comm").read_text().strip()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        table[int(proc.name)] = Process(int(fields[1]), int(fields[11]) + int(fields[12]), name,
                                        cmdline)
    return table
