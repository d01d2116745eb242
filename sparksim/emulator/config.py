"""Command line (the flags a real ``vllm serve`` gets) and emulator knobs (environment).

The command line stays vLLM's so one launcher line serves both; every emulator-only
setting is an ``SPARKSIM_EMU_*`` environment variable read once into ``Knobs``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from . import DEFAULT_VERSION

ENV_PREFIX = "SPARKSIM_EMU_"


def version_tuple(version: str) -> tuple[int, ...]:
    """``"0.11.1"`` -> ``(0, 11, 1)``; non-numeric suffixes are ignored."""
    parts = []
    for piece in version.split(".")[:3]:
        digits = re.match(r"\d+", piece)
        parts.append(int(digits.group(0)) if digits else 0)
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts)


def reasoning_fields(version: str) -> tuple[str, ...]:
    """Names vLLM gives the reasoning text: <=0.11.0 ``reasoning_content``,
    0.11.1-0.15 both, >=0.16 ``reasoning``."""
    v = version_tuple(version)
    if v <= (0, 11, 0):
        return ("reasoning_content",)
    if v < (0, 16, 0):
        return ("reasoning", "reasoning_content")
    return ("reasoning",)


def _parse_len(text: str) -> int:
    """vLLM accepts human-readable lengths: ``32768``, ``32k``, ``32K`` (x1024), ``1m``."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid length {text!r}")
    number = float(m.group(1))
    unit = m.group(2)
    scale = {"": 1, "k": 1000, "K": 1024, "m": 10**6, "M": 1024**2, "g": 10**9, "G": 1024**3}
    return int(number * scale[unit])


def _spec_config(text: str) -> dict[str, Any]:
    """``--speculative-config``'s JSON (vLLM: method, num_speculative_tokens, model, ...)."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"--speculative-config must be a JSON object: {text}")
    return value


def _bool_flag(parser: argparse.ArgumentParser, *names: str) -> None:
    parser.add_argument(*names, action=argparse.BooleanOptionalAction, default=None)


def build_serve_parser() -> argparse.ArgumentParser:
    """The subset of ``vllm serve`` flags the emulator understands; others are ignored."""
    p = argparse.ArgumentParser(prog="vllm serve", add_help=True)
    p.add_argument("model_tag", nargs="?", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", action="append", default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-model-len", type=_parse_len, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--quantization", "-q", default=None)
    p.add_argument("--distributed-executor-backend", default=None)
    # Multi-node without Ray: one `vllm serve` per node, rank 0 serves, the others headless.
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--headless", action="store_true", default=False)
    p.add_argument("--reasoning-parser", default=None)
    p.add_argument("--tool-call-parser", default=None)
    p.add_argument("--enable-auto-tool-choice", action="store_true", default=False)
    p.add_argument("--enable-request-id-headers", action="store_true", default=False)
    p.add_argument("--disable-uvicorn-access-log", action="store_true", default=False)
    p.add_argument("--disable-log-stats", action="store_true", default=False)
    p.add_argument("--default-chat-template-kwargs", type=json.loads, default=None)
    p.add_argument("--chat-template", default=None)
    p.add_argument("--speculative-config", "-sc", type=_spec_config, default=None)
    p.add_argument("--uvicorn-log-level", default="info")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--swap-space", type=float, default=None)
    p.add_argument("--block-size", type=int, default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--download-dir", default=None)
    _bool_flag(p, "--trust-remote-code")
    _bool_flag(p, "--enforce-eager")
    _bool_flag(p, "--enable-prefix-caching")
    _bool_flag(p, "--enable-chunked-prefill")
    return p


# Order in which vLLM prints its non-default args (frontend first, then engine args).
_NON_DEFAULT_ORDER = (
    "model_tag",
    "enable_auto_tool_choice",
    "tool_call_parser",
    "host",
    "port",
    "uvicorn_log_level",
    "disable_uvicorn_access_log",
    "api_key",
    "chat_template",
    "enable_request_id_headers",
    "default_chat_template_kwargs",
    "model",
    "dtype",
    "seed",
    "trust_remote_code",
    "download_dir",
    "load_format",
    "max_model_len",
    "quantization",
    "enforce_eager",
    "served_model_name",
    "reasoning_parser",
    "speculative_config",
    "distributed_executor_backend",
    "pipeline_parallel_size",
    "tensor_parallel_size",
    "data_parallel_size",
    "nnodes",
    "node_rank",
    "master_addr",
    "master_port",
    "headless",
    "block_size",
    "gpu_memory_utilization",
    "swap_space",
    "kv_cache_dtype",
    "enable_prefix_caching",
    "max_num_batched_tokens",
    "max_num_seqs",
    "enable_chunked_prefill",
    "disable_log_stats",
)


@dataclass
class ServeArgs:
    """Parsed ``vllm serve`` arguments plus what the emulator derives from them."""

    model: str
    served_names: list[str]
    host: str
    port: int
    api_keys: list[str]
    tp: int
    pp: int
    gpu_mem_util: float
    max_model_len: int
    max_num_seqs: int
    reasoning_parser: str | None
    tool_call_parser: str | None
    auto_tool_choice: bool
    executor_backend: str
    request_id_headers: bool
    access_log: bool
    default_chat_kwargs: dict[str, Any]
    non_default: dict[str, Any]
    unknown: list[str] = field(default_factory=list)
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29501
    headless: bool = False
    speculative: dict[str, Any] | None = None  # --speculative-config

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def uses_ray(self) -> bool:
        return self.executor_backend == "ray"

    @property
    def multi_node(self) -> bool:
        """Ranks spread over ``--nnodes`` processes that rendezvous (no Ray)."""
        return self.nnodes > 1 and not self.uses_ray

    @property
    def remote_ranks(self) -> int:
        """Ranks on the other nodes that join the head: one per other ``--nnodes`` process
        without Ray; with Ray one per GPU of the group beyond the head's (one GPU a Spark)."""
        return self.nnodes - 1 if self.multi_node else self.world_size - 1

    def parallel_ranks(self, rank: int) -> tuple[int, int]:
        """(PP rank, TP rank) of a global rank: vLLM lays the TP groups out inside each
        pipeline stage (rank = PP rank x TP size + TP rank)."""
        return rank // self.tp, rank % self.tp

    @property
    def local_ranks(self) -> range:
        """The TP/PP ranks this process runs: all of them, or its node's share."""
        if not self.multi_node:
            return range(self.world_size)
        per = max(1, self.world_size // self.nnodes)
        return range(self.node_rank * per, min(self.world_size, (self.node_rank + 1) * per))


def parse_serve_args(argv: list[str], environ: dict[str, str] | None = None) -> ServeArgs:
    env = os.environ if environ is None else environ
    parser = build_serve_parser()
    ns, unknown = parser.parse_known_args(argv)
    model = ns.model or ns.model_tag
    if not model:
        parser.error("the following arguments are required: model_tag")
    defaults = vars(parser.parse_args([]))
    values = vars(ns)
    if ns.model is None:
        values["model"] = model
    non_default: dict[str, Any] = {}
    for key in _NON_DEFAULT_ORDER:
        if key == "model" or values.get(key) != defaults.get(key):
            value = values.get(key)
            non_default[key] = "**REDACTED**" if key == "api_key" else value
    api_keys = list(ns.api_key or [])
    if not api_keys and env.get("VLLM_API_KEY"):
        api_keys = [env["VLLM_API_KEY"]]
    world = max(1, ns.tensor_parallel_size) * max(1, ns.pipeline_parallel_size)
    backend = ns.distributed_executor_backend or ("mp" if world > 1 else "uni")
    return ServeArgs(
        model=model,
        served_names=list(ns.served_model_name or [model]),
        # vLLM binds every interface when --host is omitted; the emulator must listen only
        # on addresses it is given, so it falls back to loopback instead.
        host=ns.host if ns.host is not None else "127.0.0.1",
        port=ns.port,
        api_keys=api_keys,
        tp=max(1, ns.tensor_parallel_size),
        pp=max(1, ns.pipeline_parallel_size),
        gpu_mem_util=ns.gpu_memory_utilization,
        max_model_len=ns.max_model_len or 40960,
        max_num_seqs=ns.max_num_seqs or 256,
        reasoning_parser=ns.reasoning_parser,
        tool_call_parser=ns.tool_call_parser,
        auto_tool_choice=bool(ns.enable_auto_tool_choice),
        executor_backend=backend,
        request_id_headers=bool(ns.enable_request_id_headers),
        access_log=not ns.disable_uvicorn_access_log,
        default_chat_kwargs=dict(ns.default_chat_template_kwargs or {}),
        non_default=non_default,
        unknown=unknown,
        nnodes=max(1, ns.nnodes),
        node_rank=max(0, ns.node_rank),
        master_addr=ns.master_addr,
        master_port=ns.master_port,
        headless=bool(ns.headless),
        speculative=ns.speculative_config,
    )


def _env_float(env: dict[str, str], name: str, default: float) -> float:
    raw = env.get(ENV_PREFIX + name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(
            f"Invalid value {raw!r} for {ENV_PREFIX}{name}: expected a number"
        ) from None


def _env_str(env: dict[str, str], name: str, default: str) -> str:
    raw = env.get(ENV_PREFIX + name)
    return default if raw is None or raw.strip() == "" else raw.strip()


@dataclass
class Knobs:
    """Emulator-only settings (``SPARKSIM_EMU_<NAME>``); defaults model the real 122B TP=2."""

    version: str = DEFAULT_VERSION
    time_scale: float = 1.0  # multiplies every startup phase
    api_seconds: float = 6.0  # API server start before the engine
    engine_seconds: float = 8.0  # engine core + distributed init
    shards: int = 39
    shard_seconds: float = 18.0
    compile_seconds: float = 40.0  # torch.compile + profiling run
    graph_seconds: float = 8.0  # CUDA graph capture
    model_gib: float = 0.0  # whole checkpoint, split across TP ranks; 0: from the model name
    gpu_total_gib: float = 119.7
    free_mem_gib: float = 58.2  # what crash-free-memory reports as free
    decode_tok_s: float = 40.0  # 1 stream; batches follow generation.StepModel
    step_expert_share: float = 0.39  # of the 1-stream step: routed experts (0 = linear)
    step_expert_pick: float = 0.03125  # routed experts per token / per layer: 8 / 256
    step_kv_s_per_token: float = 4.5e-8  # KV read per context token per step
    max_agg_tok_s: float = 0.0  # 0 = no aggregate cap
    ttft_s: float = 0.3
    prefill_tok_s: float = 4000.0
    reasoning_tokens: int = 48
    answer_tokens: int = 0  # 0 = natural length of the canned answer
    think_newlines: str = "keep"  # "keep" (vLLM source) or "strip" "\n\n" after </think>
    fault: str = ""  # SPARKSIM_EMU_FAULT: comma-separated fault names
    control: str = ""
    control_poll_s: float = 0.2
    stats_interval_s: float = 10.0
    tp_peer_port: int = 0
    tp_peer_host: str = ""
    heartbeat_s: float = 0.5
    heartbeat_timeout_s: float = 10.0
    pg_wait_s: float = 10.0
    pg_backoff: float = 2.0
    pg_timeout_s: float = 1800.0
    rendezvous_timeout_s: float = 600.0  # torch.distributed's store timeout (no Ray)
    ray_status_file: str = ""
    head_ip: str = ""
    worker_ip: str = "198.19.0.2"
    engine_prefix: str = ""  # override "(EngineCore pid=N)" / "(EngineCore_DP0 pid=N)"
    exit_on_death_s: float = -1.0  # <0: keep serving 503 after engine death

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Knobs:
        env = dict(os.environ if environ is None else environ)
        k = cls()
        for name, default in vars(cls()).items():
            env_name = name.upper()
            if isinstance(default, bool):
                continue
            if isinstance(default, int):
                setattr(k, name, int(_env_float(env, env_name, default)))
            elif isinstance(default, float):
                setattr(k, name, _env_float(env, env_name, default))
            else:
                setattr(k, name, _env_str(env, env_name, default))
        if not k.head_ip:
            k.head_ip = env.get("VLLM_HOST_IP", "") or "198.19.0.1"
        return k


def checkpoint_gib(model: str, default: float = 8.0) -> float:
    """Size of a checkpoint guessed from its name: ``Qwen3.5-122B-A10B-FP8`` -> ~111 GiB."""
    m = re.search(r"(\d+(?:\.\d+)?)[bB](?![a-zA-Z])", model.replace("_", "-"))
    if not m:
        return default
    params = float(m.group(1))
    name = model.lower()
    per_param = (
        0.5 if ("fp4" in name or "int4" in name or "awq" in name) else 1.0 if "fp8" in name else 2.0
    )
    return round(params * per_param * 1e9 / 2**30, 2)
