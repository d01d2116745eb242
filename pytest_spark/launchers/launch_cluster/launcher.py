"""The ``launch-cluster`` plug-in (``launchers.base``'s interface): launch-cluster.sh on the
head, backgrounded there, its containers one name on every node; stopped with the script's
own ``stop``, the launcher signalled and waited for, and no container of the name left."""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_spark.access.cluster import Cluster
from pytest_spark.access.layout import ServingLayout, launcher_layout
from pytest_spark.launchers.base import LauncherLog, Notify, NotServing, Record, StoodUp
from pytest_spark.launchers.containers import LEFTOVER_WAIT_S, wait_gone
from pytest_spark.launchers.launch_cluster.commands import HEAD_EXIT_SENTINEL, LAUNCHER_EXIT_WAIT_S
from pytest_spark.launchers.launch_cluster.driver import (
    Launcher,
    apply_dotenv,
    launch_spec,
    ray_only_script,
)
from pytest_spark.settings.resolve import Settings

STOP_TIMEOUT_S = 120.0  # the launcher's stop (docker stop on every node through the head)


def refuse_running(
    cluster: Cluster,
    container: str,
    wait_s: float = LEFTOVER_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.monotonic,
) -> None:
    """--spark-launch on a cluster that already runs containers of that name: the launcher
    would skip the launch and exec into them, an old server would answer /health, and
    teardown would stop what this session did not start. A stopped one of that name (an
    earlier run's, still being removed, or kept) would make the launcher's unchecked
    ``docker run --name`` fail, and its ``docker exec`` would reach a dying container."""
    left = wait_gone(cluster, container, wait_s, sleep, now)
    running = [name for name, state in left.items() if state == "running"]
    if running:
        raise NotServing(
            f"--spark-launch: container {container!r} is already running on "
            f"{', '.join(running)}. launch-cluster.sh would skip the launch and exec into it "
            "(an old server would answer /health). Attach to it instead (run without "
            f"--spark-launch), or stop it first (launch-cluster.sh --name {container} stop)"
        )
    if left:
        found = ", ".join(f"{name} ({state})" for name, state in left.items())
        raise NotServing(
            f"--spark-launch: a stopped container {container!r} is still there on {found} "
            f"after {wait_s:.0f} s: launch-cluster.sh's `docker run --name {container}` "
            "would fail on the name and its `docker exec` would reach no server. Remove it "
            f"on that node (docker rm -f {container}) and run again"
        )


class LaunchClusterSh:
    """The ``launch-cluster`` launcher plug-in (``launchers.base``): eugr's launch-cluster.sh
    on the head, backgrounded there, its containers one name on every node; stopped with
    the script's own ``stop``."""

    name = "launch-cluster"

    def __init__(
        self,
        cluster: Cluster,
        settings: Settings,
        run_dir: Path,
        mode: str | None = None,
        mode_source: str = "",
    ) -> None:
        self.cluster = cluster
        self.settings = settings
        self.mode = mode
        self.mode_source = mode_source
        self.container = settings.container  # the .env's CONTAINER_NAME may win
        self.log: LauncherLog | None = None

    def describe(self) -> str:
        return f"{self.settings.launch_script} on {self.cluster.head.name}"

    def stand_up(self, record: Record, notify: Notify | None = None) -> StoodUp:
        cluster, settings = self.cluster, self.settings
        launcher = Launcher(cluster.head, launch_spec(settings, cluster, self.mode == "ray"))
        launcher.preflight()
        mode, mode_source = ray_only_script(launcher, settings, self.mode, self.mode_source)
        launcher = apply_dotenv(cluster, settings, launcher)
        container = self.container = launcher.spec.container
        if notify is not None and container != settings.container:
            notify(f"the launcher's .env names the container {container!r}: watching it")
        refuse_running(cluster, container)
        pid = launcher.start()
        record({
            "container": container,
            "launch_pid": pid,
            "signal_launcher": launcher.spec.signal_command(pid),
            "wait_launcher": launcher.spec.wait_command(pid),
            "stop_command": launcher.spec.stop_command(),
            "launch_log": launcher.spec.log_path,
        })  # fmt: skip
        # In Ray mode the head's vLLM output is the launcher's stdout. Without Ray the head
        # writes to its container log, which the launcher only echoes (since 2026-09-15;
        # before, it too was on the launcher's stdout): the launcher's log is read until
        # the head's container log shows vLLM output.
        self.log = LauncherLog(
            pid,
            launcher.launcher_log,
            launcher.spec.log_path,
            until_container_log=mode != "ray",
            exit_file=HEAD_EXIT_SENTINEL,
        )
        return StoodUp(mode=mode, mode_source=mode_source)

    def watch(self) -> ServingLayout:
        """One container name on every node, vLLM's output in docker logs."""
        return launcher_layout(self.container)

    def serve_log(self) -> LauncherLog | None:
        return self.log

    @staticmethod
    def tear_down(
        cluster: Cluster,
        state: Mapping[str, Any],
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], float] = time.monotonic,
    ) -> str | None:
        return stop_launch_cluster(cluster, state, sleep, now)


def stop_launch_cluster(
    cluster: Cluster,
    state: Mapping[str, Any],
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.monotonic,
) -> str | None:
    """launch-cluster.sh's teardown (may raise RemoteError)."""
    # The launcher is signalled, the containers stopped, then the launcher waited for:
    # its own cleanup (a trap on TERM, run once its foreground command returns) stops
    # the containers by name, and must be over before anyone launches again.
    if state.get("signal_launcher"):
        cluster.head.run(state["signal_launcher"], timeout=15)
    result = cluster.head.run(state["stop_command"], timeout=STOP_TIMEOUT_S)
    if state.get("wait_launcher"):
        cluster.head.run(state["wait_launcher"], timeout=LAUNCHER_EXIT_WAIT_S + 15)
    if state.get("launch_log"):  # the launcher's output, kept only while it serves
        cluster.head.run(f"rm -f {shlex.quote(state['launch_log'])}; true", timeout=10)
    # `docker stop` returns before dockerd has removed a --rm container: wait, so that
    # the next launch (this suite's or an operator's) finds the name free.
    container = state.get("container")
    left = wait_gone(cluster, container, sleep=sleep, now=now) if container else {}
    if container and "running" in left.values():
        # Started after the stop: the TERM reached the launcher's group while it was
        # still starting the cluster (an interrupt during readiness), and a `docker
        # run` it had sent went through after ours stopped the rest. The launcher is
        # gone now (waited for above): one more stop catches what it left.
        result = cluster.head.run(state["stop_command"], timeout=STOP_TIMEOUT_S)
        left = wait_gone(cluster, container, sleep=sleep, now=now)
    if not result.ok:
        return f"launcher stop exited {result.rc}: {result.stderr[-500:]}"
    if left:
        found = ", ".join(f"{name} ({status})" for name, status in left.items())
        return (
            f"after launch-cluster.sh stop, container {state['container']!r} is still there "
            f"on {found} after {LEFTOVER_WAIT_S:.0f} s; remove it (docker rm -f "
            f"{state['container']}) before the next launch"
        )
    return None
