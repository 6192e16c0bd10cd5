/**
 * A genuine 503: the harness stops the Kafka broker of RF_TEST_OUTAGE_URL (SIGSTOP) on request and
 * resumes it seconds later. The client is told 503, retries the same events no sooner than
 * Retry-After, and every event is acknowledged once the broker is back.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { RewardflowClient } from "../src";
import { collectorEnv, Deliveries, followUp, PRODUCER, recordDelivered, recordingFetch, waitForFile } from "./harness";

test("a 503 while Kafka is stopped is retried with the same events until they land", async (t) => {
  const env = collectorEnv(t, "RF_TEST_OUTAGE_URL", "RF_TEST_OUTAGE_CONTROL", "RF_TEST_KEY");
  if (env === undefined) return;
  const { fetch, exchanges } = recordingFetch();
  const delivered = new Deliveries();
  const client = new RewardflowClient({
    url: env.RF_TEST_OUTAGE_URL, key: env.RF_TEST_KEY, producer: PRODUCER, fetch, initialBackoffMs: 100,
    onDelivered: delivered.on,
  });
  const run = randomUUID().slice(0, 8);
  const before = client.track(followUp(`outage-${run}-warm`, 0));
  await client.flush({ timeoutMs: 20_000 });
  assert.equal(delivered.eventIds.length, 1, "the broker works before the outage");

  writeFileSync(join(env.RF_TEST_OUTAGE_CONTROL, "pause"), "");
  await waitForFile(join(env.RF_TEST_OUTAGE_CONTROL, "paused"), 30_000);
  const tracked: string[] = [];
  for (let i = 0; i < 20; i++) {
    const r = client.track(followUp(`outage-${run}-${i % 2}`, i));
    assert.ok(r.ok);
    tracked.push(r.eventId);
  }
  await client.flush({ timeoutMs: 60_000 });
  recordDelivered("outage", t.name, delivered.eventIds);
  const unavailable = exchanges.filter((x) => x.status === 503);
  assert.ok(unavailable.length >= 1, `no 503 in ${exchanges.map((x) => x.status).join(", ")}`);
  for (const x of unavailable) {
    const next = exchanges[exchanges.indexOf(x) + 1]!;
    assert.deepEqual(next.eventIds, x.eventIds, "the same events again");
    assert.ok(next.startedAt - x.endedAt >= Number(x.retryAfter) * 1000 - 5, "not before Retry-After");
  }
  assert.ok(existsSync(join(env.RF_TEST_OUTAGE_CONTROL, "resumed")), "acknowledged only once the broker is back");
  assert.deepEqual(delivered.eventIds.slice(1).sort(), [...tracked].sort());
  assert.ok(before.ok && delivered.eventIds[0] === before.eventId);
  const stats = client.stats();
  assert.deepEqual([stats.accepted, stats.queued, stats.refused], [21, 0, 0]);
  assert.ok(stats.retries >= unavailable.length);
  await client.dispose();
});
