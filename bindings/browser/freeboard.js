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
