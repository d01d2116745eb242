"""One-round-trip link probe for a node, and the facts parsed from its output.

``LINK_PROBE`` is a single shell command (``sh -c '...'``, so it runs the same under any
login shell) that prints every link-state section a node can give, each framed by marker
lines (:mod:`pytest_spark.infra.probe`)::

    @@pytest-spark-links@@ probe v1 HOSTNAME
    @@pytest-spark-links@@ begin NAME
    ...stdout of the command...
    @@pytest-spark-links@@ stderr NAME
    ...stderr of the command...
    @@pytest-spark-links@@ end NAME rc=N

Sections: ``ibdev2netdev``, ``ibstat``, ``ibv_devinfo``, ``rdma_link``, ``ip_link``
(``ip -j link``), ``ip_addr`` (``ip -j addr``), ``wireless`` (the netdevs with a
``wireless`` or ``phy80211`` entry in sysfs, only where there is one) and ``iw_dev`` (``iw
dev``, only where installed: the wireless netdevs by the nl80211 tool), then per RoCE
netdev ``ethtool:IF``, ``carrier:IF`` and ``carrier_changes:IF`` (sysfs). A missing tool
gives ``rc=127`` and ``TOOL: command not found`` on its stderr; every other section still
runs. A tool that hangs is stopped after 10 s (``rc=124``) where coreutils ``timeout`` exists.

:func:`parse_link_probe` turns that output into :class:`NodeLinkFacts`, with one
:class:`PortFacts` per RoCE netdev joining what every tool said about it.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.hostprobe import HostProbe
from pytest_spark.infra.links.parse import (
    CaInfo,
    Ethtool,
    IbvPort,
    IpLink,
    PingResult,
    RdmaLink,
    RoceMapping,
    parse_ethtool,
    parse_ibdev2netdev,
    parse_ibstat,
    parse_ibv_devinfo,
    parse_ip_addr_json,
    parse_ip_link_json,
    parse_ping,
    parse_rdma_link,
)
from pytest_spark.infra.probe import ProbeSection, probe_script, split_probe

__all__ = [
    "BASE_SECTIONS",
    "HOST_PROBE",
    "LINK_PROBE",
    "MARKER",
    "PING_FAN_OUT",
    "PING_MARKER",
    "NodeLinkFacts",
    "PingOutcome",
    "PingTarget",
    "PortFacts",
    "discover_fabric_ifs",
    "link_probe_command",
    "matrix_peers",
    "parse_link_probe",
    "parse_ping_matrix",
    "ping_command",
    "ping_matrix_command",
    "primary_fabric_if",
]

MARKER = "@@pytest-spark-links@@"
BASE_SECTIONS = ("ibdev2netdev", "ibstat", "ibv_devinfo", "rdma_link", "ip_link", "ip_addr")

_BODY = r"""
S=@SYSFS@
s ibdev2netdev ibdev2netdev
s ibstat ibstat
s ibv_devinfo ibv_devinfo
s rdma_link rdma link
s ip_link ip -j link
s ip_addr ip -j addr
w=''
for d in "$S"/class/net/*; do
  if [ -e "$d/wireless" ] || [ -e "$d/phy80211" ]; then w="$w ${d##*/}"; fi
done
[ -n "$w" ] && s wireless echo $w
command -v iw >/dev/null 2>&1 && s iw_dev iw dev
ifs=$( {
  $T ibdev2netdev 2>/dev/null | awk '$4 == "==>" {print $5}'
  for d in "$S"/class/infiniband/*/device/net/*; do [ -e "$d" ] && echo "${d##*/}"; done
} | sort -u )
for i in $ifs; do
  case $i in *[!A-Za-z0-9_.@-]*) continue ;; esac
  s "ethtool:$i" ethtool "$i"
  s "carrier:$i" cat "$S/class/net/$i/carrier"
  s "carrier_changes:$i" cat "$S/class/net/$i/carrier_changes"
done
rm -f "$t"
"""


def link_probe_command(sysfs: str = "/sys", timeout_s: int = 10) -> str:
    """The probe as one ``sh -c`` command. ``sysfs`` exists for tests (a fake tree)."""
    return probe_script(MARKER, "links", timeout_s, _BODY.replace("@SYSFS@", shlex.quote(sysfs)))


LINK_PROBE = link_probe_command()
"""Run this on a node (one SSH call); feed its stdout to :func:`parse_link_probe`."""


# ------------------------------------------------------------------------------- sections


# ---------------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class PortFacts:
    """Everything the probe learnt about one RoCE netdev (``None``: not known).

    ``ib_state``/``phys_state`` use ibstat's words (``Active``, ``LinkUp``, ``Polling``);
    they come from ``rdma link`` (translated) when ibstat is missing (``state_source``).
    ``carrier`` is sysfs ``carrier`` when readable, else ``LOWER_UP`` from ``ip link``.
    ``exists`` is False only when ``ip -j link`` ran and did not list the netdev.
    """

    netdev: str
    dev: str | None
    roce_up: bool | None
    ib_state: str | None
    phys_state: str | None
    rate_gbps: float | None
    active_mtu: int | None
    mtu: int | None
    operstate: str | None
    lower_up: bool | None
    carrier: bool | None
    addresses: tuple[ipaddress.IPv4Interface, ...] = ()
    ethtool_speed_mbps: int | None = None
    ib_port: int | None = None
    exists: bool | None = None
    admin_up: bool | None = None
    no_carrier: bool | None = None
    flags: tuple[str, ...] = ()
    ibv_state: str | None = None
    link_layer: str | None = None
    ethtool_link_detected: bool | None = None
    carrier_changes: int | None = None
    state_source: str | None = None


@dataclass(frozen=True)
class NodeLinkFacts:
    """The parsed link probe of one node. ``errors`` maps a section name to why it gave
    nothing usable (``command not found: ibstat``, a parse error, ...)."""

    hostname: str | None
    sections: dict[str, ProbeSection]
    roce: tuple[RoceMapping, ...] = ()
    ibstat: dict[str, CaInfo] = field(default_factory=dict)
    ibv: dict[str, dict[int, IbvPort]] = field(default_factory=dict)
    rdma: tuple[RdmaLink, ...] = ()
    ip_links: dict[str, IpLink] = field(default_factory=dict)
    ip_addrs: dict[str, list[ipaddress.IPv4Interface]] = field(default_factory=dict)
    ethtool: dict[str, Ethtool] = field(default_factory=dict)
    carrier: dict[str, bool] = field(default_factory=dict)
    carrier_changes: dict[str, int] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    ports: dict[str, PortFacts] = field(default_factory=dict)
    # netdevs that are wireless (sysfs ``wireless`` / ``phy80211``, or ``iw dev``)
    wireless: frozenset[str] = frozenset()

    @property
    def missing_tools(self) -> tuple[str, ...]:
        return tuple(s.name.split(":", 1)[0] for s in self.sections.values() if s.missing)


_T = TypeVar("_T")

# rdma link words -> ibstat words
_RDMA_STATE = {
    "ACTIVE": "Active",
    "DOWN": "Down",
    "INIT": "Initializing",
    "ARMED": "Armed",
    "ACTIVE_DEFER": "Active",
}
_RDMA_PHYS = {
    "LINK_UP": "LinkUp",
    "DISABLED": "Disabled",
    "POLLING": "Polling",
    "SLEEP": "Sleep",
    "LINK_ERROR_RECOVERY": "LinkErrorRecovery",
    "PHY_TEST": "PhyTest",
    "PORT_CONFIGURATION_TRAINING": "PortConfigurationTraining",
    "NOP": "Nop",
}


def _parse_section(
    sections: dict[str, ProbeSection],
    errors: dict[str, str],
    name: str,
    parser: Callable[[str], _T],
    *,
    required: bool = True,
) -> _T | None:
    section = sections.get(name)
    if section is None:
        if required:
            errors[name] = f"{name}: section missing from probe output"
        return None
    problem = section.problem()
    if problem is not None:
        errors[name] = problem
        return None
    try:
        return parser(section.stdout)
    except ParseError as exc:
        errors[name] = str(exc)
        return None


def _sysfs_int(sections: dict[str, ProbeSection], name: str) -> int | None:
    section = sections.get(name)
    if section is None or section.rc != 0:
        return None  # carrier is unreadable (EINVAL) on an admin-down netdev: normal
    value = section.stdout.strip()
    return int(value) if value.isdigit() else None


def parse_link_probe(text: str) -> NodeLinkFacts:
    """Parse the output of :data:`LINK_PROBE`. A missing tool or an unparsable section is
    recorded in ``errors`` and leaves its facts empty; only output without any marker
    line raises :class:`ParseError`."""
    hostname, sections = split_probe(text, MARKER, "link probe")
    errors: dict[str, str] = {}
    roce = _parse_section(sections, errors, "ibdev2netdev", parse_ibdev2netdev) or []
    ibstat = _parse_section(sections, errors, "ibstat", parse_ibstat) or {}
    ibv = _parse_section(sections, errors, "ibv_devinfo", parse_ibv_devinfo) or {}
    rdma = _parse_section(sections, errors, "rdma_link", parse_rdma_link) or []
    ip_links = _parse_section(sections, errors, "ip_link", parse_ip_link_json)
    ip_addrs = _parse_section(sections, errors, "ip_addr", parse_ip_addr_json) or {}

    ethtool: dict[str, Ethtool] = {}
    carrier: dict[str, bool] = {}
    changes: dict[str, int] = {}
    for name in sections:
        kind, _, ifname = name.partition(":")
        if not ifname:
            continue
        if kind == "ethtool":
            parsed = _parse_section(sections, errors, name, parse_ethtool)
            if parsed is not None:
                ethtool[ifname] = parsed
        elif kind == "carrier" and (v := _sysfs_int(sections, name)) is not None:
            carrier[ifname] = v != 0
        elif kind == "carrier_changes" and (v := _sysfs_int(sections, name)) is not None:
            changes[ifname] = v

    facts = NodeLinkFacts(
        hostname,
        sections,
        tuple(roce),
        ibstat,
        ibv,
        tuple(rdma),
        ip_links or {},
        ip_addrs,
        ethtool,
        carrier,
        changes,
        errors,
    )
    netdevs: list[str] = []
    for mapping in roce:
        netdevs.append(mapping.netdev)
    for link in rdma:
        if link.netdev:
            netdevs.append(link.netdev)
    netdevs.extend(ethtool)
    ports = {n: _port_facts(facts, n, ip_links is not None) for n in dict.fromkeys(netdevs)}
    return NodeLinkFacts(
        hostname,
        sections,
        tuple(roce),
        ibstat,
        ibv,
        tuple(rdma),
        ip_links or {},
        ip_addrs,
        ethtool,
        carrier,
        changes,
        errors,
        ports,
        _wireless(sections),
    )


def _wireless(sections: dict[str, ProbeSection]) -> frozenset[str]:
    """The wireless netdevs: sysfs's ``wireless`` / ``phy80211`` entries, then ``iw dev``'s
    ``Interface NAME`` lines (either source alone suffices; a missing ``iw`` is no error)."""
    names: set[str] = set()
    found = sections.get("wireless")
    if found is not None and found.rc == 0:
        names |= set(found.stdout.split())
    iw = sections.get("iw_dev")
    if iw is not None and iw.rc == 0:
        for line in iw.stdout.splitlines():
            words = line.split()
            if len(words) == 2 and words[0] == "Interface":
                names.add(words[1])
    return frozenset(names)


def _port_facts(facts: NodeLinkFacts, netdev: str, ip_link_known: bool) -> PortFacts:
    mapping = next((m for m in facts.roce if m.netdev == netdev), None)
    rdma = next((r for r in facts.rdma if r.netdev == netdev), None)
    dev = mapping.dev if mapping else (rdma.dev if rdma else None)
    ib_port = mapping.port if mapping else (rdma.port if rdma else None)

    ib_state = phys = link_layer = source = None
    rate: float | None = None
    ca = facts.ibstat.get(dev) if dev else None
    port = ca.ports.get(ib_port) if ca and ib_port is not None else None
    if port is not None:
        ib_state, phys, rate, link_layer = (
            port.state,
            port.physical_state,
            port.rate_gbps,
            port.link_layer,
        )
        source = "ibstat"
    elif rdma is not None and rdma.dev == dev and rdma.state is not None:
        ib_state = _RDMA_STATE.get(rdma.state, rdma.state)
        phys = _RDMA_PHYS.get(rdma.physical_state or "", rdma.physical_state)
        source = "rdma"

    ibv = facts.ibv.get(dev, {}).get(ib_port) if dev and ib_port is not None else None
    link = facts.ip_links.get(netdev)
    eth = facts.ethtool.get(netdev)
    carrier = facts.carrier.get(netdev)
    if carrier is None and link is not None:
        carrier = link.lower_up
    return PortFacts(
        netdev=netdev,
        dev=dev,
        roce_up=mapping.up if mapping else None,
        ib_state=ib_state,
        phys_state=phys,
        rate_gbps=rate,
        active_mtu=ibv.active_mtu if ibv else None,
        mtu=link.mtu if link else None,
        operstate=link.operstate if link else None,
        lower_up=link.lower_up if link else None,
        carrier=carrier,
        addresses=tuple(facts.ip_addrs.get(netdev, ())),
        ethtool_speed_mbps=eth.speed_mbps if eth else None,
        ib_port=ib_port,
        exists=(link is not None) if ip_link_known else None,
        admin_up=link.up if link else None,
        no_carrier=link.no_carrier if link else None,
        flags=link.flags if link else (),
        ibv_state=ibv.state if ibv else None,
        link_layer=link_layer or (ibv.link_layer if ibv else None),
        ethtool_link_detected=eth.link_detected if eth else None,
        carrier_changes=facts.carrier_changes.get(netdev),
        state_source=source,
    )


# ------------------------------------------------------------------------------ discovery


def discover_fabric_ifs(facts: NodeLinkFacts) -> list[str]:
    """The netdevs ``ibdev2netdev`` reports Up, in ibdev2netdev's order (RDMA device name,
    C collation: ``roceP2p1s0f1`` before ``rocep1s0f1``), as launch-cluster.sh /
    autodiscover.sh pick them (``ibdev2netdev | awk '/Up\\)/'``).

    Without ibdev2netdev, falls back to ``rdma link`` netdevs whose ``ip link`` operstate
    is UP (what ibdev2netdev's Up means).
    """
    if facts.roce:
        ordered = sorted(facts.roce, key=lambda m: (m.dev, m.port))
        return list(dict.fromkeys(m.netdev for m in ordered if m.up))
    ordered_rdma = sorted(facts.rdma, key=lambda r: (r.dev, r.port))
    return list(
        dict.fromkeys(
            r.netdev
            for r in ordered_rdma
            if r.netdev
            and (link := facts.ip_links.get(r.netdev)) is not None
            and link.operstate == "UP"
        )
    )


def primary_fabric_if(facts: NodeLinkFacts) -> str | None:
    """The fabric netdev autodiscover.sh would pick as ETH_IF (VLLM_HOST_IP's interface):
    the first Up one with an IPv4 address and no capital ``P`` (PCI domain 0), else the
    first Up one with an IPv4 address."""
    with_addr = [n for n in discover_fabric_ifs(facts) if facts.ip_addrs.get(n)]
    preferred = [n for n in with_addr if "P" not in n]
    chosen = preferred or with_addr
    return chosen[0] if chosen else None


def ping_command(
    ifname: str, peer_addr: str | ipaddress.IPv4Address, mtu: int, count: int = 3
) -> str:
    """A don't-fragment ping filling ``mtu`` exactly (payload = MTU - 20 IP - 8 ICMP):
    ``ping -M do -s 8972 -c 3 -i 0.2 -W 1 -I enp1s0f1np1 192.168.200.13``."""
    if mtu < 68:
        raise ValueError(f"mtu must be at least 68 (IPv4 minimum), got {mtu}")
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    if not ifname or not str(peer_addr):
        raise ValueError("ifname and peer_addr must not be empty")
    return (
        f"LC_ALL=C ping -M do -s {mtu - 28} -c {count} -i 0.2 -W 1 "
        f"-I {shlex.quote(ifname)} {shlex.quote(str(peer_addr))}"
    )


# ------------------------------------------------------------------------- ping matrix

PING_MARKER = "@@pytest-spark-ping@@"
SMALL_PING_MTU = 1500  # the default-size ping that tells an MTU problem from no path

_PINGS = r"""
d=$(mktemp -d 2>/dev/null) || { d="/tmp/.pytest-spark-ping.$$"; mkdir -p "$d"; }
i=0
q() {
  i=$((i+1))
  ( t="$d/$i.err"
    s "ping:$1:$2" ping -M do -s "$3" -c @COUNT@ -i 0.2 -W 1 -I "$1" "$2"
    grep -q ' 0% packet loss' "$d/$i" ||
      s "small:$1:$2" ping -M do -s @SMALL@ -c 1 -W 1 -I "$1" "$2"
  ) >"$d/$i" 2>&1 &
}
@CALLS@
wait
j=0
while [ $j -lt $i ]; do j=$((j+1)); cat "$d/$j"; done
rm -rf "$d" "$t"
"""


@dataclass(frozen=True)
class PingTarget:
    """One DF ping of the matrix: out of ``ifname`` to ``addr``, filling ``mtu``."""

    ifname: str
    addr: str
    mtu: int


@dataclass(frozen=True)
class PingOutcome:
    """A target's DF ping at full MTU and, where it lost replies, the default-size ping
    of the same peer (None when the big one got every reply). ``problem``: why there is
    no ping to read (ping missing, output cut), else None."""

    big: PingResult | None
    small: PingResult | None = None
    problem: str | None = None


def matrix_peers(count: int, index: int) -> list[int]:
    """The nodes (indexes into ``count`` nodes) that node ``index`` pings in the ping
    matrix: the next ``count // 2`` in ring order. Every pair is then pinged from at least
    one end, and a DF ping's reply is as large as its request, so one ping tests the
    pair's path both ways at full MTU: N x N/2 pings instead of N x (N - 1). Two nodes
    ping each other."""
    if not 0 <= index < count:
        raise ValueError(f"index {index} not in 0..{count - 1}")
    return [(index + d) % count for d in range(1, count // 2 + 1)]


PING_FAN_OUT = 8  # pings a node runs at once (a bounded burst: ARP and the peers' CPUs)


def ping_matrix_command(
    targets: list[PingTarget], count: int = 3, timeout_s: int = 60, fan_out: int = PING_FAN_OUT
) -> str:
    """Every target pinged in one round trip, ``fan_out`` at a time: a don't-fragment ping
    filling the target's MTU (payload = MTU - 28), ``count`` times, and where that loses
    replies one default-size (1500) ping of the same peer. Each ping's output is kept in a
    ``mktemp -d`` directory, printed in order, then removed."""
    if fan_out < 1:
        raise ValueError(f"fan_out must be at least 1, got {fan_out}")
    if not targets:
        raise ValueError("ping_matrix_command needs at least one target")
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    calls = []
    for target in targets:
        if not re.fullmatch(r"[A-Za-z0-9_.@-]+", target.ifname):
            raise ValueError(f"not an interface name: {target.ifname!r}")
        ipaddress.IPv4Address(target.addr)  # ValueError when it is not one
        if target.mtu < 68:
            raise ValueError(f"mtu must be at least 68 (IPv4 minimum), got {target.mtu}")
        calls.append(f"q {shlex.quote(target.ifname)} {target.addr} {target.mtu - 28}")
        if len(calls) % (fan_out + 1) == fan_out:
            calls.append("wait")
    body = (
        _PINGS.replace("@COUNT@", str(count))
        .replace("@SMALL@", str(SMALL_PING_MTU - 28))
        .replace("@CALLS@", "\n".join(calls))
    )
    return probe_script(PING_MARKER, "ping", timeout_s, body)


def parse_ping_matrix(text: str) -> dict[tuple[str, str], PingOutcome]:
    """:func:`ping_matrix_command` output -> (ifname, addr) -> its outcome."""
    _, sections = split_probe(text, PING_MARKER, "ping probe")
    out: dict[tuple[str, str], PingOutcome] = {}
    for name, section in sections.items():
        kind, _, rest = name.partition(":")
        if kind != "ping":
            continue
        ifname, _, addr = rest.partition(":")
        small_section = sections.get(f"small:{rest}")
        try:
            big = parse_ping(section.stdout + section.stderr)
            small = (
                None
                if small_section is None
                else parse_ping(small_section.stdout + small_section.stderr)
            )
        except ParseError as exc:
            out[(ifname, addr)] = PingOutcome(None, problem=section.problem() or str(exc))
            continue
        out[(ifname, addr)] = PingOutcome(big, small)
    return out


# The link probe runs alone (its own round trip per node, all nodes in one wave: see
# links.gather), not in the shared host round trip.
HOST_PROBE: HostProbe[NodeLinkFacts] = HostProbe(
    key="link",
    command=lambda settings, container: LINK_PROBE,
    parse=lambda text, settings: parse_link_probe(text),
    shared=False,
    timeout_s=30,
)
