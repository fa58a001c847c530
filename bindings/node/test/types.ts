// Compiled by `npm run typecheck` only: the declared API accepts what the README shows.
import { Server, WebSocket, SendOutcome, Reach } from '..';

const server = new Server({ port: 0, memory: '64M', slowConsumer: 'drop-oldest', highWatermark: '64K' });
server.on('connection', (ws: WebSocket, request) => {
  ws.subscribe(request.url);
  ws.on('message', (data: Buffer, isBinary: boolean) => {
    const outcome: SendOutcome = ws.send(data, { binary: isBinary });
    if (outcome === 'above-high') ws.once('drain', () => undefined);
  });
  ws.on('close', (code: number, reason: Buffer) => void [code, reason.toString()]);
});
server.on('upgrade', async (request, decide) => decide(request.headers.authorization ? true : 401));
const reach: Reach = server.publish('match', 'goal');
void reach.delivered;
server.close(() => undefined);
