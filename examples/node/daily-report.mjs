// "Only one server runs the daily report", with the redis-lock module and plain
// node-redis (sendCommand only: no lock library).
//
// Five "servers" fire the same cron job at the same moment. Each tries LOCK.ACQUIRE
// without waiting; exactly one gets the lock, keeps it alive with LOCK.EXTEND while the
// report runs (longer than the lease), and releases it with LOCK.RELEASE. The others
// skip the run. A classic `SET NX PX` client is excluded too (the module treats a string
// key as a held lock, and its own lock makes SET NX fail), so old and new code can share
// one lock during a migration.
//
//   REDIS_URL=redis://127.0.0.1:6379 node examples/node/daily-report.mjs
// Exits non-zero if a check fails (`make test-examples` runs it).
//
// Fencing tokens are 64-bit integers around 2^60. node-redis 4 turns integer replies into
// JavaScript numbers (doubles, exact only up to 2^53), so this example does not pass the
// fence anywhere: to use fences from JavaScript, read them with a client that keeps 64-bit
// integers (BigInt) and compare them as BigInt or as decimal strings of equal length.
import { randomUUID } from 'node:crypto';
import { createClient } from 'redis';

const URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const LOCK = 'lock:daily-report';
const TTL_MS = 600;
let failures = 0;

function check(ok, what) {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}`);
  if (!ok) failures += 1;
}

async function connect() {
  const c = createClient({ url: URL, socket: { connectTimeout: 5000 } });
  await c.connect();
  return c;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// One server's cron job. Returns true if this server ran the report.
async function cronJob(server, ranBy) {
  const c = await connect();
  try {
    const token = randomUUID();
    const grant = await c.sendCommand(
      ['LOCK.ACQUIRE', LOCK, 'PX', String(TTL_MS), 'TOKEN', token, 'OWNER', server]);
    if (grant === null) return false; // another server runs it today
    // Renew every third of the lease while the report runs (1.5 s > the 600 ms lease).
    let lost = false;
    const renew = setInterval(async () => {
      try {
        const ok = await c.sendCommand(['LOCK.EXTEND', LOCK, token, 'PX', String(TTL_MS)]);
        if (ok !== 1) lost = true; // 0: not ours any more; a real job would stop here
      } catch {
        lost = true;
      }
    }, TTL_MS / 3);
    try {
      ranBy.push(server);
      await sleep(1500); // generating the report
    } finally {
      clearInterval(renew);
      const released = await c.sendCommand(['LOCK.RELEASE', LOCK, token]);
      check(!lost && released === 1, `${server} kept the lock through the run and released it`);
    }
    return true;
  } finally {
    await c.quit();
  }
}

async function day(n) {
  console.log(`== day ${n}: five servers start the job at 03:00`);
  const ranBy = [];
  const servers = ['server-1', 'server-2', 'server-3', 'server-4', 'server-5'];
  const jobs = servers.map((s) => cronJob(s, ranBy));
  // While the report runs: LOCK.INFO names the server, an old-style client is kept out.
  await sleep(800);
  const c = await connect();
  const info = await c.sendCommand(['LOCK.INFO', LOCK]);
  const fields = Object.fromEntries(
    Array.from({ length: info.length / 2 }, (_, i) => [info[2 * i], info[2 * i + 1]]));
  check(ranBy.length === 1 && fields.owner === ranBy[0],
    `LOCK.INFO shows the running server (${fields.owner}), after renewals past the lease`);
  const classic = await c.sendCommand(['SET', LOCK, 'old-cron', 'NX', 'PX', '5000']);
  check(classic === null, 'a classic SET NX PX client cannot take it meanwhile');
  const ran = (await Promise.all(jobs)).filter(Boolean).length;
  check(ran === 1, `exactly one server ran the report (${ran})`);
  check(await c.sendCommand(['LOCK.INFO', LOCK]) === null, 'the lock is free after the run');
  await c.quit();
}

async function classicHolderBlocksTheModule() {
  console.log('== a lock taken the classic way also counts');
  const c = await connect();
  await c.sendCommand(['SET', LOCK, 'old-cron', 'NX', 'PX', '5000']);
  const grant = await c.sendCommand(['LOCK.ACQUIRE', LOCK, 'PX', '1000']);
  check(grant === null, 'LOCK.ACQUIRE fails while a SET NX PX lock is held');
  check(await c.sendCommand(['LOCK.RELEASE', LOCK, 'old-cron']) === 1,
    'LOCK.RELEASE with the classic token releases it');
  await c.quit();
}

const c = await connect();
await c.del(LOCK);
await c.quit();
await day(1);
await day(2);
await classicHolderBlocksTheModule();
if (failures > 0) {
  console.error(`${failures} check(s) failed`);
  process.exit(1);
}
console.log('all checks passed');
