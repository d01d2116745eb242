"""Run the real suite (tests_infra, tests_e2e) against sparksim, as a user would: in a
subprocess, over SSH, reading the verdicts from the JSON results."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_spark.access.simcontrol import SimCluster, sim_up, spawn_env

REPO = Path(__file__).resolve().parents[2]
# The suite tier's sims decode 4x faster than the real 122B at TP=2 (the emulator's default
# 40 tok/s) and answer sooner: these tests are about verdicts, not about the figures (the
# sim profile's floors still hold: 160 tok/s >= 20, and the slow-decode fault's tenth,
# 16 tok/s, still fails them). Every request of a whole-suite run then waits a quarter of
# the time. `--spark-sim` and scripts/run-sim keep the emulator's real-like pacing.
# A rank silent on the fabric is declared lost after NCCL's watchdog default (600 s), not
# the emulator's 10 s: the fault matrix's "twin down that NCCL_SOCKET_IFNAME names" row
# downs the twin the ranks' heartbeat crosses while serving, and with the suite's
# infra checks grown past 10 s (GPU health, memory, GID) the engine died before the
# serving checks ran (a killed rank is still seen at once: its connection closes).
# Prefill runs at 20000 tok/s (the default 4000): the long-context check's ~29.5k-token
# prompt took 7.8 s of every whole-suite run, 1.5 s now.
SUITE_SIM_ARGS = (
    "--emu", "decode_tok_s=160", "--emu", "ttft_s=0.1", "--emu", "heartbeat_timeout_s=600",
    "--emu", "prefill_tok_s=20000",
)  # fmt: skip


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "sparksim needs root (network namespaces, veth, tc, sshd)"
    for tool in ("ip", "tc", "unshare", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    if not os.access("/usr/sbin/sshd", os.X_OK):
        return "/usr/sbin/sshd not installed (apt-get install openssh-server)"
    return None


@pytest.fixture(scope="session")
def sim() -> Iterator[SimCluster]:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    cluster = sim_up(2, SUITE_SIM_ARGS)
    try:
        yield cluster
    finally:
        cluster.down()


@dataclass
class SuiteRun:
    ret: int
    output: str
    results: dict[str, Any]
    # What changed on the nodes across the run, beyond what it may leave (an audited
    # matrix row, tests/suite/nodeaudit.py); None: not audited.
    audit: list[str] | None = None

    def checks(self, **match: str) -> list[dict[str, Any]]:
        return [c for c in self.results["checks"] if all(c.get(k) == v for k, v in match.items())]

    def outcomes(self) -> dict[str, str]:
        return {c["nodeid"].split("::", 1)[1]: c["outcome"] for c in self.results["checks"]}

    def failed(self) -> dict[str, str]:
        return {
            c["nodeid"].split("::", 1)[1]: c["message"]
            for c in self.results["checks"]
            if c["outcome"] in ("failed", "error")
        }


def run_suite(
    tmp_path: Path,
    *args: str,
    sim: SimCluster | None = None,
    timeout: float = 600,
    profile: str = "sim",
) -> SuiteRun:
    """``pytest tests_infra ...`` in a subprocess; returns exit code, output and JSON. On a
    ``sim``, held to the threshold ``profile`` (sparksim's own, scaled 1/200)."""
    results = tmp_path / "results.json"
    argv = [str(REPO / ".venv" / "bin" / "pytest") if (REPO / ".venv").exists() else "pytest"]
    argv += [
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfEs",
        f"--spark-results={results}",
        "--rootdir",
        str(REPO),
        "-c",
        str(REPO / "pyproject.toml"),
    ]
    if sim is not None:
        argv += [
            f"--spark-head={sim.head}",
            f"--spark-workers={','.join(sim.workers)}",
            f"--spark-ssh-config={sim.ssh_config}",
            f"--spark-profile={profile}",
        ]
    argv += list(args)
    env = {k: v for k, v in spawn_env().items() if not k.startswith(("SPARK_", "PYTEST_"))}
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    output = proc.stdout + proc.stderr
    data = json.loads(results.read_text()) if results.exists() else {"checks": []}
    return SuiteRun(proc.returncode, output, data)


def node_run(
    sim: SimCluster, node: str, command: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``command`` on a sim node (its mgmt address), over the sim's ssh_config: exit status
    (255: ssh itself failed), stdout and stderr."""
    return subprocess.run(
        ["ssh", "-F", str(sim.ssh_config), "-o", "ConnectTimeout=5", node, command],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=spawn_env(),  # the matrix's lanes call this off the main thread
    )


def node_ssh(sim: SimCluster, node: str, command: str, timeout: float = 60) -> str:
    """``command``'s stdout on a sim node (its mgmt address), over the sim's ssh_config."""
    return node_run(sim, node, command, timeout).stdout


def stop_serving(sim: SimCluster) -> None:
    """The sim's launch stopped with launch-cluster.sh's own ``stop`` on the head, whatever
    state a test left it in (a cut head: the connect gives up after 5 s)."""
    subprocess.run(
        ["ssh", "-F", str(sim.ssh_config), "-o", "ConnectTimeout=5", sim.head,
         f"{sim.info['launch']['script']} -n 198.19.0.1,198.19.0.2 stop"],
        capture_output=True, timeout=120,
    )  # fmt: skip


def serving_containers(sim: SimCluster, name: str = "vllm_node") -> dict[str, str]:
    """Each node's running container ids named ``name`` ("" where none runs)."""
    return {
        n["name"]: node_ssh(sim, n["mgmt"], f"docker ps -q --filter name=^{name}$", 30).strip()
        for n in sim.info["nodes"]
    }


def sim_fault(sim: SimCluster, *args: str) -> None:
    result = sim.cli("fault", *args)
    assert result.returncode == 0, result.stderr


def launch_args(sim: SimCluster) -> list[str]:
    """Suite options that launch serving on the sim the way its cluster.json says."""
    launch = sim.info.get("launch")
    if not launch:
        pytest.skip("sparksim has no serving stack here (docker missing)")
    return [
        "--spark-launch",
        f"--spark-launch-script={launch['script']}",
        f"--spark-serve-args={launch['serve_args']}",
        f"--spark-container={launch['container']}",
    ]


def assert_one_failure_the_rest_point_at_it(run: SuiteRun, headline: str, where: str = "") -> None:
    """test_cluster_serving fails with the evidence; the container check gives each node's
    own verdict; every other check (those whose node id starts with ``where``: all by
    default) skips naming the root cause: nothing passes on a dead cluster and nothing
    piles on."""
    checks = {c["nodeid"]: c for c in run.results["checks"] if c["nodeid"].startswith(where)}
    serving = checks.pop("tests_e2e/test_readiness.py::test_cluster_serving")
    assert serving["outcome"] == "failed" and serving["message"].startswith(headline), serving
    for nodeid, check in checks.items():
        if "::test_serving_container_running" in nodeid:
            assert check["outcome"] in ("passed", "failed", "skipped"), check
            continue
        assert check["outcome"] == "skipped", (nodeid, check)
        assert check["message"].startswith(f"the cluster is not serving: {headline}"), check
        assert check["message"].endswith("(test_cluster_serving has the evidence)"), check
