// Throw-away servers with the module loaded, on free loopback ports; a raw RESP client
// (no library) to read what the server stores; the client libraries under test.
// LOCK_SERVER_BIN (default /usr/bin/redis-server) and LOCK_MODULE (default the repo's
// target/release/libredis_lock.so) choose what runs.

import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, before, describe } from "node:test";
import { fileURLToPath } from "node:url";

import * as redis4 from "redis4";
import * as redis5 from "redis5";
import * as redis6 from "redis";
import IORedis5 from "ioredis5";
import IORedis6 from "ioredis";

import { LockClient } from "../dist/index.js";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
export const SERVER_BIN = process.env.LOCK_SERVER_BIN || "/usr/bin/redis-server";
export const MODULE = process.env.LOCK_MODULE || path.join(ROOT, "target/release/libredis_lock.so");

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

// ---------------------------------------------------------------- raw RESP

function encode(args) {
  let out = `*${args.length}\r\n`;
  for (const a of args) {
    const s = String(a);
    out += `$${Buffer.byteLength(s)}\r\n${s}\r\n`;
  }
  return out;
}

/** Parses one reply from `buf` at `i`: [value, next] or undefined when incomplete.
 * Integers stay strings, so nothing is rounded. */
function parse(buf, i) {
  const end = buf.indexOf("\r\n", i);
  if (end < 0) return undefined;
  const type = String.fromCharCode(buf[i]);
  const line = buf.subarray(i + 1, end).toString();
  const next = end + 2;
  if (type === "+" || type === ":") return [type === ":" ? { int: line } : line, next];
  if (type === "-") return [new Error(line), next];
  if (type === "$") {
    const n = Number(line);
    if (n < 0) return [null, next];
    if (buf.length < next + n + 2) return undefined;
    return [buf.subarray(next, next + n).toString(), next + n + 2];
  }
  if (type === "*") {
    const n = Number(line);
    if (n < 0) return [null, next];
    const items = [];
    let j = next;
    for (let k = 0; k < n; k++) {
      const r = parse(buf, j);
      if (!r) return undefined;
      items.push(r[0]);
      j = r[1];
    }
    return [items, j];
  }
  throw new Error(`unexpected RESP type ${type}`);
}

/** One command over a plain socket; integers come back as { int: "digits" }. */
export function raw(port, ...args) {
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ port, host: "127.0.0.1" });
    let buf = Buffer.alloc(0);
    s.setTimeout(5000, () => {
      s.destroy();
      reject(new Error("raw: timeout"));
    });
    s.on("error", reject);
    s.on("data", (d) => {
      buf = Buffer.concat([buf, d]);
      const r = parse(buf, 0);
      if (r) {
        s.end();
        resolve(r[0]);
      }
    });
    s.write(encode(args));
  });
}

/** The fence LOCK.INFO reports, as a bigint made from the reply's digits. */
export async function rawFence(port, key) {
  const info = await raw(port, "LOCK.INFO", key);
  if (info === null) return undefined;
  for (let i = 0; i + 1 < info.length; i += 2) if (info[i] === "fence") return BigInt(info[i + 1].int);
  throw new Error("no fence in LOCK.INFO");
}

/** A socket that sends a BLOCK acquire and never reads the reply (what a client with a
 * short command timeout leaves behind). */
export function abandonedBlock(port, key, blockMs) {
  const s = net.createConnection({ port, host: "127.0.0.1" });
  s.on("error", () => {});
  s.write(encode(["LOCK.ACQUIRE", key, "PX", "30000", "TOKEN", "abandoned", "BLOCK", String(blockMs)]));
  return s;
}

export async function infoField(port, section, field) {
  const text = await raw(port, "INFO", section);
  const line = text.split("\r\n").find((l) => l.startsWith(field + ":"));
  return line ? line.slice(field.length + 1) : undefined;
}

// ---------------------------------------------------------------- servers

export class Server {
  static async start(extra = []) {
    if (!existsSync(MODULE)) throw new Error(`module not built: ${MODULE} (run make build)`);
    for (let attempt = 0; attempt < 5; attempt++) {
      const s = new Server();
      if (await s.#start(await freePort(), extra)) return s;
      s.close();
    }
    throw new Error("server did not start");
  }

  async #start(port, extra) {
    this.port = port;
    this.dir = mkdtempSync(path.join(tmpdir(), "redis-lock-node-"));
    this.proc = spawn(
      SERVER_BIN,
      ["--bind", "127.0.0.1", "--port", String(port), "--dir", this.dir, "--save", "", "--appendonly", "no",
        "--logfile", path.join(this.dir, "server.log"), "--loadmodule", MODULE, ...extra],
      { stdio: "ignore" },
    );
    let exited = false;
    this.proc.on("exit", () => (exited = true));
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline && !exited) {
      try {
        if ((await raw(port, "PING")) === "PONG") return true;
      } catch {
        /* not up yet */
      }
      await sleep(20);
    }
    return false;
  }

  get url() {
    return `redis://127.0.0.1:${this.port}`;
  }

  log() {
    try {
      return readFileSync(path.join(this.dir, "server.log"), "utf8").slice(-3000);
    } catch {
      return "";
    }
  }

  stop() {
    process.kill(this.proc.pid, "SIGSTOP");
  }

  cont() {
    process.kill(this.proc.pid, "SIGCONT");
  }

  close() {
    if (this.proc && this.proc.exitCode === null) {
      try {
        process.kill(this.proc.pid, "SIGCONT");
        this.proc.kill("SIGKILL");
      } catch {
        /* gone */
      }
    }
    if (this.dir) rmSync(this.dir, { recursive: true, force: true });
  }
}

export class Cluster {
  static async start(masters = 3) {
    const nodes = [];
    for (let i = 0; i < masters; i++) {
      nodes.push(await Server.start(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"]));
    }
    const c = new Cluster(nodes);
    try {
      const per = Math.floor(16384 / masters);
      for (let i = 0; i < masters; i++) {
        const hi = i === masters - 1 ? 16383 : (i + 1) * per - 1;
        await raw(nodes[i].port, "CLUSTER", "ADDSLOTSRANGE", i * per, hi);
      }
      for (const n of nodes.slice(1)) await raw(nodes[0].port, "CLUSTER", "MEET", "127.0.0.1", n.port);
      const deadline = Date.now() + 30_000;
      for (;;) {
        let ok = true;
        for (const n of nodes) {
          const info = await raw(n.port, "CLUSTER", "INFO");
          const slots = await raw(n.port, "CLUSTER", "SLOTS");
          if (!info.includes("cluster_state:ok") || slots.length !== masters) ok = false;
        }
        if (ok) break;
        if (Date.now() > deadline) throw new Error("cluster did not become ok");
        await sleep(50);
      }
    } catch (e) {
      c.close();
      throw e;
    }
    return c;
  }

  constructor(nodes) {
    this.nodes = nodes;
  }

  async nodeFor(key) {
    const slot = Number((await raw(this.nodes[0].port, "CLUSTER", "KEYSLOT", key)).int);
    const slots = await raw(this.nodes[0].port, "CLUSTER", "SLOTS");
    for (const [lo, hi, master] of slots) {
      if (Number(lo.int) <= slot && slot <= Number(hi.int)) return this.nodes.find((n) => n.port === Number(master[1].int));
    }
    throw new Error(`no node for ${key}`);
  }

  /** MOVED and ASK errors the nodes have answered so far (INFO errorstats). */
  async redirects() {
    let total = 0;
    for (const n of this.nodes) {
      for (const f of ["errorstat_MOVED", "errorstat_ASK"]) {
        const v = await infoField(n.port, "errorstats", f);
        if (v) total += Number(/count=(\d+)/.exec(v)[1]);
      }
    }
    return total;
  }

  close() {
    for (const n of this.nodes) n.close();
  }
}

// ---------------------------------------------------------------- the clients under test

async function nodeRedis(mod, url) {
  const c = mod.createClient({ url });
  c.on("error", () => {});
  await c.connect();
  return c;
}

async function nodeRedisCluster(mod, port) {
  const c = mod.createCluster({ rootNodes: [{ url: `redis://127.0.0.1:${port}` }] });
  c.on("error", () => {});
  await c.connect();
  return c;
}

async function closeNodeRedis(c) {
  if (typeof c.destroy === "function") c.destroy();
  else await c.disconnect();
}

async function ioredis(Ctor, port, options = {}) {
  const c = new Ctor(port, "127.0.0.1", options);
  c.on("error", () => {});
  await new Promise((r) => (c.status === "ready" ? r() : c.once("ready", r)));
  return c;
}

async function ioredisCluster(Ctor, port, options = {}) {
  const c = new Ctor.Cluster([{ host: "127.0.0.1", port }], options);
  c.on("error", () => {});
  await new Promise((r) => (c.status === "ready" ? r() : c.once("ready", r)));
  return c;
}

/** Every client library the package supports: name, connect(server, options), close. */
export const CLIENTS = [
  { name: "node-redis 4", connect: (s) => nodeRedis(redis4, s.url), cluster: (p) => nodeRedisCluster(redis4, p), close: closeNodeRedis },
  { name: "node-redis 5", connect: (s) => nodeRedis(redis5, s.url), cluster: (p) => nodeRedisCluster(redis5, p), close: closeNodeRedis },
  { name: "node-redis 6", connect: (s) => nodeRedis(redis6, s.url), cluster: (p) => nodeRedisCluster(redis6, p), close: closeNodeRedis },
  { name: "ioredis 5", connect: (s, o) => ioredis(IORedis5, s.port, o), cluster: (p, o) => ioredisCluster(IORedis5, p, o), close: (c) => c.disconnect(), ioredis: true },
  { name: "ioredis 6", connect: (s, o) => ioredis(IORedis6, s.port, o), cluster: (p, o) => ioredisCluster(IORedis6, p, o), close: (c) => c.disconnect(), ioredis: true },
];

/** A `describe` block per client library, named `title(lib)`, whose tests share a client
 * made by `connect(lib)` and a LockClient on it (both closed after the block): `body(lib,
 * ctx)` defines the tests, which find them as `ctx.client` and `ctx.locks`. */
function describeEach(title, connect, body) {
  for (const lib of CLIENTS) {
    describe(title(lib), () => {
      const ctx = {};
      before(async () => {
        ctx.client = await connect(lib);
        ctx.locks = new LockClient(ctx.client);
      });
      after(async () => {
        await ctx.locks.close();
        await lib.close(ctx.client);
      });
      body(lib, ctx);
    });
  }
}

/** `body(lib, ctx)` once per client library, with a client of `server` (see describeEach). */
export function describeEachClient(server, body) {
  describeEach((lib) => lib.name, (lib) => lib.connect(server), body);
}

/** `body(lib, ctx)` once per client library, with a cluster client that starts from the
 * node on `port` (see describeEach). */
export function describeEachClusterClient(port, body) {
  describeEach((lib) => `${lib.name} cluster`, (lib) => lib.cluster(port), body);
}

/** Runs `fn(locks, client)` with a LockClient (`options`) on `client`, a client of
 * library `lib`, then closes both. */
export async function withLocks(lib, client, options, fn) {
  const locks = new LockClient(client, options);
  try {
    return await fn(locks, client);
  } finally {
    await locks.close();
    await lib.close(client);
  }
}
