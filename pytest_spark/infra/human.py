"""The human formats every topic's messages share: durations, byte sizes, name lists.

Pure string functions (no I/O, nothing of the project): a message reads the same whichever
check wrote it ("4.2 GB", "3 min", "a, b and 2 more").
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["DAY_S", "GIB", "gib", "human_bytes", "human_duration", "human_names"]

DAY_S = 86400.0
GIB = 1024**3


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown time"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * DAY_S:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / DAY_S:.1f} d"


def human_bytes(n: float) -> str:
    """Decimal units, as ``df`` and Hugging Face list sizes."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def gib(n: float) -> str:
    """Binary GiB, as ``free`` and ``/proc/meminfo`` count memory."""
    return f"{n / GIB:.1f} GiB"


def human_names(names: Sequence[str], limit: int = 5) -> str:
    """The first ``limit`` names, then how many more."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
