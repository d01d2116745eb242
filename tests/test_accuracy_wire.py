"""The accuracy fingerprint read from real vLLM 0.32 answers (fixtures/vllm/vllm-0.32.0-cpu,
SmolLM2-135M-Instruct): ``prompt_logprobs`` and ``echo`` with ``logprobs`` score the same
passage positions and give the same figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_spark.serving.validate.fingerprint import FingerprintError, fingerprint_of

RECORDED = Path(__file__).resolve().parent.parent / "fixtures" / "vllm" / "vllm-0.32.0-cpu"


def recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDED / name).read_text())
    return data


def echo_only(data: dict[str, Any]) -> dict[str, Any]:
    """The echo answer without the ``prompt_logprobs`` vLLM adds to it: what a server
    that only speaks OpenAI's ``logprobs`` sends."""
    choice = {k: v for k, v in data["choices"][0].items() if k != "prompt_logprobs"}
    return {**data, "choices": [choice]}


def test_prompt_logprobs_answer_gives_the_fingerprint() -> None:
    fp = fingerprint_of(recorded("completions_prompt_logprobs.json"))
    # 154 prompt tokens; the first has no logprob
    assert (fp.source, fp.tokens) == ("prompt_logprobs", 153)
    assert fp.mean_logprob == pytest.approx(-3.373472, abs=1e-6)
    assert fp.top1_agreement == pytest.approx(57 / 153)


def test_echo_answer_gives_the_same_fingerprint() -> None:
    prompt = fingerprint_of(recorded("completions_prompt_logprobs.json"))
    echo = fingerprint_of(echo_only(recorded("completions_echo_logprobs.json")))
    assert echo.source == "echo"
    # the echo covers the prompt and the one generated token; only the prompt is scored
    assert echo.tokens == prompt.tokens
    assert echo.mean_logprob == pytest.approx(prompt.mean_logprob, abs=1e-6)
    assert echo.top1_agreement == pytest.approx(prompt.top1_agreement, abs=1e-6)


def test_echo_answer_also_carries_prompt_logprobs_and_those_are_read_first() -> None:
    data = recorded("completions_echo_logprobs.json")
    assert data["choices"][0]["prompt_logprobs"][0] is None
    fp = fingerprint_of(data)
    assert fp.source == "prompt_logprobs"
    assert fp == fingerprint_of(recorded("completions_prompt_logprobs.json"))


def test_an_answer_without_prompt_logprobs_is_refused() -> None:
    data = recorded("completions_prompt_logprobs.json")
    choice = {**data["choices"][0], "prompt_logprobs": None}
    with pytest.raises(FingerprintError, match="no prompt logprobs"):
        fingerprint_of({**data, "choices": [choice]})
