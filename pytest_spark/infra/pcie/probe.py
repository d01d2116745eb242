"""The PCIe link of each RDMA device's function, read from sysfs in the node's shared host
round trip, and the facts parsed from it.

``pcie_probe_command()`` prints, for every ``/sys/class/infiniband/DEV`` (a DGX Spark has
four: the two ConnectX-7 functions of each of its two PCIe Gen5 x4 links), ``dev DEV
PCI_SLOT_NAME`` and then the four attributes the kernel writes for a PCIe device
(drivers/pci/pci-sysfs.c; Documentation/ABI/testing/sysfs-bus-pci)::

    current_link_speed 32.0 GT/s PCIe      (what the link trained at: lspci's LnkSta)
    current_link_width 4
    max_link_speed 32.0 GT/s PCIe          (what the device can do: lspci's LnkCap)
    max_link_width 4

Kernels before 5.7 print the speed without the `` PCIe`` suffix (``8 GT/s``), and
``Unknown`` where the link reports none. The section exits 3 when the node has no
``/sys/class/infiniband`` (no RDMA stack: the links checks report that). Recorded values:
``fixtures/pcie/`` (its README names the source).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.hostprobe import HostProbe
from pytest_spark.infra.probe import probe_script, split_probe

__all__ = [
    "HOST_PROBE",
    "NO_RDMA_RC",
    "NodePcie",
    "PcieLink",
    "parse_pcie_probe",
    "parse_speed",
    "pcie_probe_command",
]

MARKER = "@@pytest-spark-pcie@@"
NO_RDMA_RC = 3
ATTRS = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")

_BODY = r"""
s pcie sh -c '[ -d /sys/class/infiniband ] || { echo "no /sys/class/infiniband" >&2; exit @RC@; }
  for d in /sys/class/infiniband/*; do
    [ -d "$d/device" ] || continue
    p=$(sed -n "s/^PCI_SLOT_NAME=//p" "$d/device/uevent" 2>/dev/null)
    echo "dev ${d##*/} ${p:--}"
    for f in @ATTRS@; do v=$(cat "$d/device/$f" 2>/dev/null); echo "$f ${v:--}"; done
  done'
rm -f "$t"
"""


def pcie_probe_command(timeout_s: int = 10) -> str:
    """The node probe as one ``sh -c`` command."""
    body = _BODY.replace("@RC@", str(NO_RDMA_RC)).replace("@ATTRS@", " ".join(ATTRS))
    return probe_script(MARKER, "pcie", timeout_s, body)


_SPEED = re.compile(r"^(\d+(?:\.\d+)?) GT/s(?: PCIe)?$")


def parse_speed(text: str) -> float | None:
    """``32.0 GT/s PCIe`` (or ``8 GT/s`` before kernel 5.7) -> 32.0; ``Unknown`` or an
    unreadable file (``-``) -> None. Any other text is not this attribute."""
    text = text.strip()
    if text in ("-", "") or text.lower().startswith("unknown"):
        return None
    m = _SPEED.match(text)
    if m is None:
        raise ParseError("pcie probe", "expected a link speed such as `32.0 GT/s PCIe`", text)
    return float(m[1])


def _width(text: str) -> int | None:
    text = text.strip()
    if text in ("-", "", "0"):
        return None
    if not text.isdigit():
        raise ParseError("pcie probe", "expected a link width such as `4`", text)
    return int(text)


def _below(now: float | None, most: float | None) -> bool:
    return now is not None and most is not None and now < most


@dataclass(frozen=True)
class PcieLink:
    """One RDMA device's PCIe function: its link now (``speed``, ``width``) and what it is
    capable of (``max_speed``, ``max_width``); None where sysfs could not say."""

    dev: str
    pci: str | None
    speed: float | None
    width: int | None
    max_speed: float | None
    max_width: int | None

    @property
    def degraded(self) -> bool:
        """Trained below what it can do, in width or speed (both sides read)."""
        return _below(self.speed, self.max_speed) or _below(self.width, self.max_width)

    @property
    def read(self) -> bool:
        return None not in (self.speed, self.width, self.max_speed, self.max_width)


@dataclass(frozen=True)
class NodePcie:
    """A node's RDMA functions and their links; ``error`` says why none could be read
    (``no_rdma``: the node has no /sys/class/infiniband at all)."""

    links: tuple[PcieLink, ...]
    error: str | None = None
    no_rdma: bool = False


def _links(text: str) -> tuple[PcieLink, ...]:
    out: list[PcieLink] = []
    current: dict[str, str] = {}

    def close() -> None:
        if current:
            out.append(
                PcieLink(
                    current["dev"],
                    None if current.get("pci", "-") == "-" else current["pci"],
                    parse_speed(current.get("current_link_speed", "-")),
                    _width(current.get("current_link_width", "-")),
                    parse_speed(current.get("max_link_speed", "-")),
                    _width(current.get("max_link_width", "-")),
                )
            )

    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "dev":
            close()
            dev, _, pci = value.partition(" ")
            current = {"dev": dev, "pci": pci.strip() or "-"}
        elif key in ATTRS and current:
            current[key] = value
        elif line.strip():
            raise ParseError("pcie probe", "expected `dev DEV PCI` or `ATTRIBUTE VALUE`", line)
    close()
    return tuple(out)


def parse_pcie_probe(text: str) -> NodePcie:
    """Parse :func:`pcie_probe_command` output."""
    _, sections = split_probe(text, MARKER, "pcie probe")
    section = sections.get("pcie")
    if section is None:
        return NodePcie((), "pcie: not probed")
    if section.rc == NO_RDMA_RC:
        return NodePcie((), "no /sys/class/infiniband", no_rdma=True)
    problem = section.problem()
    if problem:
        return NodePcie((), problem)
    return NodePcie(_links(section.stdout))


# Rides the node's one host round trip (infra.roundtrip): sysfs reads, well under a second.
HOST_PROBE: HostProbe[NodePcie] = HostProbe(
    key="pcie",
    command=lambda settings, container: pcie_probe_command(),
    parse=lambda text, settings: parse_pcie_probe(text),
    what="PCIe link",
)
