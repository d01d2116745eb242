#!/usr/bin/env python3
"""Speculative decoding in the vLLM emulator, on the wall clock: one stream's decode of
``--tokens`` tokens served plain, drafting (MTP, k=3) and drafting under the spec-collapse
fault, each by an emulator of its own, printed as seconds and as ratios to the plain run
beside the pacer's own figure for the same run (its clock, no wall time: the unit test
tests/emulator/test_emu_specdecode.py holds those: drafting < 0.7x, collapsed > 1.1x).

A wall-clock figure belongs to an idle machine (a loaded one stretches every run, the
plain one too, and the ratios with them): the machine's busy CPU share during the runs is
printed to tell the two apart.

    .venv/bin/python benchmarks/emu_specdecode.py [--rate 100] [--tokens 120] [--repeat 3]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import free_port, machine_cpu_s

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "emulator"))

from sparksim.emulator.specdecode import SpecModel  # noqa: E402

CONFIG = {"method": "mtp", "num_speculative_tokens": 3}


def start(rate: float, spec: bool, fault: str | None) -> tuple[subprocess.Popen[bytes], int]:
    from conftest import base_env  # the emulator tests' fast load (time scale, shards)

    port = free_port()
    env = base_env({"SPARKSIM_EMU_DECODE_TOK_S": str(rate)})
    if fault:
        env["SPARKSIM_EMU_FAULT"] = fault
    argv = [sys.executable, "-m", "emulator", "serve", "/models/m", "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--served-model-name", "m"]
    if spec:
        argv += ["--speculative-config", json.dumps(CONFIG)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc, port
        except OSError:
            time.sleep(0.2)
    proc.terminate()
    raise SystemExit(f"the emulator on port {port} did not answer /health in 60 s")


def decode_s(port: int, tokens: int) -> float:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Count words for me."}],
        "max_tokens": tokens,
        "ignore_eos": True,
    }
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body))
    answer = json.loads(conn.getresponse().read())
    took = time.perf_counter() - t0
    assert answer["usage"]["completion_tokens"] == tokens, answer
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--tokens", type=int, default=120)
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    from test_emu_specdecode import paced_decode_s  # the unit test's pacer-clock figure

    cases = {
        "plain": (False, None, None),
        "drafting": (True, None, SpecModel.of(CONFIG, False)),
        "spec-collapse": (True, "spec-collapse", SpecModel.of(CONFIG, True)),
    }
    cpu0, t0 = machine_cpu_s(), time.monotonic()
    measured: dict[str, float] = {}
    for name, (spec, fault, _) in cases.items():
        proc, port = start(opts.rate, spec, fault)
        try:
            measured[name] = min(decode_s(port, opts.tokens) for _ in range(opts.repeat))
        finally:
            proc.terminate()
            proc.wait(10)
    busy = (machine_cpu_s() - cpu0) / (time.monotonic() - t0) / (os.cpu_count() or 1)
    paced = {n: paced_decode_s(m, opts.tokens, opts.rate) for n, (_, _, m) in cases.items()}
    print(f"{opts.tokens} tokens at {opts.rate:g} tok/s, best of {opts.repeat}")
    print(f"{'case':<16}{'wall s':>9}{'/ plain':>9}{'pacer s':>9}{'/ plain':>9}")
    for name in cases:
        print(
            f"{name:<16}{measured[name]:9.3f}{measured[name] / measured['plain']:9.3f}"
            f"{paced[name]:9.3f}{paced[name] / paced['plain']:9.3f}"
        )
    print(f"machine busy {100 * busy:.0f} % of {os.cpu_count()} cores during the runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
