"""Whether a pipeline's partitions are already past events about to be sent: a warning of ``simulate`` and
``emit``, read from the events the pipeline stored. Contract: never raises; prints at most one line."""

from __future__ import annotations

import time

from rich.console import Console

from rewardflow.settings import Settings


def warn_if_late(settings: Settings, start_ms: int, console: Console, what: str, fix: str) -> None:
    """Warn when the pipeline's stored events are already past ``start_ms`` (``what`` names that event: "this
    simulation's first"; ``fix`` is the remedy beside a fresh pipeline): its partitions' clocks are, so events dated there are late (excluded, not scored).
    Silent when no database answers."""
    from rewardflow.clickhouse.connect import as_dsn, open_reader

    dsn = as_dsn(settings.dsn)
    if dsn.embedded and (dsn.path is None or not dsn.path.exists()):
        return  # no pipeline has stored anything here (and opening the engine would make the directory)
    try:
        reader = open_reader(settings)
        try:
            newest = reader.query_arrow("SELECT max(ts) AS t, count() AS n FROM events")
        finally:
            reader.close()
    except Exception:  # noqa: BLE001 - no pipeline database yet, or none reachable: nothing to compare with
        return
    if not newest.column("n")[0].as_py():
        return
    t = int(newest.column("t")[0].as_py())
    if t - settings.allowed_lateness_ms <= start_ms:
        return
    at = time.strftime("%Y-%m-%d %H:%M", time.gmtime(t / 1000))
    console.print(f"[yellow]warning:[/] the events stored under this REWARDFLOW_HOME reach {at} UTC, "
                  f"{(t - start_ms) / 3.6e6:.1f} h after {what}. If they came through this topic "
                  f"prefix ({settings.topic_prefix or 'none'}), its partitions' clocks are past those events, "
                  "so they will be late (excluded, not scored): send them to a fresh pipeline (another "
                  f"REWARDFLOW_HOME and REWARDFLOW_TOPIC_PREFIX), or {fix}.")
