"""Digest and speed of the pure core over the stream benchmark's workload. Not a test.

Runs :class:`~rewardflow.core.processor.PartitionProcessor` (dict stores, one per
partition, batches of ``worker_batch_records`` as the worker feeds it) over the
records of ``bench_stream.session_batches``, then a far-future tick on every
partition (every turn finalised, every window closed), and prints a SHA-256 of
every output row, in order, and of the final stored state. Then it times the
same run ``--reps`` times (no hashing) and prints events/s.

Use it to prove a change to the core output-identical: the outputs digest must
not move. It depends only on the code and the seed (event time is the workload's,
``now_ms`` is 0), not on the batch size: it hashes each partition's rows of each output
in the order they were decided, which is what the core promises whatever the batches.
The current outputs digests: avro ``7f557c17…95c0`` (any ``--batch-records``, either
``--store``), json ``88d565b4…dbfd``. The state digest, avro, default batches:
``cb32375e…265d`` with the default correction window (finalised turns keep their state),
``4c33e73e…bc15`` with ``REWARDFLOW_CORRECTION_WINDOW_MS=0``. The state digest moves when the
stored format or keys do, and with the batch size (the partition meta key keeps a mark per batch).

``--shape sdk`` takes the end-to-end benchmark's workload instead
(``bench_e2e.make_records``: the SDK's default batching, 1.25 events a record, its
event time fixed so the digest is stable) and times the core as the worker runs it:
encoded store, the worker's garbage-collector settings (``rewardflow_streams.main.tune_gc``).
Its current digests: outputs ``3e60d629…2c17`` (any batch size), state ``1c07f757…733a``
(default batches; ``65758007…86a7`` with ``--batch-records 4000``);
with ``--format json`` (the SDK's ``wire_format="json"``): outputs ``9c326a38…6039`` (the
same rows; each stored payload keeps the key order its record was written in), state unchanged.

``--store json`` runs the processors over a store that keeps encoded bytes, as
the worker's Faust table does (``put_json`` checked against ``orjson.dumps``
of the value, a small decoded cache so that states are decoded again): its
digest must be the dict store's. It also prints what the worker's state changelog would
carry: bytes and records an event. ``--batch-records`` sets the batch size
(smaller batches wake sessions more often; a live stream's batches hold at most a record or
two of a session, as ``--batch-records 20`` does here). ``--commit-lag N`` tells each batch the
partition's committed offset as the worker does (the first offset of the batch N batches before;
0: its own), so finalised turns pruned at an offset not yet committed are held as the worker
holds them: the outputs digest does not move, the state digest does.

``--shape sdk --memory POINTS`` runs the workload once and prints, POINTS times along the way, the
final rewards so far, the session states kept (and their bytes) and the process's resident memory
after a full collection: whether the core's memory stays flat as finalised turns grow.

    python bench/core_digest.py [--events 100000] [--format avro|json] [--reps 3] [--store dict|json] [--shape bursts|sdk] [--batch-records N] [--commit-lag N] [--memory POINTS]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import statistics
import time
from collections.abc import Callable
from typing import Any, cast

import orjson

from bench_stream import session_batches
from rewardflow.kafka import topics as T
from rewardflow.core.config import DictStore, EncodedStore, JoinConfig
from rewardflow.core.outputs import Outputs
from rewardflow.core.processor import PartitionProcessor
from rewardflow.rewards.registry import active_specs
from rewardflow.settings import load_settings

_SDK_NOW_MS = 1_796_200_000_000  # --shape sdk: a fixed "now", so the records (and the digest) never change
_FAR_TICK = (b'{"wm": 4611686018427387904}', [("rf-format", b"tick")])
_OPTS = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def run(records: list[Any], keep: bool, store: str = "dict", batch_records: int | None = None,
        cached: int = 256, commit_lag: int | None = None,
        observe: Callable[[int, Outputs, dict[int, PartitionProcessor]], None] | None = None,
        ) -> tuple[float, list[tuple[int, Outputs]], dict[int, PartitionProcessor]]:
    """Seconds to process ``records`` (and the final ticks); the outputs when ``keep``; the processors.

    An encoded store (``store="json"``) decodes states again beyond its ``cached`` most recent writes; it
    checks every ``put_json`` against ``orjson.dumps`` when ``keep`` (the digest run), not when timed.
    ``commit_lag``: each batch is told the partition's committed offset, the first offset of the batch
    that many batches before it (0: its own first offset), as the worker tells it the group's commit;
    None: the commit is unknown. ``observe(records_done, outputs, processors)`` is called after each batch."""
    settings = load_settings()
    cfg, specs = JoinConfig.from_settings(settings), active_specs(settings)
    batch_records = batch_records or settings.worker_batch_records
    procs = {p: PartitionProcessor(cfg, specs, DictStore() if store == "dict" else EncodedStore(cached, check=keep),
                                   settings.topic(T.RAW), p) for p in range(settings.partitions)}
    offsets = dict.fromkeys(procs, 0)
    by_session: dict[bytes, int] = {}
    pending: dict[int, list[tuple[bytes | None, Any, int]]] = {p: [] for p in procs}
    starts: dict[int, list[int]] = {p: [] for p in procs}  # each batch's first offset, per partition
    outs: list[tuple[int, Outputs]] = []

    def committed(p: int, first: int) -> int | None:
        if commit_lag is None:
            return None
        starts[p].append(first)
        return starts[p][-1 - commit_lag] if len(starts[p]) > commit_lag else 0

    start = time.perf_counter()
    for i, (key, value, headers) in enumerate(records, 1):
        p = by_session.setdefault(key, len(by_session) % settings.partitions)
        pending[p].append((value, headers, offsets[p]))
        offsets[p] += 1
        if len(pending[p]) >= batch_records:
            out = procs[p].process_batch(pending[p], 0, committed(p, pending[p][0][2]))
            pending[p] = []
            if keep:
                outs.append((p, out))
            if observe is not None:
                observe(i, out, procs)
    for p, batch in pending.items():
        if not batch:
            continue
        out = procs[p].process_batch(batch, 0, committed(p, batch[0][2]))
        if keep:
            outs.append((p, out))
        if observe is not None:
            observe(len(records), out, procs)
    for p, proc in procs.items():
        out = proc.process_batch([(*_FAR_TICK, offsets[p])], 0, committed(p, offsets[p]))
        if keep:
            outs.append((p, out))
    return time.perf_counter() - start, outs, procs


def rss_mb() -> int:
    """This process's resident memory now, in MB (Linux)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS:"))


def memory(records: list[Any], events: int, cached: int, points: int) -> None:
    """Run the records once (encoded store, commit lag 1, as the worker) and print, ``points`` times
    along the way: events so far, final rewards so far, the session states kept and their bytes, and
    the process's resident memory after a full collection (what the state holds alive, not a
    batch's garbage). The records themselves are in memory from the start, so growth is the core's."""
    gc.collect()
    base, seen = rss_mb(), {"final": 0, "next": 1}
    step = max(1, len(records) // points)
    print(f"records in memory: {base:,} MB resident")
    print(f"{'events':>10} {'final rewards':>14} {'session states':>15} {'state MB':>9} {'resident MB':>12} {'growth MB':>10}")

    def observe(done: int, out: Outputs, procs: dict[int, PartitionProcessor]) -> None:
        seen["final"] += sum(1 for r in out.rewards if not r["provisional"])
        if done < seen["next"] * step:
            return
        seen["next"] = done // step + 1
        gc.collect()
        data = [(k, v) for proc in procs.values() for k, v in cast(EncodedStore, proc.store).data.items()
                if k.startswith("s:")]
        now = rss_mb()
        print(f"{round(done / len(records) * events):>10,} {seen['final']:>14,} {len(data):>15,} "
              f"{sum(len(v) for _, v in data) / 1e6:>9.1f} {now:>12,} {now - base:>10,}", flush=True)

    run(records, keep=False, store="json", cached=cached, commit_lag=1, observe=observe)


def digest(outs: list[tuple[int, Outputs]], procs: dict[int, PartitionProcessor]) -> tuple[str, str]:
    """sha256 of every output row, partition by partition and output by output (rewards, windows, ...),
    each in the order decided: the order the core promises, whatever the batches (how the
    partitions' batches interleave, and rows of different outputs within a batch, are not part of
    it); and of every processor's final state."""
    h = hashlib.sha256()
    for p in sorted(procs):
        mine = [out for q, out in outs if q == p]
        for name in Outputs.__slots__:
            for out in mine:
                for row in getattr(out, name):
                    h.update(name.encode())
                    h.update(orjson.dumps(row, option=_OPTS, default=repr))
    state = hashlib.sha256()
    for proc in procs.values():
        for key, value in sorted(proc.store.items()):
            state.update(key.encode())
            # (through JSON: a dict store holds int map keys that an encoded store gives back as str)
            state.update(orjson.dumps(orjson.loads(orjson.dumps(value, option=_OPTS)), option=_OPTS))
    return h.hexdigest(), state.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--format", choices=("avro", "json"), default="avro")
    ap.add_argument("--reps", type=int, default=3, help="timed runs after the digest run")
    ap.add_argument("--store", choices=("dict", "json"), default="dict",
                    help="dict: the replay store; json: encoded values, as the worker's table")
    ap.add_argument("--batch-records", type=int, default=None, help="records per batch (default: the worker's)")
    ap.add_argument("--commit-lag", type=int, default=None, metavar="BATCHES",
                    help="tell each batch the partition's committed offset, as the worker does: the first "
                         "offset of the batch this many batches before (0: its own); default: unknown")
    ap.add_argument("--shape", choices=("bursts", "sdk"), default="bursts",
                    help="bursts: bench_stream's records of whole turns (20-50 events); sdk: the e2e workload "
                         "(1.25 events a record), timed as the worker runs the core (encoded store, its GC settings)")
    ap.add_argument("--memory", type=int, default=0, metavar="POINTS",
                    help="with --shape sdk: instead of digests and timings, run once and print the core's "
                         "resident memory and state POINTS times along the way")
    args = ap.parse_args()
    if args.memory and args.shape != "sdk":
        ap.error("--memory needs --shape sdk")
    if args.shape == "sdk":
        from bench_e2e import make_records
        from rewardflow_streams.main import tune_gc

        records = make_records(args.events, 2_000.0, 1_000, 7, now_ms=_SDK_NOW_MS, fmt=args.format)[0]
        args.store = "json"
        settings = load_settings()
        cached = max(256, settings.worker_state_cache // settings.partitions)  # the worker's table, per partition
        tune_gc()
        if args.memory:
            memory(records, args.events, cached, args.memory)
            return
    else:
        records, cached = session_batches(args.events, args.format), 256
    _, outs, procs = run(records, keep=True, store=args.store, batch_records=args.batch_records, cached=cached,
                         commit_lag=args.commit_lag)
    rows, state = digest(outs, procs)
    print(f"digest outputs {rows}  ({args.events:,} events, {args.format}, {args.store} store, {args.shape})")
    print(f"digest state   {state}")
    if args.store == "json":  # what the worker's state changelog would carry
        stores = [p.store for p in procs.values()]
        writes, written = sum(s.records for s in stores), sum(s.written for s in stores)
        print(f"state written  {written / args.events:,.0f} bytes an event, {writes / args.events:.2f} records "
              f"an event (puts and deletes)")
    del outs, procs
    times = []
    for _ in range(args.reps):
        gc.collect()
        times.append(run(records, keep=False, store=args.store, batch_records=args.batch_records, cached=cached,
                         commit_lag=args.commit_lag)[0])
    if times:
        rates = [args.events / t for t in times]
        print(f"core: median {statistics.median(rates):,.0f} events/s ({', '.join(f'{r:,.0f}' for r in rates)})")


if __name__ == "__main__":
    main()
