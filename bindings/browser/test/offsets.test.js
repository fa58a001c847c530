// The module's offset grammar and order, without a browser (`npm test`: node --test). Its
// WebSocket side runs in Chromium: crates/freeboard-cli/tests/dashboard.rs.
import { test } from "node:test";
import assert from "node:assert/strict";
import { HISTORY_GONE, isAfter, parseOffset, splitEnvelope } from "../freeboard.js";

test("offsets parse per the contract and refuse the rest", () => {
  const t = parseOffset("1a2b.1763935200123-42");
  assert.deepEqual([t.epoch, t.ms, t.seq], ["1a2b", 1763935200123n, 42n]);
  assert.equal(parseOffset("5-6").epoch, "");
  for (const bad of ["", "-", "1-", "-1", "1-2-3", "A.1-2", ".1-2", "1.2.3-4",
    "12345678901234567.1-2", "1-+2", " 1-2", "1-18446744073709551616", "x:1-2"]) {
    assert.equal(parseOffset(bad), null, bad);
  }
});

test("offsets compare within an epoch only, as numbers", () => {
  const p = parseOffset;
  assert.equal(isAfter(p("a.10-0"), p("a.9-5")), true);
  assert.equal(isAfter(p("a.9-5"), p("a.9-5")), false);
  assert.equal(isAfter(p("b.9-6"), p("a.9-5")), null);
  assert.equal(isAfter(p("9-6"), p("a.9-5")), null);
});

test("envelopes split, text and binary; plain messages do not", () => {
  const text = splitEnvelope('ff.1-2:{"a":1}');
  assert.deepEqual([text.offset.text, text.payload], ["ff.1-2", '{"a":1}']);
  const bytes = new TextEncoder().encode("ff.1-3:\u0000\u0001").buffer;
  const binary = splitEnvelope(bytes);
  assert.equal(binary.offset.text, "ff.1-3");
  assert.deepEqual([...new Uint8Array(binary.payload)], [0, 1]);
  assert.equal(splitEnvelope('{"a":1}'), null);
  assert.equal(splitEnvelope("1-2"), null);
  assert.equal(HISTORY_GONE, 4410);
});
