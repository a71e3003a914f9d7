// The least-privilege ACL user of the README and the quick start, on a real primary with
// a replica, for node-redis 4/6 and ioredis 6: the documented line lets the package
// acquire, confirm, renew and release, and nothing else; without `+wait +role`,
// `confirm: false` still works, and the default says what is missing.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { fileURLToPath } from "node:url";

import * as redis4 from "redis4";
import * as redis6 from "redis";
import IORedis6 from "ioredis";

import { LockClient, LockNotConfirmedError } from "../dist/index.js";
import { Pair } from "./helpers.mjs";
import { raw, rawFence } from "./servers.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
const name = () => `lock:${randomUUID().slice(0, 12)}`;

/** The one `ACL SETUSER` line of the README and the quick start (the same in both). */
function documentedLine() {
  const lines = new Set();
  for (const doc of ["clients/node/README.md", "docs/quickstart-node.md"]) {
    const found = readFileSync(path.join(ROOT, doc), "utf8").match(/^ACL SETUSER .*$/gm) ?? [];
    assert.equal(found.length, 1, `${doc}: ${found}`);
    lines.add(found[0]);
  }
  assert.equal(lines.size, 1, [...lines].join("\n"));
  return [...lines][0];
}

const LIBS = [
  { name: "node-redis 4", connect: (port, user, pw) => redis4.createClient({ url: `redis://${user}:${pw}@127.0.0.1:${port}` }).on("error", () => {}).connect(), close: (c) => c.disconnect() },
  { name: "node-redis 6", connect: (port, user, pw) => redis6.createClient({ url: `redis://${user}:${pw}@127.0.0.1:${port}` }).on("error", () => {}).connect(), close: (c) => c.destroy() },
  {
    name: "ioredis 6",
    // ioredis checks that a server is ready with INFO: off for a user without INFO.
    connect: async (port, user, pw) => {
      const c = new IORedis6(port, "127.0.0.1", { username: user, password: pw, enableReadyCheck: false });
      c.on("error", () => {});
      await new Promise((r) => (c.status === "ready" ? r() : c.once("ready", r)));
      return c;
    },
    close: (c) => c.disconnect(),
  },
];

const tokens = documentedLine().split(/\s+/);
const [user, password] = [tokens[2], tokens.find((t) => t.startsWith(">")).slice(1)];
let pair;
before(async () => {
  pair = await Pair.start();
  assert.equal(await raw(pair.primary.port, ...tokens), "OK");
  const noConfirm = tokens.filter((t) => t !== "+wait" && t !== "+role");
  noConfirm[2] = "locker-noconfirm";
  assert.equal(await raw(pair.primary.port, ...noConfirm), "OK");
});
after(() => pair?.close());

for (const lib of LIBS) {
  describe(lib.name, () => {
    test("the documented user locks, confirms, renews and releases, and can do nothing more", async () => {
      const client = await lib.connect(pair.primary.port, user, password);
      const locks = new LockClient(client, { networkTimeout: 5000 });
      try {
        for (const wait of [undefined, 1000]) {
          const key = name();
          const lock = await locks.acquire(key, { ttl: 5000, wait });
          assert.ok(lock);
          assert.equal(await rawFence(pair.replica.port, key), lock.fence, "confirmed on the replica");
          assert.equal(await lock.extend(5000), true);
          assert.equal(await lock.owned(), true);
          await lock.release();
        }
        // Renewal past the TTL, and a lock without a TTL (it reads its lease with
        // LOCK.INFO). 1.5 s: the grant's WAIT and a renewal may each take a second on a
        // loaded machine (a 300 ms lease could end before its confirmation came).
        assert.equal(await locks.using(name(), { ttl: 1500 }, async (signal) => new Promise((r) => setTimeout(() => r(signal.aborted), 2000))), false);
        const dflt = await locks.acquire(name());
        assert.ok(dflt && (await dflt.owned()));
        await dflt.release();
        // Nothing more: no INFO, no CONFIG, no other command on the key, no other key.
        const key = name();
        for (const args of [["INFO"], ["CONFIG", "GET", "maxmemory"], ["SET", key, "x"], ["LOCK.FORCERELEASE", key], ["LOCK.ACQUIRE", `other:${key}`, "PX", "1000"]]) {
          await assert.rejects(lib.name.startsWith("ioredis") ? client.call(...args) : client.sendCommand(args), /NOPERM/, args.join(" "));
        }
      } finally {
        await locks.close();
        await lib.close(client);
      }
    });

    test("without +wait +role: confirm: false locks; the default names what is missing", async () => {
      const client = await lib.connect(pair.primary.port, "locker-noconfirm", password);
      const locks = new LockClient(client, { networkTimeout: 5000 });
      try {
        const lock = await locks.acquire(name(), { ttl: 5000, confirm: false });
        assert.ok(lock);
        assert.equal(await lock.extend(5000), true);
        await lock.release();
        const key = name();
        await assert.rejects(
          locks.acquire(key, { ttl: 5000 }),
          (e) => e instanceof LockNotConfirmedError && /\+role.*replicas.*confirm: false/.test(e.message),
        );
        assert.equal(await rawFence(pair.primary.port, key), undefined, "nothing was acquired");
      } finally {
        await locks.close();
        await lib.close(client);
      }
    });
  });
}
