"""WorkerMetrics: counts by output kind and dead-letter reason, the sliding dead-letter ratio alarm,
and the Prometheus text served at ``/metrics``. Pure, no broker."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from rewardflow.core.outputs import Outputs
from rewardflow_streams import metrics as M


def _out(valid: int, dead: dict[str, int] | None = None, **extra: list[Any]) -> Outputs:
    out = Outputs(**extra)
    out.valid.extend({"event_id": f"e{i}"} for i in range(valid))  # type: ignore[misc]
    for code, n in (dead or {}).items():
        out.dead.extend({"reason_code": code} for _ in range(n))  # type: ignore[misc]
    return out


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(M.time, "monotonic", lambda: now[0])
    return now


def test_counts_by_kind_and_reason(clock: list[float]) -> None:
    m = M.WorkerMetrics(dlq_limit=0.5, window_s=60)
    m.observe(_out(3, {"bad_json": 1, "invalid": 2}, excluded=[{"reason": "orphan"}, {"reason": "duplicate"}],
                   rewards=[{"provisional": True}, {"provisional": False}, {"provisional": False}],
                   late=[{}], windows=[{}, {}]), records=5, ticks=1)
    c = m.counters
    assert (c["records_in"], c["ticks"], c["events_valid"], c["dead_letters"], c["late"]) == (5, 1, 3, 3, 1)
    assert (c["orphans"], c["duplicates"], c["rewards_final"], c["rewards_provisional"], c["windows_closed"]) == (1, 1, 2, 1, 2)
    assert m.dead_by_reason == {"bad_json": 1, "invalid": 2}


def test_a_batch_counted_from_its_tally_counts_as_from_its_rows(clock: list[float]) -> None:
    """The worker keeps a batch's tally, not its rows, until the batch is confirmed."""
    def batch() -> Outputs:
        return _out(4, {"bad_json": 2}, excluded=[{"reason": "duplicate"}], rewards=[{"provisional": False}],
                    late=[{}, {}], windows=[{}])
    by_rows, by_tally = M.WorkerMetrics(dlq_limit=0.5, window_s=60), M.WorkerMetrics(dlq_limit=0.5, window_s=60)
    by_rows.observe(batch(), records=3)
    tally = M.Tally.of(batch())
    by_tally.observe(tally, records=3)
    assert by_tally.counters == by_rows.counters and by_tally.dead_by_reason == by_rows.dead_by_reason == {"bad_json": 2}
    assert by_tally.dlq_ratio == by_rows.dlq_ratio == 2 / 6


def test_the_ratio_alarm_fires_over_the_limit_logs_once_and_clears_when_the_window_slides(
        clock: list[float], caplog: pytest.LogCaptureFixture) -> None:
    m = M.WorkerMetrics(dlq_limit=0.1, window_s=60)
    m.observe(_out(90, {"bad_json": 5}))
    assert not m.alarm and m.dlq_ratio == pytest.approx(5 / 95)
    clock[0] += 30
    with caplog.at_level(logging.ERROR, logger="rewardflow.streams"):
        m.observe(_out(0, {"bad_json": 10}))
        m.observe(_out(0, {"invalid": 1}))
    assert m.alarm and m.dlq_ratio == pytest.approx(16 / 106)
    assert len([r for r in caplog.records if "DEAD-LETTER RATIO" in r.getMessage()]) == 1  # once per episode
    clock[0] += 45  # the first batch (90 valid) left the window: only the bad ones remain...
    m.observe(_out(200))  # ...then plenty of good ones
    assert not m.alarm and m.dlq_ratio == pytest.approx(11 / 211)


def test_too_few_events_never_alarm(clock: list[float]) -> None:
    m = M.WorkerMetrics(dlq_limit=0.1, window_s=60)
    m.observe(_out(1, {"bad_json": 5}))
    assert m.dlq_ratio == pytest.approx(5 / 6) and not m.alarm  # under 20 events in the window


def test_prometheus_text_has_every_counter_reason_stage_and_the_ratio(clock: list[float]) -> None:
    m = M.WorkerMetrics(dlq_limit=0.1, window_s=60)
    m.observe(_out(10, {"bad_json": 20}))
    m.time("process", 1.5)
    m.counters["state_reads"], m.counters["state_decodes"] = 7, 2
    text = m.prometheus()
    for name in m.counters:
        assert f"\nrewardflow_{name}_total " in "\n" + text
    assert 'rewardflow_dead_letters_by_reason_total{reason="bad_json"} 20.0' in text
    assert 'rewardflow_stage_seconds_total{stage="process"} 1.5' in text
    assert "rewardflow_state_decodes_total 2.0" in text and "rewardflow_dead_letter_alarm 1.0" in text
    assert f"rewardflow_dead_letter_ratio {20 / 30!r}" in text
    assert "# TYPE rewardflow_dead_letters_by_reason_total counter" in text and "# TYPE rewardflow_dead_letter_ratio gauge" in text
