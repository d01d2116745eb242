"""The one error of every parser and probe reader: output that is not in the tool's format.

A gatherer that gets it fails the asking check with the command's evidence
(:func:`pytest_spark.infra.roundtrip.gather_probe`).
"""

from __future__ import annotations

__all__ = ["ParseError"]


class ParseError(ValueError):
    """Output that is not in the tool's format. ``line`` is the offending line, if any."""

    def __init__(
        self, tool: str, problem: str, line: str | None = None, lineno: int | None = None
    ) -> None:
        self.tool = tool
        self.problem = problem
        self.line = line
        self.lineno = lineno
        where = ""
        if line is not None:
            where = f" at line {lineno}: {line!r}" if lineno is not None else f": {line!r}"
        super().__init__(f"{tool}: {problem}{where}")
