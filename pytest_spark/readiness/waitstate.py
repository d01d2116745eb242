"""The readiness wait's data: what it watches (``WaitSpec``), where the stand-up is
(``Stage``), the verdict it raises (``StartupFailed``), and its state (``WaitState``: what
the polls have seen so far, and how a dead rank is blamed over what its peers print).
The verdicts are ``verdicts.RankVerdicts``'; the transitions ``wait.ReadinessWait``'s."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Node
from pytest_spark.access.retry import Backoff, RetryState
from pytest_spark.readiness.parse import LogCursor
from pytest_spark.readiness.probe import SINCE_START, NodeProbe
from pytest_spark.readiness.vllm_log import CONSEQUENCES
from pytest_spark.readiness.watch import StartupFailure, StartupWatch

# A poll runs `docker inspect`, `docker logs` and `docker top` on every serving node (and
# curl on the head): ~150 ms of CPU on each node (measured on sparksim). Each second, not
# each half, halves what the watch costs the nodes: a crash is seen within a second; /health
# turning 200 within ~0.1 s plus one poll (the head follows it between polls: follow.py).
POLL_S = 1.0
MISSING_LIMIT_S = 30.0  # a container still missing this long (at least hang_timeout) is gone
ATTACH_MISSING_S = 5.0  # attached: a container missing this long after the wait began is gone


class StartupFailed(Exception):
    def __init__(self, failure: StartupFailure, watch: StartupWatch) -> None:
        super().__init__(failure.message())
        self.failure = failure
        self.watch = watch


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
    # The launcher's head-exit file in the head's container (launch-cluster.sh's sentinel):
    # the head command's exit status, read while no vllm serve runs (None: none).
    launcher_exit_file: str | None = None
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
class WaitState:
    """The readiness wait's state, without I/O (``wait.ReadinessWait`` adds the transitions,
    ``verdicts.RankVerdicts`` what the containers, processes and /health say), and how a
    verdict is given: a dead rank over its peers' consequence lines (``_may_blame``), with
    its own log tail first (``_rank_dead``)."""

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

    def _node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

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
