"""The startup log of ``vllm serve``, phase by phase, with real durations (scaled by knobs).

API server banner and args -> engine core + Ray placement group (waits for the TP worker)
-> distributed init -> weight shards (tqdm) -> torch.compile/profiling -> KV cache ->
CUDA graphs -> routes -> ``Application startup complete.`` The port is bound at the
start (as vLLM does) but only listens once ready, so clients get connection refused.
Load-time faults crash, hang or slow this sequence.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from .config import version_tuple
from .engine import Engine
from .logs import bar_progress, frame, shard_progress
from .metrics_schema import cache_config_info

if TYPE_CHECKING:
    from .tp import PeerLink

LOGO = [
    "",
    "       █     █     █▄   ▄█",
    " ▄▄ ▄█ █     █     █ ▀▄▀ █  version {version}",
    "  █▄█▀ █     █     █     █  model   {model}",
    "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀",
    "",
]

ROUTES = [
    ("/openapi.json", "HEAD, GET"),
    ("/docs", "HEAD, GET"),
    ("/docs/oauth2-redirect", "HEAD, GET"),
    ("/redoc", "HEAD, GET"),
    ("/load", "GET"),
    ("/version", "GET"),
    ("/health", "GET"),
    ("/metrics", "GET"),
    ("/tokenize", "POST"),
    ("/detokenize", "POST"),
    ("/v1/models", "GET"),
    ("/ping", "GET"),
    ("/ping", "POST"),
    ("/invocations", "POST"),
    ("/v1/chat/completions", "POST"),
    ("/v1/responses", "POST"),
    ("/v1/completions", "POST"),
]

# Load faults that stretch every startup phase, the strongest first.
LOAD_PACE = (("crawl-load", 100.0), ("slow-load", 10.0))
ACTIVATION_GIB = 3.1
GRAPH_GIB = 0.95
TOKENS_PER_GIB = 47663


def architecture(model: str) -> str:
    name = model.lower()
    if "qwen3.5" in name or "qwen3_5" in name:
        return "Qwen3_5MoeForConditionalGeneration"
    if "qwen3" in name:
        return "Qwen3MoeForCausalLM" if "a3b" in name or "a22b" in name else "Qwen3ForCausalLM"
    if "qwen2" in name:
        return "Qwen2ForCausalLM"
    if "llama" in name or "smollm" in name:
        return "LlamaForCausalLM"
    return "Qwen3ForCausalLM"


class Startup:
    def __init__(self, engine: Engine, go_live: Callable[[], None]) -> None:
        self.e = engine
        self.go_live = go_live
        knobs = engine.knobs
        slowed = next((x for f, x in LOAD_PACE if engine.faults.active(f)), 1.0)
        self.scale = knobs.time_scale * slowed
        self.new_style = version_tuple(knobs.version) >= (0, 30, 0)
        self.t0 = time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds * self.scale))

    # --- helpers ----------------------------------------------------------------------------
    def api(self, where: str, msg: str, level: str = "INFO") -> None:
        if not self.e.args.headless:  # a headless rank runs no API server
            self.e.log.vllm(self.e.api_prefix, level, where, msg)

    def core(self, where: str, msg: str, level: str = "INFO") -> None:
        if not self.e.args.headless:  # nor an engine core: only its workers
            self.e.log.vllm(self.e.engine_prefix, level, where, msg)

    def ranks(self, where: str, msg: str, level: str = "INFO") -> None:
        for rank in self.e.args.local_ranks:
            self.e.log.vllm(self.e.worker_prefix(rank), level, where, msg.format(rank=rank))

    def progress(self, line: str) -> None:
        first = self.e.args.local_ranks[0]
        prefix = self.e.worker_prefix(first) + " " if self.e.args.world_size > 1 else ""
        self.e.log.raw(prefix + line)

    def hang(self) -> NoReturn:
        while True:
            time.sleep(3600)

    def crash(
        self, where: str, frames: list[str], final: str, pre: list[str] | None = None
    ) -> NoReturn:
        """EngineCore traceback, then the API server's RuntimeError, then exit 1."""
        for line in pre or []:
            self.e.log.raw(line)
        body = ["EngineCore failed to start.", "Traceback (most recent call last):"]
        body += [
            frame("v1/engine/core.py", 857, "run_engine_core"),
            "    engine_core = EngineCoreProc(*args, **kwargs)",
            frame("v1/engine/core.py", 637, "__init__"),
            "    super().__init__(vllm_config, executor_class, log_stats,",
        ]
        body += [*frames, final]
        self.e.log.error(self.e.engine_prefix, where, "\n".join(body))
        failed = "{'EngineCore_DP0': 1}" if self.e.args.world_size > 1 else "{}"
        api = self.e.api_prefix
        tb = [
            "Traceback (most recent call last):",
            '  File "/usr/local/bin/vllm", line 10, in <module>',
            "    sys.exit(main())",
            frame("entrypoints/cli/main.py", 73, "main"),
            "    args.dispatch_function(args)",
            frame("entrypoints/cli/serve.py", 60, "cmd"),
            "    uvloop.run(run_server(args))",
            frame("v1/engine/utils.py", 1066, "wait_for_engine_startup"),
            "    raise RuntimeError(",
            "RuntimeError: Engine core initialization failed. See root cause above. "
            f"Failed core proc(s): {failed}",
        ]
        self.e.log.raw("\n".join(f"{api} {line}" for line in tb))
        sys.stdout.flush()
        raise SystemExit(1)

    # --- phases -------------------------------------------------------------------------------
    def run(self) -> None:
        self.banner()
        self.sleep(self.e.knobs.api_seconds)
        self.engine_core()
        if self.e.args.multi_node:
            self.rendezvous()
        elif self.e.args.world_size > 1:
            self.placement_group()
        self.distributed()
        self.load_weights()
        self.profile_and_kv()
        self.graphs()
        if self.e.args.headless:
            self.e.ready = True  # the rank serves the head's engine, not HTTP
            return
        self.serve()

    def banner(self) -> None:
        e = self.e
        logo = "\n".join(LOGO).format(version=e.knobs.version, model=e.args.model)
        self.api("api_utils.py:347", logo)
        self.api("api_utils.py:286", f"non-default args: {e.args.non_default}")
        if e.args.unknown:
            self.api(
                "arg_utils.py:1",
                "emulator: ignoring vLLM argument(s) it does not model: "
                + " ".join(e.args.unknown),
                "WARNING",
            )
        self.api("model.py:733", f"Resolved architecture: {architecture(e.args.model)}")
        self.api("model.py:2152", f"Using max model len {e.args.max_model_len}")
        self.api(
            "scheduler.py:262",
            "Chunked prefill is enabled with max_num_batched_tokens=2048.",
        )

    def engine_core(self) -> None:
        a = self.e.args
        self.core(
            "core.py:133",
            f"Initializing a V1 LLM engine (v{self.e.knobs.version}) with config: "
            f"model='{a.model}', "
            f"speculative_config=None, tokenizer='{a.model}', skip_tokenizer_init=False, "
            "tokenizer_mode=auto, revision=None, tokenizer_revision=None, "
            f"trust_remote_code={bool(a.non_default.get('trust_remote_code'))}, "
            f"dtype=torch.bfloat16, max_seq_len={a.max_model_len}, download_dir=None, "
            f"load_format=auto, tensor_parallel_size={a.tp}, pipeline_parallel_size={a.pp}, "
            "data_parallel_size=1, disable_custom_all_reduce=False, quantization=fp8, "
            "enforce_eager=False, kv_cache_dtype=auto, device_config=cuda, "
            f"served_model_name={a.served_names[0]}, "
            f"enable_prefix_caching={self.e.prefix_caching}, "
            "enable_chunked_prefill=True",
        )
        self.sleep(self.e.knobs.engine_seconds * 0.3)

    def placement_group(self) -> None:
        e, knobs = self.e, self.e.knobs
        if e.args.uses_ray:
            # initialize_ray_cluster compares the world size with the GPUs of this node (one
            # on a Spark), so every healthy multi-node Ray start warns; 2026 builds still
            # use this wording (the rewording PRs for vllm#31005 were not merged).
            world = e.args.world_size
            self.core(
                "ray_utils.py:557" if self.new_style else "ray_utils.py:337",
                f"Tensor parallel size ({world}) exceeds available GPUs (1). This may result "
                "in Ray placement group allocation failures. Consider reducing "
                f"tensor_parallel_size to 1 or less, or ensure your Ray cluster has {world} "
                "GPUs available.",
                "WARNING",
            )
            stamp = time.strftime("%Y-%m-%d %H:%M:%S") + f",{int(time.time() % 1 * 1000):03d}"
            e.log.raw(
                f"{e.engine_prefix} {stamp}\tINFO worker.py:1771 -- Connecting to existing Ray "
                f"cluster at address: {knobs.head_ip}:6379..."
            )
            e.log.raw(
                f"{e.engine_prefix} {stamp}\tINFO worker.py:1942 -- Connected to Ray cluster. "
                "View the dashboard at http://127.0.0.1:8265 "
            )
            self.core(
                "ray_utils.py:331",
                "No current placement group found. Creating a new placement group.",
            )
        e.placement_group = "pending"
        hang = e.faults.active("hang-placement-group")
        peer = e.peer
        missing = hang or (peer is not None and not peer.connected.is_set())
        if missing and e.args.uses_ray:
            self.core(
                "ray_utils.py:342",
                "The number of required GPUs exceeds the total number of available GPUs in the "
                "placement group.",
                "WARNING",
            )
        specs = [{"GPU": 1.0, f"node:{knobs.head_ip}": 0.001}] + [{"GPU": 1.0}] * (
            e.args.world_size - 1
        )
        start = time.monotonic()
        interval = knobs.pg_wait_s
        deadline = start + interval
        while hang or (peer is not None and not peer.connected.is_set()):
            left = deadline - time.monotonic()
            if left > 0:
                if peer is not None and not hang:
                    peer.connected.wait(min(left, 0.2))
                else:
                    time.sleep(min(left, 0.2))
                continue
            if time.monotonic() - start >= knobs.pg_timeout_s:
                self.crash(
                    "core.py:866",
                    [frame("v1/executor/ray_utils.py", 300, "_wait_until_pg_ready")],
                    "ValueError: Cannot provide a placement group requiring "
                    f"{float(e.args.world_size)} GPUs (placement_group_specs={specs}) within "
                    f"{int(knobs.pg_timeout_s)} seconds.\nTensor parallel size may exceed "
                    "available GPUs in your cluster. Check resources with `ray status` and "
                    "`ray list nodes`.",
                )
            self.core(
                "ray_utils.py:289",
                "Waiting for creating a placement group of specs for "
                f"{int(time.monotonic() - start)} seconds. specs={specs}. Check `ray status` and "
                "`ray list nodes` to see if you have enough resources, and make sure the IP "
                "addresses used by ray cluster are the same as VLLM_HOST_IP environment variable "
                "specified in each node if you are running on a multi-node.",
            )
            interval *= max(1.0, knobs.pg_backoff)
            deadline = time.monotonic() + interval
        if peer is not None:
            self.peer_joined(peer)
            if peer.state != "connected":
                self.worker_lost_during_load()
        e.placement_group = "created"

    def peer_joined(self, peer: PeerLink) -> None:
        """Every other node's rank is in the group: their addresses and PIDs in the log lines
        from now on. Without Ray each headless rank said its rank; Ray's workers are ranked
        as vLLM's Ray executor sorts them (the driver's node first, then by IP as text),
        each node's GPU one rank (``--nnodes`` ranks may hold several: their first)."""
        e, a = self.e, self.e.args
        peer.formed = True
        joined = [p for p in peer.peers if p.state == "connected"]
        if a.uses_ray or not a.multi_node:
            for rank, p in enumerate(sorted(joined, key=lambda p: p.ip), start=1):
                p.rank = rank
        for p in joined:
            per = max(1, a.world_size // a.nnodes) if a.multi_node else 1
            for rank in range(p.rank, min(a.world_size, p.rank + per)):
                e.worker_ips[rank] = p.ip or e.knobs.worker_ip
                if p.pid:
                    e.worker_pids[rank] = p.pid + 2 * (rank - p.rank)

    def rendezvous(self) -> None:
        """No Ray: every ``--nnodes`` rank meets at ``--master-addr:--master-port``
        (torch.distributed's store); the head waits for the others, a worker dials it."""
        e, a = self.e, self.e.args
        timeout = e.knobs.rendezvous_timeout_s
        if a.headless:
            assert e.rank_link is not None
            if not e.rank_link.join(timeout):
                self.rank_crash(
                    "torch.distributed.DistNetworkError: The client socket has timed out after "
                    f"{int(timeout * 1000)}ms while trying to connect to ({a.master_addr}, "
                    f"{a.master_port})."
                )
            return
        peer = e.peer
        if peer is None or peer.connected.wait(timeout):
            if peer is not None:
                self.peer_joined(peer)
            return
        self.crash(
            "core.py:866",
            [
                frame("v1/executor/multiproc_executor.py", 134, "_init_executor"),
                "    self.rpc_broadcast_mq = MessageQueue.create_from_process_group(",
                frame("distributed/utils.py", 252, "get"),
                "    return self.store.get(key)",
            ],
            f"torch.distributed.DistStoreError: wait timeout after {int(timeout * 1000)}ms, "
            "keys: /default_pg/0//cuda//0",
        )

    def rank_crash(self, final: str) -> NoReturn:
        """A headless rank's own traceback (no engine core, no API server), exit 1."""
        rank = self.e.args.local_ranks[0]
        body = [
            "Traceback (most recent call last):",
            frame("v1/executor/multiproc_executor.py", 512, "worker_main"),
            "    worker = WorkerProc(*args, **kwargs)",
            frame("distributed/parallel_state.py", 1186, "init_distributed_environment"),
            "    torch.distributed.init_process_group(",
            final,
        ]
        self.e.log.error(self.e.worker_prefix(rank), "multiproc_executor.py:540", "\n".join(body))
        sys.stdout.flush()
        raise SystemExit(1)

    def worker_lost_during_load(self) -> NoReturn:
        rank, ip, pid = self.e.lost_rank()
        if self.e.args.multi_node:
            self.crash(
                "core.py:866",
                [frame("v1/executor/multiproc_executor.py", 134, "_init_executor")],
                "RuntimeError: NCCL error: remote process exited or there was a network "
                f"error (rank {rank} on {ip}), NCCL version 2.27.3",
            )
        self.crash(
            "core.py:866",
            [frame("v1/executor/ray_executor.py", 101, "_init_executor")],
            "ray.exceptions.RayActorError: The actor died unexpectedly before finishing this "
            "task.\n"
            f"\tclass_name: RayWorkerWrapper\n\tpid: {pid}\n\tip: {ip}",
        )

    def check_peer(self) -> None:
        peer = self.e.peer
        if peer is not None and peer.formed and peer.state == "lost":
            self.worker_lost_during_load()

    def distributed(self) -> None:
        e, a = self.e, self.e.args
        port = 29500 + secrets.randbelow(20000)
        init = f"tcp://{e.knobs.head_ip}:{port}"
        if a.multi_node:
            init = f"tcp://{a.master_addr}:{a.master_port}"
        for rank in a.local_ranks:
            self.e.log.info(
                e.worker_prefix(rank),
                "parallel_state.py:1906",
                f"world_size={a.world_size} rank={rank} local_rank=0 distributed_init_method="
                f"{init} backend=nccl",
            )
        if a.world_size > 1:
            self.ranks("pynccl.py:103", "vLLM is using nccl==2.27.3")
            if e.faults.active("crash-nccl"):
                self.sleep(e.knobs.engine_seconds * 0.3)
                self.nccl_crash()
            if a.tp > 1:  # the TP group's custom all-reduce (a pipeline stage has none)
                self.ranks(
                    "custom_all_reduce.py:153",
                    "Custom allreduce is disabled because this process group spans across nodes.",
                    "WARNING",
                )
        for rank in a.local_ranks:
            pp, tp = a.parallel_ranks(rank)
            self.e.log.info(
                e.worker_prefix(rank),
                "parallel_state.py:2350",
                f"rank {rank} in world size {a.world_size} is assigned as DP rank 0, PP rank "
                f"{pp}, PCP rank 0, TP rank {tp}, ETP rank {tp}, EP rank N/A, EPLB rank N/A",
            )
        if e.faults.active("crash-free-memory"):
            util = a.gpu_mem_util
            want = util * e.knobs.gpu_total_gib
            self.crash(
                "core.py:866",
                [
                    frame("v1/worker/gpu_worker.py", 236, "init_device"),
                    "    raise ValueError(",
                ],
                f"ValueError: Free memory on device ({e.knobs.free_mem_gib:.1f}/"
                f"{e.knobs.gpu_total_gib:.1f} GiB) on startup is less than desired GPU memory "
                f"utilization ({util}, {want:.2f} GiB). Decrease GPU memory utilization or "
                "reduce GPU memory used by other processes.",
            )
        self.sleep(e.knobs.engine_seconds * 0.7)
        self.check_peer()
        self.ranks("gpu_model_runner.py:3310", f"Starting to load model {a.model}...")

    def nccl_crash(self) -> NoReturn:
        e = self.e
        w = e.worker_prefix(e.args.world_size - 1)
        stamp = time.strftime("%m%d %H:%M:%S")
        pre = [
            f"{w} [rank1]:[E{stamp}.{secrets.randbelow(10**6):06d} ProcessGroupNCCL.cpp:632] "
            "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
            "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600043 "
            "milliseconds before timing out.",
            f"{w} torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/"
            "distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled system error (run with "
            "NCCL_DEBUG=INFO for details), NCCL version 2.27.3",
            f"{w} ncclSystemError: System call (e.g. socket, malloc) or external library call "
            "failed or device error.",
            f"{w} Last error:",
            f"{w} socketPollConnect: connect to {e.knobs.head_ip}<43125> returned Connection "
            "timed out",
        ]
        self.crash(
            "core.py:866",
            [
                frame("distributed/device_communicators/pynccl.py", 118, "__init__"),
                "    self.comm: ncclComm_t = self.nccl.ncclCommInitRank(",
                frame("distributed/device_communicators/pynccl_wrapper.py", 385, "NCCL_CHECK"),
                '    raise RuntimeError(f"NCCL error: {error_str}")',
            ],
            "RuntimeError: NCCL Error 2: unhandled system error "
            "(run with NCCL_DEBUG=INFO for details)",
            pre,
        )

    def load_weights(self) -> None:
        e, knobs = self.e, self.e.knobs
        shards = max(1, knobs.shards)
        start = time.monotonic()
        self.progress(shard_progress(0, shards, 0.0))
        oom_at = max(1, shards // 2) if e.faults.active("crash-oom") else -1
        silent_at = max(1, shards // 3) if e.faults.active("hang-silent") else -1
        killed_at = max(1, shards // 3) if e.faults.active("killed-during-load") else -1
        for n in range(1, shards + 1):
            self.sleep(knobs.shard_seconds)
            self.check_peer()
            if n == oom_at:
                self.oom_crash()
            self.progress(shard_progress(n, shards, time.monotonic() - start))
            if n == silent_at:
                self.hang()
            if n == killed_at:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
        self.progress(shard_progress(shards, shards, time.monotonic() - start))
        self.progress("")
        took = time.monotonic() - start
        where = "default_loader.py:501" if self.new_style else "default_loader.py:384"
        self.ranks(where, f"Loading weights took {took:.2f} seconds")
        per_rank = e.model_gib / e.args.world_size
        self.ranks(
            "gpu_model_runner.py:4879",
            f"Model loading took {per_rank:.2f} GiB memory and {took + 1.2:.6f} seconds",
        )

    def oom_crash(self) -> NoReturn:
        per_rank = self.e.model_gib / self.e.args.world_size
        total = self.e.knobs.gpu_total_gib
        self.crash(
            "core.py:866",
            [
                frame("v1/worker/gpu_worker.py", 283, "load_model"),
                "    self.model_runner.load_model(eep_scale_up=eep_scale_up)",
                frame("model_executor/model_loader/default_loader.py", 305, "load_weights"),
                "    loaded_weights = model.load_weights(",
            ],
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a "
            f"total capacity of {total:.2f} GiB of which 612.00 MiB is free. Including non-PyTorch "
            f"memory, this process has {total - 1.49:.2f} GiB memory in use. Of the allocated "
            f"memory {per_rank + 57.8:.2f} GiB is allocated by PyTorch, and 512.33 MiB is reserved "
            "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
            "documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        )

    def profile_and_kv(self) -> None:
        e, knobs, a = self.e, self.e.knobs, self.e.args
        cache = f"/root/.cache/vllm/torch_compile_cache/{secrets.token_hex(5)}"
        self.ranks(
            "backends.py:609",
            f"Using cache directory: {cache}/rank_{{rank}}_0/backbone for vLLM's torch.compile",
        )
        start = time.monotonic()
        self.sleep(knobs.compile_seconds * 0.3)
        self.check_peer()
        self.ranks(
            "backends.py:623", f"Dynamo bytecode transform time: {time.monotonic() - start:.2f} s"
        )
        self.sleep(knobs.compile_seconds * 0.7)
        self.check_peer()
        self.ranks(
            "monitor.py:34", f"torch.compile takes {time.monotonic() - start:.2f} s in total"
        )
        per_rank = e.model_gib / a.world_size
        avail = a.gpu_mem_util * knobs.gpu_total_gib - per_rank - ACTIVATION_GIB
        if avail <= 0:
            self.crash(
                "core.py:866",
                [frame("v1/core/kv_cache_utils.py", 696, "check_enough_kv_cache_memory")],
                "ValueError: No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine.",
            )
        self.ranks("gpu_worker.py:348", f"Available KV cache memory: {avail:.2f} GiB")
        tokens = int(avail * TOKENS_PER_GIB * a.world_size / 16) * 16
        e.kv_cache_tokens = tokens
        concurrency = tokens / a.max_model_len
        if self.new_style:
            self.core(
                "kv_cache_utils.py:2327",
                f"GPU KV cache size: {tokens:,} tokens, Maximum concurrency for "
                f"{a.max_model_len:,} tokens per request: {concurrency:.2f}x",
            )
        else:
            self.core("kv_cache_utils.py:1234", f"GPU KV cache size: {tokens:,} tokens")
            self.core(
                "kv_cache_utils.py:1238",
                f"Maximum concurrency for {a.max_model_len:,} tokens per request: "
                f"{concurrency:.2f}x",
            )
        e.metrics.kv_cache_tokens = max(1, tokens)
        e.metrics.cache_info = cache_config_info(
            a.gpu_mem_util, tokens, a.max_model_len, int(avail * 2**30), e.prefix_caching
        )
        e.prefix_cache.capacity = max(1, tokens // e.prefix_cache.block_size)

    def graphs(self) -> None:
        knobs = self.e.knobs
        start = time.monotonic()
        for desc, total, share in (
            ("Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)", 67, 0.6),
            ("Capturing CUDA graphs (decode, FULL)", 35, 0.4),
        ):
            t = time.monotonic()
            self.progress(bar_progress(desc, 0, total, 0.0))
            self.sleep(knobs.graph_seconds * share / 2)
            self.check_peer()
            self.progress(bar_progress(desc, total // 2, total, time.monotonic() - t))
            self.sleep(knobs.graph_seconds * share / 2)
            self.progress(bar_progress(desc, total, total, time.monotonic() - t))
        secs = time.monotonic() - start
        self.ranks(
            "gpu_model_runner.py:3480",
            f"Graph capturing finished in {secs:.0f} secs, took {GRAPH_GIB:.2f} GiB",
        )
        self.core(
            "core.py:402",
            "init engine (profile, create kv cache, warmup model) took "
            f"{time.monotonic() - self.t0:.2f} s",
        )

    def serve(self) -> None:
        e, a = self.e, self.e.args
        self.check_peer()
        self.api("entry.py:136", "Supported tasks: ['generate']")
        if a.auto_tool_choice and a.tool_call_parser:
            self.api("parser_manager.py:38", '"auto" tool choice has been enabled.')
        self.api(
            "hf.py:648",
            "Detected the chat template content format to be 'string'. You can set "
            "`--chat-template-content-format` to override this.",
        )
        url = f"http://{a.host}:{a.port}"
        if self.new_style:
            self.api("entry.py:140", f"Starting vLLM server on {url}")
        else:
            self.api("api_server.py:1912", f"Starting vLLM API server 0 on {url}")
        self.api("launcher.py:186", "Available routes are:")
        for path, methods in ROUTES:
            self.api("launcher.py:195", f"Route: {path}, Methods: {methods}")
        e.log.uvicorn(f"Started server process [{e.pid}]")
        e.log.uvicorn("Waiting for application startup.")
        self.go_live()
        e.ready = True
        e.log.uvicorn("Application startup complete.")
