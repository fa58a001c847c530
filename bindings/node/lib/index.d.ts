// Types of freeboard for Node.js (lib/index.js).
import { EventEmitter } from 'node:events';

/** What the session did with a sent message. */
export type SendOutcome =
  /** Queued; the queue is at or under its high watermark. */
  | 'queued'
  /** Queued; the queue is above its high watermark: pause until 'drain'. */
  | 'above-high'
  /** The slow-consumer policy dropped this message or older ones (counted). */
  | 'dropped'
  /** Not queued: the `block` policy's cap, or the memory budget is short: retry after 'drain'. */
  | 'blocked'
  /** Not queued: the connection is closing or closed. */
  | 'closed';

export type SlowConsumerPolicy = 'block' | 'drop-newest' | 'drop-oldest' | 'conflate' | 'close';

/** A size: bytes, or text with a suffix ('64K', '256M', '1.5G'). */
export type Size = number | string;
/** A duration: milliseconds, or text ('30s', '500ms'). */
export type Duration = number | string;

export interface ServerOptions {
  /** Port to listen on; 0 (the default) picks a free one. */
  port?: number;
  /** Address to listen on (default '0.0.0.0'). */
  host?: string;
  /** Serve upgrades on this path only (default: every path). */
  path?: string;
  /** Subprotocols the server speaks, in order of preference. */
  protocols?: string[];
  /** The memory budget of every buffer (default '1G', drawn on demand). */
  memory?: Size;
  /** Largest message accepted (larger: close 1009). ws's `maxPayload` is the same. */
  maxMessageSize?: Size;
  maxPayload?: Size;
  /** Send queue: 'drain' at or below this level. */
  lowWatermark?: Size;
  /** Send queue: 'above-high' past this level. */
  highWatermark?: Size;
  /** Send queue: never more than this; the policy decides past it. */
  maxBackpressure?: Size;
  /** What happens to a slow consumer past its cap (default 'block'). */
  slowConsumer?: SlowConsumerPolicy;
  handshakeTimeout?: Duration;
  /** null (or 0) turns the idle timeout off. */
  idleTimeout?: Duration | null;
  closeTimeout?: Duration;
  drainTimeout?: Duration;
  maxConnections?: number;
  maxConnectionsPerIp?: number;
  /** Join other processes' listeners on the same port (SO_REUSEPORT): one per core. */
  sharePort?: boolean;
  /** Topic settings of `freeboard serve` (`history`, `historySeconds`, …). */
  topics?: Record<string, unknown>;
  /**
   * The id mode: handlers given here hold connections by id, with no JavaScript object per
   * connection (`server.send(id, …)`, `server.connection(id)` for a `WebSocket` on demand).
   * `this` is the server. A throw or a rejected promise closes the connection with 1011.
   */
  open?: (this: Server, id: ConnectionId, request: UpgradeRequest) => void | Promise<void>;
  /** `data` is a view of the turn's batch, valid after the call too. */
  message?: (this: Server, id: ConnectionId, data: Buffer, isBinary: boolean) => void | Promise<void>;
  /** The queue of `id` is back at its low watermark. */
  drain?: (this: Server, id: ConnectionId) => void | Promise<void>;
  /** 1006 when the transport ended first. The id is stale from now on. */
  close?: (this: Server, id: ConnectionId, code: number, reason: Buffer) => void | Promise<void>;
  /** Any other setting of `freeboard serve`'s configuration file, in camelCase. */
  [setting: string]: unknown;
}

/**
 * A connection's id: its serial number on the server's loop, never reused. Once the
 * connection has gone, every call with its id answers 'closed', `false`, 0 or throws
 * `ERR_FREEBOARD_CLOSED`, even after its slot holds another connection.
 */
export type ConnectionId = number;

/** The upgrade request, as far as a WebSocket server sees it. */
export interface UpgradeRequest {
  url: string;
  method: 'GET';
  /** Lower-case names; repeated headers joined with ', ' (parsed at first read). */
  readonly headers: Record<string, string>;
  socket: { remoteAddress: string; remotePort: number };
}

/**
 * Completes an upgrade decision: `true` (or nothing) accepts, a 4xx or 5xx number refuses
 * with that HTTP status (another number throws a RangeError, `ERR_FREEBOARD_STATUS`), `false`
 * refuses with 403. Undecided past `handshakeTimeout`: 503; past `maxPendingUpgrades`
 * waiting at once: 503 at once.
 */
export type Decide = (answer?: boolean | number, options?: { protocol?: string }) => void;

export interface Reach {
  /** Subscribers whose send queue took the message. */
  delivered: number;
  /** Subscribers whose slow-consumer policy dropped it (counted). */
  dropped: number;
}

export declare class WebSocket extends EventEmitter {
  static readonly CONNECTING: 0;
  static readonly OPEN: 1;
  static readonly CLOSING: 2;
  static readonly CLOSED: 3;
  readonly readyState: 0 | 1 | 2 | 3;
  readonly remoteAddress: string;
  readonly remotePort: number;
  /** The connection's id, for the server's id API. */
  readonly id: ConnectionId;
  /** Unsent bytes in the connection's queue. */
  readonly bufferedAmount: number;
  send(data: string | Buffer | ArrayBuffer | ArrayBufferView, options?: { binary?: boolean },
    callback?: (error: Error | null, outcome: SendOutcome) => void): SendOutcome;
  send(data: string | Buffer | ArrayBuffer | ArrayBufferView,
    callback: (error: Error | null, outcome: SendOutcome) => void): SendOutcome;
  /** Throws a RangeError (`ERR_FREEBOARD_CLOSE_CODE`) for a code no endpoint may send. */
  close(code?: number, reason?: string): void;
  /** Stops reading the connection (the peer meets TCP's flow control) until `resume()`. */
  pause(): void;
  resume(): void;
  readonly isPaused: boolean;
  /**
   * `true` if newly subscribed; throws once closed (`ERR_FREEBOARD_CLOSED`), when the topic
   * budget is spent (`ERR_FREEBOARD_NO_MEMORY`), for an invalid name (a TypeError,
   * `ERR_FREEBOARD_TOPIC_NAME`) or past a topic limit (`ERR_FREEBOARD_TOO_MANY_TOPICS`).
   * With `since` (a history topic), what was missed after that offset comes first, or 4410.
   */
  subscribe(topic: string, options?: { since?: string }): boolean;
  unsubscribe(topic: string): boolean;

  /** `data` is valid during the call and after it: it is a view of the turn's batch. */
  on(event: 'message', listener: (data: Buffer, isBinary: boolean) => void | Promise<void>): this;
  on(event: 'drain', listener: () => void): this;
  on(event: 'close', listener: (code: number, reason: Buffer) => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
}

export declare class Server extends EventEmitter {
  constructor(options?: ServerOptions, callback?: () => void);
  /** Open connections (a new Set at each read). */
  readonly clients: Set<WebSocket>;
  /**
   * Listener and handler throws and rejections: each closed its connection with 1011 (an
   * upgrade listener's refused the upgrade with 500; one with no connection left, as a
   * 'close' listener's, only logged). None ends the process.
   */
  readonly handlerErrors: number;
  address(): { address: string; family: 'IPv4' | 'IPv6'; port: number };
  /** Framed once, queued by reference to every subscriber of `topic`. */
  publish(topic: string, data: string | Buffer | ArrayBuffer | ArrayBufferView,
    options?: { binary?: boolean }): Reach;
  /** The engine's metrics, as OpenMetrics text. */
  metrics(): string;

  /** Sends to connection `id`: what the session decided ('closed' once it has gone). */
  send(id: ConnectionId, data: string | Buffer | ArrayBuffer | ArrayBufferView,
    options?: { binary?: boolean }): SendOutcome;
  /**
   * Starts the close handshake of `id` (1000 by default); `false` once it has gone. Throws
   * as `ws.close` for a code no endpoint may send.
   */
  end(id: ConnectionId, code?: number, reason?: string): boolean;
  /** As `ws.subscribe`; throws `ERR_FREEBOARD_CLOSED` once `id` has gone. */
  subscribe(id: ConnectionId, topic: string, options?: { since?: string }): boolean;
  unsubscribe(id: ConnectionId, topic: string): boolean;
  /** Unsent bytes of `id` (0 once it has gone). */
  bufferedAmount(id: ConnectionId): number;
  /** Stops reading `id` until `resume(id)`; `false` once it has gone. */
  pause(id: ConnectionId): boolean;
  resume(id: ConnectionId): boolean;
  /** The `WebSocket` of `id`, made at the first call and kept until it closes. */
  connection(id: ConnectionId): WebSocket;
  /** Close 1001 to every connection, drain, then 'close'. */
  close(callback?: (error?: Error) => void): void;

  on(event: 'listening', listener: () => void): this;
  on(event: 'connection', listener: (ws: WebSocket, request: UpgradeRequest) => void | Promise<void>): this;
  on(event: 'upgrade', listener: (request: UpgradeRequest, decide: Decide) => void | Promise<void>): this;
  /** `at`: the connection's `WebSocket`, or its id when an id-mode handler failed. */
  on(event: 'handlerError', listener: (error: unknown, at: WebSocket | ConnectionId | null) => void): this;
  on(event: 'close', listener: () => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
}

export { Server as WebSocketServer };
export declare const OUTCOMES: readonly SendOutcome[];
