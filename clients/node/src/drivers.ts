// How the lock talks to each client library: node-redis 4/5/6 and ioredis 5/6, standalone
// and cluster. Every driver runs LOCK.* on the node that owns the key (no MOVED per call),
// returns integers exactly (as strings) wherever the library can, and opens dedicated
// connections for blocking acquires.

import { slotOf } from "./slot.js";

export type Arg = string | Buffer;

/** A connection of our own, for one blocking acquire. */
export interface Dedicated {
  /** Sends a command; the promise settles with its reply (no time limit of its own). */
  send(args: Arg[]): Promise<unknown>;
  /** Closes the connection at once. */
  close(): void;
}

export interface Driver {
  readonly kind: string;
  /** Prefix applied to lock names (ioredis `keyPrefix`), "" elsewhere. */
  readonly prefix: string;
  /** False only for node-redis 4, whose parser turns every integer into a double. */
  readonly exactIntegers: boolean;
  /** Runs one command on the node owning `key` (the full key, prefix included). */
  call(key: string, args: Arg[]): Promise<unknown>;
  /** Resolves once the connection that `call` uses for `key` is ready to send (never
   * queueing a command offline); rejects at `deadline` (Date.now() ms). */
  ready(key: string, deadline: number): Promise<void>;
  /** host:port of the node owning `key`, for messages (never a credential). */
  where(key: string): string;
  /** A connection of our own to the node owning `key`, connected within `limit` ms. */
  dedicated(key: string, limit: number): Promise<Dedicated>;
  close(): Promise<void>;
}

/** The connection could not be made, or was not ready, in time: nothing was sent.
 * `cause`: the last error the connection reported (e.g. a refused password), if any. */
export class LockConnectionError extends Error {
  constructor(message: string, cause?: unknown) {
    super(cause === undefined ? message : `${message} (last error: ${errorKind(cause)})`, cause === undefined ? undefined : { cause });
    this.name = "LockConnectionError";
  }
}

const REPLY_ERRORS = new Set(["ErrorReply", "ReplyError", "SimpleError", "BlobError"]);

/** An error's class, with the code of a server's error reply (`ReplyError WRONGPASS`);
 * never the reply's text, which may echo the command's arguments (a token). */
export function errorKind(e: unknown): string {
  const ctor = (e as { constructor?: { name?: string } })?.constructor?.name;
  const kind = (e as Error)?.name && (e as Error).name !== "Error" ? (e as Error).name : (ctor ?? typeof e);
  const code = typeof (e as Error)?.message === "string" ? (e as Error).message.split(" ", 1)[0] : "";
  if (ctor && REPLY_ERRORS.has(ctor) && /^[A-Z]+$/.test(code)) return `${kind} ${code}`;
  const cause = (e as { cause?: unknown })?.cause;
  return cause === undefined ? kind : `${kind} (${errorKind(cause)})`;
}

const pause = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Waits (polling every 10 ms) until `isReady()`, or rejects at `deadline`. */
async function until(isReady: () => boolean, deadline: number, what: () => string): Promise<void> {
  while (!isReady()) {
    if (Date.now() >= deadline) throw new LockConnectionError(`redis-lock: not connected to ${what()}`);
    await pause(Math.min(10, Math.max(1, deadline - Date.now())));
  }
}

/** Settles with `p`, or rejects with LockConnectionError after `ms` (and runs `onLate`). */
function bounded<T>(p: Promise<T>, ms: number, what: () => string, onLate: () => void): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const t = setTimeout(() => {
      onLate();
      reject(new LockConnectionError(`redis-lock: connecting to ${what()}: no answer within ${ms} ms`));
    }, Math.max(1, ms));
    p.then(
      (v) => {
        clearTimeout(t);
        resolve(v);
      },
      (e) => {
        clearTimeout(t);
        reject(e);
      },
    );
  });
}

/** host:port out of a redis:// URL, dropping any user and password. */
function hostOfUrl(url: unknown): string | undefined {
  if (typeof url !== "string") return undefined;
  try {
    const u = new URL(url);
    return `${u.hostname || "localhost"}:${u.port || "6379"}`;
  } catch {
    return undefined;
  }
}

// RESP type bytes of node-redis 5+'s typeMapping: ':' integers and '(' big numbers as
// strings, so a fence above 2^53 is not rounded to a double.
const EXACT_TYPE_MAPPING = { 58: String, 40: String };

/* eslint-disable @typescript-eslint/no-explicit-any */
type Any = any;

function isIoredis(c: Any): boolean {
  return typeof c?.isCluster === "boolean" && typeof c?.duplicate === "function" && typeof c?.call === "function";
}

function isNodeRedisCluster(c: Any): boolean {
  return typeof c?.nodeClient === "function" && typeof c?.sendCommand === "function";
}

function isNodeRedisClient(c: Any): boolean {
  return typeof c?.sendCommand === "function" && typeof c?.duplicate === "function";
}

export function driverFor(client: unknown): Driver {
  const c = client as Any;
  if (isIoredis(c)) return c.isCluster ? new IoredisClusterDriver(c) : new IoredisDriver(c);
  if (isNodeRedisCluster(c)) return new NodeRedisClusterDriver(c);
  if (isNodeRedisClient(c)) return new NodeRedisDriver(c);
  throw new TypeError("redis-lock-module: pass a node-redis client or cluster, or an ioredis Redis or Cluster");
}

// ---------------------------------------------------------------- node-redis

/** node-redis 5 and 6 have typeMapping (exact integers); 4 does not. */
function nodeRedisModern(c: Any): boolean {
  return typeof c?.withTypeMapping === "function";
}

function nodeRedisWhere(c: Any): string {
  const o = c?.options ?? {};
  const s = o.socket ?? {};
  if (typeof s.path === "string") return s.path;
  if (s.host !== undefined || s.port !== undefined) return `${s.host ?? "localhost"}:${s.port ?? 6379}`;
  return hostOfUrl(o.url) ?? "localhost:6379";
}

async function nodeRedisDedicated(base: Any, limit: number): Promise<Dedicated> {
  const socket = { ...(base.options?.socket ?? {}) };
  // An idle-socket limit would cut a long BLOCK short; a reconnect would send nothing
  // we want (the pending command fails instead); the connect has our limit.
  delete socket.socketTimeout;
  socket.connectTimeout = Math.max(1, Math.min(limit, socket.connectTimeout ?? limit));
  socket.reconnectStrategy = false;
  const dup = base.duplicate({ socket, disableOfflineQueue: true });
  dup.on("error", () => {}); // errors reach the pending command's promise
  const closeDup = () => {
    try {
      if (typeof dup.destroy === "function") dup.destroy();
      else void dup.disconnect().catch(() => {});
    } catch {
      /* already closed */
    }
  };
  await bounded(dup.connect(), limit, () => nodeRedisWhere(base), closeDup);
  const modern = nodeRedisModern(dup);
  return {
    send: (args) => dup.sendCommand(args, modern ? { typeMapping: EXACT_TYPE_MAPPING } : undefined),
    close: closeDup,
  };
}

/** What both node-redis drivers share: integers exact on node-redis 5+, no prefix. */
abstract class NodeRedisBase {
  readonly kind: string;
  readonly prefix = "";
  readonly exactIntegers: boolean;
  constructor(
    protected readonly c: Any,
    what: string,
  ) {
    this.exactIntegers = nodeRedisModern(c);
    this.kind = this.exactIntegers ? `node-redis${what}` : `node-redis 4${what}`;
  }
  /** The options of sendCommand that keep integers exact (none on node-redis 4). */
  protected get commandOptions(): Any {
    return this.exactIntegers ? { typeMapping: EXACT_TYPE_MAPPING } : undefined;
  }
  async close(): Promise<void> {}
}

class NodeRedisDriver extends NodeRedisBase implements Driver {
  constructor(c: Any) {
    super(c, "");
  }
  call(_key: string, args: Arg[]): Promise<unknown> {
    return this.c.sendCommand(args, this.commandOptions);
  }
  /** node-redis queues commands while it reconnects (its offline queue): a lock
   * command is sent only on a ready connection, so nothing is granted later to nobody. */
  ready(_key: string, deadline: number): Promise<void> {
    return until(() => this.c.isReady !== false, deadline, () => this.where());
  }
  where(): string {
    return nodeRedisWhere(this.c);
  }
  dedicated(_key: string, limit: number): Promise<Dedicated> {
    return nodeRedisDedicated(this.c, limit);
  }
}

class NodeRedisClusterDriver extends NodeRedisBase implements Driver {
  constructor(c: Any) {
    super(c, " cluster");
  }
  call(key: string, args: Arg[]): Promise<unknown> {
    // firstKey routes the command to the key's master (node-redis cannot find the key
    // of a module command by itself).
    return this.c.sendCommand(key, false, args, this.commandOptions);
  }
  private master(key: string): Any {
    return this.c.slots?.[slotOf(key)]?.master;
  }
  async ready(key: string, deadline: number): Promise<void> {
    await until(() => this.c.isReady !== false, deadline, () => this.where(key));
    const m = this.master(key);
    if (m?.client) await until(() => m.client.isReady !== false, deadline, () => this.where(key));
  }
  where(key: string): string {
    const m = this.master(key);
    return m ? `${m.host}:${m.port}` : "the cluster";
  }
  async dedicated(key: string, limit: number): Promise<Dedicated> {
    const master = this.master(key);
    if (!master) throw new Error(`redis-lock-module: no master known for slot ${slotOf(key)}`);
    return nodeRedisDedicated(await this.c.nodeClient(master), limit);
  }
}

// ---------------------------------------------------------------- ioredis

// Options for the connections we make from the user's: integers as strings, and no
// retry or resend on our dedicated connections (a resent BLOCK acquire would queue a
// second waiter); commandTimeout is ours to handle.
const IOREDIS_EXACT = { stringNumbers: true, lazyConnect: false, enableOfflineQueue: false };
const IOREDIS_DEDICATED = {
  ...IOREDIS_EXACT,
  commandTimeout: undefined,
  retryStrategy: () => null,
  maxRetriesPerRequest: 0,
  autoResendUnfulfilledCommands: false,
  enableOfflineQueue: true,
};

function ioredisPrefix(c: Any): string {
  return c.options?.keyPrefix ?? c.options?.redisOptions?.keyPrefix ?? "";
}

function ioredisWhere(c: Any): string {
  const o = c?.options ?? {};
  if (typeof o.path === "string") return o.path;
  return `${o.host ?? "localhost"}:${o.port ?? 6379}`;
}

/** Resolves once an ioredis connection (or cluster) is ready; rejects if it ends first
 * or `deadline` (Date.now() ms) passes. */
async function ioredisReady(conn: Any, deadline: number, where: () => string, lastError: () => unknown = () => undefined): Promise<void> {
  if (conn.status === "ready") return;
  if (conn.status === "end") throw new LockConnectionError(`redis-lock: the connection to ${where()} is closed`, lastError());
  await new Promise<void>((resolve, reject) => {
    const done = (e?: Error) => {
      clearTimeout(t);
      conn.off?.("ready", onReady);
      conn.off?.("end", onEnd);
      if (e) reject(e);
      else resolve();
    };
    const onReady = () => done();
    const onEnd = () => done(new LockConnectionError(`redis-lock: the connection to ${where()} is closed`, lastError()));
    const t = setTimeout(() => done(new LockConnectionError(`redis-lock: not connected to ${where()}`, lastError())), Math.max(1, deadline - Date.now()));
    conn.once("ready", onReady);
    conn.once("end", onEnd);
  });
}

async function ioredisDedicated(base: Any, limit: number): Promise<Dedicated> {
  const connectTimeout = Math.max(1, Math.min(limit, base.options?.connectTimeout ?? limit));
  const dup = base.duplicate({ ...IOREDIS_DEDICATED, keyPrefix: undefined, connectTimeout });
  dup.on("error", () => {});
  try {
    await ioredisReady(dup, Date.now() + limit, () => ioredisWhere(base));
  } catch (e) {
    dup.disconnect(false);
    throw e;
  }
  return {
    send: (args) => dup.call(...(args as [string, ...Arg[]])),
    close: () => dup.disconnect(false),
  };
}

/** What both ioredis drivers share: LOCK.* go through `exact`, a twin of the user's
 * connection with integers as strings (ioredis decides integer parsing per connection),
 * made on first use and closed when the user's client ends (after its `quit()`). It
 * never reconnects by itself (a lost twin is made again at the next command): a
 * reconnect timer would keep the process alive after the user closed a client whose
 * server had gone (ioredis emits no "end" for a client closed while reconnecting). */
abstract class IoredisBase {
  readonly prefix: string;
  readonly exactIntegers = true;
  private twin: Any;
  private ended = false;
  /** The twin's last error event (a refused password, ...), for LockConnectionError. */
  protected lastError: unknown;
  constructor(
    readonly kind: string,
    protected readonly c: Any,
    private readonly makeTwin: () => Any,
  ) {
    this.prefix = ioredisPrefix(c);
    c.once?.("end", () => {
      this.ended = true;
      this.twin?.disconnect(false);
    });
  }
  protected get exact(): Any {
    if (this.ended || this.c.status === "end") {
      throw new LockConnectionError(`redis-lock: the client is closed (${this.kind})`);
    }
    if (!this.twin || this.twin.status === "end") {
      this.twin = this.makeTwin();
      this.twin.on("error", (e: unknown) => (this.lastError = e));
      this.twin.on("ready", () => (this.lastError = undefined));
    }
    return this.twin;
  }
  async close(): Promise<void> {
    this.twin?.disconnect(false);
    this.twin = undefined;
  }
}

class IoredisDriver extends IoredisBase implements Driver {
  constructor(c: Any) {
    super("ioredis", c, () => c.duplicate({ ...IOREDIS_EXACT, retryStrategy: () => null }));
  }
  call(_key: string, args: Arg[]): Promise<unknown> {
    return this.exact.call(...(args as [string, ...Arg[]]));
  }
  ready(_key: string, deadline: number): Promise<void> {
    return ioredisReady(this.exact, deadline, () => this.where(), () => this.lastError);
  }
  where(): string {
    return ioredisWhere(this.c);
  }
  dedicated(_key: string, limit: number): Promise<Dedicated> {
    return ioredisDedicated(this.c, limit);
  }
}

function isRedirect(e: unknown): boolean {
  const m = (e as Error)?.message ?? "";
  return m.startsWith("MOVED ") || m.startsWith("ASK ");
}

class IoredisClusterDriver extends IoredisBase implements Driver {
  constructor(c: Any) {
    super("ioredis cluster", c, () =>
      c.duplicate(undefined, {
        redisOptions: { ...(c.options?.redisOptions ?? {}), ...IOREDIS_EXACT },
        clusterRetryStrategy: () => null,
      }),
    );
  }

  ready(key: string, deadline: number): Promise<void> {
    return ioredisReady(this.exact, deadline, () => this.where(key), () => this.lastError);
  }

  where(key: string): string {
    const slot = slotOf(key);
    let addr: string | undefined;
    try {
      addr = this.exact.slots?.[slot]?.[0];
    } catch {
      /* closed */
    }
    return addr ?? this.c.slots?.[slot]?.[0] ?? "the cluster";
  }

  /** ioredis Cluster finds keys in a built-in command table that has no LOCK.*: route
   * by the key's slot ourselves, to the master the cluster's slot map names. */
  private async nodeFor(key: string): Promise<Any> {
    await ioredisReady(this.exact, Date.now() + 10_000, () => this.where(key));
    const slot = slotOf(key);
    for (let attempt = 0; ; attempt++) {
      // A cluster can report "ready" before its slot map is complete: fall back to the
      // user's cluster's map, then refresh.
      const addr: string | undefined = this.exact.slots?.[slot]?.[0] ?? this.c.slots?.[slot]?.[0];
      const node = addr && this.exact.nodes("all").find((n: Any) => `${n.options.host}:${n.options.port}` === addr);
      if (node) return node;
      if (attempt >= 20) throw new Error(`redis-lock-module: no master known for slot ${slot}`);
      await this.refresh();
    }
  }

  private async refresh(): Promise<void> {
    await new Promise<void>((resolve) => {
      try {
        this.exact.refreshSlotsCache(() => resolve());
      } catch {
        resolve();
      }
    });
    await new Promise((r) => setTimeout(r, 50));
  }

  async call(key: string, args: Arg[]): Promise<unknown> {
    for (let attempt = 0; ; attempt++) {
      const node = await this.nodeFor(key);
      try {
        return await node.call(...(args as [string, ...Arg[]]));
      } catch (e) {
        if (attempt < 2 && isRedirect(e)) {
          await this.refresh();
          continue;
        }
        throw e;
      }
    }
  }

  async dedicated(key: string, limit: number): Promise<Dedicated> {
    return ioredisDedicated(await this.nodeFor(key), limit);
  }
}
