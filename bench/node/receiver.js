// ./dev bench's reference receiver: what a Node.js webhook receiver made idempotent with a
// common idempotency library does on Redis. The delivery's key is claimed with one
// `SET key NX PX` (a small "processing" record); a first delivery is processed (the same
// answer as the desk's built-in processor would give: 200 and a small JSON) and its result
// stored with a second `SET`; a duplicate gets the stored result replayed, or 409 while the
// first is still processing. Plain `http` and ioredis (one pipelined connection), nothing else:
// a lean reference rather than a slow one.
// Usage: node receiver.js PORT redis://HOST:PORT[/DB]
'use strict';
const http = require('http');
const Redis = require('ioredis');

const port = Number(process.argv[2]);
const redis = new Redis(process.argv[3], { enableAutoPipelining: true });
const TTL_MS = 7 * 24 * 3600 * 1000;
const LEASE = JSON.stringify({ status: 'processing' });

function answer(res, status, body, outcome) {
  res.writeHead(status, { 'Content-Type': 'application/json', 'Idempotency-Outcome': outcome,
                          'Content-Length': Buffer.byteLength(body) });
  res.end(body);
}

http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', async () => {
    const key = req.headers['idempotency-key'];
    if (!key) return answer(res, 400, '{"error":"no Idempotency-Key"}', 'rejected');
    const rk = 'node:' + key;
    try {
      const claimed = await redis.set(rk, LEASE, 'PX', TTL_MS, 'NX');
      if (claimed === 'OK') {
        const body = Buffer.concat(chunks);
        const result = JSON.stringify({ status: 200, body: JSON.stringify({ received: body.length }) });
        await redis.set(rk, result, 'PX', TTL_MS);
        return answer(res, 200, JSON.parse(result).body, 'processed');
      }
      const stored = JSON.parse((await redis.get(rk)) || LEASE);
      if (stored.status === 'processing') return answer(res, 409, '{"error":"in progress"}', 'in-progress');
      return answer(res, stored.status, stored.body, 'replayed');
    } catch (e) {
      return answer(res, 503, JSON.stringify({ error: String(e) }), 'unavailable');
    }
  });
}).listen(port, '127.0.0.1');
