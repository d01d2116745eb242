"""What a node looks like over SSH: identity, isolation, passwordless head -> workers."""

from __future__ import annotations

import importlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.sim


def test_ssh_config_reaches_every_node_with_strict_host_keys(sim: Any) -> None:
    config = Path(sim.cluster["ssh_config"]).read_text()
    known = Path(sim.cluster["known_hosts"]).read_text().splitlines()
    for node in sim.cluster["nodes"]:
        assert f"Host {node['mgmt']}\n" in config
        assert sim.out(node["name"], "hostname").strip() == node["name"]
    assert "StrictHostKeyChecking yes" in config
    assert len(known) == 2
    assert known[0].split()[2] != known[1].split()[2], "each node has its own host key"


def test_unknown_host_key_is_refused(sim: Any, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    proc = sim.ssh("spark-1", "true", "-o", "ControlPath=none", "-o", f"UserKnownHostsFile={empty}")
    assert proc.returncode == 255
    assert "Host key verification failed" in proc.stderr


def test_node_has_own_pid_namespace_and_masked_bashrc(sim: Any) -> None:
    assert sim.out("spark-1", "cat /proc/1/comm").strip() == "sshd"
    assert sim.out("spark-2", "wc -c < /root/.bashrc").strip() == "0"
    assert sim.out("spark-2", "command -v ibstat").strip() == "/usr/local/sbin/ibstat"
    docker_host = f"unix://{sim.state_dir}/nodes/spark-2/docker.sock"
    assert sim.out("spark-2", "echo $DOCKER_HOST").strip() == docker_host
    # sysfs shows the node's own interfaces; the host's cgroup mounts stay (for dockerd).
    net = sim.out("spark-1", "ls /sys/class/net").split()
    assert sorted(net) == sorted(
        ["lo", "mgmt0", "enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1"]
    )
    if os.path.ismount("/sys/fs/cgroup"):
        assert sim.out("spark-1", "mountpoint /sys/fs/cgroup").strip().endswith("is a mountpoint")
    addrs = sim.out("spark-1", "ip -o -4 addr show").split()
    assert "198.19.0.1/24" in addrs and "198.19.1.1/24" in addrs
    assert f"198.18.{sim.instance}.11/24" in addrs


def test_head_reaches_workers_passwordlessly(sim: Any) -> None:
    # launch-cluster.sh checks `ssh -o BatchMode=yes WORKER true` from the head.
    for target in ("spark-2", sim.node("spark-2")["mgmt"], "198.19.0.2"):
        out = sim.out("spark-1", f"ssh -o BatchMode=yes -o ConnectTimeout=5 {target} hostname")
        assert out.strip() == "spark-2", target
    assert sim.out("spark-2", "ssh -o BatchMode=yes spark-1 hostname").strip() == "spark-1"


def test_fabric_twins_ping_with_jumbo_frames(sim: Any) -> None:
    # 8972 bytes of ICMP payload + 28 of headers = 9000, don't fragment.
    for addr in ("198.19.0.2", "198.19.1.2"):
        proc = sim.ssh("spark-1", f"ping -c1 -W2 -M do -s 8972 {addr}")
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_container_sources_are_visible_inside_every_node(sim: Any, sparksim: Any) -> None:
    """The node's dockerd resolves `docker run -v` sources inside the node, whose /tmp is
    its own: torch's site-packages (a CI checkout in /tmp) must be bound back there."""
    serving = importlib.import_module("sparksim_under_test.serving")
    sources = serving.container_sources(Path(sim.state_dir))
    assert sources, "no torch site-packages found for the sim's Python"
    for node in ("spark-1", "spark-2"):
        for src in sources:
            assert sim.out(node, f"test -d {src} && echo yes").strip() == "yes", (node, src)


def test_private_tmp_binds_back_sources_that_lie_under_it(sparksim: Any, tmp_path: Path) -> None:
    node_mod = importlib.import_module("sparksim_under_test.node")
    topo = importlib.import_module("sparksim_under_test.topology").build(0, 2)
    site = Path(tempfile.mkdtemp(prefix="site-", dir="/tmp"))
    elsewhere = Path("/usr/lib")
    state = tmp_path / "state"
    (state / "nodes" / topo.nodes[0].name).mkdir(parents=True)
    try:
        # the serving containers' sources, which cluster.py passes (serving.container_sources)
        steps = node_mod._private_tmp_steps(state, topo.nodes[0], [site, elsewhere])
    finally:
        site.rmdir()
    own_tmp = node_mod.node_dir(state, topo.nodes[0]) / "tmp"
    inner = own_tmp / site.relative_to("/tmp")
    assert f"mount --bind {site} {inner}" in steps
    assert not any(str(elsewhere) in step for step in steps)  # not under a private folder
    # bound back before the node's own /tmp covers the host's
    assert steps.index(f"mount --bind {site} {inner}") < steps.index(
        f"mount --rbind {own_tmp} /tmp"
    )


def test_serving_image_has_one_id_on_every_node(sim: Any) -> None:
    """The upstream launcher (verify_cluster_image_consistency) aborts a launch where
    ``vllm-node:latest`` has another ID on a worker. Real Sparks get the image by
    ``docker save | docker load`` (build-and-copy.sh --copy-to): one ID. So does the sim,
    with the config ``docker import --change`` gave it, also after ``fault clear`` puts a
    removed image back."""
    inspect = "docker image inspect -f '{{json .}}' vllm-node:latest"

    def images() -> list[dict[str, Any]]:
        return [json.loads(sim.out(n["name"], inspect)) for n in sim.cluster["nodes"]]

    found = images()
    assert len({i["Id"] for i in found}) == 1, [i["Id"] for i in found]
    config = found[0]["Config"]
    assert config["Env"] == [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONUNBUFFERED=1",
    ]
    assert config["WorkingDir"] == "/workspace" and config["Cmd"] == ["/bin/bash"]
    assert config["Labels"] == {"org.opencontainers.image.title": "vllm-node"}
    assert found[0]["RepoTags"] == ["vllm-node:latest"] and found[0]["Os"] == "linux"
    sim.cli("fault", "docker", "spark-2", "no-image")
    try:
        assert sim.ssh("spark-2", inspect).returncode != 0
    finally:
        sim.cli("fault", "clear")
    assert [i["Id"] for i in images()] == [found[0]["Id"]] * 2
