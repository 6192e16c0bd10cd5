"""The offset-gap guard: a raw record Faust never delivered is read again, not skipped.

Faust's consumer can lose a record around a rebalance (see ``streams/gaps.py``).
The worker's fault hook ``RF_FAULT_SKIP_RAW`` loses the first delivery of chosen
records the same way (never processed, never acked); the guard must notice the
hole at the next record, read the missing records straight from the broker (or,
when that fails, seek Faust back: ``RF_FAULT_NO_HOLE_READ=1``) and process
everything exactly once.
"""

from __future__ import annotations

from typing import Any

import pytest

from rewardflow.kafka import topics as T
from tests.factories import T0, turn
from tests.streams.kafka_io import json_record, tick_record

pytestmark = pytest.mark.kafka
FLUSH_WM = 2**53


@pytest.mark.parametrize("direct", [True, False], ids=["direct-read", "seek-fallback"])
def test_records_faust_never_delivered_are_read_again_and_processed_once(
        deploy: Any, monkeypatch: pytest.MonkeyPatch, direct: bool) -> None:
    # offset 0 of each partition is the fixture's probe tick; lose 2 and 3 (two in a row) and 6 of
    # partition 0, and 1 of partition 1 (the first record after the probe)
    monkeypatch.setenv("RF_FAULT_SKIP_RAW", "0:2,0:3,0:6,1:1")
    if not direct:
        monkeypatch.setenv("RF_FAULT_NO_HOLE_READ", "1")
    d = deploy()
    turns = {p: [turn(f"r{p}-{i}", f"s{p}-{i}", T0 + i * 1000, horizons=(30, 120)) for i in range(8)] for p in (0, 1)}
    d.raw.send_many([(p, *json_record(*evs)) for p in (0, 1) for evs in turns[p]])
    d.raw.send_many([(p, *tick_record(FLUSH_WM, d.settings)) for p in (0, 1)])
    want = {evs[0]["request_id"] for p in (0, 1) for evs in turns[p]}
    out = d.out.until(lambda o: {r["sample_id"] for r in o.finals()} == want, 40, "every turn final").settle(1.0)

    finals = out.finals()
    assert len(finals) == len({r["reward_id"] for r in finals}) == 2 * len(want)  # two specs, once each
    for p in (0, 1):
        for evs in turns[p]:
            rows = [r for r in finals if r["sample_id"] == evs[0]["request_id"]]
            assert all(r["n_edits"] == 1 and r["n_accept"] == 1 and sorted(int(h) for h in r["checked"]) == [30, 120] for r in rows), rows
    valid_ids = [r["event_id"] for r in out.rows[T.VALID]]
    assert set(valid_ids) == {e["event_id"] for p in (0, 1) for evs in turns[p] for e in evs}
    d.worker.wait_caught_up()
    log = d.worker.log_tail()
    assert log.count("fault hook: the first delivery") == 4
    assert "records 2..3 of" in log and "records 1..1 of" in log
    if direct:  # each hole read straight from the broker when the next delivered record reveals it
        assert "records 6..6 of" in log and "seeking instead" not in log
    else:  # 6 was lost before the seek back to 2 delivered everything from there again
        assert log.count("seeking instead") >= 2
