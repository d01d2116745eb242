"""Faults of the serving stack (:mod:`sparksim.serving`): ``stale-container`` (an earlier
run's vLLM container left running), ``worker-kill`` (a node's serving containers killed or
stopped), ``engine`` (the emulator's load and run-time faults) and ``model`` (one node's
copy of the checkpoint differs)."""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

from .. import docker, image, models, serving
from .. import node as nodes_mod
from ..emulator.faults import LOAD_FAULTS, RUN_FAULTS
from ..netns import SimError
from ..topology import NodeSpec, Topology
from .common import NODE_HELP, Kinds, positive_int, record, resolve

KINDS = ("stale-container", "worker-kill", "engine", "model")


def add_parsers(kinds: Kinds) -> None:
    k = kinds.on_node(
        "stale-container", "an earlier run's vLLM container left running, holding the GPU"
    )
    k.add_argument("--name", default="vllm_stale", help="container name (default: vllm_stale)")
    k.add_argument(
        "--port",
        type=positive_int,
        default=8001,
        help="port its vllm serve listens on (default: 8001)",
    )
    k = kinds.on_node("worker-kill", "kill the serving container(s) on a node")
    k.add_argument("--name", default=None, help="container (default: every vllm-node one)")
    k.add_argument(
        "--stop",
        action="store_true",
        help="docker stop (the container exits as on a shutdown) instead of docker kill",
    )
    k = kinds.add(
        "engine",
        "vLLM emulator faults: load faults (crash-oom, hang-silent, ...) "
        "for the next `vllm serve`, run-time ones (worker-death, "
        "slow-decode, ...) at once",
    )
    k.add_argument("names", metavar="FAULT", nargs="+", help="fault name(s)")
    k.add_argument("--node", default="head", help=f"{NODE_HELP} (default: head)")
    k = kinds.on_node("model", "make one node's copy of the checkpoint differ")
    k.add_argument(
        "how",
        metavar="HOW",
        nargs="?",
        default="corrupt",
        choices=["corrupt", "missing", "truncated"],
        help="corrupt (default), missing or truncated shard",
    )


def apply(state_dir: Path, topo: Topology, args: argparse.Namespace) -> list[str]:
    if args.kind == "stale-container":
        return stale_container(state_dir, topo, args.node, args.name, args.port)
    if args.kind == "worker-kill":
        return worker_kill(state_dir, topo, args.node, args.name, stop=args.stop)
    if args.kind == "engine":
        return engine_fault(state_dir, topo, args.names, args.node)
    return model_fault(state_dir, topo, args.node, args.how)


def _docker(state_dir: Path, node: NodeSpec, *args: str, check: bool = True) -> str:
    e = serving.engine(state_dir, node)
    if not docker.ping(e.socket):
        raise SimError(f"{node.name}: its Docker engine is not running ({e.socket})")
    proc = subprocess.run(["docker", "-H", e.host, *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SimError(f"{node.name}: docker {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def stale_container(
    state_dir: Path, topo: Topology, spec: str, name: str = "vllm_stale", port: int = 8001
) -> list[str]:
    """An earlier run's vLLM container, restarted by its restart policy, holding the GPU."""
    node = resolve(topo, spec)
    _docker(state_dir, node, "rm", "-f", name, check=False)
    cid = _docker(
        state_dir, node, "run", "-d", "--restart", "unless-stopped", "--name", name,
        "--label", serving.STALE_LABEL, "--privileged", "--gpus", "all", "--network", "host",
        "--ipc=host", "-v", "/root/models:/models", "-e", "SPARKSIM_EMU_TIME_SCALE=0",
        # A one-node (TP=1) run of a smaller checkpoint: the full 119 GiB does not fit.
        "-e", "SPARKSIM_EMU_MODEL_GIB=60",
        "-e", f"VLLM_HOST_IP={node.fabric[0].addr}", image.IMAGE,
        "vllm", "serve", f"/models/{models.MODEL_NAME}", "--served-model-name",
        "qwen-previous-run", "--host", "127.0.0.1", "--port", str(port),
    ).strip()  # fmt: skip
    pid = _serve_pid(state_dir, node, cid)
    state = nodes_mod.read_state(state_dir, node)
    gpu = state["gpu"]
    assert isinstance(gpu, dict)
    procs = [p for p in gpu.get("processes", []) if p.get("container") != name]
    procs.append(
        {
            "pid": pid,
            "name": "VLLM::EngineCore",
            "type": "C",
            "used_memory_mib": 98304,
            "container": name,
        }
    )
    gpu["processes"] = procs
    nodes_mod.write_state(state_dir, node, state)
    record(state_dir, "stale-container", node.name, "-", name)
    return [
        f"{node.name}: stale container {name} ({cid[:12]}) running `vllm serve` on port "
        f"{port}, holding the GPU (pid {pid} in nvidia-smi)"
    ]


def _serve_pid(state_dir: Path, node: NodeSpec, cid: str, timeout: float = 10.0) -> int:
    """PID, in the node, of the container's vLLM process (what nvidia-smi would list)."""
    deadline = time.monotonic() + timeout
    while True:
        top = _docker(state_dir, node, "top", cid, "-eo", "pid,args", check=False)
        for line in top.splitlines()[1:]:
            pid, _, args = line.strip().partition(" ")
            if "/vllm serve " in args and not args.startswith("bash") and pid.isdigit():
                return int(pid)
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return int(_docker(state_dir, node, "inspect", "-f", "{{.State.Pid}}", cid).strip() or 0)


def serving_containers(state_dir: Path, node: NodeSpec) -> list[str]:
    """The node's running serving containers (the vllm-node image's, stale ones left out)."""
    listed = _docker(
        state_dir,
        node,
        "ps",
        "--filter",
        serving.SERVING_IMAGE_FILTER,
        "--format",
        "{{.Names}} {{.Labels}}",
    )
    return [
        line.split()[0]
        for line in listed.splitlines()
        if line.strip() and serving.STALE_LABEL not in line
    ]


def worker_kill(
    state_dir: Path, topo: Topology, spec: str, name: str | None = None, *, stop: bool = False
) -> list[str]:
    """Kill the serving container(s) on a node, as a crash or power loss would; with
    ``stop``, ``docker stop`` them (the container exits, as on an operator's stop)."""
    node = resolve(topo, spec)
    names = serving_containers(state_dir, node) if name is None else [name]
    if not names:
        raise SimError(
            f"{node.name}: no serving container is running (docker ps "
            f"--filter {serving.SERVING_IMAGE_FILTER})"
        )
    _docker(state_dir, node, "stop" if stop else "kill", *names)
    record(state_dir, "worker-kill", node.name, "-", ",".join(names))
    done = "stopped" if stop else "killed"
    return [f"{node.name}: {done} container {n}" for n in names]


def _etc(state_dir: Path, node: NodeSpec) -> Path:
    etc = serving.home(state_dir, node) / serving.SIM_ETC
    etc.mkdir(parents=True, exist_ok=True)
    return etc


def engine_fault(
    state_dir: Path,
    topo: Topology,
    names: list[str],
    spec: str = "head",
) -> list[str]:
    """Emulator faults on a node's serving containers: load faults for the next
    ``vllm serve`` (engine.env), run-time faults at once (control.json)."""
    node = resolve(topo, spec)
    unknown = [n for n in names if n not in LOAD_FAULTS and n not in RUN_FAULTS]
    if unknown:
        known = ", ".join(sorted({**LOAD_FAULTS, **RUN_FAULTS}))
        raise SimError(f"unknown engine fault(s) {', '.join(unknown)}; known: {known}")
    etc = _etc(state_dir, node)
    load = sorted(set(_env_faults(etc)) | {n for n in names if n in LOAD_FAULTS})
    run = sorted(set(_control_faults(etc)) | {n for n in names if n in RUN_FAULTS})
    _write_engine_faults(etc, load, run)
    record(state_dir, "engine", node.name, "-", ",".join(load + run))
    msgs = []
    for n in names:
        when = "at the next `vllm serve`" if n in LOAD_FAULTS else "now"
        what = LOAD_FAULTS.get(n) or RUN_FAULTS.get(n)
        msgs.append(f"{node.name}: engine fault {n} {when}: {what}")
    return msgs


def _env_faults(etc: Path) -> list[str]:
    try:
        lines = (etc / serving.ENGINE_ENV).read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        if line.startswith(f"{serving.FAULT_ENV}="):
            return [f for f in line.split("=", 1)[1].split(",") if f]
    return []


def _control_faults(etc: Path) -> list[str]:
    try:
        data = json.loads((etc / serving.CONTROL).read_text())
    except (OSError, ValueError):
        return []
    return [str(f) for f in data.get("faults", [])] if isinstance(data, dict) else []


def _write_engine_faults(etc: Path, load: list[str], run: list[str]) -> None:
    nodes_mod.write_atomic(
        etc / serving.ENGINE_ENV, f"{serving.FAULT_ENV}={','.join(load)}\n" if load else ""
    )
    nodes_mod.write_atomic(etc / serving.CONTROL, json.dumps({"faults": run}) + "\n")


def model_fault(state_dir: Path, topo: Topology, spec: str, kind: str = "corrupt") -> list[str]:
    node = resolve(topo, spec)
    try:
        what = models.damage(serving.home(state_dir, node), kind)
    except ValueError as exc:
        raise SimError(str(exc)) from exc
    record(state_dir, "model", node.name, "-", kind)
    return [f"{node.name}: /root/models/{models.MODEL_NAME}: {what}"]


def clear(state_dir: Path, topo: Topology) -> list[str]:
    """No stale containers, no engine faults, identical checkpoints (the sim core's
    ``clear`` resets state.json and faults.json)."""
    msgs: list[str] = []
    if serving.enabled() is not None:
        return msgs
    for node in topo.nodes:
        e = serving.engine(state_dir, node)
        if docker.ping(e.socket):
            stale = _docker(
                state_dir, node, "ps", "-aq", "--filter", f"label={serving.STALE_LABEL}"
            ).split()
            if stale:
                _docker(state_dir, node, "rm", "-f", *stale)
                msgs.append(f"{node.name}: removed {len(stale)} stale container(s)")
        etc = _etc(state_dir, node)
        if _env_faults(etc) or _control_faults(etc):
            _write_engine_faults(etc, [], [])
            msgs.append(f"{node.name}: engine faults cleared")
        if _model_differs(state_dir, node):
            models.install(serving.home(state_dir, node))
            msgs.append(f"{node.name}: checkpoint restored")
    return msgs


def _model_differs(state_dir: Path, node: NodeSpec) -> bool:
    d = models.model_dir(serving.home(state_dir, node))
    expected = models.files()
    try:
        present = {p.name: p.read_bytes() for p in d.iterdir()}
    except OSError:
        return True
    return present != expected
