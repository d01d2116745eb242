"""The serving image as ``docker save`` writes it (sparksim.image.archive): loaded on every
node, it has one ID everywhere, as after build-and-copy.sh's ``docker save | docker load``
on real Sparks (the upstream launcher aborts where the IDs differ; ``docker import`` on
each node stamped each with its own time)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

from sparksim import image


def _rootfs(path: Path) -> Path:
    with tarfile.open(path, "w") as tar:
        data = b"#!/bin/sh\n"
        info = tarfile.TarInfo("usr/local/bin/vllm")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    os.utime(path, (1_750_000_000, 1_750_000_000))
    return path


def test_archive_holds_the_tarball_as_its_one_layer_with_a_fixed_config(tmp_path: Path) -> None:
    tarball = _rootfs(tmp_path / "vllm-node-abc.tar")
    path = image.archive(tarball)
    assert path == tmp_path / "vllm-node-abc.tar.save"
    with tarfile.open(path) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
    [entry] = json.loads(files["manifest.json"])
    assert entry["RepoTags"] == [image.IMAGE]
    config_bytes = files[entry["Config"]]
    assert entry["Config"] == hashlib.sha256(config_bytes).hexdigest() + ".json", "the image ID"
    [layer] = entry["Layers"]
    assert files[layer] == tarball.read_bytes()
    config = json.loads(config_bytes)
    diff_id = "sha256:" + hashlib.sha256(files[layer]).hexdigest()
    assert config["rootfs"] == {"type": "layers", "diff_ids": [diff_id]}
    assert config["created"] == "2025-06-15T15:06:40Z", "the tarball's mtime, not the load's"
    assert config["os"] == "linux" and config["architecture"]
    assert config["config"] == {
        "Env": [f"PATH={image.PATH}", "PYTHONUNBUFFERED=1"],
        "Cmd": ["/bin/bash"],
        "WorkingDir": "/workspace",
        "Labels": {"org.opencontainers.image.title": "vllm-node"},
    }
    assert len(config["history"]) == 1
    assert json.loads(files["repositories"]) == {"vllm-node": {"latest": layer.split("/")[0]}}
    # Built once: a second sim reuses it; built again from the same tarball, the same ID.
    first = path.read_bytes()
    assert image.archive(tarball) == path and path.read_bytes() == first
    path.unlink()
    assert image.archive(tarball).read_bytes() == first
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_prune_takes_an_archive_with_its_tarball(tmp_path: Path) -> None:
    tarballs = []
    for i in range(image.KEEP_TARBALLS + 1):
        t = _rootfs(tmp_path / f"vllm-node-{i}.tar")
        os.utime(t, (1_750_000_000 + i, 1_750_000_000 + i))
        image.archive(t)
        tarballs.append(t)
    orphan = tmp_path / "vllm-node-gone.tar.save"  # its tarball pruned by an older checkout
    orphan.write_bytes(b"")
    image._prune(tmp_path, keep=tarballs[-1])
    left = sorted(p.name for p in tmp_path.glob("vllm-node-*"))
    kept = [
        f"vllm-node-{i}.tar{s}" for i in range(1, image.KEEP_TARBALLS + 1) for s in ("", ".save")
    ]
    assert left == kept


def test_import_changes_are_the_config() -> None:
    """What `docker commit --change` keeps in a fault's rebuild (faults/alike.py)."""
    assert image.import_changes() == [
        f"ENV PATH={image.PATH}",
        "ENV PYTHONUNBUFFERED=1",
        "WORKDIR /workspace",
        'CMD ["/bin/bash"]',
        "LABEL org.opencontainers.image.title=vllm-node",
    ]
