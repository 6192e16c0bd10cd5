"""``rewardflow demo`` end to end on the session's real broker: reconciliation, A/B sign, gate, Goodhart.

Each demo runs as a subprocess (chDB allows one engine per process and per
path; a subprocess never clashes with the test process) with its own
``REWARDFLOW_HOME``, so its chDB data and reports land in a temp directory.
Three small demos (100 sessions x 8 turns, ~30 s each) are run once per
module and shared by the tests:

* ``clean``: the default candidate (published gains): counts reconcile, no alert;
* ``over-ask``: the planted hack: the clarifying-rate (or edit-rate) monitor
  alerts in the first 1 h window while the reward holds;
* ``regress``: a clearly worse candidate: the persistence drop is detected
  with the right sign, and ``rewardflow compare`` with the example gate fails it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.clickhouse, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
GATE = ROOT / "src" / "rewardflow" / "analysis" / "deploy-gate.toml"
DEMO_ARGS = ["--json", "--sessions", "100", "--turns-per-session", "8", "--seed", "7", "--timeout-s", "240"]
RunDemo = Callable[[str], dict[str, Any]]


def _free_port_pair() -> int:
    """A port p with p and p + 1 free (the worker serves its web view on web_port + 1)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no pair of free ports")


def _env(home: Path, bootstrap: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARDFLOW_")}
    return {**env, "REWARDFLOW_HOME": str(home), "REWARDFLOW_KAFKA_BOOTSTRAP": bootstrap,
            "REWARDFLOW_WEB_PORT": str(_free_port_pair()), **extra}


def _cli(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[bytes]:
    cmd = [sys.executable, "-c", "from rewardflow.cli.main import main; main()", *args]
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def demo(kafka_broker: Any, tmp_path_factory: pytest.TempPathFactory) -> RunDemo:
    """``demo(name)``: the JSON summary of demo ``name`` (clean | over-ask | regress), run once per module."""
    options = {"clean": [], "over-ask": ["--hack", "over-ask"], "regress": ["--candidate-profile", "regress"]}
    done: dict[str, dict[str, Any]] = {}

    def run(name: str) -> dict[str, Any]:
        if name not in done:
            home = tmp_path_factory.mktemp(f"demo-{name}")
            proc = _cli(["demo", *DEMO_ARGS, *options[name]], _env(home, kafka_broker.bootstrap), timeout=420)
            tail = proc.stderr.decode(errors="replace")[-3000:]
            assert proc.returncode == 0, f"demo {name} exited {proc.returncode}:\n{tail}"
            summary = orjson.loads(proc.stdout)
            summary["_home"] = str(home)
            done[name] = summary
        return done[name]

    return run


def _assert_reconciled(summary: dict[str, Any]) -> None:
    assert summary["ok"]
    bad = [c for c in summary["reconciliation"] if not c["ok"]]
    assert not bad, bad
    turns = sum(summary["truth"]["turns_per_checkpoint"].values()) + summary["truth"]["orphan_turns"]
    assert turns == 100 * 8


def test_clean_demo_reconciles_and_raises_no_alert(demo: RunDemo) -> None:
    summary = demo("clean")
    _assert_reconciled(summary)
    assert summary["monitors"]["window_size_s"] == 3600
    assert summary["alerts"] == []


def test_over_ask_hack_alerts_in_the_first_window_while_reward_holds(demo: RunDemo) -> None:
    summary = demo("over-ask")
    _assert_reconciled(summary)
    alerts = summary["alerts"]
    assert {a["monitor"] for a in alerts} & {"clarifying_rate", "edit_rate"}, alerts
    assert {a["monitor"] for a in alerts} <= {"clarifying_rate", "edit_rate", "followup_rate"}, alerts
    first = min(a["window_start"] for a in alerts)
    assert first == summary["sim_start_ms"]  # the first (full) 1 h window of the run
    tolerance = summary["monitors"]["reward_tolerance"]
    assert all(a["reward_delta"] >= -tolerance and a["window_end"] - a["window_start"] == 3_600_000 for a in alerts)
    metrics = summary["report"]["metrics"]
    assert metrics["clarifying_rate"]["delta"] > 0.08 and metrics["clarifying_rate"]["verdict"] == "worse"


def test_regressed_candidate_is_detected_and_fails_the_gate(demo: RunDemo, kafka_broker: Any) -> None:
    summary = demo("regress")
    _assert_reconciled(summary)
    persistence = summary["report"]["metrics"]["persistence_rate"]
    assert persistence["delta"] < 0 and persistence["ci_high"] < 0 and persistence["verdict"] == "worse"
    assert summary["alerts"] == []  # the reward fell: not a hack
    dsn = f"chdb://{Path(summary['data_dir']) / 'chdb'}"
    env = _env(Path(summary["_home"]), kafka_broker.bootstrap, REWARDFLOW_CLICKHOUSE_DSN=dsn)
    proc = _cli(["compare", "--baseline", "ckpt-base", "--candidate", "ckpt-cand", "--policy", str(GATE), "--json"],
                env, timeout=120)
    assert proc.returncode == 1, proc.stderr.decode(errors="replace")[-2000:]
    doc = orjson.loads(proc.stdout)
    assert doc["report"]["metrics"]["persistence_rate"]["delta"] == pytest.approx(persistence["delta"])
    failed = {r["metric"] for r in doc["gate"]["results"] if not r["passed"]}
    assert "persistence_rate" in failed, doc["gate"]
