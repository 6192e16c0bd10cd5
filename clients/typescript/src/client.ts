/**
 * {@link RewardflowClient}: queue events in memory, send them to the ingestion edge in per-session
 * batches, retry what may succeed later, keep what is unsent across restarts.
 *
 * Delivery: one request at a time, batches in the order they closed, so a session's events reach
 * the edge in the order they were tracked. A batch is retried with the same events (the same
 * `event_id`s: the pipeline deduplicates) until the edge acknowledges it (202) or refuses it for
 * good (400, 401, 403, 413, 415, other 4xx: its events are dropped and reported). Between
 * attempts the client waits an exponential backoff with jitter, never less than `Retry-After`.
 * There is no limit on attempts: the queue bound limits what waits (oldest events dropped first).
 *
 * Failure reporting: nothing the client does after construction throws. `track` returns a
 * {@link TrackResult}; everything else goes to `onError` (and the counters of `stats()`).
 * Callbacks run on the event loop; an exception thrown by one is swallowed.
 */
import type { Event, Producer } from "./events";
import { randomEventId } from "./ids";
import { Batch, BatchQueue, type QueuedEvent } from "./queue";
import { retryDelayMs } from "./retry";
import type { StorageAdapter } from "./storage";
import { postBatch, type Attempt } from "./transport";
import { problemOf } from "./validate";

/** Fields the client fills in when an event omits them. */
type Filled = "event_id" | "ts" | "schema_version" | "producer";

/** An event as given to {@link RewardflowClient.track}: `event_id`, `ts`, `schema_version` and `producer` may be left out. */
export type EventInput = Event extends infer E ? (E extends Event ? Omit<E, Filled> & Partial<Pick<E, Filled>> : never) : never;

export interface ClientOptions {
  /** Base URL of the edge (`rewardflow collect`), e.g. `https://collect.example.com`; `/v1/events` is appended. */
  url: string;
  /** The ingestion key, `rfk_<key id>_<secret>`. */
  key: string;
  /** This client, stamped on every event that has no `producer`. */
  producer: Producer;
  /** Events per request (per batch). Keep it at most the edge's `collect_max_events`. Default 500. */
  maxBatchEvents?: number;
  /** JSON bytes of a batch's events; keep it below the edge's `collect_max_body_bytes`. Default 512 KiB. */
  maxBatchBytes?: number;
  /** A batch is sent at most this long after its first event (sooner when full). Default 100 ms. */
  flushIntervalMs?: number;
  /** Events the queue holds at most (open, waiting and in flight); past it the oldest are dropped. Default 10 000. */
  maxQueueEvents?: number;
  /** JSON bytes the queue holds at most; past it the oldest events are dropped. Default 8 MiB. */
  maxQueueBytes?: number;
  /** Keeps unsent events across restarts; reloaded and replayed on construction. Default: none (memory only). */
  storage?: StorageAdapter;
  /** How soon after a failed attempt (or an event tracked while delivery fails) the queue is saved. Default 1000 ms. */
  persistDelayMs?: number;
  /** Backoff ceiling of the first retry; doubles per consecutive failure. Default 250 ms. */
  initialBackoffMs?: number;
  /** Largest backoff ceiling (a longer `Retry-After` is still honoured). Default 30 s. */
  maxBackoffMs?: number;
  /** A request without an answer after this long is abandoned and retried. Default 30 s. */
  requestTimeoutMs?: number;
  /** How long `flush()` and `dispose()` wait for acknowledgements before they persist and resolve. Default 5 s. */
  flushTimeoutMs?: number;
  /** Gzip request bodies of at least this many bytes (where `CompressionStream` exists); 0: always; Infinity: never. Default 1024. */
  gzipMinBytes?: number;
  /** The `fetch` to use (e.g. one that goes through a proxy). Default: the global `fetch`. */
  fetch?: typeof fetch;
  /** Told about every problem: invalid, refused, rejected, dropped events, retries, storage failures. */
  onError?: (error: ClientError) => void;
  /** Told about every acknowledged request: the events of it now in Kafka. */
  onDelivered?: (delivery: Delivery) => void;
  /** Wall clock, epoch ms (`ts`, `sent_at`, retry timing). Default `Date.now`. */
  now?: () => number;
  /** Uniform random in [0, 1) for the backoff jitter. Default `Math.random`. */
  random?: () => number;
  /** New event ids. Default `crypto.randomUUID` (see `randomEventId` for runtimes without it). */
  randomUUID?: () => string;
}

export type ClientError =
  /** `track` refused the event before queueing it (nothing was sent). */
  | { kind: "invalid"; message: string; eventIds: string[] }
  /** `track` after `dispose()`. */
  | { kind: "closed"; message: string; eventIds: string[] }
  /** The edge refused a whole request for good (400, 401, 403, 413, ...): its events are dropped. */
  | { kind: "refused"; status: number; message: string; eventIds: string[] }
  /** The edge took a request but rejected these events of it (invalid values): they are dropped. */
  | { kind: "rejected"; status: number; message: string; eventIds: string[]; rejections: RejectedEvent[] }
  /** An attempt failed and will be repeated after `retryInMs`; nothing is lost. */
  | { kind: "retrying"; status: number | null; message: string; eventIds: string[]; retryInMs: number; attempt: number }
  /** The queue was full: these, its oldest events, were dropped. */
  | { kind: "dropped"; message: string; eventIds: string[] }
  /** The storage adapter failed to load or save; the events stay in memory. */
  | { kind: "storage"; message: string; eventIds: string[]; cause: unknown };

export interface RejectedEvent {
  eventId: string;
  field: string;
  reason: string;
}

export interface Delivery {
  sessionId: string;
  /** Events of the request the edge acknowledged (in Kafka), in request order. */
  eventIds: string[];
  /** The edge's correction of this client's clock (0: none needed). */
  clockOffsetMs: number;
  /** Requests this batch took (1: no retry). */
  attempts: number;
}

export type TrackResult = { ok: true; eventId: string } | { ok: false; error: ClientError };

export interface ClientStats {
  /** HTTP requests made, including those that failed. */
  requests: number;
  /** Events the edge acknowledged (in Kafka). */
  accepted: number;
  /** Events the edge rejected one by one in an acknowledged request. */
  rejected: number;
  /** Events of requests the edge refused for good. */
  refused: number;
  /** Events `track` refused (invalid, too large, after dispose). */
  invalid: number;
  /** Requests that repeated a batch after a failed attempt. */
  retries: number;
  /** Events dropped because the queue was full. */
  dropped: number;
  /** Events held now: not yet acknowledged, refused, rejected or dropped. */
  queued: number;
  /** JSON bytes of the events held now. */
  queuedBytes: number;
}

export interface FlushOptions {
  /** Overrides `flushTimeoutMs` for this call. */
  timeoutMs?: number;
}

interface Waiter {
  seq: number;
  resolve: () => void;
}

const STORAGE_VERSION = 1;
const encoder = new TextEncoder();

export class RewardflowClient {
  private readonly o: Required<Omit<ClientOptions, "storage" | "onError" | "onDelivered">>
    & Pick<ClientOptions, "storage" | "onError" | "onDelivered">;
  private readonly queue: BatchQueue;
  private readonly counters = { requests: 0, accepted: 0, rejected: 0, refused: 0, invalid: 0, retries: 0, dropped: 0 };
  private readonly flushTimers = new Map<Batch, ReturnType<typeof setTimeout>>();
  private readonly waiters: Waiter[] = [];
  private readonly loaded: Promise<void>;
  private pumping: Promise<void> | null = null;
  private failures = 0;
  private retryAt = 0;
  private wake: { timer: ReturnType<typeof setTimeout>; resolve: () => void } | null = null;
  private inFlight: AbortController | null = null;
  private persistTimer: ReturnType<typeof setTimeout> | null = null;
  private saving: Promise<void> = Promise.resolve();
  private stored = 0;
  private closed = false;
  private stopped = false;
  private disposing: Promise<void> | null = null;

  /** Throws `RangeError` for invalid options; then starts reloading the stored queue (if `storage`). */
  constructor(options: ClientOptions) {
    const fetchFn = options.fetch ?? (globalThis as { fetch?: typeof fetch }).fetch;
    if (fetchFn === undefined) {
      throw new RangeError("fetch: no global fetch in this runtime (Node 18+ has one); pass options.fetch");
    }
    this.o = {
      maxBatchEvents: 500,
      maxBatchBytes: 512 * 1024,
      flushIntervalMs: 100,
      maxQueueEvents: 10_000,
      maxQueueBytes: 8 * 1024 * 1024,
      persistDelayMs: 1000,
      initialBackoffMs: 250,
      maxBackoffMs: 30_000,
      requestTimeoutMs: 30_000,
      flushTimeoutMs: 5000,
      gzipMinBytes: 1024,
      now: Date.now,
      random: Math.random,
      randomUUID: randomEventId,
      ...stripUndefined(options),
      fetch: fetchFn,
    };
    checkOptions(this.o);
    this.queue = new BatchQueue(this.o);
    this.loaded = this.restore();
  }

  /**
   * Queue one event. Fills `event_id` (a random UUID), `ts` (now), `schema_version` (1) and
   * `producer` when absent. Never throws and never blocks: an event that cannot be sent is
   * refused here (`ok: false`, also reported to `onError`) and counted in `stats().invalid`.
   */
  track(input: EventInput): TrackResult {
    let eventId = "";
    try {
      const given = input as unknown as Record<string, unknown>;
      if (typeof given !== "object" || given === null || Array.isArray(given)) {
        return this.refuse({ kind: "invalid", message: problemOf(given)!, eventIds: [] });
      }
      eventId = typeof given["event_id"] === "string" ? given["event_id"] : "";
      if (this.closed) {
        return this.refuse({ kind: "closed", message: "track after dispose(): the event was not queued", eventIds: ids(eventId) });
      }
      const event: Record<string, unknown> = {
        ...given,
        event_id: given["event_id"] ?? this.o.randomUUID(),
        ts: given["ts"] ?? Math.trunc(this.o.now()),
        schema_version: given["schema_version"] ?? 1,
        producer: given["producer"] ?? this.o.producer,
      };
      eventId = String(event["event_id"]);
      const problem = problemOf(event);
      if (problem !== null) {
        return this.refuse({ kind: "invalid", message: problem, eventIds: ids(eventId) });
      }
      let json: string;
      try {
        json = JSON.stringify(event);
      } catch (error) {
        return this.refuse({ kind: "invalid", message: `not serialisable as JSON: ${String(error)}`, eventIds: ids(eventId) });
      }
      const bytes = encoder.encode(json).length;
      if (bytes + 1 > this.o.maxBatchBytes) {
        const message = `event of ${bytes} bytes; maxBatchBytes is ${this.o.maxBatchBytes}`;
        return this.refuse({ kind: "invalid", message, eventIds: [eventId] });
      }
      const added = this.queue.add(event["session_id"] as string, eventId, json, bytes);
      if (added.opened !== null) {
        const batch = added.opened;
        this.flushTimers.set(batch, setTimeout(() => this.closeBatch(batch), this.o.flushIntervalMs));
      }
      added.closed.forEach((b) => this.clearFlushTimer(b));
      this.reportDropped(added.dropped);
      if (added.closed.length > 0) {
        this.kick();
      }
      if (this.failures > 0) {
        this.schedulePersist();
      }
      return { ok: true, eventId };
    } catch (error) {
      return this.refuse({ kind: "invalid", message: `not queued: ${String(error)}`, eventIds: ids(eventId) });
    }
  }

  /**
   * Send everything queued now, without waiting for the flush interval. Resolves once every event
   * tracked before the call is acknowledged, refused, rejected or dropped, or, when delivery
   * keeps failing, after `timeoutMs` (default `flushTimeoutMs`) with the rest left to retry; in
   * both cases after the queue was saved to `storage` (if any). Never rejects.
   */
  async flush(options: FlushOptions = {}): Promise<void> {
    await this.loaded;
    this.queue.closeAll().forEach((b) => this.clearFlushTimer(b));
    const seq = this.queue.lastSeq;
    this.kick();
    if (!this.stopped && this.queue.holdsUpTo(seq)) {
      await new Promise<void>((resolve) => {
        const waiter: Waiter = {
          seq,
          resolve: () => {
            clearTimeout(timer);
            this.waiters.splice(this.waiters.indexOf(waiter), 1);
            resolve();
          },
        };
        const timer = setTimeout(waiter.resolve, options.timeoutMs ?? this.o.flushTimeoutMs);
        this.waiters.push(waiter);
      });
    }
    await this.persist();
  }

  /**
   * Flush (waiting at most `timeoutMs`), then stop: abort a request still in flight, stop every
   * timer, save what is left to `storage`. `track` refuses events from the call on. Idempotent;
   * never rejects. Unsent events without `storage` are lost.
   */
  dispose(options: FlushOptions = {}): Promise<void> {
    if (this.disposing === null) {
      this.closed = true;
      this.disposing = (async () => {
        await this.flush(options);
        this.stopped = true;
        this.flushTimers.forEach((t) => clearTimeout(t));
        this.flushTimers.clear();
        if (this.persistTimer !== null) {
          clearTimeout(this.persistTimer);
          this.persistTimer = null;
        }
        this.inFlight?.abort();
        this.wakeUp();
        await this.pumping;
        this.waiters.slice().forEach((w) => w.resolve());
        await this.persist();
      })();
    }
    return this.disposing;
  }

  /** Counters since construction; `queued` and `queuedBytes` are the current state. */
  stats(): ClientStats {
    return { ...this.counters, queued: this.queue.count, queuedBytes: this.queue.bytes };
  }

  private refuse(error: ClientError): TrackResult {
    this.counters.invalid += 1;
    this.report(error);
    return { ok: false, error };
  }

  private closeBatch(batch: Batch): void {
    this.flushTimers.delete(batch);
    if (this.queue.close(batch)) {
      this.kick();
    }
  }

  private clearFlushTimer(batch: Batch): void {
    const timer = this.flushTimers.get(batch);
    if (timer !== undefined) {
      clearTimeout(timer);
      this.flushTimers.delete(batch);
    }
  }

  /** Start the sender unless it runs. */
  private kick(): void {
    if (this.pumping === null && !this.stopped) {
      this.pumping = this.pump().finally(() => {
        this.pumping = null;
        if (this.queue.next() !== undefined && !this.stopped) {
          this.kick(); // a batch closed as the sender was leaving
        }
      });
    }
  }

  /** Send closed batches one at a time until none is left or the client stops. */
  private async pump(): Promise<void> {
    await this.loaded;
    while (!this.stopped) {
      const batch = this.queue.next();
      if (batch === undefined) {
        return;
      }
      const wait = this.retryAt - this.o.now();
      if (wait > 0) {
        await this.sleep(wait);
        continue; // the head may have changed (dropped) while waiting
      }
      const outcome = await this.send(batch);
      if (outcome.kind === "retry" && outcome.aborted) {
        return; // dispose() aborted it: the batch stays queued and is persisted
      }
      this.settle(batch, outcome);
      this.releaseWaiters();
    }
  }

  private async send(batch: Batch): Promise<Attempt> {
    this.counters.requests += 1;
    if (batch.attempts > 0) {
      this.counters.retries += 1;
    }
    batch.attempts += 1;
    this.queue.setInFlight(batch);
    const controller = new AbortController();
    this.inFlight = controller;
    try {
      return await postBatch({
        fetch: this.o.fetch, url: this.o.url, key: this.o.key, events: batch.events.map((e) => e.json),
        sentAt: this.o.now(), timeoutMs: this.o.requestTimeoutMs, gzipMinBytes: this.o.gzipMinBytes,
        signal: controller.signal, now: this.o.now,
      });
    } finally {
      this.inFlight = null;
      this.queue.setInFlight(null);
    }
  }

  private settle(batch: Batch, outcome: Attempt): void {
    const eventIds = batch.eventIds;
    if (outcome.kind === "retry") {
      this.failures += 1;
      const delay = retryDelayMs(this.failures, outcome.retryAfterMs, this.o, this.o.random);
      this.retryAt = this.o.now() + delay;
      this.report({ kind: "retrying", status: outcome.status, message: outcome.message, eventIds,
                    retryInMs: Math.round(delay), attempt: batch.attempts });
      this.schedulePersist();
      return;
    }
    this.failures = 0;
    this.retryAt = 0;
    this.queue.settle(batch);
    if (outcome.kind === "refused") {
      this.counters.refused += eventIds.length;
      this.report({ kind: "refused", status: outcome.status, message: outcome.message, eventIds });
    } else {
      const rejections = outcome.rejected.map((r) => ({ eventId: eventIds[r.index] ?? `#${r.index}`, field: r.field, reason: r.reason }));
      const refusedIds = new Set(rejections.map((r) => r.eventId));
      this.counters.accepted += outcome.accepted;
      this.counters.rejected += rejections.length;
      if (rejections.length > 0) {
        this.report({ kind: "rejected", status: outcome.status, eventIds: [...refusedIds], rejections,
                      message: rejections.map((r) => `${r.eventId}: ${r.field}: ${r.reason}`).join("; ") });
      }
      const delivered = eventIds.filter((id) => !refusedIds.has(id));
      call(this.o.onDelivered, { sessionId: batch.sessionId, eventIds: delivered, clockOffsetMs: outcome.clockOffsetMs,
                                 attempts: batch.attempts });
    }
    if (this.stored > 0) {
      this.schedulePersist(); // the stored queue still holds what was just settled
    }
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      this.wake = { timer: setTimeout(() => this.wakeUp(), ms), resolve };
    });
  }

  private wakeUp(): void {
    if (this.wake !== null) {
      clearTimeout(this.wake.timer);
      const { resolve } = this.wake;
      this.wake = null;
      resolve();
    }
  }

  private releaseWaiters(): void {
    this.waiters.filter((w) => !this.queue.holdsUpTo(w.seq)).forEach((w) => w.resolve());
  }

  private reportDropped(dropped: QueuedEvent[]): void {
    if (dropped.length > 0) {
      this.counters.dropped += dropped.length;
      const bounds = `maxQueueEvents ${this.o.maxQueueEvents}, maxQueueBytes ${this.o.maxQueueBytes}`;
      this.report({ kind: "dropped", eventIds: dropped.map((e) => e.eventId),
                    message: `queue full (${bounds}): dropped the ${dropped.length} oldest events` });
      this.releaseWaiters();
    }
  }

  private schedulePersist(): void {
    if (this.o.storage === undefined || this.persistTimer !== null || this.stopped) {
      return;
    }
    this.persistTimer = setTimeout(() => {
      this.persistTimer = null;
      void this.persist();
    }, this.o.persistDelayMs);
  }

  /** Save the queue now, after any save in progress. Never rejects. */
  private persist(): Promise<void> {
    const storage = this.o.storage;
    if (storage === undefined) {
      return Promise.resolve();
    }
    this.saving = this.saving.then(async () => {
      const events = this.queue.snapshot();
      try {
        await storage.save(`{"version":${STORAGE_VERSION},"events":[${events.join(",")}]}`);
        this.stored = events.length;
      } catch (error) {
        this.report({ kind: "storage", message: `saving the queue failed: ${String(error)}`, eventIds: [], cause: error });
      }
    });
    return this.saving;
  }

  /** Reload the queue a previous run saved, before anything is sent. Never rejects. */
  private async restore(): Promise<void> {
    const storage = this.o.storage;
    if (storage === undefined) {
      return;
    }
    let events: unknown[];
    try {
      const data = await storage.load();
      if (data === null || data === "") {
        return;
      }
      const doc = JSON.parse(data) as { version?: unknown; events?: unknown };
      if (doc.version !== STORAGE_VERSION || !Array.isArray(doc.events)) {
        throw new Error(`not a queue of version ${STORAGE_VERSION}`);
      }
      events = doc.events;
    } catch (error) {
      this.report({ kind: "storage", message: `loading the stored queue failed: ${String(error)}`, eventIds: [], cause: error });
      return;
    }
    const kept: Array<Omit<QueuedEvent, "seq">> = [];
    for (const event of events) {
      const problem = problemOf(event);
      const record = event as Record<string, unknown>;
      const json = JSON.stringify(event);
      const bytes = encoder.encode(json).length;
      if (problem !== null || bytes + 1 > this.o.maxBatchBytes) {
        this.refuse({ kind: "invalid", message: `stored event: ${problem ?? "too large"}`, eventIds: ids(record?.["event_id"]) });
        continue;
      }
      kept.push({ eventId: record["event_id"] as string, sessionId: record["session_id"] as string, json, bytes });
    }
    this.stored = kept.length;
    this.reportDropped(this.queue.restore(kept));
    this.kick();
  }

  private report(error: ClientError): void {
    call(this.o.onError, error);
  }
}

function call<T>(callback: ((value: T) => void) | undefined, value: T): void {
  try {
    callback?.(value);
  } catch {
    // a callback's own failure is not the client's to handle
  }
}

function ids(eventId: unknown): string[] {
  return typeof eventId === "string" && eventId !== "" ? [eventId] : [];
}

function stripUndefined<T extends object>(value: T): T {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v !== undefined)) as T;
}

function checkOptions(o: Required<Omit<ClientOptions, "storage" | "onError" | "onDelivered">>): void {
  const positive = ["maxBatchEvents", "maxBatchBytes", "maxQueueEvents", "maxQueueBytes", "requestTimeoutMs",
                    "initialBackoffMs", "maxBackoffMs"] as const;
  for (const name of positive) {
    if (!(o[name] > 0)) {
      throw new RangeError(`${name}: must be > 0 (got ${o[name]})`);
    }
  }
  for (const name of ["flushIntervalMs", "persistDelayMs", "flushTimeoutMs", "gzipMinBytes"] as const) {
    if (!(o[name] >= 0)) {
      throw new RangeError(`${name}: must be >= 0 (got ${o[name]})`);
    }
  }
  if (o.maxQueueEvents < o.maxBatchEvents) {
    throw new RangeError(`maxQueueEvents (${o.maxQueueEvents}) must be >= maxBatchEvents (${o.maxBatchEvents})`);
  }
  if (o.maxQueueBytes < o.maxBatchBytes) {
    throw new RangeError(`maxQueueBytes (${o.maxQueueBytes}) must be >= maxBatchBytes (${o.maxBatchBytes})`);
  }
  if (!/^https?:\/\//.test(o.url)) {
    throw new RangeError(`url: expected http(s)://host[:port], got ${JSON.stringify(o.url)}`);
  }
  if (!o.key.startsWith("rfk_")) {
    throw new RangeError("key: expected an ingestion key rfk_<key id>_<secret> (rewardflow keys create)");
  }
  if (typeof o.producer?.name !== "string" || typeof o.producer?.version !== "string") {
    throw new RangeError("producer: expected {name, version}");
  }
}
