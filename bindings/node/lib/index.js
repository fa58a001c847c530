// freeboard for Node.js: a ws-like server on the freeboard engine. The engine's event loop
// runs on this thread, turned by libuv (see src/lib.rs); each turn's events arrive here in
// one batch, and every call back into the engine is synchronous and exact.
'use strict';

const { EventEmitter } = require('node:events');
const path = require('node:path');
const { NativeServer } = require(path.join(__dirname, '..', 'freeboard.node'));

/** What `send` answers (the native numbers, in order). */
const OUTCOMES = ['queued', 'above-high', 'dropped', 'blocked', 'closed'];

// Event codes of a batch (src/bridge.rs).
const OPEN = 0;
const MESSAGE = 1;
const DRAIN = 2;
const CLOSE = 3;
const UPGRADE = 4;
const STOPPED = -1;

const CONNECTING = 0;
const OPEN_STATE = 1;
const CLOSING = 2;
const CLOSED = 3;

/** ws-style option names and the freeboard settings they set. */
const ALIASES = {
  maxPayload: 'max_message_size',
  maxMessageSize: 'max_message_size',
  highWatermark: 'send_high',
  lowWatermark: 'send_low',
  maxBackpressure: 'send_cap',
  slowConsumer: 'slow_consumer',
};
/** Options the JavaScript side reads itself. */
const OWN = new Set(['port', 'host', 'path', 'protocols', 'handleProtocols']);

function snake(key) {
  return key.replace(/[A-Z]/g, (c) => '_' + c.toLowerCase());
}

/** A duration in milliseconds (a number) becomes freeboard's text; text passes as is. */
function settings(options) {
  const out = {};
  for (const [key, value] of Object.entries(options)) {
    if (OWN.has(key) || value === undefined) continue;
    // (null turns a timeout off; for other settings it means the default)
    const name = ALIASES[key] || snake(key);
    if (value === null && /_timeout$/.test(name)) {
      out[name] = '0s'; // no timer
    } else if (typeof value === 'number' && /_timeout$|retry_after/.test(name)) {
      out[name] = `${value}ms`;
    } else if (value !== null && typeof value === 'object' && !Array.isArray(value)) {
      out[name] = settings(value);
    } else {
      out[name] = value;
    }
  }
  return out;
}

function closedError(what) {
  const error = new Error(`freeboard: ${what} is closed`);
  error.code = 'ERR_FREEBOARD_CLOSED';
  return error;
}

/**
 * An upgrade request as far as a WebSocket server sees it: `url`, `headers` (lower-case
 * names; parsed at first use), `socket.remoteAddress`/`remotePort`, `method`.
 */
class UpgradeRequest {
  constructor(url, address, port, rawHeaders) {
    this.url = url;
    this.method = 'GET';
    this.socket = { remoteAddress: address, remotePort: port };
    this._raw = rawHeaders;
    this._headers = null;
  }

  get headers() {
    if (this._headers === null) {
      // No prototype, as Node's own: a header named `__proto__` or `constructor` is data.
      const headers = Object.create(null);
      const parts = this._raw.split('\n');
      for (let h = 0; h + 1 < parts.length; h += 2) {
        const name = parts[h];
        headers[name] = name in headers ? `${headers[name]}, ${parts[h + 1]}` : parts[h + 1];
      }
      this._headers = headers;
      this._raw = '';
    }
    return this._headers;
  }
}

/**
 * One WebSocket connection of a `Server`. Its methods call the engine at once: `send` says
 * what the session did with the message.
 */
class WebSocket extends EventEmitter {
  constructor(server, slot, serial) {
    // A rejected promise from an async listener is a handler error, as a throw is.
    super({ captureRejections: true });
    this._server = server;
    this._slot = slot;
    this._serial = serial;
    this.readyState = OPEN_STATE;
    /** Whether `pause()` stopped reading it. */
    this.isPaused = false;
    /** The client's address and port (the forwarded ones behind a trusted proxy). */
    this.remoteAddress = '';
    this.remotePort = 0;
  }

  /**
   * Sends `data`: a string as text, a Buffer/TypedArray/ArrayBuffer as binary (or as text
   * with `{ binary: false }`: the bytes must be UTF-8). Returns what the session decided:
   * 'queued', 'above-high' (queued, the queue is above its high watermark: pause until
   * 'drain'), 'dropped' (the slow-consumer policy dropped it or older messages: counted),
   * 'blocked' (not queued: the `block` policy's cap, or the memory budget is short; retry
   * after 'drain') or 'closed'.
   */
  send(data, options, callback) {
    if (typeof options === 'function') {
      callback = options;
      options = undefined;
    }
    const server = this._server;
    let outcome;
    if (this.readyState !== OPEN_STATE) {
      outcome = 4;
    } else if (typeof data === 'string') {
      outcome = options && options.binary
        ? server._native.send(this._slot, this._serial, Buffer.from(data), true)
        : server._native.sendText(this._slot, this._serial, data);
    } else {
      const bytes = ArrayBuffer.isView(data)
        ? (data instanceof Uint8Array ? data : new Uint8Array(data.buffer, data.byteOffset, data.byteLength))
        : new Uint8Array(data);
      const binary = !options || options.binary !== false;
      outcome = server._native.send(this._slot, this._serial, bytes, binary);
    }
    server._scheduleFlush();
    const name = OUTCOMES[outcome];
    if (callback) {
      const error = outcome === 4 ? closedError('WebSocket') : null;
      queueMicrotask(() => callback(error, name));
    }
    return name;
  }

  /** Starts the close handshake (1000 unless `code` says otherwise); 'close' follows. */
  close(code = 1000, reason = '') {
    if (this.readyState !== OPEN_STATE) return;
    this.readyState = CLOSING;
    this._server._native.close(this._slot, this._serial, code, String(reason));
    this._server._scheduleFlush();
  }

  /**
   * Stops reading the connection: its messages wait in the socket (the peer meets TCP's flow
   * control) until `resume()`. Messages already read in this turn still arrive.
   */
  pause() {
    if (this.readyState !== OPEN_STATE || this.isPaused) return;
    this.isPaused = this._server._native.holdInput(this._slot, this._serial, true);
  }

  /** Reads the connection again after `pause()`. */
  resume() {
    if (!this.isPaused) return;
    this.isPaused = false;
    this._server._native.holdInput(this._slot, this._serial, false);
  }

  /** Unsent bytes in the connection's queue (0 once closed). */
  get bufferedAmount() {
    if (this.readyState === CLOSED) return 0;
    return Math.max(0, this._server._native.bufferedAmount(this._slot, this._serial));
  }

  /**
   * Subscribes to `topic`: `server.publish(topic, …)` reaches this connection, framed once
   * for all subscribers. `true` if newly subscribed, `false` if it already was. With
   * `{ since: offset }` (a topic with history: the `topics.history` setting), what it missed
   * after that offset is sent first; if the history no longer holds it all, the connection
   * is closed 4410 and `false` returned. Throws when the memory budget for topic tables is
   * spent (close with 1013 then), or once closed.
   */
  subscribe(topic, options) {
    topic = String(topic);
    const answer = this._server._native.subscribe(this._slot, this._serial, topic);
    if (answer === -1) throw closedError('WebSocket');
    if (answer === -2) {
      const error = new Error('freeboard: the memory budget for topic subscriptions is spent');
      error.code = 'ERR_FREEBOARD_NO_MEMORY';
      throw error;
    }
    if (options && options.since !== undefined) {
      // What it missed after `since`, in order, before the live stream; if the history no
      // longer holds all of it, 4410 and the client starts afresh (as freeboard serve).
      if (!this._server._native.recover(this._slot, this._serial, topic, String(options.since))) {
        this.close(4410, 'history gone');
        return false;
      }
      this._server._scheduleFlush();
    }
    return answer === 1;
  }

  /** Unsubscribes from `topic`; whether it was subscribed. */
  unsubscribe(topic) {
    return this._server._native.unsubscribe(this._slot, this._serial, String(topic));
  }

  [Symbol.for('nodejs.rejection')](error) {
    this._server._handlerFailed(this, error);
  }
}
WebSocket.CONNECTING = CONNECTING;
WebSocket.OPEN = OPEN_STATE;
WebSocket.CLOSING = CLOSING;
WebSocket.CLOSED = CLOSED;

/**
 * A WebSocket server on the freeboard engine, shaped like ws's `WebSocketServer`.
 *
 * Events: 'listening', 'connection' (ws, request), 'upgrade' (request, decide) when you
 * decide upgrades yourself, 'handlerError' (error, ws), 'close'.
 */
class Server extends EventEmitter {
  constructor(options = {}, callback) {
    super({ captureRejections: true });
    const host = options.host || '0.0.0.0';
    const port = options.port === undefined ? 0 : options.port;
    const config = settings(options);
    config.listen = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
    this._protocols = (options.protocols || []).map(String);
    this._native = new NativeServer(
      JSON.stringify(config),
      options.path || '',
      this._protocols,
      (numbers, payload, strings) => this._onEvents(numbers, payload, strings),
    );
    /** Open connections, by serial. */
    this._conns = new Map();
    /** Handler errors (throws and rejections): each closed its connection with 1011. */
    this.handlerErrors = 0;
    this._flushQueued = false;
    this._dispatching = false;
    this._state = 'open';
    this._closeCallbacks = [];
    this._flush = () => {
      this._flushQueued = false;
      if (this._state !== 'closed') this._native.flush();
    };
    this.on('newListener', (event) => {
      if (event === 'upgrade') this._native.decideUpgrades(true);
    });
    this.on('removeListener', (event) => {
      if (event === 'upgrade' && this.listenerCount('upgrade') === 0) {
        this._native.decideUpgrades(false);
      }
    });
    if (callback) this.once('listening', callback);
    process.nextTick(() => this.emit('listening'));
  }

  /** The open connections (a new Set each time: ws's `clients`, without a second table). */
  get clients() {
    return new Set(this._conns.values());
  }

  /** `{ address, family, port }` of the listener, as `net.Server#address()`. */
  address() {
    const address = this._native.address;
    return { address, family: address.includes(':') ? 'IPv6' : 'IPv4', port: this._native.port };
  }

  /**
   * Publishes `data` to every subscriber of `topic`, framed once and queued by reference
   * (a string as text, bytes as binary unless `{ binary: false }`). Returns what it
   * reached: `{ delivered, dropped }` (dropped by subscribers' slow-consumer policies,
   * counted).
   */
  publish(topic, data, options) {
    if (this._state !== 'open') throw closedError('server');
    let reach;
    if (typeof data === 'string') {
      reach = this._native.publishText(String(topic), data);
    } else {
      const bytes = ArrayBuffer.isView(data)
        ? (data instanceof Uint8Array ? data : new Uint8Array(data.buffer, data.byteOffset, data.byteLength))
        : new Uint8Array(data);
      reach = this._native.publish(String(topic), bytes, !options || options.binary !== false);
    }
    this._scheduleFlush();
    return { delivered: reach[0], dropped: reach[1] };
  }

  /** The engine's metrics (budget, pool, drops by policy, closes…) as OpenMetrics text. */
  metrics() {
    if (this._state === 'closed') throw closedError('server');
    return this._native.metrics();
  }

  /**
   * Stops accepting, closes every connection with 1001 and waits for them (at most the
   * drain timeout); then 'close' and `callback`.
   */
  close(callback) {
    if (callback) {
      if (this._state === 'closed') {
        process.nextTick(callback, closedError('server'));
        return;
      }
      this._closeCallbacks.push(callback);
    }
    if (this._state !== 'open') return;
    this._state = 'closing';
    this._native.shutdown();
  }

  _scheduleFlush() {
    if (!this._flushQueued && !this._dispatching) {
      this._flushQueued = true;
      queueMicrotask(this._flush);
    }
  }

  _handlerFailed(ws, error) {
    this.handlerErrors += 1;
    if (ws && ws.readyState === OPEN_STATE) ws.close(1011, 'handler error');
    if (this.listenerCount('handlerError') > 0) {
      try {
        this.emit('handlerError', error, ws);
        return;
      } catch (again) {
        error = again;
      }
    }
    console.error('freeboard: a handler threw; its connection is closed with 1011:', error);
  }

  _request(numbers, i, strings, s) {
    return [new UpgradeRequest(strings[s], strings[s + 1], numbers[i], strings[s + 2]), s + 3];
  }

  _onEvents(numbers, payload, strings) {
    this._dispatching = true;
    let s = 0;
    const n = numbers.length;
    try {
      for (let i = 0; i < n;) {
        switch (numbers[i]) {
          case MESSAGE: {
            const ws = this._conns.get(numbers[i + 1]);
            const binary = numbers[i + 2] === 1;
            const offset = numbers[i + 3];
            const length = numbers[i + 4];
            i += 5;
            if (ws === undefined) break;
            try {
              ws.emit('message', payload.subarray(offset, offset + length), binary);
            } catch (error) {
              this._handlerFailed(ws, error);
            }
            break;
          }
          case OPEN: {
            const ws = new WebSocket(this, numbers[i + 1], numbers[i + 2]);
            const [request, next] = this._request(numbers, i + 3, strings, s);
            i += 4;
            s = next;
            ws.remoteAddress = request.socket.remoteAddress;
            ws.remotePort = request.socket.remotePort;
            this._conns.set(ws._serial, ws);
            try {
              this.emit('connection', ws, request);
            } catch (error) {
              this._handlerFailed(ws, error);
            }
            break;
          }
          case DRAIN: {
            const ws = this._conns.get(numbers[i + 1]);
            i += 2;
            if (ws === undefined) break;
            try {
              ws.emit('drain');
            } catch (error) {
              this._handlerFailed(ws, error);
            }
            break;
          }
          case CLOSE: {
            const ws = this._conns.get(numbers[i + 1]);
            const code = numbers[i + 2];
            const reason = strings[s];
            i += 3;
            s += 1;
            if (ws === undefined) break;
            this._conns.delete(ws._serial);
            ws.readyState = CLOSED;
            try {
              ws.emit('close', code, Buffer.from(reason));
            } catch (error) {
              this._handlerFailed(null, error);
            }
            break;
          }
          case UPGRADE: {
            const id = numbers[i + 1];
            const [request, next] = this._request(numbers, i + 2, strings, s);
            i += 3;
            s = next;
            this._upgrade(id, request);
            break;
          }
          case STOPPED:
            i += 1;
            this._stopped();
            break;
          default:
            throw new Error(`freeboard: unknown event ${numbers[i]}`);
        }
      }
    } finally {
      this._dispatching = false;
    }
  }

  /** Hands an upgrade request to the 'upgrade' listeners with its `decide` function. */
  _upgrade(id, request) {
    let decided = false;
    const decide = (answer = true, options) => {
      if (decided || this._state === 'closed') return;
      decided = true;
      let status = 101;
      if (answer === false) status = 403;
      else if (typeof answer === 'number') status = answer;
      let protocol = -1;
      if (status === 101 && options && options.protocol !== undefined) {
        protocol = this._protocols.indexOf(options.protocol);
        if (protocol < 0) status = 500;
      }
      this._native.decide(id, status, protocol);
    };
    try {
      const listeners = this.listeners('upgrade');
      for (const listener of listeners) {
        const result = listener.call(this, request, decide);
        if (result && typeof result.then === 'function') {
          result.then(undefined, (error) => {
            this.handlerErrors += 1;
            decide(500);
            console.error('freeboard: an upgrade listener failed; refused with 500:', error);
          });
        }
      }
    } catch (error) {
      this.handlerErrors += 1;
      decide(500);
      console.error('freeboard: an upgrade listener threw; refused with 500:', error);
    }
  }

  _stopped() {
    this._state = 'closed';
    for (const ws of this._conns.values()) {
      ws.readyState = CLOSED;
    }
    this._conns.clear();
    const callbacks = this._closeCallbacks;
    this._closeCallbacks = [];
    for (const callback of callbacks) callback();
    this.emit('close');
  }
}

/** The last resort for a listener rejection on the server itself ('connection'). */
Server.prototype[Symbol.for('nodejs.rejection')] = function (error, event, ws) {
  this._handlerFailed(event === 'connection' ? ws : null, error);
};

module.exports = { Server, WebSocketServer: Server, WebSocket, OUTCOMES };
