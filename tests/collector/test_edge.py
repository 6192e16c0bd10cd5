"""The edge's judgement of a request, without I/O: decoding, tenancy, per-event rejections,
clock correction and redaction."""

from __future__ import annotations

import gzip
import re
from typing import Any

import orjson
import pytest

from rewardflow.collector.edge import EVENTS_SHAPE, Refused, admit, decode_json, inflate
from rewardflow.collector.redact import redact
from tests.factories import T0, ev, turn

NOW = T0 + 3_600_000
H3 = 3 * 3_600_000


def _doc(events: list[dict[str, Any]], sent_at: int = NOW) -> dict[str, Any]:
    return {"sent_at": sent_at, "events": events}


def _admit(doc: dict[str, Any], org: str = "org", **kw: Any) -> Any:
    return admit(doc, org, NOW, max_events=kw.pop("max_events", 500), tolerance_ms=kw.pop("tolerance_ms", 1000),
                 max_record_bytes=kw.pop("max_record_bytes", None))


def decode_body(body: bytes, encoding: str | None, max_bytes: int) -> dict[str, Any]:
    """What the edge does with a ``POST /v1/events`` body before admitting it."""
    return decode_json(inflate(body, encoding, max_bytes), EVENTS_SHAPE)


def test_gzip_is_inflated_within_the_limit_and_a_bomb_is_refused() -> None:
    body = orjson.dumps(_doc(turn("r1")))
    assert decode_body(gzip.compress(body), "gzip", 1_000_000)["sent_at"] == NOW
    bomb = gzip.compress(b"[" + b" " * 5_000_000 + b"]")
    with pytest.raises(Refused) as info:
        decode_body(bomb, "gzip", 1_000_000)
    assert info.value.status == 413 and "inflates beyond" in str(info.value)


@pytest.mark.parametrize(("body", "encoding", "status", "says"), [
    (b"{not json", None, 400, "not valid JSON"),
    (b"[1, 2]", None, 400, "expected an object"),
    (b"x" * 2000, None, 413, "at most 1,024"),
    (b"{}", "br", 415, "identity or gzip"),
    (b"\x1f\x8b junk", "gzip", 400, "not valid gzip"),
])
def test_malformed_bodies_are_refused_with_the_reason(body: bytes, encoding: str | None, status: int, says: str) -> None:
    with pytest.raises(Refused) as info:
        decode_body(body, encoding, 1024)
    assert info.value.status == status and says in str(info.value)


def test_a_partly_bad_request_keeps_its_valid_events_and_names_the_bad_ones() -> None:
    good = turn("r1", horizons=(30,))
    bad = [ev("ToolCall", "r1", duration_ms="slow"), {"event_type": "Nope"}, 7]
    out = _admit(_doc([good[0], *bad, *good[1:]]))
    assert out.accepted == len(good) and [e["event_id"] for e in out.sessions["s1"]] == [e["event_id"] for e in good]
    assert [(r.index, r.field) for r in out.rejected] == [(1, "duration_ms"), (2, "event_type"), (3, "<event>")]
    assert "valid integer" in out.rejected[0].reason


def test_an_event_too_large_for_a_record_is_rejected_alone() -> None:
    events = [ev("FollowUp", "r1", dissatisfied=True), ev("FollowUp", "r1", text_redacted="t" * 3_000)]
    out = _admit(_doc(events), max_record_bytes=2_000)
    assert out.accepted == 1 and [(r.index, r.field) for r in out.rejected] == [(1, "<event>")]
    assert "a record holds at most 2,000 (REWARDFLOW_MAX_RECORD_BYTES)" in out.rejected[0].reason


def test_the_key_decides_the_org() -> None:
    missing = {k: v for k, v in ev("InferenceServed", "r1").items() if k != "org_id"}
    out = _admit(_doc([missing]), org="acme")
    assert out.sessions["s1"][0]["org_id"] == "acme"
    with pytest.raises(Refused) as info:
        _admit(_doc([ev("InferenceServed", "r1"), ev("FollowUp", "r1", org_id="other")]), org="org")
    assert info.value.status == 403 and "[1]" in str(info.value) and "nothing was accepted" in str(info.value)


@pytest.mark.parametrize("skew", [H3, -H3])
def test_a_skewed_client_clock_is_corrected_and_its_own_time_kept(skew: int) -> None:
    events = [ev("InferenceServed", "r1", ts=NOW - 5000 + skew), ev("FollowUp", "r1", ts=NOW - 1000 + skew)]
    out = _admit(_doc(events, sent_at=NOW + skew))
    got = out.sessions["s1"]
    assert [e["ts"] for e in got] == [NOW - 5000, NOW - 1000]
    assert [e["client_ts"] for e in got] == [NOW - 5000 + skew, NOW - 1000 + skew] and out.corrected_ms == skew


def test_an_honest_clock_is_left_exactly_as_sent() -> None:
    out = _admit(_doc([ev("InferenceServed", "r1", ts=NOW - 5000)], sent_at=NOW + 400))
    assert out.sessions["s1"][0]["ts"] == NOW - 5000 and out.sessions["s1"][0].get("client_ts") is None


@pytest.mark.parametrize(("doc", "status", "says"), [
    ({"events": [ev("FollowUp", "r1")]}, 400, "sent_at: missing"),
    ({"sent_at": NOW // 1000, "events": [ev("FollowUp", "r1")]}, 400, "sent_at"),
    ({"sent_at": NOW, "events": []}, 400, "non-empty"),
    ({"sent_at": NOW, "events": [ev("FollowUp", "r1")] * 3}, 413, "at most 2"),
    ({"sent_at": NOW, "events": [ev("FollowUp", "r1")], "extra": 1}, 400, "extra: unknown field"),
])
def test_request_level_errors_name_the_field(doc: dict[str, Any], status: int, says: str) -> None:
    with pytest.raises(Refused) as info:
        _admit(doc, max_events=2)
    assert info.value.status == status and says in str(info.value)


def test_clients_cannot_set_client_ts() -> None:
    out = _admit(_doc([ev("FollowUp", "r1", client_ts=NOW)]))
    assert [(r.index, r.field) for r in out.rejected] == [(0, "client_ts")]


SECRETS = ["AKIAIOSFODNN7EXAMPLE", "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
           "sk-proj-abcdefghijklmnopqrstuvwxyz1234567890ABCD",
           "xoxb-123456789012-1234567890123-abcdefghijABCDEFGHIJklmn"]


def test_secrets_in_follow_up_text_are_scrubbed_and_counted() -> None:
    text = "it broke, my keys are " + " and ".join(SECRETS) + ". Also see src/app/main.py line 12, thanks"
    out = _admit(_doc([ev("FollowUp", "r1", text_redacted=text)]))
    scrubbed = out.sessions["s1"][0]["text_redacted"]
    assert not any(s in scrubbed for s in SECRETS) and "[REDACTED:" in scrubbed
    assert "src/app/main.py line 12, thanks" in scrubbed and sum(out.redacted.values()) == len(SECRETS)


@pytest.mark.parametrize("text", ["undo that please", "the function getUserAccountByIdentifier2 is wrong",
                                  "see https://github.com/org/repo/pull/1234"])
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact(text) == (text, {})


def _redacted_tokens(text: str) -> set[tuple[int, int]]:
    """The tokens a plain scan redacts: every token holding the start of an occurrence of a value a
    plugin reports, or that the entropy rule finds."""
    from rewardflow.collector.redact import _TOKEN, _kind_of, _lines, _plugins

    tokens = [(m.start(), m.end()) for m in _TOKEN.finditer(text)]
    out = set()
    for line_start, line in _lines(text):
        for plugin in _plugins():
            for secret in plugin.analyze_line(filename="text", line=line, line_number=0, context=None):
                value = secret.secret_value or ""
                at = [line_start + i for i in range(len(line)) if value and line.startswith(value, i)]
                out |= {(s, e) for s, e in tokens for a in at if s <= a < e}
    return out | {(s, e) for s, e in tokens if _kind_of(text[s:e])}


@pytest.mark.parametrize("text", [
    'password="a" ' + "a " * 300,
    'token = "hunter2" and hunter2again, xhunter2 hunter2\npassword: hunter2 ' + SECRETS[0] + " " + SECRETS[0],
    " ".join(f'password="{"b" * k}"' for k in range(1, 30)) + " " + "bbbbbbbb " * 50,
])
def test_redaction_replaces_exactly_the_tokens_a_plain_scan_finds(text: str) -> None:
    expected = _redacted_tokens(text)
    scrubbed, counts = redact(text)
    assert expected and sum(counts.values()) == len(expected)
    pieces, last = [], 0
    for s, e in sorted(expected):
        pieces += [text[last:s], "\0"]
        last = e
    pattern = "".join(pieces) + text[last:]
    assert scrubbed.count("[REDACTED:") == len(expected)
    assert re.sub(r"\[REDACTED:[^\]]+\]", "\0", scrubbed) == pattern


def test_redaction_looks_each_occurrence_up_once_not_across_every_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-character secret repeated in every token of a long text: each occurrence costs one lookup
    (a scan of every token for each occurrence held the edge's loop for seconds)."""
    import rewardflow.collector.redact as module

    calls = []
    real = module.bisect_right
    monkeypatch.setattr(module, "bisect_right", lambda a, x: calls.append(x) or real(a, x))
    text = 'password="a" ' + "a " * 8_185
    scrubbed, counts = redact(text, 16_384)
    tokens = len(text.split())
    assert counts["Secret Keyword"] == tokens and len(calls) <= tokens + 1
    assert len(scrubbed) == 16_384 and "a a" not in scrubbed


def test_a_text_that_redaction_makes_longer_than_its_limit_is_cut_to_it_and_still_valid() -> None:
    """Markers can be longer than the tokens they replace: a follow-up within the schema's 16,384
    characters stays within them once scrubbed (else the edge would answer 202 for an event the
    worker dead-letters)."""
    from rewardflow.collector.redact import CUT

    text = ('my config has password="hunter2" ' + "The build fails on CI after your change. " * 500)[:16_380]
    out = _admit(_doc([ev("FollowUp", "r1", text_redacted=text, dissatisfied=True)]))
    assert not out.rejected
    scrubbed = out.sessions["s1"][0]["text_redacted"]
    assert len(scrubbed) == 16_384 and scrubbed.endswith(CUT) and "hunter2" not in scrubbed
    assert out.redacted["cut"] == 1 and out.redacted["Secret Keyword"] == 1
    from rewardflow.events.validate import validate_event

    validate_event(out.sessions["s1"][0])  # the worker takes it
    short = "password=hunter2 is in my config"
    assert redact(short, 16_384)[1]["cut"] == 0


def test_a_key_created_just_after_a_reload_is_found_on_its_first_use() -> None:
    import time

    from rewardflow.collector.keys import KeyCache, digest

    table: dict[str, tuple[str, str]] = {}
    loads = []
    cache = KeyCache(lambda: (loads.append(1), dict(table))[1], refresh_s=60)
    cache.refresh()
    secret = "rfk_0123456789ab_" + "s" * 43
    table["0123456789ab"] = (digest(secret), "org")  # created right after the reload
    assert cache.org_of(secret) is None
    cache.refresh_after_miss(time.monotonic())
    assert cache.org_of(secret) == ("0123456789ab", "org") and len(loads) == 2
    cache.refresh_after_miss(time.monotonic() - 10)  # a miss older than the last reload: no reload
    assert len(loads) == 2


def test_metric_labels_of_rejections_are_bounded_by_the_contract() -> None:
    from rewardflow.collector.limits import contract_field

    out = _admit(_doc([{**ev("FollowUp", "r1"), "x-attacker-chosen-1": 1}]))
    assert [r.field for r in out.rejected] == ["x-attacker-chosen-1"]
    assert contract_field("x-attacker-chosen-1") == "other"
    assert [contract_field(f) for f in ("ts", "event_type", "text_redacted", "<event>")] == [
        "ts", "event_type", "text_redacted", "<event>"]
