// Leader election and guarded writes against a real server: three candidates elected in
// FIFO order as leaders resign, terms strictly increasing, an observer that sees every
// leader, every proclaim and the gap (its LOCK.WATCH calls counted in INFO
// commandstats), a leader SIGKILLed in a child process, a proclaim after the leadership
// was lost, an aborted campaign, an observer that survives a killed connection and a
// MIGRATE of the key (LOCKMOVED) and ends at once on return(); ifHeld / ifFence / check.
// The election cases run on node-redis 6 and ioredis 6, the guarded writes on every
// supported library.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { after, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import path from "node:path";

import { LockClient, LockNotHeldError } from "../dist/index.js";
import { leaseMs, waitUntil } from "./helpers.mjs";
import { CLIENTS, Server, describeEachClient, raw, sleep } from "./servers.mjs";

const name = () => `election:${randomUUID().slice(0, 12)}`;
const server = await Server.start();
after(() => server.close());

async function watchCalls(port) {
  const text = await raw(port, "INFO", "commandstats");
  const m = /cmdstat_lock\.watch:calls=(\d+)/.exec(text);
  return m ? Number(m[1]) : 0;
}

async function waiters(port, key) {
  const info = await raw(port, "LOCK.INFO", key);
  if (info === null) return 0;
  for (let i = 0; i + 1 < info.length; i += 2) if (info[i] === "waiters") return Number(info[i + 1].int);
  return 0;
}

/** Collects what an observation yields; `next(ms)` is the next state within `ms`. */
function collect(observation) {
  const seen = [];
  const wakers = [];
  const done = (async () => {
    for await (const leader of observation) {
      seen.push(leader);
      wakers.splice(0).forEach((w) => w());
    }
  })();
  return {
    done,
    async next(ms = 3000) {
      const deadline = Date.now() + ms;
      while (seen.length === 0) {
        if (Date.now() > deadline) throw new Error("the observer saw no change in time");
        await new Promise((r) => {
          wakers.push(r);
          setTimeout(r, 50);
        });
      }
      return seen.shift();
    },
    pending: () => seen.length,
  };
}

describeEachClient(server, (lib, ctx) => {
  test("guarded writes run while held and are refused after the lease", async () => {
    const key = `lock:product:${randomUUID().slice(0, 8)}`;
    const stock = `stock:${key}`;
    await raw(server.port, "SET", stock, "10");
    const a = await ctx.locks.acquire(key, { ttl: 800 });
    assert.equal(Number(await a.ifHeld("DECRBY", stock, "1")), 9);
    assert.equal(String(await ctx.locks.ifFence(key, a.fence, "SET", `price:${key}`, "1999")), "OK");
    assert.equal(await a.check(), true);
    assert.equal(await ctx.locks.check(key, a.fence), true);
    await assert.rejects(a.ifHeld("LPUSH", stock, "x"), (e) => /^WRONGTYPE/.test(e.message));
    await assert.rejects(a.ifHeld(), TypeError);

    await sleep(1000); // A "pauses" past its lease; B takes the lock and sells one
    const b = await ctx.locks.acquire(key, { ttl: 5000 });
    assert.equal(Number(await b.ifHeld("DECRBY", stock, "1")), 8);
    await assert.rejects(a.ifHeld("DECRBY", stock, "1"), (e) => {
      assert.ok(e instanceof LockNotHeldError);
      assert.ok(!e.message.includes(a.token) && e.message.includes("did not run"), e.message);
      return true;
    });
    await assert.rejects(ctx.locks.ifFence(key, a.fence, "SET", `price:${key}`, "1"), LockNotHeldError);
    assert.equal(await raw(server.port, "GET", stock), "8");
    assert.equal(await raw(server.port, "GET", `price:${key}`), "1999");
    assert.equal(await a.check(), false);
    assert.equal(await b.check(), true);

    // A refused guarded write of a renewing lock aborts its signal (not-held).
    await raw(server.port, "LOCK.FORCERELEASE", key);
    await b.startRenewal();
    await assert.rejects(b.ifHeld("SET", `other:${key}`, "1"), LockNotHeldError);
    assert.equal(b.signal.aborted, true);
    assert.equal(b.lostReason, "not-held");
    assert.equal(await raw(server.port, "GET", `other:${key}`), null);
  });

  test("leader() and a one-step hand-over", async () => {
    const key = name();
    assert.equal(await ctx.locks.leader(key), null);
    const a = await ctx.locks.campaign(key, "node-a", { ttl: 2000 });
    assert.deepEqual(await ctx.locks.leader(key), { value: "node-a", term: a.term });
    const next = ctx.locks.campaign(key, "node-b", { ttl: 2000 });
    await waitUntil(async () => (await waiters(server.port, key)) === 1, 3000, "B queued");
    assert.equal(await a.resign(), true);
    const b = await next;
    assert.ok(b.term > a.term);
    assert.deepEqual(await ctx.locks.leader(key), { value: "node-b", term: b.term });
    assert.equal(await b.resign(), true);
    assert.equal(await b.resign(), false, "resigned already");
  });
});

for (const lib of CLIENTS.filter((l) => l.name === "node-redis 6" || l.name === "ioredis 6")) {
  describe(`election: ${lib.name}`, () => {
    test("three candidates lead in FIFO order and one observer sees every change", async () => {
      const clients = await Promise.all([0, 1, 2, 3].map(() => lib.connect(server)));
      const [la_, lb_, lc_, lw] = clients.map((c) => new LockClient(c));
      try {
        const key = name();
        const before = await watchCalls(server.port);
        const started = Date.now();
        const block = 1000;
        const obs = collect(lw.observe(key, { block }));
        assert.equal(await obs.next(), null, "nobody leads yet");

        // A 20 s lease: a hand-over that waited for it to run out (not the resign's
        // release) misses the 10 s bound below, which leaves room for a loaded machine.
        const a = await la_.campaign(key, "node-a", { ttl: 20_000 });
        assert.equal(a.isLeader, true);
        assert.deepEqual(await obs.next(), { value: "node-a", term: a.term });
        let bAt = 0;
        const bP = lb_.campaign(key, "node-b", { ttl: 2000 }).then((l) => ((bAt = Date.now()), l));
        await waitUntil(async () => (await waiters(server.port, key)) === 1, 3000, "B queued");
        const cP = lc_.campaign(key, "node-c", { ttl: 2000 });
        await waitUntil(async () => (await waiters(server.port, key)) === 2, 3000, "C queued");

        await a.proclaim("node-a:8080");
        assert.equal(a.value, "node-a:8080");
        assert.deepEqual(await obs.next(), { value: "node-a:8080", term: a.term });
        assert.deepEqual(await lw.leader(key), { value: "node-a:8080", term: a.term });

        const t0 = Date.now();
        assert.equal(await a.resign(), true);
        const b = await bP;
        assert.ok(bAt - t0 < 10_000, `hand-over took ${bAt - t0} ms`);
        assert.ok(b.term > a.term);
        assert.deepEqual(await obs.next(), { value: "node-b", term: b.term });
        assert.equal(await b.resign(), true);
        const c = await cP;
        assert.ok(c.term > b.term);
        assert.deepEqual(await obs.next(), { value: "node-c", term: c.term });
        assert.equal(await c.resign(), true);
        assert.equal(await obs.next(), null);

        // Six states: the first from LOCK.INFO, then one LOCK.WATCH per change (plus one
        // per `block` without a change, and the one pending now).
        const elapsed = Date.now() - started;
        const calls = (await watchCalls(server.port)) - before;
        assert.ok(calls >= 5 && calls <= 5 + Math.floor(elapsed / block) + 2, `${calls} calls in ${elapsed} ms`);
      } finally {
        for (const l of [la_, lb_, lc_, lw]) await l.close();
        for (const c of clients) await lib.close(c);
      }
    });

    test("a leader killed with SIGKILL keeps its term until its lease ends", async () => {
      const key = name();
      const here = path.dirname(fileURLToPath(import.meta.url));
      const child = spawn(process.execPath, [path.join(here, "elect-child.mjs"), String(server.port), key], { stdio: ["ignore", "pipe", "inherit"] });
      const client = await lib.connect(server);
      const locks = new LockClient(client);
      try {
        const term = await new Promise((resolve, reject) => {
          child.stdout.once("data", (d) => resolve(BigInt(String(d).trim())));
          child.once("exit", (code) => reject(new Error(`child exited ${code}`)));
        });
        assert.deepEqual(await locks.leader(key), { value: "doomed", term });
        let at = 0;
        const heirP = locks.campaign(key, "heir", { ttl: 1000 }).then((l) => ((at = Date.now()), l));
        await waitUntil(async () => (await waiters(server.port, key)) === 1, 3000, "heir queued");
        // Never before the lease read just before the kill ends (timed from before the
        // read; a renewal after it only moves the end later; 20 ms for the server's ms
        // clock). The child's lease is 3 s: 2 s left unless its renewal ran late on a
        // loaded machine (">= 300 ms after the kill" of a 1 s lease failed then). The
        // upper bound is a hang guard.
        const sent = Date.now();
        const left = await leaseMs(server.port, key);
        assert.ok(left !== undefined, "held before the kill");
        const killedAt = Date.now();
        child.kill("SIGKILL");
        const heir = await heirP;
        const waited = at - killedAt;
        assert.ok(at - sent >= left - 20, `elected ${waited} ms after the kill, ${at - sent} ms after ${left} ms were left`);
        assert.ok(waited <= 10_000, `elected ${waited} ms after the kill`);
        assert.ok(heir.term > term);
        assert.equal(await heir.resign(), true);
      } finally {
        child.kill("SIGKILL");
        await locks.close();
        await lib.close(client);
      }
    });

    test("proclaim after the leadership was lost fails; a campaign can time out or be aborted", async () => {
      const client = await lib.connect(server);
      const locks = new LockClient(client);
      try {
        const key = name();
        const l = await locks.campaign(key, "node-a", { ttl: 3000 });
        await raw(server.port, "LOCK.FORCERELEASE", key);
        await assert.rejects(l.proclaim("node-a:2"), (e) => e instanceof LockNotHeldError && /not published/.test(e.message));
        assert.equal(l.signal.aborted, true);
        assert.equal(l.lock.lostReason, "not-held");
        assert.equal(l.isLeader, false);
        assert.equal(l.value, "node-a");
        await assert.rejects(l.proclaim("node-a:3"), LockNotHeldError);
        assert.equal(await l.resign(), false);
        await assert.rejects(locks.campaign(key, ""), TypeError);

        const holder = await locks.acquire(key, { ttl: 5000 });
        const t = Date.now();
        assert.equal(await locks.campaign(key, "late", { wait: 300 }), null);
        assert.ok(Date.now() - t >= 280);
        assert.equal(await waiters(server.port, key), 0);
        const ac = new AbortController();
        const aborted = locks.campaign(key, "quitter", { signal: ac.signal });
        await waitUntil(async () => (await waiters(server.port, key)) === 1, 3000, "queued");
        ac.abort(new Error("shutting down"));
        await assert.rejects(aborted, /shutting down/);
        await waitUntil(async () => (await waiters(server.port, key)) === 0, 3000, "left the queue");
        await holder.release();
        await sleep(100);
        assert.equal(await locks.leader(key), null, "nobody was handed the lock");
      } finally {
        await locks.close();
        await lib.close(client);
      }
    });

    test("an observer survives quiet periods, a killed connection and LOCKMOVED, and return() ends it", async () => {
      const other = await Server.start();
      const client = await lib.connect(server);
      const locks = new LockClient(client);
      try {
        const key = name();
        const t0 = Date.now();
        const before = await watchCalls(server.port);
        const observation = locks.observe(key, { block: 300 });
        const obs = collect(observation);
        assert.equal(await obs.next(), null);
        // Each 300 ms BLOCK ends without a change: nothing is yielded, the observer asks
        // again (at least twice: polled, a loaded machine may take more than the 1 s for
        // it), and once per BLOCK, not in a busy loop (the bound follows the time taken).
        await sleep(1000);
        await waitUntil(async () => (await watchCalls(server.port)) - before >= 2, 10_000, "two quiet BLOCKs");
        assert.equal(obs.pending(), 0);
        const quiet = (await watchCalls(server.port)) - before;
        const elapsed = Date.now() - t0;
        assert.ok(quiet <= Math.floor(elapsed / 300) + 2, `${quiet} calls in ${elapsed} ms of 300 ms blocks`);

        const l = await locks.campaign(key, "node-a", { ttl: 5000 });
        assert.deepEqual(await obs.next(), { value: "node-a", term: l.term });
        const list = await raw(server.port, "CLIENT", "LIST");
        const ids = list.split("\n").filter((x) => x.includes("cmd=lock.watch")).map((x) => /id=(\d+)/.exec(x)[1]);
        assert.equal(ids.length, 1);
        assert.equal(Number((await raw(server.port, "CLIENT", "KILL", "ID", ids[0])).int), 1);
        await l.proclaim("node-a:2");
        assert.deepEqual(await obs.next(), { value: "node-a:2", term: l.term });
        assert.equal(await raw(server.port, "MIGRATE", "127.0.0.1", String(other.port), key, "0", "5000"), "OK");
        assert.equal(await obs.next(), null);

        // return() while a LOCK.WATCH is pending: the iteration ends at once.
        const t = Date.now();
        await observation.return();
        await obs.done;
        // A hang guard (the BLOCK is 300 ms; a loaded machine pauses 1-2 s).
        assert.ok(Date.now() - t < 5000, `ended after ${Date.now() - t} ms`);
        await sleep(100);
        const left = (await raw(server.port, "CLIENT", "LIST")).split("\n").filter((x) => x.includes("cmd=lock.watch"));
        assert.deepEqual(left, []);
      } finally {
        await locks.close();
        await lib.close(client);
        other.close();
      }
    });
  });
}
