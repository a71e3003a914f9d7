// Run by defaults.test.mjs: the daily report's cron job on one of five servers. At its
// start time it tries the lock once; the holder runs the 0.5 s job and, with "keep",
// keeps the lock for the rest of its 10 s lease (releaseOnExit: false).
import { createClient } from "redis";

import { LockBusyError, LockClient } from "../dist/index.js";

const [port, startAt, key, keep] = process.argv.slice(2);
await new Promise((r) => setTimeout(r, Math.max(0, Number(startAt) - Date.now())));
const client = await createClient({ url: `redis://127.0.0.1:${port}` }).connect();
const locks = new LockClient(client);
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
