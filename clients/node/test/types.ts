// Compile-time check of the published types (`npm run typecheck`): what a TypeScript
// user writes against node-redis and ioredis must type-check without casts.
import { createClient, createCluster } from "redis";
import { Redis, Cluster } from "ioredis";
import { Leader, Leadership, Lock, LockClient, LockLostError, LockNotConfirmedError, LockNotHeldError, LostReason, Observation, Session, SessionLostError, SessionOptions, errorCode } from "redis-lock-module";

export async function usage(): Promise<bigint | undefined> {
  const client = await createClient().connect();
  const locks = new LockClient(client, { networkTimeout: 1000, confirm: true, replicas: 1 });
  // @ts-expect-error: not a client (the parameter is typed)
  new LockClient("not a client");
  // @ts-expect-error: not a client either
  new LockClient({ get: async () => 1 });
  const lock: Lock | null = await locks.acquire("k", { ttl: 1000, wait: 500, owner: "me", shared: false });
  const fence: bigint | undefined = lock?.fence;
  if (lock) {
    // An acquired lock's fence is exact: a bigint, never undefined.
    const exact: bigint = lock.fence;
    const text: string = lock.fenceString;
    void exact;
    void text;
  }
  const held: bigint = await locks.using("k", { ttl: 1000 }, async (_signal, l) => l.fence);
  void held;
  const n: number = await locks.using("k", { ttl: 1000, maxHold: 5000 }, async (signal: AbortSignal, l: Lock) => {
    if (signal.aborted) {
      const reason: LostReason = (signal.reason as LockLostError).reason;
      throw new Error(reason);
    }
    await l.extend(2000);
    return 1;
  });
  await locks.using("cron", { ttl: 60_000, releaseOnExit: false }, async () => undefined);
  await locks.using("daily", { ttl: 60_000, hold: 3_600_000 }, async () => undefined);
  await (await locks.acquire("daily"))?.releaseAfter(3_600_000);
  const released: void = await (await locks.acquire("k", { confirm: false }))!.release();
  void released;
  const e: unknown = undefined;
  if (e instanceof LockNotConfirmedError) void e.key;
  void n;
  new LockClient(createCluster({ rootNodes: [{ url: "redis://127.0.0.1:7000" }] }));
  new LockClient(new Redis({ keyPrefix: "app:" }));
  new LockClient(new Cluster([{ host: "127.0.0.1", port: 7000 }]));
  const info = await locks.info("k");
  const f2: bigint | undefined = info?.fence;
  void f2;
  try {
    await locks.acquire("k", { limit: 2 });
  } catch (e) {
    const code: string | undefined = errorCode(e);
    void code;
  }
  // Sessions: one keepalive for several locks.
  const options: SessionOptions = { ttl: 30_000, bind: 5_000, owner: "job-7" };
  const session: Session = locks.session(options);
  const a: Lock | null = await session.acquire("lock:a", { wait: 1000, shared: true });
  const b: Lock | null = await locks.acquire("lock:b", { session, limit: 2 });
  // @ts-expect-error: a lock of a session has the session's lease
  await session.acquire("lock:c", { ttl: 1000 });
  const alive: boolean = await session.keepalive();
  if (session.signal.aborted) {
    const why: LostReason | undefined = session.lostReason;
    if (session.signal.reason instanceof SessionLostError) void session.signal.reason.reason;
    void why;
  }
  const count: number = await session.close();
  void [a?.session, b, alive, count];
  // Guarded writes and leader election.
  const left: unknown = await lock?.ifHeld("DECRBY", "stock:9001", "1");
  void left;
  const ok: boolean = await locks.check("k", 1n);
  await locks.ifFence("k", 1n, "SET", "price", Buffer.from("1999"));
  void ok;
  const ac = new AbortController();
  const leadership: Leadership | null = await locks.campaign("election:jobs", "node-a", { ttl: 10_000, wait: 5000, signal: ac.signal });
  if (leadership) {
    const term: bigint = leadership.term;
    void term;
    await leadership.proclaim("node-a:8080");
    const resigned: boolean = await leadership.resign();
    void resigned;
  }
  const now: Leader | null = await locks.leader("election:jobs");
  void now;
  const changes: Observation = locks.observe("election:jobs", { block: 5000, signal: ac.signal });
  for await (const who of changes) {
    const value: string | undefined = who?.value;
    void value;
    break;
  }
  if (e instanceof LockNotHeldError) void e.key;
  return fence;
}
