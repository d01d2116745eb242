"""One probe of what a node's serving container loaded, riding in the node's shared round
trip: ``docker exec CONTAINER python3 -c SCRIPT`` (the script: :mod:`elf_parse` then
:mod:`container_probe`, sent as text; the container's own python reads its own /proc, where the
ranks' map paths resolve as the ranks saw them and its root may read every process's
environ). One section, ``loaded``: the JSON line of :mod:`container_probe`; exit 3 with ``not
running`` when the container does not run.
"""

from __future__ import annotations

import inspect
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.hostprobe import HostProbe
from pytest_spark.infra.loaded import container_probe, elf_parse
from pytest_spark.infra.probe import probe_script, split_probe

if TYPE_CHECKING:
    from pytest_spark.settings.resolve import Settings

__all__ = [
    "HOST_PROBE",
    "MARKER",
    "LoadedFacts",
    "MappedLib",
    "RankProcess",
    "VllmTree",
    "inner_script",
    "loaded_probe_command",
    "parse_loaded_json",
    "parse_loaded_probe",
    "recipe_env_names",
]

MARKER = "@@pytest-spark-loaded@@"
FUTURE = "from __future__ import annotations\n"
NOT_RUNNING_RC = 3

_BODY = r"""
s loaded sh -c 'c=$1 p=$2; shift 2
  r=$(docker inspect --type container -f "{{.State.Running}}" "$c" 2>/dev/null)
  [ "$r" = true ] || { echo "not running" >&2; exit @RC@; }
  exec docker exec "$c" python3 -c "$p" "$@"' _ @CONTAINER@ @SCRIPT@@NAMES@
rm -f "$t"
"""


def recipe_env_names(settings: Settings) -> tuple[str, ...]:
    """The names of the sparkrun recipe's fixed ``env:`` entries (none without a recipe):
    the serving-env check compares them, so the loaded probe reads them too."""
    recipe = settings.recipe
    return tuple(sorted(recipe.fixed_env())) if recipe is not None else ()


def inner_script() -> str:
    """The Python text run inside the container (the Build ID reader, then the walk)."""
    walk = inspect.getsource(container_probe).replace(FUTURE, "", 1)  # once, at the top
    return inspect.getsource(elf_parse) + "\n\n" + walk


def loaded_probe_command(
    *, container: str, timeout_s: int = 10, env_names: Sequence[str] = ()
) -> str:
    """The node's loaded probe as one ``sh -c`` command; ``container``: the serving
    container's name; ``env_names``: environment names to read beside the NCCL/GLOO/vLLM
    ones (a sparkrun recipe's ``env:``, :func:`recipe_env_names`)."""
    names = "".join(f" {shlex.quote(n)}" for n in sorted(set(env_names)))
    body = (
        _BODY.replace("@RC@", str(NOT_RUNNING_RC))
        .replace("@CONTAINER@", shlex.quote(container))
        .replace("@SCRIPT@", shlex.quote(inner_script()))
        .replace("@NAMES@", names)
    )
    return probe_script(MARKER, "loaded", timeout_s, body)


@dataclass(frozen=True)
class MappedLib:
    """A libnccl file a rank mapped: its path (as in /proc/PID/maps), size and Build ID
    (None with ``error`` when the file could not be read)."""

    path: str
    size: int | None
    build_id: str | None
    error: str | None = None

    def describe(self) -> str:
        bid = self.build_id or f"no Build ID ({self.error or 'no GNU note'})"
        size = f", {self.size / 1e6:.1f} MB" if self.size is not None else ""
        return f"{self.path} (Build ID {bid}{size})"


@dataclass(frozen=True)
class RankProcess:
    pid: int
    cmd: str
    nccl: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class VllmTree:
    root: str | None
    digest: str | None
    files: dict[str, str]
    error: str | None = None


@dataclass(frozen=True)
class LoadedFacts:
    """What one node's serving container loaded; ``error`` says why nothing was read
    (``running`` False: the container does not run)."""

    procs: tuple[RankProcess, ...]
    libs: dict[str, MappedLib]
    vllm: VllmTree | None
    elapsed_s: float | None
    running: bool = True
    error: str | None = None

    @property
    def ranks(self) -> tuple[RankProcess, ...]:
        """The processes that mapped NCCL."""
        return tuple(p for p in self.procs if p.nccl)


def parse_loaded_json(text: str) -> LoadedFacts:
    """The JSON line of :mod:`container_probe` as facts."""
    line = next((ln for ln in text.splitlines() if ln.startswith("{")), None)
    if line is None:
        raise ParseError("loaded probe", "no JSON line", text.strip()[:200])
    try:
        data = json.loads(line)
        procs = tuple(
            RankProcess(
                int(p["pid"]),
                str(p.get("cmd", "")),
                tuple(str(x) for x in p.get("nccl", [])),
                {str(k): str(v) for k, v in (p.get("env") or {}).items()},
            )
            for p in data.get("procs", [])
        )
        libs = {
            str(path): MappedLib(str(path), d.get("size"), d.get("build_id"), d.get("error"))
            for path, d in (data.get("libs") or {}).items()
        }
        tree = data.get("vllm")
        vllm = (
            VllmTree(
                tree.get("root"),
                tree.get("digest"),
                dict(tree.get("files") or {}),
                tree.get("error"),
            )
            if isinstance(tree, dict)
            else None
        )
        elapsed = data.get("elapsed_s")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ParseError("loaded probe", f"unreadable JSON ({exc})", line[:200]) from exc
    return LoadedFacts(procs, libs, vllm, float(elapsed) if elapsed is not None else None)


def parse_loaded_probe(text: str) -> LoadedFacts:
    """Parse :func:`loaded_probe_command` output."""
    _, sections = split_probe(text, MARKER, "loaded probe")
    section = sections.get("loaded")
    if section is None:
        raise ParseError("loaded probe", "no 'loaded' section")
    if section.rc == NOT_RUNNING_RC:
        return LoadedFacts((), {}, None, None, running=False, error="container not running")
    if section.rc != 0:
        problem = section.problem() or f"exit {section.rc}"
        return LoadedFacts((), {}, None, None, error=f"{problem} {section.stderr.strip()[:300]}")
    return parse_loaded_json(section.stdout)


# The loaded probe rides the node's one host round trip (infra.roundtrip): one `docker
# exec` inside the node's own serving container, reading the recipe's env names too.
HOST_PROBE: HostProbe[LoadedFacts] = HostProbe(
    key="loaded",
    command=lambda settings, container: loaded_probe_command(
        container=container, env_names=recipe_env_names(settings)
    ),
    parse=lambda text, settings: parse_loaded_probe(text),
)
