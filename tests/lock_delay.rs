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
    take_px(&mut c, "lock:d", &t, 200, &["LOCKDELAY", "1000"]);
    let ended = Instant::now() + Duration::from_millis(200);
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
    assert!(left > 0 && left <= 1000, "lock-delay left {left}");
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
    let (_, _) = granted(&c.cmd(&acq("lock:d", &["PX", "1000", "BLOCK", "5000"])));
    let waited = ended.elapsed();
    assert!(
        waited >= Duration::from_millis(950),
        "granted {waited:?} after the lease ended"
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
    let mut p = ServerBuilder::new()
        .arg("repl-diskless-sync-delay", "0")
        .module_args(&["lock-delay", "3000"])
        .start();
    let r = ServerBuilder::new()
        .try_start_replica_of(&p, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("replica: {e}"));
    let mut c = conn(&p);
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "lock.lock-delay"]),
        Resp::Array(vec![
            Resp::Bulk(b"lock.lock-delay".to_vec()),
            Resp::Bulk(b"3000".to_vec())
        ])
    );
    granted(&c.cmd(&acq("lock:s", &["PX", "100"])));
    granted(&c.cmd(&acq("lock:f", &["PX", "100"])));
    sleep(Duration::from_millis(300));
    assert_eq!(c.cmd(&acq("lock:s", &[])), Resp::Nil, "the setting's delay");
    // The replica shows the delay too.
    let mut rc = conn(&r);
    assert!(wait_until(Duration::from_secs(5), || {
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
