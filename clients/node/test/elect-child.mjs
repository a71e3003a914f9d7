// Run by election.test.mjs: a leader that campaigns with a 3 s lease, prints its term
// and stays leader until it is killed (SIGKILL: no resign, no more renewals).
import { createClient } from "redis";

import { LockClient } from "../dist/index.js";

const [port, key] = process.argv.slice(2);
const client = await createClient({ url: `redis://127.0.0.1:${port}` }).connect();
const locks = new LockClient(client);
const leadership = await locks.campaign(key, "doomed", { ttl: 3000 });
console.log(String(leadership.term));
setInterval(() => {}, 1000); // stay alive until killed
