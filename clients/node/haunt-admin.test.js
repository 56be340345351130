'use strict';
// node --test: the protocol over real HTTP on the loopback.
const test = require('node:test');
const assert = require('node:assert/strict');
const { once } = require('node:events');
const { Admin } = require('./haunt-admin');

const TOKEN = 't0ken';

async function node() {
  const admin = new Admin({ points: ['after-effect-before-ack', 'after-lease'], switches: ['ack_fail_rate', 'clock_offset_ms'], token: TOKEN });
  const server = admin.listen(0);
  await once(server, 'listening');
  const base = `http://127.0.0.1:${server.address().port}`;
  const call = async (method, path, body, token = TOKEN) => {
    const headers = token ? { authorization: `Bearer ${token}` } : {};
    const raw = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body);
    const r = await fetch(base + path, { method, headers, body: raw });
    return [r.status, await r.json()];
  };
  return { admin, call, close: () => { server.closeAllConnections(); server.close(); } };
}

test('points are listed behind the token', async () => {
  const n = await node();
  assert.deepEqual(await n.call('GET', '/admin/points'), [200, { points: ['after-effect-before-ack', 'after-lease'] }]);
  assert.equal((await n.call('GET', '/admin/points', undefined, null))[0], 401);
  assert.equal((await n.call('GET', '/admin/points', undefined, 'wrong'))[0], 401);
  n.close();
});

test('without a token nothing is served', () => {
  const quiet = new Admin({ points: ['p'], token: '' });
  assert.equal(quiet.enabled, false);
  assert.equal(quiet.listen(0), null);
});

test('work at the armed point holds and is told', async () => {
  const n = await node();
  const work = (async () => {
    await new Promise((r) => setTimeout(r, 200));
    await n.admin.reached('after-lease', { messages: 9 }); // not armed there
    const started = Date.now();
    await n.admin.reached('after-effect-before-ack', { messages: 3 });
    return Date.now() - started;
  })();
  const answer = await n.call('POST', '/admin/hold', { point: 'after-effect-before-ack', wait_ms: 5000, hold_ms: 400 });
  assert.deepEqual(answer, [200, { held: true, point: 'after-effect-before-ack', messages: 3 }]);
  assert.ok((await work) >= 350, 'the work held still for hold_ms');
  n.close();
});

test('a hold no work meets answers false and disarms', async () => {
  const n = await node();
  assert.deepEqual(await n.call('POST', '/admin/hold', { point: 'after-lease', wait_ms: 50, hold_ms: 30000 }), [200, { held: false }]);
  const started = Date.now();
  await n.admin.reached('after-lease');
  assert.ok(Date.now() - started < 100, 'disarmed: later work goes through');
  n.close();
});

test('bad holds name their field', async () => {
  const n = await node();
  for (const [body, field] of [
    [{ point: 'after-lunch', wait_ms: 10, hold_ms: 10 }, 'point'],
    [{ wait_ms: 10, hold_ms: 10 }, 'point'],
    [{ point: 'after-lease', wait_ms: 0, hold_ms: 10 }, 'wait_ms'],
    [{ point: 'after-lease', wait_ms: 10, hold_ms: 30001 }, 'hold_ms'],
    [{ point: 'after-lease', wait_ms: 10 }, 'hold_ms'],
    [{ point: 'after-lease', wait_ms: 'soon', hold_ms: 10 }, 'wait_ms'],
    [{ point: 'after-lease', wait_ms: 10, hold_ms: 10, kill: true }, 'kill'],
    ['{not json', null],
    [[1, 2], null],
  ]) {
    const [status, answer] = await n.call('POST', '/admin/hold', body);
    assert.equal(status, 422, JSON.stringify(body));
    assert.equal(answer.field, field, JSON.stringify([body, answer]));
    assert.ok(answer.error);
  }
  n.close();
});

test('switches are set all or nothing', async () => {
  const n = await node();
  assert.deepEqual(await n.call('GET', '/admin/faults'), [200, { ack_fail_rate: 0, clock_offset_ms: 0 }]);
  assert.deepEqual(await n.call('POST', '/admin/faults', { ack_fail_rate: 1, clock_offset_ms: -5 }), [200, { ack_fail_rate: 1, clock_offset_ms: -5 }]);
  assert.equal(n.admin.dropAck(), true);
  assert.ok(Math.abs(n.admin.nowMs() + 5 - Date.now()) < 50);
  for (const [body, field] of [
    [{ ack_fail_rate: 0.5, clock_offset_ms: 'later' }, 'clock_offset_ms'],
    [{ ack_fail_rate: 1.5 }, 'ack_fail_rate'],
    [{ ack_fail_rate: true }, 'ack_fail_rate'],
    [{ db_error_rate: 0.1 }, 'db_error_rate'],
  ]) {
    const [status, answer] = await n.call('POST', '/admin/faults', body);
    assert.deepEqual([status, answer.field], [422, field], JSON.stringify(body));
  }
  assert.deepEqual((await n.call('GET', '/admin/faults'))[1], { ack_fail_rate: 1, clock_offset_ms: -5 }, 'a refused body changes nothing');
  n.close();
});

test('an unknown route is 404', async () => {
  const n = await node();
  assert.equal((await n.call('GET', '/admin/nothing'))[0], 404);
  n.close();
});
