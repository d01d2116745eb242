#!/usr/bin/env python3
"""Accuracy of the vLLM emulator's token pacing: the mean per-stream decode rate against
its setting at 1, 8 and 32 concurrent streams, and the per-stream share under an
aggregate cap, printed side by side as ratios (goal: within 5 %, 10 % capped).

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
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIM_DIR = REPO / "sparksim"


def machine_cpu_s() -> float:
    """CPU seconds every core of this machine has spent busy so far (/proc/stat)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        for streams in (1, 8, 32):
            rates = measure(port, streams, opts.tokens)
            mean = sum(rates) / len(rates)
            row = f"{streams} streams"
            print(
                f"{row:<28}{opts.rate:9.2f}{mean:9.2f}{min(rates):9.2f}{max(rates):9.2f}"
                f"{mean / opts.rate:13.3f}"
            )
        cap = 4 * opts.rate
        control.write_text(json.dumps({"faults": [], "max_agg_tok_s": cap}))
        time.sleep(0.5)  # a benchmark: the emulator re-reads its control file every 0.05 s
        rates = measure(port, 8, opts.tokens // 2 + 1)
        mean, target = sum(rates) / len(rates), cap / 8
        row = f"8 streams, cap {cap:g} tok/s"
        print(
            f"{row:<28}{target:9.2f}{mean:9.2f}{min(rates):9.2f}{max(rates):9.2f}"
            f"{mean / target:13.3f}"
        )
        busy = (machine_cpu_s() - cpu0) / (time.monotonic() - t0) / (os.cpu_count() or 1)
        print(f"machine busy {100 * busy:.0f} % of {os.cpu_count()} cores during the run")
    finally:
        proc.terminate()
        proc.wait(10)
        control.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
