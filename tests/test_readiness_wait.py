"""The readiness wait's state machine (readiness.wait.ReadinessWait), one poll at a time.

Each test hands ``observe`` what one poll found on each node (parsed probes, or a lost
connection) at a time of its choosing: no SSH, no threads, no sleeping. Every stage
transition and every time limit is exercised at its edge: the last moment it does not
apply and the first that it does. (``tests/test_readiness_watch.py`` drives the same
machine through ``wait_ready`` against scripted shells and a fake clock.)"""

from __future__ import annotations

from typing import Any

import pytest

from pytest_spark.access.base import NodeUnreachable
from pytest_spark.access.cluster import Node
from pytest_spark.access.retry import for_connection
from pytest_spark.readiness.probe import NodeProbe
from pytest_spark.readiness.wait import ReadinessWait
from pytest_spark.readiness.waitstate import ATTACH_MISSING_S, MISSING_LIMIT_S, Stage, WaitSpec

CONTAINER = "vllm_node"
HEAD, WORKER = "spark-head", "spark-worker-1"
SINCE = "2026-11-29T20:00:00.000000000Z"
SERVE = "1234 /usr/bin/python3 /usr/local/bin/vllm serve /models/m --tensor-parallel-size 2"
LOADING = (
    "(RayWorkerWrapper pid=455, ip=192.168.200.13) INFO 11-29 20:00:15 "
    "[gpu_model_runner.py:2602] Starting to load model /models/Qwen3.5-122B-A10B-FP8..."
)
PG_WAIT = (
    "(EngineCore_DP0 pid=1) INFO [ray_utils.py:300] Waiting for creating a placement group of "
    "specs for 10 seconds. specs=[{'GPU': 1.0}, {'GPU': 1.0}]"
)


class Target:
    def describe(self) -> str:
        return "admin@10.0.0.2"


class Conn:
    target = Target()


def node(name: str, role: str) -> Node:
    return Node(name, role, name, Conn())  # type: ignore[arg-type]


def machine(**kwargs: Any) -> ReadinessWait:
    """A two-node wait begun at t=0, launching (the launcher's pid known) unless told."""
    head, worker = node(HEAD, "head"), node(WORKER, "worker")
    options: dict[str, Any] = {
        "container": CONTAINER,
        "port": 8000,
        "ready_timeout": 600.0,
        "hang_timeout": 300.0,
        "placement_timeout": 120.0,
        "since": SINCE,
        "launcher_pid": 4242,
    }
    notify = kwargs.pop("notify", None)
    spec = WaitSpec(**{**options, **kwargs})
    policy = for_connection(1.0, 1.0)  # retries after 1, 1, 1 s
    return ReadinessWait(head, [head, worker], spec, 0.0, policy, notify)


def probe(
    status: str = "running",
    health: str | None = None,
    lines: tuple[str, ...] = (),
    alive: bool | None = None,
    procs: tuple[str, ...] = (SERVE,),
) -> NodeProbe:
    """What the probe's parser makes of one node's answer; ``lines`` get docker's stamp."""
    return NodeProbe(
        health, status, [f"{SINCE} {line}" for line in lines], alive, "", None, [*procs]
    )


MISSING = probe(status="missing", procs=())
UP = probe(health="000")  # the head: container running, /health refused (not up yet)
RUNNING = probe()  # a worker: container running, vLLM in it


def poll(
    wait: ReadinessWait, now: float, head: NodeProbe = UP, worker: NodeProbe = RUNNING
) -> Stage:
    return wait.observe({HEAD: head, WORKER: worker}, now)


def signature(wait: ReadinessWait) -> str:
    assert wait.watch.failure is not None, wait.stage
    return wait.watch.failure.signature


def confirmed(wait: ReadinessWait, now: float, **found: NodeProbe) -> Stage:
    """A dead rank found at ``now`` is held one poll (its verdict not yet given), then
    blamed by the next poll, which finds nothing in any log that came before it."""
    stage = poll(wait, now, **found)
    assert stage is not Stage.FAILED and wait.watch.failure is None, wait.watch.failure
    assert wait.held is not None
    return poll(wait, now + 0.5, **found)


# -- stages -------------------------------------------------------------------------------
def test_launching_starts_in_starting_and_loads_once_every_container_is_seen() -> None:
    wait = machine()
    assert wait.stage is Stage.STARTING
    assert poll(wait, 0.5, worker=MISSING) is Stage.STARTING  # not started yet: no verdict
    assert poll(wait, 1.0) is Stage.LOADING
    assert poll(wait, 1.5, worker=MISSING) is Stage.LOADING  # seen once is enough


def test_attaching_starts_in_loading() -> None:
    assert machine(launcher_pid=None).stage is Stage.LOADING


def test_health_5xx_while_starting_waits_and_once_loading_is_a_dead_engine() -> None:
    wait = machine()
    assert poll(wait, 0.5, head=probe(health="503"), worker=MISSING) is Stage.STARTING
    assert wait.watch.failure is None
    assert poll(wait, 1.0, head=probe(health="503")) is Stage.FAILED
    assert signature(wait) == "engine unhealthy: /health answers 503"


def test_health_200_is_ready_and_ready_is_final() -> None:
    wait = machine()
    assert poll(wait, 0.5) is Stage.LOADING
    assert poll(wait, 1.0, head=probe(health="200")) is Stage.READY
    assert wait.watch.ready and wait.watch.timeline()[-1]["start_s"] == 1.0
    assert poll(wait, 1.5, worker=probe(status="exited (code 1)")) is Stage.READY
    assert wait.watch.failure is None


def test_a_failure_is_final() -> None:
    wait = machine()
    assert confirmed(wait, 0.5, worker=probe(status="exited (code 137)")) is Stage.FAILED
    assert signature(wait) == f"container {CONTAINER} exited (code 137)"
    assert poll(wait, 1.0, head=probe(health="200")) is Stage.FAILED
    assert not wait.watch.ready


def test_no_curl_on_the_head_fails() -> None:
    wait = machine()
    assert poll(wait, 0.5, head=probe(health="nocurl")) is Stage.FAILED
    assert signature(wait) == "curl not found on the head"


# -- the graces for a missing container or one where nothing serves -----------------------
@pytest.mark.parametrize(("hang_timeout", "limit"), [(10.0, MISSING_LIMIT_S), (40.0, 40.0)])
def test_a_container_missing_past_its_limit_is_gone(hang_timeout: float, limit: float) -> None:
    wait = machine(hang_timeout=hang_timeout, head_log_visible=False)
    assert poll(wait, 1.0, worker=MISSING) is Stage.STARTING  # missing since 1.0
    assert poll(wait, 1.0 + limit, worker=MISSING) is Stage.STARTING
    assert confirmed(wait, 1.5 + limit, worker=MISSING) is Stage.FAILED
    assert signature(wait) == (
        f"no container named {CONTAINER!r} (still missing after {limit + 0.5:.0f} s "
        f"(limit {limit:.0f} s))"
    )


def test_a_missing_container_fails_the_poll_after_the_launcher_is_found_dead() -> None:
    wait = machine()
    dead = probe(health="000", alive=False)
    # the worker's probe races the head's: the poll that finds the launcher dead waits
    assert poll(wait, 0.5, head=dead, worker=MISSING) is Stage.STARTING
    assert confirmed(wait, 1.0, head=dead, worker=MISSING) is Stage.FAILED
    assert signature(wait) == f"no container named {CONTAINER!r} (the launcher has exited)"


def test_attached_a_missing_container_is_gone_after_the_attach_grace() -> None:
    wait = machine(launcher_pid=None)
    assert poll(wait, ATTACH_MISSING_S, worker=MISSING) is Stage.LOADING
    assert confirmed(wait, ATTACH_MISSING_S + 0.5, worker=MISSING) is Stage.FAILED
    assert signature(wait).startswith(f"no container named {CONTAINER!r}")


def test_attached_a_container_where_nothing_serves_is_a_dead_rank_after_the_grace() -> None:
    wait = machine(launcher_pid=None)
    idle = probe(procs=())
    assert poll(wait, 1.0, worker=idle) is Stage.LOADING  # idle since 1.0
    assert poll(wait, 1.0 + MISSING_LIMIT_S, worker=idle) is Stage.LOADING
    assert confirmed(wait, 1.5 + MISSING_LIMIT_S, worker=idle) is Stage.FAILED
    assert wait.watch.failure is not None and wait.watch.failure.node == WORKER
    assert signature(wait) == (
        f"no vllm or ray process in the running container {CONTAINER!r} for 30 s (limit 30 s)"
    )


def test_a_serving_process_seen_and_gone_is_a_dead_rank_at_once() -> None:
    wait = machine()
    assert poll(wait, 0.5) is Stage.LOADING
    assert confirmed(wait, 1.0, worker=probe(procs=())) is Stage.FAILED
    assert signature(wait).startswith("`vllm serve` exited inside the running container")


def test_a_dead_rank_held_for_confirmation_is_not_lost_to_a_limit_reached_meanwhile() -> None:
    """The confirming poll cannot reach the rank's node (its retry pending) and the ready
    timeout falls due: the dead rank, held, is still the verdict, not the timeout."""
    wait = machine(ready_timeout=1.5)
    assert poll(wait, 0.5) is Stage.LOADING
    assert poll(wait, 1.0, worker=probe(procs=())) is Stage.LOADING  # held
    lost = NodeUnreachable(WORKER, "SSH session lost")
    assert wait.observe({HEAD: UP, WORKER: lost}, 1.5) is Stage.FAILED
    assert wait.watch.failure is not None and wait.watch.failure.node == WORKER
    assert signature(wait).startswith("`vllm serve` exited inside the running container")


# -- the time limits -----------------------------------------------------------------------
def test_ready_timeout_names_the_limit_and_the_phase() -> None:
    wait = machine(ready_timeout=3.0, head_log_visible=False)
    assert poll(wait, 2.9) is Stage.LOADING
    assert poll(wait, 3.0) is Stage.FAILED
    assert wait.watch.failure is not None and wait.watch.failure.kind == "timeout"
    assert signature(wait) == "not ready after 3 s (phase start)"


def test_hang_timeout_silence_is_a_stall_naming_the_limit() -> None:
    wait = machine(hang_timeout=20.0)
    assert poll(wait, 1.0, head=probe(health="000", lines=(LOADING,))) is Stage.LOADING
    assert poll(wait, 20.9) is Stage.LOADING  # the line is fed once: polls after are silent
    assert poll(wait, 21.0) is Stage.FAILED
    failure = wait.watch.failure
    assert failure is not None and failure.kind == "stalled"
    assert failure.message().startswith(
        "vLLM startup stalled: no log progress for 20 s in phase weights "
        "(limit 20 s: --spark-hang-timeout)"
    ), failure.message()


def test_silence_is_no_stall_while_the_head_log_is_hidden() -> None:
    wait = machine(hang_timeout=20.0, head_log_visible=False)
    assert poll(wait, 1.0, head=probe(health="000", lines=(LOADING,))) is Stage.LOADING
    assert poll(wait, 500.0) is Stage.LOADING


def test_placement_timeout_counts_from_when_the_wait_began() -> None:
    # the line, fed at 12 s, says the wait began 10 s before: the budget ends at 2 + 60 s
    wait = machine(placement_timeout=60.0)
    assert poll(wait, 12.0, head=probe(health="000", lines=(PG_WAIT,))) is Stage.LOADING
    assert poll(wait, 61.9) is Stage.LOADING
    assert poll(wait, 62.0) is Stage.FAILED
    assert wait.watch.failure is not None and wait.watch.failure.kind == "hang"
    assert signature(wait) == (
        "placement-group (waiting 60 s, limit 60 s: the profile's "
        "readiness.placement_group_timeout_s)"
    )


# -- connection loss ---------------------------------------------------------------------
def test_a_lost_node_is_not_probed_until_its_retry_is_due_and_heals_with_a_notice() -> None:
    notices: list[str] = []
    wait = machine(notify=notices.append)
    lost = NodeUnreachable(WORKER, "SSH session lost")
    assert poll(wait, 0.5) is Stage.LOADING
    assert wait.observe({HEAD: UP, WORKER: lost}, 1.0) is Stage.LOADING
    assert [n.name for n in wait.due(1.9)] == [HEAD]
    assert [n.name for n in wait.due(2.0)] == [HEAD, WORKER]
    assert poll(wait, 2.0) is Stage.LOADING
    assert notices == [
        f"lost connection to {WORKER}, retry 1/3 in 1 s ({lost})",
        f"{WORKER} answers again after 1.0 s (1 retry)",
    ]
    assert wait.due(2.5) == wait.nodes


def test_silence_while_a_node_is_retried_is_no_stall() -> None:
    wait = machine(hang_timeout=2.0)
    lost = NodeUnreachable(WORKER, "SSH session lost")
    assert poll(wait, 0.5, head=probe(health="000", lines=(LOADING,))) is Stage.LOADING
    assert wait.observe({HEAD: UP, WORKER: lost}, 1.0) is Stage.LOADING
    assert wait.observe({HEAD: UP}, 2.5) is Stage.LOADING  # 2 s silent, but a node is away
    assert poll(wait, 3.0) is Stage.LOADING  # it is back: the silence starts again now
    assert poll(wait, 5.0) is Stage.FAILED
    assert wait.watch.failure is not None and wait.watch.failure.kind == "stalled"


def test_a_node_that_never_connected_fails_without_retries() -> None:
    wait = machine()
    error = NodeUnreachable(WORKER, "connection refused")
    wait.nodes[1]._error = error
    assert wait.observe({HEAD: UP, WORKER: error}, 0.5) is Stage.FAILED
    assert wait.watch.failure is not None and wait.watch.failure.kind == "unreachable"
    assert signature(wait).startswith("no SSH connection after 0 retries over 0 s")
    assert "admin@10.0.0.2" in wait.watch.failure.remediation


# -- what each node is asked -----------------------------------------------------------------
def test_only_the_head_is_asked_for_health_and_the_launcher() -> None:
    wait = machine(launcher_log_path="/tmp/launch.log")
    head, worker = (wait.command(n) for n in wait.nodes)
    assert "/health" in head and "ps -o stat= -p 4242" in head and "/tmp/launch.log" in head
    assert "/health" not in worker and "ps -o stat=" not in worker and "launch.log" not in worker
    assert f"--since {SINCE}" in worker


def test_a_docker_daemon_that_is_down_is_not_a_container_state() -> None:
    """Issue #25 part 3: a docker daemon that is down was read as the container's state
    (``container 'Cannot connect to the Docker daemon ...'``): stderr taken for stdout."""
    from pytest_spark.access.base import CommandResult
    from pytest_spark.launchers.containers import inspected_state

    def inspect(rc: int, stdout: str, stderr: str = "") -> tuple[str, str | None]:
        return inspected_state(
            CommandResult("spark-worker-1", "docker inspect", rc, stdout, stderr)
        )

    down = (
        "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
        "Is the docker daemon running?"
    )
    assert inspect(1, "", down) == ("unknown", down)
    assert inspect(0, "running\n") == ("running", None)
    assert inspect(0, "exited\n") == ("exited", None)
    assert inspect(1, "\n", "Error: No such object: vllm_node") == ("missing", None)
    assert inspect(1, "", "Error response from daemon: No such container: x") == ("missing", None)
    assert inspect(127, "", "sh: docker: not found")[0] == "unknown"
