// freeboard's resuming subscription for browsers: a history topic's subscription on the
// browser's WebSocket that reconnects with jittered exponential backoff, resumes with
// `?since=` the last offset delivered, drops a message whose offset it already delivered, asks
// for a fresh token before every attempt, and reports close 4410 ("cannot resume from that
// offset, start afresh") as `onGone`. No dependencies; the semantics of the Rust library's
// `freeboard::client::Subscription` (docs/library/client.md).
//
// Served by `freeboard serve` at /js/freeboard.js (types beside it in freeboard.d.ts).

/** Close code 4410: the server cannot resume from the offset given; start afresh. */
export const HISTORY_GONE = 4410;

const EPOCH = /^[0-9a-f]{1,16}$/;
const DECIMAL = /^[0-9]{1,20}$/;
const U64_MAX = (1n << 64n) - 1n;

/**
 * Parses an offset: `EPOCH.MS-SEQ` (EPOCH 1 to 16 lowercase hex digits) or the older
 * `MS-SEQ` (epoch ""). Returns null for anything else.
 */
export function parseOffset(text) {
  if (typeof text !== "string") return null;
  const dot = text.indexOf(".");
  const epoch = dot < 0 ? "" : text.slice(0, dot);
  if (dot >= 0 && !EPOCH.test(epoch)) return null;
  const parts = text.slice(dot + 1).split("-");
  if (parts.length !== 2 || !parts.every((p) => DECIMAL.test(p))) return null;
  const [ms, seq] = parts.map(BigInt);
  if (ms > U64_MAX || seq > U64_MAX) return null;
  return { text, epoch, ms, seq };
}

/**
 * Whether offset `a` comes after `b`: true or false within one epoch, null across two
 * (offsets of two epochs do not compare).
 */
export function isAfter(a, b) {
  if (a.epoch !== b.epoch) return null;
  return a.ms > b.ms || (a.ms === b.ms && a.seq > b.seq);
}

/**
 * Splits an enveloped message (`OFFSET:payload`, a string or an ArrayBuffer) into its offset
 * and payload; null when it does not start with a valid offset and ':'.
 */
export function splitEnvelope(data) {
  if (typeof data === "string") {
    const colon = data.slice(0, 60).indexOf(":");
    if (colon < 0) return null;
    const offset = parseOffset(data.slice(0, colon));
    return offset && { offset, payload: data.slice(colon + 1) };
  }
  const bytes = new Uint8Array(data);
  const colon = bytes.subarray(0, 60).indexOf(58);
  if (colon < 0) return null;
  const offset = parseOffset(String.fromCharCode(...bytes.subarray(0, colon)));
  return offset && { offset, payload: data.slice(colon + 1) };
}

/**
 * A subscription that survives drops. Options (all optional):
 * - `backoff: { initial, max }` in ms (default 250 and 30000): the first wait after a
 *   connection that delivered something, doubled up to `max`, each wait drawn between half
 *   and all of it;
 * - `token: () => string | Promise<string>`: a fresh token before every attempt, sent as
 *   `?access_token=` (a browser's WebSocket cannot set headers);
 * - `onOpen(since)`, `onMessage(payload, offset)`, `onGone(last)`,
 *   `onReconnecting(afterMs, cause)`, `onClose(event)`: the events, as in the Rust library.
 */
export class Subscription {
  constructor(url, options = {}) {
    const parsed = new URL(url);
    const since = parsed.searchParams.get("since");
    parsed.searchParams.delete("since");
    this.base = parsed;
    this.last = since === null ? null : parseOffset(since);
    this.options = options;
    this.initial = options.backoff?.initial ?? 250;
    this.max = Math.max(options.backoff?.max ?? 30000, this.initial);
    this.wait = this.initial;
    this.delivered = false;
    this.stopped = false;
    this.socket = null;
    this.timer = null;
    this.stats = { opened: 0, reconnects: 0, duplicates: 0, gone: 0 };
    this.connect();
  }

  /** The URL the next attempt uses: the base, with `since` the last offset delivered. */
  url() {
    const url = new URL(this.base);
    if (this.last) url.searchParams.set("since", this.last.text);
    return url;
  }

  /** Closes with 1000 and stops: no further attempt. */
  close() {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.socket) this.socket.close(1000);
  }

  async connect() {
    if (this.stopped) return;
    const url = this.url();
    const since = this.last;
    this.delivered = false;
    if (this.options.token) {
      try {
        url.searchParams.set("access_token", await this.options.token());
      } catch (e) {
        this.retry(this.nextWait(), `token: ${e}`);
        return;
      }
    }
    if (this.stopped) return;
    const socket = new WebSocket(url);
    socket.binaryType = "arraybuffer";
    this.socket = socket;
    let opened = false;
    socket.onopen = () => {
      opened = true;
      this.stats.opened += 1;
      this.options.onOpen?.(since ? since.text : null);
    };
    socket.onmessage = (event) => this.receive(event.data);
    socket.onclose = (event) => {
      if (this.socket !== socket) return;
      this.socket = null;
      if (this.stopped) {
        this.options.onClose?.(event);
        return;
      }
      if (!opened) {
        // The browser tells a refused upgrade and a failed connection apart by neither: both
        // are 1006 before open, and both are retried.
        this.retry(this.nextWait(), "could not connect");
        return;
      }
      const code = event.code;
      if (code === HISTORY_GONE) {
        const last = this.last;
        this.last = null;
        this.stats.gone += 1;
        this.options.onGone?.(last ? last.text : null);
        this.retry(this.nextWait(), null);
      } else if (code === 1000 || code === 1002 || code === 1007 || code === 1008 ||
                 code === 1009 || (code >= 4000 && code <= 4999)) {
        this.stopped = true;
        this.options.onClose?.(event);
      } else {
        this.retry(this.nextWait(), `closed with ${code}`);
      }
    };
  }

  receive(data) {
    this.delivered = true;
    const split = splitEnvelope(data);
    if (!split) {
      this.options.onMessage?.(data, null);
      return;
    }
    const { offset, payload } = split;
    const after = this.last ? isAfter(offset, this.last) : true;
    if (after === false) {
      this.stats.duplicates += 1;
      return;
    }
    if (after === null) {
      // A new epoch without 4410 first: continuity cannot be proven, said as a 4410 is.
      this.stats.gone += 1;
      this.options.onGone?.(this.last.text);
    }
    this.last = offset;
    this.options.onMessage?.(payload, offset.text);
  }

  retry(after, cause) {
    this.stats.reconnects += 1;
    if (cause !== null) this.options.onReconnecting?.(after, cause);
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.connect(), after);
  }

  nextWait() {
    if (this.delivered) this.wait = this.initial;
    this.delivered = false;
    const step = this.wait;
    this.wait = Math.min(this.wait * 2, this.max);
    return step * (0.5 + 0.5 * Math.random());
  }
}

// Delta subscriptions (`?delta=fossil`): each publication arrives as `F{seq}:{message}` (whole,
// text or binary as published) or as a binary `T{seq}:{delta}` / `B{seq}:{delta}`, the Fossil
// delta that turns message seq - 1 into message seq (text or binary). See the book's page on
// topics (docs/operating/deltas.md).

const B64 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz~";
const B64_VALUE = new Int8Array(128).fill(-1);
for (let i = 0; i < 64; i++) B64_VALUE[B64.charCodeAt(i)] = i;

/** Fossil's checksum of `bytes`: the sum of its big-endian 32-bit words, modulo 2^32. */
function fossilChecksum(bytes) {
  let sum = 0;
  const whole = bytes.length & ~3;
  for (let i = 0; i < whole; i += 4) {
    sum = (sum + ((bytes[i] << 24) | (bytes[i + 1] << 16) | (bytes[i + 2] << 8) | bytes[i + 3])) >>> 0;
  }
  let last = 0;
  for (let i = whole, shift = 24; i < bytes.length; i++, shift -= 8) last |= bytes[i] << shift;
  return (sum + (last >>> 0)) >>> 0;
}

/**
 * Applies a Fossil delta (Uint8Array) to `source` (Uint8Array); the target as a Uint8Array.
 * Throws an Error naming what is wrong for a malformed delta, one made against another base
 * (a copy past its end, a wrong checksum) or a target longer than `maxLength`.
 */
export function applyFossilDelta(source, delta, maxLength = Infinity) {
  let at = 0;
  const int = () => {
    let value = 0;
    const start = at;
    while (at < delta.length && delta[at] < 128 && B64_VALUE[delta[at]] >= 0) {
      value = value * 64 + B64_VALUE[delta[at++]];
      if (value > 0xffffffff) throw new Error("a number in the delta is too large");
    }
    if (at === start) throw new Error("not a Fossil delta");
    return value;
  };
  const length = int();
  if (length > maxLength) throw new Error(`the delta's target (${length} bytes) is too large`);
  if (delta[at++] !== 10) throw new Error("not a Fossil delta");
  const out = new Uint8Array(length);
  let total = 0;
  for (;;) {
    const count = int();
    const op = delta[at++];
    if (op === 64) { // '@' copy
      const offset = int();
      if (delta[at++] !== 44) throw new Error("not a Fossil delta");
      if (total + count > length) throw new Error("the delta makes more than it announces");
      if (offset + count > source.length) throw new Error("a copy reaches past the end of the base");
      out.set(source.subarray(offset, offset + count), total);
      total += count;
    } else if (op === 58) { // ':' insert
      if (total + count > length) throw new Error("the delta makes more than it announces");
      if (at + count > delta.length) throw new Error("not a Fossil delta");
      out.set(delta.subarray(at, at + count), total);
      total += count;
      at += count;
    } else if (op === 59) { // ';' end
      if (total !== length) throw new Error("the delta makes another length than it announces");
      if (count !== fossilChecksum(out)) throw new Error("the delta's checksum does not match (wrong base?)");
      return out;
    } else {
      throw new Error("not a Fossil delta");
    }
  }
}

/** Splits a delta envelope (`F12:`, `T12:`, `B12:`) off bytes: [letter, seq, rest] or null. */
function splitDeltaEnvelope(bytes) {
  if (bytes.length === 0) return null;
  const letter = String.fromCharCode(bytes[0]);
  if (!"FTB".includes(letter)) return null;
  const colon = bytes.subarray(1, 23).indexOf(58);
  if (colon <= 0) return null;
  const digits = String.fromCharCode(...bytes.subarray(1, colon + 1));
  if (!DECIMAL.test(digits)) return null;
  const seq = BigInt(digits);
  if (seq > U64_MAX) return null;
  return [letter, seq, bytes.subarray(colon + 2)];
}

/**
 * The decoder of a `?delta=fossil` subscription: give it each message's `event.data` (set the
 * socket's `binaryType = "arraybuffer"`) in order; `decode` returns
 * `{ data, seq, wasDelta }` — `data` a string for text, an ArrayBuffer for binary, as published
 * — or null for a delta whose base it does not hold (a message before it was lost; counted in
 * `gaps`; the server sends the next one whole). Throws for a delta that does not apply. A
 * presence event (`freeboard-presence:…`) is returned as it is, the base left alone.
 */
export class DeltaDecoder {
  constructor(maxLength = 64 << 20) {
    this.maxLength = maxLength;
    this.base = new Uint8Array(0);
    this.seq = null;
    this.gaps = 0;
  }

  decode(data) {
    const text = typeof data === "string";
    // A presence event (`freeboard-presence:…`) is no publication: passed on, base untouched.
    if (text && data.startsWith("freeboard-presence:")) return { data, seq: null, wasDelta: false };
    const bytes = text ? new TextEncoder().encode(data) : new Uint8Array(data);
    const split = splitDeltaEnvelope(bytes);
    if (split === null) { // whole, without the envelope: a history replay
      this.base = bytes.slice();
      this.seq = null;
      return { data, seq: null, wasDelta: false };
    }
    const [letter, seq, body] = split;
    if (letter === "F") {
      this.base = body.slice();
      this.seq = seq;
      return { data: text ? new TextDecoder().decode(body) : body.slice().buffer, seq, wasDelta: false };
    }
    if (this.seq === null || this.seq + 1n !== seq) {
      this.seq = null;
      this.gaps += 1;
      return null;
    }
    let made, out;
    try {
      made = applyFossilDelta(this.base, body, this.maxLength);
      out = letter === "T"
        ? new TextDecoder("utf-8", { fatal: true }).decode(made)
        : made.slice().buffer;
    } catch (e) {
      this.seq = null;
      throw e;
    }
    this.base = made;
    this.seq = seq;
    return { data: out, seq, wasDelta: true };
  }
}
