"""Pure parsers of a process's resource limits (``/proc/PID/limits``) and of the kernel's
file-handle ceilings (``/proc/sys/fs/file-max``, ``/proc/sys/fs/nr_open``).

``/proc/PID/limits`` is a table, one limit a line, columns aligned with spaces::

    Limit                     Soft Limit           Hard Limit           Units
    Max open files            1024                 524288               files

(proc(5); a limit without a ceiling prints ``unlimited``.) Only ``Max open files``
(RLIMIT_NOFILE) is read here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_spark.infra.errors import ParseError

__all__ = ["UNLIMITED", "OpenFiles", "parse_open_files", "parse_proc_int"]

UNLIMITED = 2**63 - 1  # RLIM_INFINITY as a figure that compares above any limit
_NOFILE = re.compile(r"^Max open files\s+(\d+|unlimited)\s+(\d+|unlimited)(?:\s+files)?\s*$")


@dataclass(frozen=True)
class OpenFiles:
    """A process's RLIMIT_NOFILE: the soft limit it runs with and the hard ceiling up to
    which it (or a child: a container) may raise it without privilege."""

    soft: int
    hard: int


def _limit(text: str) -> int:
    return UNLIMITED if text == "unlimited" else int(text)


def parse_open_files(text: str) -> OpenFiles:
    """The ``Max open files`` line of ``cat /proc/PID/limits``."""
    for line in text.splitlines():
        m = _NOFILE.match(line.strip())
        if m:
            return OpenFiles(_limit(m[1]), _limit(m[2]))
    head = text.strip().splitlines()[:1]
    raise ParseError("/proc/PID/limits", "no 'Max open files' line", head[0] if head else "")


def parse_proc_int(text: str, what: str) -> int:
    """One integer file of ``/proc/sys`` (``fs.file-max``, ``fs.nr_open``)."""
    value = text.strip()
    if not value.isdigit():
        raise ParseError(what, "one integer", value[:80])
    return int(value)
