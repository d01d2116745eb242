"""sparksim's journalctl of a node (tools/kernellog.py) reads as the kernel topic's probe
expects, without a running sim: the previous boot, the boot list, the kernel-log faults
(faults/gpu.py) and the ConnectX counters of ethtool -S (tools/links.py)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
from pathlib import Path

import pytest

from pytest_spark.infra.counters.parse import parse_ethtool_stats
from pytest_spark.infra.kernel.parse import clean_shutdown_line, parse_list_boots
from pytest_spark.infra.kernellog import parse_aer, parse_kernel_log
from sparksim import node as nodes_mod
from sparksim.faults import gpu
from sparksim.tools import kernellog, links
from sparksim.topology import NodeSpec

SPEC = NodeSpec(2, "spark-2", "worker", "ns", "198.18.0.2", "v", ())


def _journalctl(tmp_path: Path, state: dict[str, object], *argv: str) -> tuple[int, str]:
    (tmp_path / "state.json").write_text(json.dumps(state))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = kernellog.journalctl(str(tmp_path), list(argv))
    return rc, out.getvalue()


def test_healthy_previous_boot_ends_clean(tmp_path: Path) -> None:
    state = nodes_mod.initial_state(SPEC)
    rc, boots = _journalctl(tmp_path, state, "--list-boots", "--no-pager", "-q")
    assert rc == 0 and [b.index for b in parse_list_boots(boots)] == [-1, 0]
    rc, tail = _journalctl(tmp_path, state, "-b", "-1", "-n", "15", "-o", "short-iso")
    assert rc == 0 and clean_shutdown_line(tail.splitlines()) is not None
    _, now = _journalctl(tmp_path, state, "-k", "-b", "--no-pager", "-o", "short-iso")
    assert "Journal stopped" not in now  # -k: kernel lines of this boot only


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        ("unclean-shutdown", {"nvrm": 12}),
        ("nvrm-oom", {"lines": 3}),
        ("pcie-aer", {"domain": "0002", "correctable": False}),
    ],
)
def test_kernel_faults(tmp_path: Path, kind: str, extra: dict[str, object]) -> None:
    state = nodes_mod.initial_state(SPEC)
    gpu._kernel_fault(state, SPEC, argparse.Namespace(kind=kind, **extra))
    if kind == "unclean-shutdown":
        _, tail = _journalctl(tmp_path, state, "-b", "-1", "-n", "15", "-o", "short-iso")
        assert clean_shutdown_line(tail.splitlines()) is None
        _, prev = _journalctl(tmp_path, state, "-k", "-b", "-1", "-o", "short-iso")
        assert sum(e.no_memory for e in parse_kernel_log(prev)) == 12
        return
    _, now = _journalctl(tmp_path, state, "-k", "-b", "-o", "short-iso")
    if kind == "nvrm-oom":
        assert sum(e.no_memory for e in parse_kernel_log(now)) == 3
    else:
        assert {(e.source, e.fatal) for e in parse_aer(now)} == {("0002:01:00.0", True)}


def test_ethtool_statistics_steady_then_rising() -> None:
    state = nodes_mod.initial_state(SPEC)
    text = links._statistics(state, "enp1s0f0np0")
    assert text is not None and parse_ethtool_stats(text)["link_down_events_phy"] == 1
    assert links._statistics(state, "mgmt0") is None
    state["counter_rise"] = {"enp1s0f0np0": {"since": 0.0, "per_s": {"link_down_events_phy": 0.5}}}
    risen = links._statistics(state, "enp1s0f0np0")
    assert risen is not None and parse_ethtool_stats(risen)["link_down_events_phy"] > 1000
