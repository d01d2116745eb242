"""What one poll's containers, processes and /health say about the ranks, and the wait's
time limits: a container exited or missing, a serving process seen and gone (or never
started), a loopback ``--master-addr`` on a multi-node job, /health answering 5xx, silence,
a placement group not formed, the whole wait. Each sets the watch's verdict (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from pytest_spark.readiness.parse import loopback_master
from pytest_spark.readiness.probe import PROCESS_NAMES, NodeProbe
from pytest_spark.readiness.waitstate import (
    ATTACH_MISSING_S,
    MISSING_LIMIT_S,
    Stage,
    WaitState,
)
from pytest_spark.readiness.watch import StartupFailure


class RankVerdicts(WaitState):
    """The verdicts of one poll over the wait's state (module docstring)."""

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
