"""Settings: every ``--spark-*`` option of the options table (``options.OPTIONS``), its ini
twin and its ``SPARK_*`` variable, resolved in one place into a frozen, typed ``Settings``
(one field per option) that remembers where each value came from.

Precedence: command line > environment > ini file > threshold profile > built-in default.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shlex
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from pytest_spark.settings.fromsparkrun import apply_cluster, apply_recipe
from pytest_spark.settings.options import OPTIONS, OPTIONS_BY_ATTR
from pytest_spark.settings.parsers import (
    AccuracyMode,
    DepthSweep,
    HostkeyCheck,
    LauncherName,
    ModelHash,
    RayMode,
    SimEngine,
    boolean,
)
from pytest_spark.settings.profiles import Profile, ProfileError, load_profile
from pytest_spark.settings.sparkrun import SparkRecipe


@dataclass(frozen=True)
class Settings:
    """Resolved settings: one typed field per entry of the options table (``OPTIONS``), with
    the same name and in the same order, then ``sources``: where each value came from
    (``source(attr)``: ``command line --spark-port``, ``environment SPARK_PORT``,
    ``spark_port in pytest.ini``, ``profile sim``, ``default``, ``sparksim``), for
    messages and the report. A value of the wrong type is refused when it is built."""

    head: str | None
    workers: tuple[str, ...]
    user: str | None
    cluster: str | None  # --spark-cluster: the saved sparkrun cluster's name
    recipe: SparkRecipe | None  # --spark-recipe, or the running sparkrun job's recipe
    ssh_key: Path | None
    ssh_config: Path
    connect_timeout: float
    command_timeout: float
    hostkey_check: HostkeyCheck
    profile: Profile  # --spark-profile loaded, the --spark-threshold overrides applied
    threshold: Mapping[str, str]
    fabric_ifs: tuple[str, ...]
    results: Path | None
    sim: bool
    sim_nodes: int
    sim_engine: SimEngine
    api_url: str | None
    api_key: str | None = field(repr=False)
    api_key_file: Path | None
    model: str | None
    port: int
    http_timeout: float
    launch: bool
    keep: bool
    launch_script: str
    launcher: LauncherName  # --spark-launcher: launch-cluster or sparkrun
    sparkrun: Path | None  # --spark-sparkrun: the sparkrun CLI (None: sparkrun on PATH)
    sparkrun_args: tuple[str, ...]  # --spark-sparkrun-args, after the suite's
    ray: RayMode
    serve_log: str | None
    launch_nodes: tuple[str, ...]
    image: str | None
    container: str
    job: str | None
    serve_args: str | None
    model_dir: str | None
    model_hash: ModelHash
    nccl_debug: str | None
    ready_timeout: float
    hang_timeout: float
    history: Path | None
    compare: str | None
    compare_fail: tuple[tuple[str, float], ...]
    soak: float | None
    accuracy: AccuracyMode
    accuracy_baseline: Path | None
    serving_concurrency: int
    open_loop: bool
    depth_sweep: DepthSweep | None
    arena: Path | None
    sources: Mapping[str, str] = field(repr=False)

    def __post_init__(self) -> None:
        hints = _field_types()
        for name, hint in hints.items():
            value = getattr(self, name)
            if not conforms(value, hint):
                source = self.sources.get(name, "?")
                shown = "***" if OPTIONS_BY_ATTR[name].secret else repr(value)
                raise TypeError(
                    f"setting {name} = {shown} (from {source}) is a "
                    f"{type(value).__name__}, expected {hint}"
                )
        missing = set(hints) - set(self.sources)
        if missing:
            raise TypeError(f"settings without a source: {', '.join(sorted(missing))}")

    def source(self, attr: str) -> str:
        """Where the value of ``attr`` came from."""
        return self.sources[attr]

    @property
    def api_only(self) -> bool:
        """``--spark-api-url`` alone: a server reached by its API, no cluster (no head, no
        sim): advice names what its operator can change, not nodes or ranks."""
        return self.api_url is not None and self.head is None and not self.sim

    def replace(self, **changes: Any) -> Settings:
        """A copy with some values set by the plugin itself (e.g. by --spark-sim)."""
        sources = {**self.sources, **dict.fromkeys(changes, "sparksim")}
        return dataclasses.replace(self, **changes, sources=sources)


@cache
def _field_types() -> dict[str, object]:
    """``{option attr: type}`` of Settings' option fields (all but ``sources``)."""
    hints = typing.get_type_hints(Settings)
    return {f.name: hints[f.name] for f in dataclasses.fields(Settings) if f.name != "sources"}


def conforms(value: object, hint: object) -> bool:
    """Whether ``value`` is of type ``hint`` (the few forms Settings' fields use)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, types.UnionType):
        return any(conforms(value, arg) for arg in args)
    if origin is typing.Literal:
        return value in args
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(conforms(v, args[0]) for v in value)
        return len(value) == len(args) and all(map(conforms, value, args))
    if origin is Mapping:
        return isinstance(value, Mapping) and all(
            conforms(k, args[0]) and conforms(v, args[1]) for k, v in value.items()
        )
    if hint is type(None):
        return value is None
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, float)
    assert isinstance(hint, type), hint
    return isinstance(value, hint)


def defaults(profile: Profile, source: str = "default") -> Settings:
    """Every option at its default (benchmarks and tests start from it: ``.replace``)."""
    values: dict[str, Any] = {o.attr: o.default for o in OPTIONS}
    values["profile"] = profile
    return Settings(**values, sources=dict.fromkeys(values, source))


SettingsError = pytest.UsageError  # a bad value, with its source named (UsageError is final)


def _ini_name(config: pytest.Config) -> str:
    inipath = getattr(config, "inipath", None)
    return inipath.name if inipath else "the ini file"


def sim_profile(engine: str, nodes: int) -> str:
    """The built-in profile of a ``--spark-sim`` cluster: real vLLM on CPU has its own;
    more than two nodes stand behind the sim's switch (its default topology there)."""
    if engine == "vllm-cpu":
        return "sim-vllm-cpu"
    return "sim-switch" if nodes > 2 else "sim"


def resolve(config: pytest.Config, environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve every option. Raises SettingsError naming the source of a bad value."""
    env = os.environ if environ is None else environ
    values, sources = _parsed(_given(config, env))
    apply_cluster(values, sources, env)  # --spark-cluster: head, workers, user
    head, workers = values["head"], values["workers"]
    if head is not None and head in workers:
        raise SettingsError(
            f"the head {head!r} (from {sources['head']}) is also given as a worker (from "
            f"{sources['workers']}): a node is the head or a worker, not both; leave it out "
            "of spark_workers"
        )
    refuse_sim_with_nodes(values, sources)
    if values["sim"] and sources["profile"] == "default":
        values["profile"] = sim_profile(values["sim_engine"], values["sim_nodes"])
        sources["profile"] = "default for --spark-sim"
    _apply_profile(values, sources)
    apply_recipe(values, sources, env)  # --spark-recipe or the running sparkrun job's
    return Settings(**values, sources=sources)


def _given(config: pytest.Config, env: Mapping[str, str]) -> dict[str, tuple[Any, str, bool]]:
    """``{attr: (value, source, needs parsing)}`` of every option given: on the command line,
    else in the environment, else in the ini file."""
    raw: dict[str, tuple[Any, str, bool]] = {}
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
    return raw


def _parsed(raw: Mapping[str, tuple[Any, str, bool]]) -> tuple[dict[str, Any], dict[str, str]]:
    """Every option's typed value and its source: the given ones parsed, the rest at their
    defaults."""
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
    return values, sources


def _apply_profile(values: dict[str, Any], sources: dict[str, str]) -> None:
    """Load the profile, apply --spark-threshold, then the figures that are the defaults of
    options not given (``profile_key``) and the depth sweep the profile runs."""
    try:
        loaded = load_profile(values["profile"])
    except ProfileError as exc:
        raise SettingsError(f"{exc} (from {sources['profile']})") from None
    try:
        values["profile"] = loaded.with_overrides(values["threshold"])
    except ProfileError as exc:
        raise SettingsError(f"{exc} (from {sources['threshold']})") from None
    for option in OPTIONS:
        if not option.profile_key or sources[option.attr] != "default":
            continue
        figure = values["profile"].value(option.profile_key)
        if figure is None:  # the profile leaves it to the option's default
            continue
        source = f"profile {loaded.name}"
        try:
            values[option.attr] = option.parse(str(figure))
        except ValueError as exc:
            raise SettingsError(
                f"Invalid value {figure!r} for {option.profile_key} from {source}: {exc}"
            ) from None
        sources[option.attr] = source
    sweep = values["profile"].depth_sweep
    if sweep.run and sources["depth_sweep"] == "default":  # the profile asks for the sweep
        values["depth_sweep"] = DepthSweep(
            depths=tuple(sweep.depths),
            pp=sweep.pp,
            tg=sweep.tg,
            concurrency=sweep.concurrency,
            cooldown_s=sweep.cooldown_s,
            runs=sweep.runs,
            prefix_caching=sweep.prefix_caching,
        )
        sources["depth_sweep"] = f"profile {loaded.name}"


def refuse_sim_with_nodes(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """--spark-sim stands up its own nodes: a head or workers given too would be replaced
    without a word, and the run would check the simulator, not them."""
    if not values["sim"]:
        return
    given = [attr for attr in ("head", "workers") if sources[attr] != "default"]
    if given:
        named = " and ".join(f"{OPTIONS_BY_ATTR[a].cli} (from {sources[a]})" for a in given)
        raise SettingsError(
            f"--spark-sim (from {sources['sim']}) stands up its own cluster and would replace "
            f"{named}: give one of them, --spark-sim to check the simulator or "
            f"{OPTIONS_BY_ATTR[given[0]].cli} without --spark-sim to check your nodes"
        )


REPEATABLE = frozenset({"threshold"})
SHOW_PROFILE = "spark_show_profile"  # --spark-show-profile: a command-line action, no ini twin


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
    group.addoption(
        "--spark-show-profile",
        action="store_true",
        default=False,
        dest=SHOW_PROFILE,
        help="print every threshold of the profile in effect (key, value, unit and where it "
        "came from: the profile file, ini, env or --spark-threshold) and exit; contacts nothing",
    )


ACTIVATING = ("head", "cluster", "api_url", "sim")  # what the suite needs to check anything
EMPTY_FORMS = {  # an activating variable set but empty, and how it is given a value
    "head": "SPARK_HEAD=HOST, the head's address or ssh_config alias",
    "api_url": "SPARK_API_URL=URL, the API's base URL",
}


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
    why = _asked_for_by_twin(config, env)
    empty = [attr for attr in EMPTY_FORMS if env.get(OPTIONS_BY_ATTR[attr].env) == ""]
    if why is None and empty:  # SPARK_HEAD=$HEAD with $HEAD unset: say so, not silence
        names = " and ".join(OPTIONS_BY_ATTR[attr].env for attr in empty)
        forms = " or ".join(EMPTY_FORMS[attr] for attr in empty)
        raise SettingsError(
            f"{names} {'is' if len(empty) == 1 else 'are'} set but empty: pytest-dgx-spark "
            f"has nothing to check. Give it a value ({forms}), or unset it to run without "
            "the plugin"
        )
    return why


def _asked_for_by_twin(config: pytest.Config, env: Mapping[str, str]) -> str | None:
    """Why ``--spark-head``, ``--spark-api-url`` or ``--spark-sim``'s env or ini twin asks
    for the plugin, or None."""
    for attr in ACTIVATING:
        option = OPTIONS_BY_ATTR[attr]
        raw = env.get(option.env, "")
        if raw:
            if not option.flag:
                return f"environment {option.env}"
            try:
                if boolean(raw):
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
