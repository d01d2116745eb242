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
import sysconfig
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, Sim, spark_sim  # type: ignore[import-not-found]

pytestmark = pytest.mark.sim
LINKS = str(REPO / "tests_infra" / "test_links.py")


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


class _RankNode:
    """A rank's node over the sim's SSH config, as the collective runner drives one
    (``pytest_spark.infra.nccl.launcher_gather.RankNode``: a name and ``run``)."""

    def __init__(self, sim: Sim, node: dict[str, Any]) -> None:
        self.name, self.mgmt, self.config = node["name"], node["mgmt"], sim.cluster["ssh_config"]

    def run(self, command: str, *, timeout: float | None = None) -> Any:
        from pytest_spark.access.base import CommandResult

        proc = subprocess.run(
            ["ssh", "-F", self.config, self.mgmt, command],
            capture_output=True, text=True, timeout=(timeout or 300) + 30, check=False,
        )  # fmt: skip
        return CommandResult(self.name, command, proc.returncode, proc.stdout, proc.stderr)


SYSTEM_PYTHON = "/usr/bin/python3"


def _algbw(row: Any, timing: Any) -> float:
    """algbw in GB/s from the row's size and time (the table prints both bandwidths
    rounded to two decimals: 0.17 for 0.165)."""
    return float(row.size_bytes / timing.time_us / 1e3)


@pytest.mark.skipif(
    not os.access(SYSTEM_PYTHON, os.X_OK)
    or subprocess.run(
        [
            SYSTEM_PYTHON,
            "-c",
            f"import sys; sys.exit(sys.version_info[:2] != {sys.version_info[:2]})",
        ],
        check=False,
    ).returncode
    != 0,
    reason=f"{SYSTEM_PYTHON} is not this interpreter's version: it cannot load this venv's torch",
)
def test_all_reduce_and_all_gather_span_all_four_nodes_behind_the_switch(switch4: Sim) -> None:
    """The NCCL checks' collective across N = 4 ranks over the switched fabric (one rank per
    node, bootstrapping over twin 1, as launch-cluster.sh sets NCCL_SOCKET_IFNAME): every
    rank joins, the values are right, and busbw is algbw x nccl-tests' factor for 4 ranks,
    2(n-1)/n = 1.5 for the all-reduce and (n-1)/n = 0.75 for the all-gather. Light nodes
    have no engine: the ranks run the system python3 with this venv's site-packages (its
    torch; a node sees /usr and the checkout, its /root and /tmp are its own), on gloo."""
    from pytest_spark.infra.nccl.check import check_wrong_values
    from pytest_spark.infra.nccl.collectives_check import check_all_gather
    from pytest_spark.infra.nccl.runner_gather import run_allreduce
    from pytest_spark.settings.profiles import load_profile

    nodes = switch4.cluster["nodes"]
    twin = nodes[0]["fabric"][-1]["if"]
    site = sysconfig.get_paths()["purelib"]
    env = {"NCCL_SOCKET_IFNAME": twin, "GLOO_SOCKET_IFNAME": twin, "PYTHONPATH": site}
    ranks = [_RankNode(switch4, n) for n in nodes]
    run = run_allreduce(
        ranks,
        master_addr=nodes[0]["fabric"][-1]["addr"],
        rank_env={n["name"]: env for n in nodes},
        launcher="python",
        python=SYSTEM_PYTHON,
        min_bytes=1 << 20,
        max_bytes=4 << 20,
        iters=3,
        warmup=1,
        timeout=240,
        collectives=("all_reduce", "all_gather"),
    )
    assert run.ok, run.evidence()
    assert run.world_size == 4 and [r.rank for r in run.ranks] == [0, 1, 2, 3]
    assert run.result is not None and run.result.rows, run.evidence()
    assert check_wrong_values(run.result, where="4 ranks").level == "pass"
    for row in run.result.rows:
        for t in row.timings:
            assert t.busbw_gbps == pytest.approx(_algbw(row, t) * 1.5, abs=0.006), row
    gather = run.section("all_gather")
    assert gather is not None and gather.parsed is not None, run.evidence()
    assert gather.parsed.rows and (gather.parsed.collective or "").startswith("all_gather")
    for row in gather.parsed.rows:
        for t in row.timings:
            assert t.busbw_gbps == pytest.approx(_algbw(row, t) * 0.75, abs=0.006), row
    profile = load_profile("dgx-spark-switch")
    floor = replace(profile, nccl=replace(profile.nccl, min_busbw_gbps=0.0))
    found = check_all_gather(gather.parsed, floor, where="4 ranks")
    assert found.level in ("pass", "warn"), found.message  # the sim's gloo: no floor held here
