"""N Sparks behind a switch, the whole suite (tests_infra + tests_e2e) on a full serving
stack: three sparksim nodes behind the sim's switch, serve args that make every node a rank
(TP 1 x PP 3). The rows are docs/FAULT_MATRIX.md's "N Sparks behind a switch" table, held
to the matrix's rules (``faultmatrix.check_row``); the rows run side by side, each on a
three-node sim of its own."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from faultmatrix import (  # type: ignore[import-not-found]
    MATRIX,
    OBSERVED,
    TRIM,
    Matrix,
    Row,
    check_row,
    parse_matrix,
    summary,
)

from conftest import (  # type: ignore[import-not-found]
    SUITE_SIM_ARGS,
    SuiteRun,
    _missing,
    launch_args,
    node_ssh,
    run_suite,
)
from pytest_spark.access.simcontrol import SimCluster, sim_up

pytestmark = pytest.mark.sim
TABLE = "## N Sparks behind a switch"
ROWS = parse_matrix(MATRIX.read_text(), TABLE)
NAMES = ("spark-head", "spark-worker-1", "spark-worker-2")
SWITCH_SIM_ARGS = ("--topology", "switch", *SUITE_SIM_ARGS)
PROFILE = "sim-switch"
LINK = "tests_infra/test_links.py::"
NCCL = "tests_infra/test_nccl.py::"
READINESS = "tests_e2e/test_readiness.py::"
BASELINE_SKIPS: dict[str, set[str]] = {}


def switch_sim() -> SimCluster:
    return sim_up(len(NAMES), SWITCH_SIM_ARGS)


@pytest.fixture(scope="module")
def switch_matrix(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Matrix]:
    """The rows this session selected, all at once, each on a three-node switch sim."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    selected = [
        item.callspec.params["row"]
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.module is request.module
        and item.originalname == "test_switch_row"
    ]
    first = switch_sim()
    try:
        runner = Matrix(
            first, selected, len(selected), tmp_path_factory, new_sim=switch_sim, profile=PROFILE
        )
        try:
            yield runner
        finally:
            runner.close()
    finally:
        first.down()


def test_the_table_says_every_row_serves_on_every_node() -> None:
    assert [r.fails for r in ROWS[:1]] == [()], "the healthy row first: the others' baseline"
    for row in ROWS:
        args = f"{row.drop_args} -> {row.serve_args}"
        assert row.serve_args == "--tensor-parallel-size 1 --pipeline-parallel-size 3", args
        assert row.drop_args == "--tensor-parallel-size 2", args  # the sim's TP 2 line
        assert row.mode == "ray"  # ray status is held to the serve args' ranks


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_switch_row(switch_matrix: Matrix, row: Row) -> None:
    run = switch_matrix.result(row)
    OBSERVED.mkdir(exist_ok=True)
    (OBSERVED / f"switch-{row.id}.json").write_text(json.dumps(summary(run), indent=1))
    check_row(row, run, BASELINE_SKIPS)
    PROOFS[row.id](run)


def _checks(run: SuiteRun, prefix: str) -> dict[str, dict[str, Any]]:
    return {
        c["nodeid"].removeprefix(prefix): c
        for c in run.results["checks"]
        if c["nodeid"].startswith(prefix)
    }


def _in_place_algbw(point: dict[str, Any]) -> float:
    """algbw in GB/s of a point's in-place run, from its size and time (the series rounds
    the bandwidths to 0.01 GB/s; ``time_us`` is the in-place time)."""
    return float(point["size_bytes"] / point["time_us"] / 1e3)


def prove_every_rank(run: SuiteRun) -> None:
    """Healthy: every node in the suite's figures. The ping matrix covers every pair of
    both twins; the collective ran on three ranks, its busbw algbw x nccl-tests' factor
    for 3 ranks; readiness held Ray to the serve args' 3 ranks on 3 nodes."""
    assert [n["name"] for n in run.results["cluster"]["nodes"]] == list(NAMES)
    links = _checks(run, LINK)
    assert len(links) == 11 * len(NAMES) + 4, sorted(links)  # per node 1 + 2 twins x 5
    pairs: dict[str, set[frozenset[str]]] = {"twin0": set(), "twin1": set()}
    for name, check in links.items():
        found = re.fullmatch(r"test_ping_peer_at_full_mtu\[(.+)-(twin\d)\]", name)
        if found:
            peers = re.search(r"answered by every peer \(([^)]*)\)", check["message"])
            assert peers, check["message"]
            node, twin = found.groups()
            pairs[twin] |= {frozenset((node, peer)) for peer in peers.group(1).split(", ")}
    every = {frozenset((a, b)) for a in NAMES for b in NAMES if a != b}
    assert pairs == {"twin0": every, "twin1": every}, pairs

    nccl = _checks(run, NCCL)
    ranks = " <-> ".join(NAMES)
    for name, factor in (("test_allreduce_busbw", 4 / 3), ("test_allgather_busbw", 2 / 3)):
        check = nccl[name]
        assert check["node"] == ranks, check
        points = check["extra"]["busbw_series"]["points"]
        assert points and all(p["wrong"] == 0 for p in points), points
        for point in points:  # 2 ranks: x1 and x1/2; 4 ranks: x3/2 and x3/4
            busbw = _in_place_algbw(point) * factor
            assert point["ip_busbw_gbps"] == pytest.approx(busbw, abs=0.006), (name, point)

    readiness = _checks(run, READINESS)
    ray = readiness["test_ray_reports_every_node_and_gpu"]
    assert ray["measured"] == ray["expected"] == {"nodes": 3, "gpus": 3.0}, ray
    for node in NAMES:
        container = readiness[f"test_serving_container_running[{node}]"]
        assert container["outcome"] == "passed", container
    serving = run.results["serving"]
    assert serving["status"] == "ready" and serving["mode"] == "ray", serving


def prove_switch_port(run: SuiteRun) -> None:
    """The one failure is the ping check of the node behind the port, naming its pairs and
    the switch port; the other node that lost a ping to it skips citing it; the nodes'
    own MTUs agree; the NCCL twin and serving are untouched."""
    links = _checks(run, LINK)
    failed = [n for n, c in links.items() if c["outcome"] == "failed"]
    assert failed == ["test_ping_peer_at_full_mtu[spark-worker-2-twin0]"], failed
    message = links[failed[0]]["message"]
    assert message.startswith(
        "spark-worker-2 enP2p1s0f1np1: DF pings at full MTU failed on 2 of 2 pair(s) ("
    ), message
    for peer in NAMES[:2]:
        assert f"spark-worker-2 <-> {peer}" in message, message
    assert "goes through spark-worker-2" in message and "switch port" in message, message
    cited = f"{failed[0]} has the evidence"
    skipped = {n: c["message"] for n, c in links.items() if c["outcome"] == "skipped"}
    assert skipped and all(cited in reason for reason in skipped.values()), skipped
    for twin in ("twin0", "twin1"):
        assert links[f"test_mtu_consistent[{twin}]"]["outcome"] == "passed"
    assert all(c["outcome"] == "passed" for c in _checks(run, NCCL).values())
    ray = _checks(run, READINESS)["test_ray_reports_every_node_and_gpu"]
    assert ray["outcome"] == "passed" and ray["measured"] == {"nodes": 3, "gpus": 3.0}, ray


PROOFS: dict[str, Callable[[SuiteRun], None]] = {
    "healthy-tp-1-x-pp-3-on-3-nodes": prove_every_rank,
    "switch-port-of-one-node-at-mtu-1500": prove_switch_port,
}


def test_every_row_has_its_proof() -> None:
    assert set(PROOFS) == {row.id for row in ROWS}


TRIMMED_NOTE = (
    "Note: Command requires 2 node(s) (tp=2 * pp=1 * dp=1); using 2 of 3 configured node(s)."
)


def test_trimmed_node_is_idle_by_design(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Three nodes at TP 2: launch-cluster.sh keeps the head and spark-worker-1 and prints
    its Note line (fixtures/launcher/trim-note.txt); spark-worker-2 gets no container, by
    design. One launch run (readiness, preflight and the all-reduce: the categories that
    look for a rank on every node), kept, then one attach run of readiness without serve
    args (the head's `vllm serve` process says --nnodes 2): both healthy, the idle node
    reported, never failed, no NCCL rank expected there."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    sim = switch_sim()
    launch = sim.info["launch"]
    try:
        assert "--tensor-parallel-size 2" in launch["serve_args"], launch
        run = run_suite(
            tmp_path_factory.mktemp("trim-launch"),
            "tests_infra",
            "tests_e2e",
            *TRIM,
            "-m",
            "readiness or preflight or nccl",
            *launch_args(sim),
            "--spark-keep",
            "--spark-ray=off",
            sim=sim,
            timeout=900,
            profile=PROFILE,
        )
        assert run.ret == 0 and not run.failed(), run.output[-4000:]
        assert run.results["serving"]["idle_nodes"] == ["spark-worker-2"], run.results["serving"]
        assert TRIMMED_NOTE in run.results["serving"]["idle_because"], run.results["serving"]
        _assert_idle(run, "spark-worker-2")
        nccl = _checks(run, NCCL)["test_allreduce_busbw"]
        assert nccl["outcome"] == "passed" and nccl["node"] == "spark-head <-> spark-worker-1"
        attach = run_suite(
            tmp_path_factory.mktemp("trim-attach"),
            "tests_e2e/test_readiness.py",
            "--spark-history=off",
            f"--spark-container={launch['container']}",
            sim=sim,
            profile=PROFILE,
        )
        assert attach.ret == 0 and not attach.failed(), attach.output[-4000:]
        assert attach.results["serving"]["idle_nodes"] == ["spark-worker-2"], attach.results
        _assert_idle(attach, "spark-worker-2")
    finally:
        try:
            fabric = ",".join(f"198.19.0.{i + 1}" for i in range(len(NAMES)))
            node_ssh(sim, sim.head, f"{launch['script']} -n {fabric} stop", timeout=120)
        finally:
            sim.down()


def _assert_idle(run: SuiteRun, node: str) -> None:
    """The idle node's container check skips, saying idle by design; no check fails it."""
    readiness = _checks(run, READINESS)
    idle = readiness[f"test_serving_container_running[{node}]"]
    assert idle["outcome"] == "skipped" and "idle by design" in idle["message"], idle
    for name in NAMES[:2]:
        assert readiness[f"test_serving_container_running[{name}]"]["outcome"] == "passed"
