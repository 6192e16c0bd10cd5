"""``rewardflow audit``: what was kept out of the rewards, and the broken-tool-call hole.

Reads the final rewards of one spec version, the ``dead_letters``,
``late_events`` and ``exclusions`` tables and the stored events of the turns
that late or duplicate events belong to, then prints
:func:`rewardflow.analysis.audit.audit_counts`: per exclusion reason the
count, the share, and the reward those samples would have had; per
checkpoint the share of samples with broken tool calls, their reward
contribution and whether dodging by breaking a call pays; and the static
checks of the spec's weights.

With ``--checkpoint``, rewards, late and duplicate events are restricted to
that checkpoint's samples; dead letters and orphans carry no checkpoint and
stay stream-wide. Exit codes: 0 printed (1 with ``--strict`` when the spec is
flagged or a hole is found); 2 a fixable error, one line on stderr.
"""

from __future__ import annotations

import sys
from dataclasses import asdict
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table

from rewardflow.analysis.audit import AuditReport, TurnKey, audit_counts, turn_of
from rewardflow.cli.rewards import fail, open_store
from rewardflow.core.config import JoinConfig
from rewardflow.rewards.registry import active_specs, load_dir, specs_dir
from rewardflow.rewards.spec import RewardSpec, SpecError
from rewardflow.settings import load_settings

REWARD_COLUMNS = ("org_id", "session_id", "sample_id", "spec_version", "checkpoint_id", "provisional", "revision", "reward", "components",
                  "finalised_wm", "n_edits", "n_tool_broken", "n_tool_error", "n_reject", "n_undo", "n_revert", "n_dissatisfied",
                  "checked", "persisted")
_TURN = "org_id, session_id, sample_id"  # a sample: one turn, whatever other sessions' request ids are


def _spec(version: str | None) -> RewardSpec:
    settings = load_settings()
    try:
        files = load_dir(specs_dir(settings))
        if version is None:
            return active_specs(settings)[0]
        found = [f.spec for f in files if f.spec.version == version]
        if not found:
            raise SpecError(f"--spec {version}: no such version in {specs_dir(settings)}; known: "
                            f"{', '.join(f.spec.version for f in files)}")
        return found[0]
    except SpecError as exc:
        raise fail(str(exc)) from None


def _fetch(checkpoint: str | None, spec: RewardSpec) -> dict[str, Any]:
    with open_store(load_settings()) as store:
        where = "spec_version = {v:String} AND provisional = 0"
        params: dict[str, Any] = {"v": spec.version}
        if checkpoint:
            where += " AND checkpoint_id = {ck:String}"
            params["ck"] = checkpoint
        rewards = store.rows(f"SELECT {', '.join(REWARD_COLUMNS)} FROM rewards WHERE {where} "
                             f"ORDER BY {_TURN}, revision DESC LIMIT 1 BY {_TURN}", params)
        scored = {turn_of(r, "sample_id") for r in rewards}
        late = store.rows("SELECT org_id, session_id, request_id, payload FROM late_events LIMIT 1 BY exclusion_id", {})
        excluded = store.rows("SELECT reason, org_id, session_id, request_id, payload FROM exclusions "
                              "LIMIT 1 BY exclusion_id", {})
        if checkpoint:
            late = [e for e in late if turn_of(e) in scored]
            excluded = [e for e in excluded if e["reason"] == "orphan" or turn_of(e) in scored]
        touched = {turn_of(e) for e in late} | {turn_of(e) for e in excluded if e["reason"] == "duplicate"}
        turns = touched & scored
        turn_events: dict[TurnKey, list[Any]] = {}
        if turns:
            for r in store.rows("SELECT org_id, session_id, request_id, payload FROM events "
                                "WHERE request_id IN {ids:Array(String)} "
                                "LIMIT 1 BY org_id, session_id, request_id, event_id",
                                {"ids": sorted({t[2] for t in turns})}):
                if turn_of(r) in turns:
                    turn_events.setdefault(turn_of(r), []).append(orjson.loads(r["payload"]))
        return {
            "rewards": rewards, "late": late, "excluded": excluded, "turn_events": turn_events,
            "dead": store.rows("SELECT reason_code FROM dead_letters LIMIT 1 BY dead_letter_id", {}),
            "valid_events": int(store.rows("SELECT uniqExact(org_id, session_id, request_id, event_id) AS n "
                                           "FROM events", {})[0]["n"]),
            "without_events": int(store.rows(
                f"SELECT uniqExact({_TURN}) AS n FROM rewards WHERE {where} AND "
                f"({_TURN}) NOT IN (SELECT org_id, session_id, request_id FROM events)", params)[0]["n"]),
        }


def _render(rep: AuditReport, out: Console) -> None:
    """Tables of at most six columns, so the audit reads at 80 columns."""
    t = Table("reason", "rows", "samples", "share", "note",
              title=f"exclusions (spec {rep.spec_version}; {rep.samples} samples, {rep.events} events)")
    r = Table("reason", "stored mean", "rescored", "Δ mean", "changed", "flips",
              title="the excluded signals scored back in")
    for ln in rep.lines:
        t.add_row(ln.reason, str(ln.rows), "-" if ln.samples is None else str(ln.samples),
                  f"{ln.share:.2%} of {ln.share_of}", ln.note)
        d = ln.rescore if ln.rescore is not None and ln.rescore.paired else None
        if d is not None:
            r.add_row(ln.reason, f"{d.old_mean:+.4f}", f"{d.new_mean:+.4f}", f"{d.mean_delta:+.4f}", str(d.changed),
                      str(d.sign_flips))
    out.print(t)
    if r.row_count:
        out.print(r)
    if rep.dead_by_code:
        out.print("dead letters by reason: " + ", ".join(f"{k}={v}" for k, v in rep.dead_by_code.items()))
    b = Table("checkpoint", "samples", "with broken call", "its reward", "hole",
              title="broken tool calls (never dropped; scored negative)")
    g = Table("checkpoint", "dodges", "mean dodge", "clean failing", "mean clean",
              title="dodging: broken calls vs. clean failing turns")
    for c in rep.checkpoints:
        b.add_row(c.checkpoint_id, str(c.samples), f"{c.broken_samples} ({c.broken_share:.2%})",
                  f"{c.broken_contribution:+.3f}", "[red]YES: breaking calls pays[/]" if c.hole else "no")
        g.add_row(c.checkpoint_id, str(c.dodges), _f(c.mean_dodge), str(c.clean_failing), _f(c.mean_clean_failing))
    out.print(b)
    out.print(g)
    for flag in rep.flags:
        out.print(f"[red]spec flag[/]: {flag}")


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:+.4f}"


def command(
    checkpoint: Annotated[str | None, typer.Option("--checkpoint", help="Only this checkpoint's samples.")] = None,
    spec_version: Annotated[str | None, typer.Option("--spec", help="Spec version to audit (default: first active).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the audit as JSON.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 when the spec is flagged or a hole is found.")] = False,
) -> None:
    """Audit exclusions (dead letters, duplicates, late events, orphans) and the broken-tool-call hole."""
    spec = _spec(spec_version)
    data = _fetch(checkpoint, spec)
    rep = audit_counts(spec, data["rewards"], dead=data["dead"], late=data["late"], excluded=data["excluded"],
                       valid_events=data["valid_events"], turn_events=data["turn_events"],
                       cfg=JoinConfig.from_settings(load_settings()))
    if data["without_events"]:
        typer.echo(f"warning: {data['without_events']:,} scored samples have no stored events (removed from `events` "
                   "by retention, or never stored): their late and duplicate signals cannot be rescored", err=True)
    if json_out:
        doc = {**asdict(rep), "without_events": data["without_events"]}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _render(rep, Console())
    if strict and (rep.flags or any(c.hole for c in rep.checkpoints)):
        raise typer.Exit(1)
