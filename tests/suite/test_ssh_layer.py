"""The SSH layer against real sshd servers in sparksim nodes."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from pytest_spark.access.base import CommandTimeout, HostKeyError, NodeUnreachable
from pytest_spark.access.simcontrol import SimCluster
from pytest_spark.access.ssh import SSHConnection, resolve_target

pytestmark = pytest.mark.sim


def connect(sim: SimCluster, host: str, **kwargs: object) -> SSHConnection:
    target = resolve_target(host, ssh_config=sim.ssh_config)
    return SSHConnection("node", target, **kwargs)  # type: ignore[arg-type]


def test_runs_commands_over_one_reused_connection_with_nodelay(sim: SimCluster) -> None:
    conn = connect(sim, sim.head)
    try:
        first = conn.run("hostname")
        assert (first.rc, first.stdout.strip()) == (0, "spark-1")
        transport = conn.transport()
        assert conn.run("echo err >&2; exit 3").rc == 3
        assert conn.run("echo err >&2; exit 3").stderr == "err\n"
        assert conn.transport() is transport  # reused, not a new login
        assert transport.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        conn.close()


def test_unknown_host_key_is_refused_with_a_clear_error(sim: SimCluster, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    target = resolve_target(sim.head, ssh_config=sim.ssh_config)
    conn = SSHConnection(
        "spark-head", target.__class__(**{**target.__dict__, "known_hosts": (str(empty),)})
    )
    with pytest.raises(
        HostKeyError,
        match=r"spark-head: host key of .* is not in .*"
        r"known_hosts.*ssh-keyscan",
    ):
        conn.connect()


def test_changed_host_key_is_refused_loudly(sim: SimCluster, tmp_path: Path) -> None:
    worker_key = next(
        line.split(None, 1)[1]
        for line in Path(sim.info["known_hosts"]).read_text().splitlines()
        if line.startswith(sim.workers[0])
    )
    lying = tmp_path / "known_hosts"
    lying.write_text(f"{sim.head} {worker_key}\n")  # the head presenting the worker's key
    target = resolve_target(sim.head, ssh_config=sim.ssh_config)
    conn = SSHConnection(
        "spark-head", target.__class__(**{**target.__dict__, "known_hosts": (str(lying),)})
    )
    with pytest.raises(HostKeyError, match="CHANGED"):
        conn.connect()


def test_hostkey_check_off_accepts_and_writes_nothing(sim: SimCluster, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    target = resolve_target(sim.head, ssh_config=sim.ssh_config)
    conn = SSHConnection(
        "spark-head",
        target.__class__(**{**target.__dict__, "known_hosts": (str(empty),)}),
        strict_host_keys=False,
    )
    try:
        assert conn.run("true").rc == 0
    finally:
        conn.close()
    assert empty.read_text() == ""


def test_command_timeout_is_enforced(sim: SimCluster) -> None:
    conn = connect(sim, sim.head)
    try:
        t0 = time.monotonic()
        with pytest.raises(CommandTimeout, match=r"timed out after 0\.5 s: sleep 30"):
            conn.run("sleep 30", timeout=0.5)
        assert time.monotonic() - t0 < 15  # cut long before the 30 s sleep ends
        assert conn.run("echo still usable").stdout == "still usable\n"
    finally:
        conn.close()


def test_output_is_handed_over_as_it_arrives(sim: SimCluster) -> None:
    """``on_output`` sees stdout while the command runs (the NCCL sweep's progress reads
    rank 0's rows so), in pieces that add up to the result's stdout."""
    conn = connect(sim, sim.head)
    pieces: list[tuple[float, str]] = []
    try:
        t0 = time.monotonic()
        result = conn.run(
            "for i in 1 2 3; do echo row $i; sleep 0.6; done; echo é",
            on_output=lambda text: pieces.append((time.monotonic() - t0, text)),
        )
        end = time.monotonic() - t0
    finally:
        conn.close()
    assert "".join(text for _, text in pieces) == result.stdout == "row 1\nrow 2\nrow 3\né\n"
    first = next(t for t, text in pieces if "row 1" in text)
    assert first < end - 1.0, (first, end)  # told of row 1 long before the command ended


def test_unreachable_node_fails_within_the_connect_timeout(sim: SimCluster) -> None:
    nobody = sim.head.rsplit(".", 1)[0] + ".99"
    target = resolve_target(nobody, ssh_config=sim.ssh_config)
    conn = SSHConnection("spark-worker-9", target, connect_timeout=1.5)
    t0 = time.monotonic()
    with pytest.raises(NodeUnreachable, match="spark-worker-9"):
        conn.connect()
    assert time.monotonic() - t0 < 15  # bounded: an error, never a hang


def test_jump_through_the_head_to_a_fabric_only_address(sim: SimCluster, tmp_path: Path) -> None:
    """The worker's fabric address is reachable from the head only: ProxyJump-style."""
    head = connect(sim, sim.head)
    fabric = sim.info["nodes"][1]["fabric"][0]["addr"]
    worker_target = resolve_target(sim.workers[0], ssh_config=sim.ssh_config)
    target = worker_target.__class__(**{**worker_target.__dict__, "hostname": fabric})
    via = SSHConnection("spark-worker-1", target, jump=head, connect_timeout=5)
    try:
        # The fabric address is not in known_hosts under that name: strict refusal first.
        with pytest.raises(HostKeyError):
            via.connect()
        worker_key = next(
            line.split(None, 1)[1]
            for line in Path(sim.info["known_hosts"]).read_text().splitlines()
            if line.startswith(sim.workers[0])
        )
        known = tmp_path / "known_hosts"
        known.write_text(f"{fabric} {worker_key}\n")
        trusted = SSHConnection(
            "spark-worker-1",
            target.__class__(**{**target.__dict__, "known_hosts": (str(known),)}),
            jump=head,
            connect_timeout=5,
        )
        assert trusted.run("hostname").stdout.strip() == "spark-2"
        trusted.close()
    finally:
        via.close()
        head.close()
