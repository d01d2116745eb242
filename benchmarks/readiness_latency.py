#!/usr/bin/env python3
"""Readiness latency against sparksim, side by side with the hand-run 60 s poll loop.

Measures, in one run each, (a) seconds from the head's `Application startup complete.`
log line to the readiness wait returning, (b) seconds from a fatal log line (the
emulator's CUDA OOM crash) to the wait failing, and (c) attach after a restart: an
operator-run engine container (`docker run --restart unless-stopped ... vllm serve`, one
node) is `docker restart`ed and the wait attaches at once, while `docker logs` still holds
the earlier start's ready line; seconds from /health turning 200 (polled every 20 ms from
outside) to the wait returning. The hand loop (`sleep 60; curl /v1/models`, 20 times) is
evaluated on the same timestamps: it notices readiness at its next 60 s tick and never
notices a crash (it gives up after 20 minutes).

(d) and (e), issue #28: a worker's `vllm serve` killed inside its running container (no
Ray; `spark-sim fault rank-kill worker-1`: SIGKILL, the container stays up), (d) while the
weights load (the load slowed x10, the kill at the first shard the watch reports) and (e)
after ready (an attached wait started at the kill): seconds from the kill to the wait
failing with the dead rank named. Goal <= 5 s.

    sudo .venv/bin/python benchmarks/readiness_latency.py [--dead-rank]
"""

from __future__ import annotations

import math
import shlex
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from pytest_spark.access.cluster import Cluster
from pytest_spark.access.simcontrol import SimCluster, sim_up
from pytest_spark.readiness.clock import remote_now
from pytest_spark.readiness.wait import wait_ready
from pytest_spark.readiness.waitstate import StartupFailed, WaitSpec
from pytest_spark.settings.profiles import load_profile
from pytest_spark.settings.resolve import defaults


def cluster_for(sim: SimCluster) -> Cluster:
    settings = defaults(load_profile("sim"), source="benchmark").replace(
        head=sim.head, workers=sim.workers, ssh_config=Path(sim.ssh_config), user="root"
    )
    return Cluster(settings)


def line_time(cluster: Cluster, container: str, needle: str) -> float:
    out = cluster.head.run(
        f"docker logs --timestamps {shlex.quote(container)} 2>&1 | "
        f"grep -F {shlex.quote(needle)} | head -n 1",
        timeout=30,
    ).stdout
    stamp = out.split()[0]  # RFC 3339 with nanoseconds
    return datetime.fromisoformat(stamp[:26] + "+00:00").timestamp()


def launch(cluster: Cluster, sim: SimCluster) -> tuple[float, str]:
    spec = sim.info["launch"]
    nodes = ",".join(n["fabric"][0]["addr"] for n in sim.info["nodes"])
    since = remote_now(cluster.head)
    t0 = time.time()
    # -d: the vLLM log goes to the container's log, with docker's timestamps.
    cluster.head.run(
        f"{spec['script']} -n {nodes} -d exec {spec['serve_args']} >/dev/null 2>&1", timeout=120
    )
    return t0, since


def stop(cluster: Cluster, sim: SimCluster) -> None:
    nodes = ",".join(n["fabric"][0]["addr"] for n in sim.info["nodes"])
    cluster.head.run(f"{sim.info['launch']['script']} -n {nodes} stop", timeout=120)


def compose_run(sim: SimCluster) -> str:
    """The operator's `docker run` of a one-node (TP=1) engine with a restart policy."""
    serve = shlex.split(sim.info["launch"]["serve_args"])
    if "--distributed-executor-backend" in serve:  # one node: no distributed backend
        at = serve.index("--distributed-executor-backend")
        del serve[at : at + 2]
    for flag, value in (("--tensor-parallel-size", "1"), ("--gpu-memory-utilization", "0.99")):
        serve[serve.index(flag) + 1] = value
    ip = sim.info["nodes"][0]["fabric"][0]["addr"]
    docker = [
        "docker", "run", "-d", "--restart", "unless-stopped", "--name", "vllm_node",
        "--network", "host", "--ipc=host", "--gpus", "all", "--privileged",
        "-e", f"VLLM_HOST_IP={ip}", "-e", "SPARKSIM_EMU_TIME_SCALE=0.01",
    ]  # fmt: skip
    image = shlex.join(["vllm-node:latest", *serve])
    return f"{shlex.join(docker)} $VLLM_SPARK_EXTRA_DOCKER_ARGS {image}"


def first_200(url: str, stop: threading.Event, seen: list[float]) -> None:
    """Poll ``url`` every 20 ms until it answers 200; record when."""
    while not stop.is_set():
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    seen.append(time.time())
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.02)


def attach_after_restart(
    cluster: Cluster, sim: SimCluster, wait: WaitSpec, follow: bool = True
) -> tuple[float, float]:
    """(c): seconds from /health 200 to the attached wait returning, and from the restart
    to /health 200 (the load)."""
    url = f"http://{sim.head}:8000/health"
    cluster.head.run(compose_run(sim), timeout=60)
    try:
        done = threading.Event()
        seen: list[float] = []
        first_200(url, done, seen)  # the first start
        cluster.head.run("docker restart vllm_node", timeout=60)
        restarted = time.time()
        seen.clear()
        poller = threading.Thread(target=first_200, args=(url, done, seen), daemon=True)
        poller.start()
        wait_ready(cluster, replace(wait, nodes=(cluster.head,)), follow=follow)
        returned = time.time()
        poller.join(timeout=5)
        done.set()
        if not seen:
            raise SystemExit("the wait returned but /health never answered 200")
        return returned - seen[0], seen[0] - restarted
    finally:
        cluster.head.run("docker rm -f vllm_node", timeout=60)


def dead_rank(
    cluster: Cluster, sim: SimCluster, wait: WaitSpec, loading: bool
) -> tuple[float, float]:
    """(d)/(e): seconds to the wait failing naming the worker, from the kill command's start
    and from its return (`spark-sim fault rank-kill`: a process start and a `docker exec
    pkill`; the kill lies between the two)."""
    killed: list[float] = []

    def fault(*args: str) -> None:
        done = sim.cli("fault", *args)
        if done.returncode != 0:
            raise SystemExit(f"spark-sim fault {' '.join(args)}: {done.stderr}")

    def kill_at_first_shard(watch: object, now: float) -> None:
        if not killed and "weights" in getattr(watch, "progress", {}):
            killed.append(time.time())
            fault("rank-kill", "worker-1")
            killed.append(time.time())

    if loading:
        for node in ("head", "worker-1"):
            fault("engine", "slow-load", "--node", node)
    _, since = launch(cluster, sim)
    try:
        if loading:
            wait_ready(cluster, replace(wait, since=since), progress=kill_at_first_shard)
        else:
            wait_ready(cluster, replace(wait, since=since))
            killed.append(time.time())
            fault("rank-kill", "worker-1")
            killed.append(time.time())
            wait_ready(cluster, replace(wait, since=since))
        raise SystemExit("the dead rank was not detected")
    except StartupFailed as exc:
        failed = time.time()
        if exc.failure.node != "spark-worker-1" or not killed:
            raise SystemExit(f"not the dead rank: {exc}") from None
    finally:
        stop(cluster, sim)
        sim.cli("fault", "clear")
    return failed - killed[0], failed - killed[-1]


def dead_text(loading: tuple[float, float], ready: tuple[float, float]) -> str:
    return (
        f"while loading {loading[1]:5.2f}-{loading[0]:5.2f} s, after ready (attached) "
        f"{ready[1]:5.2f}-{ready[0]:5.2f} s after the kill (from the kill command's return "
        "to its start)   goal <= 5 s"
    )


def main() -> None:
    sim = sim_up(2)
    try:
        cluster = cluster_for(sim)
        cluster.connect()
        wait = WaitSpec(
            container="vllm_node",
            port=8000,
            ready_timeout=300,
            hang_timeout=60,
            placement_timeout=60,
        )
        if "--dead-rank" in sys.argv:  # (d) and (e) alone
            loading, loaded = (dead_rank(cluster, sim, wait, loading=x) for x in (True, False))
            cluster.close()
            print("vllm serve killed, container up -> dead rank named:", dead_text(loading, loaded))
            return
        # (a) ready: the poll alone (before issue #27), then /health followed between polls
        ready: dict[bool, float] = {}
        for follow in (False, True):
            t0, since = launch(cluster, sim)
            wait_ready(cluster, replace(wait, since=since), follow=follow)
            returned = time.time()
            ready_line = line_time(cluster, "vllm_node", "Application startup complete.")
            ready[follow] = returned - ready_line
            stop(cluster, sim)
        ours_ready = ready[True]
        hand_ready = 60 * math.ceil((ready_line - t0) / 60) - (ready_line - t0)
        # (b) fatal
        sim.cli("fault", "engine", "crash-oom")
        t0, since = launch(cluster, sim)
        try:
            wait_ready(cluster, replace(wait, since=since))
            raise SystemExit("the crash was not detected")
        except StartupFailed:
            failed = time.time()
        fatal_line = line_time(cluster, "vllm_node", "OutOfMemoryError")
        ours_fatal = failed - fatal_line
        hand_fatal = t0 + 20 * 60 - fatal_line
        stop(cluster, sim)
        sim.cli("fault", "clear")
        # (c) attach after a restart: polled, then followed
        restart: dict[bool, float] = {}
        for follow in (False, True):
            restart[follow], load = attach_after_restart(cluster, sim, wait, follow)
        ours_restart = restart[True]
        hand_restart = 60 * math.ceil(load / 60) - load  # the loop started at the restart
        # (d), (e) a rank's vllm serve killed, its container up (issue #28)
        dead_loading = dead_rank(cluster, sim, wait, loading=True)
        dead_ready = dead_rank(cluster, sim, wait, loading=False)
        cluster.close()
    finally:
        sim.down()
    print("readiness latency (sparksim, one run each)")
    print(
        f"  ready noticed, polled once a second (before): {ready[False]:5.2f} s; /health "
        f"followed from the head (after): {ready[True]:5.2f} s; goal <= 0.25 s; "
        f"{ready[False] / max(ready[True], 1e-3):.1f}x"
    )
    print(
        f"  attach after restart, /health 200 -> noticed: before {restart[False]:5.2f} s, "
        f"after {restart[True]:5.2f} s; goal <= 0.25 s"
    )
    print(
        f"  'Application startup complete.' -> noticed: ours {ours_ready:6.2f} s   "
        f"hand 60 s loop {hand_ready:6.1f} s (mean 30 s)   goal <= 0.25 s"
    )
    print(
        f"  fatal log line (CUDA OOM)      -> failed:   ours {ours_fatal:6.2f} s   "
        f"hand 60 s loop {hand_fatal:6.0f} s (never sees it; gives up at 20 min)   "
        "goal <= 5 s"
    )
    print(
        f"  attach after restart: /health 200 -> noticed: ours {ours_restart:6.2f} s   "
        f"hand 60 s loop {hand_restart:6.1f} s   goal <= 0.25 s"
    )
    print(
        f"  vllm serve killed, container up -> dead rank named: "
        f"{dead_text(dead_loading, dead_ready)}"
    )
    print(
        f"  ratio hand/ours: ready {hand_ready / max(ours_ready, 1e-3):.0f}x, "
        f"fatal {hand_fatal / max(ours_fatal, 1e-3):.0f}x, "
        f"attach after restart {hand_restart / max(ours_restart, 1e-3):.0f}x"
    )


if __name__ == "__main__":
    main()
