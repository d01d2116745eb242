"""The kernel log beyond this boot's NVRM / Xid lines: the parsers on recorded real lines
(fixtures/kernel), the previous-boot and AER checks, and the NV_ERR_NO_MEMORY burst rule
that test_gpu_kernel_errors applies."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.finding import Skip
from pytest_spark.infra.gpuhealth.check import check_gpu_kernel_log
from pytest_spark.infra.kernel.check import check_pcie_aer, check_previous_boot
from pytest_spark.infra.kernel.parse import clean_shutdown_line, parse_list_boots
from pytest_spark.infra.kernel.probe import MARKER, PreviousBoot, parse_kernel_probe
from pytest_spark.infra.kernellog import (
    KernelLog,
    line_time,
    no_memory_burst,
    parse_aer,
    parse_kernel_log,
)
from pytest_spark.settings.sections import GpuHealthSection

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernel"
SECTION = GpuHealthSection()
OOM = (FIXTURES / "nvrm_no_memory_gb10.txt").read_text().strip()


def _journal(msgs: list[str], start: int = 0, step: int = 1) -> str:
    """``journalctl -k -o short-iso`` lines of the messages, ``step`` s apart."""
    out = []
    for i, msg in enumerate(msgs):
        s = start + i * step
        out.append(f"2026-08-12T10:{s // 60 % 60:02d}:{s % 60:02d}+0000 spark-2 kernel: {msg}")
    return "\n".join(out)


def _kernel(text: str) -> KernelLog:
    return KernelLog(
        "journalctl -k -b", 5000, tuple(parse_kernel_log(text)), aer=tuple(parse_aer(text))
    )


# ------------------------------------------------------------------------------ parsers


def test_list_boots_header_is_not_a_boot() -> None:
    boots = parse_list_boots((FIXTURES / "list_boots_header_one.txt").read_text())
    assert [(b.index, b.boot_id) for b in boots] == [(0, "91ba79757a54480b855d9606ce19d16a")]
    assert boots[0].last == "Thu 2026-09-03 15:04:54 UTC"


def test_list_boots_two_and_old_form() -> None:
    two = parse_list_boots((FIXTURES / "list_boots_two.txt").read_text())
    assert [b.index for b in two] == [-1, 0]
    assert two[0].first == "Sun 2026-08-23 11:26:39 EDT"
    assert two[0].last == "Sun 2026-09-06 14:04:50 EDT"
    old = parse_list_boots((FIXTURES / "list_boots_old_emdash.txt").read_text())
    assert (old[0].index, old[0].last) == (-168, "Thu 2019-08-01 10:15:36 BST")
    assert parse_list_boots("-- No entries --\n") == []
    with pytest.raises(ParseError, match="BOOT-ID"):
        parse_list_boots("Failed to determine boots: No data available\n")


@pytest.mark.parametrize(
    ("name", "severity", "fatal"),
    [
        ("aer_corrected_old.txt", "correctable", False),
        ("aer_correctable_new.txt", "correctable", False),
        ("aer_uncorrected_fatal.txt", "uncorrectable", True),
    ],
)
def test_aer_both_spellings(name: str, severity: str, fatal: bool) -> None:
    events = parse_aer((FIXTURES / name).read_text())
    assert len(events) == 2  # the received line and the PCIe Bus Error line
    assert {(e.severity, e.fatal) for e in events} == {(severity, fatal)}
    assert not any(e.on_cx7 for e in events)  # Intel root ports, not a Spark's CX-7


def test_aer_source_device_and_cx7() -> None:
    text = _journal(
        [
            "pcieport 0002:00:00.0: AER: Uncorrectable (Fatal) error received: 0002:01:00.0",
            "mlx5_core 0002:01:00.0: PCIe Bus Error: severity=Uncorrectable (Fatal), "
            "type=Transaction Layer, (Requester ID)",
        ]
    )
    events = parse_aer(text)
    assert [(e.device, e.source, e.fatal) for e in events] == [
        ("0002:00:00.0", "0002:01:00.0", True),
        ("0002:01:00.0", "0002:01:00.0", True),
    ]
    assert all(e.on_cx7 and e.at is not None for e in events)


def test_xid_lines_of_gb10_and_their_times() -> None:
    events = parse_kernel_log(_journal((FIXTURES / "xid_gb10.txt").read_text().splitlines()))
    assert [(e.xid, e.pci) for e in events] == [
        (119, "000f:01:00"),
        (120, "000f:01:00"),
        (13, "000f:01:00"),
    ]
    assert events[1].at is not None and events[1].at - events[0].at == 1  # type: ignore[operator]
    assert line_time("[  123.456789] NVRM: x") == pytest.approx(123.456789)


def test_clean_shutdown_tails() -> None:
    blocks = (FIXTURES / "shutdown_tails.txt").read_text().split("# ")[1:]
    for block in blocks:
        kind, *lines = block.splitlines()
        assert (clean_shutdown_line(lines) is not None) == (kind == "clean"), block


# ------------------------------------------------------------------- NV_ERR_NO_MEMORY


def test_one_no_memory_line_warns_with_its_time() -> None:
    f = check_gpu_kernel_log("spark-2", _kernel(_journal([OOM], start=60)), SECTION)
    assert f.level == "warn"
    assert "1 x NVRM NV_ERR_NO_MEMORY (first 2026-08-12 10:01:00 UTC" in f.message
    assert "transient" in f.message


def test_no_memory_burst_fails() -> None:
    f = check_gpu_kernel_log("spark-2", _kernel(_journal([OOM] * 12, step=5)), SECTION)
    assert f.level == "fail"
    assert "12 x NVRM NV_ERR_NO_MEMORY" in f.message and "a burst: 12 within 600 s" in f.message
    assert "--gpu-memory-utilization" in f.message


def test_no_memory_spread_out_is_no_burst() -> None:
    events = parse_kernel_log(_journal([OOM] * 12, step=300))
    assert no_memory_burst(events, 10, 600) == []
    assert len(no_memory_burst(events, 3, 600)) == 3


# ------------------------------------------------------------------- previous boot


def _prev(tail: list[str], kernel: tuple[str, ...] = (), step: int = 1) -> PreviousBoot:
    """A previous boot whose ``kernel`` lines come ``step`` s apart, its ``tail`` right
    after them."""
    boots = tuple(parse_list_boots((FIXTURES / "list_boots_two.txt").read_text()))
    text = _journal(list(kernel), step=step)
    return PreviousBoot(
        boots,
        tail=tuple(_journal(tail, start=len(kernel) * step).splitlines()),
        lines=900,
        nvrm=tuple(parse_kernel_log(text)),
        aer=tuple(parse_aer(text)),
    )


def test_previous_boot_clean_passes() -> None:
    f = check_previous_boot("spark-2", _prev(["systemd-journald[1]: Journal stopped"]), SECTION)
    assert f.level == "pass", f.message


def test_previous_boot_unclean_names_the_nvrm_burst() -> None:
    prev = _prev(["NVRM: x"], (OOM,) * 30, step=50)
    f = check_previous_boot("spark-2", prev, SECTION)
    assert f.level == "fail"
    assert "ended without a clean shutdown" in f.message
    assert "NV_ERR_NO_MEMORY" in f.message and "open-gpu-kernel-modules#1358" in f.message
    assert "Sun 2026-08-23 11:26:39 EDT to Sun 2026-09-06 14:04:50 EDT" in f.message


def test_previous_boot_unclean_without_errors_names_a_hard_reset() -> None:
    f = check_previous_boot("spark-2", _prev(["systemd[1]: Started foo.service."]), SECTION)
    assert f.level == "fail" and "no NVRM, Xid or AER error" in f.message
    assert "power brick" in f.message


def test_previous_boot_clean_with_errors_warns() -> None:
    prev = _prev(["systemd-journald[1]: Journal stopped"], (OOM,) * 30, step=50)
    f = check_previous_boot("spark-2", prev, SECTION)
    assert f.level == "warn" and "the reboot cleared them" in f.message


def test_no_previous_boot_warns_with_the_persistence_fix() -> None:
    one = tuple(parse_list_boots((FIXTURES / "list_boots_header_one.txt").read_text()))
    f = check_previous_boot("spark-2", PreviousBoot(one), SECTION)
    assert f.level == "warn" and "/var/log/journal" in f.message


def test_probe_parse_without_previous_boot() -> None:
    out = (
        f"{MARKER} probe v1 spark-2\n{MARKER} begin boots\n"
        + (FIXTURES / "list_boots_header_one.txt").read_text()
        + f"\n{MARKER} stderr boots\n\n{MARKER} end boots rc=0\n"
    )
    facts = parse_kernel_probe(out)
    assert facts.previous is None and facts.boots is not None


# ------------------------------------------------------------------------------ AER


def test_fatal_aer_on_cx7_fails() -> None:
    text = _journal(
        [
            "pcieport 0000:00:00.0: AER: Uncorrected (Fatal) error received: 0000:01:00.0",
            "mlx5_core 0000:01:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
            "type=Transaction Layer, (Requester ID)",
        ]
    )
    f = check_pcie_aer("spark-2", _kernel(text))
    assert not isinstance(f, Skip) and f.level == "fail"
    assert "2 x uncorrectable (fatal) AER on 0000:01:00.0" in f.message
    assert "do not disable AER/ASPM" in f.message


def test_correctable_aer_warns_and_other_devices_pass() -> None:
    text = _journal(
        [
            "pcieport 0002:00:00.0: AER: Correctable error message received from 0002:01:00.1",
            "pcieport 0002:00:00.0: PCIe Bus Error: severity=Correctable, type=Physical "
            "Layer, (Receiver ID)",
        ]
    )
    f = check_pcie_aer("spark-2", _kernel(text))
    assert not isinstance(f, Skip) and f.level == "warn"
    other = check_pcie_aer("spark-2", _kernel((FIXTURES / "aer_uncorrected_fatal.txt").read_text()))
    assert not isinstance(other, Skip) and other.level == "pass"
    assert isinstance(check_pcie_aer("spark-2", KernelLog(None, 0, refused=("x",))), Skip)
