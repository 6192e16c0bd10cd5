"""Errors of the local Kafka tooling.

Every error here is something a user can fix (install Java, free a port, look
at the broker log). Its message is one line that says what to do; the CLI
prints it without a traceback and exits with code 2.
"""

from __future__ import annotations


class KafkaLocalError(RuntimeError):
    """Base class: a user-fixable problem with the local broker, one-line message."""


class ToolMissingError(KafkaLocalError):
    """Java 17+ or Maven is not installed, not on PATH, or too old."""


class ResolutionError(KafkaLocalError):
    """Maven could not resolve the Kafka jars (network, repository, disk)."""


class PortBusyError(KafkaLocalError):
    """A port the broker must bind on 127.0.0.1 is already in use."""


class BrokerStartError(KafkaLocalError):
    """The broker process exited, or did not answer metadata requests in time."""


class MetadataTimeoutError(KafkaLocalError):
    """A broker did not answer a metadata request before the deadline."""


class TopicError(KafkaLocalError):
    """Creating or deleting a topic failed for a reason other than idempotence."""
