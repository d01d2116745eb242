"""The ping matrix of the link checks (every pair of nodes on a twin, both ways): the
probe command run for real in a local shell with a stand-in ping, its parser, and the
pure verdicts (infra.links.ping_check.check_ping_pairs, ping_pairs_culprit)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_spark.infra.links.parse import PingResult
from pytest_spark.infra.links.ping_check import check_ping, check_ping_pairs, ping_pairs_culprit
from pytest_spark.infra.links.probe import (
    PingTarget,
    matrix_peers,
    parse_ping_matrix,
    ping_matrix_command,
)

pytestmark = pytest.mark.unit

# iputils' summary lines (REFERENCE.md section 2: the link checks' DF pings)
REPLIES = """PING {addr} ({addr}) from 198.19.0.1 {iface}: {size}(ns) bytes of data.
{n} bytes from {addr}: icmp_seq=1 ttl=64 time=0.071 ms

--- {addr} ping statistics ---
{count} packets transmitted, {count} received, 0% packet loss, time 401ms
rtt min/avg/max/mdev = 0.052/0.061/0.071/0.008 ms
"""
LOST = """PING {addr} ({addr}) from 198.19.0.1 {iface}: {size}(ns) bytes of data.

--- {addr} ping statistics ---
{count} packets transmitted, 0 received, 100% packet loss, time 2040ms
"""

FAKE_PING = r"""#!/bin/sh
# ping -M do -s SIZE -c COUNT [-i I] -W 1 -I IFACE ADDR; "big" frames to the addresses
# in $DROP_BIG are lost, everything else answers.
size=; count=; iface=
while [ $# -gt 1 ]; do
  case $1 in -s) size=$2; shift ;; -c) count=$2; shift ;; -I) iface=$2; shift ;;
    -M|-i|-W) shift ;; esac
  shift
done
addr=$1
if [ -n "$RUNNING" ]; then  # how many pings run at once
  mkdir -p "$RUNNING/$addr-$size"; ls "$RUNNING" | wc -l >>"$RUNNING.log"; sleep 0.3
  rmdir "$RUNNING/$addr-$size"
fi
if [ "$size" -gt 1472 ] && case " $DROP_BIG " in *" $addr "*) true ;; *) false ;; esac; then
  printf '%s' "$LOST" |
    sed "s/{addr}/$addr/g; s/{iface}/$iface/; s/{size}/$size/; s/{count}/$count/g"
  exit 1
fi
printf '%s' "$REPLIES" | sed "s/{addr}/$addr/g; s/{iface}/$iface/; s/{size}/$size/;
  s/{count}/$count/g; s/{n}/$((size + 8))/"
"""


def _run(command: str, tmp_path: Path, drop_big: str = "", running: str = "") -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    ping = bin_dir / "ping"
    ping.write_text(FAKE_PING)
    ping.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "DROP_BIG": drop_big,
        "RUNNING": running,
        "REPLIES": REPLIES,
        "LOST": LOST,
    }
    proc = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("count", range(2, 10))
def test_the_matrix_pings_every_pair_from_one_end_at_least(count: int) -> None:
    pinged = {frozenset((i, j)) for i in range(count) for j in matrix_peers(count, i)}
    assert pinged == {frozenset((i, j)) for i in range(count) for j in range(i + 1, count)}
    assert all(len(matrix_peers(count, i)) == count // 2 for i in range(count))
    assert matrix_peers(2, 0) == [1] and matrix_peers(2, 1) == [0]  # as the ring did


def test_every_target_is_pinged_in_one_command_and_a_lost_one_gets_a_small_ping(
    tmp_path: Path,
) -> None:
    targets = [
        PingTarget("enp1s0f1np1", "198.19.0.2", 9000),
        PingTarget("enp1s0f1np1", "198.19.0.3", 9000),
        PingTarget("enP2p1s0f1np1", "198.19.1.3", 9000),
    ]
    out = _run(ping_matrix_command(targets, count=3), tmp_path, drop_big="198.19.0.3")
    got = parse_ping_matrix(out)
    assert set(got) == {(t.ifname, t.addr) for t in targets}
    ok = got[("enp1s0f1np1", "198.19.0.2")]
    assert ok.big == PingResult(3, 3, 0.0, 0.061, (), None) and ok.small is None
    lost = got[("enp1s0f1np1", "198.19.0.3")]
    assert lost.big is not None and (lost.big.transmitted, lost.big.received) == (3, 0)
    assert lost.small is not None and lost.small.received == 1  # small frames pass
    assert got[("enP2p1s0f1np1", "198.19.1.3")].small is None  # other twin: no drop
    assert not list(Path("/tmp").glob(".pytest-spark-ping.*"))


def test_a_node_runs_at_most_fan_out_pings_at_once(tmp_path: Path) -> None:
    targets = [PingTarget("enp1s0f1np1", f"198.19.0.{i}", 9000) for i in range(2, 9)]
    running = tmp_path / "running"
    running.mkdir()
    out = _run(ping_matrix_command(targets, fan_out=3), tmp_path, running=str(running))
    assert len(parse_ping_matrix(out)) == 7  # every target, in waves of 3
    at_once = [int(n) for n in (tmp_path / "running.log").read_text().split()]
    assert len(at_once) == 7 and max(at_once) <= 3
    assert max(at_once) > 1  # side by side within a wave


def test_ping_matrix_command_refuses_what_is_not_an_interface_or_address() -> None:
    with pytest.raises(ValueError, match="not an interface"):
        ping_matrix_command([PingTarget("eth0;reboot", "198.19.0.2", 9000)])
    with pytest.raises(ValueError):
        ping_matrix_command([PingTarget("eth0", "198.19.0.2; reboot", 9000)])
    with pytest.raises(ValueError):
        ping_matrix_command([])


def test_a_missing_ping_is_a_problem_not_a_result(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # the shell's tools, but no ping
    bin_dir.mkdir()
    for tool in ("sh", "mktemp", "cat", "uname", "rm", "grep", "timeout", "mkdir"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    command = ping_matrix_command([PingTarget("enp1s0f1np1", "198.19.0.2", 9000)])
    proc = subprocess.run(
        ["/bin/sh", "-c", command], capture_output=True, text=True, env={"PATH": str(bin_dir)}
    )
    got = parse_ping_matrix(proc.stdout)[("enp1s0f1np1", "198.19.0.2")]
    assert got.big is None and got.problem and "ping" in got.problem


def _ping(received: int, transmitted: int = 3) -> PingResult:
    loss = 100.0 * (transmitted - received) / transmitted
    return PingResult(transmitted, received, loss, 0.06 if received else None, (), None)


@pytest.mark.parametrize(
    ("failing", "culprit"),
    [
        ([], None),
        ([("a", "b"), ("b", "a")], None),  # one pair: its two ends equally suspect
        ([("a", "c"), ("b", "c"), ("c", "a"), ("c", "b"), ("d", "c")], "c"),
        ([("a", "b"), ("c", "d")], None),  # two separate problems
        ([("a", "b"), ("a", "c"), ("b", "c")], None),  # no node in all of them
    ],
)
def test_the_culprit_is_the_one_node_in_every_failing_pair(
    failing: list[tuple[str, str]], culprit: str | None
) -> None:
    assert ping_pairs_culprit(failing) == culprit


def _findings(node: str, lost: set[str]) -> dict[str, object]:
    peers = {
        "spark-head": "198.19.0.1",
        "spark-worker-1": "198.19.0.2",
        "spark-worker-2": "198.19.0.3",
    }
    out = {}
    for peer, addr in peers.items():
        if peer == node:
            continue
        small = _ping(1, 1) if peer in lost else None
        big = _ping(0) if peer in lost else _ping(3)
        out[peer] = check_ping(node, "enp1s0f1np1", peer, addr, big, 9000, small_ping=small)
    return out


def test_pairs_verdict_names_each_failing_pair_and_the_culprit() -> None:
    node = "spark-worker-2"
    findings = _findings(node, {"spark-head", "spark-worker-1"})
    f = check_ping_pairs(node, "enp1s0f1np1", findings, culprit=node)  # type: ignore[arg-type]
    assert not f.ok and f.measured == 2 and f.expected == 0 and f.node == node
    assert f.message.startswith(
        "spark-worker-2 enp1s0f1np1: DF pings at full MTU failed on 2 of 2 pair(s) "
        "(spark-worker-2 <-> spark-head, spark-worker-2 <-> spark-worker-1)"
    )
    assert "goes through spark-worker-2" in f.message
    assert "switch port" in f.message and "ip link show enp1s0f1np1" in f.message
    assert set(f.evidence) == {"spark-worker-2 -> spark-head", "spark-worker-2 -> spark-worker-1"}


def test_pairs_verdict_without_a_culprit_gives_every_pair_its_own_words() -> None:
    node = "spark-head"
    findings = _findings(node, {"spark-worker-1"})
    f = check_ping_pairs(node, "enp1s0f1np1", findings)  # type: ignore[arg-type]
    assert not f.ok and f.measured == 1
    assert "(spark-head <-> spark-worker-1)" in f.message
    assert "small pings reach spark-worker-1 but full-size frames do not" in f.message
    assert "goes through" not in f.message


def test_pairs_verdict_passes_when_every_peer_answers() -> None:
    node = "spark-head"
    f = check_ping_pairs(node, "enp1s0f1np1", _findings(node, set()))  # type: ignore[arg-type]
    assert f.ok and f.level == "pass" and f.measured == 0
    assert "answered by every peer (spark-worker-1, spark-worker-2)" in f.message
