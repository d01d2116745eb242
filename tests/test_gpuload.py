"""The pre-serving GPU load: its sample and summary parsers, the probe command run for
real with a stub nvidia-smi, the clock rule on GB10 readings (fixtures/gpuload), and
sparksim's nvidia-smi reading busy while a process of the node runs hot."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.finding import Skip
from pytest_spark.infra.gpuhealth.check import check_gpu_throttle
from pytest_spark.infra.gpuhealth.probe import GpuHealth, GpuReading
from pytest_spark.infra.gpuload.check import busy_clock, check_gpu_clock_under_load
from pytest_spark.infra.gpuload.parse import (
    SAMPLE_FIELDS,
    parse_load_summary,
    parse_samples,
)
from pytest_spark.infra.gpuload.probe import (
    NodeLoad,
    gpuload_probe_command,
    parse_gpuload_probe,
)
from pytest_spark.infra.kernellog import KernelLog
from pytest_spark.infra.smi import parse_query_gpu
from pytest_spark.settings.profiles import load_profile

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpuload"
SECTION = load_profile("dgx-spark-2node").gpu_health
W = "spark-worker-1"


def _baseline_mhz() -> tuple[int, int]:
    """The GB10 under load, clocks not locked: current and max MHz as recorded."""
    m = re.search(
        r"current (\d+)MHz / max (\d+)MHz", (FIXTURES / "gb10_clock_baseline.txt").read_text()
    )
    assert m is not None
    return int(m[1]), int(m[2])


def _row(mhz: float, util: float, watts: float, temp: float = 62, pstate: str = "P0") -> str:
    """One sample in `--format=csv,noheader,nounits` (SAMPLE_FIELDS' order)."""
    max_mhz = _baseline_mhz()[1]
    return f"0, {mhz:g}, {max_mhz}, {watts:.2f}, {temp:g}, {util:g}, {pstate}"


def _load(*rows: str, device: str = "cuda") -> NodeLoad:
    text = "\n".join(rows)
    from pytest_spark.infra.gpuload.parse import LoadSummary

    return NodeLoad(
        tuple(parse_samples(text)), LoadSummary(device, 20, 4000, "vllm-node"), None, text
    )


def test_samples_parse_in_order_with_na() -> None:
    text = (
        "0, 208, 3003, 4.21, 41, 0, P8\n"
        "0, 2483, 3003, 86.00, 62, 100, P0\n"
        "0, [N/A], 3003, [N/A], 63, 100, P0\n"
    )
    samples = parse_samples(text)
    assert [s.sm_clock_mhz for s in samples] == [208, 2483, None]
    assert samples[1].power_w == 86.0 and samples[1].util_pct == 100 and samples[1].pstate == "P0"
    assert samples[2].power_w is None
    with pytest.raises(ParseError):
        parse_samples("0, 2483, 3003\n")


def test_load_summary_is_the_last_line() -> None:
    s = parse_load_summary("warming up\nload device=cuda seconds=20 work=4180 where=vllm-node\n")
    assert (s.device, s.seconds, s.work, s.where, s.why) == ("cuda", 20.0, 4180, "vllm-node", "")
    cpu = parse_load_summary(
        "load device=cpu seconds=4 work=31 where=host why=torch: No module named 'torch'"
    )
    assert cpu.device == "cpu" and cpu.why == "torch: No module named 'torch'"
    with pytest.raises(ParseError):
        parse_load_summary("Traceback (most recent call last):\n")


def test_a_busy_gb10_at_its_recorded_clock_passes() -> None:
    current, _ = _baseline_mhz()
    load = _load(_row(208, 0, 4.2, pstate="P8"), *[_row(current, 100, 86)] * 3)
    assert busy_clock(load, SECTION) == current
    f = check_gpu_clock_under_load(W, load, {W: current, "spark-head": 2424}, SECTION)
    assert f.level == "pass", f.message
    assert "median SM clock 2483 MHz over 3 busy samples" in f.message
    assert "spark-head 2424 MHz" in f.message


def test_the_low_power_state_fails_naming_node_clock_floor_and_fix() -> None:
    load = _load(*[_row(504, 100, 9.8)] * 4, _row(858, 100, 15.8))
    f = check_gpu_clock_under_load(W, load, {W: 504, "spark-head": 2483}, SECTION)
    assert f.level == "fail"
    assert f.measured == 504
    for words in (
        W,
        "clock-locked below expectation",
        "median SM clock 504 MHz over 5 busy samples (504-858 MHz",
        "power 9.8-15.8 W",
        ">= 1400 MHz while busy",
        "gpu_health.min_busy_sm_clock_mhz",
        "power-cycle the Spark",
    ):
        assert words in f.message, words


def test_idle_samples_around_the_load_do_not_decide() -> None:
    """The median of the busy samples only: the idle ones before the load started and the
    last one as it ended leave a healthy node passing."""
    load = _load(_row(208, 0, 4.2, pstate="P8"), *[_row(2424, 99, 84)] * 3, _row(900, 85, 20))
    assert busy_clock(load, SECTION) == 2424
    assert check_gpu_clock_under_load(W, load, {W: 2424}, SECTION).level == "pass"


def test_a_node_well_below_its_peer_warns_and_a_deliberate_lock_does_not() -> None:
    """eugr's firmware note locks an affected unit at 2150 MHz (of 2411 by default): 89 %
    of a peer at 2411, above the 0.8 ratio; 1500 MHz beside 2483 is not."""
    note = (FIXTURES / "eugr_firmware_note.txt").read_text()
    locked = int(re.search(r"-lgc 200,(\d+)", note)[1])  # type: ignore[index]
    default = int(re.search(r"default is (\d+) MHz", note)[1])  # type: ignore[index]
    ok = _load(*[_row(locked, 100, 80)] * 3)
    assert (
        check_gpu_clock_under_load(W, ok, {W: locked, "spark-head": default}, SECTION).level
        == "pass"
    )
    slow = _load(*[_row(1500, 100, 60)] * 3)
    f = check_gpu_clock_under_load(W, slow, {W: 1500, "spark-head": 2483}, SECTION)
    assert f.level == "warn"
    assert "below 0.8 x spark-head's 2483 MHz" in f.message


def test_a_load_that_never_reached_the_gpu_warns_with_what_it_ran_on() -> None:
    """The idle GB10 of the recorded table (0 %, P8, 4 W) all along: the load ran on the
    CPU (no torch with CUDA where it ran), so nothing is known of the clock under load."""
    table = (FIXTURES / "gb10_idle_table.txt").read_text()
    m = re.search(r"(\d+)C\s+(P\d+)\s+(\d+)W .*?(\d+)%", table)
    assert m is not None
    idle = _row(208, int(m[4]), int(m[3]), temp=int(m[1]), pstate=m[2])
    load = _load(idle, idle, device="cpu")
    f = check_gpu_clock_under_load(W, load, {W: None}, SECTION)
    assert f.level == "warn"
    assert "never reached 80 % utilisation" in f.message and "on cpu" in f.message
    empty = NodeLoad((), None, "no nvidia-smi sample (exit 127: nvidia-smi: not found)")
    f = check_gpu_clock_under_load(W, empty, {}, SECTION)
    assert f.level == "warn" and "nvidia-smi: not found" in f.message


def test_the_hang_signature_is_busy_at_a_high_clock_not_a_low_clock() -> None:
    """A rank spinning in a hang reads 96 % busy at 2580 MHz and 22 W (eugr#260): a clock
    rule must not call that a low clock (the hang is the readiness watch's)."""
    text = (FIXTURES / "gb10_hang_signature.txt").read_text()
    m = re.search(r"(\d+)% util, (\d+)W, (\d+) MHz", text)
    assert m is not None
    load = _load(*[_row(int(m[3]), int(m[1]), int(m[2]))] * 3)
    assert check_gpu_clock_under_load(W, load, {W: int(m[3])}, SECTION).level == "pass"


def _stub_bin(tmp_path: Path, mhz: int) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "0, {mhz}, 3003, 86.00, 60, 100, P0"\n')
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    py = bin_dir / "python3"
    py.symlink_to(sys.executable)
    return bin_dir


def test_probe_runs_the_load_and_samples_while_it_runs(tmp_path: Path) -> None:
    """The real command on this machine: no serving image, so the host's python3 runs the
    load (no torch with CUDA here: the CPU); the stub nvidia-smi answers each sample."""
    env = {**os.environ, "PATH": f"{_stub_bin(tmp_path, 2483)}:{os.environ['PATH']}"}
    cmd = gpuload_probe_command(image="no-such-image:pytest-spark", load_s=1.2, interval_s=0.4)
    out = subprocess.run(cmd, shell=True, capture_output=True, text=True, env=env, timeout=60)
    load = parse_gpuload_probe(out.stdout)
    assert load.error is None, out.stdout + out.stderr
    assert len(load.samples) >= 1  # sampled while the load ran (how many: the machine's)
    assert {s.sm_clock_mhz for s in load.samples} == {2483}
    assert load.summary is not None and load.summary.where == "host"
    assert load.summary.device == "cpu" and load.summary.why.startswith("torch")


def test_probe_says_why_there_are_no_samples(tmp_path: Path) -> None:
    bin_dir = _stub_bin(tmp_path, 2483)
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    cmd = gpuload_probe_command(image=None, load_s=0.5, interval_s=0.5)
    out = subprocess.run(cmd, shell=True, capture_output=True, text=True, env=env, timeout=60)
    load = parse_gpuload_probe(out.stdout)
    assert not load.samples and load.error is not None and "exit 6" in load.error


def test_sample_fields_are_ones_the_query_parser_reads() -> None:
    rows = parse_query_gpu("0, 2483, 3003, 86.00, 62, 100, P0\n", SAMPLE_FIELDS)
    assert rows[0].number("clocks.sm") == 2483


def _busy_low_clock() -> GpuHealth:
    g = GpuReading(0, "0000000F:01:00.0", 45, 504, 3003, 9.8, None, 100, "P0", True, {})
    return GpuHealth((g,), None, KernelLog("dmesg", 10))


def test_serving_time_low_clock_skips_citing_the_load_check_in_launch_mode() -> None:
    owner = f"test_gpu_clock_under_load[{W}]"
    skip = check_gpu_throttle(W, _busy_low_clock(), SECTION, low_clock_owner=owner)
    assert isinstance(skip, Skip)
    assert f"{owner} has the evidence" in skip.reason and "504 MHz" in skip.reason
    attached = check_gpu_throttle(W, _busy_low_clock(), SECTION)
    assert not isinstance(attached, Skip) and attached.level == "fail"


def test_a_slowdown_reason_beside_the_low_clock_still_fails_in_launch_mode() -> None:
    g = _busy_low_clock().gpus[0]
    hw = GpuReading(*[getattr(g, f) for f in ("index", "bus_id", "temperature_c", "sm_clock_mhz",
        "max_sm_clock_mhz", "power_w", "power_limit_w", "util_pct", "pstate", "persistence")],
        {"hw_slowdown": True})  # fmt: skip
    health = GpuHealth((hw,), None, KernelLog("dmesg", 10))
    f = check_gpu_throttle(W, health, SECTION, low_clock_owner="test_gpu_clock_under_load[x]")
    assert not isinstance(f, Skip) and f.level == "fail" and "hw_slowdown" in f.message


def test_sim_nvidia_smi_reads_busy_while_a_process_runs_hot(tmp_path: Path) -> None:
    """sparksim's nvidia-smi: a process that burns a core for over a second makes the GPU
    read loaded (P0, 2483 MHz, 100 %), as a load's kernels make a real one; a fault that
    already put the GPU in a loaded state (gpu-low-clock's 504 MHz) reads as it is."""
    from sparksim.tools import gpu as smi

    hot = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.5)
        smi._busy.clear()
        smi._follow[0] = True  # as in a sim node's dir (FOLLOW_FILE), which spark-sim up writes
        info = {
            "health": {"sm_clock_mhz": 208, "util_pct": 0, "pstate": "P8", "reasons": ["gpu_idle"]}
        }
        loaded = smi._health(info)
        assert (loaded["sm_clock_mhz"], loaded["util_pct"], loaded["pstate"]) == (2483, 100, "P0")
        assert "gpu_idle" not in loaded["reasons"]
        capped = {"health": {"sm_clock_mhz": 504, "util_pct": 100, "pstate": "P0", "reasons": []}}
        assert smi._health(capped)["sm_clock_mhz"] == 504
    finally:
        hot.kill()
        hot.wait()
        smi._busy.clear()
        smi._follow[0] = False


def test_sim_nvidia_smi_outside_a_sim_node_reads_state_json_alone() -> None:
    """A node dir without gpu-follows-load (the tools run by a test): no process decides."""
    from sparksim.tools import gpu as smi

    hot = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.5)
        smi._busy.clear()
        smi._follow[0] = False
        info = {"health": {"sm_clock_mhz": 208, "util_pct": 0, "pstate": "P8"}}
        assert smi._health(info)["sm_clock_mhz"] == 208 and not smi.node_busy()
    finally:
        hot.kill()
        hot.wait()
