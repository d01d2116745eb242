"""The vllm-cpu engine's wiring without a sim and without vLLM: engine.json, the serve line
and mounts it gives, defaults.env, and the image's ``vllm`` choosing the real engine."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from pytest_spark.infra.serveargs import parse_serve_args
from sparksim import engines, serving
from sparksim.netns import SimError
from sparksim.topology import build

REPO = Path(__file__).resolve().parents[2]
VLLM_SHIM = REPO / "sparksim/launcher/image/vllm"


@pytest.fixture
def setup_info(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A vllm-cpu.json as scripts/setup-vllm-cpu writes it, with its folders."""
    home = tmp_path / "vllm-cpu"
    info = {
        "venv": str(home / "venv"),
        "model": str(home / "model" / "smollm2-135m-instruct"),
        "cache": str(home / "cache"),
    }
    for d in info.values():
        Path(d).mkdir(parents=True)
    (home / "vllm-cpu.json").write_text(json.dumps({"version": 1, "vllm": "0.32.0", **info}))
    monkeypatch.setenv(engines.INFO_ENV, str(home / "vllm-cpu.json"))
    return info


def test_default_engine_is_the_emulator_with_the_reference_serve_line(tmp_path: Path) -> None:
    assert engines.name(tmp_path) == "emulator"
    assert engines.serve_args(tmp_path) is None
    assert engines.docker_args(tmp_path) == ""
    assert engines.defaults_env(tmp_path) == {}


def test_vllm_cpu_without_setup_names_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(engines.INFO_ENV, str(tmp_path / "absent.json"))
    with pytest.raises(SimError, match="scripts/setup-vllm-cpu"):
        engines.select(tmp_path, "vllm-cpu")
    with pytest.raises(SimError, match="unknown engine"):
        engines.select(tmp_path, "tgi")


def test_vllm_cpu_serve_line_mounts_and_env(tmp_path: Path, setup_info: dict[str, str]) -> None:
    state = tmp_path / "state"
    state.mkdir()
    engines.select(state, "vllm-cpu")
    assert json.loads((state / engines.ENGINE_JSON).read_text())["engine"] == "vllm-cpu"

    args = parse_serve_args(engines.serve_args(state) or "")
    assert args.model == "/models/smollm2-135m-instruct"
    assert args.served_name == "smollm2"
    assert args.max_model_len == 4096
    assert args.tensor_parallel_size == 1
    assert (args.tool_call_parser, args.auto_tool_choice, args.reasoning_parser) == (
        "hermes",
        True,
        None,
    )

    mounts = engines.docker_args(state).split()
    assert f"{setup_info['venv']}:{engines.VENV_MOUNT}:ro" in mounts
    # the model through DIR/vllm-cpu-model/<name>, a symlink to the setup's (model-perturb
    # points it at a perturbed copy)
    link = state / engines.MODEL_LINK / "smollm2-135m-instruct"
    assert f"{link}:/models/smollm2-135m-instruct:ro" in mounts
    assert link.resolve() == Path(setup_info["model"]).resolve()
    assert f"{setup_info['cache']}:{engines.CACHE_MOUNT}" in mounts  # compile cache: writable
    env = engines.defaults_env(state)
    assert env["SPARKSIM_ENGINE"] == "vllm-cpu"
    assert env["VLLM_CACHE_ROOT"] == engines.CACHE_MOUNT
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


def test_node_setup_carries_the_engine(tmp_path: Path, setup_info: dict[str, str]) -> None:
    """The launch hints, the node's docker run arguments and its defaults.env."""
    state = tmp_path / "state"
    state.mkdir()
    engines.select(state, "vllm-cpu")
    topo = build(15, 2)
    head = topo.nodes[0]
    extra = serving.sshd_env(state, head)["VLLM_SPARK_EXTRA_DOCKER_ARGS"]
    assert f"{setup_info['venv']}:{engines.VENV_MOUNT}:ro" in extra
    serving.install_node(state, topo, head)
    defaults = (serving.home(state, head) / serving.SIM_ETC / serving.DEFAULTS_ENV).read_text()
    assert "SPARKSIM_ENGINE=vllm-cpu\n" in defaults
    assert "SPARKSIM_EMU_TIME_SCALE=" in defaults
    if serving.enabled() is None:
        hints = serving.launch_hints(state)
        assert hints is not None
        assert hints["engine"] == "vllm-cpu"
        assert "--tool-call-parser hermes" in hints["serve_args"]
        assert "--tool-strict-level parameter" in hints["serve_args"]


def _shim(etc: Path, *args: str, venv: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "SPARKSIM_ETC": str(etc), "PYTHONPATH": "/elsewhere"}
    return subprocess.run(
        ["bash", str(VLLM_SHIM), *args], capture_output=True, text=True, env=env, timeout=30
    )


def test_image_vllm_runs_the_venv_vllm_when_the_engine_is_vllm_cpu(tmp_path: Path) -> None:
    """defaults.env says vllm-cpu: `vllm serve ...` execs the venv's python with vLLM's
    CLI module and the same arguments, without the emulator's PYTHONPATH."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    fake = venv / "bin" / "python"
    fake.write_text(
        '#!/bin/bash\necho "argv: $*"\necho "pythonpath: ${PYTHONPATH-unset}"\n'
        'echo "reserved: $VLLM_CPU_NUM_OF_RESERVED_CPU cache: $VLLM_CACHE_ROOT"\n'
    )
    fake.chmod(0o755)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "defaults.env").write_text(
        f"SPARKSIM_EMU_TIME_SCALE=0.002\nSPARKSIM_ENGINE=vllm-cpu\nSPARKSIM_VLLM_VENV={venv}\n"
        "VLLM_CACHE_ROOT=/opt/vllm-cpu/cache\n"
    )
    out = _shim(etc, "serve", "/models/m", "--served-model-name", "smollm2")
    assert out.returncode == 0, out.stderr
    assert "argv: -m vllm.entrypoints.cli.main serve /models/m --served-model-name smollm2" in (
        out.stdout
    )
    assert "pythonpath: unset" in out.stdout
    assert "reserved: 0 cache: /opt/vllm-cpu/cache" in out.stdout
    version = _shim(etc, "--version")
    assert "argv: -m vllm.entrypoints.cli.main --version" in version.stdout


def test_image_vllm_stays_the_emulator_by_default(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "defaults.env").write_text("SPARKSIM_EMU_TIME_SCALE=0.002\n")
    out = _shim(etc, "bogus")
    assert out.returncode == 2
    assert "invalid choice: 'bogus'" in out.stderr
