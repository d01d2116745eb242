"""The per-node fake tools. Standard library only, no imports from the rest of sparksim:
``spark-sim up`` copies this package to DIR/lib/sparksim_tools and writes, per node, small
executables into DIR/nodes/<name>/bin that call ``main(tool, node_dir, argv)``."""

from __future__ import annotations

import sys
from collections.abc import Callable

from . import gpu, kernellog, links, timesync

TOOLS: dict[str, Callable[[str, list[str]], int]] = {
    "ibdev2netdev": links.ibdev2netdev,
    "ibstat": links.ibstat,
    "ibv_devinfo": links.ibv_devinfo,
    "ibv_devices": links.ibv_devices,
    "rdma": links.rdma,
    "ethtool": links.ethtool,
    "nvidia-smi": gpu.nvidia_smi,
    "timedatectl": timesync.timedatectl,
    "journalctl": kernellog.journalctl,
    "dmesg": kernellog.dmesg,
}


def main(tool: str, node_dir: str, argv: list[str]) -> int:
    try:
        return TOOLS[tool](node_dir, argv)
    except BrokenPipeError:  # `ibstat | head`
        return 0
    except (OSError, KeyError, ValueError) as exc:
        sys.stderr.write(f"{tool}: sparksim state unreadable ({exc!r}) in {node_dir}\n")
        return 1
