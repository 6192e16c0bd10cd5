/** BatchQueue: per-session batches, the batch limits, the queue bounds (drop oldest), restore order. Pure. */
import assert from "node:assert/strict";
import { test } from "node:test";

import { BatchQueue } from "../src/queue";

const LIMITS = { maxBatchEvents: 3, maxBatchBytes: 1000, maxQueueEvents: 100, maxQueueBytes: 100_000 };

function add(q: BatchQueue, session: string, id: string, bytes = 10) {
  return q.add(session, id, JSON.stringify({ id }), bytes);
}

test("a batch holds one session's events and closes when full", () => {
  const q = new BatchQueue(LIMITS);
  const opened = add(q, "a", "a1").opened;
  assert.ok(opened !== null && opened.sessionId === "a");
  assert.equal(add(q, "b", "b1").closed.length, 0);
  assert.equal(add(q, "a", "a2").opened, null);
  const full = add(q, "a", "a3");
  assert.deepEqual(full.closed.map((b) => b.eventIds), [["a1", "a2", "a3"]]);
  assert.deepEqual(q.next()?.eventIds, ["a1", "a2", "a3"]);
  assert.ok(add(q, "a", "a4").opened !== null, "the next event of the session opens a new batch");
  assert.equal(q.count, 5);
  assert.deepEqual(q.closeAll().map((b) => b.eventIds), [["b1"], ["a4"]], "oldest first");
});

test("an event that would take a batch past maxBatchBytes starts the next batch", () => {
  const q = new BatchQueue({ ...LIMITS, maxBatchEvents: 100, maxBatchBytes: 25 });
  add(q, "s", "e1");
  add(q, "s", "e2");
  const third = add(q, "s", "e3"); // 3 x (10 + 1) > 25
  assert.deepEqual(third.closed.map((b) => b.eventIds), [["e1", "e2"]]);
  assert.ok(third.opened !== null);
});

test("past the bounds the oldest events are dropped, never those in flight", () => {
  const q = new BatchQueue({ ...LIMITS, maxQueueEvents: 4 });
  ["1", "2", "3"].forEach((n) => add(q, "a", `a${n}`)); // closes [a1 a2 a3]
  q.setInFlight(q.next()!);
  add(q, "b", "b1");
  const over = add(q, "b", "b2");
  assert.deepEqual(over.dropped.map((e) => e.eventId), ["b1"], "a1..a3 are in flight");
  assert.equal(q.count, 4);
  q.setInFlight(null);
  assert.deepEqual(add(q, "c", "c1").dropped.map((e) => e.eventId), ["a1"]);
  const byBytes = new BatchQueue({ ...LIMITS, maxQueueBytes: 25 });
  add(byBytes, "a", "x1");
  add(byBytes, "b", "x2");
  assert.deepEqual(add(byBytes, "c", "x3").dropped.map((e) => e.eventId), ["x1"]);
  assert.equal(byBytes.bytes, 20);
});

test("a batch whose events were all dropped leaves the send order", () => {
  const q = new BatchQueue({ ...LIMITS, maxBatchEvents: 1, maxQueueEvents: 1 });
  add(q, "a", "a1");
  const next = add(q, "b", "b1");
  assert.deepEqual(next.dropped.map((e) => e.eventId), ["a1"]);
  assert.deepEqual(q.next()?.eventIds, ["b1"]);
});

test("restored events come first, batched per session, and settle like others", () => {
  const q = new BatchQueue(LIMITS);
  add(q, "new", "n1");
  const restored = ["s1", "s2", "t1", "s3", "s4"].map((id) => ({
    eventId: id, sessionId: id[0]!, json: JSON.stringify({ id }), bytes: 10,
  }));
  assert.deepEqual(q.restore(restored), []);
  assert.deepEqual(q.snapshot(), [...restored.map((e) => e.json), JSON.stringify({ id: "n1" })]);
  assert.ok(q.holdsUpTo(0) && q.holdsUpTo(q.lastSeq));
  const order: string[][] = [];
  for (let b = q.next(); b !== undefined; b = q.next()) {
    order.push(b.eventIds);
    q.settle(b);
  }
  assert.deepEqual(order, [["s1", "s2", "s3"], ["t1"], ["s4"]], "the open batch n1 is not sent before it closes");
  assert.equal(q.count, 1);
  assert.ok(q.holdsUpTo(q.lastSeq) && !q.holdsUpTo(0));
});
