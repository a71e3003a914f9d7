// What the package does by default, against real servers, once per client library:
// every call bounded while the server is down; a lost lock reported (using() rejects,
// release() rejects, the signal aborts at the lease's end); nothing keeps the process
// alive after the user's quit(); once-per-period runs with releaseOnExit: false (issue 22
// items 1, 5-7, 11). The defaults that read the server's own replies (its errors, ROLE
// and WAIT for the replicas) are in replies.test.mjs, which runs on every server of the
// Makefile's PKG_TEST_SERVERS; this file runs on the first.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import { LockClient, LockLostError, LockNotHeldError } from "../dist/index.js";
import { leaseMs, timed, waitUntil } from "./helpers.mjs";
import { CLIENTS, MODULE, SERVER_BIN, Server, raw, rawFence, sleep } from "./servers.mjs";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const name = () => `def:${randomUUID().slice(0, 12)}`;

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
  // A server of its own per library, so the five children run at once (each mostly
  // waits for its call to the dead server to give up).
  await Promise.all(
    CLIENTS.map(async (lib) => {
      const server = await Server.start();
      try {
        const r = await runNode("exit-child.mjs", [lib.name, String(server.port), String(server.pid)], 15_000);
        assert.equal(r.code, 0, `${lib.name}: ${r.signal ?? ""} ${r.out}`);
        assert.match(r.out, /released[\s\S]*closed/);
        assert.ok(r.ms < 10_000, `${lib.name}: exited after ${r.ms} ms`);
      } finally {
        server.close();
      }
    }),
  );
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

void MODULE;
void SERVER_BIN;
