// freeboard for Node.js: a ws-like server on the freeboard engine. The engine's event loop
// runs on this thread, turned by libuv (see src/lib.rs); each turn's events arrive here in
// one batch, and every call back into the engine is synchronous and exact.
//
// Two ways to hold a connection: a `WebSocket` object each (ws's model), or its id alone
// (uWebSockets.js's model: handlers given to the server, `server.send(id, …)`), where no
// JavaScript value exists per connection until `server.connection(id)` asks for one.
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
const OPEN_ID = 5;
const STOPPED = -1;

// What the engine records for JavaScript (src/bridge.rs `interest`).
const WANT_OPEN = 1;
const WANT_HEAD = 2;
const WANT_MESSAGE = 4;
const WANT_DRAIN = 8;
const WANT_CLOSE = 16;

/** The slot argument that makes the engine find a connection by its id (src/lib.rs). */
const BY_ID = 0xffffffff;

/** The connection handlers of the id mode, given with the options. */
const HANDLERS = ['open', 'message', 'drain', 'close'];
const NO_HANDLERS = { open: null, message: null, drain: null, close: null };

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
const OWN = new Set(['port', 'host', 'path', 'protocols', 'handleProtocols', ...HANDLERS]);

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

/** What a negative answer of the native `subscribe` means (-1 first). */
const SUBSCRIBE_REFUSALS = [
  ['ERR_FREEBOARD_CLOSED', ''],
  ['ERR_FREEBOARD_NO_MEMORY', 'freeboard: the memory budget for topic subscriptions is spent'],
  ['ERR_FREEBOARD_TOPIC_NAME', 'freeboard: a topic name is 1 to 128 of A-Z a-z 0-9 - . _ ~ :'],
  ['ERR_FREEBOARD_TOO_MANY_TOPICS', 'freeboard: too many topics for one connection'],
  ['ERR_FREEBOARD_TOO_MANY_TOPICS', 'freeboard: too many topics on this server'],
];

/** The error of a close code no endpoint may send (the native `close` answered -1). */
function closeCodeError(code) {
  const error = new RangeError(
    `freeboard: close code ${code} cannot be sent (1000-1003, 1007-1014 or 3000-4999)`);
  error.code = 'ERR_FREEBOARD_CLOSE_CODE';
  return error;
}

function closedError(what) {
  const error = new Error(`freeboard: ${what} is closed`);
  error.code = 'ERR_FREEBOARD_CLOSED';
  return error;
}

/** Sends `data` to `(slot, serial)` (`slot` BY_ID: by id); the outcome's number. */
function sendTo(native, slot, serial, data, options) {
  if (typeof data === 'string') {
    return options && options.binary
      ? native.send(slot, serial, Buffer.from(data), true)
      : native.sendText(slot, serial, data);
  }
  const bytes = ArrayBuffer.isView(data)
    ? (data instanceof Uint8Array ? data : new Uint8Array(data.buffer, data.byteOffset, data.byteLength))
    : new Uint8Array(data);
  return native.send(slot, serial, bytes, !options || options.binary !== false);
}

/**
 * Subscribes `(slot, serial)` to `topic`, with the history's catch-up when `options.since`
 * is given; `close(code, reason)` closes the connection when the history cannot catch it up.
 */
function subscribeTo(server, slot, serial, topic, options, close) {
  topic = String(topic);
  const answer = server._native.subscribe(slot, serial, topic);
  if (answer < 0) {
    const [code, message] = SUBSCRIBE_REFUSALS[-answer - 1];
    if (code === 'ERR_FREEBOARD_CLOSED') throw closedError('WebSocket');
    const error = code === 'ERR_FREEBOARD_TOPIC_NAME' ? new TypeError(message) : new Error(message);
    error.code = code;
    throw error;
  }
  if (options && options.since !== undefined) {
    // What it missed after `since`, in order, before the live stream; if the history no
    // longer holds all of it, 4410 and the client starts afresh (as freeboard serve).
    if (!server._native.recover(slot, serial, topic, String(options.since))) {
      close(4410, 'history gone');
      return false;
    }
    server._scheduleFlush();
  }
  return answer === 1;
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
    // The listener table is made by the first `on` (EventEmitter makes it when `_events` is
    // undefined, as for an emitter never initialised): a connection nobody listens to, such
    // as a subscriber the server only publishes to, does not keep an empty dictionary.
    this._events = undefined;
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
    const outcome = this.readyState === OPEN_STATE
      ? sendTo(server._native, this._slot, this._serial, data, options)
      : 4;
    server._scheduleFlush();
    const name = OUTCOMES[outcome];
    if (callback) {
      const error = outcome === 4 ? closedError('WebSocket') : null;
      queueMicrotask(() => {
        try {
          callback(error, name);
        } catch (thrown) {
          server._handlerFailed(this, thrown);
        }
      });
    }
    return name;
  }

  /**
   * Starts the close handshake (1000 unless `code` says otherwise); 'close' follows. Throws
   * a RangeError (`ERR_FREEBOARD_CLOSE_CODE`) for a code no endpoint may send.
   */
  close(code = 1000, reason = '') {
    if (this.readyState !== OPEN_STATE) return;
    if (this._server._native.close(this._slot, this._serial, code, String(reason)) < 0) {
      throw closeCodeError(code);
    }
    this.readyState = CLOSING;
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

  /** The connection's id: the number the server's id API (`server.send(id, …)`) takes. */
  get id() {
    return this._serial;
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
   * spent (`ERR_FREEBOARD_NO_MEMORY`: close with 1013 then), for an invalid name (a
   * TypeError, `ERR_FREEBOARD_TOPIC_NAME`), past a topic limit
   * (`ERR_FREEBOARD_TOO_MANY_TOPICS`), or once closed (`ERR_FREEBOARD_CLOSED`).
   */
  subscribe(topic, options) {
    return subscribeTo(this._server, this._slot, this._serial, topic, options,
      (code, reason) => this.close(code, reason));
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
 * decide upgrades yourself, 'handlerError' (error, ws or id), 'close'.
 *
 * With connection handlers in the options (`open`, `message`, `drain`, `close`, each taking
 * the connection's id first), connections are held by id: no `WebSocket` is made unless a
 * 'connection' listener or `connection(id)` asks for one.
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
    /** The id mode's handlers, or null (a `WebSocket` per connection). */
    this._handlers = null;
    if (HANDLERS.some((name) => options[name] !== undefined)) {
      this._handlers = {};
      for (const name of HANDLERS) {
        const handler = options[name];
        if (handler !== undefined && typeof handler !== 'function') {
          throw new TypeError(`freeboard: the '${name}' handler must be a function`);
        }
        this._handlers[name] = handler || null;
      }
    }
    /** Connections that have a `WebSocket`, by id (every open one without handlers). */
    this._conns = new Map();
    /** A `WebSocket` was made in the id mode: its events must reach JavaScript. */
    this._watching = false;
    /**
     * Handler errors (throws and rejections): each closed its connection with 1011, or
     * refused its upgrade with 500; none reaches libuv (where it would end the process).
     */
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
      if (event === 'connection') this._listenTo(1);
    });
    this.on('removeListener', (event) => {
      if (event === 'upgrade' && this.listenerCount('upgrade') === 0) {
        this._native.decideUpgrades(false);
      }
      if (event === 'connection') this._listenTo(0);
    });
    this._listenTo(0);
    if (callback) this.once('listening', callback);
    process.nextTick(() => {
      try {
        this.emit('listening');
      } catch (error) {
        this._handlerFailed(null, error);
      }
    });
  }

  /** The connections that have a `WebSocket` (a new Set each time: ws's `clients`). */
  get clients() {
    return new Set(this._conns.values());
  }

  /** `{ address, family, port }` of the listener, as `net.Server#address()`. */
  address() {
    const address = this._native.address;
    return { address, family: address.includes(':') ? 'IPv6' : 'IPv4', port: this._native.port };
  }

  /**
   * Sends `data` to connection `id` (a string as text, bytes as binary unless
   * `{ binary: false }`); the outcome, as `ws.send`'s: 'closed' once the connection has gone.
   */
  send(id, data, options) {
    const outcome = sendTo(this._native, BY_ID, id, data, options);
    this._scheduleFlush();
    return OUTCOMES[outcome];
  }

  /**
   * Starts connection `id`'s close handshake (1000 unless `code` says otherwise); its
   * 'close' follows (a second call while it closes changes nothing). `false` once the
   * connection has gone. (`close` is the server's own shutdown.)
   */
  end(id, code = 1000, reason = '') {
    const ws = this._conns.get(id);
    if (ws !== undefined) {
      if (ws.readyState !== OPEN_STATE) return false;
      ws.close(code, reason);
      return true;
    }
    const closing = this._native.close(BY_ID, id, code, String(reason));
    if (closing < 0) throw closeCodeError(code);
    this._scheduleFlush();
    return closing === 1;
  }

  /** `ws.subscribe` for connection `id`; throws `ERR_FREEBOARD_CLOSED` once it has gone. */
  subscribe(id, topic, options) {
    return subscribeTo(this, BY_ID, id, topic, options, (code, reason) => this.end(id, code, reason));
  }

  /** Unsubscribes connection `id` from `topic`; whether it was subscribed. */
  unsubscribe(id, topic) {
    return this._native.unsubscribe(BY_ID, id, String(topic));
  }

  /** Unsent bytes in connection `id`'s queue (0 once it has gone, as ws's). */
  bufferedAmount(id) {
    return Math.max(0, this._native.bufferedAmount(BY_ID, id));
  }

  /** Stops reading connection `id` until `resume(id)`; `false` if it has gone. */
  pause(id) {
    return this._native.holdInput(BY_ID, id, true);
  }

  /** Reads connection `id` again after `pause(id)`; `false` if it has gone. */
  resume(id) {
    return this._native.holdInput(BY_ID, id, false);
  }

  /**
   * The `WebSocket` of connection `id`, made now if it has none (kept until it closes; its
   * events then reach it as well as the server's handlers). Throws `ERR_FREEBOARD_CLOSED`
   * once the connection has gone.
   */
  connection(id) {
    let ws = this._conns.get(id);
    if (ws !== undefined) return ws;
    const peer = this._state === 'closed' ? null : this._native.peer(BY_ID, id);
    if (peer == null) throw closedError(`connection ${id}`);
    ws = new WebSocket(this, peer.slot, id);
    ws.remoteAddress = peer.address;
    ws.remotePort = peer.port;
    this._conns.set(id, ws);
    if (!this._watching) {
      this._watching = true;
      this._listenTo(0);
    }
    return ws;
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
        process.nextTick(() => {
          try {
            callback(closedError('server'));
          } catch (error) {
            this._handlerFailed(null, error);
          }
        });
        return;
      }
      this._closeCallbacks.push(callback);
    }
    if (this._state !== 'open') return;
    this._state = 'closing';
    this._native.shutdown();
  }

  /**
   * Tells the engine which events to record: all of them for a `WebSocket` per connection;
   * in the id mode, only those a handler or a `WebSocket` listens to, and the request head
   * only for 'connection' listeners or an `open(id, request)` that declares it. `adding`:
   * a 'connection' listener is being added (it is not counted yet).
   */
  _listenTo(adding) {
    const handlers = this._handlers;
    if (handlers === null || this._state === 'closed') return;
    const objects = this.listenerCount('connection') + adding > 0;
    const watched = objects || this._watching;
    if (objects) this._watching = true;
    let mask = 0;
    if (handlers.open !== null || objects) mask |= WANT_OPEN;
    if (objects || (handlers.open !== null && handlers.open.length > 1)) mask |= WANT_HEAD;
    if (handlers.message !== null || watched) mask |= WANT_MESSAGE;
    if (handlers.drain !== null || watched) mask |= WANT_DRAIN;
    if (handlers.close !== null || watched) mask |= WANT_CLOSE;
    this._native.listenTo(mask);
  }

  _scheduleFlush() {
    if (!this._flushQueued && !this._dispatching) {
      this._flushQueued = true;
      queueMicrotask(this._flush);
    }
  }

  /** Calls an id-mode handler; a throw or a rejection closes connection `id` with 1011. */
  _call(handler, id, a, b, c) {
    try {
      const result = handler.call(this, id, a, b, c);
      if (result && typeof result.then === 'function') {
        result.then(undefined, (error) => this._handlerFailed(id, error));
      }
    } catch (error) {
      this._handlerFailed(id, error);
    }
  }

  /** A handler of connection `target` (a `WebSocket`, an id, or null) failed. */
  _handlerFailed(target, error) {
    this.handlerErrors += 1;
    if (typeof target === 'number') this.end(target, 1011, 'handler error');
    else if (target && target.readyState === OPEN_STATE) target.close(1011, 'handler error');
    if (this.listenerCount('handlerError') > 0) {
      try {
        this.emit('handlerError', error, target);
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
    const handlers = this._handlers || NO_HANDLERS;
    let s = 0;
    const n = numbers.length;
    try {
      for (let i = 0; i < n;) {
        switch (numbers[i]) {
          case MESSAGE: {
            const id = numbers[i + 1];
            const binary = numbers[i + 2] === 1;
            const offset = numbers[i + 3];
            const data = payload.subarray(offset, offset + numbers[i + 4]);
            i += 5;
            if (handlers.message !== null) this._call(handlers.message, id, data, binary);
            const ws = this._conns.get(id);
            if (ws === undefined) break;
            try {
              ws.emit('message', data, binary);
            } catch (error) {
              this._handlerFailed(ws, error);
            }
            break;
          }
          case OPEN_ID: {
            const id = numbers[i + 1];
            i += 2;
            if (handlers.open !== null) this._call(handlers.open, id);
            break;
          }
          case OPEN: {
            const slot = numbers[i + 1];
            const id = numbers[i + 2];
            const [request, next] = this._request(numbers, i + 3, strings, s);
            i += 4;
            s = next;
            if (handlers.open !== null) this._call(handlers.open, id, request);
            if (this._handlers !== null && this.listenerCount('connection') === 0) break;
            const ws = new WebSocket(this, slot, id);
            ws.remoteAddress = request.socket.remoteAddress;
            ws.remotePort = request.socket.remotePort;
            this._conns.set(id, ws);
            try {
              this.emit('connection', ws, request);
            } catch (error) {
              this._handlerFailed(ws, error);
            }
            break;
          }
          case DRAIN: {
            const id = numbers[i + 1];
            i += 2;
            if (handlers.drain !== null) this._call(handlers.drain, id);
            const ws = this._conns.get(id);
            if (ws === undefined) break;
            try {
              ws.emit('drain');
            } catch (error) {
              this._handlerFailed(ws, error);
            }
            break;
          }
          case CLOSE: {
            const id = numbers[i + 1];
            const code = numbers[i + 2];
            const reason = strings[s];
            i += 3;
            s += 1;
            if (handlers.close !== null) this._call(handlers.close, id, code, Buffer.from(reason));
            const ws = this._conns.get(id);
            if (ws === undefined) break;
            this._conns.delete(id);
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
      let status = 101;
      if (answer === false) status = 403;
      else if (typeof answer === 'number') status = answer;
      if (status !== 101 && !(Number.isInteger(status) && status >= 400 && status <= 599)) {
        // (A throw from the listener refuses with 500 and counts it, below.)
        const error = new RangeError(
          `freeboard: decide takes true, false or a 4xx or 5xx status, not ${answer}`);
        error.code = 'ERR_FREEBOARD_STATUS';
        throw error;
      }
      decided = true;
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
    // What these throw has no connection left to close: counted and logged as a handler's
    // error, never thrown into libuv's callback (where it would end the process).
    for (const callback of callbacks) {
      try {
        callback();
      } catch (error) {
        this._handlerFailed(null, error);
      }
    }
    try {
      this.emit('close');
    } catch (error) {
      this._handlerFailed(null, error);
    }
  }
}

/** The last resort for a listener rejection on the server itself ('connection'). */
Server.prototype[Symbol.for('nodejs.rejection')] = function (error, event, ws) {
  this._handlerFailed(event === 'connection' ? ws : null, error);
};

module.exports = { Server, WebSocketServer: Server, WebSocket, OUTCOMES };
