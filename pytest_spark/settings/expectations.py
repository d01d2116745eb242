"""What the server is expected to do beyond plain chat, and which profile key says so:
printed at the start of the run and kept in the JSON results, so that a failure against a
server that is not vLLM reads as an expectation to change, not a mystery."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_spark.settings.profiles import Profile
from pytest_spark.settings.sparkrun import SparkRecipe

# (profile key, the capability in words)
CAPABILITIES = (
    ("reasoning.expected", "a reasoning field"),
    ("structured_output.expected", "response_format"),
    ("tool_calls.expected", "tool calls"),
    ("tool_calls.auto_emits_calls", "a call under tool_choice=auto"),
)
GENERIC_HINT = "not vLLM? --spark-profile=generic, or one key: --spark-threshold=KEY=false"


@dataclass(frozen=True)
class Expectation:
    key: str
    what: str
    expected: bool
    source: str  # "profile NAME", where the --spark-threshold override came from, or the recipe

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "capability": self.what,
            "expected": self.expected,
            "source": self.source,
        }


def _source(key: str, profile: Profile, override_source: str, recipe: SparkRecipe | None) -> str:
    if recipe is not None and key in recipe.profile_keys:
        return recipe.origin
    return override_source if key in profile.overridden else f"profile {profile.name}"


def server_expectations(
    profile: Profile,
    override_source: str = "--spark-threshold",
    recipe: SparkRecipe | None = None,
) -> list[Expectation]:
    """Each capability the serving checks expect, its profile key and where it was set
    (``recipe``: the sparkrun recipe that set some of them, settings.recipe)."""
    return [
        Expectation(
            key, what, bool(profile.value(key)), _source(key, profile, override_source, recipe)
        )
        for key, what in CAPABILITIES
    ]


def expectations_lines(
    profile: Profile,
    override_source: str = "--spark-threshold",
    recipe: SparkRecipe | None = None,
) -> list[str]:
    """The terminal header's lines: each capability, yes or no, and the key that says so
    (and where it was set, when not by the profile); then, once, what the sparkrun recipe
    says that the profile did not (``SparkRecipe.notes``)."""
    said = server_expectations(profile, override_source, recipe)
    lines = [f"pytest-dgx-spark: profile {profile.name} expects of the server:"]
    width = max(len(e.what) for e in said)
    for e in said:
        where = "" if e.source == f"profile {profile.name}" else f" (from {e.source})"
        lines.append(f"  {e.what:<{width}}  {'yes' if e.expected else 'no ':<3}  {e.key}{where}")
    if profile.name != "generic":
        lines.append(f"  {GENERIC_HINT}")
    if recipe is not None:
        lines += [f"pytest-dgx-spark: {note}" for note in recipe.notes]
    return lines


def coverage_lines(
    profile: Profile, head: str | None, workers: tuple[str, ...], sim: bool
) -> list[str]:
    """The header's warning when fewer nodes are given than the profile is for
    (``[preflight] nodes``): a head alone checks the head alone."""
    want, given = profile.preflight.nodes, 1 + len(workers)
    if sim or head is None or given >= want:
        return []
    return [
        f"pytest-dgx-spark: WARNING: {given} node given ({', '.join((head, *workers))}), "
        f"profile {profile.name} is for {want}: the other nodes' links, fitness and ranks go "
        "unchecked. Name them: --spark-workers=HOST,... (or --spark-cluster=NAME)"
    ]
