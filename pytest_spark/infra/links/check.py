"""Link-state checks: parsed link facts + thresholds -> :class:`Finding`. No I/O, no pytest.
Link up, RoCE state and link rate here; by subject beside it: ``mtu_check`` (MTU, the same
MTU on every end), ``subnet_check`` (one subnet per twin), ``ping_check`` (DF pings, the
ping matrix) and ``twins_check`` (how many fabric twins are Up).

Every failure message names the node and interface, what was measured, what was
expected and what usually fixes it (STYLE.md).

Dependencies: a port whose link is down makes its RoCE state, rate and ping fail too.
:data:`DEPENDS_ON_LINK_UP` names those checks; the suite asks :func:`link_is_usable`
first and skips them with the root cause instead of reporting four failures for one
unplugged cable. MTU, MTU consistency, subnet and twin-count checks read configuration
that is meaningful on a down port and always run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_spark.infra.finding import Finding
from pytest_spark.infra.links.parse import CaInfo
from pytest_spark.infra.links.probe import PortFacts
from pytest_spark.infra.links.twins_check import twin_key

__all__ = [
    "DEPENDS_ON_LINK_UP",
    "check_link_rate",
    "check_link_up",
    "check_roce_active",
    "link_is_usable",
    "link_rate_ends",
    "link_rate_short",
    "nic_firmware",
    "peer_took_the_link_down",
]

DEPENDS_ON_LINK_UP: frozenset[str] = frozenset(
    {"check_roce_active", "check_link_rate", "check_ping"}
)
"""Checks that only make sense on a port whose link is up (see :func:`link_is_usable`);
``check_ping`` is in ``ping_check``."""


def _num(value: float) -> str:
    return f"{value:g}"


def _where(node: str, ifname: str) -> str:
    return f"{node} {ifname}"


# ------------------------------------------------------------------------------- link up


def check_link_up(node: str, port: PortFacts) -> Finding:
    """The netdev exists, is admin up, has carrier (LOWER_UP) and operstate UP.

    Admin-down (fix: ``ip link set IF up``) is told apart from NO-CARRIER (fix: cable,
    transceiver or the peer's port).
    """
    where, ifname = _where(node, port.netdev), port.netdev
    evidence = {
        "ip link": f"flags {','.join(port.flags) or '?'}; operstate "
        f"{port.operstate or '?'}; mtu {port.mtu}"
    }
    if port.ethtool_link_detected is not None:
        evidence["ethtool"] = f"Link detected: {'yes' if port.ethtool_link_detected else 'no'}"
    if port.exists is False or (port.exists is None and port.operstate is None):
        state = "absent from ip link" if port.exists is False else "unknown (ip link gave nothing)"
        return Finding.failed(
            "absent" if port.exists is False else "unknown",
            "UP",
            node=node,
            message=(
                f"{where}: interface {state}, expected UP with carrier. The netdev was "
                f"renamed (udev/netplan) or the mlx5_core driver did not load; compare "
                f"`ip link` with `ibdev2netdev` on {node}."
            ),
            evidence=evidence,
        )
    if port.admin_up is False:
        return Finding.failed(
            "admin-down",
            "UP",
            node=node,
            message=(
                f"{where}: link administratively down (flags "
                f"{','.join(port.flags) or 'none'}, operstate {port.operstate}), expected "
                f"UP with carrier. Bring it up with `sudo ip link set {ifname} up` and "
                f"make it persistent in the netplan config."
            ),
            evidence=evidence,
        )
    if port.no_carrier or port.lower_up is False or port.carrier is False:
        changes = (
            f" carrier_changes={port.carrier_changes}." if port.carrier_changes is not None else ""
        )
        return Finding.failed(
            "no-carrier",
            "UP",
            node=node,
            message=(
                f"{where}: no carrier (NO-CARRIER, operstate {port.operstate}), expected "
                f"UP with carrier (LOWER_UP). The port is up but sees no link partner: "
                f"reseat the QSFP cable/transceiver at both ends and check that the peer "
                f"node's port is up; `ethtool {ifname}` should say Link detected: yes."
                f"{changes}"
            ),
            evidence=evidence,
        )
    if port.operstate != "UP":
        return Finding.failed(
            port.operstate,
            "UP",
            node=node,
            message=(
                f"{where}: operstate {port.operstate}, expected UP (carrier present). "
                f"A lower layer or the driver holds it down; check "
                f"`ip -d link show {ifname}` and `dmesg | grep mlx5` on {node}."
            ),
            evidence=evidence,
        )
    return Finding.passed(
        "UP", "UP", node=node, message=f"{where}: link up (operstate UP, LOWER_UP)"
    )


def link_is_usable(port: PortFacts, node: str | None = None) -> tuple[bool, str]:
    """``(True, "")`` when the port's link is up; otherwise ``(False, reason)`` where the
    reason names the root cause, for skipping the checks in :data:`DEPENDS_ON_LINK_UP`."""
    finding = check_link_up(node or "node", port)
    if finding.ok:
        return True, ""
    first = finding.message.split(". ", 1)[0]
    return False, f"link not usable: {first} (see the link-up check)"


def link_rate_short(port: PortFacts, node: str, min_gbps: float) -> str | None:
    """The link-rate check's words for an up port whose known rate is below ``min_gbps``
    (``spark-worker-1 enP2p1s0f1np1: link rate 100 Gb/s from ibstat ... (see the
    link-rate check)``), for a check that skips citing it; None when the rate is fine, not
    known, or the link is down (the link-up check's)."""
    if not link_is_usable(port, node)[0]:
        return None
    if port.rate_gbps is None and port.ethtool_speed_mbps is None:
        return None
    finding = check_link_rate(node, port, min_gbps)
    if finding.ok:
        return None
    return f"{finding.message.split(', expected', 1)[0]} (see the link-rate check)"


# --------------------------------------------------------------------------- RoCE state


def check_roce_active(node: str, port: PortFacts) -> Finding:
    """The RoCE port is ``Active``/``LinkUp`` (ibstat or rdma link) and, where
    ibv_devinfo answered, ``PORT_ACTIVE``. Depends on link up."""
    where = _where(node, port.netdev)
    dev = f"{port.dev}/{port.ib_port or 1}" if port.dev else "(no RDMA device)"
    evidence = {
        "state": f"{port.ib_state}/{port.phys_state} (from {port.state_source}); "
        f"ibv_devinfo {port.ibv_state}"
    }
    measured = f"{port.ib_state}/{port.phys_state}"
    if port.ib_state is None and port.ibv_state is None:
        return Finding.failed(
            "unknown",
            "Active/LinkUp",
            node=node,
            message=(
                f"{where}: RoCE port state unknown (ibstat, rdma link and ibv_devinfo "
                f"said nothing about {dev}), expected Active/LinkUp. Install "
                f"infiniband-diags and rdma-core on {node}, and check that "
                f"`ibdev2netdev` maps an RDMA device to {port.netdev}."
            ),
            evidence=evidence,
        )
    ib_ok = port.ib_state in (None, "Active") and port.phys_state in (None, "LinkUp")
    ibv_ok = port.ibv_state in (None, "PORT_ACTIVE")
    if ib_ok and ibv_ok:
        return Finding.passed(
            "Active/LinkUp",
            "Active/LinkUp",
            node=node,
            message=f"{where}: RoCE {dev} Active/LinkUp",
        )
    if port.phys_state == "Polling":
        hint = (
            "Polling means the port is trying to train and hears no partner: reseat or "
            "replace the cable and check the peer's port; a cable or FEC setting the "
            "other end does not support also keeps it polling"
        )
    elif port.phys_state == "Disabled":
        hint = (
            f"the port is disabled, which follows the netdev being down: bring "
            f"{port.netdev} up (`sudo ip link set {port.netdev} up`) and check the cable"
        )
    elif ib_ok and not ibv_ok:
        measured = f"{port.ib_state}/{port.phys_state}, {port.ibv_state}"
        hint = (
            "ibstat and ibv_devinfo disagree: the verbs layer has not caught up; reload "
            "the driver (`sudo modprobe -r mlx5_ib && sudo modprobe mlx5_ib`) or reboot"
        )
    else:
        hint = (
            f"check `ibstat {port.dev}` and `dmesg | grep mlx5` on {node}; a port stuck "
            "in Init/Armed usually recovers after `ip link set` down/up"
        )
    return Finding.failed(
        measured,
        "Active/LinkUp",
        node=node,
        message=(
            f"{where}: RoCE {dev} State {port.ib_state}, Physical state "
            f"{port.phys_state}, expected Active/LinkUp. Likely cause: {hint}."
        ),
        evidence=evidence,
    )


# ----------------------------------------------------------------------------- link rate


def check_link_rate(node: str, port: PortFacts, min_gbps: float = 200.0) -> Finding:
    """ibstat ``Rate`` >= ``min_gbps``. Depends on link up.

    ibstat's rate is authoritative: a virtual link may report a fixed ethtool speed
    (a veth says 10000Mb/s). ethtool's speed is quoted as supporting evidence when it
    reports a real value, and only decides when ibstat gave no rate at all.
    """
    where = _where(node, port.netdev)
    speed = port.ethtool_speed_mbps
    evidence: dict[str, str] = {}
    if port.rate_gbps is not None:
        evidence["ibstat"] = f"Rate: {_num(port.rate_gbps)}"
    if speed is not None:
        evidence["ethtool"] = f"Speed: {speed}Mb/s"
    if port.rate_gbps is not None:
        rate, source = port.rate_gbps, "ibstat"
    elif speed is not None:
        rate, source = speed / 1000, "ethtool (ibstat gave no rate)"
    else:
        return Finding.failed(
            None,
            min_gbps,
            "Gb/s",
            bound=">=",
            node=node,
            message=(
                f"{where}: link rate unknown (no ibstat Rate, ethtool Speed: Unknown!), "
                f"expected >= {_num(min_gbps)} Gb/s. Install infiniband-diags (ibstat) "
                f"on {node} and check that the link is up."
            ),
            evidence=evidence,
        )
    support = ""
    if speed is not None and source == "ibstat":
        support = f" (ethtool: {speed}Mb/s)"
    if rate >= min_gbps:
        return Finding.passed(
            rate,
            min_gbps,
            "Gb/s",
            bound=">=",
            node=node,
            message=(
                f"{where}: link rate {_num(rate)} Gb/s from {source}"
                f"{support}, expected >= {_num(min_gbps)} Gb/s"
            ),
        )
    return Finding.failed(
        rate,
        min_gbps,
        "Gb/s",
        bound=">=",
        node=node,
        message=(
            f"{where}: link rate {_num(rate)} Gb/s from {source}{support}, expected >= "
            f"{_num(min_gbps)} Gb/s. Likely a cable rated for {_num(rate)}G or a switch "
            f"port forced to {_num(rate)}G; check ibstat and ethtool, reseat or replace "
            f"the cable."
        ),
        evidence=evidence,
    )


def link_rate_ends(
    low: Sequence[tuple[str, str, float]], node: str, ifname: str, *, direct: bool
) -> tuple[tuple[str, str], list[tuple[str, str]]]:
    """Which link-rate check reports the slow link ``node`` ``ifname`` is an end of, and
    every end it covers: ``(owner, ends)``, each an ``(node, ifname)``.

    ``low`` is every (node, ifname, rate) below the floor, in the suite's order (nodes as
    the cluster lists them, twins as discovered). The two twins of one QSFP port share its
    rate, and on a direct cable (``direct``: two nodes, no switch) both nodes' ends of it
    report the same rate: a link has one rate, so the first of them has the one failure
    naming every end, and the others skip citing it."""
    rate = next((r for n, i, r in low if (n, i) == (node, ifname)), None)
    ends = [
        (n, i)
        for n, i, r in low
        if r == rate and twin_key(i) == twin_key(ifname) and (direct or n == node)
    ]
    if not ends:
        return (node, ifname), [(node, ifname)]
    return ends[0], ends


def peer_took_the_link_down(port: PortFacts, peers: Mapping[str, PortFacts]) -> str | None:
    """On a direct cable (two nodes), why this port sees no carrier: the peer whose end of
    the same twin is administratively down or absent (its link-up check is the root cause;
    this end is fine). None when this port's own state is the problem."""
    if port.admin_up is False or port.exists is False:
        return None
    if not (port.no_carrier or port.lower_up is False or port.carrier is False):
        return None
    for name, other in peers.items():
        if other.admin_up is False or other.exists is False:
            return name
    return None


def nic_firmware(ibstat: Mapping[str, CaInfo]) -> dict[str, str]:
    """ConnectX firmware per RDMA device, as ``ibstat`` prints it (``Firmware version``),
    for the report's environment; devices without one are left out."""
    return {ca: info.firmware for ca, info in sorted(ibstat.items()) if info.firmware}
