"""Prefix cache, max_model_len and /metrics health behaviour of the emulator (issue #16
sections 6-7): a cached prefix is not prefilled again (lower TTFT) and counts in
vllm:prefix_cache_hits; --no-enable-prefix-caching turns that off and says so in
vllm:cache_config_info; an over-long prompt gets vLLM's own 400; a needle question is
answered from a long prompt, and lost beyond the native context (context-beyond-native); the
preempt-under-load fault counts preemptions."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

from conftest import Emu
from pytest_spark.serving.load.metricsnap import Snapshot
from pytest_spark.serving.validate.context import parse_too_long

PREFILL = {"SPARKSIM_EMU_PREFILL_TOK_S": "2000", "SPARKSIM_EMU_TTFT_S": "0.02"}
ARGS = ["--served-model-name", "m", "--max-model-len", "4096"]
SYSTEM = "Reference text. " + " ".join(f"word{i % 97} item" for i in range(500))


def snap(emu: Emu) -> Snapshot:
    return Snapshot.of(emu.request("GET", "/metrics").body.decode(), time.time())


def ttft(emu: Emu, question: str) -> float:
    """Seconds to the first content chunk (the client side of the emulator's pacing)."""
    body = {
        "model": "m",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": 2,
        "stream": True,
    }
    t0 = time.perf_counter()
    resp = emu.request("POST", "/v1/chat/completions", body)
    total = time.perf_counter() - t0
    assert resp.status == 200
    return total  # 2 tokens at 400 tok/s: the TTFT plus ~3 ms


def test_cached_prefix_is_faster_and_counted(emu_factory: Any) -> None:
    emu = emu_factory(ARGS, PREFILL)
    before = snap(emu)
    assert before.prefix_caching is True
    cold = ttft(emu, "First question?")
    warm = ttft(emu, "Second question?")
    after = snap(emu)
    assert cold > 0.4  # ~1000 prompt tokens at 2000 tok/s
    assert warm < cold - 0.3
    hits = (after.prefix_hits or 0) - (before.prefix_hits or 0)
    queries = (after.prefix_queries or 0) - (before.prefix_queries or 0)
    assert hits >= 960 and hits % 16 == 0  # the shared system prompt, in whole blocks
    assert queries > hits
    text = emu.request("GET", "/metrics").body.decode()
    assert 'vllm:prompt_tokens_cached_total{engine="0",model_name="m"} ' + f"{hits}" in text


def test_prefix_caching_off_is_shown_and_not_served(emu_factory: Any) -> None:
    emu = emu_factory([*ARGS, "--no-enable-prefix-caching"], PREFILL)
    before = snap(emu)
    cold = ttft(emu, "First question?")
    warm = ttft(emu, "Second question?")
    after = snap(emu)
    assert after.prefix_caching is False
    assert after.prefix_hits == before.prefix_hits == 0
    assert (after.prefix_queries or 0) > 1000  # queries still counted, as vLLM does
    assert warm > 0.4 and cold > 0.4
    assert "enable_prefix_caching=False" in emu.text()


def test_over_long_prompt_gets_vllms_400(emu_factory: Any) -> None:
    """As vLLM 0.32: a prompt alone over max_model_len is refused in its words (counted up
    to L + 1); one that fits with max_tokens that would not is served, cut to the room."""
    emu = emu_factory(["--served-model-name", "m", "--max-model-len", "1024"])
    messages = [{"role": "user", "content": " ".join(["again"] * 1100)}]
    count = emu.request("POST", "/tokenize", {"model": "m", "messages": messages}).json()["count"]
    assert count > 1024
    resp = emu.chat({"model": "m", "messages": messages, "max_tokens": 16})
    assert resp.status == 400
    err = resp.json()["error"]
    assert err["type"] == "BadRequestError" and err["param"] == "input_tokens"
    parsed = parse_too_long(err["message"])
    assert parsed is not None and parsed.wording == "prompt" and parsed.at_least
    assert (parsed.prompt_tokens, parsed.limit) == (1025, 1024)
    assert err["message"].endswith("(parameter=input_tokens, value=1025)")
    half = [{"role": "user", "content": " ".join(["again"] * 500)}]
    fits = emu.chat({"model": "m", "messages": half, "max_tokens": 1024, "ignore_eos": True})
    assert fits.status == 200
    usage = fits.json()["usage"]
    assert usage["total_tokens"] == 1024 and usage["completion_tokens"] < 1024
    assert fits.json()["choices"][0]["finish_reason"] == "length"


def test_needle_answered_from_a_long_prompt(emu_factory: Any) -> None:
    emu = emu_factory(["--served-model-name", "m", "--max-model-len", "8192"])
    filler = " ".join(["The keeper walks the rows."] * 400)
    prompt = f"{filler} The vault code is 4821. {filler}\n\nWhat is the vault code?"
    resp = emu.chat({"model": "m", "messages": [{"role": "user", "content": prompt}]})
    assert resp.status == 200
    assert "4821" in resp.json()["choices"][0]["message"]["content"]
    plain = emu.chat({"model": "m", "messages": [{"role": "user", "content": filler}]})
    assert "4821" not in plain.json()["choices"][0]["message"]["content"]


def test_context_beyond_native_loses_a_needle_far_back(emu_factory: Any) -> None:
    """Served 4x past its native context: a needle more than max_model_len/4 tokens before
    the question gets a made-up code (the request itself succeeds); one within it is still
    answered."""
    args = ["--served-model-name", "m", "--max-model-len", "8192"]
    emu = emu_factory(args, {"SPARKSIM_EMU_FAULT": "context-beyond-native"})
    filler = " ".join(["The keeper walks the rows."] * 400)  # ~2400 tokens
    far = f"{filler} The vault code is 4821. {filler}\n\nWhat is the vault code?"
    resp = emu.chat({"model": "m", "messages": [{"role": "user", "content": far}]})
    assert resp.status == 200
    answer = resp.json()["choices"][0]["message"]["content"]
    assert "4821" not in answer and re.fullmatch(r"The vault code is \d{4}\.", answer), answer
    near = f"The vault code is 4821. {filler[:2000]}\n\nWhat is the vault code?"
    resp = emu.chat({"model": "m", "messages": [{"role": "user", "content": near}]})
    assert "4821" in resp.json()["choices"][0]["message"]["content"]


def test_preempt_under_load_counts_preemptions(emu_factory: Any) -> None:
    emu = emu_factory(ARGS, {"SPARKSIM_EMU_FAULT": "preempt-under-load"})
    alone = snap(emu)
    emu.chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert snap(emu).preemptions == alone.preemptions == 0  # one at a time: none

    def one() -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}
        emu.chat(body)

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (snap(emu).preemptions or 0) >= 1
