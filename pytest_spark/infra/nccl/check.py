"""Collective-bandwidth checks: all-reduce busbw, NCCL transport, NCCL_IB_HCA, data, hangs.

Pure: parsed nccl-tests output (:mod:`pytest_spark.infra.nccl.parse`) and profile thresholds in,
:class:`Finding` out. Thresholds (``nccl.*`` in the profile):

- ``min_busbw_gbps``: the large-message busbw floor (21.875 GB/s = 175 Gb/s, NVIDIA's
  ``MIN_NCCL_TEST_BW``); read from the largest size, the better of out-of-place/in-place;
- ``one_twin_busbw_gbps`` (~13.5) and ``socket_busbw_gbps`` (~3): the two failure
  signatures a low figure is read against (community reports, REFERENCE §3).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pytest_spark.infra.finding import Finding
from pytest_spark.infra.nccl.parse import NcclOutput, NetTransport, parse_ib_hca
from pytest_spark.infra.nccl.signature_check import low_busbw_why

if TYPE_CHECKING:
    from pytest_spark.infra.nccl.probe import CollectiveRun

__all__ = [
    "CONTAINER_VERDICT",
    "FABRIC_DEVS",
    "LAUNCH_VERDICT",
    "BusbwPoint",
    "BusbwSeries",
    "TransportReading",
    "allreduce_unavailable",
    "busbw_series",
    "check_busbw",
    "check_collective",
    "check_ib_hca",
    "check_init_hang",
    "check_transport",
    "check_wrong_values",
    "read_transport",
]

FABRIC_DEVS = ("rocep1s0f1", "roceP2p1s0f1")
FABRIC_IFS = ("enp1s0f1np1", "enP2p1s0f1np1")
# The check whose failure says why the all-reduce could not run at all (no launcher on
# every node); the other NCCL checks skip citing it.
LAUNCH_VERDICT = "test_allreduce_does_not_hang_at_init"
CONTAINER_VERDICT = "test_serving_container_running"


def _gb(value: float) -> str:
    """A measured figure: 2 decimals, or 3 significant digits below 1 GB/s (sim scale)."""
    return f"{value:.3g}" if value < 1 else f"{value:.2f}"


def _fig(value: float) -> str:
    """A threshold as the profile wrote it (21.875, 13.5, 0.2)."""
    return f"{value:g}"


def _size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def allreduce_unavailable(
    why: str,
    states: Mapping[str, str],
    container: str,
    *,
    container_verdict: bool,
    owner_here: bool,
    owner_in_session: bool,
) -> tuple[bool, str]:
    """What a NCCL check says when the all-reduce could not run (``why``): ``(fail,
    text)``, a failure when ``fail`` else a skip reason.

    ``states`` is each serving node's ``docker inspect`` state of the serving container
    ("" where there is none). The benchmark runs where torch lives, the serving container:
    a rank whose container is gone while another node's is there (the launcher's stack)
    is the container check's failure, and every NCCL check skips citing it. Otherwise one
    check owns the failure (:data:`LAUNCH_VERDICT`, or each check when it is not in the
    session) and the others skip citing it: no launcher anywhere is one cause."""
    gone = [node for node, state in states.items() if state != "running"]
    if gone and container_verdict and len(gone) < len(states):
        cites = ", ".join(
            f"{CONTAINER_VERDICT}[{node}]: {container!r} {states[node] or 'missing'}"
            for node in gone
        )
        return False, (
            f"the all-reduce could not run: the serving container, where torch and NCCL "
            f"live, is gone on {', '.join(gone)} ({cites} has the evidence)"
        )
    if owner_here or not owner_in_session:
        return True, f"all-reduce could not run: {why}"
    headline = why if len(why) <= 240 else why[:237] + "..."
    return False, f"the all-reduce could not run: {headline} ({LAUNCH_VERDICT} has the evidence)"


def _how(output: NcclOutput) -> str:
    if output.tool == "nccl-tests":
        return "nccl-tests"
    return f"{output.tool} over {output.backend or 'gloo'}"


# ------------------------------------------------------------------------------ series


@dataclass(frozen=True)
class BusbwPoint:
    size_bytes: int
    busbw_gbps: float
    algbw_gbps: float
    oop_busbw_gbps: float | None
    ip_busbw_gbps: float
    time_us: float
    wrong: int


@dataclass(frozen=True)
class BusbwSeries:
    """busbw versus message size of one run, for the JSON results and the report's plot."""

    tool: str
    backend: str | None
    points: tuple[BusbwPoint, ...]
    avg_busbw_gbps: float | None

    @property
    def largest(self) -> BusbwPoint | None:
        return self.points[-1] if self.points else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "backend": self.backend,
            "unit": "GB/s",
            "avg_busbw_gbps": self.avg_busbw_gbps,
            "largest_busbw_gbps": self.largest.busbw_gbps if self.largest else None,
            "points": [vars(p).copy() for p in self.points],
        }


def busbw_series(output: NcclOutput) -> BusbwSeries:
    points = tuple(
        BusbwPoint(
            r.size_bytes,
            r.busbw_gbps,
            r.algbw_gbps,
            r.out_of_place.busbw_gbps if r.out_of_place else None,
            r.in_place.busbw_gbps,
            r.in_place.time_us,
            r.wrong,
        )
        for r in sorted(output.rows, key=lambda r: r.size_bytes)
    )
    return BusbwSeries(output.tool, output.backend, points, output.avg_busbw_gbps)


# ------------------------------------------------------------------------------ checks


def check_busbw(
    output: NcclOutput,
    profile: Any,
    *,
    where: str = "cluster",
    transports: Sequence[NetTransport] = (),
    fabric_devs: Sequence[str] = FABRIC_DEVS,
    collective: str = "all-reduce",
    minimum: float | None = None,
) -> Finding:
    """Large-message busbw >= ``nccl.min_busbw_gbps`` (or ``minimum``); a low figure gets
    its likely cause, read against the transport each rank chose (``transports``) where
    known. ``collective`` names the sweep in the message (``all-gather``: busbw is nccl-tests'
    algbw * (n-1)/n there, so the same signatures read the same)."""
    minimum = profile.nccl.min_busbw_gbps if minimum is None else minimum
    row = output.largest
    if row is None:
        return _no_rows(output, minimum, where, collective)
    busbw = round(row.busbw_gbps, 4)
    head = (
        f"{where}: {collective} busbw {_gb(busbw)} GB/s at {_size(row.size_bytes)} ({_how(output)})"
    )
    if busbw >= minimum:
        return Finding.passed(
            busbw,
            minimum,
            "GB/s",
            node=where,
            message=f"{head}, expected >= {_fig(minimum)} GB/s",
            bound=">=",
        )
    why = low_busbw_why(
        busbw, profile, backend=output.backend, transports=transports, fabric_devs=fabric_devs
    )
    evidence = {"busbw series": _series_text(output)}
    if transports:
        evidence["NCCL transport lines"] = "\n".join(t.line for t in transports)
    return Finding.failed(
        busbw,
        minimum,
        "GB/s",
        bound=">=",
        node=where,
        message=f"{head}, expected >= {_fig(minimum)} GB/s. {why}",
        evidence=evidence,
    )


def _no_rows(output: NcclOutput, minimum: float, where: str, collective: str) -> Finding:
    """A sweep without one result row: what it said instead, or the likely hang."""
    said = [*output.errors, *output.warnings][:4]
    return Finding.failed(
        None,
        minimum,
        "GB/s",
        bound=">=",
        node=where,
        message=f"{where}: {collective} produced no result rows ({_how(output)}), expected "
        f"busbw >= {_fig(minimum)} GB/s. "
        + (
            "It said:\n" + "\n".join(said)
            if said
            else "A run that stops before its first row usually hung at NCCL initialisation."
        ),
    )


def _series_text(output: NcclOutput) -> str:
    return "\n".join(
        f"{_size(r.size_bytes):>10}  busbw {r.busbw_gbps:8.3f} GB/s"
        for r in sorted(output.rows, key=lambda r: r.size_bytes)
    )


@dataclass(frozen=True)
class TransportReading:
    """What the ranks' transport lines say, decided (the words come in :func:`check_transport`).

    ``kind``: ``none`` (no line), ``socket`` (a rank on NET/Socket), ``foreign`` (a rank on a
    device off the fabric), ``missing`` (a rank without every fabric device), ``oob`` (NET/IB,
    but the bootstrap off the fabric) or ``ib`` (as expected). ``rank``: the first rank that
    decided a failure; ``names``: what is at fault (interfaces off the fabric for ``socket``,
    devices for ``foreign`` and ``missing``, ``host:interface`` for ``oob``)."""

    kind: Literal["none", "socket", "foreign", "missing", "oob", "ib"]
    rank: NetTransport | None = None
    names: tuple[str, ...] = ()


def read_transport(
    transports: Sequence[NetTransport], fabric_devs: Sequence[str], fabric_ifs: Sequence[str]
) -> TransportReading:
    """Every rank on NET/IB over all the fabric devices, bootstrapping on the fabric?"""
    if not transports:
        return TransportReading("none")
    for t in transports:
        if t.kind == "Socket":
            off = tuple(i.name for i in t.socket_ifaces if i.name not in fabric_ifs)
            return TransportReading("socket", t, off)
    for t in transports:
        foreign = tuple(d for d in t.devices if d not in fabric_devs)
        if foreign:
            return TransportReading("foreign", t, foreign)
        missing = tuple(d for d in fabric_devs if d not in t.devices)
        if missing:
            return TransportReading("missing", t, missing)
    oob_off = {
        f"{t.host}:{t.oob.name}"
        for t in transports
        if t.oob is not None and t.oob.name not in fabric_ifs
    }
    return (
        TransportReading("oob", None, tuple(sorted(oob_off))) if oob_off else TransportReading("ib")
    )


def check_transport(
    transports: Sequence[NetTransport],
    *,
    fabric_devs: Sequence[str] = FABRIC_DEVS,
    fabric_ifs: Sequence[str] = FABRIC_IFS,
    where: str = "cluster",
) -> Finding:
    """Every rank chose NET/IB on the fabric devices (all of them), never NET/Socket."""
    expected = f"NET/IB on {','.join(fabric_devs)}"
    reading = read_transport(transports, fabric_devs, fabric_ifs)
    if reading.kind == "none":
        return Finding.failed(
            None,
            expected,
            node=where,
            message=f"{where}: no NCCL transport line (NET/IB : Using ... or NET/Socket : "
            f"Using ...) in any rank's output, expected {expected}. Run with NCCL_DEBUG=INFO "
            "(the runner sets it; a container or profile overriding it hides the transport).",
        )
    note = (
        " (the transport NCCL would select, computed by pytest_spark from the NCCL_* "
        "environment and HCA state: this run measured with gloo)"
        if any(t.predicted for t in transports)
        else ""
    )
    evidence = {"NCCL transport lines": "\n".join(t.line for t in transports)}
    if reading.rank is not None:
        t = reading.rank
        measured = (
            f"NET/Socket on {_socket_ifaces(t)}"
            if reading.kind == "socket"
            else f"NET/IB on {','.join(t.devices)}"
        )
        message = _rank_transport_message(reading, expected + note, fabric_devs, fabric_ifs)
        return Finding.failed(measured, expected, node=t.host, message=message, evidence=evidence)
    hosts = ", ".join(sorted({t.host for t in transports}))
    if reading.kind == "oob":
        return Finding.warned(
            expected,
            expected,
            node=where,
            message=f"{where}: NET/IB on {','.join(fabric_devs)} on {hosts}{note}, "
            f"but NCCL's bootstrap (OOB) runs over {', '.join(reading.names)}, not a fabric "
            f"interface ({', '.join(fabric_ifs)}). Set NCCL_SOCKET_IFNAME to the fabric "
            "interface, as launch-cluster.sh does.",
            evidence=evidence,
        )
    return Finding("pass", expected, expected, None, f"{where}: {expected} on {hosts}{note}",
                   where, evidence)  # fmt: skip


def _socket_ifaces(t: NetTransport) -> str:
    return ",".join(f"{i.name}:{i.addr}" for i in t.socket_ifaces) or "?"


def _rank_transport_message(
    reading: TransportReading, expected: str, fabric_devs: Sequence[str], fabric_ifs: Sequence[str]
) -> str:
    """The words for a rank whose transport failed (``expected`` carries the gloo note)."""
    t = reading.rank
    assert t is not None
    if reading.kind == "socket":
        extra = (
            f" {', '.join(reading.names)} is not a fabric interface ({', '.join(fabric_ifs)}):"
            " NCCL_SOCKET_IFNAME points NCCL at the wrong network."
            if reading.names
            else ""
        )
        return (
            f"{t.host}: NCCL chose NET/Socket over {_socket_ifaces(t)} (TCP fallback, busbw "
            f"~3 GB/s on a Spark), expected {expected}.{extra} Usually "
            "NCCL_IB_DISABLE=1, NCCL_IB_HCA naming no Up device, the fabric ports Down "
            "(ibdev2netdev), or an NCCL/container without IB verbs (libibverbs, "
            "/dev/infiniband)."
        )
    if reading.kind == "foreign":
        return (
            f"{t.host}: NCCL uses NET/IB on {', '.join(reading.names)}, not a fabric "
            f"device, expected {expected}. Set NCCL_IB_HCA="
            f"{','.join(fabric_devs)} (launch-cluster.sh --ib-if)."
        )
    return (
        f"{t.host}: NCCL uses NET/IB on {', '.join(t.devices)} only, missing "
        f"{', '.join(reading.names)}, expected {expected}: one twin only (busbw "
        f"~13.5 GB/s). Check NCCL_IB_HCA lists both {','.join(fabric_devs)} and both "
        "are Up (ibdev2netdev)."
    )


def socket_forced_by_env(
    transports: Sequence[NetTransport], envs: Sequence[tuple[str, Mapping[str, str] | None]]
) -> tuple[str, str] | None:
    """``(node, "NCCL_IB_DISABLE=1")`` when NCCL chose NET/Socket and that node's serving
    environment turns RDMA off (the first such node of ``envs``, in cluster order): the
    environment is then the root cause of the TCP fallback and its low bandwidth."""
    if not any(t.kind == "Socket" for t in transports):
        return None
    for node, env in envs:
        value = (env or {}).get("NCCL_IB_DISABLE", "0").strip()
        if value not in ("0", ""):
            return node, f"NCCL_IB_DISABLE={value}"
    return None


def check_ib_hca(
    value: str | None, *, node: str, fabric_devs: Sequence[str] = FABRIC_DEVS
) -> Finding:
    """Both twins are selected by ``NCCL_IB_HCA`` (as NCCL reads it: prefixes, ``^``, ``=``)."""
    expected = ",".join(fabric_devs)
    if not (value or "").strip():
        return Finding.warned(
            None,
            expected,
            node=node,
            message=f"{node}: NCCL_IB_HCA is not set, expected {expected}. NCCL then uses "
            "every active HCA, which works but hides a twin that is Down; set "
            f"NCCL_IB_HCA={expected} as launch-cluster.sh does.",
        )
    spec = parse_ib_hca(value)
    missing = [d for d in fabric_devs if not spec.selects(d, 1)]
    if missing:
        return Finding.failed(
            value,
            expected,
            node=node,
            message=f"{node}: NCCL_IB_HCA={value} leaves out {', '.join(missing)}, expected "
            f"both twins {expected}: NCCL will use one twin only (busbw ~13.5 GB/s instead "
            f"of 22-24). Set NCCL_IB_HCA={expected} (launch-cluster.sh --ib-if).",
        )
    return Finding.passed(
        value, expected, node=node, message=f"{node}: NCCL_IB_HCA={value} selects {expected}"
    )


def check_wrong_values(output: NcclOutput, *, where: str = "cluster") -> Finding:
    """No ``#wrong`` elements and ``Out of bounds values : 0 OK``."""
    bad = [r for r in output.rows if r.wrong]
    oob = output.out_of_bounds or 0
    if bad or oob:
        total = sum(r.wrong for r in bad)
        sizes = ", ".join(_size(r.size_bytes) for r in bad[:6]) or "(footer only)"
        return Finding.failed(
            total or oob,
            0,
            "elements",
            node=where,
            message=f"{where}: all-reduce returned {total} wrong elements at {sizes} "
            f"(out of bounds values: {oob}), expected 0: data corrupted in flight or on a "
            "GPU. Look for Xid errors (dmesg, nvidia-smi -q) and fabric errors (ethtool -S "
            "... | grep -i err, ibstat), then rerun.",
        )
    unchecked = bool(output.rows) and all(t.wrong is None for r in output.rows for t in r.timings)
    if unchecked:
        return Finding.warned(
            None,
            0,
            "elements",
            node=where,
            message=f"{where}: results not validated (#wrong N/A: run with "
            "-c 1), expected 0 wrong elements",
        )
    return Finding.passed(
        0,
        0,
        "elements",
        node=where,
        message=f"{where}: no wrong elements in {len(output.rows)} sizes",
    )


def check_init_hang(
    *,
    hung: bool,
    timeout_s: float,
    logs: Mapping[str, Sequence[str]],
    init_lines: Iterable[str] = (),
    where: str = "cluster",
    down_ports: Sequence[str] = (),
) -> Finding:
    """A run that never printed a result row is the NCCL channel-setup hang, with its logs.
    ``timeout_s`` is the bound that really ended it; ``down_ports`` the fabric ports the
    link checks found down (named first: the likeliest cause)."""
    if not hung:
        return Finding.passed(
            "started", "started", node=where, message=f"{where}: all ranks initialised and measured"
        )
    said = [ln.lstrip("# ").strip() for ln in init_lines]
    log_text = "\n".join(
        f"[{rank}]\n" + ("\n".join(lines[-12:]) if lines else "(no log lines)")
        for rank, lines in logs.items()
    )
    return Finding.failed(
        "hang at init",
        f"first result within {timeout_s:g} s",
        node=where,
        message=(
            f"{where}: all-reduce hung at initialisation: no result row within "
            f"{timeout_s:g} s"
            + (f" ({said[0]})" if said else "")
            + ". "
            + (
                f"A fabric port is down ({'; '.join(down_ports)}): NCCL bootstraps over the "
                "interface NCCL_SOCKET_IFNAME names, so a down one hangs it; bring the port up. "
                if down_ports
                else ""
            )
            + "This is the "
            "NCCL channel-setup hang that made SGLang multi-node unusable on this "
            "deployment: the ranks start but never finish connecting. Usual causes: "
            "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME naming an interface the peer cannot "
            "reach (or docker0 with the same address on both nodes), a firewall on the "
            "fabric subnet, a fabric port Down, different NCCL versions on the nodes. "
            f"Last log lines:\n{log_text}"
        ),
        evidence={rank: "\n".join(lines) for rank, lines in logs.items()},
    )


def check_collective(
    run: CollectiveRun,
    profile: Any,
    *,
    ib_hca: Mapping[str, str | None] | None = None,
    fabric_devs: Sequence[str] = FABRIC_DEVS,
    fabric_ifs: Sequence[str] = FABRIC_IFS,
    timeout_s: float | None = None,
) -> list[Finding]:
    """Every collective finding for one run: hang, busbw, data, transport, NCCL_IB_HCA."""
    where = " <-> ".join(r.node for r in run.ranks) or "cluster"
    # the bound that really ended a hung run (a rank's init timeout) wins over the asked one
    limit = run.hang_timeout_s or (timeout_s if timeout_s is not None else run.duration_s)
    result = run.result
    if run.hung_at_init:
        lines = [r.parsed.init_timeout for r in run.ranks if r.parsed and r.parsed.init_timeout]
        findings = [
            check_init_hang(
                hung=True, timeout_s=limit, logs=run.log_lines(), init_lines=lines, where=where
            )
        ]
    elif result is None:
        rank0 = run.ranks[0] if run.ranks else None
        why = rank0.parse_error if rank0 else "no rank ran"
        findings = [
            Finding.failed(
                None,
                "nccl-tests output",
                node=where,
                message=f"{where}: the all-reduce output of rank 0 could not be read ({why}), "
                "expected nccl-tests rows. See the evidence for what each rank printed.",
                evidence={"run": run.evidence()},
            )
        ]
    elif run.timed_out:
        largest = result.largest
        asked = result.params.get("maxBytes")
        got = (
            f"{_size(largest.size_bytes)} (busbw {_gb(largest.busbw_gbps)} GB/s)"
            if largest
            else "-"
        )
        findings = [
            Finding.failed(
                largest.size_bytes if largest else None,
                asked,
                "B",
                node=where,
                message=f"{where}: all-reduce did not finish within {limit:g} s: largest size "
                f"measured {got}" + (f" of {_size(asked)} asked" if asked else "") + ". A "
                "fabric this slow also fails the bandwidth floor; check the link first, and "
                "raise nccl.timeout_s only for a fabric known to be slow.",
                evidence={"busbw series": _series_text(result)},
            )
        ]
    else:
        findings = [
            check_busbw(result, profile, where=where),
            check_wrong_values(result, where=where),
        ]
    findings.append(
        check_transport(run.transports, fabric_devs=fabric_devs, fabric_ifs=fabric_ifs, where=where)
    )
    for node, value in (ib_hca or {}).items():
        findings.append(check_ib_hca(value, node=node, fabric_devs=fabric_devs))
    return findings
