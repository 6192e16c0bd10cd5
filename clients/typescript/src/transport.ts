/**
 * One request to the edge: `POST {url}/v1/events` with one batch, and what its answer means.
 *
 * Outcomes:
 * - `accepted`: 2xx. The edge has every valid event of the batch in Kafka; `rejected` lists the
 *   events it refused one by one (by index in the batch, with field and reason).
 * - `retry`: the same events may succeed later: no answer (network error, timeout), 408, 425,
 *   429, or any 5xx (503: Kafka did not acknowledge). `retryAfterMs` from `Retry-After`.
 * - `refused`: any other status (400 malformed, 401 bad or revoked key, 403 foreign org, 413 too
 *   large, 415): sending the same request again cannot succeed.
 *
 * Contract: {@link postBatch} never throws or rejects; it resolves once the edge answered, the
 * request failed, `timeoutMs` passed, or `signal` aborted it (then `retry`, with `aborted` set).
 */
import { parseRetryAfter } from "./retry";

export interface Rejection {
  index: number;
  field: string;
  reason: string;
}

export type Attempt =
  | { kind: "accepted"; status: number; accepted: number; rejected: Rejection[]; clockOffsetMs: number }
  | { kind: "retry"; status: number | null; retryAfterMs: number | null; message: string; aborted: boolean }
  | { kind: "refused"; status: number; message: string };

export interface PostOptions {
  fetch: typeof fetch;
  url: string;
  key: string;
  /** The events' JSON, in order. */
  events: readonly string[];
  /** The client's clock now, epoch ms: the body's `sent_at`. */
  sentAt: number;
  timeoutMs: number;
  /** Gzip bodies of at least this many bytes (where `CompressionStream` exists); Infinity: never. */
  gzipMinBytes: number;
  signal?: AbortSignal;
  now: () => number;
}

const RETRYABLE = new Set([408, 425, 429]);
const GZIP_AVAILABLE = typeof (globalThis as { CompressionStream?: unknown }).CompressionStream === "function";

export async function postBatch(o: PostOptions): Promise<Attempt> {
  const text = `{"sent_at":${Math.trunc(o.sentAt)},"events":[${o.events.join(",")}]}`;
  const headers: Record<string, string> = {
    "Content-Type": "application/json",
    Authorization: `Bearer ${o.key}`,
  };
  const controller = new AbortController();
  const abort = (): void => controller.abort();
  o.signal?.addEventListener("abort", abort);
  const timer = setTimeout(abort, o.timeoutMs);
  let response: Response;
  let body: string;
  try {
    let payload: string | ArrayBuffer = text;
    if (GZIP_AVAILABLE && text.length >= o.gzipMinBytes) {
      payload = await gzip(text);
      headers["Content-Encoding"] = "gzip";
    }
    response = await o.fetch(`${o.url.replace(/\/+$/, "")}/v1/events`, {
      method: "POST", headers, body: payload, signal: controller.signal,
    });
    body = await response.text();
  } catch (error) {
    const aborted = o.signal?.aborted === true;
    const why = aborted ? "aborted" : controller.signal.aborted ? `no answer within ${o.timeoutMs} ms` : describe(error);
    return { kind: "retry", status: null, retryAfterMs: null, message: why, aborted };
  } finally {
    clearTimeout(timer);
    o.signal?.removeEventListener("abort", abort);
  }
  const status = response.status;
  const doc = parse(body);
  if (status >= 200 && status < 300) {
    const accepted = typeof doc["accepted"] === "number" ? doc["accepted"] : o.events.length;
    const rejected = Array.isArray(doc["rejected"]) ? (doc["rejected"] as Rejection[]) : [];
    const clockOffsetMs = typeof doc["clock_offset_ms"] === "number" ? doc["clock_offset_ms"] : 0;
    return { kind: "accepted", status, accepted, rejected, clockOffsetMs };
  }
  const message = `HTTP ${status}: ${typeof doc["error"] === "string" ? doc["error"] : body.slice(0, 200)}`;
  if (RETRYABLE.has(status) || status >= 500) {
    const retryAfterMs = parseRetryAfter(response.headers.get("retry-after"), o.now());
    return { kind: "retry", status, retryAfterMs, message, aborted: false };
  }
  return { kind: "refused", status, message };
}

async function gzip(text: string): Promise<ArrayBuffer> {
  const stream = new Blob([text]).stream().pipeThrough(new CompressionStream("gzip"));
  return new Response(stream).arrayBuffer();
}

function parse(body: string): Record<string, unknown> {
  try {
    const doc: unknown = JSON.parse(body);
    return typeof doc === "object" && doc !== null ? (doc as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}

function describe(error: unknown): string {
  if (error instanceof Error) {
    const cause = (error as { cause?: { code?: unknown; message?: unknown } }).cause;
    const detail = cause?.code ?? cause?.message;
    return detail !== undefined ? `${error.message} (${String(detail)})` : error.message;
  }
  return String(error);
}
