// What the package's tests need beyond the launcher in servers.mjs (used here only
// through its public API: Server.start(extra), .port, .stop(), .cont(), .close(), raw()):
// a lease read from LOCK.INFO, a primary with a replica, a server without the module,
// an abandoned waiter with a token of the length the server requires.

import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";

import { SERVER_BIN, Server, freePort, raw, rawPipeline, sleep } from "./servers.mjs";

/** The lease left (ms) as LOCK.INFO reports it; never PTTL (a module lock's lease runs
 * on the server's monotonic clock and its key may carry no Redis expiry). */
export async function leaseMs(port, key) {
  const info = await raw(port, "LOCK.INFO", key);
  if (info === null) return undefined;
  for (let i = 0; i + 1 < info.length; i += 2) if (info[i] === "ttl") return Number(info[i + 1].int);
  throw new Error("no ttl in LOCK.INFO");
}

/** Runs `fn()`: how long it took and what it threw, if anything. */
export async function timed(fn) {
  const t0 = Date.now();
  try {
    await fn();
    return { ms: Date.now() - t0, error: undefined };
  } catch (error) {
    return { ms: Date.now() - t0, error };
  }
}

export async function waitUntil(check, ms = 10_000, what = "condition") {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`${what}: not reached within ${ms} ms`);
    await sleep(20);
  }
}

function encode(args) {
  let out = `*${args.length}\r\n`;
  for (const a of args) out += `$${Buffer.byteLength(String(a))}\r\n${a}\r\n`;
  return out;
}

/** A socket that sends a BLOCK acquire and never reads the reply (what a client with a
 * short command timeout leaves behind). */
export function abandonedBlock(port, key, blockMs) {
  const s = net.createConnection({ port, host: "127.0.0.1" });
  s.on("error", () => {});
  s.write(encode(["LOCK.ACQUIRE", key, "PX", "30000", "TOKEN", "abandoned-token-01", "BLOCK", String(blockMs)]));
  return s;
}

/** A primary and one replica, both with the module. By default the link is up and the
 * replica online (the primary starts a full sync at once: repl-diskless-sync-delay 0).
 * With `{ syncing: true }` the replica is held in its first full sync (the primary waits
 * an hour before the transfer; state `wait_bgsave`) until `finishSync()`. */
export class Pair {
  static async start({ syncing = false } = {}) {
    const primary = await Server.start(["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", syncing ? "3600" : "0"]);
    let replica;
    try {
      replica = await Server.start(["--replicaof", "127.0.0.1", String(primary.port)]);
    } catch (e) {
      primary.close();
      throw e;
    }
    const p = new Pair(primary, replica);
    try {
      if (syncing) await waitUntil(async () => (await p.replicaState()) === "wait_bgsave", 20_000, "a full sync");
      else await waitUntil(() => p.linkUp(), 20_000, "replication link");
    } catch (e) {
      p.close();
      throw e;
    }
    return p;
  }

  constructor(primary, replica) {
    this.primary = primary;
    this.replica = replica;
  }

  /** The replica's `state` in the primary's INFO replication (undefined: not listed). */
  async replicaState() {
    const info = await raw(this.primary.port, "INFO", "replication");
    return /^slave0:.*\bstate=([a-z_]+)/m.exec(info)?.[1];
  }

  /** The replica online and acknowledging: a write is confirmed (after a diskless sync
   * a primary sends the replica nothing more until its first acknowledgement). */
  async linkUp() {
    const r = await raw(this.replica.port, "INFO", "replication");
    if (!r.includes("master_link_status:up") || (await this.replicaState()) !== "online") return false;
    return Number((await rawPipeline(this.primary.port, ["SET", "pair:probe", "1"], ["WAIT", "1", "100"]))[1].int) === 1;
  }

  /** Lets the held full sync run, and waits until the replica is online. */
  async finishSync() {
    await raw(this.primary.port, "CONFIG", "SET", "repl-diskless-sync-delay", "0");
    await waitUntil(() => this.linkUp(), 20_000, "the end of the full sync");
  }

  async promote() {
    await raw(this.replica.port, "REPLICAOF", "NO", "ONE");
  }

  close() {
    this.replica.close();
    this.primary.close();
  }
}

/** The server binary without the module (what a user meets before loading it). */
export class PlainServer {
  static async start() {
    const s = new PlainServer();
    s.port = await freePort();
    s.dir = mkdtempSync(path.join(tmpdir(), "redis-lock-node-plain-"));
    s.proc = spawn(SERVER_BIN, ["--bind", "127.0.0.1", "--port", String(s.port), "--dir", s.dir, "--save", "", "--appendonly", "no"], { stdio: "ignore" });
    const deadline = Date.now() + 10_000;
    for (;;) {
      try {
        if ((await raw(s.port, "PING")) === "PONG") return s;
      } catch {
        /* not up yet */
      }
      if (Date.now() > deadline) {
        s.close();
        throw new Error("plain server did not start");
      }
      await sleep(20);
    }
  }

  get url() {
    return `redis://127.0.0.1:${this.port}`;
  }

  close() {
    try {
      this.proc.kill("SIGKILL");
    } catch {
      /* gone */
    }
    rmSync(this.dir, { recursive: true, force: true });
  }
}
