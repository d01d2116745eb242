"""The preflight probe: its shell script run for real on this machine, and its parser on
outputs recorded on sparksim nodes (fixtures/preflight/README.md says what is real)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pytest_spark.infra.errors import ParseError
from pytest_spark.infra.preflight.probe import (
    EDGE_BYTES,
    SAMPLES,
    CarrierCounters,
    JournalFacts,
    clock_command,
    container_env_command,
    parse_compute_apps,
    parse_container_env,
    parse_df,
    parse_docker_inspect,
    parse_gpu_list,
    parse_preflight_probe,
    parse_ssh_probe,
    preflight_probe_command,
    sampled_sha256,
    split_sections,
    ssh_probe_command,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "preflight"
MODEL = "/root/models/Qwen3.5-122B-A10B-FP8"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


# -------------------------------------------------------------------- recorded outputs


def test_idle_worker() -> None:
    facts = parse_preflight_probe(fixture("probe_worker_idle.txt"), MODEL)
    assert facts.hostname == "spark-2"
    assert facts.now is not None and facts.uptime_s == pytest.approx(85.88)
    assert (facts.docker.up, facts.docker.version) == (True, "20.10.24+dfsg1")
    assert (facts.docker.image, facts.docker.image_present) == ("vllm-node:latest", True)
    assert facts.docker.containers == () and facts.docker.serving is None
    assert facts.gpu.gpus is not None and len(facts.gpu.gpus) == 1
    assert facts.gpu.processes == () and facts.gpu.driver_version == "580.95.05"
    assert facts.disk is not None and facts.disk.mount == "/root"
    assert facts.disk.checked == MODEL and 0 < facts.disk.used_pct < 95
    model = facts.model
    assert model is not None and model.exists and len(model.files) == 46
    assert len(model.hashes) == 46 and model.samples == {}  # tiny shards: hashed whole
    twin = facts.carriers["enp1s0f1np1"]
    assert (twin.carrier, twin.up_count, twin.down_count, twin.losses) == (True, 1, 1, 0)
    unplugged = facts.carriers["enp1s0f0np0"]
    assert (unplugged.carrier, unplugged.losses) == (False, 0)
    assert facts.journal.available is False and facts.journal.lines == 0


def test_serving_container_with_its_pids() -> None:
    facts = parse_preflight_probe(fixture("probe_head_serving.txt"), MODEL)
    serving = facts.docker.serving
    assert serving is not None and serving.name == "vllm_node" and serving.running
    assert serving.image == "vllm-node" and serving.gpu_access  # --gpus all
    assert serving.restart_policy == "no" and serving.started_at is not None
    assert len(serving.pids) == 6 and serving in facts.docker.containers
    assert serving.env["NCCL_IB_HCA"] == "roceP2p1s0f1,rocep1s0f1"
    assert facts.docker.image == "vllm-node:latest"


def test_stale_container_and_its_gpu_process() -> None:
    facts = parse_preflight_probe(fixture("probe_worker_stale_container.txt"), MODEL)
    (stale,) = facts.docker.containers
    assert (stale.name, stale.image, stale.restart_policy) == (
        "vllm_stale",
        "vllm-node:latest",
        "unless-stopped",
    )
    assert stale.gpu_access and 1041 in stale.pids
    assert stale.uptime_s(facts.now) is not None
    assert facts.docker.serving is None
    (proc,) = facts.gpu.processes or ()
    assert (proc.pid, proc.name, proc.etime_s) == (1041, "VLLM::EngineCore", 2)
    assert proc.args is not None and "--port 8001" in proc.args


def test_docker_daemon_down() -> None:
    facts = parse_preflight_probe(fixture("probe_worker_docker_stopped.txt"), MODEL)
    assert facts.docker.up is False and not facts.docker.missing
    assert facts.docker.error is not None
    assert facts.docker.error.startswith("Cannot connect to the Docker daemon at unix://")
    assert facts.docker.error.endswith("Is the docker daemon running?")
    assert facts.docker.image is None  # not asked: nothing answers


def test_image_missing() -> None:
    facts = parse_preflight_probe(fixture("probe_worker_image_missing.txt"), MODEL)
    assert facts.docker.up and facts.docker.image == "vllm-node:latest"
    assert facts.docker.image_present is False
    assert "No such image: vllm-node:latest" in (facts.docker.image_error or "")


def test_gpu_invisible() -> None:
    facts = parse_preflight_probe(fixture("probe_worker_gpu_invisible.txt"), MODEL)
    assert facts.gpu.gpus == () and facts.gpu.error == "No devices were found"
    assert facts.gpu.processes is None and facts.gpu.apps_error == "No devices were found"


def test_disk_full() -> None:
    facts = parse_preflight_probe(fixture("probe_worker_disk_full.txt"), MODEL)
    assert facts.disk is not None
    assert (facts.disk.filesystem, facts.disk.mount) == ("sparksim-disk", "/root/models")
    assert facts.disk.used_pct == pytest.approx(97.0, abs=0.1)
    assert facts.disk.avail_bytes == 492 * 1024


def test_model_damage_shows_in_sizes_or_edges() -> None:
    idle = parse_preflight_probe(fixture("probe_worker_idle.txt"), MODEL).model
    corrupt = parse_preflight_probe(fixture("probe_worker_model_corrupt.txt"), MODEL).model
    missing = parse_preflight_probe(fixture("probe_worker_model_shard_missing.txt"), MODEL).model
    assert idle and corrupt and missing
    shard = "model-00017-of-00039.safetensors"
    assert corrupt.files == idle.files
    assert corrupt.hashes[shard] != idle.hashes[shard]
    assert {k: v for k, v in corrupt.hashes.items() if k != shard} == {
        k: v for k, v in idle.hashes.items() if k != shard
    }
    assert set(idle.files) - set(missing.files) == {shard}


def test_sampled_hash_sees_damage_inside_a_shard_not_only_at_its_edges() -> None:
    """A shard damaged in its middle (a bad copy resumed mid-file) differs in its sampled
    hash; the first and last 64 KiB alone (the old comparison) did not see it."""
    shard = bytearray(os.urandom(31 * EDGE_BYTES))
    blocks = len(shard) // EDGE_BYTES
    middle = (SAMPLES // 2) * (blocks - 1) // (SAMPLES - 1)  # a sampled block
    damaged = bytearray(shard)
    damaged[middle * EDGE_BYTES + 100] ^= 0xFF
    assert 0 < middle < blocks - 1
    assert sampled_sha256(bytes(shard)) != sampled_sha256(bytes(damaged))
    edges = [bytes(x[:EDGE_BYTES] + x[-EDGE_BYTES:]) for x in (shard, damaged)]
    assert edges[0] == edges[1]
    assert sampled_sha256(b"x" * 10) != sampled_sha256(b"x" * 11)  # the size counts


def test_link_flaps_in_carrier_counters() -> None:
    facts = parse_preflight_probe(fixture("probe_worker_link_flaps.txt"), MODEL)
    assert facts.carriers["enP2p1s0f1np1"].losses == 7
    assert facts.carriers["enp1s0f1np1"].losses == 0


def test_ssh_attempts() -> None:
    (ok,) = parse_ssh_probe(fixture("ssh_ok.txt"))
    assert ok.ok and ok.address == "198.19.0.2"
    (denied,) = parse_ssh_probe(fixture("ssh_permission_denied.txt"))
    assert (denied.rc, denied.output) == (255, "root@198.19.0.2: Permission denied (publickey).")
    (unknown,) = parse_ssh_probe(fixture("ssh_host_key_unknown.txt"))
    assert not unknown.ok and unknown.output.endswith("Host key verification failed.")


def test_container_env() -> None:
    env = parse_container_env(fixture("container_env_healthy.json"))
    assert env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1" and env["NCCL_IB_DISABLE"] == "0"
    bad = parse_container_env(fixture("container_env_nccl_socket.json"))
    assert bad["NCCL_SOCKET_IFNAME"] == "mgmt0" and bad["NCCL_IB_DISABLE"] == "1"
    with pytest.raises(ParseError):
        parse_container_env("Error: No such object: vllm_node")


# ------------------------------------------------------------------------ parsers alone


def test_gpu_list_and_compute_apps() -> None:
    assert parse_gpu_list("GPU 0: NVIDIA GB10 (UUID: GPU-5f1e)\n") == [
        "GPU 0: NVIDIA GB10 (UUID: GPU-5f1e)"
    ]
    assert parse_gpu_list("No devices were found\n") == []
    apps = parse_compute_apps("4242, VLLM::EngineCore, [N/A]\n777, python3, 1024 MiB\n")
    assert apps == [(4242, "VLLM::EngineCore"), (777, "python3")]
    with pytest.raises(ParseError):
        parse_compute_apps("pid, process_name, used_gpu_memory [MiB]\n")


def test_df_parse_errors() -> None:
    with pytest.raises(ParseError):
        parse_df("/x\ndf: /x: No such file or directory\n", "/x")
    usage = parse_df(
        "/\nFilesystem 1024-blocks Used Available Capacity Mounted on\n"
        "/dev/nvme0n1p2 3750000000 3600000000 150000000 97% /\n",
        "/",
    )
    assert round(usage.used_pct) == 96 and usage.mount == "/"


def test_docker_inspect_times_and_gpu_access() -> None:
    doc = (
        '[{"Id": "abc", "Name": "/x", "Image": "sha256:1", "Config": {"Image": "img", '
        '"Env": ["NVIDIA_VISIBLE_DEVICES=all", "EMPTY"]}, "State": {"Running": true, '
        '"StartedAt": "2026-11-29T17:56:29.880797233Z"}, "HostConfig": {"Runtime": '
        '"nvidia", "RestartPolicy": {"Name": "always"}}}]'
    )
    (c,) = parse_docker_inspect(doc)
    expected = datetime(2026, 11, 29, 17, 56, 29, 880797, tzinfo=UTC).timestamp()
    assert c.started_at == pytest.approx(expected, abs=1e-6)
    assert c.gpu_access and c.restart_policy == "always" and c.env["EMPTY"] == ""
    assert c.uptime_s(c.started_at + 90) == pytest.approx(90)
    plain = doc.replace("NVIDIA_VISIBLE_DEVICES=all", "A=1")
    assert not parse_docker_inspect(plain)[0].gpu_access
    with pytest.raises(ParseError):
        parse_docker_inspect("Error: No such object")


def test_counters_without_up_count_use_down_count() -> None:
    assert CarrierCounters("x", True, None, 6).losses == 5
    assert CarrierCounters("x", None, None, None).losses is None
    assert CarrierCounters("x", False, 3, 4).losses == 3  # down now: every up was lost


def test_journal_lines_match_whole_interface_names() -> None:
    text = fixture("journal_mlx5_flaps.txt")
    journal = JournalFacts(True, 41, tuple(text.splitlines()[1:]))
    assert len(journal.about("enp1s0f1np1")) == 6
    assert len(journal.about("enP2p1s0f1np1")) == 1
    assert journal.about("enp1s0f1") == []


def test_split_without_markers_and_cut_output() -> None:
    with pytest.raises(ParseError):
        split_sections("bash: sh: command not found\n")
    _, sections = split_sections(
        fixture("probe_worker_idle.txt").split("@@pytest-spark-preflight@@ end journal")[0]
    )
    assert sections["journal"].rc is None and sections["docker_info"].rc == 0


def test_commands_are_single_shell_commands() -> None:
    assert preflight_probe_command(container="vllm_node").startswith("sh -c '")
    assert clock_command() == "LC_ALL=C date +%s.%N"
    assert container_env_command("a b") == (
        "docker inspect --type container -f '{{json .Config.Env}}' 'a b'"
    )
    with pytest.raises(ValueError):
        ssh_probe_command(["198.19.0.2; reboot"])
    with pytest.raises(ValueError):
        preflight_probe_command(container="x", timeout_s=0)


# ----------------------------------------------------- the script, run on this machine


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_probe_script_runs_for_real(tmp_path: Path) -> None:
    """The real shell script with real df/find/sha256sum/head/tail on a model directory,
    docker and nvidia-smi stubbed (one answering, one missing)."""
    model = tmp_path / "models" / "M"
    model.mkdir(parents=True)
    shard = os.urandom(40 * EDGE_BYTES + 123)
    (model / "model-00001-of-00001.safetensors").write_bytes(shard)
    tokenizer = os.urandom(3 * EDGE_BYTES)  # large, yet hashed whole: it is the tokenizer
    (model / "tokenizer.json").write_bytes(tokenizer)
    (model / "config.json").write_text('{"a": 1}\n')
    (model / "model.safetensors.index.json").write_text('{"weight_map": {}}\n')
    (model / "sub").mkdir()
    (model / "sub" / "x.bin").write_bytes(b"tiny")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _stub(
        bin_dir,
        "docker",
        'case "$1" in\n'
        "info) echo 27.3.1 ;;\n"
        "ps) ;;\n"
        'inspect) echo "[]"; echo "Error: No such object: $4" >&2; exit 1 ;;\n'
        'image) echo "Error response from daemon: No such image: $5" >&2; exit 1 ;;\n'
        "esac\n",
    )
    for tool in (
        "sh",
        "date",
        "cat",
        "uname",
        "mktemp",
        "rm",
        "df",
        "stat",
        "find",
        "sort",
        "sha256sum",
        "head",
        "tail",
        "tr",
        "grep",
        "paste",
        "dirname",
        "timeout",
        "dd",
    ):
        found = subprocess.run(
            ["sh", "-c", f"command -v {tool}"], capture_output=True, text=True
        ).stdout.strip()
        if found:
            (bin_dir / tool).symlink_to(found)
    command = preflight_probe_command(
        container="vllm_node", image="vllm-node:latest", model_dir=str(model)
    )
    proc = subprocess.run(
        ["/bin/sh", "-c", command],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir), "LC_ALL": "C"},
        timeout=60,
    )
    facts = parse_preflight_probe(proc.stdout, str(model))
    assert facts.docker.up and facts.docker.version == "27.3.1"
    assert facts.docker.image == "vllm-node:latest" and facts.docker.image_present is False
    assert facts.gpu.gpus is None and facts.gpu.error == "nvidia-smi: command not found"
    assert facts.model is not None and facts.model.files == {
        "model-00001-of-00001.safetensors": len(shard),
        "tokenizer.json": len(tokenizer),
        "config.json": 9,
        "model.safetensors.index.json": 19,
        "sub/x.bin": 4,
    }
    assert facts.model.hashes["config.json"] == hashlib.sha256(b'{"a": 1}\n').hexdigest()
    sampled = sampled_sha256(shard)
    assert facts.model.samples["model-00001-of-00001.safetensors"] == sampled
    assert facts.model.hashes["sub/x.bin"] == hashlib.sha256(b"tiny").hexdigest()
    assert facts.model.hashes["tokenizer.json"] == hashlib.sha256(tokenizer).hexdigest()
    assert set(facts.model.samples) == {"model-00001-of-00001.safetensors"}
    assert facts.disk is not None and facts.disk.checked == str(model)
    assert facts.uptime_s is not None and facts.now is not None
    assert "lo" in facts.carriers
    assert facts.journal.error == "journalctl: command not found"


def test_probe_falls_back_to_the_nearest_existing_parent(tmp_path: Path) -> None:
    command = preflight_probe_command(container="c", model_dir=str(tmp_path / "no" / "such"))
    proc = subprocess.run(
        ["/bin/sh", "-c", command],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C", "DOCKER_HOST": f"unix://{tmp_path}/none.sock"},
        timeout=60,
    )
    facts = parse_preflight_probe(proc.stdout, str(tmp_path / "no" / "such"))
    assert facts.disk is not None and facts.disk.checked == str(tmp_path)
    assert facts.model is not None and not facts.model.exists
