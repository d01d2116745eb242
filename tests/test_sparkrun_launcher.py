"""``--spark-launcher=sparkrun`` (launchers/sparkrun.py) against a scripted sparkrun
CLI and scripted nodes: the command it runs (and never ``--trust``), what teardown needs
saved before sparkrun starts, a failed start in sparkrun's own words, ``sparkrun stop``
always, an interrupted start stopped, a job already running refused; and the launcher
table both launchers sit in. The real CLI against sparksim (attached, then launched):
tests/sim_serving/test_real_sparkrun.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conn_fakes import FakeConn

from pytest_spark.access.cluster import Cluster, Node
from pytest_spark.access.files import write_json
from pytest_spark.launchers.base import LaunchError
from pytest_spark.launchers.launch_cluster.launcher import LaunchClusterSh
from pytest_spark.launchers.registry import LAUNCHERS
from pytest_spark.launchers.sparkrun import (
    SparkrunLauncher,
    own_words,
    recipe_file,
    sparkrun_binary,
    ssh_options,
    stop_matching_args,
    write_ssh_shim,
)
from pytest_spark.readiness.launch import STATE, stop_if_launched
from pytest_spark.settings.options import OPTIONS_BY_ATTR
from pytest_spark.settings.parsers import LAUNCHER_NAMES

CID = "sparkrun_123aff89c7975891_5e2f1ae6011a"
HOSTS = "198.18.0.11,198.18.0.12"
# sparkrun 0.4.2's words for an image no node has, under --offline (run here, 12-05)
OFFLINE_GAP = """\
sparkrun v0.4.2

[1/6] Preparing
Error: launch_inference failed: Offline launch cannot proceed; not present anywhere it could be copied from:
  image vllm-node:missing: missing on 198.18.0.11, 198.18.0.12 (checked: the head (198.18.0.11), this machine)
Fix: run once online (or with --online), sync from a connected machine (`sparkrun setup sync`), or pre-place the weights (cluster cache_dir).
"""  # noqa: E501
READY = f"""\
[5/6] Launching vllm runtime
  done (14.7s)
Cluster:   {CID}

[sparkrun] Inference ready at http://198.18.0.11:8000/v1; container-start TTR port-open 13.841s, HTTP-ready 13.878s, TTFT 14.188s (sparkrun-rank0-v1, rank 0)
[6/6] Post-launch hooks — skipped
"""  # noqa: E501


# -- a scripted sparkrun and scripted nodes ---------------------------------------------------
def fake_sparkrun(tmp_path: Path, output: str, rc: int = 0, sleep: float = 0) -> Path:
    """A ``sparkrun`` that records its argv (calls.txt), prints ``output`` and exits ``rc``;
    with ``sleep`` it waits first, writing ``interrupted`` when it gets SIGINT."""
    out = tmp_path / "output.txt"
    out.write_text(output)
    script = tmp_path / "sparkrun"
    script.write_text(
        "#!/bin/bash\n"
        f'echo "$*" >> {tmp_path}/calls.txt\n'
        f"trap 'touch {tmp_path}/interrupted; exit 130' INT\n"
        f'if [ "$1" = run ] && [ {sleep} != 0 ]; then sleep {sleep} & wait; fi\n'
        f'if [ "$1" = run ]; then cat {out}; exit {rc}; fi\n'
        'echo "Workload stopped on 2 host(s)."\n'
    )
    script.chmod(0o755)
    return script


class FakeCluster(Cluster):
    """Two nodes at the sim's addresses; ``docker ps`` answers from ``containers``
    (node -> lines), every other command succeeds silently."""

    def __init__(self, containers: Callable[[str, str], str] | None = None) -> None:
        self.containers = containers or (lambda node, command: "")

        def answer(name: str) -> Callable[[str], tuple[int, str, str]]:
            return lambda command: (0, self.containers(name, command), "")

        self.nodes = [
            Node(name, role, addr, FakeConn(name, answer(name)))  # type: ignore[arg-type]
            for name, role, addr in (
                ("spark-head", "head", "198.18.0.11"),
                ("spark-worker-1", "worker", "198.18.0.12"),
            )
        ]
        self._connected = True
        self._cache = {}
        self._cache_lock = threading.Lock()
        self._key_locks = {}


def fake_settings(sparkrun: Path | None, recipe: Path | None, **values: Any) -> Any:
    base: dict[str, Any] = {
        "sparkrun": sparkrun,
        "recipe": None
        if recipe is None
        else SimpleNamespace(origin=f"recipe {recipe}", runtime="vllm-distributed"),
        "sparkrun_args": (),
        "ssh_config": Path("~/.ssh/config"),
        "ssh_key": None,
        "user": None,
        "ready_timeout": 60.0,
        "launcher": "sparkrun",
    }
    base.update(values)
    return SimpleNamespace(**base, source=lambda attr: "command line")


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text('recipe_version: "2"\nmodel: m\nruntime: vllm-distributed\n')
    return path


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls.txt"
    return path.read_text().splitlines() if path.exists() else []


# -- the table and the option -----------------------------------------------------------------
def test_both_launchers_are_in_one_table_and_launch_cluster_stays_the_default() -> None:
    assert set(LAUNCHERS) == {"launch-cluster", "sparkrun"}
    assert LAUNCHERS["launch-cluster"] is LaunchClusterSh
    assert LAUNCHERS["sparkrun"] is SparkrunLauncher
    # the option's choices (settings imports nothing of launchers) are the registry's names
    assert set(LAUNCHER_NAMES) == set(LAUNCHERS)
    option = OPTIONS_BY_ATTR["launcher"]
    assert option.default == "launch-cluster"
    assert option.parse("launch-cluster.sh") == "launch-cluster"
    assert option.parse(" Sparkrun ") == "sparkrun"
    with pytest.raises(ValueError, match=r"launch-cluster .* or sparkrun"):
        option.parse("ray")
    assert OPTIONS_BY_ATTR["sparkrun_args"].parse("--no-auto-detect -o 'a=b c'") == (
        "--no-auto-detect",
        "-o",
        "a=b c",
    )


# -- stand up ---------------------------------------------------------------------------------
def test_the_run_is_sparkruns_own_command_line_and_never_trust(
    tmp_path: Path, recipe: Path
) -> None:
    sparkrun = fake_sparkrun(tmp_path, READY)
    settings = fake_settings(sparkrun, recipe, sparkrun_args=("--no-auto-detect",))
    recorded: list[dict[str, Any]] = []
    notices: list[str] = []
    launcher = SparkrunLauncher(FakeCluster(), settings, tmp_path)
    stood = launcher.stand_up(lambda d: recorded.append(dict(d)), notices.append)
    assert calls(tmp_path) == [
        f"run {recipe} --hosts {HOSTS} --offline --no-follow --no-auto-detect"
    ]
    assert "--trust" not in launcher.describe()
    assert launcher.job == CID and launcher.serve_log() is None  # no process on the head
    assert (stood.mode, stood.mode_source) == ("no-ray", "the recipe's runtime vllm-distributed")
    # what teardown needs, saved before sparkrun ran; the job's id once it said it
    assert recorded[0]["launcher"] == "sparkrun" and recorded[0]["hosts"] == HOSTS
    assert recorded[0]["recipe"] == str(recipe) and "cluster_id" not in recorded[0]
    assert recorded[-1] == {"cluster_id": CID}
    assert f"sparkrun: Cluster:   {CID}" in notices
    assert any("Inference ready" in n for n in notices)


def test_a_failed_start_is_one_error_in_sparkruns_words(tmp_path: Path, recipe: Path) -> None:
    sparkrun = fake_sparkrun(tmp_path, OFFLINE_GAP, rc=1)
    recorded: list[dict[str, Any]] = []
    launcher = SparkrunLauncher(FakeCluster(), fake_settings(sparkrun, recipe), tmp_path)
    with pytest.raises(LaunchError) as info:
        launcher.stand_up(lambda d: recorded.append(dict(d)))
    text = str(info.value)
    first = text.splitlines()[0]
    assert first == (
        "sparkrun run exited 1: launch_inference failed: Offline launch cannot proceed; not "
        "present anywhere it could be copied from:"
    )
    assert "image vllm-node:missing: missing on 198.18.0.11, 198.18.0.12" in text
    assert "Fix: run once online" in text
    assert "sparkrun v0.4.2" not in text  # its banner is not its account
    assert recorded and recorded[0]["launcher"] == "sparkrun"  # teardown still runs stop


def test_no_sparkrun_and_no_recipe_say_what_to_give(tmp_path: Path, recipe: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    old = os.environ["PATH"]
    os.environ["PATH"] = str(empty)
    try:
        with pytest.raises(LaunchError, match=r"no sparkrun on PATH.*--spark-sparkrun=PATH"):
            sparkrun_binary(fake_settings(None, recipe))
    finally:
        os.environ["PATH"] = old
    with pytest.raises(LaunchError, match=r"--spark-sparkrun=.*not an executable file"):
        sparkrun_binary(fake_settings(recipe, recipe))
    with pytest.raises(LaunchError, match="give --spark-recipe=PATH"):
        recipe_file(fake_settings(None, None))
    assert recipe_file(fake_settings(None, recipe)) == recipe.resolve()


def test_a_running_sparkrun_job_is_refused(tmp_path: Path, recipe: Path) -> None:
    def running(node: str, command: str) -> str:
        assert command.startswith("docker ps --filter") and " -a " not in command
        return f"{CID} {CID}_node_0\n" if node == "spark-head" else ""

    sparkrun = fake_sparkrun(tmp_path, READY)
    launcher = SparkrunLauncher(FakeCluster(running), fake_settings(sparkrun, recipe), tmp_path)
    with pytest.raises(LaunchError) as info:
        launcher.stand_up(lambda d: None)
    assert f"spark-head: {CID} {CID}_node_0" in str(info.value)
    assert f"sparkrun stop {CID} --hosts {HOSTS}" in str(info.value)
    assert calls(tmp_path) == []  # sparkrun never ran


def test_an_interrupted_start_is_stopped_and_the_interrupt_goes_on(
    tmp_path: Path, recipe: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (or SIGTERM, which roles.py turns into one) while sparkrun runs: the run gets
    sparkrun's own SIGINT, and the interrupt reaches the session, whose teardown stops."""
    sparkrun = fake_sparkrun(tmp_path, READY, sleep=30)
    launcher = SparkrunLauncher(FakeCluster(), fake_settings(sparkrun, recipe), tmp_path)

    def interrupted(proc: subprocess.Popen[bytes], deadline: float) -> int | None:
        start = time.monotonic()
        while not calls(tmp_path) and time.monotonic() - start < 10:
            time.sleep(0.05)
        raise KeyboardInterrupt

    monkeypatch.setattr(SparkrunLauncher, "_wait", staticmethod(interrupted))
    recorded: list[dict[str, Any]] = []
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        launcher.stand_up(lambda d: recorded.append(dict(d)))
    assert (tmp_path / "interrupted").exists()
    assert time.monotonic() - start < 15
    assert recorded[0]["launcher"] == "sparkrun"


# -- tear down --------------------------------------------------------------------------------
def state(sparkrun: Path, recipe: Path, **more: Any) -> dict[str, Any]:
    return {
        "launched": True,
        "launcher": "sparkrun",
        "sparkrun": str(sparkrun),
        "recipe": str(recipe),
        "hosts": HOSTS,
        "stop_matching": [],
        "path_prefix": None,
        **more,
    }


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def sleep(self, s: float) -> None:
        self.t += s

    def now(self) -> float:
        return self.t


def test_teardown_is_sparkrun_stop_of_the_job(tmp_path: Path, recipe: Path) -> None:
    sparkrun = fake_sparkrun(tmp_path, READY)
    write_json(tmp_path / STATE, state(sparkrun, recipe, cluster_id=CID))
    clock = Clock()
    assert (
        stop_if_launched(FakeCluster(), tmp_path, keep=False, sleep=clock.sleep, now=clock.now)
        is None
    )
    assert calls(tmp_path) == [f"stop {CID} --hosts {HOSTS}"]
    # once stopped, never again
    assert stop_if_launched(FakeCluster(), tmp_path, keep=False) is None
    assert len(calls(tmp_path)) == 1


def test_teardown_says_what_sparkrun_stop_left(tmp_path: Path, recipe: Path) -> None:
    sparkrun = fake_sparkrun(tmp_path, READY)
    write_json(tmp_path / STATE, state(sparkrun, recipe, cluster_id=CID))

    def stuck(node: str, command: str) -> str:
        return f"{CID}_node_1 (removing)\n" if node == "spark-worker-1" else ""

    clock = Clock()
    problem = stop_if_launched(FakeCluster(stuck), tmp_path, False, clock.sleep, clock.now)
    assert problem is not None
    assert f"spark-worker-1: {CID}_node_1 (removing)" in problem
    assert clock.t >= 30  # dockerd was given its time to remove a --rm container


def test_an_interrupted_start_is_stopped_by_the_job_its_recipe_left(
    tmp_path: Path, recipe: Path
) -> None:
    """No job id was printed: the id is read off the recipe's label on the nodes."""
    sparkrun = fake_sparkrun(tmp_path, READY)
    write_json(tmp_path / STATE, state(sparkrun, recipe))

    def labelled(node: str, command: str) -> str:
        if f"label=sparkrun.recipe={recipe}" in command and node == "spark-head":
            return f"{CID}\n"
        return ""

    clock = Clock()
    assert stop_if_launched(FakeCluster(labelled), tmp_path, False, clock.sleep, clock.now) is None
    assert calls(tmp_path) == [f"stop {CID} --hosts {HOSTS}"]


def test_nothing_started_is_nothing_to_stop(tmp_path: Path, recipe: Path) -> None:
    """The start failed before any container: ``sparkrun stop RECIPE`` (with the run's
    matching flags) answers that no workload matches, which is no problem."""
    script = tmp_path / "sparkrun"
    script.write_text(
        f'#!/bin/sh\necho "$*" >> {tmp_path}/calls.txt\n'
        "echo \"Error: No running workload matches intent 0b77 on hosts ['a', 'b']\"\nexit 1\n"
    )
    script.chmod(0o755)
    write_json(tmp_path / STATE, state(script, recipe, stop_matching=["--port", "9000"]))
    assert stop_if_launched(FakeCluster(), tmp_path, keep=False) is None
    assert calls(tmp_path) == [f"stop {recipe} --port 9000 --hosts {HOSTS}"]


# -- sparkrun's words, its flags, its ssh ------------------------------------------------------
def test_own_words() -> None:
    headline, lines = own_words(OFFLINE_GAP)
    assert headline.startswith("launch_inference failed: Offline launch cannot proceed")
    assert lines.splitlines()[-1].strip().startswith("Fix:")
    logged = "a\n12:00 [ERROR] sparkrun.x: Head node failed to become ready on h.\nb\n"
    assert (
        own_words(logged)[0] == "12:00 [ERROR] sparkrun.x: Head node failed to become ready on h."
    )
    assert own_words("one\ntwo\n")[1] == "    one\n    two"
    assert own_words("")[0] == "it printed nothing"


def test_stop_gets_the_runs_matching_flags() -> None:
    args = ("--no-auto-detect", "--port", "9000", "--tp=2", "-o", "x=1", "--served-model-name", "m")
    assert stop_matching_args(args) == ["--port", "9000", "--tp=2", "--served-model-name", "m"]


@pytest.mark.skipif(shutil.which("ssh") is None, reason="no ssh client")
def test_sparkruns_plain_ssh_reads_the_suites_ssh_config(tmp_path: Path) -> None:
    """``ssh -G`` prints what ssh would use without connecting: through the shim, the
    suite's ssh_config's IdentityFile and the suite's user."""
    config = tmp_path / "ssh_config"
    config.write_text("Host spark-a\n    HostName 198.18.0.11\n    IdentityFile /keys/id_sim\n")
    settings = fake_settings(None, None, ssh_config=config, user="ops")
    opts = ssh_options(settings)
    assert opts == ["-F", str(config), "-l", "ops"]
    shim = write_ssh_shim(tmp_path / "shim", opts)
    assert shim is not None
    out = subprocess.run(
        [str(shim / "ssh"), "-G", "spark-a"], capture_output=True, text=True, timeout=10
    ).stdout
    assert "hostname 198.18.0.11" in out and "identityfile /keys/id_sim" in out
    assert "user ops" in out
    assert ssh_options(fake_settings(None, None)) == []  # ~/.ssh/config: plain ssh reads it
    assert write_ssh_shim(tmp_path / "none", []) is None
