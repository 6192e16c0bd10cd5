"""Pure reward functions: a finalised :class:`TurnOutcome` and a spec → a reward record.

The same function serves the stream and batch replay, so a replay under the
same spec reproduces the stream's rewards exactly.

Contract: pure, no I/O, deterministic. Broken tool calls always contribute
``weights.tool_broken × count`` (never dropped).

Hot path: :func:`score` runs once per finalised turn and spec. The spec is an
immutable model, so what it derives to (weights, the components of a turn with
no counts, content hash, id prefix) is computed once per spec object
(:func:`_compiled`); records are built as dict literals (a ``TypedDict`` call
with keywords costs several times more). Every float is the same product, in
the same order, as the plain definition, so records are bit-identical.
"""

from __future__ import annotations

from typing import NamedTuple

from rewardflow.core.records import id_of_joined
from rewardflow.core.rows import RewardRecord
from rewardflow.core.turn import TurnOutcome
from rewardflow.core.spec import RewardSpec


_COUNTED = ("accept", "reject", "undo", "revert", "dissatisfied", "tool_broken", "tool_error", "clarifying")


class _Compiled(NamedTuple):
    """What :func:`score` needs from a spec, read once per spec object."""

    zero: dict[str, float]  # components of an outcome with no counts, in component order (see _components)
    counted: dict[str, float]  # counter name -> weight, for the counted components
    persistence: float  # weight
    latency_per_s: float  # weight
    version: str
    content_hash: str
    id_prefix: str  # spec version + the stable_id separator


_CACHE: dict[int, tuple[RewardSpec, _Compiled]] = {}  # id(spec) -> (spec, derived); holding spec pins its id
_CACHE_MAX = 256


def _compiled(spec: RewardSpec) -> _Compiled:
    hit = _CACHE.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    w = spec.weights
    counted = {name: getattr(w, name) for name in _COUNTED}
    # weight × 0 is kept as computed (e.g. -0.5 * 0 == -0.0), exactly as when the count is looked up
    zero = {"persistence": 0.0, **{n: counted[n] * 0 for n in _COUNTED[:5]}, "latency": 0.0,
            **{n: counted[n] * 0 for n in _COUNTED[5:]}}
    c = _Compiled(zero, counted, w.persistence, w.latency_per_s, spec.version, spec.content_hash, f"{spec.version!s}\x1f")
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    _CACHE[id(spec)] = (spec, c)
    return c


def _components(o: TurnOutcome, c: _Compiled) -> dict[str, float]:
    """:func:`components`: the zero-count template, then the outcome's own terms (keys keep their order)."""
    comps = c.zero.copy()
    h = o.horizon_s
    if o.checked.get(h):  # final_persistence() is not None
        comps["persistence"] = c.persistence * o.persistence[h]
    comps["latency"] = c.latency_per_s * o.latency_ms / 1000.0
    counted = c.counted
    for name, n in o.counts.items():
        if name in counted:
            comps[name] = counted[name] * n
    return comps


def components(o: TurnOutcome, spec: RewardSpec) -> dict[str, float]:
    """Each component's contribution to the reward."""
    return _components(o, _compiled(spec))


def _reward_id(id_prefix: str, o: TurnOutcome, revision: int = 0) -> str:
    # = stable_id(spec_version, org_id, session_id, request_id, tag[, f"r{revision}"]): blake2b-128 of each
    # str(part) + "\x1f". The turn is (org, session, request): two sessions' turns of one request id never
    # share a row id
    rev = f"r{revision}\x1f" if revision else ""
    return id_of_joined(f"{id_prefix}{o.org_id!s}\x1f{o.session_id!s}\x1f{o.request_id!s}\x1f"
                        f"{f'h{o.horizon_s}' if o.provisional else 'final'}\x1f{rev}")


def reward_id(spec_version: str, o: TurnOutcome, revision: int = 0) -> str:
    return _reward_id(f"{spec_version!s}\x1f", o, revision)


def score(o: TurnOutcome, spec: RewardSpec, spec_hash: str | None = None, revision: int = 0) -> RewardRecord:
    """The reward record of one outcome under one spec; ``revision`` > 0 for a correction of a final
    outcome (its own ``reward_id``, the same ``sample_id``)."""
    c = _compiled(spec)
    comps = _components(o, c)
    get = o.counts.get
    return {
        "reward_id": _reward_id(c.id_prefix, o, revision),
        "sample_id": o.request_id,
        "spec_version": c.version,
        "spec_hash": spec_hash or c.content_hash,
        "org_id": o.org_id,
        "session_id": o.session_id,
        "checkpoint_id": o.checkpoint_id,
        "experiment_arm": o.experiment_arm,
        "surface": o.surface,
        "served_ts": o.served_ts,
        "finalised_wm": o.finalised_wm,
        "finalised_by": o.finalised_by,
        "provisional": int(o.provisional),
        "horizon_s": o.horizon_s,
        "revision": revision,
        "reward": round(sum(comps.values()), 12),
        "components": comps,
        "latency_ms": o.latency_ms,
        "ttft_ms": o.ttft_ms,
        "completion_tokens": o.completion_tokens,
        "n_edits": o.n_edits,
        "n_tool_calls": get("tool_calls", 0),
        "n_tool_broken": get("tool_broken", 0),
        "n_tool_error": get("tool_error", 0),
        "n_clarifying": get("clarifying", 0),
        "n_followups": get("followups", 0),
        "n_dissatisfied": get("dissatisfied", 0),
        "n_accept": get("accept", 0),
        "n_reject": get("reject", 0),
        "n_undo": get("undo", 0),
        "n_revert": get("revert", 0),
        "persistence": dict(o.persistence),
        "persisted": dict(o.persisted),
        "checked": dict(o.checked),
    }
