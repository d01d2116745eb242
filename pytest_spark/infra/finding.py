"""The result types every check returns: a :class:`Finding`, or a :class:`Skip` when the
check does not apply or cannot be made."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Level = Literal["pass", "warn", "fail"]


class CheckNote(UserWarning):
    """How a check came to its verdict, when the way matters to whoever reads it (a request
    asked again alone after it ran out of time beside others): not a finding about the
    cluster. Warned from inside a check, it stays in pytest's warnings summary and is kept
    with the check (``notes`` in the results, under the check's row in the report)."""


@dataclass(frozen=True)
class Finding:
    """What one check concluded about one node (or the cluster).

    ``message`` is written for a person: on failure it names the node and interface,
    what was measured, what was expected and what usually fixes it (STYLE.md).
    """

    level: Level
    measured: Any
    expected: Any
    unit: str | None = None
    message: str = ""
    node: str | None = None
    evidence: dict[str, str] = field(default_factory=dict)
    # A numeric threshold's direction: ">=" (a floor) or "<=" (a ceiling); the report
    # prints it beside ``expected`` (None: words, or read off the verdict).
    bound: str | None = None

    @property
    def ok(self) -> bool:
        return self.level != "fail"

    @classmethod
    def passed(
        cls,
        measured: Any,
        expected: Any,
        unit: str | None = None,
        *,
        node: str | None = None,
        message: str = "",
        bound: str | None = None,
    ) -> Finding:
        return cls("pass", measured, expected, unit, message, node, bound=bound)

    @classmethod
    def failed(
        cls,
        measured: Any,
        expected: Any,
        unit: str | None = None,
        *,
        node: str | None = None,
        message: str,
        evidence: dict[str, str] | None = None,
        bound: str | None = None,
    ) -> Finding:
        return cls("fail", measured, expected, unit, message, node, evidence or {}, bound)

    @classmethod
    def warned(
        cls,
        measured: Any,
        expected: Any,
        unit: str | None = None,
        *,
        node: str | None = None,
        message: str,
        evidence: dict[str, str] | None = None,
        bound: str | None = None,
    ) -> Finding:
        return cls("warn", measured, expected, unit, message, node, evidence or {}, bound)


@dataclass(frozen=True)
class Skip:
    """The check does not apply or cannot be made; ``reason`` says why (the suite file
    turns it into ``pytest.skip(reason)``, citing the cause where another check owns it)."""

    reason: str
