"""A real local Apache Kafka 4.x broker for development and tests.

Jars come from Maven Central once (:func:`ensure_kafka_jars`); a
:class:`LocalBroker` runs one KRaft broker+controller on 127.0.0.1 in the
background; :mod:`rewardflow.kafka_local.admin` creates topics and waits for
metadata. Every user-fixable failure is a :class:`KafkaLocalError`.
"""

from rewardflow.kafka_local.admin import create_topics, delete_topics, wait_for_metadata
from rewardflow.kafka_local.broker import BrokerInfo, LocalBroker
from rewardflow.kafka_local.errors import (
    BrokerStartError,
    KafkaLocalError,
    MetadataTimeoutError,
    PortBusyError,
    ResolutionError,
    ToolMissingError,
    TopicError,
)
from rewardflow.kafka_local.maven import KAFKA_VERSION, ensure_kafka_jars

__all__ = [
    "KAFKA_VERSION",
    "BrokerInfo",
    "BrokerStartError",
    "KafkaLocalError",
    "LocalBroker",
    "MetadataTimeoutError",
    "PortBusyError",
    "ResolutionError",
    "ToolMissingError",
    "TopicError",
    "create_topics",
    "delete_topics",
    "ensure_kafka_jars",
    "wait_for_metadata",
]
