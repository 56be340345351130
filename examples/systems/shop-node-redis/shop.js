'use strict';
// The tutorial's shop in Node, over Redis Streams and PostgreSQL: an order
// API and workers that reserve inventory, each in two variants.
//
//   node shop.js api    --listen HOST:PORT --pg URL --redis URL --variant naive|fixed
//   node shop.js worker --pg URL --redis URL --id NAME --variant naive|fixed
//                       [--admin-listen HOST:PORT] [--visibility-timeout-ms MS]
//
// naive: the API commits the order, then adds its event to the stream (two
// writes); the workers read with NOACK (delivered is acknowledged: at most
// once) and keep no inbox. fixed: the order and an outbox row commit in one
// transaction and a relay in the API's process adds the outbox to the
// stream; the workers read into the group's pending list, apply the event
// with an inbox row and a ledger row in one transaction, then XACK; a
// message left pending (its worker killed, its ack lost) is claimed again
// by any worker after the visibility timeout (XAUTOCLAIM).
//
// Both serve haunt's admin protocol through clients/node when
// HAUNT_ADMIN_TOKEN is set: the API beside /orders, a worker on --admin-listen.

const http = require('node:http');
const crypto = require('node:crypto');
const { Pool } = require('pg');
const { createClient } = require('redis');
const { Admin } = require('haunt-admin');

const STREAM = 'orders';
const GROUP = 'workers';
const API_POINT = 'after-order-before-publish';
const DELIVERED_POINT = 'after-delivery';
const WORKER_POINT = 'after-effect-before-ack';

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function usage(message) {
  process.stderr.write(`shop: ${message}\nusage: node shop.js api|worker --pg URL --redis URL --variant naive|fixed [...]\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const role = argv[0];
  if (role !== 'api' && role !== 'worker') usage('the first argument is api or worker');
  const flags = {
    listen: '127.0.0.1:8080',
    pg: '',
    redis: 'redis://127.0.0.1:6379',
    id: 'worker-1',
    variant: '',
    'admin-listen': '',
    'visibility-timeout-ms': '2000',
  };
  for (let i = 1; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, '');
    if (!(name in flags) || !argv[i].startsWith('--')) usage(`unknown flag ${argv[i]}`);
    if (argv[i + 1] === undefined) usage(`${argv[i]} needs a value`);
    flags[name] = argv[i + 1];
  }
  if (!flags.pg) usage('--pg is required');
  if (flags.variant !== 'naive' && flags.variant !== 'fixed') usage('--variant is naive or fixed');
  const visibility = Number(flags['visibility-timeout-ms']);
  if (!Number.isInteger(visibility) || visibility < 1) usage('--visibility-timeout-ms is a positive integer');
  return { role, ...flags, visibility };
}

function hostPort(text, flag) {
  const at = text.lastIndexOf(':');
  const port = Number(text.slice(at + 1));
  if (at < 0 || !Number.isInteger(port)) usage(`${flag} is HOST:PORT, got ${text}`);
  return [text.slice(0, at), port];
}

// ---- the stores ---------------------------------------------------------------

const SCHEMA = [
  'orders (order_id TEXT PRIMARY KEY, item_id TEXT NOT NULL, qty BIGINT NOT NULL, event_id TEXT NOT NULL UNIQUE)',
  'outbox (seq BIGSERIAL PRIMARY KEY, event_id TEXT NOT NULL UNIQUE, payload TEXT NOT NULL)',
  'inventory (item_id TEXT PRIMARY KEY, reserved_qty BIGINT NOT NULL)',
  'inbox (event_id TEXT PRIMARY KEY)',
  `ledger (event_id TEXT NOT NULL, order_id TEXT NOT NULL, item_id TEXT NOT NULL, qty BIGINT NOT NULL,
    delivery_attempt BIGINT NOT NULL, worker_id TEXT NOT NULL, applied_at_ms BIGINT NOT NULL)`,
];

// Every process may come first: the schema is made under an advisory lock,
// and the database may still be starting (it is a node of the same run).
async function openDb(url) {
  const pool = new Pool({ connectionString: url, max: 4, connectionTimeoutMillis: 5000 });
  // A connection lost, idle or checked out (a partition's heal closes it):
  // said, not thrown. A query on it fails, and `transaction` discards it.
  pool.on('error', (err) => console.error(`pg: ${err.message}`));
  pool.on('connect', (client) => client.on('error', (err) => console.error(`pg: ${err.message}`)));
  for (;;) {
    try {
      await transaction(pool, async (client) => {
        await client.query('SELECT pg_advisory_xact_lock(4217)');
        for (const table of SCHEMA) await client.query(`CREATE TABLE IF NOT EXISTS ${table}`);
      });
      return pool;
    } catch (err) {
      console.error(`waiting for PostgreSQL: ${err.message}`);
      await sleep(200);
    }
  }
}

async function openRedis(url) {
  // A ping each second finds a connection that a partition left silent; the
  // client then reconnects, and commands wait in its queue meanwhile.
  const client = createClient({ url, pingInterval: 1000, socket: { reconnectStrategy: () => 100 } });
  client.on('error', (err) => console.error(`redis: ${err.message}`));
  await client.connect();
  return client;
}

// Runs `body` with a client inside BEGIN … COMMIT; on an error, rolls back
// and discards the client, whose connection may be the cause.
async function transaction(db, body) {
  const client = await db.connect();
  try {
    await client.query('BEGIN');
    const out = await body(client);
    await client.query('COMMIT');
    client.release();
    return out;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    client.release(err);
    throw err;
  }
}

// ---- the API ----------------------------------------------------------------

function reply(res, status, body) {
  const data = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) });
  res.end(data);
}

async function readJson(req) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > 64 * 1024) throw Object.assign(new Error('the body is over 64 KiB'), { field: 'body' });
    chunks.push(chunk);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString('utf8'));
  } catch (err) {
    throw Object.assign(new Error(`the body is not JSON: ${err.message}`), { field: 'body' });
  }
}

function validOrder(body) {
  if (body === null || typeof body !== 'object' || Array.isArray(body)) return ['body', 'a JSON object'];
  for (const field of Object.keys(body)) {
    if (!['order_id', 'item_id', 'qty'].includes(field)) return [field, 'an unknown field'];
  }
  if (typeof body.order_id !== 'string' || body.order_id === '') return ['order_id', 'a non-empty string'];
  if (typeof body.item_id !== 'string' || body.item_id === '') return ['item_id', 'a non-empty string'];
  if (!Number.isInteger(body.qty) || body.qty < 1) return ['qty', 'a positive integer'];
  return null;
}

async function placeOrder(req, res, c, db, redis, admin) {
  if (req.method !== 'POST') return reply(res, 405, { error: 'POST only', field: null });
  const body = await readJson(req);
  const bad = validOrder(body);
  if (bad) return reply(res, 400, { error: `${bad[0]} must be ${bad[1]}`, field: bad[0] });
  const prior = await db.query('SELECT item_id, qty, event_id FROM orders WHERE order_id = $1', [body.order_id]);
  if (prior.rowCount > 0) return samePrior(res, body, prior.rows[0]);
  const order = { ...body, event_id: crypto.randomUUID() };
  const payload = JSON.stringify(order);
  const insert = ['INSERT INTO orders VALUES ($1, $2, $3, $4)', [order.order_id, order.item_id, order.qty, order.event_id]];
  try {
    if (c.variant === 'naive') {
      // Two writes: the order commits, then the event is added. A crash
      // between them leaves an order no worker will ever hear of.
      await db.query(...insert);
      await admin.reached(API_POINT, { order_id: order.order_id });
      await redis.xAdd(STREAM, '*', { payload });
    } else {
      // The transactional outbox: the order and its event commit together.
      await transaction(db, async (client) => {
        await client.query(...insert);
        await admin.reached(API_POINT, { order_id: order.order_id });
        await client.query('INSERT INTO outbox (event_id, payload) VALUES ($1, $2)', [order.event_id, payload]);
      });
    }
  } catch (err) {
    if (err.code === '23505') {
      // The same order_id, placed concurrently by a retry: answer as for a repeat.
      const again = await db.query('SELECT item_id, qty, event_id FROM orders WHERE order_id = $1', [body.order_id]);
      if (again.rowCount > 0) return samePrior(res, body, again.rows[0]);
    }
    throw err;
  }
  return reply(res, 201, { order_id: order.order_id, event_id: order.event_id });
}

function samePrior(res, body, prior) {
  if (prior.item_id !== body.item_id || Number(prior.qty) !== body.qty) {
    return reply(res, 409, { error: 'order_id exists with another item or qty', field: 'order_id' });
  }
  return reply(res, 200, { order_id: body.order_id, event_id: prior.event_id });
}

// Adds the outbox to the stream, oldest first, and deletes each row once
// Redis has it. A crash between the two adds the event again: the workers'
// inbox absorbs it.
async function relay(db, redis) {
  for (;;) {
    try {
      const { rows } = await db.query('SELECT seq, event_id, payload FROM outbox ORDER BY seq LIMIT 100');
      for (const row of rows) {
        await redis.xAdd(STREAM, '*', { payload: row.payload });
        await db.query('DELETE FROM outbox WHERE seq = $1', [row.seq]);
      }
      if (rows.length === 0) await sleep(20);
    } catch (err) {
      console.error(`relay: ${err.message}`);
      await sleep(200);
    }
  }
}

// 200 once nothing is left to deliver: no outbox row, and the group has read
// the whole stream and holds nothing pending; 503 otherwise.
async function quiet(res, db, redis) {
  const outbox = Number((await db.query('SELECT count(*) AS n FROM outbox')).rows[0].n);
  let groups;
  try {
    groups = await redis.sendCommand(['XINFO', 'GROUPS', STREAM]);
  } catch (err) {
    // No stream yet: quiet only if nothing waits in the outbox.
    return reply(res, outbox === 0 ? 200 : 503, { quiet: outbox === 0, outbox });
  }
  const fields = (groups.map(pairs).find((g) => g.name === GROUP)) || null;
  const length = await redis.xLen(STREAM);
  const idle = fields ? Number(fields.pending) === 0 && Number(fields.lag) === 0 : length === 0;
  const ok = outbox === 0 && idle;
  return reply(res, ok ? 200 : 503, { quiet: ok, outbox, group: fields });
}

function pairs(flat) {
  const out = {};
  for (let i = 0; i + 1 < flat.length; i += 2) out[flat[i]] = flat[i + 1];
  return out;
}

async function runApi(c) {
  const db = await openDb(c.pg);
  const redis = await openRedis(c.redis);
  const admin = new Admin({ points: [API_POINT] });
  if (c.variant === 'fixed') relay(db, redis);
  const server = http.createServer(async (req, res) => {
    try {
      if (await admin.handle(req, res)) return;
      const path = (req.url || '').split('?')[0];
      if (path === '/healthz') return reply(res, 200, { ok: true });
      if (path === '/quiet') return await quiet(res, db, redis);
      if (path === '/orders') return await placeOrder(req, res, c, db, redis, admin);
      return reply(res, 404, { error: `no route ${path}`, field: null });
    } catch (err) {
      if (err.field) return reply(res, 400, { error: err.message, field: err.field });
      return reply(res, 503, { error: err.message });
    }
  });
  const [host, port] = hostPort(c.listen, '--listen');
  server.listen(port, host, () => console.error(`api variant=${c.variant} listening on ${c.listen}`));
}

// ---- a worker ---------------------------------------------------------------

async function runWorker(c) {
  const db = await openDb(c.pg);
  const redis = await openRedis(c.redis);
  // A blocking read holds its connection: it gets one of its own.
  const reader = redis.duplicate();
  reader.on('error', (err) => console.error(`redis: ${err.message}`));
  await reader.connect();
  const admin = new Admin({ points: [DELIVERED_POINT, WORKER_POINT], switches: ['ack_fail_rate'] });
  if (c['admin-listen']) admin.listen(...hostPort(c['admin-listen'], '--admin-listen').reverse());
  for (;;) {
    try {
      await redis.xGroupCreate(STREAM, GROUP, '0', { MKSTREAM: true });
      break;
    } catch (err) {
      if (/BUSYGROUP/.test(err.message)) break;
      console.error(`creating the group: ${err.message}`);
      await sleep(200);
    }
  }
  console.error(`${c.id} variant=${c.variant} consuming`);
  for (;;) {
    try {
      if (c.variant === 'fixed') {
        // Messages another worker took and never acked (killed, or its ack lost).
        const claimed = await redis.xAutoClaim(STREAM, GROUP, c.id, c.visibility, '0-0', { COUNT: 10 });
        for (const msg of claimed.messages.filter(Boolean)) {
          const [pending] = await redis.xPendingRange(STREAM, GROUP, msg.id, msg.id, 1);
          await handle(c, db, redis, admin, msg, pending ? pending.deliveriesCounter : 2);
        }
      }
      const read = await reader.xReadGroup(GROUP, c.id, { key: STREAM, id: '>' }, {
        COUNT: 10,
        BLOCK: 500,
        NOACK: c.variant === 'naive',
      });
      for (const msg of read ? read[0].messages : []) await handle(c, db, redis, admin, msg, 1);
    } catch (err) {
      console.error(`${c.id}: ${err.message}`);
      await sleep(100);
    }
  }
}

async function handle(c, db, redis, admin, msg, attempt) {
  let order;
  try {
    order = JSON.parse(msg.message.payload);
  } catch {
    await redis.xAck(STREAM, GROUP, msg.id); // a poison message: never deliverable
    return;
  }
  // Delivered and not applied: under NOACK (naive) already acknowledged, so
  // a crash here loses it; pending (fixed), it is claimed again later.
  await admin.reached(DELIVERED_POINT, { event_id: order.event_id });
  await apply(c, db, order, attempt);
  await admin.reached(WORKER_POINT, { event_id: order.event_id });
  if (c.variant === 'fixed' && !admin.dropAck()) await redis.xAck(STREAM, GROUP, msg.id);
}

// Reserves the order's quantity. fixed: inbox, reservation and ledger in one
// transaction, a redelivery a no-op. naive: no inbox, every delivery applies.
async function apply(c, db, order, attempt) {
  await transaction(db, async (client) => {
    if (c.variant === 'fixed') {
      const fresh = await client.query('INSERT INTO inbox VALUES ($1) ON CONFLICT DO NOTHING', [order.event_id]);
      if (fresh.rowCount === 0) return; // applied before: only its ack was lost
    }
    await client.query(
      `INSERT INTO inventory VALUES ($1, $2) ON CONFLICT (item_id)
       DO UPDATE SET reserved_qty = inventory.reserved_qty + excluded.reserved_qty`,
      [order.item_id, order.qty],
    );
    await client.query('INSERT INTO ledger VALUES ($1, $2, $3, $4, $5, $6, $7)', [
      order.event_id, order.order_id, order.item_id, order.qty, attempt, c.id, Date.now(),
    ]);
  });
}

const config = parseArgs(process.argv.slice(2));
for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => process.exit(0));
(config.role === 'api' ? runApi(config) : runWorker(config)).catch((err) => {
  console.error(`${config.role}: ${err.stack || err}`);
  process.exit(1);
});
