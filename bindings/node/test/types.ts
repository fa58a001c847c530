// Compiled by `npm run typecheck` only: the declared API accepts what the README shows.
import { Server, WebSocket, SendOutcome, Reach, ConnectionId } from '..';

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

// The id mode: handlers in the options, the connection named by its id.
const byId = new Server({
  port: 0,
  open(id: ConnectionId, request) {
    this.subscribe(id, request.url);
  },
  message(id, data, isBinary) {
    const outcome: SendOutcome = this.send(id, data, { binary: isBinary });
    if (outcome === 'above-high') this.pause(id);
  },
  drain(id) {
    this.resume(id);
  },
  close(id, code: number, reason: Buffer) {
    void [id, code, reason.toString()];
  },
});
byId.on('handlerError', (error, at) => void [error, typeof at === 'number' ? at : at?.id]);
const ws: WebSocket = byId.connection(1);
void [ws.id, byId.bufferedAmount(ws.id), byId.end(ws.id, 4000, 'bye')];
byId.close();
