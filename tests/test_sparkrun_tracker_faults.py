"""sparkrun's tracker faults as the plugin tells them, without a cluster: a loopback
``--master-addr`` on a multi-node job (sparkrun#249) and a rank whose serve never started
(sparkrun#292) in the readiness wait's state machine, one poll at a time; a hung engine
behind a live API (sparkrun#252) in the engine probe, against a local HTTP server that
answers /v1/models and never answers a completion. The suite runs of the same faults on
sparksim are tests/suite/test_sparkrun_faults.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_readiness_wait import (  # type: ignore[import-not-found]
    HEAD,
    SINCE,
    WORKER,
    confirmed,
    machine,
    poll,
    signature,
)

from pytest_spark.access.api import ApiEndpoint, engine_failing
from pytest_spark.readiness.parse import loopback_master
from pytest_spark.readiness.probe import NodeProbe
from pytest_spark.readiness.wait import ReadinessWait
from pytest_spark.readiness.waitstate import MISSING_LIMIT_S, Stage

JOB = "sparkrun_qwen35-122b_d64ff6cc"
SERVE_LOG = "/tmp/sparkrun_serve.log"
SERVE = (
    "195 python3 /opt/vllm/bin/vllm serve /models/m --tensor-parallel-size 2 --nnodes 2 "
    "--node-rank {rank} --master-addr {addr} --master-port 25000"
)


def rank_probe(
    rank: int, addr: str = "192.168.200.12", text: str = "x\n", health: str | None = None
) -> NodeProbe:
    procs = [SERVE.format(rank=rank, addr=addr) + (" --headless" if rank else "")]
    return NodeProbe(health, "running", [], None, "", SINCE, procs, None, text)


def sparkrun_wait(hang_timeout: float = 20.0) -> ReadinessWait:
    containers = {HEAD: f"{JOB}_node_0", WORKER: f"{JOB}_node_1"}
    return machine(
        launcher_pid=None,
        hang_timeout=hang_timeout,
        containers=containers,
        serve_log=SERVE_LOG,
    )


@pytest.mark.parametrize("addr", ["127.0.0.1", "127.0.1.1", "localhost", "::1"])
def test_a_loopback_master_addr_on_a_multi_node_serve_is_found(addr: str) -> None:
    assert loopback_master(SERVE.format(rank=1, addr=addr)) == (addr, 2, "1")


@pytest.mark.parametrize(
    "line",
    [
        SERVE.format(rank=1, addr="192.168.200.12"),  # the head's fabric address
        SERVE.format(rank=0, addr="127.0.0.1").replace("--nnodes 2", "--nnodes 1"),  # one node
        "195 python3 /opt/vllm/bin/vllm serve /models/m --master-addr 127.0.0.1",  # no --nnodes
        "12 ray start --head --node-ip-address 127.0.0.1 --nnodes 2",  # not vllm serve
    ],
)
def test_no_loopback_verdict_where_the_ranks_can_meet(line: str) -> None:
    assert loopback_master(line) is None


def test_a_loopback_master_addr_fails_at_the_first_poll_naming_the_rank_that_cannot_join() -> None:
    wait = sparkrun_wait()
    head, worker = rank_probe(0, "127.0.0.1", health="000"), rank_probe(1, "127.0.0.1")
    assert confirmed(wait, 1.0, head=head, worker=worker) is Stage.FAILED
    failure = wait.watch.failure
    assert failure is not None and failure.node == WORKER
    assert signature(wait).startswith(
        "--master-addr 127.0.0.1 is a loopback address on a 2-node job (--nnodes 2): rank 1 "
        f"on {WORKER} dials its own 127.0.0.1, never {HEAD}'s store, and can never join "
        "(sparkrun#249"
    )
    assert f"on {HEAD} (rank 0), {WORKER} (rank 1)" in signature(wait)
    assert "sparkrun stop" in failure.remediation


@pytest.mark.parametrize("head_addr", ["192.168.200.12", "127.0.0.1"])
def test_no_verdict_while_every_other_rank_dials_the_heads_address(head_addr: str) -> None:
    """The head's store listens on every address: its own loopback --master-addr alone
    (the workers dialing its fabric IP) is no fault."""
    wait = sparkrun_wait()
    head = rank_probe(0, head_addr, health="000")
    for now in (1.0, 2.0, 3.0):
        assert poll(wait, now, head=head, worker=rank_probe(1)) is Stage.LOADING


def test_a_rank_whose_serve_never_started_is_named_before_the_heads_stall() -> None:
    """Container up, no vllm process, nothing in the serve log: called at half the hang
    timeout (10 s of 20), before the head's silence reaches it."""
    wait = sparkrun_wait(hang_timeout=20.0)
    never = NodeProbe(None, "running", [], None, "", SINCE, [], None, "")
    head = rank_probe(0, health="000")
    assert poll(wait, 1.0, head=head, worker=never) is Stage.LOADING  # idle since 1.0
    assert poll(wait, 11.0, head=head, worker=never) is Stage.LOADING
    assert confirmed(wait, 11.5, head=head, worker=never) is Stage.FAILED
    failure = wait.watch.failure
    assert failure is not None and failure.node == WORKER
    assert signature(wait).startswith(
        "the container is up but its vllm serve never started (sparkrun#292): measured: no "
        f"vllm process in the running container '{JOB}_node_1' for 10 s and its serve log "
        f"{SERVE_LOG} empty or absent"
    )
    assert "`sparkrun stop` and run the job again" in failure.remediation


def test_a_rank_whose_serve_log_has_lines_died_it_did_not_fail_to_start() -> None:
    """The serve log has content, the process is gone: not 'never started'; the idle
    grace stays MISSING_LIMIT_S."""
    wait = sparkrun_wait(hang_timeout=600.0)
    died = NodeProbe(None, "running", [], None, "", SINCE, [], None, "Traceback ...\n")
    head = rank_probe(0, health="000")
    assert poll(wait, 1.0, head=head, worker=died) is Stage.LOADING
    assert poll(wait, 11.0, head=head, worker=died) is Stage.LOADING
    assert confirmed(wait, 1.5 + MISSING_LIMIT_S, head=head, worker=died) is Stage.FAILED
    assert "never started" not in signature(wait)
    assert signature(wait).startswith("no vllm or ray process in the running container")


class Hung(BaseHTTPRequestHandler):
    """/v1/models answers; a completion is read and never answered (until shutdown)."""

    release = threading.Event()

    def do_GET(self) -> None:
        body = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.release.wait(30)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hung_api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hung)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        Hung.release.set()
        server.shutdown()
        server.server_close()
        Hung.release.clear()


def test_a_hung_engine_behind_a_live_api_is_the_model_not_answering(hung_api: str) -> None:
    endpoint = ApiEndpoint(hung_api, "m", None, 0.5)
    said = engine_failing(endpoint, log_hint="the head's serve log", node=HEAD)
    assert said is not None
    assert said.startswith(
        f"{HEAD}: the model does not answer: {hung_api} answers /v1/models ('m') but a "
        "1-token chat completion got no answer in 0.5 s."
    )
    assert "sparkrun#252" in said and "fix: the head's serve log says where it stopped" in said
