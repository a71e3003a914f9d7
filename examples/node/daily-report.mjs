// "Only one server runs the daily report", with the redis-lock module and its Node
// package (clients/node) on node-redis.
//
// Five "servers" fire the same cron job, their clocks up to 2 s apart. Each calls
// locks.using(...) without waiting; the first gets the lock, keeps it renewed while the
// report runs (longer than the lease), and when the report is done keeps the lock for the
// rest of the period (`hold`) instead of releasing it: a server whose cron fires after
// the report finished finds it taken too, and skips the run. (Released at the end, a fast
// report ran twice with 0-2 s of skew.) A failed report is released at once, so another
// server can run it. A classic `SET NX PX` client is excluded too (the module treats a
// string key as a held lock, and its own lock makes SET NX fail), so old and new code can
// share one lock during a migration.
//
//   REDIS_URL=redis://127.0.0.1:6379 node examples/node/daily-report.mjs
// Exits non-zero if a check fails (`make test-examples` runs it).
//
// lock.fence is a bigint: exact even above 2^53, where a JavaScript number is not.
import { createClient } from 'redis';
import { LockBusyError, LockClient } from 'redis-lock-module';
import { check, finish, sleep } from './checks.mjs';

const URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const LOCK = 'lock:daily-report';
const TTL_MS = 600;
const PERIOD_MS = 4000; // "a day", shortened for the example
const SKEWS_MS = [0, 300, 900, 1400, 2000]; // when each server's cron fires

async function connect() {
  const c = createClient({ url: URL, socket: { connectTimeout: 5000 } });
  await c.connect();
  return c;
}

// One server's cron job. Returns the fence if this server ran the report.
async function cronJob(server, ranBy) {
  const c = await connect();
  const locks = new LockClient(c);
  try {
    return await locks.using(LOCK, { ttl: TTL_MS, hold: PERIOD_MS, owner: server }, async (signal, lock) => {
      ranBy.push(server);
      await sleep(1500); // generating the report: longer than the lease, renewed meanwhile
      check(!signal.aborted, `${server} kept the lock through the run (fence ${lock.fence})`);
      return lock.fence;
    });
  } catch (e) {
    if (e instanceof LockBusyError) return undefined; // another server runs it today
    throw e;
  } finally {
    await locks.close();
    await c.quit();
  }
}

async function day(n) {
  console.log(`== day ${n}: five servers start the job at 03:00, their clocks 0-2 s apart`);
  const start = Date.now();
  const ranBy = [];
  const servers = ['server-1', 'server-2', 'server-3', 'server-4', 'server-5'];
  const jobs = servers.map((s, i) => sleep(SKEWS_MS[i]).then(() => cronJob(s, ranBy)));
  // While the report runs: LOCK.INFO names the server, an old-style client is kept out.
  await sleep(800);
  const c = await connect();
  const locks = new LockClient(c);
  const info = await locks.info(LOCK);
  check(ranBy.length === 1 && info?.owner === ranBy[0],
    `LOCK.INFO shows the running server (${info?.owner}), after renewals past the lease`);
  const classic = await c.sendCommand(['SET', LOCK, 'old-cron', 'NX', 'PX', '5000']);
  check(classic === null, 'a classic SET NX PX client cannot take it meanwhile');
  const fences = (await Promise.all(jobs)).filter((f) => f !== undefined);
  check(fences.length === 1, `exactly one server ran the report (${fences.length})`);
  check(typeof fences[0] === 'bigint' && fences[0] === info.fence, 'its fence is an exact bigint');
  check(await locks.info(LOCK) !== null, 'the lock is kept after the run, for the rest of the period');
  await sleep(start + PERIOD_MS + 100 - Date.now());
  check(await locks.info(LOCK) === null, 'and is free when the period ends');
  await c.quit();
  return fences[0];
}

async function classicHolderBlocksTheModule() {
  console.log('== a lock taken the classic way also counts');
  const c = await connect();
  const locks = new LockClient(c);
  await c.sendCommand(['SET', LOCK, 'old-cron', 'NX', 'PX', '5000']);
  check(await locks.acquire(LOCK, { ttl: 1000 }) === null, 'the module lock is not granted while a SET NX PX lock is held');
  check(await locks.release(LOCK, 'old-cron') === true, 'releasing with the classic token releases it');
  await c.quit();
}

const c = await connect();
await c.del(LOCK);
await c.quit();
const f1 = await day(1);
const f2 = await day(2);
check(f1 < f2, `day 2's fence is higher (${f1} < ${f2})`);
await classicHolderBlocksTheModule();
finish();
