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
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_spark.access.base import CommandResult, CommandTimeout
from pytest_spark.infra.nccl import command_probe, runner_gather
from pytest_spark.infra.nccl.check import check_collective
from pytest_spark.infra.nccl.command_probe import (
    kill_command,
    mpirun_command,
    rank_command,
    script_text,
    stage_command,
)
from pytest_spark.infra.nccl.gather import _progress_line, progress_text
from pytest_spark.infra.nccl.launcher_gather import CollectiveUnavailable, detect_launcher
from pytest_spark.infra.nccl.parse import Row, Timing
from pytest_spark.infra.nccl.probe import SweepProgress
from pytest_spark.infra.nccl.result_probe import planned_sweeps
from pytest_spark.infra.nccl.runner_gather import run_allreduce
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

    def run(
        self,
        command: str,
        *,
        timeout: float | None = None,
        on_output: Callable[[str], None] | None = None,
    ) -> CommandResult:
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
        if on_output is not None:  # stdout handed over line by line as it comes, as SSH does
            return self._streamed(proc, command, timeout, on_output, started)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            partial = exc.stdout or b""
            text = partial.decode() if isinstance(partial, bytes) else partial
            raise CommandTimeout(self.name, command, timeout or 0, text) from None
        return CommandResult(
            self.name, command, proc.returncode, out, err, time.monotonic() - started
        )

    def _streamed(
        self,
        proc: subprocess.Popen[str],
        command: str,
        timeout: float | None,
        on_output: Callable[[str], None],
        started: float,
    ) -> CommandResult:
        assert proc.stdout is not None and proc.stderr is not None
        out: list[str] = []

        def read() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                out.append(line)
                on_output(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CommandTimeout(self.name, command, timeout or 0, "".join(out)) from None
        reader.join(5)
        err = proc.stderr.read()
        return CommandResult(
            self.name, command, proc.returncode, "".join(out), err, time.monotonic() - started
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
    token = command_probe.TOKEN_PREFIX + "a1b2c3d4e5f6"
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
    token = command_probe.TOKEN_PREFIX + "0badc0ffee00"
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
    monkeypatch.setattr(runner_gather, "RUN_GRACE", 1.0)
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
    monkeypatch.setattr(runner_gather, "KILL_GRACE", 1.0)
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
    ports = {
        shlex.split(r.command)[shlex.split(r.command).index("--master-port") + 1] for r in run.ranks
    }
    assert len(ports) == 1 and command_probe.PORT_LO <= int(ports.pop()) < command_probe.PORT_HI
    assert dirs_with(run.token) == [] and processes_with(run.token) == []


def test_rendezvous_port_lies_below_the_ephemeral_range() -> None:
    """Rank 0's store port is drawn where the head's own outgoing connections do not hold
    ports (Linux's ip_local_port_range): one drawn inside it was in use once, and the store
    failed to listen."""
    lo, _hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    drawn = {command_probe.free_range_port() for _ in range(2000)}
    assert max(drawn) < min(lo, 29500), (max(drawn), lo)  # and below torch's 29500
    assert min(drawn) >= 20000  # above Ray's worker ports (10002-19999)
    assert len(drawn) > 1000  # spread: two jobs rarely meet


def test_progress_is_told_while_the_ranks_run(nodes: list[LocalNode], tmp_path: Path) -> None:
    """The live line of the NCCL sweep (issue #16 section 8): called while the ranks run
    and once, finished, at the end; before any row the ranks are starting."""
    py = fake_python(tmp_path, "time.sleep(1.5)")
    calls: list[SweepProgress] = []
    run_allreduce(
        nodes,
        master_addr="127.0.0.1",
        launcher="python",
        python=py,
        timeout=60,
        progress=calls.append,
    )
    assert len(calls) >= 2
    assert [p.finished for p in calls] == [False] * (len(calls) - 1) + [True]
    assert calls[-1].elapsed_s >= 1.4 and [p.elapsed_s for p in calls] == sorted(
        p.elapsed_s for p in calls
    )
    assert all(p.done == 0 and p.total == 11 for p in calls)  # 1 MiB..1 GiB (the defaults)


def _row(size: int, busbw: float, time_us: float = 100.0) -> Row:
    timing = Timing(time_us, busbw, busbw, 0)
    return Row(size, size // 4, "float", "sum", -1, timing, timing)


def test_progress_line_names_the_size_reached_and_its_busbw() -> None:
    """One line a state: starting; the size reached out of the sweep's largest with its
    busbw (latency: its time a call) and the sizes done out of all; done at `` 100% ``."""
    planned = planned_sweeps(("all_reduce", "all_gather", "latency"), 1 << 20, 8 << 20, 1 << 20)
    assert [len(s.sizes) for s in planned] == [4, 4, 18]
    reduce, gather, latency = planned
    state = SweepProgress(5.2, False, planned)
    assert progress_text(state, 2, 120.0) == (
        "nccl all_reduce, all_gather, latency: 2 ranks starting, 0/26 sizes 0%, 5/120 s"
    )
    rows = (_row(1 << 20, 0.108), _row(2 << 20, 0.1134), _row(4 << 20, 0.117))
    state = SweepProgress(12.4, False, (replace(reduce, rows=rows), gather, latency))
    assert progress_text(state, 2, 120.0) == (
        "nccl all_reduce 4 MiB of 8 MiB: busbw 0.117 GB/s so far; 3/26 sizes 11%, 12/120 s"
    )
    done = replace(reduce, rows=(*rows, _row(8 << 20, 0.118)))
    lat = replace(latency, rows=tuple(_row(8 << k, 0.0, 650.0) for k in range(17)))
    state = SweepProgress(38.0, False, (done, replace(gather, rows=rows), lat))
    assert progress_text(state, 2, 120.0) == (
        "nccl latency 512 KiB of 1 MiB: 650 us a call so far; 24/26 sizes 92%, 38/120 s"
    )
    state = SweepProgress(40.0, True, (done, replace(gather, rows=rows), lat))
    line = progress_text(state, 2, 120.0)
    assert line == (
        "nccl all_reduce, all_gather, latency: 2 ranks done 100% in 40 s, 24/26 sizes; "
        "all_reduce busbw 0.118 GB/s at 8 MiB"
    )
    assert " 100% " in f" {line} "  # the writer ends the line here, and only here
    lines: list[str] = []
    writer = _progress_line(lines.append, 2, 120.0)
    assert writer is not None and _progress_line(None, 2, 1.0) is None
    writer(state)
    assert lines == [line]


SLOW_ROWS = (
    "import sys, time\n"
    "if args[args.index('--rank') + 1] == '0':\n"
    "    print('# nccl-tests-compatible output from pytest_spark allreduce (backend gloo)')\n"
    "    print('# Collective test starting: all_reduce_perf', flush=True)\n"
    "    for k in range(4):\n"
    "        time.sleep(0.8)\n"
    "        n = (1 << 20) << k\n"
    "        t = f'{n:12d}  {n // 4:12d}  float  sum  -1  1000.0  0.1  0.1{k}  0  1000.0  0.1  "
    "0.1{k}  0'\n"
    "        print(t, flush=True)\n"
)


def test_progress_comes_as_the_sweep_goes_not_at_its_end(
    nodes: list[LocalNode], tmp_path: Path
) -> None:
    """The script's rows reach the progress line while the ranks still run, one size at a
    time (rank 0's output read as it streams in), not all at once when they end."""
    seen: list[tuple[float, int]] = []
    started = time.monotonic()
    run = run_allreduce(
        nodes,
        master_addr="127.0.0.1",
        launcher="python",
        python=fake_python(tmp_path, SLOW_ROWS),
        min_bytes=1 << 20,
        max_bytes=8 << 20,
        timeout=60,
        progress=lambda p: seen.append((time.monotonic() - started, p.done)),
    )
    end = time.monotonic() - started
    assert run.result is not None and len(run.result.rows) == 4
    running = [done for t, done in seen[:-1]]
    assert running == sorted(running) and {1, 2, 3} <= set(running), seen
    first = next(t for t, done in seen if done >= 1)
    assert first < end - 1.5, (first, end)  # the first size was told seconds before the end
    assert seen[-1][1] == 4


def test_nccl_tests_rows_are_told_as_mpirun_prints_them(
    nodes: list[LocalNode], tmp_path: Path
) -> None:
    """nccl-tests prints one row a size: through mpirun's output, read as it comes, the
    progress counts them while the run goes (a row every 0.05 s here, 28 sizes)."""
    fixture = FIXTURES / "all_reduce_sweep_healthy.txt"
    env = tool_dir(
        tmp_path,
        all_reduce_perf=f'while IFS= read -r l; do echo "$l"; case "$l" in " "*[0-9]*) '
        f"sleep 0.05;; esac; done < {shlex.quote(str(fixture))}",
        mpirun='while [ $# -gt 0 ]; do case "$1" in *all_reduce_perf) exec "$@";; esac; '
        "shift; done; exit 2",
    )
    fake = [LocalNode("spark-head", env), LocalNode("spark-worker-1", env)]
    seen: list[SweepProgress] = []
    try:
        run = run_allreduce(
            fake,
            master_addr="192.168.200.12",
            fabric_addrs=["192.168.200.12", "192.168.200.13"],
            python=fake_python(tmp_path, ""),
            min_bytes=8,
            max_bytes=1 << 30,
            timeout=60,
            progress=seen.append,
        )
    finally:
        for node in fake:
            node.reap()
    assert run.launcher == "nccl-tests" and run.ok
    running = [p.done for p in seen if not p.finished]
    assert any(0 < done < 28 for done in running), running
    assert seen[-1].finished and seen[-1].done == 28 == seen[-1].total
    assert progress_text(seen[-1], 2, 60.0).endswith("all_reduce busbw 23.20 GB/s at 1 GiB")


def test_kill_command_ends_a_process_that_ignores_sigterm(nodes: list[LocalNode]) -> None:
    """SIGTERM first; what is still there after the grace gets SIGKILL."""
    token = command_probe.TOKEN_PREFIX + "5eed5eed5eed"
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    victim = subprocess.Popen([sys.executable, "-c", code, token])
    try:
        time.sleep(0.3)  # the handler is installed
        assert nodes[0].run(kill_command(token), timeout=30).rc == 0
        assert victim.wait(timeout=10) == -signal.SIGKILL
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()


def test_kill_command_waits_for_nothing_when_nothing_is_left(
    nodes: list[LocalNode], tmp_path: Path
) -> None:
    """A finished run's ranks are gone: the clean-up does not sit out a grace period (a
    ``sleep`` on PATH that leaves a mark shows whether it was called)."""
    (tmp_path / "sleep").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/slept\n')
    (tmp_path / "sleep").chmod(0o755)
    token = command_probe.TOKEN_PREFIX + "0000deadbeef"
    command = f"PATH={tmp_path}:$PATH; export PATH; " + kill_command(token)
    assert nodes[0].run(command, timeout=30).rc == 0
    assert not (tmp_path / "slept").exists()
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", token])
    try:
        time.sleep(0.3)
        assert nodes[0].run(command, timeout=30).rc == 0
        assert victim.wait(timeout=10) != 0
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
