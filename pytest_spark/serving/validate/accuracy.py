"""Does the served model answer correctly? The canaries, graded exactly (pure).

A cluster can be up, linked, fast and parse-clean and still compute garbage: a corrupt
tensor-parallel all-reduce, a broken quantized kernel, CUDA graphs with speculative
decoding, a chat-template mismatch. Guided decoding keeps tool-call and structured-output
JSON valid whatever the weights compute, so only the *values* of answers tell. Three reads:

- **Canaries** (here): greedy (temperature 0) prompts whose answers need no world knowledge
  and are graded exactly: arithmetic at graded difficulty, counting, copying and reversing a
  random string, sorting five numbers, and a structured-output answer whose value is a
  computed sum (a garble gate guided decoding cannot hide). Built once from a fixed seed:
  every run, alone and under load, asks the same questions.
- **A fingerprint** (``fingerprint``): the teacher-forced logprobs of a fixed passage,
  compared with a baseline recorded on an accepted run of the same model, serve args and
  vLLM version: numeric drift in models too small for the canaries.
- **Math** (``mathset``, opt-in): seeded grade-school word problems with exact integer
  answers, scored against the profile's expected accuracy within a tolerance.

The advice for wrong answers (``advice``), by where they showed, is shared by all three.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

from pytest_spark.infra.finding import Finding
from pytest_spark.settings.sections import CANARY_KINDS

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
            numbers = integers_in(text)
            got = numbers[-1] if numbers else None
            return got == int(self.expected), None if got is None else str(got)
        if self.kind in ("count", "sort"):
            numbers = integers_in(text)
            joined = " ".join(map(str, numbers)) if numbers else None
            return joined == self.expected, joined
        if self.kind == "copy":
            # "Repeat this string exactly, nothing else": the answer is the string alone
            # (quotes, backticks and a closing full stop aside). Its last word is not enough:
            # a model that echoes the prompt ends with the string too.
            bare = _bare(text)
            return bare == self.expected, clip(bare, 60) if bare else None
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


def integers_in(text: str) -> list[int]:
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
        got = "no answer" if self.error else repr(clip(self.content or ""))
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


def clip(text: str, n: int = 160) -> str:
    """``text`` on one line, at most ``n`` characters: an answer quoted in a message."""
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
