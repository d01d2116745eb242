"""The sweeps run in the all-reduce's launch: all-gather bus bandwidth and small-message
latency.

Pure: parsed nccl-tests output (:mod:`pytest_spark.infra.nccl.parse`) and profile thresholds in,
:class:`Finding` out. Thresholds (``collectives.*`` in the profile):

- ``all_gather_busbw_ratio``: all_gather's busbw floor as a share of ``nccl.min_busbw_gbps``
  (nccl-tests' all-gather busbw is algbw * (n-1)/n, comparable with all-reduce's
  2(n-1)/n figure; two Sparks measure a little lower at 1 GiB, fixtures/nccl/);
- ``max_latency_us``: the best time of the 8 B..``latency_max_bytes`` all-reduce sweep.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_spark.infra.finding import Finding
from pytest_spark.infra.nccl.check import FABRIC_DEVS, _fig, _how, _size, check_busbw
from pytest_spark.infra.nccl.parse import NcclOutput, NetTransport

__all__ = [
    "LatencyPoint",
    "LatencySeries",
    "all_gather_floor",
    "check_all_gather",
    "check_latency",
    "latency_series",
]


def all_gather_floor(profile: Any) -> float:
    """The all-gather busbw floor (GB/s): the all-reduce floor times the profile's ratio."""
    return float(profile.nccl.min_busbw_gbps) * float(profile.collectives.all_gather_busbw_ratio)


def check_all_gather(
    output: NcclOutput,
    profile: Any,
    *,
    where: str = "cluster",
    transports: Sequence[NetTransport] = (),
    fabric_devs: Sequence[str] = FABRIC_DEVS,
) -> Finding:
    """all_gather busbw at the largest size >= :func:`all_gather_floor`, no wrong elements."""
    floor = round(all_gather_floor(profile), 4)
    if output.collective and not output.collective.startswith("all_gather"):
        return Finding.failed(
            output.collective,
            "all_gather_perf",
            node=where,
            message=f"{where}: the all-gather sweep's output is {output.collective}'s, expected "
            "all_gather_perf's: the nccl-tests build or the shipped script ran the wrong "
            "collective.",
        )
    wrong = [r for r in output.rows if r.wrong]
    if wrong:
        total = sum(r.wrong for r in wrong)
        return Finding.failed(
            total,
            0,
            "elements",
            node=where,
            message=f"{where}: all-gather returned {total} wrong elements at "
            f"{', '.join(_size(r.size_bytes) for r in wrong[:6])} ({_how(output)}), expected 0: "
            "data corrupted in flight or on a GPU. Look for Xid errors (dmesg, nvidia-smi -q) "
            "and fabric errors (ethtool -S ... | grep -i err), then rerun.",
        )
    return check_busbw(
        output,
        profile,
        where=where,
        transports=transports,
        fabric_devs=fabric_devs,
        collective="all-gather",
        minimum=floor,
    )


@dataclass(frozen=True)
class LatencyPoint:
    size_bytes: int
    time_us: float  # the better of out-of-place and in-place
    oop_us: float | None
    ip_us: float


@dataclass(frozen=True)
class LatencySeries:
    """Time versus message size of the small-message sweep, for the JSON and the plot."""

    tool: str
    backend: str | None
    points: tuple[LatencyPoint, ...]
    max_us: float | None  # the profile's ceiling, drawn on the plot

    @property
    def best(self) -> LatencyPoint | None:
        return min(self.points, key=lambda p: p.time_us) if self.points else None

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {
            "tool": self.tool,
            "backend": self.backend,
            "unit": "us",
            "max_latency_us": self.max_us,
            "best_latency_us": best.time_us if best else None,
            "points": [vars(p).copy() for p in self.points],
        }


def latency_series(output: NcclOutput, max_us: float | None = None) -> LatencySeries:
    points = tuple(
        LatencyPoint(
            r.size_bytes,
            min(t.time_us for t in r.timings),
            r.out_of_place.time_us if r.out_of_place else None,
            r.in_place.time_us,
        )
        for r in sorted(output.rows, key=lambda r: r.size_bytes)
    )
    return LatencySeries(output.tool, output.backend, points, max_us)


def _us(value: float) -> str:
    return f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def check_latency(output: NcclOutput, profile: Any, *, where: str = "cluster") -> Finding:
    """The best all-reduce time of the small-message sweep <= ``collectives.max_latency_us``.
    The best of every size and both placements: load on a node only adds time, so a
    figure above the ceiling means every message paid it."""
    limit = profile.collectives.max_latency_us
    series = latency_series(output, limit)
    best = series.best
    span = (
        f"{_size(series.points[0].size_bytes)}..{_size(series.points[-1].size_bytes)}"
        if series.points
        else "8 B..1 MiB"
    )
    if best is None:
        said = [*output.errors, *output.warnings][:4]
        return Finding.failed(
            None,
            limit,
            "us",
            bound="<=",
            node=where,
            message=f"{where}: the small-message latency sweep ({span}, {_how(output)}) "
            "produced no result rows, expected a time per size"
            + (f" <= {_fig(limit)} us" if limit is not None else "")
            + (". It said:\n" + "\n".join(said) if said else "."),
        )
    measured = round(best.time_us, 2)
    head = (
        f"{where}: small-message latency {_us(measured)} us (the best all-reduce time of "
        f"{span}, at {_size(best.size_bytes)}; {_how(output)})"
    )
    if limit is None:
        return Finding.passed(
            measured, None, "us", node=where, message=f"{head}; no ceiling in this profile"
        )
    if measured <= limit:
        return Finding.passed(
            measured,
            limit,
            "us",
            node=where,
            message=f"{head}, expected <= {_fig(limit)} us",
            bound="<=",
        )
    table = "\n".join(f"{_size(p.size_bytes):>10}  {_us(p.time_us):>9} us" for p in series.points)
    return Finding.failed(
        measured,
        limit,
        "us",
        bound="<=",
        node=where,
        message=f"{head}, expected <= {_fig(limit)} us. Every message size took at least "
        "that long, so it is a fixed cost per message, not bandwidth: a delay on the "
        "fabric path (a qdisc such as netem on a fabric interface: `tc qdisc show dev "
        "enp1s0f1np1`; a firewall rule queueing packets to a userspace program: "
        "`iptables -t mangle -S`; a switch hop; a congested or misconfigured switch port), or "
        "ranks talking over another network than the fabric. `ping -I enp1s0f1np1 PEER` "
        "between the nodes should be well under 0.1 ms on a direct RoCE link.",
        evidence={"latency series": table},
    )
