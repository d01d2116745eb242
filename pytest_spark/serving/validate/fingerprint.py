"""The model's fingerprint and the baseline it is compared with (pure).

The teacher-forced logprobs of a fixed passage (vLLM's ``prompt_logprobs`` on
``/v1/completions``, or ``echo`` with ``logprobs``): the mean token logprob and the share of
positions where the passage's token is the model's top-1. Compared with a baseline recorded
on an accepted run of the same model, serve args and vLLM version: numeric drift in models
too small for the canaries (``accuracy``). The baseline also keeps the canaries' recorded
answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_spark.infra.finding import Finding
from pytest_spark.serving.validate.accuracy import Canary, Recorded, advice

PASSAGE = (
    "The river runs past the old mill and under the stone bridge before it reaches the "
    "town. In spring the water is high and brown, and the children are told to keep away "
    "from the bank. In summer it is low and clear, and the same children wade across it "
    "to the island, where they build small dams from the round grey stones. The miller's "
    "wheel has not turned for fifty years, but the building still stands, and every "
    "autumn the town holds its market in the yard beside it. People come from the "
    "villages in the hills to sell apples, cheese and wool, and the baker sells bread "
    "from a cart by the gate. When the market closes, the lamps are lit along the bridge, "
    "and the river carries their light down towards the sea."
)


@dataclass(frozen=True)
class Fingerprint:
    """Teacher-forced logprobs of the built-in passage."""

    mean_logprob: float  # mean of the passage tokens' logprobs (the first has none)
    top1_agreement: float  # share of positions whose token is the model's top-1
    tokens: int  # positions scored
    source: str  # "prompt_logprobs" or "echo"

    def row(self) -> dict[str, Any]:
        return {
            "mean_logprob": round(self.mean_logprob, 6),
            "top1_agreement": round(self.top1_agreement, 6),
            "tokens": self.tokens,
            "source": self.source,
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Fingerprint:
        return cls(
            float(row["mean_logprob"]),
            float(row["top1_agreement"]),
            int(row["tokens"]),
            str(row.get("source", "")),
        )


FINGERPRINT_BODY = {
    "prompt": PASSAGE,
    "max_tokens": 1,
    "temperature": 0,
    "prompt_logprobs": 1,  # vLLM: each prompt token's logprob and rank, + the top-1
}
ECHO_BODY = {"prompt": PASSAGE, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}


class FingerprintError(ValueError):
    """A completion that carries no usable prompt logprobs."""


def fingerprint_of(data: dict[str, Any]) -> Fingerprint:
    """The fingerprint of a ``/v1/completions`` answer to FINGERPRINT_BODY (vLLM's
    ``choices[0].prompt_logprobs``: per prompt token ``{token_id: {logprob, rank,
    decoded_token}}``, None first) or to ECHO_BODY (OpenAI's ``logprobs``: ``tokens``,
    ``token_logprobs`` and ``top_logprobs`` over the echoed prompt and the answer)."""
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(choice, dict):
        raise FingerprintError("the completion has no choices[0]")
    prompt = choice.get("prompt_logprobs") or data.get("prompt_logprobs")
    if isinstance(prompt, list) and prompt:
        return _from_prompt_logprobs(prompt)
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict) and logprobs.get("token_logprobs"):
        usage = data.get("usage") or {}
        return _from_echo(logprobs, int(usage.get("prompt_tokens") or 0))
    raise FingerprintError(
        "no prompt logprobs in the answer (neither choices[0].prompt_logprobs nor an echoed "
        "choices[0].logprobs)"
    )


def _from_prompt_logprobs(positions: list[Any]) -> Fingerprint:
    logps: list[float] = []
    top1 = 0
    for entry in positions[1:]:
        if not isinstance(entry, dict) or not entry:
            continue
        ranked = [v for v in entry.values() if isinstance(v, dict)]
        # The prompt's own token is the one with the highest rank number when the top-1
        # differs from it (vLLM lists the prompt token and the top-k): rank 1 is top-1.
        own = max(ranked, key=lambda v: int(v.get("rank") or 1), default=None)
        if own is None or not isinstance(own.get("logprob"), int | float):
            continue
        logps.append(max(float(own["logprob"]), -100.0))  # -inf: masked, count it as -100
        top1 += int(own.get("rank") or 1) == 1
    if not logps:
        raise FingerprintError("prompt_logprobs holds no scored position")
    return Fingerprint(sum(logps) / len(logps), top1 / len(logps), len(logps), "prompt_logprobs")


def _from_echo(logprobs: dict[str, Any], prompt_tokens: int) -> Fingerprint:
    values = logprobs.get("token_logprobs") or []
    tokens = logprobs.get("tokens") or []
    tops = logprobs.get("top_logprobs") or []
    end = prompt_tokens or len(values)
    logps: list[float] = []
    top1 = 0
    for i in range(1, min(end, len(values))):
        value = values[i]
        if not isinstance(value, int | float):
            continue
        logps.append(max(float(value), -100.0))
        top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
        best = max(top.items(), key=lambda kv: kv[1])[0] if top else None
        top1 += best is not None and i < len(tokens) and best == tokens[i]
    if not logps:
        raise FingerprintError("the echoed logprobs hold no scored position")
    return Fingerprint(sum(logps) / len(logps), top1 / len(logps), len(logps), "echo")


@dataclass(frozen=True)
class Baseline:
    """What a run is compared with, and where it came from: a fingerprint and the canaries'
    recorded answers (either may be missing: a record run with the fingerprint off, or a
    baseline from before answers were recorded)."""

    fingerprint: Fingerprint | None
    origin: str  # "the history, recorded ..." or a path
    canaries: tuple[Recorded, ...] | None = None

    def recorded(self, canary: Canary) -> Recorded | None:
        """The recorded answer to the same question (kind and prompt), if any."""
        for entry in self.canaries or ():
            if entry.kind == canary.kind and entry.prompt == canary.prompt:
                return entry
        return None


def check_fingerprint(
    now: Fingerprint,
    baseline: Baseline | None,
    *,
    max_logprob_delta: float,
    max_top1_delta: float,
    server: str,
    api_only: bool = False,
) -> Finding:
    """This run's fingerprint against the baseline: the mean logprob within
    ``max_logprob_delta`` (nats) and the top-1 agreement within ``max_top1_delta``."""
    figures = (
        f"mean logprob {now.mean_logprob:.4f}, top-1 agreement {now.top1_agreement:.3f} "
        f"over {now.tokens} tokens"
    )
    if baseline is None or baseline.fingerprint is None:
        return Finding.passed(
            round(now.mean_logprob, 4),
            None,
            "nats/token",
            message=f"{server}: {figures}; no baseline yet: this run's is recorded",
        )
    base = baseline.fingerprint
    d_logprob = now.mean_logprob - base.mean_logprob
    d_top1 = now.top1_agreement - base.top1_agreement
    versus = (
        f"{figures}; baseline ({baseline.origin}) {base.mean_logprob:.4f} and "
        f"{base.top1_agreement:.3f}: {d_logprob:+.4f} nats/token, {d_top1:+.3f} top-1"
    )
    if abs(d_logprob) <= max_logprob_delta and abs(d_top1) <= max_top1_delta:
        return Finding.passed(
            round(now.mean_logprob, 4),
            round(base.mean_logprob, 4),
            "nats/token",
            message=f"{server}: fingerprint within tolerance: {versus}",
        )
    if now.tokens != base.tokens:
        cause = (
            f"the passage was {now.tokens} tokens here and {base.tokens} in the baseline: "
            "another tokenizer or chat template, so another model or revision: record a "
            "new baseline for it"
        )
    else:
        cause = advice("drift", api_only)
    return Finding.failed(
        round(now.mean_logprob, 4),
        round(base.mean_logprob, 4),
        "nats/token",
        message=(
            f"{server}: the model's numbers moved from its baseline: {versus} (tolerance "
            f"{max_logprob_delta} nats/token, {max_top1_delta} top-1).\nLikely layer: {cause}"
        ),
    )
