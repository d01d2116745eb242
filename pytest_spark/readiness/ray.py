"""``ray status`` output -> active/pending nodes and resource usage."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

USAGE = re.compile(
    r"^\s*(?P<used>[\d.]+)(?P<uunit>[KMGT]?i?B)?/(?P<total>[\d.]+)"
    r"(?P<tunit>[KMGT]?i?B)? (?P<name>\S+)"
)


@dataclass(frozen=True)
class RayStatus:
    active: list[str]
    pending: list[str]
    failures: list[str]
    usage: dict[str, tuple[float, float]] = field(default_factory=dict)

    def total(self, resource: str) -> float:
        return self.usage.get(resource, (0.0, 0.0))[1]


def parse_ray_status(text: str) -> RayStatus:
    """Parse the autoscaler summary printed by ``ray status``."""
    section = None
    active: list[str] = []
    pending: list[str] = []
    failures: list[str] = []
    usage: dict[str, tuple[float, float]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or set(line) <= {"-", "="}:
            continue
        header = line.rstrip(":")
        if line.endswith(":") and header in (
            "Active",
            "Pending",
            "Recent failures",
            "Usage",
            "Demands",
            "Constraints",
        ):
            section = header
            continue
        if line.startswith(("Node status", "Resources", "======")):
            section = None
            continue
        if line.startswith("(no "):
            continue
        if section == "Active":
            active.append(line)
        elif section == "Pending":
            pending.append(line)
        elif section == "Recent failures":
            failures.append(line)
        elif section == "Usage":
            m = USAGE.match(line)
            if m:
                usage[m.group("name")] = (float(m.group("used")), float(m.group("total")))
    if not active and "Usage" not in text:
        raise ValueError(f"not ray status output: {text[:200]!r}")
    return RayStatus(active, pending, failures, usage)
