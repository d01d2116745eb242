"""sparksim's look-alike launch-cluster.sh, its issue-28 modes, run as bash without a sim:
``--launch-script`` (the per-node patched /workspace/exec-script.sh, as eugr's
``make_node_script``) and ``--non-privileged`` (its limits, refused without it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

LAUNCHER = Path(__file__).parents[1] / "sparksim" / "launcher" / "launch-cluster.sh"
RECIPE = """#!/bin/bash
export VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1

vllm serve /models/M --served-model-name m \\
  --tensor-parallel-size 2 --distributed-executor-backend ray \\
  --host 0.0.0.0 --port 8000 \\

"""


def _node_script(tmp_path: Path, rank: str) -> str:
    """make_node_script's output for ``rank`` (0, 1, or ray) of a 2-node cluster."""
    script = tmp_path / "recipe.sh"
    script.write_text(RECIPE)
    function = subprocess.run(
        ["sed", "-n", "/^make_node_script() {/,/^}/p", str(LAUNCHER)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert function.startswith("make_node_script() {"), function
    shell = (
        f"LAUNCH_SCRIPT_PATH={script} HEAD_IP=198.19.0.1 MASTER_PORT=29501\n{function}\n"
        f'f=$(make_node_script 2 {rank}); cat "$f"; rm -f "$f"'
    )
    return subprocess.run(["bash", "-c", shell], capture_output=True, text=True, check=True).stdout


def test_the_launch_scripts_last_line_is_patched_per_node(tmp_path: Path) -> None:
    head, worker = _node_script(tmp_path, "0"), _node_script(tmp_path, "1")
    for text in (head, worker):
        assert "--distributed-executor-backend" not in text
        assert "export VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8=1\n" in text
        assert "\n\n" not in text  # empty and backslash-only lines dropped
    assert head.splitlines()[-1] == (
        "  --host 0.0.0.0 --port 8000 --nnodes 2 --node-rank 0 --master-addr 198.19.0.1 "
        "--master-port 29501"
    )
    assert worker.splitlines()[-1].endswith("--node-rank 1 --master-addr 198.19.0.1 "
                                            "--master-port 29501 --headless")  # fmt: skip
    ray = _node_script(tmp_path, "ray")
    assert ray.splitlines()[-1] == "  --host 0.0.0.0 --port 8000 --distributed-executor-backend ray"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--mem-limit-gb", "100", "start"], "Error: --mem-limit-gb can only be used with "
         "--non-privileged"),
        (["--launch-script", "x.sh", "exec", "vllm", "serve"], "Error: Action 'exec' is not "
         "compatible with --launch-script."),
        (["--launch-script", "/nonexistent/recipe.sh"], "Error: Launch script not found: "
         "/nonexistent/recipe.sh"),
    ],
)  # fmt: skip
def test_the_launchers_new_flags_refuse_what_eugrs_refuses(argv: list[str], says: str) -> None:
    proc = subprocess.run(["bash", str(LAUNCHER), *argv], capture_output=True, text=True)
    assert proc.returncode == 1 and says in proc.stdout, (proc.stdout, proc.stderr)
