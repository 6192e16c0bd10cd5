/**
 * The checks the client makes before it queues an event, from the generated schema constants.
 *
 * Only what would make the edge reject the event for certain and what the client needs itself:
 * a known `event_type`, no field outside that type's schema, every required field present, no
 * `client_ts` (the edge sets it), string `event_id` and `session_id` of the schema's lengths.
 * Value rules (ranges, enum symbols, string lengths of other fields) are the edge's: it answers
 * them per event in a 202 (`rejected`), which the client reports.
 *
 * Contract: pure; returns a reason or null, never throws (whatever the input).
 */
import { EVENT_FIELDS, REQUIRED_FIELDS, type EventType } from "./events";

const MAX_EVENT_ID = 64;
const MAX_SESSION_ID = 128;

/** Why `event` cannot be sent, or null when it can. */
export function problemOf(event: unknown): string | null {
  if (typeof event !== "object" || event === null || Array.isArray(event)) {
    return "an event must be an object";
  }
  const record = event as Record<string, unknown>;
  const type = record["event_type"];
  if (typeof type !== "string" || !Object.prototype.hasOwnProperty.call(EVENT_FIELDS, type)) {
    return `event_type: unknown (${JSON.stringify(type) ?? String(type)}); one of ${Object.keys(EVENT_FIELDS).join(", ")}`;
  }
  const known = EVENT_FIELDS[type as EventType];
  for (const name of Object.keys(record)) {
    if (!known.includes(name)) {
      return `${name}: not a field of ${type}`;
    }
  }
  if (record["client_ts"] !== undefined && record["client_ts"] !== null) {
    return "client_ts: set by the edge, never by clients";
  }
  for (const name of REQUIRED_FIELDS[type as EventType]) {
    if (record[name] === undefined || record[name] === null) {
      return `${name}: required for ${type}`;
    }
  }
  const eventId = record["event_id"];
  if (typeof eventId !== "string" || eventId.length < 1 || eventId.length > MAX_EVENT_ID) {
    return `event_id: a string of 1 to ${MAX_EVENT_ID} characters`;
  }
  const sessionId = record["session_id"];
  if (typeof sessionId !== "string" || sessionId.length < 1 || sessionId.length > MAX_SESSION_ID) {
    return `session_id: a string of 1 to ${MAX_SESSION_ID} characters`;
  }
  return null;
}
