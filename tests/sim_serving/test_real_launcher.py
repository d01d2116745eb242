"""The real launcher against sparksim: eugr/spark-vllm-docker's ``launch-cluster.sh``,
unmodified, run on the sim's head as an operator runs it, and the suite passing the
cluster it starts, in attach mode and with ``--spark-launch``.

Optional: give the path of a checkout of the real project::

    git clone https://github.com/eugr/spark-vllm-docker /opt/spark-vllm-docker
    SPARK_REAL_LAUNCHER=/opt/spark-vllm-docker \
        .venv/bin/pytest tests/sim_serving/test_real_launcher.py

The checkout is copied onto the head (a node-private /tmp; never into this repository).
Its image is the sim's ``vllm-node:latest``; a checkout whose containers run
``./run-cluster-node.sh`` (before 2026-03) gets that script COPYed into a derived image on
every node, as its Dockerfile does. The modes run are the ones the script has: Ray always
(``--ray`` where the script knows the flag, nothing where Ray is its only mode), no-Ray
where it has ``--no-ray`` (its default since 2026-07).
"""

from __future__ import annotations

import io
import os
import shlex
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.sim

ENV = "SPARK_REAL_LAUNCHER"
CHECKOUT = os.environ.get(ENV, "")
HOME = "/tmp/real-launcher"  # on the head: /tmp is the node's own
DERIVED = "vllm-node-real"
CONTAINER = "vllm_node"

if not CHECKOUT:
    pytest.skip(
        f"set {ENV}=/path/to/spark-vllm-docker (a checkout of eugr/spark-vllm-docker) to run "
        "its launch-cluster.sh against sparksim",
        allow_module_level=True,
    )


def _script_text() -> str:
    path = Path(CHECKOUT) / "launch-cluster.sh"
    if not path.is_file():
        pytest.fail(f"{ENV}={CHECKOUT}: no launch-cluster.sh there (a spark-vllm-docker checkout?)")
    return path.read_text(errors="replace")


SCRIPT_TEXT = _script_text()
HAS_RAY_FLAG = "--ray)" in SCRIPT_TEXT  # since 2026-07: --ray opts in, no-Ray is the default
MODES = ["ray", "no-ray"] if "--no-ray)" in SCRIPT_TEXT else ["ray"]
OLD_NODE_SCRIPT = (Path(CHECKOUT) / "run-cluster-node.sh").is_file() and (
    "run-cluster-node.sh" in SCRIPT_TEXT
)


@dataclass
class Real:
    """The real checkout installed on a sim."""

    sim: Any
    image: str

    @property
    def script(self) -> str:
        return f"{HOME}/launch-cluster.sh"

    @property
    def nodes(self) -> str:
        return ",".join(self.sim.fabric_ip(n["name"]) for n in self.sim.cluster["nodes"])

    def mode_flags(self, mode: str) -> list[str]:
        return ["--ray"] if mode == "ray" and HAS_RAY_FLAG else []

    def serve_args(self, mode: str) -> list[str]:
        args = shlex.split(self.sim.cluster["launch"]["serve_args"])
        if "--distributed-executor-backend" in args:  # the launcher's to add, not the engine's
            at = args.index("--distributed-executor-backend")
            del args[at : at + 2]
        if mode == "ray" and not HAS_RAY_FLAG:  # the old script never adds the backend
            args += ["--distributed-executor-backend", "ray"]
        return args

    def head(self, command: str, timeout: float = 120) -> Any:
        return self.sim.ssh(self.sim.head["name"], command, timeout)

    def containers(self) -> dict[str, str]:
        return {
            n["name"]: self.sim.out(n["name"], f"docker ps -aq --filter name=^{CONTAINER}$").strip()
            for n in self.sim.cluster["nodes"]
        }

    def tail(self, path: str, lines: int = 60) -> str:
        return str(self.head(f"tail -n {lines} {shlex.quote(path)} 2>&1").stdout)


def _tarball(folder: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(folder.iterdir()):
            if path.name != ".git":
                tar.add(path, arcname=path.name)
    return buf.getvalue()


@pytest.fixture(scope="module")
def real(sim: Any) -> Iterator[Real]:
    data = _tarball(Path(CHECKOUT))
    image = DERIVED if OLD_NODE_SCRIPT else sim.cluster["launch"]["image"]
    for node in sim.cluster["nodes"]:
        steps = [f"rm -rf {HOME} && mkdir -p {HOME} && tar -x -C {HOME}"]
        if OLD_NODE_SCRIPT:  # its Dockerfile: COPY run-cluster-node.sh $VLLM_BASE_DIR/
            steps.append(
                f"mkdir -p {HOME}.image && cp {HOME}/run-cluster-node.sh {HOME}.image/ && "
                f"printf 'FROM vllm-node:latest\\nCOPY run-cluster-node.sh "
                f"/workspace/run-cluster-node.sh\\n' > {HOME}.image/Dockerfile && "
                f"DOCKER_BUILDKIT=0 docker build -q -t {DERIVED} {HOME}.image"
            )
        proc = subprocess.run(
            ["ssh", "-F", sim.cluster["ssh_config"], node["mgmt"], " && ".join(steps)],
            input=data, capture_output=True, timeout=180,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    yield Real(sim, image)


def start_by_hand(real: Real, mode: str, log: str) -> int:
    """``setsid nohup launch-cluster.sh -n .. exec vllm serve .. > LOG &`` on the head."""
    argv = [real.script, "-n", real.nodes, "-t", real.image, *real.mode_flags(mode)]
    argv += ["exec", *real.serve_args(mode)]
    proc = real.head(
        f"setsid nohup {shlex.join(argv)} >{shlex.quote(log)} 2>&1 </dev/null & echo $!",
        timeout=30,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return int(proc.stdout.split()[-1])


def wait_healthy(real: Real, log: str, timeout: float = 120) -> None:
    url = f"http://{real.sim.head['mgmt']}:8000/health"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if real.sim.http_status(url) == 200:
            return
        time.sleep(0.5)
    raise AssertionError(f"GET {url} not 200 within {timeout:.0f} s; launcher log:\n"
                         + real.tail(log))  # fmt: skip


def stop(real: Real, mode: str) -> str:
    proc = real.head(shlex.join([real.script, "-n", real.nodes, *real.mode_flags(mode), "stop"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(proc.stdout)


@pytest.mark.parametrize("mode", MODES)
def test_launched_by_hand_attach_passes_and_stop_removes_the_containers(
    real: Real, run_suite: Any, mode: str
) -> None:
    log = f"/tmp/real-cluster-{mode}.log"
    pid = start_by_hand(real, mode, log)
    try:
        wait_healthy(real, log)
        run = run_suite(f"--spark-serve-log={log}", "tests_e2e")
        assert run.ret == 0 and not run.not_passed(), (
            f"attach to the real launcher's {mode} cluster: {run.not_passed()}\n"
            + run.output[-4000:]
        )
    finally:
        out = stop(real, mode)
    assert "Cluster stopped." in out, out
    assert real.containers() == {n["name"]: "" for n in real.sim.cluster["nodes"]}
    deadline = time.monotonic() + 30
    while real.head(f"kill -0 {pid}").returncode == 0:
        assert time.monotonic() < deadline, f"launcher {pid} still runs 30 s after stop"
        time.sleep(0.5)


@pytest.mark.parametrize("mode", MODES)
def test_spark_launch_with_the_real_script_passes_and_tears_down(
    real: Real, run_suite: Any, mode: str
) -> None:
    serve = shlex.join(real.serve_args(mode))
    run = run_suite(
        "--spark-launch",
        f"--spark-launch-script={real.script}",
        f"--spark-image={real.image}",
        f"--spark-serve-args={serve}",
        f"--spark-ray={'on' if mode == 'ray' else 'off'}",
        "tests_e2e",
    )
    left = real.containers()
    if any(left.values()):
        stop(real, mode)
    assert run.ret == 0 and not run.not_passed(), (
        f"--spark-launch with the real script ({mode}): {run.not_passed()}\n" + run.output[-4000:]
    )
    assert left == {n["name"]: "" for n in real.sim.cluster["nodes"]}, "teardown left containers"
