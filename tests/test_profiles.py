"""Threshold profiles: built-ins, files that extend them, typed sections validated on load,
single-threshold overrides."""

from __future__ import annotations

import dataclasses
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from pytest_spark.settings.profiles import BUILTIN_PROFILES, Profile, ProfileError, load_profile
from pytest_spark.settings.sections import SECTIONS, ProfileSections, known_keys


def test_builtin_reference_figures() -> None:
    p = load_profile("dgx-spark-2node")
    assert p.link.min_rate_gbps == 200
    assert p.link.min_mtu == 4200
    assert p.nccl.min_busbw_gbps == 21.875
    assert p.nccl.max_bytes <= 4 * 1024**3  # 16 GiB buffers froze Sparks
    assert p.throughput.min_decode_tok_s_1 == 20.0
    assert p.throughput.concurrency == (1, 4, 16)


def test_metrics_health_is_written_in_the_reference_profile() -> None:
    """[metrics_health] lives in the TOML with its reasoning, not only as code defaults."""
    text = resources.files("pytest_spark").joinpath("settings/profiles/dgx-spark-2node.toml")
    source = text.read_text()
    table = tomllib.loads(source)["metrics_health"]
    fields = {f.name for f in dataclasses.fields(SECTIONS["metrics_health"])}
    assert set(table) == fields == {"max_preemptions", "max_drain_s"}
    assert "# vLLM preempts a running request only when the KV cache" in source


def test_sim_extends_and_scales_bandwidth() -> None:
    sim, real = load_profile("sim"), load_profile("dgx-spark-2node")
    assert sim.link.min_rate_gbps == real.link.min_rate_gbps  # from the profile it extends
    assert sim.nccl.min_busbw_gbps < real.nccl.min_busbw_gbps / 50


@pytest.mark.parametrize("name", BUILTIN_PROFILES)
def test_builtin_values_have_their_declared_types(name: str) -> None:
    profile = load_profile(name)
    for section, cls in SECTIONS.items():
        values = getattr(profile, section)
        assert type(values) is cls
        for f in dataclasses.fields(cls):
            value = getattr(values, f.name)
            # the TOML integer 200 of a float figure is read as 200.0
            if "float" in str(f.type) and value is not None:
                assert type(value) is float, (section, f.name, value)


def test_sections_are_the_profiles_fields() -> None:
    """One declaration: ProfileSections' fields are the tables, Profile adds its header."""
    assert [f.name for f in dataclasses.fields(ProfileSections)] == list(SECTIONS)
    names = [f.name for f in dataclasses.fields(Profile)]
    assert names == [*SECTIONS, "name", "origin", "overridden", "set_by"]
    loaded = load_profile("sim")
    assert [type(getattr(loaded, s)) for s in SECTIONS] == list(SECTIONS.values())


def test_section_units_name_their_own_keys() -> None:
    """A section's UNITS names only keys it has (a renamed figure does not leave it behind)."""
    for section, cls in SECTIONS.items():
        assert set(cls.UNITS) <= {f.name for f in dataclasses.fields(cls)}, section


@pytest.mark.parametrize(
    ("key", "raw", "value"),
    [
        ("link.min_rate_gbps", "100", 100.0),
        ("nccl.min_busbw_gbps", "20.5", 20.5),
        ("nccl.max_bytes", "4194304", 4194304),
        ("reasoning.expected", "no", False),
        ("throughput.concurrency", "1;4", (1, 4)),
        ("nccl.one_twin_busbw_gbps", "12", 12.0),  # not in the file: its default is None
        ("tool_calls.auto_emits_calls", "false", False),
    ],
)
def test_override_keeps_the_type(key: str, raw: str, value: object) -> None:
    p = load_profile("sim").with_overrides({key: raw})
    assert p.value(key) == value
    assert type(p.value(key)) is type(value)
    assert key in p.overridden


def test_override_leaves_the_rest_alone() -> None:
    base = load_profile("sim")
    p = base.with_overrides({"nccl.max_bytes": "4194304"})
    assert p.nccl.max_bytes == 4194304
    assert dataclasses.replace(p.nccl, max_bytes=base.nccl.max_bytes) == base.nccl
    assert p.link == base.link and p.name == base.name


@pytest.mark.parametrize(
    ("key", "raw", "expected"),
    [
        ("link.min_rate_gbps", "fast", "expected a number"),
        ("nccl.max_bytes", "4 MiB", "expected an integer"),
        ("reasoning.expected", "maybe", "expected true or false"),
        ("throughput.concurrency", "0;4", "expected a list of positive integers"),
        ("throughput.concurrency", ";", "expected a list of positive integers"),
    ],
)
def test_bad_override_names_the_type(key: str, raw: str, expected: str) -> None:
    with pytest.raises(ProfileError, match=rf"threshold {key}={raw!r}: {expected}"):
        load_profile("sim").with_overrides({key: raw})


def test_unknown_override_names_the_key_and_a_close_one() -> None:
    with pytest.raises(ProfileError) as info:
        load_profile("sim").with_overrides({"nccl.max_byte": "1"})
    message = str(info.value)
    assert "unknown threshold 'nccl.max_byte' (did you mean nccl.max_bytes?)" in message
    # the table's own keys are listed, not every key of every table (~120; issue #25 §5)
    assert "[nccl] has: min_busbw_gbps, min_bytes, max_bytes" in message
    assert "link.min_rate_gbps" not in message
    assert set(known_keys()) >= {"nccl.max_bytes", "throughput.concurrency"}


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "lab.toml"
    path.write_text(text)
    return str(path)


def test_file_profile_extends_builtin(tmp_path: Path) -> None:
    ref = _write(tmp_path, 'name = "lab"\nextends = "sim"\n[nccl]\nmax_bytes = 4194304\n')
    p = load_profile(ref)
    assert (p.name, p.origin) == ("lab", ref)
    assert p.nccl.max_bytes == 4194304
    assert p.nccl.min_busbw_gbps == load_profile("sim").nccl.min_busbw_gbps


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'extends = "sim"\n[nccl]\nmin_busbw_gbps = "fast"\n',
            "lab.toml: [nccl] min_busbw_gbps = 'fast' (a string): expected a number",
        ),
        (
            'extends = "sim"\n[link]\nmin_mtu = 4200.5\n',
            "lab.toml: [link] min_mtu = 4200.5 (a number): expected an integer",
        ),
        (
            'extends = "sim"\n[reasoning]\nexpected = "yes"\n',
            "lab.toml: [reasoning] expected = 'yes' (a string): expected true or false",
        ),
        (
            'extends = "sim"\n[link]\nmin_rate_gbps = true\n',
            "lab.toml: [link] min_rate_gbps = True (a boolean): expected a number",
        ),
        (
            'extends = "sim"\n[throughput]\nconcurrency = [1, "4"]\n',
            "lab.toml: [throughput] concurrency = [1, '4'] (a list): expected a list of "
            "positive integers",
        ),
        (
            'extends = "sim"\n[nccl]\nmax_byte = 1\n',
            "lab.toml: unknown key [nccl] max_byte (did you mean max_bytes?); [nccl] has: "
            "min_busbw_gbps, min_bytes, max_bytes",
        ),
        (
            'extends = "sim"\n[ncc]\nmax_bytes = 1\n',
            "lab.toml: unknown key 'ncc' (did you mean [nccl]?)",
        ),
        ('extends = "sim"\nlink = 3\n', "lab.toml: link = 3 (an integer): expected a table"),
        ('name = 3\nextends = "sim"\n', "lab.toml: name = 3 (an integer): expected a string"),
        (
            "[link]\nfabric_twins = 2\n",
            "lab.toml: [link] min_rate_gbps is not set (a number); set it, or extend a "
            "built-in profile",
        ),
    ],
)
def test_bad_file_names_file_key_value_and_type(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ProfileError) as info:
        load_profile(_write(tmp_path, text))
    assert message in str(info.value)
    assert str(tmp_path) in str(info.value)


def test_file_profile_with_cycle_is_refused(tmp_path: Path) -> None:
    a = tmp_path / "a.toml"
    a.write_text(f'extends = "{a}"\n')
    with pytest.raises(ProfileError, match="extends itself"):
        load_profile(str(a))


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[link\n")
    with pytest.raises(ProfileError, match=r"bad\.toml: invalid TOML"):
        load_profile(str(bad))


def test_switch_profile_keeps_the_playbook_floor_and_leaves_ranks_to_the_serve_args() -> None:
    switch, two = load_profile("dgx-spark-switch"), load_profile("dgx-spark-2node")
    assert switch.nccl.min_busbw_gbps == 21.875  # spark_cluster_setup.py MIN_NCCL_TEST_BW
    assert switch.link.min_rate_gbps == 200 and switch.link.fabric_twins == 2
    assert switch.throughput == two.throughput  # from the profile it extends
    # no fixed GPU count: ray status is held to the serve args' ranks (or one a node)
    assert switch.readiness.expected_gpus is None and two.readiness.expected_gpus is None


def test_sim_switch_profile_is_the_sims_with_the_switchs_n_node_budgets() -> None:
    """sparksim behind its switch: the sim's scaled floors (busbw compares across rank
    counts), dgx-spark-switch's doubled NCCL budget at the sim's scale, a latency ceiling
    for a 3-rank ring's twice the steps; chosen by default for --spark-sim with more than
    two nodes (the sim's switch topology)."""
    from pytest_spark.settings.resolve import sim_profile

    sim, switch = load_profile("sim"), load_profile("sim-switch")
    real_two, real_switch = load_profile("dgx-spark-2node"), load_profile("dgx-spark-switch")
    assert switch.nccl.min_busbw_gbps == sim.nccl.min_busbw_gbps
    assert sim.collectives.max_latency_us is not None
    assert switch.collectives.max_latency_us == 2 * sim.collectives.max_latency_us  # 3 ranks
    ratio = real_switch.nccl.timeout_s / real_two.nccl.timeout_s
    assert switch.nccl.timeout_s == sim.nccl.timeout_s * ratio == 240
    assert switch.readiness == sim.readiness and switch.link == sim.link
    assert sim_profile("emulator", 2) == "sim" and sim_profile("emulator", 3) == "sim-switch"
    assert sim_profile("vllm-cpu", 4) == "sim-vllm-cpu"


def test_generic_profile_expects_no_vllm_only_behaviour() -> None:
    """``--spark-profile=generic``: any OpenAI-compatible server (issue #25 section 2)."""
    generic, base = load_profile("generic"), load_profile("dgx-spark-2node")
    assert "generic" in BUILTIN_PROFILES
    assert generic.name == "generic"
    assert generic.reasoning.expected is False
    assert generic.tool_calls.auto_emits_calls is False
    assert generic.tool_calls.expected is True
    assert generic.structured_output.expected is True  # the OpenAI API's response_format
    assert generic.prefix_cache.expected is False  # read from vLLM's /metrics
    assert generic.link == base.link and generic.nccl == base.nccl  # extends dgx-spark-2node


def test_vllm_flag_fixes_also_name_the_profile_switch() -> None:
    """A fix that advises a vLLM flag also names the profile key that drops the
    expectation, for a server that is not vLLM."""
    from pytest_spark.infra.servecmd import parse_serve_args_text
    from pytest_spark.infra.server.check import check_reasoning_parser, check_tool_parser

    cmd = parse_serve_args_text("vllm serve /models/qwen")
    assert cmd is not None
    reasoning = check_reasoning_parser(cmd, expected=True, profile="dgx-spark-2node")
    tools = check_tool_parser(cmd, expected=True, profile="dgx-spark-2node")
    assert "--reasoning-parser" in reasoning.message
    assert "--spark-threshold=reasoning.expected=false" in reasoning.message
    assert "--spark-profile=generic" in reasoning.message
    assert "--tool-call-parser" in tools.message
    assert "--spark-threshold=tool_calls.expected=false" in tools.message


def test_ignored_response_format_fix_names_the_profile_switch() -> None:
    from pytest_spark.serving.validate.structured import FIX_IGNORED

    assert "--structured-outputs-config" in FIX_IGNORED
    assert "--spark-threshold=structured_output.expected=false" in FIX_IGNORED
