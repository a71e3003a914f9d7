// Run by defaults.test.mjs: takes and releases a lock, and closes a session, quits the
// client, and must then exit by itself (no locks.close()): nothing of the package keeps
// the process alive.
// With a server pid as the third argument: the server is killed while the client is
// connected, a lock is tried meanwhile, then the client is closed (it cannot quit).
import * as redis4 from "redis4";
import * as redis5 from "redis5";
import * as redis6 from "redis";
import IORedis5 from "ioredis5";
import IORedis6 from "ioredis";

import { LockClient } from "../dist/index.js";

const [lib, port, serverPid] = process.argv.slice(2);
let client;
const nodeRedis = { "node-redis 4": redis4, "node-redis 5": redis5, "node-redis 6": redis6 }[lib];
if (nodeRedis) client = await nodeRedis.createClient({ url: `redis://127.0.0.1:${port}` }).on("error", () => {}).connect();
else client = new (lib === "ioredis 5" ? IORedis5 : IORedis6)(Number(port), "127.0.0.1").on("error", () => {});
const locks = new LockClient(client);
const lock = await locks.acquire("exit-child", { ttl: 10_000, wait: 1000 });
await locks.using("exit-child:2", { ttl: 3000 }, async () => undefined);
await lock.release();
// A session (bound: a connection of its own) closed by the script leaves nothing behind.
const session = locks.session({ ttl: 3000, bind: 1000 });
await session.acquire("exit-child:s1");
await session.acquire("exit-child:s2", { shared: true });
if ((await session.close()) !== 2) throw new Error("the session did not release its two locks");
console.log("released");
if (serverPid) {
  process.kill(Number(serverPid), "SIGKILL");
  const up = () => (nodeRedis ? client.isReady : client.status === "ready");
  for (let i = 0; up() && i < 500; i++) await new Promise((r) => setTimeout(r, 10));
  await locks.acquire("exit-child:3", { ttl: 1000 }).catch((e) => console.log("while down:", e.name));
  if (nodeRedis) await (typeof client.destroy === "function" ? client.destroy() : client.disconnect());
  else client.disconnect();
  console.log("closed");
} else {
  await client.quit();
}
