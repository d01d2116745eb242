"""The match patterns of a ``[[known_bad.deny]]`` / ``[[known_bad.allow]]`` entry. Pure.

Forms (one string each; an entry's ``match`` is a list, any of which matching matches):

- ``590.`` (also ``590.x``, ``590.*``): a version prefix. ``590`` alone matches ``590``
  and ``590.<anything>``, never ``5901``.
- ``>=590 <591`` (also comma-separated; operators ``>= > <= < ==``): a range, compared as
  numbers part by part (``580.95.05`` < ``580.126.09``); a value with no number in it does
  not match.
- ``re:REGEX``: the regular expression searched in the value's text (NCCL: the version
  string, e.g. ``2.28.9+cuda13.0``).
- ``sha256:HEX`` / ``build-id:HEX``: NCCL only, the loaded library's sha256 or ELF GNU
  Build ID (``readelf -n``) starts with HEX: a build, where the version string cannot tell
  a development build from the release.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from pytest_spark.infra.errors import ParseError

_OPS: dict[str, Callable[[tuple[int, ...], tuple[int, ...]], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    ">": operator.gt,
    "<": operator.lt,
}
_COMPARATOR = re.compile(r"(>=|<=|==|>|<)\s*(\d+(?:\.\d+)*)")


def version_key(text: str) -> tuple[int, ...] | None:
    """The leading dotted number of ``text`` as a tuple (``580.95.05`` -> (580, 95, 5);
    ``28.45.4028 (NVD0000000087)`` -> (28, 45, 4028)), or None without one."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
    return tuple(int(p) for p in m[1].split(".")) if m else None


@dataclass(frozen=True)
class Value:
    """What a rule is matched against on one node: the text a person reads, and for NCCL
    the library's sha256."""

    text: str
    sha256: str | None = None
    build_id: str | None = None


@dataclass(frozen=True)
class Pattern:
    source: str  # as written in the profile
    test: Callable[[Value], bool]

    def matches(self, value: Value) -> bool:
        return self.test(value)


def _prefix(prefix: str) -> Callable[[Value], bool]:
    def test(value: Value) -> bool:
        text = value.text.strip()
        if prefix.endswith("."):
            return text.startswith(prefix)
        return text == prefix or text.startswith(prefix + ".") or text.startswith(prefix + " ")

    return test


def _range(spec: str, comparators: list[tuple[str, str]]) -> Callable[[Value], bool]:
    bounds = [(_OPS[op], tuple(int(p) for p in num.split("."))) for op, num in comparators]

    def test(value: Value) -> bool:
        key = version_key(value.text)
        if key is None:
            return False
        # compare as many parts as the bound gives: "<591" holds for 590.48.01
        return all(op(key[: len(b)], b) for op, b in bounds)

    return test


def parse_pattern(spec: str) -> Pattern:
    """One match string as a :class:`Pattern`; ParseError naming the forms when it is none."""
    text = spec.strip()
    if text.startswith("re:"):
        try:
            rx = re.compile(text[3:])
        except re.error as exc:
            raise ParseError(
                "known-bad match", f"{spec!r}: bad regular expression ({exc})"
            ) from None
        return Pattern(spec, lambda v: rx.search(v.text) is not None)
    if text.startswith(("sha256:", "build-id:")):
        kind, _, want = text.partition(":")
        want = want.lower()
        if not re.fullmatch(r"[0-9a-f]{8,64}", want):
            raise ParseError("known-bad match", f"{spec!r}: expected {kind}: and 8-64 hex digits")
        field = "sha256" if kind == "sha256" else "build_id"

        def build(v: Value) -> bool:
            have = getattr(v, field)
            return have is not None and have.lower().startswith(want)

        return Pattern(spec, build)
    if text[:1] and text[0] in "<>=":
        parts = [p for p in re.split(r"[\s,]+", text) if p]
        comparators = [_COMPARATOR.fullmatch(p) for p in parts]
        if not all(comparators):
            raise ParseError(
                "known-bad match", f"{spec!r}: a range is comparators like '>=590 <591'"
            )
        return Pattern(spec, _range(text, [(m[1], m[2]) for m in comparators if m]))
    prefix = re.sub(r"\.?[x*]$", "", text)
    if not re.fullmatch(r"[0-9A-Za-z][0-9A-Za-z._+-]*\.?", prefix):
        raise ParseError(
            "known-bad match",
            f"{spec!r}: expected a version prefix ('590.'), a range ('>=590 <591'), "
            "'re:REGEX', 'sha256:HEX' or 'build-id:HEX'",
        )
    if text.endswith(("x", "*")) and not prefix.endswith("."):
        prefix += "."
    return Pattern(spec, _prefix(prefix))
