"""``fault gid-shift`` and ``fault link-delay`` on a real sim (light nodes: no engine).

gid-shift: the worker's sysfs GID tables, read over SSH by the suite's own probe, put its
IPv4 RoCE v2 GID at index 5 (3 on the head); the suite's check names the worker, both
indexes and the extra IPv6 address. link-delay: a round trip across each twin pays twice
the delay (``ping -U``: user-to-user time), a bulk TCP flow keeps the link's rate, and
``clear`` (or ``down``) leaves no rule and no delayer behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import Sim, spark_sim  # type: ignore[import-not-found]
from pytest_spark.infra.nccl.gid_check import check_gid_same, check_gid_v2, gid_choices
from pytest_spark.infra.nccl.gid_parse import GID_PROBE, parse_gid_probe

pytestmark = pytest.mark.sim
NAMES = {"spark-1": "spark-head", "spark-2": "spark-worker-1"}
DELAY_MS = 5.0


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    state_dir = tmp_path_factory.mktemp("fabricfaults")
    saved = os.environ.get("SPARKSIM_NO_DOCKER")
    os.environ["SPARKSIM_NO_DOCKER"] = "1"  # light nodes: sysfs and the fabric only
    try:
        proc = spark_sim(state_dir, "up", "--nodes", "2")
    finally:
        if saved is None:
            os.environ.pop("SPARKSIM_NO_DOCKER", None)
        else:
            os.environ["SPARKSIM_NO_DOCKER"] = saved
    sim = Sim(state_dir=state_dir, cluster=json.loads(proc.stdout))
    try:
        yield sim
    finally:
        sim.close()
        spark_sim(state_dir, "down", check=False)


@pytest.fixture
def sim(light: Sim) -> Iterator[Sim]:
    yield light
    light.cli("fault", "clear")


def tables(sim: Sim, name: str) -> tuple[Any, list[str]]:
    """The node's GID tables, read by the suite's probe over SSH, and its fabric HCAs."""
    read = parse_gid_probe(sim.out(name, GID_PROBE))
    assert read is not None
    return read, [p["dev"] for p in sim.node(name)["fabric"]]


def test_gid_shift_moves_one_nodes_index_and_the_check_names_it(sim: Sim) -> None:
    sim.cli("fault", "gid-shift", "spark-2")
    picked = {}
    for name in NAMES:
        read, devs = tables(sim, name)
        assert check_gid_v2(NAMES[name], read, {}, devs).ok  # each a RoCE v2 GID
        picked[NAMES[name]] = gid_choices(read, {}, devs)
    assert {c.index for c in picked["spark-worker-1"].values() if c} == {5}
    assert {c.index for c in picked["spark-head"].values() if c} == {3}
    finding = check_gid_same(picked, "spark-head")
    assert not finding.ok and finding.node == "spark-worker-1"
    msg = finding.message
    assert "spark-worker-1 rocep1s0f1: GID index 5" in msg and "spark-head: 3" in msg
    assert "spark-worker-1's GID tables have rocep1s0f1 [2] 2001:2:0:1::2 (IPv6)" in msg
    assert "Remove it on spark-worker-1" in msg
    assert "gid-shift" in sim.cli("status").stdout

    sim.cli("fault", "clear")
    again = {}
    for name in NAMES:
        read, devs = tables(sim, name)
        again[NAMES[name]] = gid_choices(read, {}, devs)
    assert check_gid_same(again, "spark-head").ok


def rtt_min_ms(sim: Sim, ifname: str, peer: str) -> float:
    """The best user-to-user round trip of 5 pings (``ping -U``: ping's default time starts
    from the kernel's receive stamp, taken before the receiving end's hold)."""
    out = sim.out("spark-1", f"ping -U -c 5 -i 0.2 -q -I {ifname} {peer}")
    m = re.search(r"= ([\d.]+)/([\d.]+)/([\d.]+)/", out)
    assert m, out
    return float(m[1])


TPUT = """
import socket, sys, time
role, addr, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
if role == "server":
    s = socket.create_server((addr, 5201)); s.settimeout(30); c, _ = s.accept()
    n, t0 = 0, None
    while (d := c.recv(1 << 20)):
        t0 = t0 or time.monotonic(); n += len(d)
    print(n * 8 / (time.monotonic() - t0) / 1e6)
else:
    c = socket.create_connection((addr, 5201)); buf = b"x" * (1 << 20)
    end = time.monotonic() + secs
    while time.monotonic() < end:
        c.sendall(buf)
    c.close()
"""


def bulk_mbit(sim: Sim, secs: float = 3.0) -> float:
    """A bulk TCP flow spark-1 -> spark-2 over twin 0 (the sim shapes it to 1 Gbit/s)."""
    head, worker = sim.cluster["nodes"]
    addr = worker["fabric"][0]["addr"]

    def in_ns(node: dict[str, Any], *args: str) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{node['netns']}", sys.executable, "-c", TPUT, *args]

    server = subprocess.Popen(in_ns(worker, "server", addr, "0"), stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(50):  # until it listens
            up = subprocess.run(
                ["nsenter", f"--net=/run/netns/{worker['netns']}", "ss", "-Hltn", "sport = 5201"],
                capture_output=True, text=True,
            )  # fmt: skip
            if up.stdout.strip():
                break
            time.sleep(0.1)
        subprocess.run(in_ns(head, "client", addr, str(secs)), check=True, timeout=60)
        out, _ = server.communicate(timeout=60)
    finally:
        server.kill()
    return float(out)


def delayers(sim: Sim) -> list[str]:
    proc = subprocess.run(
        ["pgrep", "-af", f"nfqdelay.py .*--tag {sim.state_dir}/"], capture_output=True, text=True
    )
    return proc.stdout.splitlines()


def nfqueue_rules(sim: Sim) -> int:
    count = 0
    for node in sim.cluster["nodes"]:
        out = subprocess.run(
            ["nsenter", f"--net=/run/netns/{node['netns']}", "iptables", "-t", "mangle", "-S"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        count += out.count("NFQUEUE")
    return count


def test_link_delay_adds_twice_the_delay_keeps_the_rate_and_clears(sim: Sim) -> None:
    head, worker = sim.cluster["nodes"]
    twins = [(p["if"], q["addr"]) for p, q in zip(head["fabric"], worker["fabric"], strict=True)]
    before = {ifname: rtt_min_ms(sim, ifname, peer) for ifname, peer in twins}
    assert all(v < 2 for v in before.values()), before
    rate = bulk_mbit(sim)

    out = sim.cli("fault", "link-delay", "spark-2", "--ms", f"{DELAY_MS:g}").stdout
    how = "netem" if "(netem)" in out else "nfqueue"
    if how == "nfqueue":  # this kernel lacks sch_netem: a delayer in each end's namespace
        assert len(delayers(sim)) == 2 and nfqueue_rules(sim) == 4, out
    after = {ifname: rtt_min_ms(sim, ifname, peer) for ifname, peer in twins}
    for ifname, rtt in after.items():  # D each way: the round trip pays 2D
        assert 2 * DELAY_MS <= rtt < 2 * DELAY_MS + 5, (how, ifname, before, after)
    delayed = bulk_mbit(sim)
    # held on arrival, the flow keeps its rate (held on departure, TCP's small queues
    # throttled it to ~5 % of the link)
    assert delayed >= 0.6 * rate, (how, rate, delayed)

    # a second link-delay replaces the first: one delayer per end, one rule per twin
    sim.cli("fault", "link-delay", "spark-2", "--ms", "1")
    if how == "nfqueue":
        assert len(delayers(sim)) == 2 and nfqueue_rules(sim) == 4

    cleared = sim.cli("fault", "clear").stdout
    assert delayers(sim) == [] and nfqueue_rules(sim) == 0, cleared
    back = {ifname: rtt_min_ms(sim, ifname, peer) for ifname, peer in twins}
    assert all(v < 2 for v in back.values()), back


def test_down_takes_the_delayers_with_the_nodes(tmp_path: Any) -> None:
    state_dir = tmp_path / "sim"
    saved = os.environ.get("SPARKSIM_NO_DOCKER")
    os.environ["SPARKSIM_NO_DOCKER"] = "1"
    try:
        spark_sim(state_dir, "up", "--nodes", "2")
        out = spark_sim(state_dir, "fault", "link-delay", "worker-1", "--ms", "3").stdout
        if "(netem)" in out:
            pytest.skip("this kernel has sch_netem: link-delay starts no delayer")
        found = subprocess.run(
            ["pgrep", "-f", f"nfqdelay.py .*--tag {state_dir}/"], capture_output=True, text=True
        )
        assert len(found.stdout.split()) == 2, out
    finally:
        spark_sim(state_dir, "down", check=False)
        if saved is None:
            os.environ.pop("SPARKSIM_NO_DOCKER", None)
        else:
            os.environ["SPARKSIM_NO_DOCKER"] = saved
    left = subprocess.run(
        ["pgrep", "-f", f"nfqdelay.py .*--tag {state_dir}/"], capture_output=True, text=True
    )
    assert left.stdout == "", left.stdout
