"""The memory probe on a real sim node, and ``fault memory-held``: the node's
/proc/meminfo (a GB10's) loses what a real process in the node holds, the headroom check
names that process with its size on that node only, and ``fault clear`` stops it."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pytest_spark.infra.finding import Skip
from pytest_spark.infra.memory.check import Claim, check_memory_headroom
from pytest_spark.infra.memory.parse import GIB
from pytest_spark.infra.memory.probe import NodeMemory, memory_probe_command, parse_memory_probe

pytestmark = pytest.mark.sim  # a sparksim of its own: needs root (the sim tier)

NAMES = {"spark-1": "spark-head", "spark-2": "spark-worker-1"}
CLAIM = Claim(0.9, "--gpu-memory-utilization 0.90 in the serve args")


def probe(sim: Any, name: str) -> NodeMemory:
    proc = sim.ssh(name, memory_probe_command())
    assert proc.returncode == 0, proc.stderr
    return parse_memory_probe(proc.stdout)


def verdict(sim: Any, name: str) -> Any:
    return check_memory_headroom(NAMES[name], probe(sim, name), CLAIM, 4.0, engine_running=False)


def test_memory_held_caught_on_its_node_and_cleared(healthy_sim: Any) -> None:
    idle = probe(healthy_sim, "spark-2")
    assert idle.meminfo is not None and round(idle.meminfo.total / GIB, 1) == 119.7
    assert idle.apps == ()  # nvidia-smi answers, no compute app: tolerated
    for name in NAMES:
        ok = verdict(healthy_sim, name)
        assert not isinstance(ok, Skip) and ok.level == "pass", ok

    out = healthy_sim.cli("fault", "memory-held", "spark-2", "--gib", "60").stdout
    pid = re.search(r"pid (\d+) python3 holds 60 GiB", out)
    assert pid, out
    ps = healthy_sim.out("spark-2", f"ps -o rss=,args= -p {pid[1]}")
    assert ps.split()[0] == str(60 * 1024 * 1024) and "python3" in ps  # ps agrees
    held = verdict(healthy_sim, "spark-2")
    assert not isinstance(held, Skip) and held.level == "fail"
    assert held.node == "spark-worker-1"
    assert f"pid {pid[1]} python3" in held.message and "holds 60.0 GiB" in held.message
    assert "vLLM will refuse to start" in held.message
    head = verdict(healthy_sim, "spark-1")
    assert not isinstance(head, Skip) and head.level == "pass", head

    healthy_sim.cli("fault", "clear")
    after = probe(healthy_sim, "spark-2")
    assert after.meminfo == idle.meminfo
    assert all(p.pid != int(pid[1]) for p in after.processes)
    ok = verdict(healthy_sim, "spark-2")
    assert not isinstance(ok, Skip) and ok.level == "pass", ok
