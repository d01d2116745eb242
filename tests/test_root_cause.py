"""One root cause, one failure: an unreachable node is one error naming it (the checks
that need it skip citing it); the server's command line read from the container, its
process or vLLM's non-default args line; a missing parser flag is one failure quoting it;
a model's calls left in content name the model's format and the parser's."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from pytest_spark.infra.finding import Finding, Skip
from pytest_spark.infra.preflight.host_check import check_reachable
from pytest_spark.infra.servecmd import (
    MARK,
    ServerCommand,
    parse_non_default_args,
    parse_probe,
    serve_line_of,
)
from pytest_spark.infra.server.check import (
    check_reasoning_parser,
    check_tool_parser,
    missing_reasoning_parser,
    missing_tool_parser,
)
from pytest_spark.readiness.reachability import unreachable_reason
from pytest_spark.serving.client.evidence import Exchange
from pytest_spark.serving.client.turn import Turn, from_response
from pytest_spark.serving.validate.tools import ToolRequest, calls_in_content, check_tool_calls

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "fixtures" / "vllm_logs"
SERVE = (
    "vllm serve /models/Qwen3.5-122B-A10B-FP8 --served-model-name qwen3.5-122b "
    "--tensor-parallel-size 2 --reasoning-parser qwen3 --tool-call-parser qwen3_coder "
    "--enable-auto-tool-choice"
)
BARE = "vllm serve /models/Qwen3.5-122B-A10B-FP8 --tensor-parallel-size 2"


# --- unreachable node ------------------------------------------------------------------


def test_refused_names_the_node_once_and_the_fix() -> None:
    # the error text as the jump fallback wraps it: the node's name twice
    error = "spark-worker-1: spark-worker-1: SSH connection to 198.18.0.12 refused (is sshd?)"
    finding = check_reachable("spark-worker-1", "root@198.18.0.12:22", error)
    assert finding.level == "fail" and finding.node == "spark-worker-1"
    assert finding.message.startswith("spark-worker-1: unreachable over SSH at root@198.18")
    assert "spark-worker-1: spark-worker-1" not in finding.message
    assert "start sshd" in finding.message


def test_timeout_and_host_key_have_their_own_fix() -> None:
    cut = check_reachable("spark-head", "h", "spark-head: SSH connect to h timed out after 10 s")
    assert "powered on" in cut.message and cut.node == "spark-head"
    key = check_reachable("spark-head", "h", "spark-head: host key changed", host_key=True)
    assert "known_hosts" in key.message
    ok = check_reachable("spark-head", "h", None)
    assert ok.level == "pass" and ok.node == "spark-head"


def test_skip_reason_names_node_error_and_verdict() -> None:
    reason = unreachable_reason("spark-worker-1", "spark-worker-1: spark-worker-1: refused")
    assert reason == "spark-worker-1 unreachable: refused (test_node_reachable has the evidence)"


SUITE = """
import pytest
from pytest_spark.infra.preflight.host_check import check_reachable

pytestmark = pytest.mark.preflight

@pytest.mark.spark_reachability_verdict
def test_node_reachable(spark_node_unchecked, spark_cluster, spark_check):
    error = spark_cluster.unreachable(spark_node_unchecked)
    spark_check.require(
        check_reachable(spark_node_unchecked.name, "x", None if error is None else str(error))
    )

def test_needs_node(spark_node):
    pass

def test_needs_head(spark_head):
    pass
"""


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_unreachable(pytester: pytest.Pytester, port: int, *extra: str) -> pytest.RunResult:
    pytester.makepyfile(test_suite=SUITE)
    config = pytester.path / "ssh_config"
    config.write_text(f"Host 127.0.0.1\n  Port {port}\n  User root\n")
    return pytester.runpytest(
        "-rs",
        "--spark-head=127.0.0.1",
        f"--spark-ssh-config={config}",
        f"--spark-results={pytester.path / 'results.json'}",
        *extra,
    )


def test_unreachable_node_is_one_failure_and_the_rest_skip_citing_it(
    pytester: pytest.Pytester, closed_port: int
) -> None:
    result = _run_unreachable(pytester, closed_port)
    result.assert_outcomes(failed=1, skipped=2)
    result.stdout.fnmatch_lines(
        [
            "*spark-head unreachable: SSH connection to 127.0.0.1:* refused*"
            "(test_node_reachable has the evidence)*"
        ]
    )
    checks = json.loads((pytester.path / "results.json").read_text())["checks"]
    by_name = {c["nodeid"].split("::")[1]: c for c in checks}
    verdict = by_name["test_node_reachable[spark-head]"]
    assert verdict["outcome"] == "failed" and verdict["node"] == "spark-head"  # never null
    assert by_name["test_needs_node[spark-head]"]["node"] == "spark-head"


@pytest.mark.parametrize("select", [("-k", "needs"), ("-k", "not reachable"), ("-x",)])
def test_the_verdict_is_reached_whatever_the_selection(
    pytester: pytest.Pytester, closed_port: int, select: tuple[str, ...]
) -> None:
    """Issue #25 part 3: -k or -m without the reachability check gave an error per check
    ("node unreachable") and no verdict; -x stopped on a consequence. The verdict is put
    back and runs first: one failure, the others skip citing it (or, -x, never run)."""
    result = _run_unreachable(pytester, closed_port, *select)
    if select == ("-x",):
        result.assert_outcomes(failed=1)
    else:
        result.assert_outcomes(failed=1, skipped=2)
    result.stdout.fnmatch_lines(["*_ test_node_reachable[[]spark-head[]] _*"])


def test_without_the_verdict_the_checks_fail_themselves(
    pytester: pytest.Pytester, closed_port: int
) -> None:
    """No reachability check collected at all (a suite without one, or a path that leaves
    its file out): nothing else reports the node, so the first check that needs it fails
    with the whole error; issue #36 part 4: the others skip citing it (they gave one
    identical error each)."""
    pytester.makepyfile(
        test_suite="def test_needs_node(spark_node):\n    pass\n\n"
        "def test_needs_head(spark_head):\n    pass\n"
    )
    config = pytester.path / "ssh_config"
    config.write_text(f"Host 127.0.0.1\n  Port {closed_port}\n  User root\n")
    result = pytester.runpytest("-rs", "--spark-head=127.0.0.1", f"--spark-ssh-config={config}")
    result.assert_outcomes(errors=1, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "*node unreachable: spark-head: SSH connection*refused*",
            "SKIPPED*node unreachable: spark-head: SSH connection*refused*"
            "(test_needs_node[[]spark-head[]] failed on it at setup: one cause, that failure)",
        ]
    )


# A suite with the serving verdict and checks that need the server, in two categories.
SERVING_SUITE = """
import pytest

@pytest.mark.readiness
@pytest.mark.spark_serving_verdict
def test_cluster_serving(spark_api_state):
    if spark_api_state.cited is not None:
        pytest.skip(spark_api_state.cited)
    if spark_api_state.problem is not None:
        pytest.fail(spark_api_state.problem, pytrace=False)

@pytest.mark.tool_calls
@pytest.mark.parametrize("mode", ["auto", "required", "named"])
def test_tool_call(spark_api, mode):
    pass

@pytest.mark.tool_calls
def test_parallel_tool_calls(spark_api):
    pass

@pytest.mark.reasoning
@pytest.mark.parametrize("stream", ["plain", "stream"])
def test_reasoning_separated(spark_api, stream):
    pass

@pytest.mark.link
def test_link_up(spark_node):
    pass
"""


# These run in a subprocess: an in-process run drops the modules it imported (httpx, the
# plugin's stash keys), so a second one in the same test met other copies of them.
def _outcomes(result: pytest.RunResult) -> dict[str, int]:
    counts = result.parseoutcomes()
    return {k: counts.get(k, 0) for k in ("passed", "failed", "errors", "skipped")}


def _skips(result: pytest.RunResult) -> list[str]:
    """The -rs lines' reasons (one line per location, "SKIPPED [N] file:line: reason")."""
    lines = [line for line in result.outlines if line.startswith("SKIPPED [")]
    return [line.split(": ", 1)[1] for line in lines]


@pytest.mark.parametrize(
    ("select", "skipped"),
    [(("-m", "tool_calls"), 4), (("-k", "reasoning"), 2), (("-m", "tool_calls or reasoning"), 6)],
)
def test_a_refused_api_is_one_failure_whatever_the_selection(
    pytester: pytest.Pytester, closed_port: int, select: tuple[str, ...], skipped: int
) -> None:
    """Issue #36 part 4: -m tool_calls against a refused API gave 16 identical setup errors
    (-k reasoning 11): the serving verdict was deselected, so spark_api failed, and pytest
    raised that session fixture's error again for every check. It is put back: its one
    failure says "refused", every selected check skips citing it."""
    pytester.makepyfile(test_suite=SERVING_SUITE)
    result = pytester.runpytest_subprocess(
        "-rfEs", f"--spark-api-url=http://127.0.0.1:{closed_port}", *select
    )
    assert _outcomes(result) == {"passed": 0, "failed": 1, "errors": 0, "skipped": skipped}
    result.stdout.fnmatch_lines(["*_ test_cluster_serving _*", "API at *refused*"])
    reasons = _skips(result)
    assert reasons, result.outlines
    for reason in reasons:
        assert reason.startswith("the cluster is not serving: API at "), reason
        assert "refused" in reason and reason.endswith("(test_cluster_serving has the evidence)")


def test_an_unreachable_head_is_one_failure_for_the_serving_checks(
    pytester: pytest.Pytester, closed_port: int
) -> None:
    """Issue #36 part 4: -m tool_calls against an unreachable head gave 16 setup errors
    ("head unreachable"). The serving verdict and the head's reachability verdict are put
    back: the reachability check fails with its fix, the rest skip citing it."""
    verdict = SUITE.split("def test_needs_node")[0]  # test_node_reachable, in preflight
    pytester.makepyfile(test_suite=verdict + SERVING_SUITE.replace("import pytest\n", ""))
    config = pytester.path / "ssh_config"
    config.write_text(f"Host 127.0.0.1\n  Port {closed_port}\n  User root\n")
    args = ("-rfEs", "--spark-head=127.0.0.1", f"--spark-ssh-config={config}")
    for select, skipped in ((("-m", "tool_calls"), 5), (("-k", "reasoning"), 3)):
        # the serving verdict skips citing the reachability verdict, as the checks do
        result = pytester.runpytest_subprocess(*args, *select)
        assert _outcomes(result) == {"passed": 0, "failed": 1, "errors": 0, "skipped": skipped}
        result.stdout.fnmatch_lines(["FAILED*test_node_reachable[[]spark-head[]]*"])
        for reason in _skips(result):
            assert reason.startswith("spark-head unreachable: SSH connection"), reason
            assert reason.endswith("(test_node_reachable has the evidence)"), reason
    # -m link: the link checks and the reachability verdict, never the serving verdict
    result = pytester.runpytest_subprocess(*args, "-m", "link")
    assert _outcomes(result) == {"passed": 0, "failed": 1, "errors": 0, "skipped": 1}
    result.stdout.no_fnmatch_line("*test_cluster_serving*")


def test_without_the_serving_verdict_a_refused_api_is_one_error(
    pytester: pytest.Pytester, closed_port: int
) -> None:
    """A path that leaves the serving verdict out (tests_e2e/test_tool_calls.py alone):
    the first check fails at setup with the whole error, the others skip citing it, not
    the session fixture's error again for each."""
    pytester.makepyfile(
        test_suite="import pytest\n\n"
        '@pytest.mark.parametrize("mode", ["auto", "required", "named"])\n'
        "def test_tool_call(spark_api, mode):\n    pass\n"
    )
    result = pytester.runpytest_subprocess(
        "-rfEs", f"--spark-api-url=http://127.0.0.1:{closed_port}"
    )
    assert _outcomes(result) == {"passed": 0, "failed": 0, "errors": 1, "skipped": 2}
    result.stdout.fnmatch_lines(["ERROR*test_tool_call[[]auto[]]*"])
    assert _skips(result) == [
        f"API at http://127.0.0.1:{closed_port} not reachable: ConnectError: [Errno 111] "
        "Connection refused: nothing listens there, or the URL's host or port is wrong "
        "(--spark-api-url) (test_tool_call[auto] failed on it at setup: one cause, that failure)"
    ]


def test_a_crash_in_a_session_fixture_still_errors_every_time(pytester: pytest.Pytester) -> None:
    """Only verdicts (pytest.fail) are folded: a session fixture that dies of an exception
    errors every check that uses it, as before (a crash stays visible)."""
    pytester.makepyfile(
        test_suite="import pytest\n\n"
        '@pytest.fixture(scope="session")\n'
        "def broken():\n    raise RuntimeError('boom')\n\n"
        "def test_a(broken):\n    pass\n\n"
        "def test_b(broken):\n    pass\n"
    )
    from pytest_spark.verdict import RepeatedSetupFailure

    result = pytester.runpytest_inprocess(plugins=[RepeatedSetupFailure()])
    assert _outcomes(result) == {"passed": 0, "failed": 0, "errors": 2, "skipped": 0}


LOST_CONFTEST = """
from pytest_spark.state import CLUSTER_KEY


class Conn:
    closed = 0

    def close(self):
        self.closed += 1


class Node:
    def __init__(self, name, address):
        self.name, self.address, self._error, self.conn = name, address, None, Conn()


class Cluster:
    def __init__(self):
        self.nodes = [Node("spark-head", "198.18.0.11"), Node("spark-worker-1", "198.18.0.12")]

    def node(self, name):
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def unreachable(self, node):
        return node._error

    def mark_lost(self, node, error):
        node._error = error
        node.conn.close()

    def close(self):
        pass


def pytest_configure(config):
    config.stash[CLUSTER_KEY] = Cluster()
"""

LOST_SUITE = """
import pytest
from pytest_spark.access.base import NodeUnreachable
from pytest_spark.readiness.reachability import require_reachable
from pytest_spark.state import CLUSTER_KEY


def test_1_meets_the_cut(request):
    raise NodeUnreachable("spark-worker-1", "SSH session lost: Socket is closed")


def test_2_meets_it_again():
    raise NodeUnreachable("spark-worker-1", "connection lost while running: uptime")


def test_3_needs_the_worker(request):
    cluster = request.config.stash[CLUSTER_KEY]
    require_reachable(request.config, cluster, [cluster.node("spark-worker-1")])


def test_4_head_still_answers(request):
    cluster = request.config.stash[CLUSTER_KEY]
    require_reachable(request.config, cluster, [cluster.node("spark-head")])
    assert cluster.node("spark-worker-1").conn.closed == 1


def test_5_not_a_node_of_the_cluster():
    raise NodeUnreachable("elsewhere", "refused")
"""


def test_a_node_lost_mid_session_is_one_failure_and_later_checks_skip_citing_it(
    pytester: pytest.Pytester,
) -> None:
    """A node that answered at connect and is cut during the checks: the check that meets
    it first fails naming it, the last error and what to check (no traceback); a later
    check that meets it, or needs it, skips citing that check; other nodes go on."""
    pytester.makeconftest(LOST_CONFTEST)
    pytester.makepyfile(test_lost=LOST_SUITE)
    result = pytester.runpytest("-rfs", "--spark-head=198.18.0.11", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=2, skipped=2, passed=1)
    out = result.stdout.str()
    failure = (
        "spark-worker-1: lost during this check: SSH session lost: Socket is closed. It "
        "answered when the session connected. Check its management link (ping 198.18.0.12) "
        "and sshd on it; every later check that needs spark-worker-1 is skipped citing this one."
    )
    result.stdout.fnmatch_lines([failure])
    cited = "spark-worker-1 lost during test_lost.py::test_1_meets_the_cut: SSH session lost"
    assert out.count(cited) == 2, out  # test_2 and test_3
    first = out.split("_ test_5_not_a_node_of_the_cluster _")[0]
    assert "During handling" not in first and "NodeUnreachable" not in first, out
    assert "NodeUnreachable: elsewhere: refused" in out  # not ours to judge: as raised


# --- the server's command line ---------------------------------------------------------


def _probe(inspect: str = "", top: str = "", log: str = "") -> str:
    return f"{MARK}inspect\n{inspect}\n{MARK}top\n{top}\n{MARK}log\n{log}\n"


def test_container_command_that_is_vllm_serve() -> None:
    argv = json.dumps(SERVE.split()[1:])
    cmd = parse_probe(_probe(inspect=f'"vllm" {argv}'), None)
    assert cmd is not None and cmd.source == "the container's command"
    assert cmd.args.reasoning_parser == "qwen3" and cmd.args.tool_call_parser == "qwen3_coder"


def test_bash_c_command_is_read_inside_its_string() -> None:
    assert serve_line_of(["/bin/bash", "-c", f"source .env && {BARE}"]) == BARE


def test_sleep_infinity_container_reads_the_exec_process() -> None:
    """The launcher's docker exec model: the container sleeps, vllm serve is a process."""
    top = f"COMMAND\nsleep infinity\n/opt/venv/bin/python3 /opt/venv/bin/{BARE}\n"
    cmd = parse_probe(_probe(inspect='"sleep" ["infinity"]', top=top), SERVE)
    assert cmd is not None and cmd.source == "the vllm serve process"
    assert cmd.line == BARE and cmd.args.reasoning_parser is None


def test_real_non_default_args_line() -> None:
    line = next(
        x
        for x in (LOGS / "vllm-0.32.0-cpu-smollm2.log").read_text().splitlines()
        if "non-default args" in x
    )
    args = parse_non_default_args(line)
    assert args is not None
    assert args.tool_call_parser == "hermes" and args.auto_tool_choice
    assert args.reasoning_parser is None and args.served_names == ("smollm2",)
    cmd = parse_probe(_probe(inspect='"sleep" ["infinity"]', top="COMMAND\nsleep", log=line), None)
    assert cmd is not None and cmd.source == "vLLM's non-default args line"
    assert cmd.line.startswith("non-default args: {'model_tag'")


def test_falls_back_to_the_launch_args_then_to_nothing() -> None:
    gone = _probe(inspect="Error: No such object: vllm_node", top="Error", log="")
    cmd = parse_probe(gone, SERVE)
    assert cmd is not None and cmd.source == "--spark-serve-args"
    assert parse_probe(gone, None) is None


def _cmd(line: str) -> ServerCommand:
    cmd = parse_probe(_probe(inspect='"vllm" ' + json.dumps(line.split()[1:])), None)
    assert cmd is not None
    return cmd


def test_missing_reasoning_parser_is_one_failure_quoting_the_line() -> None:
    finding = check_reasoning_parser(_cmd(BARE), expected=True, profile="spark")
    assert isinstance(finding, Finding) and finding.level == "fail"
    assert "without --reasoning-parser" in finding.message and BARE in finding.message
    assert "the container's command" in finding.message
    reason = missing_reasoning_parser(_cmd(BARE), expected=True)
    assert reason and "test_server_has_reasoning_parser" in reason
    assert missing_reasoning_parser(_cmd(SERVE), expected=True) is None
    assert check_reasoning_parser(_cmd(SERVE), expected=True, profile="spark").ok  # type: ignore[union-attr]


def test_profile_that_expects_no_parser_skips_with_the_reason() -> None:
    skip = check_reasoning_parser(_cmd(BARE), expected=False, profile="vllm-cpu")
    assert isinstance(skip, Skip) and "reasoning.expected = false" in skip.reason
    assert missing_reasoning_parser(_cmd(BARE), expected=False) is None
    skip = check_tool_parser(_cmd(BARE), expected=False, profile="vllm-cpu")
    assert isinstance(skip, Skip) and "tool_calls.expected = false" in skip.reason


def test_missing_tool_flags_name_each_flag() -> None:
    half = BARE + " --tool-call-parser hermes"
    finding = check_tool_parser(_cmd(half), expected=True, profile="spark")
    assert isinstance(finding, Finding) and finding.level == "fail"
    assert "without --enable-auto-tool-choice," in finding.message and half in finding.message
    both = check_tool_parser(_cmd(BARE), expected=True, profile="spark")
    assert "--enable-auto-tool-choice and --tool-call-parser" in both.message  # type: ignore[union-attr]
    assert missing_tool_parser(_cmd(SERVE), expected=True) is None
    assert "test_server_has_tool_parser" in (missing_tool_parser(_cmd(half), expected=True) or "")


# --- tool calls in content -------------------------------------------------------------


def _content_turn(content: str) -> Turn:
    msg = {"role": "assistant", "content": content}
    data = {"id": "c1", "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}]}
    return from_response(data, Exchange("POST", "http://x/v1/chat/completions"))


WEATHER = {"type": "function", "function": {"name": "get_weather"}}
REQ = ToolRequest((WEATHER,), "auto", ("get_weather",))


def test_calls_in_content_name_the_models_format_and_the_parsers() -> None:
    xml = (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    said = calls_in_content(_content_turn(xml), REQ, parser="hermes")
    assert said is not None and "qwen3_coder format" in said and "--tool-call-parser hermes" in said
    as_json = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
    said = calls_in_content(_content_turn(as_json), REQ, parser="hermes")
    assert said is not None and "llama3_json format" in said and "<tool_call>{" in said
    assert calls_in_content(_content_turn("It is sunny."), REQ) is None
    message = check_tool_calls(_content_turn(as_json), REQ, parser="hermes").message
    assert "written into content as JSON" in message and "llama3_json format" in message


def test_socket_ifname_names_interfaces_unless_it_excludes() -> None:
    from pytest_spark.infra.nccl.gather import named_interfaces

    assert named_interfaces("enp1s0f1np1") == ["enp1s0f1np1"]
    assert named_interfaces("=enp1s0f1np1,enP2p1s0f1np1") == ["enp1s0f1np1", "enP2p1s0f1np1"]
    assert named_interfaces("^docker0,lo") == []


def test_a_worker_behind_a_head_with_an_unknown_key_skips_citing_the_head() -> None:
    """Issue #25 part 4: with an empty known_hosts the head's reachability check fails
    with the ssh-keyscan fix; the worker, reached through the head as its jump host, got
    the head's HostKeyError and failed as well. It skips citing the head's check."""
    from pytest_spark.access.base import HostKeyError, NodeUnreachable
    from pytest_spark.readiness.reachability import through_unreachable_jump

    head_key = HostKeyError(
        "spark-head", "host key of spark-head (10.0.0.1:22) is not in ~/.ssh/known_hosts"
    )
    reason = through_unreachable_jump("spark-worker-1", head_key, ["spark-head"])
    assert reason is not None
    assert reason.startswith("spark-worker-1 is reached through spark-head (its jump host)")
    assert "host key of spark-head" in reason and "spark-head: host key" not in reason
    assert reason.endswith("(test_node_reachable[spark-head] has the evidence)")
    # the head's own check, and a worker's own error, are theirs
    assert through_unreachable_jump("spark-head", head_key, ["spark-worker-1"]) is None
    own = NodeUnreachable("spark-worker-1", "SSH connection refused")
    assert through_unreachable_jump("spark-worker-1", own, ["spark-head"]) is None
    # an error naming a node the suite reaches (or no cluster node) is not a cited cause
    assert through_unreachable_jump("spark-worker-1", head_key, []) is None


def test_the_heads_engine_killed_says_so_in_the_serving_failure() -> None:
    """Issue #25 part 4: with the head's engine killed, test_cluster_serving said only
    "Connection refused" with evidence {}; the container state and the head's last log
    lines were elsewhere. The failure carries them again."""
    from pytest_spark.readiness.serving import head_account

    refused = (
        "API at http://10.0.0.1:8000 not reachable: ConnectError: [Errno 111] Connection refused"
    )
    lines = [f"INFO line {i}" for i in range(30)] + ["", "Killed"]
    message, evidence = head_account(refused, "spark-head", "vllm_node", "exited (code 137)", lines)
    assert message.startswith(refused)
    assert "spark-head: container 'vllm_node' exited (code 137)" in message
    assert "docker logs vllm_node` on spark-head" in message
    assert "spark-head log (last 15 lines):" in message and "    Killed" in message
    assert "INFO line 15" not in message and "INFO line 16" in message
    assert evidence["container"] == "spark-head: container 'vllm_node' exited (code 137)"
    assert evidence["spark-head log"].endswith("Killed")
    # the readiness watch's message already names the container: kept as it is
    watch = "serving container exited on spark-head: container vllm_node exited (code 137)"
    assert head_account(watch, "spark-head", "vllm_node", "exited (code 137)", lines) == (watch, {})
    # docker not answering on the head: nothing to add
    assert head_account(refused, "spark-head", "vllm_node", "unknown", []) == (refused, {})
    running = head_account(refused, "spark-head", "vllm_node", "running", lines)
    assert running == (refused, {})  # a running engine is not the story (an API key, a proxy)


class _Item:
    def __init__(self, name: str, verdict: bool = False, nodes: bool = True) -> None:
        self.name, self.verdict, self.nodes = name, verdict, nodes

    def get_closest_marker(self, name: str) -> object | None:
        return object() if self.verdict and name == "spark_reachability_verdict" else None


def test_the_reachability_verdict_runs_first_whatever_the_selection() -> None:
    """Issue #25 part 3: with -m link the reachability verdict was not selected (11 errors
    said "node unreachable", 4 "check cables"); with -x the run stopped on a cable error.
    The verdicts are put back when a selected check needs the nodes, and run first."""
    from pytest_spark.readiness.reachability import verdicts_first

    head = _Item("test_node_reachable[spark-head]", verdict=True)
    worker = _Item("test_node_reachable[spark-worker-1]", verdict=True)
    link = [_Item("test_mtu_consistent[twin0]"), _Item("test_link_up[spark-head-twin0]")]

    def needs(item: object) -> bool:
        return bool(getattr(item, "nodes", False))

    def names(items: list) -> list[str]:
        return [i.name for i in items]

    # -m link: the verdicts were deselected; they come back, first
    got = verdicts_first(list(link), [head, worker], needs)  # type: ignore[arg-type]
    assert names(got) == [head.name, worker.name, *names(link)]
    # the whole suite: the verdicts move ahead of tests_infra/test_links.py (-x stops there)
    got = verdicts_first([*link, head, worker], [], needs)  # type: ignore[list-item]
    assert names(got) == [head.name, worker.name, *names(link)]
    # nothing selected needs the nodes (-m tool_calls against --spark-api-url): not added
    api = [_Item("test_tool_call[auto-plain]", nodes=False)]
    assert verdicts_first(list(api), [head], needs) == api  # type: ignore[arg-type]


def test_a_verdict_put_back_is_not_counted_as_deselected() -> None:
    """pytest's header and summary counted the verdict put back by -m link as deselected
    ("1 deselected") while it ran."""
    from types import SimpleNamespace

    from pytest_spark.readiness.reachability import VerdictFirst

    head = _Item("test_node_reachable[spark-head]", verdict=True)
    other = _Item("test_tool_call[auto-plain]", nodes=False)
    link = [_Item("test_link_up[spark-head-twin0]")]
    reporter = SimpleNamespace(stats={"deselected": [head, other]})
    config = SimpleNamespace(pluginmanager=SimpleNamespace(get_plugin=lambda name: reporter))
    hooks = VerdictFirst(lambda item: bool(getattr(item, "nodes", False)))
    hooks.pytest_deselected([head, other])  # type: ignore[list-item]
    items = list(link)
    hooks.pytest_collection_modifyitems(config, items)  # type: ignore[arg-type]
    assert items == [head, *link]
    assert reporter.stats["deselected"] == [other]


# --- one cause on several nodes ----------------------------------------------------------

ACROSS = """
import pytest
from pytest_spark.infra.finding import Finding
from pytest_spark.verdict import SparkCheck, require_once_across_nodes

NAMES = ["spark-head", "spark-worker-1", "spark-worker-2"]
LIMITS = {LIMITS}
UNREACHABLE = {UNREACHABLE}


class Node:
    def __init__(self, name):
        self.name = name


class Cluster:
    nodes = [Node(n) for n in NAMES]

    def unreachable(self, node):
        return "down" if node.name in UNREACHABLE else None


def judge(node):
    hard = LIMITS[node.name]
    pid = 80 + NAMES.index(node.name)  # a dockerd's pid differs on every node
    measured = {"dockerd_pid": pid, "dockerd_nofile_hard": hard}
    if hard >= 65535:
        return Finding.passed(measured, 65535, node=node.name, message=f"{node.name}: ok")
    return Finding.failed(
        measured,
        {"dockerd_nofile_hard_min": 65535},
        node=node.name,
        message=f"{node.name}: dockerd (pid {pid}) runs with hard {hard}: expected 65535. "
        "Fix: LimitNOFILE=1048576",
    )


@pytest.mark.parametrize("_spark_node", NAMES)
@pytest.mark.parametrize("twin", ["twin0"])
def test_fd(request, _spark_node, twin):
    node = next(n for n in Cluster.nodes if n.name == _spark_node)
    require_once_across_nodes(request, SparkCheck(request.node), Cluster(), node, judge)
"""


def _across(
    pytester: pytest.Pytester, limits: dict[str, int], *args: str, unreachable: tuple = ()
) -> tuple[dict[str, int], dict[str, str], list[str]]:
    pytester.makepyfile(
        test_across=ACROSS.replace("{LIMITS}", repr(limits)).replace(
            "{UNREACHABLE}", repr(list(unreachable))
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:spark", "-rfs", *args)
    failed = {}
    for line in result.outlines:
        if line.startswith("spark-") and ": dockerd" in line:
            failed[line.split(" ", 1)[0].split(":", 1)[0]] = line
    return _outcomes(result), failed, _skips(result)


def test_the_same_failure_on_several_nodes_is_one_failure(pytester: pytest.Pytester) -> None:
    """Issue #36 part 4: the same dockerd open-files limit on both nodes gave 2 identical
    failures. The first node fails naming the others (the pid differs, the cause does
    not), the others skip citing it; a node with another value fails on its own."""
    limits = {"spark-head": 4096, "spark-worker-1": 4096, "spark-worker-2": 8192}
    outcomes, failed, skips = _across(pytester, limits)
    assert outcomes == {"passed": 0, "failed": 2, "errors": 0, "skipped": 1}
    assert failed["spark-head"].startswith(
        "spark-head (and spark-worker-1, the same: one cause, this failure; fix it there "
        "too): dockerd (pid 80) runs with hard 4096"
    )
    assert failed["spark-worker-2"].startswith("spark-worker-2: dockerd (pid 82)")
    assert skips == [
        "spark-worker-1: the same failure as on spark-head (dockerd (pid 81) runs with hard "
        "4096: expected 65535. Fix: LimitNOFILE=1048576): one cause, "
        "test_fd[twin0-spark-head] has the evidence"
    ]
    # all three alike: one failure naming both others
    every = dict.fromkeys(limits, 4096)
    outcomes, failed, skips = _across(pytester, every)
    assert outcomes == {"passed": 0, "failed": 1, "errors": 0, "skipped": 2}
    assert "spark-head (and spark-worker-1, spark-worker-2, the same" in failed["spark-head"]


def test_the_first_node_in_the_session_owns_the_cause(pytester: pytest.Pytester) -> None:
    """-k leaves the head's check out: the first node whose check runs fails naming the
    others (nothing else reports it); an unreachable node is not the same cause (its
    reachability check has it) and a passing one is no cause at all."""
    limits = {"spark-head": 4096, "spark-worker-1": 4096, "spark-worker-2": 4096}
    outcomes, failed, skips = _across(pytester, limits, "-k", "worker")
    assert outcomes == {"passed": 0, "failed": 1, "errors": 0, "skipped": 1}
    assert failed["spark-worker-1"].startswith(
        "spark-worker-1 (and spark-head, spark-worker-2, the same: one cause"
    )
    assert skips[0].endswith("one cause, test_fd[twin0-spark-worker-1] has the evidence")
    outcomes, failed, _ = _across(pytester, limits, unreachable=("spark-worker-2",))
    # worker-2 is left out of the head's failure; its own check fails alone here (in a
    # real run the spark_node fixture skips it first, citing test_node_reachable)
    assert outcomes == {"passed": 0, "failed": 2, "errors": 0, "skipped": 1}
    assert "spark-head (and spark-worker-1, the same" in failed["spark-head"]
    assert failed["spark-worker-2"].startswith("spark-worker-2: dockerd")
    healthy = {"spark-head": 65535, "spark-worker-1": 4096, "spark-worker-2": 65535}
    outcomes, failed, _ = _across(pytester, healthy)
    assert outcomes == {"passed": 2, "failed": 1, "errors": 0, "skipped": 0}
    assert failed["spark-worker-1"].startswith("spark-worker-1: dockerd (pid 81)")
