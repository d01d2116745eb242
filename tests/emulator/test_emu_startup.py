"""Startup: connection refused (never 503) while loading, the log lines vLLM prints in
order with their prefixes, version-dependent wording, port conflicts, SIGTERM."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from typing import Any

from conftest import Emu, base_env, emulator_cmd, free_port

PREFIX = (
    r"^\((APIServer|EngineCore(_DP0)?|RayWorkerWrapper|Worker(_TP\d)?) pid=\d+(, ip=[\d.]+)?\) "
    r"(INFO|WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] "
)

ORDER = [
    r"\[api_utils\.py:347\]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0\.32\.0",
    r"\[api_utils\.py:286\] non-default args: \{'model_tag': '/models/Qwen3\.5-122B-A10B-FP8'",
    r"Initializing a V1 LLM engine \(v0\.32\.0\)",
    r"^\(EngineCore_DP0 pid=\d+\) WARNING .*\[ray_utils\.py:557\] Tensor parallel size \(2\) "
    r"exceeds available GPUs \(1\)\. This may result in Ray placement group allocation "
    r"failures\.",
    r"Connecting to existing Ray cluster at address",
    r"Custom allreduce is disabled because this process group spans across nodes\.",
    r"Loading safetensors checkpoint shards:   0% Completed \| 0/4 \[00:00<\?, \?it/s\]",
    r"Loading safetensors checkpoint shards:  50% Completed \| 2/4 "
    r"\[\d\d:\d\d<\d\d:\d\d, +[\d.]+(s/it|it/s)\]",
    r"Loading safetensors checkpoint shards: 100% Completed \| 4/4",
    r"\[default_loader\.py:\d+\] Loading weights took [\d.]+ seconds",
    r"\[gpu_model_runner\.py:4879\] Model loading took 56\.81 GiB memory and [\d.]+ seconds",
    r"\[gpu_worker\.py:348\] Available KV cache memory: [\d.]+ GiB",
    r"GPU KV cache size: [\d,]+ tokens",
    r"Capturing CUDA graphs \(decode, FULL\): 100%\|##########\| 35/35 \[",
    r"\[gpu_model_runner\.py:3480\] Graph capturing finished in \d+ secs, took [\d.]+ GiB",
    r"\[entry\.py:140\] Starting vLLM server on http://127\.0\.0\.1:\d+$",
    r"^INFO:     Started server process \[\d+\]$",
    r"^INFO:     Application startup complete\.$",
]


def test_port_refused_while_loading_then_open(emu_factory: Any) -> None:
    emu = emu_factory(
        ["--served-model-name", "qwen"],
        {
            "SPARKSIM_EMU_TIME_SCALE": "1",
            "SPARKSIM_EMU_SHARD_SECONDS": "0.25",
            "SPARKSIM_EMU_API_SECONDS": "0.1",
            "SPARKSIM_EMU_ENGINE_SECONDS": "0.1",
            "SPARKSIM_EMU_COMPILE_SECONDS": "0.1",
            "SPARKSIM_EMU_GRAPH_SECONDS": "0.1",
        },
        wait=False,
    )
    emu.wait_for("Loading safetensors checkpoint shards:   0%")
    outcomes = []
    while True:
        done = any("Application startup complete." in line for line in emu.lines)
        try:
            socket.create_connection(("127.0.0.1", emu.port), timeout=1).close()
            outcomes.append("open")
        except ConnectionRefusedError:
            outcomes.append("refused")
        if done:
            break
        time.sleep(0.05)
    # Refused while loading, then open for good. The startup line is read from the
    # emulator's output by a thread, so the port may be seen open a poll or two before
    # the line is: the order, not the poll it changed at, is what is held.
    assert "open" in outcomes, outcomes
    first_open = outcomes.index("open")
    assert first_open > 5 and set(outcomes[:first_open]) == {"refused"}, outcomes
    assert set(outcomes[first_open:]) == {"open"}, outcomes
    assert emu.request("GET", "/health").status == 200


def test_log_lines_in_order_with_real_prefixes(emu_factory: Any) -> None:
    emu = emu_factory(
        [
            "--served-model-name",
            "qwen",
            "--tensor-parallel-size",
            "2",
            "--gpu-memory-utilization",
            "0.90",
            "--max-model-len",
            "32768",
            "--trust-remote-code",
            "--reasoning-parser",
            "qwen3",
            "--tool-call-parser",
            "qwen3_coder",
            "--enable-auto-tool-choice",
            "--distributed-executor-backend",
            "ray",
        ],
        model="/models/Qwen3.5-122B-A10B-FP8",
    )
    lines = emu.lines
    pos = -1
    for pattern in ORDER:
        pos = emu.wait_for(pattern, 1, pos + 1)
    text = emu.text()
    assert re.search(r"^\(EngineCore_DP0 pid=\d+\) INFO ", text, re.M)
    assert re.search(
        r"^\(RayWorkerWrapper pid=\d+, ip=198\.19\.0\.2\) INFO .*Loading weights took", text, re.M
    )
    assert re.search(
        r"^\(RayWorkerWrapper pid=\d+\) Loading safetensors checkpoint shards", text, re.M
    )
    assert '"auto" tool choice has been enabled.' in text
    assert "'tensor_parallel_size': 2" in text and "'trust_remote_code': True" in text
    for line in lines:
        if line.startswith("("):
            assert re.match(PREFIX, line) or re.match(r"^\(\w+ pid=\d+(, ip=[\d.]+)?\) ", line), (
                line
            )


LOCAL_GPUS = "exceeds available GPUs"
ALLREDUCE = "Custom allreduce is disabled because this process group spans across nodes."


def test_local_gpu_warning_only_on_the_ray_path_and_allreduce_only_multi_node(
    emu_factory: Any,
) -> None:
    """vLLM warns about the local GPU count in ray_utils (Ray only) and disables custom
    allreduce when the group spans nodes (any multi-node backend); one GPU prints neither."""
    single = emu_factory(["--served-model-name", "qwen"]).text()
    assert "Application startup complete." in single
    assert LOCAL_GPUS not in single and ALLREDUCE not in single
    mp = emu_factory(
        ["--served-model-name", "qwen", "--tensor-parallel-size", "2"],
        model="/models/Qwen3.5-122B-A10B-FP8",
    ).text()
    assert "Application startup complete." in mp
    assert LOCAL_GPUS not in mp and ALLREDUCE in mp
    old = emu_factory(
        [
            "--served-model-name",
            "qwen",
            "--tensor-parallel-size",
            "2",
            "--distributed-executor-backend",
            "ray",
        ],
        {"SPARKSIM_EMU_VERSION": "0.11.0"},
        model="/models/Qwen3.5-122B-A10B-FP8",
    ).text()
    assert re.search(
        r"WARNING .*\[ray_utils\.py:337\] Tensor parallel size \(2\) exceeds available GPUs "
        r"\(1\)\. .* ensure your Ray cluster has 2 GPUs available\.$",
        old,
        re.M,
    )


def test_single_gpu_prefixes_and_older_wording(emu_factory: Any) -> None:
    emu = emu_factory(["--served-model-name", "qwen"])
    assert re.search(
        r"^\(EngineCore pid=\d+\) INFO .*\[kv_cache_utils\.py:2327\] GPU KV cache size",
        emu.text(),
        re.M,
    )
    assert re.search(r"^Loading safetensors checkpoint shards: 100% Completed", emu.text(), re.M)
    old = emu_factory(["--served-model-name", "qwen"], {"SPARKSIM_EMU_VERSION": "0.11.0"})
    text = old.text()
    assert re.search(
        r"\[api_server\.py:1912\] Starting vLLM API server 0 on http://127\.0\.0\.1:\d+", text
    )
    assert re.search(
        r"^\(EngineCore_DP0 pid=\d+\) INFO .*\[kv_cache_utils\.py:1234\] "
        r"GPU KV cache size: [\d,]+ tokens$",
        text,
        re.M,
    )


def test_model_too_big_for_one_gpu_fails_like_vllm(emu_factory: Any) -> None:
    emu = emu_factory(
        ["--served-model-name", "qwen"], wait=False, model="/models/Qwen3.5-122B-A10B-FP8"
    )
    assert emu.wait_exit(10) == 1
    assert "No available memory for the cache blocks" in emu.text()


def test_port_in_use_and_sigterm() -> None:
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen(1)
        r = subprocess.run(
            emulator_cmd("serve", "/models/x", "--host", "127.0.0.1", "--port", str(port)),
            env=base_env(),
            capture_output=True,
            text=True,
            timeout=20,
        )
    assert r.returncode == 1 and "Address already in use" in r.stdout


def test_sigterm_shuts_down_cleanly(emu_factory: Any) -> None:
    emu: Emu = emu_factory(["--served-model-name", "qwen"])
    emu.proc.terminate()
    assert emu.wait_exit(10) == 0
    assert emu.lines[-2:] == [
        "INFO:     Shutting down",
        f"INFO:     Finished server process [{emu.proc.pid}]",
    ]
