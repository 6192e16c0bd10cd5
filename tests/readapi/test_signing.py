"""Signed requests: the header's form, the clock window and the nonces taken once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rewardflow.readapi import noncelog
from rewardflow.readapi.noncelog import NONCES_FILE, NonceLog
from rewardflow.readapi.signing import Nonces, Signed, parse

SIG = "ab" * 32


def test_only_a_well_formed_signed_header_is_parsed() -> None:
    assert parse(f"RF-HMAC-SHA256 id=0123456789ab,ts=1700000000,nonce={'c' * 32},sig={SIG}") == \
        Signed("0123456789ab", 1700000000, "c" * 32, SIG)
    assert parse(f"rf-hmac-sha256 id=0123456789ab,ts=1,nonce={'c' * 16},sig={SIG}") is not None  # (scheme: any case)
    for bad in ("Bearer rfr_0123456789ab_x", "", f"RF-HMAC-SHA256 id=0123456789ab,ts=1,nonce={'c' * 32}",
                f"RF-HMAC-SHA256 id=0123456789ab,ts=-1,nonce={'c' * 32},sig={SIG}",
                f"RF-HMAC-SHA256 id=0123456789ab,ts=1,nonce={'c' * 32},sig={SIG},x=1",
                f"RF-HMAC-SHA256 id=XYZ,ts=1,nonce={'c' * 32},sig={SIG}"):
        assert parse(bad) is None, bad


def test_a_nonce_is_taken_once_and_the_window_bounds_the_time() -> None:
    nonces = Nonces(window_s=60, max_kept=3)
    now = int(time.time())
    assert nonces.skew(now) is None and nonces.skew(now - 59) is None
    skew = nonces.skew(now - 120)
    assert skew is not None and skew < -60
    assert nonces.take("t1", "a", now) is None
    assert nonces.take("t1", "a", now) == (401, "this signed request was taken before (a copy is refused)")
    assert nonces.take("t1", "b", now) is None and nonces.take("t1", "c", now) is None
    busy = nonces.take("t1", "d", now)  # full: refused, never taken unchecked
    assert busy is not None and busy[0] == 429 and "retry later" in busy[1]
    assert nonces.take("t2", "d", now) is None  # another token has its own count


def test_a_nonce_is_kept_while_its_request_could_still_be_taken() -> None:
    nonces = Nonces(window_s=0.2, max_kept=1)
    now = time.time()
    assert nonces.take("t1", "a", int(now)) is None
    time.sleep(0.1)
    assert nonces.take("t1", "a", int(now)) is not None  # still within the window: a copy is refused
    time.sleep(0.35)
    assert nonces.take("t1", "b", int(time.time())) is None  # "a"'s request is past the window: it made room


def test_a_nonce_taken_before_a_restart_is_refused_after_it(tmp_path: Path) -> None:
    log = tmp_path / NONCES_FILE
    now = int(time.time())
    first = Nonces(window_s=60, log=NonceLog(log))
    assert first.take("0123456789ab", "a" * 32, now) is None
    with log.open("a") as f:
        f.write(f"0123456789ab {'b' * 32} {now - 1}\n")  # a nonce whose request is past the window
        f.write("0123456789ab " + "c" * 32)  # a line a kill cut short: no nonce of its was acted on
    again = Nonces(window_s=60, log=NonceLog(log))  # the endpoint restarted
    assert again.take("0123456789ab", "a" * 32, now) == (401, "this signed request was taken before (a copy is refused)")
    assert again.take("0123456789ab", "c" * 32, now) is None
    assert [line.split()[1][0] for line in log.read_text().splitlines()] == ["a", "c"]  # rewritten at start
    assert log.stat().st_mode & 0o777 == 0o600


def test_the_nonce_log_is_rewritten_once_it_grows_past_twice_the_nonces_kept(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(noncelog, "SLACK", 3)
    log = tmp_path / NONCES_FILE
    nonces = Nonces(window_s=0.2, log=NonceLog(log))
    lines = []
    for i in range(12):
        assert nonces.take("0123456789ab", f"{i:016x}", int(time.time())) is None
        lines.append(len(log.read_text().splitlines()))
        time.sleep(0.1)  # each request's nonce goes a few takes later
    assert max(lines) <= 2 * 4 + 3 + 1 and lines[-1] < 12  # never more than the rule allows, and rewritten


def test_a_nonce_the_endpoint_cannot_record_is_refused_and_not_kept(tmp_path: Path) -> None:
    log = tmp_path / NONCES_FILE
    nonces = Nonces(window_s=60, log=NonceLog(log))
    log.unlink()
    log.mkdir()  # whatever makes the write fail
    refused = nonces.take("0123456789ab", "a" * 32, int(time.time()))
    assert refused is not None and refused[0] == 503 and "cannot record" in refused[1]
    log.rmdir()
    assert nonces.take("0123456789ab", "a" * 32, int(time.time())) is None  # the reader's retry is taken
