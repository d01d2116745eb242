"""Parsers of the nodes-alike facts: what each node runs (kernel, OS, driver, CUDA), the
serving image it holds and what is inside it, and its time sync. Pure: text in, facts out.

Formats (real outputs: fixtures/alike/README.md names the sources):

- ``/etc/os-release``: ``KEY=VALUE`` lines, values optionally quoted (os-release(5)).
- ``nvidia-smi`` (no arguments): the table whose header line reads
  ``| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |``; on a GB10
  the memory fields say ``Not Supported`` / ``[N/A]``, and a field may read ``N/A``.
- ``timedatectl show``: ``KEY=VALUE`` lines (``NTP=yes``, ``NTPSynchronized=yes``).
- ``chronyc -n tracking``: ``Leap status     : Normal`` (``Not synchronised`` when not).
- ``/etc/dgx-release``: ``KEY="VALUE"`` lines (``DGX_SWBUILD_VERSION="7.5.0"``).
- ``ethtool -i IFACE`` (per ConnectX-7 port, each after a ``== IFACE`` line the probe
  prints): ``firmware-version: 28.45.4028 (NVD0000000087)``, the PSID in parentheses.
- ``docker image inspect IMAGE``: a JSON array of one image object.
- the container facts: one JSON object printed by the image's ``python3``
  (:data:`pytest_spark.infra.alike.probe.CONTAINER_SCRIPT`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from pytest_spark.infra.errors import ParseError

NA = ("", "N/A", "[N/A]", "Not Supported", "[Not Supported]", "Unknown Error")


def known(value: str | None) -> str | None:
    """``value`` stripped, or None for the forms nvidia-smi prints for a field a GPU does
    not report (a GB10 says ``[N/A]`` / ``Not Supported`` for its memory)."""
    if value is None:
        return None
    v = value.strip()
    return None if v in NA else v


def parse_key_values(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (os-release, ``timedatectl show``); quotes around values
    dropped, comments and blank lines ignored."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def os_release_name(text: str) -> str | None:
    """PRETTY_NAME, else NAME VERSION_ID (e.g. ``Ubuntu 24.04.4 LTS``)."""
    kv = parse_key_values(text)
    if kv.get("PRETTY_NAME"):
        return kv["PRETTY_NAME"]
    name = " ".join(v for v in (kv.get("NAME"), kv.get("VERSION_ID")) if v)
    return name or None


def dgx_os_version(text: str) -> str | None:
    """DGX_SWBUILD_VERSION of /etc/dgx-release (``7.5.0``), or None without one."""
    return parse_key_values(text).get("DGX_SWBUILD_VERSION") or None


def parse_ethtool_firmware(text: str) -> dict[str, str]:
    """``{iface: firmware-version}`` from ``== IFACE`` blocks of ``ethtool -i IFACE``
    output (the PSID kept: two boards with the same firmware number and another PSID run
    another image)."""
    out: dict[str, str] = {}
    iface = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("== "):
            iface = line[3:].strip()
        elif iface and line.startswith("firmware-version:"):
            value = known(line.partition(":")[2])
            if value:
                out[iface] = value
    return out


_SMI_HEADER = re.compile(
    r"Driver Version:\s*(?P<driver>\S+)(?:\s+CUDA Version:\s*(?P<cuda>\S+))?", re.IGNORECASE
)


def parse_smi_versions(text: str) -> tuple[str | None, str | None]:
    """(driver version, CUDA version) from the header of ``nvidia-smi``'s table (or from
    ``nvidia-smi -q``'s ``Driver Version : X`` / ``CUDA Version : Y`` lines). ``N/A`` and
    absent fields are None."""
    m = _SMI_HEADER.search(text)
    if m:
        return known(m["driver"]), known(m["cuda"])
    driver = re.search(r"^\s*Driver Version\s*:\s*(.+?)\s*$", text, re.MULTILINE)
    cuda = re.search(r"^\s*CUDA Version\s*:\s*(.+?)\s*$", text, re.MULTILINE)
    return (known(driver[1]) if driver else None, known(cuda[1]) if cuda else None)


@dataclass(frozen=True)
class TimeSync:
    """A node's NTP state: ``synchronized`` None when the tool did not say."""

    source: str  # "timedatectl" or "chronyc"
    synchronized: bool | None
    ntp_enabled: bool | None = None
    detail: str = ""


def _yes_no(value: str | None) -> bool | None:
    if value is None:
        return None
    return {"yes": True, "no": False}.get(value.strip().lower())


def parse_timedatectl_show(text: str) -> TimeSync:
    kv = parse_key_values(text)
    if "NTPSynchronized" not in kv:
        raise ParseError("timedatectl show", "no NTPSynchronized= line")
    ntp = kv.get("NTP")
    detail = f"NTP={ntp or '?'}, NTPSynchronized={kv['NTPSynchronized']}"
    return TimeSync("timedatectl", _yes_no(kv["NTPSynchronized"]), _yes_no(ntp), detail)


def parse_chronyc_tracking(text: str) -> TimeSync:
    m = re.search(r"^Leap status\s*:\s*(.+?)\s*$", text, re.MULTILINE)
    if not m:
        raise ParseError("chronyc tracking", "no 'Leap status' line")
    leap = m[1]
    return TimeSync("chronyc", leap.lower() != "not synchronised", None, f"Leap status: {leap}")


@dataclass(frozen=True)
class ImageFacts:
    """``docker image inspect`` of the serving image. ``identity`` is what two nodes
    compare: the registry digests when the image came from a registry, else its content
    (layer diff IDs) and the config a container starts with. Two imports of one tarball
    get different IDs (the import time is in the config) but the same identity."""

    ref: str
    id: str
    repo_digests: tuple[str, ...]
    layers: tuple[str, ...]
    config: dict[str, Any] = field(default_factory=dict)
    created: str | None = None

    @property
    def identity(self) -> str:
        if self.repo_digests:
            return "digests " + ",".join(sorted(d.split("@", 1)[-1] for d in self.repo_digests))
        body = json.dumps({"layers": self.layers, "config": self.config}, sort_keys=True)
        return "content sha256:" + hashlib.sha256(body.encode()).hexdigest()

    @property
    def short_id(self) -> str:
        return self.id.removeprefix("sha256:")[:12]


RUNTIME_CONFIG = ("Env", "Entrypoint", "Cmd", "WorkingDir", "User")


def parse_image_inspect(text: str, ref: str) -> ImageFacts:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError("docker image inspect", f"not JSON ({exc})") from exc
    if isinstance(data, list):
        if not data:
            raise ParseError("docker image inspect", "empty list")
        data = data[0]
    if not isinstance(data, dict) or "Id" not in data:
        raise ParseError("docker image inspect", "no Id")
    config = data.get("Config") or {}
    rootfs = data.get("RootFS") or {}
    return ImageFacts(
        ref,
        str(data["Id"]),
        tuple(str(d) for d in data.get("RepoDigests") or ()),
        tuple(str(x) for x in rootfs.get("Layers") or ()),
        {k: config.get(k) for k in RUNTIME_CONFIG if config.get(k) not in (None, "", [])},
        data.get("Created"),
    )


@dataclass(frozen=True)
class NcclLibrary:
    path: str  # where the loader finds it (a link, e.g. .../libnccl.so.2)
    file: str  # the file it resolves to
    size: int
    sha256: str
    version: str | None  # from the library's own "NCCL version X" string
    build_id: str | None = None  # its ELF NT_GNU_BUILD_ID note, hex (readelf -n's Build ID)

    @property
    def short_sha(self) -> str:
        return self.sha256[:12]


@dataclass(frozen=True)
class ContainerFacts:
    """What the serving image holds: Python, vLLM, torch, the NCCL libraries in the
    order the loader would find them (the first is the one torch loads)."""

    python: str | None
    vllm: str | None
    torch: str | None
    nccl: tuple[NcclLibrary, ...]
    nccl_package: str | None = None  # nvidia-nccl-cu* wheel version, when installed

    @property
    def nccl_loaded(self) -> NcclLibrary | None:
        return self.nccl[0] if self.nccl else None


def parse_container_facts(text: str) -> ContainerFacts:
    line = next((ln for ln in reversed(text.splitlines()) if ln.strip().startswith("{")), "")
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ParseError("container facts", f"not JSON ({exc})", text.strip()[:200]) from exc
    if not isinstance(data, dict):
        raise ParseError("container facts", "not a JSON object")
    libs = []
    for lib in data.get("nccl") or ():
        libs.append(
            NcclLibrary(
                str(lib["path"]),
                str(lib.get("file") or lib["path"]),
                int(lib.get("bytes") or 0),
                str(lib["sha256"]),
                lib.get("version"),
                lib.get("build_id"),
            )
        )
    return ContainerFacts(
        data.get("python"), data.get("vllm"), data.get("torch"), tuple(libs), data.get("nccl_pkg")
    )
