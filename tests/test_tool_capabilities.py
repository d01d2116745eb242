"""``auto_declined``: under tool_choice=auto, tell "the model chose plain text" (skippable
where the profile says the model does not emit calls) from a parser failure (never
skipped), on real vLLM 0.32.0 transcripts."""

from __future__ import annotations

from pathlib import Path

from transcript import read_turn

from pytest_spark.serving import ToolRequest, auto_declined
from pytest_spark.settings.profiles import load_profile

VLLM = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
SMOL = VLLM / "vllm-0.32.0-cpu"
QWEN = VLLM / "vllm-0.32.0-cpu-qwen2.5-0.5b"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}


def req(mode: str) -> ToolRequest:
    return ToolRequest((WEATHER,), mode, ("get_weather",), False)  # type: ignore[arg-type]


def test_plain_text_under_auto_is_the_models_choice() -> None:
    turn = read_turn(SMOL / "tools_auto.txt")  # SmolLM2 talks about Paris, calls nothing
    why = auto_declined(turn, req("auto"))
    assert why is not None
    assert why.startswith("the model answered in plain text with no tool markup")
    assert "Paris" in why


def test_markup_left_in_content_is_not_the_models_choice() -> None:
    """SmolLM2's `<tool_call>` left in content: a parser failure, never skipped."""
    turn = read_turn(SMOL / "tools_required.txt")
    assert turn.content is not None and "<tool_call>" in turn.content
    assert not turn.tool_calls
    assert auto_declined(turn, req("auto")) is None


def test_a_parsed_call_or_a_forced_mode_is_never_declined() -> None:
    called = read_turn(QWEN / "tools_required.txt")
    assert called.tool_calls
    assert auto_declined(called, req("auto")) is None
    plain = read_turn(SMOL / "tools_auto.txt")
    assert auto_declined(plain, req("required")) is None
    assert auto_declined(plain, req("named")) is None


def test_profiles_say_who_emits_calls_under_auto() -> None:
    assert load_profile("sim").tool_calls.auto_emits_calls is True
    cpu = load_profile("sim-vllm-cpu")
    assert cpu.tool_calls.auto_emits_calls is False
    assert cpu.reasoning.expected is False
    hang = cpu.readiness.hang_timeout_s
    assert hang is not None and hang >= 120
