"""``rewardflow demo --quick`` end to end on the session's real broker: reconciliation, verdicts, gate,
Goodhart alerts, the replay under the next spec, the HTML page.

Each demo runs as a subprocess (chDB allows one engine per process and per
path; a subprocess never clashes with the test process) with its own
``REWARDFLOW_HOME``, so its chDB data and reports land in a temp directory.
Two quick demos (400 sessions x 8 turns, three checkpoints, ~40 s each) are run
once per module and shared by the tests:

* ``story``: the default story: the candidate with the published gains passes the gate with no
  alert; the one gaming the reward (over-asking) is alerted in the first 1 h window while its
  reward holds, fails the gate naming the rules, and loses its reward lead under ``v2``;
* ``regress``: the first candidate clearly worse: the persistence drop is detected with the right
  sign, it is blocked, and ``rewardflow compare --policy default`` fails it too. The second one's
  clients hide failing turns (``--hack hide-failures``): the exclusion balance alerts in the first
  window and the gate refuses it, though its reward looks better.
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
DEMO_ARGS = ["--json", "--quick", "--seed", "7", "--timeout-s", "240"]
BASE, CAND, GAMING = "ckpt-base", "ckpt-cand", "ckpt-cand-b"
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
    """``demo(name)``: the JSON summary of demo ``name`` (story | regress), run once per module."""
    options = {"story": [], "regress": ["--candidate-profile", "regress", "--hack", "hide-failures"]}
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
    assert turns == 400 * 8
    assert set(summary["truth"]["turns_per_checkpoint"]) == {BASE, CAND, GAMING}


def _failed(candidate: dict[str, Any]) -> set[str]:
    return {r["metric"] for r in candidate["gate"]["results"] if not r["passed"]}


def test_story_candidate_with_the_published_gains_is_deployable(demo: RunDemo) -> None:
    summary = demo("story")
    _assert_reconciled(summary)
    cand = summary["candidates"][CAND]
    assert cand["verdict"]["deploy"] and cand["gate"]["passed"], cand["verdict"]
    assert cand["verdict"]["alerts"] == [] and not _failed(cand)
    assert cand["verdict"]["headline"].startswith("DEPLOY")
    assert not any(a["checkpoint_id"] == CAND for a in summary["alerts"])


def test_story_gaming_candidate_is_alerted_in_the_first_window_and_fails_the_gate(demo: RunDemo) -> None:
    summary = demo("story")
    game = summary["candidates"][GAMING]
    assert not game["verdict"]["deploy"] and not game["gate"]["passed"]
    assert _failed(game) >= {"clarifying_rate"} and _failed(game) <= {"clarifying_rate", "edit_rate"}, game["gate"]
    assert "clarifying_rate" in game["verdict"]["headline"] and game["verdict"]["headline"].startswith("BLOCK")
    alerts = [a for a in summary["alerts"] if a["checkpoint_id"] == GAMING]
    assert {a["monitor"] for a in alerts} & {"clarifying_rate", "edit_rate"}, alerts
    assert {a["monitor"] for a in alerts} <= {"clarifying_rate", "edit_rate", "followup_rate"}, alerts
    assert min(a["window_start"] for a in alerts) == summary["sim_start_ms"]  # the first (full) 1 h window
    tolerance = summary["monitors"]["reward_tolerance"]
    assert all(a["reward_delta"] >= -tolerance and a["window_end"] - a["window_start"] == 3_600_000 for a in alerts)
    assert set(game["verdict"]["alerts"]) == {a["monitor"] for a in alerts}


def test_story_replays_the_alerted_window_under_the_next_spec(demo: RunDemo) -> None:
    summary = demo("story")
    shift = summary["replay"]
    assert shift is not None
    assert (shift["spec_from"], shift["spec_to"], shift["candidate"], shift["baseline"]) == ("v1", "v2", GAMING, BASE)
    assert shift["window_start"] == summary["sim_start_ms"]
    rows = {r["checkpoint_id"]: r for r in shift["rows"]}
    for r in rows.values():  # every stored turn of the window was replayed
        assert r["turns"] == r["turns_stored"] > 0
    lead_v1 = rows[GAMING]["mean_from"] - rows[BASE]["mean_from"]
    lead_v2 = rows[GAMING]["mean_to"] - rows[BASE]["mean_to"]
    # v2 prices a clarifying question at -0.25: the over-asking candidate loses most of its lead
    assert lead_v2 < lead_v1 - 0.02, (lead_v1, lead_v2)
    assert "--spec" in shift["command"] and "v2.toml" in shift["command"]


def test_story_exclusions_are_balanced(demo: RunDemo) -> None:
    summary = demo("story")
    assert not [a for a in summary["alerts"] if a["monitor"].startswith("exclusion_")]
    for ck in (CAND, GAMING):
        cand = summary["candidates"][ck]
        counts = cand["report"]["exclusions"]
        assert counts[ck]["turns"] == summary["truth"]["turns_per_checkpoint"][ck]
        assert counts[ck]["orphan"] == summary["truth"]["checkpoints"][ck]["orphan_turns"]
        rule = next(r for r in cand["gate"]["results"] if r["metric"] == "excluded_rate")
        assert rule["passed"] and "not evaluated" not in rule["reason"], rule


def test_story_late_signals_correct_their_turns(demo: RunDemo) -> None:
    summary = demo("story")
    corrected = summary["truth"]["corrected"]
    assert corrected > 0 and summary["corrections"]["total"] == corrected
    check = next(c for c in summary["reconciliation"] if "correction window" in c["check"])
    assert check["ok"] and check["actual"] == corrected
    example = summary["corrections"]["examples"][0]
    assert example["revision"] >= 1 and example["latest_reward"] != example["first_reward"]
    assert "<h2>Corrections</h2>" in Path(summary["html"]).read_text()


def test_hidden_failures_are_caught_by_the_exclusion_balance(demo: RunDemo) -> None:
    summary = demo("regress")
    game, truth = summary["candidates"][GAMING], summary["truth"]["checkpoints"][GAMING]
    assert truth["hidden_turns"] > 0 and summary["truth"]["checkpoints"][BASE]["hidden_turns"] == 0
    counts = game["report"]["exclusions"][GAMING]
    assert counts["orphan"] == truth["orphan_turns"] >= truth["hidden_turns"]
    assert game["report"]["metrics"]["mean_reward"]["delta"] > 0  # hiding failures makes it look better
    alerts = [a for a in summary["alerts"] if a["checkpoint_id"] == GAMING]
    assert "exclusion_orphan" in {a["monitor"] for a in alerts}, alerts
    assert min(a["window_start"] for a in alerts) == summary["sim_start_ms"]  # in the first window
    assert not game["verdict"]["deploy"] and "excluded_rate" in _failed(game), game["gate"]
    assert "exclusion balance alerts" in game["verdict"]["headline"]
    assert summary["replay"] is None or summary["replay"]["candidate"] != GAMING  # no spec answers hidden turns


def test_story_page_shows_verdicts_rules_and_alerted_windows(demo: RunDemo) -> None:
    page = Path(demo("story")["html"]).read_text()
    assert "Verdicts" in page and "DEPLOY" in page and "BLOCK" in page
    assert "Deploy gate: the rules" in page and "max_rise_points" in page
    assert "clarifying_rate on ckpt-cand-b" in page or "edit_rate on ckpt-cand-b" in page  # a shaded alert band
    assert "Replay under the next spec: v1 → v2" in page
    assert "Policy lineage" in page and "Exclusions (turns kept out of the rewards)" in page


def test_story_reports_each_arms_policy_lineage(demo: RunDemo) -> None:
    summary = demo("story")
    for ck in (CAND, GAMING):
        lineage = summary["candidates"][ck]["report"]["lineage"]
        assert (lineage[BASE]["parent_id"], lineage[BASE]["generation"]) == ("", 0)
        assert (lineage[ck]["parent_id"], lineage[ck]["generation"]) == (BASE, 1)
        assert lineage[ck]["deployed_at_ms"] == summary["sim_start_ms"]  # went live as its traffic started
        assert lineage[ck]["deployed_at_ms"] - lineage[BASE]["deployed_at_ms"] == 5 * 3_600_000


def test_regressed_candidate_is_detected_and_blocked(demo: RunDemo, kafka_broker: Any) -> None:
    summary = demo("regress")
    _assert_reconciled(summary)
    cand = summary["candidates"][CAND]
    persistence = cand["report"]["metrics"]["persistence_rate"]
    assert persistence["delta"] < 0 and persistence["ci_high"] < 0 and persistence["verdict"] == "worse"
    assert not any(a["checkpoint_id"] == CAND for a in summary["alerts"])  # the reward fell: not a hack
    assert not cand["verdict"]["deploy"] and "persistence_rate" in _failed(cand)
    dsn = f"chdb://{Path(summary['data_dir']) / 'chdb'}"
    env = _env(Path(summary["_home"]), kafka_broker.bootstrap, REWARDFLOW_CLICKHOUSE_DSN=dsn)
    proc = _cli(["compare", "--baseline", BASE, "--candidate", CAND, "--policy", "default", "--json"],
                env, timeout=120)
    assert proc.returncode == 1, proc.stderr.decode(errors="replace")[-2000:]
    doc = orjson.loads(proc.stdout)
    assert doc["report"]["metrics"]["persistence_rate"]["delta"] == pytest.approx(persistence["delta"])
    failed = {r["metric"] for r in doc["gate"]["results"] if not r["passed"]}
    assert "persistence_rate" in failed, doc["gate"]
    assert doc["report"]["exclusions"] == cand["report"]["exclusions"]  # read from the tables, as the demo did
    proc = _cli(["alerts", "--evaluate", "--baseline", BASE, "--checkpoint", GAMING, "--json"], env, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    monitors = {orjson.loads(line)["monitor"] for line in proc.stdout.splitlines()}
    assert "exclusion_orphan" in monitors, monitors
