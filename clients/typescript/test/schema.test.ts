/** The generated types match schemas/*.avsc read from disk now (rewardflow codegen --check checks the whole file). */
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";

import { EVENT_FIELDS, EVENT_TYPES, REQUIRED_FIELDS, SCHEMA_DIGEST } from "../src/events";

interface AvroField {
  name: string;
  type: unknown;
  default?: unknown;
}

function schemaDir(): string {
  if (process.env["REWARDFLOW_SCHEMA_DIR"]) {
    return process.env["REWARDFLOW_SCHEMA_DIR"];
  }
  for (let dir = __dirname; dir !== dirname(dir); dir = dirname(dir)) {
    if (existsSync(join(dir, "schemas", "rewardflow.events.EventBatch.avsc"))) {
      return join(dir, "schemas");
    }
  }
  throw new Error("schemas/ not found above " + __dirname);
}

function fieldsOf(name: string): AvroField[] {
  const doc = JSON.parse(readFileSync(join(schemaDir(), `rewardflow.events.${name}.avsc`), "utf8")) as { fields: AvroField[] };
  return doc.fields;
}

test("EVENT_TYPES are the members of EventBatch's union, in order", () => {
  const batch = fieldsOf("EventBatch").find((f) => f.name === "events")!;
  const members = (batch.type as { items: string[] }).items.map((t) => t.replace("rewardflow.events.", ""));
  assert.deepEqual([...EVENT_TYPES], members);
  assert.deepEqual(Object.keys(EVENT_FIELDS), members);
});

test("EVENT_FIELDS lists every field of each schema, in order", () => {
  for (const type of EVENT_TYPES) {
    assert.deepEqual([...EVENT_FIELDS[type]], fieldsOf(type).map((f) => f.name), type);
  }
});

test("REQUIRED_FIELDS are the fields without a default that are not nullable (org_id excepted)", () => {
  for (const type of EVENT_TYPES) {
    const expected = fieldsOf(type)
      .filter((f) => !("default" in f) && !Array.isArray(f.type) && f.name !== "org_id")
      .map((f) => f.name);
    assert.deepEqual([...REQUIRED_FIELDS[type]], expected, type);
  }
});

test("SCHEMA_DIGEST is a sha256", () => {
  assert.match(SCHEMA_DIGEST, /^[0-9a-f]{64}$/);
});
