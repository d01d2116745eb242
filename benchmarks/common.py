"""What the benchmark scripts share: a free port on 127.0.0.1 and the machine's busy CPU
time. The scripts run as ``python benchmarks/NAME.py``, so this folder is on sys.path."""

from __future__ import annotations

import os
import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def machine_cpu_s() -> float:
    """CPU seconds every core of this machine has spent busy so far (/proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
