"""Startup watch: turns every node's log lines and container state into a phase timeline,
progress, and a fail-fast verdict. Pure state machine (time is passed in), so it is tested
on recorded logs and driven live by ``readiness.wait_ready``."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from pytest_spark.readiness.vllm_log import (
    CONSEQUENCES,
    PHASES,
    REMEDIATION,
    ROOT_CAUSES,
    classify,
)

TAIL_LINES = 40
REPORT = "mem avail:"  # earlyoom's periodic memory report


@dataclass(frozen=True)
class StartupFailure:
    """Why the cluster will not become ready, with every node's last log lines."""

    kind: str  # fatal | exited | hang | stalled | timeout | unreachable
    node: str | None
    signature: str
    line: str
    remediation: str
    tails: dict[str, list[str]]

    def message(self) -> str:
        where = f" on {self.node}" if self.node else ""
        head = {
            "fatal": f"vLLM failed to start{where}: {self.signature}",
            "exited": f"serving container exited{where}: {self.signature}",
            "hang": f"vLLM startup hangs{where}: {self.signature}",
            "stalled": f"vLLM startup stalled{where}: {self.signature}",
            "timeout": f"vLLM not ready: {self.signature}",
            "unreachable": f"lost the node while waiting{where}: {self.signature}",
        }[self.kind]
        parts = [head]
        if self.line:
            parts.append(f"  log: {self.line.strip()}")
        parts.append(f"  fix: {self.remediation}")
        for node, tail in self.tails.items():
            parts.append(f"--- last {len(tail)} log lines of {node} ---")
            parts.extend(tail or ["(no output)"])
        return "\n".join(parts)


def _drop_older_report(tail: deque[str], raw: str) -> None:
    """A periodic report (earlyoom's ``mem avail: ...`` every -r seconds) keeps only its
    newest line in the tail, so that the reports do not push the ranks' lines out."""
    if raw.startswith(REPORT):
        for old in [line for line in tail if line.startswith(REPORT)]:
            tail.remove(old)


@dataclass
class Phase:
    name: str
    start: float
    end: float | None = None


@dataclass
class StartupWatch:
    hang_timeout: float
    placement_timeout: float
    started: float
    phases: list[Phase] = field(default_factory=list)
    progress: dict[str, tuple[int, int, str]] = field(default_factory=dict)
    facts: dict[str, str] = field(default_factory=dict)
    tails: dict[str, deque[str]] = field(default_factory=dict)
    failure: StartupFailure | None = None
    last_activity: float = 0.0
    # (node, signature) -> when the wait began, for hangs not yet resolved
    hang_since: dict[tuple[str, str], float] = field(default_factory=dict)
    hang_line: dict[tuple[str, str], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.phases.append(Phase("start", self.started))
        self.last_activity = self.started

    @property
    def phase(self) -> str:
        return self.phases[-1].name

    @property
    def ready(self) -> bool:
        return self.phase == "ready"

    def _advance(self, name: str, now: float) -> None:
        if PHASES.index(name) <= PHASES.index(self.phase):
            return
        self.phases[-1].end = now
        self.phases.append(Phase(name, now))

    def mark_ready(self, now: float) -> None:
        """The API answered: ready, whatever the log said last."""
        self._advance("ready", now)
        self.phases[-1].end = now

    def node_seen(self, node: str) -> None:
        self.tails.setdefault(node, deque(maxlen=TAIL_LINES))

    def feed(self, node: str, lines: list[str], now: float) -> None:
        tail = self.tails.setdefault(node, deque(maxlen=TAIL_LINES))
        for raw in lines:
            if not raw.strip():
                continue
            events = classify(raw)
            if events and all(event.kind == "monitor" for event in events):
                _drop_older_report(tail, raw)
            tail.append(raw.rstrip("\n"))
            # A monitor's line (earlyoom's memory report) is no sign that the load moves.
            if not events or any(event.kind != "monitor" for event in events):
                self.last_activity = now
            for event in events:
                self._event(node, event.kind, event.name, event.line, event.value, now)

    def _event(
        self, node: str, kind: str, name: str, line: str, value: dict[str, str], now: float
    ) -> None:
        if kind == "fatal" and self._may_replace(name):
            detail = value.get("detail")
            self.failure = StartupFailure(
                "fatal",
                node,
                f"{name}: {detail}" if detail else name,
                line,
                REMEDIATION[name],
                self.snapshot_tails(),
            )
        elif kind == "hang":
            self.hang_since.setdefault((node, name), now - float(value.get("s", 0)))
            self.hang_line[(node, name)] = line
            self._check_hangs(now)
        elif kind in ("phase", "progress"):
            self.hang_since.clear()  # the start moves on: the group has formed
        if kind == "progress":
            self._advance(name, now)
            self.progress[name] = (int(value["k"]), int(value["n"]), value.get("eta", "?"))
        elif kind == "phase":
            self._advance(name, now)
        elif kind == "fact":
            if name == "kv_size":
                self._advance("graphs", now)
            for key, val in value.items():
                self.facts[key if name == "version" else f"{name}.{key}"] = val

    def _may_replace(self, name: str) -> bool:
        """No verdict yet; or a root-cause line (earlyoom's kill) after a consequence's
        (EngineDeadError): a verdict ends the wait at the end of its poll, so both came
        in the same poll, and the root cause is the one failure."""
        failure = self.failure
        return failure is None or (
            name in ROOT_CAUSES and failure.kind == "fatal" and failure.signature in CONSEQUENCES
        )

    def _check_hangs(self, now: float) -> None:
        """A hang signature still pending after ``placement_timeout`` (counted from when the
        wait began, which the line tells) fails; vLLM prints the wait at growing intervals,
        so the budget is checked on every poll, not only when the line repeats. Only a wait
        that outlasts the budget is a hang: Ray waits while a worker joins, which is normal."""
        for (node, name), since in self.hang_since.items():
            if self.failure is None and now - since >= self.placement_timeout:
                self.failure = StartupFailure(
                    "hang",
                    node,
                    f"{name} (waiting {now - since:.0f} s, limit {self.placement_timeout:g} s:"
                    " the profile's readiness.placement_group_timeout_s)",
                    self.hang_line[(node, name)],
                    REMEDIATION[name],
                    self.snapshot_tails(),
                )

    def container_exited(self, node: str, status: str, now: float) -> None:
        if self.failure is None:
            self.failure = StartupFailure(
                "exited",
                node,
                status,
                "",
                "the container stopped: its last log lines below say why; `docker logs` on "
                "that node has the whole log",
                self.snapshot_tails(),
            )

    def check_stall(self, now: float) -> None:
        """No log line from any node for ``hang_timeout`` while loading: a silent hang; a
        placement group still not formed after ``placement_timeout``: a hang."""
        self._check_hangs(now)
        if (
            self.failure is None
            and not self.ready
            and now - self.last_activity >= self.hang_timeout
        ):
            self.failure = StartupFailure(
                "stalled",
                None,
                f"no log progress for {now - self.last_activity:.0f} s in phase {self.phase}"
                f" (limit {self.hang_timeout:g} s: --spark-hang-timeout)",
                "",
                "a collective or the model load is stuck: check the fabric link and both "
                "nodes' container logs; `py-spy dump` in the container shows where; if the "
                "load only goes slowly without printing, raise --spark-hang-timeout",
                self.snapshot_tails(),
            )

    def snapshot_tails(self) -> dict[str, list[str]]:
        return {node: list(tail)[-15:] for node, tail in self.tails.items()}

    def timeline(self) -> list[dict[str, float | str | None]]:
        """Phase records relative to the start of the wait, for reports and JSON."""
        return [
            {
                "phase": p.name,
                "start_s": round(p.start - self.started, 3),
                "end_s": None if p.end is None else round(p.end - self.started, 3),
            }
            for p in self.phases
        ]

    def status_line(self, now: float) -> str:
        elapsed = now - self.started
        text = f"vLLM startup: {self.phase:<8} {elapsed:6.0f} s"
        if self.phase in self.progress:
            k, n, eta = self.progress[self.phase]
            text += f"  {'shards' if self.phase == 'weights' else 'graphs'} {k}/{n}"
            if eta not in ("?", "00:00"):
                text += f"  eta {eta}"
        return text
