"""Preflight, the model: room on the disk holding it, and the model directory identical on
every node (files, sizes, hashes).

Pure functions over :mod:`pytest_spark.infra.preflight.probe` facts and profile thresholds
(``preflight.*``): a :class:`Finding` whose failure message names the node, what was
measured, what was expected and the usual fix (STYLE.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from pytest_spark.infra.finding import Finding
from pytest_spark.infra.human import human_bytes, human_names
from pytest_spark.infra.modelfiles import ModelListing
from pytest_spark.infra.preflight.probe import SAMPLES, DiskUsage

# ----------------------------------------------------------------------------- disk


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


# ------------------------------------------------------------------------ model dir


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
