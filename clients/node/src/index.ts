// Locks on the redis-lock server module for node-redis 4/5/6 and ioredis 5/6.
//
//   const locks = new LockClient(redisClient);
//   await locks.using("lock:report", { ttl: 10_000, wait: 5_000 }, async (signal, lock) => {
//     await writeReport({ fence: lock.fence, signal });
//   });

import { randomUUID } from "node:crypto";

import { Arg, Dedicated, Driver, LockConnectionError, driverFor, errorKind } from "./drivers.js";

export { slotOf } from "./slot.js";
export { LockConnectionError } from "./drivers.js";

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
  /** Confirm the grant on the server's replicas (`WAIT`) before returning it (default:
   * the client's `confirm`, true). */
  confirm?: boolean;
  /** How many replicas must confirm (default: the client's `replicas`). */
  replicas?: number;
  /** Cancels a wait in the queue: the acquire rejects with the signal's reason, the
   * waiting connection is closed (the server drops the waiter) and a grant that raced
   * the abort is released. */
  signal?: AbortSignal;
  /** Take the lock in this session (see {@link Session.acquire}): it has the session's
   * lease instead of a `ttl` of its own (giving both is a TypeError). */
  session?: Session;
}

export interface UsingOptions extends AcquireOptions {
  /** Renew the lease every third of the TTL while the routine runs (default true). */
  autoRenew?: boolean;
  /** Cap on the total hold, in ms: renewal stops there and the signal aborts. */
  maxHold?: number;
  /** false: keep the lock when the routine ends, until its lease runs out (renewal
   * stops), so a job runs once per lease period across servers. Default true. */
  releaseOnExit?: boolean;
  /** Once per period, in ms: when the routine resolves, keep the lock until `hold` ms
   * after it was taken (see {@link Lock.releaseAfter}) instead of releasing it, so that
   * every server whose cron fires within the period finds it taken, however long the
   * routine ran. If the routine rejects, the lock is released (another server may run
   * the job). Wins over `releaseOnExit`. */
  hold?: number;
}

export interface ClientOptions {
  /** The bound of every command (and of connecting), and the time allowed on top of a
   * wait, in ms (default 2000). */
  networkTimeout?: number;
  /** Confirm every grant, and every hand-off a waiting acquire receives, on the
   * server's replicas with `WAIT` before returning it; if fewer confirm within
   * `networkTimeout`, the grant is given back and the acquire rejects with
   * {@link LockNotConfirmedError}. Default true; false only if you accept that a
   * failover can lose a grant. */
  confirm?: boolean;
  /** Replicas that must confirm. Default: the server's `min-replicas-to-write` when
   * set, else the replicas online now (`ROLE`, reused for a second; a replica in its
   * full sync is not counted). Fewer online than expected is an error, not an
   * unconfirmed grant. */
  replicas?: number;
}

/** A node-redis client (`createClient`, v4-6). */
export interface NodeRedisClientLike {
  sendCommand(...args: any[]): Promise<unknown>; // eslint-disable-line @typescript-eslint/no-explicit-any
  duplicate(...args: any[]): unknown; // eslint-disable-line @typescript-eslint/no-explicit-any
}

/** A node-redis cluster (`createCluster`, v4-6). */
export interface NodeRedisClusterLike {
  sendCommand(...args: any[]): Promise<unknown>; // eslint-disable-line @typescript-eslint/no-explicit-any
  nodeClient(...args: any[]): unknown; // eslint-disable-line @typescript-eslint/no-explicit-any
}

/** An ioredis `Redis` or `Cluster` (v5-6). */
export interface IoredisLike {
  call(...args: any[]): Promise<unknown>; // eslint-disable-line @typescript-eslint/no-explicit-any
  duplicate(...args: any[]): unknown; // eslint-disable-line @typescript-eslint/no-explicit-any
  readonly isCluster: boolean;
}

/** What a {@link LockClient} takes: a connected client of a supported library. */
export type SupportedClient = NodeRedisClientLike | NodeRedisClusterLike | IoredisLike;

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

/** `lock.release()` of a lock this grant no longer holds (expired, released, taken
 * away): as node-redlock's release, it rejects. */
export class LockNotHeldError extends Error {
  constructor(
    readonly key: string,
    detail?: string,
  ) {
    super(`redis-lock: lock ${key} is not held by this grant${detail ? ` (${detail})` : ""}`);
    this.name = "LockNotHeldError";
  }
}

/** The server's replicas did not confirm a grant in time (it was given back), or fewer
 * replicas are connected than the deployment expects (nothing was acquired). */
export class LockNotConfirmedError extends Error {
  constructor(
    readonly key: string,
    message: string,
  ) {
    super(`redis-lock: lock ${key}: ${message}`);
    this.name = "LockNotConfirmedError";
  }
}

/** A session ended before it was closed (see {@link Session.signal}): a keepalive was
 * answered 0 (closed or run out on the server, or a restart without it), an acquire in
 * it was answered NOSESSION, or no keepalive got through before its lease ran out. */
export class SessionLostError extends Error {
  constructor(
    readonly reason: LostReason,
    where?: string,
  ) {
    super(`redis-lock: session lost${where ? ` on ${where}` : ""} (${reason})`);
    this.name = "SessionLostError";
  }
}

/** Redlock: fewer than a majority of the nodes answered (connection errors, timeouts, a
 * wrong password, a refused command), so whether the lock is free could not be learned;
 * not the `null` of a lock held elsewhere. What any node granted was released first.
 * `errors` names each node that did not answer by host:port (never a credential) and its
 * error. */
export class QuorumUnavailableError extends Error {
  constructor(
    readonly key: string,
    readonly answered: number,
    readonly quorum: number,
    readonly errors: { where: string; error: unknown }[],
    nodes: number,
  ) {
    super(
      `redis-lock: Redlock ${key}: ${answered} of ${nodes} nodes answered, a majority is ${quorum}; not acquired (` +
        errors.map((e) => `${e.where}: ${errorKind(e.error)}`).join(", ") +
        ")",
    );
    this.name = "QuorumUnavailableError";
  }
}

/** The server answered that LOCK.* is an unknown command. The message names the server,
 * never the command's arguments (the server's own message echoes them, tokens too). */
export class ModuleNotLoadedError extends Error {
  readonly code = "ERR";
  constructor(readonly where: string) {
    super(
      `redis-lock: the redis-lock module is not loaded on ${where}; load it at start-up ` +
        "(loadmodule target/release/libredis_lock.so of a build, or /usr/lib/redis/modules/redis-lock.so of the .deb), " +
        "see docs/quickstart-node.md in the redis-lock repository",
    );
    this.name = "ModuleNotLoadedError";
  }
}

/** An error reply from the server (node-redis ErrorReply, ioredis ReplyError): the
 * command ran and granted nothing. Anything else (a timeout, a closed connection) may
 * hide a grant. */
function isServerReply(e: unknown): boolean {
  if (e instanceof ModuleNotLoadedError) return true;
  const n = (e as { constructor?: { name?: string } })?.constructor?.name;
  return n === "ErrorReply" || n === "ReplyError" || n === "SimpleError" || n === "BlobError";
}

function isUnknownLockCommand(e: unknown): boolean {
  const m = (e as Error)?.message;
  return typeof m === "string" && /^(ERR )?unknown command ['`"]?lock\./i.test(m);
}

/** The error code of a server error reply (`WRONGTYPE`, `WRONGMODE`, `LIMITMISMATCH`,
 * `NOREPLICAS`, ...): the first word of its message. */
export function errorCode(e: unknown): string | undefined {
  const m = (e as Error)?.message;
  return typeof m === "string" ? m.split(" ", 1)[0] : undefined;
}


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
          "exact integers). Use node-redis 5+ or ioredis for exact fences.",
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

/** What a {@link Lock} needs of its {@link LockClient}. */
interface LockOwner {
  readonly networkTimeout: number;
  command(name: string, build: (key: string) => Arg[], limit?: number): Promise<unknown>;
  release(name: string, token: string): Promise<boolean>;
  extend(name: string, token: string, ttl?: number): Promise<boolean>;
  info(name: string): Promise<LockInfo | null>;
  leaseOf(name: string, fence: bigint | undefined): Promise<number | undefined>;
}

/** A granted lock. */
export class Lock {
  /** Aborted (with a {@link LockLostError} as its reason) when the lock is lost: taken
   * away (seen by renewal), renewal failed, the cap was reached, or the lease ended
   * without a renewal (the client's own conservative view of it). */
  readonly signal: AbortSignal;
  private readonly abort = new AbortController();
  private renewTimer: NodeJS.Timeout | undefined;
  private expiryTimer: NodeJS.Timeout | undefined;
  private released = false;
  private renewing = false;
  private ttl: number | undefined;
  private readonly grantedAt: number;

  constructor(
    private readonly client: LockOwner,
    /** The name as given (without a client key prefix). */
    readonly name: string,
    readonly token: string,
    /** The fencing token, exact (a grant whose fence the client library cannot read
     * exactly, node-redis 4 above 2^53, is given back and the acquire rejects). */
    readonly fence: bigint,
    ttl: number | undefined,
    grantedAt: number = Date.now(),
    /** The session the lock was taken in (its lease is the session's), if any. */
    readonly session?: Session,
  ) {
    this.signal = this.abort.signal;
    this.ttl = ttl;
    this.grantedAt = grantedAt;
    if (session) return; // no lease of its own: the session's signal is its own
    if (ttl !== undefined) this.expireAt(grantedAt + ttl - ttl / 100);
    else void this.learnLease();
  }

  /** The fence as a decimal string (exact). */
  get fenceString(): string {
    return this.fence.toString();
  }

  /** Why the lock was lost, undefined while held. */
  get lostReason(): LostReason | undefined {
    return this.signal.aborted ? (this.signal.reason as LockLostError).reason : undefined;
  }

  /** LOCK.RELEASE. Rejects with {@link LockNotHeldError} if this grant no longer held
   * the lock (expired, taken away, or released already). */
  async release(): Promise<void> {
    this.stop();
    this.session?.untrack(this);
    if (this.released) throw new LockNotHeldError(this.name);
    this.released = true;
    if (!(await this.client.release(this.name, this.token))) throw new LockNotHeldError(this.name);
  }

  private inSession(what: string): Error {
    return new Error(`redis-lock: lock ${this.name} was taken in a session: its lease is the session's (session.keepalive() renews every lock of it); ${what} is refused`);
  }

  /** Keeps the lock until `hold` ms after it was taken and lets go of this grant:
   * renewal stops and the lease is set to what is left of the hold (`LOCK.EXTEND`), so
   * the lock ends by itself then. If the hold is already over, releases it now. Rejects
   * with {@link LockNotHeldError} when this grant no longer holds the lock. */
  async releaseAfter(hold: number): Promise<void> {
    if (this.session) throw this.inSession("releaseAfter");
    const left = Math.round(this.grantedAt + hold - Date.now());
    if (left < 1 || this.released || this.signal.aborted) return this.release();
    this.stopRenewal();
    const kept = await this.client.extend(this.name, this.token, left);
    this.keep();
    if (!kept) throw new LockNotHeldError(this.name, "the hold could not be set");
  }

  /** LOCK.EXTEND to `ttl` ms from now (default: the acquire's TTL): true if still held. */
  async extend(ttl?: number): Promise<boolean> {
    if (this.session) throw this.inSession("extend");
    const sent = Date.now();
    const ok = await this.client.extend(this.name, this.token, ttl ?? this.ttl);
    const lease = ttl ?? this.ttl;
    if (ok && lease !== undefined && !this.released) this.expireAt(sent + lease - lease / 100);
    return ok;
  }

  /**
   * Runs one command only while this grant holds the lock, in one atomic step on the
   * server (`LOCK.IFHELD name token ...args`), and resolves with its reply
   * (`await lock.ifHeld("DECRBY", "stock:9001", "1")`). When the grant no longer holds
   * the lock (its lease ended: a pause longer than the lease, a lost renewal) nothing
   * runs, the lock counts as lost (`signal` aborts with `not-held`) and it rejects with
   * {@link LockNotHeldError}. Sent once. The arguments go as given: an ioredis
   * `keyPrefix` is not applied to the wrapped command's keys. In a cluster they must
   * share the lock's slot (a hash tag: `lock:{order:7}` and `stock:{order:7}`).
   */
  async ifHeld(...args: Arg[]): Promise<unknown> {
    if (args.length === 0) throw new TypeError("ifHeld needs a command, e.g. lock.ifHeld(\"SET\", \"k\", \"v\")");
    try {
      return await this.client.command(this.name, (k) => ["LOCK.IFHELD", k, this.token, ...args]);
    } catch (e) {
      if (errorCode(e) !== "NOTHELD") throw e;
      this.lose("not-held");
      throw new LockNotHeldError(this.name, "LOCK.IFHELD: the command did not run");
    }
  }

  /** `LOCK.CHECK name fence` with this grant's fence: true while the server counts it
   * as a holder. A check and a later write are still a race: write with {@link ifHeld}. */
  async check(): Promise<boolean> {
    return Number(await this.client.command(this.name, (k) => ["LOCK.CHECK", k, this.fence.toString()])) === 1;
  }

  /** @internal `LOCK.EXTEND name token [PX ttl] OWNER owner`: a new label and lease, the
   * fence kept (a leader's proclaim). Rejects with {@link LockNotHeldError} when lost. */
  async relabel(owner: string): Promise<void> {
    if (this.released || this.signal.aborted) throw new LockNotHeldError(this.name, "leadership lost; the value was not published");
    const sent = Date.now();
    const ttl = this.ttl;
    const n = Number(
      await this.client.command(this.name, (k) =>
        ttl === undefined ? ["LOCK.EXTEND", k, this.token, "OWNER", owner] : ["LOCK.EXTEND", k, this.token, "PX", String(Math.round(ttl)), "OWNER", owner],
      ),
    );
    if (n !== 1) {
      this.lose("not-held");
      throw new LockNotHeldError(this.name, "leadership lost; the value was not published");
    }
    if (ttl !== undefined && !this.released && !this.signal.aborted) this.expireAt(sent + ttl - ttl / 100);
  }

  /** True while this grant is neither released nor lost (as far as this client knows). */
  get held(): boolean {
    return !this.released && !this.signal.aborted;
  }

  /** True if LOCK.INFO shows this grant (by its fence) as a holder. */
  async owned(): Promise<boolean> {
    return (await this.client.leaseOf(this.name, this.fence)) !== undefined;
  }

  /** Renews the lease every third of the TTL until release, loss, or `maxHold` ms. */
  async startRenewal(maxHold?: number): Promise<void> {
    if (this.session || this.renewing || this.released || this.signal.aborted) return;
    this.renewing = true;
    if (this.ttl === undefined) await this.learnLease();
    if (this.ttl === undefined || this.released || this.signal.aborted) return;
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
        // The cap: no more renewals; the expiry timer aborts the signal at the deadline.
        this.expireAt(deadline, "cap-reached");
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
        this.expireAt(sent + ask, "cap-reached");
        return;
      }
      this.expireAt(deadline);
      this.schedule(step, Math.min(interval, deadline - Date.now()));
    };
    this.schedule(step, Math.min(interval, deadline - Date.now()));
  }

  /** Stops renewal (the lease then runs out on the server, and the signal aborts then). */
  stopRenewal(): void {
    if (this.renewTimer) clearTimeout(this.renewTimer);
    this.renewTimer = undefined;
  }

  /** @internal its session ended (`reason`), or was closed (undefined). */
  sessionEnded(reason: LostReason | undefined): void {
    if (reason === undefined) this.keep();
    else this.lose(reason);
  }

  /** @internal keep the lock until its lease ends, without this grant's timers. */
  keep(): void {
    this.stop();
    this.released = true;
  }

  private stop(): void {
    this.stopRenewal();
    if (this.expiryTimer) clearTimeout(this.expiryTimer);
    this.expiryTimer = undefined;
  }

  /** Without a TTL the lease is the server's lock.default-ttl: LOCK.INFO tells it. */
  private async learnLease(): Promise<void> {
    try {
      const left = await this.client.leaseOf(this.name, this.fence);
      if (this.ttl !== undefined || this.released) return;
      if (left === undefined) return this.lose("not-held");
      this.ttl = Math.max(3, left);
      this.expireAt(Date.now() + this.ttl - this.ttl / 100);
    } catch {
      /* unknown for now: renewal (if any) or the next extend sets it */
    }
  }

  private schedule(fn: () => unknown, ms: number): void {
    this.renewTimer = setTimeout(() => void fn(), Math.max(0, ms));
    this.renewTimer.unref?.();
  }

  /** The signal aborts at `at` (Date.now() ms) unless a renewal moves it. */
  private expireAt(at: number, reason: LostReason = "expired"): void {
    if (this.expiryTimer) clearTimeout(this.expiryTimer);
    this.expiryTimer = setTimeout(() => this.lose(reason), Math.max(0, at - Date.now()));
    this.expiryTimer.unref?.();
  }

  private lose(reason: LostReason): void {
    if (this.released || this.signal.aborted) return;
    this.stop();
    this.abort.abort(new LockLostError(this.name, reason));
  }
}

interface Replicas {
  at: number;
  /** Replicas online (undefined: ROLE and INFO refused). */
  online: number | undefined;
  toWrite: number;
}

/** Locks over one node-redis or ioredis client (standalone or cluster). */
export class LockClient implements LockOwner {
  readonly networkTimeout: number;
  readonly confirm: boolean;
  readonly replicas: number | undefined;
  private readonly driver: Driver;
  private readonly replicaCache = new Map<string, Replicas>();
  /** Per node: the commands it refused (an ACL user without them), and when. */
  private readonly refused = new Map<string, Map<string, number>>();
  private readonly observations = new Set<Observation>();
  /** Open sessions (closed by close()), and every session made here. */
  private readonly sessions = new Set<Session>();
  private readonly sessionsMade = new WeakSet<Session>();

  constructor(client: SupportedClient, options: ClientOptions = {}) {
    this.driver = driverFor(client);
    this.networkTimeout = options.networkTimeout ?? 2000;
    this.confirm = options.confirm ?? true;
    this.replicas = options.replicas;
    if (!(this.networkTimeout > 0)) throw new TypeError("networkTimeout must be positive");
    if (this.replicas !== undefined && !(Number.isInteger(this.replicas) && this.replicas >= 0)) {
      throw new TypeError("replicas must be an integer >= 0");
    }
  }

  /** Which library the client is, as detected ("node-redis", "ioredis cluster", ...). */
  get kind(): string {
    return this.driver.kind;
  }

  /** @internal runs a command on the node of `name` (`build` gets the full key), within
   * `limit` ms (default networkTimeout), only once its connection is ready. */
  async command(name: string, build: (key: string) => Arg[], limit = this.networkTimeout): Promise<unknown> {
    const key = this.driver.prefix + name;
    return this.run(key, build(key), limit);
  }

  private async run(key: string, args: Arg[], limit = this.networkTimeout): Promise<unknown> {
    const deadline = Date.now() + limit;
    await this.driver.ready(key, deadline);
    const r = await within(this.driver.call(key, args), deadline - Date.now());
    if (!r) {
      throw new LockTimeoutError(`redis-lock: ${String(args[0])}: no reply from ${this.driver.where(key)} within ${limit} ms`);
    }
    if (!r.ok) throw this.mapped(r.error, key);
    return r.value;
  }

  /** @internal host:port of the node of `name` (for messages; never a credential). */
  whereOf(name: string): string {
    return this.driver.where(this.driver.prefix + name);
  }

  /** A missing module is named, without the server's message (it echoes the token). */
  private mapped(e: unknown, key: string): unknown {
    return isUnknownLockCommand(e) ? new ModuleNotLoadedError(this.driver.where(key)) : e;
  }

  /** Takes the lock: a {@link Lock}, or null when it is held (after `wait`, if given). */
  async acquire(name: string, options: AcquireOptions = {}): Promise<Lock | null> {
    const session = options.session;
    if (!session) return this.acquireOnce(name, options);
    if (options.ttl !== undefined) throw new TypeError("a lock of a session has the session's lease: no ttl");
    if (!this.sessionsMade.has(session)) throw new TypeError("the session belongs to another LockClient");
    // Opened on the key's server before its first lock there (a cluster: each primary).
    await session.openOn(this.driver.prefix + name);
    let lock: Lock | null;
    try {
      lock = await this.acquireOnce(name, options);
    } catch (e) {
      if (isServerReply(e) && errorCode(e) === "NOSESSION") throw session.endedOn(this.whereOf(name));
      throw e;
    }
    if (lock) session.track(lock);
    return lock;
  }

  private async acquireOnce(name: string, options: AcquireOptions): Promise<Lock | null> {
    const token = options.token ?? randomUUID();
    const key = this.driver.prefix + name;
    const wait = options.wait ?? 0;
    if (options.shared && options.limit !== undefined) throw new TypeError("a lock is either shared or counted (limit), not both");
    if (options.limit !== undefined && !(Number.isInteger(options.limit) && options.limit >= 1)) throw new TypeError("limit must be an integer >= 1");
    if (options.ttl !== undefined && !(options.ttl >= 1)) throw new TypeError("ttl must be at least 1 ms");
    const args: Arg[] = ["LOCK.ACQUIRE", key];
    if (options.shared) args.push("SHARED");
    if (options.limit !== undefined) args.push("LIMIT", String(options.limit));
    // A lock of a session has the session's lease (PX and SESSION exclude each other).
    if (options.session) args.push("SESSION", options.session.id);
    else if (options.ttl !== undefined) args.push("PX", String(Math.round(options.ttl)));
    args.push("TOKEN", token);
    if (options.owner !== undefined) args.push("OWNER", options.owner);
    const confirm = options.confirm ?? this.confirm;
    const need = confirm ? await this.replicasNeeded(name, key, options.replicas ?? this.replicas) : 0;
    let reply: unknown;
    let sent = Date.now();
    if (!(wait > 0)) {
      try {
        reply = await this.run(key, args);
      } catch (e) {
        // A timeout may hide a grant: give it back (the token is ours; on the same
        // connection the release runs after the acquire, whenever that is).
        if (!isServerReply(e) && !(e instanceof LockConnectionError)) await this.releaseQuietly(name, token);
        throw e;
      }
      const fence = await this.grantOf(reply, name, token);
      if (fence === null) return null;
      if (need > 0) await this.confirmGrant(name, token, need, (a, limit) => this.run(key, a, limit));
      return new Lock(this, name, token, fence, options.ttl, sent, options.session);
    }
    const blockMs = wait === Infinity ? 0 : Math.max(1, Math.round(wait));
    args.push("BLOCK", String(blockMs));
    if (options.signal?.aborted) throw abortReason(options.signal);
    const conn: Dedicated = await this.driver.dedicated(key, this.networkTimeout);
    try {
      reply = await this.acquireBlocking(conn, name, key, token, args, wait === Infinity ? Infinity : blockMs + this.networkTimeout, options.signal);
      sent = Date.now();
      const fence = await this.grantOf(reply, name, token);
      if (fence === null) return null;
      if (need > 0) {
        await this.confirmGrant(name, token, need, async (a, limit) => {
          const r = await within(conn.send(a), limit);
          if (!r) throw new LockTimeoutError(`redis-lock: ${String(a[0])}: no reply within ${limit} ms`);
          if (!r.ok) throw r.error;
          return r.value;
        });
      }
      return new Lock(this, name, token, fence, options.ttl, sent, options.session);
    } finally {
      conn.close();
    }
  }

  /** The fence of a LOCK.ACQUIRE reply, null when not granted. A fence the library
   * could not read exactly (node-redis 4 above 2^53) is no fence: the grant is given back
   * and the acquire rejects. */
  private async grantOf(reply: unknown, name: string, token: string): Promise<bigint | null> {
    if (reply === null || reply === undefined) return null;
    // Never the reply itself in a message: it holds the token.
    if (!Array.isArray(reply) || reply.length !== 2) throw new Error(`redis-lock: unexpected LOCK.ACQUIRE reply (${typeof reply})`);
    if (asString(reply[0]) !== token) throw new Error("redis-lock: LOCK.ACQUIRE granted a token other than the one sent");
    const fence = exactInt(reply[1]);
    if (fence !== undefined) return fence;
    await this.releaseQuietly(name, token);
    throw new Error(`redis-lock: lock ${name}: the fence is above 2^53 and ${this.driver.kind} cannot read it exactly; the grant was released (use node-redis 5+ or ioredis)`);
  }

  /** How many replicas must confirm a grant on the node of `key`, the rule of the Rust
   * client and the CLI: `replicas`, else the server's min-replicas-to-write when set,
   * else the replicas online now (a replica in its full sync is not counted: it gets the
   * grant with its sync), read with ROLE and reused for a second. Fewer online than
   * expected is an error before anything is acquired; so is not knowing how many are
   * online (ROLE and INFO refused) unless the count is given. */
  private async replicasNeeded(name: string, key: string, replicas: number | undefined): Promise<number> {
    const where = this.driver.where(key);
    const cached = this.replicaCache.get(where);
    const fresh = !cached || Date.now() - cached.at > 1000;
    let r = fresh ? await this.readReplicas(key, where) : cached;
    let expected: number;
    let source: string;
    if (replicas !== undefined) [expected, source] = [replicas, "replicas"];
    else if (r.toWrite > 0) [expected, source] = [r.toWrite, "min-replicas-to-write"];
    else if (r.online === undefined) {
      throw new LockNotConfirmedError(
        name,
        `cannot learn how many replicas of ${where} should confirm a grant (ROLE and INFO refused); grant the user +role, or pass replicas: n (the count) or confirm: false; not acquired`,
      );
    } else return r.online;
    if (!fresh && r.online !== undefined && r.online < expected) r = await this.readReplicas(key, where); // a second old: ask again
    if (r.online !== undefined && r.online < expected) {
      throw new LockNotConfirmedError(name, `${expected} replica(s) expected (${source}) but ${r.online} online at ${where}; not acquired`);
    }
    return expected;
  }

  /** The replicas online (ROLE; INFO replication if ROLE is refused; undefined if both
   * are) and min-replicas-to-write (CONFIG GET; 0 if refused) of the node of `key`. A
   * command the server refuses (an ACL user without it) is not asked again for a minute. */
  private async readReplicas(key: string, where: string): Promise<Replicas> {
    const refused = this.refused.get(where) ?? new Map<string, number>();
    this.refused.set(where, refused);
    const allowed = (cmd: string) => !(Date.now() - (refused.get(cmd) ?? -Infinity) < 60_000);
    const ask = async (cmd: string, args: Arg[]): Promise<unknown> => {
      try {
        return await this.run(key, args);
      } catch (e) {
        if (!isServerReply(e)) throw e;
        refused.set(cmd, Date.now());
        return undefined;
      }
    };
    // ROLE and CONFIG GET together (one round trip); INFO only when ROLE is refused. A
    // refused CONFIG (it would show every setting), or a renamed one: no setting we know.
    const [role, config] = await Promise.all([
      allowed("ROLE") ? ask("ROLE", ["ROLE"]) : undefined,
      allowed("CONFIG") ? ask("CONFIG", ["CONFIG", "GET", "min-replicas-to-write"]) : undefined,
    ]);
    let online = onlineInRole(role);
    if (online === undefined && allowed("INFO")) online = onlineInInfo(await ask("INFO", ["INFO", "replication"]));
    const toWrite = config === undefined ? 0 : configValue(config);
    const r = { at: Date.now(), online, toWrite };
    this.replicaCache.set(where, r);
    return r;
  }

  /** WAIT on the grant's connection; fewer than `need` within networkTimeout: the grant
   * is given back and the acquire rejects. */
  private async confirmGrant(name: string, token: string, need: number, send: (args: Arg[], limit: number) => Promise<unknown>): Promise<void> {
    const waitMs = Math.round(this.networkTimeout);
    let acks: number;
    try {
      acks = Number(await send(["WAIT", String(need), String(waitMs)], 2 * this.networkTimeout));
    } catch (e) {
      await this.releaseQuietly(name, token);
      throw new LockNotConfirmedError(name, `WAIT for ${need} replica(s) failed (${(e as Error)?.name ?? "error"}); the grant was released`);
    }
    if (acks >= need) return;
    let released = false;
    try {
      released = Number(await send(["LOCK.RELEASE", this.driver.prefix + name, token], this.networkTimeout)) === 1;
    } catch {
      await this.releaseQuietly(name, token);
    }
    throw new LockNotConfirmedError(name, `${acks} of ${need} replica(s) confirmed the grant within ${waitMs} ms; ${released ? "released it" : "sent LOCK.RELEASE"}`);
  }

  /** The blocking acquire on a connection of its own. If the server has not answered
   * within the wait plus networkTimeout, LOCK.RELEASE goes out on the same connection:
   * the server runs it right after the wait ends, so a grant made after we gave up is
   * given back at once instead of staying held with nobody listening. */
  private async acquireBlocking(conn: Dedicated, name: string, key: string, token: string, args: Arg[], limit: number, signal?: AbortSignal): Promise<unknown> {
    let onAbort: (() => void) | undefined;
    const aborted = signal
      ? new Promise<"aborted">((resolve) => {
          onAbort = () => resolve("aborted");
          signal.addEventListener("abort", onAbort, { once: true });
        })
      : undefined;
    try {
      const reply = conn.send(args);
      const r = aborted ? await Promise.race([within(reply, limit), aborted]) : await within(reply, limit);
      if (r === "aborted") {
        // The waiting connection closes (the server drops the waiter); a grant that
        // raced the abort is released now, and again a moment later in case the server
        // granted before it saw the connection close.
        conn.close();
        reply.catch(() => undefined);
        await this.releaseQuietly(name, token);
        setTimeout(() => void this.releaseQuietly(name, token), 250).unref?.();
        throw new AbortedWait(abortReason(signal!));
      }
      if (r) {
        if (r.ok) return r.value;
        throw this.mapped(r.error, key);
      }
      const released = conn.send(["LOCK.RELEASE", key, token]);
      const late = await within(reply, this.networkTimeout);
      const rel = late ? await within(released, this.networkTimeout) : undefined;
      if (rel?.ok) return null; // answered late; any late grant is released
      await this.releaseQuietly(name, token);
      throw new LockTimeoutError(`redis-lock: LOCK.ACQUIRE ${name}: no reply from ${this.driver.where(key)} within the wait plus ${this.networkTimeout} ms; sent LOCK.RELEASE for the token`);
    } catch (e) {
      if (e instanceof AbortedWait) throw e.reason;
      if (!(e instanceof LockTimeoutError) && !isServerReply(e)) await this.releaseQuietly(name, token);
      throw e;
    } finally {
      if (onAbort) signal?.removeEventListener("abort", onAbort);
    }
  }

  private async releaseQuietly(name: string, token: string): Promise<void> {
    await within(this.release(name, token), this.networkTimeout).catch(() => undefined);
  }

  /**
   * Runs `routine` while holding the lock, renewing it (unless `autoRenew: false`), and
   * releases it afterwards (unless `releaseOnExit: false`, or `hold`: once per period). `signal` aborts when the lock
   * is lost; then `using` rejects with that {@link LockLostError} even if the routine
   * resolved. Rejects with {@link LockBusyError} when the lock could not be taken within
   * `wait`.
   */
  async using<T>(name: string, options: UsingOptions, routine: (signal: AbortSignal, lock: Lock) => Promise<T>): Promise<T> {
    if (options.hold !== undefined && !(options.hold >= 1)) throw new TypeError("hold must be at least 1 ms");
    const lock = await this.acquire(name, options);
    if (!lock) throw new LockBusyError(name);
    let failed = false;
    let result: T;
    try {
      if (options.autoRenew !== false) await lock.startRenewal(options.maxHold);
      result = await routine(lock.signal, lock);
    } catch (e) {
      failed = true;
      throw e;
    } finally {
      if (options.releaseOnExit === false && options.hold === undefined) {
        lock.keep();
      } else {
        try {
          if (options.hold !== undefined && !failed) await lock.releaseAfter(options.hold);
          else await lock.release();
        } catch (e) {
          if (!failed && !lock.signal.aborted) throw e;
        }
      }
    }
    if (lock.signal.aborted) throw lock.signal.reason;
    return result;
  }

  /** LOCK.RELEASE by name and token: true if the token held it. */
  async release(name: string, token: string): Promise<boolean> {
    return Number(await this.command(name, (k) => ["LOCK.RELEASE", k, token])) === 1;
  }

  /** LOCK.EXTEND by name and token (ttl in ms; default the server's default TTL). */
  async extend(name: string, token: string, ttl?: number): Promise<boolean> {
    return Number(await this.command(name, (k) => (ttl === undefined ? ["LOCK.EXTEND", k, token] : ["LOCK.EXTEND", k, token, "PX", String(Math.round(ttl))]))) === 1;
  }

  /**
   * A guarded command for code that was handed only a fence (a worker the holder
   * delegates to): runs the command only while the holder with fence `fence` holds
   * `name`, in one atomic step (`LOCK.IFFENCE name fence ...args`), and resolves with
   * its reply; rejects with {@link LockNotHeldError} (nothing ran) otherwise. A fence is
   * not a secret: this refuses stale writes, it does not authorize them. Sent once.
   */
  async ifFence(name: string, fence: bigint | number | string, ...args: Arg[]): Promise<unknown> {
    if (args.length === 0) throw new TypeError("ifFence needs a command");
    try {
      return await this.command(name, (k) => ["LOCK.IFFENCE", k, String(fence), ...args]);
    } catch (e) {
      if (errorCode(e) !== "NOTHELD") throw e;
      throw new LockNotHeldError(name, "LOCK.IFFENCE: the command did not run");
    }
  }

  /** `LOCK.CHECK name fence`: true if `fence` is the fence of a current holder. */
  async check(name: string, fence: bigint | number | string): Promise<boolean> {
    return Number(await this.command(name, (k) => ["LOCK.CHECK", k, String(fence)])) === 1;
  }

  /**
   * Campaigns for leadership of `key` with `value` (1..256 bytes): waits in the lock's
   * FIFO queue (`LOCK.ACQUIRE key ... OWNER value BLOCK ...`) until elected, or until
   * `wait` ms passed (null) or `signal` aborted (rejects with its reason; the candidate
   * leaves the queue). The {@link Leadership} renews its lease every third of `ttl`
   * (default: the server's lock.default-ttl) until resigned or lost; its `signal`
   * aborts on loss. Candidates are elected in the order they started campaigning.
   */
  async campaign(key: string, value: string, options: CampaignOptions = {}): Promise<Leadership | null> {
    checkValue(value);
    const lock = await this.acquire(key, {
      ttl: options.ttl,
      wait: options.wait ?? Infinity,
      owner: value,
      token: options.token,
      confirm: options.confirm,
      replicas: options.replicas,
      signal: options.signal,
    });
    if (!lock) return null;
    await lock.startRenewal();
    return new Leadership(lock, value);
  }

  /** Who leads `key` now, or null: one round trip, `LOCK.INFO key COUNT 1` (it answers
   * at once whether or not the key is held). */
  async leader(key: string): Promise<Leader | null> {
    const seen = parseHolder(await this.command(key, (k) => ["LOCK.INFO", k, "COUNT", "1"]));
    return seen ? toLeader(seen) : null;
  }

  /**
   * Observes the election of `key`: an async iterator of who leads, first who leads
   * now, then every change (a new leader, a new value proclaimed, `null` when nobody
   * leads), each from one `LOCK.WATCH` that waits on the server (no polling) on a
   * connection of its own. It survives time-outs, reconnects, TRYAGAIN and LOCKMOVED
   * (it reads the state again). `return()` (leaving a `for await` loop) or `signal`
   * ends it at once and closes its connection. Changes closer together than a round
   * trip may be seen as one; the latest state is always seen.
   */
  observe(key: string, options: ObserveOptions = {}): Observation {
    const block = options.block ?? 10_000;
    if (!(block >= 1)) throw new TypeError("block must be at least 1 ms");
    const fullKey = this.driver.prefix + key;
    const observation = new Observation(
      {
        networkTimeout: this.networkTimeout,
        dedicated: () => this.driver.dedicated(fullKey, this.networkTimeout),
        where: () => this.driver.where(fullKey),
        refresh: async () => {
          await this.command(key, (k) => ["EXISTS", k]).catch(() => undefined);
        },
      },
      fullKey,
      Math.round(block),
      options.signal,
      () => this.observations.delete(observation),
    );
    if (!observation.isClosed) this.observations.add(observation);
    return observation;
  }

  /** LOCK.INFO as an object (fence as bigint), null when the lock is free. */
  async info(name: string): Promise<LockInfo | null> {
    return parseInfo(await this.command(name, (k) => ["LOCK.INFO", k]));
  }

  /** @internal the lease left (ms) of the holder with `fence`, undefined if none;
   * pages through LOCK.INFO's holder list (`cursor`). */
  async leaseOf(name: string, fence: bigint | undefined): Promise<number | undefined> {
    if (fence === undefined) return undefined;
    let args = (k: string): Arg[] => ["LOCK.INFO", k];
    for (let page = 0; page < 10_000; page++) {
      const info = parseInfo(await this.command(name, args));
      if (!info) return undefined;
      const ttl = holderTtl(info, fence);
      if (ttl !== undefined) return ttl;
      const cursor = exactInt(info.cursor);
      if (!Array.isArray(info["holder-list"]) || cursor === undefined || cursor <= 0n || cursor >= fence) return undefined;
      args = (k) => ["LOCK.INFO", k, "COUNT", "100", "AFTER", cursor.toString()];
    }
    return undefined;
  }

  /**
   * A session: one lease for any number of locks (see {@link Session}). Nothing is
   * sent yet: the session is opened on a server before its first lock there.
   */
  session(options: SessionOptions = {}): Session {
    const session = new Session(
      {
        networkTimeout: this.networkTimeout,
        ready: (key) => this.driver.ready(key, Date.now() + this.networkTimeout),
        where: (key) => this.driver.where(key),
        dedicated: (key) => this.driver.dedicated(key, this.networkTimeout),
        mapped: (e, key) => this.mapped(e, key),
        acquire: (name, o) => this.acquire(name, o),
        closed: () => this.sessions.delete(session),
      },
      options,
    );
    this.sessions.add(session);
    this.sessionsMade.add(session);
    return session;
  }

  /** Closes the connections this LockClient opened (not the client it was given),
   * observations included; open sessions are closed (their locks released). */
  async close(): Promise<void> {
    for (const o of [...this.observations]) o.close();
    await Promise.all([...this.sessions].map((s) => s.close().catch(() => 0)));
    await this.driver.close();
  }
}

/** An acquire's wait aborted by its signal (carries the signal's reason). */
class AbortedWait {
  constructor(readonly reason: unknown) {}
}

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new Error("redis-lock: aborted");
}

// ---------------------------------------------------------------- sessions

export interface SessionOptions {
  /** The session's lease in ms (default 30 000): every lock taken in it lives as long
   * as the session; a keepalive every third of it renews them all, one command per
   * server however many locks. */
  ttl?: number;
  /** Bind the session to its connection: it ends `bind` ms after that connection
   * closes (the process died) unless a keepalive comes first, instead of at the end of
   * its lease. Default: not bound. */
  bind?: number;
  /** Label shown by LOCK.SESSION INFO, and the default `owner` of its locks. */
  owner?: string;
  /** Confirm the grants of its locks on replicas (default: the client's `confirm`). */
  confirm?: boolean;
  /** How many replicas must confirm (default: the client's `replicas`). */
  replicas?: number;
}

/** What {@link Session.acquire} takes: {@link AcquireOptions} without a lease. */
export type SessionAcquireOptions = Omit<AcquireOptions, "ttl" | "session">;

/** What a {@link Session} needs of its LockClient (keys are full keys, prefix included). */
interface SessionHost {
  readonly networkTimeout: number;
  ready(key: string): Promise<void>;
  where(key: string): string;
  dedicated(key: string): Promise<Dedicated>;
  mapped(e: unknown, key: string): unknown;
  acquire(name: string, options: AcquireOptions): Promise<Lock | null>;
  closed(): void;
}

/** The session on one server: the connection it is kept alive over (a bound session is
 * bound to it), and when it was last renewed there. */
class SessionPart {
  conn: Dedicated | undefined;
  opened = false;
  /** The send time of its last OPEN or KEEPALIVE answered as renewed (Date.now() ms). */
  renewedAt = 0;
  /** What the last try failed with (undefined after a success). */
  failing: string | undefined;
  constructor(
    readonly where: string,
    /** A key of a lock there: what routes a new connection to this server. */
    readonly key: string,
  ) {}
}

/** The longest pause between two tries while a server does not answer a keepalive. */
const RETRY_MAX_MS = 1000;

/**
 * A session: one lease for any number of locks, as etcd, ZooKeeper and Consul have
 * them ({@link LockClient.session}). Every lock taken in it (`LOCK.ACQUIRE ... SESSION
 * id`) has the session's lease: one `LOCK.SESSION KEEPALIVE` per server, every third of
 * the TTL, renews all of them, and when the session ends (closed, its lease run out, or,
 * with `bind`, the process gone) every lock it holds is released in one step. In a
 * cluster it is opened on each primary before its first lock there and kept alive on
 * each of them, over a connection of its own per server.
 */
export class Session {
  /** The session's id: a secret, like a lock's token (whoever has it can keep the
   * session alive or close it). 32 random hex digits. */
  readonly id: string = randomUUID().replace(/-/g, "");
  /** Aborted (with a {@link SessionLostError} as its reason) when the session ends
   * without `close()`; the `signal` of each of its locks aborts then too. */
  readonly signal: AbortSignal;
  /** The lease, in ms. */
  readonly ttl: number;
  readonly bind: number | undefined;
  readonly owner: string | undefined;
  private readonly abort = new AbortController();
  private readonly parts = new Map<string, SessionPart>();
  private readonly locks = new Set<Lock>();
  private chain: Promise<unknown> = Promise.resolve();
  private timer: NodeJS.Timeout | undefined;
  private closing: Promise<number> | undefined;
  private lost: LostReason | undefined;

  constructor(
    private readonly host: SessionHost,
    private readonly options: SessionOptions,
  ) {
    this.signal = this.abort.signal;
    this.ttl = options.ttl ?? 30_000;
    this.bind = options.bind;
    this.owner = options.owner;
    if (!(this.ttl >= 3)) throw new TypeError("ttl must be at least 3 ms");
    if (this.bind !== undefined && !(this.bind >= 0)) throw new TypeError("bind is a grace period in ms, 0 or more");
    if (this.owner !== undefined && !(Buffer.byteLength(this.owner) >= 1 && Buffer.byteLength(this.owner) <= 256)) {
      throw new TypeError("owner must be 1 to 256 bytes");
    }
  }

  /** ms between two keepalives: a third of the TTL (two more tries fit in the lease
   * when one fails, as for a lock's renewal). */
  get interval(): number {
    return this.ttl / 3;
  }

  /** Why the session ended without `close()`: `not-held` (a server answered that it is
   * not open there: closed by someone else, its lease ran out, a restart without it),
   * `failed` (keepalives failed until its lease ran out), `expired` (no keepalive was
   * tried in time: the process was blocked); undefined while it holds. */
  get lostReason(): LostReason | undefined {
    return this.lost;
  }

  /** True once `close()` was called. */
  get isClosed(): boolean {
    return this.closing !== undefined;
  }

  /**
   * Takes `name` in the session (`LOCK.ACQUIRE name ... SESSION id`): a {@link Lock},
   * or null when it is held elsewhere (after `wait`). Waiting, `shared`/`limit`, the
   * confirmation on replicas and `signal` are those of {@link LockClient.acquire}. The
   * lock has the session's lease: no renewal of its own, `release()` gives it back,
   * `extend()` rejects, and its `signal` aborts when the session is lost. The same as
   * `locks.acquire(name, { session, ... })` (and `locks.using(name, { session }, fn)`).
   * Rejects with {@link SessionLostError} once the session has ended.
   */
  acquire(name: string, options: SessionAcquireOptions = {}): Promise<Lock | null> {
    return this.host.acquire(name, { owner: this.owner, confirm: this.options.confirm, replicas: this.options.replicas, ...options, session: this });
  }

  /** A keepalive now on every server the session is open on (the timer goes on as
   * before): true when each renewed it; false when one did not (`lostReason` is set if
   * the session ended there). */
  async keepalive(): Promise<boolean> {
    this.checkUsable();
    const ok = await this.exclusive(() => this.round());
    this.schedule();
    return ok && this.lost === undefined;
  }

  /**
   * Ends the session: `LOCK.SESSION CLOSE` on every server it is open on releases all
   * its locks there at once (their waiters served), and its connections are closed.
   * Resolves with the number of locks released. Every server is tried; if one could not
   * be reached it rejects with that error afterwards (the session ends there with its
   * lease, or its `bind` grace). Calling it again returns the same promise.
   */
  close(): Promise<number> {
    if (!this.closing) this.closing = this.closeAll();
    return this.closing;
  }

  /** `LOCK.SESSION INFO` of every server the session is open on, by host:port (null
   * where it is not open any more): ttl, owner, bound, locks, lock-list, ... */
  async info(): Promise<Record<string, LockInfo | null>> {
    return this.exclusive(async () => {
      const out: Record<string, LockInfo | null> = {};
      for (const p of this.opened()) out[p.where] = parseInfo((await this.send(p, () => ["LOCK.SESSION", "INFO", this.id])).reply);
      return out;
    });
  }

  // ---------------------------------------------------------------- for LockClient

  /** @internal opens the session on the server of `key` unless it is open there. */
  async openOn(key: string): Promise<void> {
    this.checkUsable();
    await this.host.ready(key);
    const where = this.host.where(key);
    if (this.parts.get(where)?.opened) return;
    await this.exclusive(async () => {
      this.checkUsable();
      let part = this.parts.get(where);
      if (!part) this.parts.set(where, (part = new SessionPart(where, key)));
      if (part.opened) return;
      // 1: opened; 0: it was open (an OPEN whose reply was lost, sent again).
      const { sent } = await this.send(part, () => this.openArgs());
      part.opened = true;
      part.renewedAt = sent;
      part.failing = undefined;
    });
    this.schedule();
  }

  /** @internal an acquire was answered NOSESSION: the session ended on `where`. */
  endedOn(where: string): SessionLostError {
    this.lose("not-held", where);
    return new SessionLostError("not-held", where);
  }

  /** @internal a lock granted in the session. */
  track(lock: Lock): void {
    if (this.closing) lock.sessionEnded(undefined);
    else if (this.lost) lock.sessionEnded(this.lost);
    else this.locks.add(lock);
  }

  /** @internal a lock of the session released. */
  untrack(lock: Lock): void {
    this.locks.delete(lock);
  }

  // ---------------------------------------------------------------- keepalive

  private checkUsable(): void {
    if (this.closing) throw new Error("redis-lock: the session is closed");
    if (this.lost) throw new SessionLostError(this.lost);
  }

  /** Runs `fn` after every earlier call of it: the session's connections carry one
   * command at a time. */
  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const p = this.chain.then(fn);
    this.chain = p.catch(() => undefined);
    return p;
  }

  private opened(): SessionPart[] {
    return [...this.parts.values()].filter((p) => p.opened);
  }

  /** The client's conservative view of the lease on a server (drift: 1% of the TTL). */
  private deadlineOf(p: SessionPart): number {
    return p.renewedAt + this.ttl - this.ttl / 100;
  }

  private openArgs(): Arg[] {
    const args: Arg[] = ["LOCK.SESSION", "OPEN", this.id, "PX", String(Math.round(this.ttl))];
    if (this.bind !== undefined) args.push("BIND", String(Math.round(this.bind)));
    if (this.owner !== undefined) args.push("OWNER", this.owner);
    return args;
  }

  /** KEEPALIVE; on a new connection of a bound session, OPEN (which renews it and binds
   * it to that connection; a KEEPALIVE rebinds only a session whose connection the
   * server saw close, and a restarted server keeps no binding). */
  private keepaliveArgs(p: SessionPart): Arg[] {
    return this.bind !== undefined && !p.conn ? this.openArgs() : ["LOCK.SESSION", "KEEPALIVE", this.id];
  }

  private drop(p: SessionPart): void {
    p.conn?.close();
    p.conn = undefined;
  }

  /** One command on the part's connection (made if there is none; `build` gives the
   * arguments once it is known whether it is new). A connection that was open and turns
   * out closed (a server restart) is replaced once. */
  private async send(p: SessionPart, build: () => Arg[]): Promise<{ reply: unknown; args: Arg[]; sent: number }> {
    for (let attempt = 0; ; attempt++) {
      const fresh = !p.conn;
      const args = build();
      const sent = Date.now();
      if (!p.conn) p.conn = await this.host.dedicated(p.key);
      const r = await within(p.conn.send(args), this.host.networkTimeout);
      if (!r) {
        this.drop(p);
        throw new LockTimeoutError(`redis-lock: LOCK.SESSION ${String(args[1])}: no reply from ${p.where} within ${this.host.networkTimeout} ms`);
      }
      if (r.ok) return { reply: r.value, args, sent };
      if (isServerReply(r.error)) throw this.host.mapped(r.error, p.key);
      this.drop(p);
      if (fresh || attempt > 0) throw r.error;
    }
  }

  /** One keepalive on every server the session is open on, at once: true when every
   * one renewed it. A server that answers that the session is not open there ends it. */
  private async round(): Promise<boolean> {
    const parts = this.opened();
    const results = await Promise.all(
      parts.map(async (p) => {
        try {
          const { reply, args, sent } = await this.send(p, () => this.keepaliveArgs(p));
          return await this.renewed(p, args, reply, sent);
        } catch (e) {
          p.failing = errorKind(e);
          return false;
        }
      }),
    );
    return results.every((ok) => ok);
  }

  private async renewed(p: SessionPart, args: Arg[], reply: unknown, sent: number): Promise<boolean> {
    const opened = args[1] === "OPEN";
    // KEEPALIVE: 1 renewed, 0 not open there. OPEN: 0 it was open (renewed, and bound
    // to this connection), 1 it was not (a new, empty session).
    if (Number(reply) === (opened ? 0 : 1)) {
      p.renewedAt = sent;
      p.failing = undefined;
      return true;
    }
    if (opened) await this.send(p, () => ["LOCK.SESSION", "CLOSE", this.id]).catch(() => undefined);
    this.lose("not-held", p.where);
    return false;
  }

  /** The next round: every third of the TTL, sooner (and again within a second) while a
   * server fails to answer; the session is lost when its lease on a server passed
   * without a renewal. The timer does not keep the process alive (its connections do,
   * until `close()`). */
  private schedule(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    const parts = this.opened();
    if (this.closing || this.lost || parts.length === 0) return;
    const now = Date.now();
    const deadline = Math.min(...parts.map((p) => this.deadlineOf(p)));
    let due = Math.min(...parts.map((p) => p.renewedAt)) + this.interval;
    if (parts.some((p) => p.failing)) due = Math.min(due, now + Math.max(50, Math.min(RETRY_MAX_MS, (deadline - now) / 4)));
    this.timer = setTimeout(() => void this.tick(), Math.max(0, Math.min(due, deadline) - now));
    this.timer.unref?.();
  }

  private async tick(): Promise<void> {
    this.timer = undefined;
    await this.exclusive(async () => {
      if (this.closing || this.lost) return;
      const late = this.opened().filter((p) => this.deadlineOf(p) <= Date.now());
      if (late.length > 0) this.lose(late.some((p) => p.failing) ? "failed" : "expired", late[0].where);
      else await this.round();
    }).catch(() => this.lose("failed"));
    this.schedule();
  }

  private lose(reason: LostReason, where?: string): void {
    if (this.closing || this.lost) return;
    this.lost = reason;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    for (const lock of this.locks) lock.sessionEnded(reason);
    this.locks.clear();
    this.abort.abort(new SessionLostError(reason, where));
  }

  private async closeAll(): Promise<number> {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    try {
      return await this.exclusive(async () => {
        const errors: unknown[] = [];
        const counts = await Promise.all(
          [...this.parts.values()].map(async (p) => {
            try {
              return p.opened ? Number((await this.send(p, () => ["LOCK.SESSION", "CLOSE", this.id])).reply ?? 0) : 0;
            } catch (e) {
              errors.push(e);
              return 0;
            } finally {
              this.drop(p);
            }
          }),
        );
        if (errors.length > 0) throw errors[0];
        return counts.reduce((a, b) => a + b, 0);
      });
    } finally {
      for (const lock of this.locks) lock.sessionEnded(undefined);
      this.locks.clear();
      this.host.closed();
    }
  }
}

// ---------------------------------------------------------------- leader election

/** Who leads an election: the value it campaigned with (or proclaimed since) and its
 * term, the fence of its grant (terms strictly increase from one leader to the next). */
export interface Leader {
  value: string;
  term: bigint;
}

export interface CampaignOptions {
  /** The leader's lease in ms, renewed every third of it; also how long a crashed
   * leader keeps the others waiting. Default: the server's lock.default-ttl (30 s). */
  ttl?: number;
  /** How long to wait in the queue, in ms (default Infinity: until elected). */
  wait?: number;
  /** Cancels the campaign (see {@link AcquireOptions.signal}). */
  signal?: AbortSignal;
  /** Hold the lock with this token (default: a random UUID). */
  token?: string;
  confirm?: boolean;
  replicas?: number;
}

export interface ObserveOptions {
  /** The longest one LOCK.WATCH waits on the server before it answers anyway, in ms
   * (default 10 000); it also bounds how long a dead connection goes unnoticed. */
  block?: number;
  /** Ends the observation (as `return()` does). */
  signal?: AbortSignal;
}

function checkValue(value: string): void {
  if (typeof value !== "string" || Buffer.byteLength(value) < 1 || Buffer.byteLength(value) > 256) {
    throw new TypeError("an election value must be a string of 1 to 256 bytes");
  }
}

/** A won election: the leader's lock, renewed until it is resigned or lost. */
export class Leadership {
  private current: string;

  constructor(
    /** The lock underneath (token, fence, signal). */
    readonly lock: Lock,
    value: string,
  ) {
    this.current = value;
  }

  /** The election's key. */
  get key(): string {
    return this.lock.name;
  }

  /** The value published now: the campaign's, or the last one proclaimed. */
  get value(): string {
    return this.current;
  }

  /** The fence of the leader's grant (exact). */
  get term(): bigint {
    return this.lock.fence;
  }

  /** Aborts (with a {@link LockLostError}) when the leadership is lost. */
  get signal(): AbortSignal {
    return this.lock.signal;
  }

  /** True until the leadership is resigned or known to be lost. */
  get isLeader(): boolean {
    return this.lock.held;
  }

  /** Publishes `value` in place of the current one, keeping the term (`LOCK.EXTEND key
   * token PX ttl OWNER value`); observers see the change. Rejects with
   * {@link LockNotHeldError} when the leadership was lost (nothing is published). */
  async proclaim(value: string): Promise<void> {
    checkValue(value);
    await this.lock.relabel(value);
    this.current = value;
  }

  /** A write guarded by the leadership: see {@link Lock.ifHeld}. */
  ifHeld(...args: Arg[]): Promise<unknown> {
    return this.lock.ifHeld(...args);
  }

  /** Gives the leadership up at once (LOCK.RELEASE): the server hands the lock to the
   * next candidate in the same step. True if it was still held. */
  async resign(): Promise<boolean> {
    try {
      await this.lock.release();
      return true;
    } catch (e) {
      if (e instanceof LockNotHeldError) return false;
      throw e;
    }
  }
}

/** A holder as LOCK.WATCH / LOCK.INFO show it: its fence and its label as sent. */
interface Seen {
  term: bigint | undefined;
  label: unknown;
}

/** The leader in a LOCK.WATCH summary or a LOCK.INFO reply: null when nobody holds the
 * key (nil, or a lock-delay running); the exclusive holder, else the first holder. */
function parseHolder(reply: unknown): Seen | null {
  if (reply === null || reply === undefined) return null;
  let fence: unknown;
  let label: unknown;
  let hasFence = false;
  let first: Seen | undefined;
  for (const [k, v] of pairs(reply)) {
    if (k === "state" && asString(v) !== "held") return null;
    if (k === "kind" && asString(v) === "string") throw new Error("redis-lock: the key holds a classic SET NX lock (a string), not an election");
    if (k === "fence") {
      fence = v;
      hasFence = true;
    } else if (k === "owner") label = v;
    else if (k === "holder-list" && Array.isArray(v) && v.length > 0) {
      let f: unknown;
      let l: unknown;
      for (const [hk, hv] of pairs(v[0])) {
        if (hk === "fence") f = hv;
        else if (hk === "owner") l = hv;
      }
      if (f !== undefined) first = { term: exactInt(f), label: l };
    }
  }
  if (hasFence && fence !== null && fence !== undefined) return { term: exactInt(fence), label };
  return first ?? null;
}

function sameSeen(a: Seen | null, b: Seen | null): boolean {
  if (a === null || b === null) return a === b;
  return a.term === b.term && asString(a.label) === asString(b.label);
}

function toLeader(s: Seen): Leader {
  if (s.term === undefined) throw new Error("redis-lock: this client returned a term above 2^53 inexactly (node-redis 4); use node-redis 5+ or ioredis");
  return { value: asString(s.label) ?? "", term: s.term };
}

/** What an {@link Observation} needs of its LockClient. */
interface ObserveHost {
  readonly networkTimeout: number;
  dedicated(): Promise<Dedicated>;
  where(): string;
  refresh(): Promise<void>;
}

const UNSEEN = Symbol("unseen");
const TRANSIENT = new Set(["TRYAGAIN", "LOCKMOVED", "UNBLOCKED", "LOADING", "MASTERDOWN", "CLUSTERDOWN", "BUSY", "MAXWAITERS", "MOVED", "ASK"]);

/** The changes of an election (see {@link LockClient.observe}): an async iterator whose
 * `return()` ends it at once, closing its connection. */
export class Observation implements AsyncIterableIterator<Leader | null> {
  private conn: Dedicated | undefined;
  private last: Seen | null | typeof UNSEEN = UNSEEN;
  private closed = false;
  private backoff = 50;
  private chain: Promise<unknown> = Promise.resolve();
  private readonly stopped: Promise<"closed">;
  private stop!: () => void;

  constructor(
    private readonly host: ObserveHost,
    private readonly key: string,
    private readonly block: number,
    signal?: AbortSignal,
    private readonly onClose: () => void = () => undefined,
  ) {
    this.stopped = new Promise((resolve) => (this.stop = () => resolve("closed")));
    if (signal) {
      if (signal.aborted) this.close();
      else signal.addEventListener("abort", () => this.close(), { once: true });
    }
  }

  [Symbol.asyncIterator](): Observation {
    return this;
  }

  /** The next state: who leads (`{ value, term }`) or null when nobody does. */
  next(): Promise<IteratorResult<Leader | null>> {
    const p = this.chain.then(() => this.step());
    this.chain = p.catch(() => undefined);
    return p;
  }

  /** Ends the observation at once (a pending `next()` resolves as done). */
  async return(): Promise<IteratorResult<Leader | null>> {
    this.close();
    return { done: true, value: undefined };
  }

  /** The same as `return()`. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.conn?.close();
    this.conn = undefined;
    this.stop();
    this.onClose();
  }

  /** True once ended (`return()`, `close()`, its signal, or an error it cannot get
   * past). */
  get isClosed(): boolean {
    return this.closed;
  }

  private args(): Arg[] {
    if (this.last === UNSEEN) return ["LOCK.INFO", this.key, "COUNT", "1"];
    if (this.last === null) return ["LOCK.WATCH", this.key, "BLOCK", String(this.block)];
    const term = this.last.term;
    if (term === undefined) throw new Error("redis-lock: cannot observe a term above 2^53 with node-redis 4 (no exact integers); use node-redis 5+ or ioredis");
    const args: Arg[] = ["LOCK.WATCH", this.key, "FENCE", term.toString()];
    const label = this.last.label;
    if ((typeof label === "string" && label.length > 0) || (Buffer.isBuffer(label) && label.length > 0)) args.push("OWNER", label as Arg);
    return [...args, "BLOCK", String(this.block)];
  }

  private drop(): void {
    this.conn?.close();
    this.conn = undefined;
  }

  private async pause(): Promise<void> {
    const ms = this.backoff;
    this.backoff = Math.min(1000, this.backoff * 2);
    let t: NodeJS.Timeout | undefined;
    await Promise.race([new Promise((r) => (t = setTimeout(r, ms))), this.stopped]);
    if (t) clearTimeout(t);
  }

  private done(): IteratorResult<Leader | null> {
    return { done: true, value: undefined };
  }

  private async step(): Promise<IteratorResult<Leader | null>> {
    for (;;) {
      if (this.closed) return this.done();
      const args = this.args();
      let reply: unknown;
      let started = Date.now();
      try {
        if (!this.conn) {
          const c = await Promise.race([this.host.dedicated(), this.stopped]);
          if (c === "closed") return this.done();
          if (this.closed) {
            c.close();
            return this.done();
          }
          this.conn = c;
        }
        started = Date.now();
        const r = await Promise.race([within(this.conn.send(args), this.block + this.host.networkTimeout), this.stopped]);
        if (r === "closed") return this.done();
        if (!r) {
          this.drop(); // no answer in time: a dead connection; read the state again
          continue;
        }
        if (!r.ok) throw r.error;
        reply = r.value;
      } catch (e) {
        if (this.closed) return this.done();
        this.drop();
        if (isUnknownLockCommand(e)) {
          this.close();
          throw new ModuleNotLoadedError(this.host.where());
        }
        const code = errorCode(e) ?? "";
        if (isServerReply(e) && !TRANSIENT.has(code)) {
          this.close();
          throw e;
        }
        if (code === "MOVED" || code === "ASK") await this.host.refresh();
        await this.pause();
        continue;
      }
      const seen = parseHolder(reply);
      if (this.last === UNSEEN || !sameSeen(seen, this.last)) {
        this.last = seen;
        this.backoff = 50;
        return { done: false, value: seen ? toLeader(seen) : null };
      }
      // Answered early with nothing new: do not spin.
      if (Date.now() - started < this.block / 2) await this.pause();
      else this.backoff = 50;
    }
  }
}

/** How many replicas a primary's ROLE reply lists: those online (a replica in its full
 * sync is left out). Not a primary: 0. A refused ROLE (undefined): undefined. */
function onlineInRole(reply: unknown): number | undefined {
  if (reply === undefined) return undefined;
  if (!Array.isArray(reply) || reply.length < 3 || asString(reply[0]) !== "master") return 0;
  return Array.isArray(reply[2]) ? reply[2].length : 0;
}

/** How many `slaveN:` lines of INFO replication say `state=online`. */
function onlineInInfo(reply: unknown): number | undefined {
  const text = asString(reply);
  if (text === undefined) return undefined;
  return text.split(/\r?\n/).filter((l) => /^slave\d+:/.test(l) && l.includes("state=online")).length;
}

function configValue(reply: unknown): number {
  const values = reply instanceof Map ? [...reply.values()] : Array.isArray(reply) ? reply.filter((_, i) => i % 2 === 1) : reply && typeof reply === "object" ? Object.values(reply) : [];
  const n = Number(asString(values[0]));
  return Number.isFinite(n) ? n : 0;
}

export default LockClient;

export { Redlock, RedlockGrant, drift } from "./redlock.js";
export type { RedlockOptions, RedlockAcquireOptions } from "./redlock.js";
