"""Does the served model answer correctly? Canaries, a logprob fingerprint, a math set (pure).

A cluster can be up, linked, fast and parse-clean and still compute garbage: a corrupt
tensor-parallel all-reduce, a broken quantized kernel, CUDA graphs with speculative
decoding, a chat-template mismatch. Guided decoding keeps tool-call and structured-output
JSON valid whatever the weights compute, so only the *values* of answers tell. Three reads:

- **Canaries**: greedy (temperature 0) prompts whose answers need no world knowledge and
  are graded exactly: arithmetic at graded difficulty, counting, copying and reversing a
  random string, sorting five numbers, and a structured-output answer whose value is a
  computed sum (a garble gate guided decoding cannot hide). Built once from a fixed seed:
  every run, alone and under load, asks the same questions.
- **A fingerprint**: the teacher-forced logprobs of a fixed passage (vLLM's
  ``prompt_logprobs`` on ``/v1/completions``, or ``echo`` with ``logprobs``): the mean
  token logprob and the share of positions where the passage's token is the model's
  top-1. Compared with a baseline recorded on an accepted run of the same model, serve
  args and vLLM version: numeric drift in models too small for the canaries.
- **Math** (opt-in): seeded grade-school word problems with exact integer answers,
  scored against the profile's expected accuracy within a tolerance, as vLLM's
  ``tests/evals/gsm8k`` gates its releases (tolerance 0.08).
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any

from pytest_spark.infra.finding import Finding
from pytest_spark.settings.profiles import CANARY_KINDS

# tests_e2e/test_accuracy.py: a model right alone and wrong under load; the functional
# checks whose requests went out together (--spark-serving-concurrency) skip citing it.
LOAD_VERDICT = "test_canaries_under_load"
ALONE_VERDICT = "test_canaries_alone"  # tests_e2e/test_accuracy.py: a wrong model's one failure
SEED = 20261203  # the built-in set: the same questions on every run and every cluster

# What to try, by where the wrong answers showed (issue #24 part 3).
FIX_ALONE = (
    "wrong when alone: the weights, a kernel or the tensor-parallel all-reduce compute "
    "garbage. Try: re-run the server with --enforce-eager (CUDA graphs off); disable "
    "speculative decoding; serve the same model at TP=1 and compare its fingerprint "
    "(--spark-accuracy-baseline); check that every node runs the same image and vLLM "
    "(tests_infra/test_alike.py) and the same weights (test_model_dir_identical)"
)
FIX_UNDER_LOAD = (
    "right alone, wrong under load: a batch-dependent path (CUDA graphs captured for "
    "larger batches, speculative decoding's batched verification, batch-size-dependent "
    "kernels). Try: --enforce-eager; disable speculative decoding; a smaller "
    "--max-num-seqs; check image and vLLM parity across nodes"
)
FIX_DRIFT = (
    "only the fingerprint drifts: precision or quantization (a kernel path, a KV-cache "
    "dtype, a changed quantization). Try: --enforce-eager; compare with a TP=1 fingerprint "
    "of the same weights; check the serve args' --dtype / --quantization / "
    "--kv-cache-dtype against the baseline's; check image and vLLM parity across nodes"
)

# The same, for --spark-api-url alone: a server reached by its API, no cluster to act on
# (no nodes, no tensor-parallel ranks, no image parity); what the one who runs the server
# can change: which model it serves, its quantization and kernels, the chat template,
# speculative decoding.
FIX_ALONE_API = (
    "wrong when alone: the server computes garbage for this model. On the machine that "
    "serves it, check which model and revision it loaded (/v1/models; a wrong or corrupt "
    "checkpoint), its quantization and kernels (serve it unquantized or with another "
    "quantization or attention backend; on vLLM, --enforce-eager), that its chat template "
    "is the model's own, and turn speculative decoding off; then compare its fingerprint "
    "with a known-good server of the same model (--spark-accuracy-baseline)"
)
FIX_UNDER_LOAD_API = (
    "right alone, wrong under load: a batch-dependent path on the server (batched "
    "kernels, speculative decoding's batched verification). On the machine that serves "
    "it: turn speculative decoding off, lower its concurrent-sequence limit (on vLLM, "
    "--max-num-seqs), try another quantization or kernel backend (on vLLM, --enforce-eager)"
)
FIX_DRIFT_API = (
    "only the fingerprint drifts: the server's numbers changed (another quantization, "
    "dtype or KV-cache dtype, another kernel path) or it serves another revision of the "
    "model. Check what it serves (/v1/models) and how (on vLLM: --dtype, --quantization, "
    "--kv-cache-dtype) against the baseline's"
)


def advice(where: str, api_only: bool) -> str:
    """What to try for wrong answers ``where`` (``alone``, ``under_load``, ``drift``): the
    cluster's layers, or with ``api_only`` (--spark-api-url alone) the server's."""
    table = {
        "alone": (FIX_ALONE, FIX_ALONE_API),
        "under_load": (FIX_UNDER_LOAD, FIX_UNDER_LOAD_API),
        "drift": (FIX_DRIFT, FIX_DRIFT_API),
    }
    return table[where][api_only]


@dataclass(frozen=True)
class Canary:
    """One question with one right answer."""

    kind: str
    prompt: str
    expected: str  # as a person reads it
    max_tokens: int
    structured: dict[str, Any] | None = None  # a response_format (json_sum)

    def grade(self, content: str | None) -> tuple[bool, str | None]:
        """(right, the answer read from ``content``); the read answer is None when none
        of the expected shape is there."""
        text = (content or "").strip()
        if self.kind == "json_sum":
            value = _json_value(text, "sum")
            return value == int(self.expected), None if value is None else str(value)
        if self.kind in ("add", "multiply", "arithmetic"):
            numbers = _integers(text)
            got = numbers[-1] if numbers else None
            return got == int(self.expected), None if got is None else str(got)
        if self.kind in ("count", "sort"):
            numbers = _integers(text)
            joined = " ".join(map(str, numbers)) if numbers else None
            return joined == self.expected, joined
        if self.kind == "copy":
            # "Repeat this string exactly, nothing else": the answer is the string alone
            # (quotes, backticks and a closing full stop aside). Its last word is not enough:
            # a model that echoes the prompt ends with the string too.
            bare = _bare(text)
            return bare == self.expected, _clip(bare, 60) if bare else None
        words = re.findall(r"[A-Za-z0-9]+", text)
        last = words[-1] if words else None
        return last == self.expected, last


def _bare(text: str) -> str:
    """``text`` without a code fence, the quotes or backticks around it, and a closing
    full stop: what a model that answers with one string alone says, whatever its markup."""
    text = text.strip()
    fence = re.fullmatch(r"```[\w-]*\s*(.*?)\s*```", text, re.S)
    if fence:
        text = fence.group(1)
    text = text.strip().rstrip(".").strip()
    while len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'`":
        text = text[1:-1].strip()
    return text.rstrip(".").strip()


def _integers(text: str) -> list[int]:
    """The integers written in ``text`` (``10,063`` is one), in order."""
    return [int(m.replace(",", "")) for m in re.findall(r"-?\d{1,3}(?:,\d{3})+|-?\d+", text)]


def _json_value(text: str, key: str) -> int | None:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        data = json.loads(text[start : end + 1])
    except ValueError:
        return None
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _word(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("bcdfghjkmnpqrstvwxz") for _ in range(n))


SUM_SCHEMA = {
    "type": "object",
    "properties": {"sum": {"type": "integer"}},
    "required": ["sum"],
    "additionalProperties": False,
}


def canaries(kinds: tuple[str, ...] = CANARY_KINDS, seed: int = SEED) -> list[Canary]:
    """The built-in set (the same for a seed), in ``CANARY_KINDS`` order, of ``kinds``."""
    rng = random.Random(seed)
    a, b = rng.randint(11, 49), rng.randint(11, 49)
    c, d = rng.randint(12, 29), rng.randint(12, 29)
    e, f, g = rng.randint(101, 499), rng.randint(21, 89), rng.randint(101, 499)
    count_to = rng.randint(8, 12)
    copy, reverse = _word(rng, 8), _word(rng, 6)
    numbers = rng.sample(range(2, 99), 5)
    s1, s2 = rng.randint(101, 899), rng.randint(101, 899)
    only_number = "Answer with the number only."
    built = [
        Canary("add", f"What is {a} + {b}? {only_number}", str(a + b), 16),
        Canary("multiply", f"What is {c} * {d}? {only_number}", str(c * d), 16),
        Canary("arithmetic", f"What is {e} + {f} * {g}? {only_number}", str(e + f * g), 16),
        Canary(
            "count",
            f"Count from 1 to {count_to}. Write the numbers separated by spaces, nothing else.",
            " ".join(str(i) for i in range(1, count_to + 1)),
            48,
        ),
        Canary("copy", f"Repeat this string exactly, nothing else: {copy}", copy, 16),
        Canary(
            "reverse",
            f"Write the string {reverse} backwards, letter by letter reversed. "
            "Answer with the reversed string only.",
            reverse[::-1],
            16,
        ),
        Canary(
            "sort",
            "Sort these numbers from smallest to largest: "
            f"{', '.join(map(str, numbers))}. Answer with the sorted numbers only, separated "
            "by commas.",
            " ".join(map(str, sorted(numbers))),
            32,
        ),
        Canary(
            "json_sum",
            f"Compute {s1} + {s2}. Answer as a JSON object with the key sum.",
            str(s1 + s2),
            32,
            structured={
                "type": "json_schema",
                "json_schema": {"name": "sum", "schema": SUM_SCHEMA, "strict": True},
            },
        ),
    ]
    return [canary for canary in built if canary.kind in kinds]


@dataclass(frozen=True)
class Recorded:
    """A canary's answer in the baseline (``--spark-accuracy=record`` on a trusted server,
    or an accepted run): what was read from it and whether that was right."""

    kind: str
    prompt: str
    read: str | None
    right: bool

    def row(self) -> dict[str, Any]:
        return {"kind": self.kind, "prompt": self.prompt, "read": self.read, "right": self.right}

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Recorded:
        read = row.get("read")
        return cls(
            str(row["kind"]),
            str(row["prompt"]),
            None if read is None else str(read),
            bool(row["right"]),
        )


@dataclass
class Answer:
    """One canary's answer: what came back and how it graded. ``recorded``: the baseline's
    answer to the same question, when there is one. Where the baseline was right the answer
    is judged against the truth; where it was wrong, against the recorded answer (a weak
    model's own wrong answer is accepted, a changed one is drift)."""

    canary: Canary
    content: str | None
    right: bool
    read: str | None
    tokens: int = 0  # completion tokens (usage)
    error: str | None = None  # the request failed (a ServingError's message)
    reasoning: str | None = None  # what the server separated as reasoning
    recorded: Recorded | None = None

    @property
    def held_to_record(self) -> bool:
        """Judged against the baseline's (wrong) answer, not the truth."""
        return self.recorded is not None and not self.recorded.right

    @property
    def accepted(self) -> bool:
        """Right, or (where the baseline was wrong) the same answer as the baseline's."""
        if self.held_to_record:
            assert self.recorded is not None
            return self.error is None and self.read == self.recorded.read
        return self.right

    @property
    def drift(self) -> bool:
        """Held to a recorded wrong answer and answered otherwise (right or not)."""
        return self.held_to_record and not self.accepted

    def elsewhere(self) -> str | None:
        """Why a wrong answer is another behaviour's failure, not the model's: the answer
        landed in reasoning (thinking was off: the reasoning parser), or the JSON canary
        came back as plain text (response_format ignored: structured output). None when the
        answer is the model's own."""
        if self.accepted or self.error or self.held_to_record:
            return None
        if not (self.content or "").strip() and self.canary.grade(self.reasoning)[0]:
            return "reasoning"
        if self.canary.structured is not None and "{" not in (self.content or ""):
            return "structured_output"
        return None

    def quoted(self) -> str:
        got = "no answer" if self.error else repr(_clip(self.content or ""))
        if self.error:
            got += f" ({self.error})"
        if self.held_to_record:
            assert self.recorded is not None
            now = "now right" if self.right else f"read {self.read!r}"
            return (
                f"{self.canary.prompt!r} -> {got} ({now}); expected {self.recorded.read!r}, "
                f"the baseline's own answer (wrong: the truth is {self.canary.expected!r}): "
                "a changed answer is drift"
            )
        base = ""
        if self.recorded is not None:
            base = " (the baseline answered it right)"
        return f"{self.canary.prompt!r} -> {got}; expected {self.canary.expected!r}{base}"

    def recording(self) -> Recorded:
        """This answer as the baseline keeps it."""
        return Recorded(self.canary.kind, self.canary.prompt, self.read, self.right)

    def row(self) -> dict[str, Any]:
        row: dict[str, Any] = {
            "kind": self.canary.kind,
            "prompt": self.canary.prompt,
            "expected": self.canary.expected,
            "answer": self.content,
            "read": self.read,
            "right": self.right,
            "tokens": self.tokens,
            "error": self.error,
        }
        if self.recorded is not None:
            row["baseline"] = {"read": self.recorded.read, "right": self.recorded.right}
            row["accepted"] = self.accepted
        return row


def _clip(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


RECORD_OPTION = "--spark-accuracy=record"


def no_baseline_hint(
    profile: str,
    kinds: tuple[str, ...],
    key: str,
    where: str | None,
    answered: tuple[str, ...] = (),
) -> str:
    """What a wrong answer without a baseline may mean, and the two ways to tell a weak
    model from a broken one: record the answers of a server you trust, or expect fewer
    canaries. ``key``: what a baseline is kept for (the cluster, model, serve args, vLLM
    version and engine); ``where``: the file it would be in (None: nowhere, history off);
    ``answered``: the canaries this model answered right."""
    kept = (
        f"no baseline of this model's answers for {key} in {where}"
        if where
        else f"no baseline of this model's answers ({key}): --spark-history=off and no "
        "--spark-accuracy-baseline, so none is kept"
    )
    return (
        f"{kept}. A model weaker than the canaries is expected to fail some of them (a small "
        "model gets arithmetic or sorting wrong): that is the model, not a broken cluster. "
        f"To tell them apart, run once with {RECORD_OPTION} against this server when you "
        "trust it: later runs judge each canary against the truth where the recorded answer "
        "was right and against the recorded answer where it was wrong, so only a changed "
        "answer fails. Or expect only the canaries this model answers: the profile's "
        f"[accuracy] canaries (profile {profile}: {', '.join(kinds) or 'none'}; "
        + (
            f"this model answered {', '.join(answered)} right: "
            f"--spark-threshold=accuracy.canaries={','.join(answered)})"
            if answered
            else "this model answered none right: canaries = [] in a profile file that "
            f'extends = "{profile}" (--spark-profile=PATH) leaves the fingerprint alone to '
            "read its numbers)"
        )
    )


def check_alone(
    answers: list[Answer],
    server: str,
    *,
    api_only: bool = False,
    origin: str | None = None,
    hint: str | None = None,
) -> Finding:
    """Every expected canary answered right, one request at a time; where the baseline
    (``origin``: where it was recorded) was wrong, the recorded answer again. ``hint``:
    said on a failure without a baseline (``no_baseline_hint``). ``api_only``: the advice is
    the server's (--spark-api-url alone), not the cluster's."""
    wrong = [a for a in answers if not a.accepted]
    right = sum(a.right for a in answers)
    held = [a for a in answers if a.held_to_record and a.accepted]
    if not wrong:
        message = f"{server}: {right}/{len(answers)} canaries answered right (greedy, alone)"
        if held:
            message += (
                f"; {len(held)} answered wrong as the baseline recorded ({origin}): "
                f"{', '.join(a.canary.kind for a in held)}"
            )
        return Finding.passed(len(answers) - len(wrong), len(answers), "canaries", message=message)
    lines = "\n".join(f"  - {a.canary.kind}: {a.quoted()}" for a in wrong)
    evidence = {"answers": json.dumps([a.row() for a in answers], indent=1)}
    if any(a.recorded is not None for a in answers):
        changed = sum(a.drift for a in wrong)
        return Finding.failed(
            len(answers) - len(wrong),
            len(answers),
            "canaries",
            message=(
                f"{server} answers {len(wrong)} of {len(answers)} canaries otherwise than its "
                f"baseline ({origin}) ({changed} changed from a recorded wrong answer, "
                f"{len(wrong) - changed} wrong where the baseline was right; greedy, "
                f"temperature 0, one request at a time):\n{lines}\nThe same cluster, model, "
                "serve args, vLLM and engine gave other answers: its numbers changed. Likely "
                f"layer: {advice('alone', api_only)}. If the change is meant (new weights "
                f"under the same name, a new driver), record again with {RECORD_OPTION}"
            ),
            evidence=evidence,
        )
    said = (
        f"\n{hint}.\nIf this model should answer them, likely layer: "
        if hint
        else ("\nLikely layer: ")
    )
    return Finding.failed(
        right,
        len(answers),
        "canaries",
        message=(
            f"{server} answers wrong: {len(wrong)} of {len(answers)} canaries (greedy, "
            f"temperature 0, one request at a time):\n{lines}{said}{advice('alone', api_only)}"
        ),
        evidence=evidence,
    )


def check_under_load(
    alone: list[Answer],
    loaded: list[list[Answer]],
    concurrency: int,
    server: str,
    *,
    api_only: bool = False,
) -> Finding:
    """The canaries accepted alone (right, or as the baseline recorded) read the same with
    ``concurrency`` requests in flight (``loaded[i]``: every copy of canary i sent under
    load)."""
    broken: list[str] = []
    sent = sum(len(copies) for copies in loaded)
    for single, copies in zip(alone, loaded, strict=True):
        if not single.accepted:
            continue
        bad = [a for a in copies if a.error or a.right != single.right or a.read != single.read]
        if bad:
            broken.append(
                f"  - {single.canary.kind}: alone {single.read!r}, under load "
                f"{len(bad)}/{len(copies)} wrong, e.g. {bad[0].quoted()}"
            )
    if not broken:
        return Finding.passed(
            sent,
            sent,
            "answers",
            message=(
                f"{server}: {sent} canary answers under load ({concurrency} in flight) equal "
                "the single-stream answers"
            ),
        )
    lines = "\n".join(broken)
    return Finding.failed(
        len(broken),
        0,
        "canaries wrong under load",
        message=(
            f"{server} answers right alone and wrong under load ({concurrency} requests in "
            f"flight, greedy): batch-dependent corruption\n{lines}\nLikely layer: "
            f"{advice('under_load', api_only)}"
        ),
        evidence={
            "under load": json.dumps([[a.row() for a in copies] for copies in loaded], indent=1)
        },
    )


# ---- the fingerprint ---------------------------------------------------------------

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


# ---- the math set ------------------------------------------------------------------

NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Femi", "Gita", "Hugo", "Ines", "Joss")
ITEMS = ("apples", "books", "marbles", "stickers", "pencils", "shells", "cards", "coins")


@dataclass(frozen=True)
class Problem:
    question: str
    answer: int


def math_problems(n: int, seed: int = SEED) -> list[Problem]:
    """``n`` seeded grade-school word problems, each with one exact integer answer (two
    or three steps of +, - and x; every intermediate count positive)."""
    rng = random.Random(seed + 1)
    out: list[Problem] = []
    for _ in range(n):
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        start = rng.randint(5, 40)
        shape = rng.randrange(3)
        if shape == 0:
            more, less = rng.randint(3, 30), rng.randint(1, 5)
            less = min(less, start + more - 1)
            q = (
                f"{name} has {start} {item}. {name} gets {more} more and then gives away "
                f"{less}. How many {item} does {name} have now?"
            )
            answer = start + more - less
        elif shape == 1:
            boxes, each, extra = rng.randint(2, 9), rng.randint(3, 12), rng.randint(1, 20)
            q = (
                f"{name} buys {boxes} boxes of {item} with {each} {item} in each box, and "
                f"already had {extra} {item}. How many {item} does {name} have now?"
            )
            answer = boxes * each + extra
        else:
            friends, each = rng.randint(2, 6), rng.randint(2, 8)
            total = friends * each + rng.randint(1, 15)
            q = (
                f"{name} has {total} {item} and gives {each} {item} to each of {friends} "
                f"friends. How many {item} does {name} have left?"
            )
            answer = total - friends * each
        out.append(Problem(q + " End your answer with the number only.", answer))
    return out


def grade_math(problem: Problem, content: str | None) -> bool:
    numbers = _integers(content or "")
    return bool(numbers) and numbers[-1] == problem.answer


@dataclass
class MathScore:
    right: int
    total: int
    wrong: list[tuple[Problem, str | None]] = field(default_factory=list)

    @property
    def accuracy(self) -> float:
        return self.right / self.total if self.total else 0.0


def check_math(
    score: MathScore,
    expected: float,
    tolerance: float,
    server: str,
    baseline: float | None = None,
    *,
    api_only: bool = False,
) -> Finding:
    """Accuracy no more than ``tolerance`` below the profile's expected accuracy (vLLM's
    gsm8k eval: ``measured >= expected - 0.08``), nor below the baseline's."""
    floor = expected - tolerance
    if baseline is not None:
        floor = max(floor, baseline - tolerance)
    figure = f"{score.right}/{score.total} = {score.accuracy:.2f}"
    ref = f"expected {expected:.2f} - {tolerance}" + (
        f", baseline {baseline:.2f} - {tolerance}" if baseline is not None else ""
    )
    if score.accuracy + 1e-9 >= floor:
        return Finding.passed(
            round(score.accuracy, 3),
            round(floor, 3),
            "accuracy",
            message=f"{server}: math {figure} ({ref})",
        )
    shown = "\n".join(
        f"  - {p.question!r} -> {_clip(a or '')!r}; expected {p.answer}" for p, a in score.wrong[:3]
    )
    return Finding.failed(
        round(score.accuracy, 3),
        round(floor, 3),
        "accuracy",
        message=(
            f"{server}: math accuracy {figure} is below {floor:.2f} ({ref}); e.g.\n{shown}\n"
            f"Likely layer: {advice('alone', api_only)}"
        ),
    )


def stderr_of(p: float, n: int) -> float:
    """The standard error of an accuracy ``p`` over ``n`` questions (to size a tolerance)."""
    return math.sqrt(max(p * (1 - p), 0.0) / n) if n else 0.0
