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
  dedicated(key: string): Promise<Dedicated>;
  close(): Promise<void>;
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

async function nodeRedisDedicated(base: Any): Promise<Dedicated> {
  const socket = { ...(base.options?.socket ?? {}) };
  // An idle-socket limit would cut a long BLOCK short.
  delete socket.socketTimeout;
  const dup = base.duplicate({ socket });
  dup.on("error", () => {}); // errors reach the pending command's promise
  await dup.connect();
  const modern = nodeRedisModern(dup);
  return {
    send: (args) => dup.sendCommand(args, modern ? { typeMapping: EXACT_TYPE_MAPPING } : undefined),
    close: () => {
      try {
        if (typeof dup.destroy === "function") dup.destroy();
        else void dup.disconnect().catch(() => {});
      } catch {
        /* already closed */
      }
    },
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
  dedicated(): Promise<Dedicated> {
    return nodeRedisDedicated(this.c);
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
  async dedicated(key: string): Promise<Dedicated> {
    const master = this.c.slots?.[slotOf(key)]?.master;
    if (!master) throw new Error(`redis-lock-module: no master known for slot ${slotOf(key)}`);
    return nodeRedisDedicated(await this.c.nodeClient(master));
  }
}

// ---------------------------------------------------------------- ioredis

// Options for the connections we make from the user's: integers as strings, and no
// retry or resend on our dedicated connections (a resent BLOCK acquire would queue a
// second waiter); commandTimeout is ours to handle.
const IOREDIS_EXACT = { stringNumbers: true, lazyConnect: false };
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

/** Resolves once an ioredis connection (or cluster) is ready; rejects if it ends first. */
async function ioredisReady(conn: Any, what: string): Promise<void> {
  if (conn.status === "ready") return;
  await new Promise<void>((resolve, reject) => {
    conn.once("ready", () => resolve());
    conn.once("end", () => reject(new Error(`redis-lock-module: ${what} closed`)));
  });
}

async function ioredisDedicated(base: Any): Promise<Dedicated> {
  const dup = base.duplicate({ ...IOREDIS_DEDICATED, keyPrefix: undefined });
  dup.on("error", () => {});
  await ioredisReady(dup, "dedicated connection");
  return {
    send: (args) => dup.call(...(args as [string, ...Arg[]])),
    close: () => dup.disconnect(false),
  };
}

/** What both ioredis drivers share: LOCK.* go through `exact`, a twin of the user's
 * connection with integers as strings (ioredis decides integer parsing per connection). */
abstract class IoredisBase {
  readonly prefix: string;
  readonly exactIntegers = true;
  constructor(
    readonly kind: string,
    protected readonly c: Any,
    protected readonly exact: Any,
  ) {
    this.prefix = ioredisPrefix(c);
    this.exact.on("error", () => {});
  }
  async close(): Promise<void> {
    this.exact.disconnect(false);
  }
}

class IoredisDriver extends IoredisBase implements Driver {
  constructor(c: Any) {
    super("ioredis", c, c.duplicate({ ...IOREDIS_EXACT }));
  }
  call(_key: string, args: Arg[]): Promise<unknown> {
    return this.exact.call(...(args as [string, ...Arg[]]));
  }
  dedicated(): Promise<Dedicated> {
    return ioredisDedicated(this.c);
  }
}

function isRedirect(e: unknown): boolean {
  const m = (e as Error)?.message ?? "";
  return m.startsWith("MOVED ") || m.startsWith("ASK ");
}

class IoredisClusterDriver extends IoredisBase implements Driver {
  constructor(c: Any) {
    super(
      "ioredis cluster",
      c,
      c.duplicate(undefined, {
        redisOptions: { ...(c.options?.redisOptions ?? {}), ...IOREDIS_EXACT },
      }),
    );
  }

  /** ioredis Cluster finds keys in a built-in command table that has no LOCK.*: route
   * by the key's slot ourselves, to the master the cluster's slot map names. */
  private async nodeFor(key: string): Promise<Any> {
    await ioredisReady(this.exact, "cluster connection");
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

  async dedicated(key: string): Promise<Dedicated> {
    return ioredisDedicated(await this.nodeFor(key));
  }
}
