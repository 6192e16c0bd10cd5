"""A stop that hangs after a crash is ended hard, with the exit code the crash's moment calls for.

Each case runs in a child process: the hard end is ``os._exit``. Pure (no broker): a stand-in app
that has crashed, and ``exit_on_crash`` as the worker starts it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(stopping: bool) -> tuple[int, str]:
    script = textwrap.dedent(f"""
        import asyncio, logging, time
        import rewardflow_streams.main as m
        logging.basicConfig(level=logging.INFO)
        m.CRASH_STOP_ASKED_S = 0.3
        stops = []

        class App:
            crashed = True
            crash_reason = RuntimeError("a service failed")

        asyncio.run(m.exit_on_crash(App(), lambda: stops.append(1), lambda: {stopping}, poll_s=0.01))
        print("stop called" if stops else "stop not called", flush=True)
        time.sleep(3)  # a stop that hangs
        print("hung through", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def test_a_stop_asked_for_that_hangs_after_a_crash_during_it_ends_hard_with_0() -> None:
    code, out = _run(stopping=True)
    assert code == 0, out
    assert "stop not called" in out and "hung through" not in out, out
    assert "crashed while stopping as asked" in out and "a service failed" in out, out


def test_a_crash_before_any_stop_asks_for_the_stop_and_arms_no_hard_end_of_0() -> None:
    code, out = _run(stopping=False)
    assert "stop called" in out and "crashed while stopping" not in out, out
    assert "hung through" in out and code == 0, out  # (the stand-in stop does nothing; the real one exits 1)
