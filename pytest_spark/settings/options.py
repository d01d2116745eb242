"""Parsers of the report options (``--spark-history``, ``--spark-compare``,
``--spark-compare-fail``). Pure: raise ValueError with the fix; settings.py names the source.
Kept free of imports from the rest of the package (settings.py imports this module)."""

from __future__ import annotations

import re
from pathlib import Path

FAMILIES = ("busbw", "tok_s", "ttft", "tpot", "load")
_METRIC = re.compile(rf"^(?:{'|'.join(FAMILIES)})(?:[._@][\w.@\[\]-]*)?$")
OFF = frozenset({"off", "none", "no", "false", "0"})


def history_dir(raw: str) -> Path | None:
    """A directory, or None for ``off`` (no history is kept or read)."""
    text = raw.strip()
    if not text:
        raise ValueError("must be a directory, or 'off'")
    if text.lower() in OFF:
        return None
    return Path(text).expanduser()


def run_ref(raw: str) -> str:
    """``last``, a run number (``3``, ``0003``), a history file name or a path."""
    text = raw.strip()
    if not text or any(c in text for c in "\n\r\t"):
        raise ValueError("must be 'last', a run number such as 0003, or a history file")
    return text


def compare_fail(raw: str) -> tuple[tuple[str, float], ...]:
    """``tok_s:10%,busbw:5%`` -> (("tok_s", 10.0), ("busbw", 5.0))."""
    specs: list[tuple[str, float]] = []
    for item in raw.replace("\n", ",").split(","):
        item = item.strip()
        if not item:
            continue
        metric, sep, pct = item.rpartition(":")
        metric = metric.strip()
        if not sep or not metric:
            raise ValueError(f"{item!r} is not METRIC:PCT (e.g. tok_s:10%,busbw:5%)")
        if not _METRIC.match(metric):
            raise ValueError(
                f"unknown metric {metric!r}: use a family ({', '.join(FAMILIES)}) or one "
                "figure such as tok_s@4, ttft_p90@1, tpot_p50@4 or load.weights"
            )
        text = pct.strip().removesuffix("%").strip()
        try:
            value = float(text)
        except ValueError:
            raise ValueError(
                f"{pct.strip()!r} in {item!r} is not a percentage (e.g. 10%)"
            ) from None
        if not 0 < value < 1000:
            raise ValueError(f"{item!r}: the percentage must be above 0 (e.g. 10%)")
        specs.append((metric, value))
    if not specs:
        raise ValueError("must be METRIC:PCT[,METRIC:PCT] (e.g. tok_s:10%,busbw:5%)")
    return tuple(specs)
