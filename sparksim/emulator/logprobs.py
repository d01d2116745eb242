"""The emulated model's token logprobs, for ``prompt_logprobs`` and ``echo`` + ``logprobs``.

Deterministic for a token in its context (the previous token and the token itself), as a
model's teacher-forced logprobs are: most tokens are the model's top-1 (rank 1), some are
not. A healthy model varies by a little between requests (batch shapes change the
kernels' summation order: uniform +-0.002 a token); ``logprob-drift`` moves every token
(precision or quantization drift: -0.15 nats/token and a tenth of the top-1 tokens lose
their rank); ``garble`` moves them far (-2 nats/token, most top-1 tokens lost).
"""

from __future__ import annotations

import itertools
import random
import zlib
from dataclasses import dataclass
from typing import Any

from . import tokens as tok

NOISE = 0.002
DRIFT = 0.15
GARBLE = 2.0


@dataclass(frozen=True)
class Scored:
    token: str
    logprob: float
    rank: int
    top: str  # the model's top-1 token here (the token itself when rank 1)
    top_logprob: float


def score(text: str, faults: set[str], garble: bool) -> list[Scored]:
    """Every token of ``text`` after the first, scored given the one before it."""
    toks = tok.tokenize(text)
    noise = random.Random()
    out: list[Scored] = []
    for prev, token in itertools.pairwise(toks):
        h = zlib.crc32(f"{prev}\x00{token}".encode())
        logprob = -(0.02 + 3.0 * ((h % 1000) / 1000.0) ** 2) + noise.uniform(-NOISE, NOISE)
        rank = 1 if h % 10 < 7 else 2 + (h >> 8) % 4
        if "logprob-drift" in faults:
            logprob -= DRIFT
            if rank == 1 and (h >> 12) % 10 == 0:
                rank = 2
        if garble:
            logprob -= GARBLE
            if rank == 1 and (h >> 12) % 10 < 6:
                rank = 3
        if rank == 1:
            out.append(Scored(token, logprob, 1, token, logprob))
        else:
            alt = f" {'xyzw'[(h >> 4) % 4]}{h % 97}"
            out.append(Scored(token, logprob, rank, alt, min(-0.01, logprob + 0.5)))
    return out


def prompt_logprobs(text: str, faults: set[str], garble: bool) -> list[Any]:
    """vLLM's ``prompt_logprobs`` with k = 1: None for the first token, then per token
    ``{token_id: {logprob, rank, decoded_token}}``, the top-1 beside it when it is not."""
    out: list[Any] = [None]
    for s in score(text, faults, garble):
        entry = {str(tok.token_id(s.token)): _logprob(s.logprob, s.rank, s.token)}
        if s.rank != 1:
            entry[str(tok.token_id(s.top))] = _logprob(s.top_logprob, 1, s.top)
        out.append(entry)
    return out


def echo_logprobs(text: str, faults: set[str], garble: bool) -> dict[str, Any]:
    """OpenAI's completions ``logprobs`` (k = 1) over an echoed prompt."""
    toks = tok.tokenize(text)
    scored = score(text, faults, garble)
    offsets, at = [], 0
    for t in toks:
        offsets.append(at)
        at += len(t)
    return {
        "text_offset": offsets,
        "token_logprobs": [None, *(s.logprob for s in scored)],
        "tokens": toks,
        "top_logprobs": [
            None,
            *(
                {s.token: s.logprob} if s.rank == 1 else {s.top: s.top_logprob, s.token: s.logprob}
                for s in scored
            ),
        ],
    }


def _logprob(value: float, rank: int, token: str) -> dict[str, Any]:
    return {"logprob": value, "rank": rank, "decoded_token": token}
