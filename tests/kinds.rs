//! Shared (read-write) and counted (semaphore) locks against a real server: who may hold
//! a key together, FIFO with shared batching and no writer starvation, per-holder
//! tokens, leases, fences, RELEASE / EXTEND / renew, FORCERELEASE of one holder or all,
//! LOCK.INFO's holder list, mode errors, and replication / RDB / AOF / DUMP of both kinds.

mod common;

use common::raw::{acquire, acquire_reply, grant, queued, wait_queued, Waiter};
use common::{
    debug_server, raw_pair, release, wait_until, words, RawConn, Resp, Server, ServerBuilder,
    SETTLE,
};

/// A server and a connection to it.
fn server() -> (Server, RawConn) {
    let srv = ServerBuilder::new().start();
    let c = RawConn::connect(srv.port);
    (srv, c)
}

fn take(c: &mut RawConn, key: &str, args: &[&str]) -> i64 {
    acquire(c, key, args)
        .unwrap_or_else(|| panic!("{key} {args:?} was not granted"))
        .1
}

/// [`take`] of `key args...` written on one line.
fn hold(c: &mut RawConn, line: &str) -> i64 {
    let w = words(line);
    take(c, w[0], &w[1..])
}

/// A client queued on `key` with `LOCK.ACQUIRE key args` (space-separated).
fn queue(port: u16, key: &str, args: &str) -> Waiter {
    Waiter::send(port, 0, key, &words(args))
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
    let (srv, mut c) = server();
    let r1 = hold(
        &mut c,
        "rw SHARED TOKEN r1-------------------tok OWNER reader-1",
    );
    let r2 = hold(&mut c, "rw SHARED TOKEN r2-------------------tok");
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
                k != "token"
                    && v != Resp::Bulk(b"r1-------------------tok".to_vec())
                    && v != Resp::Bulk(b"r2-------------------tok".to_vec()),
                "LOCK.INFO shows a token: {h:?}"
            );
        }
    }
    // Per-holder RELEASE: the writer waits until the last reader is gone.
    let mut writer = queue(srv.port, "rw", "BLOCK 10000 TOKEN w--------------------tok");
    wait_queued(&mut c, "rw", 1);
    assert_eq!(release(&mut c, "rw", "r1-------------------tok"), 1);
    assert!(writer.waiting());
    assert_eq!(
        release(&mut c, "rw", "r1-------------------tok"),
        0,
        "already released"
    );
    assert_eq!(release(&mut c, "rw", "r2-------------------tok"), 1);
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
    let (srv, mut c) = server();
    hold(&mut c, "q SHARED TOKEN r0-------------------tok");
    let on_q = |args| queue(srv.port, "q", args);
    let mut w1 = on_q("BLOCK 10000 TOKEN w1-------------------tok");
    wait_queued(&mut c, "q", 1);
    // A reader arriving after the writer waits, although readers hold the key.
    assert_eq!(acquire_reply(&mut c, "q", &["SHARED"]), Resp::Nil);
    let mut ra = on_q("SHARED BLOCK 10000 TOKEN ra-------------------tok");
    let mut rb = on_q("SHARED BLOCK 10000 TOKEN rb-------------------tok");
    wait_queued(&mut c, "q", 3);
    let mut w2 = on_q("BLOCK 10000 TOKEN w2-------------------tok");
    let mut rc = on_q("SHARED BLOCK 10000 TOKEN rc-------------------tok");
    wait_queued(&mut c, "q", 5);
    assert_eq!(release(&mut c, "q", "r0-------------------tok"), 1);
    let f1 = w1.granted();
    assert!(ra.waiting() && rb.waiting());
    assert_eq!(release(&mut c, "q", "w1-------------------tok"), 1);
    // Both readers behind w1 at once, and not the reader behind w2.
    let (fa, fb) = (ra.granted(), rb.granted());
    assert!(fa > f1 && fb > fa, "FIFO order of fences: {f1} {fa} {fb}");
    assert_eq!(holder_fences(&mut c, "q"), vec![fa, fb]);
    assert!(w2.waiting() && rc.waiting());
    assert_eq!(queued(&mut c, "q"), 2);
    assert_eq!(release(&mut c, "q", "ra-------------------tok"), 1);
    assert_eq!(release(&mut c, "q", "rb-------------------tok"), 1);
    let f2 = w2.granted();
    assert!(rc.waiting());
    assert_eq!(release(&mut c, "q", "w2-------------------tok"), 1);
    assert!(rc.granted() > f2);
}

#[test]
fn a_semaphore_grants_its_permits_in_order() {
    let (srv, mut c) = server();
    let a = hold(
        &mut c,
        "sem LIMIT 2 TOKEN a--------------------tok PX 60000",
    );
    let b = hold(
        &mut c,
        "sem LIMIT 2 TOKEN b--------------------tok PX 60000",
    );
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
            &words("LIMIT 2 TOKEN a--------------------tok PX 5000")
        )),
        Some((b"a--------------------tok".to_vec(), a))
    );
    assert_eq!(
        c.cmd(&words("LOCK.EXTEND sem b--------------------tok PX 90000"))
            .int(),
        1
    );
    let list = info(&mut c, "sem").field("holder-list").unwrap();
    let ttls: Vec<i64> = list.items().iter().map(|h| int(h, "ttl")).collect();
    assert!(ttls[0] <= 5000 && ttls[1] > 80000, "{ttls:?}");
    // The lock's `ttl` is its latest lease; the key itself has no Redis expiry.
    assert!(
        int(&info(&mut c, "sem"), "ttl") > 80000,
        "the lock lasts as long as its latest lease"
    );
    assert_eq!(c.cmd(&["PTTL", "sem"]).int(), -1);
    // Waiters take permits in order as they free.
    let on_sem = |args| queue(srv.port, "sem", args);
    let mut w1 = on_sem("LIMIT 2 BLOCK 10000 TOKEN c--------------------tok");
    let mut w2 = on_sem("LIMIT 2 BLOCK 10000 TOKEN d--------------------tok");
    wait_queued(&mut c, "sem", 2);
    assert_eq!(release(&mut c, "sem", "b--------------------tok"), 1);
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

/// LOCK.INFO pages the holder list: at most COUNT holders (default 10) by fence, after
/// AFTER; `holders` is always the total and `cursor` the fence to pass as AFTER next, 0
/// once the page reaches the end.
#[test]
fn lock_info_pages_the_holder_list() {
    let (_srv, mut c) = server();
    let fences: Vec<i64> = (0..12)
        .map(|i| {
            take(
                &mut c,
                "pg",
                &["SHARED", "TOKEN", &common::tok(&format!("r{i}"))],
            )
        })
        .collect();
    // One page of `count` (None: the default) after `after`: (fences, cursor).
    let mut page = |count: Option<&str>, after: i64| {
        let mut cmd = vec!["LOCK.INFO", "pg"];
        if let Some(n) = count {
            cmd.extend(["COUNT", n]);
        }
        let after = after.to_string();
        cmd.extend(["AFTER", &after]);
        let r = c.cmd(&cmd);
        assert_eq!(int(&r, "holders"), 12, "{cmd:?}");
        let list = r.field("holder-list").expect("holder-list");
        let got: Vec<i64> = list.items().iter().map(|h| int(h, "fence")).collect();
        (got, int(&r, "cursor"))
    };
    // The default page: the first 10, and where to go on.
    assert_eq!(page(None, 0), (fences[..10].to_vec(), fences[9]));
    assert_eq!(page(None, fences[9]), (fences[10..].to_vec(), 0));
    // Pages of 5 walk the whole list once, in fence order.
    let (mut walked, mut cursor, mut pages) = (Vec::new(), 0, 0);
    loop {
        let (got, next) = page(Some("5"), cursor);
        walked.extend(got);
        pages += 1;
        if next == 0 {
            break;
        }
        cursor = next;
    }
    assert_eq!((walked, pages), (fences.clone(), 3));
    // A page that ends exactly at the last holder is complete; past it, an empty page.
    assert_eq!(page(Some("12"), 0), (fences.clone(), 0));
    assert_eq!(page(Some("2"), fences[11]), (vec![], 0));
    assert_eq!(page(Some("1"), fences[3]).0, vec![fences[4]]);
    // AFTER a fence that is no holder's any more starts at the next one above it.
    let r4 = common::tok("r4");
    assert_eq!(release(&mut c, "pg", &r4), 1);
    let after = fences[4].to_string();
    let r = c.cmd(&["LOCK.INFO", "pg", "COUNT", "1", "AFTER", &after]);
    assert_eq!(int(&r, "holders"), 11);
    let list = r.field("holder-list").expect("holder-list");
    assert_eq!(int(&list.items()[0], "fence"), fences[5]);
    assert_eq!(int(&r, "cursor"), fences[5]);
}

#[test]
fn wrong_mode_is_an_error_never_a_silent_wait() {
    let (_srv, mut c) = server();
    take(&mut c, "x", &["TOKEN", "t--------------------tok"]);
    hold(&mut c, "s SHARED TOKEN t--------------------tok");
    for (key, args, code) in [
        ("x", &["LIMIT", "2", "BLOCK", "1000"][..], "WRONGMODE"),
        ("s", &["LIMIT", "1"][..], "WRONGMODE"),
        // The holder's own token in another mode.
        (
            "x",
            &["SHARED", "TOKEN", "t--------------------tok"][..],
            "WRONGMODE",
        ),
        ("s", &["TOKEN", "t--------------------tok"][..], "WRONGMODE"),
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
    let (srv, mut c) = server();
    hold(&mut c, "l SHARED TOKEN short----------------tok PX 200");
    let long = hold(&mut c, "l SHARED TOKEN long-----------------tok PX 60000");
    let mut writer = queue(srv.port, "l", "BLOCK 10000 TOKEN w--------------------tok");
    wait_queued(&mut c, "l", 1);
    assert!(wait_until(SETTLE, || holder_fences(&mut c, "l") == vec![long]));
    assert!(writer.waiting(), "the writer got in beside a live reader");
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", "l", "long-----------------tok", "PX", "100"])
            .int(),
        1
    );
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
        &words("SHARED TOKEN a--------------------tok OWNER o1 PX 60000"),
    );
    take(
        c,
        key,
        &["SHARED", "TOKEN", "b--------------------tok", "PX", "50000"],
    );
}

/// The fields of a lease's deadline: the time left, and the server's wall-clock estimate
/// of the end (`expires-at`, wall now + time left: it moves by a few ms between calls,
/// and is later on a replica or after a restart, never earlier). [`deadlines`] checks
/// them.
const CLOCKED: [&str; 2] = ["ttl", "expires-at"];

/// What LOCK.INFO shows that must be the same everywhere (the deadlines aside).
fn durable(r: &Resp) -> Vec<(String, String)> {
    r.pairs()
        .into_iter()
        .filter(|(k, _)| !CLOCKED.contains(&k.as_str()))
        .map(|(k, v)| {
            let v = if k == "holder-list" {
                v.items()
                    .iter()
                    .map(|h| {
                        h.pairs()
                            .into_iter()
                            .filter(|(k, _)| !CLOCKED.contains(&k.as_str()))
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

/// `expires-at` of the lock and of each holder, in holder-list order.
fn expiries(r: &Resp) -> Vec<i64> {
    let mut v = vec![int(r, "expires-at")];
    if let Some(list) = r.field("holder-list") {
        v.extend(list.items().iter().map(|h| int(h, "expires-at")));
    }
    v
}

/// Every deadline of `got` (a replica's, or after a restart) is no earlier than the one
/// in `want` (the primary's, or before) less 5 ms of rounding, and at most `later` ms
/// after it: callers pass the time from the first grant to when `got` was read, the most
/// a lease that reached its copy whole, late, can have moved.
#[track_caller]
fn deadlines(want: &Resp, got: &Resp, later: i64, what: &str) {
    let (w, g) = (expiries(want), expiries(got));
    assert_eq!(w.len(), g.len(), "{what}: {want:?} / {got:?}");
    for (w, g) in w.iter().zip(&g) {
        assert!(
            *g >= w - 5 && *g <= w + later,
            "{what}: expires-at {g}, expected {w} (-5 ms, +{later} ms)"
        );
    }
}

#[test]
fn replicas_mirror_shared_and_counted_locks() {
    let (_p, _r, mut pc, mut rc) = raw_pair();
    let t0 = common::unix_ms();
    two_readers(&mut pc, "s");
    hold(&mut pc, "n LIMIT 3 TOKEN a--------------------tok");
    hold(&mut pc, "n LIMIT 3 TOKEN b--------------------tok");
    hold(&mut pc, "n LIMIT 3 TOKEN c--------------------tok");
    assert_eq!(release(&mut pc, "n", "b--------------------tok"), 1);
    assert_eq!(
        pc.cmd(&words("LOCK.EXTEND s b--------------------tok PX 70000"))
            .int(),
        1
    );
    for key in ["s", "n"] {
        let primary_info = info(&mut pc, key);
        let want = durable(&primary_info);
        assert!(
            wait_until(SETTLE, || {
                let got = info(&mut rc, key);
                got != Resp::Nil && durable(&got) == want
            }),
            "{key}: the replica differs\nprimary {want:?}\nreplica {:?}",
            durable(&info(&mut rc, key))
        );
        // The replica applied each grant a little later (a primary streams to a replica
        // fresh from a diskless sync only after its first ACK, up to a second): its
        // deadlines are no earlier, and later by no more than that.
        let later = common::unix_ms() - t0 + 5;
        deadlines(&primary_info, &info(&mut rc, key), later, key);
        // Neither copy of the key has a Redis expiry.
        assert_eq!(pc.cmd(&["PEXPIRETIME", key]), Resp::Int(-1), "{key}");
        assert_eq!(rc.cmd(&["PEXPIRETIME", key]), Resp::Int(-1), "{key}");
    }
    // Promoted, the replica knows every holder's token.
    assert_eq!(
        rc.cmd(&["REPLICAOF", "NO", "ONE"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(release(&mut rc, "n", "c--------------------tok"), 1);
    assert_eq!(release(&mut rc, "s", "a--------------------tok"), 1);
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
        let t0 = common::unix_ms();
        two_readers(&mut c, "s");
        hold(&mut c, "n LIMIT 2 TOKEN a--------------------tok PX 60000");
        hold(&mut c, "x TOKEN x--------------------tok PX 60000");
        if preamble == "no" {
            s.rewrite_aof(SETTLE).unwrap();
        }
        if persistence == "rdb" {
            assert_eq!(c.cmd(&["SAVE"]), Resp::Simple("OK".into()));
        }
        let before_info: Vec<_> = ["s", "n", "x"].iter().map(|k| info(&mut c, k)).collect();
        let before: Vec<_> = before_info.iter().map(durable).collect();
        let counter = c.cmd(&["LOCK.DEBUG", "FENCE"]).int();
        drop(c);
        s.kill9();
        s.restart();
        let mut c = RawConn::connect(s.port);
        let after_info: Vec<_> = ["s", "n", "x"].iter().map(|k| info(&mut c, k)).collect();
        let after: Vec<_> = after_info.iter().map(durable).collect();
        let what = format!("{persistence} preamble {preamble}");
        assert_eq!(before, after, "{what}");
        // Each lease carried its time left (RDB, a rewritten AOF) or its whole length (a
        // grant in the AOF after its base): it ends no earlier than before the restart,
        // and later by at most the time since the grant.
        let later = common::unix_ms() - t0 + 5;
        for (b, a) in before_info.iter().zip(&after_info) {
            deadlines(b, a, later, &what);
        }
        assert!(c.cmd(&["LOCK.DEBUG", "FENCE"]).int() >= counter);
        // The tokens still work: one more permit, a reader releases.
        hold(&mut c, "n LIMIT 2 TOKEN b--------------------tok");
        assert_eq!(acquire_reply(&mut c, "n", &["LIMIT", "2"]), Resp::Nil);
        assert_eq!(release(&mut c, "s", "b--------------------tok"), 1);
    }
}

#[test]
fn dump_and_restore_of_a_shared_lock() {
    let (_srv, mut c) = server();
    hold(&mut c, "s SHARED TOKEN tok-a----------------tok PX 60000");
    hold(&mut c, "s SHARED TOKEN tok-b----------------tok PX 60000");
    let dump = c.cmd(&["DUMP", "s"]).bytes();
    for t in [b"tok-a----------------tok", b"tok-b----------------tok"] {
        assert!(!common::contains(&dump, t), "a token is in DUMP");
    }
    let argv: Vec<&[u8]> = vec![b"RESTORE", b"copy", b"0", &dump];
    assert_eq!(c.cmd(&argv), Resp::Simple("OK".into()));
    let (copy, orig) = (info(&mut c, "copy"), info(&mut c, "s"));
    assert_eq!(durable(&copy), durable(&orig));
    // The payload carries each holder's time left: the copy's leases end with the
    // original's (it was restored a moment later).
    deadlines(&orig, &copy, 1000, "RESTORE");
    assert_eq!(release(&mut c, "copy", "tok-b----------------tok"), 1);
    assert_eq!(int(&info(&mut c, "copy"), "holders"), 1);
}
