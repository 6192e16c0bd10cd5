"""``rewardflow simulate --dry-run``: the printed summary and the ground-truth file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console
from typer.testing import CliRunner

from rewardflow.cli.main import app
from rewardflow.clickhouse.tables import EVENTS
from rewardflow.sim import ab_config, ground_truth
from tests.clickhouse.rows import T0, event_row
from tests.conftest_clickhouse import ChDatabase

runner = CliRunner()


def test_dry_run_writes_the_ground_truth(tmp_path: Path) -> None:
    out = tmp_path / "truth.json"
    args = ["simulate", "--dry-run", "--sessions", "12", "--turns-per-session", "3", "--seed", "4", "--noise",
            "--hack", "over-ask", "--start-ms", "1800000000000", "--truth-out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "planted duplicates" in result.stdout
    truth = orjson.loads(out.read_bytes())
    expected = ground_truth(ab_config(sessions=12, turns_per_session=3, seed=4, noise=True, hack="over-ask",
                                      start_ms=1_800_000_000_000, duration_s=3600.0))
    assert truth == orjson.loads(expected.to_json())
    assert sum(truth["turns_per_checkpoint"].values()) + truth["orphan_turns"] == 36


def test_bad_options_exit_2() -> None:
    for args, needle in ((["--hack", "nope"], "--hack"), (["--format", "xml"], "--format"),
                         (["--baseline-checkpoint", "a", "--candidate-checkpoint", "a"], "distinct")):
        result = runner.invoke(app, ["simulate", "--dry-run", *args])
        assert result.exit_code == 2, args
        assert needle in result.stderr


@pytest.mark.clickhouse
def test_a_simulation_older_than_the_pipelines_events_is_warned_of(ch_db: ChDatabase) -> None:
    from rewardflow.cli.lateness import warn_if_late

    settings = ch_db.settings()
    console = Console(record=True, width=400)
    warn_if_late(settings, T0, console, "this simulation's first", "pace it")
    assert console.export_text() == ""  # no event stored yet
    rows: list[Any] = [event_row(i, ts=T0 + 3_600_000 + i) for i in range(3)]
    ch_db.client.insert("events", [[r[n] for n in EVENTS.record_columns] for r in rows],
                        column_names=list(EVENTS.record_columns))
    warn_if_late(settings, T0 + 3_600_000, console, "this simulation's first", "pace it")
    assert console.export_text() == ""  # the simulation starts where the pipeline's events are
    warn_if_late(settings, T0, console, "this simulation's first", "pace it in real time (--time-scale 1)")
    text = console.export_text()
    assert "warning:" in text and "1.0 h after this simulation's first" in text and "--time-scale 1" in text
    assert f"through this topic prefix ({settings.topic_prefix or 'none'})" in text


def test_a_start_that_dates_events_ahead_of_the_broker_is_warned_of() -> None:
    from rewardflow.cli.simulate import _warn_if_ahead
    from rewardflow.settings import Settings

    settings, console = Settings(), Console(record=True, width=400)
    safe = T0
    _warn_if_ahead(settings, safe + 3_600_000 + settings.max_clock_skew_ms, safe, console)
    assert console.export_text() == ""  # within the default's hour to spare and the allowed skew
    _warn_if_ahead(settings, safe + 3_600_000 + settings.max_clock_skew_ms + 1_500_000, safe, console)
    text = console.export_text()
    assert "dead-lettered as future_ts" in text and f"at or before {safe}" in text
