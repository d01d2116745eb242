#!/usr/bin/env python3
"""Accuracy of the vLLM emulator's token pacing: the mean per-stream decode rate against
its setting at 1, 8 and 32 concurrent streams (the step model's batch growth off), and the
per-stream share under an aggregate cap, printed side by side as ratios (goal: within 5 %,
10 % capped); then the decode step model's curve at its defaults: the aggregate decode
tok/s (the sum of the streams' rates) at 1, 4 and 16 streams against the model's own
figure, and the 4-stream to 1-stream ratio beside the published one (Qwen3.5-122B-A10B-FP8
TP=2 on two Sparks, 31.5 -> 59.7 tok/s: the bjk110 vllm-spark README, REFERENCE.md; goal:
within 15 %), all from one run.

These are wall-clock figures, so they belong to an idle machine: the self-test
(tests/emulator/test_emu_pacing.py) holds only what load cannot fake (never faster than
the rate, the median gap). The machine's busy CPU share during the run is printed, to
tell a slow pacer from a busy machine.

    .venv/bin/python benchmarks/emu_pacing.py [--rate 40] [--tokens 81]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import free_port, machine_cpu_s

REPO = Path(__file__).resolve().parents[1]
SIM_DIR = REPO / "sparksim"
sys.path.insert(0, str(REPO))

from sparksim.emulator.config import Knobs  # noqa: E402
from sparksim.emulator.generation import StepModel  # noqa: E402

PUBLISHED_1, PUBLISHED_4 = 31.5, 59.7  # tok/s, bjk110 vllm-spark README (REFERENCE.md)


def one_stream(port: int, tokens: int, out: list[float]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = {
        "model": "qwen",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    conn.request("POST", "/v1/chat/completions", json.dumps(body))
    resp = conn.getresponse()
    stamps = []
    for line in resp:
        if line.startswith(b"data: [DONE]"):
            break
        if b'"delta":{"content":"' in line and b'"content":""' not in line:
            stamps.append(time.monotonic())
    conn.close()
    out.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))


def measure(port: int, streams: int, tokens: int) -> list[float]:
    rates: list[float] = []
    threads = [
        threading.Thread(target=one_stream, args=(port, tokens, rates)) for _ in range(streams)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return rates


def curve(port: int, control: Path, rate: float, tokens: int) -> None:
    """The step model at its defaults: aggregate decode tok/s by streams, measured beside
    the model's figure, and the 4/1 ratio beside the published one."""
    control.write_text(json.dumps({"faults": []}))
    time.sleep(0.5)
    k = Knobs()
    model = StepModel(rate, k.step_expert_share, k.step_expert_pick, k.step_kv_s_per_token)
    print(f"\n{'step model (defaults)':<28}{'model':>9}{'measured':>9}{'meas/model':>12}")
    agg: dict[int, float] = {}
    for streams in (1, 4, 16):
        agg[streams] = sum(measure(port, streams, tokens))
        want = model.aggregate_tok_s(streams, 30 + tokens // 2)  # "hi" + template, mid-way
        row = f"{streams} streams, aggregate"
        print(f"{row:<28}{want:9.2f}{agg[streams]:9.2f}{agg[streams] / want:12.3f}")
    sim, published = agg[4] / agg[1], PUBLISHED_4 / PUBLISHED_1
    print(
        f"4/1-stream ratio: sim {sim:.2f}x, published {published:.2f}x "
        f"({PUBLISHED_1:g} -> {PUBLISHED_4:g} tok/s), sim/published {sim / published:.3f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--tokens", type=int, default=81)
    opts = parser.parse_args()
    port, control = free_port(), Path(f"/tmp/emu-pacing-{os.getpid()}.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKSIM_EMU_")}
    env.update(
        PYTHONPATH=str(SIM_DIR),
        SPARKSIM_EMU_TIME_SCALE="0.0005",
        SPARKSIM_EMU_DECODE_TOK_S=str(opts.rate),
        SPARKSIM_EMU_TTFT_S="0.1",
        SPARKSIM_EMU_PREFILL_TOK_S="0",
        SPARKSIM_EMU_CONTROL=str(control),
        SPARKSIM_EMU_CONTROL_POLL_S="0.05",
    )
    argv = [sys.executable, "-m", "emulator", "serve", "/models/qwen", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--served-model-name", "qwen", "--max-model-len", "4096"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        print(f"{'case':<28}{'target':>9}{'mean':>9}{'min':>9}{'max':>9}{'mean/target':>13}")
        cpu0, t0 = machine_cpu_s(), time.monotonic()
        control.write_text(json.dumps({"faults": [], "step_expert_share": 0}))
        time.sleep(0.5)  # a benchmark: the emulator re-reads its control file every 0.05 s
        for streams in (1, 8, 32):
            rates = measure(port, streams, opts.tokens)
            mean = sum(rates) / len(rates)
            row = f"{streams} streams"
            print(
                f"{row:<28}{opts.rate:9.2f}{mean:9.2f}{min(rates):9.2f}{max(rates):9.2f}"
                f"{mean / opts.rate:13.3f}"
            )
        cap = 4 * opts.rate
        control.write_text(json.dumps({"faults": [], "max_agg_tok_s": cap, "step_expert_share": 0}))
        time.sleep(0.5)  # a benchmark: the emulator re-reads its control file every 0.05 s
        rates = measure(port, 8, opts.tokens // 2 + 1)
        mean, target = sum(rates) / len(rates), cap / 8
        row = f"8 streams, cap {cap:g} tok/s"
        print(
            f"{row:<28}{target:9.2f}{mean:9.2f}{min(rates):9.2f}{max(rates):9.2f}"
            f"{mean / target:13.3f}"
        )
        curve(port, control, opts.rate, opts.tokens)
        busy = (machine_cpu_s() - cpu0) / (time.monotonic() - t0) / (os.cpu_count() or 1)
        print(f"machine busy {100 * busy:.0f} % of {os.cpu_count()} cores during the run")
    finally:
        proc.terminate()
        proc.wait(10)
        control.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
