"""How ``group_lag`` asks Kafka again: transient errors until the deadline, any other error at once. Pure."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException

from rewardflow.kafka.lag import until


def _failing(codes: list[int], answer: int = 7) -> tuple[list[int], Callable[[], int]]:
    calls: list[int] = []

    def call() -> int:
        calls.append(1)
        if len(calls) <= len(codes):
            raise KafkaException(KafkaError(codes[len(calls) - 1]))
        return answer

    return calls, call


def test_transient_errors_are_asked_again_until_an_answer() -> None:
    calls, call = _failing([KafkaError._TRANSPORT, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                            KafkaError.LEADER_NOT_AVAILABLE])
    assert until(time.monotonic() + 5, call, pause=0.01) == 7 and len(calls) == 4


def test_another_error_is_raised_at_once() -> None:
    calls, call = _failing([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    with pytest.raises(KafkaException):
        until(time.monotonic() + 5, call, pause=0.01)
    assert len(calls) == 1


def test_a_transient_error_past_the_deadline_is_raised() -> None:
    calls, call = _failing([KafkaError._TIMED_OUT] * 1000)
    start = time.monotonic()
    with pytest.raises(KafkaException):
        until(start + 0.1, call, pause=0.02)
    assert 1 < len(calls) < 20 and time.monotonic() - start < 1.0
