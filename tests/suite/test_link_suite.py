"""The link suite against sparksim: ``--spark-sim`` stands a sim up and takes it down; an
unreachable worker is an error naming it. That healthy passes and each link fault (a twin
down, a degraded rate, an MTU mismatch) fails exactly its check with the node, the
interface, the figures and a fix is proved on the fault matrix's rows of those faults
(tests/suite/test_fault_matrix.py, ``ROW_PROOFS``): the same suite runs, run once."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run_suite  # type: ignore[import-not-found]
from pytest_spark.access.simcontrol import SimCluster

pytestmark = pytest.mark.sim
INFRA = str(REPO / "tests_infra" / "test_links.py")


def link_checks() -> set[str]:
    """The test functions of every suite file of the link category (``pytestmark =
    pytest.mark.link``: tests_infra/test_links.py, test_pcie.py, ...), read from source."""
    names = set()
    for path in sorted((REPO / "tests_infra").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        marks = [
            ast.unparse(n.value)
            for n in tree.body
            if isinstance(n, ast.Assign)
            and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
        ]
        if "pytest.mark.link" in marks:
            names |= {
                n.name
                for n in tree.body
                if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
            }
    return names


def test_spark_sim_option_stands_up_and_tears_down(tmp_path: Path) -> None:
    run = run_suite(tmp_path, "--spark-sim", "-m", "link", str(REPO / "tests_infra"))
    assert run.ret == 0, run.output
    assert run.results["cluster"]["sim"] is True
    assert run.results["cluster"]["profile"] == "sim"
    outcomes = run.outcomes()
    assert set(outcomes.values()) == {"passed"}, outcomes
    # every link check ran on the sim, and the reachability verdict the link checks cite was
    # put back whatever the selection (issue #25 part 3): by name, not by a count that
    # goes stale with each new link check
    ran = {name.split("[")[0] for name in outcomes}
    assert ran == link_checks() | {"test_node_reachable"}, sorted(ran)
    for node in ("spark-head", "spark-worker-1"):
        assert f"test_fabric_twins_up[{node}]" in outcomes, sorted(outcomes)
    instance = run.results["cluster"]["head"].split(".")[2]  # 198.18.<k>.11
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"spk{instance}-" not in left, left
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"spk{instance}br" not in links


def test_unreachable_worker_is_an_error_naming_it_not_a_check_failure(
    sim: SimCluster, tmp_path: Path
) -> None:
    nobody = sim.head.rsplit(".", 1)[0] + ".99"  # on the sim's own bridge, no node there
    run = run_suite(
        tmp_path,
        INFRA,
        f"--spark-head={sim.head}",
        f"--spark-workers={nobody}",
        f"--spark-ssh-config={sim.ssh_config}",
        "--spark-profile=sim",
        "--spark-connect-timeout=2",
    )
    errors = {k: v for k, v in run.outcomes().items() if v == "error"}
    assert errors and all("spark-worker-1" in k or "twin" in k for k in errors), run.outcomes()
    message = run.checks(outcome="error")[0]["message"]
    assert "node unreachable" in message and "spark-worker-1" in message
    head_ok = run.checks(nodeid="tests_infra/test_links.py::test_link_up[spark-head-twin0]")
    assert head_ok[0]["outcome"] == "passed"
