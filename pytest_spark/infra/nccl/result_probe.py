"""What rank 0 printed, read as the run's results (no I/O here): the all-reduce table and
every later sweep parsed on its own (:func:`parse_all`: ``# pytest_spark: section NAME``
lines split them), the sweeps' planned sizes (:func:`planned_sweeps`) and the progress
rank 0's output shows while it streams in (:class:`OutputStream`: every result row it prints
is one message size done)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

from pytest_spark.infra.nccl.command_probe import LATENCY_MIN_BYTES
from pytest_spark.infra.nccl.parse import (
    MAIN_SECTION,
    NcclOutput,
    ParseError,
    Row,
    parse_nccl_tests,
    split_sections,
)
from pytest_spark.infra.nccl.probe import Section, SweepProgress, SweepState

__all__ = ["OutputStream", "parse_all", "planned_sweeps"]


def _parse_one(text: str) -> tuple[NcclOutput | None, str | None]:
    try:
        return parse_nccl_tests(text), None
    except ParseError as exc:
        return None, str(exc)


def parse_all(text: str) -> tuple[NcclOutput | None, str | None, tuple[Section, ...]]:
    """The all-reduce section parsed, its error, and every later sweep parsed on its own."""
    parts = split_sections(text)
    parsed, error = _parse_one(parts.pop(MAIN_SECTION, ""))
    sections = []
    for name, body in parts.items():
        sub, sub_error = _parse_one(body)
        if sub is not None and parsed is not None and parsed.tool != sub.tool:
            # the script says what it is once, at the top: its later tables are its too
            sub = dataclasses.replace(sub, tool=parsed.tool, backend=parsed.backend)
        sections.append(Section(name, sub, sub_error))
    return parsed, error, tuple(sections)


def _doubling(low: int, high: int) -> tuple[int, ...]:
    out, size = [], low
    while size <= high:
        out.append(size - size % 4)
        size *= 2
    return tuple(out)


def planned_sweeps(
    collectives: Sequence[str], min_bytes: int, max_bytes: int, latency_max_bytes: int
) -> tuple[SweepState, ...]:
    """Each sweep's message sizes (``-b``..``-e`` doubling, as nccl-tests and the script
    step them; the latency sweep 8 B..``latency_max_bytes``), no rows yet."""
    return tuple(
        SweepState(
            name,
            _doubling(LATENCY_MIN_BYTES, latency_max_bytes)
            if name == "latency"
            else _doubling(min_bytes, max_bytes),
        )
        for name in collectives
    )


class OutputStream:
    """Rank 0's stdout as it arrives (``feed``, from the SSH reader) and the progress it
    shows (``progress``, from the waiting loop): the rows of each sweep, re-read only when
    a whole new line came in."""

    def __init__(self, planned: tuple[SweepState, ...]) -> None:
        self.planned = planned
        self._lock = threading.Lock()
        self._text: list[str] = []
        self._read = ""
        self._sweeps = planned

    def feed(self, text: str) -> None:
        with self._lock:
            self._text.append(text)

    def progress(self, elapsed: float, finished: bool) -> SweepProgress:
        with self._lock:
            text = "".join(self._text)
        whole = text[: text.rfind("\n") + 1]
        if whole != self._read:
            self._read = whole
            parts = split_sections(whole)
            self._sweeps = tuple(
                dataclasses.replace(s, rows=_rows_of(parts.get(s.name, ""))) for s in self.planned
            )
        return SweepProgress(elapsed, finished, self._sweeps)


def _rows_of(text: str) -> tuple[Row, ...]:
    parsed, _ = _parse_one(text) if text.strip() else (None, None)
    return parsed.rows if parsed is not None else ()
