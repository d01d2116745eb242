"""Fabric error counters: the ethtool -S parser on a recorded mlx5 output
(fixtures/counters), the probe's parser, and the check over before/after windows."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_spark.infra.counters.check import check_fabric_counters
from pytest_spark.infra.counters.parse import ETH_ERRORS, parse_ethtool_stats, rises
from pytest_spark.infra.counters.probe import (
    MARKER,
    NodeCounters,
    PortCounters,
    Window,
    parse_counters,
)
from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.finding import Skip

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "counters"


def test_ethtool_stats_recorded() -> None:
    stats = parse_ethtool_stats((FIXTURES / "ethtool_S_mlx5_errors.txt").read_text())
    assert stats["rx_crc_errors_phy"] == 0 and stats["rx_corrected_bits_phy"] == 1024
    assert parse_ethtool_stats("NIC statistics:\n     link_down_events_phy: 3\n") == {
        "link_down_events_phy": 3
    }
    with pytest.raises(ParseError, match="name: value"):
        parse_ethtool_stats("no stats available\n")


def test_rises_ignore_fec_corrected_and_missing() -> None:
    before = {"rx_corrected_bits_phy": 1024, "rx_crc_errors_phy": 0, "link_down_events_phy": 1}
    after = {"rx_corrected_bits_phy": 9000, "rx_crc_errors_phy": 0, "link_down_events_phy": 1}
    assert rises(before, after, ETH_ERRORS) == []
    assert rises(
        {"rx_crc_errors_phy": 61_219_013}, {"rx_crc_errors_phy": 61_227_469}, ETH_ERRORS
    ) == [("rx_crc_errors_phy", 61_219_013, 61_227_469)]


def _probe(stats: str) -> str:
    body = (
        "port rocep1s0f0 1 enp1s0f0np0 (Up)\n"
        + "".join(f"eth {ln}\n" for ln in stats.splitlines())
        + "hw out_of_sequence 0\nhw resp_cqe_flush_error 9\n"
        + "port roceP2p1s0f0 1 enP2p1s0f0np0 (Up)\neth-error Cannot get stats information\n"
    )
    return (
        f"{MARKER} probe v1 spark-2\n{MARKER} begin ports\n{body}\n"
        f"{MARKER} stderr ports\n\n{MARKER} end ports rc=0\n"
    )


def test_probe_parse() -> None:
    facts = parse_counters(_probe("NIC statistics:\n     link_down_events_phy: 1\n"))
    first, second = facts.ports
    assert (first.dev, first.netdev, first.eth) == (
        "rocep1s0f0",
        "enp1s0f0np0",
        {"link_down_events_phy": 1},
    )
    assert first.roce == {"out_of_sequence": 0, "resp_cqe_flush_error": 9}
    assert second.eth is None and second.eth_error == "Cannot get stats information"


def _node(link_down: int, crc: int, flush: int = 9) -> NodeCounters:
    eth = {"link_down_events_phy": link_down, "rx_crc_errors_phy": crc}
    roce = {"out_of_sequence": 0, "resp_cqe_flush_error": flush}
    return NodeCounters((PortCounters("rocep1s0f0", "enp1s0f0np0", eth, None, roce),))


def test_steady_counters_pass_and_flush_errors_do_not_count() -> None:
    w = Window("throughput-sweep", {"spark-2": _node(1, 0)}, {"spark-2": _node(1, 0, flush=40)})
    f = check_fabric_counters("spark-2", [w])
    assert not isinstance(f, Skip) and f.level == "pass"


def test_a_flap_during_the_run_fails_naming_port_counter_and_readings() -> None:
    nccl = Window("collective-run", {"spark-2": _node(1, 0)}, {"spark-2": _node(1, 0)})
    sweep = Window("throughput-sweep", {"spark-2": _node(1, 0)}, {"spark-2": _node(4, 420)})
    f = check_fabric_counters("spark-2", [nccl, sweep])
    assert not isinstance(f, Skip) and f.level == "fail"
    assert (
        "enp1s0f0np0 (rocep1s0f0) link_down_events_phy 1 -> 4 (+3) during the throughput sweep"
        in f.message
    )
    assert "rx_crc_errors_phy 0 -> 420" in f.message
    assert "flapping cable" in f.message and "replace the cable" in f.message


def test_no_window_skips_and_unread_warns() -> None:
    assert isinstance(check_fabric_counters("spark-2", []), Skip)
    w = Window("collective-run", {"spark-2": "timed out"}, {"spark-2": _node(1, 0)})
    f = check_fabric_counters("spark-2", [w])
    assert not isinstance(f, Skip) and f.level == "warn" and "timed out" in f.message
