"""The PCIe link check (pytest_spark.infra.pcie): the sysfs values a probe prints, parsed,
judged; recorded values in fixtures/pcie/ (README: the source)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.finding import Skip
from pytest_spark.infra.pcie.check import check_pcie_links, link_text
from pytest_spark.infra.pcie.probe import (
    HOST_PROBE,
    MARKER,
    NO_RDMA_RC,
    parse_pcie_probe,
    parse_speed,
    pcie_probe_command,
)
from pytest_spark.infra.roundtrip import shared_probes

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "pcie"


def framed(stdout: str, rc: int = 0, stderr: str = "") -> str:
    """What the probe prints around its one section (infra.probe's framing)."""
    return (
        f"{MARKER} probe v1 spark-head\n{MARKER} begin pcie\n{stdout}\n"
        f"{MARKER} stderr pcie\n{stderr}\n{MARKER} end pcie rc={rc}\n"
    )


def facts(name: str):  # type: ignore[no-untyped-def]
    return parse_pcie_probe(framed((FIXTURES / f"{name}.txt").read_text()))


def test_speed_text_of_both_kernel_eras() -> None:
    assert parse_speed("32.0 GT/s PCIe") == 32.0
    assert parse_speed("8 GT/s") == 8.0  # before Linux 5.7: no PCIe suffix
    assert parse_speed("Unknown") is None
    assert parse_speed("-") is None  # the probe's mark for an unreadable file
    with pytest.raises(ParseError):
        parse_speed("fast")


def test_a_spark_fe_passes_with_its_four_gen5_x4_functions() -> None:
    node = facts("dgx-spark-fe")
    assert [link.pci for link in node.links] == [
        "0000:01:00.0",
        "0000:01:00.1",
        "0002:01:00.0",
        "0002:01:00.1",
    ]
    finding = check_pcie_links("spark-head", node)
    assert not isinstance(finding, Skip) and finding.level == "pass"
    assert "4 RDMA functions at their full PCIe link (32.0 GT/s (Gen5) x4)" in finding.message


def test_a_gx10s_second_link_at_x2_fails_naming_both_functions_and_the_fix() -> None:
    finding = check_pcie_links("spark-worker-1", facts("ascent-gx10-x2"))
    assert not isinstance(finding, Skip) and finding.level == "fail"
    message = finding.message
    assert message.startswith("spark-worker-1: ConnectX-7 PCIe link below its capability")
    assert "roceP2p1s0f0 (0002:01:00.0) trained at 32.0 GT/s (Gen5) x2, capable of " in message
    assert "roceP2p1s0f1 (0002:01:00.1)" in message and "rocep1s0f1" not in message
    assert "sudo lspci -vv -s 0002:01:00.0" in message  # the fix names the function
    assert "cold power cycle" in message and "thread 367853" in message
    assert finding.measured == "roceP2p1s0f0 32.0 GT/s (Gen5) x2; roceP2p1s0f1 32.0 GT/s (Gen5) x2"
    assert finding.expected.endswith("roceP2p1s0f1 32.0 GT/s (Gen5) x4")


def test_a_link_trained_slower_at_full_width_fails_too() -> None:
    text = (FIXTURES / "dgx-spark-fe.txt").read_text()
    text = text.replace("current_link_speed 32.0 GT/s PCIe", "current_link_speed 16.0 GT/s PCIe", 1)
    finding = check_pcie_links("spark-head", parse_pcie_probe(framed(text)))
    assert not isinstance(finding, Skip) and finding.level == "fail"
    assert "rocep1s0f0 (0000:01:00.0) trained at 16.0 GT/s (Gen4) x4" in finding.message


def test_no_rdma_stack_skips_citing_the_links_check() -> None:
    node = parse_pcie_probe(framed("", NO_RDMA_RC, "no /sys/class/infiniband"))
    assert node.no_rdma
    skip = check_pcie_links("spark-head", node)
    assert isinstance(skip, Skip) and "test_roce_active" in skip.reason


def test_unreadable_attributes_warn_rather_than_pass() -> None:
    text = "dev rocep1s0f0 -\ncurrent_link_speed -\ncurrent_link_width -\n"
    text += "max_link_speed -\nmax_link_width -\n"
    finding = check_pcie_links("spark-head", parse_pcie_probe(framed(text)))
    assert not isinstance(finding, Skip) and finding.level == "warn"
    assert "rocep1s0f0" in finding.message and "not judged" in finding.message
    assert link_text(None, None) == "? GT/s x?"


def test_output_that_is_not_this_probe_fails_to_parse() -> None:
    with pytest.raises(ParseError):
        parse_pcie_probe(framed("dev rocep1s0f0 0000:01:00.0\nlink_speed fast\n"))


def test_the_probe_rides_the_shared_round_trip_and_reads_a_sysfs_tree(tmp_path: Path) -> None:
    assert HOST_PROBE in shared_probes()  # declared in its topic, collected by the round trip
    # the command itself, run by sh against a tree laid out as the kernel's (its paths
    # rewritten to the tree: nothing here reads this machine's /sys)
    device = tmp_path / "infiniband" / "rocep1s0f1" / "device"
    device.mkdir(parents=True)
    (device / "uevent").write_text("DRIVER=mlx5_core\nPCI_SLOT_NAME=0000:01:00.1\n")
    for name, value in (
        ("current_link_speed", "32.0 GT/s PCIe"),
        ("current_link_width", "2"),
        ("max_link_speed", "32.0 GT/s PCIe"),
        ("max_link_width", "4"),
    ):
        (device / name).write_text(value + "\n")
    command = pcie_probe_command().replace("/sys/class/infiniband", str(tmp_path / "infiniband"))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    (link,) = parse_pcie_probe(out.stdout).links
    assert (link.dev, link.pci, link.width, link.max_width, link.degraded) == (
        "rocep1s0f1",
        "0000:01:00.1",
        2,
        4,
        True,
    )
    assert not list(tmp_path.glob("**/.pytest-spark-*"))
