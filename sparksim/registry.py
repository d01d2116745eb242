"""Which instance index belongs to which state dir, machine-wide.

``/run/sparksim/instances/<k>.json`` records the owner of instance ``k``; claims happen
under ``/run/sparksim/instances.lock`` so two ``up`` commands never pick the same ``k``.
A claim is stale (and reusable) when its claimer is gone and no namespace or link of
instance ``k`` exists.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .netns import SimError, link_names, list_netns, pid_alive
from .topology import LINK_RE, MAX_INSTANCES, NETNS_RE

RUN_DIR = Path("/run/sparksim")
INSTANCES = RUN_DIR / "instances"
LOCK = RUN_DIR / "instances.lock"


@contextmanager
def flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def entries() -> dict[int, dict[str, object]]:
    found: dict[int, dict[str, object]] = {}
    if not INSTANCES.is_dir():
        return found
    for path in INSTANCES.glob("*.json"):
        try:
            k = int(path.stem)
            found[k] = json.loads(path.read_text())
        except (ValueError, OSError, json.JSONDecodeError):
            continue
    return found


def owner(k: int) -> str | None:
    entry = entries().get(k)
    return str(entry["state_dir"]) if entry else None


def instances_in_kernel() -> set[int]:
    """Instance indexes that still have a namespace or a root-namespace link."""
    ks = set()
    for ns in list_netns():
        m = NETNS_RE.match(ns)
        if m:
            ks.add(int(m.group(1)))
    for name in link_names():
        m = LINK_RE.match(name)
        if m:
            ks.add(int(m.group(1)))
    return ks


def claim(state_dir: Path, nodes: int) -> int:
    with flock(LOCK):
        taken = instances_in_kernel()
        current = entries()
        for k in range(MAX_INSTANCES):
            entry = current.get(k)
            if k in taken:
                continue
            if entry and entry.get("state_dir") != str(state_dir):
                claimer = entry.get("pid")
                if isinstance(claimer, int) and pid_alive(claimer):
                    continue  # another `up` is building it right now
            INSTANCES.mkdir(parents=True, exist_ok=True)
            record = {
                "instance": k,
                "state_dir": str(state_dir),
                "nodes": nodes,
                "pid": os.getpid(),
                "claimed": time.time(),
            }
            (INSTANCES / f"{k}.json").write_text(json.dumps(record) + "\n")
            return k
    raise SimError(
        f"all {MAX_INSTANCES} sparksim instances are in use; "
        "run `spark-sim down --all` to remove them"
    )


def release(k: int) -> None:
    (INSTANCES / f"{k}.json").unlink(missing_ok=True)
