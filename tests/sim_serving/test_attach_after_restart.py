"""Attach while loading after a restart (issue #13, part 3): the serving container as
operators run it with a restart policy (`docker run --restart unless-stopped ... vllm serve
...`, the docker-compose way; not launch-cluster.sh's `sleep infinity` containers). After
`docker restart`, `docker logs` still holds the earlier start's lines (sparksim's dockerd is
a real one) and the engine loads again; the suite, attached at once, reads only this start:
it waits through the load and passes, instead of calling the old "Application startup
complete." ready and failing on a refused connection.

One Spark serving alone (TP=1, the suite given only the head): the 122B checkpoint then
needs ``--gpu-memory-utilization 0.99`` to leave KV cache room on one GB10.
"""

from __future__ import annotations

import shlex
import time
from typing import Any

import pytest

pytestmark = pytest.mark.sim

CONTAINER = "vllm_node"
# About 40 s of emulated load: the suite's own start-up (~10 s here) lands inside it.
LOAD_SCALE = "0.05"
PHASES = ["start", "weights", "kv", "graphs", "api", "ready"]


def compose_run(sim: Any) -> str:
    """The operator's `docker run` of a one-node (TP=1) engine container on the head."""
    serve = shlex.split(sim.cluster["launch"]["serve_args"])
    if "--distributed-executor-backend" in serve:  # one node: no distributed backend
        at = serve.index("--distributed-executor-backend")
        del serve[at : at + 2]
    for flag, value in (("--tensor-parallel-size", "1"), ("--gpu-memory-utilization", "0.99")):
        serve[serve.index(flag) + 1] = value
    ip = sim.fabric_ip(sim.head["name"])
    docker = [
        "docker", "run", "-d", "--restart", "unless-stopped", "--name", CONTAINER,
        "--network", "host", "--ipc=host", "--gpus", "all", "--privileged",
        "-e", f"VLLM_HOST_IP={ip}", "-e", f"SPARKSIM_EMU_TIME_SCALE={LOAD_SCALE}",
    ]  # fmt: skip
    # $VLLM_SPARK_EXTRA_DOCKER_ARGS: the node's model and settings mounts (its sshd sets it).
    image = shlex.join(["vllm-node:latest", *serve])
    return f"{shlex.join(docker)} $VLLM_SPARK_EXTRA_DOCKER_ARGS {image}"


def test_attach_right_after_a_restart_waits_for_this_start_and_passes(
    sim: Any, run_suite: Any
) -> None:
    head = sim.head["name"]
    url = f"http://{sim.head['mgmt']}:8000/health"
    sim.out(head, compose_run(sim))
    try:
        sim.wait_http(url, 200, timeout=180)
        sim.out(head, f"docker restart {CONTAINER}")
        assert sim.http_status(url) is None, "the restarted engine loads again"
        restarted = time.monotonic()
        run = run_suite("tests_e2e/test_readiness.py", workers=False)
        took = time.monotonic() - restarted
        logs = sim.out(head, f"docker logs {CONTAINER} 2>&1")
    finally:
        sim.ssh(head, f"docker rm -f {CONTAINER}")
    assert logs.count("INFO:     Application startup complete.") == 2, "both starts' lines"
    assert run.ret == 0 and not run.not_passed(), run.output[-4000:]
    serving = run.results["serving"]
    assert serving["status"] == "ready" and not serving["launched"], serving
    phases = [p["phase"] for p in serving["timeline"]]
    assert phases == PHASES, serving["timeline"]
    # The wait went on through this start's load (the old start's ready line would give
    # ~0 s), and the suite's run ended after it.
    assert serving["ready_s"] > 5, serving
    assert took > serving["ready_s"], (took, serving)
