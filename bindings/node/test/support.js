// What the binding's test files share: a server on an ephemeral loopback port and ws clients
// of it. (No tests here; `node --test test/` runs it as an empty file.)
'use strict';

const { once } = require('node:events');
const WS = require('ws');
const { Server } = require('..');

/** A server on an ephemeral loopback port, ready. */
async function listen(options = {}) {
  const server = new Server({ host: '127.0.0.1', port: 0, memory: '64M', ...options });
  await once(server, 'listening');
  return server;
}

function url(server, path = '/') {
  return `ws://127.0.0.1:${server.address().port}${path}`;
}

/** A ws client of `server`, open. */
async function connect(server, path, options) {
  const client = new WS(url(server, path), options);
  await once(client, 'open');
  return client;
}

async function stop(server) {
  await new Promise((resolve) => server.close(resolve));
}

module.exports = { listen, url, connect, stop };
