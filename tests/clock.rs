//! Regression tests for issue 20's measured rows: leases and BLOCK waits on the server's
//! monotonic clock (one server's wall clock stepped with the LD_PRELOAD shim of
//! scripts/reliability/clockshift.c), no Redis expiry on a module lock key, leases that
//! a restart (RDB, AOF) or a promotion does not cut short. Times are measured on this
//! test's own monotonic clock (`Instant`).

mod regress;

use regress::paths::ClockShift;
use regress::*;
use std::thread::sleep;
use std::time::{Duration, Instant};

/// How much earlier than this test's clock a lease may end: the server counts whole ms.
/// (Times on the "not before" side run from before the grant was asked for, so no reply
/// latency is allowed there.)
const EARLY: Duration = Duration::from_millis(5);
/// Slack on the "within" side: a loaded 2-core machine's pauses (1-2 s seen). The faults
/// caught there are leases and waits stretched by the clock step, 15 s or more.
const SLACK: Duration = Duration::from_secs(5);

/// A server whose wall clock the test steps.
fn shifted_server() -> (Server, ClockShift) {
    let dir = temp_dir();
    let shift = ClockShift::new(&dir);
    let s = shift.apply(ServerBuilder::new()).start();
    (s, shift)
}

/// A lease of `lease` ms with a waiter `BLOCK 10000`; the clock stepped by `step_ms`
/// 1 s after the grant. Returns (the waiter's reply, its time after the first grant was
/// asked for).
fn step_during_lease(lease_ms: u64, step_ms: i64) -> (Resp, Duration) {
    let (s, shift) = shifted_server();
    let mut c = conn(&s);
    let t = tok("clock-holder");
    let granted_at = Instant::now();
    granted(&c.cmd(&acq("lock:c", &["PX", &lease_ms.to_string(), "TOKEN", &t])));
    let mut w = Pending::send(s.port, &acq("lock:c", &["PX", "10000", "BLOCK", "10000"]));
    wait_waiters(&mut c, "lock:c", 1);
    sleep(Duration::from_secs(1).saturating_sub(granted_at.elapsed()));
    shift.set_ms(step_ms);
    let r = w
        .reply_within(Duration::from_secs(12))
        .unwrap_or_else(|e| panic!("the waiter got no reply within 12 s: {e}"));
    (r, granted_at.elapsed())
}

#[test]
fn a_forward_step_does_not_end_a_lease_early() {
    let (r, after) = step_during_lease(5000, 120_000);
    assert!(
        grant(&r).is_some(),
        "the waiter was not granted: {r:?} after {after:?}"
    );
    assert!(
        after + EARLY >= Duration::from_secs(5),
        "+120 s step: the waiter was granted {after:?} after the first grant of a 5 s lease \
         (two holders in real time)"
    );
    assert!(
        after <= Duration::from_secs(5) + SLACK,
        "+120 s step: the waiter was granted only {after:?} after the first grant"
    );
}

#[test]
fn a_backward_step_does_not_stretch_a_lease() {
    let (r, after) = step_during_lease(3000, -120_000);
    assert!(
        grant(&r).is_some(),
        "the waiter was not granted: {r:?} after {after:?}"
    );
    assert!(
        after <= Duration::from_secs(3) + SLACK,
        "-120 s step: the waiter of a 3 s lease was granted {after:?} after the first grant"
    );
    assert!(
        after + EARLY >= Duration::from_secs(3),
        "granted early: {after:?}"
    );
}

/// `BLOCK 2000` on a lock held by another; the clock stepped by `step_ms` right after the
/// waiter queued. The reply and how long it took.
fn block_2000_under_step(step_ms: i64) -> (Resp, Duration) {
    let (s, shift) = shifted_server();
    let mut c = conn(&s);
    let t = tok("block-holder");
    granted(&c.cmd(&acq("lock:b", &["PX", "60000", "TOKEN", &t])));
    let mut w = Pending::send(s.port, &acq("lock:b", &["BLOCK", "2000"]));
    wait_waiters(&mut c, "lock:b", 1);
    shift.set_ms(step_ms);
    let r = w
        .reply_within(Duration::from_secs(25))
        .unwrap_or_else(|e| panic!("no reply within 25 s: {e}"));
    (r, w.sent.elapsed())
}

#[test]
fn block_2000_answers_nil_on_time_under_a_backward_step() {
    let (r, took) = block_2000_under_step(-15_000);
    assert_eq!(r, Resp::Nil, "BLOCK 2000 under a -15 s step");
    assert!(
        took <= Duration::from_secs(2) + SLACK,
        "BLOCK 2000 under a -15 s step answered after {took:?}"
    );
}

#[test]
fn block_2000_does_not_end_early_under_a_forward_step() {
    let (r, took) = block_2000_under_step(15_000);
    assert_eq!(
        r,
        Resp::Nil,
        "BLOCK 2000 under a +15 s step, lock held for 60 s by another, after {took:?}"
    );
    assert!(
        took >= Duration::from_millis(1900),
        "BLOCK 2000 under a +15 s step answered after {took:?}"
    );
}

#[test]
fn a_module_lock_key_has_no_redis_expiry() {
    let s = ServerBuilder::new().start();
    let mut c = conn(&s);
    let t = tok("pttl");
    take_px(&mut c, "lock:p", &t, 30_000, &[]);
    take_px(&mut c, "lock:sh", &t, 30_000, &["SHARED"]);
    for key in ["lock:p", "lock:sh"] {
        assert_eq!(c.cmd(&["PTTL", key]), Resp::Int(-1), "PTTL {key}");
        let ttl = info_int(&mut c, key, "ttl");
        assert!(ttl > 0 && ttl <= 30000, "LOCK.INFO {key} ttl {ttl}");
    }
}

/// The ttl a lease of `PX 20000` must still have after a restart: the time it had left
/// when the server went down (the downtime is not taken from it), less 1.5 s for the
/// grant's reply and the restarted server's start, load and first answer on a loaded
/// machine (the fault caught: the 3 s downtime taken from it).
fn restart_keeps_the_lease(b: ServerBuilder, save: bool) {
    let mut s = b.start();
    let mut c = conn(&s);
    let t = tok("restart");
    granted(&c.cmd(&acq("lock:r", &["PX", "20000", "TOKEN", &t])));
    let granted_at = Instant::now();
    if save {
        assert_eq!(c.cmd(&["SAVE"]), Resp::Simple("OK".into()));
    }
    drop(c);
    s.kill9();
    let up_for = granted_at.elapsed();
    // Down for 3 s.
    sleep(Duration::from_secs(3));
    s.try_restart().unwrap_or_else(|e| panic!("restart: {e}"));
    let mut c = conn(&s);
    let i = info(&mut c, "lock:r");
    assert_ne!(i, Resp::Nil, "the lease ended across the restart");
    let ttl = info_int(&mut c, "lock:r", "ttl");
    let want = 20_000 - up_for.as_millis() as i64 - 1_500;
    assert!(
        ttl >= want,
        "ttl {ttl} ms after the restart, want >= {want} (20000 - {up_for:?} up - 1500): \
         the 3 s downtime ate into the lease"
    );
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:r", &t]), Resp::Int(1));
}

#[test]
fn a_restart_from_rdb_does_not_cut_a_lease_short() {
    restart_keeps_the_lease(ServerBuilder::new(), true);
}

#[test]
fn a_restart_from_aof_does_not_cut_a_lease_short() {
    restart_keeps_the_lease(
        ServerBuilder::new()
            .arg("appendonly", "yes")
            .arg("appendfsync", "always"),
        false,
    );
}

#[test]
fn a_promoted_replica_keeps_at_least_the_remaining_lease() {
    // The replica's wall clock runs 10 s ahead of the primary's: a lease carried as a
    // wall-clock deadline would lose 10 s there.
    let p = primary().start();
    let dir = temp_dir();
    let shift = ClockShift::new(&dir);
    shift.set_ms(10_000);
    let r = replica_of(&p, shift.apply(ServerBuilder::new()));
    let mut pc = conn(&p);
    let t = tok("promote");
    granted(&pc.cmd(&acq("lock:f", &["PX", "20000", "TOKEN", &t])));
    assert_eq!(pc.cmd(&["WAIT", "1", "2000"]), Resp::Int(1), "WAIT 1");
    sleep(Duration::from_secs(1));
    let remaining = info_int(&mut pc, "lock:f", "ttl");
    let read_at = Instant::now();
    let mut rc = conn(&r);
    assert_eq!(
        rc.cmd(&["REPLICAOF", "NO", "ONE"]),
        Resp::Simple("OK".into())
    );
    let i = info(&mut rc, "lock:f");
    assert_ne!(i, Resp::Nil, "the lease is gone on the promoted replica");
    let ttl = info_int(&mut rc, "lock:f", "ttl");
    let since = read_at.elapsed().as_millis() as i64;
    // 1 s for the primary's reply on a loaded machine; the fault caught is 10 s.
    assert!(
        ttl >= remaining - since - 1_000,
        "ttl {ttl} on the promoted replica, the primary had {remaining} {since} ms earlier"
    );
}
