/** Close code 4410: the server cannot resume from the offset given; start afresh. */
export declare const HISTORY_GONE: 4410;

/** A history offset: `EPOCH.MS-SEQ`, or the older `MS-SEQ` (epoch ""). */
export interface Offset {
  /** The token as the server wrote it (sent back in `?since=`). */
  readonly text: string;
  readonly epoch: string;
  readonly ms: bigint;
  readonly seq: bigint;
}

/** Parses an offset; null for anything that is not one. */
export declare function parseOffset(text: string): Offset | null;

/** Whether `a` comes after `b`: a boolean within one epoch, null across two. */
export declare function isAfter(a: Offset, b: Offset): boolean | null;

/** An enveloped message split into its offset and payload; null without an envelope. */
export declare function splitEnvelope<T extends string | ArrayBuffer>(
  data: T,
): { offset: Offset; payload: T } | null;

export interface SubscriptionStats {
  opened: number;
  reconnects: number;
  duplicates: number;
  gone: number;
}

export interface SubscriptionOptions {
  /** Waits between attempts in ms: the first (default 250) doubled up to max (30000). */
  backoff?: { initial?: number; max?: number };
  /** A fresh token before every attempt, sent as `?access_token=`. */
  token?: () => string | Promise<string>;
  /** A connection opened, resuming after `since` (null: from now on). */
  onOpen?: (since: string | null) => void;
  /** A message not delivered before, in order; `offset` null when it had no envelope. */
  onMessage?: (payload: string | ArrayBuffer, offset: string | null) => void;
  /** The server cannot resume after `last` (4410): start afresh; the subscription goes on. */
  onGone?: (last: string | null) => void;
  /** The connection ended or failed; the next attempt comes after `afterMs`. */
  onReconnecting?: (afterMs: number, cause: string) => void;
  /** The subscription ended for good (1000, 1008, a 4xxx other than 4410, or close()). */
  onClose?: (event: CloseEvent) => void;
}

/** A history topic's subscription that reconnects, resumes with `since` and de-duplicates. */
export declare class Subscription {
  constructor(url: string | URL, options?: SubscriptionOptions);
  /** The last offset delivered (the one `since` resumes from). */
  readonly last: Offset | null;
  readonly stats: SubscriptionStats;
  /** The URL the next attempt uses. */
  url(): URL;
  /** Closes with 1000 and stops. */
  close(): void;
}

/** Applies a Fossil delta to `source`; throws naming what is wrong when it does not apply. */
export declare function applyFossilDelta(
  source: Uint8Array,
  delta: Uint8Array,
  maxLength?: number,
): Uint8Array;

/** A publication a {@link DeltaDecoder} gave back. */
export interface DecodedPublication {
  /** As published: a string for text, an ArrayBuffer for binary. */
  data: string | ArrayBuffer;
  /** Its sequence number; null for a message without the delta envelope (a replay). */
  seq: bigint | null;
  wasDelta: boolean;
}

/** The decoder of a `?delta=fossil` subscription's messages, fed `event.data` in order. */
export declare class DeltaDecoder {
  constructor(maxLength?: number);
  /** null for a delta whose base was lost (counted in `gaps`); throws if it does not apply. */
  decode(data: string | ArrayBuffer): DecodedPublication | null;
  readonly gaps: number;
}
