// The package on a three-master Redis Cluster, once per client library: every LOCK.*
// call goes to the key's master (no MOVED), fences are exact per node, BLOCK hand-off
// works on a dedicated connection to the right node, ioredis keyPrefix is honoured, a
// session lives on every master it has locks on.

import assert from "node:assert/strict";
import { after, test } from "node:test";

import { slotOf } from "../dist/index.js";
import { CLIENTS, Cluster, describeEachClusterClient, raw, rawFence, sleep, withLocks } from "./servers.mjs";

const NAMES = Array.from({ length: 12 }, (_, i) => `cl:${i}`);

const cluster = await Cluster.start(3);
after(() => cluster.close());

test("slotOf matches CLUSTER KEYSLOT", async () => {
  for (const k of [...NAMES, "{user1}.a", "a{}b", "{x", "app:job", "ключ"]) {
    assert.equal(slotOf(k), Number((await raw(cluster.nodes[0].port, "CLUSTER", "KEYSLOT", k)).int), k);
  }
});

test("the control: a LOCK.* call on the wrong node is counted as a redirect", async () => {
  const owner = await cluster.nodeFor(NAMES[0]);
  const wrong = cluster.nodes.find((n) => n !== owner);
  const before = await cluster.redirects();
  const reply = await raw(wrong.port, "LOCK.INFO", NAMES[0]);
  assert.match(reply.message, /^MOVED /);
  assert.equal(await cluster.redirects(), before + 1);
});

test("one keepalive per master keeps a session's locks on all of them past two TTLs", async () => {
  const lib = CLIENTS.find((c) => c.name === "node-redis 6");
  await withLocks(lib, await lib.cluster(cluster.nodes[2].port), {}, async (locks) => {
    // 3 s: a keepalive every second may come 2 s late (a loaded machine's pause) before
    // the session is given up; with 1 s it had 0.67 s.
    const session = locks.session({ ttl: 3000 });
    const held = new Map();
    for (const n of NAMES) held.set(n, await session.acquire(n));
    await sleep(6500);
    for (const [n, lock] of held) assert.equal(await rawFence((await cluster.nodeFor(n)).port, n), lock.fence, n);
    assert.equal(session.signal.aborted, false);
    assert.equal(await session.close(), NAMES.length);
    for (const node of cluster.nodes) assert.equal(await raw(node.port, "LOCK.SESSION", "INFO", session.id), null);
  });
});

describeEachClusterClient(cluster.nodes[0].port, (lib, ctx) => {
  test("locks on every master, exact fences, no MOVED", async () => {
    const owners = new Set();
    for (const n of NAMES) owners.add((await cluster.nodeFor(n)).port);
    assert.equal(owners.size, 3);
    await ctx.locks.info(NAMES[0]); // let the client learn the slots
    const before = await cluster.redirects();
    for (const n of NAMES) {
      const node = await cluster.nodeFor(n);
      for (const wait of [undefined, 1000]) {
        const lock = await ctx.locks.acquire(n, { ttl: 5000, wait });
        assert.ok(lock, `${n} wait=${wait}`);
        const stored = await rawFence(node.port, n);
        assert.equal(lock.fence, stored);
        assert.equal(await lock.extend(6000), true);
        await lock.release();
      }
    }
    assert.equal(await cluster.redirects(), before, "every call went to the key's master");
  });

  test("BLOCK hand-off on the key's node", async () => {
    const n = NAMES[7];
    const holder = await ctx.locks.acquire(n, { ttl: 10_000 });
    const pending = ctx.locks.acquire(n, { ttl: 10_000, wait: 5000 });
    while (Number((await ctx.locks.info(n)).waiters) < 1) await sleep(10);
    await holder.release();
    const lock = await pending;
    assert.ok(lock);
    assert.ok(await rawFence((await cluster.nodeFor(n)).port, n));
    await lock.release();
  });

  test("a session on every master: opened on each, closed on each", async () => {
    const session = ctx.locks.session({ ttl: 5000 });
    for (const n of NAMES) {
      const lock = await session.acquire(n, { wait: n === NAMES[0] ? 1000 : undefined });
      assert.equal(lock.fence, await rawFence((await cluster.nodeFor(n)).port, n), n);
    }
    const info = await session.info();
    assert.equal(Object.keys(info).length, 3, "opened on each master");
    assert.equal(Object.values(info).reduce((sum, i) => sum + Number(i.locks), 0), NAMES.length);
    assert.equal(await session.close(), NAMES.length);
    for (const n of NAMES) assert.equal(await rawFence((await cluster.nodeFor(n)).port, n), undefined, n);
  });

  if (lib.ioredis) {
    test("keyPrefix is applied and routed by the prefixed key", async () => {
      await withLocks(lib, await lib.cluster(cluster.nodes[1].port, { keyPrefix: "app:" }), {}, async (l) => {
        const before = await cluster.redirects();
        for (const n of NAMES) {
          const lock = await l.acquire(n, { ttl: 5000 });
          assert.ok(lock);
          assert.equal(lock.fence, await rawFence((await cluster.nodeFor("app:" + n)).port, "app:" + n));
          await lock.release();
        }
        assert.equal(await cluster.redirects(), before);
      });
    });
  }
});
