"""One-round-trip preflight probe of a node, and the facts parsed from its output.

``preflight_probe_command(...)`` is one ``sh -c`` command printing marker-framed sections
(the link probe's framing, with its own marker)::

    @@pytest-spark-preflight@@ probe v1 HOSTNAME
    @@pytest-spark-preflight@@ begin NAME
    ...stdout...
    @@pytest-spark-preflight@@ stderr NAME
    ...stderr...
    @@pytest-spark-preflight@@ end NAME rc=N

Sections: ``now`` (``date +%s``), ``uptime`` (/proc/uptime), ``docker_info``,
``docker_inspect`` (every running container), ``docker_top:ID`` (its PIDs),
``serving_inspect`` (the serving container, running or not), ``image:REF`` (``docker image
inspect`` of the serving image), ``gpu_list`` (``nvidia-smi -L``), ``gpu_driver``,
``gpu_apps`` (``--query-compute-apps``), ``gpu_ps`` (``ps`` of those PIDs), ``df`` (the
filesystem of the model directory, or of its nearest existing parent, or /),
``model_stat``/``model_files`` (sizes), ``model_hashes`` (sha256 of config.json,
the tokenizer files, *.index.json and every small file), ``model_samples`` (of every larger
file, a sampled sha256: its size and :data:`SAMPLES` blocks of 64 KiB spread evenly from
the first to the last, :func:`sampled_sha256`; the 119 GB of weight shards are not read
whole, ~1 MiB each is), ``netdevs`` (sysfs
carrier counters of every netdev) and ``journal`` (``journalctl -k --since -24h`` lines
about links going down). The GPU health sections are a probe of their own
(:mod:`pytest_spark.infra.gpuhealth.probe`), riding the same round trip.
A missing tool gives ``rc=127``; a hung one is stopped (``rc=124``).

The per-command parsers are in :mod:`pytest_spark.infra.preflight.parse`; this module frames
and assembles. Nothing reads GPU memory fields (a GB10 reports ``[N/A]``).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.hostprobe import HostProbe
from pytest_spark.infra.modelfiles import ModelListing, parse_sha256sum
from pytest_spark.infra.preflight.parse import (
    ContainerInfo,
    DiskUsage,
    parse_compute_apps,
    parse_container_env,
    parse_df,
    parse_docker_inspect,
    parse_find_sizes,
    parse_gpu_list,
    parse_pids,
    parse_ps,
)
from pytest_spark.infra.probe import ProbeSection, probe_script, split_probe
from pytest_spark.infra.serveargs import parse_serve_args

if TYPE_CHECKING:
    from pytest_spark.settings.resolve import Settings

__all__ = [
    "HOST_PROBE",
    "MARKER",
    "CarrierCounters",
    "ClockSample",
    "ContainerInfo",
    "DiskUsage",
    "DockerFacts",
    "GpuFacts",
    "GpuProcess",
    "JournalFacts",
    "ModelDir",
    "NodePreflight",
    "SshAttempt",
    "clock_command",
    "container_env_command",
    "model_dir",
    "parse_compute_apps",
    "parse_container_env",
    "parse_df",
    "parse_docker_inspect",
    "parse_gpu_list",
    "parse_preflight_probe",
    "parse_ssh_probe",
    "preflight_probe_command",
    "split_sections",
    "ssh_probe_command",
]

MARKER = "@@pytest-spark-preflight@@"
EDGE_BYTES = 65536  # files above 2 x this are compared by a sampled hash (SAMPLES blocks)
SAMPLES = 16
LINK_DOWN = r"link (is )?down|lost carrier|carrier (lost|off|down)"

_NODE = r"""
CONTAINER=@CONTAINER@
IMAGE=@IMAGE@
MODEL=@MODEL@
s now date +%s
s uptime cat /proc/uptime
s docker_info docker info --format '{{.ServerVersion}}'
ids=''
command -v docker >/dev/null 2>&1 && ids=$($T docker ps -q --no-trunc 2>/dev/null)
[ -n "$ids" ] && s docker_inspect docker inspect --type container $ids
for c in $ids; do s "docker_top:$c" docker top "$c" -eo pid; done
s serving_inspect docker inspect --type container "$CONTAINER"
img=$IMAGE
[ -n "$img" ] ||
  img=$($T docker inspect --type container -f '{{.Config.Image}}' "$CONTAINER" 2>/dev/null)
case $img in
  *[!A-Za-z0-9_.:/@-]*|'') ;;
  *) s "image:$img" docker image inspect -f '{{.Id}}' "$img" ;;
esac
s gpu_list nvidia-smi -L
s gpu_driver nvidia-smi --query-gpu=driver_version --format=csv,noheader
s gpu_apps nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
pids=$($T nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null |
  tr -cd '0-9\n' | grep . | paste -sd, -)
[ -n "$pids" ] && s gpu_ps ps -o pid=,etimes=,args= -p "$pids"
d=${MODEL:-/}
while [ ! -e "$d" ] && [ "$d" != / ] && [ "$d" != . ]; do d=$(dirname "$d"); done
s df sh -c 'echo "$1"; df -P -k "$1"' _ "$d"
if [ -n "$MODEL" ]; then
  s model_stat stat -L -c %F "$MODEL"
  if [ -d "$MODEL" ]; then
    s model_files find -L "$MODEL" -type f -printf '%P\t%s\n'
    s model_hashes sh -c 'cd "$1" && find -L . -type f \( -name config.json \
      -o -name "tokenizer*" -o -name "*.index.json" -o -size -@SMALLK@k \) \
      -exec sha256sum {} +' _ "$MODEL"
    s model_samples sh -c 'cd "$1" || exit 1
      find -L . -type f ! -name config.json ! -name "tokenizer*" ! -name "*.index.json" \
        ! -size -@SMALLK@k | sort |
      while IFS= read -r f; do
        n=$(stat -L -c %s "$f") || continue
        b=$(( (n + @EDGE@ - 1) / @EDGE@ )); i=0
        h=$({ echo "$n"; while [ $i -lt @SAMPLES@ ]; do
              dd if="$f" bs=@EDGE@ skip=$(( i * (b - 1) / (@SAMPLES@ - 1) )) count=1 2>/dev/null
              i=$((i + 1)); done; } | sha256sum)
        echo "${h%% *}  ${f#./}"
      done' _ "$MODEL"
  fi
fi
s netdevs sh -c 'for d in /sys/class/net/*; do
  [ -e "$d" ] || continue
  c=$(cat "$d/carrier" 2>/dev/null || echo -)
  u=$(cat "$d/carrier_up_count" 2>/dev/null || echo -)
  w=$(cat "$d/carrier_down_count" 2>/dev/null || echo -)
  echo "${d##*/} $c $u $w"
done'
s journal sh -c 'if ! command -v journalctl >/dev/null 2>&1; then
    echo "journalctl: command not found" >&2; exit 127
  fi
  out=$(journalctl -k --since -24h --no-pager -q -o short-iso 2>/dev/null); rc=$?
  echo "lines $(printf "%s\n" "$out" | grep -c .)"
  printf "%s\n" "$out" | grep -iE "@LINKDOWN@" | tail -n 500
  exit $rc'
rm -f "$t"
"""

_SSH = r"""
d=$(mktemp -d 2>/dev/null) || { d="/tmp/.pytest-spark-ssh.$$"; mkdir -p "$d"; }
i=0
for a in @ADDRS@; do
  i=$((i+1))
  ( t="$d/$i.err"
    s "ssh:$a" sh -c 'ssh -o BatchMode=yes -o ConnectTimeout=5 "$1" true </dev/null' _ "$a"
  ) >"$d/$i" 2>&1 &
done
wait
i=0
for a in @ADDRS@; do i=$((i+1)); cat "$d/$i"; done
rm -rf "$d" "$t"
"""


def preflight_probe_command(
    *, container: str, image: str | None = None, model_dir: str | None = None, timeout_s: int = 20
) -> str:
    """The node probe as one ``sh -c`` command (run it once per node)."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    body = (
        _NODE.replace("@CONTAINER@", shlex.quote(container))
        .replace("@IMAGE@", shlex.quote(image or ""))
        .replace("@MODEL@", shlex.quote(model_dir or ""))
        .replace("@EDGE@", str(EDGE_BYTES))
        .replace("@SAMPLES@", str(SAMPLES))
        .replace("@SMALLK@", str(2 * EDGE_BYTES // 1024 + 1))
        .replace("@LINKDOWN@", LINK_DOWN)
    )
    return probe_script(MARKER, "preflight", timeout_s, body)


def ssh_probe_command(addresses: list[str], timeout_s: int = 15) -> str:
    """Run on the head: ``ssh -o BatchMode=yes -o ConnectTimeout=5 ADDR true`` to each
    worker, as launch-cluster.sh does before it starts anything; all workers at once (each
    attempt's output kept in a ``mktemp -d`` directory, printed in order, then removed)."""
    for a in addresses:
        if not a or not re.fullmatch(r"[A-Za-z0-9_.:@%-]+", a):
            raise ValueError(f"not an address or host name: {a!r}")
    body = _SSH.replace("@ADDRS@", " ".join(shlex.quote(a) for a in addresses))
    return probe_script(MARKER, "preflight", timeout_s, body)


def clock_command() -> str:
    """One clock reading; the caller times the round trip around it."""
    return "LC_ALL=C date +%s.%N"


def container_env_command(container: str) -> str:
    return f"docker inspect --type container -f '{{{{json .Config.Env}}}}' {shlex.quote(container)}"


# ------------------------------------------------------------------------------ framing


def split_sections(text: str) -> tuple[str | None, dict[str, ProbeSection]]:
    """(hostname, sections) of probe output; lines outside sections are ignored."""
    return split_probe(text, MARKER, "preflight probe")


def _first_line(section: ProbeSection | None) -> str:
    if section is None:
        return "not probed"
    text = section.stderr.strip() or section.stdout.strip()
    return text.splitlines()[0].strip() if text else f"exit {section.rc}"


def _ok(section: ProbeSection | None) -> bool:
    return section is not None and section.rc == 0


# -------------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class DockerFacts:
    """``up`` is None when docker was not asked (a missing section)."""

    up: bool | None
    version: str | None
    error: str | None
    containers: tuple[ContainerInfo, ...] = ()
    serving: ContainerInfo | None = None
    image: str | None = None
    image_present: bool | None = None
    image_error: str | None = None
    missing: bool = False  # the docker CLI itself is not installed


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    etime_s: int | None = None
    args: str | None = None


@dataclass(frozen=True)
class GpuFacts:
    gpus: tuple[str, ...] | None  # nvidia-smi -L lines; None when nvidia-smi failed
    error: str | None
    processes: tuple[GpuProcess, ...] | None  # None when the query failed
    apps_error: str | None
    driver_version: str | None = None


@dataclass(frozen=True)
class CarrierCounters:
    netdev: str
    carrier: bool | None
    up_count: int | None
    down_count: int | None

    @property
    def losses(self) -> int | None:
        """Carrier losses since the netdev appeared: every up but the current one (a
        driver's initial carrier-off also counts in carrier_down_count, not a loss)."""
        if self.up_count is not None:
            return max(0, self.up_count - (1 if self.carrier else 0))
        if self.down_count is not None:
            return max(0, self.down_count - 1)
        return None


@dataclass(frozen=True)
class JournalFacts:
    available: bool
    lines: int  # kernel log lines of the last 24 h
    down_lines: tuple[str, ...] = ()
    error: str | None = None

    def about(self, ifname: str) -> list[str]:
        pattern = re.compile(rf"(?<![\w.-]){re.escape(ifname)}(?![\w.-])")
        return [line for line in self.down_lines if pattern.search(line)]


@dataclass(frozen=True)
class NodePreflight:
    hostname: str | None
    sections: dict[str, ProbeSection]
    now: float | None
    uptime_s: float | None
    docker: DockerFacts
    gpu: GpuFacts
    disk: DiskUsage | None
    disk_error: str | None
    model: ModelListing | None
    carriers: dict[str, CarrierCounters]
    journal: JournalFacts


@dataclass(frozen=True)
class ClockSample:
    """A node clock read between two runner readings: offset = node - midpoint."""

    node: str
    offset_s: float
    rtt_s: float


@dataclass(frozen=True)
class SshAttempt:
    address: str
    rc: int | None
    output: str

    @property
    def ok(self) -> bool:
        return self.rc == 0


def _docker(sections: dict[str, ProbeSection]) -> DockerFacts:
    info = sections.get("docker_info")
    if info is None:
        return DockerFacts(None, None, "docker was not probed")
    if info.missing:
        return DockerFacts(False, None, "docker: command not found", missing=True)
    if info.rc != 0:
        return DockerFacts(False, None, _first_line(info))
    containers: list[ContainerInfo] = []
    inspect = sections.get("docker_inspect")
    if _ok(inspect) and inspect is not None:
        for c in parse_docker_inspect(inspect.stdout):
            top = sections.get(f"docker_top:{c.id}")
            pids = parse_pids(top.stdout) if _ok(top) and top is not None else frozenset()
            containers.append(
                ContainerInfo(
                    c.id,
                    c.name,
                    c.image,
                    c.image_id,
                    c.running,
                    c.started_at,
                    c.restart_policy,
                    c.gpu_access,
                    c.env,
                    pids,
                )
            )
    serving = None
    sinspect = sections.get("serving_inspect")
    if _ok(sinspect) and sinspect is not None:
        found = parse_docker_inspect(sinspect.stdout)
        if found:
            running = next((c for c in containers if c.id == found[0].id), None)
            serving = running or found[0]
    image = present = image_error = None
    for name, section in sections.items():
        if name.startswith("image:"):
            image = name.split(":", 1)[1]
            present = section.rc == 0
            image_error = None if present else _first_line(section)
    return DockerFacts(
        True,
        info.stdout.strip() or None,
        None,
        tuple(containers),
        serving,
        image,
        present,
        image_error,
    )


def _gpu(sections: dict[str, ProbeSection]) -> GpuFacts:
    listing = sections.get("gpu_list")
    gpus: tuple[str, ...] | None = None
    error = None
    if listing is not None and listing.rc == 0:
        gpus = tuple(parse_gpu_list(listing.stdout))
    elif listing is not None and "No devices were found" in listing.stdout + listing.stderr:
        gpus, error = (), "No devices were found"
    else:
        error = (
            "nvidia-smi: command not found"
            if listing is not None and listing.missing
            else _first_line(listing)
        )
    apps = sections.get("gpu_apps")
    processes: tuple[GpuProcess, ...] | None = None
    apps_error = None
    if apps is not None and apps.rc == 0:
        ps_section = sections.get("gpu_ps")
        ps = parse_ps(ps_section.stdout) if ps_section is not None else {}
        processes = tuple(
            GpuProcess(pid, name, *ps.get(pid, (None, None)))
            for pid, name in parse_compute_apps(apps.stdout)
        )
    else:
        apps_error = _first_line(apps)
    driver = sections.get("gpu_driver")
    version = (
        driver.stdout.strip().splitlines()[0].strip()
        if _ok(driver) and driver and driver.stdout.strip()
        else None
    )
    return GpuFacts(gpus, error, processes, apps_error, version)


def _model(sections: dict[str, ProbeSection], model_dir: str | None) -> ModelListing | None:
    stat = sections.get("model_stat")
    if stat is None or model_dir is None:
        return None
    if stat.rc != 0 or stat.stdout.strip() != "directory":
        why = _first_line(stat) if stat.rc != 0 else f"a {stat.stdout.strip()}, not a directory"
        return ModelListing(model_dir, False, error=why)
    files = sections.get("model_files")
    if not _ok(files) or files is None:
        return ModelListing(model_dir, True, error=f"cannot list it: {_first_line(files)}")
    hashes = sections.get("model_hashes")
    samples = sections.get("model_samples")
    return ModelListing(
        model_dir,
        True,
        parse_find_sizes(files.stdout),
        parse_sha256sum(hashes.stdout) if hashes is not None else {},
        parse_sha256sum(samples.stdout) if samples is not None else {},
    )


def sampled_sha256(data: bytes, block: int = EDGE_BYTES, samples: int = SAMPLES) -> str:
    """What the probe's ``model_samples`` computes for one file: sha256 of its size in
    decimal and a newline, then ``samples`` blocks of ``block`` bytes at block indices
    ``i * (blocks - 1) // (samples - 1)`` (the first, the last, evenly between)."""
    n = len(data)
    blocks = -(-n // block)
    h = hashlib.sha256(f"{n}\n".encode())
    for i in range(samples):
        k = i * (blocks - 1) // (samples - 1)
        h.update(data[k * block : (k + 1) * block])
    return h.hexdigest()


def _int_or_none(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _carriers(section: ProbeSection | None) -> dict[str, CarrierCounters]:
    out: dict[str, CarrierCounters] = {}
    if section is None:
        return out
    for line in section.stdout.splitlines():
        parts = line.split()
        if len(parts) != 4:
            continue
        name, carrier, up, down = parts
        out[name] = CarrierCounters(
            name, None if carrier == "-" else carrier == "1", _int_or_none(up), _int_or_none(down)
        )
    return out


def _journal(section: ProbeSection | None) -> JournalFacts:
    if section is None:
        return JournalFacts(False, 0, error="not probed")
    if section.missing:
        return JournalFacts(False, 0, error="journalctl: command not found")
    lines = section.stdout.splitlines()
    m = re.match(r"^lines (\d+)$", lines[0].strip()) if lines else None
    total = int(m[1]) if m else 0
    if section.rc != 0 and total == 0:
        return JournalFacts(False, 0, error=f"journalctl -k: exit {section.rc}")
    return JournalFacts(
        total > 0,
        total,
        tuple(ln for ln in lines[1:] if ln.strip()),
        None if total else "no kernel log lines in the last 24 h",
    )


def _float_first(section: ProbeSection | None) -> float | None:
    if not _ok(section) or section is None:
        return None
    try:
        return float(section.stdout.split()[0])
    except (ValueError, IndexError):
        return None


def parse_preflight_probe(text: str, model_dir: str | None = None) -> NodePreflight:
    """Parse :func:`preflight_probe_command` output (``model_dir`` as given to it)."""
    hostname, sections = split_sections(text)
    disk = disk_error = None
    df = sections.get("df")
    if _ok(df) and df is not None:
        try:
            disk = parse_df(df.stdout, model_dir or "/")
        except ParseError as exc:
            disk_error = str(exc)
    else:
        disk_error = _first_line(df)
    return NodePreflight(
        hostname=hostname,
        sections=sections,
        now=_float_first(sections.get("now")),
        uptime_s=_float_first(sections.get("uptime")),
        docker=_docker(sections),
        gpu=_gpu(sections),
        disk=disk,
        disk_error=disk_error,
        model=_model(sections, model_dir),
        carriers=_carriers(sections.get("netdevs")),
        journal=_journal(sections.get("journal")),
    )


def parse_ssh_probe(text: str) -> list[SshAttempt]:
    _, sections = split_sections(text)
    out = []
    for name, section in sections.items():
        if name.startswith("ssh:"):
            output = (section.stdout + section.stderr).strip()
            out.append(SshAttempt(name.split(":", 1)[1], section.rc, output))
    return out


# ------------------------------------------------------------------------- model dir


@dataclass(frozen=True)
class ModelDir:
    """Where the model lives on the nodes: ``path`` and where that came from, or
    ``reason`` why it is not known. ``must_exist_somewhere``: derived from the serve
    args, so it counts only when some node has it (else it is a container path)."""

    path: str | None
    source: str | None = None
    reason: str | None = None
    must_exist_somewhere: bool = False


def model_dir(settings: Settings) -> ModelDir:
    if settings.model_dir:
        return ModelDir(settings.model_dir, f"from {settings.source('model_dir')}")
    if settings.serve_args:
        model = parse_serve_args(settings.serve_args).model
        if model and model.startswith("/"):
            return ModelDir(model, "the serve args' model path", must_exist_somewhere=True)
        return ModelDir(
            None,
            reason=(
                f"the serve args name the model {model!r}, not a host path: set "
                "--spark-model-dir to the model directory on the nodes"
            ),
        )
    return ModelDir(
        None,
        reason="no --spark-model-dir and no --spark-serve-args: the model "
        "directory on the nodes is not known",
    )


# The preflight probe rides the node's one host round trip (infra.roundtrip), with the
# node's own serving container, the serving image and the model directory.
HOST_PROBE: HostProbe[NodePreflight] = HostProbe(
    key="preflight",
    command=lambda settings, container: preflight_probe_command(
        container=container, image=settings.image, model_dir=model_dir(settings).path
    ),
    parse=lambda text, settings: parse_preflight_probe(text, model_dir(settings).path),
)
