"""The heap trimmer: it calls the C library's malloc_trim on its interval, and that returns freed pages."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from rewardflow import heaptrim
from rewardflow.heaptrim import HeapTrimmer


def test_the_thread_trims_on_its_interval_until_stopped() -> None:
    calls: list[int] = []
    twice = threading.Event()

    def trim(pad: int) -> int:
        calls.append(pad)
        if len(calls) >= 2:
            twice.set()
        return 1

    trimmer = HeapTrimmer(0.01, trim).start()
    assert twice.wait(5), "the trimmer did not call malloc_trim twice in 5 s"
    trimmer.stop()
    done = len(calls)
    assert set(calls) == {0} and trimmer.calls == done
    threading.Event().wait(0.05)
    assert len(calls) == done, "the trimmer went on after stop()"


def test_interval_zero_never_starts_a_thread() -> None:
    calls: list[int] = []
    trimmer = HeapTrimmer(0, calls.append).start()
    assert trimmer._thread is None
    trimmer.stop()
    assert calls == []


def test_without_malloc_trim_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heaptrim, "_malloc_trim", lambda: None)
    trimmer = HeapTrimmer(0.01)
    assert not trimmer.available
    trimmer.start()
    trimmer.trim_once()
    trimmer.stop()
    assert trimmer._thread is None and trimmer.calls == 0


_SCENARIO = """
import sys, time
from pathlib import Path
from rewardflow.heaptrim import HeapTrimmer

def rss_anon_mb():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024

blocks = [bytes(bytearray(4000)) for _ in range(50_000)]  # ~200 MB from the C heap (past pymalloc's 512 bytes)
del blocks
freed = rss_anon_mb()
if sys.argv[1] == "trim":
    HeapTrimmer(1.0).trim_once()
time.sleep(0.2)
print(freed - rss_anon_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or heaptrim._malloc_trim() is None,
                    reason="glibc's malloc_trim and /proc are Linux's")
def test_a_trim_returns_free_pages_that_free_kept() -> None:
    # a fresh interpreter, whose free() never gives the heap's top back: only the trim can
    env = {**os.environ, "MALLOC_TRIM_THRESHOLD_": str(2**40)}

    def returned_mb(mode: str) -> float:
        out = subprocess.run([sys.executable, "-c", _SCENARIO, mode], env=env, capture_output=True, text=True,
                             timeout=60, check=True)
        return float(out.stdout.strip())

    assert returned_mb("keep") < 20, "free() gave the pages back by itself: the scenario shows nothing"
    assert returned_mb("trim") > 100
