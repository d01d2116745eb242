"""A real Docker engine per node: ``dockerd`` inside the node's namespaces.

Each node's engine runs as::

    nsenter -t <node PID 1> -m -u -p -n -- unshare -m --propagation private sh -c '...'

i.e. in the node's network, UTS, PID and mount namespaces (it sees the node's /etc/hosts,
tools and home), plus a mount namespace of its own in which it gets:

- the cgroup hierarchies, mounted again when the node does not show the host's;
- private tmpfs on /run/docker (its exec-root and plugin dir) and /run/containerd (the
  shim sockets containerd 1.6 puts there whatever its config says);
- a node-private /etc/docker (dockerd writes key.json there).

Its data-root, pidfile, log and socket live in ``DIR/nodes/<name>/docker/`` and
``DIR/nodes/<name>/docker.sock``; the node's sshd exports ``DOCKER_HOST`` pointing at that
socket, so ``ssh node docker ps`` needs no flags. Containers go into the cgroup
``sparksim-<netns>`` below dockerd's own cgroups; ``stop`` removes every container, stops
the engine and deletes those cgroups and the data-root.

The engine's default runtime is an ``nvidia`` runtime and dockerd finds an NVIDIA hook,
as on a DGX Spark (:mod:`.docker_runtime`): ``docker run --privileged --gpus all`` works.
Containers get docker-init as PID 1 (daemon.json ``init``), so ``docker stop`` of a
``sleep infinity`` container is immediate instead of the real 10 s grace.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from .docker_runtime import RUNTIME, install_lib
from .netns import SimError, kill_pids, pid_alive

DOCKERD = "/usr/sbin/dockerd"
NOFILE_SOFT, NOFILE_HARD = 1024, 524288  # dockerd's open-files limit, as systemd sets it
RUN_DIRS = ("/run/docker", "/run/containerd")
CREATED_RUN_DIRS = Path("/run/sparksim/docker-run-dirs.json")
DRIVER_ENV = "SPARKSIM_DOCKER_STORAGE_DRIVER"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
MAX_SOCKET_PATH = 100  # sun_path is 108 bytes
CGROUP_V1_CONTROLLERS = frozenset({
    "cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "net_cls",
    "net_prio", "perf_event", "hugetlb", "rdma", "misc",
})  # fmt: skip


class Engine:
    """Paths of one node's engine (``node_dir`` is ``DIR/nodes/<name>``)."""

    def __init__(self, node_dir: Path, netns: str) -> None:
        self.node_dir = node_dir
        self.netns = netns
        self.dir = node_dir / "docker"
        self.socket = node_dir / "docker.sock"
        self.data_root = self.dir / "data"
        self.etc = self.dir / "etc"
        self.config = self.dir / "daemon.json"
        self.log = self.dir / "dockerd.log"
        self.pidfile = self.dir / "dockerd.pid"  # written by dockerd (PID in the node)
        self.host_pidfile = self.dir / "dockerd.hostpid"  # written by us (PID on the host)
        self.cgroups_file = self.dir / "cgroups.json"

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def cgroup_parent(self) -> str:
        """Unique per engine: sims in sandboxes may reuse namespace names."""
        tag = hashlib.sha1(str(self.node_dir).encode()).hexdigest()[:8]
        return f"sparksim-{self.netns}-{tag}"

    def host_pid(self) -> int | None:
        try:
            pid = int(self.host_pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None


# ----------------------------------------------------------------- Engine API


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


def api(sock: Path, method: str, path: str, timeout: float = 10.0) -> tuple[int, Any]:
    """One Docker Engine API call over the node's socket: (status, decoded JSON or text)."""
    conn = _UnixHTTPConnection(sock, timeout)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        body = resp.read().decode(errors="replace")
    finally:
        conn.close()
    try:
        return resp.status, json.loads(body) if body else None
    except json.JSONDecodeError:
        return resp.status, body


def ping(sock: Path) -> bool:
    try:
        status, _ = api(sock, "GET", "/_ping", timeout=1.0)
    except OSError:
        return False
    return status == 200


def containers(engine: Engine) -> list[dict[str, Any]]:
    status, data = api(engine.socket, "GET", "/containers/json?all=1")
    if status != 200 or not isinstance(data, list):
        raise SimError(f"{engine.node_dir.name}: docker API /containers/json -> {status}")
    return data


def remove_all_containers(engine: Engine) -> int:
    removed = 0
    for c in containers(engine):
        status, data = api(
            engine.socket, "DELETE", f"/containers/{c['Id']}?force=1&v=1", timeout=STOP_TIMEOUT
        )
        if status not in (204, 404):
            raise SimError(f"{engine.node_dir.name}: docker rm -f {c['Id'][:12]}: {data}")
        removed += 1
    return removed


# ------------------------------------------------------------------ host side


def missing() -> str | None:
    """Why engines cannot run here, or None."""
    if not os.access(DOCKERD, os.X_OK):
        return f"{DOCKERD} not installed (apt-get install docker.io)"
    for tool in ("containerd", "runc", "nsenter", "unshare"):
        if shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
            return f"{tool} not installed (apt-get install docker.io util-linux)"
    return None


def storage_driver(probe_parent: Path) -> str:
    """overlay2 where the data-root's filesystem takes an overlay mount, else vfs."""
    forced = os.environ.get(DRIVER_ENV)
    if forced:
        return forced
    probe = probe_parent / ".overlay-probe"
    shutil.rmtree(probe, ignore_errors=True)
    for d in ("lower", "upper", "work", "merged"):
        (probe / d).mkdir(parents=True)
    opts = f"lowerdir={probe}/lower,upperdir={probe}/upper,workdir={probe}/work"
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private",
         "mount", "-t", "overlay", "overlay", "-o", opts, str(probe / "merged")],
        capture_output=True, text=True,
    )  # fmt: skip
    shutil.rmtree(probe, ignore_errors=True)
    return "overlay2" if proc.returncode == 0 else "vfs"


def _cgroup_mounts() -> list[tuple[str, str, str]]:
    """(path under /sys/fs/cgroup, fstype, options) of the host's cgroup mounts."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(rfields) < 3 or rfields[0] not in ("cgroup", "cgroup2"):
                continue
            mnt = fields[4]
            if mnt != "/sys/fs/cgroup" and not mnt.startswith("/sys/fs/cgroup/"):
                continue
            opts = [o for o in rfields[2].split(",") if o not in ("rw", "ro")]
            if rfields[0] == "cgroup" and not any(
                o in CGROUP_V1_CONTROLLERS or o.startswith("name=") for o in opts
            ):
                continue
            if rfields[0] == "cgroup" and any(o.startswith("name=") for o in opts):
                opts = ["none", *opts]
            found.append((os.path.relpath(mnt, "/sys/fs/cgroup"), rfields[0], ",".join(opts)))
    return found


def _engine_script(engine: Engine, driver: str, lib: Path) -> str:
    q = shlex.quote
    steps = ["set -e"]
    mounts = _cgroup_mounts()
    if mounts:  # the node may already show the host's hierarchies (then keep them)
        first = "/sys/fs/cgroup" if mounts[0][0] == "." else f"/sys/fs/cgroup/{mounts[0][0]}"
        steps.append(f"if ! mountpoint -q {q(first)}; then")
    if any(rel == "." for rel, _, _ in mounts):  # pure cgroup v2
        steps.append("mount -t cgroup2 cgroup2 /sys/fs/cgroup")
    elif mounts:
        steps.append("mount -t tmpfs -o mode=755 sparksim-cgroup /sys/fs/cgroup")
        for rel, fstype, opts in mounts:
            target = q(f"/sys/fs/cgroup/{rel}")
            o = f"-o {q(opts)} " if opts else ""
            steps.append(f"mkdir -p {target}; mount -t {fstype} {o}{fstype} {target}")
    if mounts:
        steps.append("fi")
    steps += [
        "mount -t tmpfs -o mode=755 sparksim-docker /run/docker",
        "mount -t tmpfs -o mode=711 sparksim-containerd /run/containerd",
        f"mount --bind {q(str(engine.etc))} /etc/docker",
        f"export PATH={q(str(lib))}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    ]
    argv = [
        DOCKERD,
        "--config-file", str(engine.config),
        "--data-root", str(engine.data_root),
        "--exec-root", "/run/docker",
        "--pidfile", str(engine.pidfile),
        "-H", engine.host,
        "--bridge=none", "--iptables=false", "--ip6tables=false",
        "--ip-masq=false", "--ip-forward=false", "--userland-proxy=false",
        "--storage-driver", driver,
        "--cgroup-parent", engine.cgroup_parent,
    ]  # fmt: skip
    # systemd's default for a service without LimitNOFILE (docker.service has none since
    # Docker 25): soft 1024, hard 524288 (systemd 240+). Below nr_open only.
    steps.append(f"{{ ulimit -Hn {NOFILE_HARD} && ulimit -Sn {NOFILE_SOFT}; }} 2>/dev/null || true")
    steps.append("exec " + shlex.join(argv))
    return "\n".join(steps)


def _ensure_run_dirs() -> None:
    """The mount points of the engines' private /run/docker and /run/containerd; the ones
    we create are recorded so that the last ``stop`` removes them."""
    created = _created_run_dirs()
    for d in RUN_DIRS:
        if not os.path.isdir(d):
            os.makedirs(d, mode=0o755)
            created.add(d)
    CREATED_RUN_DIRS.parent.mkdir(parents=True, exist_ok=True)
    CREATED_RUN_DIRS.write_text(json.dumps(sorted(created)) + "\n")


def _created_run_dirs() -> set[str]:
    try:
        return set(json.loads(CREATED_RUN_DIRS.read_text()))
    except (OSError, ValueError):
        return set()


def node_pid1(wrapper_pid: int) -> int:
    """Host PID of a node's PID 1 (the sshd under the sim core's unshare wrapper)."""
    deadline = time.monotonic() + 5.0
    while True:
        try:
            children = Path(f"/proc/{wrapper_pid}/task/{wrapper_pid}/children").read_text()
        except OSError as exc:
            raise SimError(f"node wrapper {wrapper_pid} is gone: {exc}") from exc
        if children.split():
            return int(children.split()[0])
        if time.monotonic() > deadline:
            raise SimError(f"node wrapper {wrapper_pid} has no child process")
        time.sleep(0.01)


def launch(engine: Engine, wrapper_pid: int, lib: Path) -> subprocess.Popen[bytes]:
    """Start the engine of one node (does not wait for it)."""
    if len(str(engine.socket)) > MAX_SOCKET_PATH:
        raise SimError(
            f"docker socket path too long for a unix socket ({engine.socket}); "
            "use a shorter --state-dir"
        )
    shutil.rmtree(engine.dir, ignore_errors=True)
    engine.socket.unlink(missing_ok=True)
    for d in (engine.dir, engine.data_root, engine.etc):
        d.mkdir(parents=True, exist_ok=True)
    os.chmod(engine.data_root, 0o710)
    engine.config.write_text(
        json.dumps(
            {
                "runtimes": {
                    RUNTIME: {"path": str(lib / "nvidia-container-runtime"), "runtimeArgs": []}
                },
                "default-runtime": RUNTIME,
                # docker-init as PID 1: `sleep infinity` alone ignores SIGTERM, so every
                # `docker stop` would sit out its 10 s grace before the kill it ends in anyway.
                "init": True,
                "log-opts": {"max-size": "50m", "max-file": "2"},
            },
            indent=2,
        )
        + "\n"
    )
    driver = storage_driver(engine.dir)
    pid1 = node_pid1(wrapper_pid)
    argv = [
        "nsenter", "-t", str(pid1), "-m", "-u", "-p", "-n", "--",
        "unshare", "-m", "--propagation", "private",
        "/bin/sh", "-c", _engine_script(engine, driver, lib),
    ]  # fmt: skip
    with open(engine.log, "ab") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
        )
    return proc


def _record_host_pid(engine: Engine, proc: subprocess.Popen[bytes]) -> None:
    """dockerd is the child nsenter forks into the node's PID namespace."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return
        try:
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        except OSError:
            kids = []
        if kids:
            engine.host_pidfile.write_text(f"{kids[0]}\n")
            return
        time.sleep(0.005)


def _record_cgroups(engine: Engine, host_pid: int) -> None:
    """Where the engine's containers' cgroups will be, as seen from the host."""
    paths = []
    mounts = {rel: fstype for rel, fstype, _ in _cgroup_mounts()}
    try:
        lines = Path(f"/proc/{host_pid}/cgroup").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            rel = "." if "." in mounts else "unified" if "unified" in mounts else None
        else:
            names = [c for c in controllers.split(",")]
            rel = next((r for r in mounts if r != "." and set(r.split(",")) == set(names)), None)
            if rel is None:  # e.g. "name=systemd" -> /sys/fs/cgroup/systemd
                rel = next((r for r in mounts if names[0].removeprefix("name=") == r), None)
        if rel is None:
            continue
        base = "/sys/fs/cgroup" if rel == "." else f"/sys/fs/cgroup/{rel}"
        paths.append(os.path.normpath(f"{base}/{path}/{engine.cgroup_parent}"))
    engine.cgroups_file.write_text(json.dumps(sorted(set(paths)), indent=2) + "\n")


def wait_ready(
    engines: list[tuple[Engine, subprocess.Popen[bytes]]], timeout: float = START_TIMEOUT
) -> dict[str, float]:
    """Wait until every engine answers /_ping; seconds each took from now."""
    start = time.monotonic()
    ready: dict[str, float] = {}
    for engine, proc in engines:
        _record_host_pid(engine, proc)
    pending = list(engines)
    while pending:
        still = []
        for engine, proc in pending:
            if ping(engine.socket):
                ready[engine.node_dir.name] = time.monotonic() - start
                pid = engine.host_pid()
                if pid:
                    _record_cgroups(engine, pid)
            elif proc.poll() is not None:
                raise SimError(
                    f"{engine.node_dir.name}: dockerd exited "
                    f"(rc {proc.returncode}); see {engine.log}:\n" + _tail(engine.log)
                )
            else:
                still.append((engine, proc))
        pending = still
        if pending and time.monotonic() - start > timeout:
            engine = pending[0][0]
            raise SimError(
                f"{engine.node_dir.name}: dockerd did not answer on "
                f"{engine.socket} within {timeout:.0f} s; see {engine.log}:\n" + _tail(engine.log)
            )
        if pending:
            time.sleep(0.02)
    return ready


def _tail(path: Path, size: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-size:]
    except OSError:
        return ""


def start_engines(
    node_dirs: list[tuple[Path, str, int]], state_dir: Path, python: str
) -> tuple[list[Engine], dict[str, float]]:
    """Start dockerd on every (node_dir, netns, sshd wrapper pid); wait for all."""
    lib = install_lib(state_dir, python)
    _ensure_run_dirs()
    launched = []
    try:
        for nd, netns, wrapper in node_dirs:
            engine = Engine(nd, netns)
            launched.append((engine, launch(engine, wrapper, lib)))
        ready = wait_ready(launched)
    except BaseException:
        stop_engines([e for e, _ in launched])
        raise
    return [e for e, _ in launched], ready


# ------------------------------------------------------------------------ stop


def _remove_cgroups(engine: Engine) -> None:
    try:
        parents = json.loads(engine.cgroups_file.read_text())
    except (OSError, ValueError):
        return
    for parent in parents:
        if not os.path.isdir(parent):
            continue
        # Deepest first: containers' cgroups, then the parent itself.
        for root, dirs, _ in sorted(os.walk(parent, topdown=False), key=lambda t: -len(t[0])):
            _ = dirs
            deadline = time.monotonic() + 2.0
            while True:
                try:
                    os.rmdir(root)
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last task exits
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)


def stop_engines(engines: list[Engine]) -> list[str]:
    """Remove every container, stop the engines, delete their cgroups and files."""
    done: list[str] = []
    running: list[tuple[Engine, int]] = []
    for engine in engines:  # containers first, while the engines still answer
        pid = engine.host_pid()
        if pid is None:
            continue
        running.append((engine, pid))
        try:
            n = remove_all_containers(engine)
        except (OSError, SimError):
            continue  # a wedged engine: it is killed below
        if n:
            done.append(f"{n} containers on {engine.node_dir.name}")
    # Each engine's containerd, and where its log stood, before the SIGTERM.
    stopping = [(e, pid, _children(pid), _size(e.log)) for e, pid in running]
    for _, pid, _, _ in stopping:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for engine, pid, containerd, log_from in stopping:
        while pid_alive(pid) and time.monotonic() < deadline:
            if _shut_down(engine, containerd, log_from):
                break
            time.sleep(0.02)
        if pid_alive(pid):
            kill_pids([pid])
        done.append(f"dockerd on {engine.node_dir.name}")
    for engine in engines:
        _remove_cgroups(engine)
        shutil.rmtree(engine.dir, ignore_errors=True)
        engine.socket.unlink(missing_ok=True)
    _remove_run_dirs()
    return done


SHUTDOWN_DONE = b'msg="Daemon shutdown complete"'


def _children(pid: int) -> set[int]:
    """Child PIDs of ``pid``, whichever of its threads forked them (Go's exec)."""
    kids: set[int] = set()
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return kids
    for tid in tasks:
        with contextlib.suppress(OSError, ValueError):
            kids.update(
                int(k) for k in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
            )
    return kids


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _shut_down(engine: Engine, containerd: set[int], log_from: int) -> bool:
    """A SIGTERMed dockerd is done: it logged the end of its shutdown (after ``log_from``)
    and the containerd it supervises has exited, which it stops only after that line.
    dockerd 20.10 then sits out the rest of its supervisor's 1 s poll (libcontainerd
    ``stopDaemon``) before it exits: nothing is left for it to do, the caller kills it."""
    if not containerd or any(pid_alive(p) for p in containerd):
        return False
    try:
        with open(engine.log, "rb") as fh:
            fh.seek(log_from)
            return SHUTDOWN_DONE in fh.read()
    except OSError:
        return False


def _remove_run_dirs() -> None:
    """Remove the /run mount points we created once no sparksim engine is left."""
    if any_engine_running():
        return
    created = _created_run_dirs()
    for d in sorted(created):
        try:
            os.rmdir(d)
            created.discard(d)
        except FileNotFoundError:
            created.discard(d)
        except OSError:
            pass
    if created:
        CREATED_RUN_DIRS.write_text(json.dumps(sorted(created)) + "\n")
    else:
        CREATED_RUN_DIRS.unlink(missing_ok=True)


def any_engine_running() -> bool:
    """True while some sparksim dockerd (an engine with our cgroup parent) runs."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if cmdline.startswith(DOCKERD.encode() + b"\0") and b"\0sparksim-" in cmdline:
            return True
    return False


def engines_in_netns(namespaces: list[str]) -> list[Engine]:
    """Engines running in the named network namespaces (``down --all``, where a state dir
    may be unknown). Matched by namespace identity, never by name: a sim in another
    /run/netns (a sandbox, another container) may use the same names."""
    wanted = {}
    for ns in namespaces:
        with contextlib.suppress(OSError):
            st = os.stat(f"/run/netns/{ns}")
            wanted[(st.st_dev, st.st_ino)] = ns
    found = []
    for entry in os.listdir("/proc") if wanted else []:
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            if not cmdline.startswith(DOCKERD.encode() + b"\0"):
                continue
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        owner = wanted.get((st.st_dev, st.st_ino))
        args = cmdline.decode(errors="replace").split("\0")
        if owner is None or "--data-root" not in args[:-1]:
            continue
        data_root = Path(args[args.index("--data-root") + 1])
        found.append(Engine(data_root.parent.parent, owner))
    return found


def engines_in(state_dir: Path) -> list[Engine]:
    """Every engine a state dir has (or had), for ``down``."""
    found = []
    for nd in sorted((state_dir / "nodes").glob("*")):
        if (nd / "docker").is_dir() or (nd / "docker.sock").exists():
            found.append(Engine(nd, ""))  # its cgroups are in docker/cgroups.json
    return found
