"""The real sparkrun CLI (PyPI ``sparkrun`` 0.4.2, REFERENCE.md 6a) against sparksim: a
two-node ``vllm-distributed`` recipe (fixtures/sparkrun/recipes/) run as an operator runs
it, ``sparkrun run RECIPE --hosts HEAD,WORKER --offline --no-auto-detect --no-follow``,
over the nodes' real sshd and into their real dockerd, until sparkrun itself says
"Inference ready"; then what it left on each node, and ``sparkrun stop``, always.

sparkrun runs from its own virtualenv (``scripts/setup-sparkrun``: Python >= 3.12, never a
dependency of the plugin); without it these tests skip saying so. Its state goes to a
temporary config and cache folder (``SPARKRUN_CONFIG_DIR``, ``SPARKRUN_CACHE_DIR``), never
the operator's ``~/.config/sparkrun``: a ``config.yaml`` whose ``ssh.options`` name the
sim's ssh_config (sparkrun's own setting for reaching hosts that root's ssh config does not
name), an empty ``registries.yaml`` (no registry clones: the recipe is a local file) and
a saved cluster. ``SPARKRUN_NO_TELEMETRY=1``: nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.sim

REPO = Path(__file__).resolve().parents[2]
Sim = Any  # tests/sim_serving/conftest.py's Sim (the module's two-node sim)
VENV = Path(os.environ.get("SPARK_SPARKRUN_VENV") or REPO / ".venv-sparkrun")
SPARKRUN = VENV / "bin" / "sparkrun"
RECIPE = REPO / "fixtures" / "sparkrun" / "recipes" / "sim-qwen3.5-2node.yaml"
SERVED = "qwen3.5-122b"
MODEL = "Qwen/Qwen3.5-122B-A10B-FP8"
SERVE_LOG = "/tmp/sparkrun_serve.log"
RUN_TIMEOUT = 300.0

if not os.access(SPARKRUN, os.X_OK):
    pytest.skip(
        f"no sparkrun CLI at {SPARKRUN}: run scripts/setup-sparkrun (its own venv, "
        "Python >= 3.12; scripts/run-tests does it)",
        allow_module_level=True,
    )


@dataclass
class Sparkrun:
    """The sparkrun CLI with a private config and cache, reaching ``sim``'s nodes."""

    sim: Sim
    home: Path

    @property
    def hosts(self) -> str:
        return ",".join(n["mgmt"] for n in self.sim.cluster["nodes"])

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKRUN_", "HF_"))}
        env.update(
            SPARKRUN_CONFIG_DIR=str(self.home / "config"),
            SPARKRUN_CACHE_DIR=str(self.home / "cache"),
            SPARKRUN_NO_TELEMETRY="1",
            # sparkrun mounts its own machine's Hugging Face cache path on every node: the
            # nodes' is root's (/root is each node's own home).
            HF_HOME="/root/.cache/huggingface",
        )
        return env

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SPARKRUN), *args],
            capture_output=True, text=True, timeout=timeout, env=self.env(), cwd=self.home,
        )  # fmt: skip


def write_config(home: Path, sim: Sim) -> None:
    config = home / "config"
    (config / "clusters").mkdir(parents=True, exist_ok=True)
    (home / "cache").mkdir(exist_ok=True)
    ssh = json.dumps(["-F", sim.cluster["ssh_config"]])
    (config / "config.yaml").write_text(f"ssh:\n  options: {ssh}\n")
    (config / "registries.yaml").write_text("config_version: 1\nregistries: []\n")
    hosts = "".join(f"  - {n['mgmt']}\n" for n in sim.cluster["nodes"])
    (config / "clusters" / "sim.yaml").write_text(
        f"name: sim\nhosts:\n{hosts}user: {sim.cluster['user']}\n"
    )


@pytest.fixture(scope="module")
def sparkrun(sim: Sim, tmp_path_factory: pytest.TempPathFactory) -> Sparkrun:
    home = tmp_path_factory.mktemp("sparkrun")
    write_config(home, sim)
    return Sparkrun(sim, home)


@dataclass
class Job:
    run: subprocess.CompletedProcess[str]
    cluster_id: str


def _output(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def _serving_containers(sim: Sim, name: str) -> list[dict[str, str]]:
    out = sim.out(
        name, "docker ps --filter label=sparkrun.cluster_id --format '{{json .}}'"
    ).splitlines()
    return [json.loads(line) for line in out if line.strip()]


@pytest.fixture(scope="module")
def job(sim: Sim, sparkrun: Sparkrun) -> Iterator[Job]:
    """The recipe launched by the real CLI; ``sparkrun stop`` after, whatever happened."""
    proc = sparkrun(
        "run", str(RECIPE), "--hosts", sparkrun.hosts,
        "--offline", "--no-auto-detect", "--no-follow",
        timeout=RUN_TIMEOUT,
    )  # fmt: skip
    text = proc.stdout + proc.stderr
    found = re.search(r"^Cluster:\s+(\S+)", text, re.M)
    try:
        assert proc.returncode == 0, f"sparkrun run failed\n{_output(proc)}"
        assert found, f"sparkrun run printed no 'Cluster:' line\n{_output(proc)}"
        yield Job(proc, found.group(1))
    finally:
        target = found.group(1) if found else str(RECIPE)
        stop = sparkrun("stop", target, "--hosts", sparkrun.hosts)
        left = [c for n in sim.cluster["nodes"] for c in _serving_containers(sim, n["name"])]
        assert stop.returncode == 0, f"sparkrun stop failed\n{_output(stop)}"
        assert not left, f"sparkrun stop left containers: {left}"


def test_sparkrun_run_reports_inference_ready(job: Job, sim: Sim) -> None:
    """sparkrun's own readiness (rank 0: master port, HTTP, one first token) passes, on
    the head's address and the recipe's port."""
    out = job.run.stdout + job.run.stderr
    head = sim.head["mgmt"]
    assert re.search(rf"Inference ready at http://{re.escape(head)}:8000/v1", out), _output(job.run)
    assert "(sparkrun-rank0-v1, rank 0)" in out


def test_one_labelled_rank_container_per_node(job: Job, sim: Sim) -> None:
    """``sparkrun_<intent>_<hash>_node_<rank>`` on each node, rank = host order, with the
    labels 6a lists and the run flags sparksim must take (``--gpus device=0``, ``--user``,
    the recipe's nofile ulimit, ``--ipc=shareable``, sparkrun's seccomp profile)."""
    for rank, node in enumerate(sim.cluster["nodes"]):
        found = _serving_containers(sim, node["name"])
        assert len(found) == 1, f"{node['name']}: {found}"
        name = found[0]["Names"]
        assert name == f"{job.cluster_id}_node_{rank}", name
        info = json.loads(sim.out(node["name"], f"docker inspect {shlex.quote(name)}"))[0]
        labels = info["Config"]["Labels"]
        assert labels["sparkrun.cluster_id"] == job.cluster_id
        assert labels["sparkrun.rank"] == str(rank)
        assert labels["sparkrun.runtime"] == "vllm-distributed"
        assert labels["sparkrun.served_model_name"] == SERVED
        assert labels["sparkrun.model"] == MODEL
        assert labels["sparkrun.recipe"] == str(RECIPE)
        assert labels["sparkrun.distribution"] == "sparkrun"
        host = info["HostConfig"]
        assert info["Config"]["User"] == "0:0"
        assert host["NetworkMode"] == "host"
        assert host["IpcMode"] == "shareable"
        assert host["AutoRemove"] is True
        assert {"Name": "nofile", "Hard": 20000, "Soft": 20000} in host["Ulimits"]
        assert [r["DeviceIDs"] for r in host["DeviceRequests"]] == [["0"]]
        assert any(o.startswith("seccomp=") for o in host["SecurityOpt"]), host["SecurityOpt"]
        assert "no-new-privileges" in host["SecurityOpt"]


def test_every_rank_serves_with_vllm_distributed_flags(job: Job, sim: Sim) -> None:
    """PID 1 keeps the container up (``sleep infinity``); each rank's ``vllm serve`` was
    ``docker exec``'d with ``--nnodes 2 --node-rank R --master-addr HEAD --master-port
    25000``, ``--headless`` on rank 1, and writes /tmp/sparkrun_serve.log inside the
    container; ``docker logs`` holds nothing of vLLM."""
    master = None
    for rank, node in enumerate(sim.cluster["nodes"]):
        name = f"{job.cluster_id}_node_{rank}"
        ps = sim.out(node["name"], f"docker exec {name} ps -eo args")
        assert "sleep infinity" in ps, ps
        serve = next((ln for ln in ps.splitlines() if " serve " in ln and "vllm" in ln), "")
        argv = serve.split()
        assert argv, f"{node['name']}: no vllm serve in {name}:\n{ps}"
        assert argv[argv.index("--nnodes") + 1] == "2", serve
        assert argv[argv.index("--node-rank") + 1] == str(rank), serve
        assert argv[argv.index("--master-port") + 1] == "25000", serve
        addr = argv[argv.index("--master-addr") + 1]
        master = master or addr
        assert addr == master, f"rank {rank} meets at {addr}, rank 0 at {master}"
        assert ("--headless" in argv) == (rank > 0), serve
        log = sim.out(node["name"], f"docker exec {name} cat {SERVE_LOG}")
        assert log.strip(), f"{node['name']}: {SERVE_LOG} empty in {name}"
        logs = sim.ssh(node["name"], f"docker logs {name}")
        assert "vllm" not in (logs.stdout + logs.stderr).lower(), logs.stdout + logs.stderr
    head_log = sim.out(sim.head["name"], f"docker exec {job.cluster_id}_node_0 cat {SERVE_LOG}")
    assert "Application startup complete" in head_log, head_log[-2000:]
    assert master == sim.head["mgmt"] or master in {p["addr"] for p in sim.head["fabric"]}


def test_the_head_serves_the_recipe_model(job: Job, sim: Sim) -> None:
    models = sim.out(sim.head["name"], "curl -s http://127.0.0.1:8000/v1/models")
    assert [m["id"] for m in json.loads(models)["data"]] == [SERVED], models


def test_job_file_and_status_name_the_job(job: Job, sim: Sim, sparkrun: Sparkrun) -> None:
    """sparkrun's own records of the job: its job file (hosts, the image it ran) and
    ``sparkrun status`` through the saved cluster."""
    jobs = list((sparkrun.home / "cache" / "jobs").glob("*.yaml"))
    digest = job.cluster_id.removeprefix("sparkrun_")
    assert [p.stem for p in jobs] == [digest], jobs
    text = jobs[0].read_text()
    assert "effective_container_image: vllm-node:latest" in text
    for node in sim.cluster["nodes"]:
        assert node["mgmt"] in text
    status = sparkrun("status", "--cluster", "sim")
    assert status.returncode == 0, _output(status)
    assert digest in status.stdout and status.stdout.count("Up ") >= 2, _output(status)
