"""The memory-bandwidth roofline of single-stream decode (issue #27 part 3): its formula,
the parsers of a model's active parameters and bytes per parameter, and the serve-args
fields it reads."""

from __future__ import annotations

import pytest

from pytest_spark.infra.serveargs import parse_serve_args
from pytest_spark.infra.servecmd import parse_non_default_args
from pytest_spark.serving.load.roofline import (
    Roofline,
    active_from_config,
    active_in_name,
    bytes_in_name,
    bytes_of,
    roofline_of,
)


def test_qwen35_122b_a10b_fp8_at_tp2_is_546_gbs_over_10_gb() -> None:
    roof = roofline_of("Qwen/Qwen3.5-122B-A10B-FP8", None, None, None, 2)
    assert roof is not None
    assert (roof.active_params_b, roof.bytes_per_param, roof.nodes) == (10.0, 1.0, 2)
    assert roof.tok_s == pytest.approx(54.6)  # 2 x 273 GB/s / (10e9 x 1 B)
    assert roof.fraction(31.5) == pytest.approx(0.577, abs=1e-3)  # the published 31.5
    assert roof.text(31.5) == "58% of the 54.6 tok/s roofline (10B active x 1 B, 2 x 273 GB/s)"
    assert roof.to_dict(31.5)["fraction"] == 0.5769


def test_roofline_scales_with_nodes_and_bytes() -> None:
    one = Roofline(10.0, "x", 1.0, "x", 1)
    assert one.tok_s == pytest.approx(27.3)
    assert Roofline(10.0, "x", 0.5, "x", 2).tok_s == pytest.approx(109.2)
    assert Roofline(8.0, "x", 2.0, "x", 1).tok_s == pytest.approx(273 / 16)


@pytest.mark.parametrize(
    ("name", "active"),
    [
        ("Qwen3.5-122B-A10B-FP8", 10.0),
        ("/root/models/Qwen3-30B-A3B", 3.0),
        ("Qwen3-235B-A22B-Instruct-2507-FP8", 22.0),
        ("nvidia/Nemotron-3.5-30B-A3.5B", 3.5),
        ("meta-llama/Llama-3.1-8B-Instruct", None),
        ("gpt-oss-120b", None),
        (None, None),
    ],
)
def test_active_parameters_from_the_name(name: str | None, active: float | None) -> None:
    assert active_in_name(name) == active


@pytest.mark.parametrize(
    ("word", "size"),
    [("fp8", 1.0), ("NVFP4", 0.5), ("awq", 0.5), ("bfloat16", 2.0), ("auto", 2.0), ("x", None)],
)
def test_bytes_of_a_quantization_or_dtype(word: str, size: float | None) -> None:
    assert bytes_of(word) == size


def test_bytes_from_the_name() -> None:
    assert bytes_in_name("Qwen3.5-122B-A10B-FP8") == 1.0
    assert bytes_in_name("Qwen3-30B-A3B-NVFP4") == 0.5
    assert bytes_in_name("Llama-3.1-8B-Instruct-AWQ") == 0.5
    assert bytes_in_name("Llama-3.1-8B-Instruct") is None


def test_active_parameters_estimated_from_a_config() -> None:
    dense = {  # Llama-3.1-8B's shapes: ~7.5B without the input embedding (+0.5B lm head)
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
    }
    assert active_from_config(dense) == pytest.approx(7.5, abs=0.1)
    moe = {  # Qwen3-30B-A3B's shapes: the publisher says 3.3B active
        "hidden_size": 2048,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "moe_intermediate_size": 768,
        "num_experts_per_tok": 8,
        "vocab_size": 151936,
    }
    assert active_from_config({"text_config": moe}) == pytest.approx(3.0, abs=0.35)
    assert active_from_config({"hidden_size": 1}) is None


def test_roofline_sources_in_order() -> None:
    config = {"quantization_config": {"quant_method": "fp8"}, "torch_dtype": "bfloat16"}
    named = roofline_of("Qwen3-30B-A3B", config, None, None, 1, 99.0)
    assert named is not None and named.params_source.startswith("the model's name")
    assert named.bytes_source == "config.json quantization_config"
    forced = roofline_of("Qwen3-30B-A3B", config, "awq", None, 1)
    assert forced is not None and forced.bytes_per_param == 0.5
    profile = roofline_of("my-model", None, None, "bfloat16", 1, 12.0)
    assert profile is not None and profile.active_params_b == 12.0
    assert profile.params_source == "the profile's roofline.active_params_b"
    assert profile.bytes_source == "--dtype bfloat16"
    assert roofline_of("my-model", None, None, None, 1) is None  # nothing tells


def test_serve_args_carry_quantization_dtype_and_speculative_config() -> None:
    args = parse_serve_args(
        "vllm serve Qwen/Qwen3.5-122B-A10B-FP8 -tp 2 -q fp8 --dtype bfloat16 "
        '--speculative-config \'{"method": "mtp", "num_speculative_tokens": 2}\''
    )
    assert (args.quantization, args.dtype) == ("fp8", "bfloat16")
    assert args.speculative_config == '{"method": "mtp", "num_speculative_tokens": 2}'
    line = (
        "non-default args: {'model_tag': 'm', 'speculative_config': {'method': 'eagle3', "
        "'num_speculative_tokens': 3}, 'quantization': 'fp8'}"
    )
    parsed = parse_non_default_args(line)
    assert parsed is not None and parsed.quantization == "fp8"
    assert parsed.speculative_config == '{"method": "eagle3", "num_speculative_tokens": 3}'
