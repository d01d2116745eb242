"""Threshold profiles: TOML files of named figures, built in or given by path.

A profile is one typed section per TOML table (``profile.nccl.min_busbw_gbps: float``).
Each file is validated when it is read: an unknown table or key, or a value of the wrong
type, is a ProfileError naming the file, the key, the value and the type expected; a key
that neither the file nor the profile it ``extends`` sets, and that has no default here, is
one too. ``--spark-threshold KEY=VALUE`` overrides one figure by its dotted key
(``nccl.max_bytes=4194304``), the raw text coerced to that figure's type.
"""

from __future__ import annotations

import difflib
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeGuard

BUILTIN_PROFILES = (
    "dgx-spark-2node",
    "dgx-spark-switch",
    "sim",
    "sim-switch",
    "sim-vllm-cpu",
    "generic",
    "spark-arena-v2",
)


class ProfileError(ValueError):
    """A profile that cannot be found or read, or a bad threshold override."""


@dataclass(frozen=True)
class LinkSection:
    """``[link]``: the fabric ports (tests_infra/test_links.py)."""

    fabric_twins: int  # RoCE ports Up per node when --spark-fabric-ifs is not given
    min_rate_gbps: float
    min_mtu: int  # the MTU RoCE needs (a warning below it)
    hard_min_mtu: int  # below it nothing works (a failure)
    ping_count: int = 3


@dataclass(frozen=True)
class NcclSection:
    """``[nccl]``: the all-reduce sweep and its bus-bandwidth floors (GB/s)."""

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
class CollectivesSection:
    """``[collectives]``: the sweeps run in the all-reduce's launch (tests_infra/test_nccl.py):
    all_gather's busbw floor as a share of ``nccl.min_busbw_gbps`` (so a lowered all-reduce
    floor lowers it too) and the small-message latency sweep and its ceiling."""

    all_gather_busbw_ratio: float = 0.85
    max_latency_us: float | None = None  # best small-message all-reduce time; None: not checked
    latency_max_bytes: int = 1048576  # the latency sweep runs 8 B..this


@dataclass(frozen=True)
class PreflightSection:
    """``[preflight]``: per-node checks before anything is launched."""

    gpus_per_node: int
    max_disk_used_pct: float
    max_clock_skew_s: float
    max_link_flaps_24h: int
    nodes: int = 0  # the nodes the profile is for (0: any number); fewer given: a header line


@dataclass(frozen=True)
class GpuHealthSection:
    """``[gpu_health]``: temperature, clocks event reasons, persistence mode and the kernel
    log's Xid / NVRM errors (tests_infra/test_gpuhealth.py). A reason whose ``*_fails``
    is false warns instead of failing; idle, applications clocks, sync boost and display
    clocks are never a fault."""

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
class MemorySection:
    """``[memory]``: GB10 unified-memory headroom before a launch (tests_infra/test_memory.py)."""

    os_headroom_gib: float  # MemAvailable left after the engine's claim, for the OS
    max_swap_used_gib: float = 1.0  # swapped out above this: a warning
    top_holders: int = 3  # processes named in a failure


@dataclass(frozen=True)
class FdLimitSection:
    """``[fdlimit]``: the Docker engine's open-files limit, which containers inherit
    (tests_infra/test_fdlimit.py)."""

    min_open_files: int = 65535  # dockerd's hard RLIMIT_NOFILE floor (vLLM's set_ulimit)


@dataclass(frozen=True)
class ReadinessSection:
    """``[readiness]``: the startup wait. ``ready_timeout_s`` and ``hang_timeout_s`` are
    the defaults of --spark-ready-timeout and --spark-hang-timeout."""

    max_load_s: float  # launch to ready above this fails test_startup_within_budget
    ready_timeout_s: float | None = None
    hang_timeout_s: float | None = None
    placement_group_timeout_s: float = 120.0
    expected_gpus: float | None = None  # ray status GPUs; default: one per node


@dataclass(frozen=True)
class ThroughputSection:
    """``[throughput]``: the closed-loop sweep and its floors."""

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
class ToolCallsSection:
    """``[tool_calls]``: what the server was launched to do with tools."""

    expected: bool = True
    max_tokens: int = 1024
    request_timeout_s: float = 180.0
    require_streamed_arguments: bool = True
    auto_emits_calls: bool = True  # under tool_choice auto (a small model may not)


@dataclass(frozen=True)
class ReasoningSection:
    """``[reasoning]``: the reasoning parser's checks."""

    expected: bool = True
    max_tokens: int = 2048
    truncate_tokens: int = 8
    request_timeout_s: float = 300.0


@dataclass(frozen=True)
class StructuredOutputSection:
    """``[structured_output]``: response_format (json_schema, json_object) answers."""

    expected: bool = True  # false: the server is not asked to honour response_format
    max_tokens: int = 512  # room for the whole JSON (after any reasoning)
    request_timeout_s: float = 180.0


@dataclass(frozen=True)
class SloSection:
    """``[slo]``: per-request ceilings (seconds), each read at its percentile, and the goodput
    gate: the share of requests meeting every SLO (``vllm bench serve --goodput``) at the
    closed-loop level ``concurrency`` (tests_e2e/test_throughput.py::test_goodput) and at each
    open-loop rate (tests_e2e/test_open_loop.py::test_open_loop_knee)."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    ttft_pct: float = 99.0
    tpot_pct: float = 99.0
    e2e_pct: float = 99.0
    min_goodput_pct: float = 95.0
    concurrency: int = 4  # the closed-loop sweep's level the goodput gate reads


@dataclass(frozen=True)
class OpenLoopSection:
    """``[open_loop]``: the Poisson request-rate sweep of --spark-open-loop (rates rise by
    ``rate_factor`` until a level's goodput breaks the SLOs) and its knee's floor."""

    start_rate: float = 0.1  # req/s
    rate_factor: float = 2.0
    max_levels: int = 6
    requests_per_level: int = 16
    seed: int = 1
    burstiness: float = 1.0  # 1: Poisson (vllm bench serve's --burstiness)
    min_knee_req_s: float | None = None  # None: the knee is reported, not gated


@dataclass(frozen=True)
class SoakSection:
    """``[soak]``: the steady load of --spark-soak=DURATION and what fails it."""

    concurrency: int = 4
    window_s: float = 60.0  # tok/s is compared between the first and the last window
    max_drift_pct: float = 10.0  # tok/s of the last window below the first by more: fail
    max_waiting_growth: float = 1.0  # vllm:num_requests_waiting, last window's mean - first's
    max_preemptions: int = 0  # vllm:num_preemptions grown during the soak


@dataclass(frozen=True)
class PrefixCacheSection:
    """``[prefix_cache]``: two requests sharing a long prefix (issue #16 section 6)."""

    expected: bool = True  # the server runs with prefix caching (vLLM's default)
    prefix_tokens: int = 2048  # the shared prefix's length (words; ~1 token each)
    request_timeout_s: float = 120.0


@dataclass(frozen=True)
class LongContextSection:
    """``[long_context]``: a request near max_model_len, and one just over it."""

    fill: float = 0.9  # the near-limit prompt's share of max_model_len
    needle: bool = True  # the model can answer a needle question from the long prompt
    max_tokens: int = 64
    request_timeout_s: float = 300.0


@dataclass(frozen=True)
class MetricsHealthSection:
    """``[metrics_health]``: /metrics around each throughput level (issue #16 section 7;
    tests_e2e/test_throughput.py::test_metrics_health_during_sweep)."""

    max_preemptions: int = 0  # vllm:num_preemptions growth per level
    max_drain_s: float = 5.0  # vllm:num_requests_waiting back to 0 after a level


# What a known-bad-version rule can name (pytest_spark.infra.knownbad reads each from the
# nodes-alike facts): the NVIDIA driver, the kernel release, the DGX OS release
# (/etc/dgx-release), the ConnectX-7 firmware (ethtool -i) and the NCCL library the serving
# image loads (its version string, or its build by sha256).
RULE_COMPONENTS = ("driver", "kernel", "dgx-os", "cx7-firmware", "nccl")


@dataclass(frozen=True)
class VersionRule:
    """One ``[[known_bad.deny]]`` or ``[[known_bad.allow]]`` entry. ``match``: any of its
    patterns matching the node's value matches (pytest_spark.infra.knownbad.parse says the
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
class KnownBadSection:
    """``[known_bad]``: versions known to break a Spark cluster, each with its public source
    (tests_infra/test_alike.py::test_no_known_bad_versions). A profile's ``deny`` and
    ``allow`` entries add to those of the profile it extends; an allow entry that matches a
    node's value overrides every deny entry of that component there."""

    deny: tuple[VersionRule, ...] = ()
    allow: tuple[VersionRule, ...] = ()


@dataclass(frozen=True)
class SpecDecodeSection:
    """``[spec_decode]``: speculative decoding read from /metrics around the throughput
    levels (issue #27 part 1; tests_e2e/test_throughput.py::test_spec_decode_acceptance),
    checked only when the server drafts (--speculative-config, or the counters on /metrics).
    ``no_draft_tok_s``: single-stream decode without drafting, the figure a collapse falls
    under (None: ``throughput.min_decode_tok_s_1``)."""

    min_acceptance: float = 0.5  # accepted / draft tokens over the sweep
    no_draft_tok_s: float | None = None


@dataclass(frozen=True)
class RooflineSection:
    """``[roofline]``: single-stream decode as a fraction of the memory-bandwidth roofline
    (issue #27 part 3; pytest_spark.serving.load.roofline). ``active_params_b``: the
    model's active parameters (billions), used when neither its name nor its config.json
    tells them."""

    bandwidth_gbs: float = 273.0  # one node's memory bandwidth (DGX Spark LPDDR5x)
    active_params_b: float | None = None


class Depths(tuple[int, ...]):
    """Context depths in tokens: a list of integers, 0 (no context) or more."""


ARENA_V2_DEPTHS = Depths((0, 4096, 8192, 16384, 32768, 65535, 100000))


@dataclass(frozen=True)
class DepthSweepSection:
    """``[depth_sweep]``: the depth x concurrency sweep in the Spark Arena's shape
    (tests_e2e/test_depth_sweep.py, pytest_spark.serving.load.depth). ``run``: the profile
    runs it (as ``--spark-depth-sweep``, which overrides it); the figures are
    spark-arena/recipe-registry ``benchmarking/spark-arena-v2.yaml``'s, ``runs`` llama-benchy's
    ``--runs`` default."""

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
class AccuracySection:
    """``[accuracy]``: does the model answer correctly (tests_e2e/test_accuracy.py, issue
    #24). ``canaries``: the built-in canaries this model is expected to answer
    (pytest_spark.serving.validate.accuracy.CANARY_KINDS; an empty list: none, the fingerprint alone
    then reads the model's numbers). The fingerprint tolerances are set from the spread of
    healthy runs (the profile says where it was measured); the math floor is
    ``math_expected - math_tolerance`` (vLLM's tests/evals/gsm8k: 0.08)."""

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


Section = (
    LinkSection
    | NcclSection
    | PreflightSection
    | GpuHealthSection
    | ReadinessSection
    | MemorySection
    | FdLimitSection
    | ThroughputSection
    | ToolCallsSection
    | ReasoningSection
    | CollectivesSection
    | StructuredOutputSection
    | SloSection
    | OpenLoopSection
    | SoakSection
    | PrefixCacheSection
    | LongContextSection
    | MetricsHealthSection
    | AccuracySection
    | KnownBadSection
    | SpecDecodeSection
    | RooflineSection
    | DepthSweepSection
)


@dataclass(frozen=True)
class Profile:
    """A threshold profile: its name, where it came from, one typed section per table."""

    name: str
    origin: str
    link: LinkSection
    nccl: NcclSection
    preflight: PreflightSection
    gpu_health: GpuHealthSection
    readiness: ReadinessSection
    throughput: ThroughputSection
    tool_calls: ToolCallsSection
    reasoning: ReasoningSection
    memory: MemorySection
    fdlimit: FdLimitSection = field(default_factory=FdLimitSection)
    collectives: CollectivesSection = field(default_factory=CollectivesSection)
    structured_output: StructuredOutputSection = field(default_factory=StructuredOutputSection)
    slo: SloSection = field(default_factory=SloSection)
    open_loop: OpenLoopSection = field(default_factory=OpenLoopSection)
    soak: SoakSection = field(default_factory=SoakSection)
    prefix_cache: PrefixCacheSection = field(default_factory=PrefixCacheSection)
    long_context: LongContextSection = field(default_factory=LongContextSection)
    metrics_health: MetricsHealthSection = field(default_factory=MetricsHealthSection)
    accuracy: AccuracySection = field(default_factory=AccuracySection)
    known_bad: KnownBadSection = field(default_factory=KnownBadSection)
    spec_decode: SpecDecodeSection = field(default_factory=SpecDecodeSection)
    roofline: RooflineSection = field(default_factory=RooflineSection)
    depth_sweep: DepthSweepSection = field(default_factory=DepthSweepSection)
    overridden: frozenset[str] = field(default_factory=frozenset)
    # {dotted key: the file that set it}: "built-in profile sim" or a path; a key no file
    # sets is at its default here (--spark-show-profile says which)
    set_by: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def value(self, key: str) -> object:
        """One figure by its dotted key (``nccl.max_bytes``), for --spark-threshold and
        the options that default to a figure. Code that knows the figure reads the
        attribute (``profile.nccl.max_bytes``)."""
        section, name = _split(key, self.name)
        return getattr(getattr(self, section), name)

    def with_overrides(self, overrides: Mapping[str, str]) -> Profile:
        """Override single figures; each raw string is coerced to the figure's type."""
        changed: dict[str, dict[str, object]] = {}
        for key, raw in overrides.items():
            section, name = _split(key, self.name)
            hint = section_hints(section)[name]
            try:
                value = _from_text(raw, hint)
            except ValueError:
                raise ProfileError(f"threshold {key}={raw!r}: expected {_describe(hint)}") from None
            wrong = out_of_range(key, value)
            if wrong:
                raise ProfileError(f"threshold {key}={raw!r}: {wrong}")
            changed.setdefault(section, {})[name] = value
        sections: dict[str, Any] = {
            s: replace(getattr(self, s), **values) for s, values in changed.items()
        }
        return replace(self, **sections, overridden=self.overridden | set(overrides))


_PROFILE_HINTS = typing.get_type_hints(Profile)
SECTIONS: dict[str, type[Section]] = {
    f.name: _PROFILE_HINTS[f.name]
    for f in fields(Profile)
    if f.name not in ("name", "origin", "overridden", "set_by")
}  # {"link": LinkSection, ...}: the TOML tables, from Profile's fields
_HEADER = ("name", "description", "extends")


@cache
def section_hints(section: str) -> dict[str, object]:
    """``{key: type}`` of one section, in declaration order."""
    cls = SECTIONS[section]
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def known_keys() -> list[str]:
    """Every dotted key a profile has (``link.min_rate_gbps``, ...)."""
    return [f"{s}.{k}" for s in SECTIONS for k in section_hints(s)]


def _split(key: str, profile: str) -> tuple[str, str]:
    section, _, name = key.partition(".")
    if section in SECTIONS and name in section_hints(section):
        return section, name
    if section in SECTIONS:  # a known table: its own keys, a handful
        close = difflib.get_close_matches(name, list(section_hints(section)), n=1)
        hint = f" (did you mean {section}.{close[0]}?)" if close else ""
        raise ProfileError(
            f"unknown threshold {key!r}{hint}; [{section}] has: {', '.join(section_hints(section))}"
        )
    close = difflib.get_close_matches(key, known_keys(), n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ProfileError(
        f"unknown threshold {key!r}: {hint}a key is TABLE.KEY, the tables are "
        f"{', '.join(SECTIONS)} (profile {profile!r}; with a table's name right, its keys "
        "are listed)"
    )


def out_of_range(key: str, value: object) -> str | None:
    """Why a figure's value can never be right, or None: no figure is negative (a floor, a
    ceiling, a count, a duration), and a timeout of 0 s would fail every request."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        if isinstance(value, tuple):
            return next((out_of_range(key, v) for v in value if out_of_range(key, v)), None)
        return None
    if value != value:  # NaN
        return "not a number"
    if value < 0:
        return f"{value:g} is negative: expected 0 or more"
    if value == 0 and "timeout" in key.rpartition(".")[2]:
        return "a timeout of 0 s fails every request: expected a positive number of seconds"
    return None


def _inner(hint: object) -> object:
    """``float | None`` -> ``float`` (TOML has no null: a value given is the type itself)."""
    if isinstance(hint, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0]
    return hint


def _describe(hint: object) -> str:
    hint = _inner(hint)
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint == tuple[VersionRule, ...]:
        return (
            "a list of tables ([[TABLE.KEY]] entries, set in a profile file), each with "
            f"component (one of {', '.join(RULE_COMPONENTS)}), match (a list of strings) and "
            "the strings reason, source, scope, fix"
        )
    if hint is Depths:
        return (
            "a list of integers, 0 or more (in a profile [0, 4096]; on the command line "
            f"{LIST_FORMS.format(0, 4096)})"
        )
    if hint == tuple[str, ...]:
        return (
            'a list of names (in a profile ["add", "count"]; on the command line '
            f"{LIST_FORMS.format('add', 'count')})"
        )
    if typing.get_origin(hint) is tuple:
        return (
            "a list of positive integers (in a profile [1, 4, 16]; on the command line "
            f"{LIST_FORMS.format(1, 4)})"
        )
    return str(hint)


def _positive_ints(value: object) -> TypeGuard[list[int]]:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
    )


def _names(value: object) -> TypeGuard[list[str]]:
    """A list of names (possibly empty: "none of them")."""
    return isinstance(value, list) and all(
        isinstance(v, str) and v.strip() and v == v.strip() for v in value
    )


def _from_toml(value: object, hint: object) -> object:
    """A TOML value as the type ``hint`` says, or ValueError (a boolean is no number)."""
    hint = _inner(hint)
    if isinstance(value, bool):
        if hint is bool:
            return value
    elif hint is int and isinstance(value, int):
        return value
    elif hint is float and isinstance(value, int | float):
        return float(value)
    elif hint == tuple[VersionRule, ...]:
        if isinstance(value, list):
            return tuple(_rule(v) for v in value)
    elif hint == tuple[str, ...]:
        if _names(value):
            return tuple(value)
    elif hint is Depths:
        if isinstance(value, list) and _positive_ints(  # 0 or more each
            [v + 1 if type(v) is int else v for v in value]
        ):
            return Depths(value)
    elif typing.get_origin(hint) is tuple and _positive_ints(value):
        return tuple(value)
    raise ValueError(hint)


def _rule(value: object) -> VersionRule:
    """One known-bad entry from its TOML table, or ValueError."""
    if not isinstance(value, Mapping) or not set(value) <= RULE_KEYS:
        raise ValueError(value)
    if value.get("component") not in RULE_COMPONENTS or not _names(value.get("match")):
        raise ValueError(value)
    if not all(isinstance(v, str) for k, v in value.items() if k != "match"):
        raise ValueError(value)
    return VersionRule(**{**value, "match": tuple(value["match"])})


# How a list is written in --spark-threshold (and its ini and env twins): the items
# separated by commas or semicolons, optionally in brackets.
LIST_FORMS = "KEY={0},{1} or KEY={0};{1} or KEY=[{0},{1}]"


def _from_text(raw: str, hint: object) -> object:
    """A ``--spark-threshold`` value as the type ``hint`` says, or ValueError. A list is
    ``1,4``, ``1;4`` or ``[1,4]`` (names may be quoted: ``["add","count"]``)."""
    hint = _inner(hint)
    text = raw.strip()
    listed = typing.get_origin(hint) is tuple or (
        isinstance(hint, type) and issubclass(hint, tuple)
    )
    if listed and text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if hint is bool:
        low = text.lower()
        if low not in {"true", "false", "1", "0", "yes", "no"}:
            raise ValueError(raw)
        return low in {"true", "1", "yes"}
    if hint is int:
        return int(text)
    if hint is float:
        return float(text)
    if hint == tuple[str, ...]:
        names = [
            item.strip().strip("'\"")
            for item in text.replace(";", ",").split(",")
            if item.strip().strip("'\"")
        ]
        return _from_toml(names, hint)
    if typing.get_origin(hint) is tuple or hint is Depths:
        items = [int(item) for item in text.replace(";", ",").split(",") if item.strip()]
        return _from_toml(items, hint)
    raise ValueError(raw)


def _shown(value: object) -> str:
    kind = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    what = kind.get(type(value), "a list" if isinstance(value, list) else "a table")
    return f"{value!r} ({what})"


def _validate(data: Mapping[str, object], origin: str) -> dict[str, dict[str, object]]:
    """One file's tables, each value converted to its key's type; errors name the file."""
    tables: dict[str, dict[str, object]] = {}
    for section, table in data.items():
        if section in _HEADER:
            continue
        if section not in SECTIONS:
            close = difflib.get_close_matches(section, list(SECTIONS), n=1)
            hint = f" (did you mean [{close[0]}]?)" if close else ""
            raise ProfileError(
                f"{origin}: unknown key {section!r}{hint}; a profile has the tables "
                f"{', '.join(f'[{s}]' for s in SECTIONS)} and name, description, extends"
            )
        if not isinstance(table, Mapping):
            raise ProfileError(
                f"{origin}: {section} = {_shown(table)}: expected a table [{section}]"
            )
        hints = section_hints(section)
        converted: dict[str, object] = {}
        for key, value in table.items():
            if key not in hints:
                close = difflib.get_close_matches(key, list(hints), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ProfileError(
                    f"{origin}: unknown key [{section}] {key}{hint}; [{section}] has: "
                    f"{', '.join(hints)}"
                )
            try:
                converted[key] = _from_toml(value, hints[key])
            except ValueError:
                raise ProfileError(
                    f"{origin}: [{section}] {key} = {_shown(value)}: expected "
                    f"{_describe(hints[key])}"
                ) from None
            wrong = out_of_range(f"{section}.{key}", converted[key])
            if wrong:
                raise ProfileError(f"{origin}: [{section}] {key} = {value!r}: {wrong}")
        tables[section] = converted
    for key in _HEADER:
        if key in data and not isinstance(data[key], str):
            raise ProfileError(f"{origin}: {key} = {_shown(data[key])}: expected a string")
    return tables


@cache
def builtin_profiles() -> dict[str, str]:
    """``{name: description}`` of every built-in profile, read from the files in
    ``pytest_spark/settings/profiles/`` (the folder is the list): the real clusters' first,
    then sparksim's."""
    folder = resources.files("pytest_spark").joinpath("settings/profiles")
    names = [e.name.removesuffix(".toml") for e in folder.iterdir() if e.name.endswith(".toml")]
    found: dict[str, str] = {}
    for name in sorted(names, key=lambda n: (n.startswith("sim"), n)):
        data = tomllib.loads(folder.joinpath(f"{name}.toml").read_text())
        found[name] = str(data.get("description", ""))
    return found


def _read(
    ref: str, seen: tuple[str, ...] = ()
) -> tuple[str, str, dict[str, dict[str, object]], dict[str, str]]:
    """The profile's name, its origin, its tables (``extends`` merged) and which file
    set each key (``{"link.min_rate_gbps": "built-in profile dgx-spark-2node"}``)."""
    if ref in seen:
        raise ProfileError(f"profile {ref!r} extends itself (via {' -> '.join(seen)})")
    if ref in builtin_profiles():
        text = resources.files("pytest_spark").joinpath(f"settings/profiles/{ref}.toml").read_text()
        origin = f"built-in profile {ref}"
    else:
        path = Path(ref).expanduser()
        if not path.is_file():
            raise ProfileError(
                f"no profile {ref!r}: not a built-in ({', '.join(builtin_profiles())}) "
                "and no such file"
            )
        origin = str(path)
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            line = path.read_bytes()[: exc.start].count(b"\n") + 1
            raise ProfileError(
                f"{origin}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} on line "
                f"{line}): TOML files are UTF-8; save it as UTF-8"
            ) from None
        except OSError as exc:
            raise ProfileError(f"{origin}: cannot read it: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{origin}: invalid TOML: {exc}") from None
    own = _validate(data, origin)
    name = str(data.get("name", Path(ref).stem))
    tables: dict[str, dict[str, object]] = {}
    set_by: dict[str, str] = {}
    if "extends" in data:
        parent = str(data["extends"])
        try:
            tables, set_by = _read(parent, (*seen, ref))[2:]
        except ProfileError as exc:
            if not str(exc).startswith(f"no profile {parent!r}"):
                raise  # a mistake inside that profile: its message names its own file
            raise ProfileError(f"{origin}: extends = {parent!r}: {exc}") from None
    for section, values in own.items():
        table = tables.setdefault(section, {})
        for key, value in values.items():
            # rule lists ([[known_bad.deny]]) add to the parent's; other figures replace
            adds = section_hints(section)[key] == tuple[VersionRule, ...]
            table[key] = (*table.get(key, ()), *value) if adds else value  # type: ignore[misc]
            dotted = f"{section}.{key}"  # moved last: the setters' order is the chain's
            before = set_by.pop(dotted, None)
            set_by[dotted] = f"{before} + {origin}" if adds and before else origin
    return name, origin, tables, set_by


def load_profile(ref: str) -> Profile:
    """Load a built-in profile by name or a TOML file by path (``extends`` honoured)."""
    name, origin, tables, set_by = _read(ref)

    def given(section: str) -> dict[str, Any]:
        values = tables.get(section, {})
        for f in fields(SECTIONS[section]):
            if f.name not in values and f.default is MISSING:
                expected = _describe(section_hints(section)[f.name])
                raise ProfileError(
                    f"{origin}: [{section}] {f.name} is not set ({expected}); set it, or "
                    'extend a built-in profile (extends = "dgx-spark-2node")'
                )
        return values

    return Profile(
        name,
        origin,
        set_by=set_by,
        link=LinkSection(**given("link")),
        nccl=NcclSection(**given("nccl")),
        preflight=PreflightSection(**given("preflight")),
        gpu_health=GpuHealthSection(**given("gpu_health")),
        readiness=ReadinessSection(**given("readiness")),
        throughput=ThroughputSection(**given("throughput")),
        tool_calls=ToolCallsSection(**given("tool_calls")),
        reasoning=ReasoningSection(**given("reasoning")),
        memory=MemorySection(**given("memory")),
        fdlimit=FdLimitSection(**given("fdlimit")),
        collectives=CollectivesSection(**given("collectives")),
        structured_output=StructuredOutputSection(**given("structured_output")),
        slo=SloSection(**given("slo")),
        open_loop=OpenLoopSection(**given("open_loop")),
        soak=SoakSection(**given("soak")),
        prefix_cache=PrefixCacheSection(**given("prefix_cache")),
        long_context=LongContextSection(**given("long_context")),
        metrics_health=MetricsHealthSection(**given("metrics_health")),
        accuracy=AccuracySection(**given("accuracy")),
        known_bad=KnownBadSection(**given("known_bad")),
        spec_decode=SpecDecodeSection(**given("spec_decode")),
        roofline=RooflineSection(**given("roofline")),
        depth_sweep=DepthSweepSection(**given("depth_sweep")),
    )
