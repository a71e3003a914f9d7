//! Shared (read-write) and counted (semaphore) locks against a real server: who may hold
//! a key together, FIFO with shared batching and no writer starvation, per-holder
//! tokens, leases, fences, RELEASE / EXTEND / renew, FORCERELEASE of one holder or all,
//! LOCK.INFO's holder list, mode errors, and replication / RDB / AOF / DUMP of both kinds.

mod common;

use common::raw::{acquire, acquire_reply, grant, queued, wait_queued, Waiter};
use common::{
    debug_server, primary, start_replica_of, wait_persistence_idle, wait_until, RawConn, Resp,
    ServerBuilder, SETTLE,
};

fn take(c: &mut RawConn, key: &str, args: &[&str]) -> i64 {
    acquire(c, key, args)
        .unwrap_or_else(|| panic!("{key} {args:?} was not granted"))
        .1
}

fn info(c: &mut RawConn, key: &str) -> Resp {
    c.cmd(&["LOCK.INFO", key])
}

fn int(r: &Resp, f: &str) -> i64 {
    match r.field(f) {
        Some(Resp::Int(i)) => i,
        other => panic!("field {f}: {other:?} in {r:?}"),
    }
}

fn holder_fences(c: &mut RawConn, key: &str) -> Vec<i64> {
    let r = info(c, key);
    if r == Resp::Nil {
        return Vec::new();
    }
    let list = r.field("holder-list").expect("holder-list");
    list.items().iter().map(|h| int(h, "fence")).collect()
}

#[test]
fn readers_share_and_a_writer_waits_for_all_of_them() {
    let srv = ServerBuilder::new().start();
    let mut c = RawConn::connect(srv.port);
    let r1 = take(
        &mut c,
        "rw",
        &["SHARED", "TOKEN", "r1", "OWNER", "reader-1"],
    );
    let r2 = take(&mut c, "rw", &["SHARED", "TOKEN", "r2"]);
    assert!(r2 > r1, "each holder gets its own, larger fence");
    // An exclusive acquire is the writer: it needs no holder at all.
    assert_eq!(acquire_reply(&mut c, "rw", &[]), Resp::Nil);
    let i = info(&mut c, "rw");
    assert_eq!(i.field("mode").unwrap().text(), "shared");
    assert_eq!(int(&i, "holders"), 2);
    assert_eq!(holder_fences(&mut c, "rw"), vec![r1, r2]);
    assert!(
        i.field("fence").is_none(),
        "no single fence for a shared lock"
    );
    for h in i.field("holder-list").unwrap().items() {
        for (k, v) in h.pairs() {
            assert!(
                k != "token" && v != Resp::Bulk(b"r1".to_vec()) && v != Resp::Bulk(b"r2".to_vec()),
                "LOCK.INFO shows a token: {h:?}"
            );
        }
    }
    // Per-holder RELEASE: the writer waits until the last reader is gone.
    let mut writer = Waiter::send(srv.port, 0, "rw", &["BLOCK", "10000", "TOKEN", "w"]);
    wait_queued(&mut c, "rw", 1);
    assert_eq!(c.cmd(&["LOCK.RELEASE", "rw", "r1"]).int(), 1);
    assert!(writer.waiting());
    assert_eq!(
        c.cmd(&["LOCK.RELEASE", "rw", "r1"]).int(),
        0,
        "already released"
    );
    assert_eq!(c.cmd(&["LOCK.RELEASE", "rw", "r2"]).int(), 1);
    let w = writer.granted();
    assert!(w > r2);
    let i = info(&mut c, "rw");
    assert_eq!(i.field("mode").unwrap().text(), "exclusive");
    assert_eq!(int(&i, "fence"), w);
}

/// A queued writer blocks every reader that arrives after it (no writer starvation);
/// when it releases, the readers queued behind it are granted together, up to the next
/// writer in line.
#[test]
fn fifo_with_shared_batching_and_no_writer_starvation() {
    let srv = ServerBuilder::new().start();
    let mut c = RawConn::connect(srv.port);
    take(&mut c, "q", &["SHARED", "TOKEN", "r0"]);
    let mut w1 = Waiter::send(srv.port, 0, "q", &["BLOCK", "10000", "TOKEN", "w1"]);
    wait_queued(&mut c, "q", 1);
    // A reader arriving after the writer waits, although readers hold the key.
    assert_eq!(acquire_reply(&mut c, "q", &["SHARED"]), Resp::Nil);
    let mut ra = Waiter::send(
        srv.port,
        0,
        "q",
        &["SHARED", "BLOCK", "10000", "TOKEN", "ra"],
    );
    let mut rb = Waiter::send(
        srv.port,
        0,
        "q",
        &["SHARED", "BLOCK", "10000", "TOKEN", "rb"],
    );
    wait_queued(&mut c, "q", 3);
    let mut w2 = Waiter::send(srv.port, 0, "q", &["BLOCK", "10000", "TOKEN", "w2"]);
    let mut rc = Waiter::send(
        srv.port,
        0,
        "q",
        &["SHARED", "BLOCK", "10000", "TOKEN", "rc"],
    );
    wait_queued(&mut c, "q", 5);
    assert_eq!(c.cmd(&["LOCK.RELEASE", "q", "r0"]).int(), 1);
    let f1 = w1.granted();
    assert!(ra.waiting() && rb.waiting());
    assert_eq!(c.cmd(&["LOCK.RELEASE", "q", "w1"]).int(), 1);
    // Both readers behind w1 at once, and not the reader behind w2.
    let (fa, fb) = (ra.granted(), rb.granted());
    assert!(fa > f1 && fb > fa, "FIFO order of fences: {f1} {fa} {fb}");
    assert_eq!(holder_fences(&mut c, "q"), vec![fa, fb]);
    assert!(w2.waiting() && rc.waiting());
    assert_eq!(queued(&mut c, "q"), 2);
    assert_eq!(c.cmd(&["LOCK.RELEASE", "q", "ra"]).int(), 1);
    assert_eq!(c.cmd(&["LOCK.RELEASE", "q", "rb"]).int(), 1);
    let f2 = w2.granted();
    assert!(rc.waiting());
    assert_eq!(c.cmd(&["LOCK.RELEASE", "q", "w2"]).int(), 1);
    assert!(rc.granted() > f2);
}

#[test]
fn a_semaphore_grants_its_permits_in_order() {
    let srv = ServerBuilder::new().start();
    let mut c = RawConn::connect(srv.port);
    let a = take(&mut c, "sem", &["LIMIT", "2", "TOKEN", "a", "PX", "60000"]);
    let b = take(&mut c, "sem", &["LIMIT", "2", "TOKEN", "b", "PX", "60000"]);
    assert_eq!(acquire_reply(&mut c, "sem", &["LIMIT", "2"]), Resp::Nil);
    let i = info(&mut c, "sem");
    assert_eq!(i.field("mode").unwrap().text(), "counted");
    assert_eq!(int(&i, "limit"), 2);
    assert_eq!(int(&i, "holders"), 2);
    // The same limit is required, and no other kind.
    for (args, code) in [
        (&["LIMIT", "3"][..], "LIMITMISMATCH"),
        (&[][..], "WRONGMODE"),
        (&["SHARED"][..], "WRONGMODE"),
        (&["LIMIT", "3", "BLOCK", "100"][..], "LIMITMISMATCH"),
    ] {
        match acquire_reply(&mut c, "sem", args) {
            Resp::Error(e) => assert!(e.starts_with(code), "{args:?}: {e}"),
            other => panic!("{args:?}: {other:?}"),
        }
    }
    // A renew keeps the holder's fence and sets its own lease only.
    assert_eq!(
        grant(&acquire_reply(
            &mut c,
            "sem",
            &["LIMIT", "2", "TOKEN", "a", "PX", "5000"]
        )),
        Some((b"a".to_vec(), a))
    );
    assert_eq!(c.cmd(&["LOCK.EXTEND", "sem", "b", "PX", "90000"]).int(), 1);
    let list = info(&mut c, "sem").field("holder-list").unwrap();
    let ttls: Vec<i64> = list.items().iter().map(|h| int(h, "ttl")).collect();
    assert!(ttls[0] <= 5000 && ttls[1] > 80000, "{ttls:?}");
    assert!(
        c.cmd(&["PTTL", "sem"]).int() > 80000,
        "the key lives as long as its latest lease"
    );
    // Waiters take permits in order as they free.
    let mut w1 = Waiter::send(
        srv.port,
        0,
        "sem",
        &["LIMIT", "2", "BLOCK", "10000", "TOKEN", "c"],
    );
    let mut w2 = Waiter::send(
        srv.port,
        0,
        "sem",
        &["LIMIT", "2", "BLOCK", "10000", "TOKEN", "d"],
    );
    wait_queued(&mut c, "sem", 2);
    assert_eq!(c.cmd(&["LOCK.RELEASE", "sem", "b"]).int(), 1);
    let cf = w1.granted();
    assert!(cf > b && w2.waiting());
    // FORCERELEASE FENCE removes exactly that holder.
    assert_eq!(
        c.cmd(&["LOCK.FORCERELEASE", "sem", "FENCE", &a.to_string()])
            .int(),
        1
    );
    let df = w2.granted();
    assert_eq!(holder_fences(&mut c, "sem"), vec![cf, df]);
    assert_eq!(
        c.cmd(&["LOCK.FORCERELEASE", "sem", "FENCE", &a.to_string()])
            .int(),
        0
    );
    assert_eq!(c.cmd(&["LOCK.FORCERELEASE", "sem"]).int(), 1);
    assert_eq!(info(&mut c, "sem"), Resp::Nil);
}

#[test]
fn wrong_mode_is_an_error_never_a_silent_wait() {
    let srv = ServerBuilder::new().start();
    let mut c = RawConn::connect(srv.port);
    take(&mut c, "x", &["TOKEN", "t"]);
    take(&mut c, "s", &["SHARED", "TOKEN", "t"]);
    for (key, args, code) in [
        ("x", &["LIMIT", "2", "BLOCK", "1000"][..], "WRONGMODE"),
        ("s", &["LIMIT", "1"][..], "WRONGMODE"),
        // The holder's own token in another mode.
        ("x", &["SHARED", "TOKEN", "t"][..], "WRONGMODE"),
        ("s", &["TOKEN", "t"][..], "WRONGMODE"),
    ] {
        match acquire_reply(&mut c, key, args) {
            Resp::Error(e) => assert!(e.starts_with(code), "{key} {args:?}: {e}"),
            other => panic!("{key} {args:?}: {other:?}"),
        }
    }
    assert_eq!(queued(&mut c, "x"), 0);
    for args in [
        &["SHARED", "LIMIT", "2"][..],
        &["LIMIT", "0"],
        &["LIMIT", "-1"],
        &["LIMIT", "x"],
        &["LIMIT", "1000001"],
    ] {
        assert!(acquire_reply(&mut c, "y", args).is_error(), "{args:?}");
    }
    // A classic string lock is held exclusively.
    assert_eq!(
        c.cmd(&["SET", "str", "v", "PX", "60000"]),
        Resp::Simple("OK".into())
    );
    assert!(acquire_reply(&mut c, "str", &["LIMIT", "2"]).is_error());
    assert_eq!(acquire_reply(&mut c, "str", &["SHARED"]), Resp::Nil);
}

#[test]
fn each_shared_lease_ends_on_its_own() {
    let srv = ServerBuilder::new().start();
    let mut c = RawConn::connect(srv.port);
    take(&mut c, "l", &["SHARED", "TOKEN", "short", "PX", "200"]);
    let long = take(&mut c, "l", &["SHARED", "TOKEN", "long", "PX", "60000"]);
    let mut writer = Waiter::send(srv.port, 0, "l", &["BLOCK", "10000", "TOKEN", "w"]);
    wait_queued(&mut c, "l", 1);
    assert!(wait_until(SETTLE, || holder_fences(&mut c, "l") == vec![long]));
    assert!(writer.waiting(), "the writer got in beside a live reader");
    assert_eq!(c.cmd(&["LOCK.EXTEND", "l", "long", "PX", "100"]).int(), 1);
    assert!(
        writer.granted() > long,
        "a shorter lease brings the writer forward"
    );
}

/// Two readers of `key`: `a` (owner `o1`, 60 s) and `b` (50 s).
fn two_readers(c: &mut RawConn, key: &str) {
    take(
        c,
        key,
        &["SHARED", "TOKEN", "a", "OWNER", "o1", "PX", "60000"],
    );
    take(c, key, &["SHARED", "TOKEN", "b", "PX", "50000"]);
}

/// What LOCK.INFO shows that must be the same everywhere (the time left aside).
fn durable(r: &Resp) -> Vec<(String, String)> {
    r.pairs()
        .into_iter()
        .filter(|(k, _)| k != "ttl")
        .map(|(k, v)| {
            let v = if k == "holder-list" {
                v.items()
                    .iter()
                    .map(|h| {
                        h.pairs()
                            .into_iter()
                            .filter(|(k, _)| k != "ttl")
                            .map(|(k, v)| format!("{k}={v:?}"))
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .collect::<Vec<_>>()
                    .join(";")
            } else {
                format!("{v:?}")
            };
            (k, v)
        })
        .collect()
}

#[test]
fn replicas_mirror_shared_and_counted_locks() {
    let p = primary().start();
    let r = start_replica_of(&p, ServerBuilder::new());
    let mut pc = RawConn::connect(p.port);
    let mut rc = RawConn::connect(r.port);
    two_readers(&mut pc, "s");
    take(&mut pc, "n", &["LIMIT", "3", "TOKEN", "a"]);
    take(&mut pc, "n", &["LIMIT", "3", "TOKEN", "b"]);
    take(&mut pc, "n", &["LIMIT", "3", "TOKEN", "c"]);
    assert_eq!(pc.cmd(&["LOCK.RELEASE", "n", "b"]).int(), 1);
    assert_eq!(pc.cmd(&["LOCK.EXTEND", "s", "b", "PX", "70000"]).int(), 1);
    for key in ["s", "n"] {
        let want = durable(&info(&mut pc, key));
        assert!(
            wait_until(SETTLE, || {
                let got = info(&mut rc, key);
                got != Resp::Nil && durable(&got) == want
            }),
            "{key}: the replica differs\nprimary {want:?}\nreplica {:?}",
            durable(&info(&mut rc, key))
        );
        assert_eq!(
            pc.cmd(&["PEXPIRETIME", key]),
            rc.cmd(&["PEXPIRETIME", key]),
            "{key}"
        );
    }
    // Promoted, the replica knows every holder's token.
    assert_eq!(
        rc.cmd(&["REPLICAOF", "NO", "ONE"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(rc.cmd(&["LOCK.RELEASE", "n", "c"]).int(), 1);
    assert_eq!(rc.cmd(&["LOCK.RELEASE", "s", "a"]).int(), 1);
    assert_eq!(int(&info(&mut rc, "n"), "holders"), 1);
}

#[test]
fn shared_and_counted_locks_survive_rdb_and_aof_restarts() {
    for (persistence, preamble) in [("rdb", "yes"), ("aof", "yes"), ("aof", "no")] {
        let mut s = debug_server()
            .arg(
                "appendonly",
                if persistence == "aof" { "yes" } else { "no" },
            )
            .arg("appendfsync", "always")
            .arg("aof-use-rdb-preamble", preamble)
            .start();
        let mut c = RawConn::connect(s.port);
        two_readers(&mut c, "s");
        take(&mut c, "n", &["LIMIT", "2", "TOKEN", "a", "PX", "60000"]);
        take(&mut c, "x", &["TOKEN", "x", "PX", "60000"]);
        if preamble == "no" {
            c.cmd(&["BGREWRITEAOF"]);
            wait_persistence_idle(&s, SETTLE);
        }
        if persistence == "rdb" {
            assert_eq!(c.cmd(&["SAVE"]), Resp::Simple("OK".into()));
        }
        let before: Vec<_> = ["s", "n", "x"]
            .iter()
            .map(|k| durable(&info(&mut c, k)))
            .collect();
        let counter = c.cmd(&["LOCK.DEBUG", "FENCE"]).int();
        drop(c);
        s.kill9();
        s.restart();
        let mut c = RawConn::connect(s.port);
        let after: Vec<_> = ["s", "n", "x"]
            .iter()
            .map(|k| durable(&info(&mut c, k)))
            .collect();
        assert_eq!(before, after, "{persistence} preamble {preamble}");
        assert!(c.cmd(&["LOCK.DEBUG", "FENCE"]).int() >= counter);
        // The tokens still work: one more permit, a reader releases.
        take(&mut c, "n", &["LIMIT", "2", "TOKEN", "b"]);
        assert_eq!(acquire_reply(&mut c, "n", &["LIMIT", "2"]), Resp::Nil);
        assert_eq!(c.cmd(&["LOCK.RELEASE", "s", "b"]).int(), 1);
    }
}

#[test]
fn dump_and_restore_of_a_shared_lock() {
    let srv = ServerBuilder::new().start();
    let mut c = RawConn::connect(srv.port);
    take(&mut c, "s", &["SHARED", "TOKEN", "tok-a", "PX", "60000"]);
    take(&mut c, "s", &["SHARED", "TOKEN", "tok-b", "PX", "60000"]);
    let dump = c.cmd(&["DUMP", "s"]).bytes();
    assert!(
        !dump.windows(5).any(|w| w == b"tok-a"),
        "a token is in DUMP"
    );
    let argv: Vec<&[u8]> = vec![b"RESTORE", b"copy", b"0", &dump];
    assert_eq!(c.cmd(&argv), Resp::Simple("OK".into()));
    assert_eq!(durable(&info(&mut c, "copy")), durable(&info(&mut c, "s")));
    assert_eq!(c.cmd(&["LOCK.RELEASE", "copy", "tok-b"]).int(), 1);
    assert_eq!(int(&info(&mut c, "copy"), "holders"), 1);
}
