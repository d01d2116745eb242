"""The launch-cluster.sh launcher (launchers/launch_cluster/) and the launch
(readiness/launch.py) against the real launch-cluster.sh's rules: Ray or no-Ray, the .env
beside the script, containers already running, the nodes the launcher keeps. Pure
functions on text, and standup's steps on a scripted fake head."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conn_fakes import FakeConn

from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.access.files import write_json
from pytest_spark.infra.serveargs import mode_of_processes, parse_serve_args
from pytest_spark.launchers.base import LaunchError, NotServing
from pytest_spark.launchers.launch_cluster.commands import LaunchSpec, shell_path
from pytest_spark.launchers.launch_cluster.dotenv import dotenv_path, parse_dotenv
from pytest_spark.launchers.launch_cluster.driver import Launcher, apply_dotenv, ray_only_script
from pytest_spark.launchers.launch_cluster.launcher import refuse_running
from pytest_spark.readiness.launch import STATE, configured_mode, stop_if_launched
from pytest_spark.readiness.ranks import (
    ServingInfo,
    head_serve_line,
    idle_by_design,
    kept_nodes,
    serving_nodes,
)
from pytest_spark.settings.options import OPTIONS_BY_ATTR

SERVE = "vllm serve /models/Qwen3.5-122B-A10B-FP8 --tensor-parallel-size 2 --port 8000"


# -- what the serve line says --------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "mode"),
    [
        (SERVE + " --distributed-executor-backend ray", "ray"),
        (SERVE + " --distributed-executor-backend=ray", "ray"),
        (
            SERVE + " --nnodes 2 --node-rank 0 --master-addr 198.19.0.1 --master-port 29501",
            "no-ray",
        ),
        (SERVE + " --nnodes 2 --node-rank 1 --headless", "no-ray"),
        (SERVE + " --distributed-executor-backend mp", "no-ray"),
        (SERVE, None),
    ],
)
def test_serve_line_says_ray_or_not(line: str, mode: str | None) -> None:
    assert parse_serve_args(line).mode == mode


def test_nodes_used_is_tp_pp_dp_over_one_gpu_a_node() -> None:
    assert parse_serve_args(SERVE).nodes_used() == 2
    assert parse_serve_args("vllm serve m -tp 2 -pp 2").nodes_used() == 4
    assert parse_serve_args("vllm serve m --tensor-parallel-size 1").nodes_used() == 1
    assert parse_serve_args("vllm serve m -tp 2 --data-parallel-size 2").nodes_used() == 4


def test_mode_from_the_containers_processes() -> None:
    ray = ["40 /usr/bin/python3 /usr/bin/ray start --block --head --port 29501", "41 raylet"]
    headless = ["77 python3 /usr/local/bin/vllm serve /models/m --nnodes 2 --headless"]
    assert mode_of_processes(ray) == "ray"
    assert mode_of_processes(headless) == "no-ray"
    # no Ray process beside vllm serve: Ray mode always has ray start/raylet in the container
    assert mode_of_processes(["9 python3 /usr/local/bin/vllm serve /models/m"]) == "no-ray"
    assert mode_of_processes(["9 bash -c vllm serve /models/m 'cut"]) == "no-ray"
    assert mode_of_processes(["1 sleep infinity"]) is None
    assert mode_of_processes([]) is None


# -- launch-cluster.sh's command line ---------------------------------------------------------
def spec(**changes: Any) -> LaunchSpec:
    base: dict[str, Any] = {
        "script": "~/spark-vllm-docker/launch-cluster.sh",
        "nodes": ("198.19.0.1", "198.19.0.2"),
        "image": "vllm-node",
        "container": "vllm_node",
        "serve_args": tuple(SERVE.split()),
        "log_path": "/tmp/l.log",
    }
    return LaunchSpec(**{**base, **changes})


def test_the_mode_flag_is_passed_explicitly() -> None:
    ray = spec(ray=True).start_command()
    assert " --ray exec vllm serve " in ray
    no_ray = spec().start_command()
    assert "--ray" not in no_ray  # no-Ray is the real script's default
    assert " exec vllm serve " in no_ray


def test_the_default_script_path_expands_on_the_head() -> None:
    default = OPTIONS_BY_ATTR["launch_script"].default
    assert default == "~/spark-vllm-docker/launch-cluster.sh"  # the script's README
    command = spec().start_command()
    assert command.startswith('setsid nohup "$HOME"/spark-vllm-docker/launch-cluster.sh -n ')
    assert spec().stop_command().endswith(" stop")
    assert shell_path("/opt/x y/launch.sh") == "'/opt/x y/launch.sh'"
    assert dotenv_path("~/spark-vllm-docker/launch-cluster.sh") == "~/spark-vllm-docker/.env"
    assert dotenv_path("launch-cluster.sh") == "./.env"


def test_parse_dotenv() -> None:
    text = (
        "# cluster settings\n"
        "CONTAINER_NAME=my_vllm\n"
        "export ETH_IF='enp1s0f1np1'\n"
        'LOCAL_IP="198.19.0.1"  \n'
        "MASTER_PORT=29501 # Ray head port\n"
        "not a line\n"
    )
    assert parse_dotenv(text) == {
        "CONTAINER_NAME": "my_vllm",
        "ETH_IF": "enp1s0f1np1",
        "LOCAL_IP": "198.19.0.1",
        "MASTER_PORT": "29501",
    }


# -- standup's steps on a scripted head -------------------------------------------------------
class FakeCluster(Cluster):
    def __init__(self, *answers: Callable[[str], tuple[int, str, str]]) -> None:
        names = ["spark-head"] + [f"spark-worker-{i}" for i in range(1, len(answers))]
        self.nodes = [
            Node(name, "head" if i == 0 else "worker", name, FakeConn(name, answer))  # type: ignore[arg-type]
            for i, (name, answer) in enumerate(zip(names, answers, strict=True))
        ]
        self._connected = True


def fake_settings(**values: Any) -> Any:
    base = {"container": "vllm_node", "ray": "auto", "serve_args": SERVE, "launch": True}
    values = {**base, **values}
    sources = {k: "command line" for k in values}
    sources.update(values.pop("_sources", {}))
    return SimpleNamespace(**values, source=lambda attr: sources.get(attr, "default"))


def test_launch_is_refused_when_the_containers_already_run() -> None:
    def running(command: str) -> tuple[int, str, str]:
        assert command.startswith("docker inspect -f '{{.State.Status}}' vllm_node")
        return 0, "running\n", ""

    def absent(command: str) -> tuple[int, str, str]:
        return 1, "", ""

    cluster = FakeCluster(absent, running)
    with pytest.raises(NotServing) as info:
        refuse_running(cluster, "vllm_node")
    message = str(info.value)
    assert message.startswith(
        "--spark-launch: container 'vllm_node' is already running on spark-worker-1."
    )
    assert "Attach to it instead (run without --spark-launch)" in message
    refuse_running(FakeCluster(absent, absent), "vllm_node")  # nothing runs: launch


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += seconds


def states(*answers: str) -> Callable[[str], tuple[int, str, str]]:
    """A node whose container is in these states, one per inspect (the last one stays)."""
    seen = list(answers)

    def answer(command: str) -> tuple[int, str, str]:
        assert command.startswith("docker inspect -f '{{.State.Status}}' vllm_node")
        state = seen.pop(0) if len(seen) > 1 else seen[0]
        return (0, f"{state}\n", "") if state else (1, "", "Error: No such object: vllm_node")

    return answer


def test_launch_waits_for_an_earlier_runs_container_to_be_removed() -> None:
    """`docker stop` of a --rm container returns before dockerd has removed it: the next
    launch waits for the name to be free instead of racing the removal (CI saw the
    launcher's docker exec reach a container 'marked for removal')."""
    clock = FakeClock()
    cluster = FakeCluster(states(""), states("removing", "exited", ""))
    refuse_running(cluster, "vllm_node", wait_s=30, sleep=clock.sleep, now=clock.now)
    assert clock.sleeps == [1.0, 1.0]


def test_launch_is_refused_when_a_stopped_container_stays() -> None:
    clock = FakeClock()
    cluster = FakeCluster(states(""), states("exited"))
    with pytest.raises(NotServing) as info:
        refuse_running(cluster, "vllm_node", wait_s=5, sleep=clock.sleep, now=clock.now)
    message = str(info.value)
    assert "a stopped container 'vllm_node' is still there on spark-worker-1 (exited)" in message
    assert "after 5 s" in message and "docker rm -f vllm_node" in message
    assert clock.t >= 5


def test_a_running_container_is_refused_without_waiting() -> None:
    clock = FakeClock()
    cluster = FakeCluster(states("exited"), states("running"))
    with pytest.raises(NotServing, match="already running on spark-worker-1"):
        refuse_running(cluster, "vllm_node", wait_s=30, sleep=clock.sleep, now=clock.now)
    assert clock.sleeps == []


def test_teardown_waits_until_the_stopped_containers_are_removed(tmp_path: Path) -> None:
    stops: list[str] = []
    head_state = states("removing", "")

    def head(command: str) -> tuple[int, str, str]:
        if command.startswith("docker inspect"):
            return head_state(command)
        stops.append(command)
        return 0, "Cluster stopped.\n", ""

    write_json(
        tmp_path / STATE, {"launched": True, "container": "vllm_node", "stop_command": "stop-it"}
    )
    clock = FakeClock()
    cluster = FakeCluster(head, states("removing", "removing", ""))
    assert stop_if_launched(cluster, tmp_path, keep=False, sleep=clock.sleep, now=clock.now) is None
    assert stops[0] == "stop-it" and clock.sleeps == [1.0, 1.0]

    write_json(
        tmp_path / STATE, {"launched": True, "container": "vllm_node", "stop_command": "stop-it"}
    )
    stuck = FakeCluster(head, states("removing"))
    problem = stop_if_launched(stuck, tmp_path, keep=False, sleep=clock.sleep, now=clock.now)
    assert problem is not None
    assert "container 'vllm_node' is still there on spark-worker-1 (removing)" in problem
    assert "docker rm -f vllm_node" in problem


def recording_head(commands: list[str]) -> Callable[[str], tuple[int, str, str]]:
    """A head with no serving container on it that records every other command it runs."""

    def head(command: str) -> tuple[int, str, str]:
        if command.startswith("docker inspect"):
            return 1, "", "Error: No such object: vllm_node"
        commands.append(command)
        return 0, "", ""

    return head


def test_teardown_stops_again_what_a_starting_launcher_left_running(tmp_path: Path) -> None:
    """Signalled while it was still starting the cluster, the launcher's last ``docker
    run`` went through after the first stop: once the launcher is gone, a second stop
    removes that container and teardown reports nothing."""
    stops: list[str] = []
    worker = states("running", "")
    head = recording_head(stops)
    write_json(
        tmp_path / STATE, {"launched": True, "container": "vllm_node", "stop_command": "stop-it"}
    )
    clock = FakeClock()
    cluster = FakeCluster(head, worker)
    assert stop_if_launched(cluster, tmp_path, keep=False, sleep=clock.sleep, now=clock.now) is None
    assert stops == ["stop-it", "stop-it"]


def test_teardown_signals_the_launcher_stops_then_waits_for_it(tmp_path: Path) -> None:
    """The launcher's own cleanup (its TERM trap, run when its foreground command returns)
    stops the containers by name: signalled, then `stop`, then waited for, so that it
    cannot stop a later launch's containers."""
    commands: list[str] = []
    head = recording_head(commands)
    write_json(
        tmp_path / STATE,
        {
            "launched": True,
            "container": "vllm_node",
            "stop_command": "stop-it",
            "signal_launcher": "signal-it",
            "wait_launcher": "wait-for-it",
            "launch_log": "/tmp/l.log",
        },
    )
    cluster = FakeCluster(head, states(""))
    assert stop_if_launched(cluster, tmp_path, keep=False, sleep=FakeClock().sleep) is None
    assert commands == ["signal-it", "stop-it", "wait-for-it", "rm -f /tmp/l.log; true"]


# Stands in for launch-cluster.sh in Ray mode: its foreground command (the head's `docker
# exec ... vllm serve`) runs until `stop` stops the container (here: a file appears); its
# TERM trap runs only then, takes a while, and leaves a mark.
FAKE_LAUNCHER = """#!/bin/bash
cleanup() { trap - EXIT TERM; sleep 0.6; echo stopped > "$1/mark"; exit 0; }
trap 'cleanup "$1"' EXIT TERM
sh -c 'while [ ! -e "$0/stopped" ]; do sleep 0.05; done' "$1"
"""


def test_teardown_commands_wait_for_the_launchers_cleanup(tmp_path: Path) -> None:
    script = tmp_path / "launch-cluster.sh"
    script.write_text(FAKE_LAUNCHER)
    script.chmod(0o755)
    proc = subprocess.Popen([str(script), str(tmp_path)], start_new_session=True)
    try:
        time.sleep(0.3)  # the trap is set
        spec = LaunchSpec(str(script), ("198.19.0.1",), None, "vllm_node", ())
        subprocess.run(["sh", "-c", spec.signal_command(proc.pid)], check=True, timeout=20)
        (tmp_path / "stopped").touch()  # what `stop` does to the head's docker exec
        subprocess.run(["sh", "-c", spec.wait_command(proc.pid, 10)], check=True, timeout=20)
        # the cleanup had finished when the wait returned (not merely been signalled)
        assert (tmp_path / "mark").read_text() == "stopped\n"
        proc.wait(timeout=5)
    finally:
        proc.kill()
        proc.wait()


# Stands in for launch-cluster.sh's no-Ray head since 2026-09-15: it polls the head's
# sentinel with a plain `sleep $HEAD_EXEC_POLL_INTERVAL` (5 s upstream; 30 here), during
# which bash defers a TERM trap.
DETACHED_LAUNCHER = """#!/bin/bash
cleanup() { trap - EXIT TERM; echo stopped > "$1/mark"; exit 0; }
trap 'cleanup "$1"' EXIT TERM
while [ ! -e "$1/sentinel" ]; do sleep 30; done
"""


def test_teardown_does_not_sit_out_the_launchers_poll(tmp_path: Path) -> None:
    """The TERM reaches the launcher's process group: its poll's ``sleep`` ends, the trap
    runs at once, and the wait finds the cleanup done (a TERM to the launcher alone ran
    the trap only after the sleep: here 30 s, past the wait)."""
    script = tmp_path / "launch-cluster.sh"
    script.write_text(DETACHED_LAUNCHER)
    script.chmod(0o755)
    proc = subprocess.Popen([str(script), str(tmp_path)], start_new_session=True)
    try:
        time.sleep(0.3)  # the trap is set, the poll sleeps
        spec = LaunchSpec(str(script), ("198.19.0.1",), None, "vllm_node", ())
        subprocess.run(["sh", "-c", spec.signal_command(proc.pid)], check=True, timeout=20)
        subprocess.run(["sh", "-c", spec.wait_command(proc.pid, 10)], check=True, timeout=20)
        assert proc.poll() == 0
        assert (tmp_path / "mark").read_text() == "stopped\n"
    finally:
        proc.kill()
        proc.wait()


def test_a_launcher_that_leads_no_group_gets_the_term_alone(tmp_path: Path) -> None:
    """Not a group leader (started without setsid): the TERM goes to the launcher only,
    never to a group it shares with others (here: pytest's own)."""
    script = tmp_path / "launch-cluster.sh"
    script.write_text(DETACHED_LAUNCHER)
    script.chmod(0o755)
    proc = subprocess.Popen([str(script), str(tmp_path)])
    try:
        time.sleep(0.3)
        spec = LaunchSpec(str(script), ("198.19.0.1",), None, "vllm_node", ())
        subprocess.run(["sh", "-c", spec.signal_command(proc.pid)], check=True, timeout=20)
        time.sleep(0.3)
        assert proc.poll() is None  # bash defers the trap while its sleep runs
        assert not (tmp_path / "mark").exists()
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(proc.pid)], check=False)  # its sleep
        proc.kill()
        proc.wait()


def test_teardown_commands_leave_a_reused_pid_alone() -> None:
    """A PID of an earlier start, reused by another process, is not the launcher's."""
    other = subprocess.Popen(["sleep", "30"])
    try:
        spec = LaunchSpec("~/spark-vllm-docker/launch-cluster.sh", ("a",), None, "vllm_node", ())
        subprocess.run(["sh", "-c", spec.signal_command(other.pid)], check=True, timeout=20)
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def dotenv_head(env: str, links: set[str] | None = None) -> Callable[[str], tuple[int, str, str]]:
    def answer(command: str) -> tuple[int, str, str]:
        if command.startswith("cat "):
            assert command == 'cat "$HOME"/spark-vllm-docker/.env 2>/dev/null; true'
            return 0, env, ""
        if command.startswith("ip -o link show dev "):
            dev = command.split()[-1]
            if dev in (links or set()):
                return 0, f"3: {dev}: <UP> mtu 9000\n", ""
            return 1, "", f'Device "{dev}" does not exist.'
        raise AssertionError(command)

    return answer


def test_dotenv_container_name_is_used_when_none_was_given() -> None:
    cluster = FakeCluster(dotenv_head("CONTAINER_NAME=team_vllm\n"))
    launcher = Launcher(cluster.head, spec())
    settings = fake_settings(_sources={"container": "default"})
    assert apply_dotenv(cluster, settings, launcher).spec.container == "team_vllm"


def test_dotenv_container_name_against_an_explicit_one_is_a_clear_error() -> None:
    cluster = FakeCluster(dotenv_head("CONTAINER_NAME=team_vllm\n"))
    with pytest.raises(NotServing) as info:
        apply_dotenv(cluster, fake_settings(), Launcher(cluster.head, spec()))
    assert str(info.value).startswith(
        "spark-head: ~/spark-vllm-docker/launch-cluster.sh's .env sets CONTAINER_NAME=team_vllm, "
        "but --spark-container is 'vllm_node' (command line)"
    )


def test_dotenv_container_name_loses_to_a_name_other_than_the_default() -> None:
    # the script's rule: CONTAINER_NAME wins only over --name vllm_node
    cluster = FakeCluster(dotenv_head("CONTAINER_NAME=team_vllm\n"))
    launcher = Launcher(cluster.head, spec(container="mine"))
    assert apply_dotenv(cluster, fake_settings(container="mine"), launcher) is launcher


def test_dotenv_local_ip_and_eth_if_are_checked() -> None:
    cluster = FakeCluster(dotenv_head("LOCAL_IP=10.9.9.9\n"))
    with pytest.raises(NotServing, match=r"LOCAL_IP=10\.9\.9\.9, not among the launcher's nodes"):
        apply_dotenv(cluster, fake_settings(), Launcher(cluster.head, spec()))
    cluster = FakeCluster(dotenv_head("ETH_IF=enp9s0\n", {"enp1s0f1np1"}))
    with pytest.raises(NotServing, match="sets ETH_IF=enp9s0, which spark-head does not have"):
        apply_dotenv(cluster, fake_settings(), Launcher(cluster.head, spec()))
    cluster = FakeCluster(dotenv_head("ETH_IF=enp1s0f1np1\nLOCAL_IP=198.19.0.1\n", {"enp1s0f1np1"}))
    launcher = Launcher(cluster.head, spec())
    assert apply_dotenv(cluster, fake_settings(), launcher) is launcher


def test_configured_mode() -> None:
    assert configured_mode(fake_settings(ray="on")) == ("ray", "command line")
    assert (
        configured_mode(fake_settings(serve_args=SERVE + " --distributed-executor-backend ray"))[0]
        == "ray"
    )
    assert configured_mode(fake_settings()) == ("no-ray", "launch-cluster.sh's default (no --ray)")
    assert configured_mode(fake_settings(launch=False, serve_args=None)) == (None, "")


def test_only_the_nodes_tp_pp_dp_keeps_are_watched() -> None:
    def ok(command: str) -> tuple[int, str, str]:
        return 0, "", ""

    cluster = FakeCluster(ok, ok, ok)
    assert [n.name for n in serving_nodes(cluster, fake_settings())] == [
        "spark-head",
        "spark-worker-1",
    ]
    four = fake_settings(serve_args="vllm serve m -tp 2 -pp 2")
    assert len(serving_nodes(cluster, four)) == 3  # never more than there are


def test_a_missing_script_names_the_path_it_tried() -> None:
    def absent(command: str) -> tuple[int, str, str]:
        assert command.startswith('test -f "$HOME"/spark-vllm-docker/launch-cluster.sh || exit 3;')
        return 3, "", ""

    cluster = FakeCluster(absent)
    with pytest.raises(LaunchError) as info:
        Launcher(cluster.head, spec()).preflight()
    assert str(info.value).startswith(
        "spark-head: launch script ~/spark-vllm-docker/launch-cluster.sh not found on the head"
    )
    assert "--spark-launch-script" in str(info.value)


def script_head(text: str) -> Callable[[str], tuple[int, str, str]]:
    """A head whose launch-cluster.sh reads ``text``: the preflight's grep runs for real."""

    def answer(command: str) -> tuple[int, str, str]:
        assert command.startswith('test -f "$HOME"/spark-vllm-docker/launch-cluster.sh')
        pattern = re.search(r"grep -qE -- '([^']+)'", command)
        assert pattern is not None, command
        found = subprocess.run(
            ["grep", "-qE", "--", pattern.group(1)], input=text, text=True
        ).returncode
        return 0, "ray-flag\n" if found == 0 else "", ""

    return answer


NEW_SCRIPT = """while [[ "$#" -gt 0 ]]; do
    case $1 in
        --ray) RAY_MODE="true" ;;
        --no-ray) RAY_MODE="false" ;;
    esac
done
"""
# eugr/spark-vllm-docker 74c02c3 (2026-01-28): Ray always, no mode flag
OLD_SCRIPT = """while [[ "$#" -gt 0 ]]; do
    case $1 in
        -n|--nodes) NODES_ARG="$2"; shift ;;
        --check-config) CHECK_CONFIG="true" ;;
        *) break ;;
    esac
done
ray start --block --head --port 6379
"""


def test_a_script_without_ray_flag_is_launched_without_it_and_watched_as_ray() -> None:
    """The launcher before mid-2026 has no --ray: passing one made `--ray exec vllm serve`
    its command (bash printed usage and the EXIT trap stopped the cluster)."""
    for text, knows in ((NEW_SCRIPT, True), (OLD_SCRIPT, False)):
        launcher = Launcher(FakeCluster(script_head(text)).head, spec(ray=True))
        launcher.preflight()
        assert launcher.knows_ray is knows
    old = Launcher(FakeCluster(script_head(OLD_SCRIPT)).head, spec(ray=True))
    old.preflight()
    mode, source = ray_only_script(old, fake_settings(), "no-ray", "launch-cluster.sh's default")
    assert (mode, "--ray" in old.spec.base()) == ("ray", False)
    assert "has no --ray option (it always starts Ray)" in source
    new = Launcher(FakeCluster(script_head(NEW_SCRIPT)).head, spec(ray=True))
    new.preflight()
    assert ray_only_script(new, fake_settings(), "ray", "the serve args") == (
        "ray",
        "the serve args",
    )
    assert "--ray" in new.spec.base()
    explicit = Launcher(FakeCluster(script_head(OLD_SCRIPT)).head, spec())
    explicit.preflight()
    with pytest.raises(LaunchError) as info:
        ray_only_script(explicit, fake_settings(ray="off"), "no-ray", "command line")
    assert "predates launch-cluster.sh's no-Ray mode" in str(info.value)
    assert "--spark-ray=on" in str(info.value)


def test_a_silent_docker_daemon_is_no_answer_about_the_container() -> None:
    """container_states() read a docker daemon that does not answer as "no container"."""
    from pytest_spark.launchers.containers import DOCKER_SILENT, container_states

    def silent(command: str) -> tuple[int, str, str]:
        assert command.startswith("docker inspect -f '{{.State.Status}}' vllm_node")
        return 1, "", "Cannot connect to the Docker daemon at unix:///var/run/docker.sock."

    got = container_states(FakeCluster(states(""), silent), "vllm_node")
    assert got == {
        "spark-head": "",
        "spark-worker-1": f"{DOCKER_SILENT} (Cannot connect to the Docker daemon at "
        "unix:///var/run/docker.sock.)",
    }
    # a launch is not refused for it (the docker check owns a silent daemon)
    refuse_running(FakeCluster(states(""), silent), "vllm_node", wait_s=0)


def test_no_fabric_address_says_when_no_rdma_device_is_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node without RDMA drivers: ibdev2netdev and `rdma link` list nothing, so the
    launcher's -n list cannot be built; the message says why, not only that."""
    import pytest_spark.infra.links.gather as gathering
    from pytest_spark.infra.links.parse import RoceMapping
    from pytest_spark.infra.links.probe import NodeLinkFacts
    from pytest_spark.launchers.launch_cluster.driver import fabric_addresses

    node = SimpleNamespace(name="spark-head")
    cluster = SimpleNamespace(nodes=[node])
    bare = NodeLinkFacts("spark-head", {})
    monkeypatch.setattr(gathering, "node_link_facts", lambda _c, _n: bare)
    with pytest.raises(NotServing) as info:
        fabric_addresses(cluster)  # type: ignore[arg-type]
    assert "list no RDMA device: are the RDMA drivers loaded? modprobe mlx5_ib" in str(info.value)
    down = RoceMapping("rocep1s0f1", 1, "enp1s0f1np1", False, "Down")
    listed = NodeLinkFacts("spark-head", {}, roce=(down,))
    monkeypatch.setattr(gathering, "node_link_facts", lambda _c, _n: listed)
    with pytest.raises(NotServing) as info:
        fabric_addresses(cluster)  # type: ignore[arg-type]
    assert "RDMA" not in str(info.value), info.value


def test_a_trimmed_node_is_idle_by_design_in_launch_and_attach() -> None:
    """3 nodes at TP 2: launch-cluster.sh keeps the head and the first worker and prints its
    Note line; attached without serve args, the head's own `vllm serve` says (--nnodes)."""

    def ok(command: str) -> tuple[int, str, str]:
        return 0, "", ""

    cluster = FakeCluster(ok, ok, ok)
    kept, why = kept_nodes(cluster, fake_settings())
    assert [n.name for n in kept] == ["spark-head", "spark-worker-1"]
    note = "Note: Command requires 2 node(s) (tp=2 * pp=1 * dp=1); using 2 of 3 configured node(s)."
    assert note in why and why.startswith("the serve args' TP 2 x PP 1 = 2 ranks")
    attached = fake_settings(serve_args=None)
    top = [
        "bash -c /workspace/exec-script.sh >> /proc/1/fd/1 2>&1",
        "python3 /opt/vllm/bin/vllm serve /m -tp 2 --nnodes 2 --node-rank 0 --master-port 29501",
    ]
    line = head_serve_line(top)
    assert line is not None and line.startswith("vllm serve /m -tp 2 --nnodes 2")
    kept, why = kept_nodes(cluster, attached, line)
    assert [n.name for n in kept] == ["spark-head", "spark-worker-1"]
    assert why == "the head's vllm serve process has --nnodes 2"
    assert kept_nodes(cluster, attached) == (list(cluster.nodes), "")  # nothing says: all
    assert head_serve_line(["sleep infinity"]) is None
    info = ServingInfo(False, 1.0, [], {}, nodes=("spark-head", "spark-worker-1"),
                       idle_nodes=("spark-worker-2",), idle_because=why)  # fmt: skip
    assert idle_by_design(cluster, attached, info, "spark-head") is None
    reason = idle_by_design(cluster, attached, info, "spark-worker-2")
    assert reason == (
        "spark-worker-2 is idle by design: it serves no rank, the cluster keeps 2 node(s) "
        "(spark-head, spark-worker-1): the head's vllm serve process has --nnodes 2"
    )
