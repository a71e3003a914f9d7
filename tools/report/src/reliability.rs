//! docs/RELIABILITY.md, rendered from docs/data/reliability.json, which
//! `make reliability` writes. Every scenario reports one [`Outcome`].

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// The store side of fencing, printed in the stale-holder section.
pub const FENCED_STORE_LUA: &str = include_str!("../../../scripts/reliability/fenced_store.lua");

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    Pass,
    Fail(String),
    NotRun(String),
}

/// What one scenario measured: a row of the table and the lines of its section.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Outcome {
    pub id: u32,
    pub key: String,
    pub title: String,
    pub target: String,
    pub figure: String,
    pub trials: String,
    pub status: Status,
    pub notes: Vec<String>,
    pub secs: f64,
    /// The server of this row, for a scenario that runs on every server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerId>,
    /// A row measured by a later run of some scenarios only (`--only`, merged into the
    /// file): that run's date, seed and module commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RowRun>,
}

/// `Redis 8.2.3` and the binary it ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerId {
    pub label: String,
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowRun {
    pub date: String,
    pub time: String,
    pub short: bool,
    pub scale: f64,
    pub seed: u64,
    pub commit: String,
    pub dirty: bool,
    /// The scenarios that run measured (`--only`).
    pub only: Vec<String>,
}

impl Outcome {
    pub fn new(id: u32, key: &str, title: &str, target: &str) -> Outcome {
        Outcome {
            id,
            key: key.to_string(),
            title: title.to_string(),
            target: target.to_string(),
            figure: String::new(),
            trials: String::new(),
            status: Status::Pass,
            notes: Vec::new(),
            secs: 0.0,
            server: None,
            run: None,
        }
    }

    /// The title, with the server when the row names one.
    pub fn full_title(&self) -> String {
        match &self.server {
            Some(s) => format!("{}, {}", self.title, s.label),
            None => self.title.clone(),
        }
    }

    /// Marks a missed target (keeps the first reason, adds the others to the notes).
    pub fn fail(&mut self, why: impl Into<String>) {
        let why = why.into();
        match &self.status {
            Status::Pass => self.status = Status::Fail(why),
            _ => self.notes.push(format!("Also failed: {why}")),
        }
    }

    pub fn note(&mut self, line: impl Into<String>) {
        self.notes.push(line.into());
    }
}

/// docs/data/reliability.json: one `make reliability` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReliabilityRun {
    pub date: String,
    pub time: String,
    pub short: bool,
    pub scale: f64,
    pub seed: u64,
    pub minutes: f64,
    pub server_path: String,
    /// `Redis server v=7.0.15`
    pub server_version: String,
    pub commit: String,
    pub dirty: bool,
    pub cpus: usize,
    pub kernel: String,
    pub fs: String,
    pub outcomes: Vec<Outcome>,
}

impl ReliabilityRun {
    /// Puts `rows`, measured by a later run of the scenarios `run.only`, in place of the
    /// rows of those scenarios; the other rows stay as measured. `order` gives a
    /// scenario's place in the report; rows are numbered again.
    pub fn merge(&mut self, rows: Vec<Outcome>, run: RowRun, order: impl Fn(&str) -> usize) {
        self.outcomes.retain(|o| !run.only.contains(&o.key));
        self.outcomes.extend(rows.into_iter().map(|mut o| {
            o.run = Some(run.clone());
            o
        }));
        // Stable: rows of one scenario keep their order (one per server).
        self.outcomes.sort_by_key(|o| order(&o.key));
        for (i, o) in self.outcomes.iter_mut().enumerate() {
            o.id = i as u32 + 1;
        }
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A real session (lock server on 6379 with the module, data on a plain 6380).
const EXAMPLE: &str = r#"```
$ redis-cli -p 6379 LOCK.ACQUIRE job:42 PX 10000
1) "93a591c9-a204-4fe2-b764-e0fed09691fd"
2) (integer) 1883237940281212928
$ redis-cli -p 6380 EVAL "$(cat scripts/reliability/fenced_store.lua)" 1 report:42 1883237940281212928 "new data"
(integer) 1
$ redis-cli -p 6380 EVAL "$(cat scripts/reliability/fenced_store.lua)" 1 report:42 1883237940281212927 "stale data"
(integer) 0
$ redis-cli -p 6380 HGETALL report:42
1) "value"
2) "new data"
3) "fence"
4) "1883237940281212928"
```
"#;

pub fn reproduce(run: &ReliabilityRun, o: &Outcome) -> String {
    let (short, scale) = o
        .run
        .as_ref()
        .map_or((run.short, run.scale), |r| (r.short, r.scale));
    let key = &o.key;
    if short {
        format!("`make reliability-short` (or `target/release/redis-lock-reliability run --short --only {key}`)")
    } else {
        format!("`make reliability ONLY={key} SCALE={scale}`")
    }
}

/// How a scenario that runs on every server is run and checked (rendered once above
/// its rows' sections).
pub fn method(key: &str) -> Option<&'static str> {
    match key {
        "chaos" => Some(CHAOS_METHOD),
        "kinds" => Some(KINDS_METHOD),
        _ => None,
    }
}

const CHAOS_METHOD: &str = "\
**Method.** Each server gets three sub-runs, each with servers of its own and its own checker: a standalone server, \
a primary with one replica, and a cluster of three masters (no replicas), 45 s each in the full run and 6 s in the \
short run. In each, 24 client threads run the fenced workload on 10 keys of db 0 (6 exclusive, 2 SHARED, 2 LIMIT with \
2 and 3 permits): a random key per acquire; 56% of the acquires block (`BLOCK` 5-300 ms); 12% take a short lease \
(20-100 ms) and a tenth of those are left to expire, the others hold 5 s and release; a fifth of the critical \
sections last 1-20 ms, the others are a read and a write; 15% extend once inside the critical section; a SHARED key is read (`SHARED`) 70% of the time and written (exclusive) otherwise; every acquire \
carries its own `TOKEN`. The clients follow the topology as a cluster- or failover-aware client does: `MOVED` updates \
the slot table, `ASK` sends `ASKING` and the command to the target, `TRYAGAIN` is retried after 5 ms (a waiter whose \
slot moved is retried where the cluster then sends it), and `READONLY` or `UNBLOCKED` from a server that became a \
replica sends the client to whichever server answers `ROLE` with `master`. A server that turns into a replica answers \
its blocked clients `UNBLOCKED` and then closes their connections (Redis and Valkey alike, with `BLPOP` too): the \
clients reconnect, and those closes do not count as broken connections.\n\n\
Meanwhile one thread applies server operations, one at a time, drawn at random by weight, with a random 30-200 ms \
(standalone), 50-300 ms (pair) or 20-150 ms (cluster) between them:\n\n\
| sub-run | operations (weight) |\n\
|---|---|\n\
| standalone | `CLIENT PAUSE <20-300 ms> WRITE` (12), `CLIENT PAUSE <20-200 ms> ALL` (8), `DEBUG RELOAD` (6), `BGREWRITEAOF` (6), one `CONFIG SET` of `lock.max-ttl` (10 s, 60 s, 1 h or 24 h), `lock.default-ttl` (1 s .. min(max-ttl, 60 s)) and `lock.max-waiters` (10000, or one of 1, 2, 4, 16, 100 one time in five) (10), `SWAPDB 1 2` (10), `CLIENT UNBLOCK <waiter> TIMEOUT` or `ERROR` (12), `CLIENT KILL` of a waiter (10) and of a holder found with `LOCK.INFO` (8) |\n\
| primary + replica | `FAILOVER TIMEOUT 5000` to the replica, and back the next time (10; it waits until the new replica is synced), `CLIENT PAUSE` WRITE (8) and ALL (4), `CONFIG SET` (4), `CLIENT UNBLOCK` (6), `CLIENT KILL` of waiters (8) and holders (8), `BGREWRITEAOF` (3), all on the current primary |\n\
| 3-master cluster | slot migration (30): the slot of a checker key (of a held one if one of four random picks is held) moves from its node to one of the two others: `CLUSTER SETSLOT IMPORTING` on the target, `MIGRATING` on the source, `MIGRATE` of every key in the slot, 0-60 ms, `SETSLOT NODE` on the target, the source and the third master; keys go back and forth as later migrations pick them again. `CLIENT PAUSE WRITE` (6), `CONFIG SET` (3), `CLIENT UNBLOCK` (4), `CLIENT KILL` of waiters (6) and holders (6), on a random node |\n\n\
`SWAPDB` legitimately moves every lock of one db to the other, so the checker's keys stay in db 0 and the swap is \
between dbs 1 and 2, where four bystander clients (two per db) keep taking 3 locks with blocking acquires (`BLOCK` \
20-300 ms, leases 30-300 ms): their waiters are held to the same answer-time rule and their fences join the \
server's fence-order check; mutual exclusion is checked on db 0 only. `CLIENT UNBLOCK` is sent only when no pause of \
ours can be holding a client: a client held by a pause is listed as blocked in `LOCK.ACQUIRE` too but is no waiter, \
and Redis 7.0.15 crashes when such a client is unblocked with `TIMEOUT` (`Guru Meditation: Unknown btype in \
replyToBlockedClientTimedOut()`, blocked.c:230, with a plain `SET` too, no module needed) and answers it twice with \
`ERROR`; Redis 8.2 and Valkey refuse.\n\n\
**Checked**, on every recorded call (invoke and completion times on one monotonic clock): per server and key, in fence \
order, no grant while earlier holders certainly live leave no room for it (an exclusive grant or a writer beside any \
holder, a reader beside a writer, a permit beside n others): a double grant; across cluster nodes, the same on the \
intervals in which holders were certainly live; per server, fences unique and never below a fence already returned \
(the primary and replica count as one server: fences continue across `FAILOVER`; each cluster node is its own); \
releases and extends answer 1 exactly while the lease is live (a call whose connection was killed has an unknown \
outcome and only widens the bounds); the in-process fenced store saw no overlapping critical sections, no write with a \
fence below the highest accepted and no lost update. In the cluster a key's fences are not ordered across nodes: a \
key whose slot moves while it is free starts from the new node's counter, which may be lower, and the store then \
refuses the new holder; those refusals are counted in the row's notes, not as violations (no two holders overlap).\n\n\
Every blocking call, each retry on its own, must be answered within its `BLOCK` time plus 1 s. A command that arrives \
while a pause of ours holds writes (`CLIENT PAUSE`, or a `FAILOVER` waiting for its replica) only starts when the \
server lets it go, so that time does not count against its `BLOCK` time; the servers let held commands go up to \
100 ms after a pause's nominal end (their cron tick, measured on all three), so a `CLIENT PAUSE` of n ms counts as \
n + 110 ms. A waiter already queued when a pause begins gets no allowance: its deadline is not a write. A waiter \
whose connection `CLIENT KILL` closed before its deadline is excused (kills are recorded before they are sent); any \
call unanswered for 8 s is a hang; a connection that breaks without a kill fails the row. After each sub-run every \
server must answer `PING`, show `lock_panics:0` and have no crash report in its log. On Redis before 7.4 `CLIENT \
UNBLOCK` of a `LOCK.ACQUIRE` waiter must be refused (by design, see docs/commands.md).\n";

const KINDS_METHOD: &str = "\
**Method.** A primary and one replica per server, 90 s in the full run and 10 s in the short run; 24 client threads \
run the fenced workload (the same code as the chaos rows) on 10 keys: 2 exclusive, 4 SHARED (read 70% of the time, \
written otherwise), and LIMIT 2, 2, 3 and 5. Every grant and every extend is sent with `WAIT 1 100` in the same \
pipeline: a grant the replica did not confirm is given back and never used, an extend it did not confirm counts as \
unknown, because the next fault may promote that replica. Every 0.8-2 s one fault, drawn at random: the primary is \
SIGKILLed, its synced replica promoted with `REPLICAOF NO ONE` and the killed server restarted as the new primary's \
replica (35%); a coordinated `FAILOVER TIMEOUT 5000` (25%); `CLIENT KILL` of a random holder of a random key (40%). \
Clients follow the primary as in the chaos rows; waiters are held to the same answer-time rule.\n\n\
**Checked:** no writer (or exclusive holder) granted while another holder was certainly live, no reader while a \
writer was, never more than n holders of a LIMIT n key at once (per server in fence order; the pair is one server); \
fences unique and rising with real time across kills and promotions; releases and extends answer 1 exactly while the \
lease is live. The fenced store: a writer (or exclusive holder) reads, then writes value + 1, and is refused when any \
holder with a higher fence came before it; a reader is refused when a writer with a higher fence came before it; a \
critical section that begins beside holders its key's kind forbids (or beside n permit holders) is an overlap. A \
LIMIT key's holders share it, so a newer fence there does not prove an older holder lost its permit: the store only \
counts them, and the checker's lease bounds judge them. Critical sections that outran their own lease (the client was \
delayed, not the lock) explain the store anomalies they cause and are counted apart.\n";

fn ids(group: &[&Outcome]) -> String {
    match group {
        [] => String::new(),
        [o] => o.id.to_string(),
        [a, .., b] => format!("{}-{}", a.id, b.id),
    }
}

/// docs/RELIABILITY.md.
pub fn render(run: &ReliabilityRun) -> String {
    let outcomes = &run.outcomes;
    let (date, time) = (&run.date, &run.time);
    let passed = outcomes.iter().filter(|o| o.status == Status::Pass).count();

    let mut s = String::new();
    let _ = writeln!(s, "# Reliability under faults\n");
    let _ = writeln!(
        s,
        "Generated by `make reliability` ({}) on {date} {time} UTC; do not edit by hand. \
         Scale {}, seed {}, {passed} of {} properties met, run time {:.1} min.\n",
        if run.short { "short run" } else { "full run" },
        run.scale,
        run.seed,
        outcomes.len(),
        run.minutes
    );
    let _ = writeln!(
        s,
        "Server: `{}` ({}){}. Module: commit {}{}, `target/release/libredis_lock.so`. Machine: {} cores, Linux {}, \
         server data on {}. Every figure comes from real server processes with the module loaded, driven by \
         `tools/reliability` (crate `redis-lock-reliability`); the faults are real: SIGKILL, SIGSTOP, nft packet drops \
         in a network namespace of the run's own, a shifted wall clock, malformed input, valgrind, and the server's own \
         operations (pauses, FAILOVER, slot migration, reloads).\n",
        run.server_path,
        run.server_version,
        if outcomes.iter().any(|o| o.server.is_some()) {
            "; rows that name a server ran on that server"
        } else {
            ""
        },
        if run.commit.is_empty() { "unknown" } else { &run.commit },
        if run.dirty { " with uncommitted changes in src/" } else { "" },
        run.cpus,
        run.kernel,
        run.fs
    );
    let mut later: Vec<(&RowRun, Vec<&Outcome>)> = Vec::new();
    for o in outcomes {
        if let Some(r) = &o.run {
            match later.iter_mut().find(|(x, _)| *x == r) {
                Some((_, v)) => v.push(o),
                None => later.push((r, vec![o])),
            }
        }
    }
    for (r, rows) in &later {
        let servers: Vec<String> = rows
            .iter()
            .filter_map(|o| {
                o.server
                    .as_ref()
                    .map(|s| format!("{} (`{}`)", s.label, s.path))
            })
            .fold(Vec::new(), |mut v, x| {
                if !v.contains(&x) {
                    v.push(x);
                }
                v
            });
        let _ = writeln!(
            s,
            "Rows {} come from a later run of those scenarios only ({}, `--only {}`) on {} {} UTC: scale {}, seed {}, \
             module commit {}{}{}; the other rows were not rerun.\n",
            ids(rows),
            if r.short { "short run" } else { "full run" },
            r.only.join(","),
            r.date,
            r.time,
            r.scale,
            r.seed,
            if r.commit.is_empty() { "unknown" } else { &r.commit },
            if r.dirty { " with uncommitted changes in src/" } else { "" },
            if servers.is_empty() {
                String::new()
            } else {
                format!(", servers {}", servers.join(", "))
            }
        );
    }
    let _ = writeln!(
        s,
        "| # | Property | Target | Measured | Trials / operations | Result | Reproduce | Date |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|");
    for o in outcomes {
        let result = match &o.status {
            Status::Pass => "met".to_string(),
            Status::Fail(w) => format!("**MISSED**: {w}"),
            Status::NotRun(w) => format!("**NOT RUN** (counts as missed): {w}"),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            o.id,
            cell(&o.full_title()),
            cell(&o.target),
            cell(&o.figure),
            cell(&o.trials),
            cell(&result),
            reproduce(run, o),
            o.run.as_ref().map_or(date, |r| &r.date)
        );
    }
    let _ = writeln!(
        s,
        "\n`SCALE` multiplies every count and time budget (`make reliability SCALE=0.1` for a quick look, up to 10); \
         `ONLY=mutex,failover` runs some scenarios and prints their rows without rewriting this file, and \
         `ONLY=chaos,kinds SAVE=1` puts their rows into it in place of the old ones (the others stay as they were). \
         Scenarios that name a server run on Redis 7.0.15, Redis 8.2.3 and Valkey 8.1.8 \
         (`RELIABILITY_SERVERS` lists the binaries). `make reliability-short` (CI, part of `make test`) runs the same \
         code with fewer operations and the same assertions, and exits non-zero when a target is missed.\n"
    );
    let missed: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.status != Status::Pass)
        .collect();
    if !missed.is_empty() {
        let _ = writeln!(s, "## Missed targets and what would fix them\n");
        for o in missed {
            let why = match &o.status {
                Status::Fail(w) => w.clone(),
                Status::NotRun(w) => format!("not run: {w}"),
                Status::Pass => String::new(),
            };
            let _ = writeln!(s, "- **{}. {}**: {why}.", o.id, o.full_title());
            for n in o.notes.iter().filter(|n| n.starts_with("Diagnosis")) {
                let _ = writeln!(s, "  {n}");
            }
        }
        let _ = writeln!(s);
    }
    let mut groups: Vec<Vec<&Outcome>> = Vec::new();
    for o in outcomes {
        match groups.last_mut() {
            Some(g) if g[0].key == o.key => g.push(o),
            _ => groups.push(vec![o]),
        }
    }
    for group in &groups {
        let o = group[0];
        let per_server = group.iter().any(|o| o.server.is_some());
        let _ = writeln!(s, "## {}. {}\n", ids(group), o.title);
        if let Some(m) = method(&o.key) {
            let _ = writeln!(s, "{m}");
        }
        for o in group {
            if let (true, Some(sv)) = (per_server, &o.server) {
                let _ = writeln!(s, "### {}. {} (`{}`)\n", o.id, sv.label, sv.path);
            }
            let _ = writeln!(
                s,
                "Target: {}. Result: {}. Took {:.0} s.\n",
                o.target,
                match &o.status {
                    Status::Pass => "met".to_string(),
                    Status::Fail(w) => format!("**missed** ({w})"),
                    Status::NotRun(w) => format!("**not run** ({w})"),
                },
                o.secs
            );
            for n in &o.notes {
                let _ = writeln!(s, "- {n}");
            }
            let _ = writeln!(s);
        }
        if o.key == "stale" {
            let _ = writeln!(s, "### The fenced store: copy this\n");
            let _ = writeln!(
                s,
                "The lock hands out fences; only the system you write to can refuse a stale one. For data kept in \
                 Redis, this script (`scripts/reliability/fenced_store.lua`) is the whole store side:\n"
            );
            let _ = writeln!(s, "```lua\n{}```\n", FENCED_STORE_LUA);
            let _ = writeln!(s, "{EXAMPLE}");
            let _ = writeln!(
                s,
                "For another store, keep the same rule next to the data: remember the highest fence accepted per \
                 resource and refuse a write that carries a lower one (SQL: `UPDATE ... SET v = ?, fence = ? WHERE \
                 id = ? AND fence <= ?`, with the fence in a BIGINT column).\n"
            );
        }
        if o.key == "clock" {
            let _ = writeln!(
                s,
                "The shim is `scripts/reliability/clockshift.c`, built by `scripts/deps-reliability.sh` into \
                 `target/reliability/libclockshift.so`. It replaces clock_gettime(CLOCK_REALTIME*), gettimeofday and \
                 time with raw syscalls plus an offset it reads, on every call, from a file mapped at load time \
                 (`CLOCKSHIFT_FILE`); rewriting that file in place moves the server's clock while it runs. \
                 Debian's libfaketime hangs redis-server at start-up (jemalloc), which is why it is not used.\n"
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, server: Option<&str>) -> Outcome {
        let mut o = Outcome::new(0, key, &format!("Title {key}"), "target");
        o.server = server.map(|s| ServerId {
            label: s.into(),
            path: format!("bin/{s}"),
        });
        o.figure = format!("figure {key}");
        o
    }

    fn run(outcomes: Vec<Outcome>) -> ReliabilityRun {
        ReliabilityRun {
            date: "2026-01-01".into(),
            time: "00:00".into(),
            short: false,
            scale: 1.0,
            seed: 1,
            minutes: 1.0,
            server_path: "/usr/bin/redis-server".into(),
            server_version: "Redis server v=7.0.15".into(),
            commit: "abc".into(),
            dirty: false,
            cpus: 2,
            kernel: "6".into(),
            fs: "ext4".into(),
            outcomes,
        }
    }

    #[test]
    fn a_later_run_replaces_only_its_own_rows() {
        let mut r = run(vec![
            row("mutex", None),
            row("chaos", Some("A")),
            row("stale", None),
        ]);
        let later = RowRun {
            date: "2026-02-02".into(),
            time: "12:00".into(),
            short: false,
            scale: 1.0,
            seed: 7,
            commit: "def".into(),
            dirty: false,
            only: vec!["chaos".into()],
        };
        let order = |k: &str| {
            ["mutex", "stale", "chaos"]
                .iter()
                .position(|x| *x == k)
                .unwrap()
        };
        r.merge(
            vec![row("chaos", Some("A")), row("chaos", Some("B"))],
            later,
            order,
        );
        let keys: Vec<(u32, &str)> = r.outcomes.iter().map(|o| (o.id, o.key.as_str())).collect();
        assert_eq!(
            keys,
            [(1, "mutex"), (2, "stale"), (3, "chaos"), (4, "chaos")]
        );
        assert!(r.outcomes[0].run.is_none() && r.outcomes[3].run.as_ref().unwrap().seed == 7);
        let doc = render(&r);
        assert!(doc.contains("Rows 3-4 come from a later run"), "{doc}");
        assert!(doc.contains("| 3 | Title chaos, A |") && doc.contains("| 2026-02-02 |"));
        assert!(doc.contains("## 3-4. Title chaos\n") && doc.contains("### 4. B (`bin/B`)"));
        assert!(doc.contains("## 1. Title mutex\n") && !doc.contains("### 1."));
    }
}
