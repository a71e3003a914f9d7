// Redlock: a lock held on a majority of N independent servers, with quorum fencing, the
// semantics of the Rust client (client/src/redlock.rs): every node at once within a node
// limit (a tenth of the TTL, 50 ms..1 s); a majority and a positive validity
// (ttl - elapsed - drift, drift = 1 % of the TTL + 2 ms); F = the highest fence, and every
// lower node renewed with MINFENCE F so that any later quorum fence exceeds F; otherwise
// release on every node and retry with jitter while the wait lasts; when fewer than a
// majority of the nodes answered at all (down, timed out, a wrong password), the last
// attempt rejects with QuorumUnavailableError instead of the null of a busy lock. Exclusive and shared
// locks only: a counted lock over a quorum would admit more than n holders. Nodes are
// independent servers: no replica confirmation, no auto-renewal (extend in time).

import { randomUUID } from "node:crypto";

import { LockClient, ModuleNotLoadedError, QuorumUnavailableError, SupportedClient } from "./index.js";

export interface RedlockOptions {
  /** Limit for one node's reply, in ms (default a tenth of the TTL, 50..1000). */
  nodeTimeout?: number;
  /** Pause between attempts while waiting: retryDelay ± retryJitter ms, random. */
  retryDelay?: number;
  retryJitter?: number;
}

export interface RedlockAcquireOptions {
  /** Lease in ms (required: a quorum lock's validity is computed from it). */
  ttl: number;
  /** Keep trying for this many ms (default: one attempt). */
  wait?: number;
  shared?: boolean;
  /** Refused: see {@link Redlock}. */
  limit?: number;
  owner?: string;
  token?: string;
}

const USAGE = /^(WRONGMODE|LIMITMISMATCH|WRONGTYPE)\b/;
const isUsage = (e: unknown) => e instanceof ModuleNotLoadedError || USAGE.test((e as Error)?.message ?? "");

/** Redlock's clock-drift allowance: 1 % of the TTL plus 2 ms. */
export const drift = (ttl: number) => ttl / 100 + 2;

/** A lock held on a majority: the quorum fence and until when it holds (Date.now() ms). */
export class RedlockGrant {
  constructor(
    private readonly rl: Redlock,
    readonly name: string,
    readonly token: string,
    readonly fence: bigint,
    public validUntil: number,
  ) {}

  /** ms the grant still holds (0 once over). */
  get validity(): number {
    return Math.max(0, this.validUntil - Date.now());
  }

  /** LOCK.EXTEND on every node: true when a majority confirmed within the new validity. */
  async extend(ttl: number): Promise<boolean> {
    const until = await this.rl.extendOn(this.name, this.token, ttl);
    if (until === undefined) return false;
    this.validUntil = until;
    return true;
  }

  /** LOCK.RELEASE on every node: true when a majority still held it. */
  async release(): Promise<boolean> {
    return (await this.rl.release(this.name, this.token)) >= this.rl.quorum;
  }
}

/** Redlock over independent servers: `new Redlock([clientA, clientB, clientC, ...])`. */
export class Redlock {
  private readonly nodes: LockClient[];
  private readonly opts: Required<Omit<RedlockOptions, "nodeTimeout">> & { nodeTimeout?: number };

  constructor(clients: SupportedClient[], options: RedlockOptions = {}) {
    if (clients.length === 0) throw new TypeError("Redlock needs at least one node");
    this.nodes = clients.map((c) => new LockClient(c, { confirm: false }));
    this.opts = { retryDelay: 150, retryJitter: 100, ...options };
  }

  get quorum(): number {
    return Math.floor(this.nodes.length / 2) + 1;
  }

  private limit(ttl: number): number {
    return this.opts.nodeTimeout ?? Math.min(1000, Math.max(50, ttl / 10));
  }

  private each(nodes: LockClient[], name: string, build: (k: string) => string[], limit: number): Promise<PromiseSettledResult<unknown>[]> {
    return Promise.allSettled(nodes.map((n) => n.command(name, build, Math.max(1, limit))));
  }

  /** LOCK.RELEASE on every node: how many released a lock held by `token`. */
  async release(name: string, token: string): Promise<number> {
    const r = await this.each(this.nodes, name, (k) => ["LOCK.RELEASE", k, token], this.opts.nodeTimeout ?? 250);
    return r.filter((x) => x.status === "fulfilled" && Number(x.value) === 1).length;
  }

  /** @internal */
  async extendOn(name: string, token: string, ttl: number): Promise<number | undefined> {
    const start = Date.now();
    const validUntil = start + ttl - drift(ttl);
    const r = await this.each(this.nodes, name, (k) => ["LOCK.EXTEND", k, token, "PX", String(Math.round(ttl))], Math.min(this.limit(ttl), validUntil - start));
    const held = r.filter((x) => x.status === "fulfilled" && Number(x.value) === 1).length;
    return held >= this.quorum && Date.now() < validUntil ? validUntil : undefined;
  }

  /** Takes `name` on a majority: a {@link RedlockGrant}, or null when no majority
   * granted within `wait` (the lock is held elsewhere). Rejects with
   * {@link QuorumUnavailableError} when fewer than a majority of the nodes answered at
   * all (in the last attempt). */
  async acquire(name: string, options: RedlockAcquireOptions): Promise<RedlockGrant | null> {
    const ttl = options.ttl;
    if (!(ttl >= 1)) throw new TypeError("ttl must be at least 1 ms");
    if (options.limit !== undefined) {
      const n = this.nodes.length;
      throw new TypeError(
        `Redlock cannot hold a counted lock (limit ${options.limit}): each node grants its own ${options.limit} permits and a holder needs only a majority of nodes, so up to ${Math.floor((options.limit * n) / this.quorum)} holders could hold it at once on these ${n} nodes; use a counted lock on one server`,
      );
    }
    const token = options.token ?? randomUUID();
    const waitEnd = options.wait === undefined ? undefined : Date.now() + options.wait;
    for (;;) {
      let unavailable: QuorumUnavailableError | undefined;
      let g: RedlockGrant | null = null;
      try {
        g = await this.attempt(name, token, ttl, options);
      } catch (e) {
        if (!(e instanceof QuorumUnavailableError)) throw e;
        unavailable = e;
      }
      if (g) return g;
      const pause = Math.max(0, this.opts.retryDelay + (Math.random() * 2 - 1) * this.opts.retryJitter);
      if (waitEnd === undefined || Date.now() + pause >= waitEnd) {
        if (unavailable) throw unavailable;
        return null;
      }
      await new Promise((r) => setTimeout(r, pause));
    }
  }

  private args(k: string, token: string, ttl: number, o: RedlockAcquireOptions): string[] {
    const a = ["LOCK.ACQUIRE", k];
    if (o.shared) a.push("SHARED");
    a.push("PX", String(Math.max(1, Math.round(ttl))), "TOKEN", token);
    if (o.owner !== undefined) a.push("OWNER", o.owner);
    return a;
  }

  private async attempt(name: string, token: string, ttl: number, o: RedlockAcquireOptions): Promise<RedlockGrant | null> {
    const start = Date.now();
    const validUntil = start + ttl - drift(ttl);
    const left = () => validUntil - Date.now();
    const results = await this.each(this.nodes, name, (k) => this.args(k, token, ttl, o), Math.min(this.limit(ttl), left()));
    const granted: { i: number; fence: bigint }[] = [];
    let usage: unknown;
    results.forEach((r, i) => {
      if (r.status === "fulfilled") {
        const v = r.value;
        if (Array.isArray(v) && v.length === 2 && String(v[0]) === token) {
          const f = v[1];
          // node-redis 4 gives doubles: above 2^53 no exact fence exists, so no quorum one.
          if (typeof f === "number" && !Number.isSafeInteger(f)) usage ??= new TypeError("redis-lock: Redlock needs exact fences (node-redis 5+ or ioredis)");
          else granted.push({ i, fence: BigInt(String(f)) });
        }
      } else if (usage === undefined && isUsage(r.reason)) usage = r.reason;
    });
    if (usage !== undefined) {
      await this.release(name, token);
      throw usage;
    }
    const failed = results.flatMap((r, i) => (r.status === "rejected" ? [{ where: this.nodes[i].whereOf(name), error: r.reason as unknown }] : []));
    if (results.length - failed.length < this.quorum) {
      await this.release(name, token);
      throw new QuorumUnavailableError(name, results.length - failed.length, this.quorum, failed, results.length);
    }
    if (granted.length < this.quorum || left() <= 0) {
      await this.release(name, token);
      return null;
    }
    const top = granted.reduce((m, g) => (g.fence > m ? g.fence : m), 0n);
    let confirmed = granted.filter((g) => g.fence === top).length;
    const lift = granted.filter((g) => g.fence < top).map((g) => this.nodes[g.i]);
    if (lift.length > 0) {
      const nodeLease = start + ttl - Date.now();
      if (nodeLease < 1 || left() <= 0) {
        await this.release(name, token);
        return null;
      }
      const r = await this.each(lift, name, (k) => [...this.args(k, token, nodeLease, o), "MINFENCE", top.toString()], Math.min(this.limit(ttl), left()));
      confirmed += r.filter((x) => x.status === "fulfilled" && Array.isArray(x.value)).length;
    }
    if (confirmed < this.quorum || left() <= 0) {
      await this.release(name, token);
      return null;
    }
    return new RedlockGrant(this, name, token, top, validUntil);
  }

  /** Closes the connections the nodes' LockClients opened. */
  async close(): Promise<void> {
    await Promise.all(this.nodes.map((n) => n.close()));
  }
}
