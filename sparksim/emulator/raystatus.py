"""``ray status`` shim: the head ``serve`` process writes which nodes are alive to a small
JSON file (``SPARKSIM_EMU_RAY_STATUS_FILE``); ``python -m ... ray status`` prints it in
Ray's autoscaler format. At TP=2 two live nodes and ``0.0/2.0 GPU`` when healthy and idle;
the placement group vLLM holds shows as ``2.0/2.0 GPU``; a dead worker leaves one node.
N ranks on N nodes (TP x PP) list every worker node whose rank is on the head's link.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

CPUS_PER_NODE = 20.0
GPUS_PER_NODE = 1.0
MEM_PER_NODE_GIB = 113.0
OBJECT_STORE_PER_NODE_GIB = 9.315
STALE_S = 5.0


def node_id(ip: str) -> str:
    return hashlib.sha224(f"sparksim-node-{ip}".encode()).hexdigest()


class StatusWriter:
    """Writes what ``ray status`` reads (:func:`render`) to ``path``: the engine's
    ``snapshot`` (nodes, placement group, bundles), stamped with the time."""

    def __init__(self, path: str, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.path = path
        self.snapshot = snapshot

    def write(self) -> None:
        data = json.dumps({"updated": time.time(), **self.snapshot()})
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".raystatus-")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(data)
            os.replace(tmp, self.path)
        except OSError:
            pass


def _gib(value: float) -> str:
    return f"{value:.2f}GiB"


def render(status: dict[str, Any], now: float | None = None) -> str:
    stamp = datetime.fromtimestamp(time.time() if now is None else now)
    nodes = status.get("nodes", [])
    stale = (time.time() if now is None else now) - float(status.get("updated", 0)) > STALE_S
    pg = "removed" if stale else status.get("placement_group", "none")
    n = len(nodes)
    total_gpu = GPUS_PER_NODE * n
    used_gpu = total_gpu if pg == "created" else 0.0
    lines = [
        f"======== Autoscaler status: {stamp.strftime('%Y-%m-%d %H:%M:%S.%f')} ========",
        "Node status",
        "---------------------------------------------------------------",
        "Active:",
    ]
    lines += [f" 1 node_{node_id(node['ip'])}" for node in nodes]
    lines += [
        "Pending:",
        " (no pending nodes)",
        "Recent failures:",
        " (no failures)",
        "",
        "Resources",
        "---------------------------------------------------------------",
        "Usage:",
        f" 0.0/{CPUS_PER_NODE * n:.1f} CPU",
    ]
    if pg == "created":
        lines.append(
            f" {used_gpu:.1f}/{total_gpu:.1f} GPU ({used_gpu:.1f} used of {used_gpu:.1f} "
            "reserved in placement groups)"
        )
    else:
        lines.append(f" 0.0/{total_gpu:.1f} GPU")
    lines += [
        f" 0B/{_gib(MEM_PER_NODE_GIB * n)} memory",
        f" 0B/{_gib(OBJECT_STORE_PER_NODE_GIB * n)} object_store_memory",
        "",
        "Demands:",
    ]
    if pg == "pending":
        bundles = status.get("bundles", [])
        shown = ", ".join(f"{b} * 1" for b in bundles)
        lines.append(f" {shown} (PACK): 1+ pending placement groups")
    else:
        lines.append(" (no resource demands)")
    return "\n".join(lines)


def ray_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="ray")
    sub = parser.add_subparsers(dest="command", required=True)
    st = sub.add_parser("status", help="cluster status")
    st.add_argument("--address", default=None)
    st.add_argument("--status-file", default=os.environ.get("SPARKSIM_EMU_RAY_STATUS_FILE", ""))
    args = parser.parse_args(argv)
    path = args.status_file
    try:
        with open(path, encoding="utf-8") as fh:
            status = json.load(fh)
    except (OSError, ValueError):
        print(
            "ConnectionError: Could not find any running Ray instance. Please specify the one to "
            "connect to by setting `--address` flag or `RAY_ADDRESS` environment variable.",
            file=sys.stderr,
        )
        return 1
    print(render(status))
    return 0
