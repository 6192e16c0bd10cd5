/**
 * What the network tests need from the pytest harness (tests/clients/test_typescript.py), which
 * starts real collectors, a Kafka broker and chDB, and passes them in environment variables:
 *
 * - RF_TEST_URL, RF_TEST_KEY: a collector with ordinary limits, and an ingestion key of it;
 * - RF_TEST_RATE_URL, RF_TEST_RATE_EVENTS_PER_S, RF_TEST_RATE_BURST: a collector with a low rate;
 * - RF_TEST_OUTAGE_URL, RF_TEST_OUTAGE_CONTROL: a collector on a broker of its own, which the
 *   harness stops (SIGSTOP) when a file `pause` appears in the control directory, then writes
 *   `paused`; it resumes the broker (SIGCONT) a few seconds later and writes `resumed`;
 * - RF_TEST_DELIVERED_DIR: where each test writes the event ids the edge acknowledged, so the
 *   harness checks every one of them landed in the raw topic exactly once;
 * - RF_TEST_REQUIRE_COLLECTOR=1: a missing variable fails the test instead of skipping it.
 *
 * Run by hand (`npm test`) without these variables, the network tests skip.
 */
import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";

import type { Delivery } from "../src";

export const REQUIRED = process.env["RF_TEST_REQUIRE_COLLECTOR"] === "1";

/** The named variables, or undefined after skipping `t` (outside the harness) when one is missing. */
export function collectorEnv<K extends string>(t: TestContext, ...names: K[]): Record<K, string> | undefined {
  const missing = names.filter((n) => !process.env[n]);
  if (missing.length > 0) {
    if (REQUIRED) {
      throw new Error(`the harness did not set ${missing.join(", ")}`);
    }
    t.skip(`needs a collector: ${missing.join(", ")} unset (run by tests/clients/test_typescript.py)`);
    return undefined;
  }
  return Object.fromEntries(names.map((n) => [n, process.env[n]!])) as Record<K, string>;
}

/** Record the acknowledged ids for the harness: `collector` names the one they were sent to. */
export function recordDelivered(collector: "main" | "rate" | "outage", test: string, eventIds: string[]): void {
  const dir = process.env["RF_TEST_DELIVERED_DIR"];
  if (dir) {
    const slug = test.replace(/[^A-Za-z0-9]+/g, "-").slice(0, 60);
    writeFileSync(join(dir, `${collector}-${slug}-${process.pid}.json`), JSON.stringify({ collector, test, eventIds }));
  }
}

/** Collects what `onDelivered` reports. */
export class Deliveries {
  readonly all: Delivery[] = [];
  readonly on = (d: Delivery): void => {
    this.all.push(d);
  };

  get eventIds(): string[] {
    return this.all.flatMap((d) => d.eventIds);
  }
}

/** One request as the client made it and the edge answered it (a pass-through `fetch`, not a fake edge). */
export interface Exchange {
  startedAt: number;
  endedAt: number;
  sentAt: number;
  sessions: string[];
  eventIds: string[];
  gzip: boolean;
  status: number | null;
  retryAfter: string | null;
}

/** A `fetch` that records every exchange and passes it on to the real `fetch` unchanged. */
export function recordingFetch(): { fetch: typeof fetch; exchanges: Exchange[] } {
  const exchanges: Exchange[] = [];
  const recording = async (input: Parameters<typeof fetch>[0], init?: RequestInit): Promise<Response> => {
    const headers = new Headers(init?.headers);
    const gzip = headers.get("content-encoding") === "gzip";
    let raw = init?.body as string | ArrayBuffer;
    if (gzip) {
      const stream = new Blob([raw]).stream().pipeThrough(new DecompressionStream("gzip"));
      raw = await new Response(stream).text();
    }
    const body = JSON.parse(raw as string) as { sent_at: number; events: Array<{ session_id: string; event_id: string }> };
    const exchange: Exchange = {
      startedAt: Date.now(), endedAt: 0, sentAt: body.sent_at, gzip, status: null, retryAfter: null,
      sessions: [...new Set(body.events.map((e) => e.session_id))], eventIds: body.events.map((e) => e.event_id),
    };
    exchanges.push(exchange);
    try {
      const response = await fetch(input, init);
      exchange.status = response.status;
      exchange.retryAfter = response.headers.get("retry-after");
      return response;
    } finally {
      exchange.endedAt = Date.now();
    }
  };
  return { fetch: recording as typeof fetch, exchanges };
}

/** A loopback URL where nothing listens (a port bound, then released). */
export async function closedPortUrl(): Promise<string> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (address === null || typeof address === "string") {
    throw new Error("no port");
  }
  return `http://127.0.0.1:${address.port}`;
}

export function tempDir(): string {
  return mkdtempSync(join(tmpdir(), "rewardflow-client-"));
}

export async function waitForFile(path: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!existsSync(path)) {
    if (Date.now() > deadline) {
      throw new Error(`${path} did not appear within ${timeoutMs} ms`);
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

export const PRODUCER = { name: "rewardflow-ts-tests", version: "0.1.0" };

export interface FollowUpInput {
  event_type: "FollowUp";
  session_id: string;
  request_id: string;
  dissatisfied: boolean;
}

/** A FollowUp of `session`; `n` goes into request_id so order can be checked. */
export function followUp(session: string, n: number): FollowUpInput {
  return { event_type: "FollowUp", session_id: session, request_id: `r-${n}`, dissatisfied: n % 2 === 0 };
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
