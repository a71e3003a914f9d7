//! Eviction (issue 31): under a `maxmemory-policy` that can evict a key without an expiry
//! (`allkeys-*`) with `maxmemory` set, a held lock can be evicted and granted to a second
//! holder. By default the module refuses new grants there (`EVICTION`), puts back a held
//! lock the server evicts anyway (a lock taken before the policy changed), and keeps
//! releases, extends and queued waiters working; `lock.allow-eviction yes` lets eviction
//! act as a DEL, as before.

mod regress;

use regress::*;
use std::thread::sleep;
use std::time::Duration;

const POLICIES: [&str; 8] = [
    "noeviction",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
];

fn set(c: &mut RawConn, k: &str, v: &str) {
    assert_eq!(c.cmd(&["CONFIG", "SET", k, v]), ok(), "CONFIG SET {k} {v}");
}

fn lock_stat(c: &mut RawConn, field: &str) -> u64 {
    c.info_u64("lock", &format!("lock_{field}"))
        .unwrap_or_else(|e| panic!("INFO lock {field}: {e}"))
}

/// Whether an acquire was refused for the eviction policy `policy` (and the text says
/// how to get out of it); false for a grant; panics on anything else.
fn refused(r: &Resp, policy: &str) -> bool {
    match r {
        Resp::Error(e) => {
            assert!(
                e.starts_with(&format!("EVICTION maxmemory-policy {policy} "))
                    && e.contains("lock.allow-eviction yes")
                    && e.contains("noeviction"),
                "{e}"
            );
            true
        }
        other => {
            granted(other);
            false
        }
    }
}

#[test]
fn every_policy_with_and_without_maxmemory_and_the_override() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    let mut n = 0;
    for policy in POLICIES {
        for maxmemory in ["0", "512mb"] {
            for allow in ["no", "yes"] {
                set(&mut c, "maxmemory-policy", policy);
                set(&mut c, "maxmemory", maxmemory);
                set(&mut c, "lock.allow-eviction", allow);
                let can_evict = policy.starts_with("allkeys-") && maxmemory != "0";
                let key = format!("lock:m{n}");
                n += 1;
                let r = c.cmd(&acq(&key, &["PX", "60000"]));
                k.check(
                    refused(&r, policy) == (can_evict && allow == "no"),
                    format!("{policy} maxmemory {maxmemory} allow {allow}: {r:?}"),
                );
                let risk = lock_stat(&mut c, "eviction_risk");
                k.check(
                    risk == u64::from(can_evict),
                    format!("{policy} maxmemory {maxmemory}: INFO lock_eviction_risk {risk}"),
                );
                let allowed = lock_stat(&mut c, "eviction_allowed");
                k.check(
                    allowed == u64::from(allow == "yes"),
                    format!("lock.allow-eviction {allow}: INFO lock_eviction_allowed {allowed}"),
                );
            }
        }
    }
    // One warning per change into an evicting policy, naming it.
    let log = s.log();
    for p in ["allkeys-lru", "allkeys-lfu", "allkeys-random"] {
        k.check(
            log.contains(&format!(
                "maxmemory-policy {p} with maxmemory 536870912 can evict"
            )),
            format!("no warning for {p} in the log"),
        );
    }
    k.check(
        lock_stat(&mut c, "refused_eviction") == 3,
        "three acquires refused".to_string(),
    );
    alive(&s, &mut k, "after the policy matrix");
    k.finish();
}

#[test]
fn at_load_the_policy_refuses_and_the_module_argument_allows() {
    let s = ServerBuilder::new()
        .arg("maxmemory", "100mb")
        .arg("maxmemory-policy", "allkeys-lru")
        .start();
    let mut c = conn(&s);
    assert!(refused(
        &c.cmd(&acq("lock:a", &["PX", "1000"])),
        "allkeys-lru"
    ));
    // MULTI, a script and another module's call are refused the same way.
    let paths = paths::with_helper_module(
        ServerBuilder::new()
            .arg("maxmemory", "100mb")
            .arg("maxmemory-policy", "allkeys-random"),
    )
    .start();
    let mut pc = conn(&paths);
    paths::load_function_library(&mut pc);
    for path in paths::Path::ALL {
        let r = paths::send(
            &mut pc,
            path,
            &acq("lock:p", &["PX", "1000", "BLOCK", "10"]),
        );
        assert!(refused(&r, "allkeys-random"), "{}: {r:?}", path.name());
    }
    assert!(
        s.log().contains(
            "maxmemory-policy allkeys-lru with maxmemory 104857600 can evict lock keys \
             (they have no expiry): new grants are refused"
        ),
        "{}",
        s.log_tail()
    );
    // Setting it back to safe grants again; the override at load grants too.
    set(&mut c, "maxmemory-policy", "volatile-lru");
    granted(&c.cmd(&acq("lock:a", &["PX", "1000"])));
    let allowed = ServerBuilder::new()
        .arg("maxmemory", "100mb")
        .arg("maxmemory-policy", "allkeys-lfu")
        .module_args(&["allow-eviction", "yes"])
        .start();
    let mut ac = conn(&allowed);
    granted(&ac.cmd(&acq("lock:a", &["PX", "1000"])));
    assert_eq!(
        ac.cmd(&["CONFIG", "GET", "lock.allow-eviction"]).items()[1].text(),
        "yes"
    );
    assert!(allowed
        .log()
        .contains("lock.allow-eviction yes: a held lock can be evicted"));
}

/// `maxmemory` just above what the server uses, and a ballast that puts it over: the
/// next command evicts first. Under `allkeys-lru` the lock key, untouched for a few
/// seconds (the LRU clock counts seconds), goes before the ballast written just now.
fn evict_the_lock(c: &mut RawConn, policy: &str) {
    let used = c.info_u64("memory", "used_memory").unwrap();
    set(c, "maxmemory-policy", policy);
    set(c, "maxmemory", &(used + 1024 * 1024).to_string());
    assert_eq!(
        c.cmd(&["SETRANGE", "ballast", "2097152", "x"]),
        Resp::Int(2 * 1024 * 1024 + 1)
    );
    // The eviction happens before this command runs.
    c.cmd(&["DEL", "ballast"]);
    set(c, "maxmemory", "0");
}

/// A lock held with a waiter queued behind it, then left alone long enough for the LRU
/// clock to see it idle.
fn held_with_a_waiter(s: &Server, key: &str, tok_a: &str) -> (RawConn, RawConn, i64) {
    let mut c = conn(s);
    let fence = take(&mut c, key, tok_a, &[]);
    let mut w = conn(s);
    w.send(&acq(key, &["PX", "60000", "BLOCK", "0"]));
    assert!(
        wait_until(SETTLE, || c.info_u64("lock", "lock_waiters").unwrap_or(0)
            == 1),
        "the waiter did not queue"
    );
    sleep(Duration::from_millis(2_500));
    (c, w, fence)
}

#[test]
fn refused_by_default_a_held_lock_evicted_is_put_back_and_the_waiter_keeps_waiting() {
    let p = primary().arg("appendonly", "yes").start();
    let r = replica_of(&p, ServerBuilder::new());
    let (key, a) = ("lock:held", tok("evict-a"));
    let (mut c, mut w, fence) = held_with_a_waiter(&p, key, &a);
    evict_the_lock(&mut c, "allkeys-lru");
    assert!(
        wait_until(SETTLE, || lock_stat(&mut c, "restored") == 1),
        "evicted {}, restored {}",
        lock_stat(&mut c, "evicted"),
        lock_stat(&mut c, "restored")
    );
    assert_eq!(lock_stat(&mut c, "evicted"), 1);
    // Still held by the first holder, with its fence, on the primary and the replica.
    assert_eq!(info_int(&mut c, key, "fence"), fence);
    caught_up(&p, &r);
    assert_eq!(info_int(&mut conn(&r), key, "fence"), fence);
    // Nobody else gets it: the waiter still waits, a new acquire is refused.
    w.set_read_timeout(Some(Duration::from_millis(300)));
    assert!(w.read().is_err(), "the waiter was answered");
    set(&mut c, "maxmemory", "100mb");
    assert!(refused(&c.cmd(&acq(key, &["PX", "1000"])), "allkeys-lru"));
    // Extends and releases work; the release hands the lock to the queued waiter.
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", key, &a, "PX", "30000"]),
        Resp::Int(1)
    );
    assert_eq!(c.cmd(&["LOCK.RELEASE", key, &a]), Resp::Int(1));
    w.set_read_timeout(Some(SETTLE));
    let (_, f2) = granted(&w.read().unwrap());
    assert!(f2 > fence);
    // The replica, promoted with the same policy, refuses as well.
    caught_up(&p, &r);
    let mut rc = conn(&r);
    set(&mut rc, "maxmemory", "100mb");
    set(&mut rc, "maxmemory-policy", "allkeys-lfu");
    assert_eq!(rc.cmd(&["REPLICAOF", "NO", "ONE"]), ok());
    assert!(refused(
        &rc.cmd(&acq("lock:new", &["PX", "1000"])),
        "allkeys-lfu"
    ));
    assert_eq!(info_int(&mut rc, key, "fence"), f2);
}

#[test]
fn allowed_an_evicted_lock_serves_its_waiter_and_its_holder_learns_it_is_lost() {
    let s = ServerBuilder::new()
        .module_args(&["allow-eviction", "yes"])
        .start();
    let (key, a) = ("lock:allowed", tok("evict-b"));
    let (mut c, mut w, fence) = held_with_a_waiter(&s, key, &a);
    evict_the_lock(&mut c, "allkeys-lru");
    w.set_read_timeout(Some(SETTLE));
    let (_, f2) = granted(&w.read().unwrap());
    assert!(f2 > fence);
    assert_eq!(lock_stat(&mut c, "evicted"), 1);
    assert_eq!(lock_stat(&mut c, "restored"), 0);
    assert_eq!(lock_stat(&mut c, "handed_off"), 1);
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", key, &a, "PX", "30000"]),
        Resp::Int(0)
    );
    assert_eq!(c.cmd(&["LOCK.RELEASE", key, &a]), Resp::Int(0));
}

#[test]
fn an_aof_reload_under_an_evicting_policy_keeps_the_locks_and_refuses_new_ones() {
    let dir = temp_dir();
    let aof = || {
        ServerBuilder::new()
            .dir(dir.clone())
            .arg("appendonly", "yes")
            .arg("appendfsync", "always")
    };
    let mut s = aof().start();
    let mut c = conn(&s);
    let a = tok("evict-c");
    let fence = take(&mut c, "lock:kept", &a, &[]);
    drop(c);
    s.kill9();
    // Started again on the same files, with a risky policy on its command line.
    let mut s = aof()
        .arg("maxmemory", "100mb")
        .arg("maxmemory-policy", "allkeys-random")
        .start();
    let mut c = conn(&s);
    assert_eq!(info_int(&mut c, "lock:kept", "fence"), fence);
    assert!(refused(
        &c.cmd(&acq("lock:other", &["PX", "1000"])),
        "allkeys-random"
    ));
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:kept", &a]), Resp::Int(1));
    assert!(s.is_running());
}

/// `evict_the_lock`, with `then` sent right behind the command that puts memory over, in
/// one pipeline: `then` runs just after the eviction, before the module's next tick. The
/// ballast stays (harmless once `maxmemory` is 0 again).
fn evict_the_lock_then(c: &mut RawConn, policy: &str, then: &[&str]) -> Resp {
    let used = c.info_u64("memory", "used_memory").unwrap();
    set(c, "maxmemory-policy", policy);
    set(c, "maxmemory", &(used + 1024 * 1024).to_string());
    let replies = c
        .pipeline(&[vec!["SETRANGE", "ballast", "2097152", "x"], then.to_vec()])
        .unwrap();
    set(c, "maxmemory", "0");
    assert_eq!(replies[0], Resp::Int(2 * 1024 * 1024 + 1));
    replies[1].clone()
}

#[test]
fn a_read_right_after_the_eviction_does_not_lose_the_restore() {
    for (i, read) in ["LOCK.INFO", "LOCK.CHECK", "LOCK.WATCH"].iter().enumerate() {
        let s = ServerBuilder::new().start();
        let (key, a) = ("lock:read-after", tok(&format!("evict-r{i}")));
        let (mut c, mut w, fence) = held_with_a_waiter(&s, key, &a);
        let argv: Vec<String> = match *read {
            "LOCK.CHECK" => vec![read.to_string(), key.into(), fence.to_string()],
            _ => vec![read.to_string(), key.into()],
        };
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let r = evict_the_lock_then(&mut c, "allkeys-lru", &argv);
        assert_eq!(
            lock_stat(&mut c, "evicted"),
            1,
            "{read}: not evicted ({r:?})"
        );
        // It answered as for the lock its holder still holds.
        match *read {
            "LOCK.CHECK" => assert_eq!(r, Resp::Int(1), "{read}"),
            _ => assert_eq!(r.field("fence"), Some(Resp::Int(fence)), "{read}: {r:?}"),
        }
        assert!(
            wait_until(SETTLE, || lock_stat(&mut c, "restored") == 1),
            "{read}: the evicted lock was not put back"
        );
        assert_eq!(info_int(&mut c, key, "fence"), fence, "{read}");
        w.set_read_timeout(Some(Duration::from_millis(300)));
        assert!(w.read().is_err(), "{read}: the waiter was granted the lock");
    }
}

#[test]
fn writes_paused_right_after_the_eviction_the_lock_still_reads_held_and_comes_back() {
    let s = ServerBuilder::new().start();
    let (key, a) = ("lock:paused", tok("evict-p"));
    let (mut c, mut w, fence) = held_with_a_waiter(&s, key, &a);
    // A leader's follower waits for the holder of `fence` to go.
    let mut follower = conn(&s);
    follower.send(&["LOCK.WATCH", key, "FENCE", &fence.to_string(), "BLOCK", "0"]);
    // Reading the key for the watch made it recent: idle again for the LRU clock.
    sleep(Duration::from_millis(2_500));
    let r = evict_the_lock_then(&mut c, "allkeys-lru", &["CLIENT", "PAUSE", "1500", "WRITE"]);
    assert_eq!(r, ok());
    assert_eq!(lock_stat(&mut c, "evicted"), 1);
    // While writes are paused the lock cannot be put back, and reads see it held.
    let info = c.cmd(&["LOCK.INFO", key]);
    assert_eq!(info.field("fence"), Some(Resp::Int(fence)), "{info:?}");
    assert_eq!(
        c.cmd(&["LOCK.CHECK", key, &fence.to_string()]),
        Resp::Int(1)
    );
    assert_eq!(
        lock_stat(&mut c, "restored"),
        0,
        "put back while writes are paused"
    );
    follower.set_read_timeout(Some(Duration::from_millis(500)));
    assert!(
        follower.read().is_err(),
        "the follower heard the holder left"
    );
    // Once writes resume, it is back; nobody else got it.
    assert!(
        wait_until(SETTLE, || lock_stat(&mut c, "restored") == 1),
        "the evicted lock was not put back after the pause"
    );
    assert_eq!(info_int(&mut c, key, "fence"), fence);
    w.set_read_timeout(Some(Duration::from_millis(300)));
    assert!(w.read().is_err(), "the waiter was granted the lock");
    follower.set_read_timeout(Some(Duration::from_millis(300)));
    assert!(
        follower.read().is_err(),
        "the follower heard the holder left"
    );
}

#[test]
fn a_shared_lock_in_a_lock_delay_comes_back_whole_on_the_replica_and_in_the_aof() {
    let p = primary()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .start();
    let r = replica_of(&p, ServerBuilder::new());
    let mut c = conn(&p);
    let key = "lock:shared-delayed";
    // One reader's lease ends without a release: a lock-delay runs beside the other.
    take_px(
        &mut c,
        key,
        &tok("evict-d1"),
        300,
        &["SHARED", "LOCKDELAY", "60000"],
    );
    let fence = take(&mut c, key, &tok("evict-d2"), &["SHARED"]);
    assert!(
        wait_until(SETTLE, || info_int(&mut c, key, "holders") == 1),
        "the first reader's lease did not end"
    );
    assert!(info_int(&mut c, key, "lock-delay") > 0);
    sleep(Duration::from_millis(2_500));
    evict_the_lock(&mut c, "allkeys-lru");
    assert!(
        wait_until(SETTLE, || lock_stat(&mut c, "restored") == 1),
        "not put back"
    );
    caught_up(&p, &r);
    let mut rc = conn(&r);
    let f = fence.to_string();
    for (who, c) in [("primary", &mut c), ("replica", &mut rc)] {
        assert_eq!(c.cmd(&["LOCK.CHECK", key, &f]), Resp::Int(1), "{who}");
        assert_eq!(info_int(c, key, "holders"), 1, "{who}");
        assert!(info_int(c, key, "lock-delay") > 0, "{who}: no lock-delay");
    }
    assert_eq!(c.cmd(&["DEBUG", "LOADAOF"]), ok());
    assert!(
        info_int(&mut c, key, "lock-delay") > 0,
        "no lock-delay after the AOF replay"
    );
}

#[test]
fn swapdb_right_after_the_eviction_puts_the_lock_back_in_its_new_db() {
    let s = ServerBuilder::new().start();
    let mut c = conn(&s);
    let (key, a) = ("lock:swapped", tok("evict-s"));
    let fence = take(&mut c, key, &a, &[]);
    sleep(Duration::from_millis(2_500));
    let r = evict_the_lock_then(&mut c, "allkeys-lru", &["SWAPDB", "0", "1"]);
    assert_eq!(r, ok());
    assert_eq!(lock_stat(&mut c, "evicted"), 1);
    assert!(
        wait_until(SETTLE, || lock_stat(&mut c, "restored") == 1),
        "not put back"
    );
    assert_eq!(c.cmd(&["SELECT", "1"]), ok());
    assert_eq!(info_int(&mut c, key, "fence"), fence);
    assert_eq!(c.cmd(&["LOCK.RELEASE", key, &a]), Resp::Int(1));
}

#[test]
fn a_lock_deleted_by_hand_is_not_put_back_when_a_string_of_its_name_is_evicted() {
    let s = ServerBuilder::new().start();
    let mut c = conn(&s);
    let key = "lock:deleted";
    set(&mut c, "maxmemory-policy", "allkeys-lru");
    set(&mut c, "maxmemory", "512mb");
    set(&mut c, "lock.allow-eviction", "yes");
    take(&mut c, key, &tok("evict-del"), &[]);
    set(&mut c, "lock.allow-eviction", "no");
    // The operator deletes the lock; a classic string lock of the same name follows.
    assert_eq!(c.cmd(&["DEL", key]), Resp::Int(1));
    assert_eq!(
        c.cmd(&["SET", key, "classic-token-0001", "NX", "PX", "60000"]),
        ok()
    );
    sleep(Duration::from_millis(2_500));
    evict_the_lock(&mut c, "allkeys-lru");
    assert_eq!(c.cmd(&["EXISTS", key]), Resp::Int(0), "the string stayed");
    sleep(Duration::from_millis(200));
    assert_eq!(
        c.cmd(&["LOCK.INFO", key]),
        Resp::Nil,
        "the deleted lock came back"
    );
    assert_eq!(lock_stat(&mut c, "restored"), 0);
    assert_eq!(
        lock_stat(&mut c, "evicted"),
        0,
        "a string counted as an evicted lock"
    );
}

#[test]
fn a_lock_given_an_expiry_by_hand_and_evicted_under_volatile_lru_is_counted() {
    let s = ServerBuilder::new().start();
    let mut c = conn(&s);
    let key = "lock:volatile";
    take(&mut c, key, &tok("evict-v"), &[]);
    assert_eq!(c.cmd(&["PEXPIRE", key, "600000"]), Resp::Int(1));
    sleep(Duration::from_millis(2_500));
    // The only key with an expiry: the one volatile-lru can take.
    evict_the_lock(&mut c, "volatile-lru");
    assert_eq!(c.cmd(&["EXISTS", key]), Resp::Int(0));
    assert_eq!(lock_stat(&mut c, "evicted"), 1);
    assert_eq!(lock_stat(&mut c, "restored"), 0);
}
