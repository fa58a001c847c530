// The freeboard binding as a benchmark server, beside peers/node-ws:
//   node server.js echo HOST:PORT       every message goes back as it came
//   node server.js broadcast HOST:PORT  every connection subscribes to one topic; a connection
//                                       that sends becomes the publisher (it leaves the
//                                       topic, as peers/node-ws-broadcast's /pub is no
//                                       subscriber) and each message it sends is published
//   node server.js idle HOST:PORT       accepts and holds connections (idle memory)
// A third argument, JSON, adds settings (the hostile suite's budget and timeouts).
// The send queue's settings are freeboard's defaults but for the broadcast, which runs
// drop-oldest with a 4 MiB cap as `freeboard bench broadcast` runs freeboard serve.
'use strict';
const { Server } = require('..');

const [mode = 'echo', at = '127.0.0.1:9005', extra = '{}'] = process.argv.slice(2);
const [host, port] = at.split(':');
const options = { host, port: Number(port), memory: '1G', maxConnections: 100000,
  maxConnectionsPerIp: 100000, idleTimeout: null };
if (mode === 'broadcast') Object.assign(options, { slowConsumer: 'drop-oldest', maxBackpressure: '4M' });
Object.assign(options, JSON.parse(extra));
const server = new Server(options);
server.on('connection', (ws) => {
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
server.on('listening', () => console.log(`freeboard-node ${mode} listening on ${host}:${port}`));
process.on('SIGTERM', () => server.close(() => process.exit(0)));
