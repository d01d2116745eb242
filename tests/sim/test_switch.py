"""Four light sparksim nodes behind the switch (``spark-sim up --nodes 4 --topology
switch``, no Docker engines: sshd and the per-node tools only) and the suite's link checks
on them: healthy, every pair answers; a switch port left at MTU 1500 is one failure, the
ping matrix's, naming the node behind it and every pair through it, the others skipping
citing it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, Sim, spark_sim  # type: ignore[import-not-found]

pytestmark = pytest.mark.sim
LINKS = str(REPO / "tests_infra" / "test_link.py")


@pytest.fixture(scope="module")
def switch4(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    state_dir = tmp_path_factory.mktemp("switch4")
    saved = os.environ.get("SPARKSIM_NO_DOCKER")
    os.environ["SPARKSIM_NO_DOCKER"] = "1"  # light nodes: the link checks need no engine
    try:
        proc = spark_sim(state_dir, "up", "--nodes", "4", "--topology", "switch")
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


def _links(sim: Sim, tmp_path: Path) -> tuple[int, dict[str, dict[str, Any]]]:
    """Run the link checks against the sim as a user does; (exit code, checks by test)."""
    nodes = sim.cluster["nodes"]
    results = tmp_path / "results.json"
    proc = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", LINKS,
            f"--spark-head={nodes[0]['mgmt']}",
            f"--spark-workers={','.join(n['mgmt'] for n in nodes[1:])}",
            f"--spark-ssh-config={sim.cluster['ssh_config']}",
            "--spark-profile=sim", "--spark-history=off", f"--spark-results={results}",
        ],
        capture_output=True, text=True, cwd=REPO, timeout=300, check=False,
    )  # fmt: skip
    assert results.exists(), proc.stdout + proc.stderr
    checks = json.loads(results.read_text())["checks"]
    return proc.returncode, {c["nodeid"].split("::", 1)[1]: c for c in checks}


def test_four_nodes_behind_the_switch_every_pair_answers(switch4: Sim, tmp_path: Path) -> None:
    assert switch4.cluster["topology"] == "switch"
    rc, checks = _links(switch4, tmp_path)
    assert rc == 0, {k: c["message"] for k, c in checks.items() if c["outcome"] != "passed"}
    pings = {k: c for k, c in checks.items() if k.startswith("test_ping_peer_at_full_mtu[")}
    assert len(pings) == 4 * 2  # every node, both twins
    names = ["spark-head", "spark-worker-1", "spark-worker-2", "spark-worker-3"]
    for twin in ("twin0", "twin1"):
        pairs = set()
        for node in names:
            message = pings[f"test_ping_peer_at_full_mtu[{node}-{twin}]"]["message"]
            peers = re.search(r"answered by every peer \(([^)]*)\)", message)
            assert peers, message
            pairs |= {frozenset((node, p)) for p in peers.group(1).split(", ")}
        assert pairs == {frozenset((a, b)) for a in names for b in names if a != b}


def test_a_switch_port_at_1500_is_one_failure_naming_the_node_and_its_pairs(
    switch4: Sim, tmp_path: Path
) -> None:
    # spark-3 (spark-worker-2): its port on the switch for enp1s0f1np1, node MTUs untouched
    switch4.cli("fault", "switch-mtu", "3", "1500", "enp1s0f1np1")
    try:
        rc, checks = _links(switch4, tmp_path)
    finally:
        switch4.cli("fault", "clear")
    failed = {k: c for k, c in checks.items() if c["outcome"] in ("failed", "error")}
    assert rc == 1
    (name,) = failed  # one root cause, one failure
    assert name.startswith("test_ping_peer_at_full_mtu[spark-worker-2-twin")
    message = failed[name]["message"]
    assert message.startswith(
        "spark-worker-2 enp1s0f1np1: DF pings at full MTU failed on 3 of 3 pair(s) ("
    ), message
    for peer in ("spark-head", "spark-worker-1", "spark-worker-3"):  # its pings and theirs
        assert f"spark-worker-2 <-> {peer}" in message
    assert "goes through spark-worker-2" in message and "switch port" in message
    assert "small pings reach" in message  # an MTU problem, not no path
    twin = name.rsplit("-", 1)[1].rstrip("]")
    # spark-head and spark-worker-1 ping spark-worker-2 (spark-worker-3 pings the head and
    # spark-worker-1): those two lost their pings of it and skip citing it.
    for node in ("spark-head", "spark-worker-1"):
        other = checks[f"test_ping_peer_at_full_mtu[{node}-{twin}]"]
        assert other["outcome"] == "skipped", other
        assert f"{name} has the evidence" in other["message"]
    assert checks[f"test_ping_peer_at_full_mtu[spark-worker-3-{twin}]"]["outcome"] == "passed"
    assert checks[f"test_mtu_consistent[{twin}]"]["outcome"] == "passed"  # nodes agree
