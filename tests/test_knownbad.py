"""Known-bad versions (issue #28 §2): the match forms, the built-in deny entries against
recorded driver strings (fixtures/knownbad/README.md names the sources), allow entries,
the failure's words, and ownership: a node on a denied driver is one failure, not also a
nodes-alike one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_spark.infra.alike.check import check_host_alike
from pytest_spark.infra.alike.knownbad_check import check_known_bad, denied_nodes, rule_matches
from pytest_spark.infra.alike.knownbad_parse import Value, parse_pattern, version_key
from pytest_spark.infra.alike.parse import ContainerFacts, NcclLibrary, parse_container_facts
from pytest_spark.infra.alike.probe import CONTAINER_SCRIPT, Fact, NodeAlike, parse_alike_probe
from pytest_spark.infra.errors import ParseError
from pytest_spark.settings.profiles import ProfileError, load_profile
from pytest_spark.settings.sections import KnownBadSection, VersionRule

ROOT = Path(__file__).resolve().parents[1]
H, W = "spark-head", "spark-worker-1"
EUGR_NCCL = "2.31.2+cuda13.0"  # eugr/spark-vllm-docker#411: NCCL built from `main`


def drivers() -> list[str]:
    text = (ROOT / "fixtures" / "knownbad" / "driver_versions.txt").read_text()
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


@pytest.fixture(scope="module")
def healthy() -> dict[str, NodeAlike]:
    alike = ROOT / "fixtures" / "alike"
    return {
        H: parse_alike_probe((alike / "probe_head_healthy.txt").read_text()),
        W: parse_alike_probe((alike / "probe_worker_healthy.txt").read_text()),
    }


@pytest.fixture(scope="module")
def builtin() -> KnownBadSection:
    return load_profile("dgx-spark-2node").known_bad


def matches(spec: str, text: str, sha: str | None = None) -> bool:
    return parse_pattern(spec).matches(Value(text, sha))


# ------------------------------------------------------------------------ match forms


def test_prefix_forms() -> None:
    for spec in ("590.", "590.x", "590.*", "590"):
        assert matches(spec, "590.48.01"), spec
        assert not matches(spec, "580.95.05"), spec
    assert not matches("590", "5901.1")
    assert matches("580.95.05", "580.95.05")
    assert matches("28.45.", "28.45.4028 (NVD0000000087)")


def test_range_compares_numbers_not_text() -> None:
    assert version_key("580.95.05") == (580, 95, 5)
    assert version_key("28.45.4028 (NVD0000000087)") == (28, 45, 4028)
    assert version_key("n/a") is None
    assert matches(">=590 <591", "590.48.01")
    assert not matches(">=590, <591", "591.0")
    assert matches("<580.126", "580.95.05")  # 95 < 126, though "95" > "126" as text
    assert not matches(">=590", "unknown")


def test_regex_and_sha256() -> None:
    assert matches("re:^2\\.28\\.9", "2.28.9+cuda13.0")
    assert not matches("re:^2\\.28\\.9", EUGR_NCCL)
    assert matches("sha256:A7F420A1", "2.28.9", "a7f420a1" + "0" * 56)
    assert not matches("sha256:a7f420a1", "2.28.9", "c0db9360" + "0" * 56)
    assert not matches("sha256:a7f420a1", "2.28.9", None)


@pytest.mark.parametrize("bad", ["re:(", "sha256:xyz", ">=abc", "5 9 0", ""])
def test_bad_patterns_name_the_forms(bad: str) -> None:
    with pytest.raises(ParseError):
        parse_pattern(bad)


# ------------------------------------------------------------------ built-in entries


def test_builtin_driver_entry_against_recorded_strings(builtin: KnownBadSection) -> None:
    rule = next(r for r in builtin.deny if r.component == "driver")
    hit = [d for d in drivers() if rule_matches(rule, Value(d))]
    assert hit == ["590.48.01"]
    assert "CUDAGraph capture deadlock" in rule.reason
    assert "2026-03-12" in rule.source and "TP=4" in rule.scope


def test_builtin_nccl_entry_waits_for_evidence(
    healthy: dict[str, NodeAlike], builtin: KnownBadSection
) -> None:
    rule = next(r for r in builtin.deny if r.component == "nccl")
    assert rule.match == () and "PR #103" in rule.source
    c = healthy[W].container
    assert c is not None and c.nccl_loaded is not None
    eugr = replace(c, nccl=(replace(c.nccl_loaded, version=EUGR_NCCL),))
    nodes = {n: replace(f, container=eugr) for n, f in healthy.items()}
    f = check_known_bad(nodes, builtin)
    assert f.ok, f.message
    assert "no match yet (NCCL library: add the evidence)" in f.message


def test_healthy_nodes_pass(healthy: dict[str, NodeAlike], builtin: KnownBadSection) -> None:
    f = check_known_bad(healthy, builtin)
    assert f.ok, f.message
    assert f.measured[W]["NVIDIA driver"] == "580.95.05"


# ------------------------------------------------------------------------- failures


def test_denied_driver_fails_once_naming_everything(
    healthy: dict[str, NodeAlike], builtin: KnownBadSection
) -> None:
    nodes = {**healthy, W: replace(healthy[W], driver=Fact("590.48.01"), cuda=Fact("13.1"))}
    f = check_known_bad(nodes, builtin)
    assert not f.ok and f.node == W
    for words in (
        "spark-worker-1: NVIDIA driver 590.48.01",
        "'590.'",
        "CUDAGraph capture deadlock",
        "eugr/spark-vllm-docker README.md, changelog 2026-03-12",
        "scope: stated for that TP=4 recipe",
        "Fix: install the 580.x driver branch",
    ):
        assert words in f.message, words
    # nodes-alike leaves the denied driver (and the CUDA version it brings) to this check
    owned = denied_nodes(nodes, builtin)
    assert owned == {"driver": {W}}
    host = check_host_alike(H, nodes, owned)
    assert host.ok, host.message
    assert "NVIDIA driver of spark-worker-1 left out" in host.message
    assert not check_host_alike(H, nodes).ok  # without the ownership it would fail too


def test_other_difference_still_fails_nodes_alike(
    healthy: dict[str, NodeAlike], builtin: KnownBadSection
) -> None:
    odd = replace(healthy[W], driver=Fact("590.48.01"), kernel=Fact("6.17.0-1014-nvidia"))
    nodes = {**healthy, W: odd}
    host = check_host_alike(H, nodes, denied_nodes(nodes, builtin))
    assert not host.ok and "kernel release" in host.message
    assert "NVIDIA driver: " not in host.message


def test_user_entries_and_allow_override(healthy: dict[str, NodeAlike]) -> None:
    sha = "c0db9360" + "1" * 56
    c = healthy[W].container
    assert c is not None
    lib = NcclLibrary("/usr/lib/libnccl.so.2", "/usr/lib/libnccl.so.2.28.9", 1, sha, "2.28.9")
    nodes = {
        **healthy,
        W: replace(healthy[W], container=ContainerFacts("3.12", None, None, (lib,))),
    }
    deny = VersionRule("nccl", ("sha256:c0db9360",), "slow dev build", "my sweep", fix="rebuild")
    f = check_known_bad(nodes, KnownBadSection(deny=(deny,)))
    assert not f.ok and f.node == W
    assert "NCCL library 2.28.9 (/usr/lib/libnccl.so.2, sha256 c0db9360" in f.message
    assert "[source: my sweep]" in f.message and "Fix: rebuild" in f.message
    allow = VersionRule("nccl", ("2.28.9",), "measured 23 GB/s here")
    f = check_known_bad(nodes, KnownBadSection(deny=(deny,), allow=(allow,)))
    assert f.ok and "allowed by '2.28.9' (measured 23 GB/s here)" in f.message


def test_unreadable_value_is_said_not_failed(
    healthy: dict[str, NodeAlike], builtin: KnownBadSection
) -> None:
    lost = replace(healthy[W], driver=Fact(None, "nvidia-smi: No devices were found"))
    f = check_known_bad({**healthy, W: lost}, builtin)
    assert f.ok and "NVIDIA driver not read on spark-worker-1" in f.message


def test_bad_pattern_in_profile_fails_with_the_fix(healthy: dict[str, NodeAlike]) -> None:
    f = check_known_bad(healthy, KnownBadSection(deny=(VersionRule("driver", ("re:(",)),)))
    assert not f.ok and "cannot read a [known_bad] entry" in f.message


# ------------------------------------------------------------------------- profiles


def test_profile_entries_add_to_the_parent(tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(
        'extends = "sim"\n'
        "[[known_bad.deny]]\n"
        'component = "cx7-firmware"\nmatch = ["28.39."]\nreason = "r"\nsource = "s"\n'
        "[[known_bad.allow]]\n"
        'component = "driver"\nmatch = ["590.48.01"]\n'
    )
    kb = load_profile(str(mine)).known_bad
    assert [r.component for r in kb.deny] == ["driver", "nccl", "cx7-firmware"]
    assert kb.allow == (VersionRule("driver", ("590.48.01",)),)


@pytest.mark.parametrize(
    "entry",
    [
        'component = "bios"\nmatch = ["1."]',
        'component = "driver"\nmatch = "590."',
        'component = "driver"\nmatch = ["590."]\nwhy = "x"',
    ],
)
def test_bad_profile_entry_is_refused(tmp_path: Path, entry: str) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(f'extends = "sim"\n[[known_bad.deny]]\n{entry}\n')
    with pytest.raises(ProfileError, match=r"\[known_bad\] deny = .*expected a list of tables"):
        load_profile(str(mine))


def test_build_id_read_from_the_library_and_matched(tmp_path: Path) -> None:
    """The image's python3 runs CONTAINER_SCRIPT: a libnccl with an ELF GNU Build ID note
    (namesz 4, descsz 20, type 3, "GNU") and the version string NCCL carries."""
    bid = bytes(range(1, 21))
    note = (4).to_bytes(4, "little") + (20).to_bytes(4, "little") + (3).to_bytes(4, "little")
    lib = tmp_path / "libnccl.so.2"
    lib.write_bytes(
        b"\x7fELF" + b"\0" * 60 + note + b"GNU\0" + bid + b"NCCL version 2.28.9+cuda13.0\0"
    )
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", CONTAINER_SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    facts = parse_container_facts(out)
    mine = next(x for x in facts.nccl if x.path == str(lib))
    assert mine.build_id == bid.hex() and mine.version == "2.28.9+cuda13.0"
    assert json.loads(out)["nccl"]
    assert matches(f"build-id:{bid.hex()[:12]}", "2.28.9", None) is False
    assert parse_pattern(f"build-id:{bid.hex()[:12]}").matches(Value("2.28.9", None, bid.hex()))
    assert not parse_pattern("build-id:ffffffff").matches(Value("2.28.9", None, bid.hex()))
