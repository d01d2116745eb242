"""Open-file limits: the parsers on recorded /proc/PID/limits (fixtures/fdlimit), the
probe's facts, and the check's verdicts on dockerd's and the serving container's limits."""

from __future__ import annotations

import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from conn_fakes import probe_settings

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.fdlimit.check import check_fd_limits
from pytest_spark.infra.fdlimit.parse import (
    UNLIMITED,
    OpenFiles,
    parse_open_files,
    parse_proc_int,
)
from pytest_spark.infra.fdlimit.probe import (
    NodeFdLimits,
    fdlimit_probe_command,
    parse_fdlimit_probe,
)
from pytest_spark.infra.finding import Finding, Skip
from pytest_spark.infra.roundtrip import host_probe_commands
from pytest_spark.settings.profiles import load_profile

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fdlimit"
W = "spark-worker-1"
MIN = 65535
HEALTHY = NodeFdLimits(
    hostname="spark-2",
    dockerd_pid=212,
    dockerd=OpenFiles(1024, 524288),
    dockerd_error=None,
    dockerd_running=True,
    container_pid=None,
    container=None,
    file_max=9223372036854775807,
    nr_open=1048576,
)


def finding(facts: NodeFdLimits, **kw: str | None) -> Finding:
    result = check_fd_limits(W, facts, MIN, **kw)
    assert isinstance(result, Finding), result
    return result


# ---------------------------------------------------------------------------- parse


def test_parse_open_files_of_a_real_limits_file() -> None:
    text = (FIXTURES / "proc_self_limits_x86_dev_machine.txt").read_text()
    assert parse_open_files(text) == OpenFiles(20000, 20000)


def test_parse_open_files_unlimited_and_missing() -> None:
    line = "Max open files            unlimited            unlimited            files     \n"
    assert parse_open_files(line) == OpenFiles(UNLIMITED, UNLIMITED)
    with pytest.raises(ParseError, match="Max open files"):
        parse_open_files(
            "Limit  Soft Limit  Hard Limit  Units\nMax cpu time  unlimited unlimited s\n"
        )


def test_parse_proc_int() -> None:
    assert parse_proc_int("1048576\n", "fs.nr_open") == 1048576
    with pytest.raises(ParseError, match=r"fs\.nr_open"):
        parse_proc_int("cat: /proc/sys/fs/nr_open: No such file\n", "fs.nr_open")


# ---------------------------------------------------------------------------- probe


def test_probe_of_a_healthy_sim_node() -> None:
    """The sim's dockerd, found by pgrep in the node's own PID namespace (pid 80 there),
    with the dev machine's 20000:20000 it inherited."""
    facts = parse_fdlimit_probe((FIXTURES / "probe_sim_node_healthy.txt").read_text())
    assert facts.hostname == "spark-2"
    assert facts.dockerd == OpenFiles(20000, 20000) and facts.dockerd_pid == 80
    assert facts.nr_open == 1048576 and facts.file_max == 2466093
    assert facts.container is None
    assert finding(facts).level == "fail"  # the real floor: 20000 < 65535
    sim = load_profile("sim").fdlimit.min_open_files
    assert check_fd_limits(W, facts, sim).level == "pass"  # type: ignore[union-attr]


def test_probe_of_a_sim_node_after_the_fault() -> None:
    facts = parse_fdlimit_probe((FIXTURES / "probe_sim_node_fd_limit_4096.txt").read_text())
    assert facts.dockerd == OpenFiles(4096, 4096)
    result = finding(facts)
    assert result.level == "fail"


def test_probe_runs_here_and_finds_no_dockerd_without_one(tmp_path: Path) -> None:
    """The command, run by a real sh with a PATH whose pgrep finds nothing: no dockerd is
    told apart from an unreadable one; the kernel's figures are read."""
    (tmp_path / "pgrep").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "pgrep").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    out = subprocess.run(
        fdlimit_probe_command(container="vllm_node"),
        shell=True,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    facts = parse_fdlimit_probe(out)
    assert facts.dockerd is None and not facts.dockerd_running
    assert "no dockerd process" in (facts.dockerd_error or "")
    assert facts.nr_open == int(Path("/proc/sys/fs/nr_open").read_text())


def test_probe_rides_in_the_host_round_trip() -> None:
    commands = host_probe_commands(probe_settings())
    assert commands["fdlimit"] == fdlimit_probe_command(container="vllm_node")


# ---------------------------------------------------------------------------- check


def test_systemd_default_passes() -> None:
    result = finding(HEALTHY)
    assert result.level == "pass"
    assert result.measured["dockerd_nofile_hard"] == 524288
    assert result.message.endswith("a container can raise its limit to vLLM's 65535")
    low_floor = check_fd_limits(W, replace(HEALTHY, dockerd=OpenFiles(20000, 20000)), 16384)
    assert isinstance(low_floor, Finding) and low_floor.level == "pass"
    assert "below vLLM's 65535: a container raises its soft limit to 20000 only" in (
        low_floor.message
    )


def test_low_dockerd_hard_limit_fails_with_node_figures_and_fix() -> None:
    result = finding(replace(HEALTHY, dockerd=OpenFiles(1024, 4096)))
    assert result.level == "fail"
    msg = result.message
    assert msg.startswith(f"{W}: dockerd (pid 212) runs with Max open files soft 1024, hard 4096")
    assert "at least 65535 for dockerd" in msg
    assert "LimitNOFILE=1048576" in msg and "systemctl daemon-reload" in msg
    assert "--ulimit nofile=1048576:1048576" in msg


def test_fix_stays_under_nr_open() -> None:
    result = finding(replace(HEALTHY, dockerd=OpenFiles(1024, 4096), nr_open=131072))
    assert "LimitNOFILE=131072" in result.message


def test_low_dockerd_with_a_container_of_its_own_limit_still_fails() -> None:
    facts = replace(
        HEALTHY,
        dockerd=OpenFiles(4096, 4096),
        container_pid=900,
        container=OpenFiles(1 << 20, 1 << 20),
    )
    result = finding(facts)
    assert result.level == "fail"
    assert "kept the limit it started with" in result.message
    assert "hard 1048576" in result.message


def test_low_container_limit_fails_naming_it() -> None:
    facts = replace(HEALTHY, container_pid=900, container=OpenFiles(1024, 1024))
    result = finding(facts)
    assert result.level == "fail"
    assert "for the serving container" in result.message
    assert "--ulimit nofile below it" in result.message


def test_hard_limit_at_vllm_target_passes() -> None:
    assert finding(replace(HEALTHY, dockerd=OpenFiles(MIN, MIN))).level == "pass"
    assert finding(replace(HEALTHY, dockerd=OpenFiles(MIN - 1, MIN - 1))).level == "fail"


def test_small_kernel_file_table_warns() -> None:
    result = finding(replace(HEALTHY, file_max=50000))
    assert result.level == "warn"
    assert "fs.file-max" in result.message


def test_no_dockerd_skips_citing_the_docker_check_when_it_runs() -> None:
    gone = replace(
        HEALTHY, dockerd=None, dockerd_pid=None, dockerd_running=False, dockerd_error="no dockerd"
    )
    result = check_fd_limits(W, gone, MIN, docker_verdict=f"test_docker_ready[{W}]")
    assert isinstance(result, Skip)
    assert f"test_docker_ready[{W}] has the verdict" in result.reason
    alone = finding(gone)
    assert alone.level == "fail" and "Start Docker" in alone.message


def test_profile_figure_and_override() -> None:
    profile = load_profile("dgx-spark-2node")
    assert profile.fdlimit.min_open_files == 65535
    assert profile.with_overrides({"fdlimit.min_open_files": "4096"}).fdlimit.min_open_files == 4096
