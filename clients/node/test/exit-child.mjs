// Run by defaults.test.mjs: takes and releases a lock, quits the client, and must then
// exit by itself (no locks.close()): nothing of the package keeps the process alive.
import * as redis4 from "redis4";
import * as redis5 from "redis5";
import * as redis6 from "redis";
import IORedis5 from "ioredis5";
import IORedis6 from "ioredis";

import { LockClient } from "../dist/index.js";

const [lib, port] = process.argv.slice(2);
let client;
const nodeRedis = { "node-redis 4": redis4, "node-redis 5": redis5, "node-redis 6": redis6 }[lib];
if (nodeRedis) client = await nodeRedis.createClient({ url: `redis://127.0.0.1:${port}` }).connect();
else client = new (lib === "ioredis 5" ? IORedis5 : IORedis6)(Number(port), "127.0.0.1");
const locks = new LockClient(client);
const lock = await locks.acquire("exit-child", { ttl: 10_000, wait: 1000 });
await locks.using("exit-child:2", { ttl: 3000 }, async () => undefined);
await lock.release();
console.log("released");
await client.quit();
