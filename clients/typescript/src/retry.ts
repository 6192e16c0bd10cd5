/**
 * When to try a failed request again: exponential backoff with jitter, never sooner than the
 * edge's `Retry-After`.
 *
 * Contract: pure functions; `random` is injectable for tests.
 */

export interface BackoffPolicy {
  /** The backoff ceiling of the first retry, in ms; it doubles with each consecutive failure. */
  initialBackoffMs: number;
  /** The largest backoff ceiling, in ms (a `Retry-After` may still ask for longer). */
  maxBackoffMs: number;
}

/**
 * The backoff after `failures` consecutive failures (1 for the first): "equal jitter", a uniformly
 * random value in [ceiling / 2, ceiling] where ceiling = min(max, initial * 2^(failures - 1)).
 * Clients that failed together spread out, and each still waits at least half the ceiling.
 */
export function backoffMs(failures: number, policy: BackoffPolicy, random: () => number = Math.random): number {
  const ceiling = Math.min(policy.maxBackoffMs, policy.initialBackoffMs * 2 ** Math.max(0, failures - 1));
  return ceiling / 2 + random() * (ceiling / 2);
}

/** How long to wait before the next attempt: the backoff, or the edge's `Retry-After` when that is longer. */
export function retryDelayMs(failures: number, retryAfterMs: number | null, policy: BackoffPolicy,
                             random: () => number = Math.random): number {
  return Math.max(retryAfterMs ?? 0, backoffMs(failures, policy, random));
}

/**
 * A `Retry-After` header in ms: delay-seconds (`"2"`) or an HTTP-date (the time until it, at
 * least 0). Null when the header is absent or unreadable.
 */
export function parseRetryAfter(value: string | null | undefined, nowMs: number): number | null {
  if (value == null) {
    return null;
  }
  const text = value.trim();
  if (/^\d+$/.test(text)) {
    return Number(text) * 1000;
  }
  const at = /[A-Za-z]/.test(text) ? Date.parse(text) : Number.NaN; // an HTTP-date names its day and month
  return Number.isNaN(at) ? null : Math.max(0, at - nowMs);
}
