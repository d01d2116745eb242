#!/usr/bin/env python3
"""What the accuracy category costs: seconds and generated tokens, part by part.

Issue #24 budgets the quick accuracy checks (the canaries alone, the canaries under load,
the fingerprint) at 60 s or less on a Spark: about 1,800 generated tokens at one stream at
31.5 tok/s. The unit of that budget is tokens, so this prints, for each part, the
completion tokens it generated and the seconds it took, side by side in one run at two
paces of the vLLM emulator (the same one sparksim serves, on 127.0.0.1):

- ``spark``: the emulator's decode model at a Spark's published single stream (31.5 tok/s,
  the 122B's batch curve);
- ``sim``: sparksim's default pace (``scripts/run-sim``: 40 tok/s).

and each one's share of the budget (tokens / budget_tokens, seconds / 60). The suite's own
probe (pytest_spark.serving.validate.accuracyprobe) sends the requests, exactly as the checks do.

    .venv/bin/python benchmarks/accuracy_cost.py [--math] [--profile dgx-spark-2node]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from common import free_port

from pytest_spark.access.api import ApiEndpoint
from pytest_spark.serving.validate.accuracyprobe import AccuracyProbe
from pytest_spark.settings.profiles import load_profile

REPO = Path(__file__).resolve().parents[1]
PACES = {"spark": "31.5", "sim": "40"}
BUDGET_S = 60.0


def start(decode: str) -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSIM_EMU_")}
    env.update(
        PYTHONPATH=str(REPO / "sparksim"),
        PYTHONUNBUFFERED="1",
        SPARKSIM_EMU_TIME_SCALE="0.001",  # the load phases: instant
        SPARKSIM_EMU_DECODE_TOK_S=decode,
    )
    argv = [sys.executable, "-m", "emulator", "serve", "/models/test-model"]  # small: no TP peer
    argv += ["--served-model-name", "qwen", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--reasoning-parser", "qwen3", "--max-model-len", "32768"]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    for line in proc.stdout:
        if "Application startup complete" in line:
            return proc, port
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError("the emulator did not start")


def measure(pace: str, profile: str, math: bool) -> list[tuple[str, int, float]]:
    proc, port = start(PACES[pace])
    try:
        api = ApiEndpoint(f"http://127.0.0.1:{port}", "qwen", timeout=60.0)
        probe = AccuracyProbe(api, load_profile(profile).accuracy)
        rows = []
        parts = [
            ("canaries alone", probe.alone),
            (f"under load ({probe.concurrency} in flight)", probe.under_load),
            ("fingerprint", probe.fingerprint),
        ]
        if math:
            parts.append(("math set", probe.math))
        for name, run in parts:
            before, t0 = probe.tokens, time.perf_counter()
            run()
            rows.append((name, probe.tokens - before, time.perf_counter() - t0))
        assert probe.error is None, probe.error
        return rows
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="dgx-spark-2node")
    ap.add_argument("--math", action="store_true", help="also the math set (opt-in in the suite)")
    args = ap.parse_args()
    budget = load_profile(args.profile).accuracy.budget_tokens
    results = {pace: measure(pace, args.profile, args.math) for pace in PACES}
    print(f"profile {args.profile}: budget {budget} tokens, {BUDGET_S:g} s on a Spark")
    print(f"{'part':34} {'tokens':>7} " + " ".join(f"{p + ' s':>9}" for p in PACES))
    for i, (name, tokens, _) in enumerate(results["spark"]):
        secs = " ".join(f"{results[p][i][2]:9.2f}" for p in PACES)
        print(f"{name:34} {tokens:7d} {secs}")
    quick = [r for r in results["spark"] if r[0] != "math set"]
    tokens = sum(r[1] for r in quick)
    print(
        f"{'quick checks (default)':34} {tokens:7d} "
        + " ".join(f"{sum(r[2] for r in results[p] if r[0] != 'math set'):9.2f}" for p in PACES)
    )
    spark_s = sum(r[2] for r in quick)
    share = f"tokens {tokens / budget:.2f}, seconds at Spark pace {spark_s / BUDGET_S:.2f}"
    print(f"share of the budget: {share}")


if __name__ == "__main__":
    main()
