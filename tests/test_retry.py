"""The backoff policy for a connection lost during a long wait (remote/retry.py)."""

from __future__ import annotations

import pytest

from pytest_spark.access.retry import Backoff, RetryState, for_connection


def test_default_connect_timeout_gives_five_doubling_retries() -> None:
    policy = for_connection(10.0, 15.0)
    assert policy.delays == (1.0, 2.0, 4.0, 8.0, 10.0)  # capped at the connect timeout
    assert policy.attempts == 5
    assert policy.window_s == 25.0
    assert policy.attempt_s == 20.0  # reopen a channel, then a fresh connect
    assert policy.budget_s == 25.0 + 6 * 20.0
    assert "5 retries after 1, 2, 4, 8, 10 s" in policy.describe()


@pytest.mark.parametrize("timeout", [0.5, 1.0, 2.0, 3.0, 10.0, 30.0, 120.0])
def test_policy_is_bounded_and_derived_from_the_connect_timeout(timeout: float) -> None:
    policy = for_connection(timeout, 15.0)
    assert policy.attempts >= 3
    assert policy.window_s >= 2 * timeout  # a drop shorter than this heals
    assert all(d <= max(1.0, timeout) for d in policy.delays)
    assert list(policy.delays) == sorted(policy.delays)
    assert policy.budget_s == policy.window_s + (policy.attempts + 1) * policy.attempt_s
    assert policy.attempt_s == max(2 * timeout, 15.0)


def test_short_connect_timeout() -> None:
    assert for_connection(2.0, 15.0).delays == (1.0, 2.0, 2.0)


def test_retry_state_gives_up_after_the_attempts() -> None:
    state = RetryState(for_connection(10.0, 15.0), started=0.0, last_error="refused")
    now, delays = 0.0, []
    while (delay := state.failed(now, f"error {len(delays)}")) is not None:
        assert not state.due(now + delay - 0.01) and state.due(now + delay)
        delays.append(delay)
        now += delay + 1.0  # each attempt fails after a second
    assert delays == [1.0, 2.0, 4.0, 8.0, 10.0]
    assert state.retries == 5 and state.last_error == "error 5"
    assert now <= state.policy.budget_s


def test_retry_state_gives_up_when_the_budget_is_spent() -> None:
    policy = Backoff(delays=(1.0, 2.0, 4.0), attempt_s=5.0)  # budget 7 + 4 * 5 = 27 s
    state = RetryState(policy, started=0.0, last_error="")
    assert state.failed(0.0, "timed out") == 1.0
    assert state.failed(21.0, "timed out") is None  # 21 + 2 + 5 > 27: report now
    assert state.retries == 1
