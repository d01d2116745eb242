"""The fault matrix: the whole suite against sparksim once per fault, verdicts asserted from
the JSON results. Generated from the table in docs/FAULT_MATRIX.md (the rules are there)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from faultmatrix import (  # type: ignore[import-not-found]
    AUDITS,
    COLUMNS,
    LANES,
    MATRIX,
    OBSERVED,
    RUNS,
    Matrix,
    Row,
    check_row,
    load_failure_row,
    parse_matrix,
    readiness_launch_row,
    summary,
)
from nodeaudit import describe  # type: ignore[import-not-found]

from conftest import (  # type: ignore[import-not-found]
    SuiteRun,
    assert_one_failure_the_rest_point_at_it,
)
from pytest_spark.access.simcontrol import SimCluster

pytestmark = pytest.mark.sim
ROWS = parse_matrix(MATRIX.read_text())

# Every row as the table says (launch rows with Ray), then the readiness launch rows
# again without Ray (the real launcher's default: --nnodes ranks, no `ray status`).
CASES = ROWS + [replace(row, mode="no-ray") for row in ROWS if readiness_launch_row(row)]


def test_matrix_covers_every_fault_the_issue_lists() -> None:
    """The table is the source of the test; a fault dropped from it is a failure here."""
    kinds = {" ".join(a[:2]) if a[0] == "engine" else a[0] for r in ROWS for a in r.inject}
    for must in (
        "link-down",
        "link-rate",
        "mtu",
        "unreachable",
        "engine crash-oom",
        "engine crash-free-memory",
        "engine crash-nccl",
        "engine hang-placement-group",
        "engine hang-silent",
        "worker-kill",
        "nccl-socket",
        "stale-container",
        "engine think-in-content",
        "engine tool-in-content",
        "engine tool-args-unstreamed",
        "engine slow-decode",
        "engine http-5xx",
        "engine malformed-sse",
        "engine truncated-stream",
        "engine invalid-json-body",
    ):
        assert must in kinds, must
    assert any("--api-key" in r.serve_args for r in ROWS)
    # the heavy modes run only by option: a row of each, with the fault only it catches
    assert any(o.startswith("--spark-soak=") for r in ROWS if r.fails for o in r.options)
    assert any("--spark-open-loop" in r.options for r in ROWS if r.fails)
    assert {r.run for r in ROWS if not r.fails and not r.inject} == set(RUNS)


def test_matrix_parser_rejects_what_it_cannot_hold_to() -> None:
    head = "## Matrix\n\n| " + " | ".join(COLUMNS) + " |\n|---|---|---|---|---|---|---|---|\n"
    good = (
        "| x | engine http-5xx | serving | readiness tool_calls over=1 | - | tool_calls: 500 "
        "| 500 | test_health test_tool_call[auto-plain] |\n"
    )
    (row,) = parse_matrix(head + good)
    assert row.inject == (("engine", "http-5xx"),) and row.fails == ("readiness", "tool_calls")
    assert row.checks == ("test_health", "test_tool_call[auto-plain]")
    assert row.says == {"tool_calls": "500"} and row.node is None and row.id == "x"
    assert row.causes == 1 and row.over == 1  # one root cause unless the row says more
    maybe = good.replace("tool_calls over=1 |", "tool_calls? |", 1)
    (row,) = parse_matrix(head + maybe.replace(" test_tool_call[auto-plain]", "", 1))
    assert row.fails == ("readiness",) and row.may_fail == ("tool_calls",)
    assert (row.causes, row.over) == (1, 0)
    (row,) = parse_matrix(head + good.replace("over=1", "causes=2 over=3", 1))
    assert row.fails == ("readiness", "tool_calls") and (row.causes, row.over) == (2, 3)
    dropped = good.replace("engine http-5xx", "-serve-args --reasoning-parser qwen3", 1)
    (row,) = parse_matrix(head + dropped)
    assert row.drop_args == "--reasoning-parser qwen3" and not row.inject
    soak = "engine heat-throttle; +opt --spark-soak=8s --spark-threshold=soak.window_s=2"
    (row,) = parse_matrix(head + good.replace("engine http-5xx", soak, 1))
    assert row.inject == (("engine", "heat-throttle"),)
    assert row.options == ("--spark-soak=8s", "--spark-threshold=soak.window_s=2")
    assert row.only == ()
    only = "engine http-5xx; +only readiness tool_calls"
    (row,) = parse_matrix(head + good.replace("engine http-5xx", only, 1))
    assert row.only == ("readiness", "tool_calls") and row.inject == (("engine", "http-5xx"),)
    served = "engine http-5xx; +only served"
    (row,) = parse_matrix(head + good.replace("engine http-5xx", served, 1))
    assert "readiness" in row.only and "tool_calls" in row.only and "context" in row.only
    assert not {"link", "nccl", "preflight"} & set(row.only)
    for bad in (
        "| x | - | serving | - | - | - | - |\n",  # a cell missing
        "| x | - | somewhere | - | - | - | - | - |\n",  # unknown run
        "| x | - | launch | links | - | - | - | test_x |\n",  # unknown category
        "| x | - | launch | link | - | nccl: slow | - | test_x |\n",  # says: not failing
        "| x | - | launch | link nccls? | - | - | - | test_x |\n",  # unknown optional category
        "| x | - | launch | link causes=x | - | - | - | test_x |\n",  # a count that is no number
        "| x | - | launch | link roots=1 | - | - | - | test_x |\n",  # an unknown count
        "| x | - | launch | link nccl causes=1 | - | - | - | test_x |\n",  # 2 categories, 1 failure
        "| x | +opt soak=8s | launch | link | - | - | - | test_x |\n",  # +opt: suite options only
        "| x | +only nccl | launch | link | - | - | - | test_x |\n",  # +only leaves its failure out
        "| x | +only links | launch | link | - | - | - | test_x |\n",  # +only: unknown category
        "| x | - | launch | link | - | - | - | - |\n",  # a failing row names no check
        "| x | - | launch | - | - | - | - | test_x |\n",  # a healthy row names a check
        "| x | - | launch | link | - | - | - | link_rate |\n",  # a check is a test_ function
        "| x | - | launch | link | - | - | - | test_x test_y |\n",  # 2 checks, 1 failure
    ):
        with pytest.raises(ValueError):
            parse_matrix(head + bad)


def test_a_row_holds_its_check_not_only_its_category() -> None:
    """Issue 36 §7: a row passed on its category, count, words and node; another check of
    the same category failing the same way passed it too. It names the check that fails."""
    head = "## Matrix\n\n| " + " | ".join(COLUMNS) + " |\n|---|---|---|---|---|---|---|---|\n"
    line = (
        "| x | +only link | launch | link | spark-worker-1 | 100 Gb/s | 100G | test_link_rate |\n"
    )
    (row,) = parse_matrix(head + line)

    def run(failed: str) -> SuiteRun:
        def check(name: str, outcome: str, message: str) -> dict[str, Any]:
            nodeid = f"tests_infra/test_links.py::{name}"
            return {
                **{"nodeid": nodeid, "category": "link", "node": "spark-worker-1"},
                **{"outcome": outcome, "message": message, "crashed": None},
            }

        return SuiteRun(
            1,
            "",
            {
                "checks": [
                    check(failed, "failed", "spark-worker-1 enp1s0f1np1: 100 Gb/s"),
                    check("test_link_up[spark-head-twin0]", "passed", ""),
                    check("test_roce_active[spark-head-twin0]", "skipped", "100G link"),
                ]
            },
        )

    check_row(row, run("test_link_rate[spark-worker-1-twin0]"), {})
    with pytest.raises(AssertionError, match="other than test_link_rate"):
        check_row(row, run("test_mtu[spark-worker-1-twin0]"), {})
    exact = replace(row, checks=("test_link_rate[spark-head-twin0]",))
    with pytest.raises(AssertionError, match=r"other than test_link_rate\[spark-head-twin0\]"):
        check_row(exact, run("test_link_rate[spark-worker-1-twin0]"), {})
    check_row(exact, run("test_link_rate[spark-head-twin0]"), {})
    two = replace(row, checks=("test_link_rate", "test_mtu"), causes=2)
    with pytest.raises(AssertionError, match=r"\['test_mtu'\] did not fail"):
        check_row(two, run("test_link_rate[spark-worker-1-twin0]"), {})


@pytest.fixture(scope="module")
def matrix(
    request: pytest.FixtureRequest, sim: SimCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Matrix]:
    """The rows this session selected (``-k`` picks some), started at the first row's
    test and run on ``FAULT_MATRIX_LANES`` sims (default 3; 1 runs them one by one)."""
    selected = [
        item.callspec.params["row"]
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.module is request.module
        and item.originalname == "test_fault"
    ]
    runner = Matrix(sim, selected, LANES, tmp_path_factory)
    try:
        yield runner
    finally:
        runner.close()


BASELINE_SKIPS: dict[str, set[str]] = {}


@pytest.mark.parametrize("row", CASES, ids=[r.id for r in CASES])
def test_fault(matrix: Matrix, row: Row) -> None:
    run = matrix.result(row)
    OBSERVED.mkdir(exist_ok=True)
    (OBSERVED / f"{row.id}.json").write_text(json.dumps(summary(run), indent=1))
    check_row(row, run, BASELINE_SKIPS)
    prove(row, run)


# Row proofs: what a fault's own suite run once asserted beside the table (the exact checks
# that fail and skip, the figures, the evidence), asserted on the matrix's run of the same
# fault: one whole-suite run per fault, not one more per proof.
LOAD_FAILURE_BUDGET_S = 150.0  # the sim profile's crash, hang and placement budgets, well in
LINK = "tests_infra/test_links.py::"


def prove(row: Row, run: SuiteRun) -> None:
    if run.audit is not None:  # an audited row (AUDITS): nothing left beyond what it may
        assert not run.audit, describe(run.audit)
        assert run.checks(nodeid=BUSBW), run.output  # the all-reduce ran in the containers
    if load_failure_row(row):
        prove_fails_fast_with_evidence(row, run)
    proof = ROW_PROOFS.get(row.id)
    if proof is not None:
        proof(run)


def prove_fails_fast_with_evidence(row: Row, run: SuiteRun) -> None:
    """A load that crashes or hangs is caught by the startup watch, with Ray and without:
    long before the ready timeout, with the signature, a fix and every node's log tail; the
    launch is stopped; test_cluster_serving has the evidence and every serving check skips
    citing it."""
    serving = run.results["serving"]
    assert serving["status"] == "failed" and serving["stopped"] is True, serving
    assert serving["failed_s"] < LOAD_FAILURE_BUDGET_S, serving  # not the 300 s ready timeout
    message = serving["message"]
    assert row.because and row.because in message, message  # the signature
    assert "fix:" in message, message
    assert "--- last" in message, message  # every node's log tail
    assert all(node in message for node in ("spark-head", "spark-worker-1")), message
    assert_one_failure_the_rest_point_at_it(run, "vLLM", where="tests_e2e/")


def _link(run: SuiteRun, outcome: str) -> dict[str, dict[str, Any]]:
    return {
        c["nodeid"].removeprefix(LINK): c
        for c in run.results["checks"]
        if c["nodeid"].startswith(LINK) and c["outcome"] == outcome
    }


def prove_healthy_links(run: SuiteRun) -> None:
    """Every link check passes: 2 nodes x (1 + 2 twins x 5) + 2 twins x 2, at 200 Gb/s."""
    checks = [c for c in run.results["checks"] if c["nodeid"].startswith(LINK)]
    assert len(checks) == 13 * 2 and {c["outcome"] for c in checks} == {"passed"}, checks
    rate = next(c for c in checks if c["nodeid"] == f"{LINK}test_link_rate[spark-head-twin0]")
    assert (rate["measured"], rate["unit"]) == (200.0, "Gb/s"), rate


def prove_link_down(run: SuiteRun) -> None:
    """One root cause, one failure: the admin-down end. Its peer's no-carrier end and the
    twin count skip citing it; the twin's dependents skip pointing at the link-up check."""
    failed = _link(run, "failed")
    assert set(failed) == {"test_link_up[spark-worker-1-twin1]"}, failed
    down = failed["test_link_up[spark-worker-1-twin1]"]["message"]
    assert "spark-worker-1 enp1s0f1np1" in down and "administratively down" in down, down
    assert "ip link set enp1s0f1np1 up" in down, down
    skipped = {name: c["message"] for name, c in _link(run, "skipped").items()}
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


def prove_degraded_rate(run: SuiteRun) -> None:
    """A link has one rate: sparksim's degraded cable reports 100G at both ends, as a real
    one does. The first end's rate check fails, with both figures, the fix and every end
    at that rate (both twins of the QSFP port on both nodes); the three other ends skip
    citing it (issue #25: it failed on both ends)."""
    failed = _link(run, "failed")
    owner = "test_link_rate[spark-head-twin0]"
    assert list(failed) == [owner], failed
    record = failed[owner]
    message = record["message"]
    assert "spark-head enP2p1s0f1np1" in message, message
    assert "100 Gb/s" in message and ">= 200 Gb/s" in message and "cable" in message, message
    assert "one link, one rate: spark-head <-> spark-worker-1" in message, message
    for end in ("spark-head enp1s0f1np1", "spark-worker-1 enP2p1s0f1np1"):
        assert end in message, (end, message)
    assert (record["measured"], record["expected"]) == (100.0, 200.0), record
    skipped = _link(run, "skipped")
    for end in ("spark-head-twin1", "spark-worker-1-twin0", "spark-worker-1-twin1"):
        reason = skipped[f"test_link_rate[{end}]"]["message"]
        assert f"{owner} has the evidence" in reason, reason


def prove_mtu_mismatch(run: SuiteRun) -> None:
    """Each twin's consistency check fails with both nodes' MTUs; the lost full-MTU ping is
    its consequence (skipped citing it); the small-MTU end warns of the RoCE cost."""
    failed = _link(run, "failed")
    assert set(failed) == {"test_mtu_consistent[twin0]", "test_mtu_consistent[twin1]"}, failed
    for record in failed.values():
        assert "spark-head 9000, spark-worker-1 1500" in record["message"], record
    skipped = _link(run, "skipped")
    for twin in ("twin0", "twin1"):
        ping = skipped[f"test_ping_peer_at_full_mtu[spark-head-{twin}]"]["message"]
        assert f"test_mtu_consistent[{twin}] has the evidence" in ping, ping
    warned = _link(run, "passed")["test_mtu[spark-worker-1-twin0]"]
    assert warned["level"] == "warn" and "~5%" in warned["message"], warned
    assert "SparkCheckWarning" in run.output, run.output[-3000:]


BUSBW = "tests_infra/test_nccl.py::test_allreduce_busbw"
SOAK = "tests_e2e/test_soak.py::"


def prove_soak_drift(run: SuiteRun) -> None:
    """The soak's one failure is its drift check, naming the first and the last window and
    the fix; its other checks pass (no errors, no preemptions, no waiting queue); the
    closed-loop checks that ran before and after it all passed (the row's count says so)."""
    checks = {c["nodeid"].removeprefix(SOAK): c for c in run.results["checks"]}
    drift = checks["test_soak_tok_s_steady"]
    assert drift["outcome"] == "failed", drift
    doc = drift["extra"]["soak"]
    windows = doc["window_tok_s"]
    assert len(windows) >= 3 and doc["drift_pct"] < -25, doc
    message = drift["message"]
    assert f"{windows[0]:.1f} -> {windows[-1]:.1f} tok/s" in message, message
    assert "nvidia-smi" in message, message  # the fix: watch the clocks during the load
    for name in (
        "test_soak_no_errors",
        "test_soak_no_preemptions",
        "test_soak_waiting_queue_steady",
    ):
        assert checks[name]["outcome"] == "passed", checks[name]


def prove_knee_cites_goodput(run: SuiteRun) -> None:
    """The open loop ran and its knee fell under the profile's floor (recorded), and the
    check skipped citing the goodput gate, which owns SLOs broken under load."""
    knee = next(c for c in run.results["checks"] if c["nodeid"].endswith("test_open_loop_knee"))
    assert knee["outcome"] == "skipped", knee
    sweep = knee["extra"]["open_loop"]
    assert sweep["knee_req_s"] is None or sweep["knee_req_s"] < 1.0, sweep  # sim: >= 1
    assert "the SLOs already break in the closed loop" in knee["message"], knee


def prove_spec_collapse(run: SuiteRun) -> None:
    """The emulator drafted (its counters under vLLM's names reached the suite, per
    position falling), accepted ~31% and decoded slower than the profile's no-drafting
    figure: test_spec_decode_acceptance names the collapse and its fix; the decode check
    passed (above its floor) with its roofline fraction beside it."""
    checks = {c["nodeid"].split("::", 1)[1]: c for c in run.results["checks"]}
    spec = checks["test_spec_decode_acceptance"]
    assert spec["outcome"] == "failed", spec
    doc = spec["extra"]["spec_decode"]
    assert doc["method"] == "mtp" and doc["num_speculative_tokens"] == 3, doc
    assert 0.2 < doc["acceptance"] < 0.4, doc
    assert doc["per_pos"] == sorted(doc["per_pos"], reverse=True), doc
    assert doc["decode_tok_s_1"] < doc["no_draft_tok_s"], doc
    assert "num_speculative_tokens" in spec["message"], spec["message"]
    decode = checks["test_decode_single_stream"]
    assert decode["outcome"] == "passed", decode
    roofline = decode["extra"]["roofline"]
    assert roofline["active_params_b"] == 10.0 and roofline["nodes"] == 2, roofline
    assert roofline["roofline_tok_s"] == 54.6, roofline


ROW_PROOFS: dict[str, Callable[[SuiteRun], None]] = {
    "healthy-launch": prove_healthy_links,
    "fabric-link-down-twin-enp1s0f1np1": prove_link_down,
    "rate-degraded-100g": prove_degraded_rate,
    "mtu-mismatch": prove_mtu_mismatch,
    "soak-the-gpu-throttles-as-it-heats-under-a-steady-load": prove_soak_drift,
    "open-loop-ttft-grows-with-the-batch-knee-under-its-floor": prove_knee_cites_goodput,
    "speculative-decoding-collapses-drafts-rejected-slower-than-without": prove_spec_collapse,
}


def test_row_proofs_name_rows_of_the_table() -> None:
    """A proof keyed by a row id the table no longer has would never run."""
    ids = {row.id for row in CASES}
    assert set(ROW_PROOFS) <= ids, set(ROW_PROOFS) - ids
    assert set(AUDITS) <= ids, set(AUDITS) - ids  # the node audits ride these rows
    assert sum(load_failure_row(row) for row in CASES) >= 7  # crash x3, hang x2, no-Ray
