"""Secrets never leave the session: the API key, bearer tokens and passwords in URLs are
replaced in every report (terminal, JUnit XML, JSON results, HTML) before anyone reads it.

Two layers: :class:`Redactor` rewrites text and JSON-like values; :class:`Sanitizer` (a
plugin, on the controller and on xdist workers) applies it to each test report as it is
logged (``longrepr``, captured sections, ``user_properties``, pytest-html extras), before
the terminal, JUnit XML, the JSON recorder and pytest-html see it.
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import markupsafe
import pytest

REDACTED = "<redacted>"
MIN_SECRET_LEN = 4  # shorter "secrets" would shred ordinary text; such keys are refused
SECRET_ENV = ("VLLM_API_KEY", "OPENAI_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
_VALUE = r"[^\s\"',;\]\}<>&]{3,}"
PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # scheme://user:password@host -> scheme://user:<redacted>@host
    (
        re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@'\"<>]*:)([^/\s@'\"<>]+)(?=@)"),
        rf"\g<1>{REDACTED}",
    ),
    (re.compile(r"(?i)(\b(?:bearer|basic)\s+)([A-Za-z0-9\-._~+/]{6,}=*)"), rf"\g<1>{REDACTED}"),
    (re.compile(r"(?i)(--(?:spark-)?api-key[ =]['\"]?)([^\s'\"]+)"), rf"\g<1>{REDACTED}"),
    (
        re.compile(
            r"(?i)((?<![a-z0-9])(?:api[_-]?key|access[_-]?token|auth[_-]?token|hf[_-]?token|"
            r"client[_-]?secret|secret[_-]?key|password|passwd)['\"]?\s*[:=]\s*\[?\s*"
            rf"['\"]?)({_VALUE})"
        ),
        rf"\g<1>{REDACTED}",
    ),
)

# One search for "does any pattern match" (each pattern's leading (?i) made scoped).
_ANY_PATTERN = re.compile(
    "|".join(
        f"(?i:{p.pattern[4:]})" if p.pattern.startswith("(?i)") else f"(?:{p.pattern})"
        for p, _ in PATTERNS
    )
)
MEMO_MAX_LEN = 4096
MEMO_MAX_ENTRIES = 50_000


class Redactor:
    """Replaces known secret values (and what looks like a credential) in text."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if not secret or len(secret) < MIN_SECRET_LEN:
                continue
            forms |= {
                secret,
                html.escape(secret),
                str(markupsafe.escape(secret)),  # the report's templates (jinja2 autoescape)
                json.dumps(secret)[1:-1],
                quote(secret),
                quote(secret, safe=""),
            }
        self.secrets = sorted(forms, key=len, reverse=True)
        # text() is pure for a given set of secrets and reports repeat the same strings
        # (node names, keys, messages) in every test: remember short results.
        self._memo: dict[str, str] = {}

    @classmethod
    def from_settings(cls, settings: Any, environ: dict[str, str] | None = None) -> Redactor:
        env = os.environ if environ is None else environ
        secrets = [
            getattr(settings, "api_key", None),
            _read(getattr(settings, "api_key_file", None)),
        ]
        secrets += [env.get(name) for name in SECRET_ENV]
        return cls(secrets)

    def text(self, value: str) -> str:
        done = self._memo.get(value)
        if done is not None:
            return done
        original = value
        for secret in self.secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        if _ANY_PATTERN.search(value):  # no pattern matches: every sub() is a no-op
            for pattern, repl in PATTERNS:
                value = pattern.sub(repl, value)
        if len(original) <= MEMO_MAX_LEN and len(self._memo) < MEMO_MAX_ENTRIES:
            self._memo[original] = value
        return value

    def value(self, obj: Any) -> Any:
        """A copy of a JSON-like value with every string redacted (keys included)."""
        if isinstance(obj, str):
            return self.text(obj)
        if isinstance(obj, dict):
            return {self.value(k): self.value(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.value(v) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self.value(v) for v in obj)
        return obj

    def inplace(self, obj: Any, depth: int = 0) -> Any:
        """Redact pytest's report objects (dataclass reprs, tuples, lists) in place where
        they are mutable; returns the (possibly new) object."""
        if depth > 12:
            return obj
        if isinstance(obj, str | dict):
            return self.value(obj)
        if isinstance(obj, tuple):
            return tuple(self.inplace(v, depth + 1) for v in obj)
        if isinstance(obj, list):
            obj[:] = [self.inplace(v, depth + 1) for v in obj]
            return obj
        # pytest's repr objects (ReprExceptionInfo, ReprEntry, CollectErrorRepr, ...)
        is_repr = dataclasses.is_dataclass(obj) or type(obj).__module__.startswith("_pytest")
        if is_repr and not isinstance(obj, type) and hasattr(obj, "__dict__"):
            for name, old in list(vars(obj).items()):
                new = self.inplace(old, depth + 1)
                if new is not old:
                    object.__setattr__(obj, name, new)
        return obj


def _read(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


class Sanitizer:
    """Redacts each report before the terminal, JUnit XML, JSON results and pytest-html
    read it (registered last, so its ``tryfirst`` hooks run before the other plugins')."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor

    def sanitize(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        r = self.redactor
        report.longrepr = r.inplace(report.longrepr)
        report.sections = [(r.text(t), r.text(c)) for t, c in report.sections]
        if isinstance(report, pytest.TestReport):
            report.user_properties = [
                (name, self._property(value)) for name, value in report.user_properties
            ]
        extras = getattr(report, "extras", None)
        if isinstance(extras, list):
            for extra in extras:
                if isinstance(extra, dict) and extra.get("format_type") in (
                    "html",
                    "text",
                    "json",
                    "url",
                ):
                    extra["content"] = r.value(extra.get("content"))

    def _property(self, value: Any) -> Any:
        """A user property redacted; one that is a JSON object in text (a check's finding,
        ``results.finding_property``) is redacted as the object, so that what is replaced
        never breaks its JSON."""
        clean = self.redactor.value(value)
        if not isinstance(value, str) or clean == value or not value.startswith("{"):
            return clean
        try:
            decoded = json.loads(value)
        except ValueError:
            return clean
        return json.dumps(self.redactor.value(decoded), default=str, ensure_ascii=False)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.sanitize(report)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self.sanitize(report)
