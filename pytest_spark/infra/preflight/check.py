"""Preflight checks: is every node fit to serve before a 15-minute model load?

Pure functions over :mod:`pytest_spark.infra.preflight.probe` facts and profile thresholds
(``preflight.*``). Each returns a :class:`Finding` whose failure message names the node,
what was measured, what was expected and the usual fix (STYLE.md), or a :class:`Skip`
when the check cannot be made (its reason says why and which check covers it).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace

from pytest_spark.infra.finding import CheckNote, Finding, Skip
from pytest_spark.infra.human import DAY_S, human_bytes, human_duration, human_names
from pytest_spark.infra.preflight.probe import (
    SAMPLES,
    CarrierCounters,
    ClockSample,
    ContainerInfo,
    DiskUsage,
    DockerFacts,
    GpuFacts,
    JournalFacts,
    ModelListing,
    SshAttempt,
)
from pytest_spark.infra.probe import PROBE_CONTAINER_PREFIX

# ----------------------------------------------------------------------- 1. docker


def check_docker(node: str, docker: DockerFacts, container: str) -> Finding | Skip:
    """The Docker daemon answers ``docker info`` and the serving image is present."""
    if docker.missing:
        return Finding.failed(
            "docker not installed",
            "Docker engine running",
            node=node,
            message=(
                f"{node}: docker: command not found; expected the Docker engine "
                "(launch-cluster.sh runs vLLM in a container on every node). Install "
                "docker (DGX OS ships it) and the NVIDIA container toolkit"
            ),
        )
    if not docker.up:
        return Finding.failed(
            f"daemon down: {docker.error}",
            "docker info answers",
            node=node,
            message=(
                f"{node}: the Docker daemon is not answering (`docker info`: {docker.error}); "
                "expected it running. Start it: sudo systemctl start docker (and enable it); "
                "on `permission denied` add the SSH user to the docker group"
            ),
        )
    if docker.image is None:
        return Skip(
            f"{node}: Docker {docker.version or ''} is up; no serving image to look for "
            f"(no --spark-image, and no container {container!r} on this node)"
        )
    if not docker.image_present:
        return Finding.failed(
            {"docker": docker.version, "image": None},
            {"image": docker.image},
            node=node,
            message=(
                f"{node}: serving image {docker.image} not present ({docker.image_error}); "
                "expected it on every node (launch-cluster.sh runs `docker run "
                f"{docker.image}` on each). Build or pull it there, or copy it from the head: "
                f"docker save {docker.image} | ssh {node} docker load"
            ),
        )
    return Finding.passed(
        {"docker": docker.version, "image": docker.image},
        {"image": docker.image},
        node=node,
        message=f"{node}: Docker {docker.version}, image {docker.image}",
    )


# --------------------------------------------------------------------- 2. GPU holders


def _describe(c: ContainerInfo, now: float | None) -> str:
    restart = f", restart policy {c.restart_policy}" if c.restart_policy != "no" else ""
    return f"container {c.name} (image {c.image}, up {human_duration(c.uptime_s(now))}{restart})"


# sparkrun's rank containers: ``<cluster id>_node_<rank>`` (vllm-distributed), ``_head`` /
# ``_worker`` (Ray), ``_solo`` (one node); the cluster id is the name's stem.
_SPARKRUN_RANK = re.compile(r"^(sparkrun_.+)_(?:node_\d+|head|worker|solo)$")


def _job_of(name: str) -> str | None:
    m = _SPARKRUN_RANK.match(name)
    return m[1] if m else None


def _stray_sparkrun_jobs(
    container: str, holders: Iterable[ContainerInfo]
) -> dict[str, list[ContainerInfo]]:
    """When every holder is a rank container of another sparkrun job than the tested
    ``container``'s: those jobs (cluster id -> containers here); else empty."""
    mine = _job_of(container)
    jobs: dict[str, list[ContainerInfo]] = {}
    for c in holders:
        job = _job_of(c.name)
        if mine is None or job is None or job == mine:
            return {}
        jobs.setdefault(job, []).append(c)
    return jobs


def check_gpu_holders(
    node: str, docker: DockerFacts, gpu: GpuFacts, container: str, now: float | None = None
) -> Finding | Skip:
    """Nothing but the serving container holds the GPU: no compute process outside it, no
    other running container with GPU access or the serving image (an earlier run's). The
    suite's own probe containers (:data:`PROBE_CONTAINER_PREFIX`, no GPU access: the
    nodes-alike probe reading the serving image's versions, another xdist worker's) are
    not holders; a GPU process inside one still is."""
    serving = docker.serving if docker.serving and docker.serving.running else None
    own = serving.pids if serving else frozenset()
    by_pid = {pid: c for c in docker.containers for pid in c.pids}
    holders: list[str] = []
    stale: dict[str, ContainerInfo] = {}
    outside = 0
    for proc in gpu.processes or ():
        if proc.pid in own:
            continue
        c = by_pid.get(proc.pid)
        if c is not None:
            stale[c.id] = c
            holders.append(f"pid {proc.pid} {proc.name} in {_describe(c, now)}")
        else:
            outside += 1
            where = "outside any container" if docker.up else "(docker not answering)"
            age = f", running {human_duration(proc.etime_s)}" if proc.etime_s is not None else ""
            holders.append(f"pid {proc.pid} {proc.name} {where}{age}")
    image = serving.image if serving else docker.image
    for c in docker.containers:
        if (
            c.running
            and c.name != container
            and c.id not in stale
            and (c.gpu_access or (image and c.image == image))
            and not (c.name.startswith(PROBE_CONTAINER_PREFIX) and not c.gpu_access)
        ):
            stale[c.id] = c
            holders.append(f"{_describe(c, now)} has GPU access")
    if not holders:
        if not docker.up and gpu.processes is None:
            return Skip(
                f"{node}: neither docker nor nvidia-smi answers (see the docker and GPU checks)"
            )
        if not docker.up:
            return Skip(
                f"{node}: no GPU processes; containers not listed: docker is not "
                "answering (see test_docker_ready)"
            )
        if gpu.processes is None:
            return Skip(
                f"{node}: no other container with GPU access; GPU processes not "
                f"listed: nvidia-smi: {gpu.apps_error} (see test_gpu_visible)"
            )
        count = len(gpu.processes)
        return Finding.passed(
            {"gpu_processes": count, "other_gpu_containers": 0},
            {"outside": container},
            node=node,
            message=f"{node}: {count} GPU process(es), all in {container}"
            if count
            else f"{node}: no GPU processes, no other GPU container",
        )
    stray = _stray_sparkrun_jobs(container, stale.values())
    if stray and not outside:
        jobs = ", ".join(sorted(stray))
        return Finding.failed(
            {"holders": holders, "sparkrun jobs": sorted(stray)},
            f"nothing but {container} on the GPU",
            node=node,
            message=(
                f"{node}: sparkrun job {jobs} runs beside the tested job "
                f"{_job_of(container)}: {'; '.join(holders)}; expected no "
                "other serve on this box (two serves share the GPU and its memory: a job left "
                f"running after `sparkrun stop --all`, sparkrun#229). Stop it: sparkrun stop "
                f"{' / '.join(sorted(stray))} (every node of it), or here docker rm -f "
                f"{' '.join(c.name for cs in stray.values() for c in cs)}"
            ),
            evidence={"cause": f"sparkrun job {jobs} beside {_job_of(container)}"},
        )
    names = [c.name for c in stale.values()]
    fix = (
        f"Stop it: docker stop {' '.join(names)} && docker rm {' '.join(names)}"
        + (
            " (and `docker update --restart=no` on any you keep)"
            if any(c.restart_policy not in ("no", "") for c in stale.values())
            else ""
        )
        if names
        else "Stop the process(es) (kill PID) or find their service"
    )
    return Finding.failed(
        {"holders": holders},
        f"nothing but {container} on the GPU",
        node=node,
        message=(
            f"{node}: the GPU is held outside the serving container {container}: "
            f"{'; '.join(holders)}; expected no other GPU process or GPU container (an "
            "earlier run's services auto-start after a reboot and keep GPU memory, so the "
            f"load fails on free memory). {fix}"
        ),
    )


# ---------------------------------------------------------------------- 3. GPU visible


def check_gpu_visible(node: str, gpu: GpuFacts, min_gpus: int) -> Finding:
    """``nvidia-smi -L`` lists at least ``min_gpus`` GPUs (counts only: a GB10 reports
    its memory fields as [N/A])."""
    if gpu.gpus is None:
        return Finding.failed(
            f"nvidia-smi failed: {gpu.error}",
            f">= {min_gpus} GPU",
            node=node,
            message=(
                f"{node}: nvidia-smi -L failed ({gpu.error}); expected >= {min_gpus} GPU. "
                "The NVIDIA driver is missing or broken: check `nvidia-smi`, "
                "`dmesg | grep -i nvrm`; reinstall the driver or reboot"
            ),
        )
    count = len(gpu.gpus)
    procs = len(gpu.processes) if gpu.processes is not None else None
    if count < min_gpus:
        return Finding.failed(
            count,
            min_gpus,
            "GPUs",
            node=node,
            message=(
                f"{node}: nvidia-smi -L lists {count} GPU(s)"
                + (f" ({gpu.error})" if gpu.error else "")
                + f", expected >= {min_gpus}. The driver lost the GPU (look for Xid errors in "
                "`dmesg`); a reboot usually brings it back, then check `nvidia-smi`"
            ),
        )
    return Finding.passed(
        count,
        min_gpus,
        "GPUs",
        node=node,
        message=(
            f"{node}: {count} GPU(s), {procs if procs is not None else '?'} compute process(es)"
        ),
    )


# ----------------------------------------------------------------------------- 4. disk


def check_disk(
    node: str,
    disk: DiskUsage | None,
    max_used_pct: float,
    model_dir: str | None,
    model_bytes: int | None = None,
    have_bytes: int = 0,
    disk_error: str | None = None,
) -> Finding:
    """Use of the filesystem holding the model directory under ``max_used_pct``, and
    room for the model (``model_bytes``, its size on the other nodes) when it is not
    (all) there yet."""
    if disk is None:
        return Finding.failed(
            f"df failed: {disk_error}",
            f"< {max_used_pct:g} %",
            node=node,
            message=f"{node}: cannot read disk use (`df -P -k`: {disk_error}); expected "
            f"< {max_used_pct:g} % used. Check that df exists and the path is readable",
        )
    pct = round(disk.used_pct, 1)
    where = (
        f"{disk.mount} ({disk.filesystem}, holding {model_dir})"
        if model_dir
        else f"{disk.mount} ({disk.filesystem})"
    )
    avail = human_bytes(disk.avail_bytes)
    if pct >= max_used_pct:
        return Finding.failed(
            pct,
            f"< {max_used_pct:g}",
            "%",
            node=node,
            message=(
                f"{node}: {where} is {pct:g} % used ({avail} free), expected "
                f"< {max_used_pct:g} %. Free space: old checkpoints and HF cache "
                "(huggingface-cli delete-cache), `docker system prune` (unused images)"
            ),
        )
    missing = (model_bytes or 0) - have_bytes
    if model_bytes and missing > disk.avail_bytes:
        return Finding.failed(
            disk.avail_bytes,
            missing,
            "B",
            node=node,
            message=(
                f"{node}: {where} has {avail} free, the model needs {human_bytes(missing)} "
                f"more ({human_bytes(model_bytes)} on the other nodes); expected room for it. "
                "Free space or put the model on a larger filesystem before copying it"
            ),
        )
    note = f", model needs {human_bytes(missing)} more" if model_bytes and missing > 0 else ""
    return Finding.passed(
        pct,
        f"< {max_used_pct:g}",
        "%",
        node=node,
        message=f"{node}: {where} {pct:g} % used, {avail} free{note}",
    )


# ------------------------------------------------------------------------ 5. model dir


def _differences(ref: ModelListing, other: ModelListing) -> list[str]:
    out = []
    missing = sorted(set(ref.files) - set(other.files))
    extra = sorted(set(other.files) - set(ref.files))
    if missing:
        out.append(f"missing {human_names(missing)}")
    if extra:
        out.append(f"extra {human_names(extra)}")
    for name in sorted(set(ref.files) & set(other.files)):
        if ref.files[name] != other.files[name]:
            out.append(f"{name} {other.files[name]} bytes vs {ref.files[name]}")
        elif name in ref.hashes or name in other.hashes:
            if ref.hashes.get(name) != other.hashes.get(name):
                out.append(f"{name} sha256 differs")
        elif ref.samples.get(name) != other.samples.get(name):
            out.append(f"{name} content differs (sampled sha256: {SAMPLES} blocks of 64 KiB)")
    return out


def check_model_identical(
    model_dir: str, listings: Mapping[str, ModelListing | None], source: str
) -> Finding:
    """The model directory exists on every node with the same files, sizes, sha256 of
    config.json, the tokenizer files, *.index.json and small files, and the same sampled
    sha256 of every larger one (weight shards are not read whole)."""
    absent = {
        n: (m.error if m else "not probed")
        for n, m in listings.items()
        if m is None or not m.exists or m.error
    }
    present = {n: m for n, m in listings.items() if m is not None and n not in absent}
    if listings and not present:
        return Finding.failed(
            {n: {"missing": why} for n, why in absent.items()},
            "identical on every node",
            message=(
                f"model directory {model_dir} ({source}) is not on any node "
                f"({'; '.join(f'{n}: {why}' for n, why in absent.items())}); expected it on "
                "every node. Download it to that path on each node (huggingface-cli download "
                "MODEL --local-dir DIR) or point --spark-model-dir at where it is"
            ),
        )
    problems = [f"{n}: {why}" for n, why in absent.items()]
    ref_name = next(iter(present), None)
    differing: dict[str, list[str]] = {}
    if ref_name is not None:
        ref = present[ref_name]
        for n, m in present.items():
            if n != ref_name and (diff := _differences(ref, m)):
                differing[n] = diff
                problems.append(f"{n} differs from {ref_name}: {'; '.join(diff)}")
    measured: dict[str, dict[str, object]] = {
        n: {"files": len(m.files), "bytes": m.total_bytes} for n, m in present.items()
    }
    measured.update({n: {"missing": why} for n, why in absent.items()})
    if problems:
        bad = sorted(set(absent) | set(differing))
        return Finding.failed(
            measured,
            "identical on every node",
            node=bad[0] if len(bad) == 1 else None,
            message=(
                f"model directory {model_dir} ({source}) is not identical on every node: "
                f"{' | '.join(problems)}; expected the same files, sizes and hashes everywhere "
                "(vLLM loads each rank's shards from its own node). Copy it again from a good "
                f"node: rsync -a --delete {model_dir}/ NODE:{model_dir}/"
            ),
        )
    first = present[ref_name] if ref_name else None
    return Finding.passed(
        measured,
        "identical on every node",
        message=(
            f"model directory {model_dir}: {len(first.files) if first else 0} files, "
            f"{human_bytes(first.total_bytes if first else 0)}, identical on {len(present)} nodes"
        ),
    )


# ---------------------------------------------------------------------------- 6. clock


def check_clock_skew(samples: Sequence[ClockSample], max_skew_s: float) -> Finding:
    """The largest pairwise skew between node clocks, each read against the runner's
    clock at the midpoint of its round trip."""
    if len(samples) < 2:
        return Finding.passed(
            0.0,
            f"< {max_skew_s:g}",
            "s",
            message="fewer than two nodes answered: no skew to measure",
        )
    hi = max(samples, key=lambda s: s.offset_s)
    lo = min(samples, key=lambda s: s.offset_s)
    skew = round(hi.offset_s - lo.offset_s, 3)
    uncertainty = (hi.rtt_s + lo.rtt_s) / 2
    offsets = ", ".join(f"{s.node} {s.offset_s:+.3f} s" for s in samples)
    if skew >= max_skew_s:
        return Finding.failed(
            skew,
            f"< {max_skew_s:g}",
            "s",
            node=hi.node,
            message=(
                f"{hi.node} runs {skew:.3f} s ahead of {lo.node} (± {uncertainty:.3f} s; "
                f"offsets against the runner: {offsets}); expected < {max_skew_s:g} s. "
                "Sync the clocks: timedatectl set-ntp true, chronyc makestep (check "
                "`chronyc tracking` on every node)"
            ),
        )
    return Finding.passed(
        skew,
        f"< {max_skew_s:g}",
        "s",
        message=(
            f"max clock skew {skew:.3f} s (± {uncertainty:.3f} s) between {hi.node} and "
            f"{lo.node}; offsets against the runner: {offsets}"
        ),
    )


# ------------------------------------------------------------------------------ 7. ssh


def check_passwordless_ssh(
    head: str, attempts: Sequence[SshAttempt], names: Mapping[str, str]
) -> Finding:
    """``ssh -o BatchMode=yes -o ConnectTimeout=5 ADDR true`` from the head to every
    worker address the launcher uses succeeds."""
    failed = [a for a in attempts if not a.ok]
    measured = {names.get(a.address, a.address): "ok" if a.ok else f"rc {a.rc}" for a in attempts}
    if not failed:
        return Finding.passed(
            measured,
            "ok to every worker",
            node=head,
            message=(f"{head}: passwordless SSH to {', '.join(measured) or 'no worker'} works"),
        )
    parts = []
    for a in failed:
        who = names.get(a.address, a.address)
        last = a.output.strip().splitlines()[-1] if a.output.strip() else f"exit {a.rc}"
        parts.append(f"{who} ({a.address}): {last}")
    hint = []
    text = " ".join(a.output for a in failed)
    if "Permission denied" in text:
        hint.append(
            f"install the head's key on the worker: ssh-copy-id WORKER (as the user "
            f"{head} runs the launcher as)"
        )
    if "Host key verification failed" in text or "host key" in text.lower():
        hint.append(
            "accept the worker's host key once on the head: ssh-keyscan WORKER >> "
            "~/.ssh/known_hosts (check the fingerprint)"
        )
    if not hint:
        hint.append(
            "check that the worker is reachable from the head on that address and "
            "that ssh-copy-id was run from the head"
        )
    return Finding.failed(
        measured,
        "ok to every worker",
        node=head,
        message=(
            f"{head}: passwordless SSH failed to {'; '.join(parts)}; expected "
            "`ssh -o BatchMode=yes WORKER true` to succeed (launch-cluster.sh stops at its "
            f"SSH check without it). Fix: {'; '.join(hint)}"
        ),
    )


# ------------------------------------------------------------------------ 8. serving env


def _nccl_list(value: str) -> tuple[str, bool, bool, list[str]]:
    """NCCL's interface/HCA list syntax: ``^`` excludes, ``=`` matches exactly, else
    prefixes; items are comma-separated, HCA items may carry ``:port``."""
    v = value.strip()
    exclude = v.startswith("^")
    v = v.lstrip("^")
    exact = v.startswith("=")
    v = v.lstrip("=")
    return value, exclude, exact, [i.strip() for i in v.split(",") if i.strip()]


def _matches(name: str, items: list[str], exact: bool) -> bool:
    bases = [i.split(":", 1)[0] for i in items]
    return any(name == b if exact else name.startswith(b) for b in bases)


ENV_VERDICT = "test_serving_env_matches_fabric"
# The evidence key of a serving-env failure judged against the node's own cabling
# (:func:`node_own_fabric`): wrong whatever the links, so never a down link's consequence.
OWN_CABLING = "against this node's cabling"

# A netdev's physical port: its twins differ only by the PCI-domain prefix (``enP2p1s0f1np1``
# and ``enp1s0f1np1``; ``roceP2p1s0f1`` and ``rocep1s0f1``).
_DOMAIN = re.compile(r"^(en|roce)P\d+p")


def _port_of(name: str) -> str:
    return _DOMAIN.sub(lambda m: f"{m[1]}p", name)


def node_own_fabric(
    node: str,
    env: Mapping[str, str],
    ports: Sequence[tuple[str, str, bool]],
    netdevs: Sequence[str] = (),
    wireless: Collection[str] = (),
) -> tuple[list[str], str]:
    """The serving environment judged against this node's own ``ibdev2netdev`` (``ports``:
    (RDMA device, netdev, Up)), not the head's nor the cluster's: (problems, the fix).

    - A device in NCCL_IB_HCA, or an interface in NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME,
      on a port with no Up twin on this node (or no such device here): the head's values
      pushed to a worker cabled on the other QSFP port (sparkrun#135: sparkrun sets every
      rank's env from the head's detection). One Down twin of a port that is Up is the
      link checks' finding, not this.
    - A socket interface of the node (``netdevs``) with no RDMA device that is wireless
      (``wireless``: sysfs or ``iw dev``): NCCL's bootstrap and gloo run over the WiFi, and
      serving dies when it drops (sparkrun PR #219). A wired one (the management link) is
      a problem only outside sparkrun's management-first layout (:func:`management_first`:
      sparkrun inits over the management link by design, data over RDMA; eugr's
      launch-cluster.sh sets every socket variable to the fabric, its ETH_IF)."""
    up = [(d, n) for d, n, ok in ports if ok]
    if not up:
        return [], ""
    up_ports = {_port_of(n) for _, n in up}
    rdma_netdevs = {n for _, n, _ in ports}
    here = ", ".join(f"{d} ==> {n}" for d, n in up)
    problems: list[str] = []
    fixes: list[str] = []
    hca = env.get("NCCL_IB_HCA", "")
    if hca and not hca.strip().startswith("^"):
        _, _, _, items = _nccl_list(hca)
        named = [i.split(":", 1)[0] for i in items]
        known = {d: n for d, n, _ in ports}
        off = [d for d in named if d in known and _port_of(known[d]) not in up_ports]
        missing = [d for d in named if not any(k.startswith(d) for k in known)]
        if off or missing:
            problems.append(
                f"NCCL_IB_HCA={hca} names "
                + ", ".join(
                    [f"{d} (port not Up on {node})" for d in off]
                    + [f"{d} (no such device on {node})" for d in missing]
                )
            )
            fixes.append(f"NCCL_IB_HCA={','.join(d for d, _ in up)}")
    mgmt: dict[str, list[str]] = {}
    mgmt_fixes: list[str] = []
    for key in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        value = env.get(key, "")
        if not value or value.strip().startswith("^"):
            continue
        _, _, _, items = _nccl_list(value)
        names = [i.split(":", 1)[0] for i in items]
        off = [n for n in names if n in rdma_netdevs and _port_of(n) not in up_ports]
        if off:
            problems.append(f"{key}={value} names {', '.join(off)}, whose port is not Up on {node}")
            fixes.append(f"{key}={up[0][1]}")
        for n in netdevs:
            if n not in rdma_netdevs and any(n.startswith(i) for i in names):
                mgmt.setdefault(n, []).append(key)
    if fixes:
        problems.append(f"Up on {node} (ibdev2netdev): {here}")
    sparkrun_mgmt = management_first(env)
    for name, keys in list(mgmt.items()):
        if name in wireless:
            problems.append(
                f"{name} ({', '.join(keys)}) is wireless: serving dies when it drops (sparkrun "
                f"PR #219): NCCL's bootstrap and gloo run over it; the fabric interfaces Up on "
                f"{node}: " + ", ".join(n for _, n in up)
            )
        elif sparkrun_mgmt:
            del mgmt[name]  # sparkrun's management-first init: a note, not a problem
            continue
        else:
            problems.append(
                f"{name} ({', '.join(keys)}) is not a fabric interface: no RDMA device on it "
                f"in {node}'s ibdev2netdev (the management / default-route link): NCCL's "
                "bootstrap and gloo run over it and serving dies when it drops (sparkrun PR "
                f"#219); the fabric interfaces Up on {node}: " + ", ".join(n for _, n in up)
            )
        mgmt_fixes += [f"{k}={up[0][1]}" for k in keys]
    fix = ""
    if fixes:
        fix += (
            f"; on {node} set its own {' '.join(dict.fromkeys(fixes))} (sparkrun passes the "
            "head's values to every rank, sparkrun#135: give this host its own, or cable "
            "every node on the same port)"
        )
    if mgmt:
        fix += (
            f"; set {' '.join(dict.fromkeys(mgmt_fixes))} on every rank: the fabric "
            "interface, not the default route"
        )
    return problems, fix


def management_first(env: Mapping[str, str]) -> bool:
    """sparkrun's layout (orchestration/infiniband.py, runtimes/_init_network.py): data over
    RDMA (``NCCL_NET=IB``) and the socket variables naming the management / default-route
    interface first, for NCCL's bootstrap and the distributed init, by design. eugr's
    launch-cluster.sh never sets NCCL_NET: there a non-fabric socket interface is a
    departure from what the launcher sets (its ETH_IF, the fabric)."""
    return env.get("NCCL_NET", "").strip().lower() == "ib"


# The evidence key of a passing serving env whose init runs over a wired management link
# (sparkrun's default): the check warns it as a CheckNote (ManagementInitNote).
MGMT_INIT = "management-link init"


class ManagementInitNote(CheckNote):
    """The serving env passed with NCCL's bootstrap / gloo on a wired management link
    (sparkrun's management-first init): serving depends on that link too."""


def management_init_note(
    node: str,
    env: Mapping[str, str],
    node_ifs: Mapping[str, bool],
    fabric: Collection[str],
    wireless: Collection[str],
    up_fabric: Sequence[str],
) -> str | None:
    """The note of a serving env that names a wired non-fabric interface of the node in
    GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME in sparkrun's management-first layout; None
    when it names none (or not in that layout: there it is a problem)."""
    if not management_first(env):
        return None
    seen: dict[str, list[str]] = {}
    for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        value = env.get(key, "")
        if not value or value.strip().startswith("^"):
            continue
        _, _, exact, items = _nccl_list(value)
        for n in node_ifs:
            if n not in fabric and n not in wireless and _matches(n, items, exact):
                seen.setdefault(n, []).append(key)
    if not seen:
        return None
    names = ", ".join(f"{n} ({', '.join(k)})" for n, k in seen.items())
    target = up_fabric[0] if up_fabric else (sorted(fabric)[0] if fabric else "the fabric")
    return (
        f"{node}: NCCL_NET=IB carries the data over RDMA, and the init (NCCL's bootstrap, "
        f"gloo) runs over the wired management link {names}: sparkrun's default "
        "(runtimes/_init_network.py prefers the management address), so serving depends on "
        f"that link too. To pin it to the fabric, set GLOO_SOCKET_IFNAME={target} "
        f"NCCL_SOCKET_IFNAME={target} (and TP_SOCKET_IFNAME) in the recipe's env: "
        "(sparkrun puts it over its own)"
    )


def same_env_as(node: str, finding: Finding, owner: str, owner_finding: Finding) -> str | None:
    """The skip reason of a node whose serving environment is wrong exactly as ``owner``'s
    (the same values: one launch, one .env or set of -e flags, set both), so that the
    owner's check is the one failure; None when it is not so (this node reports its own)."""
    if finding.ok or owner_finding.ok or finding.measured != owner_finding.measured:
        return None
    return (
        f"{node}: its serving container's environment is {owner}'s, wrong the same way "
        f"(one launch sets it on every node, one fix): {owner_finding.message} "
        f"({ENV_VERDICT}[{owner}] has the evidence)"
    )


def same_env_note(finding: Finding, same_on: Sequence[str]) -> Finding:
    """The owner's failure, saying which other nodes have the same environment."""
    if finding.ok or not same_on:
        return finding
    note = f" The same environment on {', '.join(same_on)}: this one fix covers them."
    return replace(finding, message=finding.message + note)


FORCED_KEYS = ("NCCL_ALGO", "NCCL_PROTO")
# What one launch sets alike on every node (eugr's get_env_flags, its -e flags and .env):
# compared with the head's. VLLM_HOST_IP and RAY_*IP* name the node itself.
SHARED_PREFIXES = ("NCCL_", "GLOO_", "UCX_", "TP_")
RING_ALGO_MIN_NODES = 4


def forced_nccl_choices(env: Mapping[str, str], nodes: int) -> list[str]:
    """The problems of a forced NCCL algorithm or protocol (``NCCL_ALGO=Ring`` on 4+ nodes
    is eugr's closed-ring setting and allowed)."""
    out = []
    algo, proto = env.get("NCCL_ALGO", "").strip(), env.get("NCCL_PROTO", "").strip()
    if algo and not (algo.lower() == "ring" and nodes >= RING_ALGO_MIN_NODES):
        out.append(
            f"NCCL_ALGO={algo} forced (a debugging variable: NCCL's docs say not to keep it in "
            "production; unset it and let NCCL choose"
            + (
                f"; Ring is eugr's setting only on closed rings of {RING_ALGO_MIN_NODES}+ nodes"
                if algo.lower() == "ring"
                else ""
            )
            + ")"
        )
    if proto:
        out.append(f"NCCL_PROTO={proto} forced (a debugging variable: unset it)")
    return out


# eugr/spark-vllm-docker's mesh mode (3+ Sparks cabled to each other, no switch: every
# node's four RoCE devices in NCCL_IB_HCA, README "Mesh-mode NCCL variables", written to
# .env when it detects a mesh; spark-arena/sparkrun#174: "Need to be added to a .env to run
# on a ring topology"): without them NCCL merges the NICs and routes across subnets that
# the cables do not join (eugr#252: `ibv_modify_qp failed with 110` on a 3-node ring).
MESH_VARIABLES = (
    ("NCCL_NET_PLUGIN", "none"),
    ("NCCL_IB_SUBNET_AWARE_ROUTING", "1"),
    ("NCCL_IB_MERGE_NICS", "0"),
)
MESH_MIN_NODES = 3
MESH_HCAS = 4  # a mesh lists both twins of both QSFP ports


def mesh_variables(env: Mapping[str, str], nodes: int) -> list[str]:
    """On a mesh of 3+ nodes (NCCL_IB_HCA naming 4+ devices: every port of the node, as
    eugr's mesh mode sets it), the variables eugr writes for it, as it writes them."""
    hca = env.get("NCCL_IB_HCA", "")
    listed = [d for d in hca.lstrip("^=").split(",") if d.strip()]
    if nodes < MESH_MIN_NODES or len(listed) < MESH_HCAS or hca.startswith("^"):
        return []
    wrong = [
        f"{k}={env.get(k, '(unset)')}"
        for k, want in MESH_VARIABLES
        if env.get(k, "").strip() != want
    ]
    if not wrong:
        return []
    want = ", ".join(f"{k}={v}" for k, v in MESH_VARIABLES)
    return [
        f"a {nodes}-node mesh (NCCL_IB_HCA lists {len(listed)} devices) with {', '.join(wrong)}: "
        f"eugr's mesh mode sets {want} (README 'Mesh-mode NCCL variables')"
    ]


def env_differences(env: Mapping[str, str], owner: str, owner_env: Mapping[str, str]) -> list[str]:
    """The NCCL/GLOO/UCX/TP variables that differ from ``owner``'s environment."""
    keys = sorted(k for k in set(env) | set(owner_env) if k.startswith(SHARED_PREFIXES))
    diffs = [
        f"{k}={env.get(k, '(unset)')} ({owner}: {owner_env.get(k, '(unset)')})"
        for k in keys
        if env.get(k) != owner_env.get(k)
    ]
    return [f"differs from {owner}'s ranks: {', '.join(diffs)}"] if diffs else []


def recipe_env_differences(
    env: Mapping[str, str], origin: str, wanted: Mapping[str, str]
) -> list[str]:
    """The recipe's ``env:`` entries the serving environment does not hold as written."""
    diffs = [
        f"{k}={env.get(k, '(unset)')} ({origin} sets {k}={v})"
        for k, v in sorted(wanted.items())
        if env.get(k) != v
    ]
    return [f"not as the recipe sets it: {', '.join(diffs)}"] if diffs else []


def check_serving_env(
    node: str,
    container: str,
    env: Mapping[str, str] | None,
    fabric_ifs: Sequence[str],
    fabric_devs: Sequence[str],
    node_ifs: Mapping[str, bool],
    *,
    source: str | None = None,
    nodes: int = 2,
    reference: tuple[str, Mapping[str, str]] | None = None,
    recipe_env: tuple[str, Mapping[str, str]] | None = None,
    ports: Sequence[tuple[str, str, bool]] = (),
    wireless: Collection[str] = (),
) -> Finding:
    """NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_HCA and UCX_NET_DEVICES in the
    serving environment name the fabric interfaces (``fabric_ifs``) and RDMA devices
    (``fabric_devs``, both twins in NCCL_IB_HCA); NCCL_IB_DISABLE is not 1; no forced
    NCCL_ALGO / NCCL_PROTO (NCCL's docs list them as debugging variables that "should not
    be used in production"; eugr's launcher sets ``NCCL_ALGO=Ring`` on closed rings of 4+
    nodes, so Ring is let through at ``nodes`` >= 4); and, given ``reference`` (the head's
    name and environment, when the head's own is right), the NCCL/GLOO/UCX/TP variables
    equal to the head's (one launch sets them all; VLLM_HOST_IP and Ray's node addresses
    differ by design and are not compared); and, given ``recipe_env`` (a sparkrun recipe's
    origin and its fixed ``env:`` entries, settings.recipe), each of them as the recipe sets
    it (sparkrun passes them to every rank). ``source``: where ``env`` was read (the rank
    process's /proc environ), for the message. ``node_ifs`` maps each netdev of the node
    to whether it carries an IPv4 address. ``ports``: the node's own ``ibdev2netdev``
    (device, netdev, Up), to judge the env against this node's cabling
    (:func:`node_own_fabric`); a port with no Up twin here is then not asked for in
    NCCL_IB_HCA (another node is cabled on it). ``wireless``: the node's wireless netdevs
    (sysfs / ``iw dev``): one named in a socket variable fails (sparkrun PR #219: serving
    died when the WiFi dropped); a wired non-fabric one in sparkrun's management-first
    layout (:func:`management_first`) passes with a note (evidence ``MGMT_INIT``)."""
    if env is None:
        return Finding.failed(
            "no container",
            f"container {container}",
            node=node,
            message=(
                f"{node}: serving container {container} not found (docker inspect); expected "
                "it running on every node. Check `docker ps -a` there and the launcher log"
            ),
        )
    fabric = set(fabric_ifs)
    devs = set(fabric_devs)
    if any(up for _, _, up in ports):
        up_ports = {_port_of(n) for _, n, up in ports if up}
        netdev_of = {d: n for d, n, _ in ports}
        devs = {d for d in devs if d not in netdev_of or _port_of(netdev_of[d]) in up_ports}
    keys = (
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "NCCL_IB_HCA",
        "UCX_NET_DEVICES",
        "NCCL_IB_DISABLE",
    )
    measured = {k: env.get(k) for k in keys}
    problems = []

    # sparkrun's wired management-link init is by design (a note); a wireless link never
    mgmt_first = management_first(env)
    sock = env.get("NCCL_SOCKET_IFNAME")
    if not sock:
        problems.append(
            "NCCL_SOCKET_IFNAME unset (NCCL picks any interface, often the management one)"
        )
    else:
        _, exclude, exact, items = _nccl_list(sock)
        chosen = [n for n in node_ifs if _matches(n, items, exact) != exclude]
        wrong = [
            n
            for n in chosen
            if n not in fabric and node_ifs.get(n) and (n in wireless or not mgmt_first)
        ]
        if exclude or not any(n in fabric for n in chosen) or wrong:
            problems.append(
                f"NCCL_SOCKET_IFNAME={sock} selects {', '.join(chosen) or 'no interface'}"
            )
    gloo = env.get("GLOO_SOCKET_IFNAME")
    if not gloo:
        problems.append("GLOO_SOCKET_IFNAME unset (gloo binds the hostname's interface)")
    elif not all(
        i in fabric or (mgmt_first and i in node_ifs and i not in wireless)
        for i in (j.strip() for j in gloo.split(","))
        if i
    ):
        problems.append(f"GLOO_SOCKET_IFNAME={gloo}")
    hca = env.get("NCCL_IB_HCA")
    if not hca:
        problems.append("NCCL_IB_HCA unset")
    else:
        _, exclude, exact, items = _nccl_list(hca)
        left_out = sorted(d for d in devs if _matches(d, items, exact) == exclude)
        if left_out:
            problems.append(f"NCCL_IB_HCA={hca} leaves out {', '.join(left_out)}")
    ucx = env.get("UCX_NET_DEVICES")
    if ucx:
        names = [i.split(":", 1)[0].strip() for i in ucx.split(",") if i.strip()]
        if not names or any(n not in fabric and n not in devs for n in names):
            problems.append(f"UCX_NET_DEVICES={ucx}")
    if env.get("NCCL_IB_DISABLE", "0").strip() not in ("0", ""):
        problems.append(
            f"NCCL_IB_DISABLE={env['NCCL_IB_DISABLE']} (RDMA off: NCCL falls back "
            "to TCP sockets, ~3 GB/s)"
        )
    problems += forced_nccl_choices(env, nodes)
    problems += mesh_variables(env, nodes)
    if reference is not None:
        problems += env_differences(env, *reference)
    recipe_problems = recipe_env_differences(env, *recipe_env) if recipe_env else []
    problems += recipe_problems
    own_problems, own_fix = node_own_fabric(node, env, ports, sorted(node_ifs), wireless)
    problems += own_problems
    for key in FORCED_KEYS:
        if env.get(key):
            measured[key] = env[key]
    expected: dict[str, object] = {"interfaces": sorted(fabric), "NCCL_IB_HCA": sorted(devs)}
    if recipe_env and recipe_env[1]:
        measured.update({k: env.get(k) for k in recipe_env[1]})
        expected["recipe env"] = dict(recipe_env[1])
    where = source or f"container {container}"
    if problems:
        return Finding.failed(
            measured,
            expected,
            node=node,
            evidence={OWN_CABLING: "; ".join(own_problems)} if own_problems else None,
            message=(
                f"{node}: {where} environment does not match the fabric: "
                f"{'; '.join(problems)}; expected the fabric interfaces "
                f"{', '.join(sorted(fabric))} and both twins {','.join(sorted(devs))} in "
                "NCCL_IB_HCA. Fix the launcher's .env / -e flags (CONTAINER_NCCL_* "
                "variables, --eth-if/--ib-if) or let it auto-detect, then relaunch"
                + (
                    "; for the recipe's variables, the job was not started with this recipe "
                    "or its env was changed: sparkrun run the recipe again"
                    if recipe_problems
                    else ""
                )
                + own_fix
            ),
        )
    up_fabric = [n for _, n, ok in ports if ok and n in fabric] or sorted(fabric)
    note = management_init_note(node, env, node_ifs, fabric, wireless, up_fabric)
    passed = Finding.passed(
        measured,
        expected,
        node=node,
        message=(f"{node}: {container} uses {sock} (NCCL/gloo) and {hca} (NCCL_IB_HCA)"),
    )
    return replace(passed, evidence={MGMT_INIT: note}) if note else passed


# ------------------------------------------------------------------------- 9. link flaps


def check_link_flaps(
    node: str,
    ifname: str,
    counters: CarrierCounters | None,
    uptime_s: float | None,
    journal: JournalFacts,
    max_flaps: int,
) -> Finding:
    """Fewer than ``max_flaps`` carrier losses on ``ifname`` per 24 h: journald's kernel
    lines about it when it has any, else sysfs carrier counters (since the netdev
    appeared) over the node's uptime."""
    lines = journal.about(ifname)
    losses = counters.losses if counters else None
    if lines:
        per_day: float = len(lines)
        source = f"journalctl -k: {len(lines)} link-down line(s) in the last 24 h"
        if losses is not None:
            source += f" (sysfs: {losses} carrier loss(es) since the netdev appeared)"
    elif losses is not None:
        up = uptime_s or 0.0
        if up <= DAY_S:
            per_day = float(losses)
            source = (
                f"sysfs carrier counters: {losses} carrier loss(es) since boot "
                f"{human_duration(up)} ago"
            )
        else:
            per_day = round(losses * DAY_S / up, 2)
            source = (
                f"sysfs carrier counters: {losses} carrier loss(es) in "
                f"{human_duration(up)} of uptime, {per_day:g} per 24 h on average"
            )
        if not journal.available:
            source += f"; kernel journal: {journal.error or 'empty'}"
    else:
        return Finding.failed(
            "unknown",
            f"< {max_flaps}",
            "per 24 h",
            node=node,
            message=(
                f"{node} {ifname}: no carrier counters in sysfs and no kernel journal lines "
                f"about it; expected < {max_flaps} carrier losses per 24 h to be measurable. "
                "Check that the interface exists (ip link)"
            ),
        )
    evidence = {"journal": "\n".join(lines[-20:])} if lines else {}
    if per_day >= max_flaps:
        return Finding.failed(
            per_day,
            f"< {max_flaps}",
            "per 24 h",
            node=node,
            evidence=evidence,
            message=(
                f"{node} {ifname}: {per_day:g} carrier losses per 24 h ({source}); expected "
                f"< {max_flaps}. The link flaps: reseat or replace the QSFP cable, check "
                f"`ethtool -S {ifname}` for symbol errors, and the port on the other end"
            ),
        )
    return Finding.passed(
        per_day,
        f"< {max_flaps}",
        "per 24 h",
        node=node,
        message=f"{node} {ifname}: {per_day:g} per 24 h ({source})",
    )


def check_reachable(
    node: str, target: str, error: str | None, *, host_key: bool = False
) -> Finding:
    """Reached over SSH, or unreachable with what usually fixes it (the one failure an
    unreachable node gives; the checks that need it skip citing it)."""
    if error is None:
        return Finding.passed(
            "reachable", "reachable", node=node, message=f"{node}: SSH to {target} works"
        )
    text = error
    while text.startswith(f"{node}: "):
        text = text.removeprefix(f"{node}: ")
    lowered = text.lower()
    if host_key:
        fix = (
            "the host key is unknown or changed: verify it and add it to known_hosts "
            "(ssh-keyscan), never disable the check"
        )
    elif "refused" in lowered:
        fix = (
            "the node answers but nothing listens for SSH: start sshd there "
            "(systemctl start ssh) or fix the port in the ssh_config"
        )
    elif "timed out" in lowered or "timeout" in lowered:
        fix = (
            "nothing answers at that address: check the node is powered on, its "
            "management cable and the address (--spark-head / --spark-workers)"
        )
    elif "auth" in lowered or "permission" in lowered:
        fix = "the key is not accepted: check IdentityFile and the node's authorized_keys"
    else:
        fix = "check the node, its management network and --spark-ssh-config"
    return Finding.failed(
        "unreachable",
        "reachable over SSH",
        node=node,
        message=(
            f"{node}: unreachable over SSH at {target}: {text}. Every check that needs "
            f"{node} is skipped citing this. Usual fix: {fix}"
        ),
    )
