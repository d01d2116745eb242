"""The options table: every ``--spark-*`` option with its ini twin ``spark_*``, its
``SPARK_*`` variable, help, default and parser (``OPTIONS``). The single source of the
names: ``resolve.Settings`` has one typed field per entry, in the same order
(tests/test_settings_typed.py holds the two together). The parsers are in
settings/parsers.py; resolve registers the options with pytest and reads them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_spark.settings.parsers import (
    FAMILIES,
    THRESHOLD_FORMS,
    Parse,
    accuracy_mode,
    boolean,
    compare_fail,
    concurrency,
    container,
    depth_sweep,
    head_path,
    history_dir,
    host,
    host_list,
    hostkey_check,
    interface_list,
    job,
    key_file,
    launcher,
    model_hash,
    nodes,
    path,
    port,
    ray_mode,
    remote_path,
    run_ref,
    seconds,
    sim_engine,
    sparkrun_cluster,
    sparkrun_recipe,
    thresholds,
    url,
    verbatim,
    words,
)
from pytest_spark.settings.profiles import builtin_profiles
from pytest_spark.settings.sparkrun import DEFAULT_CLUSTER


@dataclass(frozen=True)
class Option:
    """One setting: ``--spark-<noun>``, ini ``spark_<noun>``, env ``SPARK_<NOUN>``, field
    ``Settings.<attr>``. ``profile_key``: the profile figure that is the default when the
    option is not given (``readiness.ready_timeout_s``)."""

    noun: str
    parse: Parse
    default: Any
    help: str
    metavar: str = ""
    flag: bool = False
    secret: bool = False
    profile_key: str | None = None
    ini_type: str = "string"
    const: Any = None  # the value of a bare ``--spark-<noun>`` (an optional argument)

    @property
    def dest(self) -> str:
        return "spark_" + self.noun.replace("-", "_")

    @property
    def cli(self) -> str:
        return f"--spark-{self.noun}"

    @property
    def ini(self) -> str:
        return self.dest

    @property
    def env(self) -> str:
        return self.dest.upper()

    @property
    def attr(self) -> str:
        return self.noun.replace("-", "_")


OPTIONS: tuple[Option, ...] = (
    Option("head", host, None, "management address (or ssh_config alias) of the head node", "HOST"),
    Option(
        "workers",
        host_list,
        (),
        "management addresses of the workers; reached through "
        "the head as a jump host when not directly reachable",
        "HOST[,HOST...]",
    ),
    Option("user", verbatim, None, "SSH user (default: ssh_config, then the local user)", "USER"),
    Option(
        "cluster",
        sparkrun_cluster,
        None,
        "a cluster saved by sparkrun (~/.config/sparkrun/clusters/NAME.yaml, or under "
        "$SPARKRUN_CONFIG_DIR): its hosts, the first the head, and its user; bare: "
        "sparkrun's default cluster (clusters/.default). With it, no --spark-head or "
        "--spark-workers; a running sparkrun job on its hosts sets the expectations",
        "NAME",
        const=DEFAULT_CLUSTER,
    ),
    Option(
        "recipe",
        sparkrun_recipe,
        None,
        "a sparkrun v2 recipe (YAML; read, never run) that sets what is expected: served "
        "name and port, TP x PP nodes, tool calls and reasoning (tool_call_parser, "
        "reasoning_parser), max_model_len, the serving env; a running job's overrides apply",
        "PATH",
    ),
    Option("ssh-key", key_file, None, "SSH private key (default: ssh_config IdentityFile)", "PATH"),
    Option(
        "ssh-config",
        path,
        Path("~/.ssh/config"),
        "OpenSSH config to honour (Host aliases, "
        "HostName, User, IdentityFile, Port, ProxyJump, UserKnownHostsFile)",
        "PATH",
    ),
    Option("connect-timeout", seconds, 10.0, "SSH connect timeout per node", "SECONDS"),
    Option("command-timeout", seconds, 60.0, "timeout of one remote command", "SECONDS"),
    Option(
        "hostkey-check",
        hostkey_check,
        "strict",
        "host key policy: strict (unknown or "
        "changed keys are errors) or off (accept any key; the report says so)",
        "strict|off",
    ),
    Option(
        "profile",
        verbatim,
        "dgx-spark-2node",
        "threshold profile: a built-in name ("
        + "; ".join(f"{name}: {what}" for name, what in builtin_profiles().items())
        + ") or a TOML file (extends = NAME starts it from a built-in); "
        "--spark-show-profile prints every threshold it sets",
        "NAME|PATH",
    ),
    Option(
        "threshold",
        thresholds,
        {},
        f"override single thresholds of the profile: {THRESHOLD_FORMS}; "
        "--spark-show-profile lists every key with its value, unit and source",
        "KEY=VALUE[,KEY=VALUE...]",
    ),
    Option(
        "fabric-ifs",
        interface_list,
        (),
        "fabric interfaces (default: discovered from ibdev2netdev devices that are Up)",
        "IF[,IF]",
    ),
    Option("results", path, None, "write JSON results to this file", "PATH"),
    Option(
        "sim",
        boolean,
        False,
        "stand up sparksim (the embedded simulated cluster) for the "
        "session, point everything at it and tear it down afterwards",
        flag=True,
        ini_type="bool",
    ),
    Option("sim-nodes", nodes, 2, "number of sparksim nodes with --spark-sim", "N"),
    Option(
        "sim-engine",
        sim_engine,
        "emulator",
        "what serves on sparksim: its vLLM emulator, or real vLLM on CPU with a small model "
        "(vllm-cpu; profile sim-vllm-cpu)",
        "emulator|vllm-cpu",
    ),
    Option(
        "api-url",
        url,
        None,
        "OpenAI-compatible API base URL (default: the head's "
        "--spark-port, through an SSH tunnel when not directly reachable)",
        "URL",
    ),
    Option(
        "api-key",
        verbatim,
        None,
        "API key (prefer SPARK_API_KEY or --spark-api-key-file; never printed)",
        "KEY",
        secret=True,
    ),
    Option("api-key-file", path, None, "file holding the API key", "PATH"),
    Option(
        "model", verbatim, None, "served model id (default: the only one /v1/models lists)", "NAME"
    ),
    Option("port", port, 8000, "vLLM API port on the head", "PORT"),
    Option(
        "http-timeout",
        seconds,
        30.0,
        "timeout of one HTTP request, and the idle timeout of a stream",
        "SECONDS",
    ),
    Option(
        "launch",
        boolean,
        False,
        "start the serving cluster with the launch script on the "
        "head, wait until it is ready, and stop it after the session",
        flag=True,
        ini_type="bool",
    ),
    Option(
        "keep",
        boolean,
        False,
        "with --spark-launch: leave the cluster running afterwards",
        flag=True,
        ini_type="bool",
    ),
    Option(
        "launch-script",
        verbatim,
        "~/spark-vllm-docker/launch-cluster.sh",
        "launch-cluster.sh path on the head (its README clones to ~/spark-vllm-docker)",
        "PATH",
    ),
    Option(
        "launcher",
        launcher,
        "launch-cluster",
        "what --spark-launch starts the cluster with: launch-cluster (launch-cluster.sh on "
        "the head) or sparkrun (`sparkrun run RECIPE --hosts HEAD,WORKER... --offline "
        "--no-follow` from this machine, RECIPE from --spark-recipe; `sparkrun stop` after)",
        "launch-cluster|sparkrun",
    ),
    Option(
        "sparkrun",
        path,
        None,
        "the sparkrun CLI that --spark-launcher=sparkrun runs (default: sparkrun on PATH)",
        "PATH",
    ),
    Option(
        "sparkrun-args",
        words,
        (),
        "more arguments for `sparkrun run`, after the suite's (e.g. '--no-auto-detect -o "
        "max_model_len=8192'); a recipe's hooks and host paths need --trust given here",
        "ARGS",
    ),
    Option(
        "ray",
        ray_mode,
        "auto",
        "Ray or no-Ray deployment: auto reads it from the serve args "
        "(--distributed-executor-backend ray; --nnodes/--headless) or the containers' "
        "processes; with --spark-launch, on passes --ray to the launcher",
        "auto|on|off",
    ),
    Option(
        "serve-log",
        head_path,
        None,
        "attach mode: the launcher's log on the head (the operator's `launch-cluster.sh ... "
        "exec vllm serve ... > PATH`), where the head's vLLM output goes in Ray mode",
        "PATH",
    ),
    Option(
        "launch-nodes",
        host_list,
        (),
        "node IPs passed to the launcher's -n (default: each node's primary fabric address)",
        "IP[,IP...]",
    ),
    Option("image", verbatim, None, "serving image for the launcher's -t", "IMAGE"),
    Option("container", container, "vllm_node", "serving container name on every node", "NAME"),
    Option(
        "job",
        job,
        None,
        "the sparkrun job to attach to when several run on the nodes (its "
        "sparkrun.cluster_id label; default: the one found)",
        "CLUSTER_ID",
    ),
    Option(
        "serve-args",
        verbatim,
        None,
        "the `vllm serve ...` command the launcher runs in the head container",
        "'vllm serve ...'",
    ),
    Option(
        "model-dir",
        remote_path,
        None,
        "the model directory on the nodes (host path), "
        "compared across nodes and sized by the preflight checks (default: the serve "
        "args' model path when it exists on the nodes)",
        "PATH",
    ),
    Option(
        "model-hash",
        model_hash,
        "sampled",
        "how test_model_dir_identical compares the weight shards: a sampled sha256 "
        "(16 blocks of 64 KiB each), or full: sha256 of every byte, with a progress line "
        "(minutes: 119 GB per node on a Spark)",
        "sampled|full",
    ),
    Option(
        "nccl-debug",
        verbatim,
        None,
        "launcher --nccl-debug level (VERSION, WARN, INFO, TRACE)",
        "LEVEL",
    ),
    Option(
        "ready-timeout",
        seconds,
        1200.0,
        "give up waiting for readiness after this long",
        "SECONDS",
        profile_key="readiness.ready_timeout_s",
    ),
    Option(
        "hang-timeout",
        seconds,
        300.0,
        "no log progress on any node for this long while loading is a hang",
        "SECONDS",
        profile_key="readiness.hang_timeout_s",
    ),
    Option(
        "history",
        history_dir,
        Path(".spark-history"),
        "keep each run's figures (busbw, "
        "tok/s, TTFT, TPOT, startup phases) here, one JSON file per run; 'off' keeps none; "
        "default: the rootdir's .spark-history with an ini file, else the user cache",
        "DIR|off",
    ),
    Option(
        "compare",
        run_ref,
        None,
        "compare the figures with the last run of the same "
        "cluster in the history, or with run RUN (its number, e.g. 0003, or file)",
        "RUN",
        const="last",
    ),
    Option(
        "compare-fail",
        compare_fail,
        (),
        "fail the session when a figure got worse by more "
        "than PCT against the compared run (implies --spark-compare); METRIC is a family "
        f"({', '.join(FAMILIES)}: the model's load time) or one figure such as tok_s@4, "
        "ttft_p90@1 or startup.weights",
        "METRIC:PCT[,METRIC:PCT]",
    ),
    Option(
        "soak",
        seconds,
        None,
        "hold a steady load this long (e.g. 90s, 30m; the profile's [soak] says how many "
        "streams and what fails it) in tests_e2e/test_soak.py; without it the soak is skipped",
        "DURATION",
    ),
    Option(
        "accuracy",
        accuracy_mode,
        "quick",
        "the accuracy checks (tests_e2e/test_accuracy.py): quick, the exact canaries alone and "
        "under load and the logprob fingerprint; math adds the seeded math word problems; "
        "record, against a server you trust, keeps its canary answers and fingerprint as the "
        "baseline of this head, model, serve args, vLLM and engine (later runs hold a "
        "canary it got wrong to its recorded answer, one it got right to the truth)",
        "quick|math|record",
    ),
    Option(
        "accuracy-baseline",
        path,
        None,
        "an accuracy baseline file (JSON: canary answers and fingerprint): compared with "
        "when it exists, written by this run when it does not or with --spark-accuracy=record "
        "(carry a TP=1 or another cluster's baseline over); without it the run history keeps "
        "one per head, model, serve args, vLLM version and engine",
        "PATH",
    ),
    Option(
        "serving-concurrency",
        concurrency,
        16,
        "how many of the functional serving checks' requests (tool calls, reasoning, "
        "structured output, the SDK's) are in flight at once, all sent ahead "
        "together; the throughput levels, the soak, the open loop, the prefix cache, the long "
        "context and the accuracy checks always run alone. 1: one request at a time",
        "N",
    ),
    Option(
        "open-loop",
        boolean,
        False,
        "run the open-loop sweep: Poisson arrivals at rising request rates until the SLOs "
        "break (the profile's [open_loop] and [slo]); reports and gates the knee",
        flag=True,
        ini_type="bool",
    ),
    Option(
        "depth-sweep",
        depth_sweep,
        None,
        "run the depth x concurrency sweep in the Spark Arena's shape (llama-benchy: context "
        "depth 0..100000, pp 2048, tg 128, concurrency 1/2/5/10, a unique prefix per request, "
        "a heat-aware order); writes depth-sweep.json beside the results. arena (the bare "
        "option) or depths=0,4096;pp=2048;tg=128;c=1,2,5,10;cooldown=30",
        "off|arena|SPEC",
        const="arena",
    ),
    Option(
        "arena",
        path,
        None,
        "write the depth sweep as the Spark Arena publishes it into this directory: "
        "benchmark.csv in llama-benchy's columns (pp2048 @ d4096 (c5), ...) and "
        "metadata.json (recipe, cluster, benchmark); with --spark-depth-sweep or the "
        "spark-arena-v2 profile",
        "DIR",
    ),
)

OPTIONS_BY_ATTR = {option.attr: option for option in OPTIONS}
