"""Pure parsers of a node's memory: ``/proc/meminfo``, the processes' resident sizes read
from ``/proc/PID/status``, and ``nvidia-smi --query-compute-apps`` with its memory column.

On GB10 the GPU has no memory of its own: the 128 GB LPDDR5X is one pool that the kernel
reports in ``/proc/meminfo`` and CUDA allocates from, and nvidia-smi's memory fields print
``[N/A]`` (REFERENCE.md §2). Every figure here is bytes; ``None`` is a figure the source
did not give.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_spark.infra.errors import ParseError

__all__ = [
    "ComputeAppMemory",
    "ContainerMemory",
    "MemInfo",
    "ProcessMemory",
    "parse_compute_app_memory",
    "parse_meminfo",
    "parse_process_memory",
]

GIB = 1024**3
_LINE = re.compile(r"^([A-Za-z0-9_()]+):\s+(\d+)(?:\s+kB)?\s*$")
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(MiB|GiB|KiB|B)?\s*$")
_UNITS = {None: 1024**2, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": GIB}  # no unit: MiB


@dataclass(frozen=True)
class MemInfo:
    """The figures of ``/proc/meminfo`` the headroom check uses, in bytes."""

    total: int  # MemTotal: the unified pool the kernel manages (CUDA's total on GB10)
    free: int  # MemFree
    available: int | None  # MemAvailable (kernels before 3.14 have none)
    cached: int  # Cached + Buffers: page cache the kernel can drop
    swap_total: int
    swap_free: int

    @property
    def swap_used(self) -> int:
        return max(0, self.swap_total - self.swap_free)


def parse_meminfo(text: str) -> MemInfo:
    """Parse ``cat /proc/meminfo`` (``Key:   N kB`` lines; unknown keys are ignored)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            unit = 1024 if line.rstrip().endswith("kB") else 1
            values[m[1]] = int(m[2]) * unit
    if "MemTotal" not in values or "MemFree" not in values:
        head = text.strip().splitlines()[:1]
        raise ParseError("/proc/meminfo", "no MemTotal/MemFree line", head[0] if head else "")
    return MemInfo(
        total=values["MemTotal"],
        free=values["MemFree"],
        available=values.get("MemAvailable"),
        cached=values.get("Cached", 0) + values.get("Buffers", 0),
        swap_total=values.get("SwapTotal", 0),
        swap_free=values.get("SwapFree", 0),
    )


@dataclass(frozen=True)
class ProcessMemory:
    """One process by resident size (``VmRSS`` of ``/proc/PID/status``)."""

    pid: int
    name: str  # the status Name: (comm, at most 15 characters)
    rss: int  # bytes
    args: str  # /proc/PID/cmdline, NULs as spaces ('' for a kernel thread)


def parse_process_memory(text: str) -> list[ProcessMemory]:
    """Parse the probe's process listing: ``PID<TAB>RSS_KB<TAB>NAME<TAB>ARGS`` lines,
    largest first. Lines of processes that ended while listed (no RSS) are skipped."""
    out: list[ProcessMemory] = []
    for line in text.splitlines():
        parts = line.split("\t", 3)
        if len(parts) < 3 or not parts[0].strip().isdigit() or not parts[1].strip().isdigit():
            continue
        args = parts[3].strip() if len(parts) > 3 else ""
        out.append(ProcessMemory(int(parts[0]), parts[2].strip(), int(parts[1]) * 1024, args))
    return sorted(out, key=lambda p: (-p.rss, p.pid))


@dataclass(frozen=True)
class ComputeAppMemory:
    """One line of ``nvidia-smi --query-compute-apps=pid,process_name,used_memory``;
    ``used`` is None where the driver prints ``[N/A]`` (GB10's unified memory)."""

    pid: int
    name: str
    used: int | None


def parse_compute_app_memory(text: str) -> list[ComputeAppMemory]:
    """Parse ``--format=csv,noheader`` output (``nounits`` or not); ``No running
    processes found`` and blank output are no apps."""
    out: list[ComputeAppMemory] = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        m = _MEMORY.match(parts[-1])
        used = int(float(m[1]) * _UNITS[m[2]]) if m else None
        out.append(ComputeAppMemory(int(parts[0]), ",".join(parts[1:-1]), used))
    return out


@dataclass(frozen=True)
class ContainerMemory:
    """A node's serving container: its cgroup memory limit (None: none, as with
    launch-cluster.sh's default --privileged) and where it was read, and the ``vllm
    serve`` line of its running rank (None: not found)."""

    node: str
    limit: int | None
    source: str
    serve_line: str | None
    need: int | None = None  # what that rank asks for, bytes (None: not known)
    need_source: str = ""
