"""What an all-reduce run brought back: the launcher chosen (:class:`LaunchPlan`), every
rank's command and output (:class:`RankOutput`) and the whole run with rank 0's parsed result
(:class:`CollectiveRun`); the sweeps run in the same launch after the all-reduce (all_gather,
the small-message latency sweep) are rank 0's :class:`Section` entries. Plain data over the
parsed output: the runner (:mod:`pytest_spark.infra.nccl.runner_gather`) makes them, the checks
(:mod:`pytest_spark.infra.nccl.check`) read them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from pytest_spark.infra.nccl.parse import NcclOutput, NetTransport, Row


@dataclass(frozen=True)
class LaunchPlan:
    """The launcher chosen and why (one note per thing found or missing)."""

    launcher: Literal["python", "container", "nccl-tests"]
    container: str | Mapping[str, str] | None = None  # one name, or each node's (by name)
    binary: str | None = None  # all_reduce_perf path (nccl-tests)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Section:
    """One more sweep of the same launch (``all_gather``, ``latency``), parsed on its own."""

    name: str
    parsed: NcclOutput | None
    parse_error: str | None = None


@dataclass(frozen=True)
class SweepState:
    """One sweep of a running launch: its planned message sizes and the result rows rank 0
    has printed so far (in order: the last is the size reached)."""

    name: str  # all_reduce | all_gather | latency
    sizes: tuple[int, ...]
    rows: tuple[Row, ...] = ()


@dataclass(frozen=True)
class SweepProgress:
    """How far a launch has got, read from rank 0's output as it streams in (nccl-tests
    prints one row a message size, the shipped script too): ``elapsed_s`` since the ranks
    started, ``finished`` once they have all ended."""

    elapsed_s: float
    finished: bool
    sweeps: tuple[SweepState, ...]

    @property
    def done(self) -> int:
        return sum(min(len(s.rows), len(s.sizes)) for s in self.sweeps)

    @property
    def total(self) -> int:
        return sum(len(s.sizes) for s in self.sweeps)

    @property
    def current(self) -> SweepState | None:
        """The sweep running now: the last one that has printed a row."""
        return next((s for s in reversed(self.sweeps) if s.rows), None)


@dataclass(frozen=True)
class RankOutput:
    """One rank's command and what came back (``rc`` None: stopped by the runner)."""

    node: str
    rank: int
    command: str
    rc: int | None
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    parsed: NcclOutput | None = None
    parse_error: str | None = None
    sections: tuple[Section, ...] = ()  # the sweeps after the all-reduce, in order

    @property
    def output(self) -> str:
        return self.stdout + (f"\n{self.stderr}" if self.stderr.strip() else "")


@dataclass(frozen=True)
class CollectiveRun:
    """Every rank's output plus rank 0's parsed result."""

    launcher: str
    token: str
    world_size: int
    ranks: tuple[RankOutput, ...]
    result: NcclOutput | None
    timed_out: bool
    duration_s: float
    notes: tuple[str, ...] = ()
    cleanup_errors: tuple[str, ...] = field(default=())
    nodes: tuple[str, ...] = ()  # every node's name, rank order (mpirun: one output, N ranks)
    init_timeout_s: float | None = None  # each rank's own bound on initialisation
    timeout_s: float | None = None  # the whole run's bound

    collectives: tuple[str, ...] = ("all_reduce",)  # the sweeps asked for, in order
    capped: str | None = None  # why the sweep ran below the profile's sizes (memory guard)

    def section(self, name: str) -> Section | None:
        """Rank 0's sweep ``name`` (``all_gather``, ``latency``): None when not asked for;
        a Section without ``parsed`` when the output held none of it."""
        if name not in self.collectives:
            return None
        for sec in self.ranks[0].sections if self.ranks else ():
            if sec.name == name:
                return sec
        return Section(name, None, "no output for this sweep (the run ended before it)")

    @property
    def hang_timeout_s(self) -> float | None:
        """The bound that ended a run hung at initialisation: a rank's init timeout when
        one reported it, else the whole run's timeout (what a message must state)."""
        said_so = any(r.parsed is not None and r.parsed.init_timeout for r in self.ranks)
        if said_so and self.init_timeout_s is not None:
            return self.init_timeout_s
        return self.timeout_s

    @property
    def ok(self) -> bool:
        return (
            not self.timed_out
            and all(r.rc == 0 for r in self.ranks)
            and self.result is not None
            and bool(self.result.rows)
        )

    @property
    def hung_at_init(self) -> bool:
        """No result row, and the run timed out or a rank reported an init timeout."""
        if self.result is not None and self.result.rows:
            return False
        said_so = any(r.parsed is not None and r.parsed.init_timeout for r in self.ranks)
        return self.timed_out or said_so

    @property
    def rank_nodes(self) -> dict[tuple[str, int], str]:
        """(hostname, pid) as NCCL prints them (``spark-2:26:26 [0] NCCL INFO``) -> the
        node's name in the suite (``spark-worker-1``), from the ``#  Rank N Pid P on HOST``
        lines and which node ran rank N."""
        node_of = dict(enumerate(self.nodes)) or {r.rank: r.node for r in self.ranks}
        found: dict[tuple[str, int], str] = {}
        for rank in self.ranks:
            for dev in rank.parsed.devices if rank.parsed else ():
                if dev.rank in node_of:
                    found.setdefault((dev.host, dev.pid), node_of[dev.rank])
        return found

    @property
    def transports(self) -> tuple[NetTransport, ...]:
        """Every ``NET/IB`` / ``NET/Socket`` choice printed by any rank, its ``host`` the
        node's name in the suite where known (the line keeps the hostname)."""
        names = self.rank_nodes
        seen: dict[str, NetTransport] = {}
        for rank in self.ranks:
            for t in rank.parsed.transports if rank.parsed else ():
                name = names.get((t.host, t.pid), t.host)
                seen.setdefault(t.line, replace(t, host=name))
        return tuple(seen.values())

    def log_lines(self, limit: int = 40) -> dict[str, list[str]]:
        """The last NCCL / gloo / script lines of every rank (for a diagnosis)."""
        pattern = re.compile(r"NCCL (INFO|WARN)|pytest_spark|gloo|Gloo|Error|error|Traceback")
        lines: dict[str, list[str]] = {}
        for rank in self.ranks:
            picked = [ln for ln in rank.output.splitlines() if pattern.search(ln)]
            lines[f"rank {rank.rank} ({rank.node})"] = picked[-limit:]
        return lines

    def evidence(self, limit: int = 6000) -> str:
        parts = [f"launcher {self.launcher}, token {self.token}", *self.notes]
        for rank in self.ranks:
            status = "timed out" if rank.timed_out else f"exit {rank.rc}"
            parts.append(
                f"--- rank {rank.rank} on {rank.node} ({status}, "
                f"{rank.duration_s:.1f} s)\n$ {rank.command[:300]}\n{rank.output}"
            )
        text = "\n".join(parts)
        return text if len(text) <= limit else text[: limit - 20] + "\n... (truncated)"
