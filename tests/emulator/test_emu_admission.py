"""The functional checks' planned requests against a server that admits fewer sequences
than the plan sends (``--max-num-seqs``): the emulator queues the rest as vLLM's scheduler
does (a request waits, unanswered, until a sequence frees), so the last of a plan wider
than the server run out of a request timeout that each meets alone. The plan is capped at
the serve args' ``--max-num-seqs`` (``plan_workers``), and a request that ran out of time
beside others is judged on its answer alone (``Prefetch.alone_again``)."""

from __future__ import annotations

import re
import threading
import time
import warnings
from typing import Any

import pytest

from conftest import Emu
from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving.client.chat import ServingClient, TurnCache
from pytest_spark.serving.client.prefetch import Prefetch, plan_workers
from pytest_spark.serving.client.stream import ServingError

# 16 tokens at 40 tok/s: ~0.4 s a request alone.
PACED = {"SPARKSIM_EMU_DECODE_TOK_S": "40"}
TIMEOUT_S = 2.0  # five times one request alone: eight queued one at a time take 3.2 s
PLANNED = 8


def _answers(emu: Emu, workers: int) -> tuple[list[str | None], int, list[str]]:
    api = ApiEndpoint(f"http://127.0.0.1:{emu.port}", "qwen", timeout=10.0)
    client = ServingClient(api, timeout=TIMEOUT_S, idle_timeout=TIMEOUT_S)
    prefetch = Prefetch(workers)
    cache = TurnCache(client, prefetch)

    def body(i: int) -> Any:
        return lambda: client.body(f"Say {i}.", max_tokens=16, ignore_eos=True, temperature=0)

    try:
        for i in range(PLANNED):
            cache.plan(i, body(i), False)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = [cache.turn(i, body(i), False).finish_reason for i in range(PLANNED)]
    finally:
        prefetch.close()
        client.close()
    return got, prefetch.asked_alone, [str(w.message) for w in seen]


def test_a_plan_wider_than_max_num_seqs_is_judged_alone_and_capped_runs_in_time(
    emu_factory: Any,
) -> None:
    emu = emu_factory(["--served-model-name", "qwen", "--max-num-seqs", "1"], PACED)
    got, alone, said = _answers(emu, PLANNED)
    assert got == ["length"] * PLANNED  # every check judged an answer, none its own timeout
    assert alone >= 2  # the last queued ones ran out of the 2 s beside the others
    assert all("with up to 8 of the functional checks' requests in flight" in s for s in said)
    got, alone, said = _answers(emu, plan_workers(PLANNED, 1, under_xdist=False))
    assert got == ["length"] * PLANNED and alone == 0 and said == []


def _gauge(emu: Emu, name: str) -> float:
    text = emu.request("GET", "/metrics").body.decode()
    m = re.search(rf'^vllm:{name}\{{engine="0",model_name="qwen"\}} (\S+)$', text, re.M)
    assert m, name
    return float(m.group(1))


def test_a_client_that_leaves_is_aborted_running_or_queued(emu_factory: Any) -> None:
    """vLLM aborts a non-streamed request whose client disconnected (``with_cancellation``
    on its completion routes), running or still waiting: the next request does not wait
    behind answers nobody reads."""
    emu = emu_factory(["--served-model-name", "qwen", "--max-num-seqs", "1"], PACED)
    api = ApiEndpoint(f"http://127.0.0.1:{emu.port}", "qwen", timeout=10.0)
    quick = ServingClient(api, timeout=0.5, idle_timeout=0.5)
    long = quick.body("Count.", max_tokens=400, ignore_eos=True)  # 10 s at 40 tok/s
    errors: list[str] = []

    def leave() -> None:
        try:
            quick.chat(long)
        except ServingError as exc:
            errors.append(exc.kind)

    left = [threading.Thread(target=leave) for _ in range(2)]  # one running, one queued
    for t in left:
        t.start()
    for t in left:
        t.join()
    assert errors == ["timeout", "timeout"]
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and (
        _gauge(emu, "num_requests_running") or _gauge(emu, "num_requests_waiting")
    ):
        time.sleep(0.05)
    assert _gauge(emu, "num_requests_running") == 0 and _gauge(emu, "num_requests_waiting") == 0
    patient = ServingClient(api, timeout=10.0, idle_timeout=10.0)
    t0 = time.monotonic()
    assert (
        patient.chat(patient.body("Say 1.", max_tokens=16, ignore_eos=True)).finish_reason
        == "length"
    )
    assert time.monotonic() - t0 < 3  # not behind the 10 s answers that were left
    quick.close()
    patient.close()


def test_a_stream_queued_past_the_idle_timeout_is_named_as_possibly_queued(
    emu_factory: Any,
) -> None:
    """vLLM sends a stream's headers before it schedules the request: a stream that waits
    for a sequence is silent from its first chunk on, and the stall says it may be queued."""
    emu = emu_factory(["--served-model-name", "qwen", "--max-num-seqs", "1"], PACED)
    api = ApiEndpoint(f"http://127.0.0.1:{emu.port}", "qwen", timeout=10.0)
    busy = ServingClient(api, timeout=10.0, idle_timeout=10.0)
    waiting = ServingClient(api, timeout=10.0, idle_timeout=0.6)
    holder = threading.Thread(
        target=busy.chat, args=(busy.body("Count.", max_tokens=80, ignore_eos=True),)
    )
    holder.start()
    deadline = time.monotonic() + 10
    while _gauge(emu, "num_requests_running") < 1:  # the sequence is taken
        assert time.monotonic() < deadline
        time.sleep(0.02)
    try:
        with pytest.raises(ServingError) as failed:
            waiting.chat_stream(waiting.body("Say 1.", max_tokens=4))
        assert failed.value.kind == "stall" and failed.value.chunks == 0
        assert "a request still queued behind --max-num-seqs running ones" in failed.value.message
    finally:
        holder.join()
        busy.close()
        waiting.close()
