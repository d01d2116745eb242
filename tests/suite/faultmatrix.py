"""The fault matrix's machinery, shared by the tables it runs (docs/FAULT_MATRIX.md: the
two-node matrix, tests/suite/test_fault_matrix.py; N Sparks behind a switch,
tests/suite/test_switch_suite.py): a table's rows parsed, each row's whole-suite run on
lanes of sims side by side, and the rules every row is held to (``check_row``)."""

from __future__ import annotations

import os
import re
import shlex
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from nodeaudit import KEPT_LAUNCHER_LOG, LAUNCH_LEAVES, before_run, changes_after  # type: ignore[import-not-found]

from conftest import (  # type: ignore[import-not-found]
    REPO,
    SUITE_SIM_ARGS,
    SuiteRun,
    launch_args,
    node_ssh,
    run_suite,
    sim_fault,
)
from pytest_spark.access.simcontrol import SimCluster, sim_up
from pytest_spark.report.results import CATEGORIES  # the table names the report's categories

# `+only served`: every category of the served API (tests_e2e), none of the host's (link,
# nccl, preflight): a fault inside the engine's HTTP answers, which no host check reads.
SERVED = [c for c in CATEGORIES if c not in ("link", "nccl", "preflight")]
MATRIX = REPO / "docs" / "FAULT_MATRIX.md"
COLUMNS = ("fault", "inject", "run", "fails", "node", "says", "because", "check")
# Shorter sweeps keep CI time down; every check still runs. The matrix is about where a
# fault is reported, not about bandwidth floors (tests/suite/test_nccl_suite.py holds those
# at the full sweep): at 2 MiB the sim's healthy busbw (~0.11 GB/s) nears the profile's
# 0.09 on a loaded machine, so the floor is lowered below it (a one-twin or 100G link then
# passes or fails by load: those rows mark nccl as `nccl?`).
TRIM = (
    "--spark-threshold=nccl.max_bytes=2097152",
    "--spark-threshold=nccl.iters=5",  # nccl-tests -n 5 -w 1: the matrix wants verdicts
    "--spark-threshold=nccl.warmup=1",
    "--spark-threshold=nccl.min_busbw_gbps=0.02",
    "--spark-threshold=throughput.concurrency=1;4",
    "--spark-history=off",
)
# Where each run's per-category verdicts are written, to read when a row disagrees.
# SPARK_FAULT_MATRIX_OBSERVED moves it (several matrix runs on one machine).
OBSERVED = Path(os.environ.get("SPARK_FAULT_MATRIX_OBSERVED", "/tmp/pytest-spark-fault-matrix"))
RUNS = ("launch", "serving", "restart")
PHASES = ["start", "weights", "kv", "graphs", "api", "ready"]


@dataclass(frozen=True)
class Row:
    fault: str
    inject: tuple[tuple[str, ...], ...]  # spark-sim fault argv's
    serve_args: str  # appended to the launch's serve args
    drop_args: str  # removed from the launch's serve args (a flag and its value)
    run: str  # launch | serving | restart
    fails: tuple[str, ...]
    may_fail: tuple[str, ...]  # a measured consequence that may or may not cross its floor
    node: str | None
    says: dict[str, str]  # category -> words one of its failures says ("*": every category)
    because: str | None
    checks: tuple[str, ...] = ()  # the failing checks: test_x (any param) or test_x[param]
    causes: int = 1  # root causes: the failed + error checks outside may_fail, exactly
    over: int = 0  # failures over the causes, known and not yet folded into one (see the doc)
    mode: str = "ray"  # launch rows: --spark-ray=on (ray) or off (no-ray, issue #17)
    options: tuple[str, ...] = ()  # suite options the row adds (+opt: the heavy modes)
    only: tuple[str, ...] = ()  # +only CAT...: the row runs only these categories (-m)

    @property
    def id(self) -> str:
        name = re.sub(r"[^a-z0-9]+", "-", self.fault.lower()).strip("-")
        return name if self.mode == "ray" else f"{name}-{self.mode}"


def _cell(text: str) -> str | None:
    text = text.strip().strip("`").strip()
    return None if text in ("", "-") else text


def parse_matrix(text: str, heading: str = "## Matrix") -> list[Row]:
    """The rows of the table under ``heading`` (up to the next ``## `` heading); a
    malformed row is an error, not a skip."""
    body = re.split(r"^## ", text.split(f"{heading}\n", 1)[1], maxsplit=1, flags=re.M)[0]
    lines = [line for line in body.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    if tuple(header) != COLUMNS:
        raise ValueError(f"{MATRIX}: columns {header}, expected {list(COLUMNS)}")
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != len(COLUMNS):
            raise ValueError(f"{MATRIX}: {len(cells)} cells in {line!r}")
        values = dict(zip(COLUMNS, cells, strict=True))
        inject, serve_args, drop_args, options, only = [], "", "", [], []
        mode = "ray"
        for part in (_cell(values["inject"]) or "").split(";"):
            part = part.strip()
            if part.startswith("+serve-args "):
                serve_args = part.removeprefix("+serve-args ").strip()
            elif part.startswith("-serve-args "):
                drop_args = part.removeprefix("-serve-args ").strip()
            elif part.startswith("+opt "):
                options += shlex.split(part.removeprefix("+opt "))
            elif part.startswith("+only "):
                for word in part.removeprefix("+only ").split():
                    only += SERVED if word == "served" else [word]
            elif part.startswith("+mode "):  # a launch row of one launcher mode only
                mode = part.removeprefix("+mode ").strip()
            elif part:
                inject.append(tuple(shlex.split(part)))
        if any(not o.startswith("--spark-") for o in options):
            raise ValueError(f"{MATRIX}: +opt takes suite options (--spark-...): {line!r}")
        words = (_cell(values["fails"]) or "").split()
        counts = {"causes": 1, "over": 0}
        for word in [w for w in words if "=" in w]:
            key, _, number = word.partition("=")
            if key not in counts or not number.isdigit():
                raise ValueError(f"{MATRIX}: bad count {word!r} in {line!r}")
            counts[key] = int(number)
            words.remove(word)
        fails = tuple(w for w in words if not w.endswith("?"))
        may_fail = tuple(w.removesuffix("?") for w in words if w.endswith("?"))
        unknown = set(fails + may_fail + tuple(only)) - set(CATEGORIES)
        if only and not set(fails + may_fail) <= set(only):
            raise ValueError(f"{MATRIX}: +only leaves out a category the row fails: {line!r}")
        if unknown or values["run"] not in RUNS or mode not in ("ray", "no-ray"):
            raise ValueError(f"{MATRIX}: bad row {line!r}")
        if fails and counts["causes"] + counts["over"] < len(fails):
            raise ValueError(f"{MATRIX}: fewer failures allowed than failing categories: {line!r}")
        checks = tuple(c.strip("`") for c in (_cell(values["check"]) or "").split())
        if bool(checks) != bool(fails) or any(not c.startswith("test_") for c in checks):
            raise ValueError(
                f"{MATRIX}: a failing row names the checks that fail (test_...), a "
                f"healthy row none: {line!r}"
            )
        if len(checks) > counts["causes"] + counts["over"]:
            raise ValueError(f"{MATRIX}: more checks than failures allowed: {line!r}")
        rows.append(
            Row(
                fault=values["fault"],
                inject=tuple(inject),
                serve_args=serve_args,
                drop_args=drop_args,
                run=values["run"],
                fails=fails,
                may_fail=may_fail,
                node=_cell(values["node"]),
                says=_says(_cell(values["says"]), fails + may_fail),
                because=_cell(values["because"]),
                checks=checks,
                causes=counts["causes"],
                over=counts["over"],
                options=tuple(options),
                only=tuple(only),
                mode=mode,
            )
        )
    return rows


def _says(cell: str | None, fails: tuple[str, ...]) -> dict[str, str]:
    """``words`` (every failing category) or ``cat: words / cat: words``."""
    says: dict[str, str] = {}
    for part in (cell or "").split(" / "):
        category, sep, words = part.partition(": ")
        if sep and category in CATEGORIES:
            if category not in fails:
                raise ValueError(f"{MATRIX}: says {category!r}, which is not in fails {fails}")
            says[category] = words.strip()
        elif part.strip():
            says["*"] = part.strip()
    return says


def readiness_launch_row(row: Row) -> bool:
    """A launch row whose fault is the startup's (healthy, load crashes and hangs, the API
    key): these run in both modes. A placement group exists only with Ray."""
    return (
        row.run == "launch"
        and row.mode == "ray"  # a row of one mode (+mode) runs in that mode alone
        and set(row.fails) <= {"readiness"}
        and all(argv[0] == "engine" for argv in row.inject)
        and "placement" not in row.fault
    )


def load_failure_row(row: Row) -> bool:
    """A launch row whose engine crashes or hangs while it loads."""
    return row.run == "launch" and any(
        argv[0] == "engine" and argv[1].startswith(("crash-", "hang-")) for argv in row.inject
    )


class Stack:
    """A serving stack kept up across the `serving` rows, relaunched when a row killed it."""

    def __init__(self, sim: SimCluster, tmp: Path) -> None:
        self.sim, self.tmp, self.launches, self.up = sim, tmp, 0, False

    def healthy(self) -> bool:
        port = self.sim.info["launch"]["port"]
        code = node_ssh(
            self.sim,
            self.sim.head,
            f"curl -s -o /dev/null -w '%{{http_code}}' -m 5 http://127.0.0.1:{port}/health",
            timeout=30,
        )
        return code.strip() == "200"

    def ensure(self) -> None:
        if self.healthy():
            return
        self.stop()
        self.launches += 1
        run = run_suite(
            self.tmp / f"keep{self.launches}",
            str(REPO / "tests_e2e" / "test_readiness.py"),
            "-k",
            "cluster_serving",
            *launch_args(self.sim),
            "--spark-keep",
            "--spark-history=off",
            sim=self.sim,
        )
        if run.ret != 0:  # --spark-keep left a failed launch running: the next row's
            self.stop()  # launch would meet it ("already running"), one failure per row
        assert run.ret == 0, run.output
        self.up = True

    def stop(self) -> None:
        self.up = False
        launch = self.sim.info["launch"]
        fabric = ",".join(f"198.19.0.{i + 1}" for i in range(len(self.sim.info["nodes"])))
        node_ssh(self.sim, self.sim.head, f"{launch['script']} -n {fabric} stop")
        # The kept launch's own launcher (backgrounded on the head) runs its stop trap once
        # its exec ends: landed after the next launch's `docker run`, it stopped that new
        # head container (the final rehearsal's one red row: "No such container: vllm_node"
        # right after the launcher started it). Wait until no launcher is left on the head
        # and no vllm_node exists in any state on any node (--rm removes it after stop).
        base = Path(launch["script"]).name  # [l]aunch-cluster.sh: pgrep not finding itself
        pattern = shlex.quote(f"[{base[0]}]{re.escape(base[1:])}")
        gone = (
            f"for i in $(seq 60); do if ! pgrep -f {pattern} >/dev/null && "
            '[ -z "$(docker ps -aq -f name=^vllm_node$)" ]; then exit 0; fi; sleep 0.5; done'
        )
        for node in self.sim.info["nodes"]:
            node_ssh(self.sim, node["mgmt"], gone, timeout=60)


# Rows run side by side, each lane on a sim of its own: a row mostly waits (on the
# emulated load, the token pacing, the all-reduce), ~15 CPU-s in ~80 s of wall time
# (suite, sshd, dockerd and containers together), so three lanes fit on 2 cores.
LANES = int(os.environ.get("FAULT_MATRIX_LANES", "3"))
# Rows that take several times a row's time (the suite's requests at a tenth of the decode
# rate) start first, so that no lane is left running one long after the others are done.
LONG_ROWS = (("engine", "slow-decode"),)


class Lane:
    """One sim and the serving stack kept up on it; runs one row at a time."""

    def __init__(self, sim: SimCluster, tmp: Path, owned: bool) -> None:
        self.sim, self.stack, self.owned = sim, Stack(sim, tmp), owned

    def close(self) -> None:
        try:
            self.stack.stop()
            sim_fault(self.sim, "clear")
        finally:
            if self.owned:
                self.sim.down()


class Matrix:
    """Runs every selected row once, on ``lanes`` sims at once (the session's sim and
    ``lanes - 1`` more, brought up here by ``new_sim``); a test waits for its own row's
    run, the suite held to the threshold ``profile``.

    Lane 0 takes the `serving` rows first, the other lanes the `launch` rows, each in
    table order after LONG_ROWS; a lane out of its own kind takes the other's, so no
    lane idles while rows wait. The tests still assert in table order (the healthy rows'
    skips are the baseline of the rows after them). Every row still runs the whole suite
    alone on its sim, injected, run and cleared as before (``run_row``)."""

    def __init__(
        self,
        sim: SimCluster,
        rows: list[Row],
        lanes: int,
        tmp: pytest.TempPathFactory,
        new_sim: Callable[[], SimCluster] = lambda: sim_up(2, SUITE_SIM_ARGS),
        profile: str = "sim",
    ) -> None:
        self.tmp, self.new_sim, self.profile = tmp, new_sim, profile
        self.futures: dict[str, Future[SuiteRun]] = {r.id: Future() for r in rows}
        ordered = sorted(rows, key=lambda r: not any(a in LONG_ROWS for a in r.inject))
        self.queues = {  # `launch` and `restart` rows stop the kept stack: one queue
            "serving": [r for r in ordered if r.run == "serving"],
            "launch": [r for r in ordered if r.run != "serving"],
        }
        self.lock = threading.Lock()
        self.lanes: list[Lane] = []
        count = max(1, min(lanes, len(rows)))
        self.threads = [
            threading.Thread(target=self._lane, args=(i, sim), name=f"matrix-lane-{i}")
            for i in range(count)
        ]
        for thread in self.threads:
            thread.start()

    def _next(self, prefer: str) -> Row | None:
        with self.lock:
            for kind in (prefer, "launch" if prefer == "serving" else "serving"):
                if self.queues[kind]:
                    return self.queues[kind].pop(0)
        return None

    def _lane(self, index: int, session_sim: SimCluster) -> None:
        try:
            sim = session_sim if index == 0 else self.new_sim()
        except BaseException as exc:  # no sim for this lane: the others take its rows
            sys.stderr.write(f"fault matrix: lane {index} has no sim, runs nothing: {exc}\n")
            return
        lane = Lane(sim, self.tmp.mktemp(f"stack{index}"), owned=index != 0)
        with self.lock:
            self.lanes.append(lane)
        prefer = "serving" if index == 0 else "launch"
        try:
            while (row := self._next(prefer)) is not None:
                future = self.futures[row.id]
                try:
                    tmp = self.tmp.mktemp(row.id)
                    future.set_result(run_row(sim, lane.stack, row, tmp, self.profile))
                except BaseException as exc:  # a skip or failure belongs to the row's test
                    future.set_exception(exc)
        finally:
            if index != 0:
                lane.close()  # lane 0's sim is the session's: closed by the fixture

    def result(self, row: Row) -> SuiteRun:
        return self.futures[row.id].result()

    def close(self) -> None:
        with self.lock:
            for queue in self.queues.values():
                for row in queue:  # an interrupted session: rows never started
                    self.futures[row.id].cancel()
                queue.clear()
        for thread in self.threads:
            thread.join()
        for lane in self.lanes:
            if not lane.owned:
                lane.close()


def _serve_args(sim: SimCluster, row: Row) -> str:
    base: str = sim.info["launch"]["serve_args"]
    drop = row.drop_args.split()
    argv = base.split()
    for i in range(len(argv) - len(drop) + 1):
        if drop and argv[i : i + len(drop)] == drop:
            argv = argv[:i] + argv[i + len(drop) :]
            break
    else:
        assert not drop, f"{row.drop_args!r} is not in the launch's serve args {base!r}"
    return " ".join([*argv, row.serve_args]).strip()


def compose_serve_args(sim: SimCluster, rank: int = 0) -> list[str]:
    """One engine rank per node without Ray (`--nnodes N --node-rank R`, `--headless` on
    workers), as an operator's compose file on each Spark runs it."""
    serve = shlex.split(sim.info["launch"]["serve_args"])
    if "--distributed-executor-backend" in serve:
        at = serve.index("--distributed-executor-backend")
        del serve[at : at + 2]
    head_ip = sim.info["nodes"][0]["fabric"][0]["addr"]
    nodes = str(len(sim.info["nodes"]))
    serve += ["--nnodes", nodes, "--node-rank", str(rank), "--master-addr", head_ip]
    serve += ["--master-port", "29501", *(["--headless"] if rank else [])]
    return serve


def restart_compose(sim: SimCluster, container: str) -> None:
    """Operator-run engine containers (`docker run --restart unless-stopped ... vllm serve`,
    as with docker compose: the engine is the container's command, no --rm), one rank per
    node, healthy once, then `docker restart`ed on every node as after a reboot: `docker
    logs` keeps the first start's lines while the engines load again (~75 s: the suite's
    watch attached 17-30 s after the restart with the tiers side by side, and must see
    this load, not its end)."""
    port = sim.info["launch"]["port"]
    for rank, node in reversed(list(enumerate(sim.info["nodes"]))):  # workers first
        fabric = node["fabric"]
        env = {
            "VLLM_HOST_IP": fabric[0]["addr"],
            **{k: fabric[0]["if"] for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")},
            **{k: fabric[0]["if"] for k in ("TP_SOCKET_IFNAME", "UCX_NET_DEVICES")},
            "NCCL_IB_HCA": ",".join(f["dev"] for f in fabric),
            "NCCL_IB_DISABLE": "0",
            "SPARKSIM_EMU_TIME_SCALE": "0.1",
        }
        docker = [
            "docker", "run", "-d", "--restart", "unless-stopped", "--name", container,
            "--network", "host", "--ipc=host", "--gpus", "all", "--privileged",
            *(a for k, v in env.items() for a in ("-e", f"{k}={v}")),
        ]  # fmt: skip
        image = shlex.join(["vllm-node:latest", *compose_serve_args(sim, rank)])
        node_ssh(sim, node["mgmt"], f"{shlex.join(docker)} $VLLM_SPARK_EXTRA_DOCKER_ARGS {image}")
    health = f"curl -s -o /dev/null -w '%{{http_code}}' -m 2 http://127.0.0.1:{port}/health"
    wait = f'for i in $(seq 400); do [ "$({health})" = 200 ] && break; sleep 0.5; done'
    node_ssh(sim, sim.head, wait, timeout=300)
    for node in reversed(sim.info["nodes"]):
        node_ssh(sim, node["mgmt"], f"docker restart {container}", timeout=60)


LOAD_FAILURE_READY_TIMEOUT_S = 300.0
# Rows whose whole-suite run is also audited on the nodes (issue 8, tests/suite/nodeaudit.py):
# the row id -> what the run may leave (README, "What the suite changes on your nodes"). A
# launched run leaves only the HF cache dir docker makes; a run attached to a cluster
# someone else launched leaves nothing (its launcher's log grows on). Audited here, on the
# runs the matrix makes anyway, rather than by runs of their own (~180 s of the suite tier).
AUDITS: dict[str, tuple[str, ...]] = {
    "healthy-launch": LAUNCH_LEAVES,
    "healthy-serving": KEPT_LAUNCHER_LOG,
}


def run_row(
    sim: SimCluster, stack: Stack, row: Row, tmp_path: Path, profile: str = "sim"
) -> SuiteRun:
    sim_fault(sim, "clear")
    if row.run == "serving":
        stack.ensure()
    elif stack.up:
        stack.stop()
    options = list(row.options)
    for i, option in enumerate(options):  # a baseline the healthy stack records first
        if option.endswith(HEALTHY_BASELINE):
            path = tmp_path / "healthy-baseline.json"
            record_baseline(sim, stack, path, tmp_path / "baseline", profile)
            options[i] = option.removesuffix(HEALTHY_BASELINE) + f"={path}"
    for argv in row.inject:
        sim_fault(sim, *argv)
    args = [str(REPO / "tests_infra"), str(REPO / "tests_e2e"), *TRIM, *options]
    if row.only:  # a row that needs a few categories runs only those (CI time)
        args += ["-m", " or ".join(row.only)]
    if row.run == "restart":  # serving first, so that the watch attaches while it loads
        args[:2] = reversed(args[:2])
    container = sim.info["launch"]["container"]
    args += [
        f"--spark-model-dir={sim.info['launch']['model_dir']}",
        f"--spark-image={sim.info['launch']['image']}",
    ]
    if row.run == "restart":
        restart_compose(sim, container)
        serve = shlex.join(compose_serve_args(sim))
        args += [f"--spark-serve-args={serve}", f"--spark-container={container}"]
    elif row.run == "launch":
        args += [*launch_args(sim), f"--spark-serve-args={_serve_args(sim, row)}"]
        args.append(f"--spark-ray={'on' if row.mode == 'ray' else 'off'}")  # the launcher's mode
        if load_failure_row(row):  # the watch must end it, long before this timeout
            args.append(f"--spark-ready-timeout={LOAD_FAILURE_READY_TIMEOUT_S:g}")
    else:
        args += [f"--spark-serve-args={_serve_args(sim, row)}", f"--spark-container={container}"]
    allowed = AUDITS.get(row.id)
    before = before_run(sim) if allowed is not None else None
    try:
        run = run_suite(tmp_path, *args, sim=sim, timeout=900, profile=profile)
        if before is not None:  # before the clear below rewrites the sim's fault state
            run.audit = changes_after(sim, before, allowed)
        return run
    finally:
        sim_fault(sim, "clear")
        if row.run == "restart":
            for node in sim.info["nodes"]:
                node_ssh(sim, node["mgmt"], f"docker rm -f {container}")


# `+opt --spark-accuracy-baseline=@healthy`: the row compares with a fingerprint baseline
# its own sim recorded healthy, just before the fault (as an operator records one on a
# healthy cluster, then checks against it).
HEALTHY_BASELINE = "=@healthy"


def record_baseline(sim: SimCluster, stack: Stack, path: Path, tmp: Path, profile: str) -> None:
    stack.ensure()
    container = sim.info["launch"]["container"]
    run = run_suite(
        tmp,
        str(REPO / "tests_e2e" / "test_accuracy.py"),
        "-k",
        "fingerprint",
        f"--spark-accuracy-baseline={path}",
        f"--spark-serve-args={sim.info['launch']['serve_args']}",
        f"--spark-container={container}",
        "--spark-history=off",
        sim=sim,
        profile=profile,
    )
    assert run.ret == 0 and path.exists(), run.output[-3000:]


def summary(run: SuiteRun) -> dict[str, Any]:
    """Per category: outcome counts, failure messages, skip reasons (for the observer)."""
    out: dict[str, Any] = {"exit": run.ret}
    for check in run.results["checks"]:
        cat = out.setdefault(check["category"], {"outcomes": {}, "failed": [], "skipped": []})
        cat["outcomes"][check["outcome"]] = cat["outcomes"].get(check["outcome"], 0) + 1
        name = check["nodeid"].split("::", 1)[1]
        if check["outcome"] in ("failed", "error"):
            cat["failed"].append(f"{name}: {check['message'][:300]}")
        elif check["outcome"] == "skipped":
            cat["skipped"].append(f"{name}: {check['message'][:200]}")
    return out


def _names(check: dict[str, Any]) -> str:
    return f"{check.get('node') or ''} {check['message']}"


def is_check(nodeid: str, check: str) -> bool:
    """Whether the check ``nodeid`` is the row's ``check``: ``test_x[param]`` exactly, or
    ``test_x`` whatever its parameters."""
    name = nodeid.split("::")[-1]
    return name == check or ("[" not in check and name.split("[", 1)[0] == check)


def _is_row_check(row: Row, check: dict[str, Any]) -> bool:
    return any(is_check(check["nodeid"], want) for want in row.checks)


def check_row(row: Row, run: SuiteRun, baseline: dict[str, set[str]]) -> None:
    """The rules of docs/FAULT_MATRIX.md, held on one row's run. A healthy row records its
    skips in ``baseline`` (by run and mode): the rows after it may skip those too."""
    checks = run.results["checks"]
    assert checks, f"no JSON results:\n{run.output[-3000:]}"
    if row.only:  # its categories ran, each on every node (the sim's two)
        ran = {c["category"] for c in checks}
        assert set(row.only) <= ran, f"{row.only} did not run:\n{run.output[-3000:]}"
    else:
        assert len(checks) >= 60, f"the whole suite did not run:\n{run.output[-3000:]}"
    crashed = [f"{c['nodeid']}: {c['crashed']}: {c['message']}" for c in checks if c["crashed"]]
    assert not crashed, "checks died of an exception instead of a verdict:\n" + "\n".join(crashed)
    if not row.fails:
        # Recorded first: a healthy row failing on its own is one failure, not one per row.
        skipped = {c["nodeid"] for c in checks if c["outcome"] == "skipped"}
        baseline[f"{row.run}/{row.mode}"] = skipped
        bad = {c["nodeid"]: c["message"] for c in checks if c["outcome"] in ("failed", "error")}
        assert not bad, bad
        assert run.ret == 0, run.output[-3000:]
        if row.run == "restart":  # this start's load, watched: not the old ready line
            serving = run.results["serving"]
            assert [p["phase"] for p in serving["timeline"]] == PHASES, serving
            assert serving["ready_s"] > 3, serving
        return
    assert run.ret == 1, run.output[-3000:]
    for category in row.fails:
        failed = [
            c for c in checks if c["category"] == category and c["outcome"] in ("failed", "error")
        ]
        assert failed, f"{category}: nothing failed; {summary(run).get(category)}"
        words = row.says.get(category) or row.says.get("*")
        if words:
            said = [c for c in failed if words.lower() in c["message"].lower()]
            assert said, f"{category}: no failure says {words!r}: {[_names(c) for c in failed]}"
    if row.node:
        named = [
            c
            for c in checks
            if c["category"] in row.fails and c["outcome"] in ("failed", "error")
            if row.node in _names(c)
        ]
        assert named, f"no failure names {row.node}"
    for category in row.may_fail:
        words = row.says.get(category)
        for check in checks:
            if check["category"] == category and check["outcome"] in ("failed", "error"):
                assert not words or words.lower() in check["message"].lower(), check
    # One root cause, one failure: the failed + error checks (a `?` category's measured
    # consequence aside) are exactly the row's root causes (plus its known `over`).
    bad = [
        c
        for c in checks
        if c["outcome"] in ("failed", "error") and c["category"] not in row.may_fail
    ]
    stray = [f"{c['nodeid']}: {c['message'][:300]}" for c in bad if c["category"] not in row.fails]
    assert not stray, "failures outside the row's categories:\n" + "\n".join(stray)
    counted = [f"{c['nodeid']} ({c['outcome']}): {c['message'][:200]}" for c in bad]
    # The checks that fail are the row's: another check failing in the same category (and
    # saying the same words, on the same node) is not this row's verdict.
    other = [line for c, line in zip(bad, counted, strict=True) if not _is_row_check(row, c)]
    assert not other, f"failures of checks other than {' '.join(row.checks)}:\n" + "\n".join(other)
    missing = [w for w in row.checks if not any(is_check(c["nodeid"], w) for c in bad)]
    assert not missing, f"{missing} did not fail:\n" + "\n".join(counted)
    assert len(counted) == row.causes + row.over, (
        f"{len(counted)} failures for {row.causes} root cause(s)"
        + (f" + {row.over} known over" if row.over else "")
        + ":\n"
        + "\n".join(counted)
    )
    # Every other non-passing check is a skip citing the root cause (or skipped as in
    # the healthy run of the same mode), whatever its category.
    mode = f"{row.run}/{row.mode}"
    healthy = baseline.get(mode, set())
    # A row selected without its mode's healthy row (-k) has no baseline: its opt-in skips
    # (the math set, the soak) then read as skips citing nothing; say which row to add.
    hint = (
        ""
        if mode in baseline
        else f" (no healthy {mode} run in this session to take its skips from: select the "
        f"healthy row of this mode too, e.g. -k 'healthy-{row.run} or ...')"
    )
    for check in checks:
        if check["outcome"] in ("passed", "failed", "error"):
            continue
        where = f"{check['nodeid']} ({check['outcome']}): {check['message'][:400]}"
        assert check["outcome"] == "skipped", f"not passing, failing or skipped: {where}"
        if check["nodeid"] in healthy:
            continue
        assert row.because and row.because.lower() in check["message"].lower(), (
            f"skip does not point at the root cause {row.because!r}: {where}{hint}"
        )
