"""up / status / down of sparksim: contract shape, leftovers, refusal, recovery."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.sim


def leftovers(state_dir: Path, instance: int | None) -> list[str]:
    """Everything of ``instance`` / ``state_dir`` still present on the machine (processes
    and mounts only when ``instance`` is None)."""
    found = []
    if instance is None:
        instance = -1
    try:
        namespaces = os.listdir("/run/netns")
    except FileNotFoundError:
        namespaces = []
    found += [f"netns {ns}" for ns in namespaces if ns.startswith(f"spk{instance}-")]
    links = json.loads(
        subprocess.run(["ip", "-j", "link"], capture_output=True, text=True, check=True).stdout
    )
    pattern = re.compile(rf"^spk{instance}(br|n\d+m|f\d|n\d+f\d)$")
    found += [f"link {link['ifname']}" for link in links if pattern.match(link["ifname"])]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(state_dir) in cmdline and int(pid) != os.getpid():
            found.append(f"process {pid}: {cmdline.replace(chr(0), ' ')}")
    mountinfo = Path("/proc/self/mountinfo").read_text()
    found += [
        f"mount {line}"
        for line in mountinfo.splitlines()
        if str(state_dir) in line or f"/run/netns/spk{instance}-" in line
    ]
    return found


def test_up_status_down_round_trip(own_state_dir: Path, sim: Any, spark_sim: Any) -> None:
    proc = spark_sim(own_state_dir, "up")
    cluster = json.loads(proc.stdout)
    k = cluster["instance"]
    try:
        assert k != sim.instance, "two sims side by side must get different instances"
        assert json.loads((own_state_dir / "cluster.json").read_text()) == cluster
        assert cluster["version"] == 1
        assert cluster["state_dir"] == str(own_state_dir)
        assert cluster["user"] == "root"
        assert cluster["ssh_config"] == str(own_state_dir / "ssh_config")
        assert cluster["known_hosts"] == str(own_state_dir / "known_hosts")
        assert cluster["identity"] == str(own_state_dir / "id_ed25519")
        assert cluster["nodes"] == [
            {"name": f"spark-{i}", "role": "head" if i == 1 else "worker",
             "mgmt": f"198.18.{k}.{10 + i}", "netns": f"spk{k}-n{i}",
             "fabric": [
                 {"if": "enp1s0f1np1", "dev": "rocep1s0f1", "addr": f"198.19.0.{i}"},
                 {"if": "enP2p1s0f1np1", "dev": "roceP2p1s0f1", "addr": f"198.19.1.{i}"},
             ]}
            for i in (1, 2)
        ]  # fmt: skip

        status = spark_sim(own_state_dir, "status", "--json")
        report = json.loads(status.stdout)
        assert report["up"] and report["healthy"], report["problems"]
        assert [n["sshd"] for n in report["nodes"]] == ["running", "running"]
        assert report["faults"] == []
        assert "up, healthy, 2 nodes" in spark_sim(own_state_dir, "status").stdout
    finally:
        spark_sim(own_state_dir, "down")

    assert leftovers(own_state_dir, k) == []
    assert not (own_state_dir / "cluster.json").exists()
    status = spark_sim(own_state_dir, "status", check=False)
    assert status.returncode == 1
    assert "down" in status.stdout
    again = spark_sim(own_state_dir, "down")  # idempotent
    assert "nothing to remove" in again.stderr


def test_three_nodes_share_a_switched_fabric(own_state_dir: Path, start_sim: Any) -> None:
    sim3 = start_sim(own_state_dir, nodes=3)
    k = sim3.instance
    assert [n["name"] for n in sim3.cluster["nodes"]] == ["spark-1", "spark-2", "spark-3"]
    assert [n["role"] for n in sim3.cluster["nodes"]] == ["head", "worker", "worker"]
    assert sim3.cluster["topology"] == "switch"
    switch = f"spk{k}-sw"  # the switch: a namespace of its own, a bridge per twin
    links = subprocess.run(
        ["ip", "-n", switch, "-br", "link"], capture_output=True, text=True
    ).stdout
    for name in ("br0", "br1", "n3f0", "n3f1"):
        assert re.search(rf"^{name}(@\S+)?\s+(UP|UNKNOWN)\s", links, re.M), name
    assert sim3.out("spark-3", "hostname").strip() == "spark-3"
    # spark-1 reaches spark-3 over both twins through the per-twin bridges.
    assert sim3.ssh("spark-1", "ping -c1 -W2 198.19.0.3 && ping -c1 -W2 198.19.1.3").returncode == 0
    assert sim3.ssh("spark-2", "ping -c1 -W2 198.19.0.3").returncode == 0
    # A rate fault shapes the node's port and its switch port.
    sim3.cli("fault", "link-rate", "3", "50000", "0")
    rates = subprocess.run(
        ["tc", "-n", switch, "qdisc", "show", "dev", "n3f0"], capture_output=True, text=True
    ).stdout
    assert "rate 250Mbit" in rates
    assert "rate 250Mbit" in sim3.out("spark-3", "tc qdisc show dev enp1s0f1np1")
    assert "rate 1Gbit" in sim3.out("spark-1", "tc qdisc show dev enp1s0f1np1")
    sim3.cli("down")
    assert leftovers(own_state_dir, k) == []


def test_up_refuses_a_live_sim(own_state_dir: Path, start_sim: Any, spark_sim: Any) -> None:
    start_sim(own_state_dir)
    again = spark_sim(own_state_dir, "up", check=False)
    assert again.returncode == 1
    assert "already up" in again.stderr
    assert "down" in again.stderr  # says how to fix it
    assert again.stdout == ""


def test_up_recovers_from_a_crashed_sim(
    own_state_dir: Path, start_sim: Any, spark_sim: Any
) -> None:
    first = start_sim(own_state_dir)
    k = first.instance
    for pidfile in own_state_dir.glob("nodes/*/sshd.pid"):
        os.kill(int(pidfile.read_text()), signal.SIGKILL)  # sshd dies, namespaces stay
    deadline = time.monotonic() + 5
    while spark_sim(own_state_dir, "status", check=False).returncode == 0:
        assert time.monotonic() < deadline, "status still healthy after sshd was killed"
        time.sleep(0.05)
    assert os.path.exists(f"/run/netns/spk{k}-n1")

    second = start_sim(own_state_dir)
    report = second.status()
    assert report["healthy"], report["problems"]
    assert second.out("spark-2", "hostname").strip() == "spark-2"
    spark_sim(own_state_dir, "down")
    assert leftovers(own_state_dir, second.instance) == []
    assert leftovers(own_state_dir, k) == []


def test_usage_errors_exit_2_and_bad_targets_exit_1(
    own_state_dir: Path, sim: Any, spark_sim: Any
) -> None:
    assert spark_sim(own_state_dir, "up", "--nodes", "1", check=False).returncode == 2
    bad = sim.cli("fault", "link-down", "spark-9", check=False)
    assert bad.returncode == 1
    assert "unknown node 'spark-9'" in bad.stderr
    bad = sim.cli("fault", "mtu", "head", "1500", "eth7", check=False)
    assert bad.returncode == 1
    assert "unknown twin 'eth7'" in bad.stderr
    down = spark_sim(own_state_dir, "fault", "clear", check=False)
    assert down.returncode == 1
    assert "spark-sim up" in down.stderr


def test_module_entry_point_and_env_default(tmp_path: Path) -> None:
    """`python -m sparksim` (what the spark-sim script runs) and SPARKSIM_STATE_DIR."""
    env = {
        **os.environ,
        "SPARKSIM_STATE_DIR": str(tmp_path / "envdir"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "sparksim", "status", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["state_dir"] == str(tmp_path / "envdir")
    assert report["up"] is False


SANDBOX = """
set -e
trap '$SIM down --all >/dev/null 2>&1 || true' EXIT
mkdir -p /run/netns /run/sparksim
mount -t tmpfs sandbox /run/netns
mount -t tmpfs sandbox /run/sparksim
mount -t sysfs sysfs /sys
ip link set lo up
$SIM --state-dir "$A" up >/dev/null
$SIM --state-dir "$B" up --nodes 3 >/dev/null
echo "before $(ls /run/netns | wc -l) $(ip -o link | grep -c ' spk')"
$SIM down --all
echo "after $(ls /run/netns | wc -l) $(ip -o link | grep -c ' spk') $(ls /run/sparksim/instances)"
"""


def test_down_all_removes_every_instance(tmp_path: Path, spark_sim_argv: list[str]) -> None:
    """`down --all` inside a sandbox (own network and mount namespaces, so that it cannot
    touch sims running on this machine)."""
    sim_cmd = " ".join(spark_sim_argv)
    env = {**os.environ, "SIM": sim_cmd, "A": str(tmp_path / "a"), "B": str(tmp_path / "b")}
    proc = subprocess.run(
        ["unshare", "--net", "--mount", "--propagation", "private", "sh", "-c", SANDBOX],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # 2 + 3 node namespaces and the 3-node sim's switch namespace (spk{k}-sw, holding its
    # twin bridges and ports); in the root namespace each sim's management bridge and one
    # management veth end per node (2 + 1, 3 + 1)
    assert "before 6 7" in proc.stdout, proc.stdout
    assert "after 0 0 \n" in proc.stdout
    for state_dir in (tmp_path / "a", tmp_path / "b"):
        assert leftovers(state_dir, None) == []
        assert not (state_dir / "cluster.json").exists()
