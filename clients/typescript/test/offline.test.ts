/**
 * The offline queue survives a restart: a client pointed at an address where nothing listens keeps
 * its events in a file (FileStorage); a new client with the same file, pointed at the real
 * collector (RF_TEST_URL), replays them on construction and they land.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { RewardflowClient, type ClientError } from "../src";
import { FileStorage } from "../src/file-storage";
import { closedPortUrl, collectorEnv, Deliveries, followUp, PRODUCER, recordDelivered, tempDir } from "./harness";

function storedIds(path: string): string[] {
  return (JSON.parse(readFileSync(path, "utf8")) as { events: Array<{ event_id: string }> }).events.map((e) => e.event_id);
}

test("events queued while the edge is unreachable are stored, reloaded by the next client and delivered", async (t) => {
  const env = collectorEnv(t, "RF_TEST_URL", "RF_TEST_KEY");
  if (env === undefined) return;
  const path = join(tempDir(), "nested", "queue.json");
  const errors: ClientError[] = [];
  const offline = new RewardflowClient({
    url: await closedPortUrl(), key: env.RF_TEST_KEY, producer: PRODUCER, storage: new FileStorage(path),
    maxBatchEvents: 15, initialBackoffMs: 20, onError: (e) => errors.push(e),
  });
  const run = randomUUID().slice(0, 8);
  const tracked: string[] = [];
  for (let i = 0; i < 40; i++) {
    const r = offline.track(followUp(`offline-${run}-${i % 2}`, i));
    assert.ok(r.ok);
    tracked.push(r.eventId);
  }
  await offline.flush({ timeoutMs: 300 });
  assert.ok(errors.some((e) => e.kind === "retrying" && e.status === null), "the first client tried and failed");
  await offline.dispose({ timeoutMs: 100 });
  assert.equal(offline.stats().accepted, 0);
  assert.deepEqual(storedIds(path), tracked, "every event stored, oldest first");

  const delivered = new Deliveries();
  const online = new RewardflowClient({
    url: env.RF_TEST_URL, key: env.RF_TEST_KEY, producer: PRODUCER, storage: new FileStorage(path),
    maxBatchEvents: 15, onDelivered: delivered.on,
  });
  const fresh = online.track(followUp(`offline-${run}-0`, 99));
  await online.flush({ timeoutMs: 20_000 });
  recordDelivered("main", t.name, delivered.eventIds);
  assert.ok(fresh.ok);
  assert.deepEqual(delivered.eventIds.filter((id) => id !== fresh.eventId).sort(), [...tracked].sort());
  assert.equal(delivered.eventIds.at(-1), fresh.eventId, "the replayed events go first");
  for (const s of [0, 1]) {
    const mine = delivered.all.filter((d) => d.sessionId === `offline-${run}-${s}`).flatMap((d) => d.eventIds);
    assert.deepEqual(mine.filter((id) => id !== fresh.eventId), tracked.filter((_, i) => i % 2 === s), "session order kept");
  }
  assert.deepEqual(storedIds(path), [], "the stored queue is emptied once delivered");
  const stats = online.stats();
  assert.deepEqual([stats.accepted, stats.retries, stats.queued, stats.dropped], [41, 0, 0, 0]);
  await online.dispose();
});
