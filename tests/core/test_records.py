"""stable_id: deterministic ids, byte-identical to the blake2b-of-parts definition."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewardflow.core.records import stable_id


def reference_id(*parts: object) -> str:
    """The definition: blake2b-128 over each part's ``str()``, UTF-8, each followed by 0x1F."""
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(str(p).encode())
        h.update(b"\x1f")
    return h.hexdigest()


_text = st.text(st.characters(codec="utf-8"), max_size=40)
_part = st.one_of(_text, st.integers(), st.floats(), st.booleans(), st.none(), st.tuples(_text, st.integers()))


@settings(max_examples=300, deadline=None)
@given(st.lists(_part, max_size=24))
def test_stable_id_is_the_blake2b_of_the_parts(parts: list[object]) -> None:
    assert stable_id(*parts) == reference_id(*parts)


def test_known_ids_do_not_change() -> None:
    # ids already stored downstream (ClickHouse dedup keys) must stay byte-identical
    assert stable_id() == reference_id() == hashlib.blake2b(b"", digest_size=16).hexdigest()
    assert stable_id("v1", "req-1", "final") == reference_id("v1", "req-1", "final")
    assert stable_id("w", 300, 1764000000000, "ck", "arm", "chat", "v1") == \
        hashlib.blake2b(b"w\x1f300\x1f1764000000000\x1fck\x1farm\x1fchat\x1fv1\x1f", digest_size=16).hexdigest()
    assert stable_id("a", "b") == "6fca551012b8de073665988d40a497c7" != stable_id("ab")


def test_parts_are_formatted_with_their_own_str() -> None:
    class Tag(str):
        def __str__(self) -> str:
            return "tag!"

    class Obj:
        def __str__(self) -> str:
            return "obj"

    parts = (Tag("x"), Obj(), 1.5, True, None, ("t", 1), "é€")
    assert stable_id(*parts) == reference_id(*parts)
    assert stable_id(*range(40)) == reference_id(*range(40))  # more parts than the prepared formats


def test_unencodable_text_raises_as_before() -> None:
    with pytest.raises(UnicodeEncodeError):
        reference_id("\ud800")
    with pytest.raises(UnicodeEncodeError):
        stable_id("\ud800")
