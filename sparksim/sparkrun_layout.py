"""A sparkrun job stood up on sparksim's nodes the way sparkrun 0.4.2 lays one out (field
reference 6a), without the sparkrun CLI: so the suite's attach to a sparkrun job is tested
where the real CLI is not installed. The suite finds the job as it does on real Sparks,
by its containers' labels over SSH; nothing here is read by it.

Per node, in rank order (the head is rank 0), on the node's own Docker engine:

- ``docker run -d --rm --name sparkrun_<intent>_<hash>_node_<rank>`` with sparkrun's
  labels (``sparkrun.cluster_id``, ``.rank``, ``.runtime``, ``.served_model_name``,
  ``.model``, ``.recipe``, ``.distribution=sparkrun``), ``--network=host``, ``--user
  UID:GID`` (the SSH user's: root on the sim), ``-e HOME=/tmp``, ``--ipc=shareable``,
  ``--shm-size``, ``--security-opt no-new-privileges``, ``--cap-add SYS_PTRACE``, the
  ``nofile`` ulimit a recipe's ``executor_config`` sets where 65535 is refused, the NCCL
  environment sparkrun sets, and PID 1 ``bash -c "sleep infinity"``;
- then ``docker exec -d`` of ``vllm serve ... --nnodes N --node-rank R --master-addr HEAD
  --master-port 25000`` (``--headless`` on ranks > 0), its output in
  ``/tmp/sparkrun_serve.log`` inside the container (``docker logs`` holds nothing of it).

Left to the real CLI's own tests (another file): ``--gpus device=0``, sparkrun's seccomp
profile, its image distribution and its job files under ``~/.cache/sparkrun``. The sim's
own mounts (model, engine settings, tools) are those launch-cluster.sh gets from the node's
``VLLM_SPARK_EXTRA_DOCKER_ARGS``.
"""

from __future__ import annotations

import hashlib
import shlex
import subprocess
from pathlib import Path
from typing import Any

from . import docker, engines, image, models, serving
from .netns import SimError
from .topology import NodeSpec, Topology, resolve_node

LAYOUTS = ("sparkrun",)
SERVE_LOG = "/tmp/sparkrun_serve.log"
MASTER_PORT = 25000  # sparkrun's vllm-distributed --master-port
RUNTIME = "vllm-distributed"
DEFAULT_INTENT = "qwen35-122b"
DEFAULT_RECIPE = "qwen3.5-122b-a10b-fp8-tp2"
LABEL = "sparkrun.cluster_id"
# The recipe's `executor_config: ulimit: [nofile=20000:20000]`: sparkrun's rootless
# default nofile=65535:65535 is refused on these machines (hard cap 20000).
ULIMIT = "nofile=20000:20000"


def cluster_id(intent: str, hosts: list[str], recipe: str) -> str:
    """``sparkrun_<intent>_<hash>``: the job's id and its containers' name stem."""
    digest = hashlib.sha256("|".join([recipe, *hosts]).encode()).hexdigest()[:8]
    return f"sparkrun_{intent}_{digest}"


def container_name(job: str, rank: int) -> str:
    return f"{job}_node_{rank}"


def nccl_env(node: NodeSpec) -> dict[str, str]:
    """What sparkrun sets for NCCL and Gloo, as its detection finds a Spark's fabric: every
    cabled twin's RDMA device, the first twin's netdev for sockets."""
    port = node.fabric[0]
    return {
        "NCCL_NET": "IB",
        "NCCL_IB_HCA": ",".join(p.dev for p in node.fabric),
        "NCCL_SOCKET_IFNAME": port.ifname,
        "GLOO_SOCKET_IFNAME": port.ifname,
        "NCCL_IB_GID_INDEX": "3",
        "NCCL_CROSS_NIC": "1",
        "NCCL_CUMEM_ENABLE": "0",
    }


def env_for(node: NodeSpec, env: dict[str, dict[str, str]] | None) -> dict[str, str]:
    """The variables a job start sets over sparkrun's on ``node``: ``env["*"]`` on every
    rank, then ``env[NODE]`` (its name: :func:`start_job` resolves what the CLI takes) on
    that node's. Two of sparkrun's
    field failures are made so, on the rank's real environment: the head's
    ``NCCL_IB_HCA`` / ``NCCL_SOCKET_IFNAME`` pushed to a worker cabled on the other port
    (sparkrun#135: on the sim, the worker's uncabled port, Down there, as the other port is
    on a worker cabled the other way), and GLOO/NCCL on the management interface (PR #219:
    ``GLOO_SOCKET_IFNAME=mgmt0``)."""
    out = dict((env or {}).get("*", {}))
    for key, values in (env or {}).items():
        if key == node.name:
            out.update(values)
    return out


def _docker(e: docker.Engine, *args: str, timeout: float = 120) -> str:
    proc = subprocess.run(
        ["docker", "-H", e.host, *args], capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise SimError(f"docker {args[0]} on {e.netns}: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout


def run_argv(
    state_dir: Path,
    node: NodeSpec,
    job: str,
    rank: int,
    labels: dict[str, str],
    env: dict[str, str] | None = None,
) -> list[str]:
    """The rank's ``docker run`` (after ``docker -H``), as sparkrun builds it; ``env`` over
    sparkrun's NCCL environment (:func:`env_for`)."""
    argv = ["run", "-d", "--name", container_name(job, rank)]
    for key, value in {**labels, "sparkrun.rank": str(rank)}.items():
        argv += ["--label", f"{key}={value}"]
    argv += [
        "--ipc=shareable", "--shm-size=32gb", "--network=host", "--user", "0:0",
        "-e", "HOME=/tmp", "--security-opt", "no-new-privileges", "--cap-add", "SYS_PTRACE",
        "--ulimit", ULIMIT,
    ]  # fmt: skip
    for key, value in {**nccl_env(node), **(env or {})}.items():
        argv += ["-e", f"{key}={value}"]
    argv += shlex.split(serving.sshd_env(state_dir, node)["VLLM_SPARK_EXTRA_DOCKER_ARGS"])
    argv += ["--rm", image.IMAGE, "bash", "-c", "sleep infinity"]
    return argv


def serve_command(serve_args: str, nnodes: int, rank: int, master: str) -> str:
    """The rank's ``vllm serve`` with vllm-distributed's flags, its output in the log."""
    extra = f" --nnodes {nnodes} --node-rank {rank} --master-addr {master}"
    extra += f" --master-port {MASTER_PORT}" + (" --headless" if rank > 0 else "")
    return f"exec {serve_args}{extra} > {SERVE_LOG} 2>&1"


def start_job(
    state_dir: Path,
    topo: Topology,
    *,
    intent: str = DEFAULT_INTENT,
    recipe: str = DEFAULT_RECIPE,
    serve_args: str | None = None,
    nnodes: int | None = None,
    master_addr: str | None = None,
    no_serve: tuple[int, ...] = (),
    env: dict[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """Stand the job up on the first ``nnodes`` nodes (default: every node); returns what
    it started (``cluster_id``, each node's container).

    Two of sparkrun's field failures: ``master_addr`` replaces the head's fabric address
    on every rank's ``--master-addr`` (a loopback one is sparkrun#249: each headless rank
    dials its own loopback and never joins, the head waits on its store); a rank in
    ``no_serve`` keeps its container on ``sleep infinity`` and never gets its ``vllm
    serve`` (sparkrun#292: no serve process, no serve log)."""
    if serving.enabled() is not None:
        raise SimError(f"no serving stack on this sim: {serving.enabled()}")
    nodes = list(topo.nodes[: nnodes or len(topo.nodes)])
    args = serve_args or engines.serve_args(state_dir) or serving.SERVE_ARGS
    job = cluster_id(intent, [n.mgmt for n in nodes], recipe)
    master = master_addr or nodes[0].fabric[0].addr
    unknown = set(no_serve) - set(range(len(nodes)))
    if unknown:
        raise SimError(f"--no-serve {sorted(unknown)}: the job has ranks 0..{len(nodes) - 1}")
    try:
        env = {k if k == "*" else resolve_node(topo, k).name: v for k, v in (env or {}).items()}
    except ValueError as exc:
        raise SimError(f"--env-node: {exc}") from None
    labels = {
        LABEL: job,
        "sparkrun.runtime": RUNTIME,
        "sparkrun.served_model_name": _flag(args, "--served-model-name") or serving.SERVED_NAME,
        "sparkrun.model": f"/models/{models.MODEL_NAME}",
        "sparkrun.recipe": recipe,
        "sparkrun.distribution": "sparkrun",
    }
    started: dict[str, str] = {}
    try:
        for rank, node in enumerate(nodes):
            e = serving.engine(state_dir, node)
            _docker(e, *run_argv(state_dir, node, job, rank, labels, env_for(node, env)))
            started[node.name] = container_name(job, rank)
        for rank, node in enumerate(nodes):
            if rank in no_serve:
                continue
            e = serving.engine(state_dir, node)
            command = serve_command(args, len(nodes), rank, master)
            _docker(e, "exec", "-d", started[node.name], "bash", "-c", command)
    except BaseException:
        stop_job(state_dir, topo, job)
        raise
    return {
        "layout": "sparkrun",
        "cluster_id": job,
        "containers": started,
        "serve_log": SERVE_LOG,
        "master": f"{master}:{MASTER_PORT}",
        "no_serve": sorted(no_serve),
        "labels": labels,
    }


def stop_job(state_dir: Path, topo: Topology, job: str | None = None) -> list[str]:
    """Remove the job's containers (every sparkrun job's without ``job``) on every node."""
    where = f"label={LABEL}" + (f"={job}" if job else "")
    removed = []
    for node in topo.nodes:
        e = serving.engine(state_dir, node)
        if not docker.ping(e.socket):
            continue
        ids = _docker(e, "ps", "-aq", "--filter", where).split()
        if ids:
            _docker(e, "rm", "-f", *ids)
            removed.append(f"{node.name}: {len(ids)} sparkrun container(s) removed")
    return removed


def _flag(args: str, flag: str) -> str | None:
    words = shlex.split(args)
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None
