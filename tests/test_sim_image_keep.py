"""A sim keeps its own link to the image tarball it was built from: a newer image built by
another checkout's sim prunes the shared cache, and ``spark-sim fault clear`` (after
``fault docker NODE no-image``) must still re-import this sim's image. Seen on a shared
machine: a matrix lane's clear failed with `open /var/cache/sparksim/images/vllm-node-...
.tar: no such file or directory`."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from sparksim import serving


def test_the_kept_tarball_outlives_the_cache_entry(tmp_path: Path) -> None:
    cache = tmp_path / "cache" / "vllm-node-abc.tar"
    cache.parent.mkdir()
    cache.write_bytes(b"layer")
    state = tmp_path / "state"
    state.mkdir()
    kept = serving._keep_tarball(state, cache)
    assert kept == state / serving.KEPT_TARBALL and kept.samefile(cache)
    cache.unlink()  # image._prune, from another checkout's build
    assert kept.read_bytes() == b"layer"
    cache.write_bytes(b"newer")  # a sim brought up again in the same state dir: relinked
    assert serving._keep_tarball(state, cache).read_bytes() == b"newer"


def test_the_cache_path_where_no_link_can_be_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "vllm-node-abc.tar"
    cache.write_bytes(b"layer")

    def cross_device(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(serving.os, "link", cross_device)
    assert serving._keep_tarball(tmp_path, cache) == cache
