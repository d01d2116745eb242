"""Is each ConnectX-7 function's PCIe link trained at what it is capable of?

A DGX Spark reaches its 200 GbE QSFP ports through two PCIe Gen5 x4 links (32 GT/s, ~100
Gb/s each), one per "twin" of every port: the fabric's bandwidth is the two links'. A link
that trains narrower or slower than its capability (lspci's ``LnkSta`` below ``LnkCap``,
sysfs's ``current_link_*`` below ``max_link_*``) carries that much less, with no error
anywhere: the ASUS Ascent GX10's second ConnectX-7 link trains at Gen5 x2 (NVIDIA
developer forum, "ASUS Ascent GX10 — Second ConnectX-7 PCIe slot wired at Gen5 x2 instead
of x4", thread 367853: the DGX Spark FE's four functions all at 32GT/s x4, the GX10's
0002:01:00.x at x2, "(downgraded)", halving that NIC's bandwidth).

The floor is the device's own capability (no profile figure): a link at full width and
speed passes whatever they are. Pure: facts in, a Finding (or a Skip) out.
"""

from __future__ import annotations

from pytest_spark.infra.finding import Finding, Skip
from pytest_spark.infra.pcie.probe import NodePcie, PcieLink

__all__ = ["check_pcie_links", "link_text"]

GENERATIONS = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}
FIX = (
    "compare `sudo lspci -vv -s @PCI@ | grep -E 'LnkCap|LnkSta'` (LnkSta says (downgraded)); a "
    "link that trained down after a warm reboot comes back after a cold power cycle (power "
    "off, unplug 60 s); one that is always narrower is the board's wiring (the ASUS Ascent "
    "GX10's second ConnectX-7 link is x2: NVIDIA developer forum thread 367853): expect that "
    "twin at half rate, or serve from nodes whose links train at x4"
)


def link_text(speed: float | None, width: int | None) -> str:
    """``32.0 GT/s (Gen5) x4``, ``?`` for what sysfs could not say."""
    gen = GENERATIONS.get(speed) if speed is not None else None
    rate = "? GT/s" if speed is None else f"{speed:.1f} GT/s" + (f" (Gen{gen})" if gen else "")
    return f"{rate} x{width if width is not None else '?'}"


def _where(link: PcieLink) -> str:
    return f"{link.dev} ({link.pci})" if link.pci else link.dev


def _degraded_text(node: str, bad: list[PcieLink]) -> str:
    parts = [
        f"{_where(link)} trained at {link_text(link.speed, link.width)}, capable of "
        f"{link_text(link.max_speed, link.max_width)}"
        for link in bad
    ]
    fix = FIX.replace("@PCI@", next((link.pci for link in bad if link.pci), "ADDRESS"))
    return (
        f"{node}: ConnectX-7 PCIe link below its capability: {'; '.join(parts)}; expected every "
        "RDMA function at its full width and speed (on a DGX Spark each twin of a 200 GbE port "
        "is its own Gen5 x4 path of ~100 Gb/s, so a twin at x2 carries half and NCCL's bus "
        f"bandwidth falls with it). Fix: {fix}"
    )


def check_pcie_links(node: str, facts: NodePcie) -> Finding | Skip:
    """Every RDMA function's link at its own maximum width and speed: fails naming each one
    below it; warns when sysfs could not say; skips a node without RDMA devices (the links
    checks own that)."""
    if facts.no_rdma or (facts.error is None and not facts.links):
        return Skip(
            f"{node}: no RDMA device in /sys/class/infiniband: no ConnectX-7 PCIe link to read "
            "(test_roce_active reports the missing RDMA stack)"
        )
    if facts.error is not None:
        return Finding.warned(
            None,
            "each RDMA function's PCIe link",
            node=node,
            message=f"{node}: the PCIe links could not be read ({facts.error})",
        )
    bad = [link for link in facts.links if link.degraded]
    if bad:
        return Finding.failed(
            "; ".join(f"{link.dev} {link_text(link.speed, link.width)}" for link in bad),
            "; ".join(f"{link.dev} {link_text(link.max_speed, link.max_width)}" for link in bad),
            node=node,
            message=_degraded_text(node, bad),
        )
    unread = [link.dev for link in facts.links if not link.read]
    if unread:
        return Finding.warned(
            None,
            "each RDMA function's PCIe link",
            node=node,
            message=f"{node}: sysfs gives no PCIe link width or speed for {', '.join(unread)} "
            "(a virtual function, or a kernel without the attributes): not judged",
        )
    widest = sorted({link_text(link.speed, link.width) for link in facts.links})
    return Finding.passed(
        ", ".join(widest),
        "each function at its capability",
        node=node,
        message=f"{node}: {len(facts.links)} RDMA functions at their full PCIe link "
        f"({', '.join(widest)})",
    )
