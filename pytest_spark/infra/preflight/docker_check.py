"""Preflight, Docker: the daemon answers and the serving image is there; nothing but the
serving container holds the GPU (an earlier run's container, a stray sparkrun job, a
process outside any container).

Pure functions over :mod:`pytest_spark.infra.preflight.probe` facts: a :class:`Finding`
whose failure message names the node, what was measured, what was expected and the usual
fix (STYLE.md), or a :class:`Skip` saying why the check cannot be made.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from pytest_spark.infra.finding import Finding, Skip
from pytest_spark.infra.human import human_duration
from pytest_spark.infra.preflight.probe import (
    ContainerInfo,
    DockerFacts,
    GpuFacts,
)
from pytest_spark.infra.probe import PROBE_CONTAINER_PREFIX

# ----------------------------------------------------------------------- docker


def check_docker(node: str, docker: DockerFacts, container: str) -> Finding | Skip:
    """The Docker daemon answers ``docker info`` and the serving image is present."""
    if docker.missing:
        return Finding.failed(
            "docker not installed",
            "Docker engine running",
            node=node,
            message=(
                f"{node}: docker: command not found; expected the Docker engine "
                "(launch-cluster.sh runs vLLM in a container on every node). Install "
                "docker (DGX OS ships it) and the NVIDIA container toolkit"
            ),
        )
    if not docker.up:
        return Finding.failed(
            f"daemon down: {docker.error}",
            "docker info answers",
            node=node,
            message=(
                f"{node}: the Docker daemon is not answering (`docker info`: {docker.error}); "
                "expected it running. Start it: sudo systemctl start docker (and enable it); "
                "on `permission denied` add the SSH user to the docker group"
            ),
        )
    if docker.image is None:
        return Skip(
            f"{node}: Docker {docker.version or ''} is up; no serving image to look for "
            f"(no --spark-image, and no container {container!r} on this node)"
        )
    if not docker.image_present:
        return Finding.failed(
            {"docker": docker.version, "image": None},
            {"image": docker.image},
            node=node,
            message=(
                f"{node}: serving image {docker.image} not present ({docker.image_error}); "
                "expected it on every node (launch-cluster.sh runs `docker run "
                f"{docker.image}` on each). Build or pull it there, or copy it from the head: "
                f"docker save {docker.image} | ssh {node} docker load"
            ),
        )
    return Finding.passed(
        {"docker": docker.version, "image": docker.image},
        {"image": docker.image},
        node=node,
        message=f"{node}: Docker {docker.version}, image {docker.image}",
    )


# --------------------------------------------------------------------- GPU holders


def _describe(c: ContainerInfo, now: float | None) -> str:
    restart = f", restart policy {c.restart_policy}" if c.restart_policy != "no" else ""
    return f"container {c.name} (image {c.image}, up {human_duration(c.uptime_s(now))}{restart})"


# sparkrun's rank containers: ``<cluster id>_node_<rank>`` (vllm-distributed), ``_head`` /
# ``_worker`` (Ray), ``_solo`` (one node); the cluster id is the name's stem.
_SPARKRUN_RANK = re.compile(r"^(sparkrun_.+)_(?:node_\d+|head|worker|solo)$")


def _job_of(name: str) -> str | None:
    m = _SPARKRUN_RANK.match(name)
    return m[1] if m else None


def _stray_sparkrun_jobs(
    container: str, holders: Iterable[ContainerInfo]
) -> dict[str, list[ContainerInfo]]:
    """When every holder is a rank container of another sparkrun job than the tested
    ``container``'s: those jobs (cluster id -> containers here); else empty."""
    mine = _job_of(container)
    jobs: dict[str, list[ContainerInfo]] = {}
    for c in holders:
        job = _job_of(c.name)
        if mine is None or job is None or job == mine:
            return {}
        jobs.setdefault(job, []).append(c)
    return jobs


@dataclass(frozen=True)
class GpuHolders:
    """Who holds the GPU beside the serving container: each holder described, the
    containers among them (by id) and how many processes run outside any container."""

    holders: list[str]
    stale: dict[str, ContainerInfo]
    outside: int


def gpu_holders(
    docker: DockerFacts, gpu: GpuFacts, container: str, now: float | None = None
) -> GpuHolders:
    """The verdict of :func:`check_gpu_holders`: GPU processes outside the serving
    container, then other running containers with GPU access or the serving image. The
    suite's own probe containers without GPU access are not holders."""
    serving = docker.serving if docker.serving and docker.serving.running else None
    own = serving.pids if serving else frozenset()
    by_pid = {pid: c for c in docker.containers for pid in c.pids}
    holders: list[str] = []
    stale: dict[str, ContainerInfo] = {}
    outside = 0
    for proc in gpu.processes or ():
        if proc.pid in own:
            continue
        c = by_pid.get(proc.pid)
        if c is not None:
            stale[c.id] = c
            holders.append(f"pid {proc.pid} {proc.name} in {_describe(c, now)}")
        else:
            outside += 1
            where = "outside any container" if docker.up else "(docker not answering)"
            age = f", running {human_duration(proc.etime_s)}" if proc.etime_s is not None else ""
            holders.append(f"pid {proc.pid} {proc.name} {where}{age}")
    image = serving.image if serving else docker.image
    for c in docker.containers:
        if (
            c.running
            and c.name != container
            and c.id not in stale
            and (c.gpu_access or (image and c.image == image))
            and not (c.name.startswith(PROBE_CONTAINER_PREFIX) and not c.gpu_access)
        ):
            stale[c.id] = c
            holders.append(f"{_describe(c, now)} has GPU access")
    return GpuHolders(holders, stale, outside)


def check_gpu_holders(
    node: str, docker: DockerFacts, gpu: GpuFacts, container: str, now: float | None = None
) -> Finding | Skip:
    """Nothing but the serving container holds the GPU: no compute process outside it, no
    other running container with GPU access or the serving image (an earlier run's). The
    suite's own probe containers (:data:`PROBE_CONTAINER_PREFIX`, no GPU access: the
    nodes-alike probe reading the serving image's versions, another xdist worker's) are
    not holders; a GPU process inside one still is."""
    found = gpu_holders(docker, gpu, container, now)
    if not found.holders:
        return _no_holders(node, docker, gpu, container)
    stray = _stray_sparkrun_jobs(container, found.stale.values())
    if stray and not found.outside:
        return _stray_jobs_failure(node, container, found.holders, stray)
    return _holders_failure(node, container, found)


def _no_holders(node: str, docker: DockerFacts, gpu: GpuFacts, container: str) -> Finding | Skip:
    """No holder found: a pass, or a skip when docker or nvidia-smi did not answer."""
    if not docker.up and gpu.processes is None:
        return Skip(
            f"{node}: neither docker nor nvidia-smi answers (see the docker and GPU checks)"
        )
    if not docker.up:
        return Skip(
            f"{node}: no GPU processes; containers not listed: docker is not "
            "answering (see test_docker_ready)"
        )
    if gpu.processes is None:
        return Skip(
            f"{node}: no other container with GPU access; GPU processes not "
            f"listed: nvidia-smi: {gpu.apps_error} (see test_gpu_visible)"
        )
    count = len(gpu.processes)
    return Finding.passed(
        {"gpu_processes": count, "other_gpu_containers": 0},
        {"outside": container},
        node=node,
        message=f"{node}: {count} GPU process(es), all in {container}"
        if count
        else f"{node}: no GPU processes, no other GPU container",
    )


def _stray_jobs_failure(
    node: str, container: str, holders: list[str], stray: dict[str, list[ContainerInfo]]
) -> Finding:
    """Every holder is a rank container of another sparkrun job: name the jobs to stop."""
    jobs = ", ".join(sorted(stray))
    return Finding.failed(
        {"holders": holders, "sparkrun jobs": sorted(stray)},
        f"nothing but {container} on the GPU",
        node=node,
        message=(
            f"{node}: sparkrun job {jobs} runs beside the tested job "
            f"{_job_of(container)}: {'; '.join(holders)}; expected no "
            "other serve on this box (two serves share the GPU and its memory: a job left "
            f"running after `sparkrun stop --all`, sparkrun#229). Stop it: sparkrun stop "
            f"{' / '.join(sorted(stray))} (every node of it), or here docker rm -f "
            f"{' '.join(c.name for cs in stray.values() for c in cs)}"
        ),
        evidence={"cause": f"sparkrun job {jobs} beside {_job_of(container)}"},
    )


def _holders_failure(node: str, container: str, found: GpuHolders) -> Finding:
    """Other containers or processes hold the GPU: name them and how to stop them."""
    names = [c.name for c in found.stale.values()]
    fix = (
        f"Stop it: docker stop {' '.join(names)} && docker rm {' '.join(names)}"
        + (
            " (and `docker update --restart=no` on any you keep)"
            if any(c.restart_policy not in ("no", "") for c in found.stale.values())
            else ""
        )
        if names
        else "Stop the process(es) (kill PID) or find their service"
    )
    return Finding.failed(
        {"holders": found.holders},
        f"nothing but {container} on the GPU",
        node=node,
        message=(
            f"{node}: the GPU is held outside the serving container {container}: "
            f"{'; '.join(found.holders)}; expected no other GPU process or GPU container (an "
            "earlier run's services auto-start after a reboot and keep GPU memory, so the "
            f"load fails on free memory). {fix}"
        ),
    )
