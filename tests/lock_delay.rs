//! Lock-delay (issue 20 item 5): after a lease ends without a release, the lock is not
//! granted for the delay; a release hands off at once; waiters keep their order; LOCK.INFO
//! shows the delay; replicas, restarts and FORCERELEASE keep to it.

mod regress;

use regress::*;
use std::thread::sleep;
use std::time::{Duration, Instant};

fn info_field(c: &mut RawConn, key: &str, field: &str) -> Option<Resp> {
    info(c, key).get(field)
}

#[test]
fn a_lease_that_ends_leaves_the_delay_and_a_release_does_not() {
    let s = ServerBuilder::new().start();
    let mut c = conn(&s);
    let t = tok("delay-a");
    // The lease starts after `asked`, so its delay ends 3.2 s after it at the earliest,
    // however late the grant's reply comes; 3 s of delay leave a loaded machine room
    // for the checks below to run inside it.
    let asked = Instant::now();
    take_px(&mut c, "lock:d", &t, 200, &["LOCKDELAY", "3000"]);
    sleep(Duration::from_millis(350));
    // The lease is over; the delay runs: nobody gets it, LOCK.INFO says so.
    assert_eq!(c.cmd(&acq("lock:d", &["PX", "1000"])), Resp::Nil);
    assert_eq!(
        info_field(&mut c, "lock:d", "state"),
        Some(Resp::Bulk(b"delayed".to_vec()))
    );
    let left = info_field(&mut c, "lock:d", "lock-delay")
        .and_then(|r| r.as_int())
        .unwrap_or(0);
    assert!(left > 0 && left <= 3000, "lock-delay left {left}");
    // Nobody holds it: no lease fields, no holder, an empty page.
    let delayed = info(&mut c, "lock:d");
    let names: Vec<String> = delayed.pairs().into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        names,
        [
            "state",
            "kind",
            "mode",
            "lock-delay",
            "holders",
            "waiters",
            "longest-wait",
            "holder-list",
            "cursor"
        ],
        "{delayed:?}"
    );
    assert_eq!(delayed.get("holders"), Some(Resp::Int(0)));
    assert_eq!(delayed.get("holder-list"), Some(Resp::Array(Vec::new())));
    // A waiter is granted when the delay ends, not before.
    let (_, _) = granted(&c.cmd(&acq("lock:d", &["PX", "1000", "BLOCK", "10000"])));
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_millis(3_200 - 10),
        "granted {waited:?} after the 200 ms lease with a 3 s delay was asked for"
    );
    // A release hands over at once.
    let t2 = tok("delay-b");
    c.cmd(&["LOCK.FORCERELEASE", "lock:d"]);
    granted(&c.cmd(&acq(
        "lock:d",
        &["PX", "5000", "TOKEN", &t2, "LOCKDELAY", "5000"],
    )));
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:d", &t2]), Resp::Int(1));
    assert!(
        grant(&c.cmd(&acq("lock:d", &["PX", "1000"]))).is_some(),
        "a release left a delay"
    );
}

#[test]
fn the_setting_applies_forcerelease_ends_it_and_replicas_and_restarts_keep_it() {
    // A delay of a minute: it must still run after the replica's check and a restart,
    // however slowly a loaded machine does those.
    let mut p = ServerBuilder::new()
        .arg("repl-diskless-sync-delay", "0")
        .module_args(&["lock-delay", "60000"])
        .start();
    let r = ServerBuilder::new()
        .try_start_replica_of(&p, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("replica: {e}"));
    let mut c = conn(&p);
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "lock.lock-delay"]),
        Resp::Array(vec![
            Resp::Bulk(b"lock.lock-delay".to_vec()),
            Resp::Bulk(b"60000".to_vec())
        ])
    );
    granted(&c.cmd(&acq("lock:s", &["PX", "100"])));
    granted(&c.cmd(&acq("lock:f", &["PX", "100"])));
    sleep(Duration::from_millis(300));
    assert_eq!(c.cmd(&acq("lock:s", &[])), Resp::Nil, "the setting's delay");
    // The replica shows the delay too.
    let mut rc = conn(&r);
    assert!(wait_until(SETTLE, || {
        info_field(&mut rc, "lock:s", "state") == Some(Resp::Bulk(b"delayed".to_vec()))
    }));
    // FORCERELEASE ends it.
    assert_eq!(c.cmd(&["LOCK.FORCERELEASE", "lock:f"]), Resp::Int(1));
    assert!(grant(&c.cmd(&acq("lock:f", &["PX", "60000"]))).is_some());
    // A restart from the RDB keeps what is left of it.
    save_and_restart(&mut p).unwrap_or_else(|e| panic!("restart: {e}"));
    let mut c = conn(&p);
    let left = info_field(&mut c, "lock:s", "lock-delay")
        .and_then(|r| r.as_int())
        .unwrap_or(0);
    assert!(
        left > 0,
        "the delay did not survive the restart: {:?}",
        info(&mut c, "lock:s")
    );
    assert_eq!(c.cmd(&acq("lock:s", &[])), Resp::Nil);
}

/// `lock.lock-delay` may not exceed `lock.max-ttl` (as `LOCKDELAY` may not), and neither
/// may `lock.max-ttl` be set below it; a `loadmodule` argument past it stops the start.
#[test]
fn the_lock_delay_setting_stays_within_max_ttl() {
    let s = ServerBuilder::new().start();
    let mut c = conn(&s);
    let r = c.cmd(&["CONFIG", "SET", "lock.lock-delay", "100000000"]);
    assert!(r.is_error(), "{r:?}");
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "lock.lock-delay", "5000"]),
        Resp::Simple("OK".into())
    );
    let r = c.cmd(&["CONFIG", "SET", "lock.max-ttl", "4000"]);
    assert!(r.is_error(), "{r:?}");
    let err = ServerBuilder::new()
        .module_args(&["lock-delay", "100000000"])
        .try_start()
        .err()
        .unwrap_or_default();
    assert!(err.contains("lock-delay"), "{err}");
}

/// An AOF rewritten without an RDB preamble writes each lock as the module's commands:
/// a key whose holders are gone while a lock-delay runs (and a shared lock with holders
/// left and a delay) must come back delayed, not free.
#[test]
fn an_aof_rewrite_keeps_a_running_lock_delay() {
    let mut s = ServerBuilder::new()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .arg("aof-use-rdb-preamble", "no")
        .start();
    let mut c = conn(&s);
    take_px(
        &mut c,
        "lock:gone",
        &tok("aof-gone"),
        100,
        &["LOCKDELAY", "60000"],
    );
    let shared = ["SHARED", "LOCKDELAY", "60000"];
    take_px(&mut c, "lock:sh", &tok("aof-sh-1"), 100, &shared);
    take_px(&mut c, "lock:sh", &tok("aof-sh-2"), 60_000, &["SHARED"]);
    sleep(Duration::from_millis(250));
    assert_eq!(c.cmd(&acq("lock:gone", &["PX", "1000"])), Resp::Nil);
    assert_eq!(c.cmd(&acq("lock:sh", &["PX", "1000"])), Resp::Nil);
    s.rewrite_aof(SETTLE).unwrap();
    s.kill9();
    s.restart();
    let mut c = conn(&s);
    for key in ["lock:gone", "lock:sh"] {
        let left = info_field(&mut c, key, "lock-delay").and_then(|r| r.as_int());
        assert!(
            left.is_some_and(|ms| ms > 50_000),
            "{key}: lock-delay {left:?} after the rewritten AOF was loaded"
        );
    }
    assert_eq!(c.cmd(&acq("lock:gone", &["PX", "1000"])), Resp::Nil);
}

/// LOCK.INFO is read-only: a lease that is over but not yet removed by the module's timer
/// must already show the lock-delay it leaves (what the next write finds), never a free
/// key. Polled without pause across the lease's end, exclusive and SHARED (a holder left
/// beside it); failed about one run in six on the merge of the lease-index work.
#[test]
fn lock_info_shows_the_delay_of_a_lease_over_but_not_yet_removed() {
    let s = ServerBuilder::new().start();
    let mut c = conn(&s);
    for round in 0..5 {
        let (x, sh) = (format!("lock:dx{round}"), format!("lock:ds{round}"));
        take_px(&mut c, &x, &tok("dx"), 100, &["LOCKDELAY", "60000"]);
        take_px(
            &mut c,
            &sh,
            &tok("ds1"),
            100,
            &["SHARED", "LOCKDELAY", "60000"],
        );
        take_px(&mut c, &sh, &tok("ds2"), 60_000, &["SHARED"]);
        let until = Instant::now() + Duration::from_millis(400);
        while Instant::now() < until {
            let xi = info(&mut c, &x);
            let held = xi.get("holders").and_then(|r| r.as_int()) == Some(1);
            let left = xi.get("lock-delay").and_then(|r| r.as_int()).unwrap_or(0);
            assert!(held || left > 0, "round {round}: {x}: {xi:?}");
            let si = info(&mut c, &sh);
            let holders = si.get("holders").and_then(|r| r.as_int()).unwrap_or(-1);
            let left = si.get("lock-delay").and_then(|r| r.as_int()).unwrap_or(0);
            assert!(
                holders == 2 || (holders == 1 && left > 0),
                "round {round}: {sh}: {si:?}"
            );
        }
    }
}
