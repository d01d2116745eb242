"""nccl-tests / NCCL log parser on the recorded outputs in fixtures/nccl (exact values)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_spark.infra.nccl.parse import (
    IbDevice,
    ParseError,
    SocketIface,
    Timing,
    parse_ib_hca,
    parse_nccl_tests,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nccl"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_reference_16g_row_verbatim() -> None:
    out = parse_nccl_tests(fixture("all_gather_16g_spark.txt"))
    assert len(out.rows) == 1
    row = out.rows[0]
    assert (row.size_bytes, row.count, row.dtype, row.redop, row.root) == (
        17179869184,
        2147483648,
        "float",
        "none",
        -1,
    )
    assert row.out_of_place == Timing(374425.0, 45.88, 22.94, 0)
    assert row.in_place == Timing(373792.0, 45.96, 22.98, 0)
    assert row.busbw_gbps == 22.98
    assert row.algbw_gbps == 45.96
    assert out.avg_busbw_gbps == 22.9611
    assert out.out_of_bounds == 0
    assert out.params["maxBytes"] == 17179869184
    assert out.params["iters"] == 20 and out.params["warmup_iters"] == 5
    assert [(d.rank, d.host, d.name) for d in out.devices] == [
        (0, "spark-1", "NVIDIA GB10"),
        (1, "spark-2", "NVIDIA GB10"),
    ]
    assert out.tool == "nccl-tests" and out.transports == ()
    assert not out.hung_at_init and out.init_complete


def test_healthy_sweep() -> None:
    out = parse_nccl_tests(fixture("all_reduce_sweep_healthy.txt"))
    assert len(out.rows) == 28
    assert [r.size_bytes for r in out.rows][:3] == [8, 16, 32]
    row8k = next(r for r in out.rows if r.size_bytes == 8192)
    assert row8k.count == 2048 and row8k.redop == "sum"
    assert row8k.out_of_place == Timing(27.82, 0.29, 0.29, 0)
    assert row8k.in_place == Timing(27.51, 0.30, 0.30, 0)
    largest = out.largest
    assert largest is not None and largest.size_bytes == 1 << 30
    assert largest.out_of_place == Timing(46509.8, 23.09, 23.09, 0)
    assert largest.in_place == Timing(46277.3, 23.20, 23.20, 0)
    assert largest.busbw_gbps == 23.20
    assert out.avg_busbw_gbps == 9.28232
    assert out.collective == "all_reduce_perf"
    assert out.nccl_version == "2.27.7+cuda13.0"
    assert out.settings == {
        "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
        "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
    }
    assert [(t.kind, t.host) for t in out.transports] == [("IB", "spark-1"), ("IB", "spark-2")]
    ib = out.transports[0]
    assert ib.ib_devices == (
        IbDevice(0, "rocep1s0f1", 1, "RoCE"),
        IbDevice(1, "roceP2p1s0f1", 1, "RoCE"),
    )
    assert ib.oob == SocketIface("enp1s0f1np1", "192.168.200.12")
    assert ib.devices == ("rocep1s0f1", "roceP2p1s0f1")
    assert not ib.predicted
    assert out.networks == (("spark-1", "IB"), ("spark-2", "IB"))
    assert out.channel_nets == ("IB",)
    assert out.warnings == () and out.errors == ()
    series = out.series()
    assert series[-1]["size_bytes"] == 1 << 30 and series[-1]["busbw_gbps"] == 23.20
    assert series[-1]["oop_busbw_gbps"] == 23.09


def test_socket_fallback() -> None:
    out = parse_nccl_tests(fixture("all_reduce_socket_fallback.txt"))
    assert {t.kind for t in out.transports} == {"Socket"}
    sock = out.transports[1]
    assert sock.host == "spark-2"
    assert sock.socket_ifaces == (SocketIface("enp1s0f1np1", "192.168.200.13"),)
    assert sock.devices == ("enp1s0f1np1",)
    assert out.channel_nets == ("Socket",)
    assert out.largest is not None and out.largest.busbw_gbps == 2.96
    assert out.avg_busbw_gbps == 2.87455


def test_one_twin() -> None:
    out = parse_nccl_tests(fixture("all_reduce_one_twin.txt"))
    assert [t.devices for t in out.transports] == [("rocep1s0f1",), ("rocep1s0f1",)]
    assert out.settings["NCCL_IB_HCA"] == "rocep1s0f1"
    assert out.largest is not None and out.largest.busbw_gbps == 13.51


def test_wrong_values() -> None:
    out = parse_nccl_tests(fixture("all_reduce_wrong_values.txt"))
    assert out.out_of_bounds == 2
    bad = [(r.size_bytes, r.wrong) for r in out.rows if r.wrong]
    # nccl-tests prints #wrong with %6g: 1048576 shows as 1.04858e+06
    assert bad == [(1 << 28, 2 * 1048580), (1 << 29, 2 * 2097150)]
    assert out.wrong == 6291460


def test_init_hang_has_log_and_no_rows() -> None:
    out = parse_nccl_tests(fixture("all_reduce_init_hang.txt"))
    assert out.rows == () and out.avg_busbw_gbps is None
    assert out.hung_at_init and not out.init_complete
    assert out.log[-1].message == "Channel 00/0 : 0[0] -> 1[0] [receive] via NET/IB/0"
    assert out.log[-1].host == "spark-2" and out.log[-1].pid == 38810


def test_nccl_error_lines() -> None:
    out = parse_nccl_tests(fixture("all_reduce_nccl_error.txt"))
    assert len(out.warnings) == 1
    warn = next(entry for entry in out.log if entry.level == "WARN")
    assert warn.source == "misc/ibvwrap.cc:190"
    assert warn.message.startswith("Call to ibv_modify_qp failed with 110")
    assert out.errors == (
        "spark-1: Test NCCL failure common.cu:1279 'unhandled system error (run with "
        "NCCL_DEBUG=INFO for details) / '",
        ".. spark-1 pid 41352: Test failure common.cu:1100",
    )
    assert not out.hung_at_init  # an error, not a hang


def test_script_output_gloo() -> None:
    out = parse_nccl_tests(fixture("gloo_lo_rank0.txt"))
    assert out.tool == "pytest_spark allreduce" and out.backend == "gloo"
    assert [r.size_bytes for r in out.rows] == [1048576, 2097152, 4194304]
    assert out.rows[0].out_of_place == Timing(8558.18, 0.12, 0.12, 0)
    assert out.largest is not None and out.largest.in_place.busbw_gbps == 0.23
    assert out.avg_busbw_gbps == 0.144342
    assert out.out_of_bounds == 0
    (t,) = out.transports
    assert t.predicted and t.kind == "Socket"
    assert t.socket_ifaces == (SocketIface("lo", "127.0.0.1"),)
    assert [d.name for d in out.devices] == ["CPU (gloo over TCP)"] * 2
    assert out.init_complete and not out.hung_at_init


def test_script_output_other_rank_has_log_only() -> None:
    out = parse_nccl_tests(fixture("gloo_lo_rank1.txt"))
    assert out.rows == () and out.backend == "gloo" and out.init_complete
    assert out.transports[0].predicted


def test_script_init_timeout() -> None:
    out = parse_nccl_tests(fixture("gloo_init_timeout_rank0.txt"))
    assert out.rows == ()
    assert out.init_timeout is not None and "within 3 s" in out.init_timeout
    assert out.hung_at_init


ROW = "     1048576        262144     float     sum      -1"


@pytest.mark.parametrize(
    ("rest", "oop", "ip"),
    [
        (
            "    72.89   14.39   14.39    N/A    72.53   14.46   14.46    N/A",
            Timing(72.89, 14.39, 14.39, None),
            Timing(72.53, 14.46, 14.46, None),
        ),
        (
            "                                    72.53   14.46   14.46       0",
            None,
            Timing(72.53, 14.46, 14.46, 0),
        ),
        (
            "  1.2e+07    0.09    0.09       0  1.1e+07    0.10    0.10       0  "
            "2025-06-01 12:00:00",
            Timing(1.2e7, 0.09, 0.09, 0),
            Timing(1.1e7, 0.10, 0.10, 0),
        ),
    ],
    ids=["no-check", "in-place-only", "exponent-and-timestamp"],
)
def test_row_variants(rest: str, oop: Timing | None, ip: Timing) -> None:
    (row,) = parse_nccl_tests(ROW + rest).rows
    assert row.out_of_place == oop and row.in_place == ip


def test_mpirun_tag_output_prefix() -> None:
    text = (
        "[1,0]<stdout>:" + ROW + "    72.89   14.39   14.39      0    72.53   14.46   14.46"
        "      0\n[1,1]<stdout>:spark-2:9:9 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE"
        " ; OOB enp1s0f1np1:10.0.0.2<0>\n"
    )
    out = parse_nccl_tests(text)
    assert len(out.rows) == 1 and out.transports[0].host == "spark-2"
    assert out.transports[0].devices == ("rocep1s0f1",)


def test_older_nccl_formats() -> None:
    text = (
        "#   Rank  0 Pid   1115 on host0 device  0 [0x3b] Tesla V100-PCIE-32GB\n"
        "host0:20:289 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.11.1<0>\n"
        "host0:20:289 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 0.\n"
        "host0:22:295 [2] NCCL INFO NET/Socket : Using [0]ib0:192.168.11.1<0> "
        "[1]eth0:10.0.0.1<0>\n"
    )
    out = parse_nccl_tests(text)
    assert out.devices[0].host == "host0" and out.devices[0].bus_id == "0x3b"
    assert out.settings == {"NCCL_IB_DISABLE": "0"}
    assert out.transports[0].ib_devices == (IbDevice(0, "mlx5_0", 1, "IB"),)
    assert out.transports[1].devices == ("ib0", "eth0")


def test_incomplete_last_row_is_an_error_not_a_crash() -> None:
    out = parse_nccl_tests(ROW + "\n")
    assert out.rows == ()
    assert out.errors and "incomplete result row" in out.errors[0]


@pytest.mark.parametrize("text", ["", "hello world\nthis is not nccl\n", "\n\n   \n"])
def test_garbage_raises(text: str) -> None:
    with pytest.raises(ParseError, match="nccl-tests"):
        parse_nccl_tests(text)


@pytest.mark.parametrize(
    "rest", ["  12.0  0.1  0.1", "  abc  0.1  0.1  0  12.0  0.1  0.1  0"], ids=["3-cols", "nan"]
)
def test_malformed_row_raises_with_line(rest: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_nccl_tests(ROW + rest)
    assert info.value.lineno == 1 and info.value.line is not None


@pytest.mark.parametrize(
    ("value", "dev", "selected"),
    [
        ("rocep1s0f1,roceP2p1s0f1", "roceP2p1s0f1", True),
        ("rocep1s0f1", "roceP2p1s0f1", False),
        ("roce", "roceP2p1s0f1", True),  # NCCL matches prefixes
        ("=roce", "roceP2p1s0f1", False),  # '=': exact names only
        ("^rocep1s0f1", "roceP2p1s0f1", True),  # '^': exclusion list
        ("^rocep1s0f1", "rocep1s0f1", False),
        ("rocep1s0f1:1,roceP2p1s0f1:2", "roceP2p1s0f1", False),  # port 1 is the one used
        ("", "anything", True),
    ],
)
def test_ib_hca_semantics(value: str, dev: str, selected: bool) -> None:
    assert parse_ib_hca(value).selects(dev, 1) is selected


def test_ib_hca_bad_port() -> None:
    with pytest.raises(ParseError, match="NCCL_IB_HCA"):
        parse_ib_hca("rocep1s0f1:x")
