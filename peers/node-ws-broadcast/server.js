// The usual Node pub/sub pattern, as a peer for freeboard's broadcast benchmark: every
// connection except /pub is a subscriber kept in a Map; each message the /pub connection sends
// is broadcast with a loop over the Map.
'use strict';
const { WebSocketServer } = require('ws');

// The argument is a port or HOST:PORT (as `freeboard bench --peers` passes it).
const arg = process.argv[2] || '9400';
const [host, port] = arg.includes(':') ? arg.split(':') : ['127.0.0.1', arg];
const subscribers = new Map();
let next = 0;
const wss = new WebSocketServer({ port: Number(port), host, perMessageDeflate: false });
wss.on('connection', (ws, req) => {
  if (req.url.startsWith('/pub')) {
    ws.on('message', (data, isBinary) => {
      for (const sub of subscribers.values()) sub.send(data, { binary: isBinary });
    });
    return;
  }
  const id = next++;
  subscribers.set(id, ws);
  ws.on('close', () => subscribers.delete(id));
});
wss.on('listening', () => console.log(`node ws broadcast listening on ${host}:${port}`));
