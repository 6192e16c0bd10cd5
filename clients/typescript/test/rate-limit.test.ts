/**
 * 429 from a real collector with a low rate (RF_TEST_RATE_URL, RF_TEST_RATE_BURST): the client
 * waits at least Retry-After before it tries the same batch again, and every event lands.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { test } from "node:test";

import { RewardflowClient, type ClientError } from "../src";
import { collectorEnv, Deliveries, followUp, PRODUCER, recordDelivered, recordingFetch } from "./harness";

test("over its rate the client backs off for Retry-After, then delivers everything", async (t) => {
  const env = collectorEnv(t, "RF_TEST_RATE_URL", "RF_TEST_KEY", "RF_TEST_RATE_BURST");
  if (env === undefined) return;
  const burst = Number(env.RF_TEST_RATE_BURST);
  const { fetch, exchanges } = recordingFetch();
  const errors: ClientError[] = [];
  const delivered = new Deliveries();
  const client = new RewardflowClient({
    url: env.RF_TEST_RATE_URL, key: env.RF_TEST_KEY, producer: PRODUCER, fetch, maxBatchEvents: burst,
    initialBackoffMs: 10, onError: (e) => errors.push(e), onDelivered: delivered.on,
  });
  const session = `rate-${randomUUID()}`;
  const tracked = Array.from({ length: 3 * burst }, (_, i) => {
    const r = client.track(followUp(session, i));
    assert.ok(r.ok);
    return r.eventId;
  });
  await client.flush({ timeoutMs: 30_000 });
  recordDelivered("rate", t.name, delivered.eventIds);
  const limited = exchanges.filter((x) => x.status === 429);
  assert.ok(limited.length >= 1, `no 429 in ${exchanges.map((x) => x.status).join(", ")}`);
  for (const x of limited) {
    const retryAfterMs = Number(x.retryAfter) * 1000;
    assert.ok(retryAfterMs >= 1000, `Retry-After ${x.retryAfter}`);
    const next = exchanges[exchanges.indexOf(x) + 1]!;
    assert.deepEqual(next.eventIds, x.eventIds, "the same events again");
    assert.ok(next.startedAt - x.endedAt >= retryAfterMs - 5, `retried after ${next.startedAt - x.endedAt} ms`);
  }
  assert.ok(errors.filter((e) => e.kind === "retrying").every((e) => e.kind === "retrying" && e.status === 429));
  assert.deepEqual(delivered.eventIds, tracked);
  const stats = client.stats();
  assert.deepEqual([stats.accepted, stats.retries, stats.queued], [3 * burst, limited.length, 0]);
  await client.dispose();
});
