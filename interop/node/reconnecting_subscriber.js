// Node `ws` subscribers with the usual reconnect loop (reconnect on close after a jittered
// exponential backoff, without `since`), for `freeboard bench drops`: `node
// reconnecting_subscriber.js URL N`. Prints `I PAYLOAD` for every message subscriber I
// receives and `I open` for every connection that opens; stops at stdin's end.
const WebSocket = require("ws");

const [url, count] = [process.argv[2], Number(process.argv[3] || 1)];
const sockets = [];

function subscribe(i) {
  let wait = 250;
  const connect = () => {
    const ws = new WebSocket(url);
    sockets[i] = ws;
    let delivered = false;
    ws.on("open", () => process.stdout.write(`${i} open\n`));
    ws.on("message", (data) => {
      delivered = true;
      process.stdout.write(`${i} ${data}\n`);
    });
    ws.on("error", () => {});
    ws.on("close", () => {
      if (delivered) wait = 250;
      const after = wait * (0.5 + Math.random() / 2);
      wait = Math.min(wait * 2, 30000);
      setTimeout(connect, after);
    });
  };
  connect();
}

for (let i = 0; i < count; i++) subscribe(i);
process.stdin.resume();
process.stdin.on("end", () => process.exit(0));
