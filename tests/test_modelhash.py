"""The model files' full hash (--spark-model-hash=full): the command, its parser, the
listing it rewrites, the progress line, and the one case it is for: a byte changed
between the sampled blocks, which the sampled hash misses and the full hash catches."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_spark import progress_line_writer
from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.modelfiles import ModelListing
from pytest_spark.infra.modelhash.probe import (
    HashProgress,
    full_hash_command,
    parse_full_hash,
    with_full_hashes,
)
from pytest_spark.infra.preflight.model_check import check_model_identical
from pytest_spark.infra.preflight.probe import EDGE_BYTES, SAMPLES, sampled_sha256
from pytest_spark.settings.options import OPTIONS_BY_ATTR

MODEL = "/root/models/Qwen3.5-122B-A10B-FP8"
SHARD = "model-00001-of-00002.safetensors"


def shard_bytes(n: int = 4 * 1024 * 1024) -> bytes:
    out, seed = bytearray(), b"shard"
    while len(out) < n:
        seed = hashlib.sha256(seed).digest()
        out += seed
    return bytes(out[:n])


def flipped_between_samples(data: bytes) -> tuple[bytes, int]:
    """``data`` with one byte flipped in a block the sample does not read."""
    blocks = -(-len(data) // EDGE_BYTES)
    sampled = {i * (blocks - 1) // (SAMPLES - 1) for i in range(SAMPLES)}
    block = next(b for b in range(blocks // 2, blocks) if b not in sampled)
    at = block * EDGE_BYTES + 100
    out = bytearray(data)
    out[at] ^= 0x01
    return bytes(out), at


def listing(data: bytes) -> ModelListing:
    return ModelListing(
        MODEL,
        True,
        {"config.json": 10, SHARD: len(data)},
        {"config.json": "c" * 64},
        {SHARD: sampled_sha256(data)},
    )


def test_command_quotes_and_refuses_paths_outside_the_directory() -> None:
    assert full_hash_command("/data/my models", "a b.safetensors") == (
        "cd '/data/my models' && sha256sum -- 'a b.safetensors'"
    )
    for bad in ("/etc/passwd", "../x", "a/../../x", ""):
        with pytest.raises(ValueError):
            full_hash_command(MODEL, bad)


def test_parse_full_hash() -> None:
    digest = "ab" * 32
    assert parse_full_hash(f"{digest}  {SHARD}\n", SHARD) == digest
    with pytest.raises(ParseError, match="no sha256 line"):
        parse_full_hash(f"sha256sum: {SHARD}: Input/output error\n", SHARD)


def test_a_byte_between_the_samples_is_missed_sampled_and_caught_full() -> None:
    good = shard_bytes()
    bad, at = flipped_between_samples(good)
    assert at > len(good) // 2 - EDGE_BYTES  # in the middle of the shard
    head, worker = listing(good), listing(bad)
    sampled = check_model_identical(MODEL, {"spark-head": head, "spark-worker-1": worker}, "x")
    assert sampled.ok  # the sampled hash cannot see it: why the full hash exists

    full = {
        "spark-head": with_full_hashes(head, {SHARD: hashlib.sha256(good).hexdigest()}),
        "spark-worker-1": with_full_hashes(worker, {SHARD: hashlib.sha256(bad).hexdigest()}),
    }
    assert full["spark-head"].samples == {} and SHARD in full["spark-head"].hashes
    caught = check_model_identical(MODEL, full, "--spark-model-dir")
    assert not caught.ok and caught.node == "spark-worker-1"
    assert f"{SHARD} sha256 differs" in caught.message


def test_progress_line() -> None:
    plan = {
        "spark-head": {"a": 2_000_000_000, "b": 1_000_000_000},
        "spark-worker-1": {"a": 2_000_000_000},
    }
    p = HashProgress.start(plan)
    assert p.line(0.0).startswith("model sha256 (full): 0% (spark-head 0/2 files 0.0/3.0 GB")
    p.advance("spark-head", 2_000_000_000)
    p.advance("spark-worker-1", 2_000_000_000)
    assert "80% (spark-head 1/2 files 2.0/3.0 GB, spark-worker-1 1/1 files 2.0/2.0 GB" in p.line(
        10.0
    )
    assert "0.40 GB/s" in p.line(10.0) and not p.finished
    p.advance("spark-head", 1_000_000_000)
    assert p.finished and " 100% " in f" {p.line(12.0)} "


class Reporter:
    def __init__(self, tty: bool) -> None:
        self.tty, self.out = tty, []  # type: list[str]

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str, **_: Any) -> None:
        self.out.append(text)

    def write_line(self, text: str, **_: Any) -> None:
        self.out.append(text + "\n")

    def ensure_newline(self) -> None:
        pass

    def flush(self) -> None:
        pass


def config_with(reporter: Reporter) -> Any:
    plugins = {"terminalreporter": reporter, "capturemanager": None}
    return SimpleNamespace(pluginmanager=SimpleNamespace(get_plugin=plugins.get))


def test_progress_writer_throttles_a_log_and_rewrites_a_terminal() -> None:
    log = Reporter(tty=False)
    write = progress_line_writer(config_with(log), every_s=3600)
    write("model sha256 (full): 0% (x)")
    write("model sha256 (full): 50% (x)")  # within every_s: left out of a log
    write("model sha256 (full): 100% (x)")  # the last always comes
    assert log.out == ["model sha256 (full): 0% (x)\n", "model sha256 (full): 100% (x)\n"]
    dots = Reporter(tty=False)  # pytest -q: "....." on the line, no path before them
    dots._tw = SimpleNamespace(width_of_current_line=5)  # type: ignore[attr-defined]
    progress_line_writer(config_with(dots), every_s=3600)("soak 1/8 s: 2 requests 12%")
    assert dots.out == ["\n", "soak 1/8 s: 2 requests 12%\n"]  # a line of its own
    tty = Reporter(tty=True)
    write = progress_line_writer(config_with(tty), every_s=3600)
    write("model sha256 (full): 50% (x)")
    write("model sha256 (full): 100% (x)")
    assert tty.out[0].startswith("\r") and tty.out[1].endswith("\n") and len(tty.out) == 2


def test_option_defaults_to_the_sampled_hash() -> None:
    option = OPTIONS_BY_ATTR["model_hash"]
    assert option.default == "sampled"
    assert option.parse(" FULL ") == "full"
    with pytest.raises(ValueError, match=r"sampled .* or full"):
        option.parse("sha1")
