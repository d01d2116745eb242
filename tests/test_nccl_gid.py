"""The RoCE GID index NCCL uses: the sysfs probe's parser, NCCL's auto-selection
(src/transport/net_ib/connect.cc ncclIbGetGidIndex), and the checks' messages."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.nccl.gid_check import check_gid_same, check_gid_v2, gid_choices
from pytest_spark.infra.nccl.gid_parse import GID_PROBE, nccl_gid_index, parse_gid_probe

DEVS = ("rocep1s0f1", "roceP2p1s0f1")
LINK_LOCAL = "fe80:0000:0000:0000:0e42:a1ff:fe6b:2b4e"


def v4(addr: str) -> str:
    a, b, c, d = (int(x) for x in addr.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def probe(tables: dict[str, list[tuple[str, str | None]]]) -> str:
    """The probe's output (``grep -H .`` of gids/ and gid_attrs/types/) for GID tables given
    as ``{dev: [(gid, type), ...]}`` by index, as a ConnectX port lists them: a v1 and a v2
    GID per address (the link-local one first, then each IPv4 address)."""
    gids, types = [], []
    for dev, entries in tables.items():
        base = f"/sys/class/infiniband/{dev}/ports/1"
        for i, (gid, kind) in enumerate(entries):
            gids.append(f"{base}/gids/{i}:{gid}")
            if kind is not None:
                types.append(f"{base}/gid_attrs/types/{i}:{kind}")
    return "\n".join(gids + types) + "\n"


def port(addr: str, v2: str = "RoCE v2") -> list[tuple[str, str | None]]:
    return [
        (LINK_LOCAL, "IB/RoCE v1"),
        (LINK_LOCAL, "RoCE v2"),
        (v4(addr), "IB/RoCE v1"),
        (v4(addr), v2),
    ]


def healthy(addr: str = "198.19.0.1") -> str:
    return probe({DEVS[0]: port(addr), DEVS[1]: port(addr.replace(".0.", ".1."))})


def test_parser_reads_every_port() -> None:
    tables = parse_gid_probe(healthy())
    assert tables is not None and sorted(tables) == sorted(DEVS)
    t = tables["rocep1s0f1"]
    assert [e.index for e in t.entries] == [0, 1, 2, 3]
    assert t.entry(3).type == "RoCE v2" and t.entry(3).ipv4 == "198.19.0.1"
    assert t.entry(3).family == "AF_INET" and t.entry(0).family == "AF_INET6"
    assert not t.entry(0).valid and t.entry(3).valid  # link local is not valid for NCCL
    assert t.entry(7).gid == "0000:0000:0000:0000:0000:0000:0000:0000"  # unconfigured


def test_parser_says_when_there_is_no_sysfs_and_refuses_garbage() -> None:
    assert parse_gid_probe("pytest_spark: no /sys/class/infiniband\n") is None
    with pytest.raises(ParseError, match="not a GID"):
        parse_gid_probe("/sys/class/infiniband/x/ports/1/gids/0:zz\n")
    with pytest.raises(ParseError):
        parse_gid_probe("Permission denied\n")


def test_auto_selection_picks_the_ipv4_roce_v2_gid() -> None:
    tables = parse_gid_probe(healthy())
    assert tables is not None
    assert nccl_gid_index(tables["rocep1s0f1"]) == (3, False)
    # an operator's NCCL_IB_GID_INDEX wins; -1 is NCCL's default (auto)
    assert nccl_gid_index(tables["rocep1s0f1"], {"NCCL_IB_GID_INDEX": "1"}) == (1, True)
    assert nccl_gid_index(tables["rocep1s0f1"], {"NCCL_IB_GID_INDEX": "-1"}) == (3, False)
    # NCCL_IB_ROCE_VERSION_NUM=1 asks for v1; AF_INET6 for a non-mapped GID
    assert nccl_gid_index(tables["rocep1s0f1"], {"NCCL_IB_ROCE_VERSION_NUM": "1"}) == (2, False)
    assert nccl_gid_index(tables["rocep1s0f1"], {"NCCL_IB_ADDR_FAMILY": "AF_INET6"}) == (0, False)


def test_auto_selection_honours_the_address_range() -> None:
    two = [*port("10.0.0.5"), (v4("198.19.0.1"), "IB/RoCE v1"), (v4("198.19.0.1"), "RoCE v2")]
    tables = parse_gid_probe(probe({"rocep1s0f1": two}))
    assert tables is not None
    table = tables["rocep1s0f1"]
    assert nccl_gid_index(table) == (3, False)  # the first IPv4 v2 GID stays chosen
    assert nccl_gid_index(table, {"NCCL_IB_ADDR_RANGE": "198.19.0.0/24"}) == (5, False)


def test_roce_v1_only_port_falls_back_to_v1_and_fails() -> None:
    # `spark-sim fault gid-v1` (and a port whose RoCE mode is v1): no v2 IPv4 GID
    text = probe({DEVS[0]: port("198.19.0.2", v2="IB/RoCE v1"), DEVS[1]: port("198.19.1.2")})
    tables = parse_gid_probe(text)
    assert tables is not None
    assert nccl_gid_index(tables["rocep1s0f1"]) == (2, False)
    finding = check_gid_v2("spark-worker-1", tables, {}, DEVS)
    assert not finding.ok
    msg = finding.message
    assert msg.startswith("spark-worker-1: rocep1s0f1: NCCL's GID index 2 (auto-selected)")
    assert "resolves to 0000:0000:0000:0000:0000:ffff:c613:0002 IB/RoCE v1" in msg
    assert "/sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/2" in msg
    assert "expected RoCE v2 GID" in msg and "cma_roce_mode -d rocep1s0f1 -p 1" in msg
    assert "roceP2p1s0f1" not in msg  # the healthy twin is not blamed
    assert "[3]" in finding.evidence["rocep1s0f1 GID table"]


def test_forced_index_pointing_at_v1_names_the_v2_index() -> None:
    tables = parse_gid_probe(healthy())
    finding = check_gid_v2("spark-head", tables, {"NCCL_IB_GID_INDEX": "2"}, DEVS)
    assert not finding.ok
    assert "NCCL's GID index 2 (NCCL_IB_GID_INDEX)" in finding.message
    assert "set NCCL_IB_GID_INDEX=3 (the RoCE v2 GID of 198.19.0.1)" in finding.message


def test_empty_entry_fails() -> None:
    tables = parse_gid_probe(healthy())
    finding = check_gid_v2("spark-head", tables, {"NCCL_IB_GID_INDEX": "9"}, DEVS)
    assert not finding.ok and "(no type: empty entry)" in finding.message


def test_healthy_node_passes_and_missing_sysfs_fails() -> None:
    finding = check_gid_v2("spark-head", parse_gid_probe(healthy()), {}, DEVS)
    assert finding.ok and "rocep1s0f1 port 1: index 3 (auto-selected)" in finding.message
    gone = check_gid_v2("spark-head", None, {}, DEVS)
    assert not gone.ok and "modprobe mlx5_ib" in gone.message
    half = check_gid_v2("spark-head", parse_gid_probe(probe({DEVS[0]: port("1.2.3.4")})), {}, DEVS)
    assert not half.ok and "roceP2p1s0f1: no GID table" in half.message


def test_same_index_on_every_node() -> None:
    head = gid_choices(parse_gid_probe(healthy()) or {}, {}, DEVS)
    worker = gid_choices(parse_gid_probe(healthy("198.19.0.2")) or {}, {}, DEVS)
    assert check_gid_same({"spark-head": head, "spark-worker-1": worker}, "spark-head").ok
    odd = gid_choices(
        parse_gid_probe(healthy("198.19.0.2")) or {}, {"NCCL_IB_GID_INDEX": "1"}, DEVS
    )
    finding = check_gid_same({"spark-head": head, "spark-worker-1": odd}, "spark-head")
    assert not finding.ok and finding.node == "spark-worker-1"
    assert "spark-worker-1 rocep1s0f1: GID index 1" in finding.message
    assert "spark-head: 3" in finding.message and "NCCL_IB_GID_INDEX" in finding.message


def test_probe_reads_a_sysfs_like_tree(tmp_path: Path) -> None:
    """The probe's shell on a tree laid out as sysfs is (its root swapped for tmp_path)."""
    root = tmp_path / "sys" / "class" / "infiniband"
    for dev in DEVS:
        for i, (gid, kind) in enumerate([*port("198.19.0.1"), ("0000" + ":0000" * 7, None)]):
            (root / dev / "ports/1/gids").mkdir(parents=True, exist_ok=True)
            (root / dev / "ports/1/gid_attrs/types").mkdir(parents=True, exist_ok=True)
            (root / dev / "ports/1/gids" / str(i)).write_text(gid + "\n")
            if kind:
                (root / dev / "ports/1/gid_attrs/types" / str(i)).write_text(kind + "\n")
    script = GID_PROBE.replace("/sys/class/infiniband", str(root))
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    tables = parse_gid_probe(out.replace(str(root), "/sys/class/infiniband"))
    assert tables is not None and [e.index for e in tables[DEVS[0]].entries] == [0, 1, 2, 3]
    none = subprocess.run(
        ["sh", "-c", GID_PROBE.replace("/sys/class/infiniband", str(tmp_path / "nope"))],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert parse_gid_probe(none.replace(str(tmp_path / "nope"), "/sys/class/infiniband")) is None


def shifted(addr: str) -> list[tuple[str, str | None]]:
    """A port whose IPv6 address took index 2/3 before its IPv4 one (`fault gid-shift`)."""
    v6 = "2001:0002:0000:0000:0000:0000:0000:0002"
    return [*port(addr)[:2], (v6, "IB/RoCE v1"), (v6, "RoCE v2"), *port(addr)[2:]]


def test_ipv6_address_ahead_shifts_the_index_and_the_message_says_which() -> None:
    text = probe({DEVS[0]: shifted("198.19.0.2"), DEVS[1]: shifted("198.19.1.2")})
    tables = parse_gid_probe(text)
    assert tables is not None
    assert nccl_gid_index(tables[DEVS[0]]) == (5, False)  # still the IPv4 RoCE v2 GID
    assert check_gid_v2("spark-worker-1", tables, {}, DEVS).ok  # its own check passes
    head = gid_choices(parse_gid_probe(healthy()) or {}, {}, DEVS)
    odd = gid_choices(tables, {}, DEVS)
    finding = check_gid_same({"spark-head": head, "spark-worker-1": odd}, "spark-head")
    assert not finding.ok and finding.node == "spark-worker-1"
    msg = finding.message
    assert "spark-worker-1 rocep1s0f1: GID index 5" in msg and "spark-head: 3" in msg
    assert "roceP2p1s0f1: GID index 5" in msg
    assert "spark-worker-1's GID tables have rocep1s0f1 [2] 2001:2::2 (IPv6) IB/RoCE v1, " in msg
    assert "[3] 2001:2::2 (IPv6) RoCE v2" in msg and "which spark-head's lack" in msg
    assert "[4]" not in msg  # the fabric address's own v1 GID is not the extra one
    assert "Remove it on spark-worker-1" in msg
    assert "one NCCL_IB_GID_INDEX on every node does not fix this" in msg
    # the head with the extra address: the head's table is named, the worker still odd
    flipped = check_gid_same(
        {"spark-head": odd, "spark-worker-1": head}, "spark-head"
    ).message  # fmt: skip
    assert "spark-head's GID tables have rocep1s0f1 [2] 2001:2::2" in flipped
    assert "which spark-worker-1's lack" in flipped


def test_no_rdma_on_the_nodes_is_one_failure() -> None:
    """Issue #25 part 4: no RDMA on the nodes failed test_roce_gid_is_v2 on each node and
    test_transport_is_rdma_on_the_fabric: 3 failures for one cause. The first node's GID
    check names every node; the others, and the transport check, skip citing it."""
    from pytest_spark.infra.nccl.gid_check import check_gid_v2, no_rdma_cause

    both = ["spark-head", "spark-worker-1"]
    assert no_rdma_cause(both, "spark-head") is None  # the owner
    finding = check_gid_v2("spark-head", None, None, ["rocep1s0f1"], both)
    assert not finding.ok
    assert "nor on spark-worker-1" in finding.message
    assert "modprobe mlx5_ib) on spark-head, spark-worker-1" in finding.message
    worker = no_rdma_cause(both, "spark-worker-1")
    assert worker is not None
    assert worker.endswith("(test_roce_gid_is_v2[spark-head] has the evidence)")
    transport = no_rdma_cause(both, None)
    assert transport is not None and "no RDMA on spark-head, spark-worker-1" in transport
    # one node without RDMA: its own check fails; the node with RDMA checks its own GID
    assert no_rdma_cause(["spark-worker-1"], "spark-worker-1") is None
    assert no_rdma_cause(["spark-worker-1"], "spark-head") is None
    assert no_rdma_cause([], None) is None
    alone = check_gid_v2("spark-worker-1", None, None, ["rocep1s0f1"], ["spark-worker-1"])
    assert "nor on" not in alone.message
