"""The link suite against sparksim: healthy passes, each fault fails exactly its check
with the node, the interface, the figures and a fix in the message."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO, run_suite, sim_fault  # type: ignore[import-not-found]
from pytest_spark.access.simcontrol import SimCluster

pytestmark = pytest.mark.sim
INFRA = str(REPO / "tests_infra" / "test_link.py")


@pytest.fixture
def clean(sim: SimCluster) -> Iterator[SimCluster]:
    sim_fault(sim, "clear")
    yield sim
    sim_fault(sim, "clear")


def test_healthy_sim_passes_every_link_check(clean: SimCluster, tmp_path: Path) -> None:
    run = run_suite(tmp_path, INFRA, sim=clean)
    assert run.ret == 0, run.output
    outcomes = run.outcomes()
    assert len(outcomes) == 13 * 2  # 2 nodes x (1 + 2 twins x 5) + 2 twins x 2
    assert set(outcomes.values()) == {"passed"}, outcomes
    rates = run.checks(outcome="passed")
    assert all(c["category"] == "link" for c in rates)
    rate = next(c for c in rates if "test_link_rate[spark-head-twin0]" in c["nodeid"])
    assert (rate["measured"], rate["unit"]) == (200.0, "Gb/s")


def test_link_down_fails_link_up_at_the_down_end_and_skips_dependents(
    clean: SimCluster, tmp_path: Path
) -> None:
    sim_fault(clean, "link-down", "spark-2", "enp1s0f1np1")
    run = run_suite(tmp_path, INFRA, sim=clean)
    assert run.ret == 1
    failed = run.failed()
    # One root cause, one failure: the admin-down end. Its peer's no-carrier end and the
    # twin count skip citing it, the twin's dependents skip pointing at the link-up check.
    assert set(failed) == {"test_link_up[spark-worker-1-twin1]"}, failed
    down = failed["test_link_up[spark-worker-1-twin1]"]
    assert "spark-worker-1 enp1s0f1np1" in down and "administratively down" in down
    assert "ip link set enp1s0f1np1 up" in down
    skipped = {c["nodeid"].split("::", 1)[1]: c["message"] for c in run.checks(outcome="skipped")}
    assert set(skipped) == {
        "test_fabric_twins_up[spark-head]",
        "test_fabric_twins_up[spark-worker-1]",
        "test_link_up[spark-head-twin1]",
    } | {
        f"test_{t}[{n}-twin1]"
        for t in ("roce_active", "link_rate", "ping_peer_at_full_mtu")
        for n in ("spark-head", "spark-worker-1")
    }, skipped
    assert "no carrier" in skipped["test_link_up[spark-head-twin1]"]
    cited = "test_link_up[spark-worker-1-twin1] has the evidence"
    for name, reason in skipped.items():
        assert "see the link-up check" in reason or cited in reason, (name, reason)


def test_degraded_rate_fails_the_rate_check_only(clean: SimCluster, tmp_path: Path) -> None:
    sim_fault(clean, "link-rate", "spark-1", "100000", "enP2p1s0f1np1")
    run = run_suite(tmp_path, INFRA, sim=clean)
    failed = run.failed()
    assert list(failed) == ["test_link_rate[spark-head-twin0]"], failed
    message = failed["test_link_rate[spark-head-twin0]"]
    assert "spark-head enP2p1s0f1np1" in message
    assert "100 Gb/s" in message and ">= 200 Gb/s" in message and "cable" in message
    record = run.checks(nodeid="tests_infra/test_link.py::test_link_rate[spark-head-twin0]")[0]
    assert (record["measured"], record["expected"]) == (100.0, 200.0)


def test_mtu_mismatch_fails_consistency_skips_the_full_mtu_ping_and_warns(
    clean: SimCluster, tmp_path: Path
) -> None:
    sim_fault(clean, "mtu", "spark-2", "1500", "enP2p1s0f1np1")
    run = run_suite(tmp_path, INFRA, sim=clean)
    failed = run.failed()
    assert set(failed) == {"test_mtu_consistent[twin0]"}, failed
    assert "spark-head 9000, spark-worker-1 1500" in failed["test_mtu_consistent[twin0]"]
    # the lost full-MTU ping is the mismatch's consequence: skipped citing it
    ping = run.checks(
        nodeid="tests_infra/test_link.py::test_ping_peer_at_full_mtu[spark-head-twin0]"
    )[0]
    assert ping["outcome"] == "skipped", ping
    assert "test_mtu_consistent[twin0] has the evidence" in ping["message"]
    warned = run.checks(nodeid="tests_infra/test_link.py::test_mtu[spark-worker-1-twin0]")[0]
    assert warned["outcome"] == "passed" and warned["level"] == "warn"
    assert "~5%" in warned["message"]
    assert "SparkCheckWarning" in run.output


def test_spark_sim_option_stands_up_and_tears_down(tmp_path: Path) -> None:
    run = run_suite(tmp_path, "--spark-sim", "-m", "link", str(REPO / "tests_infra"))
    assert run.ret == 0, run.output
    assert run.results["cluster"]["sim"] is True
    assert run.results["cluster"]["profile"] == "sim"
    assert len(run.outcomes()) == 26
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
    head_ok = run.checks(nodeid="tests_infra/test_link.py::test_link_up[spark-head-twin0]")
    assert head_ok[0]["outcome"] == "passed"
