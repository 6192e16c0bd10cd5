/** Backoff with jitter and Retry-After. Pure. */
import assert from "node:assert/strict";
import { test } from "node:test";

import { backoffMs, parseRetryAfter, retryDelayMs } from "../src/retry";

const POLICY = { initialBackoffMs: 100, maxBackoffMs: 1000 };

test("the backoff doubles per failure up to the ceiling, jittered within its upper half", () => {
  assert.deepEqual([1, 2, 3, 4, 5, 40].map((n) => backoffMs(n, POLICY, () => 0.999999)).map(Math.round),
                   [100, 200, 400, 800, 1000, 1000]);
  assert.deepEqual([1, 2, 3, 4, 5].map((n) => backoffMs(n, POLICY, () => 0)), [50, 100, 200, 400, 500]);
  const draws = Array.from({ length: 200 }, () => backoffMs(3, POLICY));
  assert.ok(draws.every((d) => d >= 200 && d <= 400));
  assert.ok(new Set(draws).size > 100, "jitter spreads clients out");
});

test("Retry-After is a floor, never shortened by the jitter", () => {
  assert.equal(retryDelayMs(1, 2000, POLICY, () => 0), 2000);
  assert.equal(retryDelayMs(5, 200, POLICY, () => 1), 1000);
  assert.equal(retryDelayMs(1, null, POLICY, () => 0), 50);
});

test("Retry-After is read as seconds or as an HTTP date", () => {
  const now = Date.parse("2025-01-01T00:00:00Z");
  assert.equal(parseRetryAfter("2", now), 2000);
  assert.equal(parseRetryAfter(" 60 ", now), 60_000);
  assert.equal(parseRetryAfter("Wed, 01 Jan 2025 00:00:30 GMT", now), 30_000);
  assert.equal(parseRetryAfter("Tue, 31 Dec 2024 00:00:00 GMT", now), 0);
  assert.equal(parseRetryAfter("soon", now), null);
  assert.equal(parseRetryAfter("-1", now), null);
  assert.equal(parseRetryAfter(null, now), null);
});
