"""Fabric error counters (issue #28 part 4): any rise of a ConnectX port's error counter
or its link-down count while the suite's traffic ran fails, naming the port, the counter,
its readings and the fix. Pure: the readings (:mod:`pytest_spark.infra.counters.gather`)
in, a :class:`Finding` or a :class:`Skip` out.

Decisions: the counters are cumulative (a non-zero baseline after a link-up is normal),
so only a rise counts; the windows are the all-reduce run and the throughput sweep, read
around each (this check runs with the throughput category, after its sweep; an all-reduce
that did not run leaves the sweep's window alone). A flap during the run is this check's:
the link checks read the link before the traffic.
"""

from __future__ import annotations

from pytest_spark.infra.counters.parse import ETH_ERRORS, ROCE_ERRORS, rises
from pytest_spark.infra.counters.probe import Window
from pytest_spark.infra.finding import Finding, Skip

__all__ = ["CABLE_FIX", "COUNTERS_VERDICT", "check_fabric_counters"]

COUNTERS_VERDICT = "test_fabric_error_counters"
CABLE_FIX = (
    "reseat the QSFP cable of that port at both ends and clean its connectors; if the "
    "counter still rises, replace the cable (`ethtool -S PORT | grep -E 'link_down|crc|"
    "symbol'` shows them)"
)


def check_fabric_counters(node: str, windows: list[Window]) -> Finding | Skip:
    """No error counter of the node's fabric ports rose during any traffic window."""
    expected = "no fabric error counter rising during the suite's traffic"
    if not windows:
        return Skip(
            f"{node}: no traffic window was measured in this session (the all-reduce run "
            "and the throughput sweep did not run)"
        )
    risen: list[str] = []
    unread: list[str] = []
    compared = 0
    for w in windows:
        before, after = w.before.get(node), w.after.get(node)
        if before is None or after is None or isinstance(before, str) or isinstance(after, str):
            why = before if isinstance(before, str) else after if isinstance(after, str) else ""
            unread.append(f"{w.what}: {why or 'not read'}")
            continue
        if before.error or after.error:
            unread.append(f"{w.what}: {before.error or after.error}")
        for port in after.ports:
            was = before.port(port.netdev)
            if was is None:
                continue
            compared += 1
            where = f"{port.netdev} ({port.dev})"
            for name, b, a in rises(was.eth or {}, port.eth or {}, ETH_ERRORS):
                risen.append(f"{where} {name} {b} -> {a} (+{a - b}) during {w.what}")
            for name, b, a in rises(was.roce, port.roce, ROCE_ERRORS):
                risen.append(f"{where} RoCE {name} {b} -> {a} (+{a - b}) during {w.what}")
    spans = ", ".join(w.what for w in windows)
    if risen:
        flap = any("link_down_events_phy" in r for r in risen)
        return Finding.failed(
            len(risen),
            expected,
            "counters",
            node=node,
            evidence={"rises": "\n".join(risen)},
            message=(
                f"{node}: fabric error counters rose: {'; '.join(risen[:6])}"
                f"{f' (+{len(risen) - 6} more)' if len(risen) > 6 else ''}; expected {expected}"
                f"{' (the link went down and up: a flapping cable)' if flap else ''}. "
                f"Fix: {CABLE_FIX}"
            ),
        )
    if not compared:
        return Finding.warned(
            "not read",
            expected,
            node=node,
            message=(
                f"{node}: could not read the fabric counters around {spans} "
                f"({'; '.join(unread) or 'no port in both readings'}); expected to compare "
                "them. `ibdev2netdev` and `ethtool -S PORT` must work for the SSH user"
            ),
        )
    return Finding.passed(
        0,
        expected,
        "counters",
        node=node,
        message=f"{node}: no fabric error counter rose during {spans} ({compared} port readings)",
    )
