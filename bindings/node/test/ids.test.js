// The id mode against real sockets on 127.0.0.1, with ws as the client: connections held by
// their ids, handlers given to the server, no JavaScript object per connection.
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { once } = require('node:events');
const { listen, connect, stop } = require('./support');

async function until(condition, what) {
  for (let i = 0; i < 1000 && !condition(); i++) await new Promise((r) => setTimeout(r, 5));
  assert.ok(condition(), what);
}

/** A server whose handlers log what they see, in order, and hand out each open's id. */
async function logging(options = {}) {
  const log = [];
  const opened = [];
  const server = await listen({
    open(id) {
      log.push(['open', id]);
      opened.push(id);
    },
    message(id, data, isBinary) {
      log.push(['message', id, data.toString(), isBinary]);
    },
    close(id, code, reason) {
      log.push(['close', id, code, reason.toString()]);
    },
    ...options,
  });
  return { server, log, opened };
}

test('one id per connection through open, message and close; send by id says queued', async () => {
  const outcomes = [];
  const { server, log, opened } = await logging({
    message(id, data, isBinary) {
      log.push(['message', id, data.toString(), isBinary]);
      outcomes.push(this.send(id, data, { binary: isBinary }));
    },
  });
  const first = await connect(server);
  const second = await connect(server);
  await until(() => opened.length === 2, 'two opens');
  const [a, b] = opened;
  assert.equal(typeof a, 'number');
  assert.notEqual(a, b);
  second.send(Buffer.from([1, 2, 3]));
  const [bytes, isBinary] = await once(second, 'message');
  assert.deepEqual([...bytes], [1, 2, 3]);
  assert.equal(isBinary, true);
  first.send('hello');
  const [text] = await once(first, 'message');
  assert.equal(text.toString(), 'hello');
  assert.deepEqual(outcomes, ['queued', 'queued']);
  first.close(4001, 'leaving');
  await until(() => log.some(([event]) => event === 'close'), 'a close');
  assert.deepEqual(log, [
    ['open', a], ['open', b],
    ['message', b, '\u0001\u0002\u0003', true],
    ['message', a, 'hello', false],
    ['close', a, 4001, 'leaving'],
  ]);
  // No WebSocket was made: nothing per connection on the JavaScript side.
  assert.equal(server.clients.size, 0);
  second.close();
  await stop(server);
});

test('a stale id answers closed, even once its slot holds another connection', async () => {
  const heard = [];
  const { server, log, opened } = await logging({
    message(id, data) {
      heard.push([id, data.toString()]);
    },
  });
  const first = await connect(server);
  await until(() => opened.length === 1, 'the first open');
  const stale = opened[0];
  const staleSlot = server.connection(stale)._slot;
  first.close();
  await until(() => log.some(([event, id]) => event === 'close' && id === stale), 'its close');
  const second = await connect(server);
  await until(() => opened.length === 2, 'the second open');
  const fresh = opened[1];
  // The engine reuses the slot: only the serial in the id tells the two apart.
  assert.equal(server.connection(fresh)._slot, staleSlot);
  let got = 0;
  second.on('message', () => got++);
  assert.equal(server.send(stale, 'not for you'), 'closed');
  assert.equal(server.end(stale, 4000), false);
  assert.equal(server.bufferedAmount(stale), 0);
  assert.equal(server.unsubscribe(stale, 't'), false);
  assert.equal(server.pause(stale), false);
  assert.throws(() => server.subscribe(stale, 't'), { code: 'ERR_FREEBOARD_CLOSED' });
  assert.throws(() => server.connection(stale), { code: 'ERR_FREEBOARD_CLOSED' });
  assert.equal(server.send(fresh, 'yours'), 'queued');
  const [data] = await once(second, 'message');
  assert.equal(data.toString(), 'yours');
  assert.equal(got, 1);
  second.close();
  await stop(server);
  // After the server has stopped, every id is stale.
  assert.equal(server.send(fresh, 'x'), 'closed');
  assert.throws(() => server.connection(fresh), { code: 'ERR_FREEBOARD_CLOSED' });
});

test('send outcomes by id: above-high, drain, then dropped past the cap and counted', async () => {
  const drained = [];
  const { server, opened } = await logging({
    slowConsumer: 'drop-newest', lowWatermark: '16K', highWatermark: '64K', maxBackpressure: '256K',
    drain(id) {
      drained.push(id);
    },
  });
  const client = await connect(server);
  await until(() => opened.length === 1, 'the open');
  const [id] = opened;
  client._socket.pause(); // stop reading: the server's queue fills once the kernel's does
  const chunk = Buffer.alloc(16 << 10, 7);
  const counts = {};
  // Loopback's kernel buffers take a few MiB before the queue holds anything.
  for (let i = 0; i < 4000 && !counts.dropped; i++) {
    const outcome = server.send(id, chunk);
    counts[outcome] = (counts[outcome] || 0) + 1;
    if (i % 8 === 7) await new Promise((r) => setImmediate(r));
  }
  assert.ok(counts['above-high'] > 0, JSON.stringify(counts));
  assert.ok(counts.dropped > 0, JSON.stringify(counts));
  assert.equal(counts.closed, undefined);
  await new Promise((r) => setImmediate(r)); // the turn's counts reach the metrics
  assert.ok(server.bufferedAmount(id) > 64 << 10, `bufferedAmount ${server.bufferedAmount(id)}`);
  const line = server.metrics().split('\n')
    .find((l) => l.startsWith('freeboard_drops_total{reason="drop-newest"}'));
  assert.equal(Number(line.split(' ').pop()), counts.dropped);
  drained.length = 0; // (the queue may have dipped under the low watermark while it filled)
  client._socket.resume();
  await until(() => drained.includes(id), 'a drain for the id');
  assert.ok(server.bufferedAmount(id) <= 16 << 10);
  client.terminate();
  await stop(server);
});

test('close codes by id: end(id, code, reason), the client\'s code, 1009 past the size', async () => {
  const { server, log, opened } = await logging({ maxMessageSize: '1K' });
  const closes = () => log.filter(([event]) => event === 'close');
  const ended = await connect(server);
  await until(() => opened.length === 1, 'the open');
  assert.equal(server.end(opened[0], 4000, 'done here'), true);
  server.end(opened[0], 4004, 'again'); // closing already: the first code stands
  const [code, reason] = await once(ended, 'close');
  assert.deepEqual([code, reason.toString()], [4000, 'done here']);
  const big = await connect(server);
  big.send(Buffer.alloc(4096));
  const [tooBig] = await once(big, 'close');
  assert.equal(tooBig, 1009);
  const leaving = await connect(server);
  leaving.close(4002, 'bye');
  await until(() => closes().length === 3, 'three closes');
  assert.deepEqual(closes().map(([, , c]) => c), [4000, 1009, 4002]);
  assert.equal(closes()[2][3], 'bye');
  await stop(server);
});

test('topics by id: subscribe, publish reaches the subscribers, unsubscribe', async () => {
  const { server, opened } = await logging({
    open(id) {
      opened.push(id);
      assert.equal(this.subscribe(id, 'match'), true);
      assert.equal(this.subscribe(id, 'match'), false); // already
    },
  });
  const fans = [await connect(server), await connect(server)];
  await until(() => opened.length === 2, 'two opens');
  const heard = fans.map((fan) => once(fan, 'message'));
  assert.deepEqual(server.publish('match', 'goal 1-0'), { delivered: 2, dropped: 0 });
  for (const [data] of await Promise.all(heard)) assert.equal(data.toString(), 'goal 1-0');
  assert.equal(server.unsubscribe(opened[0], 'match'), true);
  assert.deepEqual(server.publish('match', 'goal 2-0'), { delivered: 1, dropped: 0 });
  for (const fan of fans) fan.close();
  await stop(server);
});

test('a handler that throws or rejects closes 1011, is counted with its id; the server goes on', async () => {
  const failures = [];
  const { server } = await logging({
    open(id, request) {
      if (request.url === '/open-throws') throw new Error('in open');
    },
    message(id, data) {
      if (data.toString() === 'throw') throw new Error('boom');
      if (data.toString() === 'reject') return Promise.reject(new Error('async boom'));
      this.send(id, data);
      return undefined;
    },
    close(id, code) {
      if (code === 4321) throw new Error('in close');
    },
  });
  server.on('handlerError', (error, id) => failures.push([error.message, typeof id]));
  for (const poison of ['throw', 'reject']) {
    const client = await connect(server);
    client.send(poison);
    const [code] = await once(client, 'close');
    assert.equal(code, 1011);
  }
  const opening = await connect(server, '/open-throws');
  assert.equal((await once(opening, 'close'))[0], 1011);
  const leaving = await connect(server);
  leaving.close(4321);
  await once(leaving, 'close');
  await until(() => failures.length === 4, 'four failures');
  assert.equal(server.handlerErrors, 4);
  assert.deepEqual(failures, [
    ['boom', 'number'], ['async boom', 'number'], ['in open', 'number'], ['in close', 'number'],
  ]);
  const client = await connect(server);
  client.send('still here');
  const [data] = await once(client, 'message');
  assert.equal(data.toString(), 'still here');
  client.close();
  await stop(server);
});

test('the request only when open declares it; connection(id) gives a WebSocket on demand', async () => {
  const requests = [];
  const server = await listen({
    open(id, request) {
      requests.push([id, request.url, request.headers['x-user'], request.socket.remoteAddress]);
    },
    message(id, data) {
      this.connection(id).send(`object heard ${data}`);
    },
  });
  const client = await connect(server, '/room?id=7', { headers: { 'x-user': 'ada' } });
  await until(() => requests.length === 1, 'the open');
  const [id, path, user, address] = requests[0];
  assert.deepEqual([path, user, address], ['/room?id=7', 'ada', '127.0.0.1']);
  client.send('one');
  const [first] = await once(client, 'message');
  assert.equal(first.toString(), 'object heard one');
  // The object, once made, is kept and hears the connection's events too.
  const ws = server.connection(id);
  assert.equal(ws.id, id);
  assert.equal(ws.remoteAddress, '127.0.0.1');
  assert.deepEqual([...server.clients], [ws]);
  const objectHeard = once(ws, 'message');
  client.send('two');
  assert.equal((await objectHeard)[0].toString(), 'two');
  const closed = once(ws, 'close');
  client.close(4003);
  assert.equal((await closed)[0], 4003);
  assert.equal(server.clients.size, 0);
  await stop(server);

  // Without a declared second parameter, open gets the id alone: no head crossed.
  const seen = [];
  const bare = await listen({ open(...args) { seen.push(args[1]); } });
  const other = await connect(bare);
  await until(() => seen.length === 1, 'the bare open');
  assert.deepEqual(seen, [undefined]);
  other.close();
  await stop(bare);
});

test('a connection listener beside the handlers gets a WebSocket per connection', async () => {
  const opened = [];
  const server = await listen({ open(id) { opened.push(id); } });
  const objects = [];
  server.on('connection', (ws, request) => objects.push([ws, request.url]));
  const client = await connect(server, '/x');
  await until(() => objects.length === 1, 'a connection event');
  assert.equal(objects[0][0].id, opened[0]);
  assert.equal(objects[0][1], '/x');
  client.close();
  await stop(server);
});

test('without handlers, a WebSocket\'s id works with the server\'s id API too', async () => {
  const server = await listen();
  const [[ws], client] = await Promise.all([once(server, 'connection'), connect(server)]);
  assert.equal(server.send(ws.id, 'by id'), 'queued');
  const [data] = await once(client, 'message');
  assert.equal(data.toString(), 'by id');
  assert.equal(server.connection(ws.id), ws);
  client.close();
  await once(ws, 'close');
  assert.equal(server.send(ws.id, 'late'), 'closed');
  await stop(server);
});
