"""Parsers of the outputs the preflight probe gathers: ``nvidia-smi -L`` and
``--query-compute-apps``, ``ps``, ``df -P -k``, ``find -printf``, ``sha256sum``,
``docker inspect``. Pure functions over text; GPU memory columns are never read (a GB10
reports ``[N/A]``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pytest_spark.infra.errors import ParseError

__all__ = [
    "ContainerInfo",
    "DiskUsage",
    "parse_compute_apps",
    "parse_container_env",
    "parse_df",
    "parse_docker_inspect",
    "parse_find_sizes",
    "parse_gpu_list",
    "parse_pids",
    "parse_ps",
]


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    image: str
    image_id: str
    running: bool
    started_at: float | None  # epoch seconds
    restart_policy: str
    gpu_access: bool
    env: dict[str, str] = field(default_factory=dict)
    pids: frozenset[int] = frozenset()

    def uptime_s(self, now: float | None) -> float | None:
        if now is None or self.started_at is None:
            return None
        return max(0.0, now - self.started_at)


@dataclass(frozen=True)
class DiskUsage:
    path: str  # what was asked for (the model directory or /)
    checked: str  # the existing path df ran on
    filesystem: str
    size_kib: int
    used_kib: int
    avail_kib: int
    mount: str

    @property
    def used_pct(self) -> float:
        """Used share as df computes it: used / (used + available)."""
        total = self.used_kib + self.avail_kib
        return 100.0 * self.used_kib / total if total else 100.0

    @property
    def avail_bytes(self) -> int:
        return self.avail_kib * 1024


def parse_gpu_list(text: str) -> list[str]:
    """``nvidia-smi -L``: one ``GPU n: NAME (UUID: ...)`` line per GPU."""
    return [ln.strip() for ln in text.splitlines() if re.match(r"^\s*GPU \d+:", ln)]


def parse_compute_apps(text: str) -> list[tuple[int, str]]:
    """``--query-compute-apps=pid,process_name,used_memory --format=csv,noheader``:
    (pid, process name) per line; the memory column is never read."""
    apps = []
    for line in text.splitlines():
        if not line.strip():
            continue
        pid, _, rest = line.partition(",")
        if not pid.strip().isdigit():
            raise ParseError("nvidia-smi --query-compute-apps", "no PID column", line)
        name = rest.rsplit(",", 1)[0].strip() if rest.count(",") >= 1 else rest.strip()
        apps.append((int(pid.strip()), name))
    return apps


def parse_ps(text: str) -> dict[int, tuple[int | None, str]]:
    """``ps -o pid=,etimes=,args=``: pid -> (elapsed seconds, command line)."""
    out: dict[int, tuple[int | None, str]] = {}
    for line in text.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2 and parts[0].isdigit():
            etime = int(parts[1]) if parts[1].isdigit() else None
            out[int(parts[0])] = (etime, parts[2] if len(parts) > 2 else "")
    return out


def parse_df(text: str, path: str) -> DiskUsage:
    """``echo PATH; df -P -k PATH`` output."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 3 or not lines[1].startswith("Filesystem"):
        raise ParseError("df -P -k", "expected a path, a header and one row", text[:200])
    parts = lines[2].split()
    if len(parts) < 6 or not all(p.isdigit() for p in parts[1:4]):
        raise ParseError("df -P -k", "unexpected row", lines[2])
    return DiskUsage(
        path,
        lines[0].strip(),
        parts[0],
        int(parts[1]),
        int(parts[2]),
        int(parts[3]),
        " ".join(parts[5:]),
    )


def parse_find_sizes(text: str) -> dict[str, int]:
    files: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, size = line.rpartition("\t")
        if sep and size.strip().isdigit() and name:
            files[name] = int(size)
    return files


def _epoch(stamp: str | None) -> float | None:
    """Docker's RFC 3339 time with nanoseconds (``2026-11-29T17:56:29.880797233Z``)."""
    if not stamp or stamp.startswith("0001-"):
        return None
    m = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", stamp)
    if not m:
        return None
    frac = (m[2] or ".0")[:7]
    zone = "+00:00" if m[3] == "Z" else m[3]
    try:
        return datetime.fromisoformat(f"{m[1]}{frac}{zone}").timestamp()
    except ValueError:
        return None


def _gpu_access(doc: dict[str, Any], env: dict[str, str]) -> bool:
    host = doc.get("HostConfig") or {}
    for req in host.get("DeviceRequests") or ():
        caps = [c for group in (req.get("Capabilities") or ()) for c in group]
        if "gpu" in caps or req.get("Driver") == "nvidia":
            return True
    visible = env.get("NVIDIA_VISIBLE_DEVICES", "")
    return host.get("Runtime") == "nvidia" and visible not in ("", "void", "none")


def _container(doc: dict[str, Any], pids: frozenset[int] = frozenset()) -> ContainerInfo:
    config = doc.get("Config") or {}
    state = doc.get("State") or {}
    env = {k: v for k, _, v in (str(i).partition("=") for i in (config.get("Env") or ()))}
    return ContainerInfo(
        id=str(doc.get("Id", "")),
        name=str(doc.get("Name", "")).lstrip("/"),
        image=str(config.get("Image", "")),
        image_id=str(doc.get("Image", "")),
        running=bool(state.get("Running")),
        started_at=_epoch(state.get("StartedAt")),
        restart_policy=str(
            ((doc.get("HostConfig") or {}).get("RestartPolicy") or {}).get("Name") or "no"
        ),
        gpu_access=_gpu_access(doc, env),
        env=env,
        pids=pids,
    )


def parse_docker_inspect(text: str) -> list[ContainerInfo]:
    """``docker inspect --type container ...`` (a JSON list)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError("docker inspect", f"not JSON ({exc.msg})", text[:200]) from None
    if not isinstance(data, list):
        raise ParseError("docker inspect", "expected a JSON list", text[:200])
    return [_container(d) for d in data if isinstance(d, dict)]


def parse_container_env(text: str) -> dict[str, str]:
    """``docker inspect -f '{{json .Config.Env}}' NAME``."""
    try:
        items = json.loads(text.strip() or "null")
    except json.JSONDecodeError as exc:
        raise ParseError(
            "docker inspect .Config.Env", f"not JSON ({exc.msg})", text[:200]
        ) from None
    if not isinstance(items, list):
        raise ParseError("docker inspect .Config.Env", "expected a JSON list", text[:200])
    pairs = (i.partition("=") for i in items if isinstance(i, str))
    return {k: v for k, _, v in pairs}


def parse_pids(text: str) -> frozenset[int]:
    """``docker top ID -eo pid``: the PIDs under the ``PID`` header."""
    return frozenset(int(t) for t in text.split() if t.isdigit())
