"""Run every benchmark (produce, stream, sink, e2e, faust_path, collect) in sequence as subprocesses and summarise them. Not a test.

One local Kafka broker is started for all of them (unless ``--bootstrap`` /
``REWARDFLOW_KAFKA_BOOTSTRAP`` names one) and passed to each script. Each
script writes its own JSON under ``bench/results/``; this collects them into
``bench/results/summary.json`` and prints one table: each figure beside its
floor (baseline), the ratio, and the target.

    python bench/run_all.py [--quick] [--only produce,e2e] [--json]

Exit code: 0 when every selected script ran, 1 otherwise (targets missed do not fail it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
NAMES = ("produce", "stream", "sink", "e2e", "faust_path", "collect")
QUICK_ARGS = {
    "produce": ["--events", "50000", "--runs", "1"],
    "stream": ["--events", "20000", "--runs", "1"],
    "sink": ["--rows", "50000", "--runs", "1"],
    "e2e": ["--quick"],
    "faust_path": ["--events", "30000", "--runs", "1"],
    "collect": ["--events", "10000"],
}


def _g(d: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def rows_of(name: str, res: dict[str, Any]) -> list[dict[str, Any]]:
    """(figure, value, floor, ratio, target, unit) rows from one script's JSON."""
    if name == "produce":
        return [{"figure": "SDK produce", "value": res.get("median_sdk_events_s"), "floor": res.get("median_raw_events_s"),
                 "ratio": res.get("ratio"), "target": ">= 0.7 ratio", "unit": "events/s"}]
    if name == "stream":
        return [{"figure": "stream worker (ingest+join+reward)", "value": res.get("median_worker_events_s"),
                 "floor": res.get("median_floor_events_s"), "ratio": res.get("ratio"),
                 "target": f">= {res.get('target_events_s', 20000):,} events/s", "unit": "events/s"}]
    if name == "sink":
        out = []
        for table, t in (res.get("tables") or {}).items():
            m = t.get("median", {})
            out.append({"figure": f"sink -> {table}", "value": m.get("sink_rows_s"), "floor": m.get("raw_insert_arrow_rows_s"),
                        "ratio": m.get("ratio"), "target": ">= 0.5 ratio", "unit": "rows/s"})
            if m.get("export_arrow_rows_s") is not None:
                out.append({"figure": f"trainer export {table} (as the sink left it)", "value": m.get("export_arrow_rows_s"),
                            "floor": None, "ratio": None, "target": ">= 1,000,000 rows/s", "unit": "rows/s"})
        scale = res.get("export_at_scale")
        if scale:
            out.append({"figure": f"trainer export, {scale['rows']:,} rows", "value": scale.get("export_rows_s"),
                        "floor": scale.get("engine_arrow_rows_s"), "ratio": scale.get("ratio"),
                        "target": ">= 1,000,000 rows/s", "unit": "rows/s"})
        return out
    if name == "e2e":
        out = []
        for s in res.get("sizes", []):
            m, n = s["median"], s["events"]
            out.append({"figure": f"e2e {n:,} events (from start)", "value": m.get("events_s"), "floor": m.get("floor_events_s"),
                        "ratio": m.get("ratio"), "target": ">= 20,000 ev/s, ratio >= 0.5", "unit": "events/s"})
            out.append({"figure": f"e2e {n:,} freshness p50 / p99", "value": m.get("fresh_p99_s"), "floor": None, "ratio": None,
                        "target": "p99 <= 2 s", "unit": f"s (p50 {m['fresh_p50_s']:.2f})" if m.get("fresh_p50_s") is not None else "s"})
            st = s.get("steady")
            if st:
                out.append({"figure": f"e2e {n:,} freshness p50 / p99, steady state at {st['offered_events_s']:,.0f} ev/s",
                            "value": st.get("fresh_p99_s"), "floor": None, "ratio": None, "target": "p99 <= 2 s",
                            "unit": f"s (p50 {st['fresh_p50_s']:.2f})" if st.get("fresh_p50_s") is not None else "s"})
            out.append({"figure": f"e2e {n:,} worker peak RSS", "value": m.get("peak_rss_mb"), "floor": m.get("rss_at_ready_mb"),
                        "ratio": (m["peak_rss_mb"] / m["rss_at_ready_mb"]) if m.get("peak_rss_mb") and m.get("rss_at_ready_mb") else None,
                        "target": f"flat vs turns ({m.get('finalised_turns') or 0:,.0f} finalised)", "unit": "MB"})
        return out
    if name == "faust_path":
        m, shape = res.get("median") or {}, f"{res.get('events_per_record') or 0:.2f} events/record"
        return [{"figure": f"Faust's agent route alone, {shape} (a ceiling)", "value": m.get("faust_events_s"),
                 "floor": m.get("floor_events_s"), "ratio": m.get("ratio"), "target": "(a ceiling, no target)",
                 "unit": "events/s"},
                {"figure": f"the worker's bulk route alone, {shape} (a ceiling)", "value": m.get("bulk_events_s"),
                 "floor": m.get("floor_events_s"),
                 "ratio": (m["bulk_events_s"] / m["floor_events_s"]) if m.get("bulk_events_s") and m.get("floor_events_s") else None,
                 "target": "(a ceiling, no target)", "unit": "events/s"}]
    if name == "collect":
        c = res.get("collector") or {}
        shape = f"{res.get('shape')} shape, {res.get('events_per_request') or 0:.1f} events/request, {res.get('clients')} clients"
        return [{"figure": f"collector HTTP ingest ({shape})", "value": c.get("events_s"),
                 "floor": _g(res, "sdk", "events_s"), "ratio": res.get("ratio"), "target": ">= 0.5 ratio (floor: SDK)",
                 "unit": "events/s"},
                {"figure": "collector request latency p50 / p99", "value": c.get("latency_p99_ms"), "floor": None,
                 "ratio": None, "target": "",
                 "unit": f"ms (p50 {c['latency_p50_ms']:.1f})" if c.get("latency_p50_ms") is not None else "ms"}]
    return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one run each (minutes, not an hour)")
    ap.add_argument("--only", default=",".join(NAMES), help=f"comma-separated subset of {','.join(NAMES)}")
    ap.add_argument("--json", action="store_true", help="print summary.json to stdout instead of the table")
    ap.add_argument("--bootstrap", default=os.environ.get("REWARDFLOW_KAFKA_BOOTSTRAP"))
    ap.add_argument("--partitions", type=int, default=4)
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        print(f"error: unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(NAMES)}", file=sys.stderr)
        return 2
    broker, bootstrap = None, args.bootstrap
    if not bootstrap:
        from rewardflow.kafka_local import LocalBroker
        from rewardflow.kafka_local.ports import free_ports
        from rewardflow.settings import load_settings

        port, cport = free_ports(2)
        tmp = Path(tempfile.mkdtemp(prefix="bench-all-"))
        broker = LocalBroker(load_settings().home, port, cport, partitions=args.partitions, data_dir=tmp / "kafka",
                             die_with_parent=True)
        bootstrap = broker.up(timeout=120).bootstrap
    out_stream = sys.stderr if args.json else sys.stdout
    summary: dict[str, Any] = {"quick": args.quick, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               "cpus": os.cpu_count(), "loadavg_before": list(os.getloadavg()), "benchmarks": {}}
    ok = True
    try:
        for name in names:
            script = BENCH / f"bench_{name}.py"
            result_file = RESULTS / f"{name}.json"
            cmd = [sys.executable, str(script), "--bootstrap", bootstrap, *(QUICK_ARGS[name] if args.quick else [])]
            print(f"\n=== {name}: {' '.join(cmd[1:])}", file=out_stream, flush=True)
            before = result_file.stat().st_mtime if result_file.exists() else None
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, stdout=out_stream, stderr=out_stream, check=False)
            entry: dict[str, Any] = {"exit_code": proc.returncode, "seconds": time.perf_counter() - t0,
                                     "command": cmd[1:], "loadavg_after": list(os.getloadavg())}
            fresh = result_file.exists() and result_file.stat().st_mtime != before
            if proc.returncode == 0 and fresh:
                entry["result"] = json.loads(result_file.read_text())
                entry["rows"] = rows_of(name, entry["result"])
            else:
                ok = False
                entry["error"] = f"exit code {proc.returncode}" + ("" if fresh else f"; {result_file.name} not written")
            summary["benchmarks"][name] = entry
    finally:
        if broker is not None:
            broker.down(timeout=30)
    summary["loadavg_after"] = list(os.getloadavg())
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_summary(summary)
    return 0 if ok else 1


def print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    def f(x: Any, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    t = Table(title=f"rewardflow benchmarks{' (quick)' if summary['quick'] else ''}: load average "
                    f"{summary['loadavg_before'][0]:.1f} -> {summary['loadavg_after'][0]:.1f} on {summary['cpus']} cores "
                    "(shared machine: figures move with the load)")
    for col, just in (("bench", "left"), ("figure", "left"), ("value", "right"), ("floor", "right"), ("ratio", "right"),
                      ("unit", "left"), ("target", "left")):
        t.add_column(col, justify=just)
    for name, entry in summary["benchmarks"].items():
        if "error" in entry:
            t.add_row(name, f"FAILED: {entry['error']}", "", "", "", "", "")
            continue
        for r in entry["rows"]:
            small = r["value"] is not None and r["value"] < 100
            t.add_row(name, r["figure"], f(r["value"], ".2f" if small else ",.0f"), f(r["floor"], ",.0f"),
                      f(r["ratio"], ".2f"), r["unit"], r["target"])
    Console(width=200).print(t)
    print(f"wrote {RESULTS / 'summary.json'}")


if __name__ == "__main__":
    sys.exit(main())
