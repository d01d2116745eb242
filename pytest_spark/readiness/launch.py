"""Launch the serving cluster (or attach to it), once per session, even under xdist; and
stop what this session started.

The launcher is a plug-in (``pytest_spark.launchers``: ``--spark-launcher`` picks it from
the registry) called only through its interface: stand up, what to watch, its own log,
tear down. The session: the first process to take the lock launches (or attaches) and
waits (``wait.wait_ready``); the others read the outcome from the run directory. Teardown
happens once, in the controller (``stop_if_launched``), also after a failure or Ctrl-C,
and only for what this session started. Which nodes serve a rank: ``ranks``."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.access.files import write_json
from pytest_spark.access.layout import LayoutError, ServingLayout
from pytest_spark.infra.serveargs import mode_of_processes, parse_serve_args
from pytest_spark.launchers import registry
from pytest_spark.launchers.base import LauncherLog, LaunchError, NotServing
from pytest_spark.readiness.attach import attach_precheck
from pytest_spark.readiness.probe import SINCE_START
from pytest_spark.readiness.ranks import ServingInfo, head_serve_line, kept_nodes
from pytest_spark.readiness.wait import wait_ready
from pytest_spark.readiness.waitstate import StartupFailed, WaitSpec
from pytest_spark.readiness.watch import StartupWatch
from pytest_spark.settings.resolve import Settings

STATE = "serving.json"


def configured_mode(settings: Settings) -> tuple[str | None, str]:
    """Ray or no-Ray as the settings and the serve args say, and how that is known."""
    if settings.ray != "auto":
        return ("ray" if settings.ray == "on" else "no-ray"), settings.source("ray")
    if settings.serve_args:
        mode = parse_serve_args(settings.serve_args).mode
        if mode is not None:
            return mode, "the serve args"
    if settings.launch:
        return "no-ray", "launch-cluster.sh's default (no --ray)"
    return None, ""


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data


def _info(doc: Mapping[str, Any]) -> ServingInfo:
    """serving.json's outcome as the fixtures hand it on."""
    return ServingInfo(
        doc["launched"],
        doc.get("ready_s"),
        doc["timeline"],
        doc["facts"],
        doc.get("mode"),
        doc.get("mode_source", ""),
        tuple(doc.get("nodes", ())),
        tuple(doc.get("idle_nodes", ())),
        doc.get("idle_because", ""),
    )


@dataclass(frozen=True)
class Target:
    """What the readiness wait watches, launched or attached: the containers, the mode,
    the launcher's own log (launched, when it keeps one), the file holding the head's vLLM
    output (the launcher's log, or --spark-serve-log attached), whether the head's output
    is visible at all, and the head's ``vllm serve`` line (attached)."""

    layout: ServingLayout
    mode: str | None
    mode_source: str
    log: LauncherLog | None = None
    log_path: str | None = None
    head_log_visible: bool = True
    attached_line: str | None = None


def ensure_serving(
    cluster: Cluster,
    settings: Settings,
    run_dir: Path,
    progress: Callable[[StartupWatch, float], None] | None = None,
    notify: Callable[[str], None] | None = None,
) -> ServingInfo:
    """Launch or attach and wait until serving, once per session (serving.json under
    serving.lock: a later process reads the outcome); raise NotServing with the verdict."""
    state_path = run_dir / STATE
    with FileLock(str(run_dir / "serving.lock")):
        state = _read(state_path)
        if state is not None and state.get("status") != "launching":
            if state.get("layout"):  # the containers the session's serving process watched
                cluster.layout = ServingLayout.from_json(state["layout"])
            if state["status"] == "failed":
                raise NotServing(state["message"])
            return _info(state)
        if cluster.unreachable(cluster.head) is not None:
            raise NotServing(f"head unreachable: {cluster.head._error}")
        doc: dict[str, Any] = {
            "status": "launching",
            "launched": False,
            "timeline": [],
            "facts": {},
        }
        t0 = time.monotonic()
        try:
            target = _target(cluster, settings, run_dir, doc, notify)
            kept = _kept(cluster, settings, target, doc, notify)
            watch = wait_ready(
                cluster, wait_spec(settings, target, kept), progress=progress, notify=notify
            )
        except StartupFailed as exc:
            failed = {"timeline": exc.watch.timeline(), "facts": exc.watch.facts}
            _failed(state_path, doc, t0, str(exc), failed)
            raise NotServing(str(exc)) from None
        except (LaunchError, NotServing, RemoteError, LayoutError) as exc:
            _failed(state_path, doc, t0, str(exc), {})
            raise NotServing(str(exc)) from None
        ready_s = round(time.monotonic() - t0, 3)
        doc.update(status="ready", ready_s=ready_s, timeline=watch.timeline(), facts=watch.facts)
        write_json(state_path, doc)
        return _info(doc)


def _failed(
    path: Path, doc: dict[str, Any], t0: float, message: str, watched: Mapping[str, Any]
) -> None:
    doc.update(status="failed", failed_s=round(time.monotonic() - t0, 3), message=message)
    doc.update(watched)
    write_json(path, doc)


def _target(
    cluster: Cluster,
    settings: Settings,
    run_dir: Path,
    doc: dict[str, Any],
    notify: Callable[[str], None] | None,
) -> Target:
    """Launch (the launcher's plug-in stands the cluster up) or attach (what runs is
    checked first); either way, what the wait then watches."""
    mode, mode_source = configured_mode(settings)
    if not settings.launch:
        return _attach(cluster, settings, mode, mode_source, notify)
    plugin = registry.make_launcher(cluster, settings, run_dir, mode, mode_source)

    def record(entries: Mapping[str, Any]) -> None:
        doc.update(entries, launched=True)
        write_json(run_dir / STATE, doc)

    stood = plugin.stand_up(record, notify)
    layout = cluster.layout = plugin.watch()
    log = plugin.serve_log()
    return Target(
        layout,
        stood.mode or mode,
        stood.mode_source or mode_source,
        log=log,
        log_path=log.path if log else None,
    )


def _attach(
    cluster: Cluster,
    settings: Settings,
    mode: str | None,
    mode_source: str,
    notify: Callable[[str], None] | None,
) -> Target:
    layout = cluster.layout
    head = attach_precheck(cluster, settings)
    if notify is not None and layout.job is not None:
        notify(f"attached to {layout.describe()}")
    if mode is None and head.processes:
        mode = mode_of_processes(head.processes)
        mode_source = "the head container's processes" if mode else ""
    log_path = settings.serve_log
    visible = not (log_path is None and mode != "no-ray" and layout.serve_log is None)
    if not visible and notify is not None:
        notify(
            f"{cluster.head.name}'s vLLM output is not visible: in Ray mode "
            "launch-cluster.sh prints it to its own stdout (the operator's "
            "log), not to docker logs; give --spark-serve-log=PATH to follow "
            "it. Waiting on /health and the workers' logs"
        )
    return Target(
        layout,
        mode,
        mode_source,
        log_path=log_path,
        head_log_visible=visible,
        attached_line=head_serve_line(head.processes or []),
    )


def _kept(
    cluster: Cluster,
    settings: Settings,
    target: Target,
    doc: dict[str, Any],
    notify: Callable[[str], None] | None,
) -> list[Node]:
    """The nodes that serve a rank (the rest idle by design), into serving.json."""
    kept, idle_because = kept_nodes(cluster, settings, target.attached_line)
    doc.update(mode=target.mode, mode_source=target.mode_source, nodes=[n.name for n in kept])
    doc.update(layout=target.layout.to_json())
    idle = [n.name for n in cluster.nodes if n not in kept]
    if idle:
        doc.update(idle_nodes=idle, idle_because=idle_because)
        if notify is not None:
            notify(f"{', '.join(idle)}: idle by design ({idle_because})")
    return kept


def wait_spec(settings: Settings, target: Target, kept: list[Node]) -> WaitSpec:
    """What the readiness wait watches (``target``, the ``kept`` nodes) and its limits."""
    layout, log = target.layout, target.log
    return WaitSpec(
        container=layout.default,
        containers=dict(layout.containers),
        serve_log=layout.serve_log,
        port=settings.port,
        ready_timeout=settings.ready_timeout,
        hang_timeout=settings.hang_timeout,
        placement_timeout=settings.profile.readiness.placement_group_timeout_s,
        since=SINCE_START,
        nodes=tuple(kept),
        head_log_visible=target.head_log_visible,
        launcher_pid=log.pid if log else None,
        launcher_log=log.read if log else None,
        launcher_log_path=target.log_path,
        launcher_log_fallback=bool(log and log.until_container_log),
        launcher_exit_file=log.exit_file if log else None,
    )


def stop_if_launched(
    cluster: Cluster,
    run_dir: Path,
    keep: bool,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.monotonic,
) -> str | None:
    """Controller teardown: stop what this session launched (and nothing else), with the
    launcher that started it (serving.json's ``launcher``)."""
    state = _read(run_dir / STATE)
    if not state or not state.get("launched") or state.get("stopped") or keep:
        return None
    try:
        cluster.connect()
        problem = registry.tear_down(cluster, state, sleep, now)
    except RemoteError as exc:
        return f"could not stop the cluster: {exc}"
    state["stopped"] = True
    write_json(run_dir / STATE, state)
    return problem
