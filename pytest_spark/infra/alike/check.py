"""Nodes-alike checks: every node runs what the head runs (issue #15 §1).

Pure functions over :mod:`pytest_spark.infra.alike.probe` facts. Each compares every node with
the head and names the odd node with both values and the usual fix; where the head is
the one that differs (two or more workers agree among themselves against it) the head is
named. A value a node cannot report (a GB10 prints ``[N/A]`` for some fields, a lost GPU
prints no version) is left out of the comparison and said in the message, never failed
here: the check that owns that fact (GPU visible, docker ready) fails for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pytest_spark.infra.alike.parse import ContainerFacts, ImageFacts
from pytest_spark.infra.alike.probe import Fact, NodeAlike
from pytest_spark.infra.finding import Finding, Skip


@dataclass(frozen=True)
class Odd:
    """Nodes whose value differs from the reference (the head's, or the others' when the
    head alone differs)."""

    nodes: tuple[str, ...]
    reference: str
    reference_from: str  # "spark-head" or "the other nodes"


def odd_nodes(head: str, values: Mapping[str, str]) -> Odd | None:
    """Which nodes differ, or None when every node with a value agrees."""
    if head not in values or len(set(values.values())) <= 1:
        return None
    groups: dict[str, list[str]] = {}
    for node, value in values.items():
        groups.setdefault(value, []).append(node)
    ref = values[head]
    biggest = max(groups.values(), key=len)
    if len(groups[ref]) == 1 and len(biggest) >= 2 and len(groups) == 2:
        other = next(v for v in groups if v != ref)
        return Odd((head,), other, f"the other {len(groups[other])} nodes")
    return Odd(tuple(n for n, v in values.items() if v != ref), ref, head)


def _known(facts: Mapping[str, Fact]) -> tuple[dict[str, str], dict[str, str]]:
    values = {n: f.value for n, f in facts.items() if f.value is not None}
    unknown = {n: f.why or "not read" for n, f in facts.items() if f.value is None}
    return values, unknown


# --------------------------------------------------------------------------- host


@dataclass(frozen=True)
class HostField:
    name: str  # what a person calls it
    get: Callable[[NodeAlike], Fact]
    fix: str


HOST_FIELDS = (
    HostField(
        "NVIDIA driver",
        lambda f: f.driver,
        "install the same driver branch on every node (DGX OS: apt install the same "
        "nvidia-driver / nvidia-dkms version the other node has, or apt full-upgrade every "
        "node together) and reboot; a driver updated on one node only breaks NCCL between them",
    ),
    HostField(
        "CUDA version (nvidia-smi)",
        lambda f: f.cuda,
        "it comes with the driver: put the same driver on every node and reboot",
    ),
    HostField(
        "kernel release",
        lambda f: f.kernel,
        "boot every node into the same kernel (apt full-upgrade on all of them, then reboot; "
        "`uname -r` must match); a node updated alone also loads a rebuilt driver module",
    ),
    HostField(
        "OS release",
        lambda f: f.os,
        "bring every node to the same DGX OS / Ubuntu release (apt update && apt "
        "full-upgrade on each, /etc/os-release must match)",
    ),
    HostField(
        "DGX OS release",
        lambda f: f.dgx_os,
        "bring every node to the same DGX OS release (/etc/dgx-release DGX_SWBUILD_VERSION; "
        "apply the same DGX OS update on each node, then reboot)",
    ),
    HostField(
        "ConnectX-7 firmware",
        lambda f: f.cx7_firmware,
        "flash the same ConnectX-7 firmware on every node (`ethtool -i IFACE` "
        "firmware-version, PSID included; DGX OS ships it: apply the same update, or "
        "mlxfwmanager / flint with the other node's image) and reboot or mlxfwreset",
    ),
)

# The HOST_FIELDS a known-bad rule's component owns (pytest_spark.infra.alike.knownbad_check): the
# CUDA version nvidia-smi prints comes with the driver.
FIELDS_OF_COMPONENT = {
    "driver": ("NVIDIA driver", "CUDA version (nvidia-smi)"),
    "kernel": ("kernel release",),
    "dgx-os": ("DGX OS release",),
    "cx7-firmware": ("ConnectX-7 firmware",),
}


def check_host_alike(
    head: str,
    facts: Mapping[str, NodeAlike],
    owned: Mapping[str, set[str]] | None = None,
) -> Finding:
    """Kernel release, OS release, NVIDIA driver, CUDA version, DGX OS release and
    ConnectX-7 firmware the same on every node. ``owned``: ``{known-bad component: nodes}``
    whose value a known-bad rule names (knownbad_check.denied_nodes):
    those values are left out here, as that check fails for them (one cause, one failure)."""
    by_field: dict[str, set[str]] = {}
    for component, owners in (owned or {}).items():
        for name in FIELDS_OF_COMPONENT.get(component, ()):
            by_field.setdefault(name, set()).update(owners)
    problems: list[str] = []
    fixes: list[str] = []
    notes: list[str] = []
    measured: dict[str, dict[str, str | None]] = {n: {} for n in facts}
    odd_all: set[str] = set()
    for fld in HOST_FIELDS:
        per_node = {n: fld.get(f) for n, f in facts.items()}
        for n, fact in per_node.items():
            measured[n][fld.name] = fact.value
        values, unknown = _known(per_node)
        notes += [f"{fld.name} not read on {n} ({why})" for n, why in unknown.items()]
        for n in sorted(by_field.get(fld.name, set()) & set(values)):
            notes.append(
                f"{fld.name} of {n} left out: a known-bad version (test_no_known_bad_versions)"
            )
            del values[n]
        odd = odd_nodes(head, values)
        if odd is None:
            continue
        odd_all.update(odd.nodes)
        shown = ", ".join(f"{n} has {values[n]}" for n in odd.nodes)
        has = "have" if odd.reference_from.startswith("the other") else "has"
        problems.append(f"{fld.name}: {shown}, {odd.reference_from} {has} {odd.reference}")
        fixes.append(fld.fix)
    expected = "the same on every node as on " + head
    note = f" ({'; '.join(notes)})" if notes else ""
    if problems:
        nodes = sorted(odd_all)
        return Finding.failed(
            measured,
            expected,
            node=nodes[0] if len(nodes) == 1 else None,
            message=(
                f"{', '.join(nodes)} unlike the rest of the cluster: {'; '.join(problems)}; "
                "expected the same kernel, OS, NVIDIA driver, CUDA, DGX OS and ConnectX-7 "
                f"firmware on every node (multi-node vLLM needs the nodes alike){note}. "
                f"Fix: {'; '.join(dict.fromkeys(fixes))}"
            ),
        )
    head_facts = facts.get(head)
    summary = (
        ", ".join(
            f"{fld.name} {fld.get(head_facts).value}"
            for fld in HOST_FIELDS
            if fld.get(head_facts).value is not None
        )
        if head_facts
        else ""
    )
    return Finding.passed(
        measured,
        expected,
        message=f"{len(facts)} nodes alike: {summary or 'nothing readable'}{note}",
    )


# -------------------------------------------------------------------------- image


def _container_diffs(head_c: ContainerFacts | None, other: ContainerFacts | None) -> list[str]:
    """What differs inside two images, in an operator's words."""
    if head_c is None or other is None:
        return []
    out = []
    for label, a, b in (
        ("vLLM", head_c.vllm, other.vllm),
        ("torch", head_c.torch, other.torch),
        ("Python", head_c.python, other.python),
    ):
        if a != b:
            out.append(f"{label} {b or 'not installed'} vs {a or 'not installed'}")
    la, lb = head_c.nccl_loaded, other.nccl_loaded
    if la is None or lb is None:
        if (la is None) != (lb is None):
            out.append(
                f"NCCL library {'absent' if lb is None else lb.path} vs "
                f"{'absent' if la is None else la.path}"
            )
    elif la.sha256 != lb.sha256:
        if la.version == lb.version:
            out.append(
                f"NCCL {lb.path}: the same version {lb.version or '?'}, a different build "
                f"(sha256 {lb.short_sha}... vs {la.short_sha}..."
                + (f", {lb.size} vs {la.size} bytes" if lb.size != la.size else "")
                + "): "
                "the ranks hang at NCCL init"
            )
        else:
            out.append(f"NCCL {lb.version or '?'} vs {la.version or '?'} ({lb.path})")
    return out


def _describe_image(img: ImageFacts) -> str:
    return f"ID {img.short_id}, {len(img.layers)} layer(s)"


def check_running_alike(
    head: str, facts: Mapping[str, NodeAlike], container: str
) -> Finding | None:
    """Attach mode: the serving containers already running on the nodes run the same image
    (the image each container was started from, by its ID, ``docker inspect --format
    '{{.Image}}'``; compared by identity, as two loads of one image may differ in ID). The
    launcher compares image IDs only when it launches (launch-cluster.sh
    ``verify_cluster_image_consistency``); a container started before a node's image was
    replaced runs the old one under the same tag. None when fewer than two nodes run one."""
    running = {n: f.running for n, f in facts.items() if f.running is not None}
    if len(running) < 2:
        return None
    odd = odd_nodes(head, {n: img.identity for n, img in running.items()})
    if odd is None:
        return None
    ref_node = head if odd.nodes != (head,) else next(n for n in running if n != head)
    ref = running[ref_node]
    tags = {n: f.image_ref for n, f in facts.items()}
    parts = [
        f"{n}'s container {container!r} runs image {running[n].short_id} "
        f"({len(running[n].layers)} layer(s)) vs {ref_node}'s {ref.short_id}"
        + (f", both tagged {tags[n]}" if tags.get(n) and tags[n] == tags.get(ref_node) else "")
        for n in odd.nodes
    ]
    nodes = list(odd.nodes)
    return Finding.failed(
        {
            n: {"running_image_id": img.id, "identity": img.identity, "tag": tags.get(n)}
            for n, img in running.items()
        },
        f"the running containers on the same image as {ref_node}",
        node=nodes[0] if len(nodes) == 1 else None,
        message=(
            f"running serving containers differ: {'; '.join(parts)}; expected every node's "
            f"running container on the same image (each rank runs its own node's container; "
            f"the launcher checks image IDs only when it launches, not when attaching). Fix: "
            f"stop the cluster, put {ref_node}'s image on {', '.join(nodes)} (docker save | "
            "docker load, or pull the same digest), then relaunch"
        ),
    )


def _image_measured(
    facts: Mapping[str, NodeAlike], images: Mapping[str, ImageFacts]
) -> dict[str, dict[str, object]]:
    """What the image check measured per node: the image's ref, ID and identity, and what
    is inside it (vLLM, torch, Python, the NCCL libraries), or why the inside was not read."""
    return {
        n: {
            "image": img.ref,
            "id": img.id,
            "identity": img.identity,
            **(
                {
                    "vllm": c.vllm,
                    "torch": c.torch,
                    "python": c.python,
                    "nccl": [
                        f"{lib.path} {lib.version} sha256:{lib.sha256}"
                        + (f" build-id:{lib.build_id}" if lib.build_id else "")
                        for lib in c.nccl
                    ],
                }
                if (c := facts[n].container) is not None
                else {"container_facts": facts[n].container_error}
            ),
        }
        for n, img in images.items()
    }


def _image_inside(facts: Mapping[str, NodeAlike], head: str) -> str:
    """The head's image inside, for the passing message."""
    c = facts[head].container if head in facts else None
    if c is None:
        return f"inside not read: {facts[head].container_error}"
    nccl = (
        f"{c.nccl_loaded.version} ({c.nccl_loaded.path}, sha256 {c.nccl_loaded.short_sha}...)"
        if c.nccl_loaded
        else "-"
    )
    return f"vLLM {c.vllm or '-'}, torch {c.torch or '-'}, Python {c.python or '-'}, NCCL {nccl}"


def _image_differences(
    facts: Mapping[str, NodeAlike],
    images: Mapping[str, ImageFacts],
    ref_node: str,
    odd: Sequence[str],
) -> str:
    """How each odd node's image differs from ``ref_node``'s, joined by `` | ``."""
    parts = []
    for n in odd:
        diffs = _container_diffs(facts[ref_node].container, facts[n].container)
        inside = (
            "; ".join(diffs)
            if diffs
            else "vLLM, torch, Python and NCCL the same inside (rebuilt or re-tagged?)"
        )
        parts.append(
            f"{n} has {images[n].ref} {_describe_image(images[n])} vs {ref_node}'s "
            f"{_describe_image(images[ref_node])}: {inside}"
        )
    return " | ".join(parts)


def check_image_alike(head: str, facts: Mapping[str, NodeAlike], container: str) -> Finding | Skip:
    """The serving image has the same identity on every node (registry digests, else its
    layers and start config); when it differs, what differs inside it (vLLM, torch, NCCL
    version and library hash, Python). In attach mode the running containers' images are
    compared first (:func:`check_running_alike`)."""
    running = check_running_alike(head, facts, container)
    if running is not None:
        return running
    refs = {n: f.image_ref for n, f in facts.items() if f.image_ref}
    if not refs:
        return Skip(
            f"no serving image to compare: no --spark-image and no container {container!r} "
            "on any node"
        )
    missing = {n: f.image_error or "not inspected" for n, f in facts.items() if f.image is None}
    images = {n: f.image for n, f in facts.items() if f.image is not None}
    if missing:
        listed = "; ".join(f"{n}: {why}" for n, why in missing.items())
        return Skip(
            f"the serving image is not readable on every node ({listed}): "
            "test_docker_ready has the evidence"
        )
    measured = _image_measured(facts, images)
    odd = odd_nodes(head, {n: img.identity for n, img in images.items()})
    if odd is None:
        ref_img = images[head] if head in images else next(iter(images.values()))
        return Finding.passed(
            measured,
            f"the same image as on {head}",
            message=f"serving image {ref_img.ref} alike on {len(images)} nodes "
            f"({_describe_image(ref_img)}; {_image_inside(facts, head)})",
        )
    ref_node = head if odd.nodes != (head,) else next(n for n in images if n != head)
    ref_img = images[ref_node]
    nodes = list(odd.nodes)
    return Finding.failed(
        measured,
        f"the same image as on {ref_node}",
        node=nodes[0] if len(nodes) == 1 else None,
        message=(
            f"serving image differs: {_image_differences(facts, images, ref_node, nodes)}; "
            f"expected the same image on every "
            f"node (each rank runs its own node's copy). Fix: copy {ref_node}'s image to "
            f"{', '.join(nodes)}: docker save {ref_img.ref} | ssh "
            f"{nodes[0] if len(nodes) == 1 else 'NODE'} docker load (or pull "
            "the same digest on every node), then relaunch"
        ),
    )


# ---------------------------------------------------------------------- time sync


def check_time_sync(facts: Mapping[str, NodeAlike]) -> Finding | Skip:
    """Every node's clock is NTP-synchronised (``timedatectl show``: NTPSynchronized=yes,
    else ``chronyc tracking``'s leap status), beside the measured skew."""
    unsynced = {
        n: f.time_sync
        for n, f in facts.items()
        if f.time_sync and f.time_sync.synchronized is False
    }
    unknown = {n: f.time_sync_error or "?" for n, f in facts.items() if f.time_sync is None}
    measured = {
        n: (f.time_sync.detail if f.time_sync else f"unknown: {f.time_sync_error}")
        for n, f in facts.items()
    }
    note = (
        " (not readable on " + "; ".join(f"{n}: {why}" for n, why in unknown.items()) + ")"
        if unknown
        else ""
    )
    if unsynced:
        nodes = sorted(unsynced)
        shown = "; ".join(f"{n}: {s.source} says {s.detail}" for n, s in unsynced.items())
        return Finding.failed(
            measured,
            "NTP-synchronised on every node",
            node=nodes[0] if len(nodes) == 1 else None,
            message=(
                f"{', '.join(nodes)}: clock not NTP-synchronised ({shown}); expected every "
                "node synchronised (a free-running clock drifts: logs, Ray heartbeats and "
                f"TLS disagree){note}. Fix: timedatectl set-ntp true (or start chronyd) on "
                f"{', '.join(nodes)}, then check `timedatectl show` / `chronyc tracking`"
            ),
        )
    if len(unknown) == len(facts):
        return Skip(f"no node says whether its clock is NTP-synchronised{note}")
    return Finding.passed(
        measured,
        "NTP-synchronised on every node",
        message=f"{len(facts) - len(unknown)} node(s) NTP-synchronised{note}",
    )


def nccl_versions(facts: Mapping[str, NodeAlike]) -> dict[str, str]:
    """The NCCL version the serving image loads, per node (for the report's environment):
    the version the library itself carries; nodes whose image was not read are left out."""
    out = {}
    for node, f in facts.items():
        lib = f.container.nccl_loaded if f.container is not None else None
        if lib is not None and lib.version:
            out[node] = lib.version
    return out
