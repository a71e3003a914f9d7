// The package against a real server with the module, once per client library.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { randomUUID } from "node:crypto";

import { LockBusyError, LockLostError, LockNotHeldError, errorCode } from "../dist/index.js";
import { abandonedBlock, leaseMs, waitUntil } from "./helpers.mjs";
import { CLIENTS, Server, describeEachClient, infoField, raw, rawFence, sleep, withLocks } from "./servers.mjs";

const SAFE = BigInt(Number.MAX_SAFE_INTEGER);
const name = () => `lock:${randomUUID().slice(0, 12)}`;

const server = await Server.start();
after(() => server.close());

/** The fence a lock must report: exact, a bigint, never a rounded number (a fence the
 * library cannot read exactly, node-redis 4 above 2^53, rejects the acquire). */
function expectFence(kind, lock, stored) {
  assert.equal(typeof lock.fence, "bigint", kind);
  assert.equal(lock.fence, stored, kind);
}

describeEachClient(server, (lib, ctx) => {
  test("fences are exact and strictly increase", async () => {
    const key = name();
    const stored = [];
    for (let i = 0; i < 20; i++) {
      const lock = await ctx.locks.acquire(key, { ttl: 5000 });
      assert.ok(lock);
      const f = await rawFence(server.port, key);
      expectFence(lib.name, lock, f);
      stored.push(f);
      assert.equal(lock.fenceString, lock.fence.toString());
      await lock.release();
    }
    for (let i = 1; i < stored.length; i++) assert.ok(stored[i - 1] < stored[i]);
    const info = await ctx.locks.info(key);
    assert.equal(info, null);
  });

  test("busy, owner, info, extend, a retry with the same token", async () => {
    const key = name();
    const lock = await ctx.locks.acquire(key, { ttl: 5000, owner: "worker-7", token: "tok-1-000000000000" });
    assert.ok(lock);
    assert.equal(await ctx.locks.acquire(key, { ttl: 5000 }), null);
    const info = await ctx.locks.info(key);
    assert.equal(String(info.owner), "worker-7");
    expectFence(lib.name, { fence: info.fence }, await rawFence(server.port, key));
    assert.equal(await lock.owned(), lib.name !== "node-redis 4" || (await rawFence(server.port, key)) <= SAFE);
    assert.equal(await lock.extend(60_000), true);
    assert.ok((await leaseMs(server.port, key)) > 50_000);
    const again = await ctx.locks.acquire(key, { ttl: 5000, token: "tok-1-000000000000" });
    assert.ok(again, "the same token renews");
    assert.equal(again.fence, lock.fence);
    assert.equal(await ctx.locks.release(key, "wrong-token-00000000"), false);
    await lock.release();
    // As node-redlock's: releasing a lock this grant no longer holds rejects.
    await assert.rejects(lock.release(), LockNotHeldError);
    const other = await ctx.locks.acquire(key, { ttl: 5000 });
    await raw(server.port, "LOCK.FORCERELEASE", key);
    await assert.rejects(other.release(), (e) => e instanceof LockNotHeldError && !e.message.includes(other.token));
  });

  test("BLOCK hand-off in arrival order, on connections of their own", async () => {
    const key = name();
    const holder = await ctx.locks.acquire(key, { ttl: 10_000 });
    const first = await rawFence(server.port, key);
    const order = [];
    const queued = async (n) => {
      while (Number((await ctx.locks.info(key)).waiters) < n) await sleep(10);
    };
    // Each waiter starts once the one before it is queued, so arrival order is call
    // order (100 ms apart need not be: each acquire opens its own connection, which a
    // loaded machine can delay by more).
    const waiters = [];
    for (const i of [0, 1, 2]) {
      waiters.push(
        (async () => {
          const l = await ctx.locks.acquire(key, { ttl: 10_000, wait: 10_000 });
          order.push(i);
          const f = await rawFence(server.port, key);
          await sleep(20);
          await l.release();
          return f;
        })(),
      );
      await queued(i + 1);
    }
    // The client's own connection is not held up by the waiting acquires.
    const t0 = Date.now();
    await ctx.locks.info(key);
    // Not held up until a wait ends (10 s).
    assert.ok(Date.now() - t0 < 5000);
    await holder.release();
    const fences = await Promise.all(waiters);
    assert.deepEqual(order, [0, 1, 2]);
    assert.ok(first < fences[0] && fences[0] < fences[1] && fences[1] < fences[2]);
  });

  test("a wait that times out returns null and leaves no waiter", async () => {
    const key = name();
    const holder = await ctx.locks.acquire(key, { ttl: 10_000 });
    const t0 = Date.now();
    assert.equal(await ctx.locks.acquire(key, { wait: 300 }), null);
    const took = Date.now() - t0;
    assert.ok(took >= 290 && took < 5000, `took ${took}`);
    assert.equal(Number((await ctx.locks.info(key)).waiters), 0);
    await holder.release();
  });

  // The renewal timer and the cap are the package's own code, the same whatever the
  // client library; what differs per library (EXTEND sent, its replies and errors read,
  // the loss signal) is in the other tests. These two wait real time (3 s each), so they
  // run on one client of each family, as Redlock and the election do.
  const timers = lib.name === "node-redis 6" || lib.name === "ioredis 6";

  if (timers) test("using(): renews past the TTL", async () => {
    const key = name();
    // A 1.5 s lease renewed every 0.5 s: a renewal may come 1 s late on a loaded machine
    // before the lease runs out (300 ms left 0.2 s). Held until a check sent two leases
    // after the grant.
    const out = await ctx.locks.using(key, { ttl: 1500 }, async (signal, lock) => {
      const granted = Date.now();
      for (;;) {
        await sleep(200);
        const sent = Date.now() - granted;
        assert.equal(signal.aborted, false, `lost ${sent} ms after the grant`);
        assert.ok(await rawFence(server.port, key), `gone ${sent} ms after the grant`);
        if (sent > 3000) break;
      }
      return lock.token;
    });
    assert.equal(typeof out, "string");
    assert.equal(await rawFence(server.port, key), undefined, "released after the routine");
  });

  test("using(): aborts the signal when the lock is taken away; busy when held elsewhere", async () => {
    const key = name();
    await assert.rejects(
      ctx.locks.using(key, { ttl: 600 }, async (signal) => {
        await raw(server.port, "LOCK.FORCERELEASE", key);
        await new Promise((resolve) => signal.addEventListener("abort", resolve));
        throw signal.reason;
      }),
      (e) => e instanceof LockLostError && e.reason === "not-held",
    );

    const holder = await ctx.locks.acquire(key, { ttl: 5000 });
    await assert.rejects(ctx.locks.using(key, { ttl: 1000 }, async () => 1), LockBusyError);
    await holder.release();
  });

  if (timers) test("the cap on the total hold", async () => {
    const key = name();
    const t0 = Date.now();
    let seen;
    // The signal aborts at the cap, and using() rejects with that loss. A 1.5 s lease
    // capped at 3.5 s: a late renewal on a loaded machine does not lose it first.
    await assert.rejects(
      ctx.locks.using(key, { ttl: 1500, maxHold: 3500 }, async (signal) => {
        await new Promise((resolve) => signal.addEventListener("abort", resolve));
        seen = signal.reason.reason;
        return "done";
      }),
      (e) => e instanceof LockLostError && e.reason === "cap-reached",
    );
    assert.equal(seen, "cap-reached");
    const took = Date.now() - t0;
    assert.ok(took > 3450 && took < 15_000, `took ${took}`);
    // The lease runs out on the server at the cap, seen from here a little later.
    await waitUntil(async () => (await rawFence(server.port, key)) === undefined, 10_000, "the lease's end");
  });

  test("server errors keep their code", async () => {
    const key = name();
    await raw(server.port, "SET", key, "x-token-0000000000");
    await raw(server.port, "LPUSH", key + ":list", "x");
    await assert.rejects(ctx.locks.acquire(key + ":list", { ttl: 1000 }), (e) => errorCode(e) === "WRONGTYPE");
    assert.equal(await ctx.locks.acquire(key, { ttl: 1000 }), null, "a string lock counts as held");
  });

  if (lib.ioredis) {
    test("ioredis keyPrefix and commandTimeout", async () => {
      await withLocks(lib, await lib.connect(server, { keyPrefix: "app:", commandTimeout: 200 }), {}, async (l, c) => {
        const key = name();
        const holder = await l.acquire(key, { ttl: 10_000 });
        assert.ok(holder);
        assert.ok(await rawFence(server.port, "app:" + key), "the prefix is applied");
        assert.equal(await rawFence(server.port, key), undefined);
        // The control: the plain command gives up after commandTimeout.
        await assert.rejects(c.call("LOCK.ACQUIRE", "app:" + key, "TOKEN", "plain-token-000001", "BLOCK", "1000"), /timed out/i);
        await raw(server.port, "LOCK.FORCERELEASE", "app:" + key);
        await sleep(100); // the plain call's waiter gets the lock nobody listens to
        assert.equal(Number((await raw(server.port, "LOCK.FORCERELEASE", "app:" + key)).int), 1, "orphaned by commandTimeout");
        const again = await l.acquire(key, { ttl: 10_000 });
        // Our waits last as long as asked, whatever commandTimeout says.
        const t0 = Date.now();
        assert.equal(await l.acquire(key, { wait: 700 }), null);
        assert.ok(Date.now() - t0 >= 690);
        await again.release();
      });
    });
  }
});

describe("no orphan after a client-side timeout", () => {
  // The server stops (SIGSTOP) while a client waits; the holder's lease and the client's
  // own limit pass. The control: a client that gave up on its own while its BLOCK still
  // runs on the server is handed the lock on resume and holds it, unseen. Ours: BLOCK is
  // the client's own limit, so the server ends the wait (its deadline is due before the
  // lease's end is seen after a stall) and hands nothing to anyone who gave up; the
  // LOCK.RELEASE queued behind the wait would free a late grant.
  let own;
  before(async () => {
    own = await Server.start();
  });
  after(() => own?.close());

  test("control: an abandoned waiter is left holding the lock", async () => {
    const key = name();
    await raw(own.port, "LOCK.ACQUIRE", key, "PX", "300", "TOKEN", "holder-token-0001");
    const s = abandonedBlock(own.port, key, 5000); // BLOCK longer than the stop
    await sleep(100);
    own.stop();
    await sleep(1300);
    own.cont();
    await sleep(200);
    const ttl = await leaseMs(own.port, key);
    assert.ok(ttl > 20_000, `expected an orphaned grant, lease ${ttl}`);
    s.destroy();
    await raw(own.port, "LOCK.FORCERELEASE", key);
  });

  for (const lib of CLIENTS) {
    test(lib.name, async () => {
      await withLocks(lib, await lib.connect(own), { networkTimeout: 1000 }, async (locks) => {
        const key = name();
        await raw(own.port, "LOCK.ACQUIRE", key, "PX", "300", "TOKEN", "holder-token-0001");
        const before = Number(await infoField(own.port, "lock", "lock_handed_off"));
        const pending = locks.acquire(key, { ttl: 30_000, wait: 1000 });
        await sleep(100);
        own.stop();
        // Past BLOCK (1 s) + networkTimeout (1 s): the client gave up and sent LOCK.RELEASE;
        // it waits networkTimeout more for the late replies, so resume well within that.
        await sleep(2400);
        own.cont();
        assert.equal(await pending, null);
        assert.equal(Number(await infoField(own.port, "lock", "lock_handed_off")), before, "no grant after its BLOCK ended");
        assert.equal(await rawFence(own.port, key), undefined, "the lock is free");
        const second = await locks.acquire(key, { ttl: 5000 });
        assert.ok(second);
        await second.release();
      });
    });
  }
});

test("fences above 2^53 (fence-shift 20): exact bigints, or the grant given back on node-redis 4", async () => {
  const big = await Server.start([], ["fence-shift", "20"]);
  try {
    for (const lib of CLIENTS) {
      await withLocks(lib, await lib.connect(big), {}, async (locks) => {
        const key = name();
        if (lib.name === "node-redis 4") {
          await assert.rejects(locks.acquire(key, { ttl: 5000 }), /above 2\^53 and node-redis 4 cannot read it exactly; the grant was released/);
          assert.equal(await rawFence(big.port, key), undefined, "given back");
          return;
        }
        const lock = await locks.acquire(key, { ttl: 5000 });
        assert.ok(lock.fence > SAFE, String(lock.fence));
        assert.equal(lock.fence, await rawFence(big.port, key), lib.name);
        await lock.release();
      });
    }
  } finally {
    big.close();
  }
});
