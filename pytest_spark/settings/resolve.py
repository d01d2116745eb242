"""Settings: every ``--spark-*`` option, its ini twin and its ``SPARK_*`` variable,
resolved in one place into a frozen object that remembers where each value came from.

Precedence: command line > environment > ini file > threshold profile > built-in default.
"""

from __future__ import annotations

import itertools
import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_spark.settings.options import compare_fail, history_dir, run_ref
from pytest_spark.settings.profiles import Profile, ProfileError, load_profile

Parse = Callable[[str], Any]


def _seconds(raw: str) -> float:
    text = raw.strip().lower()
    scale = 1.0
    for suffix, factor in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if text.endswith(suffix):
            text, scale = text[: -len(suffix)], factor
            break
    value = float(text) * scale
    if not value > 0:
        raise ValueError("must be a positive number of seconds (e.g. 10, 2.5, 30s, 20m)")
    return value


def _port(raw: str) -> int:
    value = int(raw)
    if not 0 < value < 65536:
        raise ValueError("must be a TCP port between 1 and 65535")
    return value


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError("must be a positive integer")
    return value


def _nodes(raw: str) -> int:
    value = int(raw)
    if value < 2:
        raise ValueError("a cluster has at least 2 nodes")
    return value


SIM_ENGINES = ("emulator", "vllm-cpu")


def _sim_engine(raw: str) -> str:
    value = raw.strip().lower()
    if value not in SIM_ENGINES:
        raise ValueError(
            f"must be one of {', '.join(SIM_ENGINES)} (vllm-cpu needs scripts/setup-vllm-cpu)"
        )
    return value


def _host(raw: str) -> str:
    host = raw.strip()
    if not host or any(c.isspace() for c in host) or host.startswith("-"):
        raise ValueError("must be a host name, address or ssh_config alias")
    return host


def _host_list(raw: str) -> tuple[str, ...]:
    items = [part for part in raw.replace("\n", ",").split(",") if part.strip()]
    return tuple(_host(part) for part in items)


def _name_list(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.replace("\n", ",").split(",") if part.strip())


def _bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in {"1", "true", "yes", "on"}:
        return True
    if low in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError("must be true or false")


def _hostkey_check(raw: str) -> str:
    value = raw.strip().lower()
    if value not in {"strict", "off"}:
        raise ValueError("must be 'strict' (default) or 'off'")
    return value


def _thresholds(raw: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in raw.replace("\n", ",").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"{item.strip()!r} is not KEY=VALUE (e.g. link.min_rate_gbps=100)")
        out[key.strip()] = value.strip()
    return out


def _url(raw: str) -> str:
    url = raw.strip().rstrip("/")
    if not url.startswith(("http://", "https://")) or len(url.split("//", 1)[1]) == 0:
        raise ValueError("must be an http(s) URL such as http://127.0.0.1:8000")
    return url.removesuffix("/v1")


def _text(raw: str) -> str:
    return raw


def _remote_path(raw: str) -> str:
    path = raw.strip().rstrip("/") or raw.strip()
    if not path.startswith("/") or any(c in path for c in "\n\0"):
        raise ValueError("must be an absolute path on the nodes (e.g. /data/models/NAME)")
    return path


RAY_MODES = ("auto", "on", "off")


def _ray_mode(raw: str) -> str:
    value = raw.strip().lower()
    if value not in RAY_MODES:
        raise ValueError(
            "must be auto (from the serve args or the containers' processes), on (Ray) or "
            "off (no Ray: torch.distributed ranks, launch-cluster.sh's default)"
        )
    return value


def _head_path(raw: str) -> str:
    path = raw.strip()
    if not path.startswith(("/", "~/")) or any(c in path for c in "\n\0"):
        raise ValueError("must be an absolute path on the head, or ~/PATH (e.g. ~/cluster.log)")
    return path


def _path(raw: str) -> Path:
    if not raw.strip():
        raise ValueError("must be a path")
    return Path(raw.strip()).expanduser()


@dataclass(frozen=True)
class Option:
    """One setting: ``--spark-<noun>``, ini ``spark_<noun>``, env ``SPARK_<NOUN>``."""

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
    Option("ssh-key", _path, None, "SSH private key (default: ssh_config IdentityFile)", "PATH"),
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
        "threshold profile: a built-in name (dgx-spark-2node, sim) or a TOML file",
        "NAME|PATH",
    ),
    Option(
        "threshold",
        _thresholds,
        {},
        "override single thresholds of the profile",
        "KEY=VALUE[,KEY=VALUE...]",
    ),
    Option(
        "fabric-ifs",
        _name_list,
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
    Option("container", _text, "vllm_node", "serving container name on every node", "NAME"),
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
        "tok/s, TTFT, TPOT, load phases) here, one JSON file per run; 'off' keeps none",
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
        "than PCT against the compared run (implies --spark-compare); METRIC is busbw, "
        "tok_s, ttft, tpot, load or one figure such as tok_s@4",
        "METRIC:PCT[,METRIC:PCT]",
    ),
)

OPTIONS_BY_ATTR = {option.attr: option for option in OPTIONS}


@dataclass(frozen=True)
class Settings:
    """Resolved settings. ``sources[attr]`` says where each value came from."""

    values: Mapping[str, Any]
    sources: Mapping[str, str]
    profile: Profile
    secrets: frozenset[str] = field(default_factory=frozenset)

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "values")
        try:
            return values[name]
        except KeyError:
            raise AttributeError(name) from None

    def source(self, attr: str) -> str:
        return self.sources[attr]

    def replace(self, **changes: Any) -> Settings:
        """A copy with some values set by the plugin itself (e.g. by --spark-sim)."""
        values = dict(self.values)
        sources = dict(self.sources)
        for key, value in changes.items():
            values[key] = value
            sources[key] = "sparksim"
        return Settings(values, sources, self.profile, self.secrets)


SettingsError = pytest.UsageError  # a bad value, with its source named (UsageError is final)


def _ini_name(config: pytest.Config) -> str:
    inipath = getattr(config, "inipath", None)
    return inipath.name if inipath else "the ini file"


def resolve(config: pytest.Config, environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve every option. Raises SettingsError naming the source of a bad value."""
    env = os.environ if environ is None else environ
    raw: dict[str, tuple[Any, str, bool]] = {}  # attr -> (value, source, needs parsing)
    for option in OPTIONS:
        cli_value = config.getoption(option.dest, default=None)
        if isinstance(cli_value, list):  # a repeatable option given several times
            cli_value = ",".join(cli_value)
        if cli_value is not None and cli_value is not False:
            raw[option.attr] = (cli_value, f"command line {option.cli}", not option.flag)
        elif env.get(option.env) not in (None, ""):
            raw[option.attr] = (env[option.env], f"environment {option.env}", True)
        else:
            ini_value = config.getini(option.ini)
            if ini_value not in (None, "", [], False) or (
                option.flag and str(ini_value).lower() == "false"
            ):
                if isinstance(ini_value, list):
                    ini_value = ",".join(str(v) for v in ini_value)
                raw[option.attr] = (
                    ini_value,
                    f"{option.ini} in {_ini_name(config)}",
                    not isinstance(ini_value, bool),
                )
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for option in OPTIONS:
        if option.attr in raw:
            value, source, needs_parsing = raw[option.attr]
            if needs_parsing:
                try:
                    value = option.parse(str(value))
                except ValueError as exc:
                    shown = "***" if option.secret else str(value)
                    raise SettingsError(
                        f"Invalid value {shown!r} for {option.ini} from {source}: {exc}"
                    ) from None
            values[option.attr], sources[option.attr] = value, source
        else:
            values[option.attr], sources[option.attr] = option.default, "default"

    if values["sim"] and sources["profile"] == "default":
        sim_profile = "sim-vllm-cpu" if values["sim_engine"] == "vllm-cpu" else "sim"
        values["profile"], sources["profile"] = sim_profile, "default for --spark-sim"
    try:
        profile = load_profile(values["profile"]).with_overrides(values["threshold"])
    except ProfileError as exc:
        culprit = "threshold" if "threshold" in str(exc) else "profile"
        raise SettingsError(f"{exc} (from {sources[culprit]})") from None
    for option in OPTIONS:
        if (
            option.profile_key
            and sources[option.attr] == "default"
            and (option.profile_key in profile.values)
        ):
            values[option.attr] = option.parse(str(profile[option.profile_key]))
            sources[option.attr] = f"profile {profile.name}"
    secrets = frozenset(o.attr for o in OPTIONS if o.secret)
    return Settings(values, sources, profile, secrets)


REPEATABLE = frozenset({"threshold"})


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("spark", "DGX Spark cluster checks (pytest-dgx-spark)")
    for option in OPTIONS:
        shown = "" if option.default in (None, (), {}) else f" (default: {option.default})"
        help_text = f"{option.help}{shown}; ini {option.ini}, env {option.env}"
        if option.flag:
            group.addoption(
                option.cli, action="store_true", default=None, dest=option.dest, help=help_text
            )
        elif option.const is not None:
            group.addoption(
                option.cli,
                action="store",
                nargs="?",
                const=option.const,
                default=None,
                dest=option.dest,
                metavar=option.metavar,
                help=help_text,
            )
        else:
            group.addoption(
                option.cli,
                # --spark-threshold A=1 --spark-threshold B=2 means both, not the last one
                action="append" if option.attr in REPEATABLE else "store",
                default=None,
                dest=option.dest,
                metavar=option.metavar,
                help=help_text,
            )
        parser.addini(option.ini, help=option.help, type=option.ini_type, default=None)  # type: ignore[arg-type]


ACTIVATING = ("head", "api_url", "sim")  # what the suite needs to check anything


def asked_for(config: pytest.Config, environ: Mapping[str, str] | None = None) -> str | None:
    """Why the plugin is active, or None: installed but not asked for, it stays out of the
    way of other suites (testinfra's ``host``, ``--hosts=...``). Asked for means any
    ``--spark-*`` option on the command line, or ``--spark-head``, ``--spark-api-url`` or
    ``--spark-sim`` through their environment or ini twins. Only those three are read
    here, so a stray ``SPARK_*`` variable of another option changes nothing."""
    env = os.environ if environ is None else environ
    for option in OPTIONS:
        if config.getoption(option.dest, default=None) not in (None, False):
            return f"command line {option.cli}"
    for attr in ACTIVATING:
        option = OPTIONS_BY_ATTR[attr]
        raw = env.get(option.env, "")
        if raw:
            if not option.flag:
                return f"environment {option.env}"
            try:
                if _bool(raw):
                    return f"environment {option.env}"
            except ValueError as exc:
                raise SettingsError(
                    f"Invalid value {raw!r} for {option.ini} from environment {option.env}: {exc}"
                ) from None
        ini_value = config.getini(option.ini)
        if ini_value is True or (not option.flag and ini_value not in (None, "", [])):
            return f"{option.ini} in {_ini_name(config)}"
    return None


def spaced_path_values(args: list[str], cwd: Path) -> list[tuple[str, str]]:
    """``(option, value)`` for each ``--spark-<noun> VALUE`` (space, not ``=``) whose value
    names an existing file or directory. pytest decides its rootdir and ini file before
    any plugin's options exist: it reads such a value as a test path, as it reads every
    token not starting with ``-`` that exists on disk (``198.18.0.11`` does not, so it is
    harmless). The rootdir then follows that path instead of the working directory."""
    takes_value = {option.cli for option in OPTIONS if not option.flag}
    found: list[tuple[str, str]] = []
    for option, value in itertools.pairwise(args):
        if option == "--":
            break
        if option not in takes_value or value.startswith("-"):
            continue
        path = Path(value.split("::", 1)[0])
        try:
            exists = (path if path.is_absolute() else cwd / path).exists()
        except OSError:
            exists = False
        if exists:
            found.append((option, value))
    return found


def refuse_spaced_paths(config: pytest.Config, environ: Mapping[str, str] | None = None) -> None:
    """Fail at start-up, before anything is collected or contacted, when a ``--spark-*``
    value was written with a space and pytest took it for a test path."""
    env = os.environ if environ is None else environ
    args = shlex.split(env.get("PYTEST_ADDOPTS", "")) + list(config.invocation_params.args)
    found = spaced_path_values(args, config.invocation_params.dir)
    if not found:
        return
    shown = ", ".join(f"{option} {value}" for option, value in found)
    fixed = " ".join(f"{option}={value}" for option, value in found)
    raise SettingsError(
        f"{shown}: pytest took the value for a test path (it picks its rootdir and ini file "
        "from the paths on the command line before the plugin's options exist, so they "
        f"follow that path: rootdir {config.rootpath}, ini file {config.inipath or 'none'}; "
        "the project's testpaths may be lost and the wrong tests collected). "
        f"Write the value with '=': {fixed}"
    )
