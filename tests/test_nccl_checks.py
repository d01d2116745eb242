"""Collective checks: pass/fail boundaries, diagnoses and messages (STYLE.md)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_spark.infra.nccl.check import (
    busbw_series,
    check_busbw,
    check_collective,
    check_ib_hca,
    check_init_hang,
    check_transport,
    check_wrong_values,
)
from pytest_spark.infra.nccl.parse import NcclOutput, parse_nccl_tests
from pytest_spark.infra.nccl.probe import CollectiveRun, RankOutput
from pytest_spark.infra.nccl.scripts.table_probe import header_lines, row_line
from pytest_spark.settings.profiles import load_profile

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nccl"
SPARK = load_profile("dgx-spark-2node")
SIM = load_profile("sim")


def fixture(name: str) -> NcclOutput:
    return parse_nccl_tests((FIXTURES / name).read_text())


def output_with_busbw(busbw: float, size: int = 1 << 30) -> NcclOutput:
    """A one-row nccl-tests table whose largest-size busbw prints as ``busbw`` (n = 2)."""
    seconds = size / (busbw * 1e9)
    return parse_nccl_tests(
        "\n".join(
            [*header_lines(), row_line(size, size // 4, [(seconds * 1.01, 0), (seconds, 0)], 2)]
        )
    )


def test_profiles_carry_the_nccl_thresholds() -> None:
    assert SPARK.nccl.min_busbw_gbps == 21.875
    assert SPARK.nccl.one_twin_busbw_gbps == 13.5
    assert SPARK.nccl.socket_busbw_gbps == 3.0
    assert SIM.nccl.min_busbw_gbps == 0.09


@pytest.mark.parametrize(("busbw", "level"), [(21.88, "pass"), (21.87, "fail"), (23.2, "pass")])
def test_busbw_boundary(busbw: float, level: str) -> None:
    finding = check_busbw(output_with_busbw(busbw), SPARK, where="spark-head <-> spark-worker-1")
    assert finding.level == level
    assert finding.measured == busbw and finding.expected == 21.875 and finding.unit == "GB/s"
    assert finding.message.startswith(
        f"spark-head <-> spark-worker-1: all-reduce busbw {busbw:.2f} GB/s at 1 GiB "
        "(nccl-tests), expected >= 21.875 GB/s"
    )


def test_busbw_reads_the_largest_size_best_placement() -> None:
    out = fixture("all_reduce_sweep_healthy.txt")
    finding = check_busbw(out, SPARK)
    assert finding.measured == 23.20  # in-place at 1 GiB, not the 23.09 out-of-place


def test_one_twin_diagnosis() -> None:
    finding = check_busbw(fixture("all_reduce_one_twin.txt"), SPARK)
    assert finding.level == "fail" and finding.measured == 13.51
    assert (
        "one twin only: check NCCL_IB_HCA lists both rocep1s0f1,roceP2p1s0f1 and both "
        "are Up" in finding.message
    )
    assert "100G" in finding.message
    assert "busbw series" in finding.evidence


def test_socket_diagnosis() -> None:
    finding = check_busbw(fixture("all_reduce_socket_fallback.txt"), SPARK)
    assert finding.level == "fail" and finding.measured == 2.96
    assert "TCP socket fallback or NCCL built without IB" in finding.message


@pytest.mark.parametrize(
    ("busbw", "diagnosis"),
    [
        (4.8, "socket"),
        (4.81, "unknown"),
        (9.4, "unknown"),
        (9.45, "one twin"),
        (13.5, "one twin"),
        (17.55, "one twin"),
        (17.56, "unknown"),
        (21.0, "unknown"),
    ],
)
def test_diagnosis_bands(busbw: float, diagnosis: str) -> None:
    """Socket: up to 1.6x 3 GB/s; one twin: 0.7-1.3x 13.5 GB/s; anything else: generic."""
    message = check_busbw(output_with_busbw(busbw), SPARK).message
    assert ("TCP socket fallback or NCCL built without IB" in message) == (diagnosis == "socket")
    assert ("one twin only: check NCCL_IB_HCA" in message) == (diagnosis == "one twin")
    if diagnosis == "unknown":
        assert "Not a known signature (one twin only ~13.5, TCP fallback ~3 GB/s)" in message


def test_sim_scale_healthy_and_link_rate_fault() -> None:
    healthy = check_busbw(output_with_busbw(0.12, 8 << 20), SIM)
    assert healthy.level == "pass"
    assert healthy.message.endswith("expected >= 0.09 GB/s")
    halved = check_busbw(output_with_busbw(0.06, 8 << 20), SIM)  # link-rate 100G -> 0.5 Gbit/s
    assert halved.level == "fail" and "one twin only" in halved.message
    assert "A link negotiated at 100G" in halved.message


def test_no_rows_quotes_what_the_run_said() -> None:
    finding = check_busbw(fixture("all_reduce_nccl_error.txt"), SPARK)
    assert finding.level == "fail" and finding.measured is None
    assert "Test NCCL failure common.cu:1279" in finding.message
    assert "ibv_modify_qp" in finding.message


def test_gloo_results_say_which_tool_measured() -> None:
    finding = check_busbw(fixture("gloo_lo_rank0.txt"), SIM)
    assert "(pytest_spark allreduce over gloo)" in finding.message


def test_transport_healthy() -> None:
    out = fixture("all_reduce_sweep_healthy.txt")
    finding = check_transport(out.transports, where="spark-head <-> spark-worker-1")
    assert finding.level == "pass"
    assert finding.message == (
        "spark-head <-> spark-worker-1: NET/IB on rocep1s0f1,roceP2p1s0f1 on spark-1, spark-2"
    )


def test_transport_socket_is_never_accepted() -> None:
    finding = check_transport(fixture("all_reduce_socket_fallback.txt").transports)
    assert finding.level == "fail" and finding.node == "spark-1"
    assert finding.measured == "NET/Socket on enp1s0f1np1:192.168.200.12"
    assert finding.message.startswith(
        "spark-1: NCCL chose NET/Socket over enp1s0f1np1:192.168.200.12 (TCP fallback"
    )
    assert "expected NET/IB on rocep1s0f1,roceP2p1s0f1" in finding.message
    assert "NCCL_IB_DISABLE=1" in finding.message


def test_transport_one_twin() -> None:
    finding = check_transport(fixture("all_reduce_one_twin.txt").transports)
    assert finding.level == "fail"
    assert "NET/IB on rocep1s0f1 only, missing roceP2p1s0f1" in finding.message


def test_transport_foreign_device_and_no_lines() -> None:
    text = (
        "spark-1:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE ; OOB "
        "enp1s0f1np1:192.168.200.12<0>\n"
    )
    finding = check_transport(parse_nccl_tests(text).transports)
    assert finding.level == "fail" and "mlx5_0, not a fabric device" in finding.message
    empty = check_transport(())
    assert empty.level == "fail" and "NCCL_DEBUG=INFO" in empty.message


def test_transport_predicted_in_gloo_mode_is_labelled() -> None:
    finding = check_transport(fixture("gloo_lo_rank0.txt").transports)
    assert finding.level == "fail"  # lo: the prediction is NET/Socket
    assert "the transport NCCL would select, computed by pytest_spark" in finding.message
    assert "lo is not a fabric interface" in finding.message


def test_transport_bootstrap_over_management_warns() -> None:
    text = (
        "spark-1:1:1 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE "
        "[1]roceP2p1s0f1:1/RoCE ; OOB eth0:10.1.230.180<0>\n"
    )
    finding = check_transport(parse_nccl_tests(text).transports)
    assert finding.level == "warn" and "spark-1:eth0" in finding.message


@pytest.mark.parametrize(
    ("value", "level", "text"),
    [
        ("rocep1s0f1,roceP2p1s0f1", "pass", "selects rocep1s0f1,roceP2p1s0f1"),
        ("roce", "pass", "selects"),
        ("rocep1s0f1", "fail", "NCCL_IB_HCA=rocep1s0f1 leaves out roceP2p1s0f1"),
        ("^roceP2p1s0f1", "fail", "leaves out roceP2p1s0f1"),
        ("=rocep1s0f1:1,roceP2p1s0f1:1", "pass", "selects"),
        (None, "warn", "NCCL_IB_HCA is not set"),
        ("", "warn", "NCCL_IB_HCA is not set"),
    ],
)
def test_ib_hca(value: str | None, level: str, text: str) -> None:
    finding = check_ib_hca(value, node="spark-worker-1")
    assert finding.level == level and finding.node == "spark-worker-1"
    assert finding.message.startswith("spark-worker-1: ") and text in finding.message
    if level == "fail":
        assert "one twin only" in finding.message and "launch-cluster.sh" in finding.message


def test_wrong_values() -> None:
    assert check_wrong_values(fixture("all_reduce_sweep_healthy.txt")).level == "pass"
    bad = check_wrong_values(fixture("all_reduce_wrong_values.txt"), where="c")
    assert bad.level == "fail" and bad.measured == 6291460 and bad.expected == 0
    assert bad.message.startswith(
        "c: all-reduce returned 6291460 wrong elements at 256 MiB, "
        "512 MiB (out of bounds values: 2), expected 0"
    )
    unchecked = parse_nccl_tests(
        "     1048576        262144     float     sum      -1    72.89"
        "   14.39   14.39    N/A    72.53   14.46   14.46    N/A"
    )
    assert check_wrong_values(unchecked).level == "warn"


def test_init_hang_quotes_log_lines() -> None:
    out = fixture("all_reduce_init_hang.txt")
    logs = {"rank 0 (spark-head)": [e.text for e in out.log]}
    finding = check_init_hang(hung=True, timeout_s=300, logs=logs, where="a <-> b")
    assert finding.level == "fail" and finding.measured == "hang at init"
    assert finding.message.startswith(
        "a <-> b: all-reduce hung at initialisation: no result "
        "row within 300 s. This is the NCCL channel-setup hang "
        "that made SGLang multi-node unusable"
    )
    assert "via NET/IB/0" in finding.message  # the last log lines are quoted
    assert check_init_hang(hung=False, timeout_s=1, logs={}).level == "pass"


def rank(node: str, i: int, name: str, rc: int | None = 0) -> RankOutput:
    text = (FIXTURES / name).read_text()
    return RankOutput(node, i, "cmd", rc, text, "", 1.0, rc is None, parse_nccl_tests(text))


def make_run(*ranks: RankOutput, timed_out: bool = False) -> CollectiveRun:
    return CollectiveRun("python", "tok", len(ranks), ranks, ranks[0].parsed, timed_out, 3.0)


def test_check_collective_healthy_run_gives_every_finding() -> None:
    run = make_run(rank("spark-head", 0, "all_reduce_sweep_healthy.txt"))
    findings = check_collective(run, SPARK, ib_hca={"spark-head": "rocep1s0f1,roceP2p1s0f1"})
    assert [f.level for f in findings] == ["pass"] * 4
    assert findings[0].node == "spark-head"


def test_check_collective_init_timeout_run() -> None:
    run = make_run(
        rank("spark-head", 0, "gloo_init_timeout_rank0.txt", rc=3),
        rank("spark-worker-1", 1, "gloo_lo_rank1.txt", rc=3),
    )
    assert run.hung_at_init
    hang, transport = check_collective(run, SIM, timeout_s=3)
    assert hang.level == "fail"
    assert "init timeout: rank 0 of 2 did not complete the rendezvous" in hang.message
    assert "rank 0 (spark-head)" in hang.evidence
    assert transport.level == "fail"


def test_series_for_json() -> None:
    series = busbw_series(fixture("all_reduce_sweep_healthy.txt"))
    data = json.loads(json.dumps(series.to_dict()))
    assert data["largest_busbw_gbps"] == 23.20 and data["unit"] == "GB/s"
    assert len(data["points"]) == 28
    assert data["points"][10] == {
        "size_bytes": 8192,
        "busbw_gbps": 0.30,
        "algbw_gbps": 0.30,
        "oop_busbw_gbps": 0.29,
        "ip_busbw_gbps": 0.30,
        "time_us": 27.51,
        "wrong": 0,
    }


def test_thresholds_come_from_the_profile() -> None:
    strict = SPARK.with_overrides({"nccl.min_busbw_gbps": "25"})
    assert check_busbw(fixture("all_reduce_sweep_healthy.txt"), strict).level == "fail"
    lenient = SPARK.with_overrides({"nccl.min_busbw_gbps": "13"})
    assert check_busbw(fixture("all_reduce_one_twin.txt"), lenient).level == "pass"


def test_check_collective_timed_out_mid_sweep() -> None:
    text = (FIXTURES / "all_reduce_sweep_healthy.txt").read_text()
    cut = text[: text.index("   268435456")]  # killed while measuring 256 MiB
    out = parse_nccl_tests(cut)
    ranks = (RankOutput("spark-head", 0, "cmd", None, cut, "", 300.0, True, out),)
    run = CollectiveRun("nccl-tests", "tok", 2, ranks, out, True, 300.0)
    assert not run.hung_at_init
    first = check_collective(run, SPARK, timeout_s=300)[0]
    assert first.level == "fail" and first.measured == 128 << 20
    assert first.message.startswith(
        "spark-head: all-reduce did not finish within 300 s: largest size measured 128 MiB "
        "(busbw 23.11 GB/s) of 1 GiB asked"
    )


def test_check_collective_unreadable_output() -> None:
    ranks = (RankOutput("spark-head", 0, "cmd", 1, "garbage", "", 1.0, False, None, "bad"),)
    run = CollectiveRun("python", "tok", 1, ranks, None, False, 1.0)
    first = check_collective(run, SPARK)[0]
    assert first.level == "fail" and "could not be read (bad)" in first.message


def test_one_twin_reading_names_the_node_whose_nccl_uses_one_twin() -> None:
    out = fixture("all_reduce_one_twin.txt")
    finding = check_busbw(out, SPARK, transports=out.transports)
    assert finding.level == "fail"
    assert "one twin only on spark-1, spark-2: check NCCL_IB_HCA lists both" in finding.message
    assert "NET/IB : Using [0]rocep1s0f1:1/RoCE" in finding.evidence["NCCL transport lines"]


def test_one_twin_figure_with_both_twins_in_use_is_not_called_a_missing_twin() -> None:
    """Every rank's NCCL on both twins: the figure is a slow link, not a missing twin."""
    both = fixture("all_reduce_sweep_healthy.txt").transports
    finding = check_busbw(output_with_busbw(13.5), SPARK, transports=both)
    assert finding.level == "fail"
    assert "one twin only" not in finding.message
    assert (
        "but every rank's NCCL uses both twins (rocep1s0f1,roceP2p1s0f1), so not a missing "
        "twin: a link negotiated at 100G" in finding.message
    )


def test_a_low_gloo_figure_mentions_the_cpu() -> None:
    gloo = fixture("gloo_lo_rank0.txt")
    assert gloo.backend == "gloo"
    low = check_busbw(gloo, SIM.with_overrides({"nccl.min_busbw_gbps": "1000000"}))
    assert low.level == "fail" and "gloo, which reduces on the CPU" in low.message
    nccl = check_busbw(output_with_busbw(13.5), SPARK)
    assert "reduces on the CPU" not in nccl.message


def test_hang_message_states_the_timeout_that_applied_and_the_down_port() -> None:
    """The ranks' own 60 s init bound ended the run, not the 300 s the run was given."""
    run = dataclasses.replace(
        make_run(
            rank("spark-head", 0, "gloo_init_timeout_rank0.txt", rc=3),
            rank("spark-worker-1", 1, "gloo_lo_rank1.txt", rc=3),
        ),
        init_timeout_s=60.0,
        timeout_s=300.0,
    )
    assert run.hang_timeout_s == 60.0
    hang = check_collective(run, SIM, timeout_s=300)[0]
    assert "no result row within 60 s" in hang.message and "300 s" not in hang.message
    down = "link not usable: spark-worker-1 enp1s0f1np1: link administratively down"
    finding = check_init_hang(hung=True, timeout_s=60, logs={}, down_ports=[down])
    assert f"A fabric port is down ({down})" in finding.message
    silent = dataclasses.replace(run, ranks=(), timed_out=True)
    assert silent.hang_timeout_s == 300.0  # no rank said so: the whole run's bound ended it


# -------------------------------------------------- the all-reduce could not run at all

NO_LAUNCHER = (
    "no all-reduce launcher works on every node: need nccl-tests' all_reduce_perf with "
    "mpirun, or python3 with torch on the host or inside container vllm_node. Found: ..."
)


def _unavailable(states: dict[str, str], *, owner_here: bool = False, **kw: bool) -> tuple:
    from pytest_spark.infra.nccl.check import allreduce_unavailable

    options = {"container_verdict": True, "owner_in_session": True} | kw
    return allreduce_unavailable(NO_LAUNCHER, states, "vllm_node", owner_here=owner_here, **options)


def test_a_worker_without_its_serving_container_is_the_container_checks_failure() -> None:
    """Issue #25 part 4: a worker's serving container stopped took torch with it; the 8
    NCCL checks errored with node null instead of skipping citing the container check."""
    states = {"spark-head": "running", "spark-worker-1": "exited"}
    for owner_here in (True, False):
        fail, text = _unavailable(states, owner_here=owner_here)
        assert not fail
        assert "test_serving_container_running[spark-worker-1]" in text
        assert "'vllm_node' exited" in text and "spark-head" not in text
    fail, text = _unavailable({"spark-head": "running", "spark-worker-1": ""})
    assert not fail and "'vllm_node' missing" in text


def test_no_launcher_anywhere_is_one_failure_the_others_cite() -> None:
    """No torch on any node and no nccl-tests (no container either): the launch verdict
    fails once, every other NCCL check skips citing it."""
    for states in ({"spark-head": "", "spark-worker-1": ""}, {"spark-head": "running"}):
        fail, text = _unavailable(states, owner_here=True)
        assert fail and text.startswith("all-reduce could not run: no all-reduce launcher")
        fail, text = _unavailable(states)
        assert not fail
        assert "(test_allreduce_does_not_hang_at_init has the evidence)" in text
    # the container verdict not selected: the launch verdict keeps its own failure
    fail, _ = _unavailable(
        {"spark-head": "running", "spark-worker-1": "exited"},
        owner_here=True,
        container_verdict=False,
    )
    assert fail
    # the launch verdict not selected (-k busbw): each check reports it itself
    fail, _ = _unavailable({"spark-head": ""}, owner_in_session=False)
    assert fail
