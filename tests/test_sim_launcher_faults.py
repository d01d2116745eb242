"""sparksim's look-alikes of launch-cluster.sh's newest behaviours (issue #28), without a
sim: the look-alike earlyoom prints what the readiness watch reads as earlyoom's (reports:
no proof of life; the kill line: the root cause), and the `launcher` fault edits the
head's launch-cluster.sh defaults and `fault clear` restores them."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from pytest_spark.readiness.vllm_log import classify
from sparksim import serving
from sparksim.faults import launcher as launcher_faults
from sparksim.topology import build

SHIM = Path(serving.__file__).parent / "launcher" / "image" / "earlyoom"


def load_shim() -> types.ModuleType:
    loader = importlib.machinery.SourceFileLoader("sparksim_earlyoom_shim", str(SHIM))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_look_alike_earlyoom_banner_and_reports_are_monitor_lines(tmp_path: Path) -> None:
    env = {**os.environ, "SPARKSIM_ETC": str(tmp_path)}  # no trigger file there
    child = subprocess.Popen(
        [sys.executable, str(SHIM), "-M", "524288,102400", "-s", "100", "-r", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        out, _ = child.communicate(timeout=0.9)
    except subprocess.TimeoutExpired:
        child.terminate()
        out, _ = child.communicate(timeout=10)
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines[0] == "earlyoom 1.7"
    assert sum(line.startswith("mem avail:") for line in lines) >= 2  # at once, then every 0.2 s
    for line in lines:
        assert [e.kind for e in classify(line)] == ["monitor"], line


def test_the_look_alike_kill_line_is_the_watchs_root_cause(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shim = load_shim()
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(shim, "victim", lambda me: (4242, 0, "python3", 666, 22 * 1024))
    monkeypatch.setattr(shim.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    memory = {"MemTotal": 121693 * 1024, "MemAvailable": 9000, "SwapTotal": 0, "SwapFree": 0}
    shim.low_memory(memory, 0.42, 0.0)
    lines = capsys.readouterr().err.splitlines()
    assert sent == [(4242, shim.signal.SIGTERM)]
    kill = next(line for line in lines if line.startswith("sending SIGTERM"))
    (event,) = classify(kill)
    assert event.kind == "fatal" and event.name == "earlyoom-kill"
    assert (event.value["pid"], event.value["process"], event.value["rss_mib"]) == (
        "4242",
        "python3",
        "22",
    )
    others = [line for line in lines if line != kill]
    assert others and all([e.kind for e in classify(line)] == ["monitor"] for line in others)


def test_the_look_alike_never_picks_a_victim_outside_a_serving_container() -> None:
    shim = load_shim()
    if shim.in_serving_container():
        pytest.skip("running inside a container whose PID 1 is docker-init")
    assert shim.victim(os.getpid()) is None


def test_the_launcher_fault_edits_the_heads_defaults_and_clear_restores(tmp_path: Path) -> None:
    topo = build(0, 2)
    script = tmp_path / "nodes" / topo.nodes[0].name / serving.HOME / serving.LAUNCHER_DIR
    script.mkdir(parents=True)
    (script / serving.LAUNCHER.name).write_bytes(serving.LAUNCHER.read_bytes())
    launcher_faults.launcher(tmp_path, topo, "earlyoom", report_s=1)
    launcher_faults.launcher(tmp_path, topo, "head-foreground")
    text = (script / serving.LAUNCHER.name).read_text()
    assert 'ENABLE_EARLYOOM="true"' in text and "-s 100 -r 1}" in text
    assert 'HEAD_EXEC_MODE="foreground"' in text
    keepalive = subprocess.run(
        ["bash", "-c", 'eval "$(sed -n "/^container_keepalive_command()/,/^}/p" "$0")"; '
         'ENABLE_EARLYOOM=true; EARLYOOM_ARGS="-M 524288,102400 -s 100 -r 60"; '
         "container_keepalive_command; echo; ENABLE_EARLYOOM=false; container_keepalive_command",
         str(script / serving.LAUNCHER.name)],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()  # fmt: skip
    assert keepalive == ["earlyoom -M 524288,102400 -s 100 -r 60", "sleep infinity"]
    assert launcher_faults.clear(tmp_path, topo) == [
        f"{topo.nodes[0].name}: launch-cluster.sh restored"
    ]
    assert (script / serving.LAUNCHER.name).read_bytes() == serving.LAUNCHER.read_bytes()
