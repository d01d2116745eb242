"""The probe of a node's fabric counters, read around each measurement (not in the
shared host round trip: a reading is only worth something before and after traffic).

``counters_probe_command()`` is one ``sh -c`` command with one marker-framed section,
``ports``: for each RDMA device ``ibdev2netdev`` maps to a netdev, a ``port DEV PORT
NETDEV (STATE)`` line, then ``eth`` + each line of ``ethtool -S NETDEV`` (``eth-error``
+ its stderr when it failed) and ``hw NAME VALUE`` for each file of
``/sys/class/infiniband/DEV/ports/PORT/hw_counters`` (absent when the driver does not
expose it). Read on the host: the directory may be missing inside a container.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_spark.infra.counters.parse import parse_ethtool_stats
from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.probe import probe_script, split_probe

__all__ = [
    "MARKER",
    "WINDOWS",
    "NodeCounters",
    "PortCounters",
    "Window",
    "counters_probe_command",
    "parse_counters",
]

MARKER = "@@pytest-spark-counters@@"
# The measurements that send traffic over the fabric, and what a message calls them.
WINDOWS = {"collective-run": "the all-reduce run", "throughput-sweep": "the throughput sweep"}

_BODY = r"""
s ports sh -c 'ibdev2netdev | while read -r dev _ port _ netdev state; do
  echo "port $dev $port $netdev $state"
  if out=$(ethtool -S "$netdev" 2>&1); then printf "%s\n" "$out" | sed "s/^/eth /"
  else printf "%s\n" "$out" | tail -n 1 | sed "s/^/eth-error /"; fi
  d="/sys/class/infiniband/$dev/ports/$port/hw_counters"
  if [ -d "$d" ]; then for f in "$d"/*; do echo "hw ${f##*/} $(cat "$f" 2>/dev/null)"; done; fi
done'
rm -f "$t"
"""


def counters_probe_command(*, timeout_s: int = 20) -> str:
    """The node probe as one ``sh -c`` command."""
    return probe_script(MARKER, "counters", timeout_s, _BODY)


@dataclass(frozen=True)
class PortCounters:
    """One port's counters: ``eth`` from ``ethtool -S`` (None with ``eth_error``),
    ``roce`` from its RDMA device's hw_counters (empty when not exposed)."""

    dev: str
    netdev: str
    eth: dict[str, int] | None
    eth_error: str | None = None
    roce: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeCounters:
    """Every port's counters (``error``: why none could be read)."""

    ports: tuple[PortCounters, ...]
    error: str | None = None

    def port(self, netdev: str) -> PortCounters | None:
        return next((p for p in self.ports if p.netdev == netdev), None)


@dataclass(frozen=True)
class Window:
    """One measurement's readings: node -> counters (or why they could not be read)."""

    name: str
    before: dict[str, NodeCounters | str]
    after: dict[str, NodeCounters | str]

    @property
    def what(self) -> str:
        return WINDOWS.get(self.name, self.name)


def parse_counters(text: str) -> NodeCounters:
    """The facts from the probe's output (``ParseError`` on a counter line that does not
    read)."""
    _, sections = split_probe(text, MARKER, "counters probe")
    section = sections.get("ports")
    if section is None or (section.rc != 0 and not section.stdout.strip()):
        why = section.problem() if section is not None else "not probed"
        return NodeCounters((), f"ibdev2netdev: {why or 'no RDMA device'}")
    ports: list[PortCounters] = []
    # The port being read: dev, netdev, its ethtool lines, its error, its hw counters.
    cur: tuple[str, str, list[str], list[str], dict[str, int]] | None = None

    def close() -> None:
        if cur is not None:
            dev, netdev, eth, error, roce = cur
            stats = None if error else parse_ethtool_stats("\n".join(eth))
            ports.append(PortCounters(dev, netdev, stats, error[0] if error else None, roce))

    for line in section.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "port":
            close()
            words = rest.split()
            if len(words) < 3:
                raise ParseError("counters probe", "expected `port DEV PORT NETDEV`", line)
            cur = (words[0], words[2], [], [], {})
        elif cur is None or not line.strip():
            continue
        elif kind == "eth":
            cur[2].append(rest)
        elif kind == "eth-error":
            cur[3].append(rest.strip() or "ethtool -S failed")
        elif kind == "hw":
            name, _, value = rest.partition(" ")
            if value.strip().isdigit():
                cur[4][name] = int(value)
    close()
    return NodeCounters(tuple(ports))
