"""Fault names and the live fault set (environment at start + JSON control file at run time).

Control file (path in ``SPARKSIM_EMU_CONTROL``, re-read when it changes)::

    {"faults": ["slow-decode", "http-5xx"], "decode_tok_s": 20, "max_agg_tok_s": 100}

``faults`` replaces the control-file part of the set (the environment part stays);
numeric keys override the matching knob while present. ``worker-death`` is a one-way
event: once the engine is dead it stays dead, as in vLLM.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable

# Faults that act while loading (environment only: the process is not serving yet).
LOAD_FAULTS = {
    "crash-oom": "torch.OutOfMemoryError while loading weights; engine init fails, exit 1",
    "crash-free-memory": "ValueError: Free memory on device ... at worker init, exit 1",
    "crash-nccl": "NCCL error + watchdog timeout at distributed init, exit 1",
    "hang-placement-group": "placement-group wait line forever, never ready",
    "hang-silent": "logging stops mid-load, never ready",
    "slow-load": "every startup phase x10",
    "crawl-load": "every startup phase x100: a load no test's node-loss window outlasts",
    "killed-during-load": "the process is SIGKILLed a third into the weights, printing "
    "nothing (vllm serve gone, its container up: an OOM kill or an operator's kill)",
}

# Faults that act while serving (environment or control file).
RUN_FAULTS = {
    "worker-death": "RayActorError + EngineDeadError in the log, /health 503, requests 500",
    "slow-decode": "1-stream decode rate / 10 (a per-step cost the batch shares)",
    "http-5xx": "chat and text completions answer HTTP 500",
    "engine-hang": "the engine stops stepping after ready: /health and /v1/models answer 200, "
    "every completion request waits unanswered until its client gives up (containers up, "
    "sparkrun status green: sparkrun#252)",
    "malformed-sse": "one SSE data line carries invalid JSON",
    "truncated-stream": "connection closed mid-stream, no [DONE]",
    "invalid-json-body": "non-streaming body is not valid JSON (HTTP 200)",
    "tool-in-content": "raw <tool_call> markup left in content, no tool_calls",
    "tool-args-unstreamed": "streamed tool call: header only, arguments never sent",
    "tool-param-leak": "</parameter> leaks into content next to the tool call",
    "tool-args-strings": "every tool argument typed as a string",
    "tool-delta-no-type": "streamed named tool_choice call: the header delta has no "
    '"type": "function" (vLLM #16340; the SDK\'s stream helper then leaves the call untyped)',
    "think-in-content": "the </think> tag leaks into content",
    "reasoning-in-content": "reasoning lands in content, reasoning field null",
    "answer-in-reasoning": "with enable_thinking false the answer lands in reasoning",
    # structured output (issue #16)
    "response-format-ignored": "response_format (json_schema, json_object) is ignored: "
    "the answer is plain text",
    # load: SLOs and goodput (issue #16 section 3)
    "ttft-grows-with-batch": "TTFT + 1 s for each other request running when one is "
    "admitted (prefill stalled behind the decodes): the SLOs break only under load",
    # long context (issue #16 section 6)
    "context-beyond-native": "the model's native context is a quarter of --max-model-len "
    "(served past it without the rope scaling its card prescribes): an answer reads only "
    "the prompt's last max_model_len/4 tokens, so a fact further back is lost and a needle "
    "question gets a made-up answer",
    # /metrics health under load (issue #16 section 7)
    "preempt-under-load": "every request admitted beside another is preempted once "
    "(vllm:num_preemptions grows under a batch)",
    # the soak (issue #16 section 5)
    "heat-throttle": "the GPU heats under a sustained batch and clocks down: past its "
    "thermal target steps slow, up to 4x (thermal.py), back to full speed once idle; a short "
    "sweep stays cool, a soak's tok/s drifts down",
    # what the ranks loaded (issue #28 part 1; sparksim/emulator/nccl.py)
    "nccl-system-build": "this rank maps the image's system libnccl2 (another build of the same "
    "NCCL version) in place of the wheel's, as with /usr/lib/<arch> first on its "
    "LD_LIBRARY_PATH (vllm#41725)",
    "nccl-two-builds": "this rank maps the system libnccl2 beside the wheel's (two NCCLs in one "
    "process: VLLM_NCCL_SO_PATH loaded after torch's)",
    # accuracy (issue #24): a cluster that serves wrong answers
    "garble": 'the model computes garbage: wrong answers to what it is asked ("12 + 7" -> '
    '"12 + 7 = 12"), numbers in tool arguments under auto written as strings, the prompt '
    "logprobs far off: a corrupt all-reduce or a broken kernel, at any batch size",
    "garble-under-batch": "wrong answers only with GARBLE_BATCH (4) or more completion requests "
    "in flight: a batch-dependent path (CUDA graphs captured per batch size, speculative "
    "decoding's batched verification)",
    # speculative decoding (issue #27 part 1): only with --speculative-config
    "spec-collapse": "drafts mostly rejected (acceptance ~0.31: a draft head that does not "
    "match the target) while each draft token costs half a decode step: the stream decodes "
    "at ~0.77x its rate without drafting (specdecode.py)",
    "logprob-drift": "the answers stay right, the prompt logprobs move (mean -0.15 nats/token, "
    "a tenth of the top-1 tokens lose their rank): precision or quantization drift",
}
GARBLE_BATCH = 4  # garble-under-batch: requests in flight from which answers go wrong
BATCH_TTFT_S = 1.0  # ttft-grows-with-batch: seconds added per other running request
NATIVE_SHARE = 4  # context-beyond-native: max_model_len / native context (YaRN factor 4)

ALL_FAULTS = {**LOAD_FAULTS, **RUN_FAULTS}

NUMERIC_OVERRIDES = (
    "decode_tok_s",
    "max_agg_tok_s",
    "ttft_s",
    "prefill_tok_s",
    "step_expert_share",  # the decode step model (issue #16 section 9); 0: linear batches
)


def parse_faults(text: str | Iterable[str]) -> set[str]:
    items = text.split(",") if isinstance(text, str) else list(text)
    names = {item.strip() for item in items if item and item.strip()}
    unknown = names - set(ALL_FAULTS)
    if unknown:
        known = ", ".join(sorted(ALL_FAULTS))
        raise ValueError(f"unknown fault(s) {', '.join(sorted(unknown))}; known: {known}")
    return names


class FaultState:
    """The set of active faults and knob overrides, safe to read from any thread."""

    def __init__(self, env_faults: set[str], control_path: str = "") -> None:
        self._env = set(env_faults)
        self._control: set[str] = set()
        self._overrides: dict[str, float] = {}
        self._path = control_path
        self._stamp: tuple[float, int] | None = None
        self._lock = threading.Lock()
        self.last_error = ""

    def active(self, name: str) -> bool:
        with self._lock:
            return name in self._env or name in self._control

    def names(self) -> set[str]:
        with self._lock:
            return self._env | self._control

    def override(self, key: str, default: float) -> float:
        with self._lock:
            return self._overrides.get(key, default)

    def poll(self) -> bool:
        """Re-read the control file if it changed; True when the fault set changed."""
        if not self._path:
            return False
        try:
            st = os.stat(self._path)
        except OSError:
            stamp = None
        else:
            stamp = (st.st_mtime, st.st_size)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        faults: set[str] = set()
        overrides: dict[str, float] = {}
        if stamp is not None:
            try:
                with open(self._path, encoding="utf-8") as fh:
                    data = json.load(fh)
                faults = parse_faults(data.get("faults", []))
                overrides = {k: float(data[k]) for k in NUMERIC_OVERRIDES if k in data}
                self.last_error = ""
            except (OSError, ValueError, AttributeError, TypeError) as exc:
                # A half-written file: keep the previous state, retry on the next change.
                self.last_error = str(exc)
                self._stamp = None
                return False
        with self._lock:
            changed = faults != self._control or overrides != self._overrides
            self._control = faults
            self._overrides = overrides
        return changed
