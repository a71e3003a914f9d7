// Run by defaults.test.mjs: the daily report's cron job on one of five servers. Once
// connected it says "ready" and reads the common start time (Date.now() ms) from stdin;
// at that time plus its skew it tries the lock once; the holder runs the 0.5 s job and,
// with "keep", keeps the lock for the rest of its 10 s lease (releaseOnExit: false).
import { once } from "node:events";
import { createClient } from "redis";

import { LockBusyError, LockClient } from "../dist/index.js";

const [port, skew, key, keep] = process.argv.slice(2);
const client = await createClient({ url: `redis://127.0.0.1:${port}` }).connect();
const locks = new LockClient(client);
console.log("ready");
const [line] = await once(process.stdin, "data");
process.stdin.destroy();
await new Promise((r) => setTimeout(r, Math.max(0, Number(String(line)) + Number(skew) - Date.now())));
try {
  await locks.using(key, { ttl: 10_000, releaseOnExit: keep !== "keep" }, async () => {
    await client.incr(`${key}:runs`);
    await new Promise((r) => setTimeout(r, 500)); // the job
    console.log("ran");
  });
} catch (e) {
  if (!(e instanceof LockBusyError)) throw e;
  console.log("skipped: another server runs it this period");
}
await client.quit();
