// Throw-away servers with the module loaded, on free loopback ports, from the repository's
// test kit (`redis-lock-testkit serve`, the launcher every suite uses); a raw RESP client
// (no library) to read what the server stores; the client libraries under test.
// LOCK_SERVER_BIN (default /usr/bin/redis-server), LOCK_MODULE (default the repo's
// target/release/libredis_lock.so) and LOCK_TESTKIT (default
// target/release/redis-lock-testkit) choose what runs.

import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import net from "node:net";
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
export const TESTKIT = process.env.LOCK_TESTKIT || path.join(ROOT, "target/release/redis-lock-testkit");

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

/** Several commands on one connection (WAIT counts the writes of its own connection):
 * their replies, in order. */
export function rawPipeline(port, ...commands) {
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
      const replies = [];
      for (let i = 0, r; replies.length < commands.length && (r = parse(buf, i)); i = r[1]) replies.push(r[0]);
      if (replies.length === commands.length) {
        s.end();
        resolve(replies);
      }
    });
    s.write(commands.map(encode).join(""));
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

/** One `redis-lock-testkit serve` run (the repository's test kit, `make testkit`): `topology`
 * is `["single"]`, `["servers", n]`, `["pair"]` or `["cluster", n]`; `extra` are server
 * options, `moduleArgs` go after the module. `members` are its servers; `close()` ends it,
 * and the kit then kills them and removes their directories (also if this process dies). */
export class Kit {
  static async start(topology, extra = [], moduleArgs = []) {
    for (const [what, file] of [["module", MODULE], ["test kit", TESTKIT]]) {
      if (!existsSync(file)) throw new Error(`${what} not built: ${file} (run make build testkit)`);
    }
    const argv = ["serve", "--server", SERVER_BIN, "--module", MODULE];
    for (const a of moduleArgs) argv.push("--module-arg", a);
    const kit = new Kit(spawn(TESTKIT, [...argv, ...topology.map(String), "--", ...extra], { stdio: ["pipe", "pipe", "inherit"] }));
    const first = await kit.#line();
    if (first === null) throw new Error(`the test kit could not start ${topology.join(" ")} (its stderr above)`);
    kit.members = JSON.parse(first).servers.map((m, i) => new Server(kit, i, m));
    return kit;
  }

  constructor(proc) {
    this.proc = proc;
    this.lines = [];
    this.waiting = [];
    let buf = "";
    const deliver = (line) => (this.waiting.length ? this.waiting.shift()(line) : this.lines.push(line));
    proc.stdout.on("data", (d) => {
      buf += d;
      for (let i; (i = buf.indexOf("\n")) >= 0; buf = buf.slice(i + 1)) deliver(buf.slice(0, i));
    });
    proc.on("exit", () => this.waiting.splice(0).forEach((w) => w(null)));
  }

  #line() {
    if (this.lines.length) return Promise.resolve(this.lines.shift());
    if (this.proc.exitCode !== null) return Promise.resolve(null);
    return new Promise((resolve) => this.waiting.push(resolve));
  }

  /** `stop`, `cont`, `kill` or `restart` of member `i`: the kit's reply ({ ok, pid }). */
  async send(op, i) {
    this.proc.stdin.write(`${op} ${i}\n`);
    const reply = JSON.parse((await this.#line()) ?? '{"error":"the test kit exited"}');
    if (reply.error) throw new Error(`test kit: ${op} ${i}: ${reply.error}`);
    return reply;
  }

  close() {
    if (this.proc.exitCode === null) this.proc.stdin.end();
  }
}

/** One server of a kit. `Server.start(extra)` is a standalone server of its own. stop() and
 * cont() (SIGSTOP, SIGCONT) act at once; close() ends its kit. */
export class Server {
  static async start(extra = [], moduleArgs = []) {
    return (await Kit.start(["single"], extra, moduleArgs)).members[0];
  }

  constructor(kit, index, { port, pid, dir }) {
    Object.assign(this, { kit, index, port, pid, dir });
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
    process.kill(this.pid, "SIGSTOP");
  }

  cont() {
    process.kill(this.pid, "SIGCONT");
  }

  /** SIGKILL, through the kit (the directory stays until close()). */
  async kill() {
    await this.kit.send("kill", this.index);
  }

  /** Starts it again: same port, directory and arguments. */
  async restart() {
    this.pid = (await this.kit.send("restart", this.index)).pid;
  }

  close() {
    this.kit.close();
  }
}

export class Cluster {
  /** Masters (three by default), no replicas, every slot served. */
  static async start(masters = 3) {
    const kit = await Kit.start(["cluster", masters]);
    return new Cluster(kit);
  }

  constructor(kit) {
    this.kit = kit;
    this.nodes = kit.members;
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
    this.kit.close();
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
