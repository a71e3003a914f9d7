//! The lock under the server's own operations, with waiters queued: write pauses
//! (CLIENT PAUSE, FAILOVER, SHUTDOWN waiting for replicas), cluster slot migration and
//! MIGRATE, key-moving commands (RENAME, MOVE, SWAPDB, RESTORE, COPY), expiry changes
//! (EXTEND, PEXPIRE, PERSIST), DEBUG RELOAD, CLIENT UNBLOCK / KILL, restarts that lose the
//! fence counter, and what DUMP / RDB / AOF / the replication stream reveal.
//!
//! Every test states the behaviour docs/commands.md promises in its table "Server
//! operations on a lock with waiters". The rule behind all of them: the module only
//! writes on its own (hand-off, revocation, reaping a stale lease) when the server may
//! write that key now; otherwise it tries again later, and a waiter is never answered
//! untruthfully.

mod common;

use common::raw::{acquire, grant, info_int, queued, wait_queued, Waiter};
use common::{contains, files_with, lock_stat, primary, start_replica_of, unix_ms, volatile_keys};
use common::{wait_until, Cluster, RawConn, Resp, Server, ServerBuilder, SETTLE};
use std::thread::sleep;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------
// Helpers

fn server() -> Server {
    ServerBuilder::new().start()
}

/// One command in RESP, for writing several in one go.
fn resp_command(args: &[&str]) -> Vec<u8> {
    let mut buf = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        buf.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    buf
}

fn ok() -> Resp {
    Resp::Simple("OK".into())
}

fn alive(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok_and(|s| {
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut c = RawConn::connect(port);
        c.set_read_timeout(Some(Duration::from_secs(2)));
        c.send(&["PING"]);
        matches!(c.read(), Ok(Resp::Simple(p)) if p == "PONG")
    })
}

fn assert_alive(srv: &Server, what: &str) {
    assert!(
        alive(srv.port),
        "the server died during {what}\n{}",
        srv.log_tail()
    );
}

/// The current holder's fence of `key`, None when free.
fn holder_fence(c: &mut RawConn, key: &str) -> Option<i64> {
    info_int(c, key, "fence")
}

/// Fences are `max(last + 1, unix_ms << SHIFT, ...)`: how many fence units one
/// millisecond of the clock term is worth on this server, read off a fresh grant.
fn fence_units_per_ms(fence: i64) -> i64 {
    let ratio = fence / unix_ms().max(1);
    // Round down to the power of two the shift gives.
    1i64 << (63 - ratio.max(1).leading_zeros())
}

/// A MINFENCE a few seconds of clock ahead of `fence` (the last fence issued), which
/// the server accepts: it waits until its clock has moved on by as much, so that the
/// lift stays within any bound the server puts on MINFENCE's lead over its clock, and is
/// still more than a restart takes.
fn lift_ahead(fence: i64) -> i64 {
    const AHEAD_MS: i64 = 3000;
    sleep(Duration::from_millis(AHEAD_MS as u64 + 200));
    fence + AHEAD_MS * fence_units_per_ms(fence)
}

// ------------------------------------------------------------------------------------
// 1. Write pauses: CLIENT PAUSE WRITE / ALL, FAILOVER

/// A lease with a waiter ends while writes are paused. The server must survive, the
/// waiter must not be answered until the module may write, and then it gets a grant of
/// its own (its own token, a new fence) that nobody else can take.
fn pause_while_a_lease_with_a_waiter_ends(mode: &str) {
    let srv = server();
    let mut admin = RawConn::connect(srv.port);
    // The lease must outlast setting up the waiter (a connection, polled into the queue)
    // and end inside the pause: 1.5 s and a 4 s pause leave a loaded machine 1.5 s for
    // the first and the lease's end 2.5 s inside the second (300 ms and 1.5 s did not
    // leave it much of either).
    let (lease, pause) = (1_500u64, 4_000u64);
    let (fence, mut w) = held_with_waiter_blocking(&srv, &mut admin, "lk", lease, "20000");
    // The lease was granted before this, the pause is asked for after it.
    let paused_at = Instant::now();
    let pause_ms = pause.to_string();
    assert_eq!(admin.cmd(&["CLIENT", "PAUSE", &pause_ms, mode]), ok());
    // The lease ends (and its timer fires) inside the pause.
    sleep(Duration::from_millis(lease + 600).saturating_sub(paused_at.elapsed()));
    assert_alive(&srv, &format!("CLIENT PAUSE {mode} at the lease deadline"));
    let r = w.reply_within(Duration::from_secs(10));
    assert_alive(&srv, "the pause");
    let (wtok, wfence) =
        grant(&r.expect("the waiter got no reply after the pause")).expect("the waiter got nil");
    // `paused_at` was taken before the pause was asked for: no reply latency to allow.
    // The server times the pause on its cached millisecond clock (`mstime() + pause`,
    // ended when the cached time reaches it), so it can end up to a millisecond or two
    // before `pause` has passed on ours (3.9996 s was seen); a grant during the pause
    // would come at the lease's end, 2.5 s before this.
    assert!(
        paused_at.elapsed() >= Duration::from_millis(pause - 20),
        "the waiter was granted during the pause ({:?} after it was asked for)",
        paused_at.elapsed()
    );
    assert_eq!(
        wtok,
        b"w--------------------tok".to_vec(),
        "the waiter got someone else's token"
    );
    assert_ne!(wtok, HOLDER.as_bytes());
    assert!(wfence > fence, "fence {wfence} not above {fence}");
    let mut c = RawConn::connect(srv.port);
    assert_eq!(holder_fence(&mut c, "lk"), Some(wfence));
    assert_eq!(
        acquire(&mut c, "lk", &[]),
        None,
        "a third client got the lock too"
    );
}

redis_lock_testkit::cases!(pause_while_a_lease_with_a_waiter_ends:
    client_pause_write_while_a_lease_with_a_waiter_ends => "WRITE",
    client_pause_all_while_a_lease_with_a_waiter_ends => "ALL",
);

/// FAILOVER pauses writes while it waits for a replica to catch up; a stopped replica
/// keeps it waiting until its TIMEOUT aborts it. A lease with a waiter ends meanwhile.
#[test]
fn failover_waiting_for_a_stalled_replica_while_a_lease_with_a_waiter_ends() {
    let primary = primary().start();
    let mut replica = start_replica_of(&primary, ServerBuilder::new());
    let mut p = RawConn::connect(primary.port);
    let (fence, mut w) = held_with_waiter_blocking(&primary, &mut p, "lk", 400, "15000");
    // The primary must see the replica online before FAILOVER accepts it.
    assert!(
        wait_until(SETTLE, || common::info_map(&mut p, "replication")
            .get("slave0")
            .is_some_and(|s| s.contains("state=online"))),
        "the primary never saw its replica online"
    );
    // Stop the replica so that it acknowledges nothing, then write once more so that the
    // primary must wait for it.
    unsafe { libc::kill(replica.pid() as i32, libc::SIGSTOP) };
    assert_eq!(p.cmd(&["SET", "bump", "1"]), ok());
    let r = p.cmd(&[
        "FAILOVER",
        "TO",
        "127.0.0.1",
        &replica.port.to_string(),
        "TIMEOUT",
        "2000",
    ]);
    assert_eq!(r, ok(), "FAILOVER was not accepted: {r:?}");
    sleep(Duration::from_millis(1000));
    assert_alive(&primary, "FAILOVER's write pause at the lease deadline");
    // The failover times out and is aborted; the primary stays a primary.
    let reply = w.reply_within(Duration::from_secs(8));
    unsafe { libc::kill(replica.pid() as i32, libc::SIGCONT) };
    assert_alive(&primary, "the aborted FAILOVER");
    let (wtok, wfence) = grant(&reply.expect("the waiter got no reply")).expect("nil");
    assert_eq!(wtok, b"w--------------------tok".to_vec());
    assert!(wfence > fence);
    let mut p2 = RawConn::connect(primary.port);
    assert_eq!(holder_fence(&mut p2, "lk"), Some(wfence));
    // The replica, once running again, sees the same holder.
    let mut r = RawConn::connect(replica.port);
    assert!(
        wait_until(SETTLE, || holder_fence(&mut r, "lk") == Some(wfence)),
        "the replica does not show the waiter's grant"
    );
    replica.stop();
}

// ------------------------------------------------------------------------------------
// 2. Cluster slot migration and MIGRATE

fn node_id(c: &mut RawConn) -> String {
    c.cmd(&["CLUSTER", "MYID"]).text()
}

/// A held lock with a waiter is migrated to another master. The waiter on the old node
/// must never be granted there (the lock now lives on the new node): it gets an error
/// telling it to retry, the old node keeps no key in the slot, and the migration can be
/// completed.
#[test]
fn cluster_slot_migration_never_grants_on_the_old_node() {
    let cluster = Cluster::start(2);
    let key = "{mig}lock";
    let slot = common::key_slot(key.as_bytes()).to_string();
    let src = cluster.node_for_key(key);
    let dst = cluster.nodes.iter().find(|n| n.port != src.port).unwrap();
    let mut s = RawConn::connect(src.port);
    let mut d = RawConn::connect(dst.port);
    let (_, fence) = acquire(&mut s, key, &["PX", "60000", "OWNER", "holder"]).unwrap();
    let mut w = Waiter::send(src.port, 0, key, &["BLOCK", "20000"]);
    wait_queued(&mut s, key, 1);
    let (src_id, dst_id) = (node_id(&mut s), node_id(&mut d));
    assert_eq!(
        d.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &src_id]),
        ok()
    );
    assert_eq!(
        s.cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &dst_id]),
        ok()
    );
    let r = s.cmd(&[
        "MIGRATE",
        "127.0.0.1",
        &dst.port.to_string(),
        key,
        "0",
        "5000",
    ]);
    assert_eq!(r, ok(), "MIGRATE failed");
    let reply = w.reply_within(Duration::from_secs(5));
    assert_alive(src, "MIGRATE");
    match reply {
        Ok(Resp::Error(e)) => assert!(
            e.starts_with("TRYAGAIN") || e.starts_with("ASK") || e.starts_with("MOVED"),
            "the waiter should be told to retry elsewhere, got {e:?}"
        ),
        other => panic!("the waiter on the old node must get an error, got {other:?}"),
    }
    let count = |c: &mut RawConn| c.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot]).int();
    assert_eq!(count(&mut s), 0, "the old node wrote the lock back");
    assert_eq!(count(&mut d), 1);
    for c in [&mut d, &mut s] {
        let r = c.cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &dst_id]);
        assert_eq!(r, ok(), "CLUSTER SETSLOT NODE failed: {r:?}");
    }
    // The lock kept its holder on the new node.
    assert_eq!(holder_fence(&mut d, key), Some(fence));
}

/// Standalone MIGRATE of a lock with waiters: the lock now lives on the other server, so
/// the waiters here get an error (LOCKMOVED), never a grant.
#[test]
fn standalone_migrate_fails_the_waiters_and_watchers_instead_of_granting() {
    let a = server();
    let b = server();
    let mut ca = RawConn::connect(a.port);
    let (_, fence) = acquire(&mut ca, "lk", &["PX", "60000"]).unwrap();
    let mut w = Waiter::send(a.port, 0, "lk", &["BLOCK", "20000"]);
    wait_queued(&mut ca, "lk", 1);
    // A watcher of the holder's fence too.
    let mut watcher = RawConn::connect(a.port);
    watcher.send(&["LOCK.WATCH", "lk", "FENCE", &fence.to_string()]);
    assert!(wait_until(SETTLE, || lock_stat(&mut ca, "watchers") == 1));
    let r = ca.cmd(&[
        "MIGRATE",
        "127.0.0.1",
        &b.port.to_string(),
        "lk",
        "0",
        "5000",
    ]);
    assert_eq!(r, ok());
    match w.reply_within(Duration::from_secs(5)) {
        Ok(Resp::Error(e)) => assert!(e.starts_with("LOCKMOVED"), "{e}"),
        other => panic!("expected a LOCKMOVED error, got {other:?}"),
    }
    watcher.set_read_timeout(Some(Duration::from_secs(5)));
    match watcher.read() {
        Ok(Resp::Error(e)) => assert!(e.starts_with("LOCKMOVED"), "watcher: {e}"),
        other => panic!("expected a LOCKMOVED error for the watcher, got {other:?}"),
    }
    assert_eq!(ca.cmd(&["EXISTS", "lk"]).int(), 0);
    let mut cb = RawConn::connect(b.port);
    assert_eq!(holder_fence(&mut cb, "lk"), Some(fence));
}

// ------------------------------------------------------------------------------------
// 3. Fences never go back across a restart

/// MINFENCE lifts the counter ahead of the clock; the lift is lost with everything
/// written after the last RDB save. The restarted server must still issue a larger fence.
#[test]
fn fences_do_not_go_back_after_a_restart_from_an_older_rdb() {
    let mut srv = server();
    let mut c = RawConn::connect(srv.port);
    let (_, f1) = acquire(&mut c, "a", &["PX", "60000"]).unwrap();
    assert_eq!(c.cmd(&["SAVE"]), ok());
    let (f2, lifted) = lifted_and_released(&mut c, f1);
    assert_eq!(f2, lifted);
    drop(c);
    srv.kill9();
    srv.restart();
    assert_next_fence_above(&srv, f2);
}

/// Takes `b` with a MINFENCE lifted ahead of `fence` ([`lift_ahead`]) and releases it:
/// the fence it was granted, and the MINFENCE.
fn lifted_and_released(c: &mut RawConn, fence: i64) -> (i64, i64) {
    let lifted = lift_ahead(fence);
    let (tok, f2) = acquire(c, "b", &["PX", "60000", "MINFENCE", &lifted.to_string()])
        .expect("MINFENCE half an hour ahead must be accepted");
    let tok = std::str::from_utf8(&tok).unwrap();
    assert_eq!(c.cmd(&["LOCK.RELEASE", "b", tok]).int(), 1);
    (f2, lifted)
}

/// The next grant on `srv` (after a restart) has a fence above `f2`.
fn assert_next_fence_above(srv: &Server, f2: i64) {
    let mut c = RawConn::connect(srv.port);
    let (_, f3) = acquire(&mut c, "c", &[]).unwrap();
    assert!(f3 > f2, "fence went back after the restart: {f3} <= {f2}");
}

/// The same with an AOF rewritten without the RDB preamble while no lock is held.
#[test]
fn fences_do_not_go_back_after_an_aof_rewrite_without_preamble() {
    let mut srv = ServerBuilder::new()
        .arg("appendonly", "yes")
        .arg("aof-use-rdb-preamble", "no")
        .arg("appendfsync", "always")
        .start();
    let mut c = RawConn::connect(srv.port);
    let (_, f1) = acquire(&mut c, "a", &["PX", "60000"]).unwrap();
    let (f2, _) = lifted_and_released(&mut c, f1);
    assert_eq!(c.cmd(&["LOCK.FORCERELEASE", "a"]).int(), 1);
    srv.rewrite_aof(SETTLE).unwrap();
    drop(c);
    srv.stop();
    srv.restart();
    assert_next_fence_above(&srv, f2);
}

// ------------------------------------------------------------------------------------
// 4. CLIENT UNBLOCK racing a hand-off

/// `CLIENT UNBLOCK <waiter> TIMEOUT|ERROR` arrives in the same pipeline as the holder's
/// RELEASE, which hands the lock to that waiter. The waiter must get a reply, and the
/// reply must match the lock's state: a grant it really holds, or a refusal while it
/// holds nothing.
fn unblock_racing_a_handoff(reason: &str) {
    let srv = server();
    let mut admin = RawConn::connect(srv.port);
    let (_, mut w) = held_with_waiter_blocking(&srv, &mut admin, "lk", 60_000, "0");
    let wid = w.id.to_string();
    // Both commands in one write, so that the server reads and runs them together.
    let mut both = resp_command(&["LOCK.RELEASE", "lk", HOLDER]);
    both.extend(resp_command(&["CLIENT", "UNBLOCK", &wid, reason]));
    admin.send_raw(&both).expect("write both commands");
    assert_eq!(admin.read().unwrap().int(), 1, "RELEASE");
    let unblocked = admin.read().unwrap().int();
    let reply = w.reply_within(Duration::from_secs(5)).unwrap_or_else(|e| {
        panic!("the waiter got no reply (CLIENT UNBLOCK said {unblocked}): {e}")
    });
    sleep(Duration::from_millis(200));
    let mut c = RawConn::connect(srv.port);
    match reply {
        Resp::Array(_) => {
            let (t, f) = grant(&reply).unwrap();
            assert_eq!(t, b"w--------------------tok".to_vec());
            assert_eq!(holder_fence(&mut c, "lk"), Some(f), "the grant was revoked");
        }
        Resp::Nil | Resp::Error(_) => {
            let r = c.cmd(&["LOCK.RELEASE", "lk", "w--------------------tok"]);
            assert_eq!(r.int(), 0, "the waiter was refused but holds the lock");
        }
        other => panic!("unexpected reply {other:?}"),
    }
}

redis_lock_testkit::cases!(unblock_racing_a_handoff:
    client_unblock_timeout_racing_a_handoff_answers_the_waiter => "TIMEOUT",
    client_unblock_error_racing_a_handoff_answers_the_waiter => "ERROR",
);

// ------------------------------------------------------------------------------------
// 5. Shorter leases bring the hand-off forward

fn with_volatile_keys(srv: &Server, n: usize) {
    volatile_keys(&mut srv.conn(), "vk:", n, 600_000);
}

/// `change` shortens the lease of `lk` (held for 8 s by [`HOLDER`], one waiter) to about
/// 100 ms; the waiter must be served about then, not when the 8 s are over (the lease is
/// the module's, on its own timer: 50,000 volatile keys beside it change nothing).
fn shortened_lease_hands_off_early(change: &[&str]) {
    let srv = server();
    with_volatile_keys(&srv, 50_000);
    let mut c = RawConn::connect(srv.port);
    let (_, mut w) = held_with_waiter(&srv, &mut c, "lk", 8000);
    let t0 = Instant::now();
    let r = c.cmd(change);
    assert_eq!(r.int(), 1, "{change:?} answered {r:?}");
    let g = w.reply_within(Duration::from_secs(10)).expect("no reply");
    assert!(grant(&g).is_some(), "nil");
    let waited = t0.elapsed();
    assert!(
        waited < Duration::from_secs(3),
        "the waiter was served {waited:?} after the lease was cut to ~100 ms"
    );
}

#[test]
fn extend_to_a_shorter_lease_brings_the_handoff_forward() {
    shortened_lease_hands_off_early(&["LOCK.EXTEND", "lk", HOLDER, "PX", "100"]);
}

/// `PEXPIRE` on a lock key gives the key a Redis expiry, which the module does not use:
/// the lock ends when Redis removes the key. Redis's expiry is lazy and sampled (among
/// 50,000 other volatile keys it may take minutes to find this one), but any lookup of a
/// key past its expiry removes it: the waiter is served at once then, with a grant of its
/// own on a key with no Redis expiry. The lease itself did not end (not an expiry): the
/// key was removed (`lock_removed`).
#[test]
fn pexpire_to_a_shorter_ttl_ends_the_lock_when_redis_removes_the_key() {
    let srv = server();
    with_volatile_keys(&srv, 50_000);
    let mut c = RawConn::connect(srv.port);
    let t = "t--------------------tok";
    let (_, fence) = acquire(&mut c, "lk", &["PX", "8000", "TOKEN", t]).unwrap();
    let w_tok = "w--------------------tok";
    let mut w = Waiter::send(srv.port, 0, "lk", &["BLOCK", "20000", "TOKEN", w_tok]);
    wait_queued(&mut c, "lk", 1);
    let (expired, removed) = (lock_stat(&mut c, "expired"), lock_stat(&mut c, "removed"));
    assert_eq!(
        c.cmd(&["PTTL", "lk"]).int(),
        -1,
        "a module lock has no expiry"
    );
    assert_eq!(c.cmd(&["PEXPIRE", "lk", "100"]).int(), 1);
    sleep(Duration::from_millis(200));
    // A lookup finds the key past its expiry and removes it.
    let t0 = Instant::now();
    assert_eq!(c.cmd(&["EXISTS", "lk"]).int(), 0);
    let (got, f) = grant(&w.reply_within(Duration::from_secs(5)).expect("no reply"))
        .expect("the waiter got nil");
    let waited = t0.elapsed();
    assert!(
        waited < Duration::from_secs(2),
        "the waiter was served {waited:?} after Redis removed the key"
    );
    assert_eq!(got, w_tok.as_bytes());
    assert!(f > fence);
    assert_eq!(holder_fence(&mut c, "lk"), Some(f));
    assert_eq!(
        c.cmd(&["PTTL", "lk"]).int(),
        -1,
        "the new lock has an expiry"
    );
    assert_eq!(
        lock_stat(&mut c, "expired"),
        expired,
        "counted as a lease's end"
    );
    assert_eq!(lock_stat(&mut c, "removed"), removed + 1);
    // The old holder lost it.
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lk", t]).int(), 0);
}

/// PERSIST on a lock key removes nothing (it has no Redis expiry: 0), and after a
/// PEXPIRE it removes that expiry (1), never the lease: the waiter is served at the
/// lease deadline all the same.
#[test]
fn persist_does_not_extend_the_lease() {
    let srv = server();
    let mut c = RawConn::connect(srv.port);
    // 2 s: the waiter's queueing and the three commands come before the lease's end
    // on a loaded machine (500 ms need not leave room for them).
    acquire(&mut c, "lk", &["PX", "2000"]).unwrap();
    let mut w = Waiter::send(srv.port, 0, "lk", &["BLOCK", "20000"]);
    wait_queued(&mut c, "lk", 1);
    assert_eq!(c.cmd(&["PERSIST", "lk"]).int(), 0);
    assert_eq!(c.cmd(&["PEXPIRE", "lk", "600000"]).int(), 1);
    assert_eq!(c.cmd(&["PERSIST", "lk"]).int(), 1);
    // Granted at the lease deadline (a persisted lease would keep it past the 20 s wait).
    let t0 = Instant::now();
    assert!(grant(&w.reply()).is_some());
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

// ------------------------------------------------------------------------------------
// 6. SWAPDB

/// After `SWAPDB 0 1` the waiters of db 0 see db 1's keys and the other way round: a
/// queue whose key is now free is served at once, in both dbs.
#[test]
fn swapdb_serves_the_waiters_of_both_dbs() {
    let srv = server();
    let mut c0 = RawConn::connect(srv.port);
    let mut c1 = RawConn::connect(srv.port);
    assert_eq!(c1.cmd(&["SELECT", "1"]), ok());
    acquire(&mut c0, "a", &["PX", "30000"]).unwrap();
    acquire(&mut c1, "b", &["PX", "30000"]).unwrap();
    let mut wa = Waiter::send(srv.port, 0, "a", &["BLOCK", "20000"]);
    let mut wb = Waiter::send(srv.port, 1, "b", &["BLOCK", "20000"]);
    wait_queued(&mut c0, "a", 1);
    wait_queued(&mut c1, "b", 1);
    assert_eq!(c0.cmd(&["SWAPDB", "0", "1"]), ok());
    for (w, name) in [(&mut wa, "db 0"), (&mut wb, "db 1")] {
        let r = w
            .reply_within(Duration::from_secs(3))
            .unwrap_or_else(|e| panic!("the waiter of {name} was not served: {e}"));
        assert!(grant(&r).is_some(), "{name}: {r:?}");
    }
    // The swapped locks kept their holders in their new dbs.
    assert!(holder_fence(&mut c0, "b").is_some());
    assert!(holder_fence(&mut c1, "a").is_some());
}

// ------------------------------------------------------------------------------------
// 7. BLOCK values that cannot be scheduled

#[test]
fn block_values_that_cannot_be_scheduled_are_refused() {
    let srv = server();
    let mut c = RawConn::connect(srv.port);
    acquire(&mut c, "lk", &["PX", "60000"]).unwrap();
    for v in [
        "9223372036854775807",
        "18000000000000000",
        "9223372036854775",
    ] {
        let r = c.cmd(&["LOCK.ACQUIRE", "lk", "BLOCK", v]);
        match &r {
            Resp::Error(e) => assert!(
                e.starts_with("ERR") && e.contains("out of range"),
                "BLOCK {v}: {e}"
            ),
            other => panic!("BLOCK {v} must be refused, got {other:?}"),
        }
    }
    assert_eq!(lock_stat(&mut c, "wait_timeouts"), 0);
    // A long but schedulable wait still waits.
    let mut w = Waiter::send(srv.port, 0, "lk", &["BLOCK", "100000000000"]);
    wait_queued(&mut c, "lk", 1);
    assert!(
        w.reply_within(Duration::from_millis(300)).is_err(),
        "it answered at once"
    );
}

// ------------------------------------------------------------------------------------
// 8. No token in DUMP, RDB, AOF or the replication stream

const SECRET: &str = "tok-SECRET-5f1e0c7a9b";

#[test]
fn dump_does_not_reveal_the_token() {
    let srv = server();
    let mut c = RawConn::connect(srv.port);
    acquire(&mut c, "lk", &["PX", "60000", "TOKEN", SECRET]).unwrap();
    let dump = c.cmd(&["DUMP", "lk"]).bytes();
    assert!(!contains(&dump, SECRET.as_bytes()), "DUMP shows the token");
    // The capability still works: renew, extend, release; RESTORE keeps it working.
    assert!(acquire(&mut c, "lk", &["PX", "60000", "TOKEN", SECRET]).is_some());
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", "lk", SECRET, "PX", "60000"]).int(),
        1
    );
    let mut argv: Vec<Vec<u8>> = vec![b"RESTORE".to_vec(), b"copy".to_vec(), b"0".to_vec()];
    argv.push(dump);
    assert_eq!(c.cmd(&argv), ok());
    assert_eq!(c.cmd(&["LOCK.RELEASE", "copy", "wrong"]).int(), 0);
    assert_eq!(c.cmd(&["LOCK.RELEASE", "copy", SECRET]).int(), 1);
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lk", SECRET]).int(), 1);
}

#[test]
fn rdb_and_aof_files_do_not_reveal_the_token() {
    let srv = ServerBuilder::new()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let mut c = RawConn::connect(srv.port);
    acquire(
        &mut c,
        "lk",
        &["PX", "60000", "TOKEN", SECRET, "OWNER", "o"],
    )
    .unwrap();
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", "lk", SECRET, "PX", "50000"]).int(),
        1
    );
    assert_eq!(c.cmd(&["SAVE"]), ok());
    srv.rewrite_aof(SETTLE).unwrap();
    acquire(&mut c, "lk2", &["PX", "60000", "TOKEN", SECRET]).unwrap();
    let hits = files_with(&srv.dir, SECRET.as_bytes());
    assert!(hits.is_empty(), "the token is in {hits:?}");
}

/// What a replica receives (the RDB of a full sync, then the command stream) carries no
/// token; a promoted replica still accepts the token for RELEASE.
#[test]
fn the_replication_stream_does_not_reveal_the_token() {
    let primary = primary().start();
    let mut p = RawConn::connect(primary.port);
    acquire(&mut p, "before", &["PX", "60000", "TOKEN", SECRET]).unwrap();
    // Act as a replica by hand: SYNC, read the RDB, then the stream.
    use std::io::{Read, Write};
    let mut fake = std::net::TcpStream::connect(("127.0.0.1", primary.port)).unwrap();
    fake.write_all(b"*1\r\n$4\r\nSYNC\r\n").unwrap();
    fake.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 65536];
    let mut read_for = |seen: &mut Vec<u8>, d: Duration, until: &dyn Fn(&[u8]) -> bool| {
        let deadline = Instant::now() + d;
        while Instant::now() < deadline && !until(seen) {
            match fake.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
                Err(_) => {}
            }
        }
    };
    // The RDB of the full sync first (it ends with the EOF opcode and a checksum). Its
    // magic is REDIS, or VALKEY from Valkey 9 on (without it this waited all of SETTLE).
    read_for(&mut seen, SETTLE, &|s| {
        (contains(s, b"REDIS") || contains(s, b"VALKEY")) && s.len() > 100
    });
    read_for(&mut seen, Duration::from_millis(500), &|_| false);
    let rdb_len = seen.len();
    acquire(&mut p, "after", &["PX", "60000", "TOKEN", SECRET]).unwrap();
    assert_eq!(p.cmd(&["LOCK.EXTEND", "after", SECRET]).int(), 1);
    read_for(&mut seen, Duration::from_secs(2), &|_| false);
    assert!(
        rdb_len > 0 && seen.len() > rdb_len,
        "no stream after the RDB"
    );
    // The grant as LOCK.REPL ADD, the EXTEND as RENEW (the lease's time left), and no
    // PEXPIREAT: a module lock's key has no Redis expiry to replicate.
    let stream = &seen[rdb_len..];
    for want in [&b"LOCK.REPL"[..], b"ADD", b"exclusive;", b"RENEW"] {
        assert!(
            contains(stream, want),
            "no {:?} in the stream: {:?}",
            String::from_utf8_lossy(want),
            String::from_utf8_lossy(stream)
        );
    }
    assert!(
        !contains(stream, b"PEXPIREAT") && !contains(stream, b"pexpireat"),
        "a module lock's expiry in the stream: {:?}",
        String::from_utf8_lossy(stream)
    );
    assert!(
        !contains(&seen, SECRET.as_bytes()),
        "the replication stream shows the token"
    );

    let replica = start_replica_of(&primary, ServerBuilder::new());
    let mut r = RawConn::connect(replica.port);
    assert!(wait_until(SETTLE, || holder_fence(&mut r, "after").is_some()));
    assert_eq!(r.cmd(&["REPLICAOF", "NO", "ONE"]), ok());
    assert_eq!(r.cmd(&["LOCK.RELEASE", "after", SECRET]).int(), 1);
    assert_eq!(r.cmd(&["LOCK.RELEASE", "before", "nope"]).int(), 0);
    assert_eq!(r.cmd(&["LOCK.RELEASE", "before", SECRET]).int(), 1);
}

// ------------------------------------------------------------------------------------
// 9. LOCK.INFO is read-only; LOCK.ACQUIRE is flagged blocking

#[test]
fn lock_info_on_a_string_lock_does_not_change_its_encoding() {
    let srv = server();
    let mut c = RawConn::connect(srv.port);
    for (key, value, enc) in [("n", "12345", "int"), ("s", "short-token", "embstr")] {
        assert_eq!(c.cmd(&["SET", key, value, "PX", "60000"]), ok());
        assert_eq!(c.cmd(&["OBJECT", "ENCODING", key]).text(), enc);
        let info = c.cmd(&["LOCK.INFO", key]);
        assert_eq!(info.field("kind").map(|k| k.text()), Some("string".into()));
        assert_eq!(
            c.cmd(&["OBJECT", "ENCODING", key]).text(),
            enc,
            "LOCK.INFO changed the encoding of {key}"
        );
    }
}

#[test]
fn lock_acquire_carries_the_blocking_flag() {
    let srv = server();
    let mut c = RawConn::connect(srv.port);
    let info = c.cmd(&["COMMAND", "INFO", "lock.acquire"]);
    let flags = &info.items()[0].items()[2];
    let names: Vec<String> = flags.items().iter().map(Resp::text).collect();
    assert!(names.iter().any(|f| f == "blocking"), "flags: {names:?}");
}

// ------------------------------------------------------------------------------------
// Every other operation on a lock key with waiters (docs/commands.md, the table)

/// The holder's token in [`held_with_waiter_blocking`].
const HOLDER: &str = "holder---------------tok";

/// A lock `key` held for `ms` (token [`HOLDER`]) with one waiter queued (`BLOCK block`,
/// token `w`): the holder's fence and the waiter.
fn held_with_waiter_blocking(
    srv: &Server,
    c: &mut RawConn,
    key: &str,
    ms: u64,
    block: &str,
) -> (i64, Waiter) {
    let (_, fence) = acquire(c, key, &["PX", &ms.to_string(), "TOKEN", HOLDER]).unwrap();
    let w = Waiter::send(
        srv.port,
        0,
        key,
        &["BLOCK", block, "TOKEN", "w--------------------tok"],
    );
    wait_queued(c, key, 1);
    (fence, w)
}

/// [`held_with_waiter_blocking`] with BLOCK 20 s.
fn held_with_waiter(srv: &Server, c: &mut RawConn, key: &str, ms: u64) -> (i64, Waiter) {
    held_with_waiter_blocking(srv, c, key, ms, "20000")
}

/// A fresh server, a connection to it and [`held_with_waiter`] there.
fn server_held_with_waiter(key: &str, ms: u64) -> (Server, RawConn, i64, Waiter) {
    let srv = server();
    let mut c = RawConn::connect(srv.port);
    let (fence, w) = held_with_waiter(&srv, &mut c, key, ms);
    (srv, c, fence, w)
}

fn granted_within(w: &mut Waiter, d: Duration) -> (Vec<u8>, i64) {
    let r = w
        .reply_within(d)
        .unwrap_or_else(|e| panic!("the waiter was not served within {d:?}: {e}"));
    grant(&r).unwrap_or_else(|| panic!("the waiter got nil"))
}

fn still_waiting(w: &mut Waiter) {
    assert!(
        w.reply_within(Duration::from_millis(300)).is_err(),
        "the waiter was answered"
    );
}

#[test]
fn rename_frees_the_old_name_and_takes_the_lock_along() {
    let (srv, mut c, fence, mut w) = server_held_with_waiter("src", 60_000);
    // A waiter on the destination name, queued behind a lock held there.
    acquire(
        &mut c,
        "dst",
        &["PX", "60000", "TOKEN", "d--------------------tok"],
    )
    .unwrap();
    let mut wd = Waiter::send(srv.port, 0, "dst", &["BLOCK", "20000"]);
    wait_queued(&mut c, "dst", 1);
    assert_eq!(c.cmd(&["RENAME", "src", "dst"]), ok());
    // The old name is free: its waiter gets it.
    let (t, _) = granted_within(&mut w, Duration::from_secs(3));
    assert_eq!(t, b"w--------------------tok".to_vec());
    // The renamed lock keeps its holder under the new name; the waiter there waits on.
    assert_eq!(holder_fence(&mut c, "dst"), Some(fence));
    still_waiting(&mut wd);
    assert_eq!(c.cmd(&["LOCK.RELEASE", "dst", HOLDER]).int(), 1);
    assert!(grant(&wd.reply()).is_some());
}

/// A lock RENAMEd or MOVEd keeps its lease under the new name: it ends there, the key is
/// reclaimed (counted as expired), and a waiter queued on the new name is handed the lock
/// at the lease's end. Before, the engine lost track of the value: the key stayed in memory
/// for good and such a waiter waited out its BLOCK.
#[test]
fn a_renamed_or_moved_lock_still_ends_is_reclaimed_and_hands_over() {
    let srv = server();
    let mut c = RawConn::connect(srv.port);
    let expired = lock_stat(&mut c, "expired");
    for (key, to) in [("ren:a", "ren:b"), ("mv:a", "mv:a")] {
        acquire(
            &mut c,
            key,
            &["PX", "400", "TOKEN", "renamed--------------tok"],
        )
        .unwrap();
        if key == to {
            assert_eq!(c.cmd(&["MOVE", key, "4"]).int(), 1);
        } else {
            assert_eq!(c.cmd(&["RENAME", key, to]), ok());
        }
    }
    let mut c4 = RawConn::connect(srv.port);
    assert_eq!(c4.cmd(&["SELECT", "4"]), ok());
    assert!(
        wait_until(Duration::from_secs(5), || {
            c.cmd(&["EXISTS", "ren:b"]).int() == 0 && c4.cmd(&["EXISTS", "mv:a"]).int() == 0
        }),
        "a renamed or moved lock was never reclaimed"
    );
    assert_eq!(lock_stat(&mut c, "expired") - expired, 2);
    assert_eq!(lock_stat(&mut c, "held"), 0);
    // A waiter on the new name gets the lock when the renamed lease ends.
    acquire(
        &mut c,
        "ren:c",
        &["PX", "800", "TOKEN", "renamed--------------tok"],
    )
    .unwrap();
    assert_eq!(c.cmd(&["RENAME", "ren:c", "ren:d"]), ok());
    let started = Instant::now();
    let mut w = Waiter::send(
        srv.port,
        0,
        "ren:d",
        &[
            "PX",
            "5000",
            "TOKEN",
            "waiter---------------tok",
            "BLOCK",
            "10000",
        ],
    );
    // At the 800 ms lease's end, not the waiter's 10 s BLOCK: 6 s leave room for a
    // loaded machine's pauses (3 s left 2.2 s).
    let (t, _) = granted_within(&mut w, Duration::from_secs(8));
    assert_eq!(t, b"waiter---------------tok".to_vec());
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn another_type_moved_onto_a_queued_key_fails_its_waiters() {
    let (_srv, mut c, _, mut w) = server_held_with_waiter("lk", 60_000);
    assert_eq!(c.cmd(&["RPUSH", "list", "x"]).int(), 1);
    assert_eq!(c.cmd(&["RENAME", "list", "lk"]), ok());
    match w.reply_within(Duration::from_secs(3)) {
        Ok(Resp::Error(e)) => assert!(e.starts_with("WRONGTYPE"), "{e}"),
        other => panic!("expected WRONGTYPE, got {other:?}"),
    }
}

#[test]
fn move_to_another_db_frees_the_name() {
    let (srv, mut c, fence, mut w) = server_held_with_waiter("lk", 60_000);
    assert_eq!(c.cmd(&["MOVE", "lk", "3"]).int(), 1);
    granted_within(&mut w, Duration::from_secs(3));
    let mut c3 = RawConn::connect(srv.port);
    assert_eq!(c3.cmd(&["SELECT", "3"]), ok());
    assert_eq!(holder_fence(&mut c3, "lk"), Some(fence));
}

#[test]
fn copy_of_a_lock_is_refused_and_a_string_copied_onto_a_queued_key_is_waited_for() {
    let (_srv, mut c, fence, mut w) = server_held_with_waiter("lk", 400);
    let r = c.cmd(&["COPY", "lk", "lk2"]);
    assert!(r.is_error(), "COPY of a lock: {r:?}");
    assert_eq!(c.cmd(&["EXISTS", "lk2"]).int(), 0);
    // DEL the lock and COPY a classic string lock onto the name in one transaction: the
    // waiter now waits for the string lock.
    assert_eq!(c.cmd(&["SET", "s", "classic", "PX", "60000"]), ok());
    c.cmd(&["MULTI"]);
    c.cmd(&["DEL", "lk"]);
    c.cmd(&["COPY", "s", "lk"]);
    let exec = c.cmd(&["EXEC"]);
    assert_eq!(exec.items().len(), 2, "{exec:?}");
    still_waiting(&mut w);
    assert_eq!(holder_fence(&mut c, "lk"), None);
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lk", "classic"]).int(), 1);
    let (_, f) = granted_within(&mut w, Duration::from_secs(3));
    assert!(f > fence);
}

#[test]
fn restore_replace_onto_a_queued_key_keeps_or_frees_by_the_lease() {
    let srv = server();
    let mut c = RawConn::connect(srv.port);
    // A payload of a lock held for a minute, and one whose lease is already over.
    acquire(
        &mut c,
        "long",
        &["PX", "60000", "TOKEN", "l--------------------tok"],
    )
    .unwrap();
    acquire(
        &mut c,
        "short",
        &["PX", "50", "TOKEN", "s--------------------tok"],
    )
    .unwrap();
    let long = c.cmd(&["DUMP", "long"]).bytes();
    let short = c.cmd(&["DUMP", "short"]).bytes();
    sleep(Duration::from_millis(100));
    let (_, mut w) = held_with_waiter(&srv, &mut c, "lk", 60_000);
    let restore = |c: &mut RawConn, payload: &[u8]| {
        let argv: Vec<&[u8]> = vec![b"RESTORE", b"lk", b"0", payload, b"REPLACE"];
        c.cmd(&argv)
    };
    assert_eq!(restore(&mut c, &long), ok());
    still_waiting(&mut w);
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lk", HOLDER]).int(), 0, "replaced");
    // A restored lock whose lease is over is free: the waiter gets it.
    assert_eq!(restore(&mut c, &short), ok());
    granted_within(&mut w, Duration::from_secs(3));
}

#[test]
fn flush_async_serves_the_waiters() {
    for cmd in [
        &["FLUSHDB", "ASYNC"][..],
        &["FLUSHALL", "ASYNC"],
        &["FLUSHALL", "SYNC"],
    ] {
        let (_srv, mut c, _, mut w) = server_held_with_waiter("lk", 60_000);
        assert_eq!(c.cmd(cmd), ok());
        granted_within(&mut w, Duration::from_secs(3));
    }
}

#[test]
fn expire_to_a_later_time_does_not_extend_the_lease() {
    let (_srv, mut c, _, mut w) = server_held_with_waiter("lk", 500);
    assert_eq!(c.cmd(&["PEXPIRE", "lk", "600000"]).int(), 1);
    // At the 500 ms lease's end, not the key's 600 s expiry: a 10 s hang guard (3 s
    // left 2.5 s for a loaded machine's pauses), within the waiter's 20 s BLOCK.
    let t0 = Instant::now();
    granted_within(&mut w, Duration::from_secs(10));
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[test]
fn debug_reload_keeps_the_lock_and_its_waiters() {
    let (_srv, mut c, fence, mut w) = server_held_with_waiter("lk", 60_000);
    assert_eq!(c.cmd(&["DEBUG", "RELOAD"]), ok());
    still_waiting(&mut w);
    assert_eq!(holder_fence(&mut c, "lk"), Some(fence));
    assert_eq!(queued(&mut c, "lk"), 1);
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lk", HOLDER]).int(), 1);
    let (_, f) = granted_within(&mut w, Duration::from_secs(3));
    assert!(f > fence);
}

/// `CLIENT UNBLOCK` of a queued waiter: on Redis 7.4+ and Valkey it ends the wait (nil
/// for TIMEOUT, an UNBLOCKED error for ERROR) and the waiter leaves the queue; before
/// 7.4, where it can race a hand-off, LOCK.ACQUIRE waiters refuse it.
#[test]
fn client_unblock_of_a_queued_waiter() {
    let flavor = common::server_flavor();
    let supported = flavor.is_valkey() || flavor.at_least(7, 4);
    for reason in ["TIMEOUT", "ERROR"] {
        let (_srv, mut c, _, mut w) = server_held_with_waiter("lk", 60_000);
        let n = c
            .cmd(&["CLIENT", "UNBLOCK", &w.id.to_string(), reason])
            .int();
        if supported {
            assert_eq!(n, 1, "{flavor}: CLIENT UNBLOCK {reason}");
            let r = w.reply();
            match reason {
                "TIMEOUT" => assert_eq!(r, Resp::Nil),
                _ => assert!(
                    matches!(&r, Resp::Error(e) if e.starts_with("UNBLOCKED")),
                    "{r:?}"
                ),
            }
            assert_eq!(queued(&mut c, "lk"), 0);
        } else {
            assert_eq!(n, 0, "{flavor}: CLIENT UNBLOCK {reason} must be refused");
            still_waiting(&mut w);
            assert_eq!(queued(&mut c, "lk"), 1);
        }
    }
}

#[test]
fn client_kill_takes_a_waiter_out_of_the_queue() {
    let (srv, mut c, _, w) = server_held_with_waiter("lk", 60_000);
    let mut w2 = Waiter::send(
        srv.port,
        0,
        "lk",
        &["BLOCK", "20000", "TOKEN", "w2-------------------tok"],
    );
    wait_queued(&mut c, "lk", 2);
    assert_eq!(c.cmd(&["CLIENT", "KILL", "ID", &w.id.to_string()]).int(), 1);
    wait_queued(&mut c, "lk", 1);
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lk", HOLDER]).int(), 1);
    let (t, _) = granted_within(&mut w2, Duration::from_secs(3));
    assert_eq!(t, b"w2-------------------tok".to_vec());
}

/// SHUTDOWN waits for a lagging replica with writes paused (shutdown-timeout); a lease
/// with a waiter ends meanwhile. The server must exit cleanly, not crash.
#[test]
fn shutdown_waiting_for_a_replica_while_a_lease_with_a_waiter_ends() {
    let flavor = common::server_flavor();
    let mut primary = primary().arg("shutdown-timeout", "2").start();
    let mut replica = start_replica_of(&primary, ServerBuilder::new());
    let mut p = RawConn::connect(primary.port);
    assert!(wait_until(SETTLE, || common::info_map(
        &mut p,
        "replication"
    )
    .get("slave0")
    .is_some_and(|s| s.contains("state=online"))));
    acquire(&mut p, "lk", &["PX", "300"]).unwrap();
    let _w = Waiter::send(primary.port, 0, "lk", &["BLOCK", "20000"]);
    wait_queued(&mut p, "lk", 1);
    unsafe { libc::kill(replica.pid() as i32, libc::SIGSTOP) };
    assert_eq!(p.cmd(&["SET", "bump", "1"]), ok());
    p.send(&["SHUTDOWN"]);
    let exited = wait_until(Duration::from_secs(15), || !primary.is_running());
    unsafe { libc::kill(replica.pid() as i32, libc::SIGCONT) };
    let log = primary.log();
    assert!(
        exited,
        "{flavor}: the primary did not exit\n{}",
        primary.log_tail()
    );
    assert!(
        !log.contains("crashed by signal") && !log.contains("ASSERTION FAILED"),
        "{flavor}: the primary crashed during SHUTDOWN\n{}",
        primary.log_tail()
    );
    replica.stop();
}

/// CLUSTER FAILOVER: the primary pauses writes until its replica caught up (a lease with
/// a waiter ends meanwhile), then becomes a replica; its waiters get UNBLOCKED, never a
/// grant, and the new primary's fences are above the old ones.
#[test]
fn cluster_failover_with_a_waiter() {
    let cluster = Cluster::start(3);
    let key = "{fo}lock";
    let master = cluster.node_for_key(key);
    let mut m = RawConn::connect(master.port);
    let master_id = node_id(&mut m);
    let replica = ServerBuilder::new()
        .arg("cluster-enabled", "yes")
        .arg("cluster-config-file", "nodes.conf")
        .arg("cluster-node-timeout", "5000")
        .start();
    let mut r = RawConn::connect(replica.port);
    assert_eq!(
        r.cmd(&["CLUSTER", "MEET", "127.0.0.1", &master.port.to_string()]),
        ok()
    );
    assert!(
        wait_until(SETTLE, || r.cmd(&["CLUSTER", "REPLICATE", &master_id])
            == ok()),
        "CLUSTER REPLICATE failed"
    );
    assert!(wait_until(Duration::from_secs(30), || {
        common::info_map(&mut r, "replication")
            .get("master_link_status")
            .map(String::as_str)
            == Some("up")
    }));
    let in_cluster = |c: &mut RawConn, key: &str, args: &[&str]| {
        grant(&redis_lock_testkit::lock::acquire_in_cluster(
            c, key, args, SETTLE,
        ))
        .unwrap()
    };
    let (_, fence) = in_cluster(&mut m, key, &["PX", "500"]);
    let mut w = Waiter::send(master.port, 0, key, &["BLOCK", "20000"]);
    wait_queued(&mut m, key, 1);
    assert_eq!(r.cmd(&["CLUSTER", "FAILOVER"]), ok());
    let reply = w.reply_within(Duration::from_secs(15));
    assert_alive(master, "CLUSTER FAILOVER");
    match reply {
        Ok(Resp::Error(e)) => assert!(e.starts_with("UNBLOCKED"), "{e}"),
        // The failover may also complete after the lease ended and the waiter was
        // granted by the old primary: then the new primary has that grant.
        Ok(g @ Resp::Array(_)) => {
            let (_, f) = grant(&g).unwrap();
            assert!(
                wait_until(SETTLE, || holder_fence(&mut r, key) == Some(f)),
                "the grant did not reach the new primary"
            );
        }
        other => panic!("unexpected reply {other:?}"),
    }
    assert!(wait_until(Duration::from_secs(30), || {
        common::info_map(&mut r, "replication")
            .get("role")
            .map(String::as_str)
            == Some("master")
    }));
    let (_, f) = in_cluster(&mut r, "{fo}other", &[]);
    assert!(
        f > fence,
        "the new primary's fence {f} is not above {fence}"
    );
}
