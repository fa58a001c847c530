// A peer server for freeboard's client interop tests, on the `ws` library.
//
//     node echo_server.js [PORT]     # prints "listening PORT" once ready (PORT 0: any free port)
//
// Paths:
//   /echo             echoes every message, text as text, binary as binary
//   /fragment?n=K     echoes every message in K fragments with a ping before each fragment
//   /jsonrpc          answers JSON-RPC 2.0 requests ({"result": params}) after a random short
//                     delay each, so answers come out of order
'use strict';

const { WebSocketServer } = require('ws');

const port = Number(process.argv[2] || 0);
const wss = new WebSocketServer({ host: '127.0.0.1', port, maxPayload: 64 << 20, perMessageDeflate: false });

function fragments(data, n) {
  const size = Math.max(1, Math.ceil(data.length / n));
  const parts = [];
  for (let i = 0; i < data.length; i += size) parts.push(data.subarray(i, i + size));
  while (parts.length < n) parts.push(data.subarray(0, 0));
  return parts;
}

wss.on('connection', (ws, request) => {
  const url = new URL(request.url, 'http://localhost');
  ws.on('message', (data, isBinary) => {
    if (url.pathname === '/fragment') {
      const parts = fragments(data, Number(url.searchParams.get('n') || 2));
      parts.forEach((part, i) => {
        ws.ping();
        ws.send(part, { binary: isBinary, fin: i === parts.length - 1 });
      });
    } else if (url.pathname === '/jsonrpc') {
      const request = JSON.parse(data.toString());
      setTimeout(() => {
        ws.send(JSON.stringify({ jsonrpc: '2.0', id: request.id, result: request.params ?? null }));
      }, Math.random() * 5);
    } else {
      ws.send(data, { binary: isBinary });
    }
  });
});

wss.on('listening', () => console.log(`listening ${wss.address().port}`));
