// Locks on the redis-lock server module for node-redis 4/5/6 and ioredis 5/6.
//
//   const locks = new LockClient(redisClient);
//   await locks.using("lock:report", { ttl: 10_000, wait: 5_000 }, async (signal, lock) => {
//     await writeReport({ fence: lock.fence, signal });
//   });

import { randomUUID } from "node:crypto";

import { Arg, Dedicated, Driver, driverFor } from "./drivers.js";

export { slotOf } from "./slot.js";

/** Why a held lock was lost (the `reason` of a {@link LockLostError}). */
export type LostReason = "not-held" | "failed" | "expired" | "cap-reached";

export interface AcquireOptions {
  /** Lease in ms (`PX`); default: the server's `lock.default-ttl` (30 s). */
  ttl?: number;
  /** How long to wait in the server's FIFO queue, in ms. 0 / undefined: do not wait;
   * `Infinity`: no limit. */
  wait?: number;
  /** Label shown by LOCK.INFO. */
  owner?: string;
  /** Hold the lock with this token (default: a random UUID). Acquiring again with the
   * token that holds the lock is an idempotent renew with the same fence. */
  token?: string;
  /** A shared (read-write) lock: any number of shared holders, no exclusive one. */
  shared?: boolean;
  /** A counted lock (semaphore) with `limit` permits. */
  limit?: number;
}

export interface UsingOptions extends AcquireOptions {
  /** Renew the lease every third of the TTL while the routine runs (default true). */
  autoRenew?: boolean;
  /** Cap on the total hold, in ms: renewal stops there and the signal aborts. */
  maxHold?: number;
}

export interface ClientOptions {
  /** Time allowed for the network on top of a wait, and for each renewal, in ms
   * (default 2000). */
  networkTimeout?: number;
}

export interface LockInfo {
  [field: string]: unknown;
  /** The fence as an exact bigint (undefined on node-redis 4 when above 2^53). */
  fence?: bigint;
}

export class LockBusyError extends Error {
  constructor(readonly key: string) {
    super(`redis-lock: ${key} is held elsewhere`);
    this.name = "LockBusyError";
  }
}

export class LockLostError extends Error {
  constructor(
    readonly key: string,
    readonly reason: LostReason,
  ) {
    super(`redis-lock: lock ${key} lost (${reason})`);
    this.name = "LockLostError";
  }
}

export class LockTimeoutError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "LockTimeoutError";
  }
}

/** An error reply from the server (node-redis ErrorReply, ioredis ReplyError): the
 * command ran and granted nothing. Anything else (a timeout, a closed connection) may
 * hide a grant. */
function isServerReply(e: unknown): boolean {
  const n = (e as { constructor?: { name?: string } })?.constructor?.name;
  return n === "ErrorReply" || n === "ReplyError" || n === "SimpleError" || n === "BlobError";
}

/** The error code of a server error reply (`NOTOWNER`, `WRONGMODE`, ...). */
export function errorCode(e: unknown): string | undefined {
  const m = (e as Error)?.message;
  return typeof m === "string" ? m.split(" ", 1)[0] : undefined;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Settles with the promise's outcome, or with `undefined` once `ms` passed. */
function within<T>(p: Promise<T>, ms: number): Promise<{ ok: true; value: T } | { ok: false; error: unknown } | undefined> {
  return new Promise((resolve) => {
    const t = ms === Infinity ? undefined : setTimeout(() => resolve(undefined), Math.max(0, ms));
    p.then(
      (value) => {
        if (t) clearTimeout(t);
        resolve({ ok: true, value });
      },
      (error) => {
        if (t) clearTimeout(t);
        resolve({ ok: false, error });
      },
    );
  });
}

function asString(v: unknown): string | undefined {
  if (typeof v === "string") return v;
  if (Buffer.isBuffer(v)) return v.toString();
  if (typeof v === "number" || typeof v === "bigint") return String(v);
  return undefined;
}

let warnedInexact = false;

/** An integer reply as an exact bigint; undefined where the library already rounded it. */
function exactInt(v: unknown): bigint | undefined {
  if (typeof v === "bigint") return v;
  if (typeof v === "string" && /^-?\d+$/.test(v)) return BigInt(v);
  if (Buffer.isBuffer(v)) return exactInt(v.toString());
  if (typeof v === "number") {
    if (Number.isSafeInteger(v)) return BigInt(v);
    if (!warnedInexact) {
      warnedInexact = true;
      process.emitWarning(
        "redis-lock: this client returned a fence above 2^53 as a double (node-redis 4 has no " +
          "exact integers); lock.fence is undefined. Use node-redis 5+ or ioredis for exact fences.",
      );
    }
  }
  return undefined;
}

function pairs(reply: unknown): [string, unknown][] {
  if (reply instanceof Map) return [...reply.entries()].map(([k, v]) => [asString(k) ?? String(k), v]);
  if (Array.isArray(reply)) {
    const out: [string, unknown][] = [];
    for (let i = 0; i + 1 < reply.length; i += 2) out.push([asString(reply[i]) ?? String(reply[i]), reply[i + 1]]);
    return out;
  }
  if (reply && typeof reply === "object") return Object.entries(reply);
  return [];
}

function parseInfo(reply: unknown): LockInfo | null {
  if (reply === null || reply === undefined) return null;
  const info: LockInfo = {};
  for (const [k, v] of pairs(reply)) {
    if (k === "fence") info.fence = exactInt(v);
    else if (k === "holder-list" && Array.isArray(v)) info[k] = v.map((h) => parseInfo(h));
    else info[k] = Buffer.isBuffer(v) ? v.toString() : v;
  }
  return info;
}

/** TTL (ms) of the holder with `fence`, undefined when no such holder. */
function holderTtl(info: LockInfo | null, fence: bigint | undefined): number | undefined {
  if (!info || fence === undefined) return undefined;
  const list = info["holder-list"];
  const holders = Array.isArray(list) ? (list as LockInfo[]) : [info];
  const h = holders.find((x) => x && x.fence === fence);
  return h ? Number(h.ttl) : undefined;
}

/** A granted lock. */
export class Lock {
  /** Aborted (with a {@link LockLostError} as its reason) when the lock is lost. */
  readonly signal: AbortSignal;
  private readonly abort = new AbortController();
  private renewTimer: NodeJS.Timeout | undefined;
  private released = false;
  private ttl: number | undefined;
  private grantedAt: number;

  constructor(
    private readonly client: LockClient,
    /** The name as given (without a client key prefix). */
    readonly name: string,
    readonly token: string,
    /** The fencing token, exact; undefined only on node-redis 4 above 2^53. */
    readonly fence: bigint | undefined,
    ttl: number | undefined,
  ) {
    this.signal = this.abort.signal;
    this.ttl = ttl;
    this.grantedAt = Date.now();
  }

  /** The fence as a decimal string (exact), or undefined. */
  get fenceString(): string | undefined {
    return this.fence?.toString();
  }

  /** Why the lock was lost, undefined while held. */
  get lostReason(): LostReason | undefined {
    return this.signal.aborted ? (this.signal.reason as LockLostError).reason : undefined;
  }

  /** LOCK.RELEASE: true if this grant still held the lock. */
  async release(): Promise<boolean> {
    this.stopRenewal();
    this.released = true;
    return this.client.release(this.name, this.token);
  }

  /** LOCK.EXTEND to `ttl` ms from now (default: the acquire's TTL). */
  async extend(ttl?: number): Promise<boolean> {
    return this.client.extend(this.name, this.token, ttl ?? this.ttl);
  }

  /** True if LOCK.INFO shows this grant (by its fence) as a holder. */
  async owned(): Promise<boolean> {
    return holderTtl(await this.client.info(this.name), this.fence) !== undefined;
  }

  /** Renews the lease every third of the TTL until release, loss, or `maxHold` ms. */
  async startRenewal(maxHold?: number): Promise<void> {
    if (this.renewTimer || this.released) return;
    if (this.ttl === undefined) {
      const pttl = Number(await this.client.command(this.name, (k) => ["PTTL", k]));
      this.ttl = Math.max(3, pttl);
    }
    const ttl = this.ttl;
    const capAt = maxHold === undefined ? undefined : this.grantedAt + maxHold;
    let deadline = this.grantedAt + ttl - ttl / 100;
    const interval = ttl / 3;
    const step = async (): Promise<void> => {
      this.renewTimer = undefined;
      if (this.released) return;
      const now = Date.now();
      if (now >= deadline) return this.lose("expired");
      const ask = capAt === undefined ? ttl : Math.min(ttl, capAt - now);
      if (ask < 1) {
        this.schedule(() => this.lose("cap-reached"), deadline - now);
        return;
      }
      const sent = Date.now();
      let ok: boolean | undefined;
      for (let attempt = 0; attempt < 2 && ok === undefined; attempt++) {
        const r = await within(
          this.client.extend(this.name, this.token, Math.round(ask)),
          Math.min(this.client.networkTimeout, deadline - Date.now()),
        );
        if (this.released) return;
        if (r?.ok) ok = r.value;
        else if (attempt === 1 || Date.now() >= deadline) return this.lose("failed");
      }
      if (!ok) return this.lose("not-held");
      deadline = sent + ask - ttl / 100;
      if (ask < ttl) {
        // The cap: that was the last renewal; the lease runs out on the server.
        this.schedule(() => this.lose("cap-reached"), sent + ask - Date.now());
        return;
      }
      this.schedule(step, Math.min(interval, deadline - Date.now()));
    };
    this.schedule(step, Math.min(interval, deadline - Date.now()));
  }

  stopRenewal(): void {
    if (this.renewTimer) clearTimeout(this.renewTimer);
    this.renewTimer = undefined;
  }

  private schedule(fn: () => unknown, ms: number): void {
    this.renewTimer = setTimeout(() => void fn(), Math.max(0, ms));
    this.renewTimer.unref?.();
  }

  private lose(reason: LostReason): void {
    if (this.released || this.signal.aborted) return;
    this.stopRenewal();
    this.abort.abort(new LockLostError(this.name, reason));
  }
}

/** Locks over one node-redis or ioredis client (standalone or cluster). */
export class LockClient {
  readonly networkTimeout: number;
  private readonly driver: Driver;

  constructor(client: unknown, options: ClientOptions = {}) {
    this.driver = driverFor(client);
    this.networkTimeout = options.networkTimeout ?? 2000;
  }

  /** Which library the client is, as detected ("node-redis", "ioredis cluster", ...). */
  get kind(): string {
    return this.driver.kind;
  }

  /** @internal runs a command on the node of `name`; `build` gets the full key. */
  command(name: string, build: (key: string) => Arg[]): Promise<unknown> {
    const key = this.driver.prefix + name;
    return this.driver.call(key, build(key));
  }

  /** Takes the lock: a {@link Lock}, or null when it is held (after `wait`, if given). */
  async acquire(name: string, options: AcquireOptions = {}): Promise<Lock | null> {
    const token = options.token ?? randomUUID();
    const key = this.driver.prefix + name;
    const wait = options.wait ?? 0;
    if (options.shared && options.limit !== undefined) throw new TypeError("a lock is either shared or counted (limit), not both");
    if (options.limit !== undefined && !(Number.isInteger(options.limit) && options.limit >= 1)) throw new TypeError("limit must be an integer >= 1");
    if (options.ttl !== undefined && !(options.ttl >= 1)) throw new TypeError("ttl must be at least 1 ms");
    const args: Arg[] = ["LOCK.ACQUIRE", key];
    if (options.shared) args.push("SHARED");
    if (options.limit !== undefined) args.push("LIMIT", String(options.limit));
    if (options.ttl !== undefined) args.push("PX", String(Math.round(options.ttl)));
    args.push("TOKEN", token);
    if (options.owner !== undefined) args.push("OWNER", options.owner);
    let reply: unknown;
    if (!(wait > 0)) {
      try {
        reply = await this.driver.call(key, args);
      } catch (e) {
        // A timeout may hide a grant: give it back (the token is ours).
        if (!isServerReply(e)) await this.releaseQuietly(name, token);
        throw e;
      }
    } else {
      const blockMs = wait === Infinity ? 0 : Math.max(1, Math.round(wait));
      args.push("BLOCK", String(blockMs));
      reply = await this.acquireBlocking(name, key, token, args, wait === Infinity ? Infinity : blockMs + this.networkTimeout);
    }
    if (reply === null || reply === undefined) return null;
    if (!Array.isArray(reply) || reply.length !== 2) throw new Error(`redis-lock: unexpected LOCK.ACQUIRE reply ${String(reply)}`);
    if (asString(reply[0]) !== token) throw new Error("redis-lock: LOCK.ACQUIRE granted a token other than the one sent");
    return new Lock(this, name, token, exactInt(reply[1]), options.ttl);
  }

  /** The blocking acquire on a connection of its own. If the server has not answered
   * within the wait plus networkTimeout, LOCK.RELEASE goes out on the same connection:
   * the server runs it right after the wait ends, so a grant made after we gave up is
   * given back at once instead of staying held with nobody listening. */
  private async acquireBlocking(name: string, key: string, token: string, args: Arg[], limit: number): Promise<unknown> {
    const conn: Dedicated = await this.driver.dedicated(key);
    try {
      const reply = conn.send(args);
      const r = await within(reply, limit);
      if (r) {
        if (r.ok) return r.value;
        throw r.error;
      }
      const released = conn.send(["LOCK.RELEASE", key, token]);
      const late = await within(reply, this.networkTimeout);
      const rel = late ? await within(released, this.networkTimeout) : undefined;
      if (rel?.ok) return null; // answered late; any late grant is released
      await this.releaseQuietly(name, token);
      throw new LockTimeoutError(`redis-lock: LOCK.ACQUIRE ${name}: no reply within the wait plus ${this.networkTimeout} ms; sent LOCK.RELEASE for the token`);
    } catch (e) {
      if (!(e instanceof LockTimeoutError) && !isServerReply(e)) await this.releaseQuietly(name, token);
      throw e;
    } finally {
      conn.close();
    }
  }

  private async releaseQuietly(name: string, token: string): Promise<void> {
    await within(this.release(name, token), this.networkTimeout).catch(() => undefined);
  }

  /**
   * Runs `routine` while holding the lock, renewing it (unless `autoRenew: false`), and
   * releases it afterwards. `signal` aborts when the lock is lost. Throws
   * {@link LockBusyError} when the lock could not be taken within `wait`.
   */
  async using<T>(name: string, options: UsingOptions, routine: (signal: AbortSignal, lock: Lock) => Promise<T>): Promise<T> {
    const lock = await this.acquire(name, options);
    if (!lock) throw new LockBusyError(name);
    let failed = false;
    try {
      if (options.autoRenew !== false) await lock.startRenewal(options.maxHold);
      return await routine(lock.signal, lock);
    } catch (e) {
      failed = true;
      throw e;
    } finally {
      try {
        await lock.release();
      } catch (e) {
        if (!failed && !lock.signal.aborted) throw e;
      }
    }
  }

  /** LOCK.RELEASE by name and token: true if the token held it. */
  async release(name: string, token: string): Promise<boolean> {
    return Number(await this.command(name, (k) => ["LOCK.RELEASE", k, token])) === 1;
  }

  /** LOCK.EXTEND by name and token (ttl in ms; default the server's default TTL). */
  async extend(name: string, token: string, ttl?: number): Promise<boolean> {
    return Number(await this.command(name, (k) => (ttl === undefined ? ["LOCK.EXTEND", k, token] : ["LOCK.EXTEND", k, token, "PX", String(Math.round(ttl))]))) === 1;
  }

  /** LOCK.INFO as an object (fence as bigint), null when the lock is free. */
  async info(name: string): Promise<LockInfo | null> {
    return parseInfo(await this.command(name, (k) => ["LOCK.INFO", k]));
  }

  /** Closes the connections this LockClient opened (not the client it was given). */
  async close(): Promise<void> {
    await this.driver.close();
  }
}

export default LockClient;
