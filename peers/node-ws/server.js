// The usual Node ws echo server, a peer for `freeboard bench --peers`: every message goes back
// as it came (text as text, binary as binary). Listens on the address given as argument; with
// `deflate` as the second argument it accepts permessage-deflate (ws's defaults: context
// takeover, zlib's default level) and compresses every message (threshold 0), for
// scripts/deflate-peers.
'use strict';
const { WebSocketServer } = require('ws');

const [host, port] = (process.argv[2] || '127.0.0.1:9005').split(':');
const perMessageDeflate = process.argv[3] === 'deflate' ? { threshold: 0 } : false;
const wss = new WebSocketServer({ host, port: Number(port), perMessageDeflate });
wss.on('connection', (ws) => {
  ws._socket.setNoDelay(true);
  ws.on('message', (data, isBinary) => ws.send(data, { binary: isBinary }));
});
