"""The nodes-alike probe: one ``sh -c`` command per node (one SSH round trip) printing
marker-framed sections (the link probe's framing, with its own marker):

``kernel`` (``uname -r``), ``os_release`` (/etc/os-release), ``nvidia_smi`` (the table:
its header names the driver and CUDA versions), ``timedatectl`` (``timedatectl show``),
``chrony`` (``chronyc -n tracking``: read where timedatectl cannot say), ``dgx_release``
(/etc/dgx-release: the DGX OS release), ``cx7_fw`` (``ethtool -i`` of every ConnectX-7
port ``ibdev2netdev`` lists: its firmware and PSID), ``running`` (the serving container's
image ID, ``docker inspect --format '{{.Image}}'``, and ``running-image`` its ``docker
image inspect``: what an attached cluster really runs, whatever the tag says now), ``image:REF``
(``docker image inspect`` of the serving image) and ``container:REF``: the facts inside
that image, from one ``docker run --rm --network none --entrypoint python3 REF -c SCRIPT``
(no GPU, no mounts, nothing imported but the standard library: vLLM and torch versions
from their package metadata, Python's own, and every ``libnccl.so*`` on the loader's path
hashed whole, with the version the library itself carries and its ELF GNU Build ID).

Why the image and not the running container: this is preflight, before a 15-minute load;
the image is what every node will run, the same whether the suite launches or attaches,
and it exists before any container does. Two nodes with the same image identity run the
same files; the container facts say what a difference is in an operator's words (the
same NCCL version, a different build: the ranks hang at NCCL init).

The serving image is ``--spark-image``, else the serving container's image.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from pytest_spark.infra.alike.parse import (
    ContainerFacts,
    ImageFacts,
    TimeSync,
    dgx_os_version,
    known,
    os_release_name,
    parse_chronyc_tracking,
    parse_container_facts,
    parse_ethtool_firmware,
    parse_image_inspect,
    parse_smi_versions,
    parse_timedatectl_show,
)
from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.hostprobe import HostProbe
from pytest_spark.infra.probe import (
    PROBE_CONTAINER_PREFIX,
    ProbeSection,
    probe_script,
    split_probe,
)

MARKER = "@@pytest-spark-alike@@"

# Run by the image's python3: standard library only, nothing imported from the image's
# packages (vLLM's import costs seconds and wants a GPU).
CONTAINER_SCRIPT = r"""
import glob, hashlib, json, os, re, sys
from importlib import metadata
def ver(name):
    try:
        return metadata.version(name)
    except Exception:
        return None
sites = [p for p in sys.path if p and os.path.isdir(p)]
try:
    import site
    sites += [p for p in site.getsitepackages() if os.path.isdir(p)]
except Exception:
    pass
dirs = []
for p in sites:
    dirs += [os.path.join(p, "torch", "lib"), os.path.join(p, "nvidia", "nccl", "lib")]
dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
dirs += ["/usr/local/lib", "/usr/lib/aarch64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
         "/usr/lib64", "/usr/lib", "/lib"]
libs, seen = [], set()
for d in dirs:
    for f in sorted(glob.glob(os.path.join(d, "libnccl.so*"))):
        real = os.path.realpath(f)
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        h, size, found, bid = hashlib.sha256(), 0, None, None
        with open(real, "rb") as fh:
            tail = b""
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                if size == 0:
                    n = re.search(rb"\x04\0\0\0([\x08-\x40])\0\0\0\x03\0\0\0GNU\0", chunk)
                    bid = chunk[n.end():n.end() + n.group(1)[0]].hex() if n else None
                h.update(chunk)
                size += len(chunk)
                if found is None:
                    m = re.search(rb"NCCL version (\d+\.\d+\.\d+[0-9A-Za-z.+_-]*)", tail + chunk)
                    found = m.group(1).decode() if m else None
                tail = chunk[-64:]
        libs.append({"path": f, "file": real, "bytes": size, "sha256": h.hexdigest(),
                     "version": found, "build_id": bid})
pkg = next((v for v in map(ver, ("nvidia-nccl-cu13", "nvidia-nccl-cu12")) if v), None)
print(json.dumps({"python": sys.version.split()[0], "vllm": ver("vllm"),
                  "torch": ver("torch"), "nccl": libs, "nccl_pkg": pkg}))
"""

_BODY = r"""
IMAGE=@IMAGE@
CONTAINER=@CONTAINER@
PY=@PY@
s kernel uname -r
s os_release cat /etc/os-release
s nvidia_smi nvidia-smi
s timedatectl timedatectl show
s chrony chronyc -n tracking
s dgx_release cat /etc/dgx-release
s cx7_fw sh -c 'for i in $(ibdev2netdev 2>/dev/null | awk "{print \$5}"); do
  echo "== $i"; ethtool -i "$i"; done'
rid=$($T docker inspect --type container -f '{{.Image}}' "$CONTAINER" 2>/dev/null)
case $rid in
  sha256:*[!0-9a-f]*|'') ;;
  sha256:*) s running echo "$rid"
     s running-image docker image inspect "$rid" ;;
esac
img=$IMAGE
[ -n "$img" ] ||
  img=$($T docker inspect --type container -f '{{.Config.Image}}' "$CONTAINER" 2>/dev/null)
case $img in
  *[!A-Za-z0-9_.:/@-]*|'') ;;
  *) s "image:$img" docker image inspect "$img"
     if $T docker image inspect -f . "$img" >/dev/null 2>&1; then
       s "container:$img" docker run --rm --name "@PREFIX@$$" --network none \
         --entrypoint python3 "$img" -c "$PY"
     fi ;;
esac
rm -f "$t"
"""


def alike_probe_command(*, container: str, image: str | None = None, timeout_s: int = 60) -> str:
    """The probe as one ``sh -c`` command (run it once per node)."""
    body = (
        _BODY.replace("@IMAGE@", shlex.quote(image or ""))
        .replace("@PREFIX@", PROBE_CONTAINER_PREFIX)
        .replace("@CONTAINER@", shlex.quote(container))
        .replace("@PY@", shlex.quote(CONTAINER_SCRIPT.strip()))
    )
    return probe_script(MARKER, "alike", timeout_s, body)


@dataclass(frozen=True)
class Fact:
    """One value read on a node, or why it was not (``value`` None, ``why`` set)."""

    value: str | None
    why: str | None = None


@dataclass(frozen=True)
class NodeAlike:
    hostname: str | None
    sections: dict[str, ProbeSection]
    kernel: Fact
    os: Fact
    driver: Fact
    cuda: Fact
    time_sync: TimeSync | None
    time_sync_error: str | None
    image_ref: str | None
    image: ImageFacts | None
    image_error: str | None
    container: ContainerFacts | None
    container_error: str | None
    dgx_os: Fact = Fact(None, "not probed")
    cx7_firmware: Fact = Fact(None, "not probed")
    running: ImageFacts | None = None  # the serving container's image (attach), by its ID


def _why(section: ProbeSection | None, what: str) -> str:
    if section is None:
        return f"{what} not probed"
    problem = section.problem()
    if problem:
        return problem
    first = next((ln.strip() for ln in (section.stderr + section.stdout).splitlines() if ln), "")
    return f"{what}: exit {section.rc}" + (f": {first}" if first else "")


def _text_fact(section: ProbeSection | None, what: str) -> Fact:
    if section is not None and section.rc == 0:
        value = known(section.stdout.strip().splitlines()[0] if section.stdout.strip() else "")
        if value:
            return Fact(value)
        return Fact(None, f"{what}: no output")
    return Fact(None, _why(section, what))


def _gpu_versions(section: ProbeSection | None) -> tuple[Fact, Fact]:
    if section is None or section.rc != 0:
        why = _why(section, "nvidia-smi")
        if section is not None and "No devices were found" in section.stdout + section.stderr:
            why = "nvidia-smi: No devices were found"
        return Fact(None, why), Fact(None, why)
    driver, cuda = parse_smi_versions(section.stdout)
    return (
        Fact(driver, None if driver else "nvidia-smi: Driver Version N/A"),
        Fact(cuda, None if cuda else "nvidia-smi: CUDA Version N/A"),
    )


def _time_sync(sections: dict[str, ProbeSection]) -> tuple[TimeSync | None, str | None]:
    tdc = sections.get("timedatectl")
    if tdc is not None and tdc.rc == 0:
        try:
            return parse_timedatectl_show(tdc.stdout), None
        except ParseError:
            pass
    chrony = sections.get("chrony")
    if chrony is not None and chrony.rc == 0:
        try:
            return parse_chronyc_tracking(chrony.stdout), None
        except ParseError as exc:
            return None, str(exc)
    reasons = [_why(tdc, "timedatectl")]
    if chrony is not None:
        reasons.append(_why(chrony, "chronyc"))
    return None, "; ".join(reasons)


def _dgx_os(section: ProbeSection | None) -> Fact:
    if section is None or section.rc != 0:
        return Fact(None, _why(section, "/etc/dgx-release"))
    version = dgx_os_version(section.stdout)
    return Fact(version, None if version else "/etc/dgx-release: no DGX_SWBUILD_VERSION")


def _cx7_firmware(section: ProbeSection | None) -> Fact:
    if section is None:
        return Fact(None, "ethtool -i not probed")
    firmware = parse_ethtool_firmware(section.stdout)
    if not firmware:
        return Fact(None, "no ConnectX-7 port (ibdev2netdev) answered ethtool -i")
    return Fact(", ".join(sorted(set(firmware.values()))))


def _running(sections: dict[str, ProbeSection]) -> ImageFacts | None:
    rid, inspect = sections.get("running"), sections.get("running-image")
    if rid is None or inspect is None or inspect.rc != 0:
        return None
    try:
        return parse_image_inspect(inspect.stdout, rid.stdout.strip())
    except ParseError:
        return None


def parse_alike_probe(text: str) -> NodeAlike:
    """Parse :func:`alike_probe_command` output."""
    hostname, sections = split_probe(text, MARKER, "alike probe")
    driver, cuda = _gpu_versions(sections.get("nvidia_smi"))
    os_section = sections.get("os_release")
    os_name = os_release_name(os_section.stdout) if os_section and os_section.rc == 0 else None
    sync, sync_error = _time_sync(sections)
    ref = image = image_error = container = container_error = None
    for name, section in sections.items():
        if name.startswith("image:"):
            ref = name.split(":", 1)[1]
            if section.rc == 0:
                try:
                    image = parse_image_inspect(section.stdout, ref)
                except ParseError as exc:
                    image_error = str(exc)
            else:
                image_error = _why(section, "docker image inspect")
        elif name.startswith("container:"):
            if section.rc == 0:
                try:
                    container = parse_container_facts(section.stdout)
                except ParseError as exc:
                    container_error = str(exc)
            else:
                container_error = _why(section, "docker run --rm")
    if ref is not None and image is not None and container is None and container_error is None:
        container_error = "the image's python3 was not run"
    return NodeAlike(
        hostname=hostname,
        sections=sections,
        kernel=_text_fact(sections.get("kernel"), "uname -r"),
        os=Fact(os_name, None if os_name else _why(os_section, "/etc/os-release")),
        driver=driver,
        cuda=cuda,
        time_sync=sync,
        time_sync_error=sync_error,
        image_ref=ref,
        image=image,
        image_error=image_error,
        container=container,
        container_error=container_error,
        dgx_os=_dgx_os(sections.get("dgx_release")),
        cx7_firmware=_cx7_firmware(sections.get("cx7_fw")),
        running=_running(sections),
    )


# The nodes-alike probe rides the node's one host round trip (infra.roundtrip), with the
# node's own serving container and the serving image.
HOST_PROBE: HostProbe[NodeAlike] = HostProbe(
    key="alike",
    command=lambda settings, container: alike_probe_command(
        container=container, image=settings.image
    ),
    parse=lambda text, settings: parse_alike_probe(text),
    what="nodes-alike",
)
