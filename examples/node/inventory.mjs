// Safe inventory deduction with the redis-lock module and its Node package on
// node-redis: "lock product:9001, check stock, deduct, release", the deduction written
// with lock.ifHeld("SET", ...) (LOCK.IFHELD: the write runs only while the lock's token
// still holds the lock, in the same atomic step on the server).
//
// 16 concurrent checkouts for 10 units sell exactly 10; then a holder pauses past its
// lease, another sells a unit, and the paused holder's late write (computed from the
// stock it read before the pause) is refused: nothing runs, the other sale stands.
//
//   REDIS_URL=redis://127.0.0.1:6379 node examples/node/inventory.mjs
// Exits non-zero if a check fails (`make test-examples` runs it).
import { createClient } from 'redis';
import { LockClient, LockNotHeldError } from 'redis-lock-module';
import { check, finish, sleep } from './checks.mjs';

const URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
// One hash tag: in a Redis Cluster LOCK.IFHELD needs the lock and its data in one slot.
const LOCK = 'lock:product:{9001}';
const STOCK = 'stock:{9001}';
const client = await createClient({ url: URL, socket: { connectTimeout: 5000 } }).connect();
const locks = new LockClient(client);
const stock = async () => Number(await client.get(STOCK));

console.log('== 16 concurrent checkouts for 10 units');
await client.set(STOCK, '10');
const outcomes = await Promise.all(
  Array.from({ length: 16 }, (_, i) =>
    locks
      .using(LOCK, { ttl: 5000, wait: 10_000, owner: `order-${1040 + i}` }, async (signal, lock) => {
        const left = await stock();
        if (left <= 0) return 'sold-out';
        await sleep(10); // the rest of a checkout: payment, ...
        await lock.ifHeld('SET', STOCK, String(left - 1)); // refused if the lease ended
        return 'bought';
      })
      .catch((e) => (e instanceof LockNotHeldError ? 'lease-lost' : `error: ${e.message}`)),
  ),
);
check(outcomes.filter((o) => o === 'bought').length === 10, 'exactly 10 units sold');
check(outcomes.filter((o) => o === 'sold-out').length === 6, "6 customers told 'sold out'");
check((await stock()) === 0, `stock is 0, never negative (${await stock()})`);
check((await locks.info(LOCK)) === null, 'the lock is free afterwards');

console.log('== a holder pauses past its lease; its late write is refused by LOCK.IFHELD');
await client.set(STOCK, '5');
const a = await locks.acquire(LOCK, { ttl: 200, owner: 'A' });
check(a !== null, 'A took the lock');
const seenByA = await stock();
await sleep(400); // a GC pause, a swapped-out VM: longer than the lease
const b = await locks.acquire(LOCK, { ttl: 5000, owner: 'B' });
check(b !== null && b.fence > a.fence, "B took the lock, with a higher fence");
await b.ifHeld('SET', STOCK, String((await stock()) - 1));
await b.release();
try {
  await a.ifHeld('SET', STOCK, String(seenByA - 1));
  check(false, "A's late write was refused");
} catch (e) {
  check(e instanceof LockNotHeldError, `A's late write was refused (${e.message})`);
}
check((await stock()) === 4, `stock is 4: B's sale counted once (${await stock()})`);

await locks.close();
await client.quit();
finish();
