"""The NCCL sweep's memory guard: the largest message sized from the smallest node's
MemAvailable (pytest_spark/infra/nccl/sizing_check.py; dgx-spark-playbooks#102 / PR #103)."""

from __future__ import annotations

import pytest

from pytest_spark.infra.nccl.sizing_check import BUFFERS, sweep_sizes
from pytest_spark.settings.profiles import load_profile

GIB, MIB = 1 << 30, 1 << 20
NCCL = load_profile("dgx-spark-2node").nccl
IDLE_SPARK = 121_922_600 * 1024  # an idle GB10's MemAvailable (116.3 GiB: sparksim/meminfo.py)


def test_the_profile_sweep_fits_an_idle_spark_untouched() -> None:
    sizes = sweep_sizes(NCCL.min_bytes, NCCL.max_bytes, {"a": IDLE_SPARK, "b": IDLE_SPARK}, 0.25)
    assert (sizes.min_bytes, sizes.max_bytes, sizes.capped) == (1 * MIB, 1 * GIB, None)
    assert NCCL.max_mem_share == 0.25


def test_the_playbooks_16g_test_never_fits_a_spark() -> None:
    """-b 16G -e 16G: two 16 GiB buffers need 128 GiB available at a quarter; a Spark has
    119.7 GiB in all, so the guard caps it on an idle one (to 8 GiB: 16 GiB of buffers)."""
    sizes = sweep_sizes(16 * GIB, 16 * GIB, {"spark-1": IDLE_SPARK, "spark-2": IDLE_SPARK}, 0.25)
    assert sizes.max_bytes == 8 * GIB and sizes.min_bytes == 8 * GIB
    assert BUFFERS * sizes.max_bytes <= 0.25 * IDLE_SPARK
    assert sizes.capped is not None
    assert "sweep capped at 8 GiB (profile nccl.max_bytes 16 GiB)" in sizes.capped
    assert "dgx-spark-playbooks#102" in sizes.capped


def test_the_smallest_node_decides_and_the_cap_is_a_size_the_sweep_reaches() -> None:
    """5 GiB available on the worker: a quarter is 1.25 GiB, 640 MiB a buffer; the sweep
    doubles from 1 MiB, so it stops at 512 MiB."""
    sizes = sweep_sizes(MIB, GIB, {"head": IDLE_SPARK, "worker": 5 * GIB}, 0.25)
    assert (sizes.min_bytes, sizes.max_bytes) == (MIB, 512 * MIB)
    assert sizes.capped is not None and "worker has 5.0 GiB MemAvailable" in sizes.capped


def test_a_cap_below_the_smallest_size_runs_one_smaller_size() -> None:
    """335 MiB available (sparksim's floor under memory-held): a quarter is ~84 MiB, 41.9
    MiB a buffer; a sweep starting at 64 MiB runs at 32 MiB alone rather than not at all."""
    sizes = sweep_sizes(64 * MIB, 256 * MIB, {"w": 343_480 * 1024}, 0.25)
    assert (sizes.min_bytes, sizes.max_bytes) == (32 * MIB, 32 * MIB)
    assert sizes.capped is not None


def test_unread_memory_caps_nothing_and_a_bad_share_is_refused() -> None:
    assert sweep_sizes(MIB, GIB, {"a": None}, 0.25).capped is None
    assert sweep_sizes(MIB, GIB, {}, 0.25).max_bytes == GIB
    with pytest.raises(ValueError, match="max_mem_share"):
        sweep_sizes(MIB, GIB, {"a": IDLE_SPARK}, 0)
