"""Reward audit: what was kept out of the rewards, and what it would have changed.

For each exclusion reason the audit counts the excluded rows, the samples
(turns) they touch and their share, and — where it is computable — the reward
those samples would have had:

* ``dead_letter``: undecodable or invalid events. They carry no trustworthy
  request id, so no sample can be rescored; share is of *events*.
* ``duplicate``: client resends of an event already counted; the first copy
  was scored, so the reward mix is that of the stored samples (no change).
* ``corrected``: not an exclusion: signals after their turn was finalised but within
  the correction window re-scored it (a new revision); counted here so the audit
  accounts for every signal. Rows are revisions, samples the turns corrected.
* ``late``: events after their turn was finalised, past the correction window. Each affected turn is
  rescored from its stored events *plus* its late events with the stream's
  own pure code (:class:`~rewardflow.core.turn.TurnState` and
  :func:`~rewardflow.core.score.score`) and diffed against the stored reward.
* ``orphan``: turns without ``InferenceServed``: no checkpoint, latency or
  tokens, so they cannot be scored (n/a).
* ``spec``: specs cannot exclude samples in this design — every component is
  a weight, broken tool calls must weigh < 0 — so the count is always 0.

The broken-tool-call hole is audited per checkpoint: the share of samples with
a broken call and the total reward contributed by broken calls; and the mean
reward of *dodges* (a broken call and no edit: the published hack) against
*clean failing* samples (no broken call; a reject, undo, revert, dissatisfied
follow-up, tool error, or an edit checked and not persisted at the final
horizon). ``hole`` is set when dodges score higher: breaking a call would then
pay. :func:`spec_flags` checks the weights statically: a dodge scores
``tool_broken``, a rejected edit at least ``reject``.

A sample is a turn, (``org_id``, ``session_id``, request id): two sessions' turns that share a
request id are two samples, and an excluded event counts against its own session's turn.

Contract: pure; inputs are plain rows as stored in ClickHouse.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from rewardflow.core.config import JoinConfig
from rewardflow.core.rows import RewardRecord
from rewardflow.core.turn import TurnState
from rewardflow.events.validate import validate_event
from rewardflow.rewards.diff import RewardDiff, diff_rewards
from rewardflow.core.score import score
from rewardflow.rewards.spec import RewardSpec

Row = Mapping[str, Any]
TurnKey = tuple[str, str, str]
"""A turn: (org_id, session_id, request id)."""


def turn_of(row: Row, request_field: str = "request_id") -> TurnKey:
    """The turn of a stored row: a reward's request id is its ``sample_id``, other rows' their ``request_id``."""
    return str(row["org_id"]), str(row["session_id"]), str(row[request_field])


@dataclass(frozen=True, slots=True)
class ExclusionLine:
    reason: str  # dead_letter | duplicate | corrected | late | orphan | spec
    rows: int  # excluded rows (events, or turns for orphans)
    samples: int | None  # distinct samples touched; None when unknowable
    share: float  # samples / all samples, or rows / all events for dead letters
    share_of: str  # 'samples' | 'events'
    rescore: RewardDiff | None  # stored vs had-they-been-scored, when computable
    note: str


@dataclass(frozen=True, slots=True)
class BrokenCallLine:
    checkpoint_id: str
    samples: int
    broken_samples: int
    broken_contribution: float  # sum of the tool_broken component
    dodges: int  # broken call and no edit
    mean_dodge: float | None
    clean_failing: int
    mean_clean_failing: float | None

    @property
    def broken_share(self) -> float:
        return self.broken_samples / self.samples if self.samples else 0.0

    @property
    def hole(self) -> bool:
        """Dodges out-score clean failing samples: breaking calls pays."""
        return self.mean_dodge is not None and self.mean_clean_failing is not None and self.mean_dodge > self.mean_clean_failing


@dataclass(frozen=True, slots=True)
class AuditReport:
    spec_version: str
    samples: int  # scored samples + orphan turns
    events: int  # valid events + dead letters
    lines: list[ExclusionLine]
    dead_by_code: dict[str, int]
    checkpoints: list[BrokenCallLine]
    flags: list[str]


def spec_flags(spec: RewardSpec) -> list[str]:
    """Static checks: a broken call must never score above an equivalent clean failure."""
    w, out = spec.weights, []
    if w.tool_broken > w.tool_error:
        out.append(f"{spec.version}: tool_broken ({w.tool_broken}) > tool_error ({w.tool_error}): the same turn scores "
                   "higher when its failing call is broken instead of erroring")
    if w.tool_broken > w.reject:
        out.append(f"{spec.version}: tool_broken ({w.tool_broken}) > reject ({w.reject}): a broken call that avoids "
                   "an edit out-scores a rejected edit")
    return out


def is_clean_failing(r: Row) -> bool:
    """No broken call, and some failure signal (see module docstring)."""
    if r["n_tool_broken"]:
        return False
    h = max(r["checked"], default=None)
    unpersisted = h is not None and r["checked"][h] > 0 and r["persisted"].get(h, 0) == 0
    return bool(r["n_reject"] or r["n_undo"] or r["n_revert"] or r["n_dissatisfied"] or r["n_tool_error"] or unpersisted)


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def broken_call_lines(rewards: Sequence[Row]) -> list[BrokenCallLine]:
    """One line per checkpoint, sorted by checkpoint id."""
    by_ckpt: dict[str, list[Row]] = {}
    for r in rewards:
        by_ckpt.setdefault(str(r["checkpoint_id"]), []).append(r)
    out = []
    for ckpt, rows in sorted(by_ckpt.items()):
        dodges = [float(r["reward"]) for r in rows if r["n_tool_broken"] and not r["n_edits"]]
        failing = [float(r["reward"]) for r in rows if is_clean_failing(r)]
        out.append(BrokenCallLine(
            ckpt, len(rows), sum(1 for r in rows if r["n_tool_broken"]),
            sum(float(r["components"].get("tool_broken", 0.0)) for r in rows),
            len(dodges), _mean(dodges), len(failing), _mean(failing),
        ))
    return out


def rescore_turn(stored: Row, events: Iterable[Mapping[str, Any]], spec: RewardSpec, cfg: JoinConfig) -> RewardRecord | None:
    """The final reward of a turn folded from ``events`` as given (copies count twice); None without a served event."""
    models = [validate_event(dict(e)) for e in sorted(events, key=lambda e: (e["ts"], str(e["event_id"])))]
    if not models:
        return None
    turn = TurnState.start(models[0])
    for ev in models:
        turn.apply(ev)
    if turn.served is None:
        return None
    hz = list(cfg.horizons_s)
    return score(turn.outcome(hz, hz[-1], provisional=False, wm=int(stored["finalised_wm"]), by="audit"), spec)


def _rescore(rows: Sequence[Row], scored: Mapping[TurnKey, Row],
             turn_events: Mapping[TurnKey, Sequence[Mapping[str, Any]]], spec: RewardSpec,
             cfg: JoinConfig) -> tuple[RewardDiff, int, int]:
    """Diff of stored vs rescored-with-``rows`` samples; also (samples touched, samples not rescorable)."""
    extra: dict[TurnKey, list[Mapping[str, Any]]] = {}
    for e in rows:
        extra.setdefault(turn_of(e), []).append(orjson.loads(e["payload"]))
    stored, rescored = [], []
    for key, evs in sorted(extra.items()):
        new = rescore_turn(scored[key], [*turn_events[key], *evs], spec, cfg) \
            if key in scored and key in turn_events else None
        if new is not None:
            stored.append(scored[key])
            rescored.append(new)
    return diff_rewards(stored, rescored), len(extra), len(extra) - len(stored)


def audit_counts(spec: RewardSpec, rewards: Sequence[Row], *, dead: Sequence[Row] = (), late: Sequence[Row] = (),
                 excluded: Sequence[Row] = (), valid_events: int = 0,
                 turn_events: Mapping[TurnKey, Sequence[Mapping[str, Any]]] | None = None,
                 cfg: JoinConfig | None = None) -> AuditReport:
    """Audit final ``rewards`` of ``spec`` against the exclusion rows of the same stream.

    ``turn_events`` maps a turn (:func:`turn_of`) to its stored (valid) event payloads;
    turns missing from it are counted but not rescored. Late and duplicate
    events are folded in *as if they had been accepted*: a late accept adds
    its weight; a duplicate counts its event a second time.
    """
    cfg, te = cfg or JoinConfig(), turn_events or {}
    scored: dict[TurnKey, Row] = {}
    for r in rewards:  # each sample's latest revision
        key = turn_of(r, "sample_id")
        cur = scored.get(key)
        if not r.get("provisional", 0) and (cur is None or int(r.get("revision") or 0) > int(cur.get("revision") or 0)):
            scored[key] = r
    corrected = [int(r.get("revision") or 0) for r in scored.values() if r.get("revision")]
    orphans = {turn_of(e) for e in excluded if e["reason"] == "orphan"}
    dups = [e for e in excluded if e["reason"] == "duplicate"]
    # every turn seen: scored, orphaned, or known only from its late or duplicate events (a session sent
    # wholly late has no scored turn), so no share is over 100 %
    total = len(scored.keys() | orphans | {turn_of(e) for e in late} | {turn_of(e) for e in dups})
    events = valid_events + len(dead)
    dup_diff, dup_n, dup_miss = _rescore(dups, scored, te, spec, cfg)
    late_diff, late_n, late_miss = _rescore(late, scored, te, spec, cfg)
    lines = [
        ExclusionLine("dead_letter", len(dead), None, len(dead) / events if events else 0.0, "events", None,
                      "undecodable or invalid events: no trustworthy request id, cannot be rescored"),
        ExclusionLine("duplicate", len(dups), dup_n, dup_n / total if total else 0.0, "samples", dup_diff,
                      f"client resends: the first copy was scored; the diff counts each copy again "
                      f"({dup_miss} sample(s) not rescorable)"),
        ExclusionLine("late", len(late), late_n, late_n / total if total else 0.0, "samples", late_diff,
                      f"turns rescored including their late events ({late_miss} sample(s) not rescorable: "
                      "no stored reward or events)"),
        ExclusionLine("corrected", sum(corrected), len(corrected), len(corrected) / total if total else 0.0, "samples",
                      None, "not excluded: signals after finalisation, within the correction window, re-scored "
                            "their turn (rows = revisions; each sample counts with its latest)"),
        ExclusionLine("orphan", len(orphans), len(orphans), len(orphans) / total if total else 0.0, "samples", None,
                      "n/a: no InferenceServed, so no checkpoint, latency or tokens to score"),
        ExclusionLine("spec", 0, 0, 0.0, "samples", None,
                      "specs cannot exclude samples in this design: every signal is a weight, broken calls must weigh < 0"),
    ]
    codes: dict[str, int] = {}
    for d in dead:
        codes[str(d["reason_code"])] = codes.get(str(d["reason_code"]), 0) + 1
    return AuditReport(spec.version, total, events, lines, dict(sorted(codes.items())),
                       broken_call_lines(list(scored.values())), spec_flags(spec))
