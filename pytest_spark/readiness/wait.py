"""Wait for the serving cluster to become ready, watching every node.

Every poll (twice a second) is one SSH round trip per node, all nodes at once: the head's
``/health`` (asked on the head itself, as operators do with curl), the serving container's
state, and the log lines it printed since the last poll. The lines feed a ``StartupWatch``
that keeps the phase timeline and fails fast on a fatal signature, an exited container, a
hang signature or silence.

A node whose probe fails (connection lost, probe timed out) is retried with exponential
backoff (``remote/retry.py``: attempts and total bounded by the connect timeout), each
retry announced through ``notify``; the other nodes go on being polled meanwhile. A node
that answers again within the window costs nothing; one that does not is reported with
the last error and what to check. Silence while a node is being retried is not a hang.

Each node's log is read from its serving container's own start (``.State.StartedAt``, the
node's own clock), never from another node's clock or an earlier start of the container:
a ``docker start``ed container keeps its previous run's output in ``docker logs``.

The real launcher's containers run ``sleep infinity`` (or, with ``--earlyoom``, earlyoom as
PID 1) and get vLLM (and Ray) through ``docker exec``, so a crashed server leaves its
container running: the probe also lists the container's serving processes (``docker
top``), and a node whose server was seen and is gone while its container still runs is a
dead rank. On the head, when no ``vllm serve`` runs, the probe also reads the launcher's
``/tmp/.launch-cluster-head-exit`` (launch-cluster.sh since 2026-09-15 writes the head
command's ``$?`` there when it exits, and deletes it once read): an authoritative exit
status for the verdict.

A sparkrun job's ranks (``access.layout``: each node's own container, found by its
labels) write vLLM's output to ``/tmp/sparkrun_serve.log`` inside the container, not to
``docker logs`` (PID 1 is ``sleep infinity``): the poll reads that file from the byte it
had read to (``tail -c +N``), so only new lines are fed, and a container started anew
reads its log from the start. Its PID 1 is ``sleep infinity`` by design, as
launch-cluster.sh's: a rank is alive while its ``vllm serve`` runs.

Where the head's vLLM output is: launch-cluster.sh since 2026-09-15 pipes the no-Ray head
command to the container log, as the workers'; before, it ran in the launcher's foreground
(``docker exec -i``), so the output is only on the launcher's stdout (its log here), as in
Ray mode. Launching without Ray, the watch reads both and feeds the launcher's log until
the head's container log shows vLLM output of its own (``launcher_log_fallback``).

The wait is a small state machine, ``ReadinessWait`` (no I/O: which nodes are due, what to
ask each, one poll's answers in, the ``Stage`` out); ``wait_ready`` drives it with the
probes and one injected ``Clock``, which every limit is measured on and which alone passes
time between polls."""

from __future__ import annotations

import re
import shlex
import signal
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Protocol

from pytest_spark.access.base import CommandResult, RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.access.retry import Backoff, RetryState, for_connection
from pytest_spark.readiness.follow import HealthFollower
from pytest_spark.readiness.vllm_log import CONSEQUENCES, PREFIX, classify
from pytest_spark.readiness.watch import StartupFailure, StartupWatch

SEP = "__PYTEST_SPARK_PROBE__"
# A poll runs `docker inspect`, `docker logs` and `docker top` on every serving node (and
# curl on the head): ~150 ms of CPU on each node (measured on sparksim). Each second, not
# each half, halves what the watch costs the nodes: a crash is seen within a second; /health
# turning 200 within ~0.1 s plus one poll (the head follows it between polls: follow.py).
POLL_S = 1.0
PROBE_TIMEOUT_S = 15.0
# ``since`` meaning "from this container's current start" (its .State.StartedAt).
SINCE_START = "start"
# Serving processes in a container, as ``docker top`` lists them: the API server and
# headless ranks (``vllm serve``, vLLM's ``VLLM::`` process titles) and Ray's.
VLLM_PROCESS = re.compile(r"\bvllm serve\b|VLLM::")
RAY_PROCESS = re.compile(r"\bray start\b|\braylet\b|ray::")
SERVER_PROCESS = re.compile(f"{VLLM_PROCESS.pattern}|{RAY_PROCESS.pattern}")
PROCESS_NAMES = {"vllm": "vllm serve", "ray": "ray"}
# launch-cluster.sh (since 2026-09-15): the head command's exit status, in the head container
# from its exit until the launcher's next poll (<= 5 s), which deletes it.
HEAD_EXIT_SENTINEL = "/tmp/.launch-cluster-head-exit"
MISSING_LIMIT_S = 30.0  # a container still missing this long (at least hang_timeout) is gone
ATTACH_MISSING_S = 5.0  # attached: a container missing this long after the wait began is gone
LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|localhost|localhost\.localdomain|::1|\[::1\])$", re.I)


def serve_flag(words: list[str], flag: str) -> str | None:
    """``--flag VALUE`` or ``--flag=VALUE`` in a command line's words (the last one wins,
    as with argparse)."""
    found = None
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            found = words[i + 1]
        elif word.startswith(flag + "="):
            found = word.split("=", 1)[1]
    return found


def loopback_master(process: str) -> tuple[str, int, str] | None:
    """``(address, nnodes, rank)`` when ``process`` (a ``docker top`` args line) is a
    multi-node ``vllm serve`` whose ``--master-addr`` is a loopback address: its ranks on
    other nodes dial their own loopback and can never join (sparkrun#249)."""
    if not re.search(r"\bvllm serve\b", process):
        return None
    try:
        words = shlex.split(process)
    except ValueError:
        words = process.split()
    nnodes, addr = serve_flag(words, "--nnodes"), serve_flag(words, "--master-addr")
    if not (nnodes and nnodes.isdigit() and int(nnodes) > 1 and addr and LOOPBACK.match(addr)):
        return None
    return addr, int(nnodes), serve_flag(words, "--node-rank") or "0"


class StartupFailed(Exception):
    def __init__(self, failure: StartupFailure, watch: StartupWatch) -> None:
        super().__init__(failure.message())
        self.failure = failure
        self.watch = watch


@dataclass
class NodeProbe:
    health: str | None
    status: str  # running | exited (code N) | missing | ...
    lines: list[str]
    launcher_alive: bool | None = None
    launcher_output: str = ""
    started_at: str | None = None  # the container's .State.StartedAt, fixed width
    processes: list[str] | None = None  # serving processes (docker top), when asked
    exit_status: int | None = None  # the launcher's head-exit sentinel, when present
    log_text: str = ""  # the logs section as read (a serve log file's bytes from the cursor)

    @property
    def kinds(self) -> set[str]:
        """What serves in the container: ``vllm`` (the API server or a headless rank),
        ``ray`` (Ray's processes: in Ray mode vLLM's ranks run under them)."""
        found = set()
        for line in self.processes or ():
            if VLLM_PROCESS.search(line):
                found.add("vllm")
            if RAY_PROCESS.search(line):
                found.add("ray")
        return found


def fixed_ts(stamp: str) -> str:
    """An RFC 3339 UTC time with nine fractional digits, as ``docker logs --timestamps``
    prints it, so it compares as text with the log's stamps (``docker inspect`` trims
    trailing zeros: ``20:00:00Z`` would sort after ``20:00:00.5…Z``)."""
    if not stamp.endswith("Z") or "T" not in stamp:
        return stamp
    whole, _, frac = stamp[:-1].partition(".")
    return f"{whole}.{(frac + '0' * 9)[:9]}Z"


def probe_command(
    container: str,
    since: str,
    port: int | None,
    launcher_pid: int | None,
    launcher_log: str | None = None,
    log_offset: int = 0,
    processes: bool = False,
    sentinel: str | None = None,
    serve_log: str | None = None,
    serve_offset: int = 0,
) -> str:
    """One round trip: [health], container state and start time, new container log lines
    (``since`` a log time of this node, or ``SINCE_START``: from the container's current
    start; with ``serve_log``, a file inside the container, its bytes from
    ``serve_offset`` on instead: sparkrun's /tmp/sparkrun_serve.log), [serving
    processes], [new launcher output], [launcher alive]. Sections are marked ``SEP
    name``."""
    c = shlex.quote(container)
    parts = []
    if port is not None:
        parts.append(
            f"echo {SEP} health; if command -v curl >/dev/null; then curl -s -o "
            f"/dev/null -m 2 -w '%{{http_code}}' http://127.0.0.1:{int(port)}/health;"
            " else echo nocurl; fi; echo"
        )
    parts.append(
        f"echo {SEP} state; st=$(docker inspect -f '{{{{.State.Status}}}} "
        f"{{{{.State.ExitCode}}}} {{{{.State.StartedAt}}}}' {c} 2>&1 | grep . | head -n 1);"
        ' echo "$st"'
    )
    if serve_log is not None:
        parts.append(
            f'echo {SEP} logs; case "$st" in running*|restarting*|paused*) docker exec {c} '
            f"tail -c +{int(serve_offset) + 1} {shlex.quote(serve_log)} 2>/dev/null "
            "| head -c 1048576;; esac"
        )
    else:
        since_arg = '"${st##* }"' if since == SINCE_START else shlex.quote(since)
        parts.append(
            f"echo {SEP} logs; docker logs --timestamps --since {since_arg} {c} 2>&1 | tail -n 2000"
        )
    if processes:
        parts.append(
            f'echo {SEP} procs; case "$st" in running*) p=$(docker top {c} -eo pid,args -ww '
            "2>/dev/null | grep -E 'vllm|VLLM::|ray' | cut -c1-1000 | head -n 50);"
            ' printf "%s\\n" "$p";; esac'
        )
        if sentinel is not None:  # read only while no vllm serve runs: no cost when serving
            parts.append(
                f'echo {SEP} exit; case "$st" in running*) printf "%s" "$p" | grep -qE '
                f"'vllm serve|VLLM::' || docker exec {c} cat {shlex.quote(sentinel)} "
                "2>/dev/null;; esac"
            )
    if launcher_log is not None:
        parts.append(
            f"echo {SEP} launcher; tail -c +{int(log_offset) + 1} "
            f"{shlex.quote(launcher_log)} 2>/dev/null | head -c 1048576"
        )
    if launcher_pid is not None:
        parts.append(
            f"echo {SEP} alive; s=$(ps -o stat= -p {int(launcher_pid)} 2>/dev/null); "
            'case "$s" in ""|Z*) echo dead;; *) echo alive;; esac'
        )
    return "; ".join(parts)


def parse_probe(result: CommandResult, with_health: bool = True) -> NodeProbe:
    sections: dict[str, str] = {}
    for chunk in result.stdout.split(SEP + " ")[1:]:
        name, _, body = chunk.partition("\n")
        sections[name.strip()] = body
    health = sections["health"].strip() if "health" in sections else None
    state = sections.get("state", "").strip()
    logs = sections.get("logs", "")
    alive = None
    if "alive" in sections:
        alive = sections["alive"].strip() == "alive"
    started_at = None
    if not state or "No such object" in state or "No such container" in state:
        status = "missing"
    elif state.startswith(("running", "created", "restarting", "exited", "dead")):
        parts = state.split()
        status = parts[0]
        if status in ("exited", "dead"):
            status = f"{parts[0]} (code {parts[1]})" if len(parts) > 1 else parts[0]
        if len(parts) > 2 and parts[2][:4].isdigit():
            started_at = fixed_ts(parts[2])
    else:
        status = f"unknown: {state[:200]}"
    if status == "missing" or status.startswith("unknown"):
        logs = ""  # docker's own "No such container" error, not the container's log
    processes = None
    if "procs" in sections:
        processes = [
            line.strip() for line in sections["procs"].splitlines() if SERVER_PROCESS.search(line)
        ]
    exit_text = sections.get("exit", "").strip()
    return NodeProbe(
        health,
        status,
        split_segments(logs),
        alive,
        sections.get("launcher", ""),
        started_at,
        processes,
        int(exit_text) if exit_text.isdigit() else None,
        logs,
    )


def exit_status_text(status: int) -> str:
    """``$?`` of the head command as launch-cluster.sh's sentinel holds it, in words."""
    if status > 128:
        try:
            name = signal.Signals(status - 128).name
        except ValueError:
            return f"exit status {status}"
        return f"exit status {status}: killed by {name}"
    return f"exit status {status}"


def vllm_output(line: str) -> bool:
    """A line of vLLM's own (a ``(APIServer pid=N)``-style prefix, or one the watch reads),
    not a monitor's (earlyoom) or the container's PID 1's."""
    if PREFIX.match(line):
        return True
    return any(event.kind not in ("monitor", "benign") for event in classify(line))


def split_segments(logs: str) -> list[str]:
    """``docker logs --timestamps`` lines -> one entry per ``\\r`` segment (a tqdm bar redraws
    with ``\\r`` inside one line), each carrying its line's timestamp, so that the cursor can
    tell a segment it already fed from a new one."""
    out: list[str] = []
    for raw in logs.split("\n"):  # not splitlines(): it splits at "\r" too
        ts, sep, text = raw.partition(" ")
        if not _is_timestamp(ts):
            ts, sep, text = "", "", raw
        out.extend(f"{ts}{sep}{seg}" for seg in text.split("\r") if seg.strip())
    return out


def _is_timestamp(word: str) -> bool:
    return len(word) >= 20 and word[:4].isdigit() and word[4] == "-" and "T" in word


@dataclass
class LogCursor:
    """Remembers the last docker log timestamp seen on a node, to fetch only new lines.

    ``docker logs --since TS`` returns the lines stamped TS again on the next poll, so the
    entries at the newest timestamp are counted (a tqdm line's ``\\r`` segments share its
    stamp, and may repeat): one is fresh only past the count already fed. The cursor so
    re-feeds nothing, and a progress bar that stops moving is silence."""

    since: str
    seen_at_since: Counter[str] = field(default_factory=Counter)

    def new_lines(self, lines: list[str]) -> list[str]:
        fresh: list[str] = []
        polled: Counter[str] = Counter()
        for line in lines:
            ts, _, text = line.partition(" ")
            if not _is_timestamp(ts):  # not docker's: nothing to order it by
                fresh.append(line)
                continue
            if ts < self.since:
                continue
            if ts > self.since:
                self.since, self.seen_at_since, polled = ts, Counter(), Counter()
            polled[line] += 1
            if polled[line] <= self.seen_at_since[line]:
                continue
            self.seen_at_since[line] = polled[line]
            fresh.append(text)
        return fresh


def remote_now(node: Node) -> str:
    result = node.run("date -u +%Y-%m-%dT%H:%M:%S.%NZ", timeout=10)
    return result.stdout.strip() or "1970-01-01T00:00:00Z"


class Clock(Protocol):
    """The wait's one time source: what time it is, and the pause between two polls. Every
    time limit of the wait (ready, hang, placement, the missing-container and
    nothing-serving graces, the retry backoff) is measured on ``now``; ``sleep`` is the
    only way the wait passes time. Tests give a clock whose ``sleep`` advances ``now``."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """The real clock: ``time.monotonic`` and ``time.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


REAL_CLOCK: Clock = MonotonicClock()


class Stage(Enum):
    """Where the stand-up is, as the polls have seen it. ``STARTING`` (launching only): a
    serving node's container is not seen yet, so a 5xx from /health is not yet a dead
    engine. ``LOADING``: every serving container seen (attach starts here); the log phases
    advance in the watch. ``READY``: /health answered 200. ``FAILED``: the watch holds the
    verdict. READY and FAILED are final."""

    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"


Outcome = NodeProbe | RemoteError


@dataclass(frozen=True)
class WaitSpec:
    """What the readiness wait watches, and how long each phase may take.

    ``since``: where every node's log starts (default ``SINCE_START``: each container's
    current start, on that node's clock). ``nodes``: the nodes that serve (the launcher
    trims the list to TP x PP x DP; empty: all). ``head_log_visible=False``: the head's
    vLLM output is not where the watch can read it (attached, Ray mode, no
    ``--spark-serve-log``), so silence is no evidence of a stall: the wait goes on until
    ``/health`` answers, a process or container dies, or ``ready_timeout``. The launcher's
    ``pid`` (launching; None: attached), its log (a reader) and the path of the head's
    vLLM output when the launcher writes it; ``launcher_log_fallback``: that path holds
    the head's output only until the head's container log shows vLLM output (no Ray:
    launch-cluster.sh before 2026-09-15 printed it on its stdout, since then in the
    container log, which it also echoes). ``poll_s``: from one poll's start to the
    next."""

    container: str
    port: int
    ready_timeout: float
    hang_timeout: float
    placement_timeout: float
    since: str = SINCE_START
    nodes: tuple[Node, ...] = ()
    head_log_visible: bool = True
    launcher_pid: int | None = None
    launcher_log: Callable[[], str] | None = None
    launcher_log_path: str | None = None
    launcher_log_fallback: bool = False
    poll_s: float = POLL_S
    # Each node's own container (a sparkrun job's ``..._node_<rank>``); ``container``
    # where a node has none here. ``serve_log``: vLLM's output is that file inside each
    # container (sparkrun), not docker logs.
    containers: Mapping[str, str] = field(default_factory=dict)
    serve_log: str | None = None

    def container_on(self, node: str) -> str:
        """The serving container on ``node``."""
        return self.containers.get(node, self.container)


@dataclass
class ReadinessWait:
    """The readiness wait's state and its transitions, without I/O: ``due`` says which
    nodes to probe now, ``command`` what to ask each, ``observe`` takes one poll's answers
    (with the clock's reading after it) and returns the stage they lead to. ``wait_ready``
    drives it with the probes and the clock."""

    head: Node
    nodes: list[Node]  # the serving nodes, the head first
    spec: WaitSpec
    started: float
    policy: Backoff
    notify: Callable[[str], None] | None = None
    watch: StartupWatch = field(init=False)
    stage: Stage = field(init=False)
    cursors: dict[str, LogCursor] = field(init=False)
    retrying: dict[str, RetryState] = field(default_factory=dict)
    missing_since: dict[str, float] = field(default_factory=dict)
    # Nodes whose serving container has been seen: while launching, a container not yet
    # seen is not yet started (the launcher starts the nodes one after another), not gone.
    seen: set[str] = field(default_factory=set)
    # Nodes where a serving process (vLLM's or Ray's) was seen in the running container,
    # and since when a running container has had none.
    serving: dict[str, set[str]] = field(default_factory=dict)
    idle_since: dict[str, float] = field(default_factory=dict)
    # The head's probe found the launcher dead in an earlier poll (not this one: a worker's
    # probe races the head's), so a container still missing will not come, on any node.
    launcher_exited: bool = False
    launcher_offset: int = 0  # bytes of the launcher's log fed so far
    # The head's container log has shown vLLM output: the launcher's echo of it is not fed.
    head_log_has_vllm: bool = False
    head_exit: int | None = None  # the head command's exit status (the launcher's sentinel)
    # A serve log file's cursor per node: bytes fed so far, and the container start they
    # belong to (a new start reads its log from the beginning).
    serve_offsets: dict[str, int] = field(default_factory=dict)
    serve_started: dict[str, str] = field(default_factory=dict)
    poll_start: StartupFailure | None = None  # the verdict before this poll
    # A rank found dead (its process or container gone) is blamed one poll later, once the
    # next poll of every node's log shows no root cause of its own: the rank's death may
    # reach a peer's log (the head's fatal line) a poll after the rank is seen gone.
    dead: StartupFailure | None = None  # the dead-rank verdict this poll made, if any
    held: StartupFailure | None = None  # a dead-rank verdict waiting for its confirmation

    def __post_init__(self) -> None:
        self.watch = StartupWatch(self.spec.hang_timeout, self.spec.placement_timeout, self.started)
        self.stage = Stage.STARTING if self.spec.launcher_pid is not None else Stage.LOADING
        self.cursors = {node.name: LogCursor(self.spec.since) for node in self.nodes}
        for node in self.nodes:
            self.watch.node_seen(node.name)

    @property
    def missing_limit(self) -> float:
        """How long a container may stay missing before it is gone (at least hang_timeout)."""
        return max(self.spec.hang_timeout, MISSING_LIMIT_S)

    @property
    def launcher_name(self) -> str:
        return f"{self.head.name} (launcher)"

    # -- what to probe ---------------------------------------------------------------
    def due(self, now: float) -> list[Node]:
        """Every serving node but those waiting for their next retry."""
        return [
            n for n in self.nodes if n.name not in self.retrying or self.retrying[n.name].due(now)
        ]

    def command(self, node: Node, processes: bool = True) -> str:
        """The poll's round trip on ``node``; ``processes=False`` leaves out its serving
        processes (the follower's poll at the moment /health turns 200: one docker call
        less, and a rank found dead there is found by the polls before)."""
        is_head = node is self.head
        return probe_command(
            self.spec.container_on(node.name),
            self.cursors[node.name].since,
            self.spec.port if is_head else None,
            self.spec.launcher_pid if is_head else None,
            self.spec.launcher_log_path if is_head else None,
            self.launcher_offset,
            processes=processes,
            sentinel=HEAD_EXIT_SENTINEL if is_head and self.spec.launcher_pid else None,
            serve_log=self.spec.serve_log,
            serve_offset=self.serve_offsets.get(node.name, 0),
        )

    # -- one poll --------------------------------------------------------------------
    def observe(self, results: Mapping[str, Outcome], now: float) -> Stage:
        """One poll's answers: every node's lines first, then what the containers and
        processes say (a rank found dead then wins over what its peers print because of
        it, never over a root cause that a log shows in the same poll), then /health,
        then the time limits."""
        if self.stage in (Stage.READY, Stage.FAILED):
            return self.stage
        self.poll_start = self.watch.failure
        self.dead = None
        for name, outcome in results.items():
            if isinstance(outcome, RemoteError):
                self._lost(self._node(name), outcome, now)
            else:
                self._back(name, now)
                self._feed(name, outcome, now)
        probes = {n: o for n, o in results.items() if isinstance(o, NodeProbe)}
        health = None
        for name, probe in probes.items():
            self._container(name, probe, now)
            if probe.status == "running" and probe.processes is not None:
                self._processes(name, probe, now)
            if probe.status != "missing":
                self.seen.add(name)
            if probe.health is not None:
                health = probe.health
        self._loopback_master(probes)
        self.launcher_exited = self.launcher_exited or any(
            p.launcher_alive is False for p in probes.values()
        )
        if self.stage is Stage.STARTING and all(n.name in self.seen for n in self.nodes):
            self.stage = Stage.LOADING
        if health == "200" and self.held is None:  # a rank found dead stays dead
            self.watch.mark_ready(now)
            self.stage = Stage.READY
            return self.stage
        if health is not None:
            self._health(health, probes)
        self._limits(now)
        self._confirm()
        if self.watch.failure is not None:
            self.stage = Stage.FAILED
        return self.stage

    def _confirm(self) -> None:
        """A dead-rank verdict new in this poll waits for the next poll; then it stands
        (as first found, with the peer lines it overrode) unless that poll's logs gave a
        root cause of their own (a fatal line that is not a consequence of a dead rank)."""
        failure = self.watch.failure
        held, self.held = self.held, None
        if held is not None:
            root_cause = (
                failure is not None
                and failure is not self.dead
                and failure.kind == "fatal"
                and failure.signature not in CONSEQUENCES
            )
            if not root_cause:  # nothing, the rank again, or a limit reached meanwhile
                self.watch.failure = self._with_head_exit(held)
            return
        if failure is not None and failure is self.dead and failure is not self.poll_start:
            self.held = failure
            self.watch.failure = None

    def _with_head_exit(self, failure: StartupFailure) -> StartupFailure:
        """The head's dead-rank verdict with the exit status the launcher's sentinel gave
        (it may be written a poll after the process was seen gone)."""
        if (
            self.head_exit is None
            or failure.node != self.head.name
            or "exit status" in (failure.signature)
        ):
            return failure
        where = f"{HEAD_EXIT_SENTINEL} in the container"
        return replace(
            failure, signature=f"{failure.signature}; {exit_status_text(self.head_exit)} ({where})"
        )

    def _node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def _serve_lines(self, name: str, probe: NodeProbe) -> list[str]:
        """The serve log's new lines (a file read from the byte fed so far): up to the last
        line end or tqdm redraw (``\\r``); the unfinished rest is read again next poll."""
        started = probe.started_at
        if started and self.serve_started.get(name, started) != started:
            self.serve_offsets[name] = 0  # another start of the container: its own log
        if started:
            self.serve_started[name] = started
        text = probe.log_text
        end = max(text.rfind("\n"), text.rfind("\r")) + 1
        self.serve_offsets[name] = self.serve_offsets.get(name, 0) + len(text[:end].encode())
        return [seg for seg in re.split(r"[\r\n]", text[:end]) if seg.strip()]

    def _feed(self, name: str, probe: NodeProbe, now: float) -> None:
        if self.spec.serve_log is not None:
            lines = self._serve_lines(name, probe)
        else:
            cursor = self.cursors[name]
            if cursor.since == SINCE_START and probe.started_at:
                cursor.since = probe.started_at  # this start only, on this node's clock
            lines = cursor.new_lines(probe.lines)
        self.watch.feed(name, lines, now)
        if name == self.head.name and not self.head_log_has_vllm:
            self.head_log_has_vllm = any(vllm_output(line) for line in lines)
        if probe.exit_status is not None and name == self.head.name:
            self.head_exit = probe.exit_status
        if probe.launcher_output:
            # The launcher's own output (vLLM's log when `exec` runs in the foreground).
            # Fed up to the last line end or tqdm redraw (\r): a bar that redraws shows
            # each step; the unfinished rest is read again on the next poll.
            text = probe.launcher_output
            end = max(text.rfind("\n"), text.rfind("\r")) + 1
            self.launcher_offset += len(text[:end].encode())
            lines = [seg for seg in re.split(r"[\r\n]", text[:end]) if seg.strip()]
            if not (self.spec.launcher_log_fallback and self.head_log_has_vllm):
                self.watch.feed(self.launcher_name, lines, now)

    # -- connection loss -------------------------------------------------------------
    def _lost(self, node: Node, error: RemoteError, now: float) -> None:
        state = self.retrying.get(node.name)
        if state is None:
            state = self.retrying[node.name] = RetryState(self.policy, now, str(error))
        delay = None if node._error is not None else state.failed(now, str(error))
        if delay is not None:
            if self.notify is not None:
                self.notify(
                    f"lost connection to {node.name}, retry {state.retries}/"
                    f"{self.policy.attempts} in {delay:g} s ({error})"
                )
            return
        if self.watch.failure is None:
            tried = f"{state.retries} retries over {now - state.started:.0f} s"
            self.watch.failure = StartupFailure(
                "unreachable",
                node.name,
                f"no SSH connection after {tried}; last error: {state.last_error}",
                "",
                f"{node.name} stopped answering over SSH while the cluster was starting: "
                f"check its power, its management link ({node.conn.target.describe()}, "
                "ping it from here) and that sshd runs on it",
                self.watch.snapshot_tails(),
            )

    def _back(self, name: str, now: float) -> None:
        state = self.retrying.pop(name, None)
        if state is None:
            return
        self.watch.last_activity = max(self.watch.last_activity, now)  # gone: no hang
        if self.notify is not None:
            self.notify(
                f"{name} answers again after {now - state.started:.1f} s "
                f"({state.retries} {'retry' if state.retries == 1 else 'retries'})"
            )

    # -- verdicts --------------------------------------------------------------------
    def _may_blame(self, name: str) -> bool:
        """No verdict yet, or only one from another node's log in this very poll: a rank
        found dead is the root cause of what its peers then print (NCCL errors, engine
        death), so it wins over them."""
        failure = self.watch.failure
        return failure is None or (
            failure is not self.poll_start
            and failure.kind == "fatal"
            and failure.node != name
            and failure.signature in CONSEQUENCES
        )

    def _peer_note(self) -> str:
        """What the verdict being overridden had found (a peer's consequence line)."""
        peer = self.watch.failure
        if peer is None or not peer.line:
            return ""
        return f". {peer.node} then logged: {peer.line.strip()[:300]}"

    def _rank_dead(self, name: str, signature: str, remediation: str) -> None:
        remediation += self._peer_note()
        tails = self.watch.snapshot_tails()
        tail = tails.get(name, [])
        self.watch.failure = self.dead = StartupFailure(
            "fatal",
            name,
            signature,
            tail[-1] if tail else "",
            remediation,
            {name: tail, **{n: t for n, t in tails.items() if n != name}},  # its node first
        )

    def _container(self, name: str, probe: NodeProbe, now: float) -> None:
        """An exited container is gone at once; a missing one once the launcher is dead
        (attached: after 5 s) or after ``missing_limit``."""
        if probe.status.startswith(("exited", "dead")):
            if self._may_blame(name):
                note = self._peer_note()
                self.watch.failure = None
                self.watch.container_exited(
                    name, f"container {self.spec.container_on(name)} {probe.status}", now
                )
                if note and self.watch.failure is not None:
                    failure = self.watch.failure
                    self.watch.failure = replace(failure, remediation=failure.remediation + note)
                self.dead = self.watch.failure
            return
        if probe.status != "missing":
            self.missing_since.pop(name, None)
            return
        self.missing_since.setdefault(name, now)
        exited = probe.launcher_alive is False or self.launcher_exited
        launcher_dead = exited or (
            self.spec.launcher_pid is None and now - self.started > ATTACH_MISSING_S
        )
        waited = now - self.missing_since[name]
        if not (launcher_dead or waited > self.missing_limit) or not self._may_blame(name):
            return
        log = self.spec.launcher_log() if self.spec.launcher_log else ""
        why = (
            "the launcher has exited"
            if exited
            else f"still missing after {waited:.0f} s (limit {self.missing_limit:.0f} s)"
        )
        self.watch.failure = self.dead = StartupFailure(
            "exited",
            name,
            f"no container named {self.spec.container_on(name)!r} ({why})",
            log.strip().splitlines()[-1] if log.strip() else "",
            "the launcher did not start the container on this node: read the "
            "launcher output below (SSH from head to workers, image present, "
            "docker running, the launcher's .env CONTAINER_NAME)",
            {**self.watch.snapshot_tails(), "launcher": log.splitlines()[-15:]},
        )

    def _loopback_master(self, probes: Mapping[str, NodeProbe]) -> None:
        """A multi-node ``vllm serve`` with a loopback ``--master-addr`` can never
        rendezvous (sparkrun#249): vLLM only says so after its store's ~600 s timeout.
        Read from the ranks' command lines at once. Only a rank on another node than the
        head counts (it dials its own loopback): the head's store listens on every
        address, so the head's own loopback --master-addr alone is no fault."""
        if self.watch.failure is not None:
            return
        found = {
            name: hit
            for name, probe in probes.items()
            for hit in [next(filter(None, map(loopback_master, probe.processes or ())), None)]
            if hit is not None
        }
        name = next((n for n in found if n != self.head.name), None)
        if name is None:
            return
        addr, nnodes, rank = found[name]
        ranks = ", ".join(f"{n} (rank {found[n][2]})" for n in found)
        head = self.head.name
        self._rank_dead(
            name,
            f"--master-addr {addr} is a loopback address on a {nnodes}-node job (--nnodes "
            f"{nnodes}): rank {rank} on {name} dials its own {addr}, never {head}'s store, and "
            f"can never join (sparkrun#249; vLLM says only `DistStoreError ... 1/{nnodes} "
            f"clients joined` after ~600 s). measured: `vllm serve ... --master-addr {addr}` "
            f"on {ranks}; expected: an address of {head} that every node reaches (its fabric IP)",
            f"give sparkrun the head by an address the workers reach, not 127.0.0.1/localhost "
            f"(the first host of the cluster in ~/.config/sparkrun/clusters/NAME.yaml or "
            f"--hosts: {head}'s fabric IP, and a hostname that does not resolve to 127.0.1.1 "
            "in /etc/hosts), then `sparkrun stop` and run it again",
        )

    def _processes(self, name: str, probe: NodeProbe, now: float) -> None:
        """A serving process seen and gone in a running container is a dead rank; none
        at all is one once the launcher is dead (attached: after ``MISSING_LIMIT_S``)."""
        kinds = probe.kinds
        lost_kinds = self.serving.get(name, set()) - kinds
        self.serving[name] = self.serving.get(name, set()) | kinds
        if kinds:
            self.idle_since.pop(name, None)
        else:
            self.idle_since.setdefault(name, now)
        idle = now - self.idle_since.get(name, now)
        container = self.spec.container_on(name)
        if lost_kinds and self._may_blame(name):
            what = " and ".join(f"`{PROCESS_NAMES[k]}`" for k in sorted(lost_kinds))
            self._rank_dead(
                name,
                f"{what} exited inside the running container {container!r} "
                f"(docker top lists no {' or '.join(sorted(lost_kinds))} process)",
                f"vLLM (or Ray) on {name} died and the container stays up (its PID 1 is "
                "`sleep infinity`, or earlyoom): its log tail below says why; restart the "
                "cluster (launch-cluster.sh stop, then launch again)",
            )
        elif (
            not kinds
            and (
                self.launcher_exited
                or (self.spec.launcher_pid is None and idle > self._idle_limit(name, probe))
            )
            and self._may_blame(name)
        ):
            if self._never_started(name, probe):
                self._rank_dead(
                    name,
                    f"the container is up but its vllm serve never started (sparkrun#292): "
                    f"measured: no vllm process in the running container {container!r} for "
                    f"{idle:.0f} s and its serve log {self.spec.serve_log} empty or absent; "
                    "expected: a `vllm serve` rank exec'd into every job container",
                    f"sparkrun left {container} on its PID 1 `sleep infinity` without exec'ing "
                    "vllm serve: `sparkrun stop` and run the job again; if it recurs, check the "
                    "exec'd command (`sparkrun -vvv run RECIPE --dry-run`) and the run's output "
                    f"on {name}",
                )
                return
            self._rank_dead(
                name,
                f"no vllm or ray process in the running container {container!r}"
                + (
                    " and the launcher has exited"
                    if self.launcher_exited
                    else f" for {idle:.0f} s (limit {MISSING_LIMIT_S:.0f} s)"
                ),
                f"the container on {name} runs but nothing serves in it: the launcher's "
                "`docker exec` of vLLM (or Ray) failed or it died before this wait; "
                "its log tail below says why; restart the cluster",
            )

    def _idle_limit(self, name: str, probe: NodeProbe) -> float:
        """How long an attached rank's running container may show no serving process: a
        sparkrun rank whose serve never started is called at half the hang timeout (at
        most ``MISSING_LIMIT_S``), before its peers' wait for it reads as their stall."""
        if self._never_started(name, probe):
            return min(MISSING_LIMIT_S, self.spec.hang_timeout / 2)
        return MISSING_LIMIT_S

    def _never_started(self, name: str, probe: NodeProbe) -> bool:
        """A sparkrun rank whose serve never started: no serving process ever seen in its
        container and nothing ever read from its serve log (absent or empty), as against
        one that died (its log has lines, its process is gone)."""
        return (
            self.spec.serve_log is not None
            and not self.serving.get(name)
            and self.serve_offsets.get(name, 0) == 0
            and not probe.log_text.strip()
        )

    def _health(self, health: str, probes: Mapping[str, NodeProbe]) -> None:
        """/health answers but not 200: 5xx is a dead engine (its gone or empty rank named
        when one is seen; while STARTING, a node not started yet is why); no curl on the
        head is a verdict of its own."""
        watch = self.watch
        if health[:1] == "5":
            gone = [
                (name, p.status)
                for name, p in probes.items()
                if p.status.startswith(("exited", "dead"))
                or (p.status == "missing" and (self.spec.launcher_pid is None or name in self.seen))
            ]
            # Attached: a container that runs (sleep infinity) with nothing serving in it
            # while /health answers 5xx is the dead rank (launching, it may wait for its
            # docker exec).
            empty = (
                [n for n in self.idle_since if n not in self.retrying]
                if self.spec.launcher_pid is None
                else []
            )
            if empty and not gone and self._may_blame(empty[0]):
                self._rank_dead(
                    empty[0],
                    "no vllm or ray process in the running container "
                    f"{self.spec.container_on(empty[0])!r}; /health answers {health}",
                    f"the rank on {empty[0]} is gone (its container stays up: it runs `sleep "
                    "infinity`), so the engine is dead: its log tail below says why; restart "
                    "the cluster",
                )
            if gone and self._may_blame(gone[0][0]):
                name, status = gone[0]
                watch.failure = self.dead = StartupFailure(
                    "exited",
                    name,
                    f"container {self.spec.container_on(name)} {status}; /health answers {health}",
                    "",
                    f"the TP rank on {name} is gone, so the engine is dead: "
                    f"`docker logs` on {name} (if the container is kept) and the head's log "
                    f"say why; restart the cluster{self._peer_note()}",
                    watch.snapshot_tails(),
                )
            # While launching, a node not started yet is why the engine is not up: wait for
            # it (the launcher dying, or the node staying missing, fails above).
            if watch.failure is None and self.stage is not Stage.STARTING:
                watch.failure = StartupFailure(
                    "fatal",
                    self.head.name,
                    f"engine unhealthy: /health answers {health}",
                    "",
                    "the API server is up but its engine is dead (a TP rank died: a worker "
                    "container crashed or its link dropped); the log tails below say which "
                    "node; restart the cluster",
                    watch.snapshot_tails(),
                )
        elif health == "nocurl" and watch.failure is None:
            watch.failure = StartupFailure(
                "exited",
                self.head.name,
                "curl not found on the head",
                "",
                "install curl on the head node (the readiness probe asks /health there)",
                watch.snapshot_tails(),
            )

    def _limits(self, now: float) -> None:
        """Silence (``hang_timeout``, only while the head's log is visible and no node is
        being retried), a placement group not formed (``placement_timeout``), and the
        whole wait (``ready_timeout``)."""
        if not self.retrying and self.spec.head_log_visible:
            self.watch.check_stall(now)
        if self.watch.failure is None and now - self.started >= self.spec.ready_timeout:
            self.watch.failure = StartupFailure(
                "timeout",
                None,
                f"not ready after {self.spec.ready_timeout:.0f} s (phase {self.watch.phase})",
                "",
                "raise --spark-ready-timeout if the load is progressing, else read the log tails",
                self.watch.snapshot_tails(),
            )


def wait_ready(
    cluster: Cluster,
    spec: WaitSpec,
    *,
    progress: Callable[[StartupWatch, float], None] | None = None,
    notify: Callable[[str], None] | None = None,
    clock: Clock = REAL_CLOCK,
    retry: Backoff | None = None,
    follow: bool = True,
) -> StartupWatch:
    """Return the watch once the head's /health answers 200; raise StartupFailed otherwise.

    ``spec``: what to watch and the limits (:class:`WaitSpec`). ``progress``: called after
    each poll that settles nothing; ``notify``: one-off notes for the operator. ``clock``:
    the one time source (``now`` for every limit, ``sleep`` between polls); ``retry``: the
    back-off for a node that does not answer (default: the connection's); ``follow``: sleep
    on the head's /health followed from the head between polls (False: the poll alone, the
    benchmark's before)."""
    serving_nodes = list(spec.nodes) if spec.nodes else list(cluster.nodes)
    if cluster.head not in serving_nodes:
        serving_nodes.insert(0, cluster.head)
    wait = ReadinessWait(
        cluster.head,
        serving_nodes,
        spec,
        clock.now(),
        retry or for_connection(cluster.settings.connect_timeout, PROBE_TIMEOUT_S),
        notify,
    )

    def probe(node: Node) -> NodeProbe:
        result = node.run(wait.command(node), timeout=PROBE_TIMEOUT_S)
        return parse_probe(result, node is cluster.head)

    # Between polls the wait sleeps on the head's /health followed from the head (ready
    # seen within ~0.1 s, pytest_spark.readiness.follow), on the real clock; a test's
    # clock, and the polls after the follower saw 200 once, sleep the poll interval.
    followed = follow and clock is REAL_CLOCK
    follower = (
        HealthFollower(
            cluster.head, spec.port, lambda: wait.command(cluster.head, processes=False)
        ).start()
        if followed
        else None
    )
    stop_follower = follower
    try:
        while True:
            tick = clock.now()
            if follower is not None and follower.result is not None:
                # /health turned 200: the head's poll taken by the follower at that moment
                # (its last log lines, container, processes) is this poll's head answer.
                results: dict[str, Outcome] = {
                    cluster.head.name: parse_probe(follower.result, with_health=True)
                }
                follower = None
            else:
                results = cluster.map(probe, wait.due(tick))
            for name, outcome in results.items():
                if isinstance(outcome, RemoteError):
                    cluster.node(name).conn.close()  # the next attempt connects afresh
            now = clock.now()
            stage = wait.observe(results, now)
            if stage is Stage.READY:
                return wait.watch
            if stage is Stage.FAILED:
                assert wait.watch.failure is not None
                raise StartupFailed(wait.watch.failure, wait.watch)
            if progress is not None:
                progress(wait.watch, now)
            remaining = max(0.0, spec.poll_s - (clock.now() - tick))
            if follower is not None:
                follower.wait(remaining)  # wakes the moment /health turns 200
            else:
                clock.sleep(remaining)
    finally:
        if stop_follower is not None:
            stop_follower.stop()
