"""How exact and how cheap is the load client? Measured against the vLLM emulator at a known
true per-stream decode rate (no aggregate cap, the step model's batch growth off), at
concurrency 1, 4, 16 and 64.

For each level it prints, side by side for our httpx client, openai's AsyncOpenAI (same
measurement code, openai's streaming parser) and GuideLLM (if installed):

- per-stream decode tok/s (median 1/TPOT) against the true rate, and the ratio;
- aggregate output tok/s (tokens / wall time, the field's definition) against what the
  server delivered (``server``: c x tokens per request / mean server-side E2E, from the
  emulator's own vllm:generation_tokens_total and vllm:e2e_request_latency_seconds, so the
  ratio is the client's own error and overhead), and against the ideal
  closed loop c*n / (TTFT + (n-1)/rate), which no real client reaches exactly: it leaves
  out the gap between one request's end and the next one's start and the emulator's own
  TTFT growth under load (visible in the TTFT column);
- the client's CPU seconds per 1k output tokens.

    .venv/bin/python benchmarks/load_client_accuracy.py [--rate 20] [--guidellm PATH]

GuideLLM is not a dependency: install it in a throwaway venv
(``python -m venv /tmp/gl-venv && /tmp/gl-venv/bin/pip install guidellm``) and pass
``--guidellm /tmp/gl-venv/bin/guidellm``. Its CPU is its whole process tree minus a
one-request run (start-up: it imports torch and transformers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from common import free_port

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pytest_spark.access.api import ApiEndpoint  # noqa: E402
from pytest_spark.serving.client.wire import parse_metrics  # noqa: E402
from pytest_spark.serving.load.sweep import (  # noqa: E402
    LevelResult,
    LoadClient,
    LoadSpec,
    RequestRecord,
    request_body,
)


def start_emulator(rate: float, ttft: float, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "SPARKSIM_EMU_TIME_SCALE": "0",
        "SPARKSIM_EMU_DECODE_TOK_S": str(rate),
        "SPARKSIM_EMU_MAX_AGG_TOK_S": "0",
        "SPARKSIM_EMU_STEP_EXPERT_SHARE": "0",  # every stream at the true rate
        "SPARKSIM_EMU_TTFT_S": str(ttft),
        "SPARKSIM_EMU_PREFILL_TOK_S": "0",
        "SPARKSIM_EMU_STATS_INTERVAL_S": "3600",
    }
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
        str(port),
        "--max-num-seqs",
        "256",
        "--disable-uvicorn-access-log",
    ]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"emulator did not start; see {log}")


SERVER_KEYS = (
    "vllm:generation_tokens_total",
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count",
    "vllm:time_to_first_token_seconds_sum",
)


def server_counters(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    values = parse_metrics(text)
    return {k: values.get(k, 0.0) for k in SERVER_KEYS}


def server_truth(before: dict[str, float], after: dict[str, float], c: int) -> dict[str, float]:
    """What the server delivered: per-request tokens and latency from its own counters, so
    c * tokens / e2e is the closed-loop aggregate with zero client overhead."""
    d = {k: after[k] - before[k] for k in SERVER_KEYS}
    n = d["vllm:e2e_request_latency_seconds_count"] or 1.0
    e2e = d["vllm:e2e_request_latency_seconds_sum"] / n
    return {
        "agg": c * d["vllm:generation_tokens_total"] / n / e2e if e2e else 0.0,
        "ttft": d["vllm:time_to_first_token_seconds_sum"] / n,
    }


def ours(api: ApiEndpoint, spec: LoadSpec, c: int) -> dict[str, Any]:
    async def run() -> LevelResult:
        client = LoadClient(api, LoadSpec(**{**spec.__dict__, "concurrency": (c,)}))
        async with client._client() as http:
            await client.warmup(http)
            marks.append(server_counters(api.base_url))
            level = await client.level(http, c)
            marks.append(server_counters(api.base_url))
            return level

    marks: list[dict[str, float]] = []
    level = asyncio.run(run())
    doc = level.to_dict()
    return {
        "decode": doc["decode_tok_s"]["median"],
        "agg": doc["output_tok_s"],
        "ttft": doc["ttft_s"]["median"],
        "cpu_1k": doc["client_cpu_s_per_1k_tokens"],
        "failed": doc["failed"],
        "server": server_truth(marks[0], marks[1], c),
    }


def with_openai(api: ApiEndpoint, spec: LoadSpec, c: int) -> dict[str, Any] | None:
    try:
        from openai import AsyncOpenAI
    except ImportError:
        return None

    async def run() -> dict[str, Any]:
        client = AsyncOpenAI(
            base_url=api.base_url + "/v1",
            api_key="unused",
            max_retries=0,
            timeout=spec.request_timeout_s,
        )
        serial = 0

        async def one(t_level: float) -> RequestRecord:
            nonlocal serial
            serial += 1
            body = request_body(api.model, spec, serial)
            extra = {"ignore_eos": True}
            t0 = time.perf_counter()
            rec = RequestRecord(start=t0 - t_level)
            stream = await client.chat.completions.create(
                model=api.model,
                messages=body["messages"],
                max_tokens=spec.output_tokens,
                max_completion_tokens=spec.output_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=extra,
            )
            async for chunk in stream:
                t = time.perf_counter() - t0
                if chunk.usage is not None:
                    rec.output_tokens = chunk.usage.completion_tokens
                for choice in chunk.choices:
                    d = choice.delta
                    extra_fields = d.model_extra or {}
                    if d.content or extra_fields.get("reasoning") or d.tool_calls:
                        rec.on_chunk(
                            t, {"choices": [{"delta": {"content": d.content, "reasoning": "x"}}]}
                        )
            rec.e2e = time.perf_counter() - t0
            return rec

        await one(time.perf_counter())  # warm-up
        before = server_counters(api.base_url)
        total = spec.requests_at(c)
        records: list[RequestRecord] = []
        started = 0
        t_level = time.perf_counter()
        cpu0 = time.process_time()

        async def worker() -> None:
            nonlocal started
            while started < total:
                started += 1
                records.append(await one(t_level))

        await asyncio.gather(*(worker() for _ in range(c)))
        cpu = time.process_time() - cpu0
        wall = max(r.start + (r.e2e or 0) for r in records)
        truth = server_truth(before, server_counters(api.base_url), c)
        await client.close()
        doc = LevelResult(c, records, wall, cpu).to_dict()
        return {
            "decode": doc["decode_tok_s"]["median"],
            "agg": doc["output_tok_s"],
            "ttft": doc["ttft_s"]["median"],
            "cpu_1k": doc["client_cpu_s_per_1k_tokens"],
            "failed": doc["failed"],
            "server": truth,
        }

    return asyncio.run(run())


def guidellm(
    binary: str, url: str, spec: LoadSpec, c: int, tmp: Path, baseline: float
) -> dict[str, Any] | None:
    data = tmp / "gl-data.jsonl"
    with data.open("w") as fh:
        for i in range(max(256, spec.requests_at(c) * 2)):
            prompt = request_body("qwen", spec, i)["messages"][0]["content"]
            fh.write(
                json.dumps({"prompt": prompt, "output_tokens_count": spec.output_tokens}) + "\n"
            )
    out = tmp / f"gl-{c}.json"
    before = server_counters(url)
    cpu, ok = _guidellm_run(binary, url, data, out, c, spec.requests_at(c))
    truth = server_truth(before, server_counters(url), c)
    if not ok:
        return None
    bench = json.loads(out.read_text())["benchmarks"][0]
    m = bench["metrics"]
    tokens = m["output_token_count"]["successful"]["total_sum"]
    itl_ms = m["inter_token_latency_ms"]["successful"]["median"]
    return {
        "decode": 1000.0 / itl_ms if itl_ms else None,
        "agg": tokens / bench["duration"] if bench["duration"] else None,
        "ttft": m["time_to_first_token_ms"]["successful"]["median"] / 1000.0,
        "cpu_1k": round(1000 * max(cpu - baseline, 0.0) / tokens, 5) if tokens else None,
        "failed": m["request_totals"]["errored"],
        "server": truth,
    }


def _guidellm_run(
    binary: str, url: str, data: Path, out: Path, c: int, requests: int
) -> tuple[float, bool]:
    argv = [
        binary,
        "run",
        "--backend",
        f"kind=openai_http,target={url},model=qwen",
        "--profile",
        f"kind=concurrent,streams={c}",
        "--constraint",
        f"kind=max_requests,count={requests}",
        "--data",
        f"kind=json_file,path={data}",
        "--output",
        f"kind=json,path={out}",
        "--disable-console",
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        print(f"guidellm failed ({proc.returncode}): {proc.stderr[-800:]}", file=sys.stderr)
    return cpu, proc.returncode == 0


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=20.0, help="true per-stream decode tok/s")
    ap.add_argument("--ttft", type=float, default=0.2, help="true TTFT, seconds")
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--concurrency", default="1,4,16,64")
    ap.add_argument("--requests-per-stream", type=int, default=2)
    ap.add_argument(
        "--guidellm",
        default="/tmp/gl-venv/bin/guidellm",
        help="GuideLLM executable (skipped when missing)",
    )
    ap.add_argument("--no-openai", action="store_true")
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    spec = LoadSpec(
        concurrency=tuple(levels),
        prompt_tokens=128,
        output_tokens=args.output_tokens,
        requests_per_stream=args.requests_per_stream,
        min_requests=4,
        warmup_requests=1,
        level_budget_s=600,
        request_timeout_s=600,
        idle_timeout_s=60,
    )
    n, r, t0 = args.output_tokens, args.rate, args.ttft
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        proc, url = start_emulator(r, t0, tmp / "emulator.log")
        api = ApiEndpoint(url, "qwen")
        gl = args.guidellm if Path(args.guidellm).exists() else None
        baseline = 0.0
        if gl:
            data = tmp / "base.jsonl"
            data.write_text(json.dumps({"prompt": "hi", "output_tokens_count": 1}) + "\n")
            baseline, _ = _guidellm_run(gl, url, data, tmp / "base.json", 1, 1)
        print(
            f"true: decode {r:g} tok/s per stream, TTFT {t0:g} s, {n} output tokens, "
            f"aggregate uncapped; emulator at {url}"
        )
        if gl:
            print(f"GuideLLM: {gl} (start-up CPU {baseline:.2f} s subtracted)")
        else:
            print("GuideLLM: not installed (see the module docstring), column left out")
        head = (
            f"{'c':>3} {'client':<9} {'decode':>7} {'ratio':>6} {'agg tok/s':>9} "
            f"{'server':>7} {'ratio':>6} {'ideal':>7} {'ratio':>6} {'TTFT':>6} "
            f"{'srv TTFT':>8} {'CPU s/1k tok':>12} {'fail':>4}"
        )
        print(head)
        print("-" * len(head))
        try:
            for c in levels:
                true_agg = c * n / (t0 + (n - 1) / r)
                rows: list[tuple[str, dict[str, Any] | None]] = [("httpx", ours(api, spec, c))]
                if not args.no_openai:
                    rows.append(("openai", with_openai(api, spec, c)))
                if gl:
                    rows.append(("guidellm", guidellm(gl, url, spec, c, tmp, baseline)))
                for name, res in rows:
                    if res is None:
                        print(f"{c:>3} {name:<9} (not available)")
                        continue
                    dr = res["decode"] / r if res["decode"] else None
                    ar = res["agg"] / true_agg if res["agg"] else None
                    srv = res["server"]
                    sr = res["agg"] / srv["agg"] if res["agg"] and srv["agg"] else None
                    print(
                        f"{c:>3} {name:<9} {fmt(res['decode']):>7} {fmt(dr, '.3f'):>6} "
                        f"{fmt(res['agg']):>9} {srv['agg']:>7.1f} {fmt(sr, '.3f'):>6} "
                        f"{true_agg:>7.1f} {fmt(ar, '.3f'):>6} {fmt(res['ttft'], '.3f'):>6} "
                        f"{srv['ttft']:>8.3f} {fmt(res['cpu_1k'], '.4f'):>12} "
                        f"{res['failed']:>4}"
                    )
        finally:
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
