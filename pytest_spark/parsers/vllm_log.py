"""vLLM startup/serving log lines -> phases, progress, fatal and hang signatures.

Pure: lines in, events out. Accepts the line shapes of several vLLM versions (e.g.
``Starting vLLM API server 0 on URL`` and 0.32's ``Starting vLLM server on URL``) and the
process prefixes ``(APIServer pid=N)``, ``(EngineCore_DP0 pid=N)``,
``(RayWorkerWrapper pid=N, ip=...)``, ``(Worker pid=N)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PREFIX = re.compile(
    r"^\((?P<proc>[A-Za-z_0-9-]+)(?: pid=(?P<pid>\d+))?(?:, ip=(?P<ip>[^)]*))?\)\s*"
)

# Phases in order. The weights phase covers checkpoint shards; kv = memory profiling and
# KV cache sizing (and CPU warm-up); graphs = CUDA graph capture / compilation; api = the
# HTTP server starting until "Application startup complete."
PHASES = ("start", "weights", "kv", "graphs", "api", "ready")

SHARDS = re.compile(
    r"Loading safetensors checkpoint shards:\s*(?P<pct>\d+)% Completed \| (?P<k>\d+)/(?P<n>\d+)"
    r" \[(?P<elapsed>[\d:]+)<(?P<eta>[\d:?]+)"
)
GRAPHS = re.compile(
    r"Capturing CUDA graphs[^:]*:\s*(?P<pct>\d+)%.*?\|\s*(?P<k>\d+)/(?P<n>\d+)"
    r"(?: \[(?P<elapsed>[\d:]+)<(?P<eta>[\d:?]+))?"
)
WEIGHTS_START = re.compile(r"Starting to load model |Loading model weights|Loading weights with")
CPU_WARMUP = re.compile(r"Warming up model for the compilation")  # CPU: torch.compile
WEIGHTS_TOOK = re.compile(r"Loading weights took (?P<s>[\d.]+) seconds")
MODEL_TOOK = re.compile(r"Model loading took (?P<gib>[\d.]+) GiB memory and (?P<s>[\d.]+) seconds")
KV_MEMORY = re.compile(r"Available KV cache memory: (?P<gib>[\d.]+) GiB")
KV_SIZE = re.compile(r"(?:GPU|CPU) KV cache size: (?P<tokens>[\d,]+) tokens")
GRAPHS_DONE = re.compile(r"Graph capturing finished in (?P<s>[\d.]+) secs")
INIT_ENGINE = re.compile(
    r"init engine \(profile, create kv cache, warmup model\) took "
    r"(?P<s>[\d.]+) s"
)
API_START = re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on (?P<url>\S+)")
READY = re.compile(r"Application startup complete\.")
VERSION = re.compile(r"(?:version (?P<v1>\d+\.\d+\.\S+)|V1 LLM engine \(v(?P<v2>[^)]+)\))")

# Fatal: fail the readiness wait at once. Order matters: the most specific first.
FATAL = (
    (
        "free-memory",
        re.compile(
            r"ValueError: Free memory on device .* is less than desired "
            r"GPU memory utilization"
        ),
    ),
    (
        "cuda-oom",
        re.compile(
            r"torch\.OutOfMemoryError: CUDA out of memory|"
            r"CUDA out of memory"
        ),
    ),
    (
        "cpu-memory",
        re.compile(r"Available memory on node .* is less than desired CPU memory utilization"),
    ),
    ("nccl-watchdog", re.compile(r"Watchdog caught collective operation timeout")),
    ("nccl-error", re.compile(r"NCCL Error|NCCL error|ncclInternalError|ncclSystemError")),
    ("ray-actor-died", re.compile(r"ray\.exceptions\.RayActorError|The actor died unexpectedly")),
    ("engine-dead", re.compile(r"EngineDeadError")),
    ("engine-init-failed", re.compile(r"RuntimeError: Engine core initialization failed")),
)
HANG = (
    (
        "placement-group",
        re.compile(
            r"Waiting for creating a placement group of specs for "
            r"(?P<s>\d+) seconds"
        ),
    ),
    (
        "tp-exceeds-gpus",
        re.compile(
            r"Tensor parallel size \(\d+\) exceeds available GPUs "
            r"\(\d+\)"
        ),
    ),
)
BENIGN = (
    re.compile(
        r"Custom allreduce is disabled because this process group spans "
        r"across nodes"
    ),
)

REMEDIATION = {
    "free-memory": "another process holds GPU memory (a stale container after a reboot is the "
    "usual cause): `docker ps` and `nvidia-smi` on every node, stop it, or lower "
    "--gpu-memory-utilization",
    "cuda-oom": "the model does not fit: lower --gpu-memory-utilization or --max-model-len, "
    "and check no other process holds GPU memory",
    "cpu-memory": "vLLM on CPU reserves --gpu-memory-utilization of the machine's RAM (0.92 by "
    "default): set VLLM_CPU_KVCACHE_SPACE (GiB of KV cache) or lower "
    "--gpu-memory-utilization",
    "nccl-watchdog": "a collective stalled: check the fabric link on both nodes (ibdev2netdev, "
    "ibstat) and that NCCL_SOCKET_IFNAME / NCCL_IB_HCA name the fabric",
    "nccl-error": "NCCL failed: check the fabric link state and the NCCL_* environment of the "
    "containers on every node (run with --nccl-debug INFO)",
    "ray-actor-died": "a Ray worker died (the worker node's container crashed or was killed): "
    "check `docker logs` on the worker and `ray status` on the head",
    "engine-dead": "the engine died: read the worker's log for the first error",
    "engine-init-failed": "engine initialisation failed: the root cause is in the lines above",
    "placement-group": "Ray cannot place the TP group: a node's GPU is not registered with Ray "
    "(worker container down or not joined): `ray status` must show every "
    "node and GPU",
    "tp-exceeds-gpus": "Ray sees fewer GPUs than --tensor-parallel-size: the worker node has "
    "not joined the Ray cluster",
}


@dataclass(frozen=True)
class LogLine:
    process: str | None
    pid: int | None
    ip: str | None
    text: str
    raw: str


def split_prefix(raw: str) -> LogLine:
    m = PREFIX.match(raw)
    if not m:
        return LogLine(None, None, None, raw.rstrip("\n"), raw)
    pid = m.group("pid")
    return LogLine(
        m.group("proc"), int(pid) if pid else None, m.group("ip"), raw[m.end() :].rstrip("\n"), raw
    )


@dataclass(frozen=True)
class Event:
    """What one line means: a phase change, progress, a fatal or hang signature."""

    kind: str  # phase | progress | fatal | hang | fact
    name: str
    line: str
    value: dict[str, str] = field(default_factory=dict)


def classify(raw: str) -> list[Event]:
    """All events in one log line (usually zero or one)."""
    line = split_prefix(raw)
    text = line.text
    if any(p.search(text) for p in BENIGN):
        return []
    for name, pattern in FATAL:
        if pattern.search(text):
            return [Event("fatal", name, raw.rstrip("\n"))]
    for name, pattern in HANG:
        m = pattern.search(text)
        if m:
            return [Event("hang", name, raw.rstrip("\n"), m.groupdict())]
    events: list[Event] = []
    for kind, name, pattern in (
        ("phase", "weights", WEIGHTS_START),
        ("progress", "weights", SHARDS),
        ("progress", "graphs", GRAPHS),
        ("phase", "kv", WEIGHTS_TOOK),
        ("phase", "graphs", CPU_WARMUP),
        ("fact", "model_loading", MODEL_TOOK),
        ("fact", "kv_memory", KV_MEMORY),
        ("fact", "kv_size", KV_SIZE),
        ("phase", "api", GRAPHS_DONE),
        ("phase", "api", INIT_ENGINE),
        ("phase", "api", API_START),
        ("phase", "ready", READY),
    ):
        m = pattern.search(text)
        if m:
            events.append(
                Event(
                    kind,
                    name,
                    raw.rstrip("\n"),
                    {k: v for k, v in m.groupdict().items() if v is not None},
                )
            )
    m = VERSION.search(text)
    if m:
        events.append(
            Event("fact", "version", raw.rstrip("\n"), {"version": m.group("v1") or m.group("v2")})
        )
    return events
