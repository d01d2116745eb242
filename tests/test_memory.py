"""GB10 memory headroom: the parsers on recorded outputs (fixtures/memory), the probe's
facts, and the check's verdicts before a launch and while the engine serves."""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.finding import Skip
from pytest_spark.infra.memory.check import (
    VLLM_DEFAULT_UTILIZATION,
    Claim,
    check_container_limit,
    check_memory_headroom,
)
from pytest_spark.infra.memory.parse import (
    GIB,
    ContainerMemory,
    MemInfo,
    ProcessMemory,
    parse_compute_app_memory,
    parse_meminfo,
    parse_process_memory,
)
from pytest_spark.infra.memory.probe import (
    NodeMemory,
    memory_probe_command,
    parse_container_limit,
    parse_memory_probe,
)
from pytest_spark.infra.serveargs import parse_serve_args
from pytest_spark.infra.servecmd import MARK as SERVER_MARK
from pytest_spark.settings.profiles import load_profile
from sparksim.meminfo import meminfo_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "memory"
W = "spark-worker-1"
CLAIM = Claim(0.9, "--gpu-memory-utilization 0.9 in the serve args")


def probe(name: str) -> NodeMemory:
    return parse_memory_probe((FIXTURES / name).read_text())


def kb(text: str, key: str) -> int:
    m = re.search(rf"^{re.escape(key)}:\s+(\d+) kB$", text, re.M)
    assert m, key
    return int(m[1]) * 1024


# ----------------------------------------------------------------------------- parsers


def test_meminfo_of_a_real_kernel() -> None:
    text = (FIXTURES / "meminfo_x86_dev_machine.txt").read_text()
    info = parse_meminfo(text)
    assert info.total == kb(text, "MemTotal")
    assert info.available == kb(text, "MemAvailable")
    assert info.free == kb(text, "MemFree")
    assert info.cached == kb(text, "Cached") + kb(text, "Buffers")
    assert info.swap_used == kb(text, "SwapTotal") - kb(text, "SwapFree")


def test_meminfo_without_memavailable_and_not_meminfo() -> None:
    old = "MemTotal:  1000 kB\nMemFree:  400 kB\nBuffers:  10 kB\nCached:  90 kB\n"
    info = parse_meminfo(old)  # kernels before 3.14
    assert (info.available, info.free, info.cached) == (None, 400 * 1024, 100 * 1024)
    with pytest.raises(ParseError, match="no MemTotal"):
        parse_meminfo("cat: /proc/meminfo: No such file or directory\n")


def test_compute_apps_tolerate_na_memory() -> None:
    apps = parse_compute_app_memory(
        "4242, /usr/bin/python3, [N/A]\n4343, VLLM::EngineCore, 61440 MiB\n"
    )
    assert [(a.pid, a.name, a.used) for a in apps] == [
        (4242, "/usr/bin/python3", None),
        (4343, "VLLM::EngineCore", 60 * GIB),
    ]
    assert parse_compute_app_memory("No running processes found\n") == []
    assert parse_compute_app_memory("") == []


def test_process_listing_largest_first_and_gone_processes_skipped() -> None:
    out = parse_process_memory(
        "7\t100\tsshd\tsshd: root\n9\t\tgone\t\n8\t900\tpython3\tpython3 x\n"
    )
    assert [(p.pid, p.rss) for p in out] == [(8, 900 * 1024), (7, 100 * 1024)]


def test_serve_args_memory_utilization() -> None:
    line = "vllm serve /m --tensor-parallel-size 2 --gpu-memory-utilization 0.85"
    assert parse_serve_args(line).gpu_memory_utilization == 0.85
    assert parse_serve_args("vllm serve /m --gpu-memory-utilization=0.7").gpu_memory_utilization
    assert parse_serve_args("vllm serve /m").gpu_memory_utilization is None


def test_probe_of_a_held_node_names_the_holder() -> None:
    idle, held = probe("probe_worker_idle.txt"), probe("probe_worker_held_60gib.txt")
    assert idle.meminfo and held.meminfo
    assert idle.meminfo.available and held.meminfo.available
    assert idle.meminfo.available - held.meminfo.available == 60 * GIB
    top = held.processes[0]
    assert (top.name, top.rss) == ("python3", 60 * GIB)
    assert "signal.pause()" in top.args
    assert all("\n" not in p.args for p in held.processes)
    assert held.apps == ()  # nvidia-smi answered: no compute app


def test_sim_meminfo_is_a_gb10s() -> None:
    idle = parse_meminfo(meminfo_text())
    assert round(idle.total / GIB, 1) == 119.7  # CUDA's total in vLLM's free-memory error
    assert idle.available is not None and idle.available > 0.9 * idle.total + 4 * GIB
    full = parse_meminfo(meminfo_text(118 * 1024 * 1024))
    assert full.free > 0 and full.available is not None and full.available < 2 * GIB


# ------------------------------------------------------------------------------- check


def test_idle_node_passes_before_the_launch() -> None:
    f = check_memory_headroom(W, probe("probe_worker_idle.txt"), CLAIM, 4.0, engine_running=False)
    assert not isinstance(f, Skip) and f.level == "pass", f
    assert f.expected["claim_gib"] == pytest.approx(0.9 * 119.7, abs=0.1)


def test_held_node_fails_before_the_launch_naming_the_process() -> None:
    f = check_memory_headroom(
        W, probe("probe_worker_held_60gib.txt"), CLAIM, 4.0, engine_running=False
    )
    assert not isinstance(f, Skip) and f.level == "fail"
    m = f.message
    assert m.startswith(f"{W}: MemAvailable 56.3 GiB of MemTotal 119.7 GiB")  # measured
    assert "at least 111.7 GiB" in m and "0.9 x MemTotal = 107.7 GiB" in m  # expected
    assert "vLLM will refuse to start" in m and "Free memory on device" in m  # consequence
    assert re.search(
        r"pid \d+ python3 \(python3 -c import signal; signal.pause\(\)\) holds 60.0 GiB", m
    )
    assert "dockerd" not in m  # 0.1 GiB: not a holder worth naming, nor killing
    assert re.search(r"kill \d+;", m) and "lower --gpu-memory-utilization to 0.43" in m  # fix


def test_serving_node_is_judged_on_the_os_headroom_alone() -> None:
    """A healthy serving GB10: the engine holds 0.9 of 119.7 GiB, ~8 GiB stay available.
    Counting the claim again would fail it; with the engine running it passes."""
    serving = NodeMemory(
        "spark-2",
        MemInfo(
            total=int(119.7 * GIB),
            free=int(6 * GIB),
            available=int(8 * GIB),
            cached=int(2 * GIB),
            swap_total=0,
            swap_free=0,
        ),
        None,
        (ProcessMemory(77, "python3", 3 * GIB, "python3 -m vllm serve /m"),),
        (),
    )
    running = check_memory_headroom(
        W, serving, CLAIM, 4.0, engine_running=True, own_pids=frozenset({77})
    )
    assert not isinstance(running, Skip) and running.level == "pass", running
    before = check_memory_headroom(W, serving, CLAIM, 4.0, engine_running=False)
    assert not isinstance(before, Skip) and before.level == "fail"
    assert "python3 -m vllm serve" in before.message  # outside own_pids it is a holder
    assert serving.meminfo
    squeezed = replace(serving, meminfo=replace(serving.meminfo, available=int(2 * GIB)))
    own = check_memory_headroom(
        W, squeezed, CLAIM, 4.0, engine_running=True, own_pids=frozenset({77})
    )
    assert not isinstance(own, Skip) and own.level == "fail"
    assert "python3 -m vllm serve" not in own.message  # the engine's own: not a holder


def test_held_while_serving_fails_on_the_os_headroom() -> None:
    held = probe("probe_worker_held_60gib.txt")
    assert held.meminfo
    short = replace(held, meminfo=replace(held.meminfo, available=int(2.3 * GIB)))
    f = check_memory_headroom(W, short, CLAIM, 4.0, engine_running=True)
    assert not isinstance(f, Skip) and f.level == "fail"
    assert "expected at least 4.0 GiB left for the OS" in f.message
    assert "with the serving engine running" in f.message and "python3" in f.message
    assert "lower --gpu-memory-utilization" not in f.message  # the engine is already up


def test_gpu_holder_is_the_one_failure() -> None:
    f = check_memory_headroom(
        W,
        probe("probe_worker_held_60gib.txt"),
        CLAIM,
        4.0,
        engine_running=False,
        gpu_held="test_gpu_not_held_by_others[spark-worker-1] has the evidence",
    )
    assert isinstance(f, Skip)
    assert "because the GPU is held outside the serving container" in f.reason
    assert "test_gpu_not_held_by_others[spark-worker-1]" in f.reason and "56.3 GiB" in f.reason


def test_gpu_apps_with_na_memory_are_named() -> None:
    held = probe("probe_worker_held_60gib.txt")
    apps = tuple(parse_compute_app_memory("5151, ollama, [N/A]\n"))
    f = check_memory_headroom(W, replace(held, apps=apps), CLAIM, 4.0, engine_running=False)
    assert not isinstance(f, Skip)
    assert "GPU compute app pid 5151 ollama: memory [N/A]" in f.message


def test_no_big_process_says_where_else_to_look() -> None:
    held = probe("probe_worker_held_60gib.txt")
    small = replace(held, processes=held.processes[1:])  # the holder gone, memory still short
    f = check_memory_headroom(W, small, CLAIM, 4.0, engine_running=False)
    assert not isinstance(f, Skip) and f.level == "fail"
    assert "No process outside the serving container holds 1 GiB or more" in f.message
    assert "the largest: pid" in f.message and "slabtop" in f.message


def test_swap_in_use_and_page_cache_warn() -> None:
    idle = probe("probe_worker_idle.txt")
    assert idle.meminfo
    swapped = replace(
        idle, meminfo=replace(idle.meminfo, swap_free=idle.meminfo.swap_total - 3 * GIB)
    )
    f = check_memory_headroom(W, swapped, CLAIM, 4.0, engine_running=False)
    assert not isinstance(f, Skip) and f.level == "warn" and "3.0 GiB is swapped out" in f.message
    cached = replace(idle, meminfo=replace(idle.meminfo, free=int(50 * GIB)))
    f = check_memory_headroom(W, cached, CLAIM, 4.0, engine_running=False)
    assert not isinstance(f, Skip) and f.level == "warn" and "drop_caches" in f.message


def test_unreadable_meminfo_fails_with_the_error() -> None:
    bad = NodeMemory("n", None, "cat /proc/meminfo: Permission denied", (), None, "x")
    f = check_memory_headroom(W, bad, CLAIM, 4.0, engine_running=False)
    assert not isinstance(f, Skip) and f.level == "fail" and "Permission denied" in f.message


def test_claim_defaults_to_vllms() -> None:
    claim = Claim.from_serve_args(None, have_args=True)
    assert claim.fraction == VLLM_DEFAULT_UTILIZATION == 0.92
    assert "vLLM's default 0.92" in claim.source
    assert (
        Claim.from_serve_args(0.8, True).source == "--gpu-memory-utilization 0.8 in the serve args"
    )


def test_serve_args_kv_cache_memory_bytes_is_vllms_human_readable_int() -> None:
    """vLLM's human_readable_int: lowercase decimal, uppercase binary, no binary decimals."""
    for text, want in (("80G", 80 * GIB), ("25.6k", 25600), ("1K", 1024), ("8589934592", 8 * GIB)):
        line = f"vllm serve /m --kv-cache-memory-bytes {text}"
        assert parse_serve_args(line).kv_cache_memory_bytes == want, text
    assert parse_serve_args("vllm serve /m --kv-cache-memory-bytes=2g").kv_cache_memory_bytes == (
        2 * 10**9
    )
    assert parse_serve_args("vllm serve /m").kv_cache_memory_bytes is None
    with pytest.raises(ValueError, match="decimals are not allowed with binary suffixes"):
        parse_serve_args("vllm serve /m --kv-cache-memory-bytes 1.5G")


def test_kv_cache_memory_bytes_is_the_claim_not_the_utilization() -> None:
    """--kv-cache-memory-bytes 80G with --gpu-memory-utilization 0.3: vLLM allocates an
    80 GiB KV cache whatever the utilization says (vllm/config/cache.py), so a node with
    56.3 GiB available is short, though 0.3 x MemTotal + 4 GiB (39.9 GiB) would fit."""
    held = probe("probe_worker_held_60gib.txt")
    line = "vllm serve /m --gpu-memory-utilization 0.3 --kv-cache-memory-bytes 80G"
    args = parse_serve_args(line)
    claim = Claim.from_serve_args(args.gpu_memory_utilization, True, args.kv_cache_memory_bytes)
    assert claim.kv_cache_bytes == 80 * GIB
    assert "KV cache 80.0 GiB (--kv-cache-memory-bytes" in claim.describe()
    without = Claim.from_serve_args(args.gpu_memory_utilization, True)
    assert check_memory_headroom(W, held, without, 4.0, engine_running=False).level == "pass"
    f = check_memory_headroom(W, held, claim, 4.0, engine_running=False)
    assert not isinstance(f, Skip) and (f.level, f.node) == ("fail", W)
    assert f.expected["claim_gib"] == 80.0 and f.expected["mem_available_gib_min"] == 84.0
    m = f.message
    assert m.startswith(f"{W}: MemAvailable 56.3 GiB of MemTotal 119.7 GiB")
    assert "before the engine's KV cache of 80.0 GiB (--kv-cache-memory-bytes" in m
    assert "at least 84.0 GiB" in m and "cannot allocate its 80.0 GiB KV cache" in m
    assert "vLLM will refuse" not in m  # 56.3 GiB clears the 0.3 startup floor (35.9 GiB)
    assert "lower --kv-cache-memory-bytes to 52G" in m and re.search(r"kill \d+;", m)
    # a small KV cache fits; the startup floor (vLLM's request_memory) still holds
    small = Claim.from_serve_args(0.3, True, 20 * GIB)
    assert check_memory_headroom(W, held, small, 4.0, engine_running=False).level == "pass"
    floor = Claim.from_serve_args(0.9, True, 20 * GIB)
    f = check_memory_headroom(W, held, floor, 4.0, engine_running=False)
    assert not isinstance(f, Skip) and f.level == "fail"
    assert "startup floor of 0.9 x MemTotal = 107.7 GiB" in f.message
    assert "vLLM will refuse to start" in f.message
    assert "lower --gpu-memory-utilization to 0.43" in f.message
    # while serving, the claim is taken either way: the OS headroom alone
    idle = probe("probe_worker_idle.txt")
    assert check_memory_headroom(W, held, claim, 4.0, engine_running=True).level == "pass"
    assert check_memory_headroom(W, idle, claim, 4.0, engine_running=False).level == "pass"


@pytest.mark.parametrize("name", ["dgx-spark-2node", "sim"])
def test_profiles_carry_the_os_headroom(name: str) -> None:
    memory = load_profile(name).memory
    assert memory.os_headroom_gib == 4.0 and memory.top_holders == 3


def test_probe_lists_past_a_process_that_exits_while_it_reads(tmp_path: Path) -> None:
    """A process that exits between the glob and the read (its status gone: here a dangling
    link) is skipped, and the processes listed after it are kept: mawk, given the files,
    stopped at the first it could not open (the holder was lost, a flake of the sim tier)."""

    def proc(pid: str, name: str, rss_kb: int | None, args: str) -> None:
        (tmp_path / pid).mkdir()
        rss = f"VmRSS:\t{rss_kb} kB\n" if rss_kb is not None else ""
        status = f"Name:\t{name}\nUmask:\t0022\nState:\tS (sleeping)\nPid:\t{pid}\n{rss}"
        (tmp_path / pid / "status").write_text(status + "Threads:\t1\n")
        (tmp_path / pid / "cmdline").write_bytes(args.replace(" ", "\0").encode() + b"\0")

    proc("1", "init", 1200, "/sbin/init")
    (tmp_path / "12").mkdir()  # exited: its files gone as the probe reads them
    (tmp_path / "12" / "status").symlink_to(tmp_path / "12" / "gone")
    proc("1428", "python3", 60 * 1024 * 1024, "python3 -c import signal; signal.pause()")
    proc("2", "kthreadd", None, "")  # a kernel thread: no VmRSS
    proc("310", "sshd", 5200, "sshd: root@notty")
    command = memory_probe_command(proc=str(tmp_path))
    out = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    listed = [(p.pid, p.name, p.rss) for p in parse_memory_probe(out.stdout).processes]
    assert listed == [
        (1428, "python3", 60 * GIB),
        (310, "sshd", 5200 * 1024),
        (1, "init", 1200 * 1024),
    ], out.stdout
    holder = parse_memory_probe(out.stdout).processes[0]
    assert holder.args.startswith("python3 -c import signal")


def test_requirement_above_memtotal_says_it_can_never_be_met() -> None:
    """Issue #25 §5: 25.7 GiB asked on a node of 23.5 GiB in all. Freeing memory cannot
    help: the message says so and names the settings to lower, with values that fit."""
    small = NodeMemory(
        "spark-2",
        MemInfo(
            total=int(23.5 * GIB),
            free=int(20 * GIB),
            available=int(21 * GIB),
            cached=int(1 * GIB),
            swap_total=0,
            swap_free=0,
        ),
        None,
        (),
        (),
    )
    f = check_memory_headroom(W, small, CLAIM, 4.5, engine_running=False)
    assert not isinstance(f, Skip) and f.level == "fail"
    m = f.message
    assert "at least 25.6 GiB" in m, m
    assert "more than the node's MemTotal of 23.5 GiB: it can never be met" in m, m
    assert "Lower --gpu-memory-utilization (now 0.9" in m and "at most 0.80" in m, m
    assert "memory.os_headroom_gib (now 4.5; e.g. --spark-threshold=memory.os_headroom_gib=" in m
    assert "kill" not in m  # nothing to free
    running = check_memory_headroom(W, small, CLAIM, 30.0, engine_running=True)
    assert not isinstance(running, Skip) and running.level == "fail"
    assert "it can never be met" in running.message
    assert "Lower the profile's memory.os_headroom_gib (now 30" in running.message


# --------------------------------------------------- --non-privileged: the container's limit


def test_serve_args_memory_utilization_gb() -> None:
    """eugr's gpu-mem-util-gb mod: GiB per rank, ceil(N x 2^30) + 0.5 GiB at startup."""
    args = parse_serve_args("vllm serve /m --gpu-memory-utilization-gb 103 -tp 2")
    assert args.gpu_memory_utilization_gb == 103 and args.gpu_memory_utilization is None
    claim = Claim.from_serve_args(None, True, None, 103)
    assert claim.startup_bytes(0) == 103 * GIB + GIB // 2
    assert "--gpu-memory-utilization-gb 103" in claim.source
    assert Claim.from_serve_args(0.9, True).startup_bytes(100 * GIB) == 90 * GIB


def test_gb_claim_before_the_launch_counts_gib_not_a_fraction() -> None:
    idle = probe("probe_worker_idle.txt")
    claim = Claim.from_serve_args(None, True, None, 115)
    f = check_memory_headroom(W, idle, claim, 4.0, engine_running=False)
    assert not isinstance(f, Skip) and f.level == "fail", f
    assert f.expected["claim_gib"] == 115.5 and "--gpu-memory-utilization-gb 115" in f.message


def _limit_probe(limit: str, cgroup: str, top: str) -> str:
    mark = SERVER_MARK
    return (
        f'{mark}inspect\n"sleep" ["infinity"]\n{mark}top\n{top}{mark}log\n\n'
        f"{mark}limit\n{limit}\n{mark}cgroup\n{cgroup}\n"
    )


TOP_GB = (
    "PID COMMAND\n"
    "236 bash -c /workspace/exec-script.sh >> /proc/1/fd/1 2>&1\n"
    "237 /bin/bash /workspace/exec-script.sh\n"
    "242 python3 /opt/vllm/bin/vllm serve /m -tp 2 --gpu-memory-utilization-gb 115 --nnodes 2\n"
)


def test_container_limit_is_read_inside_then_from_docker() -> None:
    """launch-cluster.sh --non-privileged --memory 110g: docker's g is GiB (118111600640)."""
    inside = parse_container_limit("n", _limit_probe("118111600640", "118111600640", TOP_GB))
    assert inside.limit == 110 * GIB and "inside" in inside.source
    assert inside.serve_line and "--gpu-memory-utilization-gb 115" in inside.serve_line
    v1_none = parse_container_limit("n", _limit_probe("118111600640", "9223372036854771712", ""))
    assert v1_none.limit == 110 * GIB and v1_none.source == "docker inspect HostConfig.Memory"
    assert v1_none.serve_line is None
    privileged = parse_container_limit("n", _limit_probe("0", "max", TOP_GB))
    assert privileged.limit is None


def test_a_need_above_the_container_limit_fails_once_naming_the_fix() -> None:
    need = 115 * GIB + GIB // 2
    short = [
        ContainerMemory(n, 110 * GIB, "docker inspect HostConfig.Memory", "vllm serve /m", need,
                        "--gpu-memory-utilization-gb 115 + 0.5 GiB")
        for n in ("spark-head", "spark-worker-1")
    ]  # fmt: skip
    f = check_container_limit(short)
    assert not isinstance(f, Skip) and f.level == "fail"
    assert f.node == "spark-head, spark-worker-1"
    m = f.message
    assert m.startswith("spark-head: the serving container's memory limit is 110.0 GiB"), m
    assert "asks for 115.5 GiB (--gpu-memory-utilization-gb 115 + 0.5 GiB)" in m
    assert "--mem-limit-gb 117" in m and "--gpu-memory-utilization-gb to 107" in m
    fits = [replace(c, need=int(0.9 * 119.7 * GIB)) for c in short]
    passed = check_container_limit(fits)
    assert not isinstance(passed, Skip) and passed.level == "pass", passed
    none = check_container_limit([replace(c, limit=None) for c in short])
    assert not isinstance(none, Skip) and none.level == "pass"
    assert isinstance(check_container_limit([]), Skip)


def test_a_dead_ranks_node_is_judged_on_the_claim_a_running_rank_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #36 part 4: with a worker's container stopped (attached, no
    --spark-serve-args), the memory check could not read that rank's serve args and took
    vLLM's default claim (0.92): a second failure beside the readiness check's. The launch
    gives every rank the same serve args: the claim is read from a running rank's."""
    from types import SimpleNamespace

    from pytest_spark.infra.memory import gather

    serve = "vllm serve /models/m --tensor-parallel-size 2 --gpu-memory-utilization 0.90"
    running = {"spark-head": True, "spark-worker-1": False}  # the worker's rank is dead
    asked: list[str] = []

    def facts(node: str) -> SimpleNamespace:
        return SimpleNamespace(
            docker=SimpleNamespace(serving=SimpleNamespace(running=running[node]))
        )

    def container_memory(cluster: object, node: SimpleNamespace) -> ContainerMemory:
        asked.append(node.name)
        return ContainerMemory(node.name, None, "none", serve if running[node.name] else None)

    class Cluster:
        nodes = [SimpleNamespace(name=n) for n in running]

        def __init__(self, serve_args: str | None = None, launch: bool = False) -> None:
            self.settings = SimpleNamespace(serve_args=serve_args, launch=launch)
            self.cache: dict[object, object] = {}

        def cached(self, key: object, compute):  # type: ignore[no-untyped-def]
            if key not in self.cache:
                self.cache[key] = compute()
            return self.cache[key]

    monkeypatch.setattr(gather, "NodePreflight", SimpleNamespace)
    monkeypatch.setattr(gather, "all_preflight", lambda c: {n: facts(n) for n in running})
    monkeypatch.setattr(gather, "container_memory", container_memory)
    cluster = Cluster()
    claim = gather.serving_claim(cluster)  # type: ignore[arg-type]
    assert claim.fraction == 0.90
    assert claim.source == (
        "--gpu-memory-utilization 0.9 in the serve args, read from spark-head's vllm serve"
    )
    assert gather.serving_claim(cluster) is claim and asked == ["spark-head"]  # once
    # the serve args given win; before a launch no rank runs: as before
    given = gather.serving_claim(Cluster("vllm serve /m --gpu-memory-utilization 0.5"))  # type: ignore[arg-type]
    assert given.fraction == 0.5 and "read from" not in given.source
    assert gather.serving_claim(Cluster(launch=True)).fraction == VLLM_DEFAULT_UTILIZATION  # type: ignore[arg-type]
    # no rank runs at all: vLLM's default, as before
    running["spark-head"] = False
    assert gather.serving_claim(Cluster()).fraction == VLLM_DEFAULT_UTILIZATION  # type: ignore[arg-type]
