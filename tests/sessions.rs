//! Sessions (issue 30 item 1): one lease for many locks. `LOCK.SESSION OPEN` a session,
//! `LOCK.ACQUIRE ... SESSION id` ties grants to it, one `KEEPALIVE` renews them all, and
//! its end (TTL, a bound connection gone, `CLOSE`) releases every lock at once, serving
//! waiters in FIFO order; replicated, persisted and carried by DUMP like the locks.

mod regress;

use regress::*;
use std::thread::sleep;
use std::time::{Duration, Instant};

const S: &str = "session-id-0000000001";

fn open(c: &mut RawConn, id: &str, extra: &[&str]) -> Resp {
    c.cmd(&[&["LOCK.SESSION", "OPEN", id], extra].concat())
}

fn in_session(c: &mut RawConn, key: &str, id: &str, extra: &[&str]) -> (Vec<u8>, i64) {
    granted(&c.cmd(&[&["LOCK.ACQUIRE", key, "SESSION", id], extra].concat()))
}

fn session_field(c: &mut RawConn, id: &str, field: &str) -> Option<Resp> {
    c.cmd(&["LOCK.SESSION", "INFO", id]).get(field)
}

fn pttl_ms(c: &mut RawConn, key: &str) -> i64 {
    info_opt(c, key, "ttl").unwrap_or(-1)
}

#[test]
fn one_keepalive_renews_every_lock_and_close_releases_them_all() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    assert_eq!(
        open(&mut c, S, &["PX", "2000", "OWNER", "job-7"]),
        Resp::Int(1)
    );
    // Opening again renews (0: it was open).
    assert_eq!(open(&mut c, S, &["PX", "2000"]), Resp::Int(0));
    let keys: Vec<String> = (0..10).map(|i| format!("lock:s{i}")).collect();
    let mut fences = Vec::new();
    const T0: &str = "retry-token-0000001";
    for (i, key) in keys.iter().enumerate() {
        let extra: &[&str] = match i {
            0 => &["TOKEN", T0],
            _ if i % 2 == 0 => &[],
            _ => &["SHARED"],
        };
        fences.push(in_session(&mut c, key, S, extra).1);
    }
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    k.check(
        session_field(&mut c, S, "locks") == Some(Resp::Int(10)),
        "INFO counts 10 locks".to_string(),
    );
    k.check(
        session_field(&mut c, S, "owner") == Some(Resp::Bulk(b"job-7".to_vec())),
        "owner label".to_string(),
    );
    // One keepalive moves every lock's lease.
    sleep(Duration::from_millis(1200));
    assert_eq!(
        c.cmd(&["LOCK.SESSION", "KEEPALIVE", S, "PX", "60000"]),
        Resp::Int(1)
    );
    for key in &keys {
        let ttl = pttl_ms(&mut c, key);
        k.check(
            ttl > 50_000,
            format!("{key}: ttl {ttl} after the keepalive"),
        );
    }
    // A retry names its session (and gets its fence again); a session lock is not
    // extended on its own.
    let (_, again) = in_session(&mut c, "lock:s0", S, &["TOKEN", T0]);
    k.check(again == fences[0], format!("retry fence {again}"));
    let retry = c.cmd(&["LOCK.ACQUIRE", "lock:s0", "TOKEN", T0]);
    k.check(
        matches!(&retry, Resp::Error(e) if e.starts_with("INSESSION")),
        format!("a retry without SESSION of a session lock: {retry:?}"),
    );
    let ext = c.cmd(&["LOCK.EXTEND", "lock:s0", T0, "PX", "1000"]);
    k.check(
        matches!(&ext, Resp::Error(e) if e.starts_with("INSESSION")),
        format!("EXTEND of a session lock: {ext:?}"),
    );
    // A waiter on one of them is served when the session closes.
    let mut w = conn(&s);
    w.send(&acq("lock:s2", &["PX", "5000", "BLOCK", "0"]));
    assert!(wait_until(SETTLE, || c
        .info_u64("lock", "lock_waiters")
        .unwrap_or(0)
        == 1));
    let released = c.cmd(&["LOCK.SESSION", "CLOSE", S]);
    k.check(
        released == Resp::Int(10),
        format!("CLOSE released {released:?} (10 locks)"),
    );
    let (_, fw) = granted(&w.read().unwrap());
    k.check(fw > fences[9], "the waiter's fence is above".to_string());
    for key in keys.iter().filter(|k| *k != "lock:s2") {
        k.check(info(&mut c, key) == Resp::Nil, format!("{key} released"));
    }
    k.check(
        c.cmd(&["LOCK.SESSION", "KEEPALIVE", S]) == Resp::Int(0),
        "a keepalive of a closed session answers 0".to_string(),
    );
    let nos = c.cmd(&["LOCK.ACQUIRE", "lock:x", "SESSION", S]);
    k.check(
        matches!(&nos, Resp::Error(e) if e.starts_with("NOSESSION")),
        format!("{nos:?}"),
    );
    alive(&s, &mut k, "after the session");
    k.finish();
}

#[test]
fn the_ttl_ends_every_lock_at_once_and_waiters_are_served_in_order() {
    let (s, mut c, _) = start(ServerBuilder::new());
    // 3 s: five grants and three waiters (each polled into the queue) must all come
    // before the session ends, which 400 ms need not leave on a loaded machine.
    assert_eq!(open(&mut c, S, &["PX", "3000"]), Resp::Int(1));
    for i in 0..5 {
        in_session(&mut c, &format!("lock:t{i}"), S, &[]);
    }
    // Three waiters on one key, in order.
    let mut ws: Vec<RawConn> = (0..3).map(|_| conn(&s)).collect();
    for (i, w) in ws.iter_mut().enumerate() {
        w.send(&acq("lock:t0", &["PX", "5000", "BLOCK", "20000"]));
        assert!(wait_until(SETTLE, || c
            .info_u64("lock", "lock_waiters")
            .unwrap_or(0)
            == i as u64 + 1));
    }
    let t0 = Instant::now();
    let (_, f1) = granted(&ws[0].read().unwrap());
    // Granted when the session ends (3 s after it opened), not at the 20 s BLOCK's end.
    let ended = t0.elapsed();
    assert!(ended < Duration::from_secs(10), "{ended:?}");
    for i in 1..5 {
        assert_eq!(info(&mut c, &format!("lock:t{i}")), Resp::Nil, "lock:t{i}");
    }
    assert_eq!(c.cmd(&["LOCK.SESSION", "INFO", S]), Resp::Nil);
    assert_eq!(c.info_u64("lock", "lock_sessions_expired").unwrap(), 1);
    // FIFO: the second waiter gets it after the first releases.
    let tok = ws[0].cmd(&["LOCK.INFO", "lock:t0"]);
    assert_eq!(tok.get("fence"), Some(Resp::Int(f1)));
    c.cmd(&["LOCK.FORCERELEASE", "lock:t0"]);
    let (_, f2) = granted(&ws[1].read().unwrap());
    assert!(f2 > f1);
}

#[test]
fn a_bound_session_ends_when_its_connection_closes_after_the_grace() {
    let s = ServerBuilder::new().start();
    let mut c = conn(&s);
    let mut owner = conn(&s);
    assert_eq!(
        open(&mut owner, S, &["PX", "60000", "BIND", "300"]),
        Resp::Int(1)
    );
    in_session(&mut owner, "lock:b1", S, &[]);
    in_session(&mut owner, "lock:b2", S, &[]);
    assert_eq!(session_field(&mut c, S, "bound"), Some(Resp::Int(1)));
    let mut w = conn(&s);
    w.send(&acq("lock:b1", &["PX", "5000", "BLOCK", "10000"]));
    assert!(wait_until(SETTLE, || c
        .info_u64("lock", "lock_waiters")
        .unwrap_or(0)
        == 1));
    let t0 = Instant::now();
    drop(owner);
    let (_, _) = granted(&w.read().unwrap());
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(5000),
        "the lock went {took:?} after the connection closed (grace 300 ms)"
    );
    assert_eq!(info(&mut c, "lock:b2"), Resp::Nil);
    // A keepalive within the grace period, from a new connection, keeps it.
    let mut a = conn(&s);
    open(
        &mut a,
        "session-id-0000000002",
        &["PX", "60000", "BIND", "2000"],
    );
    in_session(&mut a, "lock:b3", "session-id-0000000002", &[]);
    drop(a);
    sleep(Duration::from_millis(300));
    let mut again = conn(&s);
    assert_eq!(
        again.cmd(&["LOCK.SESSION", "KEEPALIVE", "session-id-0000000002"]),
        Resp::Int(1)
    );
    sleep(Duration::from_millis(2200));
    assert!(info(&mut c, "lock:b3").get("fence").is_some(), "rebound");
    drop(again);
    assert!(
        wait_until(SETTLE, || info(&mut c, "lock:b3") == Resp::Nil),
        "ended with the new connection"
    );
}

#[test]
fn replicas_restarts_and_dumps_keep_sessions_and_their_locks() {
    let mut p = primary()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let r = replica_of(&p, ServerBuilder::new());
    let mut c = conn(&p);
    assert_eq!(
        open(&mut c, S, &["PX", "60000", "OWNER", "svc"]),
        Resp::Int(1)
    );
    let (_, fa) = in_session(&mut c, "lock:r1", S, &[]);
    let (_, fb) = in_session(&mut c, "lock:r2", S, &["LIMIT", "3"]);
    assert_eq!(
        open(&mut c, "session-id-empty-0001", &["PX", "60000"]),
        Resp::Int(1)
    );
    caught_up(&p, &r);
    let mut rc = conn(&r);
    assert_eq!(info_int(&mut rc, "lock:r1", "fence"), fa);
    assert_eq!(session_field(&mut rc, S, "locks"), Some(Resp::Int(2)));
    // A keepalive reaches the replica's locks too.
    c.cmd(&["LOCK.SESSION", "KEEPALIVE", S, "PX", "90000"]);
    caught_up(&p, &r);
    assert!(pttl_ms(&mut rc, "lock:r2") > 80_000);
    // DUMP + RESTORE elsewhere: the lock names its session, which the other server learns.
    let dump = c.cmd(&["DUMP", "lock:r1"]);
    let other = ServerBuilder::new().start();
    let mut oc = conn(&other);
    assert_eq!(
        oc.cmd(&[b"RESTORE".as_slice(), b"lock:r1", b"0", &dump.bytes()]),
        ok()
    );
    assert_eq!(session_field(&mut oc, S, "locks"), Some(Resp::Int(1)));
    assert_eq!(oc.cmd(&["LOCK.SESSION", "CLOSE", S]), Resp::Int(1));
    assert_eq!(info(&mut oc, "lock:r1"), Resp::Nil);
    // RDB (SAVE) and AOF restarts keep both sessions, the empty one included.
    drop(rc);
    for how in ["rdb", "aof"] {
        if how == "rdb" {
            // SAVE is refused while a background save runs (the replica's sync, say).
            assert!(wait_until(SETTLE, || c.cmd(&["SAVE"]) == ok()), "SAVE");
        }
        drop(c);
        p.kill9();
        p.try_restart().unwrap();
        c = conn(&p);
        assert_eq!(holder_fences(&info(&mut c, "lock:r2")), vec![fb], "{how}");
        assert_eq!(
            session_field(&mut c, S, "locks"),
            Some(Resp::Int(2)),
            "{how}"
        );
        assert_eq!(
            session_field(&mut c, S, "owner"),
            Some(Resp::Bulk(b"svc".to_vec())),
            "{how}"
        );
        assert!(
            session_field(&mut c, "session-id-empty-0001", "ttl").is_some(),
            "{how}: the empty session"
        );
    }
    // Failover: the promoted replica ends the session on its own clock.
    let r = replica_of(&p, ServerBuilder::new());
    c.cmd(&["LOCK.SESSION", "KEEPALIVE", S, "PX", "500"]);
    caught_up(&p, &r);
    let mut rc = conn(&r);
    assert_eq!(rc.cmd(&["REPLICAOF", "NO", "ONE"]), ok());
    assert!(
        wait_until(SETTLE, || info(&mut rc, "lock:r1") == Resp::Nil),
        "the promoted replica ended the session's locks"
    );
    assert_eq!(rc.cmd(&["LOCK.SESSION", "INFO", S]), Resp::Nil);
}

#[test]
fn every_path_and_bad_input() {
    let s = paths::with_helper_module(ServerBuilder::new()).start();
    let mut c = conn(&s);
    paths::load_function_library(&mut c);
    let mut k = Checks::new();
    for (i, path) in paths::Path::ALL.into_iter().enumerate() {
        let id = format!("session-path-{i:08}");
        let key = format!("lock:p{i}");
        let r = paths::send(&mut c, path, &["LOCK.SESSION", "OPEN", &id, "PX", "60000"]);
        k.check(r == Resp::Int(1), format!("{}: OPEN {r:?}", path.name()));
        let r = paths::send(&mut c, path, &["LOCK.ACQUIRE", &key, "SESSION", &id]);
        k.check(
            grant(&r).is_some(),
            format!("{}: ACQUIRE {r:?}", path.name()),
        );
        let r = paths::send(&mut c, path, &["LOCK.SESSION", "KEEPALIVE", &id]);
        k.check(
            r == Resp::Int(1),
            format!("{}: KEEPALIVE {r:?}", path.name()),
        );
        let r = paths::send(&mut c, path, &["LOCK.SESSION", "CLOSE", &id]);
        k.check(r == Resp::Int(1), format!("{}: CLOSE {r:?}", path.name()));
        // BIND needs a connection: a script's or a module's call never disconnects (MULTI
        // and a pipeline run on the caller's own connection).
        let bound = format!("session-bind-{i:08}");
        let r = paths::send(
            &mut c,
            path,
            &["LOCK.SESSION", "OPEN", &bound, "BIND", "100"],
        );
        let on_connection = matches!(
            path,
            paths::Path::Direct | paths::Path::Pipelined | paths::Path::Multi
        );
        k.check(
            r.is_error() != on_connection,
            format!("{}: OPEN ... BIND {r:?}", path.name()),
        );
        k.check(
            info(&mut c, &key) == Resp::Nil,
            format!("{}: released", path.name()),
        );
    }
    for bad in [
        &["LOCK.SESSION"][..],
        &["LOCK.SESSION", "OPEN"],
        &["LOCK.SESSION", "OPEN", "short"],
        &["LOCK.SESSION", "NOPE", S],
        &["LOCK.SESSION", "OPEN", S, "PX", "0"],
        &["LOCK.SESSION", "OPEN", S, "PX", "1", "EX", "1"],
        &["LOCK.SESSION", "OPEN", S, "BIND", "-1"],
        &["LOCK.SESSION", "OPEN", S, "OWNER", ""],
        &["LOCK.SESSION", "INFO", S, "COUNT", "0"],
        &["LOCK.SESSION", "KEEPALIVE", S, "BIND", "5"],
        &["LOCK.ACQUIRE", "k", "SESSION", "short"],
        &["LOCK.ACQUIRE", "k", "SESSION", S, "PX", "100"],
        &["LOCK.SREPL", "OPEN", S, "1", "1"],
    ] {
        let r = c.cmd(bad);
        k.check(
            matches!(&r, Resp::Error(e) if starts_with_code(e)),
            format!("{bad:?}: {r:?}"),
        );
    }
    // The session id stays out of SLOWLOG.
    c.cmd(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    open(&mut c, "session-secret-000042", &["PX", "1000"]);
    c.cmd(&["LOCK.ACQUIRE", "k2", "SESSION", "session-secret-000042"]);
    let log = format!("{:?}", c.cmd(&["SLOWLOG", "GET", "10"]));
    k.check(!log.contains("session-secret-000042"), log);
    alive(&s, &mut k, "after bad input");
    k.finish();
}

fn starts_with_code(e: &str) -> bool {
    e.split(' ')
        .next()
        .is_some_and(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_uppercase()))
}

/// A keepalive that reaches a replica after the locks' old lease ran out on the
/// replica's clock (a replica lagging by more than the TTL) still renews them there: the
/// primary renewed them, and a replica promoted then must not grant them again.
#[test]
fn a_keepalive_reaching_a_lagging_replica_late_still_renews_its_locks() {
    let p = primary().start();
    let r = replica_of(&p, ServerBuilder::new());
    let mut c = conn(&p);
    let opened = Instant::now();
    assert_eq!(open(&mut c, S, &["PX", "3000"]), Resp::Int(1));
    in_session(&mut c, "lock:lag", S, &[]);
    caught_up(&p, &r);
    // The replica stalls past the old lease (to 1 s after it) while the primary renews
    // the session.
    let left = 3000 - i64::try_from(opened.elapsed().as_millis()).unwrap_or(3000);
    assert!(left > 500, "the setup took the whole lease");
    let secs = format!("{:.3}", (left + 1000) as f64 / 1000.0);
    let mut stall = Pending::send(r.port, &["DEBUG", "SLEEP", &secs]);
    sleep(Duration::from_millis(200));
    assert_eq!(
        c.cmd(&["LOCK.SESSION", "KEEPALIVE", S, "PX", "60000"]),
        Resp::Int(1)
    );
    assert_eq!(
        stall.reply_within(SETTLE).expect("DEBUG SLEEP"),
        Resp::Simple("OK".into())
    );
    caught_up(&p, &r);
    let mut rc = conn(&r);
    let ttl = pttl_ms(&mut rc, "lock:lag");
    assert!(
        ttl > 50_000,
        "the replica's lock after the keepalive: ttl {ttl}"
    );
    assert_eq!(rc.cmd(&["REPLICAOF", "NO", "ONE"]), ok());
    let again = rc.cmd(&["LOCK.ACQUIRE", "lock:lag", "PX", "1000"]);
    assert_eq!(again, Resp::Nil, "the promoted replica granted it again");
}

/// SWAPDB moves a session's locks with their db: a keepalive still renews them and
/// CLOSE still releases them.
#[test]
fn a_session_follows_its_locks_through_swapdb() {
    let (_s, mut c, mut k) = start(ServerBuilder::new());
    assert_eq!(open(&mut c, S, &["PX", "1500"]), Resp::Int(1));
    in_session(&mut c, "lock:sw", S, &[]);
    assert_eq!(c.cmd(&["SWAPDB", "0", "1"]), ok());
    assert_eq!(
        c.cmd(&["LOCK.SESSION", "KEEPALIVE", S, "PX", "60000"]),
        Resp::Int(1)
    );
    assert_eq!(c.cmd(&["SELECT", "1"]), ok());
    let ttl = pttl_ms(&mut c, "lock:sw");
    k.check(
        ttl > 50_000,
        format!("db 1 after SWAPDB and keepalive: ttl {ttl}"),
    );
    k.eq(
        session_field(&mut c, S, "locks"),
        Some(Resp::Int(1)),
        "INFO counts the swapped lock",
    );
    k.eq(
        c.cmd(&["LOCK.SESSION", "CLOSE", S]),
        Resp::Int(1),
        "CLOSE releases it",
    );
    k.eq(info(&mut c, "lock:sw"), Resp::Nil, "released in db 1");
    k.finish();
}

/// A full sync replaces a replica's sessions with its primary's: a session the replica
/// learned from a former primary (or one that ended on the primary while the replica
/// was away) is gone after it, so that a KEEPALIVE on the promoted replica answers 0
/// (the client's signal that its locks are gone) instead of 1.
#[test]
fn a_full_sync_drops_the_sessions_the_new_primary_does_not_have() {
    let a = primary().start();
    let b = primary().start();
    let r = replica_of(&a, ServerBuilder::new());
    let mut c = conn(&a);
    assert_eq!(open(&mut c, S, &["PX", "60000"]), Resp::Int(1));
    in_session(&mut c, "lock:old", S, &[]);
    caught_up(&a, &r);
    let mut rc = conn(&r);
    assert_eq!(session_field(&mut rc, S, "locks"), Some(Resp::Int(1)));
    // The replica follows b now: a full sync of b's data, which has no session.
    let mut bc = conn(&b);
    assert_eq!(bc.cmd(&["SET", "marker", "b"]), ok());
    let port = b.port.to_string();
    assert_eq!(rc.cmd(&["REPLICAOF", "127.0.0.1", &port]), ok());
    assert!(
        wait_until(SETTLE, || rc.cmd(&["GET", "marker"]) == bulk("b")),
        "the replica synced from b"
    );
    assert_eq!(rc.cmd(&["LOCK.SESSION", "INFO", S]), Resp::Nil);
    assert_eq!(rc.cmd(&["REPLICAOF", "NO", "ONE"]), ok());
    assert_eq!(
        rc.cmd(&["LOCK.SESSION", "KEEPALIVE", S]),
        Resp::Int(0),
        "the promoted replica kept a session its data has no lock of"
    );
}

/// An AOF rewritten without its RDB preamble names each holder's session with `SEEN`
/// (its lease and label; the locks untouched), not `OPEN`, which renews every lock of the
/// session: one `OPEN` per holder made the load open every lock of a session once per
/// lock (3000 locks in one session took 4.3 s to load on Redis 7.0, 10x that for 10000).
/// The restart keeps the session's lease, label and locks.
#[test]
fn an_aof_rewrite_without_preamble_names_sessions_without_renewing_them() {
    let mut p = primary()
        .arg("appendonly", "yes")
        .arg("aof-use-rdb-preamble", "no")
        .start();
    let mut c = conn(&p);
    assert_eq!(
        open(&mut c, S, &["PX", "60000", "OWNER", "rw"]),
        Resp::Int(1)
    );
    for i in 0..3 {
        in_session(&mut c, &format!("lock:aof{i}"), S, &[]);
    }
    p.rewrite_aof(SETTLE).unwrap();
    let dir = p.dir.join("appendonlydir");
    let base: Vec<u8> = std::fs::read_dir(&dir)
        .expect("appendonlydir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".base."))
        .flat_map(|e| std::fs::read(e.path()).unwrap_or_default())
        .collect();
    assert!(has(&base, b"SEEN"), "{}", String::from_utf8_lossy(&base));
    assert!(!has(&base, b"OPEN"), "{}", String::from_utf8_lossy(&base));
    drop(c);
    p.kill9();
    p.try_restart().unwrap();
    let mut c = conn(&p);
    assert_eq!(session_field(&mut c, S, "locks"), Some(Resp::Int(3)));
    assert_eq!(session_field(&mut c, S, "lease"), Some(Resp::Int(60000)));
    assert_eq!(
        session_field(&mut c, S, "owner"),
        Some(Resp::Bulk(b"rw".to_vec()))
    );
    assert_eq!(c.cmd(&["LOCK.SESSION", "KEEPALIVE", S]), Resp::Int(1));
    assert!(pttl_ms(&mut c, "lock:aof2") > 50_000);
}

/// A waiter in a session, queued behind a lock of the same session, is not granted
/// when CLOSE releases that lock: the session is closing, so it gets NOSESSION (it was
/// granted a lock of the closed session, held to the old deadline by nobody's session).
#[test]
fn close_does_not_grant_the_sessions_own_waiters() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    assert_eq!(open(&mut c, S, &["PX", "60000"]), Resp::Int(1));
    in_session(&mut c, "lock:own", S, &["TOKEN", &tok("own-1")]);
    let t2 = tok("own-2");
    let mut w = Pending::send(
        s.port,
        &[
            "LOCK.ACQUIRE",
            "lock:own",
            "SESSION",
            S,
            "TOKEN",
            &t2,
            "BLOCK",
            "10000",
        ],
    );
    wait_waiters(&mut c, "lock:own", 1);
    k.eq(
        c.cmd(&["LOCK.SESSION", "CLOSE", S]),
        Resp::Int(1),
        "CLOSE released one lock",
    );
    let r = w.reply_within(SETTLE).expect("the waiter's answer");
    k.err(&r, "NOSESSION", "the session's own waiter");
    k.eq(
        info(&mut c, "lock:own"),
        Resp::Nil,
        "nothing held after CLOSE",
    );
    k.finish();
}

/// A session that takes and releases many keys between keepalives does not keep their
/// names: 50,000 acquire/release pairs in one long session kept about 8 MB (every name
/// it ever locked) until the next keepalive.
#[test]
fn a_long_session_forgets_the_keys_it_released() {
    let (_s, mut c, _k) = start(ServerBuilder::new());
    assert_eq!(open(&mut c, S, &["PX", "86400000"]), Resp::Int(1));
    let used = |c: &mut RawConn| -> i64 {
        let Resp::Bulk(b) = c.cmd(&["INFO", "memory"]) else {
            panic!("INFO memory");
        };
        info_field(&String::from_utf8_lossy(&b), "used_memory")
            .and_then(|v| v.parse().ok())
            .expect("used_memory")
    };
    let before = used(&mut c);
    let pad = "p".repeat(100);
    for batch in 0..50 {
        for i in 0..1000 {
            let key = format!("lock:{batch}:{i}:{pad}");
            let t = tok(&format!("t{batch}-{i}"));
            c.queue(&["LOCK.ACQUIRE", &key, "SESSION", S, "TOKEN", &t]);
            c.queue(&["LOCK.RELEASE", &key, &t]);
        }
        c.flush().expect("send");
        for _ in 0..2000 {
            let r = c.read().expect("reply");
            assert!(!matches!(r, Resp::Error(_)), "{r:?}");
        }
    }
    let grown = used(&mut c) - before;
    assert!(grown < 2_000_000, "used_memory grew by {grown} bytes");
    assert_eq!(session_field(&mut c, S, "locks"), Some(Resp::Int(0)));
}

/// A session's end answers its waiters at once with NOSESSION (they could never be
/// granted in it): a waiter for several keys no longer holds the head of a free key's
/// queue until its other keys free up, and nobody else waits behind it for nothing.
#[test]
fn a_sessions_end_answers_its_waiters_at_once() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    assert_eq!(open(&mut c, S, &["PX", "60000"]), Resp::Int(1));
    take_px(&mut c, "lock:busy", &tok("other"), 60_000, &[]);
    let mut multi = Pending::send(
        s.port,
        &[
            "LOCK.ACQUIREALL",
            "2",
            "lock:free",
            "lock:busy",
            "SESSION",
            S,
            "BLOCK",
            "0",
        ],
    );
    wait_waiters(&mut c, "lock:busy", 1);
    let mut single = Pending::send(
        s.port,
        &["LOCK.ACQUIRE", "lock:busy", "SESSION", S, "BLOCK", "0"],
    );
    wait_waiters(&mut c, "lock:busy", 2);
    // The free key is not to be had while the doomed request stands first in its queue.
    k.eq(
        c.cmd(&["LOCK.ACQUIRE", "lock:free", "PX", "1000"]),
        Resp::Nil,
        "the free key while the session's request waits",
    );
    k.eq(c.cmd(&["LOCK.SESSION", "CLOSE", S]), Resp::Int(0), "CLOSE");
    for (what, p) in [("multi", &mut multi), ("single", &mut single)] {
        match p.reply_within(SETTLE) {
            Ok(r) => {
                k.err(&r, "NOSESSION", what);
            }
            Err(e) => {
                k.check(false, format!("{what}: no answer after CLOSE ({e})"));
            }
        }
    }
    k.check(
        grant(&c.cmd(&["LOCK.ACQUIRE", "lock:free", "PX", "1000"])).is_some(),
        "the free key after the session's end",
    );
    k.eq(
        waiters_of(&mut c, "lock:busy"),
        0,
        "nobody waits on the busy key",
    );
    k.finish();
}

fn waiters_of(c: &mut RawConn, key: &str) -> i64 {
    info_opt(c, key, "waiters").unwrap_or(0)
}

/// Sessions meet the other kinds of lock state: SHARED and LIMIT holders of a session
/// (taken one key or several at once) beside holders of their own, a lock-delay behind a
/// session's holder, a lock-delay running on a free key. An AOF rewritten without its
/// RDB preamble, replayed at restart, and a new replica's full sync carry all of it.
#[test]
fn session_shared_multi_key_and_delayed_locks_survive_rewrite_replay_and_full_sync() {
    let mut p = primary()
        .arg("appendonly", "yes")
        .arg("aof-use-rdb-preamble", "no")
        .start();
    let mut c = conn(&p);
    assert_eq!(
        open(&mut c, S, &["PX", "60000", "OWNER", "mix"]),
        Resp::Int(1)
    );
    in_session(
        &mut c,
        "lock:mx1",
        S,
        &[
            "SHARED",
            "LOCKDELAY",
            "5000",
            "TOKEN",
            "mix-token-000000001",
        ],
    );
    granted(&c.cmd(&acq(
        "lock:mx1",
        &[
            "SHARED",
            "PX",
            "60000",
            "TOKEN",
            "mix-token-000000002",
            "OWNER",
            "solo",
        ],
    )));
    let all = c.cmd(&[
        "LOCK.ACQUIREALL",
        "2",
        "lock:mx2",
        "lock:mx3",
        "MODES",
        "SHARED",
        "LIMIT=2",
        "SESSION",
        S,
        "LOCKDELAY",
        "3000",
        "TOKEN",
        "mix-token-000000003",
    ]);
    assert_eq!(all.items().len(), 2, "{all:?}");
    granted(&c.cmd(&acq(
        "lock:mx3",
        &["LIMIT", "2", "PX", "60000", "TOKEN", "mix-token-000000004"],
    )));
    // A lock-delay running on a key whose holder's lease ended.
    granted(&c.cmd(&acq("lock:mxd", &["PX", "50", "LOCKDELAY", "30000"])));
    assert!(wait_until(SETTLE, || {
        info(&mut c, "lock:mxd")
            .get("state")
            .and_then(|s| s.as_text())
            == Some("delayed".into())
    }));
    let keys = ["lock:mx1", "lock:mx2", "lock:mx3", "lock:mxd"];
    // The time left of a running lock-delay moves on: its state is what must arrive.
    let durable = |c: &mut RawConn, k: &str| {
        paths::durable_info(c, k).map(|f| {
            f.into_iter()
                .filter(|(n, _)| k != "lock:mxd" || n != "lock-delay")
                .collect::<Vec<_>>()
        })
    };
    let want: Vec<_> = keys.iter().map(|k| durable(&mut c, k)).collect();
    let check = |c: &mut RawConn, how: &str| {
        for (k, w) in keys.iter().zip(&want) {
            let got = durable(c, k);
            if let Err(e) = paths::same_state(w, &got) {
                panic!("{k} after {how}: {e}");
            }
        }
        let s = c.cmd(&["LOCK.SESSION", "INFO", S]);
        assert_eq!(s.get("locks"), Some(Resp::Int(3)), "{how}: {s:?}");
        assert_eq!(s.get("lease"), Some(Resp::Int(60000)), "{how}: {s:?}");
        assert_eq!(
            s.get("owner"),
            Some(Resp::Bulk(b"mix".to_vec())),
            "{how}: {s:?}"
        );
        let delay = info_int(c, "lock:mxd", "lock-delay");
        assert!(
            delay > 20_000,
            "{how}: the lock-delay runs on ({delay} ms left)"
        );
    };
    let r = replica_of(&p, ServerBuilder::new());
    caught_up(&p, &r);
    check(&mut conn(&r), "a full sync");
    // Started, or scheduled after the replica's sync.
    p.rewrite_aof(SETTLE).unwrap();
    drop(c);
    p.kill9();
    p.try_restart().unwrap();
    let mut c = conn(&p);
    check(&mut c, "an AOF rewrite replayed");
    assert_eq!(c.cmd(&acq("lock:mxd", &["PX", "1000"])), Resp::Nil);
    // The session's end ends its holders there and leaves the others.
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", S]), Resp::Int(3));
    assert_eq!(
        holder_fences(&info(&mut c, "lock:mx1")).len(),
        1,
        "the holder of its own stays"
    );
    assert_eq!(holder_fences(&info(&mut c, "lock:mx3")).len(), 1);
}

/// A keepalive from a script (or another module's call) has no connection to bind the
/// session to: it renews the lease, and the session's binding stays with connections. A
/// bound session whose connection closed, kept alive once from EVAL, is bound again by
/// the next keepalive from a connection, and ends when that one closes.
#[test]
fn a_keepalive_from_a_script_does_not_bind_the_session_to_the_script() {
    let s = ServerBuilder::new().start();
    let mut c = conn(&s);
    let id = "session-id-script-0001";
    let mut owner = conn(&s);
    assert_eq!(
        open(&mut owner, id, &["PX", "60000", "BIND", "300"]),
        Resp::Int(1)
    );
    in_session(&mut owner, "lock:sb1", id, &[]);
    drop(owner);
    let script = "return redis.call('LOCK.SESSION', 'KEEPALIVE', ARGV[1])";
    assert_eq!(c.cmd(&["EVAL", script, "0", id]), Resp::Int(1));
    let mut again = conn(&s);
    assert_eq!(again.cmd(&["LOCK.SESSION", "KEEPALIVE", id]), Resp::Int(1));
    drop(again);
    assert!(
        wait_until(SETTLE, || info(&mut c, "lock:sb1") == Resp::Nil),
        "the session outlived the connection of its last keepalive: {:?}",
        c.cmd(&["LOCK.SESSION", "INFO", id])
    );
}

/// A session that lost a lock to MIGRATE (a slot move; the command runs the same way
/// between two standalone servers) stays marked where it is kept: on the replica (which,
/// promoted, must not renew it either), after a restart from the RDB file (the mark is in
/// the auxiliary session record) and from the AOF (`LOCK.SREPL MOVED`). Its other lock
/// stays held to its lease all the while.
#[test]
fn a_session_that_lost_a_lock_to_migrate_stays_marked_on_replicas_and_restarts() {
    let sid = "session-id-moved-00001";
    for how in ["rdb", "aof", "rewrite"] {
        let mut p = match how {
            "aof" => primary()
                .arg("appendonly", "yes")
                .arg("appendfsync", "always")
                .start(),
            "rewrite" => primary()
                .arg("appendonly", "yes")
                .arg("aof-use-rdb-preamble", "no")
                .start(),
            _ => primary().start(),
        };
        let r = (how == "rdb").then(|| replica_of(&p, ServerBuilder::new()));
        let t = ServerBuilder::new().start();
        let mut c = conn(&p);
        assert_eq!(open(&mut c, sid, &["PX", "60000"]), Resp::Int(1));
        in_session(&mut c, "lock:mv-gone", sid, &[]);
        let (_, fk) = in_session(&mut c, "lock:mv-kept", sid, &[]);
        let port = t.port.to_string();
        assert_eq!(
            c.cmd(&["MIGRATE", "127.0.0.1", &port, "lock:mv-gone", "0", "5000"]),
            ok()
        );
        assert_eq!(
            c.cmd(&["LOCK.SESSION", "KEEPALIVE", sid]),
            Resp::Int(0),
            "{how}"
        );
        if let Some(r) = &r {
            let mut rc = conn(r);
            assert!(
                wait_until(SETTLE, || rc.cmd(&["LOCK.SESSION", "INFO", sid])
                    == Resp::Nil),
                "the replica learned the mark"
            );
        }
        if how == "rewrite" {
            // The rewritten AOF names the session (SEEN) and its mark (MOVED).
            p.rewrite_aof(SETTLE).unwrap();
        }
        drop(c);
        match how {
            "rdb" => save_and_restart(&mut p).unwrap(),
            _ => {
                p.kill9();
                p.try_restart().unwrap();
            }
        }
        let mut c = conn(&p);
        assert_eq!(
            holder_fences(&info(&mut c, "lock:mv-kept")),
            vec![fk],
            "{how}"
        );
        assert_eq!(
            c.cmd(&["LOCK.SESSION", "KEEPALIVE", sid]),
            Resp::Int(0),
            "{how}: after a restart"
        );
        assert_eq!(c.cmd(&["LOCK.SESSION", "INFO", sid]), Resp::Nil, "{how}");
        if let Some(r) = &r {
            // Synced again with the restarted primary before it is promoted.
            caught_up(&p, r);
            let mut rc = conn(r);
            assert_eq!(rc.cmd(&["REPLICAOF", "NO", "ONE"]), ok());
            assert_eq!(
                rc.cmd(&["LOCK.SESSION", "KEEPALIVE", sid]),
                Resp::Int(0),
                "the promoted replica"
            );
            assert_eq!(holder_fences(&info(&mut rc, "lock:mv-kept")), vec![fk]);
        }
    }
}
