"""The traffic generator: sessions of agent turns as a stream of send groups.

:meth:`Simulator.stream` yields :class:`SendGroup` values in send order. A
group holds consecutive events of ONE session that a client would flush
together (due within ``batch_window_ms`` of event time), so the SDK can send
it as one session batch. Groups of all sessions are merged by due time, i.e.
events are sent when they happen (plus planted jitter): persistence checks go
out ``horizon`` seconds after their edit. ``time_scale`` only compresses the
wall-clock send schedule (:attr:`SendGroup.send_at_s`); event times stay
realistic, starting at ``config.start_ms``.

Special groups: ``raw`` (malformed bytes; send them with a plain Kafka
producer, the SDK refuses them) and ``late`` (one planted late event; flush
the SDK before sending it so it is not batched with earlier events).

Contract: pure and deterministic under ``config.seed``; sessions are generated
lazily (memory ~ active sessions). Noise draws from its own random stream, so
the same seed gives the same sessions and turns with or without noise (noise
only drops ``InferenceServed`` of orphans and adds or delays deliveries). :attr:`Simulator.truth` is complete once
the stream is exhausted and raises ``RuntimeError`` before.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator
from dataclasses import dataclass

from rewardflow.events.models import Envelope, FollowUp, Producer
from rewardflow.sim.config import Arm, SimConfig
from rewardflow.sim.noise import MALFORMED_KINDS, hidden_served, malformed_record
from rewardflow.sim.truth import CheckpointTruth, GroundTruth
from rewardflow.sim.turns import SessionContext, TurnDraft, draft_turn, new_id, turn_failed

PRODUCERS = (
    Producer(name="vscode-ext", version="1.42.0"),
    Producer(name="agent-runner", version="0.9.3"),
    Producer(name="jetbrains-plugin", version="0.7.1"),
)
_NORMAL, _LATE, _RAW = 0, 1, 2


@dataclass(frozen=True, slots=True)
class SendGroup:
    """What to send next: valid events of one session, or one malformed record."""

    due_ms: int  # simulated event time at which the group is sent
    send_at_s: float  # wall seconds after the start of sending (0 when not paced)
    session_id: str  # the Kafka key
    events: tuple[Envelope, ...]  # valid events in send order; empty when ``raw`` is set
    raw: bytes | None = None  # a malformed JSON record (header rf-format: json)
    late: bool = False  # carries one planted late event


class Simulator:
    """One pass over a simulation's traffic; see the module docstring."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self._truth = GroundTruth(seed=config.seed, start_ms=config.start_ms, final_horizon_s=config.final_horizon_s)
        self._done = False

    @property
    def truth(self) -> GroundTruth:
        if not self._done:
            raise RuntimeError("the ground truth is complete only after stream() is exhausted")
        return self._truth

    @property
    def events_sent(self) -> int:
        """Valid events yielded so far (duplicates included); for progress display."""
        return self._truth.events_sent

    def stream(self) -> Iterator[SendGroup]:
        """Yield every send group in send order (ties: generation order)."""
        cfg, truth = self.config, self._truth
        plan = random.Random(f"{cfg.seed}:plan")
        span = int(cfg.duration_s * 1000)
        starts = sorted(cfg.start_ms + int(plan.random() * span) for _ in range(cfg.sessions))
        arms = plan.choices(cfg.arms, [a.share for a in cfg.arms], k=cfg.sessions)
        truth.sessions = cfg.sessions
        for a in cfg.arms:
            truth.arms[a.name] = a.profile.checkpoint_id
            truth.checkpoints[a.profile.checkpoint_id] = CheckpointTruth(a.profile.checkpoint_id, a.name)
        heap: list[tuple[int, int, SendGroup]] = []
        seq = nxt = 0
        while True:
            while nxt < cfg.sessions and (not heap or starts[nxt] <= heap[0][0]):
                for g in self._session(nxt, starts[nxt], arms[nxt]):
                    heapq.heappush(heap, (g.due_ms, seq, g))
                    seq += 1
                nxt += 1
            if not heap:
                break
            group = heapq.heappop(heap)[2]
            truth.events_sent += len(group.events)
            yield group
        self._done = True

    # ------------------------------------------------------------------ one session
    def _session(self, index: int, start: int, arm: Arm) -> list[SendGroup]:
        cfg, truth, noise = self.config, self._truth, self.config.noise
        rng = random.Random(f"{cfg.seed}:session:{index}")
        nrng = random.Random(f"{cfg.seed}:noise:{index}")  # noise never shifts the traffic itself
        ctx = SessionContext(org_id=f"org-{rng.randint(1, cfg.orgs):04d}", session_id="sess-" + new_id(rng),
                             producer=rng.choice(PRODUCERS), arm=arm.name)
        ck = truth.checkpoints[arm.profile.checkpoint_id]
        ck.sessions += 1
        out: list[tuple[int, int, Envelope | bytes]] = []  # (due, kind, item)
        t = start
        for _ in range(cfg.turns_per_session):
            draft = draft_turn(rng, arm.profile, ctx, t)
            orphan = len(draft.events) > 1 and nrng.random() < noise.orphan_rate
            if not orphan and self._hides(arm, draft):  # its served event goes out malformed: an orphan too
                orphan = True
                ck.hidden_turns += 1
                truth.malformed += 1
                truth.malformed_by_kind["hidden_failure"] = truth.malformed_by_kind.get("hidden_failure", 0) + 1
                out.append((draft.served.ts, _RAW, hidden_served(draft.served)))
            if orphan:
                ck.orphan_turns += 1
                truth.orphan_turns += 1
            else:
                ck.add_turn(draft, cfg.final_horizon_s)
            for e in draft.events[1:] if orphan else draft.events:
                truth.count_event(e)
                due = e.ts
                if nrng.random() < noise.out_of_order_rate:
                    due += nrng.randint(1_000, noise.max_jitter_ms)
                    truth.out_of_order += 1
                out.append((due, _NORMAL, e))
                if nrng.random() < noise.duplicate_rate:
                    out.append((due + nrng.randint(100, 5_000), _NORMAL, e))
                    truth.duplicates += 1
            self._plant_extras(nrng, ctx, draft, out, orphan)
            t = draft.end_ms + max(1_000, round(cfg.think_time.sample(rng)))
        return self._groups(ctx.session_id, out)

    def _hides(self, arm: Arm, draft: TurnDraft) -> bool:
        """Whether a ``hide-failures`` client sends this turn's served event malformed (its own random stream)."""
        rate = arm.profile.hide_failure_rate
        if not rate or not turn_failed(draft, self.config.final_horizon_s):
            return False
        return random.Random(f"{draft.request_id}:hide").random() < rate

    def _plant_extras(self, rng: random.Random, ctx: SessionContext, draft: TurnDraft,
                      out: list[tuple[int, int, Envelope | bytes]], orphan: bool) -> None:
        cfg, truth, noise = self.config, self._truth, self.config.noise
        if rng.random() < noise.late_rate:
            at = draft.anchor_ms + cfg.settle_ms + rng.randint(*noise.late_extra_ms)
            if at <= cfg.end_of_starts_ms:  # other traffic keeps flowing past it: the turn is final by then
                late = FollowUp(event_id=new_id(rng), schema_version=1, ts=at, org_id=ctx.org_id, session_id=ctx.session_id,
                                request_id=draft.request_id, producer=ctx.producer, dissatisfied=True)
                truth.count_event(late)
                if not orphan and at <= draft.anchor_ms + cfg.settle_ms + cfg.correction_ms:
                    truth.corrected += 1  # within the correction window: a new revision of the turn
                else:
                    truth.late += 1
                out.append((at, _LATE, late))
        if rng.random() < noise.malformed_rate:
            kind = rng.choice(MALFORMED_KINDS)
            at = draft.served.ts + rng.randint(0, 10_000)
            out.append((at, _RAW, malformed_record(rng, kind, ctx.session_id, at)))
            truth.malformed += 1
            truth.malformed_by_kind[kind] = truth.malformed_by_kind.get(kind, 0) + 1

    def _groups(self, session_id: str, items: list[tuple[int, int, Envelope | bytes]]) -> list[SendGroup]:
        """Cut a session's deliveries (sorted by due, stable) into send groups."""
        cfg = self.config
        groups: list[SendGroup] = []
        batch: list[Envelope] = []
        first = last = 0

        def close() -> None:
            if batch:
                groups.append(self._group(last, session_id, tuple(batch)))
                batch.clear()

        for due, kind, item in sorted(items, key=lambda x: x[0]):
            if kind != _NORMAL:
                close()
                events = (item,) if isinstance(item, Envelope) else ()
                raw = item if isinstance(item, bytes) else None
                groups.append(self._group(due, session_id, events, raw=raw, late=kind == _LATE))
                continue
            assert isinstance(item, Envelope)
            if batch and (due - first > cfg.batch_window_ms or len(batch) >= cfg.max_group_events):
                close()
            if not batch:
                first = due
            batch.append(item)
            last = due
        close()
        return groups

    def _group(self, due: int, sid: str, events: tuple[Envelope, ...], raw: bytes | None = None,
               late: bool = False) -> SendGroup:
        scale = self.config.time_scale
        at = (due - self.config.start_ms) / 1000 / scale if scale > 0 else 0.0
        return SendGroup(due, max(0.0, at), sid, events, raw, late)


def simulate(config: SimConfig) -> tuple[list[SendGroup], GroundTruth]:
    """The whole stream in memory, with its ground truth (small runs, tests)."""
    sim = Simulator(config)
    groups = list(sim.stream())
    return groups, sim.truth


def ground_truth(config: SimConfig) -> GroundTruth:
    """The ground truth of ``config`` without keeping the stream (same result as :func:`simulate`)."""
    sim = Simulator(config)
    for _ in sim.stream():
        pass
    return sim.truth
