// Installs the npm tarball of `make dist-node` (in REDIS_LOCK_DIST) into a fresh npm
// project, with node-redis, ioredis and TypeScript from the registry, and uses it
// against a server with the module: ESM import, CommonJS require, and tsc on both. And
// the package's directory (as examples/node links it): no install script runs, none is
// warned about (npm 11 warns about a `prepare` script).
// Run by `make test-node`: REDIS_LOCK_DIST=target/dist node --test test/dist/dist.test.mjs

import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Server } from "../servers.mjs";

const DIST = process.env.REDIS_LOCK_DIST;
assert.ok(DIST, "REDIS_LOCK_DIST: the directory with the tarball");
const tarballs = readdirSync(DIST).filter((f) => /^redis-lock-module-.*\.tgz$/.test(f));
assert.equal(tarballs.length, 1, `one tarball in ${DIST}: ${tarballs}`);
const tarball = path.join(DIST, tarballs[0]);

const server = await Server.start();
const dir = mkdtempSync(path.join(tmpdir(), "redis-lock-npm-"));
after(() => {
  server.close();
  rmSync(dir, { recursive: true, force: true });
});

const run = (cmd, args) => execFileSync(cmd, args, { cwd: dir, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"], timeout: 300_000 });

test("the tarball's contents and package.json", () => {
  const list = execFileSync("tar", ["tzf", tarball], { encoding: "utf8" });
  for (const f of ["package/LICENSE", "package/README.md", "package/dist/index.js", "package/dist/index.d.ts", "package/dist/cjs/index.js", "package/dist/cjs/index.d.ts", "package/dist/cjs/package.json"]) {
    assert.ok(list.includes(f + "\n"), `${f} in the tarball`);
  }
  const pkg = JSON.parse(execFileSync("tar", ["xzOf", tarball, "package/package.json"], { encoding: "utf8" }));
  assert.equal(pkg.license, "MIT");
  // No repository or homepage until the project has a public home (none is made up).
  assert.ok(!pkg.repository && !pkg.homepage && pkg.keywords?.length >= 3);
  assert.equal(pkg.exports["."].require.default, "./dist/cjs/index.js");
  assert.equal(pkg.exports["."].import.default, "./dist/index.js");
});

test("installs into a fresh npm project and locks (ESM, CommonJS, tsc)", () => {
  writeFileSync(path.join(dir, "package.json"), JSON.stringify({ name: "dist-check", private: true, version: "1.0.0" }));
  run("npm", ["install", "--no-audit", "--no-fund", "--loglevel=error", tarball, "redis@6.3.1", "ioredis@6.0.0", "typescript@5.9.3", "@types/node@20.9.5"]);
  writeFileSync(
    path.join(dir, "esm.mjs"),
    `import { createClient } from "redis";
import { LockClient } from "redis-lock-module";
const client = await createClient({ url: "redis://127.0.0.1:${server.port}" }).connect();
const locks = new LockClient(client);
const fence = await locks.using("dist:esm", { ttl: 5000, wait: 1000 }, async (signal, lock) => lock.fence);
console.log("esm", typeof fence);
await client.quit();
`,
  );
  writeFileSync(
    path.join(dir, "cjs.cjs"),
    `const { Redis } = require("ioredis");
const { LockClient } = require("redis-lock-module");
(async () => {
  const r = new Redis(${server.port}, "127.0.0.1");
  const locks = new LockClient(r);
  const lock = await locks.acquire("dist:cjs", { ttl: 5000 });
  await lock.release();
  console.log("cjs", typeof lock.fence);
  await r.quit();
})();
`,
  );
  assert.equal(run("node", ["esm.mjs"]).trim(), "esm bigint");
  assert.equal(run("node", ["cjs.cjs"]).trim(), "cjs bigint");
  writeFileSync(
    path.join(dir, "use.cts"),
    `import lockModule = require("redis-lock-module");
import redis = require("redis");
export async function f(): Promise<bigint | undefined> {
  const locks = new lockModule.LockClient(await redis.createClient().connect());
  return (await locks.acquire("k", { ttl: 1000 }))?.fence;
}
`,
  );
  writeFileSync(
    path.join(dir, "use.mts"),
    `import { LockClient } from "redis-lock-module";
import { Redis } from "ioredis";
export async function f(): Promise<bigint | undefined> {
  return (await new LockClient(new Redis()).acquire("k", { ttl: 1000 }))?.fence;
}
`,
  );
  run("npx", ["tsc", "--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext", "--skipLibCheck", "--types", "node", "use.cts", "use.mts"]);
});

test("installing from the package's directory runs no install script, and npm warns of none", () => {
  const pkgDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
  const scripts = JSON.parse(readFileSync(path.join(pkgDir, "package.json"), "utf8")).scripts ?? {};
  for (const s of ["preinstall", "install", "postinstall", "prepare"]) assert.equal(scripts[s], undefined, `${s} script`);
  const project = mkdtempSync(path.join(tmpdir(), "redis-lock-npm-dir-"));
  try {
    writeFileSync(path.join(project, "package.json"), JSON.stringify({ name: "dir-check", private: true, version: "1.0.0" }));
    const r = spawnSync("npm", ["install", "--no-audit", "--no-fund", pkgDir], { cwd: project, encoding: "utf8", timeout: 300_000 });
    assert.equal(r.status, 0, r.stdout + r.stderr);
    assert.doesNotMatch(r.stdout + r.stderr, /install-scripts|prepare/, r.stdout + r.stderr);
  } finally {
    rmSync(project, { recursive: true, force: true });
  }
});
