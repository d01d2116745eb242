"""The profile's schema: one frozen dataclass per TOML table (``[nccl]`` is NcclSection),
each field a figure with its type and default, and ProfileSections, whose fields name the
tables (``nccl: NcclSection``). That is the whole declaration of a table: the loader
(profiles.load_profile), ``--spark-threshold=TABLE.KEY=V``, the validation of a profile
file and ``--spark-show-profile`` all read it from here (``SECTIONS``, ``section_hints``).

Adding a table: write its ``@dataclass(frozen=True) class FooSection(Section)`` (a default
for every figure a built-in profile does not set; ``UNITS`` for a figure whose name does not
end in its unit, see settings/show.py SUFFIXES), then one line ``foo: FooSection`` in
ProfileSections.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cache
from typing import ClassVar


@dataclass(frozen=True)
class Section:
    """One profile table. ``UNITS``: ``{key: unit}`` for a key whose name does not end in
    its unit (``ping_count``: ``pings``; ``-`` for none), read by --spark-show-profile."""

    UNITS: ClassVar[Mapping[str, str]] = {}


@dataclass(frozen=True)
class LinkSection(Section):
    """``[link]``: the fabric ports (tests_infra/test_links.py)."""

    UNITS = {
        "fabric_twins": "ports",
        "min_mtu": "bytes",
        "hard_min_mtu": "bytes",
        "ping_count": "pings",
    }

    fabric_twins: int  # RoCE ports Up per node when --spark-fabric-ifs is not given
    min_rate_gbps: float
    min_mtu: int  # the MTU RoCE needs (a warning below it)
    hard_min_mtu: int  # below it nothing works (a failure)
    ping_count: int = 3


@dataclass(frozen=True)
class NcclSection(Section):
    """``[nccl]``: the all-reduce sweep and its bus-bandwidth floors (GB/s)."""

    UNITS = {"iters": "iters", "warmup": "iters"}

    min_busbw_gbps: float
    min_bytes: int
    max_bytes: int
    timeout_s: float
    one_twin_busbw_gbps: float | None = None  # the figure of one fabric twin only
    socket_busbw_gbps: float | None = None  # the figure of NCCL's TCP socket fallback
    iters: int = 20  # timed iterations per size (nccl-tests -n; >= 1)
    warmup: int = 5  # untimed iterations before them (nccl-tests -w; >= 0)
    max_mem_share: float = 0.25  # the sweep's buffers may take this of the least MemAvailable


@dataclass(frozen=True)
class CollectivesSection(Section):
    """``[collectives]``: the sweeps run in the all-reduce's launch (tests_infra/test_nccl.py):
    all_gather's busbw floor as a share of ``nccl.min_busbw_gbps`` (so a lowered all-reduce
    floor lowers it too) and the small-message latency sweep and its ceiling."""

    all_gather_busbw_ratio: float = 0.85
    max_latency_us: float | None = None  # best small-message all-reduce time; None: not checked
    latency_max_bytes: int = 1048576  # the latency sweep runs 8 B..this


@dataclass(frozen=True)
class PreflightSection(Section):
    """``[preflight]``: per-node checks before anything is launched."""

    UNITS = {"gpus_per_node": "GPUs", "nodes": "nodes", "max_link_flaps_24h": "flaps"}

    gpus_per_node: int
    max_disk_used_pct: float
    max_clock_skew_s: float
    max_link_flaps_24h: int
    nodes: int = 0  # the nodes the profile is for (0: any number); fewer given: a header line


@dataclass(frozen=True)
class GpuHealthSection(Section):
    """``[gpu_health]``: temperature, clocks event reasons, persistence mode and the kernel
    log's Xid / NVRM errors (tests_infra/test_gpuhealth.py). A reason whose ``*_fails``
    is false warns instead of failing; idle, applications clocks, sync boost and display
    clocks are never a fault."""

    UNITS = {"warn_xids": "Xid", "nvrm_burst_lines": "lines"}

    max_temp_c: float = 90.0  # at or above: fail (also at the GPU's own slowdown temp)
    warn_temp_c: float = 80.0
    sw_power_cap_fails: bool = False
    sw_thermal_slowdown_fails: bool = True
    hw_slowdown_fails: bool = True
    hw_thermal_slowdown_fails: bool = True
    hw_power_brake_slowdown_fails: bool = True
    min_busy_sm_clock_mhz: float = 1400.0  # SM clock floor while the GPU is busy
    busy_util_pct: float = 80.0  # "busy": utilisation at or above this
    require_persistence: bool = True  # persistence mode Disabled fails (else warns)
    warn_xids: tuple[int, ...] = (13, 31, 43, 45)  # application-level Xids: warn only
    # NVRM NV_ERR_NO_MEMORY: this many lines within the window is a burst (fails); fewer
    # warn (a transient allocation probe during warm-up). infra/kernel reads them too.
    nvrm_burst_lines: int = 10
    nvrm_burst_window_s: float = 600.0
    # A previous boot's errors this close to its last line are "near its end".
    boot_end_window_s: float = 900.0
    load_s: float = 20.0  # the pre-serving GPU load's length (launch mode; <= 30 s)
    load_interval_s: float = 1.0  # nvidia-smi samples it this often
    peer_clock_ratio: float = 0.8  # busy clock under this share of the fastest node's: warn


@dataclass(frozen=True)
class MemorySection(Section):
    """``[memory]``: GB10 unified-memory headroom before a launch (tests_infra/test_memory.py)."""

    UNITS = {"top_holders": "procs"}

    os_headroom_gib: float  # MemAvailable left after the engine's claim, for the OS
    max_swap_used_gib: float = 1.0  # swapped out above this: a warning
    top_holders: int = 3  # processes named in a failure


@dataclass(frozen=True)
class FdLimitSection(Section):
    """``[fdlimit]``: the Docker engine's open-files limit, which containers inherit
    (tests_infra/test_fdlimit.py)."""

    UNITS = {"min_open_files": "files"}

    min_open_files: int = 65535  # dockerd's hard RLIMIT_NOFILE floor (vLLM's set_ulimit)


@dataclass(frozen=True)
class ReadinessSection(Section):
    """``[readiness]``: the startup wait. ``ready_timeout_s`` and ``hang_timeout_s`` are
    the defaults of --spark-ready-timeout and --spark-hang-timeout."""

    UNITS = {"expected_gpus": "GPUs"}

    max_load_s: float  # launch to ready above this fails test_startup_within_budget
    ready_timeout_s: float | None = None
    hang_timeout_s: float | None = None
    placement_group_timeout_s: float = 120.0
    expected_gpus: float | None = None  # ray status GPUs; default: one per node


@dataclass(frozen=True)
class ThroughputSection(Section):
    """``[throughput]``: the closed-loop sweep and its floors."""

    UNITS = {
        "concurrency": "reqs",
        "requests_per_stream": "reqs",
        "min_requests": "reqs",
        "warmup_requests": "reqs",
    }

    min_decode_tok_s_1: float
    max_ttft_p90_s_1: float
    min_agg_tok_s_4: float
    concurrency: tuple[int, ...] = (1, 4, 16)
    prompt_tokens: int = 256
    output_tokens: int = 256
    requests_per_stream: int = 2
    min_requests: int = 4
    warmup_requests: int = 2
    level_budget_s: float = 180.0
    request_timeout_s: float = 300.0


@dataclass(frozen=True)
class ToolCallsSection(Section):
    """``[tool_calls]``: what the server was launched to do with tools."""

    expected: bool = True
    max_tokens: int = 1024
    request_timeout_s: float = 180.0
    require_streamed_arguments: bool = True
    auto_emits_calls: bool = True  # under tool_choice auto (a small model may not)


@dataclass(frozen=True)
class ReasoningSection(Section):
    """``[reasoning]``: the reasoning parser's checks."""

    expected: bool = True
    max_tokens: int = 2048
    truncate_tokens: int = 8
    request_timeout_s: float = 300.0


@dataclass(frozen=True)
class StructuredOutputSection(Section):
    """``[structured_output]``: response_format (json_schema, json_object) answers."""

    expected: bool = True  # false: the server is not asked to honour response_format
    max_tokens: int = 512  # room for the whole JSON (after any reasoning)
    request_timeout_s: float = 180.0


@dataclass(frozen=True)
class SloSection(Section):
    """``[slo]``: per-request ceilings (seconds), each read at its percentile, and the goodput
    gate: the share of requests meeting every SLO (``vllm bench serve --goodput``) at the
    closed-loop level ``concurrency`` (tests_e2e/test_throughput.py::test_goodput) and at each
    open-loop rate (tests_e2e/test_open_loop.py::test_open_loop_knee)."""

    UNITS = {
        "ttft_pct": "pctile",  # the percentile the SLO is read at (99: p99)
        "tpot_pct": "pctile",
        "e2e_pct": "pctile",
        "concurrency": "reqs",
    }

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    ttft_pct: float = 99.0
    tpot_pct: float = 99.0
    e2e_pct: float = 99.0
    min_goodput_pct: float = 95.0
    concurrency: int = 4  # the closed-loop sweep's level the goodput gate reads


@dataclass(frozen=True)
class OpenLoopSection(Section):
    """``[open_loop]``: the Poisson request-rate sweep of --spark-open-loop (rates rise by
    ``rate_factor`` until a level's goodput breaks the SLOs) and its knee's floor."""

    UNITS = {
        "start_rate": "req/s",
        "rate_factor": "x",
        "max_levels": "levels",
        "requests_per_level": "reqs",
        "seed": "-",
        "burstiness": "-",  # a gamma shape (1: Poisson)
    }

    start_rate: float = 0.1  # req/s
    rate_factor: float = 2.0
    max_levels: int = 6
    requests_per_level: int = 16
    seed: int = 1
    burstiness: float = 1.0  # 1: Poisson (vllm bench serve's --burstiness)
    min_knee_req_s: float | None = None  # None: the knee is reported, not gated


@dataclass(frozen=True)
class SoakSection(Section):
    """``[soak]``: the steady load of --spark-soak=DURATION and what fails it."""

    UNITS = {"concurrency": "reqs", "max_waiting_growth": "reqs", "max_preemptions": "preempts"}

    concurrency: int = 4
    window_s: float = 60.0  # tok/s is compared between the first and the last window
    max_drift_pct: float = 10.0  # tok/s of the last window below the first by more: fail
    max_waiting_growth: float = 1.0  # vllm:num_requests_waiting, last window's mean - first's
    max_preemptions: int = 0  # vllm:num_preemptions grown during the soak


@dataclass(frozen=True)
class PrefixCacheSection(Section):
    """``[prefix_cache]``: two requests sharing a long prefix (issue #16 section 6)."""

    expected: bool = True  # the server runs with prefix caching (vLLM's default)
    prefix_tokens: int = 2048  # the shared prefix's length (words; ~1 token each)
    request_timeout_s: float = 120.0


@dataclass(frozen=True)
class LongContextSection(Section):
    """``[long_context]``: a request near max_model_len, and one just over it."""

    UNITS = {"fill": "ratio"}

    fill: float = 0.9  # the near-limit prompt's share of max_model_len
    needle: bool = True  # the model can answer a needle question from the long prompt
    max_tokens: int = 64
    request_timeout_s: float = 300.0


@dataclass(frozen=True)
class MetricsHealthSection(Section):
    """``[metrics_health]``: /metrics around each throughput level (issue #16 section 7;
    tests_e2e/test_throughput.py::test_metrics_health_during_sweep)."""

    UNITS = {"max_preemptions": "preempts"}

    max_preemptions: int = 0  # vllm:num_preemptions growth per level
    max_drain_s: float = 5.0  # vllm:num_requests_waiting back to 0 after a level


# What a known-bad-version rule can name (infra.alike.knownbad_check reads each from the
# nodes-alike facts): the NVIDIA driver, the kernel release, the DGX OS release
# (/etc/dgx-release), the ConnectX-7 firmware (ethtool -i) and the NCCL library the serving
# image loads (its version string, or its build by sha256).
RULE_COMPONENTS = ("driver", "kernel", "dgx-os", "cx7-firmware", "nccl")


@dataclass(frozen=True)
class VersionRule:
    """One ``[[known_bad.deny]]`` or ``[[known_bad.allow]]`` entry. ``match``: any of its
    patterns matching the node's value matches (pytest_spark.infra.alike.knownbad_parse says the
    forms: a version prefix ``590.``, a range ``>=590 <591``, ``re:REGEX``, and for NCCL
    ``sha256:HEX`` or ``build-id:HEX``); an empty list matches nothing (an entry that waits
    for evidence)."""

    component: str  # one of RULE_COMPONENTS
    match: tuple[str, ...]
    reason: str = ""  # what goes wrong, in the source's words
    source: str = ""  # the public source (issue, README entry and date)
    scope: str = ""  # where the source says it applies, when narrower than every node
    fix: str = ""


RULE_KEYS = {f.name for f in fields(VersionRule)}


@dataclass(frozen=True)
class KnownBadSection(Section):
    """``[known_bad]``: versions known to break a Spark cluster, each with its public source
    (tests_infra/test_alike.py::test_no_known_bad_versions). A profile's ``deny`` and
    ``allow`` entries add to those of the profile it extends; an allow entry that matches a
    node's value overrides every deny entry of that component there."""

    UNITS = {"deny": "rules", "allow": "rules"}

    deny: tuple[VersionRule, ...] = ()
    allow: tuple[VersionRule, ...] = ()


@dataclass(frozen=True)
class SpecDecodeSection(Section):
    """``[spec_decode]``: speculative decoding read from /metrics around the throughput
    levels (issue #27 part 1; tests_e2e/test_throughput.py::test_spec_decode_acceptance),
    checked only when the server drafts (--speculative-config, or the counters on /metrics).
    ``no_draft_tok_s``: single-stream decode without drafting, the figure a collapse falls
    under (None: ``throughput.min_decode_tok_s_1``)."""

    UNITS = {"min_acceptance": "ratio"}

    min_acceptance: float = 0.5  # accepted / draft tokens over the sweep
    no_draft_tok_s: float | None = None


@dataclass(frozen=True)
class RooflineSection(Section):
    """``[roofline]``: single-stream decode as a fraction of the memory-bandwidth roofline
    (issue #27 part 3; pytest_spark.serving.load.roofline). ``active_params_b``: the
    model's active parameters (billions), used when neither its name nor its config.json
    tells them."""

    UNITS = {"active_params_b": "billion"}

    bandwidth_gbs: float = 273.0  # one node's memory bandwidth (DGX Spark LPDDR5x)
    active_params_b: float | None = None


class Depths(tuple[int, ...]):
    """Context depths in tokens: a list of integers, 0 (no context) or more."""


ARENA_V2_DEPTHS = Depths((0, 4096, 8192, 16384, 32768, 65535, 100000))


@dataclass(frozen=True)
class DepthSweepSection(Section):
    """``[depth_sweep]``: the depth x concurrency sweep in the Spark Arena's shape
    (tests_e2e/test_depth_sweep.py, pytest_spark.serving.load.depth). ``run``: the profile
    runs it (as ``--spark-depth-sweep``, which overrides it); the figures are
    spark-arena/recipe-registry ``benchmarking/spark-arena-v2.yaml``'s, ``runs`` llama-benchy's
    ``--runs`` default."""

    UNITS = {
        "depths": "tokens",
        "pp": "tokens",
        "tg": "tokens",
        "concurrency": "reqs",
        "runs": "batches",
    }

    run: bool = False
    depths: Depths = ARENA_V2_DEPTHS  # context tokens
    pp: int = 2048  # prompt tokens after the context
    tg: int = 128  # tokens generated per request
    concurrency: tuple[int, ...] = (1, 2, 5, 10)  # requests sent at once
    runs: int = 3  # batches per cell
    prefix_caching: bool = False  # llama-benchy's --enable-prefix-caching (the Arena's: true)
    cooldown_s: float = 0.0  # a pause after each cell


# The built-in accuracy canaries by name (pytest_spark.serving.validate.accuracy builds them).
CANARY_KINDS = ("add", "multiply", "arithmetic", "count", "copy", "reverse", "sort", "json_sum")


@dataclass(frozen=True)
class AccuracySection(Section):
    """``[accuracy]``: does the model answer correctly (tests_e2e/test_accuracy.py, issue
    #24). ``canaries``: the built-in canaries this model is expected to answer
    (pytest_spark.serving.validate.accuracy.CANARY_KINDS; an empty list: none, the fingerprint alone
    then reads the model's numbers). The fingerprint tolerances are set from the spread of
    healthy runs (the profile says where it was measured); the math floor is
    ``math_expected - math_tolerance`` (vLLM's tests/evals/gsm8k: 0.08)."""

    UNITS = {
        "canaries": "-",
        "concurrency": "reqs",
        "max_concurrency": "reqs",
        "max_logprob_delta": "nats/tok",
        "max_top1_delta": "ratio",
        "math_problems": "problems",
        "math_expected": "ratio",
        "math_tolerance": "ratio",
    }

    canaries: tuple[str, ...] = CANARY_KINDS
    concurrency: int = 8  # canary requests in flight under load (at least --max-num-seqs)
    max_concurrency: int = 256  # the cap on that (the serve args' --max-num-seqs can be 1024)
    budget_tokens: int = 1800  # generated tokens the quick checks may take (60 s at 31 tok/s)
    disable_thinking: bool = True  # chat_template_kwargs enable_thinking false (Qwen3 and kin)
    fingerprint: bool = True  # the logprob fingerprint (needs prompt logprobs or echo)
    max_logprob_delta: float = 0.05  # nats/token from the baseline's mean logprob
    max_top1_delta: float = 0.03  # top-1 agreement from the baseline's
    math_problems: int = 50
    math_expected: float = 0.9  # the model's expected accuracy on the math set
    math_tolerance: float = 0.08
    math_max_tokens: int = 256
    request_timeout_s: float = 120.0


@dataclass(frozen=True, kw_only=True)
class ProfileSections:
    """The profile's tables, one field per TOML table, in the order --spark-show-profile
    lists them. ``SECTIONS``, the loader and Profile (which adds its name and origin) are
    derived from these fields."""

    link: LinkSection
    nccl: NcclSection
    preflight: PreflightSection
    gpu_health: GpuHealthSection
    readiness: ReadinessSection
    throughput: ThroughputSection
    tool_calls: ToolCallsSection
    reasoning: ReasoningSection
    memory: MemorySection
    fdlimit: FdLimitSection
    collectives: CollectivesSection
    structured_output: StructuredOutputSection
    slo: SloSection
    open_loop: OpenLoopSection
    soak: SoakSection
    prefix_cache: PrefixCacheSection
    long_context: LongContextSection
    metrics_health: MetricsHealthSection
    accuracy: AccuracySection
    known_bad: KnownBadSection
    spec_decode: SpecDecodeSection
    roofline: RooflineSection
    depth_sweep: DepthSweepSection


def _sections() -> dict[str, type[Section]]:
    hints = typing.get_type_hints(ProfileSections)
    found: dict[str, type[Section]] = {}
    for f in fields(ProfileSections):
        cls = hints[f.name]
        if not (isinstance(cls, type) and issubclass(cls, Section)):
            raise TypeError(f"ProfileSections.{f.name}: {cls!r} is not a Section dataclass")
        found[f.name] = cls
    return found


SECTIONS: dict[str, type[Section]] = _sections()  # {"link": LinkSection, ...}: the TOML tables


@cache
def section_hints(section: str) -> dict[str, object]:
    """``{key: type}`` of one section, in declaration order."""
    cls = SECTIONS[section]
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def known_keys() -> list[str]:
    """Every dotted key a profile has (``link.min_rate_gbps``, ...)."""
    return [f"{s}.{k}" for s in SECTIONS for k in section_hints(s)]
