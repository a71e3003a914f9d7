// Runs every command of docs/quickstart-node.md: the server as `make run` starts it (its
// config file, redis.conf.example, from the repository root, on a free port), the install commands in a scratch dir beside a `target` that is the repository's
// (make dist-node there), and each JavaScript block against that server.

import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { after, test } from "node:test";
import { fileURLToPath } from "node:url";

import { freePort, raw, sleep } from "../servers.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../..");
const DOC = readFileSync(path.join(ROOT, "docs/quickstart-node.md"), "utf8");
const blocks = (lang) => [...DOC.matchAll(new RegExp("```" + lang + "\\n([\\s\\S]*?)```", "g"))].map((m) => m[1]);
const SERVER = process.env.LOCK_SERVER_BIN || "/usr/bin/redis-server";

const dir = mkdtempSync(path.join(tmpdir(), "redis-lock-quickstart-"));
const port = await freePort();
assert.equal(blocks("sh")[0].trim(), "make run");
assert.ok(readFileSync(path.join(ROOT, "Makefile"), "utf8").includes("exec $(RUN_SERVER) redis.conf.example --port $(PORT)"));
// From the repository root as make run (loadmodule ./target/...), without the AOF it
// would leave there.
const server = spawn(SERVER, ["redis.conf.example", "--port", String(port), "--appendonly", "no", "--save", ""], { cwd: ROOT, stdio: "ignore" });
after(() => {
  server.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});
for (let i = 0; ; i++) {
  try {
    if ((await raw(port, "PING")) === "PONG") break;
  } catch {
    /* not up yet */
  }
  assert.ok(i < 500, "the server of make run did not start");
  await sleep(20);
}

test("every command of the Node quick start", () => {
  // The install block runs in `dir`, whose Makefile and target are the repository's.
  symlinkSync(path.join(ROOT, "target"), path.join(dir, "target"));
  const install = blocks("sh")[1].replace(/^make /m, `make -C ${ROOT} --no-print-directory `);
  execFileSync("bash", ["-euo", "pipefail", "-c", install], { cwd: dir, stdio: "ignore", timeout: 300_000 });
  const [first, daily, session] = blocks("js");
  const project = path.join(dir, "lock-demo");
  writeFileSync(path.join(project, "quickstart.mjs"), first);
  writeFileSync(path.join(project, "daily.mjs"), daily);
  writeFileSync(path.join(project, "session.mjs"), session);
  const env = { ...process.env, REDIS_URL: `redis://127.0.0.1:${port}` };
  const out = execFileSync("node", ["quickstart.mjs"], { cwd: project, env, encoding: "utf8", timeout: 60_000 });
  assert.match(out, /^holding lock:report with fence \d+n?\nreleased\n$/);
  const runs = [0, 1].map(() => execFileSync("node", ["daily.mjs"], { cwd: project, env, encoding: "utf8", timeout: 60_000 }));
  assert.deepEqual(runs, ["this server runs the daily report\n", "another server ran it in this period\n"]);
  const both = execFileSync("node", ["session.mjs"], { cwd: project, env, encoding: "utf8", timeout: 60_000 });
  assert.equal(both, "holding both in one session: true\nreleased 2\n");
});

test("the module paths are those each install route gives", () => {
  // A build's target/release/libredis_lock.so (what redis.conf.example, make run's config,
  // loads), or the .deb's file as scripts/build-deb.sh installs it, with its snippet.
  const conf = readFileSync(path.join(ROOT, "redis.conf.example"), "utf8");
  const deb = readFileSync(path.join(ROOT, "scripts/build-deb.sh"), "utf8");
  const [built, packaged] = ["target/release/libredis_lock.so", "/usr/lib/redis/modules/redis-lock.so"];
  assert.ok(conf.includes(`loadmodule ./${built}`));
  assert.ok(deb.includes(`"$pkg${packaged}"`) && deb.includes(`loadmodule ${packaged}`));
  assert.ok(deb.includes('"$pkg/etc/redis/modules/redis-lock.conf"'));
  const named = DOC.match(/[\w./-]+\.so\b/g) ?? [];
  assert.ok(DOC.includes(built) && DOC.includes(packaged), String(named));
  for (const p of named) assert.ok(p === packaged || p.endsWith(built), `${p}: no install route gives it`);
  assert.ok(DOC.includes("include /etc/redis/modules/redis-lock.conf"));
});
