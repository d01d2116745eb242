"""``spark-sim fault unreachable NODE --how cut|sshd``: a blackholed node (connects time
out, open connections hang) and a node whose sshd is stopped (connections refused); both
undone by ``--restore``, ``fault clear`` and ``down``."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.sim


def connect(addr: str, timeout: float = 2.0) -> str:
    """How a TCP connect to addr:22 ends: ``ok``, ``refused``, ``timeout`` or the error."""
    try:
        with socket.create_connection((addr, 22), timeout=timeout):
            return "ok"
    except ConnectionRefusedError:
        return "refused"
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def wait_connect(addr: str, want: str, within: float = 10.0) -> str:
    deadline = time.monotonic() + within
    got = connect(addr)
    while got != want and time.monotonic() < deadline:
        time.sleep(0.2)
        got = connect(addr)
    return got


def test_cut_worker_is_a_blackhole_then_clear_restores_it(healthy_sim: Any) -> None:
    sim = healthy_sim
    head, worker = (n["mgmt"] for n in sim.cluster["nodes"])
    with socket.create_connection((worker, 22), timeout=2) as open_conn:
        assert open_conn.recv(64).startswith(b"SSH-2.0-")
        out = sim.cli("fault", "unreachable", "worker-1").stdout
        assert "spark-2" in out and "time out" in out
        # An open connection hangs: nothing comes back, not even a reset.
        open_conn.sendall(b"SSH-2.0-probe\r\n")
        open_conn.settimeout(1.5)
        with pytest.raises(TimeoutError):
            open_conn.recv(64)
    # New connects time out (never refused, never "No route to host" after ARP gives up).
    assert connect(worker, timeout=4.0) == "timeout"
    assert connect(head) == "ok"
    # The head cannot reach it either (launch-cluster.sh's SSH to the workers).
    proc = sim.ssh("spark-1", f"timeout 5 bash -c 'echo > /dev/tcp/{worker}/22'; echo rc=$?")
    assert "rc=124" in proc.stdout, proc.stdout + proc.stderr
    proc = sim.cli("status", "--json", check=False)
    assert proc.returncode == 1  # unhealthy while a node is cut
    status = json.loads(proc.stdout)
    fault = [f for f in status["faults"] if f["kind"] == "unreachable"]
    assert fault == [
        {"kind": "unreachable", "node": "spark-2", "if": "mgmt0", "value": "cut",
         "since": fault[0]["since"]}
    ]  # fmt: skip
    assert any("spark-2" in p for p in status["problems"]), status["problems"]

    sim.cli("fault", "clear")
    assert wait_connect(worker, "ok") == "ok"
    assert sim.out("spark-2", "hostname").strip() == "spark-2"
    assert sim.status()["healthy"]


def test_cut_head_then_restore_one_node(healthy_sim: Any) -> None:
    sim = healthy_sim
    head, worker = (n["mgmt"] for n in sim.cluster["nodes"])
    sim.cli("fault", "unreachable", "head", "--how", "cut")
    assert connect(head, timeout=3.0) == "timeout"
    assert connect(worker) == "ok"
    proc = sim.ssh("spark-2", f"timeout 5 bash -c 'echo > /dev/tcp/{head}/22'; echo rc=$?")
    assert "rc=124" in proc.stdout, proc.stdout + proc.stderr
    out = sim.cli("fault", "unreachable", "spark-1", "--restore").stdout
    assert "spark-1: back on the management bridge" in out
    assert wait_connect(head, "ok") == "ok"
    assert not [f for f in sim.status()["faults"] if f["kind"] == "unreachable"]


def test_sshd_stopped_refuses_connections(healthy_sim: Any) -> None:
    sim = healthy_sim
    worker = sim.node("spark-2")["mgmt"]
    out = sim.cli("fault", "unreachable", "2", "--how", "sshd").stdout
    assert "sshd stopped" in out and "refused" in out
    assert connect(worker) == "refused"
    proc = subprocess.run(
        ["ssh", "-F", sim.cluster["ssh_config"], worker, "true"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 255 and "Connection refused" in proc.stderr, proc.stderr
    status = json.loads(sim.cli("status", "--json", check=False).stdout)
    assert [f["value"] for f in status["faults"] if f["kind"] == "unreachable"] == ["sshd"]
    sim.cli("fault", "clear")
    assert connect(worker) == "ok"


def test_unknown_node_is_a_usage_error(healthy_sim: Any) -> None:
    proc = healthy_sim.cli("fault", "unreachable", "worker-7", check=False)
    assert proc.returncode == 1 and "unknown node 'worker-7'" in proc.stderr


def test_down_undoes_a_cut(own_state_dir: Path, sim: Any, spark_sim: Any) -> None:
    cluster = json.loads(spark_sim(own_state_dir, "up").stdout)
    worker = cluster["nodes"][1]["mgmt"]
    spark_sim(own_state_dir, "fault", "unreachable", "worker-1")
    assert connect(worker, timeout=2.0) == "timeout"
    spark_sim(own_state_dir, "down")
    neigh = subprocess.run(["ip", "neigh", "show", worker], capture_output=True, text=True)
    assert neigh.stdout.strip() == ""  # the pinned entry went with the bridge
    links = json.loads(subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout)
    assert not [x for x in links if x["ifname"].startswith(f"spk{cluster['instance']}")]
