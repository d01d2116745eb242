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
the last error and what to check. Silence while a node is being retried is not a hang."""

from __future__ import annotations

import shlex
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from pytest_spark.cluster import Cluster, Node
from pytest_spark.remote.base import CommandResult, RemoteError
from pytest_spark.remote.retry import Backoff, RetryState, for_connection
from pytest_spark.startup import StartupFailure, StartupWatch

SEP = "__PYTEST_SPARK_PROBE__"
POLL_S = 0.5
PROBE_TIMEOUT_S = 15.0


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


def probe_command(
    container: str,
    since: str,
    port: int | None,
    launcher_pid: int | None,
    launcher_log: str | None = None,
    log_offset: int = 0,
) -> str:
    """One round trip: [health], container state, new container log lines, [new launcher
    output], [launcher alive]. Sections are marked ``SEP name``."""
    c = shlex.quote(container)
    parts = []
    if port is not None:
        parts.append(
            f"echo {SEP} health; if command -v curl >/dev/null; then curl -s -o "
            f"/dev/null -m 2 -w '%{{http_code}}' http://127.0.0.1:{int(port)}/health;"
            " else echo nocurl; fi; echo"
        )
    parts.append(
        f"echo {SEP} state; docker inspect -f '{{{{.State.Status}}}} "
        f"{{{{.State.ExitCode}}}}' {c} 2>&1 | grep . | head -n 1"
    )
    parts.append(
        f"echo {SEP} logs; docker logs --timestamps --since {shlex.quote(since)} {c} "
        "2>&1 | tail -n 2000"
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
    if not state or "No such object" in state or "No such container" in state:
        status = "missing"
    elif state.startswith(("running", "created", "restarting")):
        status = state.split()[0]
    elif state.startswith(("exited", "dead")):
        parts = state.split()
        status = f"{parts[0]} (code {parts[1]})" if len(parts) > 1 else parts[0]
    else:
        status = f"unknown: {state[:200]}"
    if status == "missing" or status.startswith("unknown"):
        logs = ""  # docker's own "No such container" error, not the container's log
    return NodeProbe(health, status, split_segments(logs), alive, sections.get("launcher", ""))


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


def wait_ready(
    cluster: Cluster,
    *,
    container: str,
    port: int,
    ready_timeout: float,
    hang_timeout: float,
    placement_timeout: float,
    since: str | None = None,
    launcher_pid: int | None = None,
    launcher_log: Callable[[], str] | None = None,
    launcher_log_path: str | None = None,
    progress: Callable[[StartupWatch, float], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    retry: Backoff | None = None,
    notify: Callable[[str], None] | None = None,
) -> StartupWatch:
    """Return the watch once the head's /health answers 200; raise StartupFailed otherwise."""
    start = clock()
    policy = retry or for_connection(cluster.settings.connect_timeout, PROBE_TIMEOUT_S)
    retrying: dict[str, RetryState] = {}
    watch = StartupWatch(hang_timeout, placement_timeout, start)
    since = since or remote_now(cluster.head)
    cursors = {node.name: LogCursor(since) for node in cluster.nodes}
    missing_since: dict[str, float] = {}
    # Nodes whose serving container has been seen: while launching, a container not yet
    # seen is not yet started (the launcher starts the nodes one after another), not gone.
    seen: set[str] = set()
    # The head's probe found the launcher dead in an earlier poll (not this one: a worker's
    # probe races the head's), so a container still missing will not come, on any node.
    launcher_exited = False
    for node in cluster.nodes:
        watch.node_seen(node.name)

    offset = {"bytes": 0}
    launcher_name = f"{cluster.head.name} (launcher)"

    def probe(node: Node) -> NodeProbe:
        is_head = node is cluster.head
        cmd = probe_command(
            container,
            cursors[node.name].since,
            port if is_head else None,
            launcher_pid if is_head else None,
            launcher_log_path if is_head else None,
            offset["bytes"],
        )
        return parse_probe(node.run(cmd, timeout=PROBE_TIMEOUT_S), is_head)

    def lost(node: Node, error: RemoteError, now: float) -> None:
        state = retrying.get(node.name)
        if state is None:
            state = retrying[node.name] = RetryState(policy, now, str(error))
        node.conn.close()  # the next attempt connects afresh (a clean timeout or refusal)
        delay = None if node._error is not None else state.failed(now, str(error))
        if delay is not None:
            if notify is not None:
                notify(
                    f"lost connection to {node.name}, retry {state.retries}/{policy.attempts} "
                    f"in {delay:g} s ({error})"
                )
            return
        if watch.failure is None:
            tried = f"{state.retries} retries over {now - state.started:.0f} s"
            watch.failure = StartupFailure(
                "unreachable",
                node.name,
                f"no SSH connection after {tried}; last error: {state.last_error}",
                "",
                f"{node.name} stopped answering over SSH while the cluster was starting: "
                f"check its power, its management link ({node.conn.target.describe()}, "
                "ping it from here) and that sshd runs on it",
                watch.snapshot_tails(),
            )

    def back(node: Node, now: float) -> None:
        state = retrying.pop(node.name, None)
        if state is None:
            return
        watch.last_activity = max(watch.last_activity, now)  # silence while gone: no hang
        if notify is not None:
            notify(
                f"{node.name} answers again after {now - state.started:.1f} s "
                f"({state.retries} {'retry' if state.retries == 1 else 'retries'})"
            )

    while True:
        tick = clock()
        due = [n for n in cluster.nodes if n.name not in retrying or retrying[n.name].due(tick)]
        results = cluster.map(probe, due)
        now = clock()
        head_health = None
        for name, outcome in results.items():
            node = cluster.node(name)
            if isinstance(outcome, RemoteError):
                lost(node, outcome, now)
                continue
            back(node, now)
            watch.feed(name, cursors[name].new_lines(outcome.lines), now)
            if outcome.launcher_output:
                # The launcher's own output (vLLM's log when `exec` runs in the foreground).
                text = outcome.launcher_output
                offset["bytes"] += len(text.encode())
                complete, _, _rest = text.rpartition("\n")
                offset["bytes"] -= len(_rest.encode())
                lines = [
                    seg for raw in complete.splitlines() for seg in raw.split("\r") if seg.strip()
                ]
                watch.feed(launcher_name, lines, now)
            if outcome.status.startswith(("exited", "dead")):
                watch.container_exited(name, f"container {container} {outcome.status}", now)
            elif outcome.status == "missing":
                missing_since.setdefault(name, now)
                launcher_dead = (
                    outcome.launcher_alive is False
                    or launcher_exited
                    or (launcher_pid is None and now - start > 5)
                )
                if (launcher_dead or now - missing_since[name] > max(hang_timeout, 30)) and (
                    watch.failure is None
                ):
                    log = launcher_log() if launcher_log else ""
                    watch.failure = StartupFailure(
                        "exited",
                        name,
                        f"no container named {container!r}",
                        log.strip().splitlines()[-1] if log.strip() else "",
                        "the launcher did not start the container on this node: read the "
                        "launcher output below (SSH from head to workers, image present, "
                        "docker running)",
                        {**watch.snapshot_tails(), "launcher": log.splitlines()[-15:]},
                    )
            else:
                missing_since.pop(name, None)
            if outcome.status != "missing":
                seen.add(name)
            if outcome.health is not None:
                head_health = outcome.health
        launcher_exited = launcher_exited or any(
            isinstance(o, NodeProbe) and o.launcher_alive is False for o in results.values()
        )
        if head_health == "200":
            watch.mark_ready(now)
            return watch
        gone = [
            (name, o.status)
            for name, o in results.items()
            if isinstance(o, NodeProbe)
            and (
                o.status.startswith(("exited", "dead"))
                or (o.status == "missing" and (launcher_pid is None or name in seen))
            )
        ]
        if head_health and head_health[0] == "5" and gone and watch.failure is None:
            name, status = gone[0]
            watch.failure = StartupFailure(
                "exited",
                name,
                f"container {container} {status}; /health answers {head_health}",
                "",
                f"the TP rank on {name} is gone, so the engine is dead: "
                f"`docker logs` on {name} (if the container is kept) and the head's log say "
                "why; restart the cluster",
                watch.snapshot_tails(),
            )
        # While launching, a node not started yet is why the engine is not up: wait for it
        # (the launcher dying, or the node staying missing, fails above).
        starting = launcher_pid is not None and any(n.name not in seen for n in cluster.nodes)
        if head_health and head_health[0] == "5" and watch.failure is None and not starting:
            watch.failure = StartupFailure(
                "fatal",
                cluster.head.name,
                f"engine unhealthy: /health answers {head_health}",
                "",
                "the API server is up but its engine is dead (a TP rank died: a worker "
                "container crashed or its link dropped); the log tails below say which "
                "node; restart the cluster",
                watch.snapshot_tails(),
            )
        if head_health == "nocurl" and watch.failure is None:
            watch.failure = StartupFailure(
                "exited",
                cluster.head.name,
                "curl not found on the head",
                "",
                "install curl on the head node (the readiness probe asks /health there)",
                watch.snapshot_tails(),
            )
        if not retrying:
            watch.check_stall(now)
        if watch.failure is None and now - start >= ready_timeout:
            watch.failure = StartupFailure(
                "timeout",
                None,
                f"not ready after {ready_timeout:.0f} s (phase {watch.phase})",
                "",
                "raise --spark-ready-timeout if the load is progressing, else read the log tails",
                watch.snapshot_tails(),
            )
        if watch.failure is not None:
            raise StartupFailed(watch.failure, watch)
        if progress is not None:
            progress(watch, now)
        time.sleep(max(0.0, POLL_S - (clock() - tick)))
