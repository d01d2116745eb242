"""What the ranks loaded, compared across the cluster (pure: facts in, Finding out).

- :func:`check_nccl_loaded`: every rank process of every node mapped one libnccl file,
  and the same build (ELF Build ID) as the head's ranks. The version string is not used:
  pip's ``nvidia-nccl-cu13`` 2.28.9 and DGX OS's ``libnccl2`` 2.28.9 are one version and
  two builds (219 MB, Build ID ``a7f420a1...`` vs 190 MB, ``c0db9360...``), and a cluster
  that mixes them hangs every 20-26 min under load (vllm-project/vllm#41725, #42354).
- :func:`check_vllm_tree`: the installed vllm package tree hashes the same on every node
  (eugr/spark-vllm-docker's ``--apply-vllm-pr`` and ``--apply-mod`` patch files in place,
  leaving the version as it was).
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_spark.infra.finding import Finding, Skip
from pytest_spark.infra.loaded.probe import LoadedFacts, MappedLib

__all__ = ["NCCL_FIX", "VLLM_FIX", "check_nccl_loaded", "check_vllm_tree", "node_builds"]

NCCL_FIX = (
    "link pip's NCCL to the system one, as eugr/spark-vllm-docker's mods/use-official-vllm "
    "does (vllm-project/vllm#41725, #42354): mv .../dist-packages/nvidia/nccl/lib/"
    "libnccl.so.2{,.pipbak} && ln -sf /usr/lib/$(gcc -print-multiarch)/libnccl.so.2 "
    ".../dist-packages/nvidia/nccl/lib/libnccl.so.2 in the image (or --apply-mod "
    "mods/use-official-vllm), drop LD_LIBRARY_PATH/LD_PRELOAD/VLLM_NCCL_SO_PATH entries that "
    "point a rank at another libnccl, then relaunch"
)
VLLM_FIX = (
    "install the same vllm on every node: relaunch so every container gets the same "
    "--apply-vllm-pr / --apply-mod patches, or copy the head's image to that node "
    "(docker save | ssh NODE docker load) and relaunch"
)


def _key(lib: MappedLib) -> str:
    """A build's identity: its Build ID, else (unreadable file) its path."""
    return lib.build_id or f"path:{lib.path}"


def node_builds(facts: LoadedFacts) -> dict[str, MappedLib]:
    """The NCCL builds a node's ranks mapped, by identity."""
    out: dict[str, MappedLib] = {}
    for proc in facts.ranks:
        for path in proc.nccl:
            lib = facts.libs.get(path) or MappedLib(path, None, None, "not read")
            out.setdefault(_key(lib), lib)
    return out


def _libs(builds: Mapping[str, MappedLib]) -> str:
    return " and ".join(lib.describe() for lib in builds.values())


def check_nccl_loaded(
    node: str, facts: LoadedFacts, head: str, head_facts: LoadedFacts | None
) -> Finding | Skip:
    """The node's rank processes mapped one libnccl each, one build on the node, and the
    head's build (``head_facts`` None or ``node == head``: no comparison)."""
    if not facts.running:
        return Skip(f"{node}: the serving container does not run (nothing loaded to read)")
    if facts.error:
        return Skip(f"{node}: what the ranks loaded could not be read: {facts.error}")
    if not facts.ranks:
        return Skip(f"{node}: no rank process has mapped libnccl yet (not serving?)")
    measured = {
        str(p.pid): [_libs({"x": facts.libs.get(x) or MappedLib(x, None, None)}) for x in p.nccl]
        for p in facts.ranks
    }
    for proc in facts.ranks:
        own = {_key(facts.libs.get(x) or MappedLib(x, None, None)): x for x in proc.nccl}
        if len(proc.nccl) > 1:
            both = {k: facts.libs.get(x) or MappedLib(x, None, None) for k, x in own.items()}
            listed = " and ".join(
                (facts.libs.get(x) or MappedLib(x, None, None)).describe() for x in proc.nccl
            )
            return Finding.failed(
                measured,
                "one libnccl per process",
                node=node,
                message=(
                    f"{node}: rank process {proc.pid} mapped {len(proc.nccl)} libnccl files: "
                    f"{listed}"
                    + (" (two builds)" if len(both) > 1 else "")
                    + "; expected one NCCL per process (two NCCLs in one rank pair up "
                    f"communicators that do not match: hangs under load). Fix: {NCCL_FIX}"
                ),
            )
    builds = node_builds(facts)
    if len(builds) > 1:
        return Finding.failed(
            measured,
            "one NCCL build on the node",
            node=node,
            message=(
                f"{node}: its ranks mapped different NCCL builds: {_libs(builds)}; expected "
                f"one build on every rank. Fix: {NCCL_FIX}"
            ),
        )
    if node == head or head_facts is None or not head_facts.ranks:
        lib = next(iter(builds.values()))
        return Finding.passed(
            measured, "one NCCL build", node=node, message=f"{node}: ranks mapped {lib.describe()}"
        )
    ref = node_builds(head_facts)
    if set(builds) == set(ref):
        lib = next(iter(builds.values()))
        return Finding.passed(
            measured,
            f"{head}'s NCCL build",
            node=node,
            message=f"{node}: ranks mapped {lib.describe()}, the build {head}'s ranks mapped",
        )
    return Finding.failed(
        measured,
        f"{head}'s NCCL build: {_libs(ref)}",
        node=node,
        message=(
            f"{node}: its ranks mapped {_libs(builds)}; {head}'s ranks mapped {_libs(ref)}: "
            "two builds of NCCL in one job (the same version string does not make them one "
            "build: vllm#41725's pip 2.28.9 and DGX OS 2.28.9 hang every 20-26 min under "
            f"load); expected the same Build ID on every rank. Fix: {NCCL_FIX}"
        ),
    )


MAX_FILES_NAMED = 5


def check_vllm_tree(
    node: str, facts: LoadedFacts, head: str, head_facts: LoadedFacts | None
) -> Finding | Skip:
    """The node's installed vllm package tree hashes as the head's (file contents; a file
    over 8 MiB by its size and first and last MiB)."""
    if not facts.running:
        return Skip(f"{node}: the serving container does not run (no vllm tree to hash)")
    tree = facts.vllm
    if facts.error or tree is None or tree.digest is None:
        why = facts.error or (tree.error if tree else None) or "not read"
        return Skip(f"{node}: the installed vllm package tree could not be hashed: {why}")
    measured = {"root": tree.root, "sha256": tree.digest, "files": len(tree.files)}
    ref = head_facts.vllm if head_facts is not None else None
    if node == head or ref is None or ref.digest is None:
        return Finding.passed(
            measured,
            "hashed",
            node=node,
            message=f"{node}: vllm tree {tree.root} ({len(tree.files)} files) sha256 "
            f"{tree.digest[:16]}...",
        )
    if tree.digest == ref.digest:
        return Finding.passed(
            measured,
            f"{head}'s tree",
            node=node,
            message=f"{node}: vllm tree {tree.root} ({len(tree.files)} files) as on {head}",
        )
    changed = sorted(
        rel for rel in set(tree.files) | set(ref.files) if tree.files.get(rel) != ref.files.get(rel)
    )
    named = []
    for rel in changed[:MAX_FILES_NAMED]:
        if rel not in ref.files:
            named.append(f"{rel} (only on {node})")
        elif rel not in tree.files:
            named.append(f"{rel} (only on {head})")
        else:
            named.append(rel)
    more = f" and {len(changed) - MAX_FILES_NAMED} more" if len(changed) > MAX_FILES_NAMED else ""
    return Finding.failed(
        {**measured, "differs": changed[:20]},
        f"{head}'s tree, sha256 {ref.digest[:16]}...",
        node=node,
        message=(
            f"{node}: the installed vllm package ({tree.root}) differs from {head}'s: "
            f"sha256 {tree.digest[:16]}... vs {ref.digest[:16]}...; "
            f"{len(changed)} file(s) differ: {', '.join(named)}{more} (patched in place: the "
            "version string stays the same); expected the same code on every rank. "
            f"Fix: {VLLM_FIX}"
        ),
    )
