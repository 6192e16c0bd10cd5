"""After a restart, a partition nobody writes to still finalises the turns it holds.

The idle clock of a partition starts when the worker has read a record of it
since its assignment. A restarted worker therefore sends each silent partition
one no-op tick (watermark 0); reading it rebuilds the state and starts the clock.
"""

from __future__ import annotations

from typing import Any

import pytest

from rewardflow.kafka import topics as T
from tests.factories import T0, turn
from tests.streams.kafka_io import json_record

pytestmark = pytest.mark.kafka


def test_an_open_turn_of_a_silent_partition_finalises_after_a_restart(deploy: Any) -> None:
    # idle clock: after 3 s without records, 50 ms of event time per wall ms; the turn settles
    # 121 s of event time after its last edit, so about 5.5 s after its record was read
    d = deploy(idle_timeout_s=3.0)
    evs = turn("r-open", "s-open", T0, horizons=(30, 120))
    d.raw.send(0, *json_record(*evs))
    d.out.until(lambda o: len(o.rows[T.VALID]) == len(evs), 20, "the turn's events read")
    d.worker.stop()
    assert d.out.settle(0.5).finals() == [], "the turn finalised before the stop: the test proves nothing"

    d.worker.restart()  # no record is ever written to partition 0 again
    out = d.out.until(lambda o: len(o.finals("r-open")) == 2, 40, "the open turn final after the restart")
    assert {r["finalised_by"] for r in out.finals("r-open")} == {"idle"}
    assert "no-op tick" not in d.worker.log_tail()  # quietly, as an ordinary record
