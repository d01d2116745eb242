"""Engine state shared by the HTTP layer, the startup sequence and the TP peer link.

Holds the parsed arguments, knobs, live faults, metrics and pacer; admission (max_num_seqs);
the dead/alive flag and the failure lines vLLM prints when a TP worker dies; and one
supervisor thread that polls the control file, logs throughput every 10 s, writes the
``ray status`` file and watches for run-time ``worker-death``.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from . import errors as err
from .config import Knobs, ServeArgs, checkpoint_gib, reasoning_fields, version_tuple
from .faults import BATCH_TTFT_S, GARBLE_BATCH, FaultState
from .generation import Pacer, StepModel
from .logs import Log, frame
from .metrics import Metrics
from .prefixcache import PrefixCache
from .raystatus import StatusWriter
from .specdecode import SpecModel
from .thermal import Heat

if TYPE_CHECKING:
    from .tp import PeerLink, RankLink


def step_model(knobs: Knobs, faults: FaultState, heat: float = 1.0) -> StepModel:
    """The decode step model in force (knobs, control-file overrides, faults). slow-decode
    adds a per-step cost independent of the batch, nine 1-stream steps (a slow fabric's
    all-reduces, paid once a step): one stream decodes at a tenth of its rate, a batch
    loses less of its aggregate. heat-throttle scales the step by ``heat`` (the GPU's
    slowdown now, :class:`.thermal.Heat`)."""
    rate = max(faults.override("decode_tok_s", knobs.decode_tok_s), 1e-3)
    return StepModel(
        rate=rate,
        expert_share=faults.override("step_expert_share", knobs.step_expert_share),
        expert_pick=knobs.step_expert_pick,
        kv_s_per_token=knobs.step_kv_s_per_token,
        extra_s=9.0 / rate if faults.active("slow-decode") else 0.0,
        scale=heat if faults.active("heat-throttle") else 1.0,
    )


class Engine:
    def __init__(self, args: ServeArgs, knobs: Knobs, faults: FaultState, log: Log) -> None:
        self.args = args
        self.knobs = knobs
        self.faults = faults
        self.log = log
        self.pid = os.getpid()
        self.engine_pid = self.pid + 40
        self.worker_pids = [self.pid + 68 + 2 * r for r in range(args.world_size)]
        self.worker_ips = [knobs.head_ip] + [knobs.worker_ip] * (args.world_size - 1)
        self.api_prefix = f"(APIServer pid={self.pid})"
        self.dead = False
        self.ready = False
        self.dead_reason = ""
        self.peer: PeerLink | None = None  # the head's link to its ranks on other nodes
        self.rank_link: RankLink | None = None  # a headless rank's link to the head
        self.placement_group = "none"  # none | pending | created | removed
        self.kv_cache_tokens = 1
        self.model_gib = knobs.model_gib if knobs.model_gib > 0 else checkpoint_gib(args.model)
        self.reasoning_on = args.reasoning_parser is not None
        self.reasoning_fields = reasoning_fields(knobs.version)
        self.keep_think_newlines = knobs.think_newlines != "strip"
        seed = zlib.crc32(f"{args.model}|{knobs.version}".encode())
        self.fingerprint = f"vllm-{knobs.version}-{seed:08x}"
        self.metrics = Metrics(
            args.served_names[0], args.max_model_len, {}, 1, bool(args.tool_call_parser)
        )
        self.prefix_caching = args.non_default.get("enable_prefix_caching") is not False
        self.prefix_cache = PrefixCache(self.prefix_caching)
        self.spec = SpecModel.of(args.speculative, collapse=False)
        if self.spec is not None:
            self.metrics.drafting(self.spec.k)
        self.pacer = Pacer(
            self._step, self._cap, self._ttft, spec=self._spec, on_draft=self.metrics.spec_step
        )
        self.heat = Heat()  # tracked always, felt only under the heat-throttle fault
        self._slots = threading.BoundedSemaphore(args.max_num_seqs)
        self._lock = threading.Lock()
        self.requests = 0  # completion requests in flight (in_flight)
        self._stop = threading.Event()
        # `ray status` reads what the engine writes; ranks without Ray have no Ray to report.
        writes = bool(knobs.ray_status_file) and not args.multi_node
        self.status = StatusWriter(knobs.ray_status_file, self.ray_snapshot) if writes else None

    def ray_snapshot(self) -> dict[str, Any]:
        """The Ray cluster as ``ray status`` shows it: nodes, placement group, bundles."""
        nodes = [{"ip": self.knobs.head_ip, "role": "head"}]
        if self.peer is not None:  # every worker node whose rank is on the link
            nodes += [{"ip": p.ip, "role": "worker"} for p in self.peer.live()]
        elif self.args.world_size > 1 and not (self.dead and self.dead_reason == "worker-death"):
            nodes.append({"ip": self.knobs.worker_ip, "role": "worker"})
        bundles = [{"GPU": 1.0, f"node:{self.knobs.head_ip}": 0.001}]
        bundles += [{"GPU": 1.0}] * (self.args.world_size - 1)
        return {"nodes": nodes, "placement_group": self.placement_group, "bundles": bundles}

    # --- prefixes -------------------------------------------------------------------------
    @property
    def engine_prefix(self) -> str:
        if self.knobs.engine_prefix:
            return f"({self.knobs.engine_prefix} pid={self.engine_pid})"
        old = version_tuple(self.knobs.version) < (0, 30, 0)
        name = "EngineCore_DP0" if (old or self.args.world_size > 1) else "EngineCore"
        return f"({name} pid={self.engine_pid})"

    def worker_prefix(self, rank: int) -> str:
        pid = self.worker_pids[rank]
        if self.args.world_size == 1:
            return f"(Worker pid={pid})"
        if not self.args.uses_ray:  # vLLM's worker title: Worker[_PP<p>][_TP<t>]
            pp, tp = self.args.parallel_ranks(rank)
            name = "Worker" + (f"_PP{pp}" if self.args.pp > 1 else "")
            return f"({name}{f'_TP{tp}' if self.args.tp > 1 else ''} pid={pid})"
        if rank == 0:
            return f"(RayWorkerWrapper pid={pid})"
        return f"(RayWorkerWrapper pid={pid}, ip={self.worker_ips[rank]})"

    # --- pacing knobs (control-file overrides win) ---------------------------------------
    def _step(self) -> StepModel:
        return step_model(self.knobs, self.faults, self.heat.factor(self.pacer.running))

    def _spec(self) -> SpecModel | None:
        """Drafting in force: the speculative config's, collapsed under spec-collapse."""
        if self.spec is None or not self.faults.active("spec-collapse"):
            return self.spec
        return SpecModel.of(self.args.speculative, collapse=True)

    def _cap(self) -> float:
        return self.faults.override("max_agg_tok_s", self.knobs.max_agg_tok_s)

    def _ttft(self, prompt_tokens: int) -> float:
        base = self.faults.override("ttft_s", self.knobs.ttft_s)
        prefill = self.faults.override("prefill_tok_s", self.knobs.prefill_tok_s)
        if self.faults.active("ttft-grows-with-batch"):
            base += BATCH_TTFT_S * max(0, self.metrics.running - 1)
        ttft = base + (prompt_tokens / prefill if prefill > 0 else 0.0)
        heat = self.heat.factor(self.pacer.running)  # a throttled GPU prefills slower too
        return ttft * heat if self.faults.active("heat-throttle") else ttft

    # --- what the model computes ----------------------------------------------------------
    @contextmanager
    def in_flight(self) -> Iterator[None]:
        """A completion request from its arrival to its last byte (``requests``)."""
        with self._lock:
            self.requests += 1
        try:
            yield
        finally:
            with self._lock:
                self.requests -= 1

    def garbles(self, faults: set[str]) -> bool:
        """Whether the model computes garbage for a request arriving now: always under
        ``garble``, with GARBLE_BATCH or more requests in flight under
        ``garble-under-batch`` (a batch-dependent path: CUDA graphs, batched kernels)."""
        if "garble" in faults:
            return True
        return "garble-under-batch" in faults and self.requests >= GARBLE_BATCH

    # --- request admission ----------------------------------------------------------------
    def check_serving(self) -> None:
        if self.dead:
            raise err.engine_dead()
        if self.faults.active("http-5xx"):
            raise err.internal()

    def admit(self, prompt_tokens: int, gone: Callable[[], bool] | None = None) -> float:
        """A sequence slot (``--max-num-seqs``), waited for in the queue; a client that
        leaves while queued (``gone()``) leaves the queue (BrokenPipeError), as vLLM
        aborts a waiting request whose client disconnected."""
        start = time.monotonic()
        self._hung(gone)
        if not self._slots.acquire(blocking=False):
            with self._lock:
                self.metrics.waiting += 1
            try:
                while not self._slots.acquire(timeout=0.05):
                    if gone is not None and gone():
                        raise BrokenPipeError("the client left while queued")
            finally:
                with self._lock:
                    self.metrics.waiting -= 1
        self.metrics.admit(prompt_tokens)
        if self.faults.active("preempt-under-load") and self.metrics.running > 1:
            self.metrics.preempted()  # KV cache short under a batch: vLLM recomputes it
        return time.monotonic() - start

    def _hung(self, gone: Callable[[], bool] | None) -> None:
        """``engine-hang``: the request waits, never scheduled, while the fault lasts (the
        API server still answers /health: vLLM's health check asks only whether the engine
        core is dead, not whether it steps); a client that leaves leaves the queue."""
        if not self.faults.active("engine-hang"):
            return
        with self._lock:
            self.metrics.waiting += 1
        try:
            while self.faults.active("engine-hang") and not self.dead:
                if gone is not None and gone():
                    raise BrokenPipeError("the client left while the engine hung")
                time.sleep(0.1)
        finally:
            with self._lock:
                self.metrics.waiting -= 1

    def release(self, prompt_tokens: int, done: int, aborted: bool) -> None:
        self._slots.release()
        if aborted:
            self.metrics.abort(prompt_tokens, done, "error" if self.dead else "abort")

    # --- death ----------------------------------------------------------------------------
    def die(self, cause: str) -> None:
        """A rank is gone: vLLM's failure lines, then /health 503 and requests 500.

        ``cause``: "worker-death" (fault), "eof" (peer process gone), "timeout" (link down).
        """
        with self._lock:
            if self.dead:
                return
            self.dead = True
            self.dead_reason = cause
        log, knobs = self.log, self.knobs
        rank, w_ip, w_pid = self.lost_rank()
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime())
        micros = f"{time.time() % 1:.6f}"[2:]
        r0 = self.worker_prefix(0)
        if cause == "timeout":
            log.raw(
                f"{r0} [rank0]:[E{stamp}.{micros} ProcessGroupNCCL.cpp:632] [PG ID 2 PG GUID 3 "
                "Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=48213, "
                "OpType=ALLREDUCE, NumelIn=12288, NumelOut=12288, Timeout(ms)=600000) ran for "
                "600032 milliseconds before timing out."
            )
        elif cause == "eof":
            log.raw(
                f"{r0} [rank0]:[E{stamp}.{micros} ProcessGroupNCCL.cpp:2057] [PG ID 2 PG GUID 3 "
                "Rank 0] Process group watchdog thread terminated with exception: NCCL error: "
                "remote process exited or there was a network error, NCCL version 2.27.3"
            )
        where = "core.py:922"
        e = self.engine_prefix
        trace = [
            "EngineCore encountered a fatal error.",
            "Traceback (most recent call last):",
            frame("v1/engine/core.py", 913, "run_engine_core"),
            "    engine_core.run_busy_loop()",
            frame("v1/engine/core.py", 940, "run_busy_loop"),
            "    self._process_engine_step()",
        ]
        if self.args.multi_node:  # no Ray: the multiprocessing executor's own words
            log.error(
                e,
                "multiproc_executor.py:171",
                f"Worker proc rank {rank} ({w_ip}, pid {w_pid}) died unexpectedly, shutting "
                "down executor.",
            )
            trace += [
                frame("v1/executor/multiproc_executor.py", 298, "collective_rpc"),
                "    raise RuntimeError(",
                "RuntimeError: Executor failed.",
            ]
        else:
            trace += self._ray_death(cause, w_ip, w_pid)
        log.error(e, where, "\n".join(trace))
        self._api_dead()
        self.placement_group = "removed"
        if knobs.exit_on_death_s >= 0:
            threading.Timer(knobs.exit_on_death_s, self._exit_dead).start()

    def lost_rank(self) -> tuple[int, str, int]:
        """(rank, address, pid) of the rank whose loss kills the engine: the one the link
        lost, else rank 1 (the worker-death fault)."""
        lost = self.peer.lost if self.peer is not None else None
        if lost is not None:
            return lost.rank, lost.ip, lost.pid or self.worker_pids[lost.rank]
        rank = min(1, self.args.world_size - 1)
        pid = self.peer.peer_pid if self.peer and self.peer.peer_pid else self.worker_pids[rank]
        return rank, self.worker_ips[rank], pid

    def _ray_death(self, cause: str, w_ip: str, w_pid: int) -> list[str]:
        node_id = zlib.crc32(w_ip.encode()).to_bytes(4, "big").hex() * 7
        return [
            frame("v1/executor/ray_executor.py", 455, "execute_model"),
            "    return refs[0].get()",
            "ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.",
            "\tclass_name: RayWorkerWrapper",
            f"\tactor_id: {secrets.token_hex(16)}",
            f"\tpid: {w_pid}",
            f"\tnamespace: {secrets.token_hex(4)}-{secrets.token_hex(2)}-{secrets.token_hex(2)}",
            f"\tip: {w_ip}",
            f"The actor is dead because its node has died. Node Id: {node_id}"
            if cause == "timeout"
            else "The actor is dead because its worker process has died. Worker exit type: "
            "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error "
            "code 2. End of file.",
        ]

    def _api_dead(self) -> None:
        self.log.error(
            self.api_prefix,
            "async_llm.py:527",
            "\n".join(
                [
                    "AsyncLLM output_handler failed.",
                    "Traceback (most recent call last):",
                    frame("v1/engine/async_llm.py", 486, "output_handler"),
                    "    outputs = await engine_core.get_output_async()",
                    frame("v1/engine/core_client.py", 882, "get_output_async"),
                    "    raise self._format_exception(outputs) from None",
                    f"vllm.v1.engine.exceptions.EngineDeadError: {err.ENGINE_DEAD_MESSAGE}",
                ]
            ),
        )

    def _exit_dead(self) -> None:
        self.log.uvicorn("Shutting down")
        self.log.uvicorn(f"Finished server process [{self.pid}]")
        os._exit(1)

    # --- supervisor -------------------------------------------------------------------------
    def start_supervisor(self) -> None:
        threading.Thread(target=self._supervise, name="supervisor", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _supervise(self) -> None:
        knobs = self.knobs
        next_stats = time.monotonic() + knobs.stats_interval_s
        next_status = 0.0
        last_logged_busy = False
        while not self._stop.wait(knobs.control_poll_s):
            self.faults.poll()
            now = time.monotonic()
            if self.ready and not self.dead and self.faults.active("worker-death"):
                self.die("worker-death")
            if self.status is not None and now >= next_status:
                self.status.write()
                next_status = now + 1.0
            if (
                self.ready
                and now >= next_stats
                and not self.args.non_default.get("disable_log_stats")
            ):
                prompt, gen = self.metrics.take_window()
                busy = bool(prompt or gen or self.metrics.running or self.metrics.waiting)
                if busy or last_logged_busy:
                    span = knobs.stats_interval_s
                    self.log.info(
                        self.api_prefix,
                        "loggers.py:335",
                        f"Engine 000: Avg prompt throughput: {prompt / span:.1f} tokens/s, "
                        f"Avg generation throughput: {gen / span:.1f} tokens/s, "
                        f"Running: {self.metrics.running} reqs, "
                        f"Waiting: {self.metrics.waiting} reqs, "
                        f"GPU KV cache usage: {100 * self.metrics.kv_usage():.1f}%, "
                        f"Prefix cache hit rate: {100 * self.metrics.prefix_hit_rate():.1f}%",
                    )
                last_logged_busy = busy
                next_stats = now + knobs.stats_interval_s
