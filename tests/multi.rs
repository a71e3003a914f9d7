//! All-or-nothing acquires of several keys (issue 30 item 3): `LOCK.ACQUIREALL numkeys
//! key ... [MODES mode ...] [options]` grants every key or none; with BLOCK it waits in
//! every key's FIFO queue without barging and without deadlock; `LOCK.RELEASEALL` and
//! `LOCK.EXTENDALL` take the same set.

mod regress;

use regress::*;
use std::time::Duration;

const T1: &str = "multi-token-00000001";
const T2: &str = "multi-token-00000002";

fn all(c: &mut RawConn, keys: &[&str], extra: &[&str]) -> Resp {
    let n = keys.len().to_string();
    let mut argv: Vec<&str> = vec!["LOCK.ACQUIREALL", &n];
    argv.extend_from_slice(keys);
    argv.extend_from_slice(extra);
    c.cmd(&argv)
}

/// `[token, [fence, ...]]`.
fn fences(r: &Resp) -> Vec<i64> {
    match r {
        Resp::Array(a) if a.len() == 2 => a[1].items().iter().map(|f| f.int()).collect(),
        other => panic!("not a grant of several keys: {other:?}"),
    }
}

fn waiters(c: &mut RawConn, key: &str) -> i64 {
    match info(c, key).get("waiters") {
        Some(Resp::Int(n)) => n,
        _ => 0,
    }
}

#[test]
fn all_or_nothing_without_waiting() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    take(&mut c, "m:b", &tok("holder-b"), &[]);
    // b is held: nothing is taken, a stays free.
    k.check(
        all(&mut c, &["m:a", "m:b"], &["PX", "60000", "TOKEN", T1]) == Resp::Nil,
        "granted with b held",
    );
    k.check(info(&mut c, "m:a") == Resp::Nil, "a was taken");
    // Free keys: all granted, each with its own fence, in order.
    let r = all(
        &mut c,
        &["m:c", "m:d", "m:e"],
        &[
            "MODES",
            "EXCLUSIVE",
            "SHARED",
            "LIMIT=2",
            "PX",
            "60000",
            "TOKEN",
            T1,
        ],
    );
    let f = fences(&r);
    k.check(f.len() == 3 && f[0] < f[1] && f[1] < f[2], format!("{f:?}"));
    k.check(
        info(&mut c, "m:d").get("mode") == Some(Resp::Bulk(b"shared".to_vec())),
        "d shared",
    );
    k.check(
        info(&mut c, "m:e").get("limit") == Some(Resp::Int(2)),
        "e a semaphore of 2",
    );
    // The same token again renews (an idempotent retry): the same fences.
    let again = all(
        &mut c,
        &["m:c", "m:d", "m:e"],
        &[
            "MODES",
            "EXCLUSIVE",
            "SHARED",
            "LIMIT=2",
            "PX",
            "60000",
            "TOKEN",
            T1,
        ],
    );
    k.check(fences(&again) == f, format!("retry {again:?}"));
    k.check(
        c.cmd(&[
            "LOCK.EXTENDALL",
            "3",
            "m:c",
            "m:d",
            "m:e",
            T1,
            "PX",
            "90000",
        ]) == Resp::Int(3),
        "EXTENDALL",
    );
    k.check(info_int(&mut c, "m:c", "ttl") > 80_000, "extended");
    k.check(
        c.cmd(&["LOCK.RELEASEALL", "4", "m:c", "m:d", "m:e", "m:b", T1]) == Resp::Int(3),
        "RELEASEALL releases what the token holds",
    );
    for key in ["m:c", "m:d", "m:e"] {
        k.check(info(&mut c, key) == Resp::Nil, format!("{key} released"));
    }
    for bad in [
        &["LOCK.ACQUIREALL", "2", "x", "x"][..],
        &["LOCK.ACQUIREALL", "0", "x"],
        &["LOCK.ACQUIREALL", "3", "x", "y"],
        &["LOCK.ACQUIREALL", "2", "x", "y", "MODES", "SHARED"],
        &["LOCK.ACQUIREALL", "1", "x", "MODES", "LIMIT=0"],
        &["LOCK.ACQUIREALL", "1", "x", "MODES", "NOPE"],
        &["LOCK.ACQUIREALL", "1", "x", "SHARED"],
        &["LOCK.ACQUIREALL", "1", "x", "PX", "-1"],
        &["LOCK.RELEASEALL", "2", "x"],
        &["LOCK.EXTENDALL", "1", "x", T1, "PX", "0"],
    ] {
        let r = c.cmd(bad);
        k.check(r.is_error(), format!("{bad:?}: {r:?}"));
    }
    alive(&s, &mut k, "after bad input");
    k.finish();
}

#[test]
fn two_clients_asking_in_opposite_orders_both_finish_in_order() {
    let s = ServerBuilder::new().start();
    let mut c = conn(&s);
    let ta = tok("x-holds-a");
    let tb = tok("x-holds-b");
    take(&mut c, "d:a", &ta, &[]);
    take(&mut c, "d:b", &tb, &[]);
    let mut one = conn(&s);
    let mut two = conn(&s);
    one.send(&[
        "LOCK.ACQUIREALL",
        "2",
        "d:a",
        "d:b",
        "PX",
        "60000",
        "TOKEN",
        T1,
        "BLOCK",
        "10000",
    ]);
    assert!(wait_until(SETTLE, || waiters(&mut c, "d:a") == 1));
    two.send(&[
        "LOCK.ACQUIREALL",
        "2",
        "d:b",
        "d:a",
        "PX",
        "60000",
        "TOKEN",
        T2,
        "BLOCK",
        "10000",
    ]);
    assert!(wait_until(SETTLE, || waiters(&mut c, "d:a") == 2
        && waiters(&mut c, "d:b") == 2));
    // No barging: a single acquire of a key they wait for gets nothing.
    c.cmd(&["LOCK.RELEASE", "d:a", &ta]);
    assert_eq!(c.cmd(&acq("d:a", &["PX", "1000"])), Resp::Nil);
    assert_eq!(
        info(&mut c, "d:a"),
        Resp::Nil,
        "a stays free for the first in line"
    );
    c.cmd(&["LOCK.RELEASE", "d:b", &tb]);
    let f1 = fences(&one.read().unwrap());
    assert_eq!(f1.len(), 2);
    assert_eq!(
        c.cmd(&["LOCK.RELEASEALL", "2", "d:a", "d:b", T1]),
        Resp::Int(2)
    );
    let f2 = fences(&two.read().unwrap());
    assert!(f2.iter().all(|f| *f > f1[1]), "{f1:?} then {f2:?}");
    assert_eq!(waiters(&mut c, "d:a"), 0);
}

#[test]
fn waiters_that_time_out_or_leave_free_every_queue() {
    let s = ServerBuilder::new().start();
    let mut c = conn(&s);
    let th = tok("holds-q2");
    take(&mut c, "q:2", &th, &[]);
    // Times out: nil, and neither queue keeps it.
    let r = all(&mut c, &["q:1", "q:2"], &["PX", "1000", "BLOCK", "100"]);
    assert_eq!(r, Resp::Nil);
    assert_eq!((waiters(&mut c, "q:1"), waiters(&mut c, "q:2")), (0, 0));
    // Leaves: its connection closes.
    let mut w = conn(&s);
    w.send(&[
        "LOCK.ACQUIREALL",
        "2",
        "q:1",
        "q:2",
        "PX",
        "1000",
        "BLOCK",
        "0",
    ]);
    assert!(wait_until(SETTLE, || waiters(&mut c, "q:2") == 1));
    drop(w);
    assert!(wait_until(SETTLE, || waiters(&mut c, "q:2") == 0));
    // The key it held a place on is free for others again.
    granted(&c.cmd(&acq("q:1", &["PX", "1000"])));
    assert_eq!(c.info_u64("lock", "lock_waiters").unwrap(), 0);
}

#[test]
fn every_path_replicas_and_the_aof() {
    let mut p = paths::with_helper_module(
        primary()
            .arg("appendonly", "yes")
            .arg("appendfsync", "always"),
    )
    .start();
    let r = replica_of(&p, ServerBuilder::new());
    let mut c = conn(&p);
    paths::load_function_library(&mut c);
    let mut k = Checks::new();
    let mut want = Vec::new();
    for (i, path) in paths::Path::ALL.into_iter().enumerate() {
        let (a, b) = (format!("p:{i}:a"), format!("p:{i}:b"));
        let t = format!("path-token-{i:09}");
        let reply = paths::send(
            &mut c,
            path,
            &[
                "LOCK.ACQUIREALL",
                "2",
                &a,
                &b,
                "MODES",
                "SHARED",
                "EXCLUSIVE",
                "PX",
                "60000",
                "TOKEN",
                &t,
                "BLOCK",
                "10",
            ],
        );
        k.check(
            matches!(&reply, Resp::Array(x) if x.len() == 2),
            format!("{}: {reply:?}", path.name()),
        );
        if let Resp::Array(x) = &reply {
            want.push((
                a,
                b,
                x[1].items().iter().map(|f| f.int()).collect::<Vec<_>>(),
            ));
        }
    }
    caught_up(&p, &r);
    let mut rc = conn(&r);
    for (a, b, f) in &want {
        k.check(
            holder_fences(&info(&mut rc, a)) == vec![f[0]],
            format!("replica {a}"),
        );
        k.check(
            info_opt(&mut rc, b, "fence") == Some(f[1]),
            format!("replica {b}"),
        );
    }
    drop(c);
    p.kill9();
    p.try_restart().unwrap();
    let mut c = conn(&p);
    for (a, b, f) in &want {
        k.check(
            holder_fences(&info(&mut c, a)) == vec![f[0]],
            format!("AOF {a}"),
        );
        k.check(
            info_opt(&mut c, b, "fence") == Some(f[1]),
            format!("AOF {b}"),
        );
    }
    k.finish();
}

#[test]
fn a_cluster_takes_keys_of_one_slot_only() {
    let (cl, mut k) = start_cluster();
    let node = cl.node_for_key("{job}:a");
    let mut c = conn(node);
    let r = c.cmd(&["LOCK.ACQUIREALL", "2", "{job}:a", "{job}:b", "PX", "10000"]);
    k.check(fences(&r).len() == 2, format!("{r:?}"));
    let cross = c.cmd(&[
        "LOCK.ACQUIREALL",
        "2",
        "{job}:a",
        "other-slot",
        "PX",
        "10000",
    ]);
    k.check(
        matches!(&cross, Resp::Error(e) if e.starts_with("CROSSSLOT")),
        format!("{cross:?}"),
    );
    let getkeys = c.cmd(&[
        "COMMAND",
        "GETKEYS",
        "LOCK.ACQUIREALL",
        "2",
        "k1",
        "k2",
        "MODES",
        "SHARED",
        "SHARED",
    ]);
    k.check(
        getkeys == Resp::Array(vec![Resp::Bulk(b"k1".to_vec()), Resp::Bulk(b"k2".to_vec())]),
        format!("{getkeys:?}"),
    );
    let _ = Duration::from_millis(0);
    k.finish();
}

/// The token of LOCK.RELEASEALL / LOCK.EXTENDALL stays out of SLOWLOG whatever is
/// wrong with the arguments after it (too many of them was refused before the token was
/// redacted).
#[test]
fn the_token_is_redacted_from_slowlog_whatever_follows_it() {
    let s = ServerBuilder::new().start();
    let mut c = conn(&s);
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]),
        ok()
    );
    let many: Vec<&str> = vec!["x"; 12];
    for cmd in [
        &["LOCK.RELEASEALL", "1", "k", "SECRET-0000000000000001"][..],
        &[
            "LOCK.EXTENDALL",
            "1",
            "k",
            "SECRET-0000000000000002",
            "PX",
            "100",
        ][..],
        &["LOCK.EXTENDALL", "1", "k", "SECRET-0000000000000003", "PX"][..],
    ] {
        c.cmd(cmd);
        c.cmd(&[cmd, &many[..]].concat());
    }
    let log = c.cmd(&["SLOWLOG", "GET", "100"]);
    let mut text = Vec::new();
    all_bytes(&log, &mut text);
    assert!(
        !has(&text, b"SECRET-"),
        "{}",
        String::from_utf8_lossy(&text)
    );
    assert!(
        has(&text, b"(redacted)"),
        "{}",
        String::from_utf8_lossy(&text)
    );
}

/// LOCK.RELEASEALL takes nothing after the token (it released and ignored them).
#[test]
fn releaseall_refuses_arguments_after_the_token() {
    let s = ServerBuilder::new().start();
    let mut c = conn(&s);
    fences(&all(&mut c, &["ra", "rb"], &["PX", "10000", "TOKEN", T1]));
    let r = c.cmd(&["LOCK.RELEASEALL", "2", "ra", "rb", T1, "PX", "5"]);
    assert!(is_err_with(&r, "ERR wrong number"), "{r:?}");
    assert_eq!(
        c.cmd(&["LOCK.RELEASEALL", "2", "ra", "rb", T1]),
        Resp::Int(2)
    );
}
