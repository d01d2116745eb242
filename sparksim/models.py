"""The fake checkpoint each node holds: ``/root/models/Qwen3.5-122B-A10B-FP8``, and the
same files as repo ``Qwen/Qwen3.5-122B-A10B-FP8`` in the node's Hugging Face cache
(``~/.cache/huggingface/hub``: where sparkrun finds a recipe's model on each node).

The layout of a Hugging Face FP8 checkpoint (config, generation config, tokenizer files,
``model.safetensors.index.json`` and 39 ``model-000NN-of-00039.safetensors`` shards), each
shard a valid but tiny safetensors file. Every byte is derived from the file name, so all
nodes hold identical copies and a preflight check can compare lists, sizes and hashes;
``fault model NODE`` makes one node's copy differ.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

MODEL_NAME = "Qwen3.5-122B-A10B-FP8"
MODELS_DIR = "models"  # under the node's home: /root/models
HF_REPO = f"Qwen/{MODEL_NAME}"  # the checkpoint's repo id in the node's Hugging Face cache
HF_HUB = ".cache/huggingface/hub"  # under the node's home: huggingface_hub's default cache
SHARDS = 39
FAULT_SHARD = 17
FAULT_KINDS = ("corrupt", "missing", "truncated")

CONFIG = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "torch_dtype": "bfloat16",
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "moe_intermediate_size": 1024,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "max_position_embeddings": 262144,
    "rope_theta": 10000000,
    "rms_norm_eps": 1e-06,
    "vocab_size": 248320,
    "tie_word_embeddings": False,
    "bos_token_id": 248044,
    "eos_token_id": 248046,
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    },
    "transformers_version": "4.57.0",
}
GENERATION_CONFIG = {
    "bos_token_id": 248044,
    "eos_token_id": [248046, 248044],
    "do_sample": True,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
    "transformers_version": "4.57.0",
}
SPECIAL = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046,
           "<think>": 248068, "</think>": 248069, "<tool_call>": 248058,
           "</tool_call>": 248059}  # fmt: skip
VOCAB = {chr(c): i for i, c in enumerate(range(33, 127))}
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
    "message.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
)


def shard_name(i: int) -> str:
    return f"model-{i:05d}-of-{SHARDS:05d}.safetensors"


def _tensors(i: int) -> dict[str, tuple[str, list[int], int]]:
    """name -> (dtype, shape, byte size) of shard i (1-based)."""
    layer = (i - 1) * 48 // SHARDS
    base = f"model.language_model.layers.{layer}.mlp.experts.{i}"
    return {
        f"{base}.down_proj.weight": ("F8_E4M3", [8, 16], 128),
        f"{base}.down_proj.weight_scale_inv": ("F32", [1, 1], 4),
        f"{base}.gate_up_proj.weight": ("F8_E4M3", [16, 8], 128),
        f"{base}.gate_up_proj.weight_scale_inv": ("F32", [1, 1], 4),
    }


def _shard(i: int) -> bytes:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape, size) in _tensors(i).items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads the header to 8 bytes
    data = b""
    seed = shard_name(i).encode()
    while len(data) < offset:
        seed = hashlib.sha256(seed).digest()
        data += seed
    return struct.pack("<Q", len(text)) + text + data[:offset]


def files() -> dict[str, bytes]:
    """File name -> content of the whole checkpoint."""
    out: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(1, SHARDS + 1):
        out[shard_name(i)] = _shard(i)
        for name, (_, _, size) in _tensors(i).items():
            weight_map[name] = shard_name(i)
            total += size
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    vocab = {**VOCAB, **SPECIAL}
    tokenizer: dict[str, object] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for t, i in SPECIAL.items()
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": []},
    }  # fmt: skip
    tokenizer_config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": CONFIG["max_position_embeddings"],
        "tokenizer_class": "Qwen2Tokenizer",
        "chat_template": CHAT_TEMPLATE,
    }

    def dump(obj: object) -> bytes:
        return (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode()

    out.update({
        "config.json": dump(CONFIG),
        "generation_config.json": dump(GENERATION_CONFIG),
        "model.safetensors.index.json": dump(index),
        "tokenizer.json": dump(tokenizer),
        "tokenizer_config.json": dump(tokenizer_config),
        "vocab.json": dump(vocab),
        "merges.txt": b"#version: 0.2\n",
    })  # fmt: skip
    return out


def model_dir(home: Path) -> Path:
    return home / MODELS_DIR / MODEL_NAME


def install(home: Path) -> Path:
    """Write the checkpoint under ``home`` (a node's /root); replace any older copy. The
    same checkpoint is in the node's Hugging Face cache too (:func:`install_hf_cache`)."""
    dest = model_dir(home)
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    content = files()
    for name, data in content.items():
        (tmp / name).write_bytes(data)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    install_hf_cache(home, content)
    return dest


def hf_cache_dir(home: Path) -> Path:
    """``~/.cache/huggingface/hub/models--Qwen--Qwen3.5-122B-A10B-FP8`` under ``home``."""
    return home / HF_HUB / ("models--" + HF_REPO.replace("/", "--"))


def hf_revision(content: dict[str, bytes]) -> str:
    """The snapshot's commit: 40 hex digits derived from the files, as stable as they are."""
    h = hashlib.sha1()
    for name in sorted(content):
        h.update(name.encode() + b"\0" + hashlib.sha256(content[name]).digest())
    return h.hexdigest()


def install_hf_cache(home: Path, content: dict[str, bytes] | None = None) -> Path:
    """The checkpoint as ``huggingface_hub`` caches repo ``HF_REPO`` (blobs, a snapshot of
    relative links to them, ``refs/main``), where sparkrun looks for a recipe's ``model:``
    repo id on each node (its remote cache ``~/.cache/huggingface``, mounted at
    /cache/huggingface in its containers; ``--offline`` needs the snapshot there)."""
    content = files() if content is None else content
    dest = hf_cache_dir(home)
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    rev = hf_revision(content)
    snapshot = tmp / "snapshots" / rev
    for d in (tmp / "blobs", tmp / "refs", snapshot):
        d.mkdir(parents=True)
    for name, data in content.items():
        blob = hashlib.sha256(data).hexdigest()
        (tmp / "blobs" / blob).write_bytes(data)
        (snapshot / name).symlink_to(f"../../blobs/{blob}")
    (tmp / "refs" / "main").write_text(rev)  # no newline, as huggingface_hub writes it
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return dest


def damage(home: Path, kind: str) -> str:
    """Make this node's copy differ from the others; return what was done."""
    path = model_dir(home) / shard_name(FAULT_SHARD)
    if kind == "missing":
        path.unlink(missing_ok=True)
        return f"{path.name} deleted"
    data = files()[path.name]
    if kind == "truncated":
        path.write_bytes(data[: len(data) // 2])
        return f"{path.name} truncated to {len(data) // 2} of {len(data)} bytes"
    if kind == "corrupt":
        flipped = bytearray(data)
        flipped[-1] ^= 0xFF  # same size, different hash
        path.write_bytes(bytes(flipped))
        return f"{path.name} corrupted (same size, different sha256)"
    raise ValueError(f"unknown model fault {kind!r}: use one of {', '.join(FAULT_KINDS)}")
