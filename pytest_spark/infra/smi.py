"""nvidia-smi's query CSV (``--query-gpu=FIELDS --format=csv,noheader,nounits``), read the
same way by every check that asks it (GPU health at rest, the clock under load). GB10
reports many fields as ``[N/A]``: such a value is ``None``, never a failure of the parser.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pytest_spark.infra.errors import ParseError

__all__ = ["QueryRow", "parse_query_gpu", "to_float"]

_NA = {"", "[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", "unknown"}


def to_float(text: str | None) -> float | None:
    """``41``, ``4.21 W``, ``3003 MHz``, ``45 C``, ``10 %`` -> the number; N/A -> None."""
    if text is None or text.strip().lower() in _NA:
        return None
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", text)
    return float(m[1]) if m else None


@dataclass(frozen=True)
class QueryRow:
    """One GPU's ``--query-gpu`` answer: field -> raw value (None for N/A)."""

    values: dict[str, str | None]

    def text(self, field: str) -> str | None:
        return self.values.get(field)

    def number(self, field: str) -> float | None:
        return to_float(self.values.get(field))


def parse_query_gpu(text: str, fields: tuple[str, ...]) -> list[QueryRow]:
    """``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits``: one row per GPU,
    the values in the order asked. A row with another column count is not this format."""
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            raise ParseError(
                "nvidia-smi --query-gpu",
                f"expected {len(fields)} columns ({','.join(fields)}), got {len(cells)}",
                line,
                lineno,
            )
        values = {f: (None if c.lower() in _NA else c) for f, c in zip(fields, cells, strict=True)}
        rows.append(QueryRow(values))
    return rows
