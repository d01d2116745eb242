"""The full model hash on real sim nodes: a 4 MiB shard the same on both nodes but for one
byte in the middle, between the sampled blocks. The preflight probe's sampled hash sees
the two alike (what it is made to cost: ~1 MiB read per shard); the full hash, run over
SSH as --spark-model-hash=full runs it, names the shard."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_spark.infra.modelfiles import ModelListing
from pytest_spark.infra.modelhash.probe import full_hash_command, parse_full_hash, with_full_hashes
from pytest_spark.infra.preflight.model_check import check_model_identical
from pytest_spark.infra.preflight.probe import (
    EDGE_BYTES,
    SAMPLES,
    parse_preflight_probe,
    preflight_probe_command,
)

pytestmark = pytest.mark.sim  # a sparksim of its own: needs root (the sim tier)

DIR = "/root/models/hash-test"  # under the node's own /root: nothing else reads it
SHARD = "model-00001-of-00001.safetensors"
SIZE = 4 * 1024 * 1024
NODES = {"spark-1": "spark-head", "spark-2": "spark-worker-1"}


def middle_unsampled_offset() -> int:
    blocks = SIZE // EDGE_BYTES
    sampled = {i * (blocks - 1) // (SAMPLES - 1) for i in range(SAMPLES)}
    block = next(b for b in range(blocks // 2, blocks) if b not in sampled)
    return block * EDGE_BYTES + 100


def listings(sim: Any) -> dict[str, ModelListing | None]:
    out: dict[str, ModelListing | None] = {}
    for name, suite_name in NODES.items():
        proc = sim.ssh(name, preflight_probe_command(container="vllm_node", model_dir=DIR))
        assert proc.returncode == 0, proc.stderr
        out[suite_name] = parse_preflight_probe(proc.stdout, DIR).model
    return out


def test_full_hash_catches_a_byte_the_sample_misses(healthy_sim: Any) -> None:
    make = (
        f"mkdir -p {DIR} && echo '{{}}' > {DIR}/config.json && "
        f"yes shard-weights | head -c {SIZE} > {DIR}/{SHARD}"
    )
    at = middle_unsampled_offset()
    flip = (  # one byte in the middle made 0xff (it was not: checked below)
        f"printf '\\377' | dd of={DIR}/{SHARD} bs=1 seek={at} conv=notrunc 2>/dev/null"
    )
    try:
        for name in NODES:
            healthy_sim.out(name, make)
        assert healthy_sim.out("spark-2", f"od -An -tx1 -j{at} -N1 {DIR}/{SHARD}").strip() != "ff"
        healthy_sim.out("spark-2", flip)

        sampled = listings(healthy_sim)
        head, worker = sampled["spark-head"], sampled["spark-worker-1"]
        assert head and worker and SHARD in head.samples  # 4 MiB: sampled, not hashed whole
        assert head.samples == worker.samples  # the sample misses the byte
        assert check_model_identical(DIR, sampled, "--spark-model-dir").ok

        full: dict[str, ModelListing | None] = {}
        for name, suite_name in NODES.items():
            text = healthy_sim.out(name, full_hash_command(DIR, SHARD))
            listing = sampled[suite_name]
            assert listing is not None
            full[suite_name] = with_full_hashes(listing, {SHARD: parse_full_hash(text, SHARD)})
        caught = check_model_identical(DIR, full, "--spark-model-dir")
        assert not caught.ok and caught.node == "spark-worker-1"
        assert f"{SHARD} sha256 differs" in caught.message
    finally:
        for name in NODES:
            healthy_sim.ssh(name, f"rm -rf {DIR}")
