// The usual Node ws echo server, a peer for `freeboard bench --peers`: every message goes back
// as it came (text as text, binary as binary). Listens on the address given as argument.
'use strict';
const { WebSocketServer } = require('ws');

const [host, port] = (process.argv[2] || '127.0.0.1:9005').split(':');
const wss = new WebSocketServer({ host, port: Number(port), perMessageDeflate: false });
wss.on('connection', (ws) => {
  ws._socket.setNoDelay(true);
  ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));
});
