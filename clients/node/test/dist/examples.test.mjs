// Runs examples/node/daily-report.mjs as `make test-examples` does, against a server with
// the module, with the package and node-redis 5 (the example's pin) linked from this
// checkout: five cron runners started 0-2 s apart, the report must run once per period.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";

import { Server } from "../servers.mjs";

const PKG = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const EXAMPLES = path.resolve(PKG, "../../examples/node");

const server = await Server.start();
const dir = mkdtempSync(path.join(tmpdir(), "redis-lock-examples-"));
after(() => {
  server.close();
  rmSync(dir, { recursive: true, force: true });
});

test("daily-report.mjs: the report runs once per period across runners 0-2 s apart", () => {
  mkdirSync(path.join(dir, "node_modules"));
  symlinkSync(path.join(PKG, "node_modules/redis5"), path.join(dir, "node_modules/redis"));
  symlinkSync(PKG, path.join(dir, "node_modules/redis-lock-module"));
  for (const f of readdirSync(EXAMPLES).filter((f) => f.endsWith(".mjs"))) copyFileSync(path.join(EXAMPLES, f), path.join(dir, f));
  const r = spawnSync("node", ["daily-report.mjs"], {
    cwd: dir,
    env: { ...process.env, REDIS_URL: `redis://127.0.0.1:${server.port}` },
    encoding: "utf8",
    timeout: 120_000,
  });
  const out = r.stdout + r.stderr;
  assert.equal(r.status, 0, out);
  assert.match(out, /exactly one server ran the report/);
  assert.match(out, /all checks passed/);
});
