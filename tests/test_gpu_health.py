"""GPU health (issue #15 §3): parsers on recorded real outputs (fixtures/gpu, sources in
its README), the facts the preflight probe's GPU sections give, and the checks' verdicts
and messages (node, measured, expected, fix). sparksim's nvidia-smi / journalctl / dmesg
are read here too, in process: the suite must parse what the sim prints exactly as it
parses the real tools."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.finding import Skip
from pytest_spark.infra.gpuhealth.check import (
    check_gpu_kernel_log,
    check_gpu_persistence,
    check_gpu_temperature,
    check_gpu_throttle,
    gpu_lost_in_kernel_log,
)
from pytest_spark.infra.gpuhealth.parse import (
    QUERY_FIELDS,
    parse_smi_q,
    reasons_from_mask,
    reasons_from_q,
)
from pytest_spark.infra.gpuhealth.probe import (
    HOST_PROBE,
    MARKER,
    PROBE_BODY,
    GpuHealth,
    gpuhealth_probe_command,
    parse_gpu_health,
    parse_gpuhealth_probe,
)
from pytest_spark.infra.kernellog import KernelLog, parse_kernel_log
from pytest_spark.infra.preflight.probe import preflight_probe_command
from pytest_spark.infra.probe import ProbeSection
from pytest_spark.infra.roundtrip import shared_probes
from pytest_spark.infra.smi import parse_query_gpu
from pytest_spark.settings.profiles import load_profile
from pytest_spark.settings.sections import GpuHealthSection

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
H = "spark-head"
SECTION = load_profile("dgx-spark-2node").gpu_health

# A GB10 as hoesing/spark-gpu-throttle-check printed it (fixtures/gpu/README.md), in the
# probe's --query-gpu field order: idle, busy, and the USB-PD low-power state.
IDLE = "0, 0000000F:01:00.0, 41, 208, 3003, 4.50, [N/A], 0, P8, Enabled, 0x0000000000000001"
BUSY = "0, 0000000F:01:00.0, 62, 2424, 3003, 87.20, [N/A], 100, P0, Enabled, 0x0000000000000000"
CAPPED = "0, 0000000F:01:00.0, 47, 481, 3003, 5.80, [N/A], 100, P0, Enabled, 0x0000000000000000"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def section(name: str, stdout: str, rc: int = 0, stderr: str = "") -> ProbeSection:
    return ProbeSection(name, stdout, stderr, rc)


def health(
    query: str = IDLE,
    q: str | None = None,
    kernel: ProbeSection | None = None,
    query_rc: int = 0,
) -> GpuHealth:
    sections = {"gpu_query": section("gpu_query", query + "\n", query_rc)}
    if q is not None:
        sections["gpu_q"] = section("gpu_q", q)
    sections["kernel_log"] = kernel or section("kernel_log", "source journalctl lines 2480\n")
    return parse_gpu_health(sections)


# ----------------------------------------------------------------------------- parsers


def test_query_row_reads_gb10_na_as_none() -> None:
    (row,) = parse_query_gpu(IDLE + "\n", QUERY_FIELDS)
    assert row.number("temperature.gpu") == 41
    assert row.number("clocks.max.sm") == 3003
    assert row.text("power.limit") is None  # GB10: [N/A]
    assert row.text("persistence_mode") == "Enabled"


def test_query_with_another_column_count_is_not_this_format() -> None:
    with pytest.raises(ParseError, match="expected 11 columns"):
        parse_query_gpu("41, 208\n", QUERY_FIELDS)


def test_smi_q_reads_the_clocks_event_reasons_block_of_driver_580() -> None:
    (gpu,) = parse_smi_q(fixture("smi_q_performance_580.txt"))
    assert gpu["Bus Id"] == "00000000:42:00.0"
    assert gpu["Performance State"] == "P8"
    # HW Thermal Slowdown is nested under HW Slowdown in the real layout
    assert gpu["Clocks Event Reasons/HW Slowdown/HW Thermal Slowdown"] == "Not Active"
    reasons = reasons_from_q(gpu)
    assert reasons is not None and set(reasons) == {
        "gpu_idle",
        "applications_clocks_setting",
        "sw_power_cap",
        "hw_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
        "sync_boost",
        "sw_thermal_slowdown",
        "display_clocks_setting",
    }
    assert not any(reasons.values())


def test_smi_q_reads_temperature_power_and_clocks() -> None:
    (gpu,) = parse_smi_q(fixture("smi_q_temperature_power_clocks.txt"))
    assert gpu["Temperature/GPU Slowdown Temp"] == "93 C"
    assert gpu["Temperature/GPU Max Operating Temp"] == "N/A"
    assert gpu["Max Clocks/SM"] == "1911 MHz"
    assert gpu["Power Readings/Power Draw"] == "60.06 W"
    assert reasons_from_q(gpu) is None  # no Clocks Event Reasons block in this display


def test_reasons_mask_decodes_nvml_bits() -> None:
    reasons = reasons_from_mask("0x0000000000000048")
    assert reasons is not None
    assert sorted(r for r, on in reasons.items() if on) == ["hw_slowdown", "hw_thermal_slowdown"]
    assert reasons_from_mask(None) is None
    assert reasons_from_mask("[N/A]") is None


def test_kernel_log_on_a_gb10_whose_gpu_never_initialised() -> None:
    events = parse_kernel_log(fixture("kernel_gb10_xid169_rminit.txt"))
    # "GPU at PCI:...: GPU-<uuid>" is the driver naming the GPU, not an error
    assert [(e.xid, e.pci) for e in events] == [(169, "000f:01:00"), (None, None)]
    assert "RmInitAdapter failed" in events[1].line


def test_kernel_log_dmesg_ctime_xids_with_pid_and_name() -> None:
    events = parse_kernel_log(fixture("dmesg_ctime_xid13_109.txt"))
    assert [e.xid for e in events] == [13, 13, 13, 109]  # nvidia-peermem is not NVRM
    assert events[3].detail.startswith("pid=1797828, name=pt_main_thread")


def test_kernel_log_syslog_fallen_off_the_bus_and_old_xid_format() -> None:
    events = parse_kernel_log(fixture("syslog_fallen_off_bus.txt"))
    assert [e.xid for e in events] == [None, 3]
    assert "has fallen off the bus" in events[0].line
    assert events[1].pci == "0000:01:00"


def test_kernel_log_healthy_driver_lines_are_no_errors() -> None:
    text = (
        "2026-12-01T09:10:32+0000 spark-1 kernel: NVRM: loading NVIDIA UNIX Open Kernel "
        "Module for aarch64  580.95.05  Release Build\n"
        "2026-12-01T09:10:32+0000 spark-1 kernel: nvidia-nvlink: Nvlink Core is being "
        "initialized, major device number 509\n"
    )
    assert parse_kernel_log(text) == []


# ------------------------------------------------------------------------------- facts


def test_facts_prefer_q_reasons_and_keep_clocks_and_power() -> None:
    q = fixture("smi_q_performance_580.txt").replace(
        "HW Slowdown                       : Not Active",
        "HW Slowdown                       : Active",
    )
    g = health(IDLE, q).gpus[0]  # -q by position: the bus ids differ
    assert g.active() == ["hw_slowdown"]  # -q wins over the mask (idle)
    assert (g.sm_clock_mhz, g.max_sm_clock_mhz, g.power_w) == (208, 3003, 4.5)
    assert g.persistence is True and g.power_limit_w is None
    assert g.unread == ("power limit",)


def test_facts_fall_back_to_the_mask_without_q() -> None:
    g = health(IDLE).gpus[0]
    assert g.active() == ["gpu_idle"]


def test_facts_when_nvidia_smi_fails() -> None:
    h = health("No devices were found", query_rc=6)
    assert h.gpus == () and h.error is not None and "exit 6" in h.error


def test_kernel_facts_journal_then_dmesg_refused() -> None:
    refused = section(
        "kernel_log",
        "",
        rc=1,
        stderr=(
            "refused journalctl: exit 1, 0 kernel lines: No journal files were opened due "
            "to insufficient permissions.\n"
            "refused dmesg: exit 1: dmesg: read kernel buffer failed: Operation not permitted\n"
        ),
    )
    k = health(kernel=refused).kernel
    assert k.source is None and len(k.refused) == 2
    assert k.refused[1].startswith("dmesg: exit 1: dmesg: read kernel buffer failed")


def test_kernel_facts_dmesg_after_journal_refused() -> None:
    k = health(
        kernel=section(
            "kernel_log",
            "source dmesg lines 3100\n" + fixture("syslog_fallen_off_bus.txt"),
            stderr="refused journalctl: exit 1, 0 kernel lines\n",
        )
    ).kernel
    assert (k.source, k.lines, len(k.events)) == ("dmesg", 3100, 2)


# ------------------------------------------------------------------------------- checks


def test_temperature_pass_warn_fail() -> None:
    ok = check_gpu_temperature(H, health(IDLE), SECTION)
    assert ok.level == "pass" and ok.measured == 41
    warm = check_gpu_temperature(H, health(IDLE.replace(", 41,", ", 84,")), SECTION)
    assert warm.level == "warn" and "80 C warning level" in warm.message
    hot = check_gpu_temperature(H, health(IDLE.replace(", 41,", ", 93,")), SECTION)
    assert hot.level == "fail" and hot.node == H
    assert f"{H} GPU 0: temperature 93 C, expected < 90 C" in hot.message
    assert "airflow" in hot.message and "SM clock 208 MHz of max 3003 MHz" in hot.message


def test_temperature_uses_the_gpus_own_slowdown_point() -> None:
    q = "GPU 0000000F:01:00.0\n    Temperature\n        GPU Slowdown Temp : 85 C\n"
    f = check_gpu_temperature(H, health(IDLE.replace(", 41,", ", 86,"), q), SECTION)
    assert f.level == "fail" and "the GPU's own slowdown temperature" in f.message


def test_temperature_na_warns_saying_what_could_not_be_read() -> None:
    f = check_gpu_temperature(H, health(IDLE.replace(", 41,", ", [N/A],")), SECTION)
    assert f.level == "warn" and "could not be read" in f.message and "[N/A]" in f.message


def test_throttle_healthy_idle_and_busy_pass_with_clocks_and_power() -> None:
    idle = check_gpu_throttle(H, health(IDLE), SECTION)
    assert not isinstance(idle, Skip) and idle.level == "pass"
    assert "active reasons: gpu_idle" in idle.message and "power 4.5 W (limit N/A)" in idle.message
    busy = check_gpu_throttle(H, health(BUSY), SECTION)
    assert not isinstance(busy, Skip) and busy.level == "pass"


@pytest.mark.parametrize(
    ("mask", "reason", "level", "fix"),
    [
        ("0x0000000000000008", "hw_slowdown", "fail", "power brick"),
        ("0x0000000000000080", "hw_power_brake_slowdown", "fail", "power brick"),
        ("0x0000000000000040", "hw_thermal_slowdown", "fail", "airflow"),
        ("0x0000000000000020", "sw_thermal_slowdown", "fail", "airflow"),
        ("0x0000000000000004", "sw_power_cap", "warn", "power limit"),
    ],
)
def test_throttle_reason_levels_follow_the_profile(
    mask: str, reason: str, level: str, fix: str
) -> None:
    f = check_gpu_throttle(H, health(BUSY.replace("0x0000000000000000", mask)), SECTION)
    assert not isinstance(f, Skip)
    assert (f.level, f.measured, f.node) == (level, reason, H)
    assert f"{H} GPU 0: clocks event reason {reason} active" in f.message
    assert "expected no slowdown reason active" in f.message
    assert "SM clock 2424 MHz of max 3003 MHz, power 87.2 W" in f.message
    assert fix in f.message


def test_throttle_reason_that_warns_by_profile() -> None:
    lenient = replace(SECTION, hw_slowdown_fails=False)
    f = check_gpu_throttle(H, health(BUSY.replace("0x0000000000000000", "0x08")), lenient)
    assert not isinstance(f, Skip) and f.level == "warn"


def test_throttle_busy_gpu_at_low_clock_is_the_gb10_low_power_state() -> None:
    f = check_gpu_throttle(H, health(CAPPED), SECTION)
    assert not isinstance(f, Skip) and f.level == "fail" and f.measured == 481
    assert "SM clock 481 MHz while 100 % busy, expected >= 1400 MHz" in f.message
    assert "unplug its USB-C power brick" in f.message


def test_throttle_thermal_reason_skips_citing_a_failed_temperature_check() -> None:
    hot = health(BUSY.replace(", 62,", ", 95,").replace("0x0000000000000000", "0x40"))
    result = check_gpu_throttle(H, hot, SECTION, temperature_failed=True)
    assert isinstance(result, Skip) and f"test_gpu_temperature[{H}]" in result.reason
    # a power reason is its own cause even then
    power = health(BUSY.replace(", 62,", ", 95,").replace("0x0000000000000000", "0x08"))
    assert not isinstance(check_gpu_throttle(H, power, SECTION, temperature_failed=True), Skip)


def test_throttle_reasons_unreadable_warns() -> None:
    f = check_gpu_throttle(H, health(IDLE.replace("0x0000000000000001", "[N/A]")), SECTION)
    assert not isinstance(f, Skip) and f.level == "warn" and "could not be read" in f.message


def test_persistence() -> None:
    assert check_gpu_persistence(H, health(IDLE), SECTION).level == "pass"
    off = check_gpu_persistence(H, health(IDLE.replace("Enabled", "Disabled")), SECTION)
    assert off.level == "fail" and off.node == H
    assert f"{H} GPU 0: persistence mode Disabled, expected Enabled" in off.message
    assert "nvidia-persistenced" in off.message
    lenient = replace(SECTION, require_persistence=False)
    assert check_gpu_persistence(H, health(IDLE.replace("Enabled", "Disabled")), lenient).level == (
        "warn"
    )
    na = check_gpu_persistence(H, health(IDLE.replace("Enabled", "[N/A]")), SECTION)
    assert na.level == "warn" and "could not be read" in na.message


def test_checks_on_no_readings_warn_never_fail() -> None:
    h = health("No devices were found", query_rc=6)
    for f in (
        check_gpu_temperature(H, h, SECTION),
        check_gpu_persistence(H, h, SECTION),
        check_gpu_throttle(H, h, SECTION),
    ):
        assert not isinstance(f, Skip) and f.level == "warn" and "exit 6" in f.message


def _kernel(text: str, source: str = "journalctl -k -b") -> KernelLog:
    return KernelLog(source, 2480, tuple(parse_kernel_log(text)))


def test_kernel_log_clean_passes() -> None:
    f = check_gpu_kernel_log(H, KernelLog("journalctl -k -b", 2480), SECTION)
    assert f.level == "pass" and "2480 lines" in f.message


def test_kernel_log_xid_79_fails_with_the_catalog_fix() -> None:
    line = (
        "2026-12-01T16:01:02+0000 spark-2 kernel: NVRM: Xid (PCI:000f:01:00): 79, "
        "pid=4242, name=python3, GPU has fallen off the bus."
    )
    f = check_gpu_kernel_log(H, _kernel(line), SECTION)
    assert (f.level, f.measured, f.node) == ("fail", 1, H)
    assert "1 x Xid 79 (GPU has fallen off the bus)" in f.message
    assert "expected no Xid or NVRM errors since boot" in f.message
    assert "power-cycle the node" in f.message and "journalctl -k -b, 2480 lines" in f.message
    assert line in f.evidence["kernel log"]


def test_kernel_log_gb10_init_failure_fails_naming_both_lines() -> None:
    f = check_gpu_kernel_log(H, _kernel(fixture("kernel_gb10_xid169_rminit.txt")), SECTION)
    assert f.level == "fail" and f.measured == 2
    assert "1 x Xid 169" in f.message and "1 NVRM error line(s)" in f.message
    assert "RmInitAdapter failed" in f.message
    # the Xid's catalog action, not the generic driver fix of the line beside it
    assert "power-cycle the node" in f.message and "reinstall the driver" not in f.message
    f = check_gpu_kernel_log(
        H, _kernel(fixture("syslog_fallen_off_bus.txt").splitlines()[0]), SECTION
    )
    assert f.level == "fail" and "reinstall the driver" in f.message


def test_kernel_log_application_xids_warn() -> None:
    only13 = "\n".join(fixture("dmesg_ctime_xid13_109.txt").splitlines()[:4])
    f = check_gpu_kernel_log(H, _kernel(only13, "dmesg"), SECTION)
    assert f.level == "warn" and "3 x Xid 13" in f.message and "warn_xids" in f.message
    # Xid 109 is not in warn_xids: the whole log fails, on it
    f = check_gpu_kernel_log(H, _kernel(fixture("dmesg_ctime_xid13_109.txt")), SECTION)
    assert f.level == "fail" and "1 x Xid 109 (context switch timeout)" in f.message


def test_kernel_log_driver_assertion_warns_and_an_xid_beside_it_fails() -> None:
    # the open driver's assertion form (NVIDIA/open-gpu-kernel-modules#120)
    assertion = (
        "[   24.020433] NVRM: nvAssertOkFailedNoLog: Assertion failed: Generic operating "
        "system error [NV_ERR_OPERATING_SYSTEM] (0x00000059)"
    )
    (event,) = parse_kernel_log(assertion)
    assert event.soft and event.xid is None
    f = check_gpu_kernel_log(H, _kernel(assertion, "dmesg"), SECTION)
    assert f.level == "warn" and "1 driver assertion line(s)" in f.message
    assert "nvidia-bug-report.sh" in f.message
    xid = "[  300.1] NVRM: Xid (PCI:000f:01:00): 48, pid=1, name=python3, An uncorrectable DBE"
    f = check_gpu_kernel_log(H, _kernel(assertion + "\n" + xid, "dmesg"), SECTION)
    assert (
        f.level == "fail" and f.measured == 1 and "1 x Xid 48 (double-bit ECC error)" in f.message
    )


def test_gpu_lost_is_read_from_xid_79_or_the_drivers_own_words() -> None:
    lost = gpu_lost_in_kernel_log(_kernel(fixture("syslog_fallen_off_bus.txt")))
    assert lost is not None and "has fallen off the bus" in lost.line
    xid = "NVRM: Xid (PCI:000f:01:00): 79, pid=1, name=python3, GPU has fallen off the bus."
    assert gpu_lost_in_kernel_log(_kernel(xid)) is not None
    assert gpu_lost_in_kernel_log(_kernel(fixture("dmesg_ctime_xid13_109.txt"))) is None
    assert gpu_lost_in_kernel_log(_kernel(fixture("kernel_gb10_xid169_rminit.txt"))) is None


def test_kernel_log_unreadable_says_so() -> None:
    refused = (
        "journalctl: exit 1, 0 kernel lines: "
        + fixture("journalctl_no_permission.txt").splitlines()[-1],
        "dmesg: exit 1: " + fixture("dmesg_refused.txt").strip(),
    )
    f = check_gpu_kernel_log(H, KernelLog(None, 0, refused=refused), SECTION)
    assert f.level == "warn" and f.node == H
    assert "cannot read the kernel log since boot" in f.message
    assert "insufficient permissions" in f.message and "Operation not permitted" in f.message
    assert "adm or systemd-journal group" in f.message and "dmesg_restrict" in f.message


def test_profile_section_is_typed_and_overridable() -> None:
    assert isinstance(SECTION, GpuHealthSection) and SECTION.warn_xids == (13, 31, 43, 45)
    p = load_profile("dgx-spark-2node").with_overrides(
        {"gpu_health.max_temp_c": "85", "gpu_health.warn_xids": "13;43"}
    )
    assert p.gpu_health.max_temp_c == 85.0 and p.gpu_health.warn_xids == (13, 43)


# ------------------------------------------------- the probe's shell and sparksim's tools


def test_probe_is_its_own_and_rides_the_host_round_trip() -> None:
    """The GPU sections are the gpuhealth topic's own probe (its own marker), declared to
    ride the node's one host round trip beside the preflight probe, not inside it."""
    command = gpuhealth_probe_command()
    preflight = preflight_probe_command(container="vllm_node")
    for name in ("s gpu_query ", "s gpu_q ", "s kernel_log "):
        assert name in PROBE_BODY and name in command and name not in preflight
    assert MARKER in command and 'rm -f "$t"' in command  # its scratch file removed
    assert HOST_PROBE in shared_probes()


def _tools_dir(tmp_path: Path, **state_changes: object) -> Path:
    """sparksim's nvidia-smi, journalctl and dmesg as a node's PATH has them (the wrappers
    spark-sim up writes), over a state.json of our own."""
    import sys

    from sparksim import node as nodes_mod
    from sparksim.topology import NodeSpec

    root = Path(__file__).resolve().parents[1]
    node_dir = tmp_path / "node"
    bin_dir = tmp_path / "bin"
    for d in (node_dir, bin_dir):
        d.mkdir()
    state = nodes_mod.initial_state(NodeSpec(1, "spark-1", "head", "n", "198.18.0.11", "v", ()))
    state.update(state_changes)
    (node_dir / "state.json").write_text(json.dumps(state))
    for tool in ("nvidia-smi", "journalctl", "dmesg"):
        path = bin_dir / tool
        path.write_text(
            f"#!{sys.executable} -IS\nimport sys\nsys.path.insert(0, {str(root)!r})\n"
            "from sparksim.tools import main\n"
            f"sys.exit(main({tool!r}, {str(node_dir)!r}, sys.argv[1:]))\n"
        )
        path.chmod(0o755)
    return bin_dir


def _run_probe(bin_dir: Path) -> GpuHealth:
    from pytest_spark.infra.probe import probe_script, split_probe

    command = probe_script("@@m@@", "gpu", 20, PROBE_BODY)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LC_ALL": "C"}
    out = subprocess.run(command, shell=True, env=env, capture_output=True, text=True, timeout=60)
    _, sections = split_probe(out.stdout, "@@m@@", "gpu probe")
    return parse_gpu_health(sections)


def test_probe_shell_on_sparksims_tools(tmp_path: Path) -> None:
    """The probe's own shell (query, -q, journalctl -k -b) against the sim's tools."""
    h = _run_probe(_tools_dir(tmp_path))
    (g,) = h.gpus
    assert (g.temperature_c, g.persistence, g.active()) == (41, True, ["gpu_idle"])
    assert h.kernel.source == "journalctl -k -b" and h.kernel.lines == 4 and not h.kernel.events


def test_probe_shell_kernel_log_refused_by_both_sources(tmp_path: Path) -> None:
    h = _run_probe(_tools_dir(tmp_path, kernel_log_restricted=True))
    assert h.kernel.source is None
    assert h.kernel.refused[0].startswith("journalctl: exit 1, 0 kernel lines: No journal files")
    assert h.kernel.refused[1] == (
        "dmesg: exit 1: dmesg: read kernel buffer failed: Operation not permitted"
    )


def _sim_tool(tmp_path: Path, tool: str, argv: list[str], **health: object) -> tuple[int, str]:
    from sparksim import node as nodes_mod
    from sparksim.tools import TOOLS
    from sparksim.topology import NodeSpec

    state = nodes_mod.initial_state(NodeSpec(1, "spark-1", "head", "n", "198.18.0.11", "v", ()))
    state["gpu"]["health"].update(health)  # type: ignore[index]
    (tmp_path / "state.json").write_text(json.dumps(state))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = TOOLS[tool](str(tmp_path), argv)
    return rc, out.getvalue()


def test_the_probe_reads_sparksims_tools_as_the_real_ones(tmp_path: Path) -> None:
    """The probe's sections run the sim's tools (sh, in process for the tools); the facts
    parse them into the same readings as recorded real outputs."""
    fields = ",".join(QUERY_FIELDS)
    _, query = _sim_tool(
        tmp_path, "nvidia-smi", [f"--query-gpu={fields}", "--format=csv,noheader,nounits"]
    )
    _, q = _sim_tool(tmp_path, "nvidia-smi", ["-q", "-d", "PERFORMANCE,TEMPERATURE"])
    _, journal = _sim_tool(tmp_path, "journalctl", ["-k", "-b", "--no-pager", "-o", "short-iso"])
    lines = journal.splitlines()
    count = sum(" kernel: " in ln for ln in lines)
    nvrm = "\n".join(ln for ln in lines if "NVRM" in ln or "Xid" in ln)
    kernel = f"source journalctl lines {count}\n{nvrm}"
    h = parse_gpu_health(
        {
            "gpu_query": section("gpu_query", query),
            "gpu_q": section("gpu_q", q),
            "kernel_log": section("kernel_log", kernel),
        }
    )
    (g,) = h.gpus
    assert (g.temperature_c, g.sm_clock_mhz, g.max_sm_clock_mhz, g.power_w) == (41, 208, 3003, 4.21)
    assert g.persistence is True and g.active() == ["gpu_idle"] and g.unread == ("power limit",)
    assert h.kernel.source == "journalctl -k -b" and h.kernel.lines == 4 and not h.kernel.events
    for check in (check_gpu_temperature, check_gpu_persistence, check_gpu_throttle):
        f = check(H, h, SECTION)
        assert not isinstance(f, Skip) and f.level == "pass", f
    throttled_rc, throttled = _sim_tool(
        tmp_path,
        "nvidia-smi",
        [f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        reasons=["hw_slowdown"],
        persistence=False,
    )
    (row,) = parse_query_gpu(throttled, QUERY_FIELDS)
    assert throttled_rc == 0 and row.text("clocks_event_reasons.active") == "0x0000000000000008"
    assert row.text("persistence_mode") == "Disabled"


def _sim_readings(tmp_path: Path, **health_: object) -> GpuHealth:
    """What the probe's query and -q sections make of the sim's nvidia-smi over these
    health readings."""
    fields = ",".join(QUERY_FIELDS)
    _, query = _sim_tool(
        tmp_path,
        "nvidia-smi",
        [f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        **health_,
    )
    _, q = _sim_tool(tmp_path, "nvidia-smi", ["-q", "-d", "PERFORMANCE,TEMPERATURE"], **health_)
    return parse_gpu_health(
        {
            "gpu_query": section("gpu_query", query),
            "gpu_q": section("gpu_q", q),
            "kernel_log": section("kernel_log", "source journalctl lines 4\n"),
        }
    )


def test_sim_low_clock_fault_reads_as_a_capped_gb10_under_load(tmp_path: Path) -> None:
    """sparksim's gpu-low-clock: busy, P0, the SM clock capped and no reason set, as
    hoesing/spark-gpu-throttle-check read a capped GB10. The throttle check fails on the
    busy clock alone; the same clock idle is a healthy idle GB10 and passes."""
    from sparksim.faults.gpu import low_clock_health

    (g,) = _sim_readings(tmp_path, **low_clock_health(504)).gpus
    assert (g.sm_clock_mhz, g.util_pct, g.pstate, g.active()) == (504, 100, "P0", [])
    f = check_gpu_throttle(H, _sim_readings(tmp_path, **low_clock_health(504)), SECTION)
    assert not isinstance(f, Skip) and (f.level, f.measured, f.node) == ("fail", 504, H)
    assert f"{H} GPU 0: SM clock 504 MHz while 100 % busy, expected >= 1400 MHz" in f.message
    assert "power 9.8 W" in f.message and "unplug its USB-C power brick" in f.message
    for check in (check_gpu_temperature, check_gpu_persistence):
        assert check(H, _sim_readings(tmp_path, **low_clock_health(504)), SECTION).level == "pass"
    idle = {**low_clock_health(504), "util_pct": 0, "pstate": "P8", "reasons": ["gpu_idle"]}
    f = check_gpu_throttle(H, _sim_readings(tmp_path, **idle), SECTION)
    assert not isinstance(f, Skip) and f.level == "pass", f


def test_probe_output_carries_the_gpu_health(tmp_path: Path) -> None:
    """A whole probe output (the other sections absent) still parses."""
    m = MARKER
    text = (
        f"{m} probe v1 spark-1\n{m} begin gpu_query\n{IDLE}\n\n{m} stderr gpu_query\n\n"
        f"{m} end gpu_query rc=0\n{m} begin kernel_log\nsource dmesg lines 900\n\n"
        f"{m} stderr kernel_log\nrefused journalctl: exit 1, 0 kernel lines\n\n"
        f"{m} end kernel_log rc=0\n"
    )
    facts = parse_gpuhealth_probe(text)
    assert facts.gpus[0].temperature_c == 41
    assert facts.kernel.source == "dmesg"
    assert facts.kernel.refused == ("journalctl: exit 1, 0 kernel lines",)
    with pytest.raises(ParseError):  # another probe's output is not this one's
        parse_gpuhealth_probe(text.replace(m, "@@pytest-spark-preflight@@"))
