// Leader election with the redis-lock module and its Node package on node-redis.
//
// Three schedulers campaign for "election:{scheduler}"; exactly one leads at a time, in
// the order they started campaigning. The leader publishes where it can be reached
// (proclaim), runs its jobs with writes guarded by its leadership (ifHeld: a leader
// whose lease ended cannot write any more), then resigns, and the next candidate is
// elected in the same step. An observer prints every change, from LOCK.WATCH, without
// polling.
//
//   REDIS_URL=redis://127.0.0.1:6379 node examples/node/election.mjs
// Exits non-zero if a check fails (`make test-examples` runs it).
import { createClient } from 'redis';
import { LockClient } from 'redis-lock-module';
import { check, finish, sleep } from './checks.mjs';

const URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const KEY = 'election:{scheduler}';
const RUNS = 'scheduler:{scheduler}:runs';
const connect = () => createClient({ url: URL, socket: { connectTimeout: 5000 } }).connect();

const client = await connect();
const locks = new LockClient(client);
await client.del([KEY, RUNS]);

// The observer: who leads now, then every change.
const seen = [];
const changes = locks.observe(KEY, { block: 5000 });
const observing = (async () => {
  for await (const leader of changes) {
    console.log('   observer:', leader ? `${leader.value} (term ${leader.term})` : 'nobody leads');
    seen.push(leader?.value ?? null);
  }
})();
await sleep(200);

async function scheduler(name) {
  const c = await connect();
  const mine = new LockClient(c);
  const leadership = await mine.campaign(KEY, name, { ttl: 5000 }); // waits until elected
  const term = leadership.term;
  await leadership.proclaim(`${name}:8080`); // where followers find the leader
  for (let i = 0; i < 3; i++) {
    await leadership.ifHeld('INCR', RUNS); // a job, written only while it leads
    await sleep(50);
  }
  await leadership.resign(); // the next candidate leads at once
  await mine.close();
  await c.quit();
  return { name, term };
}

const runs = [];
for (const name of ['scheduler-a', 'scheduler-b', 'scheduler-c']) {
  runs.push(scheduler(name));
  await sleep(100); // they start campaigning in this order
}
const results = await Promise.all(runs);
const elected = [...results].sort((x, y) => (x.term < y.term ? -1 : 1)).map((r) => r.name);
await sleep(300);
await changes.return(); // ends the observation at once
await observing;

check(elected.join() === 'scheduler-a,scheduler-b,scheduler-c', `elected in FIFO order (${elected})`);
check(Number(await client.get(RUNS)) === 9, `9 guarded job runs (${await client.get(RUNS)})`);
// Each leader's lasting value, in order. A state that lasts less than a round trip (the
// campaign value, proclaimed over at once) may be seen or overtaken.
const lasting = seen.filter((v) => v === null || v.endsWith(':8080'));
const expected = [null, ...elected.map((n) => `${n}:8080`), null];
const allowed = new Set([null, ...elected, ...elected.map((n) => `${n}:8080`)]);
check(
  JSON.stringify(lasting) === JSON.stringify(expected) && seen.every((v) => allowed.has(v)),
  `the observer saw each leader in order (${JSON.stringify(seen)})`,
);
check((await locks.leader(KEY)) === null, 'nobody leads at the end');

await locks.close();
await client.quit();
finish();
