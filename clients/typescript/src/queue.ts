/**
 * The client's bounded queue of events: open batches (one per session, still filling) and closed
 * batches waiting to be sent, oldest first.
 *
 * A batch holds the events of one session, in the order they were added. It closes when it holds
 * `maxBatchEvents` events, when the next event would take its JSON past `maxBatchBytes` (that
 * event opens the next batch), or when the owner closes it ({@link BatchQueue.close}: the flush
 * interval, a flush). Closed batches are sent in the order they closed, so a session's events
 * reach the edge in the order they were added.
 *
 * Bounds: the queue holds at most `maxQueueEvents` events and `maxQueueBytes` bytes of event JSON
 * (open, closed and in-flight batches together). Past either, the oldest events are dropped,
 * never those of the batch in flight, and returned to the caller to be counted and reported.
 *
 * Contract: pure bookkeeping, synchronous, no timers and no I/O. Every event carries a sequence
 * number, increasing in the order events were added (restored events come before all others).
 */

export interface QueuedEvent {
  readonly seq: number;
  readonly eventId: string;
  readonly sessionId: string;
  /** The event as JSON, exactly as it goes into the request body. */
  readonly json: string;
  /** UTF-8 length of `json`. */
  readonly bytes: number;
}

export interface QueueLimits {
  maxBatchEvents: number;
  maxBatchBytes: number;
  maxQueueEvents: number;
  maxQueueBytes: number;
}

/** The events of one session sent in one request. */
export class Batch {
  readonly events: QueuedEvent[] = [];
  /** JSON bytes of the events plus one separator each: what they add to a request body. */
  bytes = 0;
  /** Requests made with this batch so far. */
  attempts = 0;

  constructor(readonly id: number, readonly sessionId: string) {}

  get eventIds(): string[] {
    return this.events.map((e) => e.eventId);
  }
}

export interface AddResult {
  /** The batch the event opened (the owner starts its flush interval), else null. */
  opened: Batch | null;
  /** Batches this addition closed, in send order. */
  closed: Batch[];
  /** Events dropped to keep within the bounds, oldest first. */
  dropped: QueuedEvent[];
}

export class BatchQueue {
  private readonly open = new Map<string, Batch>();
  private ready: Batch[] = [];
  private inFlight: Batch | null = null;
  private nextSeq = 1;
  private nextBatch = 1;
  /** Events held (open, closed, in flight). */
  count = 0;
  /** JSON bytes of the events held. */
  bytes = 0;

  constructor(readonly limits: QueueLimits) {}

  /** The sequence number of the last event added (0 before any). */
  get lastSeq(): number {
    return this.nextSeq - 1;
  }

  /**
   * Add one event to its session's open batch. The caller guarantees `bytes + 1 <= maxBatchBytes`
   * (a larger event can never be sent and is refused before it gets here).
   */
  add(sessionId: string, eventId: string, json: string, bytes: number): AddResult {
    const event: QueuedEvent = { seq: this.nextSeq++, eventId, sessionId, json, bytes };
    const closed: Batch[] = [];
    let batch = this.open.get(sessionId);
    let opened: Batch | null = null;
    if (batch !== undefined && batch.bytes + bytes + 1 > this.limits.maxBatchBytes) {
      closed.push(batch);
      this.close(batch);
      batch = undefined;
    }
    if (batch === undefined) {
      batch = opened = new Batch(this.nextBatch++, sessionId);
      this.open.set(sessionId, batch);
    }
    this.push(batch, event);
    if (batch.events.length >= this.limits.maxBatchEvents) {
      closed.push(batch);
      this.close(batch);
    }
    return { opened, closed, dropped: this.enforceBounds() };
  }

  /** Close `batch` if it is still open (it joins the send order); false if it was not open. */
  close(batch: Batch): boolean {
    if (this.open.get(batch.sessionId) !== batch) {
      return false;
    }
    this.open.delete(batch.sessionId);
    this.ready.push(batch);
    return true;
  }

  /** Close every open batch, oldest first; returns them. */
  closeAll(): Batch[] {
    const batches = [...this.open.values()].sort((a, b) => a.events[0]!.seq - b.events[0]!.seq);
    batches.forEach((b) => this.close(b));
    return batches;
  }

  /** The next batch to send (the oldest closed one), if any. */
  next(): Batch | undefined {
    return this.ready[0];
  }

  /** Mark `batch` as in flight (never dropped) or, with null, that no batch is. */
  setInFlight(batch: Batch | null): void {
    this.inFlight = batch;
  }

  /** Remove a closed batch whose fate is decided (acknowledged or refused). */
  settle(batch: Batch): void {
    const i = this.ready.indexOf(batch);
    if (i >= 0) {
      this.ready.splice(i, 1);
      this.count -= batch.events.length;
      this.bytes -= batch.events.reduce((sum, e) => sum + e.bytes, 0);
    }
    if (this.inFlight === batch) {
      this.inFlight = null;
    }
  }

  /**
   * Put events kept from an earlier run (oldest first) before every other event, batched per
   * session like added ones but closed at once (ready to send). Returns what the bounds dropped.
   */
  restore(events: ReadonlyArray<Omit<QueuedEvent, "seq">>): QueuedEvent[] {
    const batches: Batch[] = [];
    const current = new Map<string, Batch>();
    events.forEach((e, i) => {
      let batch = current.get(e.sessionId);
      if (batch === undefined || batch.events.length >= this.limits.maxBatchEvents
          || batch.bytes + e.bytes + 1 > this.limits.maxBatchBytes) {
        batch = new Batch(this.nextBatch++, e.sessionId);
        current.set(e.sessionId, batch);
        batches.push(batch);
      }
      this.push(batch, { ...e, seq: i - events.length });
    });
    this.ready = [...batches, ...this.ready];
    return this.enforceBounds();
  }

  /** Whether an event added at or before sequence number `seq` is still held. */
  holdsUpTo(seq: number): boolean {
    return this.batches().some((b) => b.events.length > 0 && b.events[0]!.seq <= seq);
  }

  /** The JSON of every event held, oldest first: what a restart must send. */
  snapshot(): string[] {
    return this.batches().flatMap((b) => b.events).sort((a, b) => a.seq - b.seq).map((e) => e.json);
  }

  private batches(): Batch[] {
    return [...this.ready, ...this.open.values()];
  }

  private push(batch: Batch, event: QueuedEvent): void {
    batch.events.push(event);
    batch.bytes += event.bytes + 1;
    this.count += 1;
    this.bytes += event.bytes;
  }

  private enforceBounds(): QueuedEvent[] {
    const dropped: QueuedEvent[] = [];
    while (this.count > this.limits.maxQueueEvents || this.bytes > this.limits.maxQueueBytes) {
      let victim: Batch | undefined;
      for (const b of this.batches()) {
        if (b !== this.inFlight && b.events.length > 0 && (victim === undefined || b.events[0]!.seq < victim.events[0]!.seq)) {
          victim = b;
        }
      }
      if (victim === undefined) {
        break; // only the batch in flight is left: it is settled by its answer
      }
      const event = victim.events.shift()!;
      victim.bytes -= event.bytes + 1;
      this.count -= 1;
      this.bytes -= event.bytes;
      dropped.push(event);
      if (victim.events.length === 0) {
        this.discard(victim);
      }
    }
    return dropped;
  }

  private discard(batch: Batch): void {
    if (this.open.get(batch.sessionId) === batch) {
      this.open.delete(batch.sessionId);
    }
    const i = this.ready.indexOf(batch);
    if (i >= 0) {
      this.ready.splice(i, 1);
    }
  }
}
