"""The nodes-alike probe on a real sim node, and the faults that make a node unlike the
head: ``driver``, ``ntp``, ``nccl-build``, ``cx7-firmware``, ``dgx-os`` and ``running-image``
are each seen by their check, naming the node; ``fault clear`` makes the nodes alike again
(the original image back)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from pytest_spark.infra.alike.check import check_host_alike, check_image_alike, check_time_sync
from pytest_spark.infra.alike.probe import NodeAlike, alike_probe_command, parse_alike_probe
from pytest_spark.infra.finding import Skip

pytestmark = pytest.mark.sim  # a sparksim of its own: needs root (the sim tier)

NAMES = {"spark-1": "spark-head", "spark-2": "spark-worker-1"}


def probe_all(sim: Any) -> dict[str, NodeAlike]:
    command = alike_probe_command(container="vllm_node", image="vllm-node:latest")
    out = {}
    for name, suite_name in NAMES.items():
        proc = sim.ssh(name, command)
        assert proc.returncode == 0, proc.stderr
        out[suite_name] = parse_alike_probe(proc.stdout)
    return out


def test_alike_faults_caught_and_cleared(healthy_sim: Any) -> None:
    facts = probe_all(healthy_sim)
    head = facts["spark-head"]
    assert head.driver.value == "580.95.05" and head.cuda.value == "13.0"
    assert head.container is not None and head.container.nccl_loaded is not None
    assert head.dgx_os.value == "7.5.0", head.dgx_os  # /etc/dgx-release
    assert head.cx7_firmware.value == "28.45.4028 (NVD0000000087)", head.cx7_firmware
    assert check_host_alike("spark-head", facts).ok
    image = check_image_alike("spark-head", facts, "vllm_node")
    assert not isinstance(image, Skip) and image.ok, image.message
    before = facts["spark-worker-1"].image

    healthy_sim.cli("fault", "driver", "spark-2", "580.82.09")
    healthy_sim.cli("fault", "ntp", "spark-2")
    healthy_sim.cli("fault", "nccl-build", "spark-2")
    healthy_sim.cli("fault", "cx7-firmware", "spark-2", "28.39.1002 (NVD0000000099)")
    healthy_sim.cli("fault", "dgx-os", "spark-2", "7.2.3")
    facts = probe_all(healthy_sim)
    host = check_host_alike("spark-head", facts)
    assert not host.ok and host.node == "spark-worker-1" and "580.82.09" in host.message
    assert "ConnectX-7 firmware: spark-worker-1 has 28.39.1002 (NVD0000000099)" in host.message
    assert "DGX OS release: spark-worker-1 has 7.2.3, spark-head has 7.5.0" in host.message
    image = check_image_alike("spark-head", facts, "vllm_node")
    assert not isinstance(image, Skip) and not image.ok and image.node == "spark-worker-1"
    assert "the same version 2.27.7+cuda13.0, a different build" in image.message
    sync = check_time_sync(facts)
    assert not isinstance(sync, Skip) and not sync.ok and "NTPSynchronized=no" in sync.message

    healthy_sim.cli("fault", "clear")
    facts = probe_all(healthy_sim)
    assert check_host_alike("spark-head", facts).ok
    assert facts["spark-worker-1"].dgx_os.value == "7.5.0"
    image = check_image_alike("spark-head", facts, "vllm_node")
    assert not isinstance(image, Skip) and image.ok, image.message
    after = facts["spark-worker-1"].image
    assert before is not None and after is not None and after.identity == before.identity


def test_running_image_fault_seen_in_attach(healthy_sim: Any) -> None:
    """``running-image``: the node's next serving container starts from another build, then
    its tag goes back: the tags are alike, the running containers are not."""
    start = "docker run -d --rm --name vllm_node --entrypoint= vllm-node:latest sleep infinity"
    healthy_sim.cli("fault", "running-image", "spark-2")
    try:
        for name in NAMES:
            proc = healthy_sim.ssh(name, start)
            assert proc.returncode == 0, proc.stderr
        back = "docker image inspect -f '{{.Id}}' vllm-node:latest"
        running = "docker inspect -f '{{.Image}}' vllm_node"
        for _ in range(50):  # the watcher puts the tag back within ~0.2 s
            tag, run = (healthy_sim.ssh("spark-2", c).stdout.strip() for c in (back, running))
            if tag != run:
                break
            time.sleep(0.2)
        assert tag != run, "the tag was not put back on the original image"
        facts = probe_all(healthy_sim)
        assert all(f.running is not None for f in facts.values())
        image = check_image_alike("spark-head", facts, "vllm_node")
        assert not isinstance(image, Skip) and not image.ok and image.node == "spark-worker-1"
        assert "both tagged vllm-node:latest" in image.message, image.message
    finally:
        healthy_sim.cli("fault", "clear")
        healthy_sim.ssh("spark-1", "docker rm -f vllm_node")
    assert healthy_sim.ssh("spark-2", "docker ps -q --filter name=vllm_node").stdout.strip() == ""
    facts = probe_all(healthy_sim)
    image = check_image_alike("spark-head", facts, "vllm_node")
    assert not isinstance(image, Skip) and image.ok, image.message
