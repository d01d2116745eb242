"""Stand the serving cluster up (or attach to it) once per session, even under xdist.

The first process to take the lock launches and waits; the others read the outcome from
the run directory. Teardown happens once, in the controller (``stop_if_launched``), also
after a failure or Ctrl-C, and only for what this session started."""

from __future__ import annotations

import json
import shlex
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from pytest_spark.cluster import Cluster
from pytest_spark.launch import Launcher, LaunchError, LaunchSpec
from pytest_spark.readiness import StartupFailed, parse_probe, probe_command, remote_now, wait_ready
from pytest_spark.remote.base import RemoteError
from pytest_spark.results import write_json
from pytest_spark.settings import Settings
from pytest_spark.startup import StartupWatch

STATE = "serving.json"
STOP_TIMEOUT_S = 120.0  # the launcher's stop (docker stop on every node through the head)


class NotServing(Exception):
    """The cluster is not (and will not become) ready; the message says what was found."""


@dataclass(frozen=True)
class ServingInfo:
    launched: bool
    ready_s: float | None
    timeline: list[dict[str, Any]]
    facts: dict[str, str]


def fabric_addresses(cluster: Cluster) -> tuple[str, ...]:
    """Each node's address on its primary fabric interface, as launch-cluster.sh wants them
    in -n (it checks that the local fabric IP is in that list)."""
    from pytest_spark.facts.links import primary_fabric_if
    from pytest_spark.linkstate import node_link_facts

    addresses = []
    for node in cluster.nodes:
        facts = node_link_facts(cluster, node)
        ifname = primary_fabric_if(facts)
        addrs = facts.ip_addrs.get(ifname or "", [])
        if not addrs:
            raise NotServing(
                f"{node.name}: no fabric interface with an IPv4 address (ibdev2netdev Up): "
                "cannot give launch-cluster.sh its -n list; set --spark-launch-nodes"
            )
        addresses.append(str(addrs[0].ip))
    return tuple(addresses)


def launch_spec(settings: Settings, cluster: Cluster) -> LaunchSpec:
    if not settings.serve_args:
        raise NotServing(
            "--spark-launch needs --spark-serve-args='vllm serve MODEL ...' (the "
            "command the launcher runs in the head container)"
        )
    nodes = settings.launch_nodes or fabric_addresses(cluster)
    return LaunchSpec(
        settings.launch_script,
        tuple(nodes),
        settings.image,
        settings.container,
        tuple(shlex.split(settings.serve_args)),
        settings.nccl_debug,
        log_path=f"/tmp/pytest-spark-launch-{uuid.uuid4().hex[:12]}.log",
    )


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data


def ensure_serving(
    cluster: Cluster,
    settings: Settings,
    run_dir: Path,
    progress: Callable[[StartupWatch, float], None] | None = None,
    notify: Callable[[str], None] | None = None,
) -> ServingInfo:
    state_path = run_dir / STATE
    with FileLock(str(run_dir / "serving.lock")):
        state = _read(state_path)
        if state is not None and state.get("status") != "launching":
            if state["status"] == "failed":
                raise NotServing(state["message"])
            return ServingInfo(
                state["launched"], state.get("ready_s"), state["timeline"], state["facts"]
            )
        if cluster.unreachable(cluster.head) is not None:
            raise NotServing(f"head unreachable: {cluster.head._error}")
        profile = settings.profile
        launcher: Launcher | None = None
        doc: dict[str, Any] = {
            "status": "launching",
            "launched": False,
            "timeline": [],
            "facts": {},
        }
        t0 = time.monotonic()
        try:
            since = remote_now(cluster.head)
            if settings.launch:
                launcher = Launcher(cluster.head, launch_spec(settings, cluster))
                doc.update(
                    launched=True,
                    launch_pid=launcher.start(),
                    stop_command=launcher.spec.stop_command(),
                    launch_log=launcher.spec.log_path,
                )
                write_json(state_path, doc)
            else:
                attach_precheck(cluster, settings)
            watch = wait_ready(
                cluster,
                container=settings.container,
                port=settings.port,
                ready_timeout=settings.ready_timeout,
                hang_timeout=settings.hang_timeout,
                placement_timeout=float(profile.get("readiness.placement_group_timeout_s", 120)),
                since=since if settings.launch else _attach_since(since),
                launcher_pid=launcher.pid if launcher else None,
                launcher_log=launcher.launcher_log if launcher else None,
                launcher_log_path=launcher.spec.log_path if launcher else None,
                progress=progress,
                notify=notify,
            )
        except StartupFailed as exc:
            doc.update(
                status="failed",
                message=str(exc),
                timeline=exc.watch.timeline(),
                facts=exc.watch.facts,
            )
            write_json(state_path, doc)
            raise NotServing(str(exc)) from None
        except (LaunchError, NotServing, RemoteError) as exc:
            doc.update(status="failed", message=str(exc))
            write_json(state_path, doc)
            raise NotServing(str(exc)) from None
        doc.update(
            status="ready",
            ready_s=round(time.monotonic() - t0, 3),
            timeline=watch.timeline(),
            facts=watch.facts,
        )
        write_json(state_path, doc)
        return ServingInfo(doc["launched"], doc["ready_s"], doc["timeline"], doc["facts"])


def _attach_since(now: str) -> str:
    """Attach mode reads the recent past too, so a load in progress shows its phase."""
    return "10m"


def attach_precheck(cluster: Cluster, settings: Settings) -> None:
    """Attach mode: report what is there instead of waiting on nothing."""
    cmd = probe_command(settings.container, "1s", settings.port, None)
    head = parse_probe(cluster.head.run(cmd, timeout=15))
    if head.health == "200":
        return
    states = {cluster.head.name: head.status}
    reachable = [node for node in cluster.workers if cluster.unreachable(node) is None]
    command = probe_command(settings.container, "1s", None, None)
    # All workers at once (a serial loop grew with the node count); the first worker's
    # error, in worker order, is raised as the loop raised it.
    results = cluster.map(lambda node: node.run(command, timeout=15), reachable)
    for node in reachable:
        result = results[node.name]
        if isinstance(result, RemoteError):
            raise result
        states[node.name] = parse_probe(result, with_health=False).status
    if all(status == "missing" or status.startswith("unknown") for status in states.values()):
        found = ", ".join(f"{n}: {s}" for n, s in states.items())
        raise NotServing(
            f"attach mode: the cluster is not serving. API /health on {cluster.head.name} port "
            f"{settings.port}: {_health_text(head.health)}; container {settings.container!r}: "
            f"{found}. Start it (launch-cluster.sh, or run with --spark-launch), or point "
            "--spark-container / --spark-port at what is running"
        )


def _health_text(code: str | None) -> str:
    return {"000": "connection refused or timed out", None: "not probed"}.get(code, f"HTTP {code}")


def stop_if_launched(cluster: Cluster, run_dir: Path, keep: bool) -> str | None:
    """Controller teardown: stop what this session launched (and nothing else)."""
    state = _read(run_dir / STATE)
    if not state or not state.get("launched") or state.get("stopped") or keep:
        return None
    try:
        cluster.connect()
        result = cluster.head.run(state["stop_command"], timeout=STOP_TIMEOUT_S)
        cleanup = []
        if state.get("launch_pid"):
            cleanup.append(f"kill {int(state['launch_pid'])} 2>/dev/null")
        if state.get("launch_log"):  # the launcher's output, kept only while it serves
            cleanup.append(f"rm -f {shlex.quote(state['launch_log'])}")
        if cleanup:
            cluster.head.run("; ".join([*cleanup, "true"]), timeout=10)
    except RemoteError as exc:
        return f"could not stop the cluster: {exc}"
    state["stopped"] = True
    write_json(run_dir / STATE, state)
    return None if result.ok else f"launcher stop exited {result.rc}: {result.stderr[-500:]}"
