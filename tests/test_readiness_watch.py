"""The readiness watch (readiness.wait_ready) against a scripted two-node cluster.

Each fake node answers the real ``probe_command`` with the text the shell would print
(``SEP name`` sections, ``docker inspect``/``docker logs``/``curl``/``ps`` output), one
scripted state per probe; a connection loss is a scripted ``NodeUnreachable``. Time is
virtual: ``wait_ready``'s clock and its sleep between polls advance a fake clock, so a
minute of watching takes milliseconds."""

from __future__ import annotations

import itertools
import re
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_spark import readiness
from pytest_spark.cluster import Cluster, Node
from pytest_spark.readiness import SEP, StartupFailed, wait_ready
from pytest_spark.remote.base import CommandResult, NodeUnreachable
from pytest_spark.remote.retry import for_connection
from pytest_spark.startup import StartupWatch

CONTAINER = "vllm_node"
PORT = 8000
PID = 4242
SINCE = "2026-11-29T20:00:00.000000000Z"
HEAD, WORKER = "spark-head", "spark-worker-1"
# docker's answers for a container that does not exist (inspect, then logs).
NO_OBJECT = f"Error: No such object: {CONTAINER}"
NO_CONTAINER = f"Error response from daemon: No such container: {CONTAINER}"
INSPECT = f"docker inspect -f '{{{{.State.Status}}}} {{{{.State.ExitCode}}}}' {CONTAINER}"
OOM = (
    "(EngineCore_DP0 pid=312) ERROR 11-29 20:00:05 [core.py:866] torch.OutOfMemoryError: "
    "CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of "
    "119.70 GiB of which 612.00 MiB is free."
)
LOADING = (
    "(RayWorkerWrapper pid=455, ip=192.168.200.13) INFO 11-29 20:00:15 "
    "[gpu_model_runner.py:2602] Starting to load model /models/Qwen3.5-122B-A10B-FP8..."
)


@dataclass(frozen=True)
class State:
    """What one probe finds on a node: ``docker inspect`` status and exit code, the
    head's ``/health`` code (``000``: refused), new log lines, the launcher's liveness."""

    status: str = "running"
    code: int = 0
    health: str = "000"
    logs: tuple[str, ...] = ()
    alive: bool = True


MISSING = State(status="missing")
Answer = State | NodeUnreachable


class Clock:
    """Virtual monotonic time; ``sleep`` advances it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps = 0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        assert self.sleeps < 10_000, "wait_ready never returned"
        self.now += seconds


class FakeTarget:
    def describe(self) -> str:
        return "admin@10.0.0.2"


class FakeConn:
    """Answers each probe with the next scripted state (the last one repeats)."""

    def __init__(self, name: str, script: Sequence[Answer], stamps: Iterator[int]) -> None:
        self.name, self.script, self.stamps = name, script, stamps
        self.commands: list[str] = []
        self.log: list[str] = []  # "<timestamp> <line>", as `docker logs --timestamps`
        self.closed = 0
        self.target = FakeTarget()

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        assert timeout == readiness.PROBE_TIMEOUT_S
        self.commands.append(command)
        answer = self.script[min(len(self.commands), len(self.script)) - 1]
        if isinstance(answer, NodeUnreachable):
            raise answer
        for line in answer.logs:
            i = next(self.stamps)  # itertools.count: safe from cluster.map's threads
            self.log.append(f"2026-11-29T20:{i // 60:02d}:{i % 60:02d}.000000000Z {line}")
        return CommandResult(self.name, command, 0, self.shell_output(command, answer), "")

    def shell_output(self, command: str, state: State) -> str:
        """What the probe's shell prints: one ``SEP name`` section per part it asks for."""
        assert INSPECT in command
        out = ""
        if f"echo {SEP} health" in command:
            assert f"http://127.0.0.1:{PORT}/health" in command
            out += f"{SEP} health\n{state.health}\n"  # curl -w '%{http_code}'; echo
        missing = state.status == "missing"
        out += f"{SEP} state\n{NO_OBJECT if missing else f'{state.status} {state.code}'}\n"
        since_arg = re.search(r"--since (\S+) ", command)
        assert since_arg is not None, command
        since = shlex.split(since_arg.group(1))[0]
        # docker logs --since is inclusive: the line at the cursor comes back again.
        lines = [NO_CONTAINER] if missing else [x for x in self.log if x.split()[0] >= since]
        out += f"{SEP} logs\n" + "".join(f"{line}\n" for line in lines)
        if f"echo {SEP} alive" in command:
            assert f"ps -o stat= -p {PID}" in command
            out += f"{SEP} alive\n{'alive' if state.alive else 'dead'}\n"
        return out

    def close(self) -> None:
        self.closed += 1


class FakeCluster(Cluster):
    """The real Cluster's map/node/head over fake connections (nothing to connect)."""

    def __init__(self, head: Sequence[Answer], worker: Sequence[Answer]) -> None:
        stamps = itertools.count(1)  # log timestamps, in seconds after SINCE
        self.nodes = [
            Node(name, role, name, FakeConn(name, script, stamps))  # type: ignore[arg-type]
            for name, role, script in ((HEAD, "head", head), (WORKER, "worker", worker))
        ]
        self._connected = True

    def conn(self, name: str) -> FakeConn:
        conn = self.node(name).conn
        assert isinstance(conn, FakeConn)
        return conn


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(readiness, "time", SimpleNamespace(sleep=clock.sleep, monotonic=clock))
    return clock


def watch(cluster: FakeCluster, clock: Clock, **kwargs: Any) -> StartupWatch:
    options: dict[str, Any] = {
        "container": CONTAINER,
        "port": PORT,
        "ready_timeout": 600.0,
        "hang_timeout": 300.0,
        "placement_timeout": 120.0,
        "since": SINCE,
        "launcher_pid": PID,
        "clock": clock,
        "retry": for_connection(1.0, 1.0),  # retries after 1, 1, 1 s
    }
    return wait_ready(cluster, **{**options, **kwargs})


def fails(cluster: FakeCluster, clock: Clock, **kwargs: Any) -> StartupFailed:
    with pytest.raises(StartupFailed) as info:
        watch(cluster, clock, **kwargs)
    return info.value


def rounds(clock: Clock, start: float = 1000.0) -> float:
    """Polls made so far (one sleep of POLL_S between two polls)."""
    return (clock.now - start) / readiness.POLL_S


# -- launching: nodes start one after another ---------------------------------------------
def test_launch_a_worker_not_started_yet_is_not_a_dead_tp_rank(clock: Clock) -> None:
    head = [State(health="503")] * 4 + [State(health="200")]
    cluster = FakeCluster(head, [MISSING] * 4 + [State(logs=(LOADING,))])
    done = watch(cluster, clock)
    assert done.ready and done.failure is None
    assert rounds(clock) == 4  # ready on the 5th poll, not before
    head_cmd, worker_cmd = cluster.conn(HEAD).commands[0], cluster.conn(WORKER).commands[0]
    assert "/health" in head_cmd and f"-p {PID}" in head_cmd
    assert "/health" not in worker_cmd and "ps -o stat=" not in worker_cmd
    assert list(done.tails[WORKER]) == [LOADING]  # docker's "No such container" is no log line
    assert done.phase == "ready"


def test_launch_a_worker_never_started_fails_once_the_launcher_is_dead(clock: Clock) -> None:
    head = [State(health="503")] * 3 + [State(health="503", alive=False)]
    failed = fails(FakeCluster(head, [MISSING]), clock, launcher_log=lambda: "ssh: worker down\n")
    assert failed.failure.kind == "exited" and failed.failure.node == WORKER
    message = str(failed)
    assert message.startswith(f"serving container exited on {WORKER}: no container named")
    assert "  log: ssh: worker down" in message
    assert rounds(clock) == 4  # the poll after the one that found the launcher dead


def test_launch_health_5xx_once_every_node_started_is_a_dead_engine(clock: Clock) -> None:
    head = [State(health="503")]
    failed = fails(FakeCluster(head, [MISSING, MISSING, State()]), clock)
    assert failed.failure.kind == "fatal" and failed.failure.node == HEAD
    assert str(failed).startswith(
        f"vLLM failed to start on {HEAD}: engine unhealthy: /health answers 503"
    )
    assert rounds(clock) == 2  # the poll that first saw the worker's container


def test_launch_a_worker_seen_then_gone_is_a_dead_tp_rank(clock: Clock) -> None:
    head = [State(health="000")] * 2 + [State(health="503")]
    failed = fails(FakeCluster(head, [State(), State(), MISSING]), clock)
    assert failed.failure.kind == "exited" and failed.failure.node == WORKER
    message = str(failed)
    assert message.startswith(
        f"serving container exited on {WORKER}: container {CONTAINER} missing; /health answers 503"
    ), message
    assert f"the TP rank on {WORKER} is gone" in message
    assert rounds(clock) == 2  # the poll that saw it


def test_launch_a_worker_container_exited_fails_at_once(clock: Clock) -> None:
    failed = fails(FakeCluster([State()], [State(), State(status="exited", code=137)]), clock)
    assert failed.failure.kind == "exited" and failed.failure.node == WORKER
    assert str(failed).startswith(
        f"serving container exited on {WORKER}: container {CONTAINER} exited (code 137)"
    )


# -- attach mode: what is missing now is gone -----------------------------------------------
def test_attach_a_missing_worker_with_health_503_is_a_dead_tp_rank(clock: Clock) -> None:
    cluster = FakeCluster([State(health="503")], [MISSING])
    failed = fails(cluster, clock, launcher_pid=None)
    assert failed.failure.kind == "exited" and failed.failure.node == WORKER
    message = str(failed)
    assert message.startswith(
        f"serving container exited on {WORKER}: container {CONTAINER} missing; /health answers 503"
    ), message
    assert "TP rank" in message
    assert rounds(clock) == 0
    assert "ps -o stat=" not in cluster.conn(HEAD).commands[0]  # no launcher to ask about


def test_attach_a_missing_worker_fails_after_five_seconds(clock: Clock) -> None:
    failed = fails(FakeCluster([State()], [MISSING]), clock, launcher_pid=None)
    assert failed.failure.node == WORKER
    assert str(failed).startswith(
        f"serving container exited on {WORKER}: no container named {CONTAINER!r}"
    )
    assert 5 < rounds(clock) * readiness.POLL_S <= 5.5


# -- log signatures ---------------------------------------------------------------------
def test_a_fatal_log_line_fails_at_once_with_its_signature(clock: Clock) -> None:
    worker = [State(logs=(LOADING,)), State(logs=(OOM,))]
    failed = fails(FakeCluster([State()], worker), clock)
    assert failed.failure.kind == "fatal" and failed.failure.node == WORKER
    assert failed.failure.signature == "cuda-oom"
    message = str(failed)
    assert message.startswith(f"vLLM failed to start on {WORKER}: cuda-oom")
    assert "  log: (EngineCore_DP0 pid=312) ERROR" in message
    assert "lower --gpu-memory-utilization" in message
    assert f"--- last 2 log lines of {WORKER} ---" in message  # no line counted twice
    assert f"--- last 0 log lines of {HEAD} ---" in message
    assert rounds(clock) == 1


# -- connection loss --------------------------------------------------------------------
def test_a_worker_lost_for_two_probes_is_retried_and_heals(clock: Clock) -> None:
    lost = NodeUnreachable(WORKER, "SSH session lost: [Errno 113] No route to host")
    head = [State(logs=(LOADING,))] + [State()] * 9 + [State(health="200")]
    cluster = FakeCluster(head, [State(), lost, lost, State()])
    notices: list[str] = []
    done = watch(cluster, clock, notify=notices.append)
    assert done.ready and done.failure is None
    assert notices == [
        f"lost connection to {WORKER}, retry 1/3 in 1 s ({lost})",
        f"lost connection to {WORKER}, retry 2/3 in 1 s ({lost})",
        f"{WORKER} answers again after 2.0 s (2 retries)",
    ]
    assert cluster.conn(WORKER).closed == 2  # each retry connects afresh
    assert len(cluster.conn(HEAD).commands) == 11  # the head polled all along
    assert len(cluster.conn(WORKER).commands) == 4 + 5  # not polled while waiting to retry


def test_a_worker_lost_beyond_the_retry_budget_fails_naming_it(clock: Clock) -> None:
    lost = NodeUnreachable(WORKER, "SSH session lost: [Errno 113] No route to host")
    notices: list[str] = []
    failed = fails(FakeCluster([State()], [State(), lost]), clock, notify=notices.append)
    assert failed.failure.kind == "unreachable" and failed.failure.node == WORKER
    message = str(failed)
    assert message.startswith(
        f"lost the node while waiting on {WORKER}: no SSH connection after 3 retries over "
        f"3 s; last error: {lost}"
    ), message
    assert "admin@10.0.0.2" in message  # its management address, to ping
    assert len(notices) == 3 and notices[-1].startswith(f"lost connection to {WORKER}, retry 3/3")
    assert rounds(clock) == 7  # lost at 0.5 s, retried at 1.5, 2.5, 3.5 s


def test_a_node_that_never_connected_fails_without_retries(clock: Clock) -> None:
    cluster = FakeCluster([State()], [State()])
    cluster.node(WORKER)._error = NodeUnreachable(WORKER, "connection refused")
    failed = fails(cluster, clock, notify=pytest.fail)
    assert failed.failure.kind == "unreachable" and failed.failure.node == WORKER
    assert "no SSH connection after 0 retries" in str(failed)
    assert cluster.conn(WORKER).commands == []


# -- time limits ------------------------------------------------------------------------
def test_not_ready_within_the_ready_timeout(clock: Clock) -> None:
    cluster = FakeCluster([State(logs=(LOADING,)), State(logs=("still loading",))], [State()])
    failed = fails(cluster, clock, ready_timeout=3.0)
    assert failed.failure.kind == "timeout" and failed.failure.node is None
    assert str(failed).startswith("vLLM not ready: not ready after 3 s (phase weights)")
    assert rounds(clock) == 6


def test_silence_while_a_node_is_retried_is_no_hang(clock: Clock) -> None:
    lost = NodeUnreachable(WORKER, "connection lost while running: probe")
    head = [State(logs=(LOADING,))] + [State()] * 8 + [State(health="200")]
    done = watch(FakeCluster(head, [State(), lost, lost, lost, State()]), clock, hang_timeout=2.0)
    assert done.ready, done.failure
