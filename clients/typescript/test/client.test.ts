/**
 * The client without an edge: local refusals, option checks, the bounded queue, retries against
 * an address where nothing listens, and the stored queue. No collector needed.
 */
import assert from "node:assert/strict";
import { test } from "node:test";

import { MemoryStorage, RewardflowClient, type ClientError, type EventInput } from "../src";
import { closedPortUrl, followUp, PRODUCER } from "./harness";

const KEY = "rfk_000000000000_" + "x".repeat(43);

function stored(storage: MemoryStorage): Array<Record<string, unknown>> {
  return (JSON.parse(storage.data ?? "{}") as { events: Array<Record<string, unknown>> }).events;
}

test("track fills event_id, ts, schema_version and producer, and keeps what was given", async () => {
  const storage = new MemoryStorage();
  const now = 1_750_000_000_123;
  const client = new RewardflowClient({ url: await closedPortUrl(), key: KEY, producer: PRODUCER, storage, now: () => now });
  const filled = client.track(followUp("s", 1));
  const given = client.track({ ...followUp("s", 2), event_id: "mine", ts: now - 5, producer: { name: "other", version: "9" } });
  assert.ok(filled.ok && /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/.test(filled.eventId));
  assert.deepEqual(given, { ok: true, eventId: "mine" });
  await client.dispose({ timeoutMs: 50 });
  const [first, second] = stored(storage);
  assert.deepEqual(first, {
    ...followUp("s", 1), event_id: filled.ok ? filled.eventId : "", ts: now, schema_version: 1, producer: PRODUCER,
  });
  assert.deepEqual(second, {
    ...followUp("s", 2), event_id: "mine", ts: now - 5, schema_version: 1, producer: { name: "other", version: "9" },
  });
});

test("track refuses what cannot be sent, never throws, and reports it", async () => {
  const errors: ClientError[] = [];
  let requests = 0;
  const client = new RewardflowClient({
    url: await closedPortUrl(), key: KEY, producer: PRODUCER, maxBatchBytes: 2048, onError: (e) => errors.push(e),
    fetch: (async () => { requests += 1; throw new Error("unreachable"); }) as typeof fetch,
  });
  const bad: unknown[] = [
    null,
    "FollowUp",
    {},
    { event_type: "Nope", session_id: "s", request_id: "r" },
    { ...followUp("s", 1), colour: "blue" },
    { ...followUp("s", 1), client_ts: 1_700_000_000_000 },
    { event_type: "FollowUp", session_id: "s" },
    { ...followUp("", 1) },
    { ...followUp("s", 1), event_id: "x".repeat(65) },
    { ...followUp("s", 1), text_redacted: "y".repeat(4096) },
    { ...followUp("s", 1), dissatisfied: 10n },
  ];
  const results = bad.map((event) => client.track(event as EventInput));
  assert.deepEqual(results.map((r) => r.ok), bad.map(() => false));
  const reasons = results.map((r) => (r.ok ? "" : r.error.message));
  for (const [i, expected] of ["object", "object", "event_type", "event_type", "colour", "client_ts", "request_id",
                               "session_id", "event_id", "bytes", "serialisable"].entries()) {
    assert.match(reasons[i]!, new RegExp(expected), `event ${i}: ${reasons[i]}`);
  }
  assert.equal(errors.length, bad.length);
  assert.ok(errors.every((e) => e.kind === "invalid"));
  await client.dispose({ timeoutMs: 50 });
  const late = client.track(followUp("s", 1));
  assert.ok(!late.ok && late.error.kind === "closed");
  assert.deepEqual({ ...client.stats(), requests }, {
    requests: 0, accepted: 0, rejected: 0, refused: 0, invalid: bad.length + 1, retries: 0, dropped: 0, queued: 0, queuedBytes: 0,
  });
});

test("options that cannot work are refused at construction", () => {
  const base = { url: "http://127.0.0.1:1", key: KEY, producer: PRODUCER };
  assert.throws(() => new RewardflowClient({ ...base, url: "127.0.0.1:16068" }), /url/);
  assert.throws(() => new RewardflowClient({ ...base, key: "secret" }), /key/);
  assert.throws(() => new RewardflowClient({ ...base, maxBatchEvents: 0 }), /maxBatchEvents/);
  assert.throws(() => new RewardflowClient({ ...base, maxBatchEvents: 50, maxQueueEvents: 10 }), /maxQueueEvents/);
  assert.throws(() => new RewardflowClient({ ...base, flushIntervalMs: -1 }), /flushIntervalMs/);
});

test("a full queue drops its oldest events, counts them, and stores the newest", async () => {
  const storage = new MemoryStorage();
  const dropped: string[] = [];
  const client = new RewardflowClient({
    url: await closedPortUrl(), key: KEY, producer: PRODUCER, storage, maxBatchEvents: 5, maxQueueEvents: 20,
    onError: (e) => { if (e.kind === "dropped") dropped.push(...e.eventIds); },
  });
  const ids = Array.from({ length: 30 }, (_, i) => {
    const r = client.track({ ...followUp(`s${i % 3}`, i), event_id: `e${i}` });
    assert.ok(r.ok);
    return r.eventId;
  });
  assert.deepEqual(dropped, ids.slice(0, 10));
  assert.deepEqual({ dropped: client.stats().dropped, queued: client.stats().queued }, { dropped: 10, queued: 20 });
  await client.dispose({ timeoutMs: 100 });
  assert.deepEqual(stored(storage).map((e) => e["event_id"]), ids.slice(10));
});

test("an unreachable edge is retried with growing backoff; flush resolves at its timeout, with the queue stored", async () => {
  const storage = new MemoryStorage();
  const errors: ClientError[] = [];
  const client = new RewardflowClient({
    url: await closedPortUrl(), key: KEY, producer: PRODUCER, storage, initialBackoffMs: 40, random: () => 1,
    onError: (e) => errors.push(e),
  });
  const r = client.track(followUp("s", 1));
  const started = Date.now();
  await client.flush({ timeoutMs: 700 });
  const waited = Date.now() - started;
  assert.ok(waited >= 650 && waited < 2000, `flush waited ${waited} ms`);
  const retrying = errors.filter((e): e is Extract<ClientError, { kind: "retrying" }> => e.kind === "retrying");
  assert.ok(retrying.length >= 3, `${retrying.length} attempts`);
  assert.deepEqual(retrying.slice(0, 4).map((e) => e.retryInMs), [40, 80, 160, 320].slice(0, Math.min(4, retrying.length)));
  assert.ok(retrying.every((e) => e.status === null && r.ok && e.eventIds[0] === r.eventId));
  const stats = client.stats();
  assert.equal(stats.retries, stats.requests - 1);
  assert.equal(stats.queued, 1);
  assert.deepEqual(stored(storage).map((e) => e["event_id"]), [r.ok ? r.eventId : ""]);
  await client.dispose({ timeoutMs: 10 });
});

test("a stored queue that cannot be read is reported, and the client starts empty", async () => {
  const errors: ClientError[] = [];
  const client = new RewardflowClient({
    url: await closedPortUrl(), key: KEY, producer: PRODUCER, storage: new MemoryStorage("{not json"),
    onError: (e) => errors.push(e),
  });
  await client.flush({ timeoutMs: 10 });
  assert.deepEqual(errors.map((e) => e.kind), ["storage"]);
  assert.equal(client.stats().queued, 0);
  await client.dispose({ timeoutMs: 10 });
});
