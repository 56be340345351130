'use strict';
// haunt's admin protocol for a Node service: hold points, where a kill or a
// pause of the node waits for work in flight, and fault hooks, switches that
// haunt flips inside the node (docs/admin.md of haunt's repository). Node's
// own modules only.
//
//   const { Admin } = require('haunt-admin');
//   const admin = new Admin({ points: ['after-effect-before-ack'], switches: ['ack_fail_rate'] });
//   admin.listen(9101, '127.0.0.1');          // or admin.handle(req, res) in your own server
//   ...
//   await apply(msg);
//   await admin.reached('after-effect-before-ack', { messages: 1 });
//   if (!admin.dropAck()) msg.ack();
//
// Nothing is served and every call is a no-op unless HAUNT_ADMIN_TOKEN is
// set: haunt sets it for each node that declares `admin` in its system file.

const http = require('node:http');

const TOKEN_VAR = 'HAUNT_ADMIN_TOKEN';
const HOLD_MS_MAX = 30000;
// The switches a node may offer: true for a rate (0 to 1), false for a whole offset.
const RATES = { ack_fail_rate: true, db_error_rate: true, clock_offset_ms: false };

class Refused extends Error {
  constructor(field, message) {
    super(message);
    this.field = field;
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function object(body, allowed) {
  let value;
  try {
    value = JSON.parse(body);
  } catch (err) {
    throw new Refused(null, `the body is not JSON: ${err.message}`);
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new Refused(null, 'the body must be a JSON object');
  }
  for (const field of Object.keys(value)) {
    if (!allowed.includes(field)) {
      throw new Refused(field, `unknown field ${JSON.stringify(field)} (known: ${allowed.join(', ') || 'none'})`);
    }
  }
  return value;
}

function whole(body, field, low, high) {
  const value = body[field];
  if (value === undefined) throw new Refused(field, `${field} is missing`);
  if (!Number.isInteger(value)) throw new Refused(field, `${field} must be an integer`);
  if (value < low || value > high) throw new Refused(field, `${field} must be within ${low}..=${high}, got ${value}`);
  return value;
}

class Admin {
  constructor({ points = [], switches = [], token = process.env[TOKEN_VAR] } = {}) {
    for (const s of switches) {
      if (!(s in RATES)) throw new Error(`haunt-admin: unknown switch ${s}; known: ${Object.keys(RATES).join(', ')}`);
    }
    this.token = token || '';
    this.points = [...points];
    this.switches = Object.fromEntries(switches.map((s) => [s, 0]));
    this.arm = null;
  }

  get enabled() {
    return this.token !== '';
  }

  // At hold point `point`: if haunt armed it, say so and hold still. Resolves
  // at once when nothing is armed there. `info` goes into haunt's record.
  async reached(point, info = {}) {
    const arm = this.arm;
    if (arm === null || arm.point !== point) return;
    this.arm = null;
    arm.tell({ held: true, point, ...info });
    await sleep(arm.holdMs);
  }

  dropAck() {
    const rate = this.switches.ack_fail_rate || 0;
    return rate > 0 && Math.random() < rate;
  }

  dbError() {
    const rate = this.switches.db_error_rate || 0;
    return rate > 0 && Math.random() < rate;
  }

  // This node's clock in ms since the epoch, skewed by the clock-skew hook.
  nowMs() {
    return Date.now() + (this.switches.clock_offset_ms || 0);
  }

  async hold(raw) {
    const body = object(raw, ['point', 'wait_ms', 'hold_ms']);
    let point = body.point;
    if (point === undefined && this.points.length === 1) point = this.points[0];
    if (point === undefined) throw new Refused('point', `point is missing (points: ${this.points.join(', ')})`);
    if (!this.points.includes(point)) {
      throw new Refused('point', `no hold point ${JSON.stringify(point)} here (points: ${this.points.join(', ') || 'none'})`);
    }
    const waitMs = whole(body, 'wait_ms', 1, HOLD_MS_MAX);
    const holdMs = whole(body, 'hold_ms', 1, HOLD_MS_MAX);
    let timer;
    const answer = new Promise((resolve) => {
      // A second request replaces the first.
      const arm = { point, holdMs, tell: resolve };
      this.arm = arm;
      timer = setTimeout(() => {
        if (this.arm === arm) this.arm = null;
        resolve({ held: false });
      }, waitMs);
    });
    const out = await answer;
    clearTimeout(timer);
    return out;
  }

  setFaults(raw) {
    const body = object(raw, Object.keys(this.switches));
    const next = { ...this.switches };
    for (const [field, value] of Object.entries(body)) {
      if (RATES[field]) {
        if (typeof value !== 'number') throw new Refused(field, `${field} must be a number`);
        if (value < 0 || value > 1) throw new Refused(field, `${field} must be within 0..=1, got ${value}`);
        next[field] = value;
      } else {
        next[field] = whole(body, field, -Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER);
      }
    }
    this.switches = next;
    return { ...next };
  }

  // Answers an admin request; resolves false (and writes nothing) for a path
  // outside /admin/ or when no token is set, so a server can fall through.
  async handle(req, res) {
    const path = (req.url || '').split('?')[0];
    if (!this.enabled || !path.startsWith('/admin/')) return false;
    const reply = (status, body) => {
      const data = JSON.stringify(body);
      res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) });
      res.end(data);
      return true;
    };
    if (req.headers.authorization !== `Bearer ${this.token}`) {
      return reply(401, { error: 'a bearer token is required', field: null });
    }
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const body = Buffer.concat(chunks).toString('utf8');
    try {
      const route = `${req.method} ${path}`;
      if (route === 'GET /admin/points') return reply(200, { points: this.points });
      if (route === 'GET /admin/faults') return reply(200, { ...this.switches });
      if (route === 'POST /admin/faults') return reply(200, this.setFaults(body));
      if (route === 'POST /admin/hold') return reply(200, await this.hold(body));
      return reply(404, { error: `no route ${route}`, field: null });
    } catch (err) {
      if (err instanceof Refused) return reply(422, { error: err.message, field: err.field });
      throw err;
    }
  }

  // Serves the protocol on port and host; null when no token is set.
  listen(port, host = '127.0.0.1') {
    if (!this.enabled) return null;
    const server = http.createServer((req, res) => {
      this.handle(req, res).then((done) => {
        if (!done) {
          res.writeHead(404, { 'content-type': 'application/json' });
          res.end('{"error": "not found", "field": null}');
        }
      });
    });
    server.listen(port, host);
    return server;
  }
}

module.exports = { Admin, TOKEN_VAR, HOLD_MS_MAX };
