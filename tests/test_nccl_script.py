"""The shipped benchmark script: formats, transport prediction, and real 2-rank gloo runs."""

from __future__ import annotations

import ast
import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_spark.infra.nccl.command_probe import SCRIPT_PARTS, script_text
from pytest_spark.infra.nccl.parse import parse_nccl_tests, split_sections
from pytest_spark.infra.nccl.scripts import allreduce_probe as ar
from pytest_spark.infra.nccl.scripts import predict_probe as pp
from pytest_spark.infra.nccl.scripts import table_probe as tp

SCRIPT = Path(ar.__file__)
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(
    not HAS_TORCH,
    reason="torch is not installed: `.venv/bin/pip install torch==2.13.0` (CPU wheel)",
)
FABRIC = {
    "enp1s0f1np1": "198.19.0.1",
    "enP2p1s0f1np1": "198.19.1.1",
    "eth0": "198.18.0.11",
    "lo": "127.0.0.1",
}
TWINS_UP = [
    pp.Hca("rocep1s0f1", 1, "enp1s0f1np1", True),
    pp.Hca("roceP2p1s0f1", 1, "enP2p1s0f1np1", True),
]


def top_imports(text: str) -> set[str]:
    """The top-level names a module imports at module level (absolute imports only)."""
    top = ast.parse(text).body
    imports = {
        alias.name.split(".")[0]
        for node in top
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    return imports | {
        (node.module or "").split(".")[0]
        for node in top
        if isinstance(node, ast.ImportFrom) and not node.level
    }


def test_script_is_shipped_and_standalone() -> None:
    """The program a rank runs is the files of scripts/ bundled, each as it is on disk, the
    last run as __main__; the bundle and every part import the stdlib only at module level
    (torch is imported in run, the parts import one another)."""
    text = script_text()
    tree = ast.parse(text)
    (parts,) = [n.value for n in tree.body if isinstance(n, ast.Assign)]
    bundled = ast.literal_eval(parts)
    assert [file for _, file, _ in bundled] == [f"{name}.py" for name in SCRIPT_PARTS]
    assert [name for name, _, _ in bundled][-1] == "__main__"
    for _, file, body in bundled:
        assert body == (SCRIPT.parent / file).read_text()
        assert top_imports(body) <= set(sys.stdlib_module_names) | {"__future__"}, file
    assert top_imports(text) <= set(sys.stdlib_module_names)
    assert SCRIPT.name == "allreduce_probe.py" and "import torch" in SCRIPT.read_text()


def test_bundle_runs_from_stdin() -> None:
    """As the container launcher runs it (``python3 - ARGS < script``): its parts found in
    the bundle, not beside it; a refusal needs no torch."""
    proc = subprocess.run(
        [sys.executable, "-", "--rank", "0", "--world-size", "2", "--master-addr",
         "127.0.0.1", "--max-bytes", "16G"],
        input=script_text(), capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert proc.returncode == ar.EXIT_USAGE, proc.stderr
    assert "refusing --max-bytes 17179869184: above 4 GiB" in proc.stdout


@pytest.mark.parametrize(
    ("value", "width", "text"),
    [
        (27.82, 7, "  27.82"),
        (374425.0, 7, " 374425"),
        (12345678.0, 7, "1.2e+07"),
        (22.94, 6, " 22.94"),
        (1234.5, 6, "1234.5"),
        (0.0, 6, "  0.00"),
        (45.88, 6, " 45.88"),
    ],
)
def test_float_str_matches_nccl_tests(value: float, width: int, text: str) -> None:
    assert tp.float_str(value, width) == text


def test_row_and_header_round_trip_through_the_parser() -> None:
    row = tp.row_line(1 << 20, 1 << 18, [(72.89e-6, 0), (72.53e-6, 0)], 2)
    assert row == (
        "     1048576        262144     float     sum      -1    72.89   14.39   14.39"
        "       0    72.53   14.46   14.46       0"
    )
    out = parse_nccl_tests("\n".join([*tp.header_lines(), row]))
    assert out.rows[0].in_place.busbw_gbps == 14.46 and out.init_complete


def test_busbw_factor() -> None:
    # all-reduce busbw = algbw * 2(n-1)/n: 1.0 at n=2, 1.5 at n=4
    two = tp.row_line(1 << 30, 1 << 28, [(0.1, 0), (0.1, 0)], 2).split()
    four = tp.row_line(1 << 30, 1 << 28, [(0.1, 0), (0.1, 0)], 4).split()
    assert two[6] == two[7] == "10.74"
    assert (four[6], four[7]) == ("10.74", "16.11")


@pytest.mark.parametrize(
    ("text", "value"), [("1048576", 1 << 20), ("1M", 1 << 20), ("4GiB", 4 << 30), ("8k", 8192)]
)
def test_parse_size(text: str, value: int) -> None:
    assert ar.parse_size(text) == value


def test_sizes_sweep() -> None:
    assert ar.sizes(1 << 20, 1 << 30, 2) == [1 << k for k in range(20, 31)]
    assert ar.sizes(6, 64, 2) == [4, 12, 24, 48]  # whole float32 elements


def test_refuses_above_4gib_before_touching_torch() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--rank",
            "0",
            "--world-size",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--max-bytes",
            "16G",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == ar.EXIT_USAGE
    assert "refusing --max-bytes 17179869184: above 4 GiB" in proc.stdout
    assert "froze DGX Sparks" in proc.stdout


def test_ibdev2netdev_parsing() -> None:
    text = (
        "roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Down)\n"
        "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)\n"
        "rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)\n"
        "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)\n"
    )
    hcas = pp.parse_ibdev2netdev(text)
    assert [(h.dev, h.up) for h in hcas] == [
        ("roceP2p1s0f0", False),
        ("roceP2p1s0f1", True),
        ("rocep1s0f0", False),
        ("rocep1s0f1", True),
    ]


def test_predicted_ib_both_twins() -> None:
    env = {
        "NCCL_SOCKET_IFNAME": "enp1s0f1np1",
        "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
        "NCCL_IB_DISABLE": "0",
    }
    lines = pp.predict_transport(env, TWINS_UP, FABRIC)
    assert (
        "NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE ; OOB "
        "enp1s0f1np1:198.19.0.1<0>" in lines
    )
    assert lines[-1] == "Using network IB"
    assert "Bootstrap : Using enp1s0f1np1:198.19.0.1<0>" in lines


@pytest.mark.parametrize(
    ("env", "hcas", "why"),
    [
        ({"NCCL_IB_DISABLE": "1"}, TWINS_UP, "NCCL_IB_DISABLE set by environment to 1."),
        ({"NCCL_IB_HCA": "mlx5_0"}, TWINS_UP, "NET/IB : No device found."),
        (
            {},
            [pp.Hca(h.dev, h.port, h.netdev, False) for h in TWINS_UP],
            "NET/IB : No device found.",
        ),
        ({}, [], "NET/IB : No device found."),
        ({"NCCL_NET": "Socket"}, TWINS_UP, None),
    ],
    ids=["ib-disabled", "hca-list-misses", "twins-down", "no-hca", "nccl-net-socket"],
)
def test_predicted_socket_fallback(
    env: dict[str, str], hcas: list[pp.Hca], why: str | None
) -> None:
    env = {"NCCL_SOCKET_IFNAME": "enp1s0f1np1", **env}
    lines = pp.predict_transport(env, hcas, FABRIC)
    assert "NET/Socket : Using [0]enp1s0f1np1:198.19.0.1<0>" in lines
    assert lines[-1] == "Using network Socket"
    if why:
        assert why in lines


def test_predicted_one_twin_and_mgmt_oob() -> None:
    env = {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "=rocep1s0f1"}
    lines = pp.predict_transport(env, TWINS_UP, FABRIC)
    assert "NET/IB : Using [0]rocep1s0f1:1/RoCE ; OOB eth0:198.18.0.11<0>" in lines


def test_socket_ifname_default_skips_lo_and_docker() -> None:
    addrs = {"lo": "127.0.0.1", "docker0": "172.17.0.1", "enp1s0f1np1": "198.19.0.1"}
    assert pp.find_socket_ifs({}, addrs) == ["enp1s0f1np1"]
    assert pp.find_socket_ifs({"NCCL_SOCKET_IFNAME": "^enp"}, addrs) == ["lo", "docker0"]


def test_predicted_lines_are_labelled_and_parse_as_predicted(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(pp, "read_hcas", lambda: (TWINS_UP, "ibdev2netdev"))
    monkeypatch.setattr(pp, "interface_addrs", lambda: FABRIC)
    pp.print_predicted_transport({"NCCL_SOCKET_IFNAME": "enp1s0f1np1"})
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("# pytest_spark: transport NCCL would select")
    assert "not a measurement" in text.splitlines()[0]
    out = parse_nccl_tests(text)
    (t,) = out.transports
    assert t.predicted and t.kind == "IB" and t.devices == ("rocep1s0f1", "roceP2p1s0f1")


def test_interface_addrs_sees_loopback() -> None:
    assert pp.interface_addrs().get("lo") == "127.0.0.1"


# ---------------------------------------------------------------------- real gloo runs


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_argv(rank: int, port: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(SCRIPT),
        "--rank",
        str(rank),
        "--world-size",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "--min-bytes",
        "1M",
        "--max-bytes",
        "4M",
        "--iters",
        "3",
        "--warmup",
        "1",
        *extra,
    ]


def local_env() -> dict[str, str]:
    return {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "NCCL_SOCKET_IFNAME": "lo",
        "NCCL_DEBUG": "INFO",
        "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1",
    }


@pytest.mark.slow
@needs_torch
def test_two_rank_gloo_run_on_loopback() -> None:
    port = free_port()
    procs = [
        subprocess.Popen(
            rank_argv(
                r,
                port,
                "--init-timeout",
                "60",
                "--deadline",
                "170",
                "--collectives",
                "all_reduce,all_gather,latency",
                "--latency-max-bytes",
                "64",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=local_env(),
        )
        for r in (1, 0)
    ]
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=180)
        outs.append((proc.returncode, stdout, stderr))
    (rc1, out1, err1), (rc0, out0, err0) = outs
    assert rc0 == 0, out0 + err0
    assert rc1 == 0, out1 + err1
    result = parse_nccl_tests(split_sections(out0)["all_reduce"])
    assert result.tool == "pytest_spark allreduce" and result.backend == "gloo"
    assert [r.size_bytes for r in result.rows] == [1 << 20, 2 << 20, 4 << 20]
    assert all(r.busbw_gbps > 0 for r in result.rows)
    assert result.out_of_bounds == 0 and result.wrong == 0
    assert len(result.devices) == 2
    assert result.transports[0].predicted and result.transports[0].kind == "Socket"
    other = parse_nccl_tests(split_sections(out1)["all_reduce"])
    assert other.rows == () and other.transports and other.init_complete
    # the same ranks ran the all-gather and the latency sweep after the all-reduce
    parts = split_sections(out0)
    assert list(parts) == ["all_reduce", "all_gather", "latency"]
    gathered = parse_nccl_tests(parts["all_gather"])
    assert gathered.collective == "all_gather_perf" and gathered.wrong == 0
    assert [(r.size_bytes, r.count, r.redop) for r in gathered.rows] == [
        (1 << 20, 1 << 17, "none"), (2 << 20, 1 << 18, "none"), (4 << 20, 1 << 19, "none"),
    ]  # fmt: skip
    for row in gathered.rows:  # busbw = algbw * (n-1)/n
        assert row.in_place.busbw_gbps == pytest.approx(row.in_place.algbw_gbps / 2, abs=0.011)
    small = parse_nccl_tests(parts["latency"])
    assert [r.size_bytes for r in small.rows] == [8, 16, 32, 64] and small.wrong == 0
    assert out0.count("rendezvous complete") == 1  # one process group for all three


@pytest.mark.slow
@needs_torch
def test_missing_peer_hits_init_timeout_quickly() -> None:
    # The bound is the rank's own (its timer names it); the subprocess timeout is only the
    # guard against the 30 min default, with room for a torch import on a loaded machine
    # (0.7-2.4 s here quiet, over 25 s at load 90): no wall-clock assertion of our own.
    proc = subprocess.run(
        rank_argv(0, free_port(), "--init-timeout", "3"),
        capture_output=True,
        text=True,
        timeout=180,
        env=local_env(),
    )
    assert proc.returncode == ar.EXIT_INIT_TIMEOUT, proc.stdout + proc.stderr
    out = parse_nccl_tests(proc.stdout)
    assert out.hung_at_init and out.rows == ()
    assert out.init_timeout is not None
    assert "did not complete the rendezvous at tcp://127.0.0.1" in out.init_timeout
    assert "within 3 s" in out.init_timeout, out.init_timeout
