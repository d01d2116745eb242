"""``spark-sim fault model-perturb`` without a sim and without vLLM: the perturbed copy
(sparksim/faults/perturb.py) keeps every file, tensor name, dtype, shape and offset and adds
noise of the requested size only to the chosen layers' weight matrices; the engine's
model mount follows the fault and ``clear``. One test reads the real setup's model
(``scripts/setup-vllm-cpu``) and is skipped without it."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sparksim import engines
from sparksim.faults import perturb
from sparksim.faults.common import load_faults
from sparksim.netns import SimError

REPO = Path(__file__).resolve().parents[2]


def write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """A safetensors file of ``name: (dtype, float32 values)`` (BF16 by truncation)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs, at = [], 0
    for name, (dtype, values) in tensors.items():
        if dtype == "BF16":
            raw = (values.astype(np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            raw = values.astype("<f4").tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(values.shape),
            "data_offsets": [at, at + len(raw)],
        }
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_tensors(path: Path) -> dict[str, tuple[str, list[int], np.ndarray]]:
    n, header = perturb.read_header(path)
    data = path.read_bytes()[8 + n :]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, stop = meta["data_offsets"]
        values = perturb._to_float(data[start:stop], meta["dtype"])
        out[name] = (meta["dtype"], meta["shape"], values)
    return out


def tiny_model(root: Path, layers: int = 4) -> Path:
    rng = np.random.default_rng(0)
    model = root / "tiny-model"
    model.mkdir(parents=True)
    tensors: dict[str, tuple[str, np.ndarray]] = {
        "model.embed_tokens.weight": ("BF16", rng.standard_normal((32, 16)))
    }
    for i in range(layers):
        tensors[f"model.layers.{i}.input_layernorm.weight"] = ("BF16", np.ones(16))
        tensors[f"model.layers.{i}.self_attn.q_proj.weight"] = (
            "BF16",
            rng.standard_normal((16, 16)) * 0.05,
        )
        tensors[f"model.layers.{i}.mlp.down_proj.weight"] = (
            "F32",
            rng.standard_normal((16, 64)) * 0.02,
        )
    tensors["model.norm.weight"] = ("BF16", np.ones(16))
    write_safetensors(model / "model.safetensors", tensors)
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": layers}) + "\n")
    (model / "tokenizer.json").write_text("{}\n")
    return model


def rel_noise(before: np.ndarray, after: np.ndarray) -> float:
    rms = float(np.sqrt(np.mean(before.astype(np.float64) ** 2)))
    return float(np.std((after - before).astype(np.float64))) / rms


@pytest.mark.parametrize(("layers", "noisy"), [("all", {0, 1, 2, 3}), ("upper", {2, 3})])
def test_copy_keeps_the_layout_and_adds_noise_only_where_asked(
    tmp_path: Path, layers: str, noisy: set[int]
) -> None:
    model = tiny_model(tmp_path)
    dest, changed = perturb.write_copy(model, tmp_path / "out", 0.1, layers, seed=7)
    assert dest.name == model.name
    assert sorted(p.name for p in dest.iterdir()) == sorted(p.name for p in model.iterdir())
    assert (dest / "config.json").read_bytes() == (model / "config.json").read_bytes()
    src, out = model / "model.safetensors", dest / "model.safetensors"
    assert out.stat().st_size == src.stat().st_size
    n, _ = perturb.read_header(src)
    assert out.read_bytes()[: 8 + n] == src.read_bytes()[: 8 + n]  # names, dtypes, shapes
    before, after = read_tensors(src), read_tensors(out)
    expected = {
        f"model.layers.{i}.{w}.weight" for i in noisy for w in ("self_attn.q_proj", "mlp.down_proj")
    }
    assert set(changed) == expected
    for name, (dtype, shape, values) in before.items():
        assert after[name][:2] == (dtype, shape)
        if name in expected:
            # 0.1 x rms, within sampling error and bf16 rounding
            assert rel_noise(values, after[name][2]) == pytest.approx(0.1, rel=0.25), name
        else:
            assert np.array_equal(values, after[name][2]), name  # norms, embeddings too


def test_copy_is_seeded(tmp_path: Path) -> None:
    model = tiny_model(tmp_path)
    a, _ = perturb.write_copy(model, tmp_path / "a", 0.05, "upper", seed=1)
    b, _ = perturb.write_copy(model, tmp_path / "b", 0.05, "upper", seed=1)
    c, _ = perturb.write_copy(model, tmp_path / "c", 0.05, "upper", seed=2)
    blob = lambda d: (d / "model.safetensors").read_bytes()  # noqa: E731
    assert blob(a) == blob(b) != blob(c)


def test_bad_scale_and_layers_are_refused(tmp_path: Path) -> None:
    model = tiny_model(tmp_path)
    with pytest.raises(SimError, match="--scale 0"):
        perturb.write_copy(model, tmp_path / "out", 0.0, "all")
    with pytest.raises(SimError, match="--layers 'lower'"):
        perturb.write_copy(model, tmp_path / "out", 0.1, "lower")


def test_bf16_rounds_to_nearest_even() -> None:
    values = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5], dtype=np.float32)
    raw = perturb._from_float(values, "BF16")
    assert list(perturb._to_float(raw, "BF16")) == [1.0, 1.0, 1.0 + 4 * 2**-8, -2.5]


def test_fault_repoints_the_engine_mount_and_clear_restores_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the containers mount at /models/<name> follows the fault; faults.json lists it."""
    home = tmp_path / "vllm-cpu"
    model = tiny_model(home / "model")
    info = {"venv": str(home / "venv"), "model": str(model), "cache": str(home / "cache")}
    for d in ("venv", "cache"):
        (home / d).mkdir()
    (home / "vllm-cpu.json").write_text(json.dumps({"version": 1, **info}))
    monkeypatch.setenv(engines.INFO_ENV, str(home / "vllm-cpu.json"))
    state = tmp_path / "state"
    state.mkdir()
    engines.select(state, "vllm-cpu")
    link = engines.model_source(state)
    assert f"{link}:/models/{model.name}:ro" in engines.docker_args(state).split()
    assert link.resolve() == model.resolve()

    args = argparse.Namespace(scale=0.05, layers="upper", seed=3)
    (msg,) = perturb.apply(state, None, args)
    assert "4 weight matrices" in msg and "next launch" in msg
    assert link.resolve() == (state / perturb.COPY_DIR / model.name).resolve()
    assert engines.docker_args(state) == engines.docker_args(state)  # the same line
    (entry,) = [f for f in load_faults(state) if f["kind"] == perturb.KIND]
    assert entry["value"] == {"scale": 0.05, "layers": "upper", "seed": 3, "tensors": 4}

    assert perturb.clear(state) == ["every node: the original model back at the next launch"]
    assert link.resolve() == model.resolve()
    assert not (state / perturb.COPY_DIR).exists()
    assert perturb.clear(state) == []


def test_fault_needs_the_vllm_cpu_engine(tmp_path: Path) -> None:
    args = argparse.Namespace(scale=0.05, layers="all", seed=1)
    with pytest.raises(SimError, match="--engine vllm-cpu"):
        perturb.apply(tmp_path, None, args)


def test_cli_knows_the_verb() -> None:
    from sparksim.cli import build_parser

    args = build_parser().parse_args(
        ["fault", "model-perturb", "--scale", "0.05", "--layers", "upper"]
    )
    assert (args.kind, args.scale, args.layers, args.seed) == ("model-perturb", 0.05, "upper", 24)


SETUP = engines.installed_vllm_cpu()


@pytest.mark.skipif(SETUP is None, reason=f"no vllm-cpu setup ({engines.SETUP} makes it)")
def test_real_model_copy_loads_with_the_same_names_shapes_and_dtypes(tmp_path: Path) -> None:
    """The setup's SmolLM2 checkpoint, perturbed in its upper half: the vLLM venv's own
    safetensors reads the same tensors from both, and only layers 15-29's matrices moved."""
    assert SETUP is not None
    model = Path(SETUP["model"])
    dest, changed = perturb.write_copy(model, tmp_path, 0.02, "upper", seed=1)
    assert changed and all(15 <= (perturb.layer_of(n) or -1) <= 29 for n in changed)
    script = (
        "import json, sys, torch\n"
        "from safetensors import safe_open\n"
        "out = {}\n"
        "for path in sys.argv[1:]:\n"
        "    with safe_open(path, 'pt') as f:\n"
        "        s = {k: f.get_slice(k) for k in f.keys()}\n"
        "        out[path] = {k: [str(v.get_dtype()), v.get_shape()] for k, v in s.items()}\n"
        "print(json.dumps(out))\n"
    )
    python = Path(SETUP["venv"]) / "bin" / "python"
    if not python.exists() or shutil.which(str(python)) is None:
        pytest.skip(f"{python} absent")
    src, out = str(model / "model.safetensors"), str(dest / "model.safetensors")
    proc = subprocess.run(
        [str(python), "-c", script, src, out], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    layouts = json.loads(proc.stdout)
    assert layouts[src] == layouts[out]
    before, after = (
        read_tensors(model / "model.safetensors"),
        read_tensors(dest / "model.safetensors"),
    )
    for name in changed[:3]:
        assert rel_noise(before[name][2], after[name][2]) == pytest.approx(0.02, rel=0.25)
    untouched = [n for n in before if n not in changed]
    assert all(np.array_equal(before[n][2], after[n][2]) for n in untouched)


@pytest.mark.sim
@pytest.mark.skipif(SETUP is None, reason=f"no vllm-cpu setup ({engines.SETUP} makes it)")
def test_every_nodes_container_sees_the_perturbed_model_until_clear(tmp_path: Path) -> None:
    """On a two-node ``--engine vllm-cpu`` sim, a container started on either node with the
    node's docker arguments reads the perturbed copy at /models/<name> after the fault,
    and the original again after ``clear`` (the nodes' dockerd follows the symlink)."""
    assert SETUP is not None
    model = Path(SETUP["model"])
    shard = f"/models/{model.name}/model.safetensors"
    state = tmp_path / "sim"
    try:
        cluster = json.loads(spark_sim(state, "up", "--nodes", "2", "--engine", "vllm-cpu"))
        mgmt = {n["name"]: n["mgmt"] for n in cluster["nodes"]}

        def seen(node: str) -> str:
            """The shard's digest in a container started on ``node`` as the launcher would."""
            run = "docker run --rm $VLLM_SPARK_EXTRA_DOCKER_ARGS --entrypoint sha256sum"
            ssh = ["ssh", "-F", cluster["ssh_config"], mgmt[node]]
            proc = subprocess.run(
                [*ssh, f"{run} vllm-node:latest {shard}"],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert proc.returncode == 0, proc.stderr[-2000:]
            return proc.stdout.split()[0]

        def digest(path: Path) -> str:
            return subprocess.run(
                ["sha256sum", str(path)], capture_output=True, text=True, check=True
            ).stdout.split()[0]

        original = digest(model / "model.safetensors")
        assert seen("spark-1") == original
        out = spark_sim(state, "fault", "model-perturb", "--scale", "0.05", "--layers", "upper")
        assert "105 weight matrices (upper layers" in out
        copy = digest(state / perturb.COPY_DIR / model.name / "model.safetensors")
        assert copy != original
        assert seen("spark-1") == seen("spark-2") == copy
        status = spark_sim(state, "status")
        assert "fault: model-perturb all" in status
        spark_sim(state, "fault", "clear")
        assert seen("spark-2") == original
    finally:
        spark_sim(state, "down")


def spark_sim(state: Path, *args: str) -> str:
    """``spark-sim --state-dir STATE ARGS`` from this checkout; its stdout."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SPARKSIM_STATE_DIR", None)
    env.pop("SPARKSIM_NO_DOCKER", None)
    proc = subprocess.run(
        [sys.executable, "-m", "sparksim", "--state-dir", str(state), *args],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0 or args[0] == "down", f"spark-sim {args}: {proc.stderr[-2000:]}"
    return proc.stdout
