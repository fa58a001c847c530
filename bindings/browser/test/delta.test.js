// The module's delta decoder without a browser (`npm test`: node --test): Fossil deltas made by
// the `fossil-delta` package (the reference Centrifugo's JS SDK uses; installed in interop/node
// by scripts/test) apply byte for byte, envelopes are read as the server writes them, and a
// delta whose base was lost is refused, never applied.
import { test } from "node:test";
import assert from "node:assert/strict";
import { DeltaDecoder, applyFossilDelta } from "../freeboard.js";

const reference = await import("../../../interop/node/node_modules/fossil-delta/fossil-delta.js")
  .catch(() => null);
const skip = reference ? false : "fossil-delta is not installed (npm ci in interop/node)";
const enc = new TextEncoder();

function documentOf(n) {
  const rows = Array.from({ length: 100 }, (_, r) =>
    `{"id":${r},"value":${r === n % 100 ? n * 7 + r : r * 3},"label":"sensor ${r} ünïcode"}`);
  return `{"seq":${n},"rows":[${rows.join(",")}]}`;
}

function enveloped(letter, seq, body) {
  const head = enc.encode(`${letter}${seq}:`);
  const out = new Uint8Array(head.length + body.length);
  out.set(head);
  out.set(body, head.length);
  return out.buffer;
}

test("the reference package's deltas apply byte for byte", { skip }, () => {
  const binary = Uint8Array.from({ length: 5000 }, (_, i) => (i * 7919) % 251);
  const changed = binary.slice(0, 4000);
  changed[1234] ^= 0xff;
  const cases = [
    [enc.encode(""), enc.encode("")],
    [enc.encode("tiny"), enc.encode("tiny too")],
    [enc.encode(documentOf(1)), enc.encode(documentOf(2))],
    [binary, changed],
    [enc.encode(documentOf(3)), new Uint8Array(0)],
  ];
  for (const [source, target] of cases) {
    const delta = reference.createDelta(source, target);
    assert.deepEqual(applyFossilDelta(source, delta), target);
  }
});

test("wrong bases and damaged deltas are refused", { skip }, () => {
  const [a, b] = [enc.encode(documentOf(1)), enc.encode(documentOf(2))];
  const delta = reference.createDelta(a, b);
  assert.throws(() => applyFossilDelta(a.subarray(0, 100), delta), /past the end/);
  const other = a.slice();
  other[200] ^= 1;
  assert.throws(() => applyFossilDelta(other, delta), /checksum/);
  assert.throws(() => applyFossilDelta(a, delta, 10), /too large/);
  for (let cut = 0; cut < delta.length; cut++) {
    assert.throws(() => applyFossilDelta(a, delta.subarray(0, cut)));
  }
});

test("a subscription decodes in sequence and waits for a whole message after a gap", { skip }, () => {
  const d = new DeltaDecoder();
  const doc = (n) => enc.encode(documentOf(n));
  const delta = (seq, from, to) => enveloped("T", seq, reference.createDelta(doc(from), doc(to)));
  assert.equal(d.decode(delta(1, 0, 1)), null, "a delta before any whole message");
  assert.deepEqual(d.decode(`F1:${documentOf(1)}`), { data: documentOf(1), seq: 1n, wasDelta: false });
  assert.deepEqual(d.decode(delta(2, 1, 2)), { data: documentOf(2), seq: 2n, wasDelta: true });
  assert.equal(d.decode(delta(4, 3, 4)), null, "3 was lost");
  assert.equal(d.decode(delta(5, 4, 5)), null, "and 4 with it");
  assert.equal(d.decode(`F6:${documentOf(6)}`).data, documentOf(6));
  const event = 'freeboard-presence:{"event":"join","topic":"t","id":"0.1"}';
  assert.deepEqual(d.decode(event), { data: event, seq: null, wasDelta: false });
  assert.equal(d.decode(delta(7, 6, 7)).data, documentOf(7), "a presence event leaves the base");
  assert.equal(d.gaps, 3);
  // Binary publications: whole and delta.
  const bin = new DeltaDecoder();
  const whole = bin.decode(enveloped("F", 1, doc(8)));
  assert.deepEqual(new Uint8Array(whole.data), doc(8));
  const next = bin.decode(enveloped("B", 2, reference.createDelta(doc(8), doc(9))));
  assert.deepEqual(new Uint8Array(next.data), doc(9));
  // A replay of a history topic comes without the envelope: passed on, and deltas wait.
  assert.deepEqual(bin.decode("ab.1-2:{}"), { data: "ab.1-2:{}", seq: null, wasDelta: false });
  assert.equal(bin.decode(enveloped("B", 3, reference.createDelta(doc(9), doc(10)))), null);
});
