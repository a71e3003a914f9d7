// Compile-time check of the CommonJS types (`npm run typecheck`): a CommonJS TypeScript
// project gets the package through its `require` export, typed.
import redis = require("redis");
import IORedis = require("ioredis");
import lockModule = require("redis-lock-module");

const { LockClient, LockLostError } = lockModule;

export async function usage(): Promise<bigint | undefined> {
  const client = await redis.createClient().connect();
  const locks = new LockClient(client);
  // @ts-expect-error: not a client (the parameter is typed)
  new LockClient("not a client");
  new LockClient(new IORedis.Redis());
  const lock = await locks.acquire("k", { ttl: 1000 });
  if (lock) {
    const exact: bigint = lock.fence;
    void exact;
  }
  await locks.using("k", { ttl: 1000 }, async (signal) => {
    if (signal.aborted) throw signal.reason as InstanceType<typeof LockLostError>;
  });
  return lock?.fence;
}
