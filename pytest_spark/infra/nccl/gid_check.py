"""The RoCE GID index NCCL uses: a RoCE v2 GID on every fabric HCA, the same on every node.

Pure: GID tables read from sysfs (:mod:`pytest_spark.infra.nccl.gid_parse`) and the node's NCCL
environment in, :class:`Finding` out. The index is the one NCCL itself would use
(``NCCL_IB_GID_INDEX``, or NCCL's auto-selection when it is unset or -1:
:func:`pytest_spark.infra.nccl.gid_parse.nccl_gid_index`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_spark.infra.finding import Finding
from pytest_spark.infra.nccl.gid_parse import GidEntry, GidTable, nccl_gid_index

__all__ = ["GidChoice", "check_gid_same", "check_gid_v2", "gid_choices", "no_rdma_cause"]

GID_VERDICT = "test_roce_gid_is_v2"

SYSFS = "/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{idx}"


@dataclass(frozen=True)
class GidChoice:
    """The GID NCCL uses on one HCA of one node."""

    dev: str
    port: int
    index: int
    forced: bool  # NCCL_IB_GID_INDEX set
    entry: GidEntry
    table: GidTable | None = None  # the port's whole table (what the index was chosen from)

    @property
    def ok(self) -> bool:
        return self.entry.roce_version == 2 and self.entry.valid

    def text(self) -> str:
        how = "NCCL_IB_GID_INDEX" if self.forced else "auto-selected"
        return (
            f"{self.dev} port {self.port}: index {self.index} ({how}) = {self.entry.gid} "
            f"{self.entry.type or '(no GID type)'}"
        )


def gid_choices(
    tables: Mapping[str, GidTable], env: Mapping[str, str] | None, devs: Sequence[str]
) -> dict[str, GidChoice | None]:
    """``{dev: the GID NCCL uses there}`` for each fabric HCA (None: no GID table)."""
    out: dict[str, GidChoice | None] = {}
    for dev in devs:
        table = tables.get(dev)
        if table is None:
            out[dev] = None
            continue
        index, forced = nccl_gid_index(table, env)
        out[dev] = GidChoice(dev, table.port, index, forced, table.entry(index), table)
    return out


def _v2_index(table: GidTable) -> GidEntry | None:
    """The RoCE v2 GID of an IPv4 address on this port, if the table has one."""
    for e in table.entries:
        if e.roce_version == 2 and e.valid and e.family == "AF_INET":
            return e
    return None


def check_gid_v2(
    node: str,
    tables: Mapping[str, GidTable] | None,
    env: Mapping[str, str] | None,
    devs: Sequence[str],
    also: Sequence[str] = (),
) -> Finding:
    """On every fabric HCA of ``node``, the GID index NCCL uses resolves to a RoCE v2 GID.
    ``also``: every node without RDMA (no /sys/class/infiniband), named in the failure of
    the first (:func:`no_rdma_cause`)."""
    expected = "RoCE v2 GID"
    if tables is None:
        others = [n for n in also if n != node]
        same = f" (nor on {', '.join(others)}: one cause, this failure)" if others else ""
        return Finding.failed(
            "no /sys/class/infiniband",
            expected,
            node=node,
            message=f"{node}: /sys/class/infiniband does not exist{same}, expected a RoCE v2 "
            f"GID on {', '.join(devs)}: the RDMA drivers are not loaded, so NCCL cannot use "
            "RoCE and falls back to TCP sockets. Load them (modprobe mlx5_ib) on "
            f"{', '.join([node, *others])} (they come with the DOCA-host / MLNX_OFED "
            "packages: install those where modprobe finds no mlx5_ib) and check "
            "ibdev2netdev lists the fabric twins.",
        )
    choices = gid_choices(tables, env, devs)
    bad = []
    for dev, choice in choices.items():
        table = tables.get(dev)
        if choice is None or table is None:
            bad.append(
                f"{dev}: no GID table in /sys/class/infiniband/{dev}/ports/*/gids (HCA "
                "missing or without addresses); expected a RoCE v2 GID. Check ibdev2netdev "
                "and that the fabric interface has its IPv4 address."
            )
            continue
        if choice.ok:
            continue
        path = SYSFS.format(dev=dev, port=choice.port, idx=choice.index)
        v2 = _v2_index(table)
        measured = (
            f"{dev}: NCCL's GID index {choice.index} "
            f"({'NCCL_IB_GID_INDEX' if choice.forced else 'auto-selected'}) resolves to "
            f"{choice.entry.gid} {choice.entry.type or '(no type: empty entry)'} ({path})"
        )
        if choice.forced and v2 is not None:
            fix = (
                f"set NCCL_IB_GID_INDEX={v2.index} (the RoCE v2 GID of {v2.ipv4}) or unset it "
                "(NCCL then picks the RoCE v2 IPv4 GID itself)."
            )
        elif choice.forced:
            fix = (
                "and this port has no RoCE v2 GID of an IPv4 address at all: give the fabric "
                "interface its address, check the RoCE mode (cma_roce_mode -d "
                f"{dev} -p {choice.port}; set -m 2), then set NCCL_IB_GID_INDEX to that GID's "
                "index or unset it."
            )
        else:
            fix = (
                "no RoCE v2 GID of an IPv4 address on this port, so NCCL falls back to "
                "RoCE v1 (not routable; a peer on v2 cannot connect). Usually the RoCE mode "
                f"is v1 (cma_roce_mode -d {dev} -p {choice.port}; set -m 2) or the fabric "
                "interface lost its IPv4 address (each address adds a v1 and a v2 GID)."
            )
        bad.append(f"{measured}, expected {expected}: {fix}")
    evidence = {f"{dev} GID table": tables[dev].describe() for dev in devs if dev in tables}
    if bad:
        return Finding.failed(
            "; ".join(
                c.text() if c is not None else f"{d}: no GID table" for d, c in choices.items()
            ),
            expected,
            node=node,
            message=f"{node}: " + f"\n{node}: ".join(bad),
            evidence=evidence,
        )
    summary = "; ".join(c.text() for c in choices.values() if c is not None)
    return Finding("pass", summary, expected, None, f"{node}: {summary}", node, evidence)


def _before(choice: GidChoice) -> list[GidEntry]:
    """The GIDs of other addresses (configured, not link local) ahead of the chosen one."""
    if choice.table is None:
        return []
    return [
        e
        for e in choice.table.entries
        if e.index < choice.index and e.valid and e.gid != choice.entry.gid
    ]


def _what(entries: list[GidEntry]) -> str:
    """``[2] 2001:2:0:0::2 (IPv6) IB/RoCE v1, [3] ... RoCE v2``."""
    return ", ".join(
        f"[{e.index}] {e.ipv4 or e.address.compressed} "
        f"({'IPv4' if e.family == 'AF_INET' else 'IPv6'}) {e.type or '(no type)'}"
        for e in entries
    )


def _extra(node: str, theirs: GidChoice, head: str, want: GidChoice) -> tuple[str, str, str]:
    """Why two auto-selected indexes differ: (the node whose table has entries ahead of its
    RoCE v2 IPv4 GID that the other's lacks, the other node, ``DEV [i] GID ...``)."""
    mine, ref = _before(theirs), _before(want)
    if len(mine) >= len(ref):
        return node, head, f"{theirs.dev} {_what(mine)}" if mine else ""
    return head, node, f"{want.dev} {_what(ref)}"


def _shift_fix(extras: Mapping[tuple[str, str], list[str]]) -> str:
    out = []
    for (who, other), tables in extras.items():
        out.append(
            f" {who}'s GID tables have {'; '.join(tables)} ahead of the RoCE v2 IPv4 GID, "
            f"which {other}'s lack: an extra address on {who}'s fabric interfaces (an IPv6 "
            "address from SLAAC or netplan, a VLAN, a second IPv4 address) took those slots "
            f"first. Remove it on {who} (ip addr del ..., and from its netplan config) or "
            "re-add the fabric address before it, so that the tables line up; one "
            f"NCCL_IB_GID_INDEX on every node does not fix this (on {who} that index names "
            "the extra address's GID)."
        )
    return "".join(out)


def check_gid_same(choices: Mapping[str, Mapping[str, GidChoice | None]], head: str) -> Finding:
    """NCCL's GID index is the same on every node, HCA by HCA (compared with the head).
    Give only the nodes whose own GID resolves to RoCE v2: an odd one's check names it."""
    where = "cluster"
    ref = choices.get(head)
    if ref is None:
        return Finding.passed(
            None, "same GID index", node=where,
            message=f"{where}: {head}'s GID index is not known (its own check has it); "
            "nothing to compare with",
        )  # fmt: skip
    odd = []
    extras: dict[tuple[str, str], list[str]] = {}
    forced = False
    for node, mine in choices.items():
        if node == head:
            continue
        for dev, theirs in mine.items():
            want = ref.get(dev)
            if want is None or theirs is None or theirs.index == want.index:
                continue
            odd.append(
                f"{node} {dev}: GID index {theirs.index} ({theirs.entry.gid}), {head}: "
                f"{want.index} ({want.entry.gid})"
            )
            if theirs.forced or want.forced:
                forced = True
            else:
                who, other, what = _extra(node, theirs, head, want)
                if what:
                    extras.setdefault((who, other), []).append(what)
    expected = "the head's index on every node"
    if odd:
        if forced or not extras:
            advice = (
                " Set NCCL_IB_GID_INDEX to one value on every node (launch-cluster.sh's .env "
                "or -e) or unset it everywhere; a different auto-selected index means a "
                "different GID table (an extra address or VLAN on one node's fabric "
                "interface)."
            )
        else:
            advice = _shift_fix(extras)
        return Finding.failed(
            "; ".join(odd),
            expected,
            node=odd[0].split(" ", 1)[0],
            message=f"{where}: NCCL's RoCE GID index differs between nodes: "
            + "; ".join(odd)
            + ", expected the same index on every node."
            + advice,
        )
    nodes = ", ".join(choices)
    indexes = ", ".join(f"{d}={c.index}" for d, c in ref.items() if c is not None)
    return Finding.passed(
        indexes, expected, node=where, message=f"{where}: GID index {indexes} on {nodes}"
    )


def no_rdma_cause(without: Sequence[str], node: str | None) -> str | None:
    """No RDMA on the nodes is one cause: the GID check of the first node in ``without``
    (the nodes with no /sys/class/infiniband, in the cluster's order) fails naming them
    all. The skip reason of a check that meets it elsewhere (another such node's GID
    check; ``node`` None: the NCCL transport check, whose socket fallback it causes), or
    None where that check is the owner or every node has RDMA."""
    if not without or node == without[0] or (node is not None and node not in without):
        return None
    here = f"{node}: " if node is not None else ""
    return (
        f"{here}no RDMA on {', '.join(without)} (/sys/class/infiniband missing: the RDMA "
        f"drivers are not loaded), so NCCL cannot use RoCE ({GID_VERDICT}[{without[0]}] has "
        "the evidence)"
    )
