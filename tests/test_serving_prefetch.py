"""Requests sent ahead together (pytest_spark.serving.client.prefetch): a module's planned
requests are in flight at once, bounded; each check reads its own answer (or the error its
request raised) unchanged; nothing planned is left in flight when the module ends; one worker
(or xdist) sends each request when its check runs, as before."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_spark.infra.finding import Finding
from pytest_spark.serving.client.chat import TurnCache
from pytest_spark.serving.client.evidence import Exchange
from pytest_spark.serving.client.prefetch import (
    AskedAloneWarning,
    Prefetch,
    confirmed_alone,
    plan_workers,
)
from pytest_spark.serving.client.stream import ServingError
from pytest_spark.serving.client.turn import Turn
from pytest_spark.serving.validate.reasoningturns import ReasoningTurns
from pytest_spark.settings.profiles import load_profile

pytestmark = pytest.mark.unit


class FakeClient:
    """``turn(body, streamed)``: records what was in flight at once; ``fail`` bodies raise."""

    def __init__(self, hold_s: float = 0.2) -> None:
        self.hold_s = hold_s
        self.lock = threading.Lock()
        self.inflight = 0
        self.peak = 0
        self.sent: list[str] = []

    def turn(self, body: dict[str, Any], streamed: bool) -> Turn:
        with self.lock:
            self.inflight += 1
            self.peak = max(self.peak, self.inflight)
            self.sent.append(body["q"])
        try:
            time.sleep(self.hold_s)
            if body["q"].startswith("fail"):
                raise ServingError("http", f"HTTP 500 for {body['q']}", Exchange("POST", "/x"))
            return Turn(
                streamed=streamed,
                content=f"answer to {body['q']}",
                reasoning=None,
                reasoning_fields=(),
                tool_calls=[],
                finish_reason="stop",
                usage=None,
                exchange=Exchange("POST", "/x"),
            )
        finally:
            with self.lock:
                self.inflight -= 1


def _body(q: str) -> Any:
    return lambda: {"q": q}


def test_planned_requests_go_out_together_bounded_and_each_check_reads_its_own() -> None:
    client = FakeClient()
    prefetch = Prefetch(3)
    cache = TurnCache(client, prefetch)
    for q in ("a", "b", "c", "d", "e", "f"):
        cache.plan(q, _body(q), False)
    answers = [cache.turn(q, _body(q), False).content for q in ("a", "b", "c", "d", "e", "f")]
    prefetch.close()
    assert answers == [f"answer to {q}" for q in "abcdef"]
    assert client.peak == 3  # bounded by the setting, and really concurrent
    assert sorted(client.sent) == list("abcdef")  # each sent once: the check read the plan


def test_a_planned_request_that_failed_raises_its_error_in_the_check_that_reads_it() -> None:
    client = FakeClient(hold_s=0.01)
    prefetch = Prefetch(4)
    cache = TurnCache(client, prefetch)
    cache.plan("fail-1", _body("fail-1"), True)
    with pytest.raises(ServingError, match="HTTP 500 for fail-1"):
        cache.turn("fail-1", _body("fail-1"), True)
    with pytest.raises(ServingError):  # kept: a second reader sees the same error
        cache.turn("fail-1", _body("fail-1"), True)
    prefetch.close()
    assert client.sent == ["fail-1"]


def test_concurrency_one_plans_nothing_and_sends_when_the_check_runs() -> None:
    client = FakeClient(hold_s=0.01)
    prefetch = Prefetch(1)
    cache = TurnCache(client, prefetch)
    cache.plan("a", _body("a"), False)
    assert client.sent == [] and prefetch.sent == 0
    assert cache.turn("a", _body("a"), False).content == "answer to a"
    assert client.sent == ["a"]


def test_drain_waits_until_nothing_planned_is_in_flight() -> None:
    client = FakeClient(hold_s=0.3)
    prefetch = Prefetch(4)
    cache = TurnCache(client, prefetch)
    for q in ("a", "b"):  # planned, never read (their checks skipped)
        cache.plan(q, _body(q), False)
    time.sleep(0.05)
    assert client.inflight == 2
    prefetch.drain()
    assert client.inflight == 0  # a measurement after this runs alone
    prefetch.close()


E2E = Path(__file__).resolve().parents[1] / "tests_e2e"


def test_the_modules_that_measure_never_send_ahead() -> None:
    """Only the functional modules plan: the sweeps, the soak, the open loop, the prefix
    cache, the long context and the accuracy canaries send their own requests alone."""
    planning = {p.name for p in E2E.glob("test_*.py") if "def plan_ahead(" in p.read_text()}
    assert planning == {
        "test_tool_calls.py",
        "test_reasoning.py",
        "test_structured_output.py",
        "test_via_sdk.py",
    }


def test_a_comparison_that_failed_together_is_decided_on_the_pair_sent_alone() -> None:
    """Two answers sent in a batch may part (batch-variant greedy decoding): the pair is sent
    again alone and that comparison decides; a real difference still fails."""
    differed = Finding.failed("b", "a", message="streamed text differs")
    asked: list[int] = []

    def again(ok: bool) -> Finding:
        asked.append(1)
        if ok:
            return Finding.passed("a", "a", message="the same")
        return Finding.failed("c", "a", message="differs alone too")

    together = Prefetch(8)
    healed = confirmed_alone(together, differed, lambda: again(True))
    assert healed.ok and "sent alone, one after the other, they agree" in healed.message
    still = confirmed_alone(together, differed, lambda: again(False))
    assert not still.ok and still.message == "differs alone too"
    assert len(asked) == 2
    # one at a time (or a comparison that passed): the finding stands, nothing re-asked
    assert confirmed_alone(Prefetch(1), differed, lambda: again(True)) is differed
    same = Finding.passed("a", "a")
    assert confirmed_alone(together, same, lambda: again(False)) is same
    assert len(asked) == 2


RUN_CONFTEST = """
import pytest
from pytest_spark.serving.client.prefetch import Prefetch, ask_ahead

LOG = []
PREFETCH = Prefetch(4)


@pytest.fixture(scope="session")
def serving_prefetch():
    yield PREFETCH
    PREFETCH.close()


@pytest.fixture(scope="module", autouse=True)
def _ask_ahead(request):
    yield from ask_ahead(request)
"""

PLANNING_MODULE = """
import time
from conftest import LOG, PREFETCH


def plan_ahead(request, item):
    LOG.append(("plan", item.name))

    def ask(name=item.name):
        time.sleep(3)
        LOG.append(("done", name))

    PREFETCH.submit(ask)
"""


def test_the_first_functional_module_plans_the_run_and_its_last_drains(
    pytester: pytest.Pytester,
) -> None:
    """Consecutive functional modules are one plan: the first plans every check of the
    run (its requests go out together), the next ones plan nothing again and nothing is
    drained between them; after the run's last, a measuring module finds nothing in flight."""
    pytester.makeconftest(RUN_CONFTEST)
    pytester.makepyfile(
        test_a=PLANNING_MODULE
        + """
def test_a1():
    assert ("plan", "test_b1") in LOG and ("plan", "test_b2") in LOG

def test_a2():
    pass
""",
        test_b=PLANNING_MODULE
        + """
def test_b1():
    assert ("done", "test_a1") not in LOG  # not drained at test_a's end: still in flight
    assert [e for e in LOG if e[0] == "plan"] == [
        ("plan", "test_a1"), ("plan", "test_a2"), ("plan", "test_b1"), ("plan", "test_b2")
    ]

def test_b2():
    pass
""",
        test_c="""
from conftest import LOG

def test_c_measures():
    assert sorted(n for kind, n in LOG if kind == "done") == [
        "test_a1", "test_a2", "test_b1", "test_b2"
    ]
""",
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--spark-history=off")
    result.assert_outcomes(passed=5)


def test_a_plan_whose_fixture_fails_stays_with_its_own_module(pytester: pytest.Pytester) -> None:
    """A later module's planner that meets a failing or skipping fixture does not error or
    skip the module that planned for it: that module's checks pass, and the failing
    fixture's error and skip land where the checks that use it are."""
    pytester.makeconftest(
        RUN_CONFTEST
        + """

@pytest.fixture(scope="session")
def broken():
    raise RuntimeError("the SDK client could not be made")


@pytest.fixture(scope="session")
def skipping():
    pytest.skip("no SDK here")
"""
    )
    pytester.makepyfile(
        test_a=PLANNING_MODULE + "\ndef test_a1():\n    pass\n",
        test_b="""
def plan_ahead(request, item):
    request.getfixturevalue("broken" if item.name == "test_b1" else "skipping")

def test_b1(broken):
    pass

def test_b2(skipping):
    pass
""",
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--spark-history=off")
    result.assert_outcomes(passed=1, errors=1, skipped=1)
    result.stdout.fnmatch_lines(["*ERROR at setup of test_b1*"])


SPANNED_MODULE = """
from conftest import LOG
plan_spans = True

def test_s_reads():
    LOG.append(("spanned", "test_s_reads"))
"""


def test_a_run_goes_on_across_a_module_that_spans_it(pytester: pytest.Pytester) -> None:
    """A module that declares ``plan_spans`` (it sends nothing that must stay alone: the
    throughput checks read the sweep measured alone) does not end a run: the functional
    module after it was planned by the first, nothing is drained at the spanned module;
    a run that ends on such a module still drains there."""
    pytester.makeconftest(RUN_CONFTEST)
    pytester.makepyfile(
        test_a=PLANNING_MODULE + "\ndef test_a1():\n    assert ('plan', 'test_c1') in LOG\n",
        test_b=SPANNED_MODULE,
        test_c=PLANNING_MODULE
        + """
def test_c1():
    assert ("done", "test_a1") not in LOG  # not drained at test_a's or test_b's end
    assert [e for e in LOG if e[0] == "plan"] == [("plan", "test_a1"), ("plan", "test_c1")]
""",
        test_d="""
from conftest import LOG

def test_d_measures():
    assert sorted(n for kind, n in LOG if kind == "done") == ["test_a1", "test_c1"]
""",
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--spark-history=off")
    result.assert_outcomes(passed=4)


def test_a_run_that_ends_on_a_spanned_module_drains_there(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(RUN_CONFTEST)
    pytester.makepyfile(
        test_a=PLANNING_MODULE + "\ndef test_a1():\n    pass\n",
        test_b=SPANNED_MODULE,
        test_c="""
from conftest import LOG

def test_c_measures():
    assert ("done", "test_a1") in LOG
""",
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--spark-history=off")
    result.assert_outcomes(passed=3)


class CrowdedClient(FakeClient):
    """A server that runs out of time only under load: a request answers within its
    ``timeout`` kind while it is alone in flight, and raises ``kind`` when another request
    was in flight beside it; ``slow_alone`` makes it run out of time alone too."""

    def __init__(self, kind: str = "timeout", slow_alone: bool = False) -> None:
        super().__init__(hold_s=0.15)
        self.kind = kind
        self.slow_alone = slow_alone
        self.alone: list[str] = []

    def turn(self, body: dict[str, Any], streamed: bool) -> Turn:
        with self.lock:
            crowded = self.inflight > 0 or self.slow_alone
            if not crowded:
                self.alone.append(body["q"])
        if not crowded:
            return super().turn(body, streamed)
        super().turn(body, streamed)  # holds its place in flight a while
        raise ServingError(
            self.kind,
            "POST /x: no complete answer within the 1 s request timeout",
            Exchange("POST", "/x"),
        )


def test_a_planned_request_out_of_time_beside_others_is_judged_on_its_answer_alone() -> None:
    """Our own load must not fail a check: a planned request that ran out of time with
    others in flight is asked again once nothing is in flight, and that answer is the
    check's, with a warning that names the setting."""
    client = CrowdedClient()
    prefetch = Prefetch(4)
    cache = TurnCache(client, prefetch)
    for q in ("a", "b", "c"):
        cache.plan(q, _body(q), False)
    with pytest.warns(
        AskedAloneWarning, match=r"asked again alone it answered in .* --spark-serving-concurrency"
    ):
        turn = cache.turn("c", _body("c"), False)  # c went out beside a
    assert turn.content == "answer to c"
    assert client.alone == ["a", "c"]  # sent again only after the plan drained: alone
    assert prefetch.asked_alone == 1
    prefetch.close()


def test_a_stall_beside_others_is_asked_alone_too_but_not_an_error_of_the_server() -> None:
    client = CrowdedClient(kind="stall")
    prefetch = Prefetch(4)
    cache = TurnCache(client, prefetch)
    for q in ("a", "b"):
        cache.plan(q, _body(q), True)
    with pytest.warns(AskedAloneWarning):
        assert cache.turn("b", _body("b"), True).content == "answer to b"
    prefetch.close()
    other = FakeClient(hold_s=0.01)  # an HTTP 500 is the server's answer: never asked again
    prefetch = Prefetch(4)
    cache = TurnCache(other, prefetch)
    cache.plan("fail-x", _body("fail-x"), False)
    with pytest.raises(ServingError, match="HTTP 500"):
        cache.turn("fail-x", _body("fail-x"), False)
    assert other.sent == ["fail-x"] and prefetch.asked_alone == 0
    prefetch.close()


def test_a_server_too_slow_alone_fails_once_and_later_checks_wait_no_more() -> None:
    """Out of time alone too: that answer (its error) is the check's, and the later planned
    requests that ran out of time keep their own errors without another wait each (a hung
    server would otherwise cost one more timeout per check)."""
    client = CrowdedClient(slow_alone=True)
    prefetch = Prefetch(4)
    cache = TurnCache(client, prefetch)
    for q in ("a", "b", "c"):
        cache.plan(q, _body(q), False)
    for q in ("a", "b", "c"):
        with pytest.raises(ServingError, match="request timeout"):
            cache.turn(q, _body(q), False)
    assert client.sent.count("a") == 2  # asked again once, alone
    assert client.sent.count("b") == client.sent.count("c") == 1
    assert prefetch.asked_alone == 0
    prefetch.close()


@pytest.mark.parametrize(
    ("concurrency", "seqs", "xdist", "workers"),
    [
        (16, None, False, 16),
        (16, 4, False, 4),
        (16, 256, False, 16),
        (16, 4, True, 1),
        (1, 8, False, 1),
    ],
)
def test_plan_workers_are_capped_by_the_servers_max_num_seqs(
    concurrency: int, seqs: int | None, xdist: bool, workers: int
) -> None:
    """More in flight than the server admits only queues there, and a queued stream says
    nothing until a sequence frees (an idle timeout where alone it answers)."""
    assert plan_workers(concurrency, seqs, xdist) == workers


def _suite_module(name: str) -> Any:
    """A tests_e2e module, loaded from its file (its plan_ahead, not its checks)."""
    path = Path(__file__).resolve().parents[1] / "tests_e2e" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"suite_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RecordingRaw:
    """The raw client as a turn cache calls it: every (body, streaming) it was asked."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.asked: list[tuple[str, bool]] = []

    def body(self, messages: Any, **params: Any) -> dict[str, Any]:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return {"model": "m", "messages": messages, **params}

    def turn(self, body: dict[str, Any], streamed: bool) -> Turn:
        with self.lock:
            self.asked.append((json.dumps(body, sort_keys=True), streamed))
        return Turn(
            streamed=streamed,
            content="42",
            reasoning="17 + 25 = 42",
            reasoning_fields=("reasoning",),
            tool_calls=[],
            finish_reason="stop",
            usage=None,
            exchange=Exchange("POST", "/x"),
        )


def test_the_sdk_reasoning_twin_is_the_raw_checks_own_request() -> None:
    """The raw twin an SDK reasoning check compares with is the raw reasoning check's own
    request, asked once a session: the plan of both modules and the checks' reads send no
    request twice (a second cache asked it again: two more thinking answers to decode)."""
    reasoning = _suite_module("test_reasoning")
    via_sdk = _suite_module("test_via_sdk")
    raw, sdk = RecordingRaw(), RecordingRaw()
    prefetch = Prefetch(4)
    settings = SimpleNamespace(profile=load_profile("dgx-spark-2node"))
    turns = ReasoningTurns(raw, settings, None, prefetch)  # type: ignore[arg-type]
    fixtures = {"reasoning_turns": turns, "sdk_turns": TurnCache(sdk, prefetch)}
    request = SimpleNamespace(getfixturevalue=fixtures.__getitem__)

    def item(name: str, streamed: bool) -> Any:
        callspec = SimpleNamespace(params={"streamed": streamed})
        return SimpleNamespace(originalname=name, name=name, callspec=callspec)

    try:
        for streamed in (False, True):
            reasoning.plan_ahead(request, item("test_reasoning_separated", streamed))
            via_sdk.plan_ahead(request, item("test_sdk_reasoning", streamed))
        prefetch.drain()
        for streamed in (False, True):  # what the SDK check reads as its twins
            turns.turn("thinking", streamed)
    finally:
        prefetch.close()
    assert len(raw.asked) == len(set(raw.asked)) == 2, raw.asked  # thinking, plain and streamed
    assert sorted(s for _, s in sdk.asked) == [False, True]
    assert {body for body, _ in sdk.asked} == {body for body, _ in raw.asked}  # the same question
