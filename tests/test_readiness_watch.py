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
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_spark.access.base import CommandResult, NodeUnreachable
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.access.retry import for_connection
from pytest_spark.launchers.launch_cluster.commands import HEAD_EXIT_SENTINEL
from pytest_spark.readiness import clock as readiness_clock
from pytest_spark.readiness import parse, probe, waitstate
from pytest_spark.readiness.probe import SEP, SINCE_START
from pytest_spark.readiness.wait import wait_ready
from pytest_spark.readiness.waitstate import StartupFailed, WaitSpec
from pytest_spark.readiness.watch import StartupWatch

CONTAINER = "vllm_node"
PORT = 8000
PID = 4242
LAUNCH_LOG = "/tmp/pytest-spark-launch-0123.log"
SINCE = "2026-11-29T20:00:00.000000000Z"
HEAD, WORKER = "spark-head", "spark-worker-1"
# docker's answers for a container that does not exist (inspect, then logs).
NO_OBJECT = f"Error: No such object: {CONTAINER}"
NO_CONTAINER = f"Error response from daemon: No such container: {CONTAINER}"
INSPECT = (
    f"docker inspect -f '{{{{.State.Status}}}} {{{{.State.ExitCode}}}} {{{{.State.StartedAt}}}}' "
    f"{CONTAINER}"
)
# docker inspect trims trailing zeros of StartedAt; docker logs prints nine digits.
STARTED = "2026-11-29T20:00:00Z"
SERVE = "1234 /usr/bin/python3 /usr/local/bin/vllm serve /models/m --tensor-parallel-size 2"
DOCKER_TOP = f"docker top {CONTAINER} -eo pid,args -ww"
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
    started: str = STARTED  # .State.StartedAt
    procs: tuple[str, ...] = (SERVE,)  # docker top's lines (PID ARGS) of a running container
    launcher: str = ""  # the launcher's log file so far (the head's vLLM output, Ray mode)
    sentinel: int | None = None  # launch-cluster.sh's head-exit file in the container


MISSING = State(status="missing")
Answer = State | NodeUnreachable


class Clock:
    """Virtual monotonic time, the wait's one clock: ``sleep`` advances ``now``."""

    def __init__(self) -> None:
        self.time = 1000.0
        self.sleeps = 0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.time

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        assert self.sleeps < 10_000, "wait_ready never returned"
        self.slept.append(seconds)
        self.time += seconds


class FakeTarget:
    def describe(self) -> str:
        return "admin@10.0.0.2"


class FakeConn:
    """Answers each probe with the next scripted state (the last one repeats)."""

    def __init__(
        self, name: str, script: Sequence[Answer], stamps: Iterator[int], skew: int = 0
    ) -> None:
        self.name, self.script, self.stamps = name, script, stamps
        self.skew = skew  # this node's clock minus the head's, in seconds
        self.commands: list[str] = []
        self.log: list[str] = []  # "<timestamp> <line>", as `docker logs --timestamps`
        self.sinces: list[str] = []  # the --since of each probe's docker logs
        self.closed = 0
        self.target = FakeTarget()

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        assert timeout == probe.PROBE_TIMEOUT_S
        self.commands.append(command)
        answer = self.script[min(len(self.commands), len(self.script)) - 1]
        if isinstance(answer, NodeUnreachable):
            raise answer
        for line in answer.logs:
            i = next(self.stamps) + self.skew  # itertools.count: safe from map's threads
            self.log.append(f"{log_time(i)} {line}")
        return CommandResult(self.name, command, 0, self.shell_output(command, answer), "")

    def shell_output(self, command: str, state: State) -> str:
        """What the probe's shell prints: one ``SEP name`` section per part it asks for."""
        assert INSPECT in command
        out = ""
        if f"echo {SEP} health" in command:
            assert f"http://127.0.0.1:{PORT}/health" in command
            out += f"{SEP} health\n{state.health}\n"  # curl -w '%{http_code}'; echo
        missing = state.status == "missing"
        inspect = NO_OBJECT if missing else f"{state.status} {state.code} {state.started}"
        out += f"{SEP} state\n{inspect}\n"
        self.sinces.append(since := self.since_of(command, state))
        # docker logs --since is inclusive: the line at the cursor comes back again
        # (compared as times: docker parses the argument, whatever its digits).
        lines = [NO_CONTAINER] if missing else [x for x in self.log if stamp(x) >= stamp(since)]
        out += f"{SEP} logs\n" + "".join(f"{line}\n" for line in lines)
        if f"echo {SEP} procs" in command:
            assert DOCKER_TOP in command and 'case "$st" in running*)' in command
            running = state.status == "running"
            top = ["PID COMMAND", *state.procs] if running else []
            out += f"{SEP} procs\n" + "".join(f"{line}\n" for line in top)
        if f"echo {SEP} exit" in command:  # read only while no vllm serve runs
            assert f"docker exec {CONTAINER} cat {HEAD_EXIT_SENTINEL}" in command
            serving = any("vllm serve" in line for line in state.procs)
            found = state.status == "running" and not serving and state.sentinel is not None
            out += f"{SEP} exit\n" + (f"{state.sentinel}\n" if found else "")
        offset = re.search(r"echo \S+ launcher; tail -c \+(\d+) (\S+) ", command)
        if offset is not None:
            assert offset.group(2) == LAUNCH_LOG
            data = state.launcher.encode()[int(offset.group(1)) - 1 :]
            out += f"{SEP} launcher\n" + data.decode()
        if f"echo {SEP} alive" in command:
            assert f"ps -o stat= -p {PID}" in command
            out += f"{SEP} alive\n{'alive' if state.alive else 'dead'}\n"
        return out

    def since_of(self, command: str, state: State) -> str:
        """The ``--since`` the probe gives docker logs: a log time, or the container's
        StartedAt through the shell (``${st##* }``: the last word of the inspect line)."""
        if '--since "${st##* }" ' in command:
            return state.started
        since_arg = re.search(r"--since (\S+) ", command)
        assert since_arg is not None, command
        return shlex.split(since_arg.group(1))[0]

    def close(self) -> None:
        self.closed += 1


def log_time(seconds: int) -> str:
    """``docker logs --timestamps``' stamp ``seconds`` after SINCE (on the head's clock)."""
    when = datetime(2026, 11, 29, 20, 0, 0) + timedelta(seconds=seconds)
    return when.strftime("%Y-%m-%dT%H:%M:%S.000000000Z")


def stamp(line: str) -> datetime:
    """The time of a ``docker logs --timestamps`` line (or of a bare RFC 3339 time)."""
    text = line.split()[0].rstrip("Z")
    whole, _, frac = text.partition(".")
    return datetime.fromisoformat(whole) + timedelta(microseconds=int((frac + "0" * 6)[:6]))


class FakeCluster(Cluster):
    """The real Cluster's map/node/head over fake connections (nothing to connect)."""

    def __init__(
        self, head: Sequence[Answer], worker: Sequence[Answer], worker_skew: int = 0
    ) -> None:
        stamps = itertools.count(1)  # log timestamps, in seconds after SINCE
        self.nodes = [
            Node(name, role, name, FakeConn(name, script, stamps, skew))  # type: ignore[arg-type]
            for name, role, script, skew in (
                (HEAD, "head", head, 0),
                (WORKER, "worker", worker, worker_skew),
            )
        ]
        self._connected = True

    def conn(self, name: str) -> FakeConn:
        conn = self.node(name).conn
        assert isinstance(conn, FakeConn)
        return conn


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The fake clock, and the real one forbidden: the wait passes and reads time only
    through the clock it is given."""

    def real_time(*args: object) -> float:
        raise AssertionError("the readiness wait used the real clock beside the injected one")

    fake = SimpleNamespace(sleep=real_time, monotonic=real_time)
    monkeypatch.setattr(readiness_clock, "time", fake)
    return Clock()


# The schedules below (retries, hang, ready and grace limits, confirming polls) are counted
# in polls half a second apart; the product's default (readiness.POLL_S) is held by
# test_the_default_pause_between_polls_is_a_second.
POLL_S = 0.5
SPEC_FIELDS = {f.name for f in fields(WaitSpec)}


def watch(cluster: FakeCluster, clock: Clock, **kwargs: Any) -> StartupWatch:
    options: dict[str, Any] = {
        "container": CONTAINER,
        "port": PORT,
        "ready_timeout": 600.0,
        "hang_timeout": 300.0,
        "placement_timeout": 120.0,
        "since": SINCE,
        "launcher_pid": PID,
        "launcher_exit_file": HEAD_EXIT_SENTINEL,
        "poll_s": POLL_S,
    }
    calls: dict[str, Any] = {"clock": clock, "retry": for_connection(1.0, 1.0)}  # 1, 1, 1 s
    for name, value in kwargs.items():
        if name == "nodes":
            value = tuple(value)
        (options if name in SPEC_FIELDS else calls)[name] = value
    return wait_ready(cluster, WaitSpec(**options), **calls)


def fails(cluster: FakeCluster, clock: Clock, **kwargs: Any) -> StartupFailed:
    with pytest.raises(StartupFailed) as info:
        watch(cluster, clock, **kwargs)
    return info.value


def rounds(clock: Clock, start: float = 1000.0) -> float:
    """Polls made so far (one sleep of POLL_S between two polls)."""
    return (clock.time - start) / POLL_S


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
    # the poll after the one that found the launcher dead, and its confirming poll
    assert rounds(clock) == 5


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
    assert rounds(clock) == 3  # the poll that saw it, and the one that confirmed it


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
    assert rounds(clock) == 1  # the confirming poll
    assert "ps -o stat=" not in cluster.conn(HEAD).commands[0]  # no launcher to ask about


def test_attach_a_missing_worker_fails_after_five_seconds(clock: Clock) -> None:
    failed = fails(FakeCluster([State()], [MISSING]), clock, launcher_pid=None)
    assert failed.failure.node == WORKER
    assert str(failed).startswith(
        f"serving container exited on {WORKER}: no container named {CONTAINER!r}"
    )
    assert 5.5 < rounds(clock) * POLL_S <= 6.0  # and its confirming poll


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


def test_a_silent_load_stalls_at_the_hang_timeout_naming_it(clock: Clock) -> None:
    cluster = FakeCluster([State(logs=(LOADING,)), State()], [State()])
    failed = fails(cluster, clock, hang_timeout=5.0)
    assert failed.failure.kind == "stalled"
    assert str(failed).startswith(
        "vLLM startup stalled: no log progress for 5 s in phase weights "
        "(limit 5 s: --spark-hang-timeout)"
    ), str(failed)
    assert rounds(clock) == 10  # the line came on the first poll; 5 s of silence after it


def test_a_placement_group_not_formed_hangs_at_the_placement_timeout(clock: Clock) -> None:
    wait_line = (
        "(EngineCore_DP0 pid=1) INFO [ray_utils.py:300] Waiting for creating a placement "
        "group of specs for 10 seconds. specs=[{'GPU': 1.0}, {'GPU': 1.0}]"
    )
    head = [State(logs=(wait_line,)), State(logs=("(APIServer pid=1) INFO waiting",))]
    failed = fails(FakeCluster(head, [State()]), clock, placement_timeout=20.0)
    assert failed.failure.kind == "hang" and failed.failure.node == HEAD
    assert failed.failure.signature.startswith("placement-group (waiting 20 s, limit 20 s")
    assert rounds(clock) == 20  # began 10 s before the first poll: 10 s more


def test_the_pause_between_polls_is_the_rest_of_the_poll_on_the_one_clock(
    clock: Clock,
) -> None:
    # each head probe takes 0.2 s of the clock: the wait sleeps the 0.3 s left of the poll
    cluster = FakeCluster([State()] * 3 + [State(health="200")], [State()])
    conn = cluster.conn(HEAD)
    answer = conn.run

    def slow(command: str, *, timeout: float | None = None) -> CommandResult:
        clock.time += 0.2
        return answer(command, timeout=timeout)

    conn.run = slow  # type: ignore[method-assign]
    assert watch(cluster, clock).ready
    assert clock.slept == pytest.approx([POLL_S - 0.2] * 3)


def test_the_default_pause_between_polls_is_a_second(clock: Clock) -> None:
    """Without ``poll_s`` the wait polls every readiness.POLL_S, 1 s: each probe runs
    three docker commands on every node, and a 15-minute load needs no more."""
    cluster = FakeCluster([State()] * 3 + [State(health="200")], [State()])
    options = {"container": CONTAINER, "port": PORT, "ready_timeout": 600.0}
    spec = WaitSpec(
        **options, hang_timeout=300.0, placement_timeout=120.0, since=SINCE, launcher_pid=PID
    )
    done = wait_ready(cluster, spec, clock=clock, retry=for_connection(1.0, 1.0))
    assert done.ready
    assert waitstate.POLL_S == 1.0 and clock.slept == pytest.approx([1.0] * 3)


def test_silence_while_a_node_is_retried_is_no_hang(clock: Clock) -> None:
    lost = NodeUnreachable(WORKER, "connection lost while running: probe")
    head = [State(logs=(LOADING,))] + [State()] * 8 + [State(health="200")]
    done = watch(FakeCluster(head, [State(), lost, lost, lost, State()]), clock, hang_timeout=2.0)
    assert done.ready, done.failure


# -- each container's current start, on its own node's clock ----------------------------
OLD_RUN = (  # an earlier start of the same container: docker start keeps its output
    "(APIServer pid=1) INFO 11-29 19:40:00 [api_server.py:1912] Starting vLLM API server 0 on "
    "http://0.0.0.0:8000",
    "INFO:     Application startup complete.",
)
SHARDS = (
    "(EngineCore_DP0 pid=312) Loading safetensors checkpoint shards:  56% Completed | 5/9 "
    "[00:13<00:11,  2.87s/it]"
)


def test_attach_after_a_restart_reads_only_this_start(clock: Clock) -> None:
    head = [State(health="000", logs=(LOADING,)), State(health="000", logs=(SHARDS,))]
    head += [State(health="000")] * 6 + [State(health="200")]
    cluster = FakeCluster(head, [State()])
    old = [f"2026-11-29T19:40:0{i}.000000000Z {line}" for i, line in enumerate(OLD_RUN)]
    cluster.conn(HEAD).log.extend(old)
    cluster.conn(WORKER).log.extend(old)
    lines: list[str] = []
    done = watch(
        cluster,
        clock,
        since=SINCE_START,
        launcher_pid=None,
        progress=lambda w, now: lines.append(w.status_line(now)),
    )
    assert done.ready and done.failure is None
    assert rounds(clock) == 8  # the poll on which /health answered 200, not before
    assert [p["phase"] for p in done.timeline()] == ["start", "weights", "ready"]
    for node in (HEAD, WORKER):
        assert not any("startup complete" in line for line in done.tails[node]), node
        assert cluster.conn(node).sinces[0] == STARTED  # docker logs from StartedAt
    assert list(done.tails[HEAD]) == [LOADING, SHARDS]
    assert lines[0].startswith("vLLM startup: weights") and "shards 5/9" in lines[-1]
    assert not any("ready" in line for line in lines)
    # later polls continue from the last line read (its nine-digit stamp), not from the start
    assert cluster.conn(HEAD).sinces[-1] == log_time(2)


def test_each_node_is_read_on_its_own_clock(clock: Clock) -> None:
    # The worker's clock runs 5 minutes behind the head's: its container started, and its
    # lines are stamped, at 19:55 by the head's 20:00.
    skew = -300
    worker = [State(started=log_time(skew)), State(started=log_time(skew), logs=(OOM,))]
    cluster = FakeCluster([State()], worker, worker_skew=skew)
    failed = fails(cluster, clock, since=SINCE_START)
    assert failed.failure.kind == "fatal" and failed.failure.node == WORKER
    assert failed.failure.signature == "cuda-oom"
    assert cluster.conn(WORKER).sinces[0] == log_time(skew)  # its own StartedAt


def test_fixed_ts_makes_docker_inspect_times_compare_with_log_stamps() -> None:
    assert parse.fixed_ts("2026-11-29T20:00:00Z") == "2026-11-29T20:00:00.000000000Z"
    assert parse.fixed_ts("2026-11-29T20:00:00.5Z") == "2026-11-29T20:00:00.500000000Z"
    # untouched: not a UTC RFC 3339 time
    assert parse.fixed_ts("0001-01-01T00:00:00+01:00") == "0001-01-01T00:00:00+01:00"
    assert parse.fixed_ts("2026-11-29T20:00:00Z") < "2026-11-29T20:00:00.100000000Z"


# -- the real container model: sleep infinity, vLLM through docker exec ----------------
HEADLESS = (
    "77 /usr/bin/python3 /usr/local/bin/vllm serve /models/m --tensor-parallel-size 2 "
    "--nnodes 2 --node-rank 1 --master-addr 198.19.0.1 --master-port 29501 --headless"
)
RAY_HEAD = "40 /usr/bin/python3 /usr/local/bin/ray start --block --head --port 29501"


def test_a_dead_headless_rank_in_a_live_container_fails_naming_its_node(clock: Clock) -> None:
    crash = "(EngineCore_DP0 pid=77) ERROR 11-29 20:00:09 [core.py:866] EngineCore failed"
    worker = [State(procs=(HEADLESS,), logs=(LOADING,)), State(procs=(), logs=(crash,))]
    failed = fails(FakeCluster([State(health="000")], worker), clock)
    assert failed.failure.kind == "fatal" and failed.failure.node == WORKER
    message = str(failed)
    assert message.startswith(
        f"vLLM failed to start on {WORKER}: `vllm serve` exited inside the running container "
        f"{CONTAINER!r} (docker top lists no vllm process)"
    ), message
    assert f"  log: {crash}" in message  # that node's last line
    assert message.index(f"log lines of {WORKER}") < message.index(f"log lines of {HEAD}")
    assert rounds(clock) == 2  # the poll that found the process gone, and the next


def test_a_dead_vllm_serve_on_a_ray_head_is_seen_while_ray_runs_on(clock: Clock) -> None:
    head = [State(procs=(RAY_HEAD, SERVE)), State(procs=(RAY_HEAD,))]
    failed = fails(FakeCluster(head, [State(procs=(RAY_HEAD,))]), clock, launcher_pid=None)
    assert failed.failure.node == HEAD
    assert "`vllm serve` exited inside the running container" in str(failed)


def test_attach_a_container_where_nothing_serves_fails_after_the_grace(clock: Clock) -> None:
    failed = fails(FakeCluster([State()], [State(procs=())]), clock, launcher_pid=None)
    assert failed.failure.node == WORKER
    assert str(failed).startswith(
        f"vLLM failed to start on {WORKER}: no vllm or ray process in the running container "
        f"{CONTAINER!r} for 30 s (limit 30 s)"
    ), str(failed)


def test_launch_a_container_waiting_for_its_docker_exec_is_not_dead(clock: Clock) -> None:
    # sleep infinity first, then the launcher's docker exec starts vLLM
    worker = [State(procs=())] * 80 + [State(procs=(HEADLESS,))]
    head = [State()] * 85 + [State(health="200")]
    assert watch(FakeCluster(head, worker), clock).ready


def test_a_missing_container_names_the_limit_that_applied(clock: Clock) -> None:
    head = [State(logs=("(APIServer pid=1) INFO still loading",))]  # a line every poll
    failed = fails(FakeCluster(head, [MISSING]), clock, hang_timeout=40.0)
    assert str(failed).startswith(
        f"serving container exited on {WORKER}: no container named {CONTAINER!r} (still "
        "missing after 40 s (limit 40 s))"
    ), str(failed)
    assert rounds(clock) == 82  # the first poll past 40 s, and its confirming poll


# -- what the watch can see ---------------------------------------------------------------
def test_hidden_head_log_no_false_stall_on_a_long_load(clock: Clock) -> None:
    head = [State(health="000")] * 30 + [State(health="200")]
    done = watch(
        FakeCluster(head, [State()]),
        clock,
        launcher_pid=None,
        hang_timeout=5.0,
        head_log_visible=False,
    )
    assert done.ready and rounds(clock) == 30
    # the same silence with the head's log visible is a stall
    failed = fails(FakeCluster(head, [State()]), clock, launcher_pid=None, hang_timeout=5.0)
    assert failed.failure.kind == "stalled"


def test_only_the_nodes_the_launcher_keeps_are_expected(clock: Clock) -> None:
    cluster = FakeCluster([State()] * 20 + [State(health="200")], [MISSING])
    done = watch(cluster, clock, nodes=[cluster.node(HEAD)])
    assert done.ready
    assert cluster.conn(WORKER).commands == []
    assert WORKER not in done.tails


def test_attach_health_5xx_with_a_container_where_nothing_serves_names_it(clock: Clock) -> None:
    cluster = FakeCluster([State(health="503")], [State(procs=())])
    failed = fails(cluster, clock, launcher_pid=None)
    assert failed.failure.node == WORKER
    assert str(failed).startswith(
        f"vLLM failed to start on {WORKER}: no vllm or ray process in the running container "
        f"{CONTAINER!r}; /health answers 503"
    ), str(failed)
    assert rounds(clock) == 1  # the confirming poll


NCCL_AFTER = (
    "(Worker_TP0 pid=89) [rank0]:[E1201 09:25:21 ProcessGroupNCCL.cpp:2057] Process group "
    "watchdog thread terminated with exception: NCCL error: remote process exited or there "
    "was a network error"
)


def test_a_dead_rank_wins_over_what_its_peer_then_logs(clock: Clock) -> None:
    # attached: the worker's rank died; the head's log says NCCL error, /health says 503
    head = [State(health="503", logs=(NCCL_AFTER,))]
    failed = fails(FakeCluster(head, [State(procs=())]), clock, launcher_pid=None)
    assert failed.failure.node == WORKER, str(failed)
    message = str(failed)
    assert "no vllm or ray process in the running container" in message
    assert f"{HEAD} then logged: {NCCL_AFTER[:60]}" in message


def test_a_root_cause_in_a_log_wins_over_the_rank_it_killed(clock: Clock) -> None:
    # the head's engine ran out of memory; the worker's headless rank exits with it
    head = [State(), State(logs=(OOM,))]
    worker = [State(procs=(HEADLESS,)), State(procs=())]
    failed = fails(FakeCluster(head, worker), clock)
    assert failed.failure.node == HEAD and failed.failure.signature == "cuda-oom", str(failed)


def test_a_root_cause_that_reaches_the_log_a_poll_later_wins_over_the_dead_rank(
    clock: Clock,
) -> None:
    """No-Ray: the head's engine fails, the worker's headless rank exits at once, and the
    head's fatal line reaches its log one poll after the rank is seen gone. The rank is
    blamed only once the next poll of every log shows no cause of its own: here it does."""
    head = [State(), State(), State(logs=(OOM,))]
    worker = [State(procs=(HEADLESS,)), State(procs=())]
    failed = fails(FakeCluster(head, worker), clock)
    assert failed.failure.node == HEAD and failed.failure.signature == "cuda-oom", str(failed)
    assert rounds(clock) == 2  # the poll that saw the rank gone, and the next one


def test_a_dead_rank_stands_when_the_next_poll_brings_only_its_consequences(
    clock: Clock,
) -> None:
    """The poll after the rank is seen gone brings the peer's NCCL error (a consequence):
    the dead rank stands, as first found."""
    head = [State(), State(), State(logs=(NCCL_AFTER,))]
    worker = [State(procs=(HEADLESS,)), State(procs=())]
    failed = fails(FakeCluster(head, worker), clock)
    assert failed.failure.node == WORKER, str(failed)
    assert "exited inside the running container" in str(failed)
    assert rounds(clock) == 2


# -- the head's vLLM output in the launcher's log (Ray mode) ------------------------------
def test_a_progress_bar_in_the_launcher_log_shows_each_redraw(clock: Clock) -> None:
    bar = "Loading safetensors checkpoint shards:  {}% Completed | {}/9 [00:13<00:11,  2.87s/it]"
    log = LOADING + "\n" + bar.format(11, 1) + "\r"
    steps = [log, log + bar.format(22, 2) + "\r", log + bar.format(22, 2) + "\r" + bar[:20]]
    head = [State(launcher=text) for text in steps] + [State(health="200", launcher=steps[-1])]
    shards: list[str] = []

    def seen(w: StartupWatch, now: float) -> None:
        shards.append(w.status_line(now).split("shards ")[-1].split()[0])

    done = watch(FakeCluster(head, [State()]), clock, launcher_log_path=LAUNCH_LOG, progress=seen)
    assert shards[:3] == ["1/9", "2/9", "2/9"]  # each redraw as it comes, the cut tail not yet
    assert list(done.tails[f"{HEAD} (launcher)"]) == [LOADING, bar.format(11, 1), bar.format(22, 2)]


@pytest.mark.parametrize("worker", [MISSING, State(status="exited", code=137)])
def test_a_gone_container_wins_over_what_its_peer_then_logs(clock: Clock, worker: State) -> None:
    # attached after `worker-kill`: the head's log already says NCCL error, /health 503
    head = [State(health="503", logs=(NCCL_AFTER,))]
    failed = fails(FakeCluster(head, [worker]), clock, launcher_pid=None)
    assert failed.failure.kind == "exited" and failed.failure.node == WORKER, str(failed)
    assert str(failed).startswith(f"serving container exited on {WORKER}: container {CONTAINER}")
    assert f"{HEAD} then logged: {NCCL_AFTER[:60]}" in str(failed)
    assert rounds(clock) == 1  # the confirming poll


# -- launch-cluster.sh's newest behaviours (issue #28): earlyoom, the head's exit file ------
EARLYOOM_REPORT = (
    "mem avail: 117532 of 121693 MiB (96.58%), swap free: 16383 of 16383 MiB (100.00%)"
)
EARLYOOM_KILL = 'sending SIGTERM to process 8342 uid 0 "python3": badness 905, VmRSS 110231 MiB'
ENGINE_DEAD = (
    "(APIServer pid=1) ERROR 12-03 16:40:12 [async_llm.py:480] "
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."
)


def test_an_earlyoom_kill_of_a_rank_is_the_one_failure_before_the_engine_dead_error(
    clock: Clock,
) -> None:
    head = [State(), State(health="503", logs=(ENGINE_DEAD,))]
    worker = [
        State(procs=(HEADLESS,), logs=(EARLYOOM_REPORT,)),
        State(procs=(), logs=(EARLYOOM_KILL,)),
    ]
    failed = fails(FakeCluster(head, worker), clock)
    assert failed.failure.node == WORKER, str(failed)
    assert str(failed).startswith(
        f"vLLM failed to start on {WORKER}: earlyoom-kill: earlyoom sent SIGTERM to process 8342 "
        '"python3" (VmRSS 110231 MiB)'
    ), str(failed)
    assert "--gpu-memory-utilization" in str(failed)
    assert rounds(clock) == 1  # the poll that brought it


def test_earlyoom_reports_do_not_hide_a_stall(clock: Clock) -> None:
    reports = [State(logs=(EARLYOOM_REPORT,))] * 40
    failed = fails(
        FakeCluster([State(logs=(LOADING,)), *reports], reports), clock, hang_timeout=10.0
    )
    assert failed.failure.kind == "stalled", str(failed)
    assert rounds(clock) == 20  # 10 s after the last vLLM line, reports every poll


def test_the_head_exit_file_gives_the_dead_head_rank_its_exit_status(clock: Clock) -> None:
    head = [State(), State(procs=()), State(procs=(), sentinel=137)]
    worker = [State(procs=(HEADLESS,))]
    cluster = FakeCluster(head, worker)
    failed = fails(cluster, clock)
    assert failed.failure.node == HEAD, str(failed)
    assert failed.failure.signature.endswith(
        "; exit status 137: killed by SIGKILL (/tmp/.launch-cluster-head-exit in the container)"
    ), failed.failure.signature
    assert f"echo {SEP} exit" in cluster.conn(HEAD).commands[0]
    assert f"echo {SEP} exit" not in cluster.conn(WORKER).commands[0]  # the head's file only
    assert rounds(clock) == 2


def test_no_ray_before_2026_09_15_the_head_output_is_read_from_the_launcher(
    clock: Clock,
) -> None:
    """The old launcher ran the no-Ray head in its foreground: nothing of it in docker logs
    (earlyoom's reports only), its vLLM output on the launcher's stdout."""
    chatter = "Executing command on head node (rank 0): vllm serve /models/m\n"
    head = [
        State(logs=(EARLYOOM_REPORT,), launcher=chatter),
        State(launcher=chatter + LOADING + "\n" + OOM + "\n"),
    ]
    failed = fails(
        FakeCluster(head, [State(procs=(HEADLESS,))]),
        clock,
        launcher_log_path=LAUNCH_LOG,
        launcher_log_fallback=True,
    )
    assert failed.failure.node == f"{HEAD} (launcher)" and failed.failure.signature == "cuda-oom"


def test_no_ray_since_2026_09_15_the_launchers_echo_of_the_head_log_is_not_fed_twice(
    clock: Clock,
) -> None:
    chatter = "Executing command on head node (rank 0): vllm serve /models/m"
    head = [
        State(launcher=chatter + "\n"),
        State(logs=(LOADING,), launcher=chatter + "\n"),
        State(launcher=f"{chatter}\n{LOADING}\n"),
        State(health="200", launcher=f"{chatter}\n{LOADING}\n"),
    ]
    done = watch(
        FakeCluster(head, [State(procs=(HEADLESS,))]),
        clock,
        launcher_log_path=LAUNCH_LOG,
        launcher_log_fallback=True,
    )
    assert done.ready
    assert list(done.tails[HEAD]) == [LOADING]
    assert list(done.tails[f"{HEAD} (launcher)"]) == [chatter]
