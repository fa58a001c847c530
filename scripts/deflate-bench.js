#!/usr/bin/env node
// JSON echo through `freeboard serve` with and without permessage-deflate, in one run:
// bytes on the wire per message (both directions, as the client's socket counts them) and
// the server's CPU per message (utime + stime from /proc/PID/stat around the run).
//
//   NODE_PATH=interop/node/node_modules node scripts/deflate-bench.js PORT PID MODE [COUNT]
//
// MODE names the server's --compression for the report; the client (Node `ws`) offers
// permessage-deflate with threshold 0 unless MODE is off.
const fs = require('fs');
const WebSocket = require('ws');
const [port, pid, mode, countArg] = process.argv.slice(2);
const count = Number(countArg || 20000);
const ticks = () => {
  const f = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return Number(f[11]) + Number(f[12]); // utime + stime, clock ticks (100 Hz)
};
function corpus(size) {
  const out = [];
  for (let i = 0; out.length < 64; i++) {
    const items = [];
    let s = '';
    for (let j = 0; s.length < size; j++) {
      items.push({ id: i * 1000 + j, symbol: ['EURUSD', 'GBPUSD', 'USDJPY'][j % 3],
        bid: 1.0842 + j * 0.0001, ask: 1.0844 + j * 0.0001, ts: 1732380000000 + i * 17 + j });
      s = JSON.stringify({ type: 'quotes', seq: i, items });
    }
    out.push(s.slice(0, size));
  }
  return out;
}
async function run(size) {
  const messages = corpus(size);
  const ws = new WebSocket(`ws://127.0.0.1:${port}/echo`, {
    perMessageDeflate: mode === 'off' ? false : { threshold: 0 },
  });
  await new Promise((ok, err) => { ws.once('open', ok); ws.once('error', err); });
  const negotiated = ws.extensions || '-';
  const sock = ws._socket;
  const [r0, w0, t0] = [sock.bytesRead, sock.bytesWritten, ticks()];
  let received = 0, sent = 0;
  const window = 16;
  await new Promise((ok) => {
    const pump = () => { while (sent < count && sent - received < window) ws.send(messages[sent++ % 64]); };
    ws.on('message', () => { if (++received === count) ok(); else pump(); });
    pump();
  });
  const [r1, w1, t1] = [sock.bytesRead, sock.bytesWritten, ticks()];
  ws.close();
  const wire = (r1 - r0 + w1 - w0) / count / 2;
  const cpuUs = (t1 - t0) * 10000 / count;
  console.log(`${mode}\t${size}\t${negotiated}\t${wire.toFixed(1)} B/msg (ratio ${(wire / size).toFixed(3)})\tserver ${cpuUs.toFixed(1)} µs/msg`);
}
(async () => { for (const size of [256, 4096, 65536]) await run(size); })();
