"""The collective runner: command building, quoting, detection, cleanup, pkill on timeout
and interrupt, with fake nodes that run commands locally (as a node runs them over SSH)."""

from __future__ import annotations

import _thread
import importlib.util
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_spark.access.base import CommandResult, CommandTimeout
from pytest_spark.checks.nccl import check_collective
from pytest_spark.collective import runner as collective
from pytest_spark.collective.runner import (
    CollectiveUnavailable,
    detect_launcher,
    kill_command,
    mpirun_command,
    rank_command,
    run_allreduce,
    stage_command,
)
from pytest_spark.collective.script import script_text
from pytest_spark.settings.profiles import load_profile

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nccl"
HAS_TORCH = importlib.util.find_spec("torch") is not None


class LocalNode:
    """A node whose commands run here, through bash, as sshd would run them.

    On a timeout the command is left running (an SSH channel closed at the timeout leaves
    the remote process alive), so the runner's pkill is what has to end it.
    """

    def __init__(self, name: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.env = {**os.environ, **(env or {})}
        self.commands: list[str] = []
        self.procs: list[subprocess.Popen[str]] = []

    def run(self, command: str, *, timeout: float | None = None) -> CommandResult:
        self.commands.append(command)
        proc = subprocess.Popen(
            ["bash", "-c", command],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            env=self.env,
            start_new_session=True,
        )
        self.procs.append(proc)
        started = time.monotonic()
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            partial = exc.stdout or b""
            text = partial.decode() if isinstance(partial, bytes) else partial
            raise CommandTimeout(self.name, command, timeout or 0, text) from None
        return CommandResult(
            self.name, command, proc.returncode, out, err, time.monotonic() - started
        )

    def reap(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


@pytest.fixture
def nodes() -> Iterator[list[LocalNode]]:
    made = [LocalNode("spark-head"), LocalNode("spark-worker-1")]
    yield made
    for node in made:
        node.reap()


def processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.append(int(entry.name))
    return found


def dirs_with(token: str) -> list[Path]:
    return list(Path("/tmp").glob(f"{token}*"))


def fake_python(tmp_path: Path, body: str) -> str:
    """An executable standing in for python3: ``body`` runs with the script's argv."""
    path = tmp_path / "fakepython"
    path.write_text(f"#!{sys.executable}\nimport sys, time\nargs = sys.argv[2:]\n{body}\n")
    path.chmod(0o755)
    return str(path)


# --------------------------------------------------------------------- command building


def test_stage_copies_the_script_intact_and_kill_cleans_up(nodes: list[LocalNode]) -> None:
    token = collective.TOKEN_PREFIX + "a1b2c3d4e5f6"
    res = nodes[0].run(stage_command(token, script_text()), timeout=30)
    assert res.rc == 0, res.stderr
    workdir = Path(res.stdout.strip())
    assert workdir.name.startswith(token + ".")
    assert (workdir / "allreduce.py").read_text() == script_text()
    assert nodes[0].run(kill_command(token), timeout=30).rc == 0
    assert not workdir.exists()


def test_rank_command_quotes_env_and_args() -> None:
    env = {"NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1", "WEIRD": "a b'c\"$d"}
    cmd = rank_command(
        "python",
        workdir="/tmp/pytest-spark-nccl-x.AbC",
        env=env,
        args=["--rank", "1", "--token", "pytest-spark-nccl-x"],
        python="/opt/py thon/bin/python3",
    )
    assert shlex.split(cmd) == [
        "cd",
        "/tmp/pytest-spark-nccl-x.AbC",
        "&&",
        "exec",
        "env",
        "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1",
        "WEIRD=a b'c\"$d",
        "/opt/py thon/bin/python3",
        "/tmp/pytest-spark-nccl-x.AbC/allreduce.py",
        "--rank",
        "1",
        "--token",
        "pytest-spark-nccl-x",
    ]


def test_container_command_feeds_the_script_on_stdin() -> None:
    cmd = rank_command(
        "container",
        workdir="/tmp/d",
        env={"NCCL_DEBUG": "INFO"},
        args=["--rank", "0"],
        container="vllm node",
    )
    assert shlex.split(cmd) == [
        "exec",
        "docker",
        "exec",
        "-i",
        "-e",
        "NCCL_DEBUG=INFO",
        "vllm node",
        "python3",
        "-",
        "--rank",
        "0",
        "<",
        "/tmp/d/allreduce.py",
    ]
    with pytest.raises(ValueError, match="container"):
        rank_command("container", workdir="/tmp/d", env={}, args=[])


def test_mpirun_command_follows_the_playbook() -> None:
    cmd = mpirun_command(
        hosts=["192.168.200.12", "192.168.200.13"],
        env={"NCCL_SOCKET_IFNAME": "enp1s0f1np1", "NCCL_DEBUG": "INFO"},
        token="pytest-spark-nccl-x",
        min_bytes=1 << 20,
        max_bytes=1 << 30,
        iters=20,
        warmup=5,
    )
    argv = shlex.split(cmd)
    assert argv[argv.index("mpirun") : argv.index("mpirun") + 5] == [
        "mpirun",
        "-np",
        "2",
        "-H",
        "192.168.200.12:1,192.168.200.13:1",
    ]
    assert "btl_tcp_if_include" in argv and "enp1s0f1np1" in argv  # not docker0
    assert argv[argv.index("NCCL_DEBUG=INFO") - 1] == "-x"
    assert argv[-15:] == [
        "/tmp/pytest-spark-nccl-x.mpi/all_reduce_perf",
        "-b",
        "1048576",
        "-e",
        "1073741824",
        "-f",
        "2",
        "-g",
        "1",
        "-n",
        "20",
        "-w",
        "5",
        "-c",
        "1",
    ]


def test_kill_command_spares_its_own_shell(nodes: list[LocalNode]) -> None:
    token = collective.TOKEN_PREFIX + "0badc0ffee00"
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", token])
    try:
        res = nodes[0].run(kill_command(token), timeout=30)
        assert res.rc == 0  # 143/-15 would mean pkill matched the shell running it
        assert victim.wait(timeout=10) != 0
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()


def test_kill_command_enters_the_container() -> None:
    cmd = kill_command("pytest-spark-nccl-x", container="vllm")
    assert cmd.startswith("docker exec vllm sh -c ")
    assert "[p]ytest-spark-nccl-x" in cmd and "pytest-spark-nccl-x" not in cmd.replace(
        "[p]ytest-spark-nccl-x", ""
    )


def test_sizes_above_4gib_are_refused(nodes: list[LocalNode]) -> None:
    with pytest.raises(ValueError, match="above 4 GiB"):
        run_allreduce(nodes, master_addr="127.0.0.1", max_bytes=16 << 30)
    assert nodes[0].commands == []


# ---------------------------------------------------------------------------- detection


def tool_dir(tmp_path: Path, **tools: str) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name, body in tools.items():
        path = bindir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}"}


def test_detect_prefers_nccl_tests_with_mpirun(tmp_path: Path) -> None:
    env = tool_dir(tmp_path, all_reduce_perf="true", mpirun="true")
    plan = detect_launcher(
        [LocalNode("a", env), LocalNode("b", env)], python=fake_python(tmp_path, "")
    )
    assert plan.launcher == "nccl-tests"
    assert plan.binary == str(tmp_path / "bin" / "all_reduce_perf")


def test_detect_skips_nccl_tests_without_mpirun(tmp_path: Path) -> None:
    env = tool_dir(tmp_path, all_reduce_perf="true")
    py = tool_dir(tmp_path, python3="echo 2.13.0")["PATH"].split(":")[0] + "/python3"
    plan = detect_launcher([LocalNode("a", env), LocalNode("b", env)], python=py)
    assert plan.launcher == "python"
    assert any("nccl-tests#121" in note for note in plan.notes)


def test_detect_fails_with_the_fix_when_nothing_works(tmp_path: Path) -> None:
    no_torch = tool_dir(tmp_path, python3="exit 1")["PATH"].split(":")[0] + "/python3"
    with pytest.raises(CollectiveUnavailable, match=r"pip install torch") as info:
        detect_launcher([LocalNode("spark-head"), LocalNode("spark-worker-1")], python=no_torch)
    assert "spark-worker-1: all_reduce_perf=none" in str(info.value)


# ----------------------------------------------------------------- runs with fake ranks


def test_timeout_pkills_every_rank_and_removes_temp_dirs(
    nodes: list[LocalNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(collective, "RUN_GRACE", 1.0)
    py = fake_python(
        tmp_path, "print('# pytest_spark allreduce: rank started', flush=True)\ntime.sleep(300)"
    )
    run = run_allreduce(
        nodes,
        master_addr="127.0.0.1",
        launcher="python",
        python=py,
        timeout=2,
        min_bytes=1 << 20,
        max_bytes=1 << 20,
    )
    assert run.timed_out and run.hung_at_init and not run.ok
    assert [r.timed_out for r in run.ranks] == [True, True]
    assert all(r.rc is None and "rank started" in r.stdout for r in run.ranks)
    assert processes_with(run.token) == []
    assert dirs_with(run.token) == []
    assert all(run.token in r.command for r in run.ranks)
    (hang, transport) = check_collective(run, load_profile("sim"), timeout_s=2)
    assert hang.level == "fail" and "hung at initialisation" in hang.message
    assert "SGLang" in hang.message and "rank started" in hang.message
    assert transport.level == "fail"  # no NCCL transport line at all


def test_keyboard_interrupt_ends_the_run_everywhere(nodes: list[LocalNode], tmp_path: Path) -> None:
    marker = tmp_path / "token"
    py = fake_python(
        tmp_path,
        f"open({str(marker)!r}, 'w').write(args[args.index('--token') + 1])\ntime.sleep(300)",
    )
    # Ctrl-C's handler even when this process inherited SIGINT ignored (started in the
    # background, as some CI runners do): interrupt_main() then does nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(3.0, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_allreduce(nodes, master_addr="127.0.0.1", launcher="python", python=py, timeout=120)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - started < 60
    token = marker.read_text()
    assert processes_with(token) == []
    assert dirs_with(token) == []


def test_peers_of_a_failed_rank_are_stopped(
    nodes: list[LocalNode], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(collective, "KILL_GRACE", 1.0)
    py = fake_python(
        tmp_path,
        "rank = args[args.index('--rank') + 1]\n"
        "if rank == '0':\n"
        "    print('# pytest_spark allreduce: init timeout: rank 0 of 2 '"
        "'did not complete the rendezvous', flush=True)\n"
        "    sys.exit(3)\n"
        "time.sleep(300)",
    )
    started = time.monotonic()
    run = run_allreduce(nodes, master_addr="127.0.0.1", launcher="python", python=py, timeout=120)
    assert time.monotonic() - started < 30
    assert run.ranks[0].rc == 3 and run.ranks[1].rc != 0
    assert run.hung_at_init and not run.timed_out
    assert processes_with(run.token) == []


def test_nccl_tests_through_mpirun(nodes: list[LocalNode], tmp_path: Path) -> None:
    fixture = FIXTURES / "all_reduce_sweep_healthy.txt"
    env = tool_dir(
        tmp_path,
        all_reduce_perf=f"cat {shlex.quote(str(fixture))}",
        # a stand-in mpirun: run the binary (first argument ending in all_reduce_perf) once
        mpirun='while [ $# -gt 0 ]; do case "$1" in *all_reduce_perf) exec "$@";; esac; '
        "shift; done; exit 2",
    )
    fake = [LocalNode("spark-head", env), LocalNode("spark-worker-1", env)]
    try:
        run = run_allreduce(
            fake,
            master_addr="192.168.200.12",
            fabric_addrs=["192.168.200.12", "192.168.200.13"],
            python=fake_python(tmp_path, ""),
            timeout=30,
        )
    finally:
        for node in fake:
            node.reap()
    assert run.launcher == "nccl-tests" and run.ok
    assert len(run.ranks) == 1 and "-H 192.168.200.12:1,192.168.200.13:1" in run.ranks[0].command
    assert run.result is not None and len(run.result.rows) == 28
    # NCCL prints hostnames (spark-1, spark-2); the findings name the nodes as the suite
    # does, from the "#  Rank N Pid P on HOST" lines and the order mpirun gave the ranks
    assert run.nodes == ("spark-head", "spark-worker-1")
    assert sorted(t.host for t in run.transports) == ["spark-head", "spark-worker-1"]
    assert all(t.line.startswith(("spark-1:", "spark-2:")) for t in run.transports)
    assert dirs_with(run.token) == []


# --------------------------------------------------------------------- a real gloo run


@pytest.mark.slow
@pytest.mark.skipif(
    not HAS_TORCH,
    reason="torch is not installed: `.venv/bin/pip install torch==2.13.0` (CPU wheel)",
)
def test_real_two_rank_run_through_the_runner(nodes: list[LocalNode]) -> None:
    env = {"NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1"}
    run = run_allreduce(
        nodes,
        master_addr="127.0.0.1",
        launcher="auto",
        python=sys.executable,
        rank_env={n.name: env for n in nodes},
        min_bytes=1 << 20,
        max_bytes=2 << 20,
        iters=3,
        warmup=1,
        timeout=150,
    )
    assert run.ok, run.evidence()
    assert run.launcher == "python"
    assert run.result is not None and run.result.backend == "gloo"
    assert [r.size_bytes for r in run.result.rows] == [1 << 20, 2 << 20]
    assert all(r.busbw_gbps > 0 for r in run.result.rows)
    assert len(run.transports) == 2 and all(t.predicted for t in run.transports)
    # both ranks run on this one host: the pid tells them apart
    assert sorted(t.host for t in run.transports) == sorted(n.name for n in nodes)
    assert all("GLOO_SOCKET_IFNAME=lo" in r.command for r in run.ranks)
    assert dirs_with(run.token) == [] and processes_with(run.token) == []
