// The freeboard binding as a benchmark server, beside peers/node-ws:
//   node server.js echo HOST:PORT       every message goes back as it came
//   node server.js broadcast HOST:PORT  every connection subscribes to one topic; a connection
//                                       that sends becomes the publisher (it leaves the
//                                       topic, as peers/node-ws-broadcast's /pub is no
//                                       subscriber) and each message it sends is published
//   node server.js idle HOST:PORT       accepts and holds connections (idle memory)
// A mode with the suffix -ids (echo-ids, broadcast-ids, idle-ids) is the same server held by
// connection ids: handlers in the options, no JavaScript object per connection (idle-ids
// has a message handler only: an idle connection costs JavaScript nothing at all).
// A third argument, JSON, adds settings (the hostile suite's budget and timeouts).
// The send queue's settings are freeboard's defaults but for the broadcast, which runs
// drop-oldest with a 4 MiB cap as `freeboard bench broadcast` runs freeboard serve.
'use strict';
const { Server } = require('..');

const [named = 'echo', at = '127.0.0.1:9005', extra = '{}'] = process.argv.slice(2);
const ids = named.endsWith('-ids');
const mode = ids ? named.slice(0, -4) : named;
const [host, port] = at.split(':');
const options = { host, port: Number(port), memory: '1G', maxConnections: 100000,
  maxConnectionsPerIp: 100000, idleTimeout: null };
if (mode === 'broadcast') Object.assign(options, { slowConsumer: 'drop-oldest', maxBackpressure: '4M' });
Object.assign(options, JSON.parse(extra));
if (ids) {
  const publisher = new Set(); // the ids of publishers (one in practice)
  Object.assign(options, mode === 'broadcast' ? {
    open(id) {
      this.subscribe(id, 'bench');
    },
    message(id, data, isBinary) {
      if (!publisher.has(id)) {
        publisher.add(id);
        this.unsubscribe(id, 'bench');
      }
      this.publish('bench', data, { binary: isBinary });
    },
    close(id) {
      publisher.delete(id);
    },
  } : {
    message(id, data, isBinary) {
      this.send(id, data, { binary: isBinary });
    },
  });
}
const server = new Server(options);
if (!ids) server.on('connection', (ws) => {
  if (mode === 'echo') {
    ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));
  } else if (mode === 'broadcast') {
    ws.subscribe('bench');
    let publisher = false;
    ws.on('message', (data, isBinary) => {
      if (!publisher) {
        publisher = true;
        ws.unsubscribe('bench');
      }
      server.publish('bench', data, { binary: isBinary });
    });
  }
});
server.on('listening', () => console.log(`freeboard-node ${named} listening on ${host}:${port}`));
process.on('SIGTERM', () => server.close(() => process.exit(0)));
