// Live commentary: fans follow a match at ws://HOST:PORT/match/ID; the commentator connects
// with ?commentator=SECRET and each line it sends is published to every fan, framed once.
// A fan who cannot keep up loses the oldest lines (drop-oldest, counted), never the server.
'use strict';
const { Server } = require('..'); // require('freeboard') outside this folder

const port = Number(process.env.PORT || 8080);
const secret = process.env.COMMENTATOR_SECRET || 'let-me-talk';
const server = new Server({ port, memory: '256M', slowConsumer: 'drop-oldest', maxBackpressure: '256K',
  maxConnectionsPerIp: 5000 }); // fans behind one carrier's NAT share an address

server.on('connection', (ws, request) => {
  const url = new URL(request.url, 'ws://localhost');
  const match = /^\/match\/(\w+)$/.exec(url.pathname);
  if (!match) return ws.close(4404, 'no such match');
  const topic = `match:${match[1]}`;
  if (url.searchParams.get('commentator') !== secret) {
    ws.subscribe(topic); // a fan: every line from now on
    return;
  }
  ws.on('message', (line) => {
    const { delivered, dropped } = server.publish(topic, line.toString());
    ws.send(JSON.stringify({ delivered, dropped })); // what the line reached
  });
});
server.on('listening', () => console.log(`live commentary on ws://localhost:${server.address().port}/match/ID`));
process.on('SIGINT', () => server.close(() => process.exit(0)));
process.on('SIGTERM', () => server.close(() => process.exit(0)));
