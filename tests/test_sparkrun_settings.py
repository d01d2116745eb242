"""--spark-cluster and --spark-recipe: sparkrun's saved clusters, job files and v2 recipes
(fixtures/sparkrun/settings/, written by sparkrun 0.4.2 itself where it writes them) read
as data, and resolved into the settings through the real option, ini and env machinery."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from pytest_spark.settings.expectations import expectations_lines, server_expectations
from pytest_spark.settings.resolve import Settings, resolve
from pytest_spark.settings.sparkrun import (
    DEFAULT_CLUSTER,
    SparkrunError,
    cache_root,
    config_root,
    default_cluster_name,
    find_job,
    read_cluster,
    read_job,
    read_recipe,
    saved_cluster_names,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "sparkrun" / "settings"
RECIPES = FIXTURES / "recipes"
QWEN = RECIPES / "qwen3.5-122b-a10b-fp8-vllm.yaml"
GPT_OSS = RECIPES / "gpt-oss-120b-defaults-vllm.yaml"
JOB = FIXTURES / "cache" / "jobs" / "b17d2e953e05a037_710bfccf3235.yaml"


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A copy of the fixtures' sparkrun state (config and cache roots) to change freely."""
    root = tmp_path / "sparkrun"
    shutil.copytree(FIXTURES / "config", root / "config")
    shutil.copytree(FIXTURES / "cache", root / "cache")
    return root


@pytest.fixture
def env(state: Path, tmp_path: Path) -> dict[str, str]:
    return {
        "HOME": str(tmp_path / "home"),
        "SPARKRUN_CONFIG_DIR": str(state / "config"),
        "SPARKRUN_CACHE_DIR": str(state / "cache"),
    }


# ------------------------------------------------------------------- where sparkrun keeps it


def test_roots_follow_sparkrun_not_xdg(tmp_path: Path) -> None:
    home = tmp_path / "h"
    plain = {"HOME": str(home), "XDG_CONFIG_HOME": "/x/config", "XDG_CACHE_HOME": "/x/cache"}
    assert config_root(plain) == home / ".config" / "sparkrun"
    assert cache_root(plain) == home / ".cache" / "sparkrun"
    moved = {**plain, "SPARKRUN_CONFIG_DIR": str(tmp_path / "c")}
    assert config_root(moved) == tmp_path / "c"
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.yaml").write_text(f"cache_dir: {tmp_path / 'k'}\n")
    # config.yaml's cache_dir comes before $SPARKRUN_CACHE_DIR, as in sparkrun's config
    assert cache_root({**moved, "SPARKRUN_CACHE_DIR": "/elsewhere"}) == tmp_path / "k"


# --------------------------------------------------------------------------- clusters


def test_saved_cluster_and_default(env: dict[str, str]) -> None:
    assert saved_cluster_names(env) == ["bench4", "mylab"]
    assert default_cluster_name(env) == "mylab"
    lab = read_cluster("mylab", env)
    assert (lab.head, lab.workers, lab.user) == ("spark-a.lab", ("spark-b.lab",), "ops")
    assert read_cluster(DEFAULT_CLUSTER, env) == lab
    bench = read_cluster("bench4", env)
    assert bench.user is None and bench.workers == ("spark-2.lab", "spark-3.lab", "spark-4.lab")


def test_unknown_cluster_lists_the_saved_ones(env: dict[str, str]) -> None:
    with pytest.raises(SparkrunError) as err:
        read_cluster("lab2", env)
    text = str(err.value)
    assert "clusters/lab2.yaml does not exist" in text
    assert "saved clusters: bench4, mylab" in text and "sparkrun cluster create" in text


def test_default_that_names_a_deleted_cluster_is_none(env: dict[str, str], state: Path) -> None:
    (state / "config" / "clusters" / "mylab.yaml").unlink()
    assert default_cluster_name(env) is None
    with pytest.raises(SparkrunError, match=r"names none that exists \(saved clusters: bench4\)"):
        read_cluster(DEFAULT_CLUSTER, env)


def test_cluster_file_not_a_mapping(env: dict[str, str]) -> None:
    other = {**env, "SPARKRUN_CONFIG_DIR": str(FIXTURES / "other")}
    with pytest.raises(SparkrunError, match=r"listed\.yaml: a YAML list, not a mapping"):
        read_cluster("listed", other)


# ---------------------------------------------------------------------------- recipes


def test_recipe_with_a_command_template() -> None:
    recipe = read_recipe(QWEN)
    assert recipe.origin == f"recipe {QWEN}" and recipe.path == QWEN
    assert (recipe.model, recipe.runtime, recipe.min_nodes) == (
        "Qwen/Qwen3.5-122B-A10B-FP8",
        "vllm",
        2,
    )
    assert (recipe.served_model_name, recipe.port, recipe.nodes) == ("qwen3.5-122b", 8000, 2)
    assert recipe.max_model_len == 262144
    assert (recipe.tool_call_parser, recipe.reasoning_parser) == ("qwen3_coder", "qwen3")
    assert recipe.fixed_env() == {"VLLM_MARLIN_USE_ATOMIC_ADD": "1", "NCCL_CUMEM_ENABLE": "0"}
    command = recipe.rendered_command()
    assert command is not None and command.startswith("vllm serve Qwen/Qwen3.5-122B-A10B-FP8")
    assert "{" not in command and "\\" not in command


def test_overrides_win_over_defaults_over_runtime_defaults() -> None:
    recipe = read_recipe(QWEN).with_overrides({"port": 8001, "tensor_parallel": 4})
    assert (recipe.port, recipe.tensor_parallel, recipe.nodes) == (8001, 4, 4)
    assert recipe.value("data_parallel") is None  # no runtime default for it
    plain = read_recipe(GPT_OSS)
    assert plain.pipeline_parallel == 1  # the runtime's default: not in the recipe


def test_recipe_without_command_reads_the_defaults() -> None:
    recipe = read_recipe(GPT_OSS)
    assert recipe.command is None and recipe.rendered_command() is None
    assert (recipe.served_model_name, recipe.nodes, recipe.max_model_len) == (
        "openai/gpt-oss-120b",
        2,
        131072,
    )
    assert recipe.tool_call_parser is None and recipe.reasoning_parser is None
    # {ib_hca} is filled in on the node at launch: not a value to compare here
    assert recipe.fixed_env() == {"TIKTOKEN_ENCODINGS_BASE": "/cache/tiktoken"}
    assert recipe.expected_capabilities() == {
        "reasoning.expected": (False, "no reasoning_parser"),
        "tool_calls.auto_emits_calls": (False, "no tool_call_parser"),
    }


def test_a_flag_written_in_the_command_is_what_runs(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(
        'recipe_version: "2"\nmodel: org/m\ndefaults:\n  reasoning_parser: qwen3\n'
        "  max_model_len: 8k\ncommand: vllm serve {model} --max-model-len {max_model_len} "
        "--served-model-name=fixed --tool-call-parser hermes --port 9000\n"
    )
    recipe = read_recipe(path)
    assert recipe.served_model_name == "fixed" and recipe.port == 9000
    assert recipe.max_model_len == 8192
    # the default names a parser the command never passes: vLLM runs without one
    assert (recipe.reasoning_parser, recipe.tool_call_parser) == (None, "hermes")


@pytest.mark.parametrize(
    ("path", "words"),
    [
        (RECIPES / "eugr-v1.yaml", "recipe_version '1'; this reads v2 recipes"),
        (RECIPES / "broken.yaml", "broken.yaml: not YAML"),
        (RECIPES / "missing.yaml", "missing.yaml: no such recipe file"),
        (RECIPES, "a directory; give the recipe's YAML file"),
    ],
    ids=["v1", "not-yaml", "missing", "directory"],
)
def test_bad_recipe_names_the_file_and_the_fix(path: Path, words: str) -> None:
    with pytest.raises(SparkrunError) as err:
        read_recipe(path)
    assert words in str(err.value)


def test_reading_a_recipe_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "hooks.yaml"
    path.write_text(
        'recipe_version: "2"\nmodel: org/m\n'
        f"pre_exec:\n  - touch {marker}\npost_exec:\n  - touch {marker}\n"
        f"command: vllm serve {{model}} $(touch {marker}) `touch {marker}`\n"
        "defaults:\n  port: !!python/object/apply:os.system ['true']\n"
    )
    with pytest.raises(SparkrunError, match="not YAML"):  # safe_load refuses the tag
        read_recipe(path)
    path.write_text(path.read_text().replace("!!python/object/apply:os.system ['true']", "8000"))
    recipe = read_recipe(path)
    assert recipe.rendered_command() == f"vllm serve org/m $(touch {marker}) `touch {marker}`"
    assert not marker.exists()


# ------------------------------------------------------------------------------- jobs


def test_job_file_as_sparkrun_writes_it() -> None:
    job = read_job(JOB)
    assert job.cluster_id == "sparkrun_b17d2e953e05a037_710bfccf3235"
    assert (job.cluster, job.ssh_user, job.hosts) == (
        "mylab",
        "ops",
        ("spark-a.lab", "spark-b.lab"),
    )
    assert (job.port, job.tensor_parallel, job.served_model_name) == (8001, 2, "qwen3.5-122b")
    assert job.ib_ip_map == {"spark-a.lab": "192.168.177.11", "spark-b.lab": "192.168.177.12"}
    assert job.effective_container_image == "ghcr.io/spark-arena/dgx-vllm-eugr-nightly:latest"
    assert job.recipe_ref == "/home/ops/recipes/qwen3.5-122b-a10b-fp8-vllm.yaml"
    recipe = job.recipe()
    assert recipe is not None and recipe.origin == f"sparkrun job {JOB}" and recipe.path is None
    # its -o port=8001 -o max_model_len=131072 over the recipe's defaults
    assert (recipe.port, recipe.max_model_len, recipe.nodes) == (8001, 131072, 2)
    assert recipe.runtime == "vllm-distributed"


def test_find_job_by_hosts(env: dict[str, str], state: Path) -> None:
    assert find_job(("spark-a.lab", "spark-b.lab"), env) is not None
    assert find_job(("spark-b.lab", "spark-a.lab"), env) is None  # another head
    assert find_job(("spark-a.lab", "spark-c.lab"), env) is None
    (state / "cache" / "jobs" / "junk.yaml").write_text("[not, a, job]\n")
    newer = state / "cache" / "jobs" / "aaaa.yaml"
    newer.write_text(
        JOB.read_text()
        .replace("cluster_id: sparkrun_b17d2e953e05a037_710bfccf3235", "cluster_id: sparkrun_x")
        .replace("started_at: 1796510560.6712456", "started_at: 1796510999.0")
    )
    found = find_job(("spark-a.lab", "spark-b.lab", "spark-c.lab"), env)
    assert found is not None and found.cluster_id == "sparkrun_x"


# -------------------------------------------------- resolution (option, ini, env machinery)


@pytest.fixture
def resolved(pytester: pytest.Pytester, env: dict[str, str]):  # type: ignore[no-untyped-def]
    def run(*args: str, extra_env: dict[str, str] | None = None) -> Settings:
        # in this process pytest_spark is imported already: its rewrite warning is moot
        config = pytester.parseconfig("-W", "ignore::pytest.PytestAssertRewriteWarning", *args)
        return resolve(config, {**env, **(extra_env or {})})

    return run


def test_cluster_gives_head_workers_and_user(resolved, state: Path) -> None:  # type: ignore[no-untyped-def]
    # a cluster whose hosts run no job: only the cluster's facts
    (state / "cache" / "jobs" / JOB.name).unlink()
    s = resolved("--spark-cluster=mylab")
    assert (s.head, s.workers, s.user, s.cluster) == (
        "spark-a.lab",
        ("spark-b.lab",),
        "ops",
        "mylab",
    )
    for attr in ("head", "workers", "user"):
        assert s.source(attr) == "sparkrun cluster mylab"
    assert s.recipe is None and s.model is None and s.source("model") == "default"


def test_bare_cluster_option_is_the_default_cluster(resolved, pytester: pytest.Pytester) -> None:  # type: ignore[no-untyped-def]
    s = resolved("--spark-cluster")
    assert (s.cluster, s.head) == ("mylab", "spark-a.lab")
    assert s.source("cluster") == "command line --spark-cluster"


def test_cluster_from_ini_and_env(resolved, pytester: pytest.Pytester) -> None:  # type: ignore[no-untyped-def]
    pytester.makeini("[pytest]\nspark_cluster = bench4\n")
    s = resolved(f"--spark-recipe={GPT_OSS}")
    assert s.source("cluster") == "spark_cluster in tox.ini" and s.cluster == "bench4"
    s = resolved(extra_env={"SPARK_CLUSTER": "mylab"})
    assert s.source("cluster") == "environment SPARK_CLUSTER" and s.head == "spark-a.lab"


def test_explicit_user_wins_and_a_different_head_conflicts(resolved) -> None:  # type: ignore[no-untyped-def]
    s = resolved("--spark-cluster=mylab", "--spark-user=root", "--spark-head=spark-a.lab")
    assert (s.user, s.source("user")) == ("root", "command line --spark-user")
    with pytest.raises(pytest.UsageError) as err:
        resolved("--spark-cluster=mylab", "--spark-head=10.0.0.9")
    assert str(err.value).startswith(
        "--spark-head 10.0.0.9 (from command line --spark-head) and --spark-cluster mylab"
    )
    assert "head spark-a.lab) name different nodes: give one of them" in str(err.value)


def test_unknown_cluster_is_a_usage_error_naming_the_source(resolved) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(pytest.UsageError) as err:
        resolved(extra_env={"SPARK_CLUSTER": "nope"})
    text = str(err.value)
    assert "no saved sparkrun cluster 'nope'" in text and "saved clusters: bench4, mylab" in text
    assert text.endswith("(from environment SPARK_CLUSTER)")
    with pytest.raises(pytest.UsageError, match="is not a sparkrun cluster name"):
        resolved("--spark-cluster=../etc")


def test_running_job_sets_the_expectations(resolved, state: Path) -> None:  # type: ignore[no-untyped-def]
    s = resolved("--spark-cluster=mylab")
    job = state / "cache" / "jobs" / JOB.name
    assert s.recipe is not None and s.recipe.origin == f"sparkrun job {job}"
    assert s.source("recipe") == f"sparkrun job sparkrun_b17d2e953e05a037_710bfccf3235 ({job})"
    assert (s.model, s.port) == ("qwen3.5-122b", 8001)  # the job's -o port=8001
    assert s.source("port") == s.recipe.origin
    assert s.recipe.max_model_len == 131072
    assert s.profile.reasoning.expected and s.profile.tool_calls.auto_emits_calls


def test_recipe_sets_the_expectations_with_the_jobs_overrides(resolved) -> None:  # type: ignore[no-untyped-def]
    s = resolved(
        "--spark-head=spark-a.lab", "--spark-workers=spark-b.lab", f"--spark-recipe={QWEN}"
    )
    assert s.recipe is not None
    assert s.source("recipe") == "command line --spark-recipe"
    assert s.recipe.origin == (
        f"recipe {QWEN} with sparkrun job sparkrun_b17d2e953e05a037_710bfccf3235's "
        "-o max_model_len=131072, port=8001"
    )
    assert (s.port, s.recipe.max_model_len, s.recipe.path) == (8001, 131072, QWEN)
    # given options win over the recipe
    s = resolved(
        "--spark-cluster=mylab", f"--spark-recipe={QWEN}", "--spark-port=9000", "--spark-model=x"
    )
    assert (s.port, s.model) == (9000, "x")


def test_recipe_and_profile_disagree_once_in_the_header(resolved, state: Path) -> None:  # type: ignore[no-untyped-def]
    (state / "cache" / "jobs" / JOB.name).unlink()
    s = resolved("--spark-cluster=mylab", f"--spark-recipe={GPT_OSS}")
    assert not s.profile.reasoning.expected and not s.profile.tool_calls.auto_emits_calls
    said = {e.key: e for e in server_expectations(s.profile, s.source("threshold"), s.recipe)}
    assert said["reasoning.expected"].source == f"recipe {GPT_OSS}"
    assert said["structured_output.expected"].source == "profile dgx-spark-2node"
    lines = expectations_lines(s.profile, s.source("threshold"), s.recipe)
    disagree = [line for line in lines if "disagree" in line]
    assert disagree == [
        f"pytest-dgx-spark: recipe {GPT_OSS} and profile dgx-spark-2node disagree: "
        "reasoning.expected no (no reasoning_parser; profile dgx-spark-2node: yes); "
        "tool_calls.auto_emits_calls no (no tool_call_parser; profile dgx-spark-2node: yes). "
        "The recipe is what runs, so its word is taken (--spark-threshold=KEY=VALUE sets one)"
    ]
    # a key set by --spark-threshold keeps its value, and the recipe stays quiet about it
    s = resolved(
        "--spark-cluster=mylab",
        f"--spark-recipe={GPT_OSS}",
        "--spark-threshold=reasoning.expected=true",
    )
    assert s.profile.reasoning.expected
    assert s.recipe is not None and "reasoning.expected" not in " ".join(s.recipe.notes)


def test_recipe_agreeing_with_the_profile_says_nothing(resolved) -> None:  # type: ignore[no-untyped-def]
    s = resolved("--spark-cluster=mylab", f"--spark-recipe={QWEN}")
    assert s.recipe is not None and s.recipe.notes == ()


def test_node_count_from_tp_x_pp(resolved, state: Path) -> None:  # type: ignore[no-untyped-def]
    # four saved hosts, a TP 2 recipe: the first two serve, as sparkrun places it
    s = resolved("--spark-cluster=bench4", f"--spark-recipe={GPT_OSS}")
    assert (s.head, s.workers) == ("spark-1.lab", ("spark-2.lab",))
    assert s.source("workers") == f"sparkrun cluster bench4, cut to recipe {GPT_OSS}'s 2"
    assert s.recipe is not None and any(
        "checking spark-1.lab, spark-2.lab" in n for n in s.recipe.notes
    )
    # typed by hand: no guessing which serve
    with pytest.raises(pytest.UsageError, match=r"serves on TP 2 x PP 1 = 2 nodes; 3 given"):
        resolved("--spark-head=a", "--spark-workers=b,c", f"--spark-recipe={GPT_OSS}")
    with pytest.raises(pytest.UsageError, match=r"= 2 nodes; 1 given \(a, from command line"):
        resolved("--spark-head=a", f"--spark-recipe={GPT_OSS}")


def test_job_of_another_model_is_not_applied(resolved) -> None:  # type: ignore[no-untyped-def]
    s = resolved("--spark-cluster=mylab", f"--spark-recipe={GPT_OSS}")
    assert s.recipe is not None and s.port == 8000
    assert any("serves Qwen/Qwen3.5-122B-A10B-FP8, not the recipe's" in n for n in s.recipe.notes)


def test_spark_job_names_the_job_file(resolved, state: Path) -> None:  # type: ignore[no-untyped-def]
    other = state / "cache" / "jobs" / "aaaa.yaml"
    other.write_text(
        JOB.read_text()
        .replace("cluster_id: sparkrun_b17d2e953e05a037_710bfccf3235", "cluster_id: sparkrun_x")
        .replace("started_at: 1796510560.6712456", "started_at: 1796510999.0")
        .replace("  port: 8001\n", "  port: 8002\n")
    )
    assert resolved("--spark-cluster=mylab").port == 8002  # the newest on the nodes
    named = "sparkrun_b17d2e953e05a037_710bfccf3235"
    assert resolved("--spark-cluster=mylab", f"--spark-job={named}").port == 8001
    s = resolved("--spark-cluster=mylab", "--spark-job=sparkrun_gone")
    assert s.recipe is None and s.port == 8000  # no such file: nothing is guessed


def test_no_job_lookup_when_launching_or_simulating(resolved) -> None:  # type: ignore[no-untyped-def]
    s = resolved("--spark-cluster=mylab", "--spark-launch")
    assert s.recipe is None and s.port == 8000


def test_bad_recipe_option_names_its_source(resolved) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(pytest.UsageError) as err:
        resolved(
            extra_env={
                "SPARK_API_URL": "http://127.0.0.1:9",
                "SPARK_RECIPE": str(RECIPES / "eugr-v1.yaml"),
            }
        )
    text = str(err.value)
    assert text.startswith(
        f"Invalid value '{RECIPES / 'eugr-v1.yaml'}' for spark_recipe from environment SPARK_RECIPE"
    )
    assert "recipe_version '1'" in text


def test_header_and_asked_for(
    pytester: pytest.Pytester, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through a real session: SPARK_CLUSTER alone asks for the plugin, and the header says
    the disagreement once."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SPARK_CLUSTER", "mylab")
    monkeypatch.setenv("SPARK_RECIPE", str(GPT_OSS))
    pytester.makepyfile(
        "def test_show(pytestconfig):\n"
        "    from pytest_spark.state import SETTINGS_KEY\n"
        "    s = pytestconfig.stash[SETTINGS_KEY]\n"
        "    print('HEAD', s.head, 'FROM', s.source('head'))\n"
    )
    result = pytester.runpytest_subprocess("-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*HEAD spark-a.lab FROM sparkrun cluster mylab"])
    assert result.stdout.str().count("disagree") == 1


# ------------------------------------------------------- the recipe's env, in the env check


def test_serving_env_check_holds_the_recipes_env() -> None:
    from pytest_spark.infra.preflight.env_check import check_serving_env
    from pytest_spark.infra.preflight.probe import parse_container_env

    fabric = ["enP2p1s0f1np1", "enp1s0f1np1"]
    devs = ["roceP2p1s0f1", "rocep1s0f1"]
    node_ifs = {"lo": True, "mgmt0": True, "enp1s0f1np1": True, "enP2p1s0f1np1": True}
    healthy = FIXTURES.parent.parent / "preflight" / "container_env_healthy.json"
    env = parse_container_env(healthy.read_text())
    recipe = read_recipe(QWEN)
    wanted = (recipe.origin, recipe.fixed_env())

    def check(values: dict[str, str]):  # type: ignore[no-untyped-def]
        return check_serving_env(
            "spark-b.lab", "c", values, fabric, devs, node_ifs, recipe_env=wanted
        )

    assert check({**env, **recipe.fixed_env()}).ok
    found = check({**env, "VLLM_MARLIN_USE_ATOMIC_ADD": "0", "NCCL_CUMEM_ENABLE": "0"})
    assert not found.ok
    assert (
        f"not as the recipe sets it: VLLM_MARLIN_USE_ATOMIC_ADD=0 (recipe {QWEN} sets "
        "VLLM_MARLIN_USE_ATOMIC_ADD=1)" in found.message
    )
    assert "sparkrun run the recipe again" in found.message
    assert "NCCL_CUMEM_ENABLE=0 (" not in found.message  # as the recipe sets it
    # without a recipe, the same environment passes: the recipe is what adds the check
    assert check_serving_env(
        "spark-b.lab", "c", {**env, "VLLM_MARLIN_USE_ATOMIC_ADD": "0"}, fabric, devs, node_ifs
    ).ok
