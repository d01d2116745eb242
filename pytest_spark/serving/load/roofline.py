"""The memory-bandwidth roofline of single-stream decode (issue #27 part 3).

Decode of one stream is memory-bound: each token reads every active weight once. On DGX
Spark each node's GB10 reads its LPDDR5x at 273 GB/s, and tensor parallelism splits the
weights over the nodes, so the ceiling is

    roofline tok/s = (273 GB/s x TP nodes) / (active parameters x bytes per parameter)

Pipeline stages read their layers one after another (a token passes every stage in turn),
so they add no bandwidth: the nodes counted are the tensor-parallel ranks (one GPU a node).
KV-cache reads, activations and the all-reduces come on top, so a real engine reaches a
fraction of it: Qwen3.5-122B-A10B-FP8 at TP=2 has 10e9 active parameters (the ``A10B`` of
its name, the publisher's count) x 1 byte (FP8) = 10 GB a token, 546 GB/s / 10 GB = 54.6
tok/s; the published 31.5 tok/s (bjk110 vllm-spark README) is 58% of it.

Where the figures come from, in order: the active parameter count from the model's name
(``-A10B``, the publisher's own figure), else estimated from its ``config.json`` (hidden
size, layers, heads, experts per token), else the profile's ``roofline.active_params_b``;
bytes per parameter from ``--quantization``, else the config's ``quantization_config``,
else the name (``FP8``, ``NVFP4``, ``AWQ``), else ``--dtype`` / ``torch_dtype``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SPARK_BANDWIDTH_GBS = 273.0  # one DGX Spark's LPDDR5x (NVIDIA's DGX Spark datasheet)

# Bytes a weight takes, by quantization method or dtype (lower case).
_BYTES = (
    (("nvfp4", "mxfp4", "fp4", "awq", "gptq", "int4", "w4a16", "w4a8", "bnb", "exl3"), 0.5),
    (("fp8", "int8", "w8a8", "w8a16", "compressed-tensors-fp8", "modelopt"), 1.0),
    (("bfloat16", "bf16", "float16", "fp16", "half", "auto"), 2.0),
    (("float32", "fp32", "float"), 4.0),
)
_ACTIVE_IN_NAME = re.compile(r"(?:^|[-_/])A(\d+(?:\.\d+)?)B(?:$|[-_.])")


def bytes_of(word: str | None) -> float | None:
    """Bytes a parameter takes under a quantization method or dtype name; None: unknown."""
    text = (word or "").strip().lower()
    if not text:
        return None
    for names, size in _BYTES:
        if text in names:
            return size
    return None


def bytes_in_name(model: str | None) -> float | None:
    """Bytes a parameter from a checkpoint's name (``...-FP8``, ``...-NVFP4``, ``-AWQ``)."""
    for word in reversed(re.split(r"[-_/.]", (model or "").lower())):
        size = bytes_of(word)
        if size is not None and word != "auto":
            return size
    return None


def active_in_name(model: str | None) -> float | None:
    """Active parameters (billions) a MoE checkpoint's name states: ``Qwen3.5-122B-A10B``
    -> 10.0, ``Qwen3-30B-A3B`` -> 3.0; None when the name says none."""
    match = _ACTIVE_IN_NAME.search(model or "")
    return float(match.group(1)) if match else None


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A multimodal config's language model part (``text_config``), else the config."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


def active_from_config(config: Mapping[str, Any]) -> float | None:
    """Active parameters (billions) a token reads, estimated from a Hugging Face
    ``config.json``: per layer the attention projections (q and o: hidden x heads x
    head_dim each; k and v: hidden x kv_heads x head_dim each) and the MLP (3 matrices
    of hidden x intermediate; for a MoE, ``num_experts_per_tok`` routed experts of
    ``moe_intermediate_size`` plus a shared expert when the config has one), and the LM
    head (vocab x hidden). Norms, biases and the router are left out (< 1%). An estimate:
    hybrid layers (linear attention) are counted as full attention."""
    c = _text_config(config)
    try:
        hidden = int(c["hidden_size"])
        layers = int(c["num_hidden_layers"])
        heads = int(c["num_attention_heads"])
        vocab = int(c["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or hidden // max(1, heads))
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    experts = int(c.get("num_experts_per_tok") or 0)
    if experts and c.get("moe_intermediate_size"):
        mlp = 3 * hidden * int(c["moe_intermediate_size"]) * experts
        mlp += 3 * hidden * int(c.get("shared_expert_intermediate_size") or 0)
    else:
        mlp = 3 * hidden * int(c.get("intermediate_size") or 4 * hidden)
    return (layers * (attention + mlp) + vocab * hidden) / 1e9


def config_bytes(config: Mapping[str, Any]) -> float | None:
    """Bytes a parameter from ``quantization_config.quant_method`` (else None)."""
    quant = config.get("quantization_config")
    if isinstance(quant, Mapping):
        return bytes_of(str(quant.get("quant_method") or ""))
    return None


@dataclass(frozen=True)
class Roofline:
    """The single-stream decode ceiling and where each of its figures came from."""

    active_params_b: float
    params_source: str
    bytes_per_param: float
    bytes_source: str
    nodes: int
    bandwidth_gbs: float = SPARK_BANDWIDTH_GBS

    @property
    def tok_s(self) -> float:
        return self.bandwidth_gbs * self.nodes / (self.active_params_b * self.bytes_per_param)

    def fraction(self, tok_s: float) -> float:
        return tok_s / self.tok_s

    def text(self, tok_s: float | None = None) -> str:
        """``57% of the 54.6 tok/s roofline (10B active x 1 B, 2 x 273 GB/s)``."""
        head = f"{100 * self.fraction(tok_s):.0f}% of the " if tok_s is not None else ""
        return (
            f"{head}{self.tok_s:.1f} tok/s roofline ({self.active_params_b:g}B active x "
            f"{self.bytes_per_param:g} B, {self.nodes} x {self.bandwidth_gbs:g} GB/s)"
        )

    def to_dict(self, tok_s: float | None = None) -> dict[str, Any]:
        return {
            "roofline_tok_s": round(self.tok_s, 2),
            "fraction": round(self.fraction(tok_s), 4) if tok_s is not None else None,
            "decode_tok_s": tok_s,
            "active_params_b": self.active_params_b,
            "params_source": self.params_source,
            "bytes_per_param": self.bytes_per_param,
            "bytes_source": self.bytes_source,
            "nodes": self.nodes,
            "bandwidth_gbs": self.bandwidth_gbs,
        }


def roofline_of(
    model: str | None,
    config: Mapping[str, Any] | None,
    quantization: str | None,
    dtype: str | None,
    tp: int,
    profile_active_b: float | None = None,
) -> Roofline | None:
    """The roofline from what is known of the model; None when its active parameters or
    bytes per parameter cannot be told."""
    config = config or {}
    params: tuple[float | None, str] = (active_in_name(model), f"the model's name ({model})")
    if params[0] is None:
        params = (active_from_config(config), "config.json (estimated from its shapes)")
    if params[0] is None:
        params = (profile_active_b, "the profile's roofline.active_params_b")
    size: tuple[float | None, str] = (bytes_of(quantization), f"--quantization {quantization}")
    for candidate in (
        (config_bytes(config), "config.json quantization_config"),
        (bytes_in_name(model), f"the model's name ({model})"),
        (bytes_of(dtype) if dtype and dtype != "auto" else None, f"--dtype {dtype}"),
        (bytes_of(str(_text_config(config).get("torch_dtype") or "")), "config.json torch_dtype"),
    ):
        if size[0] is None:
            size = candidate
    if params[0] is None or size[0] is None or params[0] <= 0:
        return None
    return Roofline(params[0], params[1], size[0], size[1], max(1, tp))
