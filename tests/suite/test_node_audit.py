"""Issue 8: nothing on the nodes is changed except what ``--spark-launch`` and the
benchmark copy are documented to change (README, "What the suite changes on your nodes").

Every node is snapshot over SSH, as the node sees it, before and after a full suite run
(tests_infra and tests_e2e): files under /tmp, /var/tmp, /root, /etc, /dev/shm and the
sim's per-node state, the processes in the node's PID namespace, docker containers,
images, volumes and networks, links, addresses, routes and qdiscs, sysctls and mounts.
:mod:`nodeaudit` says what it leaves out and why.

The audited runs are the fault matrix's healthy rows (tests/suite/faultmatrix.py,
``AUDITS``): ``healthy-launch`` (``--spark-launch``: only what the README lists is left)
and ``healthy-serving`` (attached to a cluster someone else launched: nothing is left),
each a whole-suite run the matrix makes anyway. Here: the diff itself, and that a
snapshot sees what the node sees.
"""

from __future__ import annotations

import re

import pytest
from nodeaudit import (  # type: ignore[import-not-found]
    before_run,
    diff,
    parse,
    sim_snapshot,
    sim_ssh,
    snapshot_script,
)

from conftest import sim_fault  # type: ignore[import-not-found]
from pytest_spark.access.simcontrol import SimCluster

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
    """The audit sees what the node sees: a file made in the worker's own /tmp over SSH;
    and not what another writes into a folder bound in below /tmp (sparksim binds the
    host's venv there when the checkout lies in /tmp: the host rewrote its certifi bundle
    during a CI row)."""
    sim_fault(sim, "clear")
    worker = sim.workers[0]
    host = sim.state_dir / "audit-host"  # the state dir is seen in the node at its path
    host.mkdir(exist_ok=True)
    bound = "/tmp/pytest-spark-audit-bound"
    sim_ssh(sim, worker, f"mkdir -p {bound} && mount --bind {host} {bound}")
    try:
        before = before_run(sim)
        sim_ssh(sim, worker, "echo x > /tmp/pytest-spark-audit-planted")
        (host / "rewritten-by-the-host").write_text("x")
        try:
            changes = diff(before, sim_snapshot(sim))
        finally:
            sim_ssh(sim, worker, "rm -f /tmp/pytest-spark-audit-planted")
            (host / "rewritten-by-the-host").unlink()
        assert [c.split(" f ")[0] for c in changes] == [
            "spark-2 files: + /tmp/pytest-spark-audit-planted"
        ], changes
        assert diff(before, sim_snapshot(sim)) == []
    finally:
        sim_ssh(sim, worker, f"umount {bound}; rmdir {bound}")
