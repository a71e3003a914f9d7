// What the package does by default, against real servers, once per client library:
// every call bounded while the server is down; no credential or token in any error; a
// missing module named as such; a lost lock reported (using() rejects, release()
// rejects, the signal aborts at the lease's end); nothing keeps the process alive after
// the user's quit(); once-per-period runs with releaseOnExit: false; grants confirmed on
// the replicas (WAIT) and surviving a failover (issue 22 items 1-3, 5-7, 11; issue 20 item 3).

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { inspect } from "node:util";

import * as redis4 from "redis4";
import * as redis5 from "redis5";
import * as redis6 from "redis";
import IORedis5 from "ioredis5";
import IORedis6 from "ioredis";

import { LockClient, LockLostError, LockNotConfirmedError, LockNotHeldError, ModuleNotLoadedError } from "../dist/index.js";
import { Pair, PlainServer, leaseMs, waitUntil } from "./helpers.mjs";
import { CLIENTS, MODULE, SERVER_BIN, Server, raw, rawFence, sleep } from "./servers.mjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const name = () => `def:${randomUUID().slice(0, 12)}`;
const SECRET_TOKEN = "secret-token-4f1c2a9e7d";
const PASSWORD = "hunter2-pass-8c1e";

/** A client of `lib` on `port` with `password` (no error handler left unset). */
async function connectWith(lib, port, password) {
  const nodeRedis = { "node-redis 4": redis4, "node-redis 5": redis5, "node-redis 6": redis6 }[lib.name];
  if (nodeRedis) {
    const auth = password ? `:${password}@` : "";
    const c = nodeRedis.createClient({ url: `redis://${auth}127.0.0.1:${port}` });
    c.on("error", () => {});
    await c.connect();
    return c;
  }
  const Ctor = lib.name === "ioredis 5" ? IORedis5 : IORedis6;
  const c = new Ctor(port, "127.0.0.1", password ? { password } : {});
  c.on("error", () => {});
  await new Promise((r, j) => {
    c.once("ready", r);
    c.once("end", () => j(new Error("ended")));
  });
  return c;
}

async function timed(fn) {
  const t0 = Date.now();
  try {
    await fn();
    return { ms: Date.now() - t0, error: undefined };
  } catch (error) {
    return { ms: Date.now() - t0, error };
  }
}

function allText(e) {
  return `${String(e)}\n${e?.stack ?? ""}\n${inspect(e, { depth: 5 })}`;
}

// ---------------------------------------------------------------- 1. bounded calls

describe("every call is bounded while the server is down", () => {
  for (const lib of CLIENTS) {
    test(lib.name, async () => {
      const own = await Server.start();
      const client = await lib.connect(own);
      const locks = new LockClient(client, { networkTimeout: 500 });
      try {
        const held = await locks.acquire(name(), { ttl: 30_000 });
        assert.ok(held);
        own.close(); // SIGKILL
        await sleep(50);
        for (const [what, call] of [
          ["acquire({ ttl, wait })", () => locks.acquire(name(), { ttl: 1000, wait: 500 })],
          ["acquire({ ttl })", () => locks.acquire(name(), { ttl: 1000 })],
          ["lock.release()", () => held.release()],
          ["info()", () => locks.info(name())],
        ]) {
          const { ms, error } = await timed(call);
          assert.ok(error, `${what} rejected`);
          assert.ok(ms < 500 * 2 + 1000, `${what}: ${ms} ms`);
        }
      } finally {
        await locks.close();
        await lib.close(client);
        own.close();
      }
    });
  }
});

// ---------------------------------------------------------------- 2. nothing secret in errors

describe("no credential or token in errors; a missing module named as such", () => {
  for (const lib of CLIENTS) {
    test(lib.name, async () => {
      const own = await Server.start();
      await raw(own.port, "CONFIG", "SET", "requirepass", PASSWORD);
      const client = await connectWith(lib, own.port, PASSWORD);
      const locks = new LockClient(client, { networkTimeout: 500 });
      const plain = await PlainServer.start();
      const plainClient = await connectWith(lib, plain.port);
      const plainLocks = new LockClient(plainClient, { networkTimeout: 500 });
      try {
        // The control: the server's own message echoes the arguments, the token too.
        const echoed = await raw(plain.port, "LOCK.ACQUIRE", "k", "PX", "1000", "TOKEN", SECRET_TOKEN);
        assert.ok(echoed.message.includes(SECRET_TOKEN));
        for (const wait of [undefined, 500]) {
          const { error } = await timed(() => plainLocks.acquire(name(), { ttl: 1000, wait, token: SECRET_TOKEN }));
          assert.ok(error instanceof ModuleNotLoadedError, String(error));
          assert.match(error.message, new RegExp(`the redis-lock module is not loaded on [^ ]*:${plain.port}`));
          assert.ok(!allText(error).includes(SECRET_TOKEN));
        }
        const held = await locks.acquire(name(), { ttl: 30_000, token: SECRET_TOKEN });
        assert.ok(held);
        own.close();
        await sleep(50);
        const errors = [];
        for (const call of [
          () => locks.acquire(name(), { ttl: 1000, token: SECRET_TOKEN }),
          () => locks.acquire(name(), { ttl: 1000, wait: 300, token: SECRET_TOKEN }),
          () => held.release(),
        ]) {
          errors.push((await timed(call)).error);
        }
        for (const e of errors) {
          assert.ok(e, "rejected");
          const text = allText(e);
          assert.ok(!text.includes(PASSWORD) && !text.includes(SECRET_TOKEN), text);
        }
      } finally {
        await locks.close();
        await plainLocks.close();
        await lib.close(client);
        await lib.close(plainClient);
        own.close();
        plain.close();
      }
    });
  }
});

// ---------------------------------------------------------------- 5. a lost lock is loud

describe("a lost lock is reported", () => {
  let server;
  before(async () => {
    server = await Server.start();
  });
  after(() => server?.close());
  for (const lib of CLIENTS) {
    test(lib.name, async () => {
      const client = await lib.connect(server);
      const locks = new LockClient(client);
      try {
        // using() rejects when the lock was lost, even if the routine resolved.
        const key = name();
        await assert.rejects(
          locks.using(key, { ttl: 600 }, async (signal) => {
            await raw(server.port, "LOCK.FORCERELEASE", key);
            await waitUntil(() => signal.aborted, 2000, "the signal");
            return "done";
          }),
          (e) => e instanceof LockLostError && e.reason === "not-held",
        );
        // Without renewal the signal aborts at the lease's end (never before; the upper
        // bound only guards against a signal that never comes).
        const t0 = Date.now();
        const shortKey = name();
        const lock = await locks.acquire(shortKey, { ttl: 300 });
        await new Promise((resolve) => lock.signal.addEventListener("abort", resolve));
        const took = Date.now() - t0;
        assert.equal(lock.lostReason, "expired");
        assert.ok(took >= 280 && took < 5000, `aborted after ${took} ms`);
        // The server's lease ends a little later than the client's view of it (the grant
        // was made after the acquire was sent): wait for it, not 100 ms.
        await waitUntil(async () => (await rawFence(server.port, shortKey)) === undefined, 10_000, "the lease's end");
        await assert.rejects(lock.release(), LockNotHeldError);
        // A lock acquired without a TTL learns the server's default lease.
        const dflt = await locks.acquire(name());
        await sleep(100);
        assert.equal(dflt.signal.aborted, false);
        await dflt.release();
      } finally {
        await locks.close();
        await lib.close(client);
      }
    });
  }
});

/** Runs `node test/<script> args...` and resolves with { code, out, ms }. */
function runNode(script, args, ms = 20_000) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const p = spawn(process.execPath, [path.join(HERE, script), ...args], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    p.stdout.on("data", (d) => (out += d));
    p.stderr.on("data", (d) => (out += d));
    const t = setTimeout(() => p.kill("SIGKILL"), ms);
    p.on("exit", (code, signal) => {
      clearTimeout(t);
      resolve({ code, signal, out, ms: Date.now() - t0 });
    });
  });
}

test("nothing keeps the process alive after the user's client quits (no locks.close())", async () => {
  const server = await Server.start();
  try {
    for (const lib of CLIENTS) {
      const r = await runNode("exit-child.mjs", [lib.name, String(server.port)], 15_000);
      assert.equal(r.code, 0, `${lib.name}: ${r.signal ?? ""} ${r.out}`);
      assert.match(r.out, /released/);
      assert.ok(r.ms < 10_000, `${lib.name}: exited after ${r.ms} ms`);
    }
  } finally {
    server.close();
  }
});

test("nor after the server died and the user closed the client", async () => {
  for (const lib of CLIENTS) {
    const server = await Server.start();
    try {
      const r = await runNode("exit-child.mjs", [lib.name, String(server.port), String(server.pid)], 15_000);
      assert.equal(r.code, 0, `${lib.name}: ${r.signal ?? ""} ${r.out}`);
      assert.match(r.out, /released[\s\S]*closed/);
      assert.ok(r.ms < 10_000, `${lib.name}: exited after ${r.ms} ms`);
    } finally {
      server.close();
    }
  }
});

// ---------------------------------------------------------------- 3. once per period

async function cron(server, key, keep) {
  const skews = [0, 300, 900, 1400, 2000]; // cron on five servers, 0-2 s apart
  const children = skews.map((s) => {
    const p = spawn(process.execPath, [path.join(HERE, "cron-child.mjs"), String(server.port), String(s), key, keep], { stdio: ["pipe", "pipe", "pipe"] });
    const child = { out: "", ready: undefined, done: undefined };
    child.ready = new Promise((resolve) =>
      p.stdout.on("data", (d) => {
        child.out += d;
        if (child.out.includes("ready")) resolve();
      }),
    );
    p.stderr.on("data", (d) => (child.out += d));
    child.done = new Promise((resolve) => p.on("exit", (code) => resolve(code)));
    child.start = (at) => p.stdin.end(`${at}\n`);
    return child;
  });
  // The skews count from when every process has started and connected (five Node starts
  // on a busy machine take a while).
  await Promise.race([Promise.all(children.map((c) => c.ready)), Promise.all(children.map((c) => c.done))]);
  const start = Date.now() + 100;
  for (const c of children) c.start(start);
  const codes = await Promise.all(children.map((c) => c.done));
  codes.forEach((code, i) => assert.equal(code, 0, children[i].out));
  return { runs: Number((await raw(server.port, "GET", `${key}:runs`)) ?? 0), outs: children.map((c) => c.out) };
}

test("once per period across five processes with 0-2 s of skew", async () => {
  const server = await Server.start();
  try {
    const key = name();
    const kept = await cron(server, key, "keep");
    assert.equal(kept.runs, 1, kept.outs.join("\n"));
    assert.ok((await leaseMs(server.port, key)) > 4000, "the lock stays for its lease");
    // The control: releasing when the job ends lets later servers run it again.
    const released = await cron(server, key + ":control", "release");
    assert.ok(released.runs >= 2, released.outs.join("\n"));
  } finally {
    server.close();
  }
});

test("hold: kept until the hold after the grant when the routine succeeds, released when it fails", async () => {
  const server = await Server.start();
  const lib = CLIENTS.find((l) => l.name === "node-redis 6");
  const client = await lib.connect(server);
  const locks = new LockClient(client);
  try {
    const key = name();
    const t0 = Date.now();
    // The routine outlasts the lease (renewed meanwhile); the lock then stays for the hold.
    // A 1.5 s lease: a renewal may come 1 s late on a loaded machine (300 ms left 0.2 s).
    await locks.using(key, { ttl: 1500, hold: 5000 }, () => sleep(2000));
    const left = await leaseMs(server.port, key);
    const elapsed = Date.now() - t0;
    // What is left of the hold (not a 1.5 s lease): between its end seen from now and
    // from the routine's end.
    assert.ok(left >= 5000 - elapsed - 50 && left <= 5000 - 2000 + 50, `lease ${left} ms after ${elapsed} ms`);
    const failing = name();
    await assert.rejects(locks.using(failing, { ttl: 300, hold: 3000 }, async () => Promise.reject(new Error("report failed"))), /report failed/);
    assert.equal(await rawFence(server.port, failing), undefined, "released: another server may run it");
  } finally {
    await locks.close();
    await lib.close(client);
    server.close();
  }
});

// ---------------------------------------------------------------- 9. confirmed grants

describe("grants are confirmed on the replicas", () => {
  for (const lib of CLIENTS.filter((l) => l.name === "node-redis 4" || l.name.endsWith(" 6"))) {
    test(lib.name, async () => {
      const pair = await Pair.start();
      const client = await lib.connect(pair.primary);
      const locks = new LockClient(client, { networkTimeout: 500 });
      // Grants that must be confirmed get 10 s (a loaded machine); the refused ones 500 ms.
      const patient = new LockClient(client, { networkTimeout: 10_000 });
      try {
        const ok = await patient.acquire(name(), { ttl: 10_000 });
        assert.ok(ok, "confirmed with the replica running");
        await ok.release();
        pair.replica.stop();
        try {
          for (const wait of [undefined, 1000]) {
            const key = name();
            const { ms, error } = await timed(() => locks.acquire(key, { ttl: 10_000, wait }));
            assert.ok(error instanceof LockNotConfirmedError, String(error));
            assert.match(error.message, /0 of 1 replica/);
            assert.ok(ms < 500 * 2 + 1500, `${ms} ms`);
            assert.equal(await rawFence(pair.primary.port, key), undefined, "the grant was given back");
          }
          const key = name();
          const unconfirmed = await locks.acquire(key, { ttl: 10_000, confirm: false });
          assert.ok(unconfirmed, "confirm: false returns the grant");
          assert.equal(await rawFence(pair.primary.port, key), unconfirmed.fence);
          await unconfirmed.release();
        } finally {
          pair.replica.cont();
        }
        await assert.rejects(
          new LockClient(client, { replicas: 2 }).acquire(name(), { ttl: 1000 }),
          (e) => e instanceof LockNotConfirmedError && /2 replica\(s\) expected \(replicas\) but 1 online/.test(e.message),
        );
        // Grants survive a SIGKILL failover: every one is on the promoted replica.
        const held = [];
        for (let i = 0; i < 20; i++) held.push(await patient.acquire(name(), { ttl: 60_000, wait: i % 2 ? 1000 : undefined }));
        pair.primary.close();
        await pair.promote();
        for (const lock of held) {
          assert.equal(await rawFence(pair.replica.port, lock.name), lock.fence, lock.name);
        }
      } finally {
        await locks.close();
        await patient.close();
        await Promise.resolve()
          .then(() => lib.close(client))
          .catch(() => {});
        pair.close();
      }
    });
  }
});

test("a replica in its full sync is not counted: locks are granted and reach it with its sync", async () => {
  const pair = await Pair.start({ syncing: true });
  const held = [];
  try {
    for (const lib of CLIENTS.filter((l) => l.name === "node-redis 4" || l.name.endsWith(" 6"))) {
      const client = await lib.connect(pair.primary);
      const locks = new LockClient(client, { networkTimeout: 500 });
      try {
        for (const wait of [undefined, 1000]) {
          const lock = await locks.acquire(name(), { ttl: 30_000, wait });
          assert.ok(lock, `${lib.name}, wait ${wait}`);
          held.push(lock);
        }
        // A deployment that expects a replica refuses before acquiring anything.
        const key = name();
        await assert.rejects(
          locks.acquire(key, { ttl: 30_000, replicas: 1 }),
          (e) => e instanceof LockNotConfirmedError && /1 replica\(s\) expected \(replicas\) but 0 online/.test(e.message),
        );
        assert.equal(await rawFence(pair.primary.port, key), undefined);
      } finally {
        await locks.close();
        await lib.close(client);
      }
    }
    assert.equal(await pair.replicaState(), "wait_bgsave", "all of it ran during the sync");
    await pair.finishSync();
    for (const lock of held) assert.equal(await rawFence(pair.replica.port, lock.name), lock.fence, lock.name);
  } finally {
    pair.close();
  }
});

void MODULE;
void SERVER_BIN;
