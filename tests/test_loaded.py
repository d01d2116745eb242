"""What the serving ranks loaded (issue #28 part 1): the Build ID reader, the maps and
probe parsers (fixtures/loaded), the in-container script run for real against a process
that maps a libnccl, and the verdicts of the NCCL, vllm-tree and environment checks."""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conn_fakes import probe_settings

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.finding import Finding, Skip
from pytest_spark.infra.loaded import container_probe
from pytest_spark.infra.loaded.check import check_nccl_loaded, check_vllm_tree
from pytest_spark.infra.loaded.container_probe import nccl_paths_in
from pytest_spark.infra.loaded.elf_parse import build_id_of
from pytest_spark.infra.loaded.probe import (
    MARKER,
    LoadedFacts,
    MappedLib,
    RankProcess,
    VllmTree,
    inner_script,
    loaded_probe_command,
    parse_loaded_json,
    parse_loaded_probe,
    recipe_env_names,
)
from pytest_spark.infra.preflight.env_check import check_serving_env
from pytest_spark.infra.roundtrip import host_probe_commands
from sparksim import image

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "loaded"
WHEEL = "/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"
SYSTEM = "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9"


# ------------------------------------------------------------------------ Build ID


def test_build_id_of_the_stand_in_matches_readelf() -> None:
    """The sim's libnccl stand-ins: ``readelf -n`` printed ``Build ID:
    19899af16e3e1fe2b774ecb00ad3f7ef4d67b9b7`` for the wheel build (binutils 2.40)."""
    data = image.nccl_library(image.NCCL_BUILD)
    assert build_id_of(io.BytesIO(data)) == "19899af16e3e1fe2b774ecb00ad3f7ef4d67b9b7"
    other = build_id_of(io.BytesIO(image.nccl_library(image.NCCL_SYSTEM_BUILD)))
    assert other is not None and other != "19899af16e3e1fe2b774ecb00ad3f7ef4d67b9b7"


def test_build_id_of_this_python_is_readelf_s() -> None:
    exe = os.path.realpath(sys.executable)
    out = subprocess.run(["readelf", "-n", exe], capture_output=True, text=True)
    if out.returncode != 0 or "Build ID:" not in out.stdout:
        pytest.skip("no readelf, or this interpreter has no Build ID")
    want = out.stdout.split("Build ID:", 1)[1].split()[0]
    with open(exe, "rb") as fh:
        assert build_id_of(fh) == want


def test_build_id_of_rejects_non_elf_and_finds_none_without_a_note() -> None:
    with pytest.raises(ValueError, match="not an ELF"):
        build_id_of(io.BytesIO(b"NCCL version 2.28.9+cuda13.0" + b"\0" * 64))
    data = bytearray(image.nccl_library())
    struct.pack_into("<I", data, 64, 1)  # the one program header: PT_LOAD, not PT_NOTE
    assert build_id_of(io.BytesIO(bytes(data))) is None
    data = bytearray(image.nccl_library())
    struct.pack_into("<I", data, 64 + 56 + 8, 1)  # the note's type: NT_GNU_ABI_TAG
    assert build_id_of(io.BytesIO(bytes(data))) is None


# ---------------------------------------------------------------------------- maps


def test_nccl_paths_in_maps_skips_nccl_shared_memory() -> None:
    """Recorded maps: the wheel's path mapped, NCCL-named /dev/shm segment beside it."""
    text = (FIXTURES / "proc_maps_dev_machine_wheel_path.txt").read_text()
    paths = nccl_paths_in(text)
    assert paths == [
        "/tmp/loaded-fixture/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"
    ]


def test_nccl_paths_in_maps_keeps_two_files_once_each() -> None:
    text = "\n".join(
        f"7f00{i:04x}000-7f00{i:04x}fff r--p 00000000 fe:00 {i} {p}"
        for i, p in enumerate([WHEEL, WHEEL, SYSTEM, SYSTEM])
    )
    assert nccl_paths_in(text) == [WHEEL, SYSTEM]


# -------------------------------------------------------------------------- probe


def test_probe_rides_in_the_shared_round_trip() -> None:
    commands = host_probe_commands(probe_settings())
    assert commands["loaded"] == loaded_probe_command(container="vllm_node")


def test_the_recipes_env_names_ride_to_the_container_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sparkrun recipe's env: entries (PYTHONPATH, HF_HUB_OFFLINE...) are compared by the
    serving-env check: the loaded probe reads them from the rank's /proc environ too (it
    kept only NCCL/GLOO/vLLM names, and a healthy real-sparkrun launch failed saying the
    recipe's PYTHONPATH was unset)."""
    recipe = SimpleNamespace(fixed_env=lambda: {"PYTHONPATH": "/opt/x", "HF_HUB_OFFLINE": "1"})
    settings = SimpleNamespace(
        container="c", image=None, model_dir=None, serve_args=None, recipe=recipe,
        source=lambda a: "x",
    )  # fmt: skip
    names = recipe_env_names(settings)  # type: ignore[arg-type]
    assert names == ("HF_HUB_OFFLINE", "PYTHONPATH")
    command = host_probe_commands(settings)["loaded"]  # type: ignore[arg-type]
    assert command == loaded_probe_command(container="c", env_names=names)
    assert command != loaded_probe_command(container="c")
    # the container side: the walk keeps a name it is given, and only then
    env = b"NCCL_NET=IB\0PYTHONPATH=/opt/x\0HOME=/tmp\0HF_TOKEN=s\0"
    reads = {"/proc/7/environ": env}
    monkeypatch.setattr(container_probe, "_read", lambda path, mode="rb": reads.get(path))
    assert container_probe._env("7") == {"NCCL_NET": "IB"}
    kept = container_probe._env("7", ("PYTHONPATH", "HF_TOKEN"))
    assert kept == {"NCCL_NET": "IB", "PYTHONPATH": "/opt/x"}  # a secret's name stays hidden


def test_parse_loaded_probe_container_not_running() -> None:
    text = (
        f"{MARKER} probe v1 spark-worker-1\n{MARKER} begin loaded\n\n"
        f"{MARKER} stderr loaded\nnot running\n\n{MARKER} end loaded rc=3\n"
    )
    facts = parse_loaded_probe(text)
    assert not facts.running
    assert isinstance(check_nccl_loaded("spark-worker-1", facts, "spark-head", None), Skip)


def test_parse_loaded_json_rejects_garbage() -> None:
    with pytest.raises(ParseError, match="no JSON line"):
        parse_loaded_json("docker: Error response from daemon")


def test_inner_script_reads_a_real_rank_that_mapped_a_libnccl(tmp_path: Path) -> None:
    """The script the probe sends, run here against a child process that really maps a
    stand-in libnccl (the kernel's /proc/PID/maps and environ)."""
    lib = tmp_path / "nvidia" / "nccl" / "lib" / "libnccl.so.2"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(image.nccl_library(image.NCCL_SYSTEM_BUILD))
    child_code = (
        "import mmap, sys, time\n"
        f"f = open({str(lib)!r}, 'rb')\n"
        "m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)\n"
        "print('mapped', flush=True)\n"
        "time.sleep(30)\n"
    )
    env = {**os.environ, "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1", "VLLM_API_KEY": "secret"}
    child = subprocess.Popen(
        [sys.executable, "-c", child_code], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "mapped"
        out = subprocess.run(
            [sys.executable, "-c", inner_script()], capture_output=True, text=True, timeout=60
        )
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    facts = parse_loaded_json(out.stdout)
    ours = [p for p in facts.ranks if p.pid == child.pid]
    assert ours, (out.stdout[:500], out.stderr[-500:])
    assert ours[0].nccl == (str(lib),)
    assert ours[0].env.get("NCCL_IB_HCA") == "rocep1s0f1,roceP2p1s0f1"
    assert "VLLM_API_KEY" not in ours[0].env  # secrets are not carried off the node
    mapped = facts.libs[str(lib)]
    assert mapped.build_id == image.nccl_build_id(image.NCCL_SYSTEM_BUILD).hex()
    assert mapped.size == len(image.nccl_library(image.NCCL_SYSTEM_BUILD))


# ------------------------------------------------------------------- NCCL verdicts


def _ranks_of_41725() -> dict[str, MappedLib]:
    """vllm#41725's two builds of 2.28.9 (Build ID prefixes: the full IDs are not public)."""
    data = json.loads((FIXTURES / "vllm41725_two_builds.json").read_text())
    return {
        k: MappedLib(
            data[k]["path"], data[k]["size_mb"] * 1_000_000, data[k]["build_id_prefix"], None
        )
        for k in ("pip", "system")
    }


def _facts(*procs: tuple[int, tuple[MappedLib, ...]], tree: VllmTree | None = None) -> LoadedFacts:
    libs = {lib.path: lib for _, group in procs for lib in group}
    ranks = tuple(
        RankProcess(pid, "python3 /opt/vllm/bin/vllm serve M", tuple(lib.path for lib in group))
        for pid, group in procs
    )
    return LoadedFacts(ranks, libs, tree, 0.1)


def test_nccl_same_build_on_every_rank_passes() -> None:
    pip = _ranks_of_41725()["pip"]
    head = _facts((101, (pip,)), (102, (pip,)))
    found = check_nccl_loaded("spark-worker-1", _facts((201, (pip,))), "spark-head", head)
    assert isinstance(found, Finding) and found.ok, found


def test_nccl_other_build_on_a_worker_fails_naming_both_builds_and_the_fix() -> None:
    libs = _ranks_of_41725()
    head = _facts((101, (libs["pip"],)))
    worker = _facts((201, (libs["system"],)))
    found = check_nccl_loaded("spark-worker-1", worker, "spark-head", head)
    assert isinstance(found, Finding) and not found.ok
    for words in (
        "spark-worker-1",
        SYSTEM,
        WHEEL,
        "c0db9360",
        "a7f420a1",
        "190.0 MB",
        "219.0 MB",
        "use-official-vllm",
    ):
        assert words in found.message, (words, found.message)


def test_nccl_same_path_same_version_other_build_fails() -> None:
    """The version string (and even the path) alike, the Build ID not: two builds."""
    a = MappedLib(WHEEL, 219_000_000, "a7f420a1", None)
    b = MappedLib(WHEEL, 219_000_000, "0badc0de", None)
    found = check_nccl_loaded("spark-worker-1", _facts((7, (b,))), "spark-head", _facts((5, (a,))))
    assert isinstance(found, Finding) and not found.ok
    assert "0badc0de" in found.message and "a7f420a1" in found.message


def test_nccl_two_files_in_one_process_fails_on_that_node() -> None:
    libs = _ranks_of_41725()
    worker = _facts((201, (libs["pip"], libs["system"])))
    found = check_nccl_loaded("spark-worker-1", worker, "spark-head", None)
    assert isinstance(found, Finding) and not found.ok
    assert "rank process 201 mapped 2 libnccl files" in found.message
    assert "two builds" in found.message and SYSTEM in found.message and WHEEL in found.message


def test_nccl_two_builds_on_one_node_fails_even_on_the_head() -> None:
    libs = _ranks_of_41725()
    head = _facts((101, (libs["pip"],)), (102, (libs["system"],)))
    found = check_nccl_loaded("spark-head", head, "spark-head", None)
    assert isinstance(found, Finding) and not found.ok
    assert "different NCCL builds" in found.message


def test_nccl_no_rank_yet_is_a_skip() -> None:
    facts = LoadedFacts((RankProcess(1, "vllm serve M", ()),), {}, None, 0.1)
    assert isinstance(check_nccl_loaded("spark-head", facts, "spark-head", None), Skip)


# -------------------------------------------------------------------- vllm verdicts


def _tree(**changed: str) -> VllmTree:
    files = {"__init__.py": "aaaa", "distributed/pynccl_wrapper.py": "bbbb", "_C.abi3.so": "cccc"}
    files.update(changed)
    digest = str(abs(hash(tuple(sorted(files.items())))))
    return VllmTree("/usr/local/lib/python3.12/dist-packages/vllm", digest, files)


def test_vllm_tree_alike_passes_and_a_patched_file_is_named() -> None:
    head = _facts(tree=_tree())
    same = check_vllm_tree("spark-worker-1", _facts(tree=_tree()), "spark-head", head)
    assert isinstance(same, Finding) and same.ok
    patched = _facts(tree=_tree(**{"distributed/pynccl_wrapper.py": "dddd", "new.py": "eeee"}))
    found = check_vllm_tree("spark-worker-1", patched, "spark-head", head)
    assert isinstance(found, Finding) and not found.ok
    assert "spark-worker-1" in found.message
    assert "distributed/pynccl_wrapper.py" in found.message
    assert "new.py (only on spark-worker-1)" in found.message
    assert "--apply-vllm-pr" in found.message


def test_vllm_tree_unreadable_is_a_skip_naming_why() -> None:
    facts = LoadedFacts((), {}, VllmTree(None, None, {}, "no vllm package"), 0.1)
    found = check_vllm_tree("spark-head", facts, "spark-head", None)
    assert isinstance(found, Skip) and "no vllm package" in found.reason


# ------------------------------------------------------------- environment verdicts

FABRIC_IFS = ["enp1s0f0np0", "enP2p1s0f0np0"]
FABRIC_DEVS = ["rocep1s0f0", "roceP2p1s0f0"]
NODE_IFS = {"enp1s0f0np0": True, "enP2p1s0f0np0": True, "enP7s7": True}


def _eugr_env() -> dict[str, str]:
    lines = (FIXTURES / "environ_eugr_dual_spark.txt").read_text().splitlines()
    return dict(ln.split("=", 1) for ln in lines if ln and not ln.startswith("#"))


def _env_check(env: dict[str, str], **kw: object) -> Finding:
    return check_serving_env(
        "spark-worker-1",
        "vllm_node",
        env,
        FABRIC_IFS,
        FABRIC_DEVS,
        NODE_IFS,
        **kw,  # type: ignore[arg-type]
    )


def test_eugr_launcher_env_passes() -> None:
    found = _env_check(_eugr_env(), source="container vllm_node rank process 7 (/proc/7/environ)")
    assert found.ok, found.message


def test_env_one_twin_in_nccl_ib_hca_fails() -> None:
    """vllm#41725's own setting: ``export NCCL_IB_HCA=rocep1s0f0`` (one twin)."""
    found = _env_check({**_eugr_env(), "NCCL_IB_HCA": "rocep1s0f0"})
    assert not found.ok and "leaves out roceP2p1s0f0" in found.message


@pytest.mark.parametrize(
    ("extra", "nodes", "ok"),
    [
        ({"NCCL_ALGO": "Tree"}, 2, False),
        ({"NCCL_ALGO": "Ring"}, 2, False),
        ({"NCCL_ALGO": "Ring"}, 4, True),  # eugr's closed-ring setting
        ({"NCCL_ALGO": "Tree"}, 4, False),
        ({"NCCL_PROTO": "Simple"}, 2, False),
    ],
)
def test_env_forced_nccl_algo_or_proto(extra: dict[str, str], nodes: int, ok: bool) -> None:
    found = _env_check({**_eugr_env(), **extra}, nodes=nodes, source="rank process 9")
    assert found.ok is ok, found.message
    if not ok:
        key = next(iter(extra))
        assert f"{key}={extra[key]} forced" in found.message
        assert "rank process 9 environment" in found.message


MESH_HCA = "rocep1s0f0,roceP2p1s0f0,rocep1s0f1,roceP2p1s0f1"
MESH_VARS = {
    "NCCL_NET_PLUGIN": "none",
    "NCCL_IB_SUBNET_AWARE_ROUTING": "1",
    "NCCL_IB_MERGE_NICS": "0",
}


@pytest.mark.parametrize(
    ("extra", "nodes", "says"),
    [
        ({"NCCL_IB_HCA": MESH_HCA, **MESH_VARS}, 3, None),  # eugr's mesh mode, as written
        ({"NCCL_IB_HCA": MESH_HCA}, 2, None),  # two nodes: no mesh
        ({}, 3, None),  # 3 nodes behind a switch: one port's twins, no mesh variables
        ({"NCCL_IB_HCA": MESH_HCA}, 3, "NCCL_NET_PLUGIN=(unset)"),
        ({"NCCL_IB_HCA": MESH_HCA, **MESH_VARS, "NCCL_IB_MERGE_NICS": "1"}, 4, "MERGE_NICS=1"),
    ],
)
def test_env_mesh_of_three_or_more_needs_eugrs_mesh_variables(
    extra: dict[str, str], nodes: int, says: str | None
) -> None:
    found = _env_check({**_eugr_env(), **extra}, nodes=nodes)
    assert found.ok is (says is None), found.message
    if says is not None:
        assert says in found.message and "Mesh-mode NCCL variables" in found.message


def test_env_differs_from_the_head_fails_but_node_addresses_may() -> None:
    head = {**_eugr_env(), "VLLM_HOST_IP": "198.18.1.1", "RAY_NODE_IP_ADDRESS": "198.18.1.1"}
    worker = {**_eugr_env(), "VLLM_HOST_IP": "198.18.1.2", "RAY_NODE_IP_ADDRESS": "198.18.1.2"}
    assert _env_check(worker, reference=("spark-head", head)).ok
    worker["NCCL_IGNORE_CPU_AFFINITY"] = "0"
    found = _env_check(worker, reference=("spark-head", head))
    assert not found.ok
    assert "NCCL_IGNORE_CPU_AFFINITY=0 (spark-head: 1)" in found.message


def test_inner_script_runs_over_a_whole_proc() -> None:
    """The script over this machine's whole /proc (no vllm tree) ends cleanly; its time
    against the 5 s budget is benchmarks/loaded_parity.py's, not a test's."""
    out = subprocess.run([sys.executable, "-c", inner_script()], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
