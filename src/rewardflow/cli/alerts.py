"""``rewardflow alerts``: Goodhart alerts — a guard drifted while the reward held — and
exclusion-balance alerts — one arm lost more of its turns than the baseline.

By default lists the rows of the ``alerts`` table (once per ``alert_id``).
With ``--evaluate`` it instead runs
:func:`rewardflow.analysis.goodhart.evaluate_windows` now over the stored
``reward_windows`` partials and, given ``--baseline``, the exclusion balance
(:mod:`rewardflow.analysis.balance`, the largest window size unless
``--window-size``), and prints what it finds, writing nothing (the stream
worker publishes alerts to the ``alerts`` topic).

Exit codes: 0 printed (1 with ``--strict`` when there is any alert); 2 a
fixable error, one line on stderr.
"""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from rewardflow.analysis.goodhart import MonitorConfig, evaluate_windows
from rewardflow.cli.rewards import fail, open_store
from rewardflow.settings import load_settings

ALERT_COLUMNS = ("alert_id", "monitor", "checkpoint_id", "baseline", "window_start", "window_end", "value",
                 "baseline_value", "z", "p_value", "reward_delta", "message", "raised_at")
WINDOW_COLUMNS = ("window_id", "window_key", "window_start", "window_size_s", "checkpoint_id", "surface", "spec_version",
                  "samples", "reward_sum", "turns_with_edit", "turns_clarifying", "turns_broken", "turns_followup",
                  "tool_calls", "tool_broken", "tool_error", "completion_tokens_sum")


def _stored(checkpoint: str | None) -> list[dict[str, Any]]:
    where, params = ("WHERE checkpoint_id = {ck:String} ", {"ck": checkpoint}) if checkpoint else ("", {})
    with open_store(load_settings()) as store:
        return store.rows(f"SELECT {', '.join(ALERT_COLUMNS)} FROM alerts {where}"
                          "ORDER BY window_start, checkpoint_id, monitor LIMIT 1 BY alert_id", params, missing_ok=True)


def _evaluated(checkpoint: str | None, baseline: str | None, cfg: MonitorConfig, spec: str | None) -> list[dict[str, Any]]:
    where, params = ("WHERE spec_version = {v:String} ", {"v": spec}) if spec else ("", {})
    with open_store(load_settings()) as store:
        rows = store.rows(f"SELECT {', '.join(WINDOW_COLUMNS)} FROM reward_windows FINAL {where}", params)
    try:
        alerts = evaluate_windows(rows, baseline, cfg, now_ms=int(time.time() * 1000))
    except ValueError as exc:
        raise fail(str(exc)) from None
    if baseline is not None and rows:
        alerts += _balance(rows, baseline, cfg, spec)
    return [dict(a) for a in alerts if checkpoint is None or a["checkpoint_id"] == checkpoint]


def _balance(rows: list[dict[str, Any]], baseline: str, cfg: MonitorConfig, spec: str | None) -> list[Any]:
    from rewardflow.analysis.balance import BalanceConfig, balance_alerts, mean_rewards
    from rewardflow.analysis.source import SourceError, fetch_balance

    size = cfg.window_size_s or max(int(r["window_size_s"]) for r in rows)
    spec = spec or max(str(r["spec_version"]) for r in rows)
    try:
        b = fetch_balance(load_settings(), rows, window_s=size, spec_version=spec)
    except SourceError as exc:
        raise fail(str(exc)) from None
    return balance_alerts(b, baseline, BalanceConfig(alpha=cfg.alpha, min_samples=cfg.min_samples),
                          mean_rewards(rows, window_s=size, spec_version=spec))


def command(
    checkpoint: Annotated[str | None, typer.Option("--checkpoint", help="Only alerts of this checkpoint.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="One JSON object per alert, one per line.")] = False,
    evaluate: Annotated[bool, typer.Option("--evaluate", help="Evaluate the stored windows now instead of listing alerts.")] = False,
    baseline: Annotated[str | None, typer.Option("--baseline", help="Baseline checkpoint (with --evaluate).")] = None,
    mode: Annotated[str, typer.Option("--mode", help="same_window | pooled | trailing (with --evaluate).")] = "same_window",
    alpha: Annotated[float, typer.Option("--alpha", min=1e-12, max=0.5, help="Significance level per test.")] = 0.001,
    min_samples: Annotated[int, typer.Option("--min-samples", min=1, help="Samples needed on each side.")] = 200,
    window_size: Annotated[int | None, typer.Option("--window-size", help="Only windows of this size, seconds.")] = None,
    spec: Annotated[str | None, typer.Option("--spec", help="Only windows of this spec version.")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 when there is any alert.")] = False,
) -> None:
    """List Goodhart alerts (guard behaviour drifting while mean reward holds or rises) and exclusion-balance
    alerts (one arm losing more of its turns than the baseline)."""
    if mode not in ("same_window", "pooled", "trailing"):
        raise fail(f"--mode must be same_window, pooled or trailing, not {mode!r}")
    if evaluate and mode != "trailing" and baseline is None:
        raise fail(f"--evaluate --mode {mode} needs --baseline CHECKPOINT (or use --mode trailing)")
    if evaluate:
        cfg = MonitorConfig(alpha=alpha, min_samples=min_samples, baseline=mode,  # type: ignore[arg-type]
                            window_size_s=window_size)
        alerts = _evaluated(checkpoint, baseline, cfg, spec)
    else:
        alerts = _stored(checkpoint)
    if json_out:
        sys.stdout.write("".join(orjson.dumps(a).decode() + "\n" for a in alerts))
    else:
        t = Table("window start", "checkpoint", "monitor", "value", "baseline", "p", "Δ reward", "message",
                  title=f"{len(alerts)} alert(s)")
        for a in alerts:
            t.add_row(time.strftime("%Y-%m-%d %H:%M", time.gmtime(a["window_start"] / 1000)), a["checkpoint_id"],
                      a["monitor"], f"{a['value']:.4g}", f"{a['baseline_value']:.4g} ({a['baseline']})",
                      f"{a['p_value']:.2g}", f"{a['reward_delta']:+.4f}", a["message"])
        Console().print(t)
    if strict and alerts:
        raise typer.Exit(1)
