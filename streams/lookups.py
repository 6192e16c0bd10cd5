"""What a worker asks the brokers outside Faust: its group's committed offsets and its partitions' log starts.

Contract: each client is made at its first use, from any thread (the gap guard and the stall watch
call these from threads), and used by one request at a time. :meth:`BrokerLookups.committed` blocks
up to 10 s while the group coordinator is away; :meth:`BrokerLookups.admin` up to 10 s for the raw
topic's metadata. :meth:`BrokerLookups.close` closes what was made, once the app stopped.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from rewardflow_streams.commits import group_offsets, log_starts

log = logging.getLogger("rewardflow.streams")


class BrokerLookups:
    """The offsets reader of group ``group_id`` and an AdminClient, on ``client_config``."""

    def __init__(self, client_config: dict[str, Any], group_id: str, raw_topic: str) -> None:
        self._config, self._group_id, self._raw_topic = client_config, group_id, raw_topic
        self._admin: Any = None
        self._reader: Any = None  # a Consumer of the group that never subscribes
        self._admin_lock = threading.Lock()
        self._reader_lock = threading.Lock()

    def committed(self, tps: list[Any]) -> dict[Any, int | None]:
        """The group's committed offsets of ``tps`` (:func:`~rewardflow_streams.commits.group_offsets`)."""
        with self._reader_lock:
            if self._reader is None:
                from confluent_kafka import Consumer

                self._reader = Consumer({**self._config, "group.id": self._group_id,
                                         "enable.auto.commit": False, "enable.auto.offset.store": False})
            return group_offsets(self._reader, tps)

    def log_starts(self, tps: list[Any]) -> dict[Any, int | None]:
        """The first offset each of ``tps`` still holds (:func:`~rewardflow_streams.commits.log_starts`)."""
        return log_starts(self.admin(), tps)

    def admin(self) -> Any:
        """The confluent-kafka AdminClient.

        Made with the raw topic's metadata read first: a fresh client's first ``list_offsets``
        otherwise waited 3 s for it, in about one call of three (against 1-3 ms). When that read
        fails, the client is kept and the read is left to its first request.
        """
        from confluent_kafka.admin import AdminClient

        with self._admin_lock:
            if self._admin is None:
                admin = AdminClient(self._config)
                try:
                    admin.list_topics(self._raw_topic, timeout=10)
                except Exception:  # noqa: BLE001 - only slower: each request reads the metadata it needs
                    log.warning("cannot read the raw topic's metadata for the admin client", exc_info=True)
                self._admin = admin
            return self._admin

    def close(self) -> None:
        """Close the offsets reader (the AdminClient needs no closing)."""
        with self._reader_lock:
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()
