"""Parsers for link-state command output: ibdev2netdev, ibstat, ibv_devinfo, rdma link,
ethtool, ``ip -j link``, ``ip -j addr`` and ping.

Pure functions: text in, frozen dataclasses out, no I/O. Every parser tolerates blank
lines, trailing spaces and missing optional fields; text that is not the tool's format
raises :class:`ParseError` naming the offending line (never ``IndexError``/``KeyError``).
Recorded real outputs live in ``fixtures/links/``.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pytest_spark.infra.errors import ParseError

__all__ = [
    "CaInfo",
    "Ethtool",
    "IbPort",
    "IbvPort",
    "IpLink",
    "PingResult",
    "RdmaLink",
    "RoceMapping",
    "parse_ethtool",
    "parse_ibdev2netdev",
    "parse_ibstat",
    "parse_ibv_devinfo",
    "parse_ip_addr_json",
    "parse_ip_link_json",
    "parse_ping",
    "parse_rdma_link",
]


def _lines(text: str) -> Iterator[tuple[int, str]]:
    """Numbered (1-based) non-blank lines with trailing whitespace removed."""
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if line.strip():
            yield lineno, line


def _key_value(tool: str, lineno: int, line: str) -> tuple[str, str]:
    key, sep, value = line.strip().partition(":")
    if not sep or not key.strip():
        raise ParseError(tool, "expected 'key: value'", line, lineno)
    return key.strip(), value.strip()


# --------------------------------------------------------------------------- ibdev2netdev


@dataclass(frozen=True)
class RoceMapping:
    """One ``ibdev2netdev`` line: ``rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)``."""

    dev: str
    port: int
    netdev: str
    up: bool
    state: str = ""  # as printed: "Up", "Down"


_IBDEV2NETDEV = re.compile(
    r"^(?P<dev>\S+)\s+port\s+(?P<port>\d+)\s+==>\s+(?P<netdev>\S+)\s+\((?P<state>[^()]*)\)$"
)


def parse_ibdev2netdev(text: str) -> list[RoceMapping]:
    """Parse ``ibdev2netdev`` into one :class:`RoceMapping` per line, in output order."""
    out: list[RoceMapping] = []
    for lineno, line in _lines(text):
        m = _IBDEV2NETDEV.match(line.strip())
        if m is None:
            raise ParseError(
                "ibdev2netdev", "expected 'DEV port N ==> NETDEV (State)'", line, lineno
            )
        state = m["state"].strip()
        out.append(RoceMapping(m["dev"], int(m["port"]), m["netdev"], state.lower() == "up", state))
    return out


# --------------------------------------------------------------------------------- ibstat


@dataclass(frozen=True)
class IbPort:
    """One ``Port N:`` block of ``ibstat``. ``rate_gbps`` is ``Rate:`` (Gb/s)."""

    state: str | None
    physical_state: str | None
    rate_gbps: float | None
    link_layer: str | None


@dataclass(frozen=True)
class CaInfo:
    """One ``CA 'name'`` block of ``ibstat``."""

    ca_type: str | None
    firmware: str | None
    ports: dict[int, IbPort] = field(default_factory=dict)
    hardware_version: str | None = None
    node_guid: str | None = None


_CA_HEADER = re.compile(r"^CA\s+'(?P<name>[^']+)'$")
_PORT_HEADER = re.compile(r"^Port\s+(?P<num>\d+):$")


def _float(tool: str, value: str, lineno: int, line: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ParseError(tool, f"expected a number, got {value!r}", line, lineno) from None


def parse_ibstat(text: str) -> dict[str, CaInfo]:
    """Parse ``ibstat`` (all CAs) into ``{ca_name: CaInfo}``.

    Indentation is not trusted (TABs in real output, spaces after copy and paste): a
    field belongs to the last ``Port N:`` seen in its CA, or to the CA before any port.
    """
    cas: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    port: dict[str, Any] | None = None
    for lineno, line in _lines(text):
        stripped = line.strip()
        if (m := _CA_HEADER.match(stripped)) is not None:
            current = {"fields": {}, "ports": {}}
            cas[m["name"]] = current
            port = None
            continue
        if current is None:
            raise ParseError("ibstat", "expected \"CA 'name'\" first", line, lineno)
        if (m := _PORT_HEADER.match(stripped)) is not None:
            port = {}
            current["ports"][int(m["num"])] = port
            continue
        key, value = _key_value("ibstat", lineno, line)
        if port is not None:
            if key == "Rate":
                port[key] = _float("ibstat", value, lineno, line)
            else:
                port[key] = value
        else:
            current["fields"][key] = value
    result: dict[str, CaInfo] = {}
    for name, raw in cas.items():
        fields: dict[str, str] = raw["fields"]
        ports = {
            num: IbPort(p.get("State"), p.get("Physical state"), p.get("Rate"), p.get("Link layer"))
            for num, p in raw["ports"].items()
        }
        result[name] = CaInfo(
            fields.get("CA type"),
            fields.get("Firmware version"),
            ports,
            fields.get("Hardware version"),
            fields.get("Node GUID"),
        )
    return result


# ---------------------------------------------------------------------------- ibv_devinfo


@dataclass(frozen=True)
class IbvPort:
    """One ``port:`` block of ``ibv_devinfo``: ``state: PORT_ACTIVE (4)``,
    ``active_mtu: 4096 (5)``."""

    state: str
    state_code: int
    active_mtu: int | None
    active_mtu_code: int | None
    link_layer: str | None
    max_mtu: int | None = None


_CODED = re.compile(r"^(?P<name>\S+)\s+\((?P<code>\d+)\)$")


def _coded(key: str, value: str, lineno: int, line: str) -> tuple[str, int]:
    m = _CODED.match(value)
    if m is None:
        raise ParseError("ibv_devinfo", f"expected '{key}: NAME (N)'", line, lineno)
    return m["name"], int(m["code"])


def _mtu(key: str, value: str, lineno: int, line: str) -> tuple[int, int]:
    name, code = _coded(key, value, lineno, line)
    if not name.isdigit():
        raise ParseError("ibv_devinfo", f"expected a numeric {key}", line, lineno)
    return int(name), code


@dataclass
class _IbvPortDraft:
    lineno: int
    state: tuple[str, int] | None = None
    active_mtu: tuple[int, int] | None = None
    max_mtu: tuple[int, int] | None = None
    link_layer: str | None = None

    def build(self, dev: str, num: int) -> IbvPort:
        if self.state is None:
            raise ParseError(
                "ibv_devinfo", f"{dev} port {num} has no 'state:' line", None, self.lineno
            )
        active = self.active_mtu or (None, None)
        return IbvPort(
            self.state[0],
            self.state[1],
            active[0],
            active[1],
            self.link_layer,
            self.max_mtu[0] if self.max_mtu else None,
        )


def parse_ibv_devinfo(text: str) -> dict[str, dict[int, IbvPort]]:
    """Parse ``ibv_devinfo`` (all devices) into ``{hca_id: {port: IbvPort}}``.

    ``No IB devices found`` gives ``{}``. Lines without a colon inside a device block
    (the capability lists of ``ibv_devinfo -v``) are skipped.
    """
    devices: dict[str, dict[int, IbvPort]] = {}
    dev: str | None = None
    port: tuple[int, _IbvPortDraft] | None = None

    def flush() -> None:
        if dev is not None and port is not None:
            devices[dev][port[0]] = port[1].build(dev, port[0])

    for lineno, line in _lines(text):
        stripped = line.strip()
        if stripped == "No IB devices found":
            continue
        key, sep, value = stripped.partition(":")
        key, value = key.strip(), value.strip()
        if key == "hca_id" and sep:
            flush()
            if not value:
                raise ParseError("ibv_devinfo", "empty hca_id", line, lineno)
            dev, port = value, None
            devices[dev] = {}
            continue
        if dev is None:
            raise ParseError("ibv_devinfo", "expected 'hca_id: DEV' first", line, lineno)
        if key == "port" and sep:
            flush()
            if not value.isdigit():
                raise ParseError("ibv_devinfo", "expected 'port: N'", line, lineno)
            port = (int(value), _IbvPortDraft(lineno))
            continue
        if not sep or port is None:
            continue
        draft = port[1]
        if key == "state":
            draft.state = _coded(key, value, lineno, line)
        elif key == "active_mtu":
            draft.active_mtu = _mtu(key, value, lineno, line)
        elif key == "max_mtu":
            draft.max_mtu = _mtu(key, value, lineno, line)
        elif key == "link_layer":
            draft.link_layer = value
    flush()
    return devices


# ------------------------------------------------------------------------------ rdma link


@dataclass(frozen=True)
class RdmaLink:
    """One ``rdma link`` line:
    ``link rocep1s0f0/1 state ACTIVE physical_state LINK_UP netdev enp1s0f0np0``."""

    dev: str
    port: int
    state: str | None
    physical_state: str | None
    netdev: str | None


_RDMA_HEAD = re.compile(r"^link\s+(?P<dev>[^/\s]+)/(?P<port>\d+)(?:\s+(?P<rest>.*))?$")


def parse_rdma_link(text: str) -> list[RdmaLink]:
    """Parse ``rdma link`` (``rdma link show``) into one :class:`RdmaLink` per line."""
    out: list[RdmaLink] = []
    for lineno, line in _lines(text):
        m = _RDMA_HEAD.match(line.strip())
        if m is None:
            raise ParseError("rdma link", "expected 'link DEV/PORT key value ...'", line, lineno)
        tokens = (m["rest"] or "").split()
        attrs = dict(zip(tokens[0::2], tokens[1::2], strict=False))
        out.append(
            RdmaLink(
                m["dev"],
                int(m["port"]),
                attrs.get("state"),
                attrs.get("physical_state"),
                attrs.get("netdev"),
            )
        )
    return out


# -------------------------------------------------------------------------------- ethtool


@dataclass(frozen=True)
class Ethtool:
    """The fields of ``ethtool IF`` the checks use. ``None``: not reported or Unknown!."""

    ifname: str
    speed_mbps: int | None
    link_detected: bool | None
    duplex: str | None = None
    lanes: int | None = None
    port: str | None = None
    auto_negotiation: bool | None = None


_ETHTOOL_HEADER = re.compile(r"^Settings for (?P<ifname>\S+):$")
_SPEED = re.compile(r"^(?P<n>\d+)\s*Mb/s$")
# diagnostics ethtool prints (stderr, often first in merged output) when not root
_ETHTOOL_NOISE = re.compile(r"^(Cannot get |netlink error|No data available)")


def _yes_no(tool: str, value: str, lineno: int, line: str) -> bool:
    low = value.lower()
    if low in {"yes", "on"}:
        return True
    if low in {"no", "off"}:
        return False
    raise ParseError(tool, f"expected yes/no, got {value!r}", line, lineno)


def parse_ethtool(text: str) -> Ethtool:
    """Parse ``ethtool IF``. ``Speed: Unknown!`` (no link) gives ``speed_mbps=None``."""
    ifname: str | None = None
    fields: dict[str, tuple[str, int, str]] = {}
    for lineno, line in _lines(text):
        stripped = line.strip()
        if ifname is None:
            if (m := _ETHTOOL_HEADER.match(stripped)) is not None:
                ifname = m["ifname"]
            elif _ETHTOOL_NOISE.match(stripped) is None:
                raise ParseError("ethtool", "expected 'Settings for IF:'", line, lineno)
            continue
        key, sep, value = stripped.partition(":")
        if not sep:
            continue  # continuation line of a multi-line field (link modes, msg level)
        fields.setdefault(key.strip(), (value.strip(), lineno, line))
    if ifname is None:
        raise ParseError("ethtool", "no 'Settings for IF:' header")

    speed: int | None = None
    if "Speed" in fields:
        value, lineno, line = fields["Speed"]
        if (m := _SPEED.match(value)) is not None:
            speed = int(m["n"])
        elif not value.lower().startswith("unknown"):
            raise ParseError("ethtool", f"unrecognised speed {value!r}", line, lineno)
    detected: bool | None = None
    if "Link detected" in fields:
        detected = _yes_no("ethtool", *fields["Link detected"])
    lanes: int | None = None
    if "Lanes" in fields and fields["Lanes"][0].isdigit():
        lanes = int(fields["Lanes"][0])
    autoneg: bool | None = None
    if "Auto-negotiation" in fields:
        autoneg = _yes_no("ethtool", *fields["Auto-negotiation"])
    duplex = fields["Duplex"][0] if "Duplex" in fields else None
    port = fields["Port"][0] if "Port" in fields else None
    return Ethtool(ifname, speed, detected, duplex, lanes, port, autoneg)


# ----------------------------------------------------------------------- ip -j link / addr


@dataclass(frozen=True)
class IpLink:
    """One interface of ``ip -j link``. ``up`` is the admin flag ``UP``."""

    ifname: str
    flags: tuple[str, ...]
    operstate: str | None
    mtu: int | None
    up: bool
    lower_up: bool
    no_carrier: bool
    link_type: str | None = None
    address: str | None = None


def _json_list(tool: str, text: str) -> list[dict[str, Any]]:
    if not text.strip():
        return []
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        bad = text.splitlines()[exc.lineno - 1] if text.splitlines() else text
        raise ParseError(tool, f"invalid JSON ({exc.msg})", bad[:200], exc.lineno) from None
    if not isinstance(data, list):
        raise ParseError(tool, "expected a JSON array of interfaces", text.strip()[:200])
    # old iproute2 emits {} for filtered entries: skip anything without an ifname
    return [e for e in data if isinstance(e, dict) and isinstance(e.get("ifname"), str)]


def parse_ip_link_json(text: str) -> dict[str, IpLink]:
    """Parse ``ip -j link`` into ``{ifname: IpLink}``."""
    out: dict[str, IpLink] = {}
    for entry in _json_list("ip -j link", text):
        raw_flags = entry.get("flags", [])
        if not isinstance(raw_flags, list):
            raise ParseError("ip -j link", "'flags' is not a list", json.dumps(entry)[:200])
        flags = tuple(str(f) for f in raw_flags)
        mtu = entry.get("mtu")
        if mtu is not None and not isinstance(mtu, int):
            raise ParseError("ip -j link", "'mtu' is not an integer", json.dumps(entry)[:200])
        operstate = entry.get("operstate")
        out[entry["ifname"]] = IpLink(
            ifname=entry["ifname"],
            flags=flags,
            operstate=str(operstate) if operstate is not None else None,
            mtu=mtu,
            up="UP" in flags,
            lower_up="LOWER_UP" in flags,
            no_carrier="NO-CARRIER" in flags,
            link_type=entry.get("link_type"),
            address=entry.get("address"),
        )
    return out


def parse_ip_addr_json(text: str) -> dict[str, list[ipaddress.IPv4Interface]]:
    """Parse ``ip -j addr`` into ``{ifname: [IPv4Interface, ...]}`` (IPv6 is ignored;
    an interface without IPv4 maps to an empty list)."""
    out: dict[str, list[ipaddress.IPv4Interface]] = {}
    for entry in _json_list("ip -j addr", text):
        addrs = out.setdefault(entry["ifname"], [])
        info = entry.get("addr_info", [])
        if not isinstance(info, list):
            raise ParseError("ip -j addr", "'addr_info' is not a list", json.dumps(entry)[:200])
        for a in info:
            if not isinstance(a, dict) or a.get("family") != "inet":
                continue
            try:
                addrs.append(ipaddress.IPv4Interface(f"{a['local']}/{a['prefixlen']}"))
            except (KeyError, ValueError):
                raise ParseError(
                    "ip -j addr", "bad IPv4 address entry", json.dumps(a)[:200]
                ) from None
    return out


# ----------------------------------------------------------------------------------- ping


@dataclass(frozen=True)
class PingResult:
    """Summary of an iputils (or busybox) ping run.

    ``errors`` are normalised kinds in order of first appearance: ``"message too long"``
    (local MTU below the packet, DF set), ``"Frag needed"`` (a hop's MTU is smaller),
    ``"Destination Host Unreachable"``, ``"Network is unreachable"``, ``"No such device"``,
    ``"unknown host"``. ``error_mtu`` is the MTU the error reported, if any.
    """

    transmitted: int
    received: int
    loss_pct: float
    rtt_avg_ms: float | None
    errors: tuple[str, ...] = ()
    error_mtu: int | None = None

    @property
    def mtu_problem(self) -> bool:
        return "message too long" in self.errors or "Frag needed" in self.errors


_PING_STATS = re.compile(
    r"(?P<tx>\d+) packets transmitted, (?P<rx>\d+) (?:packets )?received"
    r"(?:, \+(?P<err>\d+) errors)?.*?, (?P<loss>[\d.]+)% packet loss"
)
_PING_RTT = re.compile(
    r"^(?:rtt|round-trip) min/avg/max(?:/\w+)? = "
    r"(?P<min>[\d.]+)/(?P<avg>[\d.]+)/(?P<max>[\d.]+)"
)
_PING_ERRORS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"message too long", re.I), "message too long"),
    (re.compile(r"frag(mentation)? needed", re.I), "Frag needed"),
    (re.compile(r"destination host unreachable", re.I), "Destination Host Unreachable"),
    (re.compile(r"destination net unreachable", re.I), "Destination Net Unreachable"),
    (re.compile(r"network is unreachable", re.I), "Network is unreachable"),
    (re.compile(r"no such device", re.I), "No such device"),
    (
        re.compile(r"name or service not known|unknown host|temporary failure in name", re.I),
        "unknown host",
    ),
    (re.compile(r"cannot assign requested address", re.I), "Cannot assign requested address"),
    (re.compile(r"operation not permitted", re.I), "Operation not permitted"),
)
_PING_MTU = re.compile(r"mtu\s*=\s*(?P<mtu>\d+)", re.I)


def parse_ping(text: str) -> PingResult:
    """Parse ping output. Output with an error but no statistics (``ping: connect:
    Network is unreachable``) gives 0 transmitted, 100 % loss and the error."""
    stats: re.Match[str] | None = None
    rtt_avg: float | None = None
    errors: list[str] = []
    error_mtu: int | None = None
    for _lineno, line in _lines(text):
        stripped = line.strip()
        if stats is None and (m := _PING_STATS.search(stripped)) is not None:
            stats = m
            continue
        if (m := _PING_RTT.match(stripped)) is not None:
            rtt_avg = float(m["avg"])
            continue
        for pattern, kind in _PING_ERRORS:
            if pattern.search(stripped):
                if kind not in errors:
                    errors.append(kind)
                if error_mtu is None and (mm := _PING_MTU.search(stripped)) is not None:
                    error_mtu = int(mm["mtu"])
                break
    if stats is None:
        if errors:
            return PingResult(0, 0, 100.0, None, tuple(errors), error_mtu)
        first = next((line for _, line in _lines(text)), None)
        raise ParseError("ping", "no 'packets transmitted' statistics line", first, 1)
    return PingResult(
        int(stats["tx"]), int(stats["rx"]), float(stats["loss"]), rtt_avg, tuple(errors), error_mtu
    )
