"""Threshold profiles: built-ins, files that extend them, single-threshold overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_spark.settings.profiles import ProfileError, load_profile


def test_builtin_reference_figures() -> None:
    p = load_profile("dgx-spark-2node")
    assert p["link.min_rate_gbps"] == 200
    assert p["link.min_mtu"] == 4200
    assert p["nccl.min_busbw_gbps"] == 21.875
    assert p["nccl.max_bytes"] <= 4 * 1024**3  # 16 GiB buffers froze Sparks
    assert p["throughput.min_decode_tok_s_1"] == 20.0


def test_sim_extends_and_scales_bandwidth() -> None:
    sim, real = load_profile("sim"), load_profile("dgx-spark-2node")
    assert sim["link.min_rate_gbps"] == real["link.min_rate_gbps"]
    assert sim["nccl.min_busbw_gbps"] < real["nccl.min_busbw_gbps"] / 50


@pytest.mark.parametrize(
    ("key", "raw", "value"),
    [
        ("link.min_rate_gbps", "100", 100),
        ("nccl.min_busbw_gbps", "20.5", 20.5),
        ("reasoning.expected", "no", False),
        ("throughput.concurrency", "1;4", [1, 4]),
    ],
)
def test_override_keeps_the_type(key: str, raw: str, value: object) -> None:
    p = load_profile("sim").with_overrides({key: raw})
    assert p[key] == value
    assert key in p.overridden


def test_bad_override_names_the_type() -> None:
    with pytest.raises(ProfileError, match="expected a int"):
        load_profile("sim").with_overrides({"link.min_rate_gbps": "fast"})


def test_file_profile_with_cycle_is_refused(tmp_path: Path) -> None:
    a = tmp_path / "a.toml"
    a.write_text(f'extends = "{a}"\n')
    with pytest.raises(ProfileError, match="extends itself"):
        load_profile(str(a))


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[link\n")
    with pytest.raises(ProfileError, match=r"bad\.toml: invalid TOML"):
        load_profile(str(bad))
