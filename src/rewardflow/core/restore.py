"""A partition's state read back from its store after a (re)assignment: what
:meth:`~rewardflow.core.processor.PartitionProcessor.rebuild` starts from.

:func:`restore` reads the partition meta key, the stored window closes and every session state of
the partition, and recomputes what is derived from them (the window accumulators, the open served
turns). It appends to ``out`` every final output decided at or after ``first_offset``, because
their delivery is uncertain: the rewards of tombstones and their kept corrections, orphan
exclusions, then the stored window closes, oldest offset first. Ids are deterministic, so this
re-emission only ever produces duplicates with equal ids.

State stored under the session id alone (no org in the key) is taken as the session of the org
its turns name, under that org's key; :attr:`Restored.unkeyed` maps it to its old store key,
which the processor deletes once the new key is written. Such state is dropped
(:attr:`Restored.dropped`) when no turn or tombstone names an org (then it holds nothing but seen
ids) or when the org's key already holds a state.

Contract: pure; it only reads the store. Sessions come in the store's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rewardflow.core.config import JoinConfig, StateStore
from rewardflow.core.corrections import Scored, reemit
from rewardflow.core.outputs import Outputs
from rewardflow.core.score import score
from rewardflow.core.session import SessionState, org_of, session_key
from rewardflow.core.turn import outcome_from_obj
from rewardflow.core.windows import WindowBook, window_from_obj

NEVER = 2**62
"""Beyond any event time: ``-NEVER`` is the watermark of a partition that has seen nothing."""


def meta_key(partition: int) -> str:
    """The store key of the partition's meta value (watermark, closed-through, last offset, marks)."""
    return f"m:{partition}"


def close_prefix(partition: int) -> str:
    """The prefix of the store keys ``r:<partition>:<offset>:<chunk>`` of the partition's window closes."""
    return f"r:{partition}:"


@dataclass(slots=True)
class Restored:
    """What a partition's store holds, and what is derived from it."""

    wm: int
    maxts: int
    marks: list[list[int]]
    last_offset: int
    book: WindowBook
    closes: dict[str, int]  # stored window-close keys -> offset of the record that closed them
    sessions: list[SessionState]
    open_served: dict[tuple[str, str], int]  # (session key, request id) of an open served turn -> its served ts
    unkeyed: dict[str, str]  # session key -> the store key of its state stored under the session id alone
    dropped: list[str]  # store keys of states to delete


def restore(store: StateStore, cfg: JoinConfig, partition: int, scored: Scored,
            first_offset: int, out: Outputs) -> Restored:
    """The partition's state in ``store``; outputs decided at or after ``first_offset`` go to ``out``."""
    meta = store.get(meta_key(partition)) or {}
    book = WindowBook(list(cfg.window_sizes_s), partition, {int(k): v for k, v in meta.get("ct", {}).items()})
    r = Restored(meta.get("wm", -NEVER), meta.get("maxts", -NEVER), meta.get("marks", []), int(meta.get("off", -1)),
                 book, {}, [], {}, {}, [])
    prefix = close_prefix(partition)
    recent: list[tuple[int, list[Any]]] = []
    for key, obj in store.items():
        if key.startswith(prefix):
            off = int(key.split(":")[2])
            r.closes[key] = off
            recent.append((off, obj))
            continue
        if not key.startswith("s:") or obj[1] != partition:
            continue
        st = _stored_state(store, key, obj, r)
        if st is None:
            continue
        for rid, turn in st.turns.items():
            if turn.served is not None:
                r.open_served[(st.key, rid)] = turn.served["ts"]
        # (held tombstones are pruned ones a restart may need, SessionState.prune: adding one to the
        # book is a no-op unless the meta write of the batch that closed its window was lost)
        for tomb in (*st.done.values(), *(h[1] for h in st.held.values())):
            if tomb.outcome is not None:
                recs = [score(outcome_from_obj(tomb.outcome), s, h) for s, h in scored]
                for rec in recs:
                    book.add(rec)
                if tomb.offset >= first_offset:
                    out.rewards.extend(recs)
                rewards, windows = reemit(tomb, first_offset, scored, cfg, partition)
                out.rewards.extend(rewards)
                out.windows.extend(windows)
            elif tomb.orphan is not None and tomb.offset >= first_offset:
                out.excluded.append(tomb.orphan)  # type: ignore[arg-type]
        r.sessions.append(st)
    for off, wins in sorted(recent, key=lambda x: x[0]):
        if off >= first_offset:
            out.windows.extend(window_from_obj(w) for w in wins)
    return r


def _stored_state(store: StateStore, key: str, obj: Any, r: Restored) -> SessionState | None:
    """The state stored under ``key``, or None when it is to be dropped (the module's docstring)."""
    if "\t" in key:
        return SessionState.from_obj(obj, org_of(key[2:]))
    st = SessionState.from_obj(obj, "")
    org = st.recorded_org()
    if org is None or store.get("s:" + session_key(org, st.session_id)) is not None:
        r.dropped.append(key)
        return None
    st = SessionState.from_obj(obj, org)
    r.unkeyed[st.key] = key
    return st
