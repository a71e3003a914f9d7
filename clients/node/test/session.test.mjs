// Sessions: one keepalive for many locks, released together when the session ends
// (closed, its lease run out, its process gone with `bind`), and the loss signal when it
// ends without close(). The API once per client library; the longer checks on one.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import path from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";

import { LockClient, LockLostError, LockNotHeldError, SessionLostError } from "../dist/index.js";
import { waitUntil } from "./helpers.mjs";
import { CLIENTS, Server, describeEachClient, infoField, raw, rawFence, sleep, withLocks } from "./servers.mjs";

const name = () => `lock:${randomUUID().slice(0, 12)}`;
const HERE = path.dirname(fileURLToPath(import.meta.url));
const [NODE_REDIS_6, IOREDIS_6] = ["node-redis 6", "ioredis 6"].map((n) => CLIENTS.find((c) => c.name === n));

const server = await Server.start();
after(() => server.close());

async function waiters(port, key) {
  const info = await raw(port, "LOCK.INFO", key);
  if (info === null) return 0;
  for (let i = 0; i + 1 < info.length; i += 2) if (info[i] === "waiters") return Number(info[i + 1].int);
  return 0;
}

const counter = async (field) => Number(await infoField(server.port, "lock", field));

describeEachClient(server, (lib, ctx) => {
  test("locks in a session: kinds, waiting, release, keepalive, close releases the rest", async () => {
    const k = name();
    const session = ctx.locks.session({ ttl: 5000, owner: "job-7" });
    const a = await session.acquire(`${k}:a`);
    const b = await session.acquire(`${k}:b`, { shared: true });
    const c = await ctx.locks.acquire(`${k}:c`, { session, limit: 2 });
    for (const [key, lock] of [[`${k}:a`, a], [`${k}:b`, b], [`${k}:c`, c]]) {
      assert.ok(lock, key);
      assert.equal(lock.session, session);
      assert.equal(await lock.check(), true, key); // LOCK.CHECK: a holder with its fence
    }
    assert.equal(a.fence, await rawFence(server.port, `${k}:a`));
    await assert.rejects(a.extend(10_000), /session/);
    await assert.rejects(ctx.locks.acquire(`${k}:d`, { session, ttl: 1000 }), TypeError);
    const [info] = Object.values(await session.info());
    assert.equal(Number(info.locks), 3);
    assert.equal(String(info.owner), "job-7");
    assert.equal(await session.keepalive(), true);
    // Waiting in the session: served when the holder releases.
    const holder = await ctx.locks.acquire(`${k}:busy`, { ttl: 10_000 });
    const pending = session.acquire(`${k}:busy`, { wait: 5000 });
    await waitUntil(async () => (await waiters(server.port, `${k}:busy`)) === 1, 5000, "a waiter in the session");
    await holder.release();
    const waited = await pending;
    assert.ok(waited);
    await a.release();
    assert.equal(await raw(server.port, "LOCK.INFO", `${k}:a`), null);
    assert.equal(await session.close(), 3, "b, c and the waited one");
    for (const s of ["b", "c", "busy"]) assert.equal(await raw(server.port, "LOCK.INFO", `${k}:${s}`), null, s);
    assert.equal(await raw(server.port, "LOCK.SESSION", "INFO", session.id), null);
    assert.equal(session.isClosed, true);
    assert.equal(session.signal.aborted, false, "closed, not lost");
    assert.equal(b.held, false);
    await assert.rejects(b.release(), LockNotHeldError);
    await assert.rejects(session.acquire(`${k}:e`), /closed/);
  });
});

test("one keepalive keeps ten locks held past several TTLs", async () => {
  await withLocks(NODE_REDIS_6, await NODE_REDIS_6.connect(server), {}, async (locks) => {
    const k = name();
    // A 3 s session: a keepalive every second may come 2 s late (a loaded machine's
    // pause) before the session is given up; with 1 s it had 0.67 s.
    const session = locks.session({ ttl: 3000 });
    const held = [];
    for (let i = 0; i < 10; i++) held.push(await session.acquire(`${k}:${i}`, i === 8 ? { shared: true } : i === 9 ? { limit: 2 } : {}));
    const control = await locks.acquire(`${k}:control`, { ttl: 1000 });
    const [keepalives, extended] = [await counter("lock_session_keepalives"), await counter("lock_extended")];
    const t0 = Date.now();
    await sleep(6500); // more than two TTLs
    const elapsed = Date.now() - t0;
    assert.equal(await raw(server.port, "LOCK.INFO", `${k}:control`), null, "the control's lease (1 s, not renewed) ran out");
    for (let i = 0; i < 10; i++) {
      if (i < 8) assert.equal(await rawFence(server.port, `${k}:${i}`), held[i].fence, `${k}:${i}`);
      assert.equal(await held[i].check(), true, `${k}:${i}`);
      assert.equal(held[i].signal.aborted, false);
    }
    // One KEEPALIVE per round (every third of the TTL) for all ten; a renewal per lock
    // would be ten per round.
    const rounds = (await counter("lock_session_keepalives")) - keepalives;
    assert.ok(rounds >= 3 && rounds <= elapsed / session.interval + 2, `${rounds} keepalives in ${elapsed} ms`);
    assert.equal(await counter("lock_extended"), extended, "no lock was extended on its own");
    assert.equal(await session.close(), 10);
    control.signal.aborted || (await control.release().catch(() => undefined));
  });
});

test("the loss signal: the session closed from another connection", async () => {
  await withLocks(IOREDIS_6, await IOREDIS_6.connect(server), {}, async (locks) => {
    const k = name();
    // 3 s: expired before the CLOSE below needs a keepalive 2 s late, not 0.67 s.
    const session = locks.session({ ttl: 3000 });
    const a = await session.acquire(`${k}:a`);
    await session.acquire(`${k}:b`);
    const pending = locks.acquire(`${k}:a`, { ttl: 10_000, wait: 10_000 });
    await waitUntil(async () => (await waiters(server.port, `${k}:a`)) === 1, 5000, "the waiter queued");
    assert.equal((await raw(server.port, "LOCK.SESSION", "CLOSE", session.id)).int, "2");
    const waiter = await pending;
    assert.ok(waiter, "served by the close");
    await waiter.release();
    await waitUntil(() => session.signal.aborted, 10_000, "the loss signal");
    assert.ok(session.signal.reason instanceof SessionLostError);
    assert.equal(session.lostReason, "not-held");
    assert.ok(a.signal.aborted && a.signal.reason instanceof LockLostError);
    assert.equal(a.lostReason, "not-held");
    await assert.rejects(session.acquire(`${k}:c`), SessionLostError);
    assert.equal(await session.close(), 0);
  });
});

test("the loss signal: one of the session's locks migrated to another server (a slot move)", async () => {
  const other = await Server.start();
  try {
    await withLocks(IOREDIS_6, await IOREDIS_6.connect(server), {}, async (locks) => {
      const k = name();
      const session = locks.session({ ttl: 30_000 });
      await session.acquire(`${k}:a`);
      await session.acquire(`${k}:b`);
      assert.equal(await session.keepalive(), true);
      // MIGRATE, as a slot move does to each key: the server answers the next keepalive
      // 0 (the moved lock lasts there only as long as the keepalives that reach it).
      const moved = await raw(server.port, "MIGRATE", "127.0.0.1", String(other.port), `${k}:a`, "0", "5000");
      assert.equal(moved, "OK");
      assert.equal(await session.keepalive(), false);
      assert.ok(session.signal.aborted && session.signal.reason instanceof SessionLostError);
      assert.equal(session.lostReason, "not-held");
      assert.notEqual(await raw(server.port, "LOCK.INFO", `${k}:b`), null, "held to its lease");
      assert.equal(await session.close(), 1);
    });
  } finally {
    other.close();
  }
});

test("the loss signal: a restart without persistence (a bound and an unbound session)", async () => {
  const own = await Server.start();
  try {
    await withLocks(IOREDIS_6, await IOREDIS_6.connect(own), {}, async (locks) => {
      // 6 s: the restart (a process start, 1-2 s on a loaded machine) ends well before
      // a keepalive failing meanwhile gives up (4 s).
      const plain = locks.session({ ttl: 6000 });
      const bound = locks.session({ ttl: 6000, bind: 1000 });
      assert.ok(await plain.acquire("lock:p"));
      assert.ok(await bound.acquire("lock:q"));
      await own.restart();
      await waitUntil(() => plain.signal.aborted && bound.signal.aborted, 10_000, "both lost");
      assert.equal(plain.lostReason, "not-held");
      assert.equal(bound.lostReason, "not-held");
      // The bound one's check (an OPEN on a new connection) left no session behind.
      assert.equal(await infoField(own.port, "lock", "lock_sessions"), "0");
      await plain.close();
      await bound.close();
    });
  } finally {
    own.close();
  }
});

test("a bound session ends when its process is killed: a waiter elsewhere is served within the grace", async () => {
  const k = name();
  const keys = [`${k}:0`, `${k}:1`, `${k}:2`];
  const child = spawn(process.execPath, [path.join(HERE, "session-child.mjs"), String(server.port), ...keys], { stdio: ["ignore", "pipe", "inherit"] });
  try {
    await new Promise((resolve, reject) => {
      child.stdout.once("data", (d) => (String(d).trim() === "ready" ? resolve() : reject(new Error(String(d)))));
      child.once("exit", (code) => reject(new Error(`child exited ${code}`)));
    });
    await withLocks(NODE_REDIS_6, await NODE_REDIS_6.connect(server), {}, async (locks) => {
      const pending = locks.acquire(keys[0], { ttl: 10_000, wait: 30_000 });
      await waitUntil(async () => (await waiters(server.port, keys[0])) === 1, 5000, "the waiter queued");
      const t0 = Date.now();
      child.kill("SIGKILL");
      const lock = await pending;
      const took = Date.now() - t0;
      assert.ok(lock);
      assert.ok(took >= 450 && took < 30_000, `served ${took} ms after the kill (grace 500 ms, lease 60 s)`);
      for (const key of keys.slice(1)) assert.equal(await raw(server.port, "LOCK.INFO", key), null, key);
      await lock.release();
    });
  } finally {
    child.kill("SIGKILL");
  }
});

test("a session lock under using(): the routine's signal is the session's loss", async () => {
  await withLocks(IOREDIS_6, await IOREDIS_6.connect(server), {}, async (locks) => {
    const k = name();
    const session = locks.session({ ttl: 3000 });
    const seen = await locks
      .using(k, { session }, async (signal) => {
        await raw(server.port, "LOCK.SESSION", "CLOSE", session.id);
        await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
        return signal.reason;
      })
      .catch((e) => e);
    assert.ok(seen instanceof LockLostError && seen.reason === "not-held", String(seen));
    await session.close();
  });
});

test("sessions are closed by LockClient.close()", async () => {
  const client = await IOREDIS_6.connect(server);
  const locks = new LockClient(client);
  const k = name();
  const session = locks.session({ ttl: 5000 });
  assert.ok(await session.acquire(k));
  await locks.close();
  assert.equal(session.isClosed, true);
  assert.equal(await raw(server.port, "LOCK.INFO", k), null);
  await IOREDIS_6.close(client);
});
