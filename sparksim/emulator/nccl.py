"""The NCCL library a rank maps, as a real rank's loader would pick it: the
``libnccl.so.2`` of the first ``LD_LIBRARY_PATH`` directory that has one, else the
``nvidia-nccl-cu13`` wheel's (torch's own RPATH), plus ``VLLM_NCCL_SO_PATH`` when it
names another file (vLLM's pynccl loads that one by path). The file is really mapped
(``mmap``), so ``/proc/PID/maps`` of the rank names it, with the kernel's resolved path.

Run-time faults (control.json), for the serving stack's rows:

- ``nccl-system-build``: the rank maps the image's system ``libnccl2`` (DGX OS's build of
  the same version) in place of the wheel's, as a rank started with its
  ``/usr/lib/<arch>`` first on LD_LIBRARY_PATH does (vllm-project/vllm#41725);
- ``nccl-two-builds``: the rank maps the system build beside the wheel's, as one whose
  pynccl loads VLLM_NCCL_SO_PATH after torch loaded the wheel's.

The emulator swaps the mapping in the running rank so the row runs on the serving stack;
what the suite reads is the kernel's maps of a real file either way.
"""

from __future__ import annotations

import mmap
import os
import site
import sys
import threading

from .faults import FaultState

SONAME = "libnccl.so.2"
WHEEL_REL = os.path.join("nvidia", "nccl", "lib", SONAME)
SYSTEM_DIRS = ("/usr/lib/aarch64-linux-gnu", "/usr/lib/x86_64-linux-gnu")


def _wheel() -> str | None:
    roots = [*site.getsitepackages(), *sys.path]
    for root in roots:
        path = os.path.join(root, WHEEL_REL)
        if root and os.path.isfile(path):
            return path
    return None


def _system() -> str | None:
    for d in SYSTEM_DIRS:
        path = os.path.join(d, SONAME)
        if os.path.isfile(path):
            return path
    return None


def chosen(env: dict[str, str] | os._Environ[str] = os.environ) -> list[str]:
    """The files a rank loads, in order (see the module docstring)."""
    first = None
    for d in (env.get("LD_LIBRARY_PATH") or "").split(":"):
        if d and os.path.isfile(os.path.join(d, SONAME)):
            first = os.path.join(d, SONAME)
            break
    first = first or _wheel()
    out = [first] if first else []
    extra = env.get("VLLM_NCCL_SO_PATH")
    if extra and os.path.isfile(extra) and not any(os.path.samefile(extra, p) for p in out):
        out.append(extra)
    return out


class LoadedNccl:
    """The rank's mappings, following the run-time faults."""

    def __init__(self, faults: FaultState | None, poll_s: float = 0.5) -> None:
        self.faults = faults
        self.poll_s = poll_s
        self.maps: dict[str, mmap.mmap] = {}
        self._stop = threading.Event()

    def _map(self, path: str) -> None:
        if path in self.maps:
            return
        try:
            with open(path, "rb") as fh:
                self.maps[path] = mmap.mmap(
                    fh.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ
                )
        except (OSError, ValueError):
            pass

    def _unmap(self, path: str) -> None:
        m = self.maps.pop(path, None)
        if m is not None:
            m.close()

    def want(self) -> list[str]:
        files = chosen()
        active = self.faults.active if self.faults is not None else (lambda _n: False)
        system = _system()
        if system and active("nccl-system-build"):
            files = [system, *files[1:]]
        if system and active("nccl-two-builds") and system not in files:
            files.append(system)
        return files

    def apply(self) -> None:
        want = self.want()
        for path in list(self.maps):
            if path not in want:
                self._unmap(path)
        for path in want:
            self._map(path)

    def start(self) -> LoadedNccl:
        """Map now; with faults, follow them on a thread of its own."""
        self.apply()
        if self.faults is not None:
            threading.Thread(target=self._follow, name="nccl-loader", daemon=True).start()
        return self

    def _follow(self) -> None:
        assert self.faults is not None
        while not self._stop.wait(self.poll_s):
            self.faults.poll()
            self.apply()

    def stop(self) -> None:
        self._stop.set()
