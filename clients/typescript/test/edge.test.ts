/**
 * Against a real collector (RF_TEST_URL, RF_TEST_KEY; see ./harness): per-session batches, the
 * flush interval, per-event rejections and a refused key. Requests are observed by a
 * pass-through fetch; the edge is the real one.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { RewardflowClient, type ClientError, type EventInput } from "../src";
import { collectorEnv, Deliveries, followUp, PRODUCER, recordDelivered, recordingFetch, sleep } from "./harness";

test("events go in per-session batches of at most maxBatchEvents, in order, each acknowledged once", async (t) => {
  const env = collectorEnv(t, "RF_TEST_URL", "RF_TEST_KEY");
  if (env === undefined) return;
  const { fetch, exchanges } = recordingFetch();
  const delivered = new Deliveries();
  const client = new RewardflowClient({
    url: env.RF_TEST_URL, key: env.RF_TEST_KEY, producer: PRODUCER, fetch, maxBatchEvents: 10, flushIntervalMs: 60_000,
    onDelivered: delivered.on,
  });
  const run = randomUUID().slice(0, 8);
  const sessions = ["a", "b", "c"].map((s) => `batching-${run}-${s}`);
  const tracked = new Map<string, string[]>(sessions.map((s) => [s, []]));
  for (let i = 0; i < 25; i++) {
    for (const s of sessions) {
      const r = client.track(followUp(s, i));
      assert.ok(r.ok);
      tracked.get(s)!.push(r.eventId);
    }
  }
  await client.flush({ timeoutMs: 20_000 });
  recordDelivered("main", t.name, delivered.eventIds);
  assert.deepEqual(exchanges.map((x) => x.sessions.length), Array(9).fill(1), "one session per request");
  for (const s of sessions) {
    const mine = exchanges.filter((x) => x.sessions[0] === s);
    assert.deepEqual(mine.map((x) => x.eventIds.length), [10, 10, 5]);
    assert.deepEqual(mine.flatMap((x) => x.eventIds), tracked.get(s), "in tracking order");
  }
  assert.ok(exchanges.every((x) => x.status === 202));
  assert.ok(exchanges.every((x) => x.sentAt <= x.startedAt && x.startedAt - x.sentAt < 1000), "sent_at stamped at send");
  assert.ok(exchanges.some((x) => x.gzip), "bodies over 1 KiB are gzipped");
  assert.deepEqual(new Set(delivered.eventIds), new Set([...tracked.values()].flat()));
  assert.equal(delivered.eventIds.length, 75);
  const stats = client.stats();
  assert.deepEqual([stats.requests, stats.accepted, stats.retries, stats.queued, stats.rejected], [9, 75, 0, 0, 0]);
  await client.dispose();
});

test("a batch is sent flushIntervalMs after its first event, without flush()", async (t) => {
  const env = collectorEnv(t, "RF_TEST_URL", "RF_TEST_KEY");
  if (env === undefined) return;
  const { fetch, exchanges } = recordingFetch();
  const delivered = new Deliveries();
  const client = new RewardflowClient({ url: env.RF_TEST_URL, key: env.RF_TEST_KEY, producer: PRODUCER, fetch,
                                        flushIntervalMs: 150, onDelivered: delivered.on });
  const session = `interval-${randomUUID()}`;
  const started = Date.now();
  client.track(followUp(session, 1));
  await sleep(50);
  client.track(followUp(session, 2));
  for (let waited = 0; delivered.eventIds.length < 2 && waited < 10_000; waited += 20) {
    await sleep(20);
  }
  recordDelivered("main", t.name, delivered.eventIds);
  assert.equal(delivered.eventIds.length, 2);
  assert.equal(exchanges.length, 1);
  // (Date.now() and Node's timer clock round differently: a timer may fire a millisecond early by Date.now())
  assert.ok(exchanges[0]!.startedAt - started >= 150 - 5, "not before the interval");
  await client.dispose();
});

test("events the edge rejects are reported with their field and never retried; the rest land", async (t) => {
  const env = collectorEnv(t, "RF_TEST_URL", "RF_TEST_KEY");
  if (env === undefined) return;
  const errors: ClientError[] = [];
  const delivered = new Deliveries();
  const client = new RewardflowClient({ url: env.RF_TEST_URL, key: env.RF_TEST_KEY, producer: PRODUCER,
                                        onError: (e) => errors.push(e), onDelivered: delivered.on });
  const session = `rejected-${randomUUID()}`;
  client.track(followUp(session, 1));
  const bad = client.track({
    event_type: "ToolCall", session_id: session, request_id: "r-1", call_id: "c1", tool: "run", duration_ms: 5,
    status: "exploded",
  } as unknown as EventInput);
  client.track(followUp(session, 2));
  await client.flush({ timeoutMs: 20_000 });
  recordDelivered("main", t.name, delivered.eventIds);
  assert.ok(bad.ok);
  const rejected = errors.filter((e) => e.kind === "rejected");
  assert.equal(rejected.length, 1);
  assert.deepEqual(rejected[0]!.kind === "rejected" && rejected[0]!.rejections.map((r) => [r.eventId, r.field]),
                   [[bad.eventId, "status"]]);
  assert.equal(delivered.eventIds.length, 2);
  assert.ok(!delivered.eventIds.includes(bad.eventId));
  const stats = client.stats();
  assert.deepEqual([stats.requests, stats.accepted, stats.rejected, stats.retries, stats.queued], [1, 2, 1, 0, 0]);
  await client.dispose();
});

test("an unknown key is refused with 401 once: no retry, the events are dropped and reported", async (t) => {
  const env = collectorEnv(t, "RF_TEST_URL");
  if (env === undefined) return;
  const errors: ClientError[] = [];
  const client = new RewardflowClient({ url: env.RF_TEST_URL, key: "rfk_000000000000_" + "x".repeat(43), producer: PRODUCER,
                                        onError: (e) => errors.push(e), initialBackoffMs: 10 });
  const r = client.track(followUp(`unknown-key-${randomUUID()}`, 1));
  await client.flush({ timeoutMs: 5000 });
  assert.deepEqual(errors.map((e) => e.kind), ["refused"]);
  const refused = errors[0]!;
  assert.ok(refused.kind === "refused" && refused.status === 401 && /key/.test(refused.message));
  assert.deepEqual(refused.eventIds, [r.ok ? r.eventId : ""]);
  const stats = client.stats();
  assert.deepEqual([stats.requests, stats.retries, stats.refused, stats.accepted, stats.queued], [1, 0, 1, 0, 0]);
  await client.dispose();
});
