//! Replication: a primary and a replica, both with the module. The replica must hold
//! exactly the primary's lock state (same fence, owner, acquired-at, and leases that end
//! no earlier than the primary's), refuse lock writes from clients, keep issuing greater
//! fences once promoted, and write what its primary sent into its own AOF.

mod common;

use common::conn::{
    acquire, acquire_far, assert_deadlines, counter, durable, exists, int, int_field, key_type,
    lock_info, pexpiretime, renew_with_floor, Info,
};
use common::{debug_server, primary, unix_ms, wait_until, words, Server, ServerBuilder};
use redis::{Connection, Value};
use std::time::Duration;

const SYNC_TIMEOUT: Duration = Duration::from_secs(15);

// ------------------------------------------------------------------------------------
// Helpers

/// Makes `replica` replicate `primary` (REPLICAOF as a command, so that a restart of the
/// replica comes up standalone) and waits for the link to be up.
fn replicate_from(replica: &Server, primary: &Server) {
    let mut c = replica.conn();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(primary.port)
        .query(&mut c)
        .unwrap();
    assert!(
        wait_until(SYNC_TIMEOUT, || replica
            .info_field("replication", "master_link_status")
            .as_deref()
            == Some("up")),
        "replica never linked up\n{}\n{}",
        replica.log_tail(),
        primary.log_tail()
    );
}

fn pair() -> (Server, Server) {
    let p = primary().start();
    let r = debug_server().start();
    replicate_from(&r, &p);
    (p, r)
}

fn offset(s: &Server, field: &str) -> i64 {
    s.info_field("replication", field)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1)
}

/// Waits until the replica has processed everything the primary has propagated so far.
fn wait_synced(primary: &Server, replica: &Server) {
    let target = offset(primary, "master_repl_offset");
    assert!(target > 0, "primary has no replication offset");
    assert!(
        wait_until(SYNC_TIMEOUT, || offset(replica, "slave_repl_offset")
            >= target),
        "replica did not reach offset {target} (at {})\n{}",
        offset(replica, "slave_repl_offset"),
        replica.log_tail()
    );
}

/// Asserts that the replica's copy of `key` equals the primary's: LOCK.INFO but the
/// deadlines and waiters ([`durable`]), TYPE, and neither copy with a Redis expiry. Each
/// lease on the replica ends no earlier than on the primary, and later by at most the
/// time since `since` (unix ms before the key's last change): the replica keeps the
/// lease it was sent on its own clock, from when it applied it (a primary streams to a
/// replica fresh from a diskless sync only after its first ACK, up to a second later).
/// Returns the primary's LOCK.INFO.
fn assert_same_lock(p: &mut Connection, r: &mut Connection, key: &str, since: i64) -> Info {
    let pi = lock_info(p, key).unwrap_or_else(|| panic!("{key} not held on the primary"));
    let ri = lock_info(r, key).unwrap_or_else(|| panic!("{key} not held on the replica"));
    assert_eq!(durable(&pi), durable(&ri), "LOCK.INFO {key} differs");
    assert_deadlines(&pi, &ri, unix_ms() - since + 5, key);
    let (pe, re) = (pexpiretime(p, key), pexpiretime(r, key));
    assert_eq!(
        (pe, re),
        (-1, -1),
        "PEXPIRETIME {key}: a module lock has no expiry"
    );
    assert_eq!(key_type(p, key), key_type(r, key), "TYPE {key} differs");
    pi
}

/// Once the replica caught up: its copy of `key` is the primary's
/// ([`assert_same_lock`]) with `fence`; the LOCK.INFO.
fn assert_replicated(
    (p, r): (&Server, &Server),
    pc: &mut Connection,
    rc: &mut Connection,
    key: &str,
    fence: i64,
    since: i64,
) -> Info {
    wait_synced(p, r);
    let info = assert_same_lock(pc, rc, key, since);
    assert_eq!(int_field(&info, "fence"), fence, "{key}");
    info
}

/// The replica's `expires-at` of `key`.
fn expires_at(r: &mut Connection, key: &str) -> i64 {
    int_field(&lock_info(r, key).expect("held"), "expires-at")
}

/// The `owner` of a LOCK.INFO is `owner`.
fn assert_owner(info: &Info, owner: &[u8]) {
    assert_eq!(info.get("owner"), Some(&Value::BulkString(owner.to_vec())));
}

fn err_code(r: redis::RedisResult<Value>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.code().unwrap_or("<none>").to_string(),
    }
}

// ------------------------------------------------------------------------------------
// Tests

#[test]
fn replica_mirrors_acquire_extend_relabel_renew_release_and_forcerelease() {
    let (p, r) = pair();
    let (mut pc, mut rc) = (p.conn(), r.conn());

    // ACQUIRE with an owner: every durable field, the lease and the type match.
    let t0 = unix_ms();
    let (tok, fence) = acquire(
        &mut pc,
        "repl:a",
        &words("PX 60000 TOKEN tok-a----------------tok OWNER svc-1"),
    )
    .unwrap();
    assert_eq!(tok, b"tok-a----------------tok");
    let info = assert_replicated((&p, &r), &mut pc, &mut rc, "repl:a", fence, t0);
    assert_owner(&info, b"svc-1");
    assert_eq!(key_type(&mut rc, "repl:a"), "redislock");
    let first_deadline = expires_at(&mut rc, "repl:a");

    // EXTEND: the replica gets the new lease.
    std::thread::sleep(Duration::from_millis(5));
    let t1 = unix_ms();
    let ext = int(
        &mut pc,
        &words("LOCK.EXTEND repl:a tok-a----------------tok PX 120000"),
    );
    assert_eq!(ext, 1);
    wait_synced(&p, &r);
    let info = assert_same_lock(&mut pc, &mut rc, "repl:a", t1);
    assert_eq!(int_field(&info, "fence"), fence, "EXTEND changed the fence");
    let extended = expires_at(&mut rc, "repl:a");
    assert!(
        extended > first_deadline + 50_000,
        "replica deadline {extended} not extended from {first_deadline}"
    );

    // Idempotent renew: same fence, new deadline, identical on the replica.
    let renewed = acquire(
        &mut pc,
        "repl:a",
        &words("PX 90000 TOKEN tok-a----------------tok OWNER svc-1"),
    )
    .unwrap();
    assert_eq!(renewed, (b"tok-a----------------tok".to_vec(), fence));
    assert_replicated((&p, &r), &mut pc, &mut rc, "repl:a", fence, t1);
    let renewed_deadline = expires_at(&mut rc, "repl:a");
    assert!(
        renewed_deadline < extended,
        "renew to 90 s should shorten the 120 s lease: {renewed_deadline} vs {extended}"
    );

    // EXTEND ... OWNER: the replica gets the new label; the fence stays.
    let ext = int(
        &mut pc,
        &words("LOCK.EXTEND repl:a tok-a----------------tok PX 90000 OWNER svc-2"),
    );
    assert_eq!(ext, 1);
    wait_synced(&p, &r);
    let info = lock_info(&mut rc, "repl:a").expect("the relabelled lock on the replica");
    assert_owner(&info, b"svc-2");
    assert_eq!(
        int_field(&info, "fence"),
        fence,
        "EXTEND OWNER changed the fence"
    );

    // RELEASE: gone on the replica.
    let rel = int(
        &mut pc,
        &["LOCK.RELEASE", "repl:a", "tok-a----------------tok"],
    );
    assert_eq!(rel, 1);
    wait_synced(&p, &r);
    assert!(
        !exists(&mut rc, "repl:a"),
        "released lock still on the replica"
    );
    assert!(lock_info(&mut rc, "repl:a").is_none());

    // FORCERELEASE: gone on the replica.
    let t2 = unix_ms();
    let (_, f2) = acquire(&mut pc, "repl:b", &["PX", "60000"]).unwrap();
    assert!(f2 > fence);
    wait_synced(&p, &r);
    let info = assert_same_lock(&mut pc, &mut rc, "repl:b", t2);
    assert_eq!(info.get("owner"), Some(&Value::Nil));
    let fr = int(&mut pc, &["LOCK.FORCERELEASE", "repl:b"]);
    assert_eq!(fr, 1);
    wait_synced(&p, &r);
    assert!(
        !exists(&mut rc, "repl:b"),
        "force-released lock still on the replica"
    );
}

#[test]
fn classic_string_lock_extend_reaches_replica_as_absolute_deadline() {
    let (p, r) = pair();
    let (mut pc, mut rc) = (p.conn(), r.conn());
    let set: Option<String> = redis::cmd("SET")
        .arg("repl:classic")
        .arg("classic-tok")
        .arg("NX")
        .arg("PX")
        .arg(5000)
        .query(&mut pc)
        .unwrap();
    assert_eq!(set.as_deref(), Some("OK"));
    let before = pexpiretime(&mut pc, "repl:classic");
    let ext = int(
        &mut pc,
        &["LOCK.EXTEND", "repl:classic", "classic-tok", "PX", "60000"],
    );
    assert_eq!(ext, 1);
    wait_synced(&p, &r);
    let (pe, re) = (
        pexpiretime(&mut pc, "repl:classic"),
        pexpiretime(&mut rc, "repl:classic"),
    );
    assert_eq!(pe, re, "PEXPIRETIME differs after EXTEND of a string lock");
    assert!(pe >= before + 50_000, "not extended: {before} -> {pe}");
    assert_eq!(key_type(&mut rc, "repl:classic"), "string");
    let v: String = redis::cmd("GET")
        .arg("repl:classic")
        .query(&mut rc)
        .unwrap();
    assert_eq!(v, "classic-tok");
    let ri = lock_info(&mut rc, "repl:classic").unwrap();
    assert_eq!(ri.get("kind"), Some(&Value::BulkString(b"string".to_vec())));
    assert_eq!(int_field(&ri, "expires-at"), pe);
    // A wrong token extends nothing and changes nothing on either side.
    let ext = int(
        &mut pc,
        &["LOCK.EXTEND", "repl:classic", "other", "PX", "1000"],
    );
    assert_eq!(ext, 0);
    wait_synced(&p, &r);
    assert_eq!(pexpiretime(&mut rc, "repl:classic"), pe);
}

/// `LOCK.ACQUIRE key args...` on a connection of its own to `s`, in a thread: the grant.
fn spawn_waiter(
    s: &Server,
    key: &'static str,
    args: Vec<&'static str>,
) -> std::thread::JoinHandle<Option<(Vec<u8>, i64)>> {
    let mut c = s.conn();
    std::thread::spawn(move || acquire(&mut c, key, &args))
}

/// `holder` takes `key` for `px` ms; a waiter queues behind it with `TOKEN waiter args`
/// (BLOCK 5000); `end` ends the hold (a RELEASE), or waits for nothing and lets the lease
/// end on the primary's timer. The waiter must be handed the lock with a larger fence, and
/// the replica must hold the same lock: its LOCK.INFO.
#[allow(clippy::too_many_arguments)]
fn hand_off(
    (p, r): (&Server, &Server),
    pc: &mut Connection,
    rc: &mut Connection,
    key: &'static str,
    px: &str,
    holder: &str,
    waiter: &'static str,
    args: &'static str,
    end: impl FnOnce(&mut Connection),
) -> Info {
    let t0 = unix_ms();
    let (_, fa) = acquire(pc, key, &["PX", px, "TOKEN", holder]).unwrap();
    let mut argv = vec!["TOKEN", waiter];
    argv.extend(words(args));
    argv.extend(["BLOCK", "5000"]);
    let w = spawn_waiter(p, key, argv);
    end(pc);
    let (tb, fb) = w
        .join()
        .unwrap()
        .unwrap_or_else(|| panic!("{waiter} was not handed {key}"));
    assert_eq!(tb, waiter.as_bytes());
    assert!(fb > fa, "hand-off fence {fb} <= {fa}");
    assert_replicated((p, r), pc, rc, key, fb, t0)
}

#[test]
fn handoff_to_blocked_waiter_reaches_replica() {
    let (p, r) = pair();
    let mut pc = p.conn();
    let mut rc = r.conn();

    // 1. Hand-off on RELEASE.
    let holder = "tok-a----------------tok";
    let release = |pc: &mut Connection| {
        assert!(
            wait_until(Duration::from_secs(5), || p
                .info_field("lock", "lock_waiters")
                .as_deref()
                == Some("1")),
            "waiter B never queued"
        );
        assert_eq!(int(pc, &["LOCK.RELEASE", "repl:h", holder]), 1);
    };
    let info = hand_off(
        (&p, &r),
        &mut pc,
        &mut rc,
        "repl:h",
        "60000",
        holder,
        "tok-b----------------tok",
        "OWNER waiter-b PX 60000",
        release,
    );
    assert_owner(&info, b"waiter-b");

    // 2. Hand-off when the holder's lease ends (granted from a timer, not a command).
    hand_off(
        (&p, &r),
        &mut pc,
        &mut rc,
        "repl:h2",
        "300",
        "tok-c----------------tok",
        "tok-d----------------tok",
        "PX 60000",
        |_| {},
    );
}

#[test]
fn promoted_replica_issues_fences_above_every_fence_of_the_old_primary() {
    let (p, r) = pair();
    let mut pc = p.conn();
    // A fence an hour ahead of the clock: the counter the replica learns from the
    // replication stream must hold it.
    let mut issued = Vec::new();
    let ((ta, fa), far) = acquire_far(&mut pc, "repl:p1", &["PX", "60000"]);
    assert!(fa as u64 >= far);
    issued.push(fa);
    let (tb, fb) = acquire(&mut pc, "repl:p2", &["PX", "60000"]).unwrap();
    issued.push(fb);
    let (_, fc) = acquire(&mut pc, "repl:p3", &["PX", "60000", "OWNER", "x"]).unwrap();
    issued.push(fc);
    // Free them all again: the replica then holds no lock that remembers a fence.
    for (k, t) in [("repl:p1", &ta), ("repl:p2", &tb)] {
        let n: i64 = redis::cmd("LOCK.RELEASE")
            .arg(k)
            .arg(t)
            .query(&mut pc)
            .unwrap();
        assert_eq!(n, 1);
    }
    let n = int(&mut pc, &["LOCK.FORCERELEASE", "repl:p3"]);
    assert_eq!(n, 1);
    wait_synced(&p, &r);

    let mut rc = r.conn();
    let max_issued = *issued.iter().max().unwrap();
    assert!(
        counter(&mut rc) as u64 >= max_issued as u64,
        "the replica's counter is below the primary's fences"
    );
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut rc)
        .unwrap();
    assert_eq!(
        r.info_field("replication", "role").as_deref(),
        Some("master")
    );
    for key in ["repl:p1", "repl:new"] {
        let (_, f) = acquire(&mut rc, key, &["PX", "60000"]).unwrap();
        assert!(
            f > max_issued,
            "promoted replica granted fence {f} for {key}, old primary issued up to {max_issued}"
        );
    }
}

#[test]
fn replica_refuses_lock_writes_and_answers_lock_info() {
    let (p, r) = pair();
    let mut pc = p.conn();
    let (tok, fence) = acquire(&mut pc, "repl:ro", &["PX", "60000", "OWNER", "o"]).unwrap();
    wait_synced(&p, &r);
    let mut rc = r.conn();

    let info = lock_info(&mut rc, "repl:ro").expect("LOCK.INFO on the replica");
    assert_eq!(int_field(&info, "fence"), fence);
    assert!(lock_info(&mut rc, "repl:none").is_none());

    let writes: Vec<redis::Cmd> = vec![
        redis::cmd("LOCK.ACQUIRE")
            .arg("repl:other")
            .arg("PX")
            .arg(1000)
            .clone(),
        redis::cmd("LOCK.ACQUIRE")
            .arg("repl:ro")
            .arg("PX")
            .arg(1000)
            .arg("BLOCK")
            .arg(1000)
            .clone(),
        redis::cmd("LOCK.RELEASE").arg("repl:ro").arg(&tok).clone(),
        redis::cmd("LOCK.EXTEND")
            .arg("repl:ro")
            .arg(&tok)
            .arg("PX")
            .arg(1000)
            .clone(),
        redis::cmd("LOCK.FORCERELEASE").arg("repl:ro").clone(),
    ];
    for (i, cmd) in writes.iter().enumerate() {
        let code = err_code(cmd.query(&mut rc));
        assert_eq!(code, "READONLY", "write command #{i} on the replica");
    }
    // LOCK.SYNC from an ordinary client is refused too (READONLY or the module's ERR).
    let r_sync: redis::RedisResult<Value> = redis::cmd("LOCK.SYNC")
        .arg("repl:ro")
        .arg("forged")
        .arg(1)
        .arg(unix_ms() + 60000)
        .arg(unix_ms())
        .arg(1)
        .arg("127.0.0.1:1")
        .query(&mut rc);
    assert!(r_sync.is_err(), "LOCK.SYNC accepted from a client");
    assert!(!exists(&mut rc, "repl:other"));
    // Nothing changed: the replica still mirrors the primary, with the same lease.
    let info2 = lock_info(&mut rc, "repl:ro").unwrap();
    assert_eq!(durable(&info), durable(&info2));
    // (expires-at is an estimate: two LOCK.INFO calls may differ by a few ms.)
    assert_deadlines(&info, &info2, 5, "repl:ro");
    let pong: String = redis::cmd("PING").query(&mut rc).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn blocked_waiters_fail_when_the_server_becomes_a_replica() {
    let other = primary().start();
    let s = primary().start();
    let mut sc = s.conn();
    acquire(&mut sc, "repl:w", &["PX", "60000"]).unwrap();
    let mut bc = s.conn();
    let waiter = std::thread::spawn(move || -> redis::RedisResult<Value> {
        redis::cmd("LOCK.ACQUIRE")
            .arg("repl:w")
            .arg("BLOCK")
            .arg(0)
            .query(&mut bc)
    });
    assert!(wait_until(Duration::from_secs(5), || s
        .info_field("lock", "lock_waiters")
        .as_deref()
        == Some("1")));
    replicate_from(&s, &other);
    let res = waiter.join().unwrap();
    // The server's own error (not our 10 s read timeout): `UNBLOCKED ...`.
    match &res {
        Err(e) => assert_eq!(
            e.code(),
            Some("UNBLOCKED"),
            "a waiter got {e:?} after its server became a replica"
        ),
        Ok(v) => panic!("a waiter got {v:?} after its server became a replica"),
    }
    assert!(wait_until(Duration::from_secs(5), || s
        .info_field("lock", "lock_waiters")
        .as_deref()
        == Some("0")));
    let pong: String = redis::cmd("PING").query(&mut s.conn()).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn replica_aof_keeps_replicated_locks_across_kill9_restart_standalone() {
    let mut p = primary().start();
    let mut r = ServerBuilder::new()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    replicate_from(&r, &p);
    // After a full sync the replica rewrites its AOF; let that finish first.
    common::wait_persistence_idle(&r, SYNC_TIMEOUT);

    let mut pc = p.conn();
    let t0 = unix_ms();
    let aof1_args = [
        "PX",
        "120000",
        "TOKEN",
        "tok-1----------------tok",
        "OWNER",
        "svc-aof",
    ];
    let ((_, f1), _) = acquire_far(&mut pc, "repl:aof1", &aof1_args);
    let (_, f2) = acquire(
        &mut pc,
        "repl:aof2",
        &["PX", "120000", "TOKEN", "tok-2----------------tok"],
    )
    .unwrap();
    let ext = int(
        &mut pc,
        &words("LOCK.EXTEND repl:aof2 tok-2----------------tok PX 150000"),
    );
    assert_eq!(ext, 1);
    wait_synced(&p, &r);
    let mut rc = r.conn();
    assert_same_lock(&mut pc, &mut rc, "repl:aof1", t0);
    assert_same_lock(&mut pc, &mut rc, "repl:aof2", t0);
    // What the replica holds is what its AOF must bring back.
    let before1 = lock_info(&mut rc, "repl:aof1").unwrap();
    let before2 = lock_info(&mut rc, "repl:aof2").unwrap();
    drop(rc);
    drop(pc);
    // The replica wrote what its primary sent (LOCK.REPL) into its own AOF.
    let aof_dir = r.dir.join("appendonlydir");
    let in_aof = std::fs::read_dir(&aof_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", aof_dir.display()))
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .any(|b| {
            b.windows(9).any(|w| w == b"LOCK.REPL") && b.windows(9).any(|w| w == b"repl:aof1")
        });
    assert!(in_aof, "no LOCK.REPL for repl:aof1 in the replica's AOF");

    p.kill9();
    r.kill9();
    r.restart();
    let mut rc = r.conn();
    assert_eq!(
        r.info_field("replication", "role").as_deref(),
        Some("master"),
        "restarted replica should be standalone"
    );
    // Replayed from the AOF, each lease ends no earlier than before the restart, and
    // later by at most the time since the grant (the AOF has each grant's whole lease).
    let later = unix_ms() - t0 + 5;
    for (key, before, fence) in [("repl:aof1", &before1, f1), ("repl:aof2", &before2, f2)] {
        let after = lock_info(&mut rc, key)
            .unwrap_or_else(|| panic!("{key} lost by the replica's AOF\n{}", r.log_tail()));
        assert_eq!(durable(before), durable(&after), "{key}");
        assert_deadlines(before, &after, later, key);
        assert_eq!(int_field(&after, "fence"), fence);
        assert_eq!(pexpiretime(&mut rc, key), -1, "{key}");
        assert_eq!(key_type(&mut rc, key), "redislock");
    }
    // The tokens came along: they still release.
    let n = int(
        &mut rc,
        &["LOCK.RELEASE", "repl:aof2", "tok-2----------------tok"],
    );
    assert_eq!(n, 1);
    // The fence counter was rebuilt from the AOF: above the far-future fence.
    let (_, f3) = acquire(&mut rc, "repl:aof3", &["PX", "1000"]).unwrap();
    assert!(
        f3 > f1.max(f2),
        "fence {f3} after restart <= {}",
        f1.max(f2)
    );
}

#[test]
fn a_renew_with_minfence_raises_the_promoted_replicas_counter() {
    let (p, r) = pair();
    let mut pc = p.conn();
    // A quorum client's second round: same token, a floor far above the clock term.
    let floor = renew_with_floor(&mut pc, "repl:floor", "60000");
    wait_synced(&p, &r);
    let mut rc = r.conn();
    assert!(
        counter(&mut rc) as u64 >= floor,
        "the replica did not learn the floor {floor}"
    );
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut rc)
        .unwrap();
    let (_, next) = acquire(&mut rc, "repl:after", &["PX", "60000"]).unwrap();
    assert!(
        next as u64 > floor,
        "promoted replica granted {next}, below the floor {floor} the primary had reached"
    );
}

// ------------------------------------------------------------------------------------
// The stream is skipped while nothing can receive it (no replica, no backlog, no AOF): a
// replica that starts listening later must still end up with every lock.

/// Longer than the module's once-a-second re-check of whether anything listens (it
/// decides from the first command on; a replica connecting or a fork turns it on at
/// once).
const STREAM_CHECK: Duration = Duration::from_millis(1300);

fn sync_partial_ok(s: &Server) -> i64 {
    s.info_field("stats", "sync_partial_ok")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1)
}

#[test]
fn a_replica_that_connects_later_gets_the_locks_granted_while_nothing_listened() {
    let p = primary().start();
    let mut pc = p.conn();
    std::thread::sleep(STREAM_CHECK);
    let t0 = unix_ms();
    let (t, f) = acquire(&mut pc, "later:a", &["PX", "60000", "OWNER", "before"]).unwrap();
    let r = ServerBuilder::new().start();
    replicate_from(&r, &p);
    let (_, g) = acquire(&mut pc, "later:b", &["PX", "60000"]).unwrap();
    assert!(g > f);
    wait_synced(&p, &r);
    let mut rc = r.conn();
    let a = assert_same_lock(&mut pc, &mut rc, "later:a", t0);
    assert_eq!(int_field(&a, "fence"), f);
    assert_same_lock(&mut pc, &mut rc, "later:b", t0);
    // Promoted, the replica accepts the token granted before it ever connected.
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut rc)
        .unwrap();
    let n: i64 = redis::cmd("LOCK.RELEASE")
        .arg("later:a")
        .arg(&t)
        .query(&mut rc)
        .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn a_replica_resuming_from_the_backlog_gets_what_was_granted_while_it_was_away() {
    let (p, r) = pair();
    let mut pc = p.conn();
    acquire(&mut pc, "away:0", &["PX", "60000"]).unwrap();
    wait_synced(&p, &r);
    // Cut the link and keep the replica from reconnecting: no replica is connected, only
    // the backlog remains, and the module looks again meanwhile.
    unsafe { libc::kill(r.pid() as i32, libc::SIGSTOP) };
    let killed = int(&mut pc, &["CLIENT", "KILL", "TYPE", "replica"]);
    assert_eq!(killed, 1);
    std::thread::sleep(STREAM_CHECK);
    let before = sync_partial_ok(&p);
    let t0 = unix_ms();
    let (_, f) = acquire(
        &mut pc,
        "away:1",
        &["PX", "60000", "TOKEN", "away-----------------tok"],
    )
    .unwrap();
    unsafe { libc::kill(r.pid() as i32, libc::SIGCONT) };
    assert!(
        wait_until(SYNC_TIMEOUT, || sync_partial_ok(&p) > before),
        "the replica did not resume from the backlog\n{}",
        r.log_tail()
    );
    wait_synced(&p, &r);
    let mut rc = r.conn();
    let info = assert_same_lock(&mut pc, &mut rc, "away:1", t0);
    assert_eq!(int_field(&info, "fence"), f);
}

#[test]
fn turning_the_aof_on_later_keeps_every_later_grant() {
    let mut s = ServerBuilder::new().start();
    let _keep = s.dir.clone();
    let mut c = s.conn();
    std::thread::sleep(STREAM_CHECK);
    let (_, f1) = acquire(&mut c, "aof:before", &["PX", "60000"]).unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("appendonly")
        .arg("yes")
        .query(&mut c)
        .unwrap();
    let (_, f2) = acquire(&mut c, "aof:after", &["PX", "60000", "OWNER", "o"]).unwrap();
    common::wait_persistence_idle(&s, SYNC_TIMEOUT);
    let (_, f3) = acquire(&mut c, "aof:last", &["PX", "60000"]).unwrap();
    drop(c);
    s.kill9();
    // The AOF was turned on by CONFIG SET, which a restart with the same arguments would
    // undo: load the directory with the AOF on.
    let s = ServerBuilder::new()
        .dir(s.dir.clone())
        .arg("appendonly", "yes")
        .start();
    let mut c = s.conn();
    for (key, fence) in [("aof:before", f1), ("aof:after", f2), ("aof:last", f3)] {
        let info = lock_info(&mut c, key).unwrap_or_else(|| panic!("{key} lost\n{}", s.log_tail()));
        assert_eq!(int_field(&info, "fence"), fence, "{key}");
    }
}
