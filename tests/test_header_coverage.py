"""The header says when fewer nodes are given than the profile is for (issue #36 §1): the
headline command with a head alone checks the head alone, and must not look like a
two-node verdict."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pytest_spark.settings.expectations import coverage_lines
from pytest_spark.settings.profiles import load_profile

REPO = Path(__file__).resolve().parents[1]


def test_a_head_alone_under_the_two_node_profile_is_warned():
    (line,) = coverage_lines(load_profile("dgx-spark-2node"), "10.1.230.180", (), sim=False)
    assert "1 node given (10.1.230.180)" in line
    assert "dgx-spark-2node is for 2" in line
    assert "--spark-workers=HOST" in line and "--spark-cluster=NAME" in line


def test_enough_nodes_any_number_profiles_and_the_sim_are_not_warned():
    two = load_profile("dgx-spark-2node")
    assert coverage_lines(two, "h", ("w",), sim=False) == []
    assert coverage_lines(two, "h", ("w1", "w2"), sim=False) == []
    assert coverage_lines(load_profile("dgx-spark-switch"), "h", (), sim=False) == []
    assert coverage_lines(two, None, (), sim=False) == []  # --spark-api-url alone: no nodes
    assert coverage_lines(two, "h", (), sim=True) == []


def test_the_header_of_a_real_run_carries_it(tmp_path):
    """Collected only (nothing is contacted): the header line is printed before anything."""

    def header(*extra: str) -> str:
        cmd = [sys.executable, "-m", "pytest", "--co", "-p", "no:cacheprovider"]
        cmd += ["--spark-head=198.18.255.250", "--spark-connect-timeout=1", *extra]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
        return done.stdout + done.stderr

    assert "WARNING: 1 node given (198.18.255.250)" in header()
    assert "node given" not in header("--spark-workers=198.18.255.251")
