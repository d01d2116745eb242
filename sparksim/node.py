"""Per-node files (keys, sshd/ssh configs, hosts, tools, state.json) and the sshd launch.

Each node's sshd runs as::

    nsenter --net=/run/netns/spk{k}-n{i} unshare --uts --pid --fork --kill-child \\
        --mount-proc --propagation private sh -c '<mounts>; exec sshd -D -f .../sshd_config'

so it has its own network namespace, hostname, PID 1, boot time (a time namespace: its
uptime counts from ``up``) and a private mount namespace with
a sysfs of its own network namespace (host cgroup mounts kept; /sys/class/infiniband the
node's GID tables, rdmasysfs.py), its own /tmp, /var/tmp and /dev/shm, in which the node's
tools dir covers ``/usr/local/sbin`` (first on sshd's default PATH), an
empty file covers ``/root/.bashrc`` (pyenv init costs ~130 ms per command), the node's
``ssh/`` dir covers ``/root/.ssh`` (head -> worker ssh works) and a cluster hosts file
covers ``/etc/hosts`` and a GB10's meminfo covers ``/proc/meminfo`` (sim/meminfo.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

from . import rdmasysfs
from .meminfo import write_meminfo
from .netns import SimError, run
from .topology import ALL_PORTS, FABRIC_TWINS, HEALTHY_RATE_MBPS, NodeSpec, Topology

SSHD = "/usr/sbin/sshd"
TOOLS = (
    "ibdev2netdev",
    "ibstat",
    "ibv_devinfo",
    "ibv_devices",
    "rdma",
    "nvidia-smi",
    "ethtool",
    "timedatectl",
    "journalctl",  # the node's kernel log (tools/kernellog.py; faults/gpu.py adds to it)
    "dmesg",
)
TOOLS_PKG = "sparksim_tools"
CABLED = {dev for _, dev, _ in FABRIC_TWINS}
FIRMWARE = "28.45.4028"
DRIVER_VERSION = "580.95.05"
DGX_OS_VERSION = "7.5.0"  # DGX OS on the Sparks of dgx-spark-playbooks PR #103 and PR #108
CUDA_VERSION = "13.0"
# An idle GB10 as nvidia-smi reads it (fixtures/gpu/README.md: 41-45 C, 208 of 3003 MHz,
# P8, ~4.5 W, persistence On, only the idle clocks event reason active).
GPU_HEALTH = {
    "temperature_c": 41,
    "sm_clock_mhz": 208,
    "max_sm_clock_mhz": 3003,
    "power_w": 4.21,
    "util_pct": 0,
    "pstate": "P8",
    "persistence": True,
    "reasons": ["gpu_idle"],
}
BOOT_LOG = (
    {"t": 0.0, "msg": "Booting Linux on physical CPU 0x0000000000 [0x410fd870]"},
    {"t": 4.21, "msg": "nvidia: loading out-of-tree module taints kernel."},
    {"t": 4.25, "msg": "nvidia-nvlink: Nvlink Core is being initialized, major device number 509"},
    {
        "t": 4.31,
        "msg": f"NVRM: loading NVIDIA UNIX Open Kernel Module for aarch64  {DRIVER_VERSION}  "
        "Release Build",
    },
)

# ethtool -S of a healthy ConnectX-7 port some time after its link came up: mlx5's names
# (en_stats.c), a non-zero link-down count from a past reseat, FEC-corrected bits (normal).
PORT_COUNTERS = {
    "rx_packets_phy": 48_817_230,
    "tx_packets_phy": 48_790_114,
    "rx_bytes_phy": 301_455_920_118,
    "tx_bytes_phy": 300_981_233_870,
    "rx_crc_errors_phy": 0,
    "rx_in_range_len_errors_phy": 0,
    "rx_out_of_range_len_phy": 0,
    "rx_oversize_pkts_phy": 0,
    "rx_symbol_err_phy": 0,
    "rx_unsupported_op_phy": 0,
    "rx_discards_phy": 0,
    "tx_discards_phy": 0,
    "tx_errors_phy": 0,
    "rx_undersize_pkts_phy": 0,
    "rx_fragments_phy": 0,
    "rx_jabbers_phy": 0,
    "link_down_events_phy": 1,
    "rx_pcs_symbol_err_phy": 0,
    "rx_corrected_bits_phy": 1024,
}

# The previous boot, as a persistent journal keeps it (tools/kernellog.py ``-b -1``): it
# booted three days before this one and ended with a clean shutdown, journald's own last
# line (fixtures/kernel/shutdown_tails.txt). ``t``: seconds from this boot's start.
PREVIOUS_UPTIME_S = 3 * 86400.0
SHUTDOWN_TAIL: tuple[tuple[float, str, str], ...] = (  # (t, identifier, message)
    (-42.0, "systemd[1]", "Stopped target Multi-User System."),
    (-41.0, "systemd[1]", "Unmounted /boot/efi."),
    (-40.5, "systemd[1]", "Reached target System Reboot."),
    (-40.0, "systemd-journald[1]", "Journal stopped"),
)


def previous_boot(node: NodeSpec) -> dict[str, object]:
    """state.json ``previous_boot``: its ID and lines (the boot log, then a clean end)."""
    start = -PREVIOUS_UPTIME_S
    log = [
        {"t": start + cast(float, line["t"]), "ident": "kernel", "msg": line["msg"]}
        for line in BOOT_LOG
    ]
    tail = [{"t": t, "ident": ident, "msg": msg} for t, ident, msg in SHUTDOWN_TAIL]
    return {"id": hashlib.md5(f"{node.name}-previous".encode()).hexdigest(), "log": log + tail}


def tools_python() -> str:
    """The interpreter baked into tool shebangs: the system one, free of pyenv shims."""
    for candidate in ("/usr/bin/python3", sys.executable):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise SimError("no python3 found for the node tools")


def keygen_many(jobs: list[tuple[Path, str]]) -> None:
    """Generate missing keys in parallel (ssh-keygen is a process launch each)."""
    procs = []
    for path, comment in jobs:
        if path.exists() and path.with_suffix(".pub").exists():
            continue
        for p in (path, path.with_suffix(".pub")):
            p.unlink(missing_ok=True)
        argv = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)]
        procs.append(
            (
                argv,
                subprocess.Popen(
                    argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
                ),
            )
        )
    for argv, proc in procs:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise SimError(f"`{' '.join(argv)}` failed: {err.strip()}")


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def pubkey(path: Path) -> str:
    return path.with_suffix(".pub").read_text().split("#")[0].strip()


def host_key_line(path: Path) -> str:
    """``ssh-ed25519 AAAA...`` without the comment."""
    return " ".join(pubkey(path).split()[:2])


def dgx_release(version: str) -> str:
    """A DGX's /etc/dgx-release (the KEY="VALUE" form NVIDIA/NemoClaw#9898 shows for a DGX
    Station; a Spark's own file is not public, its reports say "DGX OS 7.5.0")."""
    return (
        'DGX_NAME="DGX Spark"\n'
        'DGX_PRETTY_NAME="NVIDIA DGX Spark"\n'
        'DGX_SWBUILD_DATE="2026-06-16-11-48-10"\n'
        f'DGX_SWBUILD_VERSION="{version}"\n'
        'DGX_PLATFORM="DGX Spark"\n'
    )


def node_dir(state_dir: Path, node: NodeSpec) -> Path:
    return state_dir / "nodes" / node.name


def initial_state(node: NodeSpec) -> dict[str, object]:
    """DIR/nodes/<name>/state.json: what the fake tools cannot read from the kernel."""
    return {
        "node": node.name,
        "ca_type": "MT4129",
        "firmware": FIRMWARE,
        "ports": {
            dev: {
                "netdev": netdev,
                "rate_gbps": HEALTHY_RATE_MBPS // 1000,
                "cable": dev in CABLED,
            }
            for dev, netdev in ALL_PORTS
        },
        "gpu": {
            "driver_version": DRIVER_VERSION,
            "cuda_version": CUDA_VERSION,
            "gpus": [
                {
                    "index": 0,
                    "name": "NVIDIA GB10",
                    "uuid": "GPU-5f1e0c2a-7b3d-4c8e-9a61-%012x" % (0xA0000 + node.index),
                    "pci_bus_id": "0000000F:01:00.0",
                    "compute_cap": "12.1",
                }
            ],
            "processes": [],
            "health": dict(GPU_HEALTH),  # tools/gpu.py; faults/gpu.py changes it
        },
        "kernel_log": [dict(line) for line in BOOT_LOG],  # tools/kernellog.py
        # ethtool -S of each ConnectX port (tools/links.py): steady values, as a real port's
        # keep theirs across a run; faults/link.py's cable-flapping makes some rise.
        "port_counters": {netdev: dict(PORT_COUNTERS) for _, netdev in ALL_PORTS},
        "boot_id": hashlib.md5(f"{node.name}-boot".encode()).hexdigest(),
        "previous_boot": previous_boot(node),
        "time": {"ntp": True, "synchronized": True},  # timedatectl (tools/timesync.py)
    }


def read_state(state_dir: Path, node: NodeSpec) -> dict[str, object]:
    data: dict[str, object] = json.loads((node_dir(state_dir, node) / "state.json").read_text())
    return data


def write_state(state_dir: Path, node: NodeSpec, state: dict[str, object]) -> None:
    write_atomic(node_dir(state_dir, node) / "state.json", json.dumps(state, indent=2) + "\n")


def install_tools(state_dir: Path) -> Path:
    """Copy the tools package into DIR/lib so the state dir is self-contained."""
    lib = state_dir / "lib"
    dest = lib / TOOLS_PKG
    src = Path(__file__).resolve().parent / "tools"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return lib


def _ssh_quote(value: str) -> str:
    return f'"{value}"' if any(c.isspace() for c in value) else value


def write_client_files(state_dir: Path, topo: Topology) -> None:
    """DIR/ssh_config, DIR/known_hosts and DIR/authorized_keys for the host side."""
    identity = state_dir / "id_ed25519"
    known = state_dir / "known_hosts"
    blocks = [f"# written by spark-sim up (instance {topo.instance}); do not edit\n"]
    lines = []
    for node in topo.nodes:
        blocks.append(
            f"Host {node.mgmt}\n"
            f"    HostName {node.mgmt}\n"
            f"    User root\n"
            f"    Port 22\n"
            f"    IdentityFile {_ssh_quote(str(identity))}\n"
            f"    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {_ssh_quote(str(known))}\n"
            f"    GlobalKnownHostsFile /dev/null\n"
            f"    StrictHostKeyChecking yes\n"
            f"    BatchMode yes\n"
            f"    LogLevel ERROR\n"
        )
        key = host_key_line(node_dir(state_dir, node) / "ssh_host_ed25519_key")
        lines.append(f"{node.mgmt} {key}\n")
    write_atomic(state_dir / "ssh_config", "\n".join(blocks))
    write_atomic(known, "".join(lines))
    write_atomic(state_dir / "authorized_keys", pubkey(identity) + "\n", 0o600)


SSHD_LOG_LEVEL_ENV = "SPARKSIM_SSHD_LOG_LEVEL"
SSHD_LOG_LEVELS = ("QUIET", "FATAL", "ERROR", "INFO", "VERBOSE", "DEBUG1", "DEBUG2", "DEBUG3")


def sshd_log_level() -> str:
    """Each node's sshd LogLevel: INFO, or ``$SPARKSIM_SSHD_LOG_LEVEL`` at ``up``. DEBUG1
    logs every command a client runs (``req exec``): benchmarks/scale.py counts the
    suite's round trips per node in ``DIR/nodes/<name>/sshd.log`` that way."""
    level = os.environ.get(SSHD_LOG_LEVEL_ENV, "INFO").upper()
    if level not in SSHD_LOG_LEVELS:
        raise SimError(
            f"{SSHD_LOG_LEVEL_ENV}={level!r}: expected one of {', '.join(SSHD_LOG_LEVELS)}"
        )
    return level


def write_node_files(
    state_dir: Path, topo: Topology, node: NodeSpec, lib: Path, setenv: str
) -> None:
    """The node's tools, keys, hosts and sshd_config; ``setenv``: the one ``SetEnv`` line
    of its sshd (the serving stack's, serving.sshd_setenv)."""
    nd = node_dir(state_dir, node)
    ssh_dir = nd / "ssh"
    bin_dir = nd / "bin"
    for d in (nd, ssh_dir, bin_dir, nd / "cgroup"):
        d.mkdir(parents=True, exist_ok=True)
    os.chmod(ssh_dir, 0o700)
    identity = state_dir / "id_ed25519"

    write_atomic(
        nd / "sshd_config",
        f"# sparksim node {node.name} (instance {topo.instance})\n"
        "Port 22\n"
        # All of the node's own addresses (mgmt and fabric): the namespace holds no others.
        "ListenAddress 0.0.0.0\n"
        f"HostKey {nd / 'ssh_host_ed25519_key'}\n"
        "PidFile none\n"
        "UsePAM no\n"
        "PermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "AuthorizedKeysFile .ssh/authorized_keys\n"
        "StrictModes no\n"
        "UseDNS no\n"
        "PrintMotd no\n"
        "PrintLastLog no\n"
        "X11Forwarding no\n"
        "AcceptEnv LANG LC_*\n" + setenv + "MaxStartups 200:30:400\n"
        # The node's own Docker engine (sim/docker.py), never the host's /run/docker.sock,
        # and the launcher's docker args (sim/serving.py): one SetEnv line, sshd reads one.
        "MaxSessions 100\n"
        f"LogLevel {sshd_log_level()}\n"
        "Subsystem sftp internal-sftp\n",
    )
    write_atomic(nd / "empty", "")
    write_meminfo(nd / "meminfo")  # a GB10's /proc/meminfo (sim/meminfo.py)
    if not (nd / "dgx-release").exists():  # faults/alike.py rewrites it in place
        write_atomic(nd / "dgx-release", dgx_release(DGX_OS_VERSION))
    # The node's /etc/hosts: every node by hostname on the management network.
    hosts = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    hosts += [f"{n.mgmt}\t{n.name}" for n in topo.nodes]
    write_atomic(nd / "hosts", "\n".join(hosts) + "\n")

    # The node's ~/.ssh: the cluster client key, every node's host key, authorized_keys.
    shutil.copyfile(identity, ssh_dir / "id_ed25519")
    os.chmod(ssh_dir / "id_ed25519", 0o600)
    shutil.copyfile(identity.with_suffix(".pub"), ssh_dir / "id_ed25519.pub")
    write_atomic(ssh_dir / "authorized_keys", pubkey(identity) + "\n", 0o600)
    known = []
    for n in topo.nodes:
        names = ",".join([n.mgmt, n.name] + [p.addr for p in n.fabric])
        known.append(f"{names} {host_key_line(node_dir(state_dir, n) / 'ssh_host_ed25519_key')}")
    write_atomic(ssh_dir / "known_hosts", "\n".join(known) + "\n")
    write_atomic(
        ssh_dir / "config",
        "Host *\n    User root\n    StrictHostKeyChecking yes\n    IdentitiesOnly yes\n"
        "    IdentityFile ~/.ssh/id_ed25519\n",
        0o600,
    )

    python = tools_python()
    for tool in TOOLS:
        write_atomic(
            bin_dir / tool,
            f"#!{python} -IS\n"
            "import sys\n"
            f"sys.path.insert(0, {str(lib)!r})\n"
            f"from {TOOLS_PKG} import main\n"
            f"sys.exit(main({tool!r}, {str(nd)!r}, sys.argv[1:]))\n",
            0o755,
        )
    if not (nd / "state.json").exists():
        write_state(state_dir, node, initial_state(node))
    rdmasysfs.write(nd, node)


def _mount_script(
    state_dir: Path, node: NodeSpec, home_binds: list[tuple[Path, str]], keep: list[Path]
) -> str:
    nd = node_dir(state_dir, node)
    q = shlex.quote
    binds = [
        *home_binds,  # the node-private /root, first
        (nd / "bin", "/usr/local/sbin"),
        (nd / "ssh", "/root/.ssh"),
        (nd / "hosts", "/etc/hosts"),
        (nd / "empty", "/root/.bashrc"),
        (nd / "meminfo", "/proc/meminfo"),
    ]
    park = q(str(nd / "cgroup"))
    steps = [
        f"hostname {q(node.name)}",
        # A sysfs of the node's network namespace over /sys, keeping the host's cgroup
        # mounts under it (ip netns exec loses them, and dockerd in a node needs them).
        f"if mountpoint -q /sys/fs/cgroup; then mount --rbind /sys/fs/cgroup {park}; fi",
        "mount -t sysfs sysfs /sys",
        f"if mountpoint -q {park}; then mount --move {park} /sys/fs/cgroup; fi",
        # /sys/class/infiniband: the RDMA devices' GID tables (rdmasysfs.py), unless
        # its RDMA drivers are not loaded (fault no-rdma, faults/rdma.py)
        *rdmasysfs.mount_steps(nd, infiniband=read_state(state_dir, node).get("rdma") is not False),
    ]
    # /etc/dgx-release, which the host lacks: /etc under an overlay whose upper layer is a
    # tmpfs of this mount namespace (nothing lands in the host's /etc), the node's file
    # bound over it there.
    ovl = q(str(nd / "etc-overlay"))
    steps += [
        f"mkdir -p {ovl}",
        f"mount -t tmpfs sparksim-etc {ovl}",
        f"mkdir {ovl}/upper {ovl}/work",
        f"mount -t overlay sparksim-etc -o lowerdir=/etc,upperdir={ovl}/upper,"
        f"workdir={ovl}/work /etc",
        "touch /etc/dgx-release",
        f"mount --bind {q(str(nd / 'dgx-release'))} /etc/dgx-release",
    ]
    for src, dst in binds:
        steps.append(f"if [ -e {q(dst)} ]; then mount --bind {q(str(src))} {q(dst)}; fi")
    steps += _private_tmp_steps(state_dir, node, keep)
    steps.append(f"exec {SSHD} -D -f {q(str(nd / 'sshd_config'))} -E {q(str(nd / 'sshd.log'))}")
    return " && ".join(steps)


PRIVATE_TMP = ("/tmp", "/var/tmp")


def _private_tmp_steps(state_dir: Path, node: NodeSpec, keep: list[Path]) -> list[str]:
    """A node of its own /tmp and /var/tmp (DIR/nodes/<name>/tmp, .../var-tmp) and /dev/shm
    (a tmpfs), as a real node has: what one node leaves there is not seen, nor cleaned up,
    by another or by the host. The state dir and the folders the serving containers mount
    (torch, the engine's venv: a CI checkout may lie in /tmp), when they lie under one of
    them, are bound back at their own paths (the node's tools, keys, docker socket and logs
    live in the state dir; the node's dockerd resolves ``-v`` sources in the node)."""
    q = shlex.quote
    nd = node_dir(state_dir, node)
    keep = [state_dir.resolve(), *(p.resolve() for p in keep)]
    steps = []
    for path in PRIVATE_TMP:
        own = nd / path.strip("/").replace("/", "-")
        own.mkdir(mode=0o1777, exist_ok=True)
        os.chmod(own, 0o1777)
        for host in dict.fromkeys(keep):
            if host.is_relative_to(path) and host.exists():
                inner = own / host.relative_to(path)
                inner.mkdir(parents=True, exist_ok=True)
                steps.append(f"mount --bind {q(str(host))} {q(str(inner))}")
        steps.append(f"mount --rbind {q(str(own))} {q(path)}")
    steps.append("mount -t tmpfs -o mode=1777,nosuid,nodev sparksim-shm /dev/shm")
    return steps


def start_sshd(
    state_dir: Path, node: NodeSpec, home_binds: list[tuple[Path, str]], keep: list[Path]
) -> int:
    """Launch the node's sshd detached from us; return the host PID of its wrapper.

    ``home_binds``: the node's private /root and what it must see inside it, mounted before
    the sim core's own binds (serving.node_binds); ``keep``: host folders under /tmp that
    the node must still see at their own paths (serving.container_sources)."""
    if not os.access(SSHD, os.X_OK):
        raise SimError(f"{SSHD} missing: apt-get install openssh-server")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    os.makedirs("/root/.ssh", mode=0o700, exist_ok=True)  # mount point for the node's ~/.ssh
    nd = node_dir(state_dir, node)
    argv = [
        "nsenter", f"--net=/run/netns/{node.netns}",
        "unshare", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc",
        "--propagation", "private", *boot_now(),
        "/bin/sh", "-c", _mount_script(state_dir, node, home_binds, keep),
    ]  # fmt: skip
    launch = f"{shlex.join(argv)} </dev/null >>{shlex.quote(str(nd / 'node.log'))} 2>&1 & echo $!"
    out = run(["/bin/sh", "-c", launch]).strip()
    pid = int(out)
    write_atomic(nd / "sshd.pid", f"{pid}\n")
    return pid


def boot_now() -> list[str]:
    """``unshare`` options for a time namespace whose boot is now: the node's /proc/uptime
    counts from ``spark-sim up``, as old as its fabric netdevs (a real node's appear at
    boot), whatever the machine's own uptime. None where the kernel has no time namespaces.
    """
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        offsets = Path("/proc/self/timens_offsets").read_text()
    except (OSError, ValueError, IndexError):
        return []
    ours = 0  # offsets are against the host clock; we may sit in a time namespace already
    for line in offsets.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("boottime", "7") and parts[1].lstrip("-").isdigit():
            ours = int(parts[1])
    return ["--time", "--boottime", str(-int(uptime - ours))]


def read_pid(state_dir: Path, node: NodeSpec) -> int | None:
    try:
        return int((node_dir(state_dir, node) / "sshd.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def ssh_banner(addr: str, timeout: float = 1.0) -> bool:
    """True when an SSH server answers on addr:22."""
    try:
        with socket.create_connection((addr, 22), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(64).startswith(b"SSH-2.0-")
    except OSError:
        return False


def wait_sshd(state_dir: Path, nodes: tuple[NodeSpec, ...], timeout: float = 15.0) -> None:
    pending = list(nodes)
    deadline = time.monotonic() + timeout
    while pending:
        pending = [n for n in pending if not ssh_banner(n.mgmt, timeout=0.5)]
        if not pending:
            return
        if time.monotonic() > deadline:
            n = pending[0]
            log = node_dir(state_dir, n) / "node.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise SimError(
                f"{n.name}: sshd did not answer on {n.mgmt}:22 within {timeout:.0f} s; "
                f"see {log}\n{tail}"
            )
        time.sleep(0.02)
