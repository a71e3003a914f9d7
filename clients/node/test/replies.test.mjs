// The defaults that read what the server itself answers, against real servers: no
// credential or token in any error (a password the server asks for, the server gone), a
// missing module named as such (the server's own unknown-command error), grants confirmed
// on the replicas (ROLE, WAIT) and surviving a failover (issue 22 items 2, 3; issue 20
// item 3). These replies are what differs between servers, so this file runs on every
// server of the Makefile's PKG_TEST_SERVERS (NODE_TESTS_EVERY_SERVER); the rest of the
// defaults is in defaults.test.mjs.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { describe, test } from "node:test";
import { inspect } from "node:util";

import * as redis4 from "redis4";
import * as redis5 from "redis5";
import * as redis6 from "redis";
import IORedis5 from "ioredis5";
import IORedis6 from "ioredis";

import { LockClient, LockNotConfirmedError, ModuleNotLoadedError } from "../dist/index.js";
import { Pair, PlainServer, timed } from "./helpers.mjs";
import { CLIENTS, Server, raw, rawFence, sleep } from "./servers.mjs";

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

function allText(e) {
  return `${String(e)}\n${e?.stack ?? ""}\n${inspect(e, { depth: 5 })}`;
}

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
