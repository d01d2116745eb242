"""Names, addresses and CLI parsing of sparksim (pure: no root needed)."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def topology(sparksim: ModuleType) -> ModuleType:
    return importlib.import_module("sparksim_under_test.topology")


def test_two_node_layout_matches_the_contract(topology: ModuleType) -> None:
    topo = topology.build(0, 2)
    assert topo.bridge == "spk0br" and topo.gateway == "198.18.0.1"
    assert not topo.switched
    head, worker = topo.nodes
    assert (head.name, head.role, head.mgmt, head.netns) == (
        "spark-1",
        "head",
        "198.18.0.11",
        "spk0-n1",
    )
    assert (worker.name, worker.role, worker.mgmt, worker.netns) == (
        "spark-2",
        "worker",
        "198.18.0.12",
        "spk0-n2",
    )
    assert [p.as_json() for p in worker.fabric] == [
        {"if": "enp1s0f1np1", "dev": "rocep1s0f1", "addr": "198.19.0.2"},
        {"if": "enP2p1s0f1np1", "dev": "roceP2p1s0f1", "addr": "198.19.1.2"},
    ]


def test_link_names_fit_ifnamsiz_and_match_the_cleanup_pattern(topology: ModuleType) -> None:
    topo = topology.build(15, topology.MAX_NODES)
    assert topo.switched and topo.kind == "switch"
    root = [topo.bridge] + [n.host_veth for n in topo.nodes]
    for name in root:
        assert len(name) <= 15, name
        m = topology.LINK_RE.match(name)
        assert m and m.group(1) == "15", name
    # The switch's bridges and ports live in its own namespace, found by NETNS_RE.
    inside = [topo.twin_bridge(t) for t in (0, 1)]
    inside += [topo.switch_port(n, t) for n in topo.nodes for t in (0, 1)]
    assert len(set(inside)) == len(inside)
    assert all(len(name) <= 15 for name in inside)
    assert topology.NETNS_RE.match(topo.switch_netns).group(1) == "15"
    assert topology.NETNS_RE.match(topo.nodes[-1].netns).group(1) == "15"
    assert not topology.LINK_RE.match("spk1-n1")  # namespaces are not links


def test_topology_defaults_and_refusals(topology: ModuleType) -> None:
    assert topology.build(0, 2).kind == "direct"  # today's default stays
    assert topology.build(0, 3).kind == "switch"
    assert topology.build(0, 2, "switch").switched  # two nodes behind a switch
    with pytest.raises(ValueError, match=r"direct joins exactly two nodes.*--topology switch"):
        topology.build(0, 4, "direct")
    with pytest.raises(ValueError, match="--topology 'mesh'"):
        topology.build(0, 4, "mesh")


@pytest.mark.parametrize(
    ("spec", "name"),
    [
        ("1", "spark-1"),
        ("head", "spark-1"),
        ("spark-3", "spark-3"),
        ("worker-1", "spark-2"),
        ("worker-2", "spark-3"),
        ("spk2-n3", "spark-3"),
        ("198.18.2.12", "spark-2"),
    ],
)
def test_resolve_node(topology: ModuleType, spec: str, name: str) -> None:
    assert topology.resolve_node(topology.build(2, 3), spec).name == name


@pytest.mark.parametrize("spec", ["0", "4", "worker-3", "tail", ""])
def test_resolve_node_rejects_unknown_nodes(topology: ModuleType, spec: str) -> None:
    with pytest.raises(ValueError, match="unknown node"):
        topology.resolve_node(topology.build(0, 3), spec)


def test_resolve_twins(topology: ModuleType) -> None:
    assert topology.resolve_twins(None) == [0, 1]
    assert topology.resolve_twins("1") == [1]
    assert topology.resolve_twins("enp1s0f1np1") == [0]
    assert topology.resolve_twins("roceP2p1s0f1") == [1]
    with pytest.raises(ValueError, match="unknown twin"):
        topology.resolve_twins("enp1s0f0np0")  # the unplugged port is not a fabric twin


def test_shaped_rate_is_one_two_hundredth(topology: ModuleType) -> None:
    assert topology.tbf_mbit(200_000) == 1000
    assert topology.tbf_mbit(100_000) == 500
    assert topology.tbf_mbit(50) == 1


def test_cli_parses_the_contract(sparksim: ModuleType) -> None:
    cli = importlib.import_module("sparksim_under_test.cli")
    parser = cli.build_parser()
    args = parser.parse_args(["--state-dir", "/x", "fault", "link-rate", "head", "100000", "1"])
    assert (args.kind, args.node, args.mbps, args.twin) == ("link-rate", "head", 100000, "1")
    assert parser.parse_args(["up"]).nodes == 2
    assert parser.parse_args(["up", "--state-dir", "/y", "--nodes", "3"]).state_dir == "/y"
    assert parser.parse_args(["down", "--all"]).all
    with pytest.raises(SystemExit):
        parser.parse_args(["up", "--nodes", "1"])
