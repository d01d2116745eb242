"""The real sparkrun CLI (PyPI ``sparkrun`` 0.4.2, REFERENCE.md 6a) against sparksim, on one
two-node sim, in three parts:

1. A job stood up as an operator stands one up: a two-node ``vllm-distributed`` recipe
   (fixtures/sparkrun/recipes/) run with ``sparkrun run RECIPE --hosts HEAD,WORKER
   --offline --no-auto-detect --no-follow``, over the nodes' real sshd and into their real
   dockerd, until sparkrun itself says "Inference ready"; then what it left on each node.
2. The whole suite attached to that job (issue #35, item 1), as a user runs it after
   ``sparkrun run``: ``--spark-head``/``--spark-workers``, no ``--spark-container``; the suite
   finds the job by its labels over SSH, as on real Sparks. Then two jobs and xdist; then
   ``sparkrun stop``, always, leaving nothing. (Measured before the sparkrun layout was read,
   2026-12-05, on sparksim's own job model: 2 failures, the serving env "container vllm_node
   not found" and the all-reduce "could not run", and 33 skips: the loaded parity, nodes alike,
   the container checks, the reasoning and tool-call diagnoses, ...; on the real sparkrun the
   issue saw 6 failures. After: none, every such check run.)
3. The whole suite with ``--spark-launch --spark-launcher=sparkrun``: the CLI stands the
   recipe up, the readiness watch takes over, every check runs against sparkrun's rank
   containers, and teardown's ``sparkrun stop`` leaves nothing on the nodes; a failed start
   and SIGTERM during the start.

One sim and one ``sparkrun run`` for parts 1 and 2 (they were three modules, three sims, and
part 2 ran on a job of sparksim's own model: one stack and two sims more). sparksim's job
model (``spark-sim job start``) is held to sparkrun's layout by test_sparkrun_env_faults.py
(with rank 1 killed in its running container: the real CLI's container goes when its rank is
killed, sparksim's model keeps it) and the suite tier's tests/suite/test_sparkrun_faults.py.

The recipe gets the mounts a sparksim serving container gets from launch-cluster.sh's node
settings (torch for the all-reduce, the node's tools and the sim's files), added as an
operator adds mounts to a recipe (``executor_config: volumes``; a local recipe is trusted
by sparkrun, no ``--trust``). sparkrun runs from its own virtualenv
(``scripts/setup-sparkrun``: Python >= 3.12, never a dependency of the plugin); without it
these tests skip saying so. Its state goes to a temporary config and cache folder
(``SPARKRUN_CONFIG_DIR``, ``SPARKRUN_CACHE_DIR``), never the operator's
``~/.config/sparkrun``: a ``config.yaml`` whose ``ssh.options`` name the sim's ssh_config
(sparkrun's own setting for reaching hosts that root's ssh config does not name; launched
by the suite, its ``ssh`` reaches the nodes through the suite's ``--spark-ssh-config``), an
empty ``registries.yaml`` (no registry clones: the recipe is a local file) and a saved
cluster. ``SPARKRUN_NO_TELEMETRY=1``: nothing leaves the machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

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
TORCH_MOUNT = "/opt/sparksim/torch-site"  # where sparksim's serving containers find torch
# The sim profile's 60 s is launch-cluster.sh's launch to ready on a loaded 2-core machine;
# sparkrun's own steps before it (hardware probe, image check on every node, the model's
# rsync to the worker, its 3 s serve check per rank) add 30-50 s here.
LOAD_BUDGET_S = 180
ENV_CHECK = "tests_infra/test_preflight.py::test_serving_env_matches_fabric[spark-head]"
HEAD, WORKER = "spark-head", "spark-worker-1"  # the suite's names of the sim's nodes

if not os.access(SPARKRUN, os.X_OK):
    pytest.skip(
        f"no sparkrun CLI at {SPARKRUN}: run scripts/setup-sparkrun (its own venv, "
        "Python >= 3.12; scripts/run-tests does it)",
        allow_module_level=True,
    )


def sim_recipe(sim: Sim, dest: Path, **changes: Any) -> Path:
    """The fixture recipe with the sim's container mounts (and ``changes`` at its top)."""
    data = {**yaml.safe_load(RECIPE.read_text()), **changes}
    volumes = ["/usr/local/sbin:/usr/local/sbin:ro", f"{sim.state_dir}:{sim.state_dir}:ro"]
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:
        volumes.append(f"{Path(spec.origin).resolve().parent.parent}:{TORCH_MOUNT}:ro")
        data.setdefault("env", {})["PYTHONPATH"] = TORCH_MOUNT
    data.setdefault("executor_config", {})["volumes"] = volumes
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


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
    """The job ``sparkrun run`` started; :meth:`stop` is ``sparkrun stop``, once."""

    run: subprocess.CompletedProcess[str]
    cluster_id: str
    recipe: Path
    sparkrun: Sparkrun
    stopped: bool = False

    def container(self, rank: int) -> str:
        return f"{self.cluster_id}_node_{rank}"

    def stop(self) -> None:
        """``sparkrun stop``: it exits 0 and leaves no container of the job on any node."""
        if self.stopped:
            return
        self.stopped = True
        sim = self.sparkrun.sim
        stop = self.sparkrun("stop", self.cluster_id, "--hosts", self.sparkrun.hosts)
        left = [c for n in sim.cluster["nodes"] for c in _serving_containers(sim, n["name"])]
        assert stop.returncode == 0, f"sparkrun stop failed\n{_output(stop)}"
        assert not left, f"sparkrun stop left containers: {left}"


def _output(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


def _serving_containers(sim: Sim, name: str) -> list[dict[str, str]]:
    out = sim.out(
        name, "docker ps --filter label=sparkrun.cluster_id --format '{{json .}}'"
    ).splitlines()
    return [json.loads(line) for line in out if line.strip()]


STARTED: list[Job] = []  # the module's job, for the launch tests to stop before they launch


@pytest.fixture(scope="module")
def job(sim: Sim, sparkrun: Sparkrun) -> Iterator[Job]:
    """The recipe launched by the real CLI; ``sparkrun stop`` after, whatever happened (the
    launch tests stop it first: they stand their own up)."""
    recipe = sim_recipe(sim, sparkrun.home / RECIPE.name)
    proc = sparkrun(
        "run", str(recipe), "--hosts", sparkrun.hosts,
        "--offline", "--no-auto-detect", "--no-follow",
        timeout=RUN_TIMEOUT,
    )  # fmt: skip
    text = proc.stdout + proc.stderr
    found = re.search(r"^Cluster:\s+(\S+)", text, re.M)
    if not found:  # no id to stop it by: by the recipe's label
        sparkrun("stop", str(recipe), "--hosts", sparkrun.hosts)
        assert proc.returncode == 0, f"sparkrun run failed\n{_output(proc)}"
        pytest.fail(f"sparkrun run printed no 'Cluster:' line\n{_output(proc)}")
    started = Job(proc, found.group(1), recipe, sparkrun)
    STARTED.append(started)
    try:
        assert proc.returncode == 0, f"sparkrun run failed\n{_output(proc)}"
        yield started
    finally:
        started.stop()


@pytest.fixture
def no_job() -> None:
    """The module's ``sparkrun run`` job stopped (asserting its stop), if it was started."""
    for started in STARTED:
        started.stop()


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
        assert labels["sparkrun.recipe"] == str(job.recipe)
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
        name = job.container(rank)
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
    head_log = sim.out(sim.head["name"], f"docker exec {job.container(0)} cat {SERVE_LOG}")
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


# Part 2: the whole suite attached to the job (issue #35, item 1).


def test_the_whole_suite_attached_to_a_sparkrun_job_is_green(
    sim: Sim, job: Job, run_suite: Any
) -> None:
    run = run_suite(timeout=900)
    assert run.ret == 0 and not run.not_passed(), run.output[-6000:]
    outcomes = {c["nodeid"]: c for c in run.results["checks"]}
    # the checks that read the serving containers ran (before: skipped, or failed)
    for nodeid in (
        "tests_e2e/test_readiness.py::test_serving_container_running[spark-head]",
        "tests_e2e/test_readiness.py::test_serving_container_running[spark-worker-1]",
        "tests_infra/test_preflight.py::test_serving_env_matches_fabric[spark-worker-1]",
        "tests_infra/test_preflight.py::test_gpu_not_held_by_others[spark-head]",
        "tests_infra/test_nccl.py::test_allreduce_does_not_hang_at_init",
        "tests_infra/test_alike.py::test_serving_image_alike",
    ):
        assert outcomes[nodeid]["outcome"] == "passed", outcomes[nodeid]
    loaded = [c for n, c in outcomes.items() if n.startswith("tests_infra/test_loaded.py")]
    assert loaded and all(c["outcome"] == "passed" for c in loaded), loaded
    assert run.results["serving"]["mode"] == "no-ray", run.results["serving"]
    # sparkrun's own management-first init (GLOO_SOCKET_IFNAME and the first
    # NCCL_SOCKET_IFNAME entry the wired mgmt0, NCCL_NET=IB: the data over RDMA) passes
    # with a note (was test_sparkrun_env_faults.py's, on sparksim's job model with that env
    # set by hand; the launched run below holds it too)
    env_check = outcomes[ENV_CHECK]
    assert any("wired management link mgmt0" in n for n in env_check.get("notes", [])), env_check


def _start_sim_job(sim: Sim, *args: str) -> dict[str, Any]:
    """A second job beside the module's, laid out by sparksim's own job model."""
    started: dict[str, Any] = json.loads(sim.cli("job", "start", *args).stdout)
    return started


def test_two_jobs_need_spark_job_and_it_picks_one(sim: Sim, job: Job, run_suite: Any) -> None:
    """Two jobs on the nodes (#229: one left running after ``sparkrun stop --all``): the
    suite will not guess, it names both; ``--spark-job`` picks one, which serves, and the
    other's rank containers are one failure (the same job on both nodes: one cause), the
    picked job's own ranks no strangers."""
    other = _start_sim_job(sim, "--intent", "gpt-oss-120b", "--recipe", "gpt-oss-120b-tp2")
    try:
        refused = run_suite("tests_e2e/test_readiness.py")
        assert refused.ret == 4, refused.output[-3000:]
        assert "2 sparkrun jobs run on the nodes" in refused.output, refused.output[-3000:]
        for cid in (job.cluster_id, other["cluster_id"]):
            assert cid in refused.output
        assert not refused.results["checks"], "no check ran"
        picked = run_suite(
            "tests_e2e/test_readiness.py", "tests_infra", "-m", "readiness or preflight or nccl",
            f"--spark-job={job.cluster_id}", timeout=900,
        )  # fmt: skip
    finally:
        sim.cli("job", "stop", "--cluster-id", other["cluster_id"], check=False)
    readiness = [
        c for c in picked.results["checks"] if c["nodeid"].startswith("tests_e2e/test_readiness")
    ]
    assert readiness and all(c["outcome"] != "failed" for c in readiness), readiness
    failed = picked.not_passed()
    held = f"tests_infra/test_preflight.py::test_gpu_not_held_by_others[{HEAD}]"
    assert list(failed) == [held], picked.output[-6000:]
    message = failed[held]
    assert message.startswith(
        f"{HEAD} (and {WORKER}, the same: one cause, this failure; fix it there too): "
        f"sparkrun job {other['cluster_id']} runs beside the tested job {job.cluster_id}"
    ), message
    assert f"container {other['containers'][sim.head['name']]}" in message
    assert f"sparkrun stop {other['cluster_id']}" in message


def test_xdist_workers_attach_to_the_job_the_controller_found(
    sim: Sim, job: Job, run_suite: Any
) -> None:
    """Under xdist the controller finds the layout before its workers start; they read it
    from the run directory (the per-node containers, the serve log)."""
    run = run_suite(
        "-n", "2", "tests_e2e/test_readiness.py", "tests_infra/test_preflight.py",
        "tests_infra/test_loaded.py",
    )  # fmt: skip
    assert run.ret == 0 and not run.not_passed(), run.output[-4000:]
    outcomes = {c["nodeid"]: c["outcome"] for c in run.results["checks"]}
    for node in ("spark-head", "spark-worker-1"):
        assert outcomes[f"tests_e2e/test_readiness.py::test_serving_container_running[{node}]"] == (
            "passed"
        )


# Part 3: the whole suite launching the recipe with the real CLI (the job above stopped).


@pytest.fixture
def sparkrun_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_job: None) -> Path:
    home = tmp_path / "sparkrun"
    (home / "config").mkdir(parents=True)
    (home / "cache").mkdir()
    (home / "config" / "registries.yaml").write_text("config_version: 1\nregistries: []\n")
    monkeypatch.setenv("SPARKRUN_CONFIG_DIR", str(home / "config"))
    monkeypatch.setenv("SPARKRUN_CACHE_DIR", str(home / "cache"))
    monkeypatch.setenv("SPARKRUN_NO_TELEMETRY", "1")
    monkeypatch.setenv("HF_HOME", "/root/.cache/huggingface")  # the nodes' (their /root)
    return home


def sparkrun_containers(sim: Sim) -> dict[str, str]:
    found = {}
    for node in sim.cluster["nodes"]:
        out = sim.out(node["name"], "docker ps -a --filter label=sparkrun.cluster_id -q")
        if out.strip():
            found[node["name"]] = out.strip()
    return found


def test_the_whole_suite_launched_by_sparkrun(
    sim: Sim, run_suite: Any, sparkrun_home: Path, tmp_path: Path
) -> None:
    recipe = sim_recipe(sim, tmp_path / "sim-qwen3.5-2node.yaml")
    run = run_suite(
        "--spark-launch", "--spark-launcher=sparkrun", f"--spark-recipe={recipe}",
        f"--spark-sparkrun={SPARKRUN}", "--spark-sparkrun-args=--no-auto-detect",
        f"--spark-threshold=readiness.max_load_s={LOAD_BUDGET_S}",
        timeout=900,
    )  # fmt: skip
    serving = run.results.get("serving") or {}
    assert serving.get("status") == "ready", run.output[-6000:]
    assert serving.get("launcher") == "sparkrun" and serving.get("stopped") is True, serving
    assert serving.get("cluster_id", "").startswith("sparkrun_"), serving
    assert serving.get("mode") == "no-ray", serving
    assert "--trust" not in serving.get("launch_command", "")
    assert "sparkrun: [sparkrun] Inference ready at http://" in run.output
    outcomes = {c["nodeid"]: c for c in run.results["checks"]}
    for nodeid in (
        "tests_e2e/test_readiness.py::test_cluster_serving",
        "tests_e2e/test_readiness.py::test_serving_container_running[spark-head]",
        "tests_e2e/test_readiness.py::test_serving_container_running[spark-worker-1]",
        "tests_infra/test_nccl.py::test_allreduce_does_not_hang_at_init",
        "tests_infra/test_preflight.py::test_gpu_not_held_by_others[spark-head]",
    ):
        assert outcomes[nodeid]["outcome"] == "passed", outcomes[nodeid]
    # sparkrun 0.4.2 inits over the management network when the workers reach the head's
    # management address (runtimes/_init_network.py): GLOO_SOCKET_IFNAME and the first
    # NCCL_SOCKET_IFNAME entry are the (wired) management interface, the data over RDMA
    # (NCCL_NET=IB). A healthy model is never called broken: the serving-env check holds
    # nothing against that (only a wireless one fails, sparkrun PR #219) and notes it.
    # The recipe's env: entries (PYTHONPATH, SPARKSIM_EMU_TIME_SCALE) are compared with the
    # rank process's environment: the loaded probe reads those names too (it kept only the
    # NCCL/GLOO/vLLM ones, and this check failed saying they were unset).
    failed = run.not_passed()
    assert not failed, failed
    env_check = outcomes[ENV_CHECK]
    assert any(
        "init (NCCL's bootstrap, gloo) runs over the wired management link mgmt0" in note
        for note in env_check.get("notes", [])
    ), env_check
    assert not sparkrun_containers(sim), "teardown's sparkrun stop left containers"


LAUNCH = ("--spark-launch", "--spark-launcher=sparkrun", "--spark-sparkrun-args=--no-auto-detect")


def test_a_failed_start_is_one_failure_in_sparkruns_words(
    sim: Sim, run_suite: Any, sparkrun_home: Path, tmp_path: Path
) -> None:
    """An image no node has: sparkrun --offline refuses before it starts anything; the
    suite says so once, in sparkrun's words, and every serving check skips citing it."""
    recipe = sim_recipe(sim, tmp_path / "r.yaml", container="vllm-node:on-no-node")
    run = run_suite(
        "tests_e2e/test_readiness.py", *LAUNCH, f"--spark-recipe={recipe}",
        f"--spark-sparkrun={SPARKRUN}", timeout=300,
    )  # fmt: skip
    failed = run.not_passed()
    assert list(failed) == ["tests_e2e/test_readiness.py::test_cluster_serving"], failed
    message = failed["tests_e2e/test_readiness.py::test_cluster_serving"]
    assert message.startswith(
        "sparkrun run exited 1: launch_inference failed: Offline launch cannot proceed"
    ), message
    assert "image vllm-node:on-no-node: missing on" in message, message
    assert run.results["serving"]["stopped"] is True
    assert not sparkrun_containers(sim)


def test_sigterm_during_the_start_stops_the_job(
    sim: Sim, sparkrun_home: Path, tmp_path: Path
) -> None:
    """SIGTERM (CI cancelling a job) while sparkrun waits for its rank 0: sparkrun gets its
    own SIGINT, the session ends interrupted (exit 2), and teardown's sparkrun stop finds
    the job by its recipe's label (no id was printed to the suite yet) and removes it."""
    env_slow = {**yaml.safe_load(RECIPE.read_text())["env"], "SPARKSIM_EMU_TIME_SCALE": "0.03"}
    recipe = sim_recipe(sim, tmp_path / "slow.yaml", env=env_slow)
    results = tmp_path / "results.json"
    argv = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
        "--rootdir", str(REPO), "-c", str(REPO / "pyproject.toml"),
        str(REPO / "tests_e2e" / "test_readiness.py"),
        f"--spark-head={sim.head['mgmt']}", f"--spark-workers={sim.worker['mgmt']}",
        f"--spark-ssh-config={sim.cluster['ssh_config']}", "--spark-profile=sim",
        *LAUNCH, f"--spark-recipe={recipe}", f"--spark-sparkrun={SPARKRUN}",
        f"--spark-results={results}", "--spark-history=off",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYTEST_"))}
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 180
    for line in proc.stdout:  # sparkrun has started the containers, and waits for rank 0
        seen.append(line)
        if "sparkrun: Cluster:" in line or time.monotonic() > deadline:
            break
    assert any("sparkrun: Cluster:" in line for line in seen), "".join(seen)
    assert sparkrun_containers(sim), "the job's containers run"
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=240)
    output = "".join(seen) + rest
    assert proc.returncode == 2, output[-4000:]
    assert not sparkrun_containers(sim), output[-4000:]
    serving = json.loads(results.read_text())["serving"]
    assert serving["launched"] is True and serving["stopped"] is True, serving
    assert serving["status"] == "launching" and "cluster_id" not in serving, serving
