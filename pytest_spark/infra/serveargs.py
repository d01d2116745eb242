"""What a ``vllm serve ...`` command line promises: model, served name, limits, parsers."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass


@dataclass(frozen=True)
class ServeArgs:
    model: str | None
    served_names: tuple[str, ...]
    max_model_len: int | None
    tensor_parallel_size: int
    reasoning_parser: str | None
    tool_call_parser: str | None
    auto_tool_choice: bool
    api_key_set: bool
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    executor_backend: str | None = None  # --distributed-executor-backend
    nnodes: int | None = None
    headless: bool = False
    gpu_memory_utilization: float | None = None  # None: not on the line (vLLM's default)
    kv_cache_memory_bytes: int | None = None  # --kv-cache-memory-bytes, per GPU
    parallelism_given: bool = False  # any of TP/PP/DP on the line (the launcher trims then)
    max_num_seqs: int | None = None  # --max-num-seqs (None: vLLM's default for the platform)
    # --gpu-memory-utilization-gb (eugr's gpu-mem-util-gb mod): GiB per rank, in place of
    # the fraction (mods/gpu-mem-util-gb/gpu_mem.patch: ceil(N * 1024**3))
    gpu_memory_utilization_gb: float | None = None
    speculative_config: str | None = None  # --speculative-config's JSON text (spec decoding)
    quantization: str | None = None  # --quantization
    dtype: str | None = None  # --dtype

    @property
    def mode(self) -> str | None:
        """``ray`` or ``no-ray`` when the line says which; None when it does not."""
        if self.executor_backend == "ray":
            return "ray"
        if self.executor_backend == "mp" or self.nnodes is not None or self.headless:
            return "no-ray"
        return None

    @property
    def ranks(self) -> int:
        """GPU ranks the line asks for: TP x PP x DP, one GPU each."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    def describe_ranks(self) -> str:
        """``TP 2 x PP 2 = 4 ranks`` (DP named only when it is not 1)."""
        parts = [f"TP {self.tensor_parallel_size}", f"PP {self.pipeline_parallel_size}"]
        if self.data_parallel_size != 1:
            parts.append(f"DP {self.data_parallel_size}")
        return f"{' x '.join(parts)} = {self.ranks} rank{'s' if self.ranks != 1 else ''}"

    def nodes_used(self, gpus_per_node: int = 1) -> int:
        """Nodes the launcher keeps: TP x PP x DP ranks over the nodes' GPUs."""
        return max(1, -(-self.ranks // max(1, gpus_per_node)))

    @property
    def served_name(self) -> str | None:
        return self.served_names[0] if self.served_names else self.model


RAY_PROCESS = re.compile(r"\bray start\b|\braylet\b|\bgcs_server\b")
SHORT = {
    "-sc": "--speculative-config",
    "-q": "--quantization",
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
}


def _length(value: str) -> int:
    text = value.strip().lower()
    for suffix, factor in (("k", 1024), ("m", 1024 * 1024)):
        if text.endswith(suffix):
            return int(float(text[:-1]) * factor)
    return int(text)


_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(value: str) -> int:
    """vLLM's ``human_readable_int`` (vllm/engine/arg_utils.py), the type of
    ``--kv-cache-memory-bytes``: a lowercase suffix is decimal (``25.6k`` = 25600), an
    uppercase one binary (``1K`` = 1024, no decimals: vLLM refuses ``1.5G``)."""
    text = value.strip()
    match = _HUMAN_INT.fullmatch(text)
    if match:
        number, suffix = match.groups()
        if suffix in _DECIMAL:
            return int(float(number) * _DECIMAL[suffix])
        if "." in number:
            raise ValueError(
                f"{value!r}: decimals are not allowed with binary suffixes like {suffix} "
                f"(vLLM refuses it; {number}{suffix.lower()} is the decimal form)"
            )
        return int(number) * _BINARY[suffix]
    return int(text)


def parse_serve_args(command: str) -> ServeArgs:
    """Parse ``vllm serve MODEL --flag value ...`` (``--flag=value`` too)."""
    argv = shlex.split(command)
    if argv[:2] == ["vllm", "serve"]:
        argv = argv[2:]
    elif argv and argv[0].endswith(("vllm", "api_server")):
        argv = argv[1:]
    model: str | None = None
    names: list[str] = []
    values: dict[str, str] = {}
    flags: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in SHORT:  # vLLM's -tp/-pp/-dp
            arg = SHORT[arg]
        if arg.startswith("--"):
            key, eq, val = arg[2:].partition("=")
            if eq:
                values[key] = val
            elif key == "served-model-name":
                while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                    names.append(argv[i + 1])
                    i += 1
            elif i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                values[key] = argv[i + 1]
                i += 1
            else:
                flags.add(key)
        elif model is None:
            model = arg
        i += 1
    if "served-model-name" in values:
        names = [values["served-model-name"]]
    model = model or values.get("model")
    return ServeArgs(
        model=model,
        served_names=tuple(names),
        max_model_len=_length(values["max-model-len"]) if "max-model-len" in values else None,
        tensor_parallel_size=int(values.get("tensor-parallel-size", values.get("tp", "1"))),
        reasoning_parser=values.get("reasoning-parser"),
        tool_call_parser=values.get("tool-call-parser"),
        auto_tool_choice="enable-auto-tool-choice" in flags,
        api_key_set="api-key" in values,
        pipeline_parallel_size=int(values.get("pipeline-parallel-size", "1")),
        data_parallel_size=int(values.get("data-parallel-size", "1")),
        executor_backend=values.get("distributed-executor-backend"),
        nnodes=int(values["nnodes"]) if "nnodes" in values else None,
        headless="headless" in flags,
        gpu_memory_utilization=(
            float(values["gpu-memory-utilization"]) if "gpu-memory-utilization" in values else None
        ),
        kv_cache_memory_bytes=(
            human_readable_int(values["kv-cache-memory-bytes"])
            if "kv-cache-memory-bytes" in values
            else None
        ),
        parallelism_given=bool(
            {"tensor-parallel-size", "tp", "pipeline-parallel-size", "data-parallel-size"}
            & values.keys()
        ),
        max_num_seqs=int(values["max-num-seqs"]) if "max-num-seqs" in values else None,
        gpu_memory_utilization_gb=(
            float(values["gpu-memory-utilization-gb"])
            if "gpu-memory-utilization-gb" in values
            else None
        ),
        speculative_config=values.get("speculative-config"),
        quantization=values.get("quantization"),
        dtype=values.get("dtype"),
    )


def mode_of_processes(processes: list[str]) -> str | None:
    """``ray`` or ``no-ray`` from a container's process lines (``docker top`` args): Ray
    mode runs ``ray start``/``raylet`` in every container, so a ``vllm serve`` with no Ray
    process beside it is a no-Ray rank."""
    if any(RAY_PROCESS.search(line) for line in processes):
        return "ray"
    modes = set()
    for line in processes:
        if "vllm serve" in line:
            try:
                modes.add(parse_serve_args(line[line.index("vllm serve") :]).mode)
            except ValueError:  # a cut or shell-quoted line
                modes.add(None)
    if "ray" in modes:
        return "ray"
    return "no-ray" if modes else None


def expected_ray_members(
    serve_args: str | None, nodes: int, profile_gpus: float | None, gpus_per_node: int = 1
) -> tuple[int, float, str]:
    """What ``ray status`` must show for this deployment: (nodes, GPUs, why). Serve args
    that give TP, PP or DP say it: that many ranks, one GPU each, on the nodes the
    launcher keeps (launch-cluster.sh trims its node list to them; ``nodes`` caps it).
    Else, as the launcher then starts Ray on every node, the profile's GPU figure, or one
    GPU on each of the ``nodes``."""
    args = parse_serve_args(serve_args) if serve_args else None
    if args is not None and args.parallelism_given:
        kept = min(nodes, args.nodes_used(gpus_per_node))
        return kept, float(args.ranks), f"the serve args' {args.describe_ranks()}"
    if profile_gpus is not None:
        return nodes, profile_gpus, "the profile's readiness.expected_gpus"
    return nodes, float(nodes * gpus_per_node), f"one GPU on each of the {nodes} nodes"
