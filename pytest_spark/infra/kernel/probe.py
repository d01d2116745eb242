"""One-round-trip probe of a node's previous boot, and the facts parsed from it.

``kernel_probe_command()`` is one ``sh -c`` command printing marker-framed sections
(:func:`pytest_spark.infra.probe.probe_script`)::

    boots       journalctl --list-boots: the boots the journal holds (one, boot 0,
                when it is not persistent: /var/log/journal missing)
    prev_tail   journalctl -b -1 -n 15 -o short-iso: the previous boot's last lines,
                every unit's (a clean shutdown is systemd's and journald's lines)
    prev_events journalctl -k -b -1 -o short-iso, its line count (``lines N``) and the
                NVRM / Xid / AER lines only (the last 400)

This boot's NVRM, Xid and AER lines come with the GPU health part of the preflight probe
(:mod:`pytest_spark.infra.gpuhealth.probe`, ``kernel_log``), which reads ``journalctl
-k -b`` and falls back to ``dmesg``. ``dmesg`` holds no previous boot: without a
persistent journal the previous boot is not readable, and the check says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.hostprobe import HostProbe
from pytest_spark.infra.kernel.parse import Boot, parse_list_boots
from pytest_spark.infra.kernellog import AerEvent, KernelEvent, parse_aer, parse_kernel_log
from pytest_spark.infra.probe import ProbeSection, probe_script, split_probe

__all__ = ["HOST_PROBE", "MARKER", "PreviousBoot", "kernel_probe_command", "parse_kernel_probe"]

MARKER = "@@pytest-spark-kernel@@"
TAIL_LINES = 15

_BODY = r"""
s boots journalctl --list-boots --no-pager -q
s prev_tail journalctl -b -1 -n @TAIL@ --no-pager -q -o short-iso
s prev_events sh -c 'journalctl -k -b -1 --no-pager -q -o short-iso 2>/dev/null |
  awk "{ n++ } /NVRM|Xid|AER|PCIe Bus Error/ { print } END { print \"lines \" n+0 }" |
  tail -n 401'
rm -f "$t"
"""


def kernel_probe_command(*, timeout_s: int = 20) -> str:
    """The node probe as one ``sh -c`` command (run it once per node)."""
    return probe_script(MARKER, "kernel", timeout_s, _BODY.replace("@TAIL@", str(TAIL_LINES)))


@dataclass(frozen=True)
class PreviousBoot:
    """A node's previous boot as its journal holds it. ``boots``: every boot listed
    (None with ``error`` when the journal could not be read); ``tail``: the previous
    boot's last lines (empty when the journal holds no previous boot); ``lines``: its
    kernel line count; ``nvrm``: its NVRM / Xid errors, ``aer``: its AER lines."""

    boots: tuple[Boot, ...] | None
    error: str | None = None
    tail: tuple[str, ...] = ()
    lines: int = 0
    nvrm: tuple[KernelEvent, ...] = ()
    aer: tuple[AerEvent, ...] = ()

    @property
    def previous(self) -> Boot | None:
        return next((b for b in self.boots or () if b.index == -1), None)


def _why(section: ProbeSection | None, what: str) -> str:
    if section is None:
        return f"{what} was not probed"
    return section.problem() or f"{what}: exit {section.rc}"


def parse_kernel_probe(text: str) -> PreviousBoot:
    """The facts from the probe's output (``ParseError`` on a list of boots that does
    not read as one)."""
    _, sections = split_probe(text, MARKER, "kernel probe")
    boots = sections.get("boots")
    if boots is None or boots.rc != 0:
        return PreviousBoot(None, _why(boots, "journalctl --list-boots"))
    listed = tuple(parse_list_boots(boots.stdout))
    if not any(b.index == -1 for b in listed):
        return PreviousBoot(listed)
    tail = sections.get("prev_tail")
    if tail is None or tail.rc != 0:
        return PreviousBoot(listed, _why(tail, "journalctl -b -1"))
    events = sections.get("prev_events")
    body = events.stdout.strip().splitlines() if events is not None else []
    if not body or not body[-1].startswith("lines "):
        raise ParseError("kernel probe", "expected `lines N` last in prev_events")
    text_ = "\n".join(body[:-1])
    return PreviousBoot(
        listed,
        tail=tuple(ln for ln in tail.stdout.splitlines() if ln.strip()),
        lines=int(body[-1].split()[1]),
        nvrm=tuple(parse_kernel_log(text_)),
        aer=tuple(parse_aer(text_)),
    )


# The previous-boot probe rides the node's one host round trip (infra.roundtrip).
HOST_PROBE: HostProbe[PreviousBoot] = HostProbe(
    key="kernel",
    command=lambda settings, container: kernel_probe_command(),
    parse=lambda text, settings: parse_kernel_probe(text),
)
