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
head-exit file when it has one (``WaitSpec.launcher_exit_file``: launch-cluster.sh since
2026-09-15 writes the head command's ``$?`` to ``/tmp/.launch-cluster-head-exit`` when it
exits, and deletes it once read): an authoritative exit status for the verdict.

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
from collections.abc import Callable, Mapping
from dataclasses import replace

from pytest_spark.access.base import RemoteError
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.access.retry import Backoff, RetryState, for_connection
from pytest_spark.readiness.clock import REAL_CLOCK, Clock
from pytest_spark.readiness.follow import HealthFollower
from pytest_spark.readiness.parse import exit_status_text, parse_probe, vllm_output
from pytest_spark.readiness.probe import (
    PROBE_TIMEOUT_S,
    SINCE_START,
    NodeProbe,
    probe_command,
)
from pytest_spark.readiness.verdicts import RankVerdicts
from pytest_spark.readiness.vllm_log import CONSEQUENCES
from pytest_spark.readiness.waitstate import Outcome, Stage, StartupFailed, WaitSpec
from pytest_spark.readiness.watch import StartupFailure, StartupWatch


class ReadinessWait(RankVerdicts):
    """The readiness wait's state and its transitions, without I/O: ``due`` says which
    nodes to probe now, ``command`` what to ask each, ``observe`` takes one poll's answers
    (with the clock's reading after it) and returns the stage they lead to. ``wait_ready``
    drives it with the probes and the clock."""

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
            sentinel=self.spec.launcher_exit_file if is_head and self.spec.launcher_pid else None,
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
        where = f"{self.spec.launcher_exit_file} in the container"
        return replace(
            failure, signature=f"{failure.signature}; {exit_status_text(self.head_exit)} ({where})"
        )

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
