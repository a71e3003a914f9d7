// Shared (SHARED) and counted (LIMIT n) locks, once per client library: readers and a
// queued writer, n permits, LIMITMISMATCH and WRONGMODE (docs/commands.md, "The lock state").

import assert from "node:assert/strict";
import { after, test } from "node:test";
import { randomUUID } from "node:crypto";

import { errorCode } from "../dist/index.js";
import { waitUntil } from "./helpers.mjs";
import { Server, describeEachClient, raw, sleep } from "./servers.mjs";

const name = () => `kind:${randomUUID().slice(0, 12)}`;

/** Every fence in the raw LOCK.INFO (one per holder), as bigints. */
async function rawFences(port, key) {
  const out = [];
  const walk = (v) => {
    if (!Array.isArray(v)) return;
    for (let i = 0; i + 1 < v.length; i++) {
      if (v[i] === "fence" && v[i + 1]?.int) out.push(BigInt(v[i + 1].int));
      walk(v[i + 1]);
    }
    v.forEach(walk);
  };
  walk(await raw(port, "LOCK.INFO", key));
  return [...new Set(out)].sort((a, b) => (a < b ? -1 : 1));
}

const server = await Server.start();
after(() => server.close());

describeEachClient(server, (lib, ctx) => {
  test("readers share; a writer waits for all of them", async () => {
    const key = name();
    const a = await ctx.locks.acquire(key, { ttl: 10_000, shared: true });
    const b = await ctx.locks.acquire(key, { ttl: 10_000, shared: true });
    assert.ok(a && b);
    assert.deepEqual(await rawFences(server.port, key), [a.fence, b.fence]);
    const info = await ctx.locks.info(key);
    assert.equal(String(info.mode), "shared");
    assert.equal(Number(info.holders), 2);
    assert.equal(await ctx.locks.acquire(key, { ttl: 10_000 }), null);
    const writer = ctx.locks.acquire(key, { ttl: 10_000, wait: 5000 });
    // Queued (polled: 100 ms of sleep is not enough on a loaded machine), so that the
    // reader below arrives after a queued writer.
    await waitUntil(async () => Number((await ctx.locks.info(key)).waiters) === 1, 5000, "the writer queued");
    assert.equal(await ctx.locks.acquire(key, { shared: true }), null, "no reader barges past a queued writer");
    await a.release();
    await b.release();
    const w = await writer;
    assert.ok(w);
    await w.release();
  });

  test("a counted lock has n permits, and a mismatched limit or mode is an error", async () => {
    const key = name();
    const p1 = await ctx.locks.acquire(key, { ttl: 10_000, limit: 2 });
    const p2 = await ctx.locks.acquire(key, { ttl: 10_000, limit: 2 });
    assert.ok(p1 && p2);
    assert.equal(await ctx.locks.acquire(key, { limit: 2 }), null);
    await assert.rejects(ctx.locks.acquire(key, { limit: 3 }), (e) => errorCode(e) === "LIMITMISMATCH");
    await assert.rejects(ctx.locks.acquire(key, {}), (e) => errorCode(e) === "WRONGMODE");
    await assert.rejects(ctx.locks.acquire(key, { shared: true }), (e) => errorCode(e) === "WRONGMODE");
    const third = ctx.locks.acquire(key, { ttl: 10_000, limit: 2, wait: 5000 });
    await sleep(100);
    await p1.release();
    const p3 = await third;
    assert.ok(p3 && (await p3.owned()) && !(await p1.owned()));
    await p2.release();
    await p3.release();
  });
});
