"""The startup watch on real and reference vLLM logs: phases, progress, fail-fast."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_spark.readiness.vllm_log import classify, split_prefix
from pytest_spark.readiness.watch import StartupWatch

LOGS = Path(__file__).parent.parent / "fixtures" / "vllm_logs"


def replay(name: str, watch: StartupWatch | None = None, node: str = "spark-head") -> StartupWatch:
    watch = watch or StartupWatch(hang_timeout=300, placement_timeout=120, started=0.0)
    for i, line in enumerate((LOGS / name).read_text().splitlines()):
        watch.feed(node, [line], float(i))
    return watch


@pytest.mark.parametrize(
    "log",
    [
        "vllm-0.32.0-cpu-smollm2.log",
        "vllm-0.32.0-cpu-qwen2.5-0.5b.log",
        "reference-gpu-tp2.log",
        "spark-ray-tp2-healthy.log",
        "vllm-0.10-and-older.log",
    ],
)
def test_real_logs_walk_every_phase_in_order(log: str) -> None:
    watch = replay(log)
    assert [p["phase"] for p in watch.timeline()] == [
        "start",
        "weights",
        "kv",
        "graphs",
        "api",
        "ready",
    ]
    assert watch.failure is None
    starts = [p["start_s"] for p in watch.timeline()]
    assert starts == sorted(starts)


def test_gpu_log_progress_and_facts() -> None:
    watch = StartupWatch(hang_timeout=300, placement_timeout=120, started=0.0)
    lines = (LOGS / "reference-gpu-tp2.log").read_text().splitlines()
    for i, line in enumerate(lines[:7]):
        watch.feed("spark-head", [line], float(i))
    assert watch.phase == "weights"
    assert watch.progress["weights"] == (22, 39, "05:11")
    assert "shards 22/39" in watch.status_line(10.0)
    assert "eta 05:11" in watch.status_line(10.0)
    watch = replay("reference-gpu-tp2.log")
    assert watch.facts["kv_size.tokens"] == "1,587,648"
    assert watch.facts["version"] == "0.11.0"
    assert watch.progress["graphs"] == (35, 35, "00:00")


def test_prefixes_are_split() -> None:
    line = split_prefix("(RayWorkerWrapper pid=455, ip=192.168.200.13) INFO x")
    assert (line.process, line.pid, line.ip, line.text) == (
        "RayWorkerWrapper",
        455,
        "192.168.200.13",
        "INFO x",
    )
    assert split_prefix("INFO:     Application startup complete.").process is None


@pytest.mark.parametrize(
    ("line", "signature"),
    [
        (
            "(EngineCore_DP0 pid=212) ERROR 11-29 10:00:20 [core.py:708] ValueError: Free memory "
            "on device (58.2/119.7 GiB) on startup is less than desired GPU memory utilization "
            "(0.9, 107.73 GiB).",
            "free-memory",
        ),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", "cuda-oom"),
        ("RuntimeError: NCCL Error 2: unhandled system error", "nccl-error"),
        (
            "[rank0]:[E] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)",
            "nccl-watchdog",
        ),
        (
            "ray.exceptions.RayActorError: The actor died unexpectedly before finishing this task.",
            "ray-actor-died",
        ),
        (
            "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
            "engine-dead",
        ),
        (
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core "
            "proc(s): {}",
            "engine-init-failed",
        ),
    ],
)
def test_fatal_signature_fails_at_once_naming_node_and_fix(line: str, signature: str) -> None:
    watch = replay("reference-gpu-tp2.log", node="spark-head")
    watch = StartupWatch(hang_timeout=300, placement_timeout=120, started=0.0)
    watch.feed("spark-head", ["(APIServer pid=1) INFO starting"], 1.0)
    watch.feed("spark-worker-1", ["(RayWorkerWrapper pid=9) INFO loading", line], 2.0)
    assert watch.failure is not None
    assert watch.failure.kind == "fatal"
    assert watch.failure.signature == signature
    assert watch.failure.node == "spark-worker-1"
    text = watch.failure.message()
    assert "spark-worker-1" in text and "fix:" in text
    assert "--- last 1 log lines of spark-head ---" in text  # every node's tail


def test_benign_allreduce_line_is_not_fatal() -> None:
    events = classify("Custom allreduce is disabled because this process group spans across nodes.")
    assert [(e.kind, e.name) for e in events] == [("benign", "custom-allreduce-disabled")]


LOADING = "(RayWorkerWrapper pid=455, ip=192.168.200.13) INFO Starting to load model /m..."


# The local-GPU warning in every wording vLLM printed or was proposed to print
# (fixtures/vllm_logs/README.md names each source).
LOCAL_GPU_WARNINGS = [
    "(EngineCore_DP0 pid=1121) WARNING 01-22 12:06:34 [ray_utils.py:337] Tensor parallel size "
    "(2) exceeds available GPUs (1). This may result in Ray placement group allocation "
    "failures. Consider reducing tensor_parallel_size to 1 or less, or ensure your Ray "
    "cluster has 2 GPUs available.",
    "World size (16) exceeds locally visible GPUs (8).",
    "Total GPU requirement (world_size=16) exceeds locally visible GPUs (8).",
    "Required GPU count (16) exceeds locally visible GPUs (8).",
    "Parallelism world size (TP=8 x PP=2 = 16) exceeds locally available GPUs (8).",
]


@pytest.mark.parametrize("line", LOCAL_GPU_WARNINGS)
def test_local_gpu_warning_is_benign_in_every_wording(line: str) -> None:
    """vLLM compares the world size with the local node's GPUs (vllm#31005): on two Sparks
    every healthy Ray start prints it, so it is neither a hang nor a failure, however long
    the start then takes."""
    assert [(e.kind, e.name) for e in classify(line)] == [("benign", "local-gpus-below-world-size")]
    watch = StartupWatch(hang_timeout=300, placement_timeout=30, started=0.0)
    watch.feed("spark-head", [line], 1.0)
    watch.feed("spark-head", [line], 200.0)
    watch.feed("spark-head", [LOADING], 250.0)
    watch.check_stall(260.0)
    assert watch.failure is None
    assert watch.phase == "weights"


@pytest.mark.parametrize("log", ["spark-ray-tp2-healthy.log", "public-healthy-excerpts.log"])
def test_recorded_healthy_multi_node_starts_pass(log: str) -> None:
    """The lines healthy two-node starts print (REFERENCE §4, the public threads) pass the
    watch; the excerpts stop short of the API, which the watch then confirms."""
    watch = replay(log)
    assert watch.failure is None
    watch.check_stall(float(len((LOGS / log).read_text().splitlines())))
    assert watch.failure is None
    if not watch.ready:
        assert watch.phase == "graphs"
        watch.mark_ready(100.0)
    assert watch.ready


def test_placement_group_that_forms_in_time_is_no_hang() -> None:
    """Ray prints the wait while the worker joins; a group formed inside the budget is a
    healthy (slow) start."""
    watch = StartupWatch(hang_timeout=300, placement_timeout=120, started=0.0)
    wait = (
        "(EngineCore_DP0 pid=1) INFO [ray_utils.py:300] Waiting for creating a placement "
        "group of specs for {} seconds. specs=[{{'GPU': 1.0}}, {{'GPU': 1.0}}]"
    )
    watch.feed("spark-head", [LOCAL_GPU_WARNINGS[0]], 1.0)
    for s in (10, 30, 70):
        watch.feed("spark-head", [wait.format(s)], float(s))
    for i, line in enumerate((LOGS / "spark-ray-tp2-healthy.log").read_text().splitlines()):
        watch.feed("spark-head", [line], 80.0 + i)
    assert watch.failure is None and watch.ready


@pytest.mark.parametrize("line", (LOGS / "rendezvous-timeouts.log").read_text().splitlines())
def test_rendezvous_timeouts_are_fatal_with_the_master_address_fix(line: str) -> None:
    watch = StartupWatch(hang_timeout=300, placement_timeout=120, started=0.0)
    watch.feed("spark-head", ["(APIServer pid=1) INFO starting"], 1.0)
    watch.feed("spark-worker-1", [line], 2.0)
    assert watch.failure is not None
    assert (watch.failure.kind, watch.failure.signature) == ("fatal", "rendezvous-timeout")
    text = watch.failure.message()
    assert text.startswith("vLLM failed to start on spark-worker-1: rendezvous-timeout")
    assert "did not all reach the master address/port" in text
    assert "--master-addr/--master-port" in text and "--headless" in text


def test_fastsafetensors_progress_counts_as_shards() -> None:
    watch = StartupWatch(hang_timeout=300, placement_timeout=120, started=0.0)
    lines = (LOGS / "fastsafetensors.log").read_text().splitlines()
    watch.feed("spark-head", lines[:1], 1.0)
    assert watch.phase == "weights" and watch.progress["weights"] == (0, 1, "?")
    watch.feed("spark-head", lines[1:], 2.0)
    assert watch.progress["weights"] == (1, 1, "00:00")
    assert "shards 1/1" in watch.status_line(3.0)


def test_older_vllm_wordings_give_load_facts_and_graph_progress() -> None:
    """vLLM <= 0.10: "Model loading took X GiB and S seconds" ends the weights phase and
    "Capturing CUDA graph shapes" is the graph capture's progress."""
    watch = StartupWatch(hang_timeout=300, placement_timeout=120, started=0.0)
    lines = (LOGS / "vllm-0.10-and-older.log").read_text().splitlines()
    for i, line in enumerate(lines[:2]):
        watch.feed("spark-head", [line], float(i))
    assert watch.phase == "kv"
    assert watch.facts["model_loading.gib"] == "2.2845"
    assert watch.facts["model_loading.s"] == "74.270197"
    for i, line in enumerate(lines[2:7], start=2):
        watch.feed("spark-head", [line], float(i))
    assert watch.phase == "graphs" and watch.progress["graphs"] == (9, 35, "00:09")
    assert "graphs 9/35" in watch.status_line(8.0)
    v0 = (LOGS / "vllm-v0-ray-weights.log").read_text().splitlines()
    watch = StartupWatch(hang_timeout=300, placement_timeout=120, started=0.0)
    watch.feed("spark-head", [LOADING, *v0], 1.0)
    assert [p.name for p in watch.phases] == ["start", "weights", "kv"]


def test_placement_group_wait_is_a_hang_after_its_budget() -> None:
    watch = StartupWatch(hang_timeout=300, placement_timeout=30, started=0.0)
    line = (
        "(EngineCore_DP0 pid=1) INFO [ray_utils.py:300] Waiting for creating a placement "
        "group of specs for {} seconds. specs=[{{'GPU': 1.0}}, {{'GPU': 1.0}}]"
    )
    watch.feed("spark-head", [line.format(10)], 10.0)
    assert watch.failure is None
    watch.feed("spark-head", [line.format(20)], 20.0)
    assert watch.failure is None
    watch.feed("spark-head", [line.format(30)], 30.0)
    assert watch.failure is not None and watch.failure.kind == "hang"
    assert "placement-group" in watch.failure.signature
    assert "ray status" in watch.failure.message()


PG_WAIT = (
    "(EngineCore_DP0 pid=1) INFO [ray_utils.py:300] Waiting for creating a placement group of "
    "specs for {} seconds. specs=[{{'GPU': 1.0}}, {{'GPU': 1.0}}]"
)


def test_placement_group_not_formed_is_a_hang_at_the_budget_between_its_lines() -> None:
    """vLLM prints the wait after 10, 30, 70, 150 s...: the budget (60 s here) runs out
    between two lines, and the watch calls the hang then, not at the next line."""
    watch = StartupWatch(hang_timeout=300, placement_timeout=60, started=0.0)
    watch.feed("spark-head", [PG_WAIT.format(10)], 12.0)
    watch.feed("spark-head", [PG_WAIT.format(30)], 32.0)
    watch.check_stall(61.0)
    assert watch.failure is None
    watch.check_stall(62.0)
    assert watch.failure is not None and watch.failure.kind == "hang"
    assert watch.failure.signature == (
        "placement-group (waiting 60 s, limit 60 s: the profile's "
        "readiness.placement_group_timeout_s)"
    )
    assert "Waiting for creating a placement group of specs for 30 seconds" in (
        watch.failure.message()
    )


def test_a_placement_group_that_formed_is_no_longer_a_pending_hang() -> None:
    watch = StartupWatch(hang_timeout=300, placement_timeout=60, started=0.0)
    watch.feed("spark-head", [PG_WAIT.format(10)], 10.0)
    watch.feed("spark-worker-1", [LOADING], 15.0)
    watch.check_stall(200.0)
    assert watch.failure is None


def test_silence_while_loading_is_a_stall() -> None:
    watch = StartupWatch(hang_timeout=20, placement_timeout=30, started=0.0)
    watch.feed(
        "spark-head",
        ["Loading safetensors checkpoint shards:   5% Completed | 2/39 [00:36<11:00, 18.0s/it]"],
        1.0,
    )
    watch.check_stall(20.0)
    assert watch.failure is None
    watch.check_stall(21.5)
    assert watch.failure is not None and watch.failure.kind == "stalled"
    assert watch.failure.message().startswith(
        "vLLM startup stalled: no log progress for 20 s in phase weights "
        "(limit 20 s: --spark-hang-timeout)"
    ), watch.failure.message()
    assert "raise --spark-hang-timeout" in watch.failure.message()


def test_container_exit_is_a_failure_with_tails() -> None:
    watch = StartupWatch(hang_timeout=20, placement_timeout=30, started=0.0)
    watch.feed("spark-worker-1", ["Traceback (most recent call last):"], 1.0)
    watch.container_exited("spark-worker-1", "exited (code 1)", 2.0)
    assert watch.failure is not None
    assert "serving container exited on spark-worker-1" in watch.failure.message()
    assert "Traceback" in watch.failure.message()


def test_mark_ready_closes_the_timeline() -> None:
    watch = StartupWatch(hang_timeout=20, placement_timeout=30, started=100.0)
    watch.mark_ready(104.5)
    assert watch.ready
    assert watch.timeline()[-1] == {"phase": "ready", "start_s": 4.5, "end_s": 4.5}


def test_cpu_compile_warmup_is_the_graphs_phase() -> None:
    """vLLM on CPU compiles (silently, for minutes) after "Warming up model for the
    compilation...": that is the graphs phase, not KV sizing."""
    lines = (LOGS / "vllm-0.32.0-cpu-smollm2.log").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "Warming up model for the compilation" in line)
    watch = StartupWatch(hang_timeout=300, placement_timeout=120, started=0.0)
    for i, line in enumerate(lines[: at + 1]):
        watch.feed("spark-head", [line], float(i))
    assert watch.phase == "graphs"
    assert watch.phases[-1].start == float(at)


def test_cpu_memory_reservation_fails_fast_with_the_fix() -> None:
    line = (
        "(VllmWorker-0 pid=5694) ERROR 11-29 19:46:30 [multiproc_executor.py:953] ValueError: "
        "Available memory on node 0 (15.63/18.09 GiB) on startup is less than desired CPU "
        "memory utilization (0.92, 16.64 GiB)."
    )
    watch = StartupWatch(hang_timeout=300, placement_timeout=120, started=0.0)
    watch.feed("spark-head", [line], 1.0)
    assert watch.failure is not None
    assert watch.failure.signature == "cpu-memory"
    assert "VLLM_CPU_KVCACHE_SPACE" in watch.failure.message()


# -- earlyoom as the container's PID 1 (launch-cluster.sh --earlyoom; issue #28) ----------
EARLYOOM = Path(__file__).parent.parent / "fixtures" / "earlyoom"
ENGINE_DEAD = (
    "(APIServer pid=1) ERROR 12-03 16:40:12 [async_llm.py:480] "
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."
)


@pytest.mark.parametrize(
    "fixture", ["manpage-report.txt", "readme-start.txt", "v1.7-container-log.txt"]
)
def test_earlyoom_banner_and_reports_are_monitor_lines(fixture: str) -> None:
    lines = (EARLYOOM / fixture).read_text().splitlines()
    kinds = {line: [e.kind for e in classify(line)] for line in lines}
    kills = [line for line in lines if line.startswith("sending SIGTERM to")]
    for line, found in kinds.items():
        assert found == (["fatal"] if line in kills else ["monitor"]), (line, found)


@pytest.mark.parametrize("line", (EARLYOOM / "readme-kill.txt").read_text().splitlines())
def test_earlyoom_kill_line_names_the_process_and_its_rss_in_every_version(line: str) -> None:
    (event,) = classify(line)
    assert event.kind == "fatal" and event.name == "earlyoom-kill"
    assert event.value["process"] == "tail" and event.value["rss_mib"] == "4962"
    assert event.value["detail"] == 'earlyoom sent SIGTERM to process 7378 "tail" (VmRSS 4962 MiB)'
    v19 = 'sending SIGKILL to process 9 uid 0 "vllm": oom_score 900, oom_score_adj 0, VmRSS 7 MiB'
    assert classify(v19)[0].value["signal"] == "SIGKILL"


def test_earlyoom_reports_are_no_proof_of_life_a_stall_under_them_is_a_stall() -> None:
    watch = StartupWatch(hang_timeout=30, placement_timeout=120, started=0.0)
    report = (EARLYOOM / "manpage-report.txt").read_text().strip()
    watch.feed("spark-worker-1", [LOADING], 1.0)
    for t in range(2, 40):  # a report every second (-r 1), nothing else
        watch.feed("spark-worker-1", [report], float(t))
        watch.check_stall(float(t))
    assert watch.failure is not None and watch.failure.kind == "stalled"
    assert "no log progress for 30 s" in watch.failure.signature
    tail = watch.failure.tails["spark-worker-1"]
    assert tail == [LOADING, report]  # the newest report stays, the older ones make room


def test_an_earlyoom_kill_is_the_one_failure_over_the_engine_dead_error_it_causes() -> None:
    watch = StartupWatch(hang_timeout=300, placement_timeout=120, started=0.0)
    kill = (EARLYOOM / "v1.7-container-log.txt").read_text().splitlines()[-2]
    watch.feed("spark-head", [ENGINE_DEAD], 5.0)  # the head's log came first in the poll
    watch.feed("spark-worker-1", [kill], 5.0)
    failure = watch.failure
    assert failure is not None and failure.node == "spark-worker-1"
    assert failure.signature == (
        'earlyoom-kill: earlyoom sent SIGTERM to process 8342 "python3" (VmRSS 110231 MiB)'
    )
    assert "--gpu-memory-utilization" in failure.remediation
    assert "memory headroom" in failure.remediation
    watch.feed("spark-head", [ENGINE_DEAD], 6.0)  # a consequence never replaces it
    assert watch.failure is failure
