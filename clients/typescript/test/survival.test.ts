/** The survival scores, the edit-survival helper on a fake clock, and its deterministic ids. Pure. */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test } from "node:test";

import type { EventInput, TrackResult } from "../src/client";
import { sha1, uuid5 } from "../src/ids";
import { DEFAULT_HORIZONS_S, persistenceCheckId, trackEditSurvival, type Timer } from "../src/persistence";
import { editDelta, revertScore, scoreEdit, survival } from "../src/survival";
import { problemOf } from "../src/validate";

const BEFORE = "import os\n\ndef total(xs):\n    return sum(xs)\n\nprint(total([1, 2]))\n";
const INSERTED = "    if not xs:\n        raise ValueError('empty input')\n";
const AFTER = BEFORE.replace("    return sum(xs)\n", INSERTED + "    return sum(xs)\n");

test("survival: the fraction of the inserted text's 4-grams found in the document", () => {
  assert.deepEqual(survival(INSERTED, AFTER), { score: 1, survivingChars: INSERTED.length });
  assert.deepEqual(survival(INSERTED, BEFORE).score < 0.1, true);
  assert.deepEqual(survival("abcdefghij", "xx abcdef yy"), { score: 3 / 7, survivingChars: 6 });
  assert.deepEqual(survival("xxxxxx", "xxxx"), { score: 1 / 3, survivingChars: 4 }, "each occurrence matches once");
  assert.deepEqual(survival("a\r\nbcd", "a\nbcd"), { score: 1, survivingChars: 5 }, "line endings are not changes");
});

test("survival: text shorter than 4 characters scores as a substring; empty text as fully kept", () => {
  assert.deepEqual(survival("x+1", "y = x+1"), { score: 1, survivingChars: 3 });
  assert.deepEqual(survival("x+1", "y = x + 1"), { score: 0, survivingChars: 0 });
  assert.deepEqual(survival("", "anything"), { score: 1, survivingChars: 0 });
});

test("revert: 0 right after the edit, 1 when the text before is back, edits elsewhere do not count", () => {
  const delta = editDelta(BEFORE, AFTER);
  assert.equal(revertScore(delta, AFTER), 0);
  assert.equal(revertScore(delta, BEFORE), 1);
  const elsewhere = "# a comment the user added\n" + AFTER.replace("print(total([1, 2]))", "print(total([3]))");
  assert.equal(revertScore(delta, elsewhere), 0);
  assert.equal(revertScore(delta, "# a comment the user added\n" + BEFORE), 1);
  const half = AFTER.replace("        raise ValueError('empty input')\n", "");
  const partial = revertScore(delta, half);
  assert.ok(partial > 0.3 && partial < 0.9, String(partial));
});

test("revert: a replaced line put back counts both the removal and the insertion undone", () => {
  const before = "const limit = computeLimit(config);\n";
  const after = "const limit = 42;\n";
  const delta = editDelta(before, after);
  assert.equal(revertScore(delta, before), 1);
  const insertionGone = "const limit = ;\n"; // the inserted "42" deleted, the old call not restored
  const score = revertScore(delta, insertionGone);
  assert.ok(score > 0 && score < 0.5, String(score));
  assert.equal(revertScore(editDelta("same", "same"), "other"), 0, "an edit that changed nothing has no revert");
});

test("scoreEdit: unchanged from 0.95, revert 0 without the text before", () => {
  const kept = scoreEdit(INSERTED, null, AFTER);
  assert.deepEqual(kept, { survival_score: 1, revert_score: 0, unchanged: true, surviving_chars: INSERTED.length });
  const reworded = scoreEdit(INSERTED, editDelta(BEFORE, AFTER), AFTER.replace("'empty input'", "'no values given'"));
  assert.ok(reworded.survival_score < 0.95 && !reworded.unchanged && reworded.surviving_chars < INSERTED.length);
});

test("uuid5 and sha1 agree with the standard vectors and Python's uuid.uuid5", () => {
  assert.equal(uuid5("6ba7b810-9dad-11d1-80b4-00c04fd430c8", "python.org"), "886313e1-3b8a-5372-9b90-0c9aee199e5d");
  assert.equal(persistenceCheckId("edit-1", 30), "cb1ef491-9c52-5c6b-aad1-45350554919c");
  assert.equal(persistenceCheckId("édit-ü", 900), "aad128ab-bb6d-57b1-a80f-fa539230cbbb");
  for (const n of [0, 3, 55, 56, 63, 64, 65, 1000]) {
    const data = new Uint8Array(Array.from({ length: n }, (_, i) => (i * 7) & 0xff));
    assert.equal(Buffer.from(sha1(data)).toString("hex"), createHash("sha1").update(data).digest("hex"), `${n} bytes`);
  }
});

/** Timers on a clock that only moves when the test says so. */
class FakeTime implements Timer {
  now = 1_700_000_000_000;
  private timers: Array<{ due: number; callback: () => void; id: number }> = [];
  private ids = 0;

  readonly clock = (): number => this.now;

  setTimeout(callback: () => void, ms: number): unknown {
    const id = ++this.ids;
    this.timers.push({ due: this.now + ms, callback, id });
    return id;
  }

  clearTimeout(handle: unknown): void {
    this.timers = this.timers.filter((t) => t.id !== handle);
  }

  /** Move to `at`, firing every timer due on the way (and letting the helper's awaits settle). */
  async advanceTo(at: number): Promise<void> {
    for (;;) {
      await settle();
      const next = this.timers.filter((t) => t.due <= at).sort((a, b) => a.due - b.due)[0];
      if (next === undefined) {
        break;
      }
      this.timers = this.timers.filter((t) => t !== next);
      this.now = next.due;
      next.callback();
    }
    this.now = at;
    await settle();
  }
}

async function settle(): Promise<void> {
  for (let i = 0; i < 5; i++) {
    await new Promise((resolve) => setImmediate(resolve));
  }
}

class Tracked {
  readonly events: Array<Record<string, unknown>> = [];
  track(event: EventInput): TrackResult {
    this.events.push(event as unknown as Record<string, unknown>);
    return { ok: true, eventId: String(event.event_id) };
  }
}

test("the helper checks at each horizon, skips unreadable documents and uses stable ids", async () => {
  const time = new FakeTime();
  const start = time.now;
  let document: string | null = AFTER;
  const client = new Tracked();
  const edit = { sessionId: "s1", requestId: "r1", editId: "e1", insertedText: INSERTED, textBefore: BEFORE };
  const handle = trackEditSurvival({ client, edit, readDocument: async () => document, clock: time.clock, timer: time });
  await time.advanceTo(start + 29_999);
  assert.equal(client.events.length, 0, "nothing before the first horizon");
  await time.advanceTo(start + 30_000);
  assert.equal(client.events.length, 1);
  document = AFTER.replace("'empty input'", "'no values given'");
  await time.advanceTo(start + 120_000);
  document = BEFORE;
  await time.advanceTo(start + 300_000);
  document = null;
  await time.advanceTo(start + 600_000);
  document = "";
  await time.advanceTo(start + 900_000);
  await handle.done;
  const checks = client.events;
  assert.deepEqual(checks.map((e) => e["horizon_s"]), [30, 120, 300, 900], "600 s skipped: document unreadable");
  assert.deepEqual(checks.map((e) => e["ts"]), [30, 120, 300, 900].map((h) => start + h * 1000));
  assert.deepEqual(checks.map((e) => e["event_id"]), [30, 120, 300, 900].map((h) => persistenceCheckId("e1", h)));
  assert.deepEqual(checks.map((e) => e["unchanged"]), [true, false, false, false]);
  // 900 s: the document is empty, so everything the (pure) insertion added is gone again
  assert.deepEqual(checks.map((e) => e["revert_score"]), [0, checks[1]!["revert_score"], 1, 1]);
  assert.ok((checks[1]!["survival_score"] as number) > 0.3 && (checks[1]!["survival_score"] as number) < 0.95);
  assert.deepEqual(checks.map((e) => e["survival_score"] as number < 0.1), [false, false, true, true]);
  assert.equal(checks[3]!["surviving_chars"], 0);
  for (const e of checks) {
    assert.equal(problemOf({ ...e, ts: e["ts"], producer: { name: "p", version: "1" } }), null, "a valid event");
    assert.deepEqual([e["session_id"], e["request_id"], e["edit_id"]], ["s1", "r1", "e1"]);
  }
});

test("a re-run for the same edit after a restart checks past horizons at once, with the same ids", async () => {
  const time = new FakeTime();
  const editedAt = time.now - 200_000; // the edit happened 200 s before this run
  const client = new Tracked();
  const edit = { sessionId: "s", requestId: "r", editId: "e1", insertedText: INSERTED, textAfter: AFTER, editedAt };
  const handle = trackEditSurvival({ client, edit, readDocument: () => AFTER, clock: time.clock, timer: time });
  await time.advanceTo(time.now);
  assert.deepEqual(client.events.map((e) => e["horizon_s"]), [30, 120]);
  await time.advanceTo(editedAt + 900_000);
  await handle.done;
  assert.deepEqual(client.events.map((e) => e["event_id"]), DEFAULT_HORIZONS_S.map((h) => persistenceCheckId("e1", h)));
});

test("cancel stops the schedule; a bad horizon is refused at the call", async () => {
  const time = new FakeTime();
  const client = new Tracked();
  let reads = 0;
  const edit = { sessionId: "s", requestId: "r", editId: "e2", insertedText: "x" };
  const handle = trackEditSurvival({ client, edit, readDocument: () => { reads += 1; return "x"; },
                                     horizonsS: [120, 30], clock: time.clock, timer: time });
  await time.advanceTo(time.now + 30_000);
  handle.cancel();
  handle.cancel();
  await time.advanceTo(time.now + 1_000_000);
  await handle.done;
  assert.equal(client.events.length, 1);
  assert.equal(reads, 1);
  assert.throws(() => trackEditSurvival({ client, edit, readDocument: () => "", horizonsS: [0] }), RangeError);
  assert.throws(() => trackEditSurvival({ client, edit, readDocument: () => "", horizonsS: [1.5] }), RangeError);
});

test("a read that throws is skipped and reported", async () => {
  const time = new FakeTime();
  const client = new Tracked();
  const errors: unknown[] = [];
  const edit = { sessionId: "s", requestId: "r", editId: "e3", insertedText: "abcdef" };
  let calls = 0;
  const readDocument = (): string => {
    calls += 1;
    if (calls === 1) {
      throw new Error("file is busy");
    }
    return "abcdef";
  };
  const handle = trackEditSurvival({ client, edit, readDocument, horizonsS: [30, 120], clock: time.clock, timer: time,
                                     onError: (e) => errors.push(e) });
  await time.advanceTo(time.now + 120_000);
  await handle.done;
  assert.deepEqual(client.events.map((e) => e["horizon_s"]), [120]);
  assert.equal((errors[0] as Error).message, "file is busy");
});
