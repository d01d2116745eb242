"""GPU health gathering on real sim nodes: the GPU health probe (in the node's one host
round trip) brings back the GPU readings and the kernel log since boot from the node's own
nvidia-smi, journalctl and dmesg; each GPU fault is seen by its check, naming the node,
and only by it; ``fault clear`` makes the node healthy again."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_spark.infra.finding import Skip
from pytest_spark.infra.gpuhealth.check import (
    check_gpu_kernel_log,
    check_gpu_persistence,
    check_gpu_temperature,
    check_gpu_throttle,
)
from pytest_spark.infra.gpuhealth.probe import (
    GpuHealth,
    gpuhealth_probe_command,
    parse_gpuhealth_probe,
)
from pytest_spark.settings.profiles import load_profile

pytestmark = pytest.mark.sim  # a sparksim of its own: needs root (the sim tier)

SECTION = load_profile("sim").gpu_health
NAMES = {"spark-1": "spark-head", "spark-2": "spark-worker-1"}


def probe(sim: Any, name: str) -> GpuHealth:
    proc = sim.ssh(name, gpuhealth_probe_command())
    assert proc.returncode == 0, proc.stderr
    return parse_gpuhealth_probe(proc.stdout)


def levels(node: str, h: GpuHealth) -> dict[str, str]:
    throttle = check_gpu_throttle(node, h, SECTION)
    assert not isinstance(throttle, Skip)
    return {
        "temperature": check_gpu_temperature(node, h, SECTION).level,
        "throttle": throttle.level,
        "persistence": check_gpu_persistence(node, h, SECTION).level,
        "kernel": check_gpu_kernel_log(node, h.kernel, SECTION).level,
    }


HEALTHY = {"temperature": "pass", "throttle": "pass", "persistence": "pass", "kernel": "pass"}


def test_gpu_faults_caught_each_by_its_check_and_cleared(healthy_sim: Any) -> None:
    for name, node in NAMES.items():
        h = probe(healthy_sim, name)
        assert h.gpus[0].temperature_c == 41 and h.gpus[0].persistence is True
        assert h.kernel.source == "journalctl -k -b" and h.kernel.lines >= 4
        assert levels(node, h) == HEALTHY, (node, h)

    W = "spark-worker-1"
    healthy_sim.cli("fault", "gpu-xid", "spark-2", "--xid", "79")
    h = probe(healthy_sim, "spark-2")
    kernel = check_gpu_kernel_log(W, h.kernel, SECTION)
    assert kernel.level == "fail" and kernel.node == W
    assert "Xid 79 (GPU has fallen off the bus)" in kernel.message
    assert "NVRM: Xid (PCI:000f:01:00): 79" in kernel.message
    assert levels(W, h) == {**HEALTHY, "kernel": "fail"}
    assert levels("spark-head", probe(healthy_sim, "spark-1")) == HEALTHY  # that node only

    healthy_sim.cli("fault", "clear")
    healthy_sim.cli("fault", "gpu-throttle", "spark-2", "--reason", "hw_slowdown")
    h = probe(healthy_sim, "spark-2")
    throttle = check_gpu_throttle(W, h, SECTION)
    assert not isinstance(throttle, Skip) and throttle.level == "fail"
    assert "clocks event reason hw_slowdown active" in throttle.message
    assert "SM clock 504 MHz of max 3003 MHz" in throttle.message
    assert levels(W, h) == {**HEALTHY, "throttle": "fail"}

    healthy_sim.cli("fault", "clear")
    healthy_sim.cli("fault", "gpu-persistence-off", "spark-2")
    h = probe(healthy_sim, "spark-2")
    assert levels(W, h) == {**HEALTHY, "persistence": "fail"}

    healthy_sim.cli("fault", "clear")
    healthy_sim.cli("fault", "kernel-log-restricted", "spark-2")
    h = probe(healthy_sim, "spark-2")
    kernel = check_gpu_kernel_log(W, h.kernel, SECTION)
    assert kernel.level == "warn" and "insufficient permissions" in kernel.message
    assert "Operation not permitted" in kernel.message

    healthy_sim.cli("fault", "clear")
    assert levels(W, probe(healthy_sim, "spark-2")) == HEALTHY
