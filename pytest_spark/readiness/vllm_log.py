"""vLLM startup/serving log lines -> phases, progress, fatal and hang signatures.

Pure: lines in, events out. Accepts the line shapes of several vLLM versions (e.g.
``Starting vLLM API server 0 on URL`` and 0.32's ``Starting vLLM server on URL``) and the
process prefixes ``(APIServer pid=N)``, ``(EngineCore_DP0 pid=N)``,
``(RayWorkerWrapper pid=N, ip=...)``, ``(Worker pid=N)``. Recorded real lines, and where
each wording comes from, are in ``fixtures/vllm_logs/README.md``.
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
# fastsafetensors (--load-format fastsafetensors) loads the files in groups of one per rank,
# so N is ceil(files / world size), not the number of shards.
FASTSAFETENSORS = re.compile(
    r"Loading safetensors using Fastsafetensor loader:\s*(?P<pct>\d+)% Completed \| "
    r"(?P<k>\d+)/(?P<n>\d+) \[(?P<elapsed>[\d:]+)<(?P<eta>[\d:?]+)"
)
# "Capturing CUDA graphs (decode, FULL): 35%|###| 12/35" (V1) and, up to vLLM 0.10,
# "Capturing CUDA graph shapes: 100%|#####| 35/35" (the bar is missing where stderr is no tty).
GRAPHS = re.compile(
    r"Capturing CUDA graph(?:s| shapes)[^:]*:\s*(?P<pct>\d+)%(?:\|[^|]*\|)?\s*"
    r"(?P<k>\d+)/(?P<n>\d+)(?: \[(?P<elapsed>[\d:]+)<(?P<eta>[\d:?]+))?"
)
WEIGHTS_START = re.compile(
    r"Starting to load model |Loading model weights(?! took)|Loading weights with"
)
CPU_WARMUP = re.compile(r"Warming up model for the compilation")  # CPU: torch.compile
# "Loading weights took S seconds"; before V1 (<= 0.7) "Loading model weights took X GB".
WEIGHTS_TOOK = re.compile(
    r"Loading weights took (?P<s>[\d.]+) seconds|Loading model weights took (?P<gb>[\d.]+) GB"
)
# "Model loading took X GiB memory and S seconds"; vLLM <= 0.10: "X GiB and S seconds".
MODEL_TOOK = re.compile(
    r"Model loading took (?P<gib>[\d.]+) GiB(?: memory)? and (?P<s>[\d.]+) seconds"
)
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
    # torch.distributed rendezvous of the --nnodes/--node-rank ranks (no Ray): the store on
    # --master-addr:--master-port never saw every rank (TCPStore / c10d / torchelastic).
    (
        "rendezvous-timeout",
        re.compile(
            r"DistStoreError: (?:wait timeout after \d+ ?ms|Timed out after \d+ seconds "
            r"waiting for clients)|RendezvousTimeoutError|The client socket has timed out "
            r"after \d+ ?ms while trying to connect to"
        ),
    ),
    ("engine-dead", re.compile(r"EngineDeadError")),
    ("engine-init-failed", re.compile(r"RuntimeError: Engine core initialization failed")),
)
# earlyoom as the container's PID 1 (launch-cluster.sh --earlyoom; earlyoom 1.7 in eugr's
# image, fixtures/earlyoom/README.md): its banner and its memory report every -r seconds
# (60 by default, the first at once) share the container log with the ranks. They are
# neither load progress nor proof of life: a stall under them is still a stall.
EARLYOOM_MONITOR = re.compile(
    r"^(?:earlyoom v?\d[\w.-]*$"
    r"|mem avail: *\d+ of *\d+ MiB \( *[\d.]+ ?%\), swap free: *\d+ of *\d+ MiB"
    r"|mem total: *\d+ MiB, (?:user mem total: *\d+ MiB, )?swap total: *\d+ MiB"
    r"|sending SIGTERM when mem (?:avail )?<=|\s+SIGKILL when mem (?:avail )?<="
    r"|low memory! at or below SIGTERM limits|low memory! at or below SIGKILL limits"
    r"|escalating to SIGKILL after|process (?:\d+ )?exited after [\d.]+ seconds"
    r"|Could not lock memory|memory situation has recovered"
    r"|Preferring to kill process names|Will avoid killing process names"
    r"|Priority was raised successfully|Could not set (?:priority|oom_score_adj))"
)
# earlyoom's kill line: the root cause of the rank's death (and of the EngineDeadError its
# peers print after it). v1.7: `badness N, VmRSS N MiB`; 1.8 and later: `oom_score N, ...`.
EARLYOOM_KILL = re.compile(
    r"^sending (?P<signal>SIGTERM|SIGKILL) to process (?P<pid>\d+) uid (?P<uid>\d+) "
    r'"(?P<process>[^"]*)": (?:badness|oom_score) (?P<score>-?\d+)'
    r"(?:, oom_score_adj -?\d+)?, VmRSS (?P<rss_mib>\d+) MiB"
)
HANG = (
    (
        "placement-group",
        re.compile(
            r"Waiting for creating a placement group of specs for "
            r"(?P<s>\d+) seconds"
        ),
    ),
)
# Printed by every healthy multi-node start: never a hang or a failure by itself.
BENIGN = (
    (
        "custom-allreduce-disabled",
        re.compile(r"Custom allreduce is disabled because this process group spans across nodes"),
    ),
    # ray_utils.py compares the world size with the GPUs of the *local* node (one on a
    # Spark), in each wording vLLM has used or proposed (vllm-project/vllm#31005).
    (
        "local-gpus-below-world-size",
        re.compile(
            r"(?:Tensor parallel size|World size|Total GPU requirement|Required GPU count|"
            r"Parallelism world size) \([^)]*\) exceeds "
            r"(?:available|locally visible|locally available) GPUs \(\d+\)"
        ),
    ),
)

# Fatal signatures that a rank dying elsewhere makes its peers print: a dead rank, or an
# earlyoom kill, found in the same poll is the root cause. (A CUDA OOM or a watchdog
# timeout is a cause of its own.)
CONSEQUENCES = frozenset({"nccl-error", "ray-actor-died", "engine-dead", "engine-init-failed"})
# Fatal signatures that name the root cause of those consequences.
ROOT_CAUSES = frozenset({"earlyoom-kill"})

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
    "rendezvous-timeout": "the ranks did not all reach the master address/port (torch."
    "distributed rendezvous, no Ray): check --master-addr/--master-port (the head's fabric "
    "address, the port open and free on the head), the fabric link between the nodes, and "
    "that every worker runs its headless rank (`vllm serve ... --headless --node-rank R`, "
    "same --nnodes) and has not crashed; restart all ranks together",
    "engine-dead": "the engine died: read the worker's log for the first error",
    "earlyoom-kill": "earlyoom (the container's PID 1, launch-cluster.sh --earlyoom) killed it: "
    "the node's available memory fell under earlyoom's -M limit. Leave memory headroom: "
    "lower --gpu-memory-utilization (or --gpu-memory-utilization-gb, --max-model-len), stop "
    "other memory users on that node (`free -m`, `docker ps`); GB10's GPU memory is the "
    "same RAM",
    "engine-init-failed": "engine initialisation failed: the root cause is in the lines above",
    "placement-group": "Ray cannot place the TP group: a node's GPU is not registered with Ray "
    "(worker container down or not joined): `ray status` must show every "
    "node and GPU",
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

    kind: str  # phase | progress | fatal | hang | fact | benign | monitor
    name: str
    line: str
    value: dict[str, str] = field(default_factory=dict)


def classify(raw: str) -> list[Event]:
    """All events in one log line (usually zero or one)."""
    line = split_prefix(raw)
    text = line.text
    m = EARLYOOM_KILL.search(text)
    if m:
        v = m.groupdict()
        detail = (
            f'earlyoom sent {v["signal"]} to process {v["pid"]} "{v["process"]}" '
            f"(VmRSS {v['rss_mib']} MiB)"
        )
        return [Event("fatal", "earlyoom-kill", raw.rstrip("\n"), {**v, "detail": detail})]
    if EARLYOOM_MONITOR.search(text):
        return [Event("monitor", "earlyoom", raw.rstrip("\n"))]
    for name, pattern in BENIGN:
        if pattern.search(text):
            return [Event("benign", name, raw.rstrip("\n"))]
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
        ("progress", "weights", FASTSAFETENSORS),
        ("progress", "graphs", GRAPHS),
        ("phase", "kv", WEIGHTS_TOOK),
        ("phase", "graphs", CPU_WARMUP),
        ("phase", "kv", MODEL_TOOK),
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
