// Redlock on 5 real servers, on node-redis 6 and ioredis 6: a majority survives 2 nodes
// down, 3 down grants nothing and leaves nothing held, quorum fences strictly increase
// (one node's counter lifted ahead by MINFENCE), shared allowed, counted refused, extend
// needs a majority (the Rust client's semantics, client/src/redlock.rs).

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { describe, test } from "node:test";

import { Redlock } from "../dist/index.js";
import { CLIENTS, Server, raw, rawFence } from "./servers.mjs";

const name = () => `rl:${randomUUID().slice(0, 12)}`;

async function heldOn(nodes, key) {
  let n = 0;
  for (const s of nodes) if ((await rawFence(s.port, key)) !== undefined) n++;
  return n;
}

for (const lib of CLIENTS.filter((l) => l.name === "node-redis 6" || l.name === "ioredis 6")) {
  describe(`Redlock on ${lib.name}`, () => {
    test("2 of 5 down: granted; 3 down: nothing granted or held; extend needs a majority", async () => {
      const five = await Promise.all([0, 1, 2, 3, 4].map(() => Server.start()));
      const clients = await Promise.all(five.map((s) => lib.connect(s)));
      const rl = new Redlock(clients);
      try {
        assert.equal(rl.quorum, 3);
        const key = name();
        five[0].close();
        five[1].stop();
        const t0 = Date.now();
        const g = await rl.acquire(key, { ttl: 2000 });
        assert.ok(g && g.fence > 0n);
        assert.ok(Date.now() - t0 < 1500, `${Date.now() - t0} ms`);
        assert.equal(await heldOn(five.slice(2), key), 3);
        assert.ok(await g.extend(3000));
        assert.ok(await g.release());
        assert.equal(await heldOn(five.slice(2), key), 0);
        const again = await rl.acquire(key, { ttl: 3000 });
        assert.ok(again);
        five[2].stop();
        assert.equal(await again.extend(3000), false, "2 of 5 answer: no majority");
        const k2 = name();
        assert.equal(await rl.acquire(k2, { ttl: 1000, wait: 600 }), null);
        assert.equal(await heldOn(five.slice(3), k2), 0, "partial grants were released");
        five[1].cont();
        five[2].cont();
      } finally {
        await rl.close();
        for (const c of clients) await Promise.resolve().then(() => lib.close(c)).catch(() => {});
        for (const s of five) s.close();
      }
    });

    test("quorum fences strictly increase; shared allowed, counted refused", async () => {
      const five = await Promise.all([0, 1, 2, 3, 4].map(() => Server.start()));
      const clients = await Promise.all(five.map((s) => lib.connect(s)));
      const rl = new Redlock(clients);
      try {
        const key = name();
        const base = BigInt((await raw(five[0].port, "LOCK.ACQUIRE", key + ":lift", "PX", "100", "TOKEN", "lift-token-00000001"))[1].int);
        await raw(five[0].port, "LOCK.ACQUIRE", key + ":lift2", "PX", "100", "TOKEN", "lift-token-00000002", "MINFENCE", String(base + 1000n));
        const fences = [];
        for (let i = 0; i < 6; i++) {
          if (i === 3) five[0].stop();
          const g = await rl.acquire(key, { ttl: 2000 });
          assert.ok(g);
          fences.push(g.fence);
          assert.ok(await g.release());
        }
        five[0].cont();
        assert.ok(fences[0] > base + 1000n);
        for (let i = 1; i < fences.length; i++) assert.ok(fences[i - 1] < fences[i], String(fences));
        const a = await rl.acquire(key, { ttl: 5000, shared: true });
        const b = await rl.acquire(key, { ttl: 5000, shared: true });
        assert.ok(a && b);
        assert.equal(await rl.acquire(key, { ttl: 5000 }), null, "a writer is kept out by the readers");
        await assert.rejects(rl.acquire(key + ":n", { ttl: 5000, limit: 2 }), /counted lock/);
        await a.release();
        await b.release();
      } finally {
        await rl.close();
        for (const c of clients) await Promise.resolve().then(() => lib.close(c)).catch(() => {});
        for (const s of five) s.close();
      }
    });
  });
}
