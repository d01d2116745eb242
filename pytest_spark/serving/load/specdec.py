"""Speculative decoding read from ``/metrics`` around the throughput levels (issue #27 part 1).

vLLM registers its spec-decode counters only when served with ``--speculative-config``
(``vllm/v1/spec_decode/metrics.py`` ``SpecDecodingProm``), as ``<name>_total`` with the
labels ``model_name`` and ``engine`` (and ``position``): ``vllm:spec_decode_num_drafts``,
``..._num_draft_tokens``, ``..._num_accepted_tokens``, ``..._num_accepted_tokens_per_pos``.
Its own formulas (same file): acceptance rate = accepted / draft tokens; mean acceptance
length = 1 + accepted / drafts; per-position acceptance = accepted at position N / drafts.

A collapse: drafts so often rejected that each step's draft and verify cost outweighs the
tokens it gains, and the stream decodes slower than it would without drafting
(MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#142: ~33% acceptance, 12 tok/s against the
36 claimed).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

METHODS = ("mtp", "eagle", "eagle3", "dflash", "ngram", "medusa", "draft_model", "suffix")


def spec_config(raw: str | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``--speculative-config``'s JSON as a dict (None: not given or unreadable)."""
    if isinstance(raw, Mapping):
        return dict(raw)
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class SpecFigures:
    """The spec-decode counters' growth over a window (one level, or several)."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_pos: tuple[float, ...]

    @property
    def acceptance(self) -> float | None:
        """Accepted / draft tokens (vLLM's "Avg Draft acceptance rate")."""
        return self.accepted / self.draft_tokens if self.draft_tokens > 0 else None

    @property
    def mean_length(self) -> float | None:
        """1 + accepted / drafts: tokens a decode step yields on average."""
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None

    @property
    def per_pos_rate(self) -> tuple[float, ...]:
        """Accepted at position N / drafts, N = 0, 1, ..."""
        return tuple(a / self.drafts for a in self.per_pos) if self.drafts > 0 else ()

    @property
    def num_spec_tokens(self) -> int | None:
        return round(self.draft_tokens / self.drafts) if self.drafts > 0 else None

    def __add__(self, other: SpecFigures) -> SpecFigures:
        n = max(len(self.per_pos), len(other.per_pos))
        pad = (0.0,) * n
        return SpecFigures(
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted + other.accepted,
            tuple(
                a + b
                for a, b in zip((self.per_pos + pad)[:n], (other.per_pos + pad)[:n], strict=True)
            ),
        )

    def text(self) -> str:
        """``acceptance 72.0% (1440 of 2000 draft tokens), mean accepted length 3.16,
        per position 0.90/0.72/0.54``."""
        acc, mean = self.acceptance, self.mean_length
        per = "/".join(f"{r:.2f}" for r in self.per_pos_rate)
        return (
            f"acceptance {100 * (acc or 0):.1f}% ({self.accepted:g} of {self.draft_tokens:g} "
            f"draft tokens), mean accepted length {mean or 0:.2f}"
            + (f", per position {per}" if per else "")
        )

    def to_dict(self) -> dict[str, Any]:
        acc, mean = self.acceptance, self.mean_length
        return {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted": self.accepted,
            "acceptance": round(acc, 4) if acc is not None else None,
            "mean_length": round(mean, 3) if mean is not None else None,
            "per_pos": [round(r, 4) for r in self.per_pos_rate],
        }


def level_spec(metrics: Mapping[str, Any] | None) -> SpecFigures | None:
    """A level's spec-decode growth from ``LevelResult.metrics`` (metricsnap.level_metrics):
    None when the server exports no spec-decode counters."""
    if not metrics:
        return None
    before, after = (
        (metrics.get("before") or {}).get("spec"),
        (metrics.get("after") or {}).get("spec"),
    )
    if not isinstance(before, Mapping) or not isinstance(after, Mapping):
        return None
    b_pos, a_pos = list(before.get("per_pos") or ()), list(after.get("per_pos") or ())
    b_pos += [0.0] * (len(a_pos) - len(b_pos))
    return SpecFigures(
        after["drafts"] - before["drafts"],
        after["draft_tokens"] - before["draft_tokens"],
        after["accepted"] - before["accepted"],
        tuple(a - b for a, b in zip(a_pos, b_pos, strict=False)),
    )


def total(figures: Iterable[SpecFigures | None]) -> SpecFigures | None:
    """The sum of several windows' figures (None when none has any)."""
    out: SpecFigures | None = None
    for f in figures:
        if f is not None:
            out = f if out is None else out + f
    return out


@dataclass(frozen=True)
class SpecVerdict:
    """What the check concludes: ``kind`` is ``ok``, ``low`` (acceptance under the minimum,
    tok/s still above no drafting) or ``collapse`` (and fewer tok/s than no drafting)."""

    kind: str
    measured: str
    fix: str = ""


FIX_COLLAPSE = (
    "drafting costs more than it gains: lower num_speculative_tokens in "
    "--speculative-config (1-2 for a weak draft), or serve without --speculative-config; "
    "check the draft model matches the target (same tokenizer and checkpoint family: an MTP "
    "head of another quantization or revision, or an EAGLE head trained for another model, "
    "accepts little)"
)
FIX_LOW = (
    "drafts are mostly rejected: check the draft model matches the target (tokenizer, "
    "revision, quantization), lower num_speculative_tokens, or lower "
    "spec_decode.min_acceptance if this method and workload accept this little"
)


def judge(
    figures: SpecFigures,
    tok_s: float | None,
    no_draft_tok_s: float,
    min_acceptance: float,
    no_draft_source: str,
) -> SpecVerdict:
    """Acceptance against the profile's minimum; below it, the single-stream tok/s against
    what decode would give without drafting names a collapse."""
    acc = figures.acceptance or 0.0
    shown = figures.text()
    if acc >= min_acceptance:
        return SpecVerdict("ok", shown)
    speed = f"{tok_s:.1f} tok/s" if tok_s is not None else "tok/s not measured"
    if tok_s is not None and tok_s < no_draft_tok_s:
        return SpecVerdict(
            "collapse",
            f"speculative decoding collapsed: {shown}, expected >= {100 * min_acceptance:g}%; "
            f"single-stream decode {speed}, fewer than the {no_draft_tok_s:g} tok/s expected "
            f"without drafting ({no_draft_source})",
            FIX_COLLAPSE,
        )
    return SpecVerdict(
        "low",
        f"speculative decoding acceptance {100 * acc:.1f}% below the minimum "
        f"{100 * min_acceptance:g}%: {shown}; single-stream decode {speed} (no drafting: "
        f"{no_draft_tok_s:g} tok/s, {no_draft_source})",
        FIX_LOW,
    )
