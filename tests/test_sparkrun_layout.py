"""Attaching to a sparkrun job (issue #35, item 1): the layout found from the nodes' rank
containers (access.layout), and the serve log read from /tmp/sparkrun_serve.log inside
them (readiness.wait, infra.servecmd), against outputs recorded on sparksim's real
dockerd with a job laid out as sparkrun 0.4.2 lays one out (fixtures/sparkrun/layout)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_spark.access.base import CommandResult
from pytest_spark.access.cluster import Node
from pytest_spark.access.layout import (
    DISCOVERY_COMMAND,
    SPARKRUN_LOG,
    LayoutError,
    ServingLayout,
    choose,
    launcher_layout,
    log_read_command,
    log_tail_command,
    parse_inspect_labels,
    parse_ps,
)
from pytest_spark.access.retry import for_connection
from pytest_spark.infra.nccl.command_probe import container_on
from pytest_spark.infra.nccl.launcher_gather import detect_launcher
from pytest_spark.infra.servecmd import parse_probe as parse_server_probe
from pytest_spark.infra.servecmd import probe as server_probe
from pytest_spark.readiness.parse import parse_probe
from pytest_spark.readiness.probe import SINCE_START, probe_command
from pytest_spark.readiness.wait import ReadinessWait
from pytest_spark.readiness.waitstate import WaitSpec

pytestmark = pytest.mark.unit

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "sparkrun" / "layout"
HEAD, WORKER = "spark-head", "spark-worker-1"
JOB = "sparkrun_qwen35-122b_918a3fa0"
OTHER = "sparkrun_gpt-oss-120b_d6a81262"


def read(name: str) -> str:
    return (DATA / name).read_text()


def found(kind: str) -> list[Any]:
    return parse_ps(HEAD, read(f"ps-head-{kind}.txt")) + parse_ps(
        WORKER, read(f"ps-worker-{kind}.txt")
    )


# ---------------------------------------------------------------------- discovery


def test_one_job_gives_each_node_its_rank_container_and_the_serve_log() -> None:
    layout = choose(found("one-job"), [HEAD, WORKER], "vllm_node", None)
    assert layout.kind == "sparkrun"
    assert layout.container(HEAD) == f"{JOB}_node_0"
    assert layout.container(WORKER) == f"{JOB}_node_1"
    assert layout.serve_log == SPARKRUN_LOG
    job = layout.job
    assert job is not None and job.cluster_id == JOB
    assert (job.runtime, job.served_model_name, job.recipe) == (
        "vllm-distributed",
        "qwen3.5-122b",
        "qwen3.5-122b-a10b-fp8-tp2",
    )
    assert [(r.node, r.rank, r.state) for r in job.ranks] == [
        (HEAD, 0, "running"),
        (WORKER, 1, "running"),
    ]


def test_no_sparkrun_container_keeps_the_launch_cluster_layout() -> None:
    layout = choose([], [HEAD, WORKER], "vllm_node", None)
    assert layout == launcher_layout("vllm_node")
    assert layout.container(HEAD) == layout.container(WORKER) == "vllm_node"
    assert layout.serve_log is None and layout.job is None


def test_two_jobs_without_a_pick_is_an_error_listing_both() -> None:
    with pytest.raises(LayoutError) as err:
        choose(found("two-jobs"), [HEAD, WORKER], "vllm_node", None)
    text = str(err.value)
    assert "--spark-job=CLUSTER_ID" in text
    for words in (JOB, OTHER, "recipe gpt-oss-120b-tp2", "recipe qwen3.5-122b-a10b-fp8-tp2"):
        assert words in text
    assert "spark-head rank 0 (running), spark-worker-1 rank 1 (running)" in text


def test_spark_job_picks_one_of_several() -> None:
    layout = choose(found("two-jobs"), [HEAD, WORKER], "vllm_node", OTHER)
    assert layout.container(HEAD) == f"{OTHER}_node_0"
    assert layout.container(WORKER) == f"{OTHER}_node_1"


def test_spark_job_naming_no_running_job_is_an_error() -> None:
    with pytest.raises(LayoutError, match=f"--spark-job=nope.*Jobs found: {JOB}"):
        choose(found("one-job"), [HEAD, WORKER], "vllm_node", "nope")


def test_a_node_whose_rank_container_is_gone_gets_the_name_it_would_have() -> None:
    # rank 1's --rm container removed: the worker's checks name what is missing there
    layout = choose(parse_ps(HEAD, read("ps-head-one-job.txt")), [HEAD, WORKER], "x", None)
    assert layout.container(WORKER) == f"{JOB}_node_1"


def test_stopped_leftovers_do_not_count_beside_a_running_job() -> None:
    running = parse_ps(HEAD, read("ps-head-one-job.txt"))
    leftover = parse_ps(
        HEAD,
        read("ps-head-two-jobs.txt").replace("\trunning\tsparkrun_gpt", "\texited\tsparkrun_gpt"),
    )
    layout = choose(running + [c for c in leftover if c.cluster_id == OTHER], [HEAD], "v", None)
    assert layout.job is not None and layout.job.cluster_id == JOB


def test_ps_output_that_is_not_a_container_line_is_left_out() -> None:
    text = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock.\n"
    assert parse_ps(HEAD, text) == []
    assert "label=sparkrun.cluster_id" in DISCOVERY_COMMAND


def test_inspect_labels_are_the_sparkrun_ones() -> None:
    labels = parse_inspect_labels(json.loads(read("inspect-node-0.json")))
    assert labels["sparkrun.cluster_id"] == JOB
    assert labels["sparkrun.rank"] == "0"
    assert labels["sparkrun.distribution"] == "sparkrun"
    inspect = json.loads(read("inspect-node-0.json"))[0]
    assert inspect["Path"] == "bash" and inspect["Args"] == ["-c", "sleep infinity"]


def test_layout_round_trips_through_json() -> None:
    layout = choose(found("one-job"), [HEAD, WORKER], "vllm_node", None)
    assert ServingLayout.from_json(json.loads(json.dumps(layout.to_json()))) == layout
    eugr = launcher_layout("vllm_node")
    assert ServingLayout.from_json(eugr.to_json()) == eugr


# ---------------------------------------------------------------------- the serve log


def test_log_commands_read_the_file_inside_a_sparkrun_container() -> None:
    assert log_tail_command("c", None, 5) == "docker logs --tail 5 c 2>&1"
    assert log_tail_command("c", SPARKRUN_LOG, 5) == f"docker exec c tail -n 5 {SPARKRUN_LOG}"
    assert log_read_command("c", SPARKRUN_LOG).startswith(f"docker exec c cat {SPARKRUN_LOG}")


def test_the_poll_reads_the_serve_log_not_docker_logs() -> None:
    plain = probe_command("vllm_node", SINCE_START, 8000, None)
    assert "docker logs --timestamps" in plain
    command = probe_command(f"{JOB}_node_1", SINCE_START, None, None, serve_log=SPARKRUN_LOG)
    assert "docker logs" not in command
    assert f"docker exec {JOB}_node_1 tail -c +1 {SPARKRUN_LOG}" in command
    later = probe_command("c", SINCE_START, None, None, serve_log=SPARKRUN_LOG, serve_offset=99)
    assert "tail -c +100 " in later


def _answer(started: str, text: str) -> CommandResult:
    sep = "__PYTEST_SPARK_PROBE__"
    stdout = f"{sep} state\nrunning 0 {started}\n{sep} logs\n{text}"
    return CommandResult(WORKER, "probe", 0, stdout, "")


class _Conn:
    class target:
        @staticmethod
        def describe() -> str:
            return "root@198.18.0.12"


def _wait() -> ReadinessWait:
    head, worker = (Node(n, r, n, _Conn()) for n, r in ((HEAD, "head"), (WORKER, "worker")))  # type: ignore[arg-type]
    spec = WaitSpec(
        container=f"{JOB}_node_0",
        containers={HEAD: f"{JOB}_node_0", WORKER: f"{JOB}_node_1"},
        serve_log=SPARKRUN_LOG,
        port=8000,
        ready_timeout=600.0,
        hang_timeout=300.0,
        placement_timeout=120.0,
    )
    return ReadinessWait(head, [head, worker], spec, 0.0, for_connection(1.0, 1.0))


def test_the_serve_log_is_fed_once_across_polls_by_its_byte_cursor() -> None:
    """The file has no docker timestamps: each poll reads it from the byte fed so far; a
    line cut mid-poll is fed whole the next time, never twice."""
    data = read("serve-log-node-1.txt").encode()
    wait = _wait()
    fed: list[str] = []
    wait.watch.feed = lambda node, lines, now: fed.extend(lines)  # type: ignore[method-assign]
    started = "2026-12-05T22:48:50.123456789Z"
    for size in (len(data) // 2 + 7, len(data)):  # the file as it grows: first cut mid-line
        offset = wait.serve_offsets.get(WORKER, 0)
        assert f"tail -c +{offset + 1} " in wait.command(wait.nodes[1])
        shown = data[offset:size].decode()  # what `tail -c +N` prints then
        wait._feed(WORKER, parse_probe(_answer(started, shown)), 1.0)
    log = data.decode()
    assert fed == [line for line in log.splitlines() if line.strip()]
    assert wait.serve_offsets[WORKER] == len(log.encode())
    assert f"{JOB}_node_1" in wait.command(wait.nodes[1])
    assert f"{JOB}_node_0" in wait.command(wait.nodes[0])


def test_a_new_start_of_the_container_reads_its_log_from_the_beginning() -> None:
    wait = _wait()
    wait.watch.feed = lambda node, lines, now: None  # type: ignore[method-assign]
    wait._feed(WORKER, parse_probe(_answer("2026-12-05T22:00:00.000000000Z", "a\nb\n")), 1.0)
    assert wait.serve_offsets[WORKER] == 4
    wait._feed(WORKER, parse_probe(_answer("2026-12-05T23:00:00.000000000Z", "")), 2.0)
    assert wait.serve_offsets[WORKER] == 0


def test_the_server_command_is_read_from_the_exec_d_rank_not_pid_1() -> None:
    """PID 1 is ``bash -c "sleep infinity"``: the flags come from the exec'd vllm serve,
    and vLLM's non-default args line from the serve log file."""
    command = server_probe(f"{JOB}_node_0", SPARKRUN_LOG)
    assert f"docker exec {JOB}_node_0 cat {SPARKRUN_LOG}" in command
    assert "docker logs" not in command
    inspect = json.loads(read("inspect-node-0.json"))[0]
    text = (
        f"@@spark-servercmd inspect\n{json.dumps(inspect['Path'])} {json.dumps(inspect['Args'])}\n"
        f"@@spark-servercmd top\n{read('top-node-0.txt')}@@spark-servercmd log\n"
    )
    found = parse_server_probe(text, None)
    assert found is not None and found.source == "the vllm serve process"
    assert found.args.nnodes == 2 and found.args.served_name == "qwen3.5-122b"


# ---------------------------------------------------------------------- the all-reduce


class _RankNode:
    def __init__(self, name: str) -> None:
        self.name = name
        self.commands: list[str] = []

    def run(self, command: str, *, timeout: float | None = None, on_output: Any = None) -> Any:
        self.commands.append(command)
        return CommandResult(self.name, command, 0, "torch=2.9.0\nc_torch=2.9.0\n", "")


def test_the_all_reduce_probes_each_node_in_its_own_rank_container() -> None:
    per_node = {HEAD: f"{JOB}_node_0", WORKER: f"{JOB}_node_1"}
    assert container_on(per_node, WORKER) == f"{JOB}_node_1"
    assert container_on("vllm_node", WORKER) == "vllm_node"
    nodes = [_RankNode(HEAD), _RankNode(WORKER)]
    detect_launcher(nodes, container=per_node)
    assert f"{JOB}_node_0" in nodes[0].commands[0] and f"{JOB}_node_1" not in nodes[0].commands[0]
    assert f"{JOB}_node_1" in nodes[1].commands[0] and f"{JOB}_node_0" not in nodes[1].commands[0]


def test_the_log_hint_names_the_serve_log_of_a_sparkrun_head() -> None:
    from types import SimpleNamespace

    from pytest_spark.readiness.serving import server_log_hint

    settings: Any = SimpleNamespace(head="198.18.0.11", container="vllm_node", api_url=None)
    layout = choose(found("one-job"), [HEAD, WORKER], "vllm_node", None)
    hint = server_log_hint(settings, layout)
    assert f"docker exec {JOB}_node_0 tail -n 100 {SPARKRUN_LOG}" in hint
    assert "docker logs vllm_node" in server_log_hint(settings)
    assert "docker logs vllm_node" in server_log_hint(settings, launcher_layout("vllm_node"))
