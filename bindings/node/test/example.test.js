// The live-commentary example as a user runs it (its own process), with 1,000 fans.
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { once } = require('node:events');
const { spawn } = require('node:child_process');
const path = require('node:path');
const WS = require('ws');

test('live commentary: one line reaches 1,000 fans of the match, and the ack says so', async () => {
  const example = spawn(process.execPath, [path.join(__dirname, '..', 'examples', 'live-commentary.js')], {
    env: { ...process.env, PORT: '0', COMMENTATOR_SECRET: 's3cret' },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  try {
    const [line] = await once(example.stdout, 'data');
    const port = /:(\d+)\//.exec(line.toString())[1];
    const at = (p) => `ws://127.0.0.1:${port}${p}`;
    const fans = [];
    for (let i = 0; i < 1000; i++) fans.push(new WS(at('/match/final')));
    const other = new WS(at('/match/semi'));
    await Promise.all([...fans, other].map((fan) => once(fan, 'open')));
    const heard = fans.map((fan) => once(fan, 'message'));
    let otherHeard = false;
    other.on('message', () => { otherHeard = true; });
    const commentator = new WS(at('/match/final?commentator=s3cret'));
    await once(commentator, 'open');
    // The fans' subscriptions are made when they open; the server has seen them all.
    commentator.send('GOAL! 1-0');
    const [ack] = await once(commentator, 'message');
    assert.deepEqual(JSON.parse(ack.toString()), { delivered: 1000, dropped: 0 });
    for (const [data] of await Promise.all(heard)) assert.equal(data.toString(), 'GOAL! 1-0');
    assert.equal(otherHeard, false);
    const refused = new WS(at('/nowhere'));
    const [code] = await once(refused, 'close');
    assert.equal(code, 4404);
    for (const ws of [...fans, other, commentator]) ws.terminate();
  } finally {
    example.kill('SIGTERM');
    await once(example, 'exit');
  }
});
