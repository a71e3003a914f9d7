//! Persistence: locks survive a SIGKILL and restart through the AOF (fsync always, with
//! and without an AOF rewrite) and RDB, with the same token, fence and owner, and leases
//! that end no earlier than before; fences keep rising across restarts; DUMP/RESTORE
//! copies a lock, and RESTORE refuses corrupted payloads and hostile payloads that carry
//! a valid checksum.

mod common;

use common::conn::{
    acquire, acquire_far, assert_deadlines, bytes_field, counter, durable, exists, int, int_field,
    lock_info, pexpiretime, release, renew_with_floor, Info,
};
use common::{aof, contains, debug_server, far_fence, unix_ms, wait_persistence_idle, wait_until};
use common::{Server, ServerBuilder};
use redis::{Connection, Value};
use redis_lock_testkit::paths::{crc64, ModuleDump, Op};
use std::time::Duration;

/// How long a background save or AOF rewrite may take.
const IDLE_TIMEOUT: Duration = Duration::from_secs(20);

// ------------------------------------------------------------------------------------
// Helpers

fn ping(c: &mut Connection) {
    let pong: String = redis::cmd("PING").query(c).unwrap();
    assert_eq!(pong, "PONG");
}

/// The AOF files of a server (Redis 7+ multi-part AOF in `appendonlydir/`).
fn aof_files(s: &Server) -> Vec<(String, Vec<u8>)> {
    let dir = s.dir.join("appendonlydir");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let e = e.unwrap();
        out.push((
            e.file_name().to_string_lossy().into_owned(),
            std::fs::read(e.path()).unwrap(),
        ));
    }
    out
}

// ------------------------------------------------------------------------------------
// A set of locks to persist and compare

struct Held {
    key: &'static str,
    token: Vec<u8>,
    info: Info,
}

struct Snapshot {
    locks: Vec<Held>,
    classic_pexpiretime: i64,
    max_fence: i64,
    /// When the first lock was taken (unix ms): no lease can end later after the
    /// restart than this plus its length.
    started: i64,
}

const CLASSIC_KEY: &str = "persist:classic";
const CLASSIC_TOKEN: &str = "classic-token";

/// Module locks with and without OWNER and TOKEN (one extended, one renewed), one
/// classic string lock, and one lock released before the restart. With `far`, the first
/// lock carries a fence an hour ahead of the clock.
fn make_locks(c: &mut Connection, far: bool) -> Snapshot {
    let started = unix_ms();
    let far_s = far_fence().to_string();
    let mut first: Vec<&str> = vec![
        "PX",
        "120000",
        "TOKEN",
        "tok-owner------------tok",
        "OWNER",
        "svc-1",
    ];
    if far {
        first.extend(["MINFENCE", far_s.as_str()]);
    }
    let specs: [(&str, Vec<&str>); 4] = [
        ("persist:owner", first),
        (
            "persist:plain",
            vec!["PX", "120000", "TOKEN", "tok-plain------------tok"],
        ),
        ("persist:generated", vec!["PX", "100000", "OWNER", "gen"]),
        (
            "persist:extended",
            vec!["PX", "5000", "TOKEN", "tok-ext--------------tok"],
        ),
    ];
    let mut tokens = Vec::new();
    for (key, opts) in &specs {
        let (t, _) = acquire(c, key, opts).unwrap();
        tokens.push(t);
    }
    let n: i64 = redis::cmd("LOCK.EXTEND")
        .arg("persist:extended")
        .arg("tok-ext--------------tok")
        .arg("PX")
        .arg(110000)
        .query(c)
        .unwrap();
    assert_eq!(n, 1);
    // Idempotent renew with a new TTL.
    acquire(
        c,
        "persist:plain",
        &["PX", "115000", "TOKEN", "tok-plain------------tok"],
    )
    .unwrap();
    // Gone before the restart: must not come back.
    let (t, _) = acquire(c, "persist:released", &["PX", "120000"]).unwrap();
    assert_eq!(release(c, "persist:released", &t), 1);

    let ok: Option<String> = redis::cmd("SET")
        .arg(CLASSIC_KEY)
        .arg(CLASSIC_TOKEN)
        .arg("NX")
        .arg("PX")
        .arg(120000)
        .query(c)
        .unwrap();
    assert_eq!(ok.as_deref(), Some("OK"));

    let mut locks = Vec::new();
    let mut max_fence = 0;
    for ((key, _), token) in specs.iter().zip(tokens) {
        let info = lock_info(c, key).unwrap();
        max_fence = max_fence.max(int_field(&info, "fence"));
        // A module lock's key has no Redis expiry: its lease is the module's.
        assert_eq!(pexpiretime(c, key), -1, "{key}");
        locks.push(Held { key, token, info });
    }
    Snapshot {
        locks,
        classic_pexpiretime: pexpiretime(c, CLASSIC_KEY),
        max_fence,
        started,
    }
}

/// After a restart: every lock as before (each lease ending no earlier than before, and
/// later by at most the time since the locks were taken: RDB and a rewritten AOF carry
/// the time left, an AOF replay each grant's whole lease), tokens still release, and the
/// next fence is above every earlier one.
fn check_locks(s: &Server, snap: &Snapshot) {
    let mut c = s.conn();
    let later = unix_ms() - snap.started + 5;
    for h in &snap.locks {
        let after = lock_info(&mut c, h.key)
            .unwrap_or_else(|| panic!("{} lost across the restart\n{}", h.key, s.log_tail()));
        assert_eq!(durable(&h.info), durable(&after), "{}", h.key);
        assert_deadlines(&h.info, &after, later, h.key);
        assert_eq!(pexpiretime(&mut c, h.key), -1, "{}: a Redis expiry", h.key);
        let t: String = redis::cmd("TYPE").arg(h.key).query(&mut c).unwrap();
        assert_eq!(t, "redislock");
    }
    assert_eq!(
        bytes_field(&snap.locks[0].info, "owner").as_deref(),
        Some(&b"svc-1"[..])
    );
    assert!(
        !exists(&mut c, "persist:released"),
        "a released lock came back"
    );
    // The classic string lock is still a string with its token and deadline.
    let v: Option<String> = redis::cmd("GET").arg(CLASSIC_KEY).query(&mut c).unwrap();
    assert_eq!(v.as_deref(), Some(CLASSIC_TOKEN));
    assert_eq!(pexpiretime(&mut c, CLASSIC_KEY), snap.classic_pexpiretime);
    let ci = lock_info(&mut c, CLASSIC_KEY).unwrap();
    assert_eq!(bytes_field(&ci, "kind").as_deref(), Some(&b"string"[..]));

    // Persistence brought the counter back, and the next grant's fence is above every
    // fence issued before the restart.
    assert!(
        counter(&mut c) >= snap.max_fence,
        "the loaded counter {} is below {}",
        counter(&mut c),
        snap.max_fence
    );
    let (_, f) = acquire(&mut c, "persist:next", &["PX", "10000"]).unwrap();
    assert!(
        f > snap.max_fence,
        "fence {f} after the restart <= {} before",
        snap.max_fence
    );
    // The tokens came through unchanged: the original ones release.
    for h in &snap.locks {
        assert_eq!(
            release(&mut c, h.key, b"not-the-token"),
            0,
            "{}: a wrong token released",
            h.key
        );
        assert_eq!(release(&mut c, h.key, &h.token), 1, "{}", h.key);
    }
    assert_eq!(release(&mut c, CLASSIC_KEY, CLASSIC_TOKEN.as_bytes()), 1);
}

// ------------------------------------------------------------------------------------
// AOF and RDB

#[test]
fn aof_fsync_always_keeps_locks_across_kill9() {
    let mut s = debug_server()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let snap = make_locks(&mut s.conn(), true);
    // The locks are in the AOF as the deterministic LOCK.REPL, never as LOCK.ACQUIRE.
    let files = aof_files(&s);
    assert!(
        files.iter().any(|(_, b)| contains(b, b"LOCK.REPL")),
        "no LOCK.REPL in the AOF"
    );
    assert!(
        files.iter().any(|(_, b)| contains(b, b"ADD")),
        "no LOCK.REPL ADD (a grant) in the AOF"
    );
    assert!(
        !files.iter().any(|(_, b)| contains(b, b"LOCK.ACQUIRE")),
        "LOCK.ACQUIRE (random token, live state) was written to the AOF"
    );
    s.kill9();
    s.restart();
    check_locks(&s, &snap);
}

#[test]
fn an_aof_with_the_op_word_as_its_own_argument_still_loads() {
    // Builds before this one wrote `LOCK.REPL key ADD <fields>`; this one writes
    // `LOCK.REPL key ADD;<fields>` (one argument fewer for the AOF and the replicas to
    // write). A file of the earlier form is made from this build's own by splitting the
    // op word off again, and must load to the same locks.
    let mut s = debug_server()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let snap = make_locks(&mut s.conn(), true);
    let mut c = s.conn();
    // Two readers, one of them gone (DROP), and the lock-delay a lease's end leaves
    // behind it (DELAY).
    for t in ["reader-one-000000000001", "reader-two-000000000002"] {
        acquire(
            &mut c,
            "persist:readers",
            &["SHARED", "PX", "120000", "TOKEN", t],
        )
        .unwrap();
    }
    assert_eq!(
        release(&mut c, "persist:readers", b"reader-one-000000000001"),
        1
    );
    acquire(
        &mut c,
        "persist:delayed",
        &["PX", "100", "LOCKDELAY", "100000"],
    )
    .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || {
            lock_info(&mut c, "persist:delayed")
                .is_some_and(|i| bytes_field(&i, "state").as_deref() == Some(&b"delayed"[..]))
        }),
        "the lease of persist:delayed did not end into its lock-delay"
    );
    // A session (LOCK.SREPL OPEN, RENEW) and a lock of it.
    let sid = "session-id-0000000000000001";
    let open = [
        "LOCK.SESSION",
        "OPEN",
        sid,
        "PX",
        "120000",
        "OWNER",
        "svc;s",
    ];
    assert_eq!(
        redis::cmd(open[0])
            .arg(&open[1..])
            .query::<i64>(&mut c)
            .unwrap(),
        1
    );
    acquire(
        &mut c,
        "persist:session",
        &["SESSION", sid, "TOKEN", "in-session-0000000001"],
    )
    .unwrap();
    let keepalive = ["KEEPALIVE", sid, "PX", "110000"];
    let kept: i64 = redis::cmd("LOCK.SESSION")
        .arg(&keepalive)
        .query(&mut c)
        .unwrap();
    assert_eq!(kept, 1);
    let readers = lock_info(&mut c, "persist:readers").unwrap();
    let delayed = lock_info(&mut c, "persist:delayed").unwrap();
    drop(c);
    s.kill9();
    let dir = s.dir.join("appendonlydir");
    let (mut split, mut ops) = (0, std::collections::BTreeSet::new());
    for (name, bytes) in aof_files(&s) {
        if !name.ends_with(".incr.aof") {
            continue;
        }
        let mut cmds = aof::commands(&bytes);
        for argv in &mut cmds {
            // LOCK.REPL key OP;fields -> OP fields; LOCK.SREPL OP;a;b -> OP a b.
            if let Some(op) = aof::split_op_word(argv) {
                ops.insert(op);
                split += 1;
            }
        }
        std::fs::write(dir.join(&name), aof::bytes(&cmds)).unwrap();
    }
    let want: std::collections::BTreeSet<String> = [
        "LOCK.REPL ADD",
        "LOCK.REPL RENEW",
        "LOCK.REPL DROP",
        "LOCK.REPL DELAY",
        "LOCK.SREPL OPEN",
        "LOCK.SREPL RENEW",
    ]
    .map(String::from)
    .into();
    assert_eq!(ops, want, "the ops of the AOF ({split} LOCK.REPL commands)");
    s.restart();
    check_locks(&s, &snap);
    let mut c = s.conn();
    let r = lock_info(&mut c, "persist:readers").unwrap();
    assert_eq!(bytes_field(&r, "mode").as_deref(), Some(&b"shared"[..]));
    assert_eq!(int_field(&r, "holders"), 1);
    // The reader left is the same holder (its fence; a shared lock's fences are its
    // holders').
    let first_holder = |i: &Info| match i.get("holder-list") {
        Some(Value::Array(hs)) => hs.first().cloned(),
        other => panic!("holder-list {other:?}"),
    };
    let fence_of = |h: Option<Value>| match h {
        Some(Value::Array(kv)) if kv.len() > 1 => kv[1].clone(),
        other => panic!("holder {other:?}"),
    };
    assert_eq!(fence_of(first_holder(&r)), fence_of(first_holder(&readers)));
    assert_eq!(
        release(&mut c, "persist:readers", b"reader-one-000000000001"),
        0
    );
    assert_eq!(
        release(&mut c, "persist:readers", b"reader-two-000000000002"),
        1
    );
    // The lock-delay still runs: nobody may take the key until it ends.
    let d = lock_info(&mut c, "persist:delayed").unwrap();
    assert_eq!(bytes_field(&d, "state"), bytes_field(&delayed, "state"));
    assert!(acquire(&mut c, "persist:delayed", &["PX", "1000"]).is_none());
    // The session came back with its label and the keepalive's lease, its lock with it.
    let info: Vec<Value> = redis::cmd("LOCK.SESSION")
        .arg(&["INFO", sid])
        .query(&mut c)
        .unwrap();
    let field = |name: &str| {
        let i = info
            .iter()
            .position(|v| *v == Value::BulkString(name.into()));
        i.and_then(|i| info.get(i + 1).cloned())
            .unwrap_or_else(|| panic!("no {name} in {info:?}"))
    };
    assert_eq!(field("owner"), Value::BulkString(b"svc;s".to_vec()));
    assert_eq!(field("lease"), Value::Int(110_000));
    assert_eq!(field("locks"), Value::Int(1));
    assert_eq!(
        release(&mut c, "persist:session", b"in-session-0000000001"),
        1
    );
}

#[test]
fn aof_rewrite_without_rdb_preamble_keeps_locks_across_kill9() {
    let mut s = debug_server()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .arg("aof-use-rdb-preamble", "no")
        .start();
    wait_persistence_idle(&s, IDLE_TIMEOUT);
    let snap = make_locks(&mut s.conn(), true);
    s.rewrite_aof(IDLE_TIMEOUT).unwrap();
    // The rewritten base file holds the module's own rewrite of every lock.
    let files = aof_files(&s);
    let base = files
        .iter()
        .find(|(n, _)| n.ends_with(".base.aof"))
        .unwrap_or_else(|| {
            panic!(
                "no .base.aof among {:?}",
                files.iter().map(|f| &f.0).collect::<Vec<_>>()
            )
        });
    for h in &snap.locks {
        assert!(
            contains(&base.1, h.key.as_bytes()),
            "{} missing from the rewritten {}",
            h.key,
            base.0
        );
    }
    assert!(
        contains(&base.1, b"LOCK.REPL"),
        "no LOCK.REPL in {}",
        base.0
    );
    assert!(!contains(&base.1, b"persist:released"));
    s.kill9();
    s.restart();
    check_locks(&s, &snap);
}

#[test]
fn rdb_save_keeps_locks_across_kill9() {
    let mut s = debug_server().start();
    let snap = make_locks(&mut s.conn(), true);
    let _: () = redis::cmd("SAVE").query(&mut s.conn()).unwrap();
    s.kill9();
    s.restart();
    check_locks(&s, &snap);
}

/// Lock commands count as changes for the `save` points (`save 1 1` here), so the server
/// snapshots a workload of lock commands by itself and a SIGKILL after that snapshot
/// keeps the locks. (They once counted only when something received the replication
/// stream: with no replica and no AOF, no snapshot was ever taken.)
#[test]
fn lock_writes_count_for_save_points_and_trigger_snapshots() {
    let mut s = debug_server().arg("save", "1 1").start();
    let save_time = |s: &Server| -> i64 {
        s.info_field("persistence", "rdb_last_save_time")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let t0 = save_time(&s);
    // Module commands only (a plain SET would count by itself).
    let mut held = Vec::new();
    {
        let mut c = s.conn();
        for i in 0..3 {
            let key = format!("persist:save:{i}");
            let (_, fence) = acquire(&mut c, &key, &["PX", "120000"]).unwrap();
            held.push((key, fence));
        }
    }
    let changes: i64 = s
        .info_field("persistence", "rdb_changes_since_last_save")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(
        changes > 0 || save_time(&s) > t0,
        "lock commands counted no change for the save points"
    );
    assert!(
        wait_until(IDLE_TIMEOUT, || save_time(&s) > t0
            && s.info_field("persistence", "rdb_changes_since_last_save")
                .as_deref()
                == Some("0")
            && s.info_field("persistence", "rdb_bgsave_in_progress")
                .as_deref()
                == Some("0")),
        "no snapshot after lock commands with save 1 1\n{}",
        s.log_tail()
    );
    s.kill9();
    s.restart();
    let mut c = s.conn();
    for (key, fence) in &held {
        let info = lock_info(&mut c, key).unwrap_or_else(|| panic!("{key} lost: no snapshot"));
        assert_eq!(int_field(&info, "fence"), *fence, "{key}");
    }
}

#[test]
fn fences_keep_rising_after_every_lock_was_released_and_the_server_restarted() {
    let mut s = ServerBuilder::new().start();
    let mut max_fence = 0;
    {
        let mut c = s.conn();
        for i in 0..5 {
            let key = format!("persist:clock:{i}");
            let (t, f) = acquire(&mut c, &key, &["PX", "60000"]).unwrap();
            max_fence = max_fence.max(f);
            assert_eq!(release(&mut c, &key, &t), 1);
        }
        let n = int(&mut c, &["DBSIZE"]);
        assert_eq!(n, 0);
        let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    }
    // Nothing but the RDB's counter remembers a fence, and the clock term (unix_ms << 10)
    // and the start-up jump keep the next one above the old ones.
    s.kill9();
    s.restart();
    let mut c = s.conn();
    let (_, f) = acquire(&mut c, "persist:clock:0", &["PX", "60000"]).unwrap();
    assert!(
        f > max_fence,
        "fence {f} after restart <= {max_fence} before"
    );
    assert!(
        (f as u64) >> 10 >= (unix_ms() as u64).saturating_sub(60_000),
        "fence {f} does not carry the clock term"
    );
}

/// The counter itself is in the RDB (module aux data): a counter pushed ahead of the
/// clock (MINFENCE, or a clock that was later set back) survives a restart from a
/// snapshot taken after every lock was released, where the clock term would not cover it.
#[test]
fn the_fence_counter_survives_an_rdb_restart_without_any_lock() {
    let mut s = debug_server().start();
    let far;
    {
        let mut c = s.conn();
        let ((t, f), floor) = acquire_far(&mut c, "persist:aux", &["PX", "60000"]);
        far = floor;
        assert!(f as u64 >= far);
        assert_eq!(release(&mut c, "persist:aux", &t), 1);
        let n = int(&mut c, &["DBSIZE"]);
        assert_eq!(n, 0);
        let _: () = redis::cmd("SAVE").query(&mut c).unwrap();
    }
    assert_counter_kept(&mut s, far, "RDB");
}

/// After a SIGKILL and a restart of `s` from its `what` file, the fence counter is at
/// `floor` or above, and so is the next grant's fence.
fn assert_counter_kept(s: &mut Server, floor: u64, what: &str) {
    s.kill9();
    s.restart();
    let mut c = s.conn();
    assert!(
        counter(&mut c) as u64 >= floor,
        "{what}: the counter came back below the floor {floor}"
    );
    let (_, next) = acquire(&mut c, "persist:after", &["PX", "60000"]).unwrap();
    assert!(
        next as u64 > floor,
        "{what}: after restart granted {next}, below the floor {floor}"
    );
}

// ------------------------------------------------------------------------------------
// DUMP / RESTORE

fn dump(c: &mut Connection, key: &str) -> Vec<u8> {
    let v: Option<Vec<u8>> = redis::cmd("DUMP").arg(key).query(c).unwrap();
    v.unwrap_or_else(|| panic!("DUMP {key} returned nil"))
}

/// A fresh server, a connection to it, and the DUMP of `key` taken there with `args`.
fn dumped(key: &str, args: &[&str]) -> (Server, Connection, Vec<u8>) {
    let s = ServerBuilder::new().start();
    let mut c = s.conn();
    acquire(&mut c, key, args).unwrap();
    let payload = dump(&mut c, key);
    (s, c, payload)
}

fn restore(
    c: &mut Connection,
    key: &str,
    ttl: i64,
    payload: &[u8],
    abs: bool,
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("RESTORE");
    cmd.arg(key).arg(ttl).arg(payload);
    if abs {
        cmd.arg("ABSTTL");
    }
    cmd.query(c)
}

#[test]
fn dump_restore_copies_a_lock_to_another_key_and_another_server() {
    let a = ServerBuilder::new().start();
    let b = ServerBuilder::new().start();
    let (mut ac, mut bc) = (a.conn(), b.conn());
    let src_args = [
        "PX",
        "60000",
        "TOKEN",
        "tok-dump-------------tok",
        "OWNER",
        "dumper",
    ];
    let ((token, fence), _) = acquire_far(&mut ac, "dump:src", &src_args);
    let t0 = unix_ms();
    let src = lock_info(&mut ac, "dump:src").unwrap();
    let payload = dump(&mut ac, "dump:src");

    // The payload carries the lease (its time left); the key's Redis expiry is whatever
    // RESTORE gives it: none here, an absolute one far past the lease on the other
    // server (the module does not use it; Redis would end the lock when it removes the
    // key).
    let far_at = unix_ms() + 3_600_000;
    for (c, key, ttl, abs) in [
        (&mut ac, "dump:copy", 0, false),
        (&mut bc, "dump:src", far_at, true),
    ] {
        restore(c, key, ttl, &payload, abs).unwrap();
        let info = lock_info(c, key).unwrap();
        assert_eq!(durable(&src), durable(&info), "{key}");
        assert_eq!(int_field(&info, "fence"), fence);
        assert_deadlines(&src, &info, unix_ms() - t0 + 5, key);
        assert_eq!(pexpiretime(c, key), if abs { far_at } else { -1 }, "{key}");
        let t: String = redis::cmd("TYPE").arg(key).query(c).unwrap();
        assert_eq!(t, "redislock");
        // Held: someone else cannot take it, the original token renews and releases.
        assert!(acquire(c, key, &["PX", "1000"]).is_none());
        assert_eq!(
            acquire(
                c,
                key,
                &["PX", "60000", "TOKEN", "tok-dump-------------tok"]
            ),
            Some((token.clone(), fence))
        );
        assert_eq!(release(c, key, &token), 1);
        assert!(!exists(c, key));
    }
    // The second server learned the fence from the payload: its next grant is above it.
    let (_, f) = acquire(&mut bc, "dump:fresh", &["PX", "1000"]).unwrap();
    assert!(
        f > fence,
        "fence {f} on the restoring server <= restored {fence}"
    );
}

#[test]
fn restore_refuses_corrupted_payloads() {
    let (_s, mut c, good) = dumped("dump:src", &["PX", "60000", "OWNER", "o"]);
    let mut bad: Vec<(String, Vec<u8>)> = Vec::new();
    for i in [0, 1, 5, 12, good.len() / 2, good.len() - 11, good.len() - 1] {
        let mut p = good.clone();
        p[i] ^= 0x5a;
        bad.push((format!("byte {i} flipped"), p));
    }
    for n in [0, 1, 10, good.len() / 2, good.len() - 10, good.len() - 1] {
        bad.push((format!("truncated to {n} bytes"), good[..n].to_vec()));
    }
    let mut longer = good.clone();
    longer.push(0);
    bad.push(("one byte appended".into(), longer));
    for (what, p) in &bad {
        let r = restore(&mut c, "dump:bad", 0, p, false);
        assert!(r.is_err(), "RESTORE accepted a payload with {what}: {r:?}");
        ping(&mut c);
        assert!(!exists(&mut c, "dump:bad"), "{what}: key created");
    }
    // The intact payload still restores.
    restore(&mut c, "dump:good", 60000, &good, false).unwrap();
    assert!(lock_info(&mut c, "dump:good").is_some());
}

#[test]
fn crc64_matches_the_redis_check_value() {
    // From Redis's crc64.c self-test.
    assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
}

/// What these tests need of a decoded payload besides the kit's [`ModuleDump`].
trait DumpExt {
    /// The 9-character type name packed into the upper 54 bits of the module id.
    fn type_name(&self) -> String;
    fn with_ops(&self, ops: Vec<Op>) -> ModuleDump;
    /// [`ModuleDump::encode`], optionally without the EOF marker (a fresh CRC64).
    fn encode_with(&self, eof: bool) -> Vec<u8>;
}

impl DumpExt for ModuleDump {
    fn type_name(&self) -> String {
        const CHARS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        (0..9)
            .map(|i| CHARS[((self.module_id >> (10 + 6 * (8 - i))) & 63) as usize] as char)
            .collect()
    }

    fn with_ops(&self, ops: Vec<Op>) -> ModuleDump {
        ModuleDump {
            ops,
            ..self.clone()
        }
    }

    fn encode_with(&self, eof: bool) -> Vec<u8> {
        let mut out = self.encode();
        if !eof {
            // The EOF opcode is the one byte before the version (2) and the CRC64 (8).
            out.truncate(out.len() - 11);
            out = sealed(out, self.rdb_version);
        }
        out
    }
}

/// `body` followed by the RDB version and its CRC64: a payload.
fn sealed(mut body: Vec<u8>, version: [u8; 2]) -> Vec<u8> {
    body.extend_from_slice(&version);
    let crc = crc64(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    body
}

/// The kit's decoding of a payload the server wrote, which must be well formed.
fn parse(p: &[u8]) -> ModuleDump {
    ModuleDump::parse(p).unwrap_or_else(|e| panic!("the real payload: {e}"))
}

/// The token's digest as stored (keyed BLAKE3, first 16 bytes): pinned in the module's
/// unit tests against the reference implementation; here only its length and that it is
/// not the token.
const DIGEST_LEN: usize = 16;

#[test]
fn dump_payload_layout_is_the_documented_field_stream() {
    let s = ServerBuilder::new().start();
    let mut c = s.conn();
    for (key, owner) in [("dump:o", Some("svc-owner")), ("dump:n", None)] {
        let mut opts = vec!["PX", "60000", "TOKEN", "tok-layout-----------tok"];
        if let Some(o) = owner {
            opts.extend(["OWNER", o]);
        }
        let (_, fence) = acquire(&mut c, key, &opts).unwrap();
        let info = lock_info(&mut c, key).unwrap();
        let payload = dump(&mut c, key);
        let left_after = int_field(&lock_info(&mut c, key).unwrap(), "ttl");
        let d = parse(&payload);
        assert_eq!(d.type_name(), "redislock");
        assert_eq!(d.encver(), 4);
        // mode (0: exclusive), holders, then the holder: digest, fence, the lease's time
        // left (ms, rounded up), acquired-at, client-id, client-addr, owner flag [owner],
        // lock-delay (ms), session flag [session digest]; then the time left of a running
        // lock-delay (0: none).
        let Op::Str(digest) = &d.ops[2] else {
            panic!("{key}: no digest in {:?}", d.ops)
        };
        // The time left when DUMP ran: between what LOCK.INFO showed just before and
        // just after it.
        let left = match d.ops[4] {
            Op::Uint(v) => v as i64,
            ref other => panic!("{key}: time left {other:?}"),
        };
        let left_before = int_field(&info, "ttl");
        assert!(
            left <= left_before && left >= left_after,
            "{key}: DUMP carries {left} ms left, LOCK.INFO showed {left_before} then {left_after}"
        );
        assert_eq!(digest.len(), DIGEST_LEN);
        assert!(
            !contains(&payload, b"tok-layout-----------tok"),
            "{key}: the token is in DUMP"
        );
        let mut want = vec![
            Op::Uint(0),
            Op::Uint(1),
            Op::Str(digest.clone()),
            Op::Uint(fence as u64),
            Op::Uint(left as u64),
            Op::Uint(int_field(&info, "acquired-at") as u64),
            Op::Uint(int_field(&info, "client-id") as u64),
            Op::Str(bytes_field(&info, "client-addr").unwrap()),
        ];
        match owner {
            Some(o) => {
                want.push(Op::Uint(1));
                want.push(Op::Str(o.as_bytes().to_vec()));
            }
            None => want.push(Op::Uint(0)),
        }
        want.push(Op::Uint(0));
        want.push(Op::Uint(0));
        want.push(Op::Uint(0));
        assert_eq!(d.ops, want, "{key}");
        // Our encoder reproduces the server's bytes exactly.
        assert_eq!(d.encode(), payload, "{key}: re-encoding differs");
    }
}

/// The same lock in the 0.1 release's encoding (version 1, token in clear, the lease's
/// end as an absolute unix-ms `expires_at`), built by hand from a current payload.
fn v1_of(real: &ModuleDump, token: &[u8], owner: &[u8], expires_at: u64) -> ModuleDump {
    let (fence, acq, cid, addr) = match real.ops.as_slice() {
        [_, _, _, f, _, a, c, Op::Str(addr), ..] => (f.clone(), a.clone(), c.clone(), addr.clone()),
        other => panic!("unexpected v3 layout {other:?}"),
    };
    ModuleDump {
        module_id: (real.module_id & !1023) | 1,
        ops: vec![
            Op::Str(token.to_vec()),
            fence,
            Op::Uint(expires_at),
            acq,
            Op::Uint(1),
            Op::Str(owner.to_vec()),
            cid,
            Op::Str(addr),
        ],
        rdb_version: real.rdb_version,
    }
}

/// The same value in release 0.2's encoding (version 2: the v4 fields of one holder
/// without its lock-delay, its session and the trailing delay, with the lease's end as
/// an absolute unix-ms `expires_at` where v4 has the time left).
fn v2_of(real: &ModuleDump, expires_at: u64) -> ModuleDump {
    let mut ops = real.ops.clone();
    assert!(matches!(ops[2], Op::Str(_)), "unexpected v4 layout {ops:?}");
    ops[4] = Op::Uint(expires_at);
    ops.truncate(ops.len() - 3);
    ModuleDump {
        module_id: (real.module_id & !1023) | 2,
        ops,
        rdb_version: real.rdb_version,
    }
}

fn assert_refused(c: &mut Connection, what: &str, payload: &[u8]) {
    let r = restore(c, "dump:hostile", 60000, payload, false);
    match &r {
        Err(e) => {
            eprintln!("{what}: {e}");
            assert!(e.code().is_some(), "{what}: error without a code: {e:?}")
        }
        Ok(v) => panic!("RESTORE accepted a payload with {what}: {v:?}"),
    }
    ping(c);
    assert!(!exists(c, "dump:hostile"), "{what}: key created");
    assert!(
        lock_info(c, "dump:hostile").is_none(),
        "{what}: LOCK.INFO shows a lock"
    );
}

#[test]
fn restore_refuses_hostile_payloads_with_a_valid_checksum() {
    let src = [
        "PX",
        "60000",
        "TOKEN",
        "tok-hostile----------tok",
        "OWNER",
        "own",
    ];
    let (s, mut c, real) = dumped("dump:src", &src);
    let real = parse(&real);
    // [mode, holders, digest, fence, time left, acquired-at, client-id, client-addr,
    //  owner-flag, owner, lock-delay, session-flag, delay left]
    assert_eq!(real.ops.len(), 13);
    let ops = real.ops.clone();
    let set = |i: usize, op: Op| {
        let mut o = ops.clone();
        o[i] = op;
        real.with_ops(o)
    };
    let drop_at = |i: usize| {
        let mut o = ops.clone();
        o.remove(i);
        real.with_ops(o)
    };
    let id_with = |module_id: u64| ModuleDump {
        module_id,
        ..real.clone()
    };
    // A second holder: the first one again (same digest and fence), or with its own.
    let holder = ops[2..ops.len() - 1].to_vec();
    let tail = ops[ops.len() - 1].clone();
    let two = |mode: Vec<Op>, second: Vec<Op>| {
        let mut o = mode;
        o.push(Op::Uint(2));
        o.extend(holder.clone());
        o.extend(second);
        o.push(tail.clone());
        real.with_ops(o)
    };
    let mut other = holder.clone();
    other[0] = Op::Str(vec![7; DIGEST_LEN]);
    other[1] = Op::Uint(match ops[3] {
        Op::Uint(f) => f + 1,
        _ => 1,
    });

    let mut hostile: Vec<(&str, Vec<u8>)> = vec![
        ("mode 3", set(0, Op::Uint(3)).encode()),
        ("0 holders", set(1, Op::Uint(0)).encode()),
        (
            "2 holders of an exclusive lock",
            two(vec![Op::Uint(0)], other.clone()).encode(),
        ),
        (
            "a duplicate holder",
            two(vec![Op::Uint(1)], holder.clone()).encode(),
        ),
        (
            "more holders than the limit",
            two(vec![Op::Uint(2), Op::Uint(1)], other.clone()).encode(),
        ),
        (
            "limit 0",
            two(vec![Op::Uint(2), Op::Uint(0)], other.clone()).encode(),
        ),
        (
            "a billion holders declared",
            set(1, Op::Uint(1 << 30)).encode(),
        ),
        ("empty digest", set(2, Op::Str(Vec::new())).encode()),
        ("15-byte digest", set(2, Op::Str(vec![1; 15])).encode()),
        (
            "10000-byte digest",
            set(2, Op::Str(vec![b'x'; 10000])).encode(),
        ),
        ("digest as an integer", set(2, Op::Uint(42)).encode()),
        ("fence 0", set(3, Op::Uint(0)).encode()),
        ("fence u64::MAX", set(3, Op::Uint(u64::MAX)).encode()),
        ("fence i64::MAX", set(3, Op::Uint(i64::MAX as u64)).encode()),
        ("fence as a string", set(3, Op::Str(b"7".to_vec())).encode()),
        (
            "client-id above i64::MAX",
            set(6, Op::Uint(u64::MAX)).encode(),
        ),
        (
            "1000-byte client-addr",
            set(7, Op::Str(vec![b'a'; 1000])).encode(),
        ),
        ("owner flag 7", set(8, Op::Uint(7)).encode()),
        ("session flag 2", set(11, Op::Uint(2)).encode()),
        ("session flag 1 without a session", {
            let mut o = ops.clone();
            o[11] = Op::Uint(1);
            real.with_ops(o).encode()
        }),
        ("a 15-byte session digest", {
            let mut o = ops.clone();
            o[11] = Op::Uint(1);
            o.insert(12, Op::Str(vec![3; 15]));
            real.with_ops(o).encode()
        }),
        ("owner flag 1 without an owner", drop_at(9).encode()),
        ("empty owner", set(9, Op::Str(Vec::new())).encode()),
        ("257-byte owner", set(9, Op::Str(vec![b'o'; 257])).encode()),
        (
            "truncated after the fence",
            real.with_ops(ops[..4].to_vec()).encode(),
        ),
        (
            "truncated after the fence, no EOF marker",
            real.with_ops(ops[..4].to_vec()).encode_with(false),
        ),
        ("no fields at all", real.with_ops(Vec::new()).encode()),
        ("an extra field after the owner", {
            let mut o = ops.clone();
            o.push(Op::Uint(1));
            real.with_ops(o).encode()
        }),
        ("no EOF marker", real.encode_with(false)),
        (
            "encoding version 5",
            id_with((real.module_id & !1023) | 5).encode(),
        ),
        (
            "encoding version 0",
            id_with(real.module_id & !1023).encode(),
        ),
        (
            "encoding version 1023",
            id_with(real.module_id | 1023).encode(),
        ),
        (
            "unknown module type name",
            id_with(real.module_id ^ (1 << 20)).encode(),
        ),
    ];
    // The 0.1 release's encoding (version 1) still loads (its tokens were not held to a
    // minimum length); hostile versions of it do not.
    let in_a_minute = (unix_ms() + 60_000) as u64;
    let v1 = v1_of(&real, b"tok-v1", b"own", in_a_minute);
    let v1_set = |i: usize, op: Op| {
        let mut o = v1.ops.clone();
        o[i] = op;
        v1.with_ops(o)
    };
    hostile.extend([
        ("v1: empty token", v1_set(0, Op::Str(Vec::new())).encode()),
        (
            "v1: 257-byte token",
            v1_set(0, Op::Str(vec![b't'; 257])).encode(),
        ),
        ("v1: fence 0", v1_set(1, Op::Uint(0)).encode()),
        ("v1: owner flag 7", v1_set(4, Op::Uint(7)).encode()),
        ("v1: truncated", v1.with_ops(v1.ops[..3].to_vec()).encode()),
    ]);
    // A huge declared string length with no bytes behind it.
    // (an empty last string without EOF, its one-byte length 0 made 0x80 + 4 bytes BE)
    let empty_last = [Op::Uint(0), Op::Uint(1), Op::Str(Vec::new())];
    let mut huge = real.with_ops(empty_last.to_vec()).encode_with(false);
    huge.truncate(huge.len() - 11);
    huge.push(0x80);
    huge.extend_from_slice(&(1u32 << 30).to_be_bytes());
    let huge = sealed(huge, real.rdb_version);
    hostile.push(("digest length 1 GiB with no bytes", huge));

    // The unmodified fields re-encoded restore fine, in all three encodings: the encoder
    // is not the reason for the refusals below. v1 and v2 carry the lease's end as a
    // unix-ms deadline, a minute from now: the restored lease ends then.
    restore(&mut c, "dump:control", 60000, &real.encode(), false).unwrap();
    assert!(lock_info(&mut c, "dump:control").is_some());
    let v2 = v2_of(&real, in_a_minute);
    for (key, payload) in [("dump:v1", v1.encode()), ("dump:v2", v2.encode())] {
        restore(&mut c, key, 60000, &payload, false).unwrap();
        let info = lock_info(&mut c, key).unwrap_or_else(|| panic!("{key} not restored"));
        let at = int_field(&info, "expires-at");
        assert!(
            (at - in_a_minute as i64).abs() <= 5,
            "{key}: expires-at {at}, the payload says {in_a_minute}"
        );
        assert_eq!(
            int_field(&info, "fence"),
            int_field(&lock_info(&mut c, "dump:control").unwrap(), "fence")
        );
    }
    // Release 0.3's encoding (version 3: no session field) restores as it was.
    let mut v3_ops = real.ops.clone();
    v3_ops.remove(11);
    let v3 = ModuleDump {
        module_id: (real.module_id & !1023) | 3,
        ops: v3_ops,
        rdb_version: real.rdb_version,
    };
    restore(&mut c, "dump:v3", 60000, &v3.encode(), false).unwrap();
    let v3_info = lock_info(&mut c, "dump:v3").unwrap_or_else(|| panic!("dump:v3 not restored"));
    assert_eq!(
        int_field(&v3_info, "fence"),
        int_field(&lock_info(&mut c, "dump:control").unwrap(), "fence")
    );
    assert_eq!(release(&mut c, "dump:v3", b"tok-hostile----------tok"), 1);
    assert_eq!(release(&mut c, "dump:v2", b"tok-hostile----------tok"), 1);
    assert_eq!(release(&mut c, "dump:v1", b"tok-hostile----------tok"), 0);
    assert_eq!(
        release(&mut c, "dump:v1", b"tok-v1"),
        1,
        "a v1 token releases"
    );

    for (what, payload) in &hostile {
        assert_refused(&mut c, what, payload);
    }
    // The server and the module still work.
    let (_, f) = acquire(&mut c, "dump:after", &["PX", "1000"]).unwrap();
    assert!(f > 0);
    assert!(s.log().contains("Ready to accept connections"));
}

/// A lease ends on its own, whatever Redis expiry the key has: none (RESTORE without a
/// TTL), a longer one (RESTORE with a TTL, PEXPIRE), or one removed again (PERSIST, which
/// on a lock key without one removes nothing). Once the lease has ended the lock is free,
/// and the next lock on that key does not inherit the old key's expiry.
#[test]
fn restored_lock_is_free_once_its_lease_ends_even_without_key_expiry() {
    let (_s, mut c, payload) = dumped(
        "dump:short",
        &["PX", "300", "TOKEN", "tok-short------------tok"],
    );
    restore(&mut c, "dump:forever", 0, &payload, false).unwrap();
    restore(&mut c, "dump:longer", 600_000, &payload, false).unwrap();
    // The same through plain key commands on a live lock.
    acquire(
        &mut c,
        "dump:persisted",
        &["PX", "300", "TOKEN", "tok-p----------------tok"],
    )
    .unwrap();
    assert_eq!(
        int(&mut c, &["PERSIST", "dump:persisted"]),
        0,
        "no expiry to remove"
    );
    assert_eq!(int(&mut c, &["PEXPIRE", "dump:persisted", "600000"]), 1);
    assert_eq!(int(&mut c, &["PERSIST", "dump:persisted"]), 1);
    acquire(
        &mut c,
        "dump:pexpired",
        &["PX", "300", "TOKEN", "tok-p----------------tok"],
    )
    .unwrap();
    assert_eq!(int(&mut c, &["PEXPIRE", "dump:pexpired", "600000"]), 1);
    std::thread::sleep(Duration::from_millis(400));
    for key in [
        "dump:forever",
        "dump:longer",
        "dump:persisted",
        "dump:pexpired",
    ] {
        let got = wait_until(Duration::from_secs(3), || {
            acquire(
                &mut c,
                key,
                &["PX", "1000", "TOKEN", "tok-new--------------tok"],
            )
            .is_some()
        });
        let info = lock_info(&mut c, key);
        assert!(
            got,
            "{key}: the lease ended but LOCK.ACQUIRE still finds it held \
             (PTTL {}, LOCK.INFO {info:?})",
            redis::cmd("PTTL").arg(key).query::<i64>(&mut c).unwrap()
        );
        assert_eq!(
            int(&mut c, &["PTTL", key]),
            -1,
            "{key}: the new lock has an expiry"
        );
    }
}

/// A quorum client's second round (an idempotent renew with MINFENCE) raises the fence
/// counter; the AOF, both as written live and as rewritten, must bring that back.
#[test]
fn a_counter_raised_by_a_renew_survives_aof_replay_and_rewrite() {
    for preamble in ["yes", "no"] {
        let mut s = debug_server()
            .arg("appendonly", "yes")
            .arg("appendfsync", "always")
            .arg("aof-use-rdb-preamble", preamble)
            .start();
        wait_persistence_idle(&s, IDLE_TIMEOUT);
        let mut c = s.conn();
        let floor = renew_with_floor(&mut c, "persist:floor", "600000");
        if preamble == "no" {
            s.rewrite_aof(IDLE_TIMEOUT).unwrap();
        }
        drop(c);
        assert_counter_kept(&mut s, floor, &format!("AOF, preamble {preamble}"));
    }
}

/// An AOF is read back as its commands: `LOCK.REPL` / `LOCK.SREPL` lines that a `;` in
/// an owner label or a unix-socket address could confuse load as they were written, and
/// malformed ones (an empty or unknown op word, a `;` first, missing or extra fields,
/// options without values) are refused one by one, with no panic and no key left
/// behind, while the lines after them still load.
#[test]
fn an_aof_with_ambiguous_and_malformed_changes_loads_what_is_well_formed() {
    use redis_lock_testkit::lock::{lock_stat, token_digest};
    let hex = |d: [u8; 16]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let mut s = ServerBuilder::new()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    // A grant written by the server itself: the incr file exists and is read.
    acquire(&mut s.conn(), "aof:first", &["PX", "120000"]).unwrap();
    s.kill9();
    let d = hex(token_digest(b"aof-ambiguous-token-1"));
    let sid = "aof-ambiguous-session-01";
    let sd = hex(token_digest(sid.as_bytes()));
    let fields = |fence: u32, addr: &str| format!("exclusive;{d};{fence};120000;1;7;{addr}");
    let add = |fence: u32, addr: &str| format!("ADD;{}", fields(fence, addr));
    let repl = |key: &str, args: &[&str]| -> Vec<Vec<u8>> {
        [&["LOCK.REPL", key][..], args]
            .concat()
            .iter()
            .map(|a| a.as_bytes().to_vec())
            .collect()
    };
    let srepl = |args: &[&str]| -> Vec<Vec<u8>> {
        [&["LOCK.SREPL"][..], args]
            .concat()
            .iter()
            .map(|a| a.as_bytes().to_vec())
            .collect()
    };
    let many = ";".repeat(10_000);
    let mut cmds = vec![
        vec![b"SELECT".to_vec(), b"0".to_vec()],
        // Well formed, with a `;` where a field could end.
        repl(
            "aof:unix",
            &[&add(5, "/tmp/a;b.sock:0"), "OWNER", "OWNER;x"],
        ),
        repl(
            "aof:old",
            &["ADD", &fields(6, "127.0.0.1:1"), "OWNER", "a;b"],
        ),
        srepl(&[&format!("OPEN;{sd};60000;60000"), "OWNER", ";"]),
        repl("aof:session", &[&add(7, "127.0.0.1:2"), "SESSION", &sd]),
    ];
    let bad: Vec<Vec<String>> = vec![
        vec![";".to_string()],
        vec![";;".into()],
        vec!["ADD;".into()],
        vec![format!(";{}", add(8, "a"))],
        vec![format!("add;{}", fields(8, "a"))],
        vec!["OWNER;x".into()],
        vec![format!("ADD;exclusive;{d};8;120000;1;7")],
        vec![add(0, "a")],
        vec![add(8, "a"), "OWNER".into()],
        vec![add(8, "a"), "extra".into()],
        vec![add(8, "a"), "FLOOR".into(), "0".into()],
        vec![add(8, "a"), "SESSION".into(), "nothex".into()],
        vec![add(8, "a"), "OWNER".into(), "".into()],
        vec!["ADD".into(), ";".into()],
        vec!["ADD".into(), fields(8, "a"), "RENEW".into()],
        vec!["DROP;".into()],
        vec!["DROP;0".into()],
        vec!["DELAY;".into()],
        vec!["DELAY;x".into()],
        vec!["RENEW;".into()],
        vec!["RENEW;8".into()],
        vec!["RENEW;8;x".into()],
        vec!["RENEW;8;1000;1".into()],
        vec!["RENEW;8;1000".into(), "OWNER".into(), "o".into()],
        vec![many.clone()],
    ];
    for (i, args) in bad.iter().enumerate() {
        let key = format!("aof:bad:{i}");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cmds.push(repl(&key, &args));
    }
    for args in [
        &[";"][..],
        &["END;"],
        &["END;zz"],
        &["MOVED;"],
        &["x"],
        &["OPEN", &sd],
        &[&format!("OPEN;{sd};1")],
        &[&format!("OPEN;{sd};-1;1")],
        &[&format!("OPEN;{sd};1;1"), "OWNER"],
        &[&format!("RENEW;{sd};1;1"), "OWNER", "x"],
        &[&format!("END;{sd};1")],
        &["SEEN;;;"],
        &[&many],
    ] {
        cmds.push(srepl(args));
    }
    cmds.push(repl("aof:last", &[&add(9, "127.0.0.1:3")]));
    let dir = s.dir.join("appendonlydir");
    let incr: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".incr.aof"))
        .collect();
    assert_eq!(incr.len(), 1, "{:?}", incr);
    let mut bytes = std::fs::read(incr[0].path()).unwrap();
    bytes.extend(aof::bytes(&cmds));
    std::fs::write(incr[0].path(), bytes).unwrap();
    s.restart();
    let mut c = s.conn();
    for key in ["aof:first", "aof:last", "aof:old", "aof:session"] {
        assert!(lock_info(&mut c, key).is_some(), "{key}\n{}", s.log_tail());
    }
    let unix = lock_info(&mut c, "aof:unix").expect("aof:unix");
    assert_eq!(
        bytes_field(&unix, "owner").as_deref(),
        Some(&b"OWNER;x"[..])
    );
    let holder = match unix.get("holder-list") {
        Some(Value::Array(hs)) => hs[0].clone(),
        other => panic!("holder-list {other:?}"),
    };
    let addr = match holder {
        Value::Array(kv) => kv
            .chunks(2)
            .find(|p| p[0] == Value::BulkString(b"client-addr".to_vec()))
            .map(|p| p[1].clone()),
        other => panic!("holder {other:?}"),
    };
    assert_eq!(addr, Some(Value::BulkString(b"/tmp/a;b.sock:0".to_vec())));
    let old = lock_info(&mut c, "aof:old").unwrap();
    assert_eq!(bytes_field(&old, "owner").as_deref(), Some(&b"a;b"[..]));
    let info: Vec<Value> = redis::cmd("LOCK.SESSION")
        .arg(&["INFO", sid])
        .query(&mut c)
        .unwrap();
    let at = info
        .iter()
        .position(|v| *v == Value::BulkString(b"owner".to_vec()));
    let owner = at.and_then(|i| info.get(i + 1));
    assert_eq!(owner, Some(&Value::BulkString(b";".to_vec())), "{info:?}");
    for (i, args) in bad.iter().enumerate() {
        let key = format!("aof:bad:{i}");
        assert!(!exists(&mut c, &key), "{key}: {args:?}");
    }
    let mut raw = common::RawConn::connect(s.port);
    assert_eq!(lock_stat(&mut raw, "panics"), 0);
}
