"""The emulated model answers the accuracy canaries as a healthy model does, by rules read
from the prompt, and fails them the ways issue #24's broken clusters do: ``garble`` (wrong
at any batch), ``garble-under-batch`` (wrong with 4+ requests in flight), ``logprob-drift``
(right answers, moved logprobs). The suite's own probe (pytest_spark.serving.validate.accuracyprobe)
asks it, so these tests hold the emulator to what the checks read."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import Emu
from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving.validate.accuracy import canaries, check_alone, check_under_load
from pytest_spark.serving.validate.accuracyprobe import AccuracyProbe
from pytest_spark.serving.validate.fingerprint import Baseline, check_fingerprint
from pytest_spark.serving.validate.mathset import check_math, grade_math, math_problems
from pytest_spark.settings.sections import AccuracySection

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sparksim"))
from emulator.solver import garbled, solve

SECTION = AccuracySection(math_problems=20, request_timeout_s=30.0)


def probe(emu: Emu, section: AccuracySection = SECTION) -> AccuracyProbe:
    api = ApiEndpoint(f"http://127.0.0.1:{emu.port}", "qwen", timeout=30.0)
    return AccuracyProbe(api, section)


def test_rules_answer_every_canary_and_math_problem() -> None:
    """No table of the suite's prompts: the rules read any numbers, words and lists."""
    for canary in canaries():
        if canary.structured is None:
            assert canary.grade(solve(canary.prompt))[0], canary
            assert not canary.grade(garbled(canary.prompt))[0], canary
    for canary in canaries(seed=7):  # another seed: other numbers, other strings
        if canary.structured is None:
            assert canary.grade(solve(canary.prompt))[0], canary
    problems = math_problems(100, seed=99)
    assert all(grade_math(p, solve(p.question)) for p in problems)
    assert not any(grade_math(p, garbled(p.question)) for p in problems)
    assert solve("What is 12 + 7?") == "19" and garbled("What is 12 + 7?") == "12 + 7 = 12"
    assert solve("Tell me a story.") is None


def test_healthy_model_passes_every_accuracy_check(qwen: Emu) -> None:
    p = probe(qwen)
    alone = p.alone()
    assert check_alone(alone, p.server).ok, [a.row() for a in alone]
    assert {a.canary.kind for a in alone} == set(SECTION.canaries)
    json_sum = next(a for a in alone if a.canary.kind == "json_sum")
    assert json_sum.content and json_sum.content.startswith("{"), json_sum.content
    assert check_under_load(alone, p.under_load(), p.concurrency, p.server).ok
    assert sum(map(len, p.under_load())) == p.concurrency == 8
    score = p.math()
    assert check_math(score, 1.0, 0.08, p.server).ok, score.wrong
    assert p.error is None and p.tokens > 0


def test_fingerprint_spread_of_healthy_runs_is_within_tolerance(qwen: Emu) -> None:
    """The modelled batch noise: 10 fingerprints, alone and beside a load, spread far
    below the tolerance (the sim profile's claim)."""
    prints = []
    for i in range(10):
        p = probe(qwen)
        if i % 3 == 0:
            p.under_load()
        prints.append(p.fingerprint())
    means = [f.mean_logprob for f in prints]
    assert max(means) - min(means) < 0.002, means
    assert len({f.top1_agreement for f in prints}) == 1
    assert {f.source for f in prints} == {"prompt_logprobs"}
    assert 100 < prints[0].tokens < 200


def test_garble_fails_the_canaries_alone_naming_the_layer(faulty: Any) -> None:
    emu = faulty("garble")
    p = probe(emu)
    finding = check_alone(p.alone(), p.server)
    assert not finding.ok
    assert "What is" in finding.message and "expected" in finding.message
    assert "--enforce-eager" in finding.message and "wrong when alone" in finding.message
    assert "= " in finding.message  # the answer quoted: "19 + 13 = 19"


def test_garble_under_batch_is_right_alone_wrong_under_load(faulty: Any) -> None:
    emu = faulty("garble-under-batch")
    p = probe(emu)
    alone = p.alone()
    assert check_alone(alone, p.server).ok
    finding = check_under_load(alone, p.under_load(), p.concurrency, p.server)
    assert not finding.ok
    assert "right alone and wrong under load" in finding.message
    assert "batch-dependent" in finding.message


def test_logprob_drift_moves_the_fingerprint_only(qwen: Emu, faulty: Any) -> None:
    healthy = probe(qwen).fingerprint()
    emu = faulty("logprob-drift")
    p = probe(emu)
    assert check_alone(p.alone(), p.server).ok
    drifted = p.fingerprint()
    finding = check_fingerprint(
        drifted,
        Baseline(healthy, "healthy"),
        max_logprob_delta=SECTION.max_logprob_delta,
        max_top1_delta=SECTION.max_top1_delta,
        server=p.server,
    )
    assert not finding.ok
    assert drifted.mean_logprob < healthy.mean_logprob - 0.1
    assert "precision or quantization" in finding.message


def test_echo_logprobs_give_the_same_fingerprint(qwen: Emu) -> None:
    """OpenAI's echo + logprobs, for servers without vLLM's prompt_logprobs."""
    from pytest_spark.serving.validate.fingerprint import (
        ECHO_BODY,
        FINGERPRINT_BODY,
        fingerprint_of,
    )

    echo = fingerprint_of(
        qwen.request("POST", "/v1/completions", {"model": "qwen", **ECHO_BODY}).json()
    )
    prompt = fingerprint_of(
        qwen.request("POST", "/v1/completions", {"model": "qwen", **FINGERPRINT_BODY}).json()
    )
    assert echo.source == "echo" and echo.tokens == prompt.tokens
    assert abs(echo.mean_logprob - prompt.mean_logprob) < 0.002
    assert echo.top1_agreement == prompt.top1_agreement


def test_bad_prompt_logprobs_is_a_400(qwen: Emu) -> None:
    resp = qwen.request(
        "POST", "/v1/completions", {"model": "qwen", "prompt": "hi", "prompt_logprobs": "x"}
    )
    assert resp.status == 400, resp.body


@pytest.mark.parametrize("kind", ["count", "sort", "copy"])
def test_canaries_are_stable_across_runs(kind: str) -> None:
    assert canaries((kind,)) == canaries((kind,))
