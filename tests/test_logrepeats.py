"""Kafka clients' retry chatter: once per interval for each message template, and said so."""

from __future__ import annotations

import logging
import time

import pytest

from rewardflow.logrepeats import Repeats


def test_a_repeated_message_is_let_through_once_per_interval_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("test.logrepeats.client")
    repeats = Repeats(every_s=0.3)
    logger.addFilter(repeats)
    try:
        with caplog.at_level(logging.INFO, logger="test.logrepeats.client"):
            for node in range(50):
                logger.error("Unable connect to node with id %s: %s", node % 3, "refused")
            logger.error("another message %d%%", 1)  # (another template: its own count)
            logger.error("%s [%s] %s", "FAIL", "rdkafka#producer-1", "Connect failed")
            logger.error("%s [%s] %s", "FAIL", "rdkafka#producer-1", "Connect failed")
            logger.error("%s [%s] %s", "ERROR", "rdkafka#producer-1", "Local: all brokers down")  # another facility
            time.sleep(0.35)
            logger.error("Unable connect to node with id %s: %s", 2, "refused")
    finally:
        logger.removeFilter(repeats)
    shown = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert shown == [
        ("WARNING", "Unable connect to node with id 0: refused"),  # retried by the client: a warning
        ("ERROR", "another message 1%"),
        ("WARNING", "FAIL [rdkafka#producer-1] Connect failed"),
        ("ERROR", "ERROR [rdkafka#producer-1] Local: all brokers down"),
        ("WARNING", "Unable connect to node with id 2: refused (49 more like it since the last one shown)"),
    ]
