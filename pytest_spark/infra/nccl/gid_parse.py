"""RoCE GID tables from sysfs, and the GID index NCCL picks from them.

The probe (:data:`GID_PROBE`, run on each node) prints ``path:value`` lines, as
``grep -H .`` does, for every configured GID (``/sys/class/infiniband/DEV/ports/PORT/gids/N``,
the all-zero entries left out) and every readable GID type (``.../gid_attrs/types/N``:
``IB/RoCE v1`` or ``RoCE v2``; an unused entry's type cannot be read). :func:`parse_gid_probe`
reads them into one :class:`GidTable` per HCA port.

:func:`nccl_gid_index` is NCCL's own choice (src/transport/net_ib/connect.cc,
``ncclIbGetGidIndex`` and ``ncclUpdateGidIndex``): ``NCCL_IB_GID_INDEX`` when set to an
index >= 0 (its default is -1); else, starting at 0, each later index replaces the choice
when it is of the wanted address family (``NCCL_IB_ADDR_FAMILY``, default ``AF_INET``: an
IPv4-mapped GID) and the current is not, or when it is a valid GID (configured, not link
local) of that family whose RoCE version is ``NCCL_IB_ROCE_VERSION_NUM`` (default 2)
while the current one's version differs or the current is not valid. ``NCCL_IB_ADDR_RANGE``
(a subnet the GID must be in) is honoured for IPv4.

Pure: text in, frozen dataclasses out.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pytest_spark.infra.errors import ParseError

__all__ = [
    "GID_PROBE",
    "NO_SYSFS",
    "GidEntry",
    "GidTable",
    "nccl_gid_index",
    "parse_gid_probe",
]

ROOT = "/sys/class/infiniband"
NO_SYSFS = "pytest_spark: no /sys/class/infiniband"
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# One round trip, two processes: grep reads every file (cat per file would be ~1000 forks
# on a ConnectX-7's 4 x 255 entries). Unused types fail to read (EINVAL): -s hides that.
GID_PROBE = (
    f"if [ -d {ROOT} ]; then "
    f"grep -s -H . {ROOT}/*/ports/*/gids/* | grep -v ':{ZERO_GID}$'; "
    f"grep -s -H . {ROOT}/*/ports/*/gid_attrs/types/*; "
    f"true; else echo '{NO_SYSFS}'; fi"
)
_LINE = re.compile(
    r"^/sys/class/infiniband/(?P<dev>[^/]+)/ports/(?P<port>\d+)/"
    r"(?P<kind>gids|gid_attrs/types)/(?P<idx>\d+):(?P<value>.*)$"
)
_GID = re.compile(r"^[0-9a-fA-F]{4}(?::[0-9a-fA-F]{4}){7}$")


@dataclass(frozen=True)
class GidEntry:
    """One GID table entry: its value (``fe80:0000:...``) and RoCE type, as sysfs has them."""

    index: int
    gid: str
    type: str | None  # "RoCE v2", "IB/RoCE v1"; None when sysfs gives none

    @property
    def address(self) -> ipaddress.IPv6Address:
        return ipaddress.IPv6Address(self.gid)

    @property
    def family(self) -> str:
        """``AF_INET`` for an IPv4-mapped GID (or its multicast twin), else ``AF_INET6``."""
        packed = self.address.packed
        mapped = packed[:10] == bytes(10) and packed[10:12] == b"\xff\xff"
        multicast = packed[:4] == b"\xff\x0e\x00\x00" and packed[4:12] == bytes(6) + b"\xff\xff"
        return "AF_INET" if mapped or multicast else "AF_INET6"

    @property
    def valid(self) -> bool:
        """Configured (not all zero, not a bare fe80::) and not link local (NCCL's validGid)."""
        packed = self.address.packed
        if packed == bytes(16) or (packed[:4] == b"\xfe\x80\x00\x00" and packed[4:] == bytes(12)):
            return False
        return not (packed[:4] == b"\xfe\x80\x00\x00" and packed[4:8] == bytes(4))

    @property
    def ipv4(self) -> str | None:
        mapped = self.address.ipv4_mapped
        return str(mapped) if mapped is not None else None

    @property
    def roce_version(self) -> int | None:
        """1 for ``IB/RoCE v1`` / ``RoCE v1``, 2 for ``RoCE v2`` (ncclIbRoceGetVersionNum)."""
        if self.type is None:
            return None
        if self.type.startswith(("IB/RoCE v1", "RoCE v1")):
            return 1
        if self.type.startswith("RoCE v2"):
            return 2
        return None


@dataclass(frozen=True)
class GidTable:
    """One HCA port's configured GIDs, by index."""

    dev: str
    port: int
    entries: tuple[GidEntry, ...]

    def entry(self, index: int) -> GidEntry:
        """The entry at ``index``; an unconfigured one reads as the all-zero GID."""
        for e in self.entries:
            if e.index == index:
                return e
        return GidEntry(index, ZERO_GID, None)

    def describe(self) -> str:
        return "; ".join(f"[{e.index}] {e.gid} {e.type or '(no type)'}" for e in self.entries)


def parse_gid_probe(text: str) -> dict[str, GidTable] | None:
    """``{dev: GidTable}`` (port 1 of each device, the one RoCE uses on a Spark) from the
    probe's output; None when the node has no /sys/class/infiniband."""
    if NO_SYSFS in text:
        return None
    gids: dict[tuple[str, int], dict[int, str]] = {}
    types: dict[tuple[str, int], dict[int, str]] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        m = _LINE.match(line)
        if not m:
            raise ParseError(
                "sysfs gid probe", "not a gids/ or gid_attrs/types/ line", line, lineno
            )
        key, idx, value = (m["dev"], int(m["port"])), int(m["idx"]), m["value"].strip()
        if m["kind"] == "gids":
            if not _GID.match(value):
                raise ParseError("sysfs gid probe", f"not a GID: {value!r}", line, lineno)
            gids.setdefault(key, {})[idx] = value.lower()
        else:
            types.setdefault(key, {})[idx] = value
    tables: dict[str, GidTable] = {}
    for (dev, port), by_index in sorted(gids.items()):
        kinds = types.get((dev, port), {})
        entries = tuple(GidEntry(i, g, kinds.get(i)) for i, g in sorted(by_index.items()))
        if dev not in tables or port < tables[dev].port:
            tables[dev] = GidTable(dev, port, entries)
    return tables


def _in_range(entry: GidEntry, family: str, prefix: ipaddress.IPv4Network | None) -> bool:
    if prefix is None or family != "AF_INET":
        return True
    return entry.ipv4 is not None and ipaddress.IPv4Address(entry.ipv4) in prefix


def nccl_gid_index(table: GidTable, env: Mapping[str, str] | None = None) -> tuple[int, bool]:
    """(the GID index NCCL uses on this RoCE port, whether NCCL_IB_GID_INDEX forced it)."""
    env = env or {}
    raw = (env.get("NCCL_IB_GID_INDEX") or "").strip()
    if raw.lstrip("-").isdigit() and int(raw) >= 0:
        return int(raw), True
    family = (
        "AF_INET6" if (env.get("NCCL_IB_ADDR_FAMILY") or "").strip() == "AF_INET6" else "AF_INET"
    )
    version_raw = (env.get("NCCL_IB_ROCE_VERSION_NUM") or "").strip()
    version = int(version_raw) if version_raw.isdigit() else 2
    prefix: ipaddress.IPv4Network | None = None
    try:
        if env.get("NCCL_IB_ADDR_RANGE") and family == "AF_INET":
            prefix = ipaddress.IPv4Network(env["NCCL_IB_ADDR_RANGE"].strip(), strict=False)
    except ValueError:
        prefix = None  # NCCL ignores a range it cannot read
    chosen = 0
    top = max((e.index for e in table.entries), default=0)
    for cand_index in range(1, top + 1):
        cur, cand = table.entry(chosen), table.entry(cand_index)
        matches = _in_range(cand, family, prefix)
        if cand.family != cur.family and cand.family == family and matches:
            chosen = cand_index
            continue
        if cand.family != family or not cand.valid or not matches:
            continue
        if (
            cur.roce_version != cand.roce_version or not cur.valid
        ) and cand.roce_version == version:
            chosen = cand_index
    return chosen, False
