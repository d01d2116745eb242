"""The one-round-trip link probe: its command, its output format and parse_link_probe.

The probe is also run for real under ``sh`` here, with stub tools printing the
fixtures/links/ files and a fake sysfs, so the stored probe fixtures cannot drift from
what the command really prints.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from ipaddress import IPv4Interface
from pathlib import Path

import pytest

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.links.probe import (
    BASE_SECTIONS,
    LINK_PROBE,
    MARKER,
    NodeLinkFacts,
    PortFacts,
    discover_fabric_ifs,
    link_probe_command,
    parse_link_probe,
    ping_command,
    primary_fabric_if,
)
from pytest_spark.infra.probe import split_probe

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "links"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.fixture(scope="module")
def healthy() -> NodeLinkFacts:
    return parse_link_probe(read("probe_healthy.txt"))


@pytest.fixture(scope="module")
def degraded() -> NodeLinkFacts:
    return parse_link_probe(read("probe_degraded.txt"))


def section(name: str, stdout: str, rc: int | str = 0, stderr: str = "") -> str:
    return (
        f"{MARKER} begin {name}\n{stdout}\n{MARKER} stderr {name}\n{stderr}\n"
        f"{MARKER} end {name} rc={rc}\n"
    )


# ------------------------------------------------------------------------------- command


def test_link_probe_is_one_sh_command_gathering_every_tool() -> None:
    argv = shlex.split(LINK_PROBE)
    assert argv[:2] == ["sh", "-c"]
    assert len(argv) == 3
    script = argv[2]
    for needle in (
        "ibdev2netdev",
        "ibstat",
        "ibv_devinfo",
        "rdma link",
        "ip -j link",
        "ip -j addr",
        'ethtool "$i"',
        "/class/net/$i/carrier_changes",
        "timeout 10",
        MARKER,
    ):
        assert needle in script, needle


def test_link_probe_command_validates_timeout() -> None:
    assert "timeout 3" in link_probe_command(timeout_s=3)
    with pytest.raises(ValueError):
        link_probe_command(timeout_s=0)


def test_ping_command_exact() -> None:
    assert ping_command("enp1s0f1np1", "192.168.200.13", 9000) == (
        "LC_ALL=C ping -M do -s 8972 -c 3 -i 0.2 -W 1 -I enp1s0f1np1 192.168.200.13"
    )
    assert "-s 1472 -c 5 " in ping_command("enp1s0f1np1", "192.168.200.13", 1500, count=5)


def test_ping_command_quotes_arguments() -> None:
    cmd = ping_command("en p1; rm -rf /", "1.2.3.4 && reboot", 9000)
    argv = shlex.split(cmd)
    assert argv[-3:] == ["-I", "en p1; rm -rf /", "1.2.3.4 && reboot"]


@pytest.mark.parametrize(
    ("ifname", "mtu", "count"),
    [("enp1s0f1np1", 67, 3), ("enp1s0f1np1", 9000, 0), ("", 9000, 3)],
)
def test_ping_command_rejects_bad_values(ifname: str, mtu: int, count: int) -> None:
    with pytest.raises(ValueError):
        ping_command(ifname, "1.2.3.4", mtu, count=count)


# ---------------------------------------------------------------------- healthy probe


def test_healthy_probe_sections_are_the_fixture_files(healthy: NodeLinkFacts) -> None:
    assert healthy.hostname == "spark-1"
    s = healthy.sections
    assert s["ibdev2netdev"].stdout == read("ibdev2netdev_healthy.txt")
    assert s["ibstat"].stdout == read("ibstat_healthy.txt")
    assert s["ibv_devinfo"].stdout.strip() == read("ibv_devinfo_healthy.txt").strip()
    assert s["rdma_link"].stdout == read("rdma_link_healthy.txt")
    assert s["ip_link"].stdout == read("ip_link_healthy.json")
    assert s["ethtool:enp1s0f1np1"].stdout == read("ethtool_enp1s0f1np1_200g.txt")
    assert all(sec.rc == 0 for sec in s.values())


def test_healthy_probe_facts(healthy: NodeLinkFacts) -> None:
    assert healthy.errors == {}
    assert healthy.missing_tools == ()
    assert list(healthy.ports) == ["enP2p1s0f0np0", "enP2p1s0f1np1", "enp1s0f0np0", "enp1s0f1np1"]
    assert healthy.ports["enp1s0f1np1"] == PortFacts(
        netdev="enp1s0f1np1",
        dev="rocep1s0f1",
        roce_up=True,
        ib_state="Active",
        phys_state="LinkUp",
        rate_gbps=200.0,
        active_mtu=4096,
        mtu=9000,
        operstate="UP",
        lower_up=True,
        carrier=True,
        addresses=(IPv4Interface("192.168.200.12/24"),),
        ethtool_speed_mbps=200000,
        ib_port=1,
        exists=True,
        admin_up=True,
        no_carrier=False,
        flags=("BROADCAST", "MULTICAST", "UP", "LOWER_UP"),
        ibv_state="PORT_ACTIVE",
        link_layer="Ethernet",
        ethtool_link_detected=True,
        carrier_changes=2,
        state_source="ibstat",
    )
    unplugged = healthy.ports["enp1s0f0np0"]
    assert (unplugged.roce_up, unplugged.ib_state, unplugged.carrier, unplugged.no_carrier) == (
        False,
        "Down",
        False,
        True,
    )
    assert unplugged.ethtool_speed_mbps is None


def test_discover_fabric_ifs_healthy(healthy: NodeLinkFacts) -> None:
    # ibdev2netdev order: RDMA device name in C collation (roceP2... before rocep1...)
    assert discover_fabric_ifs(healthy) == ["enP2p1s0f1np1", "enp1s0f1np1"]
    # autodiscover.sh's ETH_IF: the Up one with an address and no capital P
    assert primary_fabric_if(healthy) == "enp1s0f1np1"


def test_discover_fabric_ifs_is_stable_under_input_order() -> None:
    text = section(
        "ibdev2netdev",
        "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)\nroceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)",
    )
    assert discover_fabric_ifs(parse_link_probe(text)) == ["enP2p1s0f1np1", "enp1s0f1np1"]


# --------------------------------------------------------------------- degraded probe


def test_degraded_probe_records_missing_tool(degraded: NodeLinkFacts) -> None:
    assert degraded.hostname == "spark-2"
    assert degraded.errors == {"ibv_devinfo": "command not found: ibv_devinfo"}
    assert degraded.missing_tools == ("ibv_devinfo",)
    assert degraded.sections["ibv_devinfo"].rc == 127
    assert degraded.ibv == {}


def test_degraded_probe_ports(degraded: NodeLinkFacts) -> None:
    lost = degraded.ports["enP2p1s0f1np1"]
    assert (lost.roce_up, lost.ib_state, lost.phys_state, lost.operstate) == (
        False,
        "Down",
        "Polling",
        "DOWN",
    )
    assert (lost.admin_up, lost.no_carrier, lost.carrier, lost.carrier_changes) == (
        True,
        True,
        False,
        7,
    )
    slow = degraded.ports["enp1s0f1np1"]
    assert (slow.rate_gbps, slow.ethtool_speed_mbps, slow.mtu, slow.active_mtu) == (
        100.0,
        100000,
        1500,
        None,
    )
    assert degraded.sections["ethtool:enp1s0f1np1"].stderr == (
        "netlink error: Operation not permitted\n"
    )
    assert discover_fabric_ifs(degraded) == ["enp1s0f1np1"]


# ----------------------------------------------------------------------- robustness


def test_every_tool_missing_gives_errors_not_an_exception() -> None:
    text = f"{MARKER} probe v1 bare\n" + "".join(
        section(name, "", 127, f"{name}: command not found") for name in BASE_SECTIONS
    )
    facts = parse_link_probe(text)
    assert set(facts.errors) == set(BASE_SECTIONS)
    assert facts.errors["ibstat"] == "command not found: ibstat"
    assert facts.ports == {}
    assert discover_fabric_ifs(facts) == []
    assert primary_fabric_if(facts) is None


def test_absent_sections_are_reported() -> None:
    facts = parse_link_probe(f"{MARKER} probe v1 x\n")
    assert facts.errors["ip_link"] == "ip_link: section missing from probe output"


def test_truncated_output_keeps_what_arrived(healthy: NodeLinkFacts) -> None:
    text = read("probe_healthy.txt")
    cut = text[: text.index(f"{MARKER} stderr ip_addr")]  # ssh died inside ip_addr
    facts = parse_link_probe(cut)
    assert facts.errors == {"ip_addr": "ip_addr: output cut short (no end marker)"}
    assert facts.sections["ip_addr"].rc is None
    assert facts.ports["enp1s0f1np1"].mtu == 9000  # ip_link arrived whole
    assert facts.ports["enp1s0f1np1"].addresses == ()
    assert facts.ports["enp1s0f1np1"].ethtool_speed_mbps is None


def test_unparsable_section_is_recorded_and_rdma_fills_in() -> None:
    text = read("probe_healthy.txt")
    start = text.index(f"{MARKER} begin ibstat\n") + len(f"{MARKER} begin ibstat\n")
    end = text.index(f"{MARKER} stderr ibstat")
    facts = parse_link_probe(text[:start] + "Segmentation fault\n" + text[end:])
    assert facts.errors["ibstat"].startswith("ibstat: ")
    assert "'Segmentation fault'" in facts.errors["ibstat"]
    port = facts.ports["enP2p1s0f1np1"]
    assert (port.ib_state, port.phys_state, port.state_source) == ("Active", "LinkUp", "rdma")
    assert port.rate_gbps is None


def test_nonzero_exit_without_output_is_an_error() -> None:
    facts = parse_link_probe(section("ibv_devinfo", "", 255, "No IB devices found"))
    assert facts.errors["ibv_devinfo"] == "ibv_devinfo: exit 255: No IB devices found"
    timed_out = parse_link_probe(section("ibstat", "", 124))
    assert timed_out.errors["ibstat"] == "ibstat: timed out"


def test_banner_noise_outside_sections_is_ignored() -> None:
    text = "Welcome to DGX OS\n" + read("probe_healthy.txt") + "logout\n"
    assert parse_link_probe(text).ports == parse_link_probe(read("probe_healthy.txt")).ports


def test_not_probe_output_raises() -> None:
    with pytest.raises(ParseError) as info:
        parse_link_probe("Permission denied (publickey).\n")
    assert info.value.line == "Permission denied (publickey)."


def test_discover_falls_back_to_rdma_when_ibdev2netdev_missing() -> None:
    text = (
        section("ibdev2netdev", "", 127)
        + section(
            "rdma_link",
            "link rocep1s0f1/1 state ACTIVE physical_state LINK_UP netdev enp1s0f1np1 \n"
            "link rocep1s0f0/1 state DOWN physical_state DISABLED netdev enp1s0f0np0 ",
        )
        + section("ip_link", read("ip_link_healthy.json"))
    )
    facts = parse_link_probe(text)
    assert discover_fabric_ifs(facts) == ["enp1s0f1np1"]
    assert facts.ports["enp1s0f0np0"].phys_state == "Disabled"
    assert facts.ports["enp1s0f1np1"].roce_up is None


def test_split_probe_reads_header_and_rc() -> None:
    host, sections = split_probe(
        f"{MARKER} probe v1 node-a\n" + section("x", "out", 3, "err"), MARKER, "link probe"
    )
    assert host == "node-a"
    assert (sections["x"].stdout, sections["x"].stderr, sections["x"].rc) == ("out\n", "err\n", 3)


# ------------------------------------------------------------- the probe, run for real

STUB = """#!/bin/sh
{body}
"""


def _write_stub(bindir: Path, name: str, body: str) -> None:
    path = bindir / name
    path.write_text(STUB.format(body=body))
    path.chmod(0o755)


def _fake_node(tmp_path: Path, *, degraded: bool) -> tuple[Path, Path]:
    """Stub tools printing fixture files, and a fake sysfs; the recipe of the stored
    probe fixtures (fixtures/links/README.md)."""
    bindir, sysfs, src = tmp_path / "bin", tmp_path / "sys", tmp_path / "src"
    for d in (bindir, sysfs, src):
        d.mkdir()
    f = FIXTURES
    if degraded:
        ibstat = read("ibstat_polling.txt")
        head, sep, tail = ibstat.partition("CA 'rocep1s0f1'")
        (src / "ibstat.txt").write_text(head + sep + tail.replace("Rate: 200", "Rate: 100", 1))
        links = json.loads(read("ip_link_unplugged.json"))
        for link in links:
            if link["ifname"] == "enp1s0f1np1":
                link["mtu"] = 1500
        (src / "ip_link.json").write_text(json.dumps(links, separators=(",", ":")) + "\n")
        ibdev, rdma = f / "ibdev2netdev_one_twin_down.txt", f / "rdma_link_polling.txt"
        ethtool = (
            'case "$1" in\n'
            '  enp1s0f1np1) echo "netlink error: Operation not permitted" >&2;'
            f" exec cat {f}/ethtool_enp1s0f1np1_100g.txt;;\n"
            f'  *) exec cat "{f}/ethtool_$1_nolink.txt";;\nesac'
        )
        carriers = {
            "enp1s0f0np0": (0, 0),
            "enp1s0f1np1": (1, 2),
            "enP2p1s0f0np0": (0, 0),
            "enP2p1s0f1np1": (0, 7),
        }
    else:
        (src / "ibstat.txt").write_text(read("ibstat_healthy.txt"))
        (src / "ip_link.json").write_text(read("ip_link_healthy.json"))
        ibdev, rdma = f / "ibdev2netdev_healthy.txt", f / "rdma_link_healthy.txt"
        _write_stub(bindir, "ibv_devinfo", f"cat {f}/ibv_devinfo_healthy.txt")
        ethtool = (
            'case "$1" in\n'
            f'  enp1s0f1np1|enP2p1s0f1np1) exec cat "{f}/ethtool_$1_200g.txt";;\n'
            f'  *) exec cat "{f}/ethtool_$1_nolink.txt";;\nesac'
        )
        carriers = {
            "enp1s0f0np0": (0, 0),
            "enp1s0f1np1": (1, 2),
            "enP2p1s0f0np0": (0, 0),
            "enP2p1s0f1np1": (1, 2),
        }
    _write_stub(bindir, "ibdev2netdev", f"cat {ibdev}")
    _write_stub(bindir, "ibstat", f"cat {src}/ibstat.txt")
    _write_stub(bindir, "rdma", f'[ "$1" = link ] && exec cat {rdma}\nexit 1')
    _write_stub(
        bindir,
        "ip",
        f'case "$*" in\n  "-j link") exec cat {src}/ip_link.json;;\n'
        f'  "-j addr") exec cat {f}/ip_addr_healthy.json;;\nesac\nexit 1',
    )
    _write_stub(bindir, "ethtool", ethtool)
    for ifname, (carrier, changes) in carriers.items():
        d = sysfs / "class" / "net" / ifname
        d.mkdir(parents=True)
        (d / "carrier").write_text(f"{carrier}\n")
        (d / "carrier_changes").write_text(f"{changes}\n")
    return bindir, sysfs


def _run_probe(bindir: Path, sysfs: Path) -> str:
    cmd = link_probe_command(sysfs=str(sysfs))
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(bindir)}
    done = subprocess.run(
        cmd, shell=True, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


needs_sh = pytest.mark.skipif(
    shutil.which("sh") is None or shutil.which("awk") is None, reason="needs sh and awk"
)


@needs_sh
def test_probe_runs_under_sh_and_matches_stored_healthy_fixture(tmp_path: Path) -> None:
    out = _run_probe(*_fake_node(tmp_path, degraded=False))
    live, stored = parse_link_probe(out), parse_link_probe(read("probe_healthy.txt"))
    assert live.errors == {}
    assert live.ports == stored.ports
    assert {n: s.stdout for n, s in live.sections.items()} == {
        n: s.stdout for n, s in stored.sections.items()
    }
    assert live.hostname  # uname -n of this machine


@needs_sh
def test_probe_runs_under_sh_and_matches_stored_degraded_fixture(tmp_path: Path) -> None:
    if shutil.which("ibv_devinfo", path="/usr/bin:/bin:/usr/sbin:/sbin"):
        pytest.skip("ibv_devinfo is installed here: cannot show it missing")
    out = _run_probe(*_fake_node(tmp_path, degraded=True))
    live, stored = parse_link_probe(out), parse_link_probe(read("probe_degraded.txt"))
    assert live.errors == {"ibv_devinfo": "command not found: ibv_devinfo"}
    assert live.ports == stored.ports
    assert {n: (s.stdout, s.stderr, s.rc) for n, s in live.sections.items()} == {
        n: (s.stdout, s.stderr, s.rc) for n, s in stored.sections.items()
    }


@needs_sh
def test_probe_skips_unsafe_interface_names(tmp_path: Path) -> None:
    bindir, sysfs = _fake_node(tmp_path, degraded=False)
    _write_stub(bindir, "ibdev2netdev", "echo 'rocep1s0f1 port 1 ==> $(reboot) (Up)'")
    facts = parse_link_probe(_run_probe(bindir, sysfs))
    assert not any(name.startswith("ethtool:") for name in facts.sections)


def test_carrier_falls_back_to_lower_up_without_sysfs() -> None:
    text = read("probe_healthy.txt")
    kept = []
    skipping = False
    for line in text.splitlines():
        if line.startswith(f"{MARKER} begin carrier:"):
            skipping = True
        if not skipping:
            kept.append(line)
        if skipping and line.startswith(f"{MARKER} end carrier:"):
            skipping = False
    facts = parse_link_probe("\n".join(kept) + "\n")
    assert facts.carrier == {}
    assert facts.ports["enp1s0f1np1"].carrier is True
    assert facts.ports["enp1s0f0np0"].carrier is False


@needs_sh
def test_probe_finds_netdevs_in_sysfs_without_ibdev2netdev(tmp_path: Path) -> None:
    bindir, sysfs = _fake_node(tmp_path, degraded=False)
    (bindir / "ibdev2netdev").unlink()
    if shutil.which("ibdev2netdev", path="/usr/bin:/bin:/usr/sbin:/sbin"):
        pytest.skip("ibdev2netdev is installed here: cannot show it missing")
    (sysfs / "class" / "infiniband" / "rocep1s0f1" / "device" / "net" / "enp1s0f1np1").mkdir(
        parents=True
    )
    facts = parse_link_probe(_run_probe(bindir, sysfs))
    assert facts.errors == {"ibdev2netdev": "command not found: ibdev2netdev"}
    assert [n for n in facts.sections if n.startswith("ethtool:")] == ["ethtool:enp1s0f1np1"]
    # no ibdev2netdev: rdma link names the devices, ip link says which are UP
    assert discover_fabric_ifs(facts) == ["enP2p1s0f1np1", "enp1s0f1np1"]
    assert facts.ports["enp1s0f1np1"].ethtool_speed_mbps == 200000
