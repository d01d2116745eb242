"""sparkrun's state on the operator's machine, read as data: saved clusters, the running
jobs' files and v2 recipes (REFERENCE.md 6a; field names as PyPI ``sparkrun`` 0.4.2 writes
and reads them). Pure readers: ``yaml.safe_load`` only; a recipe's ``command`` is filled
with plain ``{key}`` substitution of its defaults and read for flags, never run; its
hooks (``pre_exec``, ``post_exec``, ``mods``, ``executor_config``) are not read at all.

Where sparkrun keeps them (0.4.2, ``core/config.py``; not the XDG variables):

- clusters: ``$SPARKRUN_CONFIG_DIR`` or ``~/.config/sparkrun``, then ``clusters/NAME.yaml``
  and ``clusters/.default`` (the default cluster's name);
- jobs: the cache root's ``jobs/<digest>.yaml``, the cache root being ``cache_dir`` of the
  config root's ``config.yaml``, else ``$SPARKRUN_CACHE_DIR``, else ``~/.cache/sparkrun``.

Errors are ``SparkrunError`` (a ValueError): the file, what is wrong, and the fix.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

CONFIG_DIR_ENV = "SPARKRUN_CONFIG_DIR"
CACHE_DIR_ENV = "SPARKRUN_CACHE_DIR"
# ``--spark-cluster`` alone: sparkrun's default cluster (``clusters/.default``). Not a name
# sparkrun accepts for a cluster (it starts with a letter or digit), so it never shadows one.
DEFAULT_CLUSTER = ":default"
CLUSTER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_-]*$")  # sparkrun's own rule
# What sparkrun itself assumes when a recipe's defaults and the overrides leave a key out
# (the runtime layer of CLI -o > recipe defaults > runtime defaults): port 8000, and one
# of each parallelism dimension (core/parallelism.py).
RUNTIME_DEFAULTS: Mapping[str, Any] = {"port": 8000, "tensor_parallel": 1, "pipeline_parallel": 1}
VLLM_RUNTIMES = frozenset({"vllm", "vllm-distributed", "vllm-ray", "eugr-vllm"})


class SparkrunError(ValueError):
    """A sparkrun file that cannot be used: names the file, what is wrong and the fix."""


def _home(environ: Mapping[str, str]) -> Path:
    home = environ.get("HOME")
    return Path(home) if home else Path.home()


def config_root(environ: Mapping[str, str]) -> Path:
    """sparkrun's config root: ``$SPARKRUN_CONFIG_DIR``, else ``~/.config/sparkrun``."""
    override = environ.get(CONFIG_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return _home(environ) / ".config" / "sparkrun"


def cache_root(environ: Mapping[str, str]) -> Path:
    """sparkrun's cache root: ``cache_dir`` in the config root's ``config.yaml``, else
    ``$SPARKRUN_CACHE_DIR``, else ``~/.cache/sparkrun`` (sparkrun's own order)."""
    config = config_root(environ) / "config.yaml"
    if config.is_file():
        try:
            data = _load(config, "sparkrun's config")
        except SparkrunError:
            data = None
        if isinstance(data, dict) and isinstance(data.get("cache_dir"), str):
            return Path(data["cache_dir"]).expanduser()
    override = environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return _home(environ) / ".cache" / "sparkrun"


def _load(path: Path, what: str) -> object:
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SparkrunError(f"{path}: no such file ({what})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SparkrunError(f"{path}: cannot read the {what}: {exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SparkrunError(
            f"{path}: not YAML ({' '.join(str(exc).split())}); the {what} is a YAML mapping: "
            "fix the file, or write it again with sparkrun"
        ) from None


def _mapping(path: Path, data: object, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise SparkrunError(
            f"{path}: a YAML {type(data).__name__}, not a mapping; the {what} is a mapping of "
            "keys (see sparkrun's own files)"
        )
    return {str(k): v for k, v in data.items()}


def _hosts(path: Path, raw: object, key: str = "hosts") -> tuple[str, ...]:
    if isinstance(raw, str):
        raw = raw.split(",")
    if not isinstance(raw, list) or not all(isinstance(h, str | int) for h in raw):
        raise SparkrunError(f"{path}: {key} is not a list of host names: {raw!r}")
    return tuple(str(h).strip() for h in raw if str(h).strip())


# ---------------------------------------------------------------------- saved clusters


@dataclass(frozen=True)
class SavedCluster:
    """``clusters/NAME.yaml``: its hosts (the first is the head) and its SSH user."""

    name: str
    hosts: tuple[str, ...]
    user: str | None
    path: Path

    @property
    def head(self) -> str:
        return self.hosts[0]

    @property
    def workers(self) -> tuple[str, ...]:
        return self.hosts[1:]


def clusters_dir(environ: Mapping[str, str]) -> Path:
    return config_root(environ) / "clusters"


def saved_cluster_names(environ: Mapping[str, str]) -> list[str]:
    """The saved clusters' names, sorted (install manifests left out, as sparkrun does)."""
    folder = clusters_dir(environ)
    if not folder.is_dir():
        return []
    return sorted(p.stem for p in folder.glob("*.yaml") if not p.name.endswith(".manifest.yaml"))


def default_cluster_name(environ: Mapping[str, str]) -> str | None:
    """The name ``clusters/.default`` holds, when that cluster's file exists (sparkrun
    treats a default naming a deleted cluster as no default)."""
    marker = clusters_dir(environ) / ".default"
    try:
        name = marker.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if not name or not (clusters_dir(environ) / f"{name}.yaml").is_file():
        return None
    return name


def _known(environ: Mapping[str, str]) -> str:
    names = saved_cluster_names(environ)
    return f"saved clusters: {', '.join(names)}" if names else "no cluster is saved there"


def read_cluster(name: str, environ: Mapping[str, str]) -> SavedCluster:
    """The saved cluster ``name`` (``DEFAULT_CLUSTER``: the one ``.default`` names)."""
    folder = clusters_dir(environ)
    if name == DEFAULT_CLUSTER:
        found = default_cluster_name(environ)
        if found is None:
            raise SparkrunError(
                f"--spark-cluster without a name uses sparkrun's default cluster, and "
                f"{folder / '.default'} names none that exists ({_known(environ)}). Set one "
                "with `sparkrun cluster default NAME`, or give --spark-cluster=NAME"
            )
        name = found
    if not CLUSTER_NAME.match(name):
        raise SparkrunError(
            f"{name!r} is not a sparkrun cluster name (a letter or digit, then letters, "
            "digits, '_' or '-')"
        )
    path = folder / f"{name}.yaml"
    if not path.is_file():
        raise SparkrunError(
            f"no saved sparkrun cluster {name!r}: {path} does not exist ({_known(environ)}; "
            f"sparkrun's config root is ${CONFIG_DIR_ENV} or ~/.config/sparkrun). "
            "Save it with `sparkrun cluster create`, or give --spark-head and --spark-workers"
        )
    data = _mapping(path, _load(path, "saved sparkrun cluster"), "saved cluster")
    hosts = _hosts(path, data.get("hosts", []))
    if not hosts:
        raise SparkrunError(
            f"{path}: the cluster has no hosts; add them with `sparkrun cluster update {name} "
            "--hosts HEAD,WORKER`"
        )
    user = data.get("user")
    return SavedCluster(
        name=str(data.get("name") or name),
        hosts=hosts,
        user=str(user) if user not in (None, "") else None,
        path=path,
    )


# ----------------------------------------------------------------------------- recipes

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# vLLM's flag spellings (and sparkrun's short -tp / -pp) for what a recipe's command fixes.
_FLAGS: Mapping[str, tuple[str, ...]] = {
    "served_model_name": ("--served-model-name",),
    "port": ("--port",),
    "max_model_len": ("--max-model-len",),
    "tool_call_parser": ("--tool-call-parser",),
    "reasoning_parser": ("--reasoning-parser",),
    "tensor_parallel": ("--tensor-parallel-size", "-tp"),
    "pipeline_parallel": ("--pipeline-parallel-size", "-pp"),
    "gpu_memory_utilization": ("--gpu-memory-utilization",),
}


def _int(value: object) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip().lower()
    for suffix, factor in (("k", 1024), ("m", 1024 * 1024)):
        if text.endswith(suffix):
            try:
                return int(float(text[:-1]) * factor)
            except ValueError:
                return None
    try:
        return int(text)
    except ValueError:
        return None


def coerce(raw: str) -> object:
    """An ``-o key=value`` value as sparkrun reads it: a bool, an int, a float or text."""
    low = raw.strip().lower()
    if low in ("true", "yes"):
        return True
    if low in ("false", "no"):
        return False
    for kind in (int, float):
        try:
            return kind(raw.strip())
        except ValueError:
            pass
    return raw.strip()


def parse_overrides(items: Iterable[str]) -> dict[str, object]:
    """``["tensor_parallel=2", "port=8001"]`` (sparkrun's ``-o key=value``) as a mapping."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SparkrunError(f"{item!r} is not key=value (as sparkrun's -o takes it)")
        out[key.strip()] = coerce(value)
    return out


@dataclass(frozen=True)
class SparkRecipe:
    """A v2 recipe's serving facts (``model``, ``runtime``, ``container``, node range,
    ``defaults``, ``env``, ``command``) with ``overrides`` over its defaults. ``origin``
    says where it was read (``recipe /path/x.yaml``, ``sparkrun job /path/d.yaml``);
    ``path``: the recipe file (None for a job's recipe state); ``notes``: what the session
    header says about it (disagreements with the profile)."""

    origin: str
    model: str
    runtime: str
    container: str
    min_nodes: int
    max_nodes: int | None
    defaults: Mapping[str, Any]
    env: Mapping[str, str]
    command: str | None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    path: Path | None = None
    profile_keys: tuple[str, ...] = ()  # the profile figures it set (expectations.py's)

    def with_overrides(
        self, overrides: Mapping[str, Any], origin: str | None = None
    ) -> SparkRecipe:
        """These overrides over the present ones (a later ``-o`` wins)."""
        merged = {**self.overrides, **overrides}
        return replace(self, overrides=merged, origin=origin or self.origin)

    def value(self, key: str) -> Any:
        """CLI -o > recipe defaults > runtime defaults, as sparkrun resolves a key."""
        for layer in (self.overrides, self.defaults):
            if layer.get(key) is not None:
                return layer[key]
        if key == "model":
            return self.model
        return RUNTIME_DEFAULTS.get(key)

    def rendered_command(self) -> str | None:
        """``command`` with each ``{key}`` the chain knows put in as plain text (others
        left as they are) and the line continuations joined. Nothing is evaluated."""
        if not self.command:
            return None

        def fill(match: re.Match[str]) -> str:
            value = self.value(match.group(1))
            return match.group(0) if value is None else str(value)

        text = _PLACEHOLDER.sub(fill, self.command)
        return re.sub(r"\\\s*\n", " ", text).strip()

    def _command_flags(self) -> dict[str, str]:
        text = self.rendered_command()
        if text is None:
            return {}
        try:
            words = shlex.split(text)
        except ValueError:
            words = text.split()
        found: dict[str, str] = {}
        for i, word in enumerate(words):
            flag, eq, inline = word.partition("=")
            for key, names in _FLAGS.items():
                if flag in names:
                    if eq:
                        found[key] = inline
                    elif i + 1 < len(words):
                        found[key] = words[i + 1]
        return found

    def _serving(self, key: str) -> Any:
        """What the server gets for ``key``: the command's flag when the recipe has a
        command (sparkrun runs it as written, adding only the served name), else the
        chain's value (sparkrun turns the defaults into the flags)."""
        if self.command:
            return self._command_flags().get(key)
        return self.value(key)

    @property
    def served_model_name(self) -> str:
        name = self._serving("served_model_name") if self.command else None
        return str(name or self.value("served_model_name") or self.model)

    @property
    def port(self) -> int:
        return _int(self._serving("port")) or 8000  # vLLM's own default

    @property
    def tensor_parallel(self) -> int:
        return _int(self.value("tensor_parallel")) or 1

    @property
    def pipeline_parallel(self) -> int:
        return _int(self.value("pipeline_parallel")) or 1

    @property
    def nodes(self) -> int:
        """Nodes the job serves on: TP x PP ranks, one GPU per Spark (sparkrun's
        ``tensor_parallel: N`` = N hosts)."""
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def max_model_len(self) -> int | None:
        return _int(self._serving("max_model_len"))

    @property
    def tool_call_parser(self) -> str | None:
        value = self._serving("tool_call_parser")
        return str(value) if value not in (None, "", False) else None

    @property
    def reasoning_parser(self) -> str | None:
        value = self._serving("reasoning_parser")
        return str(value) if value not in (None, "", False) else None

    def fixed_env(self) -> dict[str, str]:
        """``env`` entries with a fixed value: those holding a ``{token}`` or ``$VAR``
        are filled in at launch, on the node, and cannot be compared here."""
        return {k: v for k, v in self.env.items() if "{" not in v and "$" not in v}

    def expected_capabilities(self) -> dict[str, tuple[bool, str]]:
        """``{profile key: (expected, why)}`` that the recipe decides (expectations.py's
        keys): reasoning from ``reasoning_parser``; a call under tool_choice=auto from
        ``tool_call_parser`` (vLLM needs it; required and named calls work without)."""
        reasoning, tools = self.reasoning_parser, self.tool_call_parser
        return {
            "reasoning.expected": (
                reasoning is not None,
                f"reasoning_parser {reasoning}" if reasoning else "no reasoning_parser",
            ),
            "tool_calls.auto_emits_calls": (
                tools is not None,
                f"tool_call_parser {tools}" if tools else "no tool_call_parser",
            ),
        }


def recipe_from_mapping(data: Mapping[str, Any], path: Path, origin: str) -> SparkRecipe:
    """A recipe's mapping (a recipe file, or a job file's ``recipe_state``)."""
    version = str(data.get("recipe_version", data.get("sparkrun_version", "2"))).strip()
    if version != "2":
        raise SparkrunError(
            f"{path}: recipe_version {version!r}; this reads v2 recipes (recipe_version: "
            '"2": model, runtime, container, defaults, env, command). Write it as a v2 '
            "recipe, or give the serve command with --spark-serve-args"
        )
    model = data.get("model")
    if not isinstance(model, str) or not model.strip():
        raise SparkrunError(f"{path}: no model; a v2 recipe names its model (model: ORG/NAME)")
    defaults = data.get("defaults") or {}
    env = data.get("env") or {}
    for key, value in (("defaults", defaults), ("env", env)):
        if not isinstance(value, dict):
            raise SparkrunError(f"{path}: {key} is a {type(value).__name__}, not a mapping")
    command = data.get("command")
    if command is not None and not isinstance(command, str):
        if isinstance(command, list) and all(isinstance(c, str) for c in command):
            command = " ".join(command)
        else:
            raise SparkrunError(f"{path}: command is not text: {command!r}")
    try:
        min_nodes = int(data.get("min_nodes", 1))
        max_raw = data.get("max_nodes")
        max_nodes = int(max_raw) if max_raw is not None else None
    except (TypeError, ValueError):
        raise SparkrunError(f"{path}: min_nodes / max_nodes are not whole numbers") from None
    return SparkRecipe(
        origin=origin,
        model=model.strip(),
        runtime=str(data.get("runtime") or "vllm"),
        container=str(data.get("container") or ""),
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        defaults={str(k): v for k, v in defaults.items()},
        env={str(k): str(v) for k, v in env.items()},
        command=command,
    )


def read_recipe(path: Path) -> SparkRecipe:
    """A v2 recipe file. Nothing in it is run."""
    path = path.expanduser()
    if path.is_dir():
        raise SparkrunError(f"{path}: a directory; give the recipe's YAML file")
    if not path.exists():
        raise SparkrunError(
            f"{path}: no such recipe file; give the path of a v2 recipe YAML (a registry "
            "recipe's file is under sparkrun's cache, registries/)"
        )
    data = _mapping(path, _load(path, "sparkrun recipe"), "recipe")
    return replace(recipe_from_mapping(data, path, f"recipe {path}"), path=path)


# -------------------------------------------------------------------------------- jobs


@dataclass(frozen=True)
class SparkrunJob:
    """``jobs/<digest>.yaml``, written by ``sparkrun run`` and removed by ``sparkrun stop``
    (``api_key`` is never read)."""

    path: Path
    cluster_id: str
    recipe_name: str | None  # ``recipe``: the recipe's qualified name
    recipe_ref: str | None  # ``recipe_ref``: what was given to ``sparkrun run``
    cluster: str | None  # ``cluster``: the saved cluster it ran on, when one
    ssh_user: str | None
    model: str | None
    runtime: str | None
    hosts: tuple[str, ...]
    port: int | None
    tensor_parallel: int | None
    pipeline_parallel: int | None
    served_model_name: str | None
    ib_ip_map: Mapping[str, str]
    effective_container_image: str | None
    overrides: Mapping[str, Any]
    started_at: float
    recipe_state: Mapping[str, Any] | None

    def recipe(self) -> SparkRecipe | None:
        """The recipe it was launched with (its ``recipe_state``), the job's overrides
        applied; None when the file has no recipe state."""
        if self.recipe_state is None:
            return None
        origin = f"sparkrun job {self.path}"
        base = recipe_from_mapping(self.recipe_state, self.path, origin)
        return base.with_overrides(self.overrides)


def _opt_str(value: object) -> str | None:
    return str(value) if value not in (None, "") else None


def read_job(path: Path) -> SparkrunJob:
    data = _mapping(path, _load(path, "sparkrun job file"), "job file")
    ib = data.get("ib_ip_map") or {}
    overrides = data.get("overrides") or {}
    state = data.get("recipe_state")
    started = data.get("started_at")
    return SparkrunJob(
        path=path,
        cluster_id=str(data.get("cluster_id") or f"sparkrun_{path.stem}"),
        recipe_name=_opt_str(data.get("recipe")),
        recipe_ref=_opt_str(data.get("recipe_ref")),
        cluster=_opt_str(data.get("cluster")),
        ssh_user=_opt_str(data.get("ssh_user")),
        model=_opt_str(data.get("model")),
        runtime=_opt_str(data.get("runtime")),
        hosts=_hosts(path, data.get("hosts") or []),
        port=_int(data.get("port")),
        tensor_parallel=_int(data.get("tensor_parallel")),
        pipeline_parallel=_int(data.get("pipeline_parallel")),
        served_model_name=_opt_str(data.get("served_model_name")),
        ib_ip_map={str(k): str(v) for k, v in ib.items()} if isinstance(ib, dict) else {},
        effective_container_image=_opt_str(data.get("effective_container_image")),
        overrides={str(k): v for k, v in overrides.items()} if isinstance(overrides, dict) else {},
        started_at=float(started) if isinstance(started, int | float) else 0.0,
        recipe_state=state if isinstance(state, dict) else None,
    )


def jobs_dir(environ: Mapping[str, str]) -> Path:
    return cache_root(environ) / "jobs"


def read_jobs(environ: Mapping[str, str]) -> list[SparkrunJob]:
    """Every readable job file, newest first (a file that is not a job is passed over:
    the folder is sparkrun's, written while we read)."""
    folder = jobs_dir(environ)
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("*.yaml")):
        try:
            found.append(read_job(path))
        except SparkrunError:
            continue
    return sorted(found, key=lambda j: j.started_at, reverse=True)


def find_job(nodes: tuple[str, ...], environ: Mapping[str, str]) -> SparkrunJob | None:
    """The newest job running on these nodes: its head is the first node and its hosts
    are among them (sparkrun may use the first N of a larger cluster)."""
    if not nodes:
        return None
    for job in read_jobs(environ):
        if job.hosts and job.hosts[0] == nodes[0] and set(job.hosts) <= set(nodes):
            return job
    return None
