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
import re
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
    "throughput.max_ttft_p90_s_1=2.0,"
    "slo.ttft_s=2.0,slo.tpot_s=0.5,slo.e2e_s=8.0"
)
# Healthy 600 tok/s per stream; slow-decode 60. Speed checks are strict where speed is the
# point (healthy; slow-decode, whose slowness only grows under load) and lax in the other
# scenarios, which run side by side on a busy machine.
# The strict runs decode 64 tokens a request. Beside the fault matrix (the suite tier's
# other worker) the healthy emulator gave 278 tok/s at 1 stream and 305-364 at 4 (600 and
# 2400 nominal): the floors are 150 and 250, and slow-decode's 4 streams (~233 tok/s, lower
# under load) still fall under the aggregate floor, its skip citing the decode verdict.
STRICT = SHAPE + ",throughput.output_tokens=64"
STRICT += ",throughput.min_decode_tok_s_1=150,throughput.min_agg_tok_s_4=250"
LAX = SHAPE + ",throughput.min_decode_tok_s_1=1,throughput.min_agg_tok_s_4=1"
EMU_ENV = {
    "SPARKSIM_EMU_TIME_SCALE": "0",
    "SPARKSIM_EMU_DECODE_TOK_S": "600",
    # Every stream at 600 tok/s (the step model's batch growth off): these scenarios are
    # about verdicts, and at ms-scale steps with 16-token requests a loaded machine's TTFT
    # already eats the 4-stream aggregate (1.9x of 600, the hardware's curve, measured
    # 229 tok/s at load 20 on 2 cores). The suite tier's fault matrix runs the curve.
    "SPARKSIM_EMU_STEP_EXPERT_SHARE": "0",
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
    "test_goodput",
    "test_metrics_health_during_sweep",
    "test_spec_decode_acceptance",
}
# These emulators serve without --speculative-config: the spec-decode check skips saying so
# (the fault matrix's spec-collapse row runs it drafting).
NO_SPEC = {"test_spec_decode_acceptance"}
# Only the API is given (--spark-api-url): no nodes whose fabric counters could be read.
NO_NODES = {"test_fabric_error_counters"}
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
    | NO_NODES
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
    # the engine failing: test_cluster_serving's one failure (ENGINE_FAILING below)
    "http-5xx": (set(), "HTTP 500"),
    "worker-death": (set(), "HTTP 500"),
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
    # vLLM #16340: the named stream's header delta has no "type". Within OpenAI's chunk
    # schema, so the raw checks pass it; only the SDK's stream helper is left without a call
    "tool-delta-no-type": (
        {"test_sdk_tool_call[named-stream]"},
        "has no field choices.0.delta.tool_calls.0.type: ",
    ),
    # one verdict: the json_schema non-streaming answer; the other formats skip citing it
    "response-format-ignored": (
        {"test_structured_output[json_schema-plain]"},
        "the server ignored response_format: content is not JSON but text",
    ),
    # one request alone is as fast as ever; at 4 streams TTFT + 1 s per other running
    # request breaks the TTFT SLO of half the requests: only the goodput gate sees it
    "ttft-grows-with-batch": ({"test_goodput"}, "most broken: TTFT"),
    # /metrics health: the sweep's requests all succeed; the server counts preemptions
    "preempt-under-load": ({"test_metrics_health_during_sweep"}, "vllm:num_preemptions +"),
}
# faults of speed, not of the wire: their failures carry the figures, not a request
SPEED_FAULTS = {"slow-decode", "ttft-grows-with-batch"}


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
    # the aggregate, and the goodput whose requests broke TPOT (slo.tpot_s=0.01 there)
    "slow-decode": (
        {"test_aggregate_four_streams", "test_goodput"},
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
    verdict: dict[str, Any] | None = None  # test_cluster_serving, put back by -m

    def failed(self) -> set[str]:
        return {k for k, c in self.checks.items() if c["outcome"] in ("failed", "error")}


class Emulator:
    """One ``python -m sparksim.emulator serve`` on a free loopback port."""

    def __init__(
        self,
        workdir: Path,
        server_flags: bool = True,
        extra_args: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.control = workdir / "control.json"
        self.control.write_text('{"faults": []}')
        env = {**os.environ, **EMU_ENV, **(extra_env or {})}
        env["SPARKSIM_EMU_CONTROL"] = str(self.control)
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
            *extra_args,
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


def run_suite(
    url: str, workdir: Path, thresholds: str, serve_args: str, marker: str = MARKERS, *extra: str
) -> Run:
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
        marker,
        *extra,
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
    # -m without readiness: the serving verdict runs all the same (put back for the checks
    # that need the server), kept apart so that the checks are the selected categories'
    verdict = checks.pop("test_cluster_serving", None) if "readiness" not in marker else None
    return Run(proc.returncode, proc.stdout + proc.stderr, checks, verdict)


def scenario(fault: str, workdir: Path) -> Run:
    workdir.mkdir(parents=True, exist_ok=True)
    flags = not fault.startswith("no-flags")
    emu = Emulator(workdir, server_flags=flags)
    try:
        if fault != "healthy" and flags:
            emu.fault(fault)
        strict = fault in ("healthy", "slow-decode")
        thresholds = STRICT if strict else LAX
        if fault == "slow-decode":  # 60 tok/s: TPOT ~17 ms breaks it, healthy's ~2 ms not
            thresholds += ",slo.tpot_s=0.01"
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
            and "fault" in getattr(getattr(item, "callspec", None), "params", {})
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
    if fault in ENGINE_FAILING:
        # found once, before any check runs: the serving verdict (put back by -m) is its
        # one failure and every check skips citing it (issue #36: each check errored with
        # it, 40 identical errors)
        verdict = run.verdict
        assert verdict is not None and verdict["outcome"] == "failed", run.output[-3000:]
        assert not verdict["crashed"] and phrase in verdict["message"], verdict
        assert "serves 'qwen' but a chat completion answered HTTP 500" in verdict["message"]
        assert "The engine is failing requests" in verdict["message"]
        assert run.failed() == set(), run.output[-3000:]
        for name, check in run.checks.items():
            assert check["outcome"] == "skipped", (name, check)
            if name in NO_NODES:
                assert "only the API was given" in check["message"], check
                continue
            assert check["message"].startswith("the cluster is not serving: "), check
            assert check["message"].endswith("(test_cluster_serving has the evidence)"), check
        return
    assert run.failed() == must_fail, (
        f"unexpected failures {sorted(run.failed() - must_fail)}, missing failures "
        f"{sorted(must_fail - run.failed())}\n{run.output[-4000:]}"
    )
    cited, because = CITED.get(fault, (set(), ""))
    sdk_cited, sdk_because = SDK_CITED.get(fault, (set(), ""))
    skipped = {k for k, c in run.checks.items() if c["outcome"] == "skipped"}
    cited = cited | ((NO_SPEC | NO_NODES) - must_fail)
    assert skipped == cited | sdk_cited, (
        f"unexpected skips {sorted(skipped - cited - sdk_cited)}, missing skips "
        f"{sorted((cited | sdk_cited) - skipped)}\n{run.output[-3000:]}"
    )
    for name in cited - NO_SPEC - NO_NODES:
        assert because in run.checks[name]["message"], (name, run.checks[name]["message"])
    for name in cited & NO_NODES:
        assert "only the API was given" in run.checks[name]["message"], run.checks[name]
    for name in cited & NO_SPEC:
        assert "no speculative decoding" in run.checks[name]["message"], run.checks[name]
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
        assert "qwen at http://127.0.0.1:" in check["message"], check["message"]
        evidence = check["evidence"]
        assert evidence, (name, "no evidence attached")
        if fault == "preempt-under-load":  # the server's figures, level by level
            assert '"preemptions":' in evidence["level_metrics"], evidence
        elif fault not in SPEED_FAULTS:
            assert "POST http://127.0.0.1:" in evidence["request"], evidence
            assert set(evidence) & {"response", "stream"}, evidence
    if fault == "healthy":
        assert run.ret == 0
        sweep = run.checks["test_sweep_completes"]["extra"]["sweep"]
        assert [lv["concurrency"] for lv in sweep["levels"]] == [1, 4]
        assert [lv["goodput"]["goodput_pct"] for lv in sweep["levels"]] == [100.0, 100.0]
        good = run.checks["test_goodput"]["extra"]["goodput"]
        assert good["slo_s"] == {"ttft": 2.0, "tpot": 0.5, "e2e": 8.0}
        assert good["at_percentile"]["ttft"]["pct"] == 99.0
        assert sweep["server_metrics"]["kv_cache_metric"] == "vllm:kv_cache_usage_perc"
        assert sweep["server_metrics"]["client_output_tokens"] == 6 * 64
        assert (
            run.checks["test_reasoning_separated[plain]"]["extra"]["reasoning_field"] == "reasoning"
        )
        # the throughput levels' live line (issue #16 section 8), flushed as written: in a
        # log, the first request's line as it comes, then each level's last, at 100%
        for line in (
            r"throughput 1 stream: 1/2 requests 50% \d+\.\d tok/s so far",
            r"throughput 1 stream: 2/2 requests 100% \d+\.\d tok/s so far",
            r"throughput 4 streams: 4/4 requests 100% \d+\.\d tok/s so far",
        ):
            assert re.search(f"^{line}$", run.output, re.MULTILINE), (line, run.output[-3000:])


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
    skipped = {k for k, o in outcomes.items() if o == "skipped"}
    assert skipped == must_skip | NO_SPEC | NO_NODES, outcomes
    for name, phrase in must_fail.items():
        assert phrase in run.checks[name]["message"], run.checks[name]["message"]
    for name in must_skip:
        message = run.checks[name]["message"]
        assert any(words in message for words in SKIP_SAYS[fault]), (name, message)


# The load modes (tests_e2e/test_open_loop.py, test_soak.py) at short settings: off by
# default, so each run asks for its mode; against their own emulators, side by side.
# A drift of 60 %: the healthy soak's 2 s windows drifted 39 % on a loaded machine (the tiers
# side by side); slow-decode's tenth is a 90 % fall.
LOAD = SHAPE + ",throughput.output_tokens=64,soak.window_s=2,soak.concurrency=2"
LOAD += ",soak.max_drift_pct=60"
OPEN_LOOP = {"test_open_loop_knee"}
SOAK = {
    "test_soak_no_errors",
    "test_soak_tok_s_steady",
    "test_soak_no_preemptions",
    "test_soak_waiting_queue_steady",
}
DEPTH = {"test_depth_sweep"}
DEPTH_SPEC = "depths=0,256;pp=64;tg=8;c=1,2"


def _served(emu: Emulator) -> float:
    """Requests the emulator has finished (vllm:request_success_total)."""
    text = httpx.get(emu.url + "/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


def load_mode(name: str, workdir: Path) -> Run:
    workdir.mkdir(parents=True, exist_ok=True)
    emu = Emulator(workdir)
    try:
        if name == "skipped":
            return run_suite(emu.url, workdir, LOAD, f"{SERVE} {FLAGS}", marker="load")
        if name == "knee-fault":  # every request fast alone, slow once two overlap
            emu.fault("ttft-grows-with-batch")
            args = LOAD + ",open_loop.min_knee_req_s=8"
            return run_suite(
                emu.url, workdir, args, f"{SERVE} {FLAGS}", "load", "--spark-open-loop"
            )
        extra = (
            [
                "--spark-open-loop",
                "--spark-soak=8s",
                f"--spark-depth-sweep={DEPTH_SPEC}",
                f"--spark-arena={workdir / 'arena'}",
            ]
            if name == "healthy"
            else ["--spark-soak=8s"]
        )
        if name == "healthy":
            return run_suite(emu.url, workdir, LOAD, f"{SERVE} {FLAGS}", "load", *extra)
        # drift: decode slows tenfold a few seconds into the soak (slow-decode)
        with ThreadPoolExecutor(1) as pool:
            run = pool.submit(run_suite, emu.url, workdir, LOAD, f"{SERVE} {FLAGS}", "load", *extra)
            deadline = time.monotonic() + 120
            while not run.done() and time.monotonic() < deadline and _served(emu) < 40:
                time.sleep(0.1)
            emu.fault("slow-decode")
            return run.result()
    finally:
        emu.stop()


@pytest.fixture(scope="module")
def load_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run | Exception]:
    reason = _emulator_missing()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("load-modes")

    def one(name: str) -> Run | Exception:
        try:
            return load_mode(name, base / name)
        except Exception as exc:  # reported by the test of that mode
            return exc

    names = ("healthy", "skipped", "knee-fault", "soak-drift")
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        return dict(zip(names, pool.map(one, names), strict=True))


def _load_run(load_runs: dict[str, Run | Exception], name: str) -> Run:
    run = load_runs[name]
    if isinstance(run, Exception):
        raise run
    assert set(run.checks) == OPEN_LOOP | SOAK | DEPTH, run.output[-3000:]
    return run


def test_load_modes_skip_without_their_options(load_runs: dict[str, Run | Exception]) -> None:
    run = _load_run(load_runs, "skipped")
    assert all(c["outcome"] == "skipped" for c in run.checks.values()), run.output[-3000:]
    assert "--spark-open-loop runs it" in run.checks["test_open_loop_knee"]["message"]
    assert "--spark-depth-sweep runs it" in run.checks["test_depth_sweep"]["message"]
    for name in SOAK:
        assert "--spark-soak=DURATION" in run.checks[name]["message"], name


def test_load_modes_pass_on_a_healthy_server(load_runs: dict[str, Run | Exception]) -> None:
    run = _load_run(load_runs, "healthy")
    assert run.failed() == set() and run.ret == 0, run.output[-4000:]
    knee = run.checks["test_open_loop_knee"]
    sweep = knee["extra"]["open_loop"]
    assert [lv["rate"] for lv in sweep["levels"]][:1] == [1.0] and sweep["knee_req_s"] >= 1.0
    assert all("p99" in lv["level"]["ttft_s"] for lv in sweep["levels"])
    soak = run.checks["test_soak_no_errors"]["extra"]["soak"]
    assert soak["failed"] == 0 and len(soak["window_tok_s"]) >= 3, soak
    assert soak["preemptions"] == 0 and soak["waiting_growth"] is not None
    assert all(run.checks[name]["outcome"] == "passed" for name in SOAK)
    assert "soak " in run.output and "open loop 1 req/s: " in run.output  # progress lines
    # the depth sweep, trimmed for the emulator: every cell, llama-benchy's fields, the file
    depth = run.checks["test_depth_sweep"]
    assert depth["outcome"] == "passed", depth["message"]
    report = depth["extra"]["depth_sweep"]
    cells = {(b["context_size"], b["concurrency"]): b for b in report["benchmarks"]}
    assert set(cells) == {(0, 1), (0, 2), (256, 1), (256, 2)}
    assert report["heat_order"][:2] == [[256, 2], [0, 1]]  # hottest, then coolest
    for (_, c), b in cells.items():
        assert b["failed"] == 0 and len(b["e2e_ttft"]["values"]) == c, b
        assert b["prompt_size"] == 64 and b["response_size"] == 8
        assert b["tg_req_throughput"]["mean"] > 0 and b["pp_throughput"]["mean"] > 0
    # the depth is sent: the server counted 256 more prompt tokens (about a word each)
    tokens = {k: b["prompt_tokens"]["mean"] for k, b in cells.items()}
    assert tokens[(256, 1)] - tokens[(0, 1)] >= 200, tokens
    path = depth["message"].rsplit("written to ", 1)[1].strip()
    assert path.endswith("depth-sweep.json"), depth["message"]
    written = json.loads(Path(path).read_text())
    assert written["benchmarks"] == report["benchmarks"]
    # --spark-arena: the same sweep as the Spark Arena publishes it (report/arena.py)
    arena = Path(path).parent / "arena"
    rows = (arena / "benchmark.csv").read_text().splitlines()
    assert rows[0].startswith("model,test_name,t_s_mean,t_s_std,t_s_req_mean,"), rows[0]
    names = [line.split(",")[1] for line in rows[1:]]
    assert names == [
        f"{k}{n}{d} (c{c})"
        for d in ("", " @ d256")
        for c in (1, 2)
        for k, n in (("pp", 64), ("tg", 8))
    ], names
    meta = json.loads((arena / "metadata.json").read_text())
    assert meta["benchmark"]["args"]["depth"] == [0, 256] and meta["recipe"]["model"]
    assert "Spark Arena figures: " in run.output and "benchmark.csv" in run.output


def test_open_loop_knee_fails_when_load_breaks_the_slos(
    load_runs: dict[str, Run | Exception],
) -> None:
    run = _load_run(load_runs, "knee-fault")
    assert run.failed() == OPEN_LOOP, run.output[-4000:]
    message = run.checks["test_open_loop_knee"]["message"]
    assert "qwen at http://127.0.0.1:" in message and "open-loop knee" in message
    assert "expected >= 8 req/s" in message and "most broken: TTFT" in message
    assert "vllm:num_requests_waiting" in message  # the fix
    assert run.checks["test_open_loop_knee"]["evidence"]["open_loop"]


def test_soak_fails_on_tok_s_drift(load_runs: dict[str, Run | Exception]) -> None:
    run = _load_run(load_runs, "soak-drift")
    assert run.failed() == {"test_soak_tok_s_steady"}, run.output[-4000:]
    message = run.checks["test_soak_tok_s_steady"]["message"]
    assert "soak output tok/s fell" in message and "expected at most 60%" in message
    assert "qwen at http://127.0.0.1:" in message
    assert run.checks["test_soak_tok_s_steady"]["evidence"]["soak"]


# Prefix cache and long context (issue #16 section 6), their own small runs: prefill is paced
# (5000 tok/s: a 2048-token prefix costs 0.4 s cold, nothing cached) so a hit shows in TTFT.
CONTEXT = {
    "test_prefix_cache",
    "test_long_context_needle",
    "test_context_over_limit",
    "test_context_is_the_recipes",  # skips: no sparkrun recipe
}
CONTEXT_ENV = {"SPARKSIM_EMU_PREFILL_TOK_S": "5000"}
# case -> (serve args, emulator faults, the checks that fail, words of the failure, its fix)
CONTEXT_RUNS: dict[str, tuple[tuple[str, ...], str, set[str], str, str]] = {
    "healthy": ((), "", set(), "", ""),
    "no-prefix-caching": (
        ("--no-enable-prefix-caching",),
        "",
        {"test_prefix_cache"},
        "prefix caching is off (vllm:cache_config_info enable_prefix_caching=False): TTFT cold ",
        "drop the flag from the serve arguments",
    ),
    # served 4x past its native context: the needle, mid-prompt, lies beyond the last 2048
    # tokens of a ~7.3k-token prompt; the ~1k-token probe still answers it
    "context-beyond-native": (
        (),
        "context-beyond-native",
        {"test_long_context_needle"},
        "expected the answer to name ",
        "-token prompt answered it: the context is lost between ",
    ),
}


def test_context_on_emulator_healthy(tmp_path: Path) -> None:
    context_run(tmp_path, "healthy")


def test_context_on_emulator_no_prefix_caching(tmp_path: Path) -> None:
    context_run(tmp_path, "no-prefix-caching")


def test_context_on_emulator_context_beyond_native(tmp_path: Path) -> None:
    context_run(tmp_path, "context-beyond-native")


@pytest.mark.parametrize(("recipe_len", "outcome"), [(8192, "passed"), (4096, "failed")])
def test_context_is_the_recipes_on_emulator(tmp_path: Path, recipe_len: int, outcome: str) -> None:
    """--spark-recipe's max_model_len against the served one (the emulator's 8192)."""
    reason = _emulator_missing()
    if reason:
        pytest.skip(reason)
    recipe = tmp_path / "qwen.yaml"
    recipe.write_text(
        'recipe_version: "2"\nmodel: /models/qwen\nruntime: vllm\ndefaults:\n'
        f"  served_model_name: qwen\n  max_model_len: {recipe_len}\n"
    )
    emu = Emulator(tmp_path)
    try:
        run = run_suite(
            emu.url,
            tmp_path,
            LAX,
            f"{SERVE} {FLAGS}",
            "context",
            "-k",
            "test_context_is_the_recipes",
            f"--spark-recipe={recipe}",
        )
    finally:
        emu.stop()
    check = run.checks["test_context_is_the_recipes"]
    assert check["outcome"] == outcome, run.output[-3000:]
    if outcome == "failed":
        assert check["message"].startswith("qwen at http://127.0.0.1:"), check["message"]
        assert f"/v1/models says max_model_len 8192; recipe {recipe} sets 4096." in check["message"]


def context_run(tmp_path: Path, case: str) -> None:
    """(Not parametrized: the module's `runs` fixture reads every parametrized test's
    `fault`.)"""
    reason = _emulator_missing()
    if reason:
        pytest.skip(reason)
    args, fault, must_fail, phrase, fix = CONTEXT_RUNS[case]
    env = {**CONTEXT_ENV, **({"SPARKSIM_EMU_FAULT": fault} if fault else {})}
    emu = Emulator(tmp_path, extra_args=args, extra_env=env)
    try:
        run = run_suite(emu.url, tmp_path, LAX, f"{SERVE} {FLAGS} {' '.join(args)}", "context")
    finally:
        emu.stop()
    assert set(run.checks) == CONTEXT, run.output[-3000:]
    assert run.failed() == must_fail, run.output[-4000:]
    for name in CONTEXT - must_fail - {"test_context_is_the_recipes"}:
        assert run.checks[name]["outcome"] == "passed", (name, run.checks[name]["message"])
    assert run.checks["test_context_is_the_recipes"]["outcome"] == "skipped"
    for name in must_fail:
        check = run.checks[name]
        assert check["message"].startswith("qwen at http://127.0.0.1:"), check["message"]
        assert phrase in check["message"] and fix in check["message"], check["message"]
    if case == "healthy":
        cache = run.checks["test_prefix_cache"]["extra"]["prefix_cache"]
        assert cache["hits"] >= 2000 and cache["ttft_warm_s"] < cache["ttft_cold_s"]
        assert (
            run.checks["test_long_context_needle"]["extra"]["long_context"]["prompt_tokens"]
            > 0.85 * 8192
        )


# A model that answers wrong (issue #24): with the accuracy checks in the session it is their
# one failure (test_canaries_alone, quoting a prompt, the answer and the expected answer) and
# the tool calls whose arguments break (numbers as strings under auto) skip citing it; with
# `-m tool_calls` alone the same calls fail on their own, as they must.
WRONG_MODEL_TOOLS = {
    "test_tool_call[auto-plain]",
    "test_tool_call[auto-stream]",
    "test_parallel_tool_calls[plain]",
    "test_parallel_tool_calls[stream]",
}


def test_a_wrong_model_is_the_accuracy_verdicts_failure(tmp_path: Path) -> None:
    wrong_model_run(tmp_path, "accuracy or tool_calls")


def test_a_wrong_model_fails_the_tool_checks_without_the_accuracy_verdict(tmp_path: Path) -> None:
    wrong_model_run(tmp_path, "tool_calls")


def wrong_model_run(tmp_path: Path, marker: str) -> None:
    """(Not parametrized: the module's `runs` fixture reads every parametrized test's
    `fault`.)"""
    reason = _emulator_missing()
    if reason:
        pytest.skip(reason)
    emu = Emulator(tmp_path)
    try:
        emu.fault("garble")
        run = run_suite(emu.url, tmp_path, LAX, f"{SERVE} {FLAGS}", marker)
    finally:
        emu.stop()
    if marker == "tool_calls":
        assert run.failed() >= WRONG_MODEL_TOOLS, run.output[-3000:]
        assert not any(n.startswith("test_canaries") for n in run.checks)
        says = run.checks["test_tool_call[auto-plain]"]["message"]
        assert '"2" is a string' in says, says
        return
    assert run.failed() == {"test_canaries_alone"}, run.output[-4000:]
    verdict = run.checks["test_canaries_alone"]["message"]
    assert "answers wrong" in verdict and "expected" in verdict and " = " in verdict, verdict
    assert "wrong when alone" in verdict and "--enforce-eager" in verdict, verdict
    # --spark-api-url alone: the server's advice, not the cluster's (issue #25)
    assert "chat template" in verdict and "speculative decoding" in verdict, verdict
    for word in ("tensor-parallel", "TP=1", "CUDA graphs", "test_model_dir_identical"):
        assert word not in verdict, verdict
    for name in WRONG_MODEL_TOOLS | {"test_canaries_under_load", "test_logprob_fingerprint"}:
        check = run.checks[name]
        assert check["outcome"] == "skipped", (name, check)
        assert "test_canaries_alone has the evidence" in check["message"], check["message"]


# Right alone, wrong under load (issue #24's garble-under-batch): the functional checks'
# requests go out together (--spark-serving-concurrency, issue #27), so their answers break
# too; the under-load verdict is the one failure and each of them whose answer broke skips
# citing it. One request at a time they are right and pass.
def test_a_model_wrong_under_load_is_the_under_load_verdicts_failure(tmp_path: Path) -> None:
    reason = _emulator_missing()
    if reason:
        pytest.skip(reason)
    runs = {}
    for concurrency in (8, 1):
        (tmp_path / str(concurrency)).mkdir()
        emu = Emulator(tmp_path / str(concurrency))
        try:
            emu.fault("garble-under-batch")
            runs[concurrency] = run_suite(
                emu.url,
                tmp_path / str(concurrency),
                LAX,
                f"{SERVE} {FLAGS}",
                "accuracy or tool_calls or structured_output",
                f"--spark-serving-concurrency={concurrency}",
            )
        finally:
            emu.stop()
    together, alone = runs[8], runs[1]
    assert together.failed() == {"test_canaries_under_load"}, together.output[-4000:]
    cited = [
        c
        for c in together.checks.values()
        if c["outcome"] == "skipped" and "test_canaries_under_load has the evidence" in c["message"]
    ]
    assert cited, together.output[-4000:]  # some answers broke in the batch, and say why
    assert all("--spark-serving-concurrency" in c["message"] for c in cited)
    assert alone.failed() == {"test_canaries_under_load"}, alone.output[-4000:]
    assert not any(
        "test_canaries_under_load has the evidence" in c["message"] for c in alone.checks.values()
    )


SPEC_ARGS = ("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 3}')


def test_spec_collapse_under_the_decode_floor_is_one_failure(tmp_path: Path) -> None:
    """Speculative decoding collapsed (the emulator's spec-collapse fault: ~31% accepted,
    0.77x the plain rate) so far that single-stream decode misses its floor (set at 500 of
    the emulator's 600 tok/s without drafting, the profile's spec_decode.no_draft_tok_s):
    test_spec_decode_acceptance names the collapse, with the figures and the fix, and the
    decode check skips citing it."""
    reason = _emulator_missing()
    if reason:
        pytest.skip(reason)
    emu = Emulator(tmp_path, extra_args=SPEC_ARGS)
    try:
        emu.fault("spec-collapse")
        thresholds = LAX.replace("min_decode_tok_s_1=1", "min_decode_tok_s_1=500")
        thresholds += ",spec_decode.no_draft_tok_s=600"
        serve = f"{SERVE} {FLAGS} --speculative-config " + repr(SPEC_ARGS[1])
        run = run_suite(emu.url, tmp_path, thresholds, serve, "throughput")
    finally:
        emu.stop()
    assert run.failed() == {"test_spec_decode_acceptance"}, run.output[-4000:]
    spec = run.checks["test_spec_decode_acceptance"]
    assert "speculative decoding collapsed: acceptance" in spec["message"], spec["message"]
    assert "600 tok/s expected without drafting" in spec["message"], spec["message"]
    assert "num_speculative_tokens" in spec["message"], spec["message"]  # the fix
    doc = spec["extra"]["spec_decode"]
    assert doc["method"] == "mtp" and doc["acceptance"] < 0.4, doc
    decode = run.checks["test_decode_single_stream"]
    assert decode["outcome"] == "skipped", decode
    assert "(test_spec_decode_acceptance has the evidence)" in decode["message"], decode
