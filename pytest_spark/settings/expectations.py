"""What the server is expected to do beyond plain chat, and which profile key says so:
printed at the start of the run and kept in the JSON results, so that a failure against a
server that is not vLLM reads as an expectation to change, not a mystery."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pytest_spark.settings.profiles import Profile

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
    source: str  # "profile NAME" or where the --spark-threshold override came from

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "capability": self.what,
            "expected": self.expected,
            "source": self.source,
        }


def server_expectations(
    profile: Profile, override_source: str = "--spark-threshold"
) -> list[Expectation]:
    """Each capability the serving checks expect, its profile key and where it was set."""
    return [
        Expectation(
            key,
            what,
            bool(profile.value(key)),
            override_source if key in profile.overridden else f"profile {profile.name}",
        )
        for key, what in CAPABILITIES
    ]


def expectations_lines(profile: Profile, override_source: str = "--spark-threshold") -> list[str]:
    """The terminal header's lines: each capability, yes or no, and the key that says so
    (and where it was set, when not by the profile)."""
    said = server_expectations(profile, override_source)
    lines = [f"pytest-dgx-spark: profile {profile.name} expects of the server:"]
    width = max(len(e.what) for e in said)
    for e in said:
        where = "" if e.source == f"profile {profile.name}" else f" (from {e.source})"
        lines.append(f"  {e.what:<{width}}  {'yes' if e.expected else 'no ':<3}  {e.key}{where}")
    if profile.name != "generic":
        lines.append(f"  {GENERIC_HINT}")
    return lines
