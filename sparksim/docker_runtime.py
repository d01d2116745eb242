"""The ``nvidia`` runtime and hook of the node engines (see :mod:`.docker`).

``nvidia-container-runtime``: the engines' default runtime, a wrapper around runc that fits
each OCI process spec to what this machine can grant (capabilities outside its bounding
set and rlimits above its hard limits are dropped: ``--privileged`` and ``--ulimit
nofile=1048576`` would otherwise fail here) and then runs runc, as NVIDIA's runtime edits
the spec before runc on a Spark.

``nvidia-container-runtime-hook``: a no-op on dockerd's PATH; its presence is what makes
dockerd register its NVIDIA device driver, so ``docker run --gpus all`` works as on a
Spark (there is no GPU to hand over).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .netns import SimError

LIB = "docker"  # DIR/lib/docker holds both scripts
RUNTIME = "nvidia"


def lib_dir(state_dir: Path) -> Path:
    return state_dir / "lib" / LIB


_RUNTIME = r"""#!/bin/sh
# nvidia-container-runtime of a sparksim node (see sparksim/docker.py): fits the
# OCI process spec to what this machine can grant, then runs runc.
spec=""; action=""; prev=""
for a in "$@"; do
    case "$prev" in
        --bundle|-b) [ "$action" = create ] && spec="$a/config.json" ;;
        --process|-p) [ "$action" = exec ] && spec="$a" ;;
    esac
    case "$a" in
        create|run|exec) [ -z "$action" ] && action="$a" ;;
    esac
    prev="$a"
done
if [ -n "$spec" ] && [ -f "$spec" ]; then
    PYTHON -I -c "$(cat <<'EOF'
import json, os, resource, sys
path = sys.argv[1]
with open(path) as fh:
    spec = json.load(fh)
with open("/proc/self/status") as fh:
    bnd = int(next(l.split()[1] for l in fh if l.startswith("CapBnd:")), 16)
names = CAPS
allowed = {n for i, n in enumerate(names) if bnd >> i & 1}
proc = spec.get("process", spec)  # config.json has "process"; `runc exec` gets it bare
caps = proc.get("capabilities") or {}
for key, values in caps.items():
    caps[key] = [c for c in values or [] if c in allowed or c not in names]
if not bnd >> 24 & 1:  # no CAP_SYS_RESOURCE: rlimits cannot go above the hard limits
    for rl in proc.get("rlimits") or []:
        res = getattr(resource, rl.get("type", ""), None)
        if res is None:
            continue
        hard = resource.getrlimit(res)[1]
        if hard != resource.RLIM_INFINITY:
            rl["hard"] = min(int(rl["hard"]), hard)
            rl["soft"] = min(int(rl["soft"]), rl["hard"])
with open(path + ".tmp", "w") as fh:
    json.dump(spec, fh)
os.replace(path + ".tmp", path)
EOF
)" "$spec" || exit 1
fi
exec RUNC "$@"
"""
_HOOK = """#!/bin/sh
# nvidia-container-runtime-hook of a sparksim node: there is no GPU to hand over.
cat >/dev/null
exit 0
"""
CAP_NAMES = (
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
    "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
    "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
)  # fmt: skip


def install_lib(state_dir: Path, python: str) -> Path:
    """DIR/lib/docker/{nvidia-container-runtime, nvidia-container-runtime-hook}."""
    runc = shutil.which("runc", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if runc is None:
        raise SimError("runc not installed (apt-get install docker.io)")
    lib = lib_dir(state_dir)
    lib.mkdir(parents=True, exist_ok=True)
    runtime = (
        _RUNTIME.replace("PYTHON", python)
        .replace("RUNC", runc)
        .replace("CAPS", repr(list(CAP_NAMES)))
    )
    for name, text in (
        ("nvidia-container-runtime", runtime),
        ("nvidia-container-runtime-hook", _HOOK),
    ):
        path = lib / name
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    return lib
