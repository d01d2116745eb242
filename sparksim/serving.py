"""The serving stack of sparksim, as ``spark-sim up``/``down``/``fault`` drive it.

Per node: a private home (``DIR/nodes/<name>/home`` mounted on /root) holding the model
checkpoint (``~/models``), the sim's engine settings (``~/.sparksim``, mounted read-only
at /etc/sparksim in serving containers) and, on the head, the launcher
(``~/spark-vllm-docker/launch-cluster.sh``); a Docker engine (:mod:`.docker`) with the
serving image (:mod:`.image`) loaded. The node's sshd exports ``DOCKER_HOST`` (its
engine) and ``VLLM_SPARK_EXTRA_DOCKER_ARGS`` (the launcher's documented hook for extra
``docker run`` arguments: the model and settings mounts, as an operator would set it).

Its faults (``stale-container``, ``worker-kill``, ``engine``, ``model``) are in
:mod:`sparksim.faults.serving`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from . import docker, engines, image, models
from . import node as nodes_mod
from .netns import SimError, list_netns
from .topology import NodeSpec, Topology

HOME = "home"  # DIR/nodes/<name>/home is the node's /root
SIM_ETC = ".sparksim"  # ~/.sparksim on the node, /etc/sparksim in serving containers
ENGINE_ENV = "engine.env"
KEPT_TARBALL = "image.tar"  # the sim's own link to its image archive (_keep_tarball)
CONTROL = "control.json"
LAUNCHER_DIR = "spark-vllm-docker"
LAUNCHER = Path(__file__).resolve().parent / "launcher" / "launch-cluster.sh"
EXTRA_DOCKER_ARGS = f"-v /root/models:/models -v /root/{SIM_ETC}:/etc/sparksim:ro"
SERVING_JSON = "serving.json"
TORCH_MOUNT = "/opt/sparksim/torch-site"
HOST_ROOT_PARK = "host-root"  # DIR/nodes/<name>/host-root: the host's /root, for engine binds
DEFAULTS_ENV = "defaults.env"
SERVED_NAME = "qwen3.5-122b"
# The reference deployment's line, without the executor backend: launch-cluster.sh adds
# `--distributed-executor-backend ray` with --ray and per-rank flags without it.
SERVE_ARGS = (
    f"vllm serve /models/{models.MODEL_NAME} --served-model-name {SERVED_NAME} "
    "--tensor-parallel-size 2 --gpu-memory-utilization 0.90 --max-model-len 32768 "
    "--trust-remote-code --host 0.0.0.0 --port 8000 --reasoning-parser qwen3 "
    "--tool-call-parser qwen3_coder --enable-auto-tool-choice"
)
# How launch-cluster.sh runs a multi-node vLLM: "no-ray" (its default: one rank per node,
# torch.distributed rendezvous) or "ray" (its --ray flag). Chosen at `spark-sim up`.
LAUNCH_MODES = {"no-ray": (), "ray": ("--ray",)}
DEFAULT_LAUNCH_MODE = "no-ray"
LAUNCH_MODE_JSON = "launch-mode.json"
MASTER_PORT = 29501  # the launcher's Ray head port / torch.distributed master port
STALE_LABEL = "sparksim.fault=stale-container"
SERVING_IMAGE_FILTER = f"ancestor={image.IMAGE}"
DISABLE_ENV = "SPARKSIM_NO_DOCKER"
FAULT_ENV = "SPARKSIM_EMU_FAULT"  # the emulator's Knobs.fault (launcher/image/vllm merges it)


def enabled() -> str | None:
    """None when the serving stack can run here, else why not."""
    if os.environ.get(DISABLE_ENV):
        return f"{DISABLE_ENV} is set"
    return docker.missing()


def home(state_dir: Path, node: NodeSpec) -> Path:
    return nodes_mod.node_dir(state_dir, node) / HOME


def engine(state_dir: Path, node: NodeSpec) -> docker.Engine:
    return docker.Engine(nodes_mod.node_dir(state_dir, node), node.netns)


# ------------------------------------------------------------ node setup (before sshd)


def select_launch_mode(state_dir: Path, mode: str) -> None:
    """Record how this sim's launches run (before cluster.json is written, which says it)."""
    if mode not in LAUNCH_MODES:
        raise SimError(f"unknown launch mode {mode!r}; known: {', '.join(LAUNCH_MODES)}")
    nodes_mod.write_atomic(state_dir / LAUNCH_MODE_JSON, json.dumps({"mode": mode}) + "\n")


def launch_mode(state_dir: Path) -> str:
    try:
        mode = json.loads((state_dir / LAUNCH_MODE_JSON).read_text()).get("mode")
    except (OSError, ValueError, AttributeError):
        return DEFAULT_LAUNCH_MODE
    return mode if mode in LAUNCH_MODES else DEFAULT_LAUNCH_MODE


def launch_hints(state_dir: Path) -> dict[str, Any] | None:
    """How to start serving on this sim, as a real operator would on a Spark (the reference
    deployment's `vllm serve` line); None when the serving stack is off. ``mode``: "ray" or
    "no-ray"; ``mode_flags``: what to pass launch-cluster.sh for it (before the action)."""
    if enabled() is not None:
        return None
    mode = launch_mode(state_dir)
    return {
        "engine": engines.name(state_dir),
        "script": f"/root/{LAUNCHER_DIR}/{LAUNCHER.name}",
        "image": image.IMAGE,
        "container": "vllm_node",
        "port": 8000,
        "serve_args": engines.serve_args(state_dir) or SERVE_ARGS,
        "model_dir": f"/root/{models.MODELS_DIR}/{models.MODEL_NAME}",
        "mode": mode,
        "mode_flags": list(LAUNCH_MODES[mode]),
        "master_port": MASTER_PORT,
    }  # on the nodes


def sshd_env(state_dir: Path, node: NodeSpec) -> dict[str, str]:
    """Environment the node's sshd gives every session."""
    # The node's RDMA/GPU tools (and the sim files they read) inside the container too, as
    # a privileged vLLM container on a Spark sees the host's ibdev2netdev and sysfs.
    extra = (
        f"{EXTRA_DOCKER_ARGS} -v /usr/local/sbin:/usr/local/sbin:ro -v {state_dir}:{state_dir}:ro"
    )
    site = image.torch_site()
    if site is not None:
        extra += f" -v {site}:{TORCH_MOUNT}:ro -e PYTHONPATH={TORCH_MOUNT}"
    extra += engines.docker_args(state_dir)  # real vLLM: its venv, model and cache
    return {
        "DOCKER_HOST": engine(state_dir, node).host,
        "VLLM_SPARK_EXTRA_DOCKER_ARGS": extra,
    }


def container_sources(state_dir: Path) -> list[Path]:
    """Host folders the serving containers mount (torch's site-packages, the engine's
    venv, model and cache). The node's dockerd resolves them inside the node, so one that
    lies under a node-private folder (/tmp: a CI checkout there) is bound back there."""
    site = image.torch_site()
    return [*([Path(site)] if site else []), *engines.host_dirs(state_dir)]


def prepare_home(state_dir: Path, node: NodeSpec) -> Path:
    """The node's private /root, with mount points for the sim core's binds."""
    h = home(state_dir, node)
    for d in (h, h / ".ssh", h / SIM_ETC, h / ".cache"):
        d.mkdir(parents=True, exist_ok=True)
    os.chmod(h, 0o700)
    (h / ".bashrc").touch()
    return h


def sshd_setenv(state_dir: Path, node: NodeSpec) -> str:
    """The node's one ``SetEnv`` line (sshd uses only the first one it reads)."""
    return "SetEnv " + " ".join(f'"{k}={v}"' for k, v in sshd_env(state_dir, node).items()) + "\n"


def node_binds(state_dir: Path, node: NodeSpec) -> list[tuple[Path, str]]:
    """Bind mounts the node needs before the sim core's own (which land inside it): its
    private /root, and inside it the containers' host folders (:func:`container_sources`:
    torch, the engine's venv, model and cache) that lie under the host's /root, as a
    checkout there puts them (the node's dockerd resolves ``docker run -v`` sources in
    the node)."""
    h = prepare_home(state_dir, node)
    under_root = [p for p in container_sources(state_dir) if p.is_relative_to("/root")]
    if not under_root:
        return [(h, "/root")]
    # The host's /root parked first: once the node's own /root covers it, the sources
    # below are reached through the park.
    park = nodes_mod.node_dir(state_dir, node) / HOST_ROOT_PARK
    park.mkdir(exist_ok=True)
    binds = [(Path("/root"), str(park)), (h, "/root")]
    for src in under_root:
        rel = src.relative_to("/root")
        (h / rel).mkdir(parents=True, exist_ok=True)
        binds.append((park / rel, str(src)))
    return binds


# ------------------------------------------------------------------ up / down


def start(
    state_dir: Path, topo: Topology, time_scale: float = 0.002, emu: dict[str, str] | None = None
) -> dict[str, Any]:
    """Engines, image, models and launcher on every node; returns the timings."""
    for n in topo.nodes:  # the checkpoint is there with or without Docker
        install_node(state_dir, topo, n, time_scale, emu)
    why = enabled()
    if why is not None:
        report = {"docker": False, "reason": why}
        nodes_mod.write_atomic(state_dir / SERVING_JSON, json.dumps(report, indent=2) + "\n")
        return report
    t0 = time.monotonic()
    python = image.image_python()
    wrappers = []
    for n in topo.nodes:
        pid = nodes_mod.read_pid(state_dir, n)
        if pid is None:
            raise SimError(f"{n.name}: no sshd wrapper pid; is the node up?")
        wrappers.append((nodes_mod.node_dir(state_dir, n), n.netns, pid))

    built: dict[str, Any] = {}

    def build() -> None:
        t = time.monotonic()
        try:
            tarball, built["built"] = image.tarball()
            built["path"] = image.archive(tarball)
        except BaseException as exc:  # reported below
            built["error"] = exc
        built["seconds"] = time.monotonic() - t

    builder = threading.Thread(target=build, daemon=True)
    builder.start()
    engines, ready = docker.start_engines(wrappers, state_dir, python)
    try:
        builder.join()
        if "error" in built:
            raise SimError(f"building the serving image failed: {built['error']}")
        t_import = time.monotonic()
        _import_image(engines, built["path"])
        import_s = time.monotonic() - t_import
    except BaseException:
        docker.stop_engines(engines)
        raise
    report = {
        "docker": True,
        "image": image.IMAGE,
        "tarball": str(_keep_tarball(state_dir, built["path"])),
        "image_built": built["built"],
        "image_build_s": round(built["seconds"], 2),
        "image_import_s": round(import_s, 2),
        "dockerd_ready_s": {k: round(v, 2) for k, v in ready.items()},
        "storage_driver": _driver(engines[0]),
        "total_s": round(time.monotonic() - t0, 2),
    }
    nodes_mod.write_atomic(state_dir / SERVING_JSON, json.dumps(report, indent=2) + "\n")
    return report


def _driver(e: docker.Engine) -> str:
    try:
        status, info = docker.api(e.socket, "GET", "/info")
    except OSError:
        return "?"
    return str(info.get("Driver", "?")) if status == 200 and isinstance(info, dict) else "?"


def _import_image(engines: list[docker.Engine], archive: Path) -> None:
    """``docker load`` of the image archive on every node at once (:func:`image.archive`:
    one image ID on every node, as after build-and-copy.sh's ``docker save | docker load``)."""
    procs = [
        (
            e,
            subprocess.Popen(
                image.load_argv(e.host, archive),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for e in engines
    ]
    for e, proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise SimError(f"{e.node_dir.name}: docker load {archive} failed: {err.strip()}")


def _keep_tarball(state_dir: Path, path: Path) -> Path:
    """The image archive this sim re-loads (``fault clear`` after ``docker
    no-image``), hard-linked into its state dir: another checkout's sim building a newer
    image prunes the cache (image.KEEP_TARBALLS), and the file must outlive that. The
    cache's own path where a link cannot be made (another file system)."""
    kept = state_dir / KEPT_TARBALL
    kept.unlink(missing_ok=True)
    try:
        os.link(path, kept)
    except OSError:
        return path
    return kept


def install_node(
    state_dir: Path,
    topo: Topology,
    node: NodeSpec,
    time_scale: float = 0.002,
    emu: dict[str, str] | None = None,
) -> None:
    """Model, sim settings and (head) launcher in the node's home."""
    h = prepare_home(state_dir, node)
    models.install(h)
    etc = h / SIM_ETC
    nodes_mod.write_atomic(etc / ENGINE_ENV, "")
    # The sim's own engine defaults (read before engine.env, which faults rewrite).
    defaults = {
        "SPARKSIM_EMU_TIME_SCALE": f"{time_scale:g}",
        **{f"SPARKSIM_EMU_{name.upper()}": value for name, value in (emu or {}).items()},
        **engines.defaults_env(state_dir),
    }
    nodes_mod.write_atomic(etc / DEFAULTS_ENV, "".join(f"{k}={v}\n" for k, v in defaults.items()))
    etc.joinpath(CONTROL).unlink(missing_ok=True)
    if node.role == "head":
        dest = h / LAUNCHER_DIR
        dest.mkdir(exist_ok=True)
        shutil.copyfile(LAUNCHER, dest / LAUNCHER.name)
        os.chmod(dest / LAUNCHER.name, 0o755)
    _ = topo


def stop(state_dir: Path | None, instance: int | None = None) -> list[str]:
    """Remove every container and engine of this state dir and/or sim instance (before
    the nodes go); their cgroups, data-roots and sockets with them."""
    engines = {e.node_dir: e for e in docker.engines_in(state_dir)} if state_dir else {}
    if instance is not None:
        namespaces = [ns for ns in list_netns() if ns.startswith(f"spk{instance}-n")]
        for e in docker.engines_in_netns(namespaces):
            engines.setdefault(e.node_dir, e)
    done = docker.stop_engines(list(engines.values())) if engines else []
    if state_dir is not None:
        (state_dir / SERVING_JSON).unlink(missing_ok=True)
    return done


def report(state_dir: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((state_dir / SERVING_JSON).read_text())
    except (OSError, ValueError):
        return {"docker": False, "reason": "not started"}
    return data


def problems(state_dir: Path, topo: Topology) -> list[str]:
    """What is wrong with the serving stack of an up sim (for ``status``)."""
    if not report(state_dir).get("docker"):
        return []
    return [
        f"{n.name}: Docker engine not answering on {engine(state_dir, n).socket}"
        for n in topo.nodes
        if not docker.ping(engine(state_dir, n).socket)
    ]


def describe(rep: dict[str, Any]) -> str:
    if not rep.get("docker"):
        return f"no Docker engines ({rep.get('reason', 'not started')})"
    ready = rep.get("dockerd_ready_s", {})
    return (
        f"Docker engine on {len(ready)} nodes ({rep.get('storage_driver')}), "
        f"image {rep.get('image')}"
    )
