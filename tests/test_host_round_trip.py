"""A node's host facts in one SSH round trip: the probes the topics declare shared (the
preflight, nodes-alike, memory, GPU health ... probes) run side by side in one command
(infra.roundtrip.host_round_trip, infra.probe.joint_probe), whichever check asks first;
which probe rides it is the topic's declaration (infra.hostprobe.HostProbe), never a
comparison of command text. Run for real in a local shell, with stand-ins for docker and
nvidia-smi on PATH (the host's own must not be asked)."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from types import ModuleType

import pytest
from conn_fakes import probe_settings

from pytest_spark.access.base import CommandResult
from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.access.layout import launcher_layout
from pytest_spark.infra.alike.gather import all_alike, node_alike
from pytest_spark.infra.gpuhealth.gather import node_gpu_health
from pytest_spark.infra.hostprobe import HostProbe
from pytest_spark.infra.memory import probe as memory_probe
from pytest_spark.infra.memory.gather import node_memory
from pytest_spark.infra.preflight.gather import all_preflight, node_preflight
from pytest_spark.infra.probe import joint_probe, probe_script, split_probe
from pytest_spark.infra.roundtrip import (
    declared_probes,
    gather_probe,
    host_probes,
    shared_probes,
)

pytestmark = pytest.mark.unit


class LocalConn:
    """Runs each command in a local shell, as sshd would run it; counts them."""

    def __init__(self, name: str, env: dict[str, str]) -> None:
        self.name, self.env = name, env
        self.commands: list[str] = []

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        self.commands.append(command)
        proc = subprocess.run(
            ["sh", "-c", command],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            check=False,
        )
        return CommandResult(self.name, command, proc.returncode, proc.stdout, proc.stderr)

    def close(self) -> None:
        pass


class LocalCluster(Cluster):
    def __init__(self, count: int, env: dict[str, str]) -> None:
        names = ["spark-head"] + [f"spark-worker-{i}" for i in range(1, count)]
        self.nodes = [
            Node(name, "head" if i == 0 else "worker", name, LocalConn(name, env))  # type: ignore[arg-type]
            for i, name in enumerate(names)
        ]
        self.settings = probe_settings()
        self._cache = {}
        self._cache_lock = threading.Lock()
        self._key_locks = {}
        self._connected = True
        self.layout = launcher_layout("vllm_node")  # launch-cluster.sh's: no discovery


@pytest.fixture
def node_env(tmp_path: Path) -> dict[str, str]:
    """PATH with stand-ins first: a docker whose daemon is down, an nvidia-smi with one GPU."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(
        "#!/bin/sh\necho 'Cannot connect to the Docker daemon at unix:///x.sock.' >&2\nexit 1\n"
    )
    (bin_dir / "nvidia-smi").write_text(
        "#!/bin/sh\ncase $1 in\n"
        "  -L) echo 'GPU 0: NVIDIA GB10 (UUID: GPU-00000000-0000-0000-0000-000000000000)' ;;\n"
        "  --query-gpu=*) echo 580.95.05 ;;\n"
        "  --query-compute-apps=*) ;;\n"
        "  *) echo '| NVIDIA-SMI 580.95.05  Driver Version: 580.95.05  CUDA Version: 13.0 |' ;;\n"
        "esac\n"
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "LC_ALL": "C"}


def test_preflight_and_alike_share_one_round_trip_per_node(node_env: dict[str, str]) -> None:
    cluster = LocalCluster(2, node_env)
    preflight = all_preflight(cluster)
    alike = all_alike(cluster)
    for node in cluster.nodes:
        conn = node.conn
        assert isinstance(conn, LocalConn)
        assert len(conn.commands) == 1, f"{node.name}: {len(conn.commands)} round trips"
        facts = preflight[node.name]
        assert not isinstance(facts, Exception)
        assert facts.now is not None and facts.uptime_s is not None
        assert facts.docker.up is False  # the stand-in's daemon is down
        same = alike[node.name]
        assert not isinstance(same, Exception)
        assert same.kernel.value == os.uname().release
    # asked again, in the other order: all from the cache
    node_alike(cluster, cluster.head)
    node_preflight(cluster, cluster.head)
    assert len(cluster.head.conn.commands) == 1  # type: ignore[attr-defined]


def test_memory_probe_shares_the_host_round_trip(node_env: dict[str, str]) -> None:
    """The memory check's probe (/proc/meminfo, the largest processes, the GPU compute
    apps) rides the same round trip: asked first or after the others, one command."""
    cluster = LocalCluster(2, node_env)
    head, worker = cluster.nodes
    memory = node_memory(cluster, head)  # the memory check asks first on the head
    assert memory.meminfo is not None and memory.meminfo.total > 0
    assert memory.apps == ()  # the stand-in nvidia-smi lists no compute app
    assert memory.processes  # this shell's /proc has processes
    all_preflight(cluster)
    all_alike(cluster)
    node_memory(cluster, worker)  # asked last on the worker: from the cache
    for node in (head, worker):
        conn = node.conn
        assert isinstance(conn, LocalConn)
        assert len(conn.commands) == 1, f"{node.name}: {len(conn.commands)} round trips"


def test_gpu_health_rides_the_same_round_trip(node_env: dict[str, str]) -> None:
    """The GPU health probe is its own (not sections of the preflight probe) and still
    costs no round trip of its own: asked first or last, one command per node."""
    cluster = LocalCluster(2, node_env)
    head, worker = cluster.nodes
    health = node_gpu_health(cluster, head)
    assert health.kernel is not None and "gpu_query" in health.raw
    all_preflight(cluster)
    node_gpu_health(cluster, worker)
    for node in (head, worker):
        assert len(node.conn.commands) == 1, node.conn.commands  # type: ignore[attr-defined]


def test_every_topic_declares_its_host_probes() -> None:
    """The round trip's probes are collected from the topics' own declarations (a new
    topic's declared probe joins with no line elsewhere): the six that shared it before
    and the GPU health probe among them; the link probe is declared too and runs alone."""
    shared = [p.key for p in shared_probes()]
    before = ["alike", "fdlimit", "gpuhealth", "kernel", "loaded", "memory", "preflight"]
    assert [k for k in shared if k in before] == before  # topics in name order
    assert "link" in [p.key for p in host_probes() if not p.shared]
    assert len({p.key for p in host_probes()}) == len(host_probes())  # one key each
    assert host_probes() is host_probes()  # collected once


def test_declarations_are_read_in_order_and_a_key_is_declared_once() -> None:
    first, second = ModuleType("a"), ModuleType("b")
    one = HostProbe(key="one", command=lambda s, c: "true", parse=lambda t, s: t)
    two = HostProbe(key="two", command=lambda s, c: "true", parse=lambda t, s: t)
    first.HOST_PROBE, first.OTHER, second.HOST_PROBE = two, "not a probe", one  # type: ignore[attr-defined]
    assert declared_probes([first, second]) == (two, one)
    second.AGAIN = HostProbe(key="two", command=one.command, parse=one.parse)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="declared twice under one key: two"):
        declared_probes([first, second])


def test_a_probe_rides_by_declaration_not_by_its_command_text(node_env: dict[str, str]) -> None:
    """A probe the topics do not declare runs alone, even when its command is word for word
    a shared probe's (the round trip matched command text before: a mismatch quietly cost
    a round trip, a match made any caller's command ride)."""
    declared = memory_probe.HOST_PROBE
    twin = HostProbe(key="memory-twin", command=declared.command, parse=declared.parse)
    cluster = LocalCluster(1, node_env)
    (head,) = cluster.nodes
    assert twin not in shared_probes() and declared in shared_probes()
    ours = gather_probe(cluster, head, twin)
    theirs = gather_probe(cluster, head, declared)
    assert ours.meminfo is not None and theirs.meminfo is not None
    assert len(head.conn.commands) == 2  # type: ignore[attr-defined]
    assert head.conn.commands[0] == declared.command(cluster.settings, "vllm_node")  # type: ignore[attr-defined]


def test_alike_first_then_preflight_is_still_one_round_trip(node_env: dict[str, str]) -> None:
    cluster = LocalCluster(1, node_env)
    node_alike(cluster, cluster.head)
    node_preflight(cluster, cluster.head)
    assert len(cluster.head.conn.commands) == 1  # type: ignore[attr-defined]


def _waits_for(mine: Path, other: Path, marker: str) -> str:
    """A probe that marks ``mine`` and then waits (up to 10 s) for ``other``: two of them
    only both finish at once when they run side by side."""
    body = (
        f"touch {mine}\n"
        f"s wait sh -c 'i=0; while [ ! -e {other} ] && [ $i -lt 100 ]; do sleep 0.1; "
        f"i=$((i+1)); done; [ -e {other} ] && echo saw-{other.name}'\n"
    )
    return probe_script(marker, "joint", 20, body)


def test_joint_probe_runs_its_probes_side_by_side_and_prints_them_in_order(
    tmp_path: Path,
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    command = joint_probe([_waits_for(a, b, "@@m-a@@"), _waits_for(b, a, "@@m-b@@")])
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    _, first = split_probe(proc.stdout, "@@m-a@@", "a")
    _, second = split_probe(proc.stdout, "@@m-b@@", "b")
    assert first["wait"].rc == 0 and first["wait"].stdout.strip() == "saw-b"
    assert second["wait"].rc == 0 and second["wait"].stdout.strip() == "saw-a"
    assert proc.stdout.index("@@m-a@@") < proc.stdout.index("@@m-b@@")  # given order
    assert not list(Path("/tmp").glob(".pytest-spark-joint.*"))


def test_joint_probe_of_one_command_is_that_command() -> None:
    assert joint_probe(["sh -c 'echo x'"]) == "sh -c 'echo x'"
    with pytest.raises(ValueError):
        joint_probe([])
