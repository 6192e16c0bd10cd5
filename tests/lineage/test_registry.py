"""The registry's rules, pure: generations, lag, the lag filter's ids, refusals, times."""

from __future__ import annotations

import pytest

from rewardflow.lineage.registry import Checkpoint, LineageError, Registry, iso_ms, parse_time

T = 1_748_764_800_000  # 2025-06-01T08:00:00Z


def chain(*ids: str, step_ms: int = 5 * 3_600_000) -> Registry:
    """A registry where each id is the child of the one before, deployed ``step_ms`` apart."""
    registry = Registry()
    for n, ck in enumerate(ids):
        planned, new = registry.plan(ck, ids[n - 1] if n else "", T + n * step_ms, now_ms=0)
        assert new
        registry = Registry({**registry.checkpoints, ck: planned})
    return registry


def test_generation_is_the_parents_plus_one_and_lag_counts_from_the_newest() -> None:
    registry = chain("g0", "g1", "g2", "g3")
    fork, _ = registry.plan("g1b", "g0", T, now_ms=0)
    registry = Registry({**registry.checkpoints, "g1b": fork})
    assert [registry.get(c).generation for c in ("g0", "g1", "g2", "g3", "g1b")] == [0, 1, 2, 3, 1]  # type: ignore[union-attr]
    assert registry.newest_generation == 3
    assert [registry.lag(c) for c in ("g3", "g2", "g1b", "g0", "unknown")] == [0, 1, 2, 3, None]
    assert registry.within(0) == ["g3"]
    assert registry.within(2) == ["g1", "g1b", "g2", "g3"]
    assert registry.within(99) == ["g0", "g1", "g1b", "g2", "g3"]
    assert [c.checkpoint_id for c in registry.ordered()] == ["g0", "g1b", "g1", "g2", "g3"]  # g1b deployed first


def test_an_empty_registry_has_no_generation_and_no_ids_within_any_lag() -> None:
    assert Registry().newest_generation is None and Registry().within(5) == [] and Registry().lag("x") is None
    with pytest.raises(ValueError, match="0 or more"):
        Registry().within(-1)


def test_registering_again_identically_is_a_no_op_and_defaults_to_the_registered_time() -> None:
    registry = chain("a", "b")
    same, new = registry.plan("b", "a", T + 5 * 3_600_000, "another note", now_ms=T * 2)
    assert not new and same == registry.get("b")
    implicit, new = registry.plan("b", "a", None, now_ms=T * 2)  # no time given: the registered one, not now
    assert not new and implicit.deployed_at_ms == T + 5 * 3_600_000
    fresh, new = registry.plan("c", "b", None, now_ms=T * 2)  # a new checkpoint without a time: now
    assert new and fresh.deployed_at_ms == T * 2 and fresh.generation == 2


@pytest.mark.parametrize("parent, when, needle", [
    ("", T + 5 * 3_600_000, "registered with parent 'a'"),  # made a root
    ("b", T + 5 * 3_600_000, "cannot be its own parent"),
    ("a", T + 1, "does not change"),  # another deployment time
    ("zzz", T + 5 * 3_600_000, "registered with parent 'a'"),
])
def test_a_changed_lineage_is_refused(parent: str, when: int, needle: str) -> None:
    with pytest.raises(LineageError, match=needle):
        chain("a", "b").plan("b", parent, when, now_ms=0)


def test_an_unknown_parent_is_refused_by_name_so_no_cycle_can_be_written() -> None:
    registry = chain("a")
    with pytest.raises(LineageError, match=r"unknown parent checkpoint 'ghost'.*register ghost"):
        registry.plan("child", "ghost", T, now_ms=0)
    # a cycle needs a parent registered after its child: the child would have to name it first
    with pytest.raises(LineageError, match="unknown parent"):
        registry.plan("x", "y", T, now_ms=0)


@pytest.mark.parametrize("bad", ["", "a\nb", "x" * 129])
def test_ids_are_1_to_128_printable_characters(bad: str) -> None:
    with pytest.raises(LineageError, match="checkpoint id"):
        Registry().plan(bad, "", T, now_ms=0)


def test_from_rows_keeps_the_first_row_of_an_id() -> None:
    rows = [{"checkpoint_id": "a", "parent_id": "", "generation": 0, "deployed_at_ms": T, "note": "first"},
            {"checkpoint_id": "a", "parent_id": "", "generation": 0, "deployed_at_ms": T + 9, "note": "racer"}]
    assert Registry.from_rows(rows).get("a") == Checkpoint("a", "", 0, T, "first")


@pytest.mark.parametrize("text, ms", [
    ("1748764800000", T), ("2025-06-01T08:00:00Z", T), ("2025-06-01T10:00:00+02:00", T),
    ("2025-06-01T08:00:00", T), ("2025-06-01 08:00:00.123", T + 123),
])
def test_times_are_iso_8601_or_epoch_ms(text: str, ms: int) -> None:
    assert parse_time(text) == ms
    assert parse_time(iso_ms(ms)) == ms


@pytest.mark.parametrize("text, needle", [
    ("1748764800", "looks like epoch seconds"), ("yesterday", "ISO-8601"), ("-5", "ISO-8601"),
    ("99999999999999999", "between 1973 and 9999"),
])
def test_bad_times_are_refused_with_the_reason(text: str, needle: str) -> None:
    with pytest.raises(LineageError, match=needle):
        parse_time(text)
