"""Issue 8: nothing on the nodes is changed except what ``--spark-launch`` and the
benchmark copy are documented to change (README, "What the suite changes on your nodes").

Every node is snapshot over SSH, as the node sees it, before and after a full suite run
(tests_infra and tests_e2e): files under /tmp, /var/tmp, /root, /etc, /dev/shm and the
sim's per-node state, the processes in the node's PID namespace, docker containers,
images, volumes and networks, links, addresses, routes and qdiscs, sysctls and mounts.
:mod:`nodeaudit` says what it leaves out and why.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest
from nodeaudit import Snapshot, describe, diff, parse, snapshot, snapshot_script  # type: ignore[import-not-found]

from conftest import REPO, launch_args, run_suite, sim_fault  # type: ignore[import-not-found]
from pytest_spark.access.simcontrol import SimCluster

# What --spark-launch may leave behind (README): launch-cluster.sh bind-mounts
# $HF_HOME (default ~/.cache/huggingface) into the containers, and docker creates it on
# every node when it is missing. The containers themselves are stopped and removed.
LAUNCH_LEAVES = (r"^\S+ files: \+ /root/\.cache/huggingface d \d+$",)
# A cluster someone else launched keeps writing its launcher log while it serves.
KEPT_LAUNCHER_LOG = (r"^spark-1 files: ~ /tmp/pytest-spark-launch-[0-9a-f]+\.log: ",)
BUSBW = "tests_infra/test_nccl.py::test_allreduce_busbw"


def _nodes(sim: SimCluster) -> dict[str, str]:
    return {n["name"]: n["mgmt"] for n in sim.info["nodes"]}


def _snap(sim: SimCluster) -> dict[str, Snapshot]:
    return snapshot(sim.ssh_config, _nodes(sim), sim.state_dir)


# launch-cluster.sh without Ray follows the head's vLLM, checking every 5 s whether it has
# exited; after `stop` it notices the container is gone at its next check.
ORPHAN_LAUNCHER = (
    "for i in $(seq 60); do pgrep -f 'launch-cluster.sh .* exec ' >/dev/null || exit 0; "
    '[ -n "$(docker ps -q --filter name=^vllm_node$)" ] && exit 0; sleep 0.5; done; exit 1'
)


def _before(sim: SimCluster) -> dict[str, Snapshot]:
    """The snapshot to compare against, once a launcher that an earlier test stopped has
    noticed its container is gone (at most 30 s; else its exit would count as a change)."""
    _ssh(sim, sim.head, ORPHAN_LAUNCHER)
    return _snap(sim)


SETTLE_S = 30.0  # a container still stopping, an SSH session still closing, on a busy machine


def _changes_after(
    sim: SimCluster, before: dict[str, Snapshot], allowed: tuple[str, ...] = ()
) -> list[str]:
    """The differences once the nodes have settled: snapshots are taken until one shows
    nothing changed (what a stopping container or a closing SSH session was still doing
    has ended) or SETTLE_S has passed; then the last one's differences stand."""
    deadline = time.monotonic() + SETTLE_S
    while (changes := diff(before, _snap(sim), allowed)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return changes


def _ssh(sim: SimCluster, address: str, command: str) -> None:
    subprocess.run(
        ["ssh", "-F", str(sim.ssh_config), address, command],
        capture_output=True,
        timeout=120,
        check=False,
    )


def _stop_serving(sim: SimCluster) -> None:
    fabric = ",".join(n["fabric"][0]["addr"] for n in sim.info["nodes"])
    _ssh(sim, sim.head, f"{sim.info['launch']['script']} -n {fabric} stop")
    # The kept launcher's `exec` ends with the head container; its log is the test's to remove.
    _ssh(sim, sim.head, "rm -f /tmp/pytest-spark-launch-*.log")


# ------------------------------------------------------------------ the diff itself


def _listing(*files: str) -> str:
    lines = ["@self 99", "@files"]
    lines += [f"{path}\tf\t10\t644\t1700000000.0\t" for path in files]
    lines += [
        "/tmp\td\t4096\t1777\t1700000001.0\t",
        "@procs",
        "1 0 sshd: /usr/sbin/sshd [listener]",
    ]
    lines += ["@docker", "@net", "@sysctl", "kernel.random.uuid = x", "@mounts"]
    return "\n".join(lines)


def test_diff_reports_a_planted_file_and_nothing_else() -> None:
    before = {"spark-1": parse(_listing("/etc/hostname"))}
    after = {"spark-1": parse(_listing("/etc/hostname", "/tmp/planted"))}
    assert diff(before, after) == ["spark-1 files: + /tmp/planted f 10 B 644 mtime 1700000000.0"]
    assert diff(before, after, allowed=[r"/tmp/planted"]) == []
    assert diff(after, after) == []


def test_diff_reports_a_leftover_process_a_changed_file_and_a_container() -> None:
    base = parse(_listing("/etc/x"))
    later = parse(_listing("/etc/x").replace("1700000000.0", "1700000009.0"))
    later["procs"]["sleep 1000"] = "1"
    later["docker"]["container vllm_node\tvllm-node:latest\texited"] = ""
    changes = diff({"n": base}, {"n": later})
    assert changes == [
        "n files: ~ /etc/x: f 10 B 644 mtime 1700000000.0 -> f 10 B 644 mtime 1700000009.0",
        "n procs: + sleep 1000 1",
        "n docker: + container vllm_node\tvllm-node:latest\texited",
    ]


def test_snapshot_leaves_out_its_own_session_and_volatile_counters() -> None:
    text = "\n".join(
        [
            "@self 40",
            "@procs",
            "1 0 sshd: /usr/sbin/sshd -D -f /x [listener] 0 of 200-400 startups",
            "30 1 sshd: root@notty",
            "40 30 sh -s",
            "41 40 ps -e -o pid=,ppid=,args=",
            "50 1 dockerd --data-root /x",
            "@sysctl",
            "kernel.random.uuid = 1",
            "fs.file-nr = 1 0 2",
            "net.ipv4.ip_forward = 0",
        ]
    )
    snap = parse(text)
    assert sorted(snap["procs"]) == [
        "dockerd --data-root /x",
        "sshd: /usr/sbin/sshd -D -f /x [listener] 0 of 200-400 startups",
    ]
    assert snap["sysctl"] == {"net.ipv4.ip_forward": "0"}
    script = snapshot_script("/tmp/s", "/tmp/s/nodes/spark-1")
    assert re.search(r"-path /tmp/s/nodes/spark-1/docker/data", script)


# ------------------------------------------------------------------ against sparksim


@pytest.mark.sim
def test_planted_file_on_a_node_is_found(sim: SimCluster) -> None:
    """The audit sees what the node sees: a file made in the worker's own /tmp over SSH."""
    sim_fault(sim, "clear")
    worker = sim.workers[0]
    before = _before(sim)
    _ssh(sim, worker, "echo x > /tmp/pytest-spark-audit-planted")
    try:
        changes = diff(before, _snap(sim))
    finally:
        _ssh(sim, worker, "rm -f /tmp/pytest-spark-audit-planted")
    assert [c.split(" f ")[0] for c in changes] == [
        "spark-2 files: + /tmp/pytest-spark-audit-planted"
    ], changes
    assert diff(before, _snap(sim)) == []


@pytest.mark.sim
def test_attached_run_changes_nothing_on_the_nodes(sim: SimCluster, tmp_path: Path) -> None:
    """The whole suite attached to a serving cluster (someone else launched it): the
    all-reduce runs in its containers, the serving checks talk to it; nothing is left."""
    sim_fault(sim, "clear")
    launch = launch_args(sim)
    try:
        kept = run_suite(
            tmp_path / "serve",
            str(REPO / "tests_e2e" / "test_readiness.py"),
            *launch,
            "--spark-keep",
            "--spark-history=off",
            sim=sim,
        )
        assert kept.ret == 0, kept.output
        before = _before(sim)
        run = run_suite(
            tmp_path / "attach",
            f"--spark-container={sim.info['launch']['container']}",
            f"--spark-serve-args={sim.info['launch']['serve_args']}",
            "--spark-history=off",
            sim=sim,
        )
        assert run.results["serving"]["launched"] is False, run.output
        assert run.checks(nodeid=BUSBW), run.output  # the all-reduce was attempted
        changes = _changes_after(sim, before, KEPT_LAUNCHER_LOG)
    finally:
        _stop_serving(sim)
    assert not changes, describe(changes)


@pytest.mark.sim
def test_launched_run_leaves_only_what_is_documented(sim: SimCluster, tmp_path: Path) -> None:
    """--spark-launch starts the containers, stops and removes them at the end: what
    remains is only what the README lists (LAUNCH_LEAVES)."""
    sim_fault(sim, "clear")
    launch = launch_args(sim)
    before = _before(sim)
    try:
        run = run_suite(tmp_path, *launch, "--spark-history=off", sim=sim)
        assert run.results["serving"]["launched"] is True, run.output
        assert run.checks(nodeid=BUSBW), run.output  # the all-reduce was attempted
        changes = _changes_after(sim, before, LAUNCH_LEAVES)
    finally:
        _stop_serving(sim)
    assert not changes, describe(changes)
