//! LOCK.WATCH and LOCK.EXTEND ... OWNER (issue 23) against real servers: a watcher without
//! FENCE waits for a holder, one with FENCE for that holder to be gone (whatever removes
//! it: a release, the lease, FORCERELEASE, the server deleting, renaming, flushing,
//! swapping, restoring or migrating the key, a hand-off), with OWNER for its label to
//! change; BLOCK, MULTI/EXEC and scripts, CLIENT UNBLOCK, disconnects and MAXWAITERS; a
//! thousand watchers on one key; replicas (also with the primary stopped); the summary's
//! shape; the cluster. Lean: watchers of many keys wait at once, one server per test.

mod regress;

use redis_lock_testkit::Stopped;
use regress::paths::{self, Path};
use regress::*;
use std::collections::HashMap;
use std::thread::sleep;
use std::time::{Duration, Instant};

// ---- helpers ----------------------------------------------------------------------------

/// `INFO lock` `lock_watchers`.
fn watchers(c: &mut RawConn) -> i64 {
    let text = c.cmd(&["INFO", "lock"]).text();
    info_field(&text, "lock_watchers")
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}

fn wait_watchers(c: &mut RawConn, n: i64) {
    let ok = wait_until(SETTLE, || watchers(c) == n);
    assert!(ok, "expected {n} watchers, INFO says {}", watchers(c));
}

/// The fences of a summary's `holder-list`.
fn listed_fences(r: &Resp) -> Vec<i64> {
    let list = field(r, "holder-list").unwrap().items();
    list.iter().filter_map(fence_of).collect()
}

/// The ids of the clients blocked in LOCK.WATCH (`CLIENT LIST`).
fn blocked_watchers(c: &mut RawConn) -> Vec<String> {
    let list = c.cmd(&["CLIENT", "LIST"]).text();
    list.lines()
        .filter(|l| l.contains("cmd=lock.watch") && l.contains(" flags=b"))
        .filter_map(|l| {
            l.split(' ')
                .find_map(|f| f.strip_prefix("id="))
                .map(str::to_string)
        })
        .collect()
}

/// A client in LOCK.WATCH (or anything sent and not yet answered), on db `db`. `sent`
/// is taken before the command is written: a BLOCK the server times from when it read
/// the command cannot end before `sent + BLOCK`, however late this thread runs.
struct Watch {
    c: RawConn,
    sent: Instant,
    what: String,
}

impl Watch {
    fn start(port: u16, db: u32, args: &[&str]) -> Watch {
        let mut c = RawConn::connect(port);
        if db != 0 {
            assert_eq!(c.cmd(&["SELECT", &db.to_string()]), ok());
        }
        let mut v = vec!["LOCK.WATCH"];
        v.extend_from_slice(args);
        let sent = Instant::now();
        c.send(&v);
        Watch {
            c,
            sent,
            what: v.join(" "),
        }
    }

    /// The answer, within `d` (Err: none came).
    fn within(&mut self, d: Duration) -> std::io::Result<Resp> {
        self.c.set_read_timeout(Some(d));
        self.c.read()
    }

    /// True when nothing came within `d`.
    fn silent_for(&mut self, d: Duration) -> bool {
        self.within(d).is_err()
    }

    /// After the answer: no second one (the next reply is the PING's).
    fn answered_once(&mut self) -> bool {
        self.c.set_read_timeout(Some(SETTLE));
        matches!(self.c.call(&["PING"]), Ok(Resp::Simple(p)) if p == "PONG")
    }
}

/// Field `name` of a summary (RESP2 flat array or RESP3 map).
fn field(r: &Resp, name: &str) -> Option<Resp> {
    r.get(name)
}

fn fence_of(r: &Resp) -> Option<i64> {
    field(r, "fence").and_then(|f| f.as_int())
}

/// How long an answer may take once its cause happened (the agenda runs within a few ms;
/// slack for a loaded machine, whose pauses reach 1-2 s). Below the 6 and 8 s BLOCKs that
/// a prompt answer is told apart from (blocking.rs's is 5 s too).
const PROMPT: Duration = Duration::from_secs(5);

// ---- without FENCE -------------------------------------------------------------------------

#[test]
fn watch_without_fence_answers_once_the_key_is_held() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    // Held: at once, whatever the kind.
    let t = tok("held-at-once");
    let f = take(&mut c, "lock:held", &t, &["OWNER", "leader-1"]);
    take(&mut c, "lock:sh", &tok("reader"), &["SHARED"]);
    take(&mut c, "lock:ct", &tok("permit"), &["LIMIT", "2"]);
    c.cmd(&["SET", "lock:str", &tok("classic"), "PX", "60000"]);
    for key in ["lock:held", "lock:sh", "lock:ct", "lock:str"] {
        let t0 = Instant::now();
        let r = c.cmd(&["LOCK.WATCH", key]);
        k.check(
            field(&r, "state") == Some(bulk("held")) && t0.elapsed() < PROMPT,
            format!("{key} answers at once: {r:?}"),
        );
    }
    k.eq(
        fence_of(&c.cmd(&["LOCK.WATCH", "lock:held"])),
        Some(f),
        "the holder's fence",
    );

    // Free: waits, then wakes on an acquire with the new holder.
    let mut w = Watch::start(s.port, 0, &["lock:free"]);
    let mut w2 = Watch::start(s.port, 0, &["lock:free", "BLOCK", "0"]);
    wait_watchers(&mut c, 2);
    k.check(
        w.silent_for(Duration::from_millis(300)),
        "a free key: no answer",
    );
    let f = take(
        &mut c,
        "lock:free",
        &tok("first-holder"),
        &["OWNER", "new-leader"],
    );
    for (i, w) in [&mut w, &mut w2].into_iter().enumerate() {
        let r = w.within(PROMPT).expect("woken by the acquire");
        k.eq(
            fence_of(&r),
            Some(f),
            &format!("watcher {i}: the new holder's fence"),
        );
        k.eq(field(&r, "owner"), Some(bulk("new-leader")), "its label");
        k.check(w.answered_once(), "answered once");
    }

    // A hand-off: a lock-delay runs with a waiter queued; the watcher wakes when the
    // delay ends and the waiter is handed the lock.
    let lost = tok("lost-holder");
    granted(&c.cmd(&[
        "LOCK.ACQUIRE",
        "lock:ho",
        "PX",
        "100",
        "TOKEN",
        &lost,
        "LOCKDELAY",
        "700",
    ]));
    sleep(Duration::from_millis(250));
    k.eq(
        c.cmd(&["LOCK.WATCH", "lock:ho", "BLOCK", "1"]),
        Resp::Nil,
        "delayed: nobody holds",
    );
    let mut waiter = Pending::send(
        s.port,
        &["LOCK.ACQUIRE", "lock:ho", "BLOCK", "5000", "OWNER", "next"],
    );
    let mut w = Watch::start(s.port, 0, &["lock:ho"]);
    wait_watchers(&mut c, 1);
    let got = waiter.reply_within(SETTLE).unwrap();
    let (_, wf) = granted(&got);
    let r = w.within(PROMPT).expect("woken by the hand-off");
    k.eq(
        fence_of(&r),
        Some(wf),
        "the watcher sees the waiter that got it",
    );
    k.eq(field(&r, "owner"), Some(bulk("next")), "its label");

    // A lock restored onto a watched free key.
    let payload = c.cmd(&["DUMP", "lock:held"]).bytes();
    let mut w = Watch::start(s.port, 0, &["lock:restored"]);
    wait_watchers(&mut c, 1);
    let restore: Vec<Vec<u8>> = vec![b("RESTORE"), b("lock:restored"), b("0"), payload];
    k.eq(c.cmd(&restore), ok(), "RESTORE");
    let r = w.within(PROMPT);
    k.check(
        r.as_ref()
            .is_ok_and(|r| fence_of(r) == fence_of(&c.cmd(&["LOCK.WATCH", "lock:held"]))),
        format!("woken by a RESTORE: {r:?}"),
    );
    k.eq(watchers(&mut c), 0, "no watcher left");
    k.finish_alive(&s, "watch without fence");
}

#[test]
fn watch_without_fence_sees_a_lock_renamed_or_moved_onto_the_key() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    // (source, token name, watched key and its db, the move and its reply, what it is)
    let moves = [
        (
            "lock:src1",
            "renamed",
            "lock:dst1",
            0,
            ["RENAME", "lock:src1", "lock:dst1"],
            ok(),
        ),
        (
            "lock:src2",
            "moved",
            "lock:src2",
            1,
            ["MOVE", "lock:src2", "1"],
            Resp::Int(1),
        ),
    ];
    let whats = ["RENAME onto a watched key", "MOVE into a watched key's db"];
    for ((src, name, key, db, cmd, reply), what) in moves.into_iter().zip(whats) {
        let f = take(&mut c, src, &tok(name), &[]);
        let mut w = Watch::start(s.port, db, &[key, "BLOCK", "6000"]);
        wait_watchers(&mut c, 1);
        k.eq(c.cmd(&cmd), reply, cmd[0]);
        let r = w.within(PROMPT);
        k.check(
            r.as_ref().is_ok_and(|r| fence_of(r) == Some(f)),
            format!(
                "{what}: answered promptly with the lock, got {r:?} after {:?}",
                w.sent.elapsed()
            ),
        );
        drop(w);
        wait_watchers(&mut c, 0);
    }
    // A classic SET NX lock appearing on a watched free key: seen once the module listens
    // to keyspace events (after a client first waited for a string lock).
    c.cmd(&["SET", "lock:cls-held", &tok("classic-a"), "PX", "60000"]);
    k.eq(
        c.cmd(&["LOCK.ACQUIRE", "lock:cls-held", "BLOCK", "50"]),
        Resp::Nil,
        "a string-lock waiter",
    );
    let mut w = Watch::start(s.port, 0, &["lock:cls", "BLOCK", "6000"]);
    wait_watchers(&mut c, 1);
    c.cmd(&["SET", "lock:cls", &tok("classic-b"), "NX", "PX", "60000"]);
    let r = w.within(PROMPT);
    k.check(
        r.as_ref()
            .is_ok_and(|r| field(r, "kind") == Some(bulk("string"))),
        format!(
            "SET NX onto a watched key (key events on): answered promptly, got {r:?} after {:?}",
            w.sent.elapsed()
        ),
    );
    k.finish();
}

// ---- with FENCE --------------------------------------------------------------------------

#[test]
fn watch_fence_answers_whatever_removes_the_holder() {
    let s = ServerBuilder::new().start();
    let target = ServerBuilder::new().start();
    let mut c = conn(&s);
    let mut k = Checks::new();
    let t = tok("watched-holder");
    // (name, db of the key). Each key gets a lock held by `t` and a FENCE watcher.
    let cases: &[(&str, u32)] = &[
        ("release", 0),
        ("lease", 0),
        ("forcerelease", 0),
        ("forcerelease-fence", 0),
        ("del", 0),
        ("unlink", 0),
        ("rename", 0),
        ("restore-replace", 0),
        ("handoff", 0),
        ("migrate", 0),
        ("owner-other", 0),
        ("flushdb", 3),
        ("swapdb", 4),
        ("flushall", 6),
        // Not woken:
        ("extend", 0),
        ("renew", 0),
        ("owner-same", 0),
        ("owner-other-no-owner-watch", 0),
        ("shared-other-leaves", 0),
    ];
    let mut fences = HashMap::new();
    let mut ws: HashMap<&str, Watch> = HashMap::new();
    let mut waiter = None;
    // When the 1.5 s lease was asked for: it ends no sooner than 1.5 s after this.
    let mut lease_asked = Instant::now();
    for (name, db) in cases {
        let key = format!("lock:{name}");
        c.cmd(&["SELECT", &db.to_string()]);
        let px = if *name == "lease" { 1500 } else { 60_000 };
        let extra: &[&str] = if *name == "shared-other-leaves" {
            &["SHARED", "OWNER", "o1"]
        } else {
            &["OWNER", "o1"]
        };
        if *name == "lease" {
            lease_asked = Instant::now();
        }
        let f = take_px(&mut c, &key, &t, px, extra);
        if *name == "shared-other-leaves" {
            take(&mut c, &key, &tok("other-reader"), &["SHARED"]);
        }
        if *name == "handoff" {
            let mut p = RawConn::connect(s.port);
            p.send(&["LOCK.ACQUIRE", &key, "BLOCK", "10000", "OWNER", "successor"]);
            waiter = Some(p);
        }
        fences.insert(*name, f);
        let fs = f.to_string();
        let mut args = vec![key.as_str(), "FENCE", &fs];
        if name.starts_with("owner") && *name != "owner-other-no-owner-watch" {
            args.extend(["OWNER", "o1"]);
        }
        ws.insert(*name, Watch::start(s.port, *db, &args));
    }
    c.cmd(&["SELECT", "0"]);
    wait_watchers(&mut c, cases.len() as i64);
    wait_waiters(&mut c, "lock:handoff", 1);

    fn take_answer(ws: &mut HashMap<&str, Watch>, name: &str, k: &mut Checks) -> Option<Resp> {
        let w = ws.get_mut(name).unwrap();
        let r = w.within(PROMPT);
        k.check(
            r.is_ok(),
            format!("{name}: answered within {PROMPT:?} ({r:?})"),
        );
        let r = r.ok()?;
        k.check(w.answered_once(), format!("{name}: answered once"));
        Some(r)
    }
    let mut answer = |name: &str, k: &mut Checks| take_answer(&mut ws, name, k);
    let fs = |name: &str| fences[name].to_string();

    let ff = fs("forcerelease-fence");
    // (what removes the holder, the watcher's case, what the check is called)
    for (cmd, name, what) in [
        (
            vec!["LOCK.RELEASE", "lock:release", &t],
            "release",
            "release: free",
        ),
        (
            vec!["LOCK.FORCERELEASE", "lock:forcerelease"],
            "forcerelease",
            "forcerelease",
        ),
        (
            vec!["LOCK.FORCERELEASE", "lock:forcerelease-fence", "FENCE", &ff],
            "forcerelease-fence",
            "forcerelease FENCE",
        ),
        (vec!["DEL", "lock:del"], "del", "DEL"),
        (vec!["UNLINK", "lock:unlink"], "unlink", "UNLINK"),
        (
            vec!["RENAME", "lock:rename", "lock:renamed-away"],
            "rename",
            "RENAME away",
        ),
    ] {
        c.cmd(&cmd);
        let got = answer(name, &mut k);
        k.eq(got, Some(Resp::Nil), what);
    }
    let other = take(&mut c, "lock:restore-src", &tok("restored-holder"), &[]);
    let payload = c.cmd(&["DUMP", "lock:restore-src"]).bytes();
    let restore: Vec<Vec<u8>> = vec![
        b("RESTORE"),
        b("lock:restore-replace"),
        b("0"),
        payload,
        b("REPLACE"),
    ];
    k.eq(c.cmd(&restore), ok(), "RESTORE REPLACE");
    let r = answer("restore-replace", &mut k);
    k.eq(
        r.as_ref().and_then(fence_of),
        Some(other),
        "RESTORE REPLACE: the restored holder",
    );
    c.cmd(&["LOCK.RELEASE", "lock:handoff", &t]);
    let granted_to = waiter.as_mut().unwrap().read().unwrap();
    let (_, next) = granted(&granted_to);
    let r = answer("handoff", &mut k);
    k.eq(
        r.as_ref().and_then(fence_of),
        Some(next),
        "hand-off: the new holder",
    );
    k.eq(
        r.as_ref().and_then(|r| field(r, "owner")),
        Some(bulk("successor")),
        "its label",
    );
    let port = target.port.to_string();
    k.eq(
        c.cmd(&["MIGRATE", "127.0.0.1", &port, "lock:migrate", "0", "5000"]),
        ok(),
        "MIGRATE",
    );
    let r = answer("migrate", &mut k);
    k.check(
        r.as_ref().is_some_and(|r| is_err_with(r, "LOCKMOVED ")),
        format!("MIGRATE: {r:?}"),
    );
    c.cmd(&[
        "LOCK.EXTEND",
        "lock:owner-other",
        &t,
        "PX",
        "60000",
        "OWNER",
        "o2",
    ]);
    let r = answer("owner-other", &mut k);
    k.eq(
        r.as_ref().and_then(|r| field(r, "owner")),
        Some(bulk("o2")),
        "relabelled",
    );
    k.eq(
        r.as_ref().and_then(fence_of),
        Some(fences["owner-other"]),
        "same fence",
    );
    c.cmd(&["SELECT", "3"]);
    c.cmd(&["FLUSHDB"]);
    c.cmd(&["SELECT", "0"]);
    let got = answer("flushdb", &mut k);
    k.eq(got, Some(Resp::Nil), "FLUSHDB");
    c.cmd(&["SWAPDB", "4", "5"]);
    let got = answer("swapdb", &mut k);
    k.eq(got, Some(Resp::Nil), "SWAPDB");
    let r = answer("lease", &mut k);
    k.eq(r, Some(Resp::Nil), "lease end");
    // Timed from the acquire (a watcher started after a slow connect would see less of
    // the lease); 20 ms for the server's ms clock.
    k.check(
        lease_asked.elapsed() >= Duration::from_millis(1480),
        "not before the lease ended",
    );

    // Not woken: a longer lease, a same-token renew, the same label, a relabel the watcher
    // did not ask about, another reader leaving.
    c.cmd(&["LOCK.EXTEND", "lock:extend", &t, "PX", "90000"]);
    c.cmd(&["LOCK.ACQUIRE", "lock:renew", "PX", "90000", "TOKEN", &t]);
    c.cmd(&[
        "LOCK.EXTEND",
        "lock:owner-same",
        &t,
        "PX",
        "90000",
        "OWNER",
        "o1",
    ]);
    c.cmd(&[
        "LOCK.EXTEND",
        "lock:owner-other-no-owner-watch",
        &t,
        "OWNER",
        "o9",
    ]);
    c.cmd(&[
        "LOCK.RELEASE",
        "lock:shared-other-leaves",
        &tok("other-reader"),
    ]);
    sleep(Duration::from_millis(500));
    let unwoken = [
        "extend",
        "renew",
        "owner-same",
        "owner-other-no-owner-watch",
        "shared-other-leaves",
    ];
    for name in unwoken {
        let w = ws.get_mut(name).unwrap();
        k.check(
            w.silent_for(Duration::from_millis(20)),
            format!("{name}: not woken"),
        );
    }
    let mut answer = |name: &str, k: &mut Checks| take_answer(&mut ws, name, k);
    c.cmd(&["SELECT", "6"]);
    c.cmd(&["FLUSHALL"]);
    let got = answer("flushall", &mut k);
    k.eq(got, Some(Resp::Nil), "FLUSHALL");
    for name in unwoken {
        let got = answer(name, &mut k);
        k.eq(got, Some(Resp::Nil), &format!("{name}: FLUSHALL ends it"));
    }
    k.eq(watchers(&mut c), 0, "no watcher left");
    k.finish_alive(&s, "fence watchers");
}

// ---- BLOCK, contexts, unblock, disconnect, limits ------------------------------------------

#[test]
fn watch_block_contexts_unblock_and_limits() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    let t = tok("block-holder");
    let f = take(&mut c, "lock:b", &t, &["OWNER", "b-owner"]);
    let fs = f.to_string();

    // BLOCK ms: the summary at the timeout (held: the holder; free: nil).
    let mut held = Watch::start(s.port, 0, &["lock:b", "FENCE", &fs, "BLOCK", "300"]);
    let mut free = Watch::start(s.port, 0, &["lock:none", "BLOCK", "300"]);
    let r = held.within(PROMPT).expect("timed out watch");
    k.eq(fence_of(&r), Some(f), "timeout answers the holder");
    k.check(
        held.sent.elapsed() >= Duration::from_millis(280),
        "not before BLOCK",
    );
    k.eq(
        free.within(PROMPT).ok(),
        Some(Resp::Nil),
        "timeout on a free key: nil",
    );
    k.check(held.answered_once() && free.answered_once(), "once each");
    // BLOCK 0 waits without limit.
    let mut forever = Watch::start(s.port, 0, &["lock:b", "FENCE", &fs, "BLOCK", "0"]);
    k.check(
        forever.silent_for(Duration::from_millis(600)),
        "BLOCK 0 waits",
    );

    // MULTI and scripts: at once, as a timeout would answer.
    let r = c
        .pipeline(&[
            vec!["MULTI"],
            vec!["LOCK.WATCH", "lock:none"],
            vec!["LOCK.WATCH", "lock:b", "FENCE", &fs],
            vec!["LOCK.WATCH", "lock:b"],
            vec!["EXEC"],
        ])
        .unwrap();
    let items = r[4].items();
    k.eq(items[0].clone(), Resp::Nil, "MULTI, free key");
    k.eq(fence_of(&items[1]), Some(f), "MULTI, held fence");
    k.eq(fence_of(&items[2]), Some(f), "MULTI, held");
    let r = c.cmd(&[
        "EVAL",
        "return redis.call('LOCK.WATCH', KEYS[1])",
        "1",
        "lock:none",
    ]);
    k.eq(r, Resp::Nil, "EVAL, free key");
    let r = c.cmd(&[
        "EVAL",
        "return redis.call('LOCK.WATCH', KEYS[1], 'FENCE', ARGV[1])",
        "1",
        "lock:b",
        &fs,
    ]);
    k.eq(fence_of(&r), Some(f), "EVAL, held fence");

    // CLIENT UNBLOCK: TIMEOUT answers the summary (Redis 7.4+, Valkey); ERROR an error.
    let mut cu = Watch::start(s.port, 0, &["lock:b", "FENCE", &fs]);
    let mut ce = Watch::start(s.port, 0, &["lock:b", "FENCE", &fs]);
    wait_watchers(&mut c, 3);
    let ids = blocked_watchers(&mut c);
    k.eq(ids.len(), 3, "three blocked watchers in CLIENT LIST");
    let f = server_flavor();
    let unblock_works = f.is_valkey() || f.at_least(7, 4);
    for id in &ids {
        let r = c.cmd(&["CLIENT", "UNBLOCK", id, "TIMEOUT"]);
        if unblock_works {
            k.eq(r, Resp::Int(1), "CLIENT UNBLOCK TIMEOUT");
        } else {
            k.eq(r, Resp::Int(0), "CLIENT UNBLOCK is refused before 7.4");
        }
    }
    for (name, w) in [("forever", &mut forever), ("cu", &mut cu), ("ce", &mut ce)] {
        let r = w.within(Duration::from_millis(if unblock_works {
            3000
        } else {
            300
        }));
        if unblock_works {
            k.check(
                r.as_ref().is_ok_and(|r| fence_of(r) == Some(f_int(&fs))),
                format!("{name}: CLIENT UNBLOCK TIMEOUT answers the summary: {r:?}"),
            );
        } else {
            k.check(
                r.is_err(),
                format!("{name}: still waiting after a refused unblock ({r:?})"),
            );
        }
    }
    if !unblock_works {
        // ERROR is refused too; the watchers go on until the release.
        let r = c.cmd(&["CLIENT", "UNBLOCK", &ids[0], "ERROR"]);
        k.eq(r, Resp::Int(0), "CLIENT UNBLOCK ERROR refused before 7.4");
        c.cmd(&["LOCK.RELEASE", "lock:b", &t]);
        for w in [&mut forever, &mut cu, &mut ce] {
            k.eq(w.within(PROMPT).ok(), Some(Resp::Nil), "released");
        }
        take(&mut c, "lock:b", &t, &[]);
    } else {
        let f2 = info_int(&mut c, "lock:b", "fence").to_string();
        let mut w = Watch::start(s.port, 0, &["lock:b", "FENCE", &f2]);
        wait_watchers(&mut c, 1);
        let id = blocked_watchers(&mut c).remove(0);
        k.eq(
            c.cmd(&["CLIENT", "UNBLOCK", &id, "ERROR"]),
            Resp::Int(1),
            "CLIENT UNBLOCK ERROR",
        );
        let r = w.within(PROMPT);
        k.check(
            r.as_ref().is_ok_and(|r| is_err_with(r, "UNBLOCKED")),
            format!("ERROR: {r:?}"),
        );
    }
    k.eq(watchers(&mut c), 0, "unblocked watchers left");

    // A disconnected watcher leaves.
    let fnow = info_int(&mut c, "lock:b", "fence").to_string();
    let gone: Vec<Watch> = (0..5)
        .map(|_| Watch::start(s.port, 0, &["lock:b", "FENCE", &fnow]))
        .collect();
    wait_watchers(&mut c, 5);
    drop(gone);
    k.check(
        wait_until(SETTLE, || watchers(&mut c) == 0),
        "disconnected watchers leave",
    );

    // lock.max-waiters watchers per key, then MAXWAITERS at once.
    c.cmd(&["CONFIG", "SET", "lock.max-waiters", "3"]);
    let three: Vec<Watch> = (0..3)
        .map(|_| Watch::start(s.port, 0, &["lock:b", "FENCE", &fnow]))
        .collect();
    wait_watchers(&mut c, 3);
    let r = c.cmd(&["LOCK.WATCH", "lock:b", "FENCE", &fnow]);
    k.check(
        is_err_with(&r, "MAXWAITERS "),
        format!("a fourth watcher: {r:?}"),
    );
    k.eq(
        fence_of(&c.cmd(&["LOCK.WATCH", "lock:b"])),
        Some(f_int(&fnow)),
        "a watch that answers at once is fine",
    );
    let other = c.cmd(&["LOCK.WATCH", "lock:c", "BLOCK", "50"]);
    k.eq(other, Resp::Nil, "another key has its own limit");
    drop(three);
    k.check(wait_until(SETTLE, || watchers(&mut c) == 0), "gone again");
    c.cmd(&["CONFIG", "SET", "lock.max-waiters", "10000"]);

    // Bad input.
    for (line, want) in [
        ("LOCK.WATCH lock:b OWNER x", "ERR syntax error"),
        ("LOCK.WATCH lock:b FENCE 0", "ERR FENCE must be"),
        ("LOCK.WATCH lock:b FENCE abc", "ERR FENCE must be"),
        ("LOCK.WATCH lock:b BLOCK -1", "ERR timeout is negative"),
        ("LOCK.WATCH lock:b BLOCK x", "ERR timeout is not an integer"),
        (
            "LOCK.WATCH lock:b BLOCK 9223372036854775807",
            "ERR timeout is out of range",
        ),
        ("LOCK.WATCH lock:b FENCE 1 FENCE 2", "ERR syntax error"),
        ("LOCK.WATCH lock:b NOPE", "ERR syntax error"),
        ("LOCK.WATCH", "ERR wrong number of arguments"),
    ] {
        let argv = words(line);
        let r = c.cmd(&argv);
        k.check(
            is_err_with(&r, want),
            format!("{argv:?}: want {want:?}, got {r:?}"),
        );
    }
    c.cmd(&["RPUSH", "lock:list", "x"]);
    let r = c.cmd(&["LOCK.WATCH", "lock:list", "BLOCK", "10"]);
    k.check(is_err_with(&r, "WRONGTYPE "), format!("a list: {r:?}"));
    k.eq(watchers(&mut c), 0, "no watcher left");
    k.finish_alive(&s, "block and limits");
}

fn f_int(s: &str) -> i64 {
    s.parse().unwrap()
}

#[test]
fn a_thousand_watchers_are_each_woken_once_and_leave_nothing() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    let t = tok("thousand");
    let mut mem = Vec::new();
    // Four rounds: the first one grows what the server keeps for a thousand clients (its
    // client tables, rehashed and shrunk in its cron, at times after the first look), so a
    // leak shows as growth after the second round.
    for round in 0..4 {
        let f = take(&mut c, "lock:many", &t, &[]).to_string();
        let mut ws: Vec<RawConn> = (0..1000)
            .map(|_| {
                let mut w = RawConn::connect(s.port);
                w.send(&["LOCK.WATCH", "lock:many", "FENCE", &f]);
                w
            })
            .collect();
        wait_watchers(&mut c, 1000);
        k.check(
            c.cmd(&["LOCK.RELEASE", "lock:many", &t]) == Resp::Int(1),
            "one release",
        );
        let mut nil = 0;
        for w in ws.iter_mut() {
            if w.read().is_ok_and(|r| r == Resp::Nil) {
                nil += 1;
            }
        }
        k.eq(
            nil,
            1000,
            &format!("round {round}: every watcher answered nil"),
        );
        let mut once = 0;
        for w in ws.iter_mut() {
            w.queue(&["PING"]);
            let _ = w.flush();
        }
        for w in ws.iter_mut() {
            if matches!(w.read(), Ok(Resp::Simple(p)) if p == "PONG") {
                once += 1;
            }
        }
        k.eq(once, 1000, &format!("round {round}: each exactly once"));
        drop(ws);
        k.check(
            wait_until(SETTLE, || watchers(&mut c) == 0),
            "no watcher left",
        );
        k.check(
            wait_until(SETTLE, || {
                c.cmd(&["INFO", "clients"])
                    .text()
                    .contains("connected_clients:1\r")
            }),
            "every watcher's connection closed",
        );
        let read = || {
            info_field(&c.cmd(&["INFO", "memory"]).text(), "used_memory")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let settled = redis_lock_testkit::settled_memory(read);
        let used = *settled.as_ref().unwrap_or_else(|r| r.last().unwrap_or(&-1));
        mem.push(used);
        k.check(
            settled.is_ok(),
            format!("round {round}: used_memory settled: {settled:?}"),
        );
    }
    // A leak grows every round; the noise of a loaded machine does not: the smaller of
    // the last two rounds is set against the second.
    k.check(
        mem[2].min(mem[3]) - mem[1] < 256 * 1024,
        format!("used_memory after four rounds of 1000 watchers: {mem:?}"),
    );
    k.finish_alive(&s, "thousand watchers");
}

#[test]
fn watchers_with_deadlines_on_many_keys_are_all_answered_on_time() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    let t = tok("agenda");
    let keys = 150;
    let changed = |i: usize| i.is_multiple_of(10);
    let mut fences = Vec::new();
    for i in 0..keys {
        let key = format!("lock:ag:{i}");
        fences.push((i % 2 == 0).then(|| take(&mut c, &key, &t, &[])));
    }
    // Three watchers per key: BLOCK 200..1400 ms (20000 on the keys that change), FENCE on
    // the held keys; each read by its own thread, which notes when the answer came. The
    // watchers of the keys that change start first and are all counted before the rest
    // start: opening 450 connections can outlast the shortest BLOCK on a loaded machine,
    // so all 450 are never counted at once.
    let mut ws: Vec<(Watch, u64, usize)> = Vec::new();
    for first in [true, false] {
        for (i, fence) in fences.iter().enumerate() {
            if changed(i) != first {
                continue;
            }
            let key = format!("lock:ag:{i}");
            for j in 0..3 {
                // 20 s: opening the other 420 connections and 450 threads before the
                // changes can take seconds on a loaded machine; a wake by the change (not
                // the timeout) is then told apart by when it came and what it says.
                let block = if first {
                    20_000
                } else {
                    200 + ((i * 7 + j * 131) % 1200) as u64
                };
                let bs = block.to_string();
                let w = match fence {
                    Some(f) => {
                        let fs = f.to_string();
                        Watch::start(s.port, 0, &[&key, "FENCE", &fs, "BLOCK", &bs])
                    }
                    None => Watch::start(s.port, 0, &[&key, "BLOCK", &bs]),
                };
                ws.push((w, block, i));
            }
        }
        if first {
            wait_watchers(&mut c, ws.len() as i64);
        }
    }
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = ws
            .iter_mut()
            .map(|(w, block, i)| {
                let (block, i) = (*block, *i);
                scope.spawn(move || {
                    let began = Instant::now();
                    let r = w.within(Duration::from_millis(block) + PROMPT);
                    (
                        w.what.clone(),
                        block,
                        i,
                        r,
                        w.sent.elapsed(),
                        Instant::now(),
                        w.sent,
                        // From when this thread could read: the short BLOCKs end before
                        // the last threads start on a loaded machine, their answers
                        // waiting in the socket.
                        began,
                    )
                })
            })
            .collect();
        // Every tenth key changes (released if held, acquired if free).
        let mut changed_at = Instant::now();
        for i in (0..keys).filter(|&i| changed(i)) {
            let key = format!("lock:ag:{i}");
            if fences[i].is_some() {
                c.cmd(&["LOCK.RELEASE", &key, &t]);
            } else {
                take(&mut c, &key, &tok("churn"), &[]);
            }
            changed_at = Instant::now();
        }
        let out: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        (out, changed_at)
    });
    let (results, changed_at) = results;
    let mut bad = Vec::new();
    for (what, block, i, r, took, at, sent, began) in results {
        let block = Duration::from_millis(block);
        match r {
            Err(e) => bad.push(format!("{what}: not answered ({e})")),
            Ok(r) if changed(i) => {
                if at > changed_at.max(began) + PROMPT || took + Duration::from_millis(500) > block
                {
                    bad.push(format!("{what}: woken late ({took:?})"));
                }
                if (r != Resp::Nil) != fences[i].is_none() {
                    bad.push(format!("{what}: after the change answered {r:?}"));
                }
            }
            Ok(r) => {
                if took + Duration::from_millis(30) < block
                    || at > (sent + block).max(began) + PROMPT
                {
                    bad.push(format!("{what}: timed out after {took:?}"));
                }
                if (r != Resp::Nil) != fences[i].is_some() {
                    bad.push(format!("{what}: the timeout answered {r:?}"));
                }
            }
        }
    }
    k.check(
        bad.is_empty(),
        format!("{} of {} watchers: {bad:?}", bad.len(), keys * 3),
    );
    k.eq(watchers(&mut c), 0, "no watcher left");
    k.finish_alive(&s, "agenda");
}

// ---- replicas --------------------------------------------------------------------------

#[test]
fn watch_on_a_replica_follows_its_primary_and_the_lease() {
    let p = primary().start();
    let r = replica_of(&p, ServerBuilder::new());
    let mut c = conn(&p);
    let mut rc = conn(&r);
    let mut k = Checks::new();
    let t = tok("replica-watch");
    let f = take(&mut c, "lock:rw", &t, &["OWNER", "primary-holder"]);
    caught_up(&p, &r);
    k.eq(
        fence_of(&rc.cmd(&["LOCK.WATCH", "lock:rw"])),
        Some(f),
        "held on the replica: at once",
    );
    let fs = f.to_string();
    let mut gone = Watch::start(r.port, 0, &["lock:rw", "FENCE", &fs]);
    let mut held = Watch::start(r.port, 0, &["lock:rw2"]);
    wait_watchers(&mut rc, 2);
    c.cmd(&["LOCK.RELEASE", "lock:rw", &t]);
    k.eq(
        gone.within(PROMPT).ok(),
        Some(Resp::Nil),
        "woken by the primary's release",
    );
    let f2 = take(&mut c, "lock:rw2", &t, &["OWNER", "second"]);
    let r2 = held.within(PROMPT);
    k.check(
        r2.as_ref().is_ok_and(|r| fence_of(r) == Some(f2)),
        format!("woken by the primary's acquire: {r2:?}"),
    );
    // EXTEND ... OWNER on the primary reaches an OWNER watcher on the replica.
    let f2s = f2.to_string();
    let mut relabel = Watch::start(r.port, 0, &["lock:rw2", "FENCE", &f2s, "OWNER", "second"]);
    wait_watchers(&mut rc, 1);
    c.cmd(&["LOCK.EXTEND", "lock:rw2", &t, "OWNER", "third"]);
    let rr = relabel.within(PROMPT);
    k.check(
        rr.as_ref()
            .is_ok_and(|r| field(r, "owner") == Some(bulk("third"))),
        format!("replica OWNER watcher: {rr:?}"),
    );
    // The primary stopped: a FENCE watcher on the replica is answered at the lease's end,
    // not before: timed from the acquire (the replica's catch-up and the watcher's start
    // can take 1-2 s on a loaded machine), with 100 ms for the servers' ms clocks.
    let asked = Instant::now();
    let f3 = take_px(&mut c, "lock:rw3", &t, 1500, &[]);
    caught_up(&p, &r);
    let f3s = f3.to_string();
    let mut lease = Watch::start(r.port, 0, &["lock:rw3", "FENCE", &f3s]);
    wait_watchers(&mut rc, 1);
    {
        let _stopped = Stopped::new(p.pid());
        let got = lease.within(Duration::from_millis(1500) + PROMPT);
        k.eq(
            got.ok(),
            Some(Resp::Nil),
            "answered at the lease end with the primary stopped",
        );
        k.check(
            asked.elapsed() >= Duration::from_millis(1400),
            "not before it",
        );
        k.eq(
            rc.cmd(&["LOCK.WATCH", "lock:rw3", "BLOCK", "1"]),
            Resp::Nil,
            "and the key reads free",
        );
    }
    k.eq(watchers(&mut rc), 0, "no watcher left on the replica");
    k.finish_alive(&r, "replica");
}

// ---- the summary -------------------------------------------------------------------------

#[test]
fn the_summary_names_holders_never_tokens() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    let mut c3 = RawConn::connect_resp3(s.port);
    let t = tok("summary-secret");
    let f = take(&mut c, "lock:x", &t, &["OWNER", "svc-a"]);
    let readers: Vec<(String, i64)> = (0..12)
        .map(|i| {
            let t = tok(&format!("summary-reader-{i}"));
            let owner = format!("reader-{i}");
            let f = take(&mut c, "lock:s", &t, &["SHARED", "OWNER", &owner]);
            (t, f)
        })
        .collect();
    let permits: Vec<i64> = (0..2)
        .map(|i| {
            take(
                &mut c,
                "lock:n",
                &tok(&format!("summary-permit-{i}")),
                &["LIMIT", "5"],
            )
        })
        .collect();
    c.cmd(&["SET", "lock:str", &tok("summary-classic"), "PX", "60000"]);

    for (proto, conn) in [("resp2", &mut c), ("resp3", &mut c3)] {
        let x = conn.cmd(&["LOCK.WATCH", "lock:x"]);
        if proto == "resp3" {
            k.check(matches!(x, Resp::Map(_)), format!("RESP3 map: {x:?}"));
        } else {
            k.check(
                matches!(x, Resp::Array(_)),
                format!("RESP2 flat array: {x:?}"),
            );
        }
        let names: Vec<String> = x.pairs().into_iter().map(|(n, _)| n).collect();
        k.eq(
            names,
            [
                "state",
                "kind",
                "mode",
                "fence",
                "owner",
                "holders",
                "holder-list",
            ]
            .map(String::from)
            .to_vec(),
            &format!("{proto}: exclusive fields"),
        );
        k.eq(field(&x, "state"), Some(bulk("held")), "state");
        k.eq(field(&x, "kind"), Some(bulk("module")), "kind");
        k.eq(field(&x, "mode"), Some(bulk("exclusive")), "mode");
        k.eq(fence_of(&x), Some(f), "fence");
        k.eq(field(&x, "owner"), Some(bulk("svc-a")), "owner");
        k.eq(field(&x, "holders"), Some(Resp::Int(1)), "holders");
        let list = field(&x, "holder-list").unwrap().items();
        k.eq(list.len(), 1, "one holder listed");
        k.eq(
            list[0]
                .pairs()
                .into_iter()
                .map(|(n, _)| n)
                .collect::<Vec<_>>(),
            vec!["fence".to_string(), "owner".to_string()],
            "a holder is its fence and label",
        );
        if proto == "resp3" {
            k.check(matches!(list[0], Resp::Map(_)), "RESP3 holder is a map");
        }

        let sh = conn.cmd(&["LOCK.WATCH", "lock:s"]);
        k.eq(field(&sh, "mode"), Some(bulk("shared")), "shared mode");
        k.eq(field(&sh, "holders"), Some(Resp::Int(12)), "12 holders");
        k.eq(
            field(&sh, "fence"),
            None,
            "no top-level fence for a shared lock",
        );
        k.eq(
            field(&sh, "owner"),
            None,
            "no top-level owner for a shared lock",
        );
        let list = field(&sh, "holder-list").unwrap().items();
        let listed: Vec<i64> = list.iter().filter_map(fence_of).collect();
        let want: Vec<i64> = readers.iter().take(10).map(|(_, f)| *f).collect();
        k.eq(listed, want, "the first 10 readers by fence");
        k.eq(
            list.iter().map(|h| field(h, "owner")).collect::<Vec<_>>(),
            (0..10)
                .map(|i| Some(bulk(&format!("reader-{i}"))))
                .collect::<Vec<_>>(),
            "their labels",
        );

        let n = conn.cmd(&["LOCK.WATCH", "lock:n"]);
        k.eq(field(&n, "mode"), Some(bulk("counted")), "counted mode");
        k.eq(field(&n, "holders"), Some(Resp::Int(2)), "2 permits held");
        let listed = listed_fences(&n);
        k.eq(listed, permits.clone(), "the permits' fences");
        k.eq(field(&n, "owner"), None, "no label set, no top-level owner");

        let st = conn.cmd(&["LOCK.WATCH", "lock:str"]);
        k.eq(field(&st, "kind"), Some(bulk("string")), "string kind");
        k.eq(
            field(&st, "fence"),
            Some(Resp::Nil),
            "a string lock has no fence",
        );
        k.eq(field(&st, "holders"), Some(Resp::Int(1)), "one holder");
        k.eq(
            field(&st, "holder-list").map(|l| l.items().len()),
            Some(0),
            "nobody listed",
        );
        k.eq(
            conn.cmd(&["LOCK.WATCH", "lock:free", "BLOCK", "1"]),
            Resp::Nil,
            "free: nil",
        );

        // Never a token, nor its digest.
        let mut bytes = Vec::new();
        for r in [&x, &sh, &n, &st] {
            all_bytes(r, &mut bytes);
        }
        k.check(!has(&bytes, t.as_bytes()), format!("{proto}: no token"));
        for (rt, _) in &readers {
            k.check(
                !has(&bytes, rt.as_bytes()),
                format!("{proto}: no reader token"),
            );
        }
        k.check(
            !has(&bytes, tok("summary-classic").as_bytes()),
            format!("{proto}: no string-lock token"),
        );
        let digest = redis_lock_testkit::lock::token_digest(t.as_bytes());
        k.check(!has(&bytes, &digest), format!("{proto}: no digest"));
    }
    // The summary woken by a change is the same as the one a new watch answers.
    let mut w = Watch::start(s.port, 0, &["lock:s", "FENCE", &readers[0].1.to_string()]);
    wait_watchers(&mut c, 1);
    c.cmd(&["LOCK.RELEASE", "lock:s", &readers[0].0]);
    let woke = w.within(PROMPT).unwrap();
    k.eq(
        woke.clone(),
        c.cmd(&["LOCK.WATCH", "lock:s"]),
        "woken summary = current summary",
    );
    k.eq(field(&woke, "holders"), Some(Resp::Int(11)), "11 left");
    let listed = listed_fences(&woke);
    k.eq(
        listed,
        readers[1..11].iter().map(|(_, f)| *f).collect::<Vec<_>>(),
        "the next ten",
    );
    k.finish();
}

// ---- EXTEND ... OWNER --------------------------------------------------------------------

#[test]
fn extend_owner_relabels_keeping_the_fence_on_every_path() {
    let p = paths::with_helper_module(primary()).start();
    let r = replica_of(&p, ServerBuilder::new());
    let mut c = conn(&p);
    paths::load_function_library(&mut c);
    let mut k = Checks::new();
    for path in Path::ALL {
        let key = format!("lock:eo:{}", path.name());
        let t = tok(&format!("eo-{}", path.name()));
        let f = take(&mut c, &key, &t, &["OWNER", "before"]);
        let label = format!("after-{}", path.name());
        let reply = paths::send(
            &mut c,
            path,
            &["LOCK.EXTEND", &key, &t, "PX", "50000", "OWNER", &label],
        );
        k.eq(
            reply,
            Resp::Int(1),
            &format!("{}: EXTEND OWNER", path.name()),
        );
        k.eq(
            info_int(&mut c, &key, "fence"),
            f,
            &format!("{}: same fence", path.name()),
        );
        k.eq(
            info(&mut c, &key).get("owner"),
            Some(bulk(&label)),
            &format!("{}: new label", path.name()),
        );
        let wrong = paths::send(
            &mut c,
            path,
            &["LOCK.EXTEND", &key, &tok("nope"), "OWNER", "hijack"],
        );
        k.eq(
            wrong,
            Resp::Int(0),
            &format!("{}: wrong token", path.name()),
        );
    }
    caught_up(&p, &r);
    let mut rc = conn(&r);
    for path in Path::ALL {
        let key = format!("lock:eo:{}", path.name());
        k.eq(
            info(&mut rc, &key).get("owner"),
            Some(Resp::Bulk(b(&format!("after-{}", path.name())))),
            &format!("{}: the replica has the label", path.name()),
        );
    }
    // A reader of a shared lock relabels itself only.
    let (ra, rb) = (tok("eo-reader-a"), tok("eo-reader-b"));
    take(&mut c, "lock:eo:sh", &ra, &["SHARED", "OWNER", "a"]);
    take(&mut c, "lock:eo:sh", &rb, &["SHARED", "OWNER", "b"]);
    k.eq(
        c.cmd(&["LOCK.EXTEND", "lock:eo:sh", &ra, "OWNER", "a2"]),
        Resp::Int(1),
        "shared relabel",
    );
    let owners: Vec<Option<Resp>> = info(&mut c, "lock:eo:sh")
        .get("holder-list")
        .unwrap()
        .items()
        .iter()
        .map(|h| h.get("owner"))
        .collect();
    k.eq(
        owners,
        vec![Some(bulk("a2")), Some(bulk("b"))],
        "only that reader",
    );
    // A string lock has no label; bad labels.
    c.cmd(&["SET", "lock:eo:str", &tok("eo-classic"), "PX", "60000"]);
    let e = c.cmd(&[
        "LOCK.EXTEND",
        "lock:eo:str",
        &tok("eo-classic"),
        "OWNER",
        "x",
    ]);
    k.check(
        is_err_with(&e, "ERR OWNER needs a module lock"),
        format!("string lock: {e:?}"),
    );
    let long = "x".repeat(257);
    for bad in ["", long.as_str()] {
        let e = c.cmd(&["LOCK.EXTEND", "lock:eo:sh", &ra, "OWNER", bad]);
        k.check(
            is_err_with(&e, "ERR OWNER must be"),
            format!("label of {} bytes: {e:?}", bad.len()),
        );
    }
    // The relabel survives a restart from the RDB (through the replica's full sync here).
    let r2 = replica_of(&p, ServerBuilder::new());
    k.eq(
        info(&mut conn(&r2), "lock:eo:direct").get("owner"),
        Some(bulk("after-direct")),
        "a new replica's full sync carries the label",
    );
    k.finish_alive(&p, "extend owner");
}

// ---- cluster ----------------------------------------------------------------------------

#[test]
fn cluster_watchers_follow_the_slot() {
    let (cluster, mut k) = start_cluster();
    let held = "lock:{wslot-a}";
    let free = "lock:{wslot-b}";
    let (sa, sb) = (
        redis_lock_testkit::key_slot(held.as_bytes()),
        redis_lock_testkit::key_slot(free.as_bytes()),
    );
    let owner_a = cluster.slot_owner(sa).unwrap();
    let owner_b = cluster.slot_owner(sb).unwrap();
    let node_a = &cluster.nodes[owner_a];
    let mut c = conn(node_a);
    let t = tok("cluster-watch");
    let f = take(&mut c, held, &t, &[]).to_string();
    // The wrong node: MOVED.
    let other = (owner_a + 1) % 3;
    let r = conn(&cluster.nodes[other]).cmd(&["LOCK.WATCH", held]);
    k.check(is_err_with(&r, "MOVED "), format!("wrong node: {r:?}"));
    let mut wa = Watch::start(node_a.port, 0, &[held, "FENCE", &f, "BLOCK", "8000"]);
    let mut wb = Watch::start(cluster.nodes[owner_b].port, 0, &[free, "BLOCK", "8000"]);
    if owner_a == owner_b {
        wait_watchers(&mut c, 2);
    } else {
        wait_watchers(&mut c, 1);
        wait_watchers(&mut conn(&cluster.nodes[owner_b]), 1);
    }
    // The held key's slot moves: its watcher is answered (TRYAGAIN or LOCKMOVED).
    let to = (owner_a + 1) % 3;
    cluster
        .migrate_slot(sa, to, Duration::from_millis(100))
        .expect("migrate");
    let r = wa.within(PROMPT);
    k.check(
        r.as_ref()
            .is_ok_and(|r| is_err_with(r, "TRYAGAIN") || is_err_with(r, "LOCKMOVED")),
        format!(
            "the held key's slot moved: {r:?} after {:?}",
            wa.sent.elapsed()
        ),
    );
    // The free key's slot moves away: the watcher must not stay until its BLOCK ends.
    let to = (owner_b + 1) % 3;
    let moved_at = Instant::now();
    cluster
        .migrate_slot(sb, to, Duration::from_millis(100))
        .expect("migrate");
    let r = wb.within(Duration::from_secs(9));
    k.check(
        r.as_ref().is_ok_and(|r| r.is_error()) && moved_at.elapsed() < PROMPT,
        format!(
            "a free key's slot moved away: {r:?} after {:?} (BLOCK 8000)",
            wb.sent.elapsed()
        ),
    );
    // On the new owner the watch works.
    let node = cluster.node_for_key(held);
    let mut nc = conn(node);
    let got = nc.cmd(&["LOCK.WATCH", held, "BLOCK", "10"]);
    k.check(
        fence_of(&got).is_some(),
        format!("the lock on its new node: {got:?}"),
    );
    k.finish();
}
