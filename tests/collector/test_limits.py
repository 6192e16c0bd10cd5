"""The edge's per-key limits, pure: the session gate."""

from __future__ import annotations

import math

from rewardflow.collector.limits import SessionGate


def test_new_sessions_spend_the_keys_session_rate_and_known_ones_do_not() -> None:
    gate = SessionGate(rate=2.0, burst=3, remembered=10)
    assert gate.take("k", ["a", "b", "c"], now=0.0) == 0.0  # the burst
    assert gate.take("k", ["a", "b", "c", "a"], now=0.0) == 0.0  # known sessions cost nothing
    assert gate.take("k", ["d"], now=0.0) == 0.5  # a new one waits for the rate (2 a second)
    assert gate.take("other", ["d"], now=0.0) == 0.0  # each key has its own
    assert gate.take("k", ["a", "d"], now=0.5) == 0.0
    assert gate.take("k", [f"s{i}" for i in range(4)], now=10.0) == math.inf  # over the burst: never at once

    once = SessionGate(rate=1e-9, burst=1, remembered=10)
    assert once.take("k", (s for s in ["e", "e"]), now=0.0) == 0.0  # any iterable; a session counts once
    assert once.take("k", ["e"], now=0.0) == 0.0  # and is remembered
    assert once.take("k", ["f"], now=0.0) > 0


def test_a_refused_request_remembers_none_of_its_sessions() -> None:
    gate = SessionGate(rate=1.0, burst=2, remembered=10)
    assert gate.take("k", ["a", "b"], now=0.0) == 0.0
    assert gate.take("k", ["a", "c"], now=0.0) > 0  # c is new, and the bucket is empty
    assert gate.take("k", ["c"], now=0.0) > 0  # c was not remembered by the refused request


def test_a_key_remembers_its_latest_sessions_only() -> None:
    gate = SessionGate(rate=1000.0, burst=1000, remembered=3)
    gate.take("k", ["a", "b", "c", "d"], now=0.0)
    gate._buckets = type(gate._buckets)(rate=1e-9, burst=1)  # from here, one new session at most
    assert gate.take("k", ["b", "c", "d"], now=1.0) == 0.0
    assert gate.take("k", ["a"], now=1.0) == 0.0  # forgotten: new again (the one token)
    assert gate.take("k", ["b"], now=1.0) > 0  # pushed out by a
