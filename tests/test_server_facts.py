"""What the server was started with, read from ``docker top`` as Docker prints it: the PID
column is required (``-eo args`` alone is refused), the server's own process wins over the
``bash -c`` that started it, and the shell's redirections are not read as vLLM flags."""

from __future__ import annotations

from pathlib import Path

from pytest_spark.infra.server.probe import MARK, parse_probe, probe, serve_line_of

TOP = (Path(__file__).parents[1] / "fixtures" / "docker" / "top-pid-args-no-ray.txt").read_text()
REFUSED = "Error response from daemon: Couldn't find PID field in ps output\n"


def _probe(top: str) -> str:
    return f'{MARK}inspect\n"sleep" ["infinity"]\n{MARK}top\n{top}{MARK}log\n\n'


def test_probe_asks_docker_top_for_the_pid_column() -> None:
    """Docker answers ``-eo args`` with "Couldn't find PID field in ps output"."""
    assert "docker top vllm_node -eo pid,args -ww" in probe("vllm_node")
    assert parse_probe(_probe(REFUSED), None) is None


def test_the_server_process_is_read_not_the_shell_around_it() -> None:
    cmd = parse_probe(_probe(TOP), None)
    assert cmd is not None and cmd.source == "the vllm serve process"
    assert cmd.line.startswith("vllm serve /models/Qwen3.5-122B-A10B-FP8 --served-model-name")
    assert cmd.line.endswith("--master-port 29501"), cmd.line
    assert cmd.args.reasoning_parser == "qwen3" and cmd.args.tool_call_parser == "qwen3_coder"
    assert cmd.args.auto_tool_choice and cmd.args.nnodes == 2


def test_a_bash_c_listing_stops_at_the_shell_operators() -> None:
    """Only the shell is there (its child not yet started): its row is read up to ``>>``."""
    rows = [line for line in TOP.splitlines() if "python3" not in line]
    cmd = parse_probe(_probe("\n".join(rows) + "\n"), None)
    assert cmd is not None and cmd.line.endswith("--master-port 29501"), cmd
    assert ">>" not in cmd.line and "echo" not in cmd.line
    line = "vllm serve M --port 8000 && echo done | tee x; true"
    assert serve_line_of(["bash", "-c", line]) == "vllm serve M --port 8000"
    assert serve_line_of(["bash", "-c", "vllm serve M 2>&1"]) == "vllm serve M"
