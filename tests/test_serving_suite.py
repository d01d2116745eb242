"""The serving suite (tests_e2e: tool_calls, reasoning, throughput) run as a user runs it,
``pytest tests_e2e --spark-api-url URL``, against the vLLM emulator: healthy, it passes;
with each emulator fault, exactly the checks of the broken behaviour fail, each with its
evidence (request and response or stream excerpt) in the JSON results.

The healthy scenario runs alone; the faults run six at a time, each against its own
emulator, to stay within the time budget on two cores. The emulator runs fast (600 tok/s
per stream) and the throughput thresholds are scaled to match through --spark-threshold.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
MARKERS = "tool_calls or reasoning or throughput or structured_output"
SHAPE = (
    "throughput.output_tokens=16,throughput.prompt_tokens=64,"
    "throughput.concurrency=1;4,throughput.min_requests=2,"
    "throughput.requests_per_stream=1,throughput.warmup_requests=1,"
    "throughput.max_ttft_p90_s_1=2.0"
)
# Healthy 600 tok/s per stream; slow-decode 60. Speed checks are strict where speed is the
# point (healthy, run alone; slow-decode, whose slowness only grows under load) and lax in
# the other scenarios, which run side by side on a busy machine.
STRICT = SHAPE + ",throughput.min_decode_tok_s_1=150,throughput.min_agg_tok_s_4=400"
LAX = SHAPE + ",throughput.min_decode_tok_s_1=1,throughput.min_agg_tok_s_4=1"
EMU_ENV = {
    "SPARKSIM_EMU_TIME_SCALE": "0",
    "SPARKSIM_EMU_DECODE_TOK_S": "600",
    "SPARKSIM_EMU_TTFT_S": "0.02",
    "SPARKSIM_EMU_PREFILL_TOK_S": "0",
    "SPARKSIM_EMU_REASONING_TOKENS": "16",
    "SPARKSIM_EMU_CONTROL_POLL_S": "0.05",
}

TOOL_PLAIN = {
    "test_tool_call[auto-plain]",
    "test_tool_call[required-plain]",
    "test_tool_call[named-plain]",
    "test_parallel_tool_calls[plain]",
}
TOOL_STREAM = {t.replace("plain", "stream") for t in TOOL_PLAIN}
AUTO_ENABLED = {"test_auto_tool_choice_enabled"}
R_KINDS = (
    "test_reasoning_separated",
    "test_thinking_disabled",
    "test_truncated_inside_thinking",
    "test_reasoning_then_tool_call",
)
R_PLAIN = {f"{k}[plain]" for k in R_KINDS}
R_STREAM = {f"{k}[stream]" for k in R_KINDS}
THROUGHPUT = {
    "test_sweep_completes",
    "test_decode_single_stream",
    "test_ttft_p90_single_stream",
    "test_aggregate_four_streams",
}
# The command-line verdicts: read from --spark-serve-args here (no container to inspect).
VERDICTS = {"test_server_has_tool_parser", "test_server_has_reasoning_parser"}
# Structured output (raw client) and the same questions through the openai SDK.
STRUCT = {
    f"test_structured_output[{k}-{s}]"
    for k in ("json_schema", "json_object")
    for s in ("plain", "stream")
}
SDK_TOOL_PLAIN = {f"test_sdk_tool_call[{m}-plain]" for m in ("auto", "required", "named")}
SDK_TOOL_STREAM = {t.replace("plain", "stream") for t in SDK_TOOL_PLAIN}
SDK_REASONING = {"test_sdk_reasoning[plain]", "test_sdk_reasoning[stream]"}
SDK_STRUCT = {t.replace("test_", "test_sdk_") for t in STRUCT}
SDK_STRUCT_PLAIN = {t for t in SDK_STRUCT if t.endswith("-plain]")}
STRUCT_PLAIN = {t for t in STRUCT if t.endswith("-plain]")}
STRUCT_STREAM = STRUCT - STRUCT_PLAIN
SDK = SDK_TOOL_PLAIN | SDK_TOOL_STREAM | SDK_REASONING | SDK_STRUCT
ALL = (
    TOOL_PLAIN
    | TOOL_STREAM
    | AUTO_ENABLED
    | R_PLAIN
    | R_STREAM
    | THROUGHPUT
    | VERDICTS
    | STRUCT
    | SDK
)
THEN_TOOL = {"test_reasoning_then_tool_call[plain]", "test_reasoning_then_tool_call[stream]"}
# The engine answers every request with 500: the API fixture's one-token probe finds it.
# test_cluster_serving is not selected here (-m without readiness), so every check fails
# with that finding instead of skipping (a dead engine never passes by deselection).
ENGINE_FAILING = {"http-5xx", "worker-death"}

# fault -> the checks that must fail (all others pass), and a phrase every message has
EXPECTED: dict[str, tuple[set[str], str]] = {
    "healthy": (set(), ""),
    "slow-decode": ({"test_decode_single_stream"}, "tok/s"),
    "http-5xx": (ALL, "HTTP 500"),
    "worker-death": (ALL, "HTTP 500"),
    "malformed-sse": (TOOL_STREAM | R_STREAM | THROUGHPUT | STRUCT_STREAM, "is not valid JSON"),
    "truncated-stream": (
        TOOL_STREAM | R_STREAM | THROUGHPUT | STRUCT_STREAM,
        "without data: [DONE]",
    ),
    "invalid-json-body": (TOOL_PLAIN | AUTO_ENABLED | R_PLAIN | STRUCT_PLAIN, "body is not JSON"),
    # under auto only (required and named calls come from guided decoding): one verdict
    "tool-in-content": ({"test_tool_call[auto-plain]"}, "left in content"),
    # one verdict per broken behaviour; its dependents skip citing it (CITED)
    "tool-args-unstreamed": ({"test_tool_call[auto-stream]"}, "arguments never streamed"),
    "tool-param-leak": (
        {
            "test_tool_call[auto-plain]",
            "test_tool_call[auto-stream]",
            "test_parallel_tool_calls[plain]",
            "test_parallel_tool_calls[stream]",
        }
        | THEN_TOOL,
        "</parameter>",
    ),
    "tool-args-strings": (TOOL_PLAIN | TOOL_STREAM | THEN_TOOL, "is a string, expected integer"),
    "think-in-content": ({"test_reasoning_separated[plain]"}, "</think> leaked into content"),
    "reasoning-in-content": ({"test_reasoning_separated[plain]"}, "content"),
    "answer-in-reasoning": ({"test_thinking_disabled[plain]"}, "the answer landed in reasoning"),
    # one verdict: the json_schema non-streaming answer; the other formats skip citing it
    "response-format-ignored": (
        {"test_structured_output[json_schema-plain]"},
        "the server ignored response_format: content is not JSON but text",
    ),
}


# fault -> the checks that skip citing the one failure, and the words each skip says
CITED: dict[str, tuple[set[str], str]] = {
    "tool-in-content": (
        {
            "test_tool_call[auto-stream]",
            "test_parallel_tool_calls[plain]",
            "test_parallel_tool_calls[stream]",
        }
        | THEN_TOOL,
        "the call was left in content: the model wrote XML calls (<tool_call><function=NAME>"
        "<parameter=KEY>), the qwen3_coder format; the server runs --tool-call-parser "
        "qwen3_coder, which reads XML calls (<tool_call><function=NAME><parameter=KEY>) "
        "(test_tool_call[auto-plain] has the evidence)",
    ),
    "slow-decode": (
        {"test_aggregate_four_streams"},
        "so the shortfall is each stream's speed: single-stream decode",
    ),
    "tool-args-unstreamed": (
        (TOOL_STREAM - {"test_tool_call[auto-stream]"}) | {"test_reasoning_then_tool_call[stream]"},
        "the streamed tool-call arguments never came: call 0 (get_weather, header at chunk",
    ),
    "think-in-content": (
        {"test_reasoning_separated[stream]"} | THEN_TOOL,
        "the same failure as test_reasoning_separated[plain]: reasoning (non-streaming): "
        "</think> leaked into content",
    ),
    "reasoning-in-content": (
        {"test_reasoning_separated[stream]"}
        | {"test_truncated_inside_thinking[plain]", "test_truncated_inside_thinking[stream]"}
        | THEN_TOOL,
        "the same failure as test_reasoning_separated[plain]: reasoning (non-streaming): no "
        "reasoning",
    ),
    "answer-in-reasoning": (
        {"test_thinking_disabled[stream]"},
        "the same failure as test_thinking_disabled[plain]: enable_thinking false "
        "(non-streaming): the answer landed in reasoning",
    ),
}
CITED["response-format-ignored"] = (
    (STRUCT | SDK_STRUCT) - {"test_structured_output[json_schema-plain]"},
    "the same failure as test_structured_output[json_schema-plain]: response_format "
    "json_schema, non-streaming: the server ignored response_format",
)
# fault -> the new checks (structured output, the SDK's) that skip citing their raw twin or
# the verdict that owns the failure (one failure, there); and the words each skip says
SEPARATED_CITED = "(test_reasoning_separated[plain] has the evidence)"
SAME_WAY = "the raw request failed the same way: POST http://127.0.0.1:"
SDK_STREAM = SDK_TOOL_STREAM | {"test_sdk_reasoning[stream]"} | (SDK_STRUCT - SDK_STRUCT_PLAIN)
SDK_CITED: dict[str, tuple[set[str], str]] = {
    "malformed-sse": (SDK_STREAM, SAME_WAY),
    "truncated-stream": (SDK_STREAM, SAME_WAY),
    "invalid-json-body": (
        SDK_TOOL_PLAIN | {"test_sdk_reasoning[plain]"} | SDK_STRUCT_PLAIN,
        SAME_WAY,
    ),
    "tool-in-content": (
        {"test_sdk_tool_call[auto-plain]", "test_sdk_tool_call[auto-stream]"},
        "(test_tool_call[auto-plain] has the evidence)",
    ),
    "tool-args-unstreamed": (
        SDK_TOOL_STREAM,
        "the streamed tool-call arguments never came: call 0 (get_weather, header at chunk",
    ),
    "tool-param-leak": (
        {"test_sdk_tool_call[auto-plain]", "test_sdk_tool_call[auto-stream]"},
        "the same failure as test_tool_call[auto-",
    ),
    "tool-args-strings": (SDK_TOOL_PLAIN | SDK_TOOL_STREAM, "the same failure as test_tool_call["),
    "think-in-content": (SDK_REASONING | STRUCT | SDK_STRUCT, SEPARATED_CITED),
    "reasoning-in-content": (SDK_REASONING | STRUCT | SDK_STRUCT, SEPARATED_CITED),
}
SERVE = "vllm serve /models/qwen --served-model-name qwen --max-model-len 8192"
FLAGS = "--reasoning-parser qwen3 --tool-call-parser qwen3_coder --enable-auto-tool-choice"


def _emulator_missing() -> str | None:
    if not (REPO / "sparksim" / "emulator" / "__main__.py").exists():
        return "the vLLM emulator (sparksim.emulator) is not there yet"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Run:
    ret: int
    output: str
    checks: dict[str, dict[str, Any]]

    def failed(self) -> set[str]:
        return {k for k, c in self.checks.items() if c["outcome"] in ("failed", "error")}


class Emulator:
    """One ``python -m sparksim.emulator serve`` on a free loopback port."""

    def __init__(self, workdir: Path, server_flags: bool = True) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.control = workdir / "control.json"
        self.control.write_text('{"faults": []}')
        env = {**os.environ, **EMU_ENV, "SPARKSIM_EMU_CONTROL": str(self.control)}
        argv = [
            sys.executable,
            "-m",
            "sparksim.emulator",
            "serve",
            "/models/qwen",
            "--served-model-name",
            "qwen",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--max-model-len",
            "8192",
        ]
        if server_flags:  # the reference deployment's flags (REFERENCE section 1)
            argv += [
                "--reasoning-parser",
                "qwen3",
                "--tool-call-parser",
                "qwen3_coder",
                "--enable-auto-tool-choice",
            ]
        self.log = (workdir / "emulator.log").open("w")
        self.proc = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"emulator exited {self.proc.returncode}: "
                    f"{(workdir / 'emulator.log').read_text()[-2000:]}"
                )
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("emulator not ready within 30 s")

    def fault(self, name: str) -> None:
        self.control.write_text(json.dumps({"faults": [name]}))
        time.sleep(0.4)  # the emulator polls its control file every 0.05 s
        if name == "worker-death":  # wait until the engine is dead (/health 503)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if httpx.get(self.url + "/health", timeout=2).status_code == 503:
                    break
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def run_suite(url: str, workdir: Path, thresholds: str, serve_args: str) -> Run:
    results = workdir / "results.json"
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "tests_e2e",
        "-p",
        "no:cacheprovider",
        "-q",
        "-m",
        MARKERS,
        f"--spark-api-url={url}",
        f"--spark-serve-args={serve_args}",
        "--spark-profile=sim",
        f"--spark-threshold={thresholds}",
        f"--spark-results={results}",
        f"--spark-history={workdir / 'history'}",
        "--rootdir",
        str(REPO),
        "-c",
        str(REPO / "pyproject.toml"),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYTEST_"))}
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240, env=env)
    data = json.loads(results.read_text()) if results.exists() else {"checks": []}
    checks = {c["nodeid"].split("::", 1)[1]: c for c in data["checks"]}
    return Run(proc.returncode, proc.stdout + proc.stderr, checks)


def scenario(fault: str, workdir: Path) -> Run:
    workdir.mkdir(parents=True, exist_ok=True)
    flags = not fault.startswith("no-flags")
    emu = Emulator(workdir, server_flags=flags)
    try:
        if fault != "healthy" and flags:
            emu.fault(fault)
        strict = fault in ("healthy", "slow-decode")
        thresholds = STRICT if strict else LAX
        if fault == "no-flags-lax":
            thresholds += ",tool_calls.expected=false,reasoning.expected=false"
        return run_suite(emu.url, workdir, thresholds, f"{SERVE} {FLAGS}" if flags else SERVE)
    finally:
        emu.stop()


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Run | Exception]]:
    """Every scenario this session selected: healthy alone, then the faults six at a time."""
    reason = _emulator_missing()
    if reason:
        pytest.skip(reason)
    wanted = sorted(
        {
            item.callspec.params["fault"]
            for item in request.session.items
            if isinstance(item, pytest.Function)
            and item.module is request.module
            and hasattr(item, "callspec")
        }
    )
    base = tmp_path_factory.mktemp("serving-suite")

    def one(fault: str) -> Run | Exception:
        try:
            return scenario(fault, base / fault)
        except Exception as exc:  # reported by the test of that scenario
            return exc

    done = {}
    if "healthy" in wanted:  # alone: its speed checks are strict
        done["healthy"] = one("healthy")
    rest = [f for f in wanted if f != "healthy"]
    with ThreadPoolExecutor(max_workers=6) as pool:
        done.update(zip(rest, pool.map(one, rest), strict=True))
    yield done


@pytest.mark.parametrize("fault", list(EXPECTED))
def test_suite_on_emulator(runs: dict[str, Run | Exception], fault: str) -> None:
    run = runs[fault]
    if isinstance(run, Exception):
        raise run
    must_fail, phrase = EXPECTED[fault]
    assert set(run.checks) == ALL, run.output[-3000:]
    assert run.failed() == must_fail, (
        f"unexpected failures {sorted(run.failed() - must_fail)}, missing failures "
        f"{sorted(must_fail - run.failed())}\n{run.output[-4000:]}"
    )
    cited, because = CITED.get(fault, (set(), ""))
    sdk_cited, sdk_because = SDK_CITED.get(fault, (set(), ""))
    skipped = {k for k, c in run.checks.items() if c["outcome"] == "skipped"}
    assert skipped == cited | sdk_cited, (
        f"unexpected skips {sorted(skipped - cited - sdk_cited)}, missing skips "
        f"{sorted((cited | sdk_cited) - skipped)}\n{run.output[-3000:]}"
    )
    for name in cited:
        assert because in run.checks[name]["message"], (name, run.checks[name]["message"])
    for name in sdk_cited:
        assert sdk_because in run.checks[name]["message"], (name, run.checks[name]["message"])
    assert all(
        c["outcome"] == "passed"
        for k, c in run.checks.items()
        if k not in must_fail | cited | sdk_cited
    )
    for name in must_fail:
        check = run.checks[name]
        assert phrase in check["message"], (name, check["message"])
        if fault in ENGINE_FAILING:
            # found once, before any check runs: each check reports it, with no own request
            assert check["outcome"] == "error" and not check["crashed"], check
            assert "serves 'qwen' but a chat completion answered HTTP 500" in check["message"]
            assert "The engine is failing requests" in check["message"]
            continue
        assert "qwen at http://127.0.0.1:" in check["message"], check["message"]
        evidence = check["evidence"]
        assert evidence, (name, "no evidence attached")
        if fault != "slow-decode":
            assert "POST http://127.0.0.1:" in evidence["request"], evidence
            assert set(evidence) & {"response", "stream"}, evidence
    if fault == "healthy":
        assert run.ret == 0
        sweep = run.checks["test_sweep_completes"]["extra"]["sweep"]
        assert [lv["concurrency"] for lv in sweep["levels"]] == [1, 4]
        assert sweep["server_metrics"]["kv_cache_metric"] == "vllm:kv_cache_usage_perc"
        assert sweep["server_metrics"]["client_output_tokens"] == 6 * 16
        assert (
            run.checks["test_reasoning_separated[plain]"]["extra"]["reasoning_field"] == "reasoning"
        )


AUTO = {
    "test_tool_call[auto-plain]",
    "test_tool_call[auto-stream]",
    "test_parallel_tool_calls[plain]",
    "test_parallel_tool_calls[stream]",
}
SDK_AUTO = {"test_sdk_tool_call[auto-plain]", "test_sdk_tool_call[auto-stream]"}
NO_FLAGS: dict[str, tuple[dict[str, str], set[str]]] = {
    # profile expects both parsers: one failure per missing parser, quoting the command
    # line; every check that needs the parser skips citing it
    "no-flags": (
        {
            "test_server_has_tool_parser": "started without --enable-auto-tool-choice and "
            f"--tool-call-parser, but profile sim expects tool calls under tool_choice=auto: "
            f"vLLM refuses auto with HTTP 400 or leaves the calls in content. Read from "
            f"--spark-serve-args: {SERVE}.",
            "test_server_has_reasoning_parser": "started without --reasoning-parser, but "
            f"profile sim expects the model's thinking in the reasoning field: without a parser "
            f"it stays in content. Read from --spark-serve-args: {SERVE}.",
        },
        AUTO | AUTO_ENABLED | R_PLAIN | R_STREAM | SDK_AUTO | SDK_REASONING,
    ),
    # profile says neither is expected: every check that cannot apply skips with the reason
    "no-flags-lax": (
        {},
        AUTO | AUTO_ENABLED | R_PLAIN | R_STREAM | VERDICTS | SDK_AUTO | SDK_REASONING,
    ),
}
# what each skip says: the verdict it cites (no-flags), or why it cannot apply (lax)
SKIP_SAYS = {
    "no-flags": ("(test_server_has_",),  # ...tool_parser / ...reasoning_parser has the evidence
    "no-flags-lax": ("started without --", "expected = false"),
}


@pytest.mark.parametrize("fault", list(NO_FLAGS))
def test_suite_without_server_flags(runs: dict[str, Run | Exception], fault: str) -> None:
    """A server started without --enable-auto-tool-choice --tool-call-parser and without
    --reasoning-parser: reported as a misconfiguration, or skipped with the reason where the
    profile says the deployment does not need them; never a silent pass."""
    run = runs[fault]
    if isinstance(run, Exception):
        raise run
    must_fail, must_skip = NO_FLAGS[fault]
    outcomes = {k: c["outcome"] for k, c in run.checks.items()}
    assert set(outcomes) == ALL, run.output[-3000:]
    assert run.failed() == set(must_fail), run.output[-4000:]
    assert {k for k, o in outcomes.items() if o == "skipped"} == must_skip, outcomes
    for name, phrase in must_fail.items():
        assert phrase in run.checks[name]["message"], run.checks[name]["message"]
    for name in must_skip:
        message = run.checks[name]["message"]
        assert any(words in message for words in SKIP_SAYS[fault]), (name, message)
