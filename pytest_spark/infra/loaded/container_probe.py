"""The script the loaded probe runs with the serving container's own ``python3`` (standard
library only; sent as text, with :mod:`pytest_spark.infra.loaded.elf_parse` before it): one
JSON line of what the container's serving processes loaded.

Rank processes: every process of the container that mapped a ``libnccl.so*`` file
(``/proc/PID/maps``; matched on the basename, so NCCL's ``/dev/shm/nccl-*`` segments are
not taken for it), and the serving processes as the readiness watch names them (``vllm
serve``, ``VLLM::`` titles, Ray's ``ray::`` workers) even before they load NCCL. For each:
its PID, its command line (cut), the libnccl paths it mapped and its NCCL/GLOO/UCX/TP/
vLLM/Ray environment (``/proc/PID/environ``; names holding KEY, TOKEN, SECRET or PASSWORD
left out; names given as arguments are kept too: a sparkrun recipe's ``env:`` entries).
For each mapped file: its size and Build ID (read from the file's PT_NOTE, a few KiB).
The vllm package tree (found with ``importlib.util.find_spec``, nothing imported): its
files' SHA-256 in path order; a file over 8 MiB (the native extensions) is hashed by its
size and its first and last MiB, which keeps a node under a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # in the container it is defined just above this script (elf_parse)
    from pytest_spark.infra.loaded.elf_parse import build_id_of

SERVING = re.compile(r"\bvllm serve\b|VLLM::|ray::")
ENV_PREFIXES = ("NCCL_", "GLOO_", "UCX_", "TP_", "OMPI_", "VLLM_", "RAY_", "MN_IF_NAME")
ENV_NAMES = ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF")
HIDDEN = re.compile(r"KEY|TOKEN|SECRET|PASSWORD")
BIG = 8 << 20
EDGE = 1 << 20


def _read(path: str, mode: str = "rb") -> Any:
    try:
        with open(path, mode) as fh:
            return fh.read()
    except OSError:
        return None


def _env(pid: str, extra: tuple[str, ...] = ()) -> dict[str, str]:
    raw = _read(f"/proc/{pid}/environ") or b""
    out = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.decode("utf-8", "replace").partition("=")
        if not sep or HIDDEN.search(name):
            continue
        if name.startswith(ENV_PREFIXES) or name in ENV_NAMES or name in extra:
            out[name] = value
    return out


def nccl_paths_in(maps_text: str) -> list[str]:
    """The libnccl files a /proc/PID/maps text maps, in order, each once (by basename:
    NCCL's /dev/shm/nccl-* segments are not the library)."""
    paths = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        name = parts[5] if len(parts) == 6 else ""
        if os.path.basename(name).startswith("libnccl.so") and name not in paths:
            paths.append(name)
    return paths


def _lib(path: str) -> dict[str, Any]:
    if path.endswith(" (deleted)"):
        return {"error": "replaced on disk since the rank mapped it"}
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            return {"size": size, "build_id": build_id_of(fh)}
    except (OSError, ValueError) as exc:
        return {"error": str(exc)}


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size <= BIG:
            h.update(fh.read())
        else:
            h.update(b"size %d " % size)
            h.update(fh.read(EDGE))
            fh.seek(size - EDGE)
            h.update(fh.read(EDGE))
    return h.hexdigest()


def _vllm_tree() -> dict[str, Any]:
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError) as exc:
        return {"error": f"find_spec('vllm'): {exc}"}
    roots = list(spec.submodule_search_locations or []) if spec else []
    if not roots:
        return {"error": "no vllm package on the container's python3 path"}
    root = roots[0]
    files = {}
    for d, dirs, names in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for name in sorted(names):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(d, name)
            try:
                files[os.path.relpath(path, root)] = _file_digest(path)
            except OSError:
                continue
    total = hashlib.sha256()
    for rel in sorted(files):
        total.update(f"{rel}\0{files[rel]}\n".encode())
    return {
        "root": root,
        "digest": total.hexdigest(),
        "files": {rel: digest[:12] for rel, digest in files.items()},
    }


def main() -> None:
    start = time.monotonic()
    procs: list[dict[str, Any]] = []
    me = os.getpid()
    extra = tuple(sys.argv[1:])  # python3 -c SCRIPT NAME...: more environment names to keep
    for entry in sorted(os.listdir("/proc"), key=lambda s: (len(s), s)):
        if not entry.isdigit() or int(entry) == me:
            continue
        raw = _read(f"/proc/{entry}/cmdline") or b""
        cmd = raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()
        paths = nccl_paths_in(_read(f"/proc/{entry}/maps", "r") or "")
        if not paths and not SERVING.search(cmd):
            continue
        procs.append(
            {"pid": int(entry), "cmd": cmd[:300], "nccl": paths, "env": _env(entry, extra)}
        )
    libs = {p: _lib(p) for proc in procs for p in proc["nccl"]}
    tree = _vllm_tree()
    print(
        json.dumps(
            {"procs": procs, "libs": libs, "vllm": tree, "elapsed_s": time.monotonic() - start}
        )
    )


if __name__ == "__main__":
    main()
