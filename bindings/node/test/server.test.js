// The Node binding against real sockets on 127.0.0.1, with ws as the client.
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { once } = require('node:events');
const WS = require('ws');
const { listen, url, connect, stop } = require('./support');

/** A client and the server's side of its connection. */
async function pair(server, path) {
  const [[ws], client] = await Promise.all([once(server, 'connection'), connect(server, path)]);
  return [client, ws];
}

/** The next message a client receives, as [data, isBinary]. */
function nextMessage(client) {
  return once(client, 'message');
}

test('echoes text and binary with their kind, and send says queued', async () => {
  const server = await listen();
  const outcomes = [];
  server.on('connection', (ws) => {
    ws.on('message', (data, isBinary) => outcomes.push(ws.send(data, { binary: isBinary })));
  });
  const client = await connect(server);
  client.send('hello');
  const [text, textIsBinary] = await nextMessage(client);
  assert.equal(text.toString(), 'hello');
  assert.equal(textIsBinary, false);
  client.send(Buffer.from([0, 1, 2, 255]));
  const [bytes, bytesIsBinary] = await nextMessage(client);
  assert.deepEqual([...bytes], [0, 1, 2, 255]);
  assert.equal(bytesIsBinary, true);
  assert.deepEqual(outcomes, ['queued', 'queued']);
  client.close();
  await once(client, 'close');
  await stop(server);
});

test('a WebSocket nobody listens to yet is an EventEmitter as any other', async () => {
  const server = await listen();
  const [client, ws] = await pair(server);
  // (Its listener table is made at the first `on`.)
  assert.deepEqual(ws.eventNames(), []);
  assert.equal(ws.listenerCount('message'), 0);
  assert.equal(ws.emit('message', Buffer.from('x'), false), false);
  ws.removeAllListeners('message');
  const heard = once(ws, 'message');
  assert.equal(ws.listenerCount('message'), 1);
  client.send('now');
  assert.equal((await heard)[0].toString(), 'now');
  assert.equal(ws.listenerCount('message'), 0);
  const closed = once(ws, 'close');
  client.close(4005);
  assert.equal((await closed)[0], 4005);
  await stop(server);
});

test('messages of one read arrive in order, each a Buffer of its own bytes, a turn\'s in one batch', async () => {
  const server = await listen();
  const received = [];
  const batches = new Set();
  server.on('connection', (ws) => ws.on('message', (data) => {
    received.push(data.toString());
    // Each message is a view of its turn's batch: one memory crossed for many messages.
    assert.ok(data.buffer.byteLength >= data.length);
    batches.add(data.buffer);
  }));
  const client = await connect(server);
  const sent = [];
  for (let i = 0; i < 500; i++) {
    sent.push(`message ${i}`);
    client.send(`message ${i}`);
  }
  while (received.length < sent.length) await new Promise((r) => setTimeout(r, 5));
  assert.deepEqual(received, sent);
  // The client wrote them all before this thread let the server read: a few turns at most.
  assert.ok(batches.size <= 10, `${batches.size} batches for 500 messages`);
  client.close();
  await stop(server);
});

test('the connection event carries the request; close(code, reason) reaches the client', async () => {
  const server = await listen();
  let request;
  const closed = new Promise((resolve) => {
    server.on('connection', (ws, req) => {
      request = req;
      ws.on('close', (code, reason) => resolve([code, reason.toString()]));
      ws.close(4000, 'done here');
    });
  });
  const client = new WS(url(server, '/room?id=7'), { headers: { 'x-user': 'ada', constructor: 'data' } });
  const [code, reason] = await once(client, 'close');
  assert.equal(code, 4000);
  assert.equal(reason.toString(), 'done here');
  assert.deepEqual(await closed, [4000, 'done here']);
  assert.equal(request.url, '/room?id=7');
  assert.equal(request.headers['x-user'], 'ada');
  assert.equal(request.headers.constructor, 'data'); // a header, not the prototype's
  assert.equal(request.socket.remoteAddress, '127.0.0.1');
  await stop(server);
});

test('a slow reader: above-high, then drain once it reads; bufferedAmount follows', async () => {
  const server = await listen({ lowWatermark: '16K', highWatermark: '64K', maxBackpressure: '8M' });
  const [client, ws] = await pair(server);
  client._socket.pause(); // stop reading: the server's queue fills once the kernel's does
  const chunk = Buffer.alloc(16 << 10, 7);
  let outcome;
  let sent = 0;
  // Loopback's kernel buffers take a few MiB before the queue holds anything.
  for (; sent < 2000; sent++) {
    outcome = ws.send(chunk);
    if (outcome === 'above-high') break;
    await new Promise((r) => setImmediate(r));
  }
  assert.equal(outcome, 'above-high');
  assert.ok(ws.bufferedAmount > 64 << 10, `bufferedAmount ${ws.bufferedAmount}`);
  const drained = once(ws, 'drain');
  let bytes = 0;
  client.on('message', (data) => {
    bytes += data.length;
  });
  client._socket.resume();
  await drained;
  assert.ok(ws.bufferedAmount <= 16 << 10);
  while (bytes < (sent + 1) * chunk.length) await new Promise((r) => setTimeout(r, 5));
  client.close();
  await stop(server);
});

test('drop-newest: past the cap sends are dropped and counted, nothing silently', async () => {
  const server = await listen({
    slowConsumer: 'drop-newest', lowWatermark: '16K', highWatermark: '32K', maxBackpressure: '64K',
  });
  const [client, ws] = await pair(server);
  client._socket.pause();
  const chunk = Buffer.alloc(8 << 10, 1);
  const counts = {};
  for (let i = 0; i < 400; i++) {
    const outcome = ws.send(chunk);
    counts[outcome] = (counts[outcome] || 0) + 1;
    if (i % 8 === 7) await new Promise((r) => setImmediate(r));
  }
  assert.ok(counts.dropped > 0, JSON.stringify(counts));
  assert.equal(counts.closed, undefined);
  // Every drop the sends reported is in the server's counter.
  await new Promise((r) => setImmediate(r));
  const line = server.metrics().split('\n')
    .find((l) => l.startsWith('freeboard_drops_total{reason="drop-newest"}'));
  assert.ok(line, 'a drop counter');
  assert.equal(Number(line.split(' ').pop()), counts.dropped);
  client.terminate();
  await stop(server);
});

test('topics: publish is framed once and says what it reached', async () => {
  const server = await listen();
  server.on('connection', (ws, request) => {
    if (request.url === '/match') assert.equal(ws.subscribe('match'), true);
  });
  const fans = [await connect(server, '/match'), await connect(server, '/match')];
  const other = await connect(server, '/other');
  let otherGot = 0;
  other.on('message', () => otherGot++);
  while (server.clients.size < 3) await new Promise((r) => setTimeout(r, 5));
  const got = fans.map((fan) => nextMessage(fan));
  assert.deepEqual(server.publish('match', 'goal 1-0'), { delivered: 2, dropped: 0 });
  for (const [data] of await Promise.all(got)) assert.equal(data.toString(), 'goal 1-0');
  assert.deepEqual(server.publish('nobody', 'x'), { delivered: 0, dropped: 0 });
  assert.equal(otherGot, 0);
  for (const c of [...fans, other]) c.close();
  await stop(server);
});

/** The status a ws client's upgrade to `path` gets: 101, or the refusal's. */
function upgradeStatus(server, path) {
  return new Promise((resolve) => {
    const client = new WS(url(server, path));
    client.on('open', () => {
      client.close();
      resolve(101);
    });
    client.on('unexpected-response', (_, response) => resolve(response.statusCode));
    client.on('error', () => {});
  });
}

/** The value of the metrics line that starts with `name` (0 when absent). */
function metric(server, name) {
  const line = server.metrics().split('\n').find((l) => l.startsWith(name));
  return line ? Number(line.split(' ').pop()) : 0;
}

test('upgrades decided in JavaScript, later: accept, refuse, and the timeout answers 503', async () => {
  const server = await listen({ handshakeTimeout: 300 });
  server.on('upgrade', async (request, decide) => {
    await new Promise((r) => setTimeout(r, 20));
    if (request.url === '/yes') decide(true);
    else if (request.url === '/no') decide(401);
    // '/never': no answer; the runtime's handshake timeout refuses it.
  });
  assert.equal(await upgradeStatus(server, '/yes'), 101);
  assert.equal(await upgradeStatus(server, '/no'), 401);
  assert.equal(await upgradeStatus(server, '/never'), 503);
  // Counted as the Rust server counts a Decision that timed out.
  assert.equal(metric(server, 'freeboard_access_refusals_total{reason="decision_timeout"}'), 1);
  await stop(server);
});

test('past maxPendingUpgrades undecided upgrades, the next gets 503 at once; decided ones free their place', async () => {
  const server = await listen({ maxPendingUpgrades: 2, handshakeTimeout: 20000 });
  const waiting = new Map();
  server.on('upgrade', (request, decide) => {
    waiting.set(request.url, decide);
  });
  const first = upgradeStatus(server, '/first');
  const second = upgradeStatus(server, '/second');
  while (waiting.size < 2) await new Promise((r) => setTimeout(r, 5));
  // Two wait for JavaScript: a third is refused by the engine without waiting for it.
  assert.equal(await upgradeStatus(server, '/third'), 503);
  assert.equal(metric(server, 'freeboard_access_refusals_total{reason="pending_full"}'), 1);
  assert.equal(metric(server, 'freeboard_access_pending_upgrades'), 2);
  waiting.get('/first')(true);
  waiting.get('/second')(403);
  assert.equal(await first, 101);
  assert.equal(await second, 403);
  // Their places are free again.
  const fourth = upgradeStatus(server, '/fourth');
  while (!waiting.has('/fourth')) await new Promise((r) => setTimeout(r, 5));
  waiting.get('/fourth')(true);
  assert.equal(await fourth, 101);
  assert.equal(metric(server, 'freeboard_access_refusals_total{reason="pending_full"}'), 1);
  await stop(server);
});

test('an upgrade listener that throws or rejects refuses with 500, is counted, and the server goes on', async () => {
  const server = await listen();
  const logged = [];
  const error = console.error;
  console.error = (...args) => logged.push(args.join(' '));
  try {
    server.on('upgrade', (request, decide) => {
      if (request.url === '/throw') throw new Error('boom');
      if (request.url === '/reject') return Promise.reject(new Error('async boom'));
      if (request.url === '/ok-is-no-refusal') decide(200); // throws ERR_FREEBOARD_STATUS
      decide(true);
      return undefined;
    });
    assert.equal(await upgradeStatus(server, '/throw'), 500);
    assert.equal(await upgradeStatus(server, '/reject'), 500);
    assert.equal(await upgradeStatus(server, '/ok-is-no-refusal'), 500);
    assert.equal(await upgradeStatus(server, '/fine'), 101);
  } finally {
    console.error = error;
  }
  assert.equal(server.handlerErrors, 3);
  assert.equal(logged.length, 3);
  assert.match(logged[2], /ERR_FREEBOARD_STATUS|4xx or 5xx/);
  await stop(server);
});

test('a listener that throws closes its connection with 1011, is counted, and the server goes on', async () => {
  const server = await listen();
  const failures = [];
  server.on('handlerError', (error) => failures.push(error.message));
  server.on('connection', (ws, request) => {
    if (request.url === '/connection-throws') throw new Error('in connection');
    ws.on('message', (data) => {
      if (data.toString() === 'throw') throw new Error('boom');
      if (data.toString() === 'reject') return Promise.reject(new Error('async boom'));
      if (data.toString() === 'callback') {
        ws.send(data, () => {
          throw new Error('in a send callback');
        });
        return undefined;
      }
      ws.send(data);
      return undefined;
    });
    ws.on('message', async () => {});
    if (request.url === '/close-throws') {
      ws.on('close', () => {
        throw new Error('in close');
      });
    }
  });
  const poisons = [['/', 'throw'], ['/', 'reject'], ['/connection-throws', null], ['/', 'callback']];
  for (const [path, poison] of poisons) {
    const client = new WS(url(server, path));
    if (poison) client.on('open', () => client.send(poison));
    const [code] = await once(client, 'close');
    assert.equal(code, 1011, `${path} ${poison}`);
  }
  // A 'close' listener that throws: nothing left to close; counted, the server goes on.
  const leaving = await connect(server, '/close-throws');
  leaving.close();
  await once(leaving, 'close');
  while (failures.length < 5) await new Promise((r) => setTimeout(r, 5));
  assert.equal(server.handlerErrors, 5);
  assert.deepEqual(failures, ['boom', 'async boom', 'in connection', 'in a send callback', 'in close']);
  const client = await connect(server);
  client.send('still here');
  const [data] = await nextMessage(client);
  assert.equal(data.toString(), 'still here');
  client.close();
  // Even what the server's own 'close' throws is only counted: the process goes on.
  server.on('close', () => {
    throw new Error('in the server close');
  });
  await new Promise((resolve) => server.close(resolve));
  assert.equal(server.handlerErrors, 6);
  assert.equal(failures[5], 'in the server close');
  // And a callback of a closed server's close.
  server.close(() => {
    throw new Error('in a late close callback');
  });
  while (failures.length < 7) await new Promise((r) => setTimeout(r, 5));
  assert.equal(failures[6], 'in a late close callback');
});

test('close() sends 1001 to everyone, drains, and the server refuses use after it', async () => {
  const server = await listen();
  const clients = [await connect(server), await connect(server)];
  while (server.clients.size < 2) await new Promise((r) => setTimeout(r, 5));
  const kept = [...server.clients];
  const codes = clients.map((c) => once(c, 'close'));
  const closed = once(server, 'close');
  server.close();
  for (const [code] of await Promise.all(codes)) assert.equal(code, 1001);
  await closed;
  assert.equal(server.clients.size, 0);
  assert.throws(() => server.publish('t', 'x'), { code: 'ERR_FREEBOARD_CLOSED' });
  assert.throws(() => server.metrics(), { code: 'ERR_FREEBOARD_CLOSED' });
  // Its connections say so too: closed.
  for (const ws of kept) {
    assert.equal(ws.readyState, WS.CLOSED);
    assert.equal(ws.send('late'), 'closed');
    assert.throws(() => ws.subscribe('t'), { code: 'ERR_FREEBOARD_CLOSED' });
    assert.equal(server.send(ws.id, 'late'), 'closed');
    assert.throws(() => server.subscribe(ws.id, 't'), { code: 'ERR_FREEBOARD_CLOSED' });
    assert.equal(ws.bufferedAmount, 0);
  }
  await new Promise((resolve) => server.close((error) => {
    assert.equal(error.code, 'ERR_FREEBOARD_CLOSED');
    resolve();
  }));
});

test('a message past maxMessageSize closes 1009; send on a closed socket says closed', async () => {
  const server = await listen({ maxMessageSize: '1K' });
  const [ws] = await Promise.all([
    once(server, 'connection').then(([ws]) => ws),
    (async () => {
      const client = await connect(server);
      client.send(Buffer.alloc(4096));
      const [code] = await once(client, 'close');
      assert.equal(code, 1009);
    })(),
  ]);
  while (ws.readyState !== 3) await new Promise((r) => setTimeout(r, 5));
  assert.equal(ws.send('late'), 'closed');
  assert.throws(() => ws.subscribe('t'), { code: 'ERR_FREEBOARD_CLOSED' });
  await stop(server);
});

test('misuse is a clear error: a close code no endpoint may send, a topic the server refuses', async () => {
  const server = await listen({ topics: { maxTopicsPerConnection: 2 } });
  const [client, ws] = await pair(server);
  // RFC 6455 §7.4.1: 1005 and 1006 are never sent; 1004 is reserved; past 4999 is no code.
  for (const code of [1005, 1006, 1004, 999, 5000, 70000]) {
    assert.throws(() => ws.close(code), { name: 'RangeError', code: 'ERR_FREEBOARD_CLOSE_CODE' });
    assert.throws(() => server.end(ws.id, code), { code: 'ERR_FREEBOARD_CLOSE_CODE' });
  }
  assert.equal(ws.readyState, WS.OPEN); // nothing was started
  assert.throws(() => ws.subscribe('no spaces'), { name: 'TypeError', code: 'ERR_FREEBOARD_TOPIC_NAME' });
  assert.throws(() => ws.subscribe('x'.repeat(129)), { code: 'ERR_FREEBOARD_TOPIC_NAME' });
  assert.equal(ws.subscribe('a'), true);
  assert.equal(ws.subscribe('b'), true);
  assert.throws(() => ws.subscribe('c'), { code: 'ERR_FREEBOARD_TOO_MANY_TOPICS' });
  // The connection is as it was: it still echoes nothing and closes with a code it may send.
  const closed = once(client, 'close');
  ws.close(4000, 'fine');
  assert.equal((await closed)[0], 4000);
  await stop(server);
});

test('pause() leaves what the client sends in the socket until resume()', async () => {
  const server = await listen();
  const [client, ws] = await pair(server);
  const received = [];
  ws.on('message', (data) => received.push(data.toString()));
  ws.pause();
  assert.equal(ws.isPaused, true);
  for (let i = 0; i < 10; i++) client.send(`m${i}`);
  await new Promise((r) => setTimeout(r, 200));
  assert.deepEqual(received, []);
  ws.resume();
  while (received.length < 10) await new Promise((r) => setTimeout(r, 5));
  assert.deepEqual(received, [...Array(10).keys()].map((i) => `m${i}`));
  client.close();
  await stop(server);
});

test('history: a subscriber that comes back with since gets what it missed, in order', async () => {
  const server = await listen({ topics: { history: 100 } });
  server.on('connection', (ws, request) => {
    const since = new URL(request.url, 'ws://x').searchParams.get('since');
    ws.subscribe('match', since ? { since } : undefined);
  });
  const first = await connect(server, '/');
  while (server.clients.size < 1) await new Promise((r) => setTimeout(r, 5));
  const heard = nextMessage(first);
  server.publish('match', 'kick-off');
  const [envelope] = await heard;
  // {epoch}-{sequence}:{payload}
  const [, offset, payload] = /^([0-9a-f]+\.\d+-\d+):(.*)$/.exec(envelope.toString());
  assert.equal(payload, 'kick-off');
  first.close();
  await once(first, 'close');
  server.publish('match', 'goal 1-0');
  server.publish('match', 'goal 2-0');
  const back = new WS(url(server, `/?since=${offset}`));
  const replay = [];
  back.on('message', (data) => replay.push(data.toString().replace(/^[0-9a-f]+\.\d+-\d+:/, '')));
  while (replay.length < 2) await new Promise((r) => setTimeout(r, 5));
  assert.deepEqual(replay, ['goal 1-0', 'goal 2-0']);
  const stranger = new WS(url(server, '/?since=1-999999'));
  const [code] = await once(stranger, 'close');
  assert.equal(code, 4410);
  back.close();
  await stop(server);
});
