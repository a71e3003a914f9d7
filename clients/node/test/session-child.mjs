// Run by session.test.mjs: holds the locks named on the command line in a session bound
// to its connection (grace 500 ms, lease 60 s), says "ready", and waits to be killed.
import IORedis6 from "ioredis";

import { LockClient } from "../dist/index.js";

const [port, ...keys] = process.argv.slice(2);
const client = new IORedis6(Number(port), "127.0.0.1").on("error", () => {});
const session = new LockClient(client).session({ ttl: 60_000, bind: 500 });
for (const k of keys) if (!(await session.acquire(k))) throw new Error(`${k} is busy`);
console.log("ready");
setInterval(() => undefined, 60_000);
