"""``GET /metrics``: Prometheus text as vLLM 0.32 serves it (prometheus_client layout).

Families, HELP texts, label sets, bucket bounds and order follow the recorded
``metrics_before/after.txt``; counters move with the emulator's real traffic. Counters are
rendered as ``name_total`` plus a ``name_created`` gauge, histograms as buckets, ``_count``,
``_sum`` plus ``_created``; labels sorted by name; numbers in Go float format.
"""

from __future__ import annotations

import gc
import itertools
import math
import os
import platform
import resource
import threading
import time
from collections.abc import Iterable

from .metrics_schema import (
    CONTENT_TYPE,
    ENGINE_LABEL,
    EXCLUDED_HANDLERS,
    FINISH_REASONS,
    HANDLER_BUCKETS,
    HELP,
    HIGHR_BUCKETS,
    ITERATION_BUCKETS,
    ITL_BUCKETS,
    LATENCY_BUCKETS,
    N_BUCKETS,
    PREEMPTION_BUCKETS,
    TTFT_BUCKETS,
)

__all__ = ["CONTENT_TYPE", "Metrics", "go_float"]


def go_float(value: float) -> str:
    """prometheus_client's floatToGoString."""
    d = float(value)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


def buckets_1_2_5(limit: int) -> tuple[float, ...]:
    out: list[float] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > limit:
                return tuple(out)
            out.append(float(v))
        exp += 1


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    items = sorted(pairs)
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}"


Labels = tuple[tuple[str, str], ...]


class Histogram:
    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0
        self.created = time.time()

    def observe(self, value: float) -> None:
        for i, b in enumerate(self.bounds):
            if value <= b:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.sum += value
        self.count += 1


class _Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def head(self, name: str, kind: str, help_text: str) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, labels: Labels, value: float) -> None:
        self.lines.append(f"{name}{_labels(labels)} {go_float(value)}")

    def counter(self, base: str, series: list[tuple[Labels, float, float]]) -> None:
        help_text = HELP[base]
        self.head(base + "_total", "counter", help_text)
        for labels, value, _ in series:
            self.sample(base + "_total", labels, value)
        self.head(base + "_created", "gauge", help_text)
        for labels, _, created in series:
            self.sample(base + "_created", labels, created)

    def gauge(self, name: str, series: list[tuple[Labels, float]]) -> None:
        self.head(name, "gauge", HELP[name])
        for labels, value in series:
            self.sample(name, labels, value)

    def histogram(
        self, name: str, series: list[tuple[Labels, Histogram]], kind: str = "histogram"
    ) -> None:
        help_text = HELP[name]
        self.head(name, kind, help_text)
        for labels, h in series:
            if kind == "histogram":
                running = 0
                for bound, n in zip((*h.bounds, math.inf), h.counts, strict=True):
                    running += n
                    self.sample(name + "_bucket", (*labels, ("le", go_float(bound))), running)
            self.sample(name + "_count", labels, h.count)
            self.sample(name + "_sum", labels, h.sum)
        self.head(name + "_created", "gauge", help_text)
        for labels, h in series:
            self.sample(name + "_created", labels, h.created)


def _process_lines() -> list[str]:
    """prometheus_client's default GC, platform and process collectors."""
    w = _Writer()
    stats = gc.get_stats()
    for name, key, help_text in (
        ("python_gc_objects_collected_total", "collected", "Objects collected during gc"),
        (
            "python_gc_objects_uncollectable_total",
            "uncollectable",
            "Uncollectable objects found during GC",
        ),
        (
            "python_gc_collections_total",
            "collections",
            "Number of times this generation was collected",
        ),
    ):
        w.head(name, "counter", help_text)
        for i, st in enumerate(stats):
            w.sample(name, (("generation", str(i)),), st[key])
    out = w.lines
    major, minor, patch = platform.python_version_tuple()
    out.append("# HELP python_info Python platform information")
    out.append("# TYPE python_info gauge")
    out.append(
        f'python_info{{implementation="{platform.python_implementation()}",major="{major}",'
        f'minor="{minor}",patchlevel="{patch}",version="{platform.python_version()}"}} 1.0'
    )
    vmem = rss = 0.0
    start = time.time()
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        page = os.sysconf("SC_PAGE_SIZE")
        ticks = os.sysconf("SC_CLK_TCK")
        vmem, rss = float(fields[20]), float(fields[21]) * page
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        start = time.time() - uptime + float(fields[19]) / ticks
    except (OSError, ValueError, IndexError):
        pass
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        fds = float(len(os.listdir("/proc/self/fd")))
    except OSError:
        fds = 0.0
    max_fds = float(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    for name, kind, help_text, value in (
        ("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", vmem),
        ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", rss),
        (
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            round(start, 2),
        ),
        (
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            round(usage.ru_utime + usage.ru_stime, 2),
        ),
        ("process_open_fds", "gauge", "Number of open file descriptors.", fds),
        ("process_max_fds", "gauge", "Maximum number of open file descriptors.", max_fds),
    ):
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} {kind}")
        out.append(f"{name} {go_float(value)}")
    return out


class Metrics:
    """Counters updated by the request path; ``render()`` for ``GET /metrics``."""

    def __init__(
        self,
        model_name: str,
        max_model_len: int,
        cache_info: dict[str, str],
        kv_cache_tokens: int,
        tool_parser: bool,
    ) -> None:
        self.model = model_name
        self.cache_info = cache_info
        self.kv_cache_tokens = max(1, kv_cache_tokens)
        self.tool_parser = tool_parser
        self._lock = threading.Lock()
        self._t0 = time.time()
        self.running = 0
        self.waiting = 0
        self.kv_tokens_in_use = 0
        self.prompt_tokens = 0.0
        self.generation_tokens = 0.0
        self.prefix_queries = 0.0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0.0  # of those, served from it
        self.preemptions = 0.0
        # speculative decoding (only with a speculative config: spec_k draft positions)
        self.spec_k = 0
        self.spec_drafts = 0.0
        self.spec_draft_tokens = 0.0
        self.spec_accepted = 0.0
        self.spec_per_pos: list[float] = []
        self.success = dict.fromkeys(FINISH_REASONS, 0.0)
        self.tool_invocations: dict[tuple[str, str], float] = {}
        tok_buckets = buckets_1_2_5(max_model_len)
        self.hist: dict[str, Histogram] = {
            "vllm:request_prompt_tokens": Histogram(tok_buckets),
            "vllm:request_generation_tokens": Histogram(tok_buckets),
            "vllm:iteration_tokens_total": Histogram(tuple(float(b) for b in ITERATION_BUCKETS)),
            "vllm:request_max_num_generation_tokens": Histogram(tok_buckets),
            "vllm:request_params_n": Histogram(tuple(float(b) for b in N_BUCKETS)),
            "vllm:request_params_max_tokens": Histogram(tok_buckets),
            "vllm:time_to_first_token_seconds": Histogram(TTFT_BUCKETS),
            "vllm:inter_token_latency_seconds": Histogram(ITL_BUCKETS),
            "vllm:request_time_per_output_token_seconds": Histogram(ITL_BUCKETS),
            "vllm:e2e_request_latency_seconds": Histogram(LATENCY_BUCKETS),
            "vllm:request_queue_time_seconds": Histogram(LATENCY_BUCKETS),
            "vllm:request_inference_time_seconds": Histogram(LATENCY_BUCKETS),
            "vllm:request_prefill_time_seconds": Histogram(LATENCY_BUCKETS),
            "vllm:request_decode_time_seconds": Histogram(LATENCY_BUCKETS),
            "vllm:request_num_preemptions": Histogram(tuple(float(b) for b in PREEMPTION_BUCKETS)),
            "vllm:request_prefill_kv_computed_tokens": Histogram(tok_buckets),
        }
        self.http_requests: dict[tuple[str, str, str], list[float]] = {}
        self.http_req_size: dict[str, Histogram] = {}
        self.http_resp_size: dict[str, Histogram] = {}
        self.http_highr = Histogram(HIGHR_BUCKETS)
        self.http_duration: dict[tuple[str, str], Histogram] = {}
        # Window for the periodic "Engine 000: Avg prompt throughput" log line.
        self.window_prompt = 0
        self.window_generation = 0

    # --- request path -------------------------------------------------------------------
    def admit(self, prompt_tokens: int) -> None:
        with self._lock:
            self.running += 1
            self.kv_tokens_in_use += prompt_tokens

    def prefix(self, prompt_tokens: int, cached_tokens: int) -> None:
        """One prompt's prefix-cache lookup (counted at admission, as vLLM's scheduler)."""
        with self._lock:
            self.prefix_queries += prompt_tokens
            self.prefix_hits += cached_tokens

    def drafting(self, k: int) -> None:
        """Served with a speculative config of ``k`` draft tokens: export the counters."""
        with self._lock:
            self.spec_k = k
            self.spec_per_pos = [0.0] * k

    def spec_step(self, accepted: int) -> None:
        """One draft of ``spec_k`` tokens verified, its first ``accepted`` kept."""
        with self._lock:
            self.spec_drafts += 1
            self.spec_draft_tokens += self.spec_k
            self.spec_accepted += accepted
            for pos in range(min(accepted, self.spec_k)):
                self.spec_per_pos[pos] += 1

    def preempted(self) -> None:
        with self._lock:
            self.preemptions += 1

    def prefix_hit_rate(self) -> float:
        with self._lock:
            return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0

    def token(self, n: int = 1) -> None:
        with self._lock:
            self.kv_tokens_in_use += n
            self.generation_tokens += n
            self.window_generation += n
            self.hist["vllm:iteration_tokens_total"].observe(float(n))

    def finish(
        self,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        max_tokens: int | None,
        reason: str,
        queue_s: float,
        token_times: list[float],
        start: float,
        cached_tokens: int = 0,
    ) -> None:
        with self._lock:
            self.running = max(0, self.running - 1)
            self.kv_tokens_in_use = max(
                0, self.kv_tokens_in_use - prompt_tokens - completion_tokens
            )
            self.prompt_tokens += prompt_tokens
            self.window_prompt += prompt_tokens
            self.success[reason if reason in self.success else "stop"] += 1
            h = self.hist
            h["vllm:request_prompt_tokens"].observe(prompt_tokens)
            h["vllm:request_generation_tokens"].observe(completion_tokens)
            h["vllm:request_max_num_generation_tokens"].observe(max_tokens or completion_tokens)
            h["vllm:request_params_n"].observe(1)
            if max_tokens is not None:
                h["vllm:request_params_max_tokens"].observe(max_tokens)
            h["vllm:request_num_preemptions"].observe(0)
            h["vllm:request_prefill_kv_computed_tokens"].observe(prompt_tokens - cached_tokens)
            h["vllm:iteration_tokens_total"].observe(float(prompt_tokens))
            h["vllm:request_queue_time_seconds"].observe(queue_s)
            if token_times:
                first, last = token_times[0], token_times[-1]
                ttft = first - start
                h["vllm:time_to_first_token_seconds"].observe(ttft)
                h["vllm:request_prefill_time_seconds"].observe(ttft - queue_s)
                h["vllm:request_decode_time_seconds"].observe(last - first)
                h["vllm:request_inference_time_seconds"].observe(last - start - queue_s)
                h["vllm:e2e_request_latency_seconds"].observe(last - start)
                for a, b in itertools.pairwise(token_times):
                    h["vllm:inter_token_latency_seconds"].observe(b - a)
                if len(token_times) > 1:
                    tpot = (last - first) / (len(token_times) - 1)
                    h["vllm:request_time_per_output_token_seconds"].observe(tpot)

    def abort(self, prompt_tokens: int, completion_tokens: int, reason: str = "abort") -> None:
        with self._lock:
            self.running = max(0, self.running - 1)
            self.kv_tokens_in_use = max(
                0, self.kv_tokens_in_use - prompt_tokens - completion_tokens
            )
            self.success[reason] += 1

    def tool_parser_call(self, mode: str, tool_call: bool, n: int = 1) -> None:
        if not self.tool_parser:
            return
        key = (mode, "tool_call" if tool_call else "no_tool_call")
        with self._lock:
            self.tool_invocations[key] = self.tool_invocations.get(key, 0.0) + n

    def http(
        self, handler: str, method: str, status: int, req_size: int, resp_size: int, duration: float
    ) -> None:
        if handler in EXCLUDED_HANDLERS:
            return
        with self._lock:
            key = (handler, method, f"{status // 100}xx")
            entry = self.http_requests.setdefault(key, [0.0, time.time()])
            entry[0] += 1
            self.http_req_size.setdefault(handler, Histogram(())).observe(req_size)
            self.http_resp_size.setdefault(handler, Histogram(())).observe(resp_size)
            self.http_highr.observe(duration)
            self.http_duration.setdefault((handler, method), Histogram(HANDLER_BUCKETS)).observe(
                duration
            )

    def take_window(self) -> tuple[int, int]:
        with self._lock:
            window = (self.window_prompt, self.window_generation)
            self.window_prompt = self.window_generation = 0
            return window

    def kv_usage(self) -> float:
        return min(1.0, self.kv_tokens_in_use / self.kv_cache_tokens)

    # --- exposition ---------------------------------------------------------------------
    def render(self) -> str:
        with self._lock:
            return "\n".join(_process_lines() + self._vllm_lines()) + "\n"

    def _vllm_lines(self) -> list[str]:
        w = _Writer()
        m = (("engine", "0"), ("model_name", self.model))
        t0 = self._t0
        for base in (
            "vllm:estimated_flops_per_gpu",
            "vllm:estimated_read_bytes_per_gpu",
            "vllm:estimated_write_bytes_per_gpu",
        ):
            w.counter(base, [(m, 0.0, t0)])
        w.gauge("vllm:num_requests_running", [(m, float(self.running))])
        w.gauge("vllm:num_requests_waiting", [(m, float(self.waiting))])
        w.gauge(
            "vllm:num_requests_waiting_by_reason",
            [
                ((*m, ("reason", "capacity")), float(self.waiting)),
                ((*m, ("reason", "deferred")), 0.0),
            ],
        )
        w.gauge(
            "vllm:engine_sleep_state",
            [
                ((*m, ("sleep_state", s)), 1.0 if s == "awake" else 0.0)
                for s in ("awake", "weights_offloaded", "discard_all")
            ],
        )
        w.gauge("vllm:kv_cache_usage_perc", [(m, self.kv_usage())])
        w.counter("vllm:prefix_cache_queries", [(m, self.prefix_queries, t0)])
        w.counter("vllm:prefix_cache_hits", [(m, self.prefix_hits, t0)])
        if self.spec_k:
            w.counter("vllm:spec_decode_num_drafts", [(m, self.spec_drafts, t0)])
            w.counter("vllm:spec_decode_num_draft_tokens", [(m, self.spec_draft_tokens, t0)])
            w.counter("vllm:spec_decode_num_accepted_tokens", [(m, self.spec_accepted, t0)])
            w.counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                [((*m, ("position", str(i))), v, t0) for i, v in enumerate(self.spec_per_pos)],
            )
        for base in (
            "vllm:external_prefix_cache_queries",
            "vllm:external_prefix_cache_hits",
            "vllm:mm_cache_queries",
            "vllm:mm_cache_hits",
        ):
            w.counter(base, [(m, 0.0, t0)])
        w.counter("vllm:num_preemptions", [(m, self.preemptions, t0)])
        w.counter("vllm:prompt_tokens", [(m, self.prompt_tokens, t0)])
        cached = min(self.prefix_hits, self.prompt_tokens)
        by_source = {"local_compute": self.prompt_tokens - cached, "local_cache_hit": cached}
        w.counter(
            "vllm:prompt_tokens_by_source",
            [
                ((*m, ("source", s)), by_source.get(s, 0.0), t0)
                for s in ("local_compute", "local_cache_hit", "external_kv_transfer")
            ],
        )
        w.counter("vllm:prompt_tokens_cached", [(m, cached, t0)])
        w.counter(
            "vllm:prompt_tokens_cached_by_source",
            [
                ((*m, ("source", s)), cached if s == "device" else 0.0, t0)
                for s in ("device", "host", "p2p", "disk", "external_unspecified")
            ],
        )
        w.counter("vllm:generation_tokens", [(m, self.generation_tokens, t0)])
        w.counter(
            "vllm:request_success",
            [((*m, ("finished_reason", r)), self.success[r], t0) for r in FINISH_REASONS],
        )
        model_only = (("model_name", self.model),)
        w.counter(
            "vllm:admission_rejections",
            [
                ((*model_only, ("reason", r)), 0.0, t0)
                for r in ("max_num_queued_reqs", "max_num_queued_tokens")
            ],
        )
        for name, h in self.hist.items():
            w.histogram(name, [(m, h)])
        info = tuple((k, v) for k, v in self.cache_info.items()) + ENGINE_LABEL
        w.gauge("vllm:cache_config_info", [(info, 1.0)])
        w.counter(
            "http_requests",
            [
                ((("handler", h), ("method", me), ("status", st)), v[0], v[1])
                for (h, me, st), v in self.http_requests.items()
            ],
        )
        w.histogram(
            "http_request_size_bytes",
            [((("handler", k),), h) for k, h in self.http_req_size.items()],
            "summary",
        )
        w.histogram(
            "http_response_size_bytes",
            [((("handler", k),), h) for k, h in self.http_resp_size.items()],
            "summary",
        )
        w.histogram("http_request_duration_highr_seconds", [((), self.http_highr)])
        w.histogram(
            "http_request_duration_seconds",
            [((("handler", k[0]), ("method", k[1])), h) for k, h in self.http_duration.items()],
        )
        if self.tool_parser:
            series: list[tuple[Labels, float, float]] = []
            for mode in ("streaming", "non_streaming"):
                for outcome in ("tool_call", "no_tool_call"):
                    for rtype in ("chat_completions", "responses", "other"):
                        v = (
                            self.tool_invocations.get((mode, outcome), 0.0)
                            if rtype == "chat_completions"
                            else 0.0
                        )
                        labels = (
                            ("mode", mode),
                            ("model_name", self.model),
                            ("outcome", outcome),
                            ("request_type", rtype),
                        )
                        series.append((labels, v, t0))
            w.counter("vllm:tool_call_parser_invocations", series)
        return w.lines
