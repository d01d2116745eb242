#!/usr/bin/env python3
"""Readiness latency against sparksim, side by side with the hand-run 60 s poll loop.

Measures, in one run each, (a) seconds from the head's `Application startup complete.`
log line to the readiness wait returning, and (b) seconds from a fatal log line (the
emulator's CUDA OOM crash) to the wait failing. The hand loop (`sleep 60; curl
/v1/models`, 20 times) is evaluated on the same timestamps: it notices readiness at its
next 60 s tick and never notices a crash (it gives up after 20 minutes).

    sudo .venv/bin/python benchmarks/readiness_latency.py
"""

from __future__ import annotations

import math
import shlex
import time
from datetime import datetime
from pathlib import Path

from pytest_spark.cluster import Cluster
from pytest_spark.profiles import load_profile
from pytest_spark.readiness import StartupFailed, remote_now, wait_ready
from pytest_spark.settings import OPTIONS, Settings
from pytest_spark.simcontrol import SimCluster, sim_up


def cluster_for(sim: SimCluster) -> Cluster:
    values = {o.attr: o.default for o in OPTIONS}
    values.update(head=sim.head, workers=sim.workers, ssh_config=Path(sim.ssh_config), user="root")
    return Cluster(Settings(values, {k: "benchmark" for k in values}, load_profile("sim")))


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


def main() -> None:
    sim = sim_up(2)
    try:
        cluster = cluster_for(sim)
        cluster.connect()
        wait = dict(
            container="vllm_node",
            port=8000,
            ready_timeout=300,
            hang_timeout=60,
            placement_timeout=60,
        )
        # (a) ready
        t0, since = launch(cluster, sim)
        wait_ready(cluster, since=since, **wait)
        returned = time.time()
        ready_line = line_time(cluster, "vllm_node", "Application startup complete.")
        ours_ready = returned - ready_line
        hand_ready = 60 * math.ceil((ready_line - t0) / 60) - (ready_line - t0)
        stop(cluster, sim)
        # (b) fatal
        sim.cli("fault", "engine", "crash-oom")
        t0, since = launch(cluster, sim)
        try:
            wait_ready(cluster, since=since, **wait)
            raise SystemExit("the crash was not detected")
        except StartupFailed:
            failed = time.time()
        fatal_line = line_time(cluster, "vllm_node", "OutOfMemoryError")
        ours_fatal = failed - fatal_line
        hand_fatal = t0 + 20 * 60 - fatal_line
        stop(cluster, sim)
        cluster.close()
    finally:
        sim.down()
    print("readiness latency (sparksim, one run each)")
    print(
        f"  'Application startup complete.' -> noticed: ours {ours_ready:6.2f} s   "
        f"hand 60 s loop {hand_ready:6.1f} s (mean 30 s)   goal <= 1 s"
    )
    print(
        f"  fatal log line (CUDA OOM)      -> failed:   ours {ours_fatal:6.2f} s   "
        f"hand 60 s loop {hand_fatal:6.0f} s (never sees it; gives up at 20 min)   "
        "goal <= 5 s"
    )
    print(
        f"  ratio hand/ours: ready {hand_ready / max(ours_ready, 1e-3):.0f}x, "
        f"fatal {hand_fatal / max(ours_fatal, 1e-3):.0f}x"
    )


if __name__ == "__main__":
    main()
