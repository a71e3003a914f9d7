//! What an operator sees: `INFO lock` counters, keyspace notifications, the `lock.*`
//! configs (CONFIG GET/SET and `loadmodule` arguments), COMMAND INFO and COMMAND DOCS.

mod common;

use common::{
    debug_server, release, server_flavor, starts_with_error_code, wait_until, RawConn, Resp,
    ServerBuilder,
};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

/// Every counter of `INFO lock`, in the order the section lists them (`last_fence` is
/// last).
const COUNTERS: &[&str] = &[
    "held",
    "waiters",
    "watchers",
    "sessions",
    "acquired",
    "renewed",
    "contended",
    "released",
    "extended",
    "expired",
    "removed",
    "evicted",
    "restored",
    "handed_off",
    "wait_timeouts",
    "force_released",
    "repaired",
    "refused_eviction",
    "sessions_opened",
    "sessions_expired",
    "sessions_closed",
    "session_keepalives",
    "sessions_moved",
    "panics",
    "eviction_risk",
    "eviction_allowed",
];

/// Every `lock_*` counter of `INFO lock` except `last_fence`.
fn stats(c: &mut RawConn) -> BTreeMap<String, i64> {
    let m = common::info_map(c, "lock");
    COUNTERS
        .iter()
        .map(|f| {
            let k = format!("lock_{f}");
            let v = m
                .get(&k)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("INFO lock has no {k}: {m:?}"));
            (f.to_string(), v)
        })
        .collect()
}

/// What a contended acquisition moves: one more acquisition, lock held and contention.
const CONTENDED: [(&str, i64); 3] = [("acquired", 1), ("held", 1), ("contended", 1)];

/// Asserts that the counters moved from `before` by exactly `deltas` (others unchanged)
/// and returns the new snapshot.
#[track_caller]
fn expect_moved(
    c: &mut RawConn,
    before: &BTreeMap<String, i64>,
    deltas: &[(&str, i64)],
    step: &str,
) -> BTreeMap<String, i64> {
    let mut want = before.clone();
    for (k, d) in deltas {
        *want.get_mut(*k).unwrap_or_else(|| panic!("no counter {k}")) += d;
    }
    let now = stats(c);
    assert_eq!(now, want, "INFO lock after {step}");
    now
}

fn grant(r: &Resp) -> (Vec<u8>, i64) {
    match r {
        Resp::Array(v) if v.len() == 2 => (v[0].bytes(), v[1].int()),
        other => panic!("expected [token, fence], got {other:?}"),
    }
}

#[test]
fn info_lock_counters_follow_every_outcome() {
    let server = ServerBuilder::new().arg("hz", "100").start();
    let mut c = RawConn::connect(server.port);
    let mut w = RawConn::connect(server.port);
    let s0 = stats(&mut c);
    assert!(s0.values().all(|v| *v == 0), "fresh server: {s0:?}");
    let m = common::info_map(&mut c, "lock");
    assert_eq!(m.get("lock_last_fence").map(String::as_str), Some("0"));
    // The section holds exactly these fields, in this order.
    let text = c.cmd(&["INFO", "lock"]).text();
    let fields: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once(':').map(|(k, _)| k))
        .collect();
    // The counters, with the two wait times (in ms, which depend on timing: checked by
    // lock_info_names_the_waiters_and_how_long_they_wait) in their places.
    let want: Vec<String> = COUNTERS
        .iter()
        .flat_map(|f| match *f {
            "waiters" => vec!["waiters", "longest_wait_ms"],
            "panics" => vec!["waited_ms", "panics"],
            f => vec![f],
        })
        .chain(["last_fence"])
        .map(|f| format!("lock_{f}"))
        .collect();
    assert_eq!(fields, want, "INFO lock fields");

    // acquire, renew, contended, extend (and no-ops that must not count).
    c.cmd(&[
        "LOCK.ACQUIRE",
        "c:a",
        "TOKEN",
        "a--------------------tok",
        "PX",
        "60000",
    ]);
    let s = expect_moved(&mut c, &s0, &[("acquired", 1), ("held", 1)], "acquire");
    c.cmd(&["LOCK.ACQUIRE", "c:a", "TOKEN", "a--------------------tok"]);
    let s = expect_moved(&mut c, &s, &[("renewed", 1)], "renew");
    assert_eq!(c.cmd(&["LOCK.ACQUIRE", "c:a"]), Resp::Nil);
    let s = expect_moved(&mut c, &s, &[("contended", 1)], "contended acquire");
    assert_eq!(
        c.cmd(&[
            "LOCK.EXTEND",
            "c:a",
            "a--------------------tok",
            "PX",
            "60000"
        ]),
        Resp::Int(1)
    );
    let s = expect_moved(&mut c, &s, &[("extended", 1)], "extend (not a renew)");
    assert_eq!(c.cmd(&["LOCK.EXTEND", "c:a", "zz"]), Resp::Int(0));
    assert_eq!(c.cmd(&["LOCK.RELEASE", "c:a", "zz"]), Resp::Int(0));
    assert_eq!(c.cmd(&["LOCK.FORCERELEASE", "c:none"]), Resp::Int(0));
    assert!(c.cmd(&["LOCK.ACQUIRE", "c:a", "PX", "0"]).is_error());
    let s = expect_moved(
        &mut c,
        &s,
        &[],
        "failed extend/release/forcerelease/acquire",
    );
    assert_eq!(release(&mut c, "c:a", "a--------------------tok"), 1);
    let s = expect_moved(&mut c, &s, &[("released", 1), ("held", -1)], "release");

    // A module lock that expires by itself (active expiry, nobody touches the key).
    c.cmd(&["LOCK.ACQUIRE", "c:e", "PX", "50"]);
    let s = expect_moved(&mut c, &s, &[("acquired", 1), ("held", 1)], "short acquire");
    assert!(
        wait_until(Duration::from_secs(10), || stats(&mut c)["expired"] == 1),
        "lock_expired did not move: {:?}",
        stats(&mut c)
    );
    let s = expect_moved(&mut c, &s, &[("expired", 1), ("held", -1)], "expiry");

    // FORCERELEASE.
    c.cmd(&["LOCK.ACQUIRE", "c:f"]);
    assert_eq!(c.cmd(&["LOCK.FORCERELEASE", "c:f"]), Resp::Int(1));
    let s = expect_moved(
        &mut c,
        &s,
        &[("acquired", 1), ("force_released", 1)],
        "forcerelease",
    );

    // A waiter, then a hand-off on release.
    c.cmd(&["LOCK.ACQUIRE", "c:h", "TOKEN", "h--------------------tok"]);
    w.send(&[
        "LOCK.ACQUIRE",
        "c:h",
        "BLOCK",
        "10000",
        "TOKEN",
        "w--------------------tok",
    ]);
    assert!(wait_until(Duration::from_secs(5), || stats(&mut c)
        ["waiters"]
        == 1));
    let waiting = [&CONTENDED[..], &[("waiters", 1)]].concat();
    let s = expect_moved(&mut c, &s, &waiting, "a client waiting");
    assert_eq!(release(&mut c, "c:h", "h--------------------tok"), 1);
    let (tok, _) = grant(&w.read().unwrap());
    assert_eq!(tok, b"w--------------------tok");
    let s = expect_moved(
        &mut c,
        &s,
        &[
            ("released", 1),
            ("handed_off", 1),
            ("acquired", 1),
            ("waiters", -1),
        ],
        "hand-off",
    );
    assert_eq!(release(&mut c, "c:h", "w--------------------tok"), 1);
    let s = expect_moved(&mut c, &s, &[("released", 1), ("held", -1)], "release");

    // A wait that times out.
    c.cmd(&["LOCK.ACQUIRE", "c:t", "TOKEN", "t--------------------tok"]);
    assert_eq!(
        w.cmd(&["LOCK.ACQUIRE", "c:t", "BLOCK", "50"]),
        Resp::Nil,
        "a timed-out wait answers nil"
    );
    let timed_out = [&CONTENDED[..], &[("wait_timeouts", 1)]].concat();
    let s = expect_moved(&mut c, &s, &timed_out, "wait timeout");

    // A hand-off when the holder's lease ends: an expiry and a hand-off.
    c.cmd(&["LOCK.ACQUIRE", "c:x", "PX", "100"]);
    w.send(&[
        "LOCK.ACQUIRE",
        "c:x",
        "BLOCK",
        "10000",
        "TOKEN",
        "wx-------------------tok",
    ]);
    let (tok, _) = grant(&w.read().unwrap());
    assert_eq!(tok, b"wx-------------------tok");
    // The holder's acquisition and the waiter's contended one.
    let handed = [
        &CONTENDED[..],
        &[("acquired", 1), ("expired", 1), ("handed_off", 1)],
    ]
    .concat();
    let s = expect_moved(&mut c, &s, &handed, "hand-off at lease end");

    // A lock key the server removes by hand counts as removed, not released or expired:
    // DEL (held goes down), RENAME away (the lock lives on under the new name: still
    // held), an overwrite by SET (gone).
    c.cmd(&["LOCK.ACQUIRE", "c:d"]);
    assert_eq!(c.cmd(&["DEL", "c:d"]), Resp::Int(1));
    let s = expect_moved(&mut c, &s, &[("acquired", 1), ("removed", 1)], "DEL");
    c.cmd(&["LOCK.ACQUIRE", "c:r"]);
    assert_eq!(c.cmd(&["RENAME", "c:r", "c:r2"]), Resp::Simple("OK".into()));
    let s = expect_moved(
        &mut c,
        &s,
        &[("acquired", 1), ("held", 1), ("removed", 1)],
        "RENAME",
    );
    assert_eq!(c.cmd(&["SET", "c:r2", "x"]), Resp::Simple("OK".into()));
    let s = expect_moved(
        &mut c,
        &s,
        &[("held", -1), ("removed", 1)],
        "SET over a lock",
    );
    assert_eq!(c.cmd(&["DEL", "c:r2"]), Resp::Int(1));
    let s = expect_moved(&mut c, &s, &[], "DEL of a string");

    // held counts every lock in memory; FLUSHALL frees them without counting expiries
    // or removals.
    for i in 0..5 {
        c.cmd(&["LOCK.ACQUIRE", &format!("c:many:{i}")]);
    }
    let s = expect_moved(&mut c, &s, &[("acquired", 5), ("held", 5)], "five more");
    assert_eq!(s["held"], 7);
    assert_eq!(c.cmd(&["FLUSHALL", "SYNC"]), Resp::Simple("OK".into()));
    let s = expect_moved(&mut c, &s, &[("held", -7)], "FLUSHALL");
    assert_eq!(s["panics"], 0);

    // lock_last_fence is the last fence granted.
    let (_, f) = grant(&c.cmd(&["LOCK.ACQUIRE", "c:last"]));
    assert_eq!(common::lock_stat(&mut c, "last_fence"), f);
}

/// A lease that ends while a client waits is an expiry like any other: the waiter gets
/// the lock, and `lock_expired` and the `expired` notification record the old lease.
#[test]
fn a_lease_ending_under_a_waiter_counts_as_expired() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    let mut w = RawConn::connect(server.port);
    c.cmd(&["CONFIG", "SET", "notify-keyspace-events", "Ex"]);
    let mut sub = server.conn();
    let mut ps = sub.as_pubsub();
    ps.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    ps.subscribe("__keyevent@0__:expired").unwrap();
    let rounds = 20;
    for i in 0..rounds {
        c.cmd(&[
            "LOCK.ACQUIRE",
            "lock:le",
            "PX",
            "30",
            "TOKEN",
            "holder---------------tok",
        ]);
        let tok = common::tok(&format!("w{i}"));
        let r = w.cmd(&["LOCK.ACQUIRE", "lock:le", "BLOCK", "5000", "TOKEN", &tok]);
        assert_eq!(grant(&r).0, tok.as_bytes());
        assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:le", &tok]), Resp::Int(1));
    }
    let s = stats(&mut c);
    assert_eq!(s["handed_off"], rounds);
    assert_eq!(
        s["expired"],
        rounds,
        "{} of {rounds} leases that ended under a waiter were not counted as expired",
        rounds - s["expired"]
    );
    for _ in 0..rounds {
        assert_eq!(
            next_msg(&mut ps),
            ("__keyevent@0__:expired".to_string(), "lock:le".to_string())
        );
    }
}

/// Next pub/sub message as `(channel, payload)`.
fn next_msg(ps: &mut redis::PubSub<'_>) -> (String, String) {
    let m = ps
        .get_message()
        .expect("a keyspace notification within the read timeout");
    (
        m.get_channel_name().to_string(),
        m.get_payload::<String>().expect("text payload"),
    )
}

#[test]
fn keyspace_notifications_for_every_change() {
    let server = ServerBuilder::new().arg("hz", "100").start();
    let mut c = RawConn::connect(server.port);
    let mut w = RawConn::connect(server.port);
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "notify-keyspace-events", "KEgx"]),
        Resp::Simple("OK".into())
    );
    let ks = "__keyspace@0__:lock:n";
    let handoff_ev = "__keyevent@0__:lock.handoff";
    let mut sub = server.conn();
    let mut ps = sub.as_pubsub();
    ps.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    ps.subscribe(ks).unwrap();
    ps.subscribe(handoff_ev).unwrap();
    let ev = |e: &str| (ks.to_string(), e.to_string());
    // A marker published on the same channel proves nothing else came in between.
    let mut marker_no = 0;
    let mut marker = |c: &mut RawConn, ps: &mut redis::PubSub<'_>| {
        marker_no += 1;
        let m = format!("marker-{marker_no}");
        c.cmd(&["PUBLISH", ks, &m]);
        assert_eq!(next_msg(ps), (ks.to_string(), m));
    };

    c.cmd(&[
        "LOCK.ACQUIRE",
        "lock:n",
        "TOKEN",
        "a--------------------tok",
        "PX",
        "60000",
    ]);
    assert_eq!(next_msg(&mut ps), ev("lock.acquire"));
    c.cmd(&[
        "LOCK.ACQUIRE",
        "lock:n",
        "TOKEN",
        "a--------------------tok",
    ]);
    assert_eq!(next_msg(&mut ps), ev("lock.acquire"), "idempotent renew");
    assert_eq!(
        c.cmd(&[
            "LOCK.EXTEND",
            "lock:n",
            "a--------------------tok",
            "PX",
            "60000"
        ]),
        Resp::Int(1)
    );
    assert_eq!(next_msg(&mut ps), ev("lock.extend"));
    // Nothing for operations that change nothing.
    assert_eq!(c.cmd(&["LOCK.ACQUIRE", "lock:n"]), Resp::Nil);
    assert_eq!(c.cmd(&["LOCK.EXTEND", "lock:n", "b"]), Resp::Int(0));
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:n", "b"]), Resp::Int(0));
    assert!(c.cmd(&["LOCK.ACQUIRE", "lock:n", "PX", "x"]).is_error());
    c.cmd(&["LOCK.INFO", "lock:n"]);
    marker(&mut c, &mut ps);
    assert_eq!(release(&mut c, "lock:n", "a--------------------tok"), 1);
    assert_eq!(next_msg(&mut ps), ev("lock.release"));
    assert_eq!(c.cmd(&["LOCK.FORCERELEASE", "lock:n"]), Resp::Int(0));
    marker(&mut c, &mut ps);

    c.cmd(&["LOCK.ACQUIRE", "lock:n"]);
    assert_eq!(next_msg(&mut ps), ev("lock.acquire"));
    assert_eq!(c.cmd(&["LOCK.FORCERELEASE", "lock:n"]), Resp::Int(1));
    assert_eq!(next_msg(&mut ps), ev("lock.forcerelease"));

    // A blocked waiter gets the lock: release, then handoff (keyspace and keyevent).
    c.cmd(&[
        "LOCK.ACQUIRE",
        "lock:n",
        "TOKEN",
        "a--------------------tok",
    ]);
    assert_eq!(next_msg(&mut ps), ev("lock.acquire"));
    w.send(&[
        "LOCK.ACQUIRE",
        "lock:n",
        "BLOCK",
        "10000",
        "TOKEN",
        "w--------------------tok",
    ]);
    assert!(wait_until(Duration::from_secs(5), || c
        .cmd(&["LOCK.INFO", "lock:n"])
        .field("waiters")
        == Some(Resp::Int(1))));
    marker(&mut c, &mut ps); // queueing is not a change of the key
    assert_eq!(release(&mut c, "lock:n", "a--------------------tok"), 1);
    assert_eq!(next_msg(&mut ps), ev("lock.release"));
    assert_eq!(next_msg(&mut ps), ev("lock.handoff"));
    assert_eq!(
        next_msg(&mut ps),
        (handoff_ev.to_string(), "lock:n".to_string())
    );
    assert_eq!(grant(&w.read().unwrap()).0, b"w--------------------tok");
    assert_eq!(c.cmd(&["LOCK.FORCERELEASE", "lock:n"]), Resp::Int(1));
    assert_eq!(next_msg(&mut ps), ev("lock.forcerelease"));

    // Expiry shows as Redis's own `expired` (class x).
    c.cmd(&["LOCK.ACQUIRE", "lock:n", "PX", "50"]);
    assert_eq!(next_msg(&mut ps), ev("lock.acquire"));
    assert_eq!(next_msg(&mut ps), ev("expired"));

    // The lock events are class g: without it they are not published.
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "notify-keyspace-events", "Kx"]),
        Resp::Simple("OK".into())
    );
    c.cmd(&[
        "LOCK.ACQUIRE",
        "lock:n",
        "TOKEN",
        "q--------------------tok",
    ]);
    c.cmd(&["LOCK.RELEASE", "lock:n", "q--------------------tok"]);
    marker(&mut c, &mut ps);
}

#[track_caller]
fn config_get(c: &mut RawConn, name: &str) -> String {
    let r = c.cmd(&["CONFIG", "GET", name]);
    let pairs = r.pairs();
    assert_eq!(pairs.len(), 1, "CONFIG GET {name}: {r:?}");
    assert_eq!(pairs[0].0, name);
    pairs[0].1.text()
}

#[track_caller]
fn config_set_err(c: &mut RawConn, name: &str, value: &str) -> String {
    let r = c.cmd(&["CONFIG", "SET", name, value]);
    let Resp::Error(e) = r else {
        panic!("CONFIG SET {name} {value} should fail, got {r:?}")
    };
    assert!(starts_with_error_code(&e), "{e:?}");
    e
}

#[track_caller]
fn config_set_ok(c: &mut RawConn, name: &str, value: &str) {
    let r = c.cmd(&["CONFIG", "SET", name, value]);
    assert_eq!(r, Resp::Simple("OK".into()), "CONFIG SET {name} {value}");
    assert_eq!(config_get(c, name), value);
}

/// The lease of the module lock `key` (LOCK.INFO `ttl`) is in `(lo, hi]`; the key has no
/// Redis expiry.
#[track_caller]
fn lease_in(c: &mut RawConn, key: &str, lo: i64, hi: i64) {
    let p = c.cmd(&["LOCK.INFO", key]).field("ttl").expect("ttl").int();
    assert!(p > lo && p <= hi, "{key}: lease {p}, expected ({lo}, {hi}]");
    assert_eq!(c.cmd(&["PTTL", key]), Resp::Int(-1), "PTTL {key}");
}

#[test]
fn config_get_set_bounds_cross_check_and_effect() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    assert_eq!(config_get(&mut c, "lock.default-ttl"), "30000");
    assert_eq!(config_get(&mut c, "lock.max-ttl"), "86400000");
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "10000");
    assert_eq!(config_get(&mut c, "lock.min-token-length"), "16");
    let all = c.cmd(&["CONFIG", "GET", "lock.*"]).pairs();
    let names: HashSet<String> = all.into_iter().map(|(k, _)| k).collect();
    for n in [
        "lock.default-ttl",
        "lock.max-ttl",
        "lock.max-waiters",
        "lock.min-token-length",
    ] {
        assert!(names.contains(n), "CONFIG GET lock.* lacks {n}: {names:?}");
    }

    // Out of bounds / not numbers: refused, value unchanged.
    for name in [
        "lock.default-ttl",
        "lock.max-ttl",
        "lock.max-waiters",
        "lock.min-token-length",
    ] {
        let before = config_get(&mut c, name);
        for bad in ["0", "-5", "abc", ""] {
            config_set_err(&mut c, name, bad);
        }
        assert_eq!(config_get(&mut c, name), before);
    }
    // lock.min-token-length is 1..=256 (tests/holes.rs row 10 checks what it does).
    config_set_err(&mut c, "lock.min-token-length", "257");
    config_set_ok(&mut c, "lock.min-token-length", "256");
    config_set_ok(&mut c, "lock.min-token-length", "1");
    config_set_ok(&mut c, "lock.min-token-length", "16");
    // default-ttl > max-ttl is refused from either side.
    let e = config_set_err(&mut c, "lock.default-ttl", "86400001");
    assert!(e.contains("max-ttl"), "{e}");
    let e = config_set_err(&mut c, "lock.max-ttl", "29999");
    assert!(e.contains("default-ttl"), "{e}");
    assert_eq!(config_get(&mut c, "lock.default-ttl"), "30000");
    assert_eq!(config_get(&mut c, "lock.max-ttl"), "86400000");

    // New values take effect at once.
    config_set_ok(&mut c, "lock.default-ttl", "1500");
    c.cmd(&["LOCK.ACQUIRE", "lock:d"]);
    lease_in(&mut c, "lock:d", 500, 1500);
    config_set_ok(&mut c, "lock.max-ttl", "2000");
    let e = c.cmd(&["LOCK.ACQUIRE", "lock:big", "PX", "2001"]).err();
    assert!(e.starts_with("ERR invalid expire time"), "{e}");
    let e = c.cmd(&["LOCK.ACQUIRE", "lock:big", "EX", "3"]).err();
    assert!(e.starts_with("ERR invalid expire time"), "{e}");
    let (tok, _) = grant(&c.cmd(&["LOCK.ACQUIRE", "lock:big", "PX", "2000"]));
    lease_in(&mut c, "lock:big", 1000, 2000);
    let tok = String::from_utf8(tok).unwrap();
    let e = c
        .cmd(&["LOCK.EXTEND", "lock:big", &tok, "PX", "2001"])
        .err();
    assert!(e.starts_with("ERR invalid expire time"), "{e}");
    assert_eq!(c.cmd(&["LOCK.EXTEND", "lock:big", &tok]), Resp::Int(1));
    lease_in(&mut c, "lock:big", 500, 1500);
    // Both ways again at the new values.
    config_set_err(&mut c, "lock.max-ttl", "1499");
    config_set_err(&mut c, "lock.default-ttl", "2001");
    config_set_ok(&mut c, "lock.max-ttl", "1500");
    assert_eq!(config_get(&mut c, "lock.default-ttl"), "1500");

    // max-waiters 1: one waiter queues, the second is refused.
    config_set_ok(&mut c, "lock.max-waiters", "1");
    config_set_ok(&mut c, "lock.max-ttl", "86400000");
    c.cmd(&[
        "LOCK.ACQUIRE",
        "lock:q",
        "TOKEN",
        "h--------------------tok",
        "PX",
        "60000",
    ]);
    let mut w1 = RawConn::connect(server.port);
    w1.send(&["LOCK.ACQUIRE", "lock:q", "BLOCK", "10000"]);
    assert!(wait_until(Duration::from_secs(5), || c
        .cmd(&["LOCK.INFO", "lock:q"])
        .field("waiters")
        == Some(Resp::Int(1))));
    let e = c.cmd(&["LOCK.ACQUIRE", "lock:q", "BLOCK", "10000"]).err();
    assert!(e.starts_with("MAXWAITERS"), "{e}");
    assert_eq!(c.cmd(&["LOCK.FORCERELEASE", "lock:q"]), Resp::Int(1));
    assert!(matches!(w1.read().unwrap(), Resp::Array(_)));
}

/// `CONFIG SET a x b y` is atomic in Redis: the pair is judged as a whole, so a valid
/// final pair is accepted in either order and an invalid one leaves both unchanged.
#[test]
fn config_set_of_both_ttls_in_one_command_is_order_independent() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    let set = |c: &mut RawConn, args: &[&str]| {
        let mut a = vec!["CONFIG", "SET"];
        a.extend_from_slice(args);
        c.cmd(&a)
    };
    let both = |c: &mut RawConn| {
        (
            config_get(c, "lock.default-ttl"),
            config_get(c, "lock.max-ttl"),
        )
    };
    // Lowering both: max-ttl first would be below the old default on its own.
    let r = set(&mut c, &["lock.max-ttl", "1000", "lock.default-ttl", "500"]);
    assert_eq!(r, Resp::Simple("OK".into()), "lowering both, max-ttl first");
    assert_eq!(both(&mut c), ("500".into(), "1000".into()));
    // Raising both: default-ttl first would be above the old max on its own.
    let r = set(
        &mut c,
        &["lock.default-ttl", "60000", "lock.max-ttl", "120000"],
    );
    assert_eq!(
        r,
        Resp::Simple("OK".into()),
        "raising both, default-ttl first"
    );
    assert_eq!(both(&mut c), ("60000".into(), "120000".into()));
    // An invalid pair is refused whole.
    let r = set(
        &mut c,
        &["lock.max-ttl", "5000", "lock.default-ttl", "6000"],
    );
    assert!(r.is_error(), "{r:?}");
    assert_eq!(both(&mut c), ("60000".into(), "120000".into()));
}

#[test]
fn loadmodule_arguments_set_the_configs() {
    let server = ServerBuilder::new()
        .module_args(&[
            "default-ttl",
            "1234",
            "lock.max-ttl",
            "5000",
            "max-waiters",
            "3",
        ])
        .start();
    let mut c = RawConn::connect(server.port);
    assert_eq!(config_get(&mut c, "lock.default-ttl"), "1234");
    assert_eq!(config_get(&mut c, "lock.max-ttl"), "5000");
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "3");
    c.cmd(&["LOCK.ACQUIRE", "lock:a"]);
    lease_in(&mut c, "lock:a", 234, 1234);
    let e = c.cmd(&["LOCK.ACQUIRE", "lock:b", "PX", "5001"]).err();
    assert!(e.starts_with("ERR invalid expire time"), "{e}");
    c.cmd(&["LOCK.ACQUIRE", "lock:b", "PX", "5000"]);
    lease_in(&mut c, "lock:b", 4000, 5000);
    drop(server);

    // A config-file / command-line value overrides the loadmodule argument.
    let server = ServerBuilder::new()
        .module_args(&["max-waiters", "3"])
        .arg("lock.max-waiters", "7")
        .start();
    let mut c = RawConn::connect(server.port);
    assert_eq!(config_get(&mut c, "lock.max-waiters"), "7");
}

#[test]
fn bad_loadmodule_arguments_stop_the_server() {
    for (args, needle) in [
        (&["bogus", "1"][..], "bogus"),
        (&["max-ttl", "0"], "max-ttl"),
        (&["max-ttl"], "max-ttl"),
        (&["default-ttl", "-1"], "default-ttl"),
        (&["default-ttl", "10000", "max-ttl", "5000"], "default-ttl"),
        (&["debug-commands", "maybe"], "debug-commands"),
    ] {
        let err = ServerBuilder::new()
            .module_args(args)
            .start_timeout(Duration::from_secs(10))
            .try_start()
            .err()
            .unwrap_or_else(|| panic!("the server started with module args {args:?}"));
        assert!(
            err.contains("redis-lock"),
            "module args {args:?}: the log does not mention redis-lock:\n{err}"
        );
        let line = err
            .lines()
            .find(|l| l.contains("redis-lock:"))
            .unwrap_or_default();
        assert!(
            line.contains(needle),
            "module args {args:?}: the log line {line:?} should name {needle:?}"
        );
    }
}

/// Every `token` value anywhere in a COMMAND DOCS argument tree (RESP2 descriptions are
/// flat field/value arrays, so only even positions are field names).
fn tokens(r: &Resp, out: &mut HashSet<String>) {
    match r {
        Resp::Array(v) => {
            for pair in v.chunks(2) {
                if let [Resp::Bulk(k), val @ (Resp::Bulk(_) | Resp::Simple(_))] = pair {
                    if k == b"token" {
                        out.insert(val.text());
                    }
                }
            }
            for x in v {
                tokens(x, out);
            }
        }
        Resp::Map(m) => {
            for (k, v) in m {
                if k.text() == "token" {
                    out.insert(v.text());
                }
                tokens(v, out);
            }
        }
        _ => {}
    }
}

/// Names of the status replies in an array (COMMAND INFO flags).
fn names(r: &Resp) -> HashSet<String> {
    r.items().iter().map(Resp::text).collect()
}

/// What COMMAND INFO / DOCS must say about one command: name, arity, flags, key-spec
/// flags, argument tokens (space-separated), ACL categories (where the server lets a module set them).
type CmdSpec = (
    &'static str,
    i64,
    &'static [&'static str],
    &'static [&'static str],
    &'static str,
    &'static [&'static str],
);

/// The ACL categories COMMAND INFO shows for `entry` (its 7th element).
fn acl_categories(entry: &[Resp]) -> HashSet<String> {
    names(&entry[6])
}

#[test]
fn command_info_and_docs() {
    // With `debug-commands yes`, the one way LOCK.DEBUG is there to document.
    let server = debug_server().start();
    let mut c = RawConn::connect(server.port);
    let table: &[CmdSpec] = &[
        (
            "lock.acquire",
            -2,
            &["write", "denyoom", "blocking"],
            &["RW", "ACCESS", "INSERT"],
            "SHARED LIMIT PX EX TOKEN OWNER BLOCK MINFENCE LOCKDELAY SESSION",
            &["@write", "@blocking", "@slow", "@lock"],
        ),
        (
            "lock.release",
            3,
            &["write", "fast"],
            &["RW", "ACCESS", "DELETE"],
            "",
            &["@write", "@fast", "@lock"],
        ),
        (
            "lock.extend",
            -3,
            &["write", "fast"],
            &["RW", "ACCESS", "UPDATE"],
            "PX EX OWNER",
            &["@write", "@fast", "@lock"],
        ),
        (
            "lock.check",
            3,
            &["readonly", "fast"],
            &["RO", "ACCESS"],
            "",
            &["@read", "@fast", "@lock"],
        ),
        (
            "lock.watch",
            -2,
            &["readonly", "blocking"],
            &["RO", "ACCESS"],
            "FENCE OWNER BLOCK",
            &["@read", "@blocking", "@slow", "@lock"],
        ),
        (
            "lock.info",
            -2,
            &["readonly", "fast"],
            &["RO", "ACCESS"],
            "COUNT AFTER WAITERS",
            &["@read", "@fast", "@lock"],
        ),
        (
            "lock.forcerelease",
            -2,
            &["write"],
            &["RW", "DELETE"],
            "FENCE",
            &["@write", "@dangerous", "@slow", "@lock"],
        ),
    ];
    // Redis 7.2+ and Valkey let a module put its commands in ACL categories; on 7.0
    // they are in none (users grant them by name or with +@all).
    let categorised = server_flavor().at_least(7, 2);
    for &(name, arity, flags, ks_flags, toks, cats) in table {
        let r = c.cmd(&["COMMAND", "INFO", name]);
        let entry = r.items()[0].items();
        assert_eq!(entry[0].text(), name);
        assert_eq!(entry[1], Resp::Int(arity), "{name} arity");
        let f = names(&entry[2]);
        for want in flags {
            assert!(f.contains(*want), "{name} flags {f:?} lack {want}");
        }
        assert!(f.contains("module"), "{name} flags {f:?}");
        let want: HashSet<String> = if categorised {
            cats.iter().map(|s| s.to_string()).collect()
        } else {
            HashSet::new()
        };
        assert_eq!(acl_categories(&entry), want, "{name} ACL categories");
        // Legacy key range: first key 1, last 1, step 1.
        assert_eq!(
            &entry[3..6],
            &[Resp::Int(1), Resp::Int(1), Resp::Int(1)],
            "{name} key range"
        );
        let specs = entry[8].items();
        assert_eq!(specs.len(), 1, "{name} key specs {specs:?}");
        let spec = &specs[0];
        // Redis writes these as "RW", "access", "insert": compare without case.
        let kf: HashSet<String> = names(&spec.field("flags").unwrap())
            .iter()
            .map(|f| f.to_uppercase())
            .collect();
        let want: HashSet<String> = ks_flags.iter().map(|s| s.to_string()).collect();
        assert_eq!(kf, want, "{name} key spec flags");
        let bs = spec.field("begin_search").unwrap();
        assert_eq!(bs.field("type").unwrap().text(), "index");
        assert_eq!(
            bs.field("spec").unwrap().field("index"),
            Some(Resp::Int(1)),
            "{name} begin_search"
        );
        let fk = spec.field("find_keys").unwrap();
        assert_eq!(fk.field("type").unwrap().text(), "range");
        let fks = fk.field("spec").unwrap();
        assert_eq!(fks.field("lastkey"), Some(Resp::Int(0)));
        assert_eq!(fks.field("keystep"), Some(Resp::Int(1)));

        // COMMAND DOCS: a summary and the arguments with their tokens.
        let d = c.cmd(&["COMMAND", "DOCS", name]);
        let doc = d
            .field(name)
            .unwrap_or_else(|| panic!("COMMAND DOCS {name}: {d:?}"));
        assert!(!doc.field("summary").unwrap().text().is_empty());
        let args = doc
            .field("arguments")
            .unwrap_or_else(|| panic!("{name} docs without arguments: {doc:?}"));
        let first = &args.items()[0];
        assert_eq!(first.field("name").unwrap().text(), "key");
        assert_eq!(first.field("type").unwrap().text(), "key");
        let mut found = HashSet::new();
        tokens(&args, &mut found);
        let want: HashSet<String> = toks.split_whitespace().map(String::from).collect();
        assert_eq!(found, want, "{name} argument tokens");

        // The key is found where the specs say.
        let mut getkeys = vec!["COMMAND", "GETKEYS", name, "lock:k"];
        getkeys.extend(match arity {
            3 | -3 => &["tok"][..],
            _ => &[][..],
        });
        let keys = c.cmd(&getkeys);
        assert_eq!(
            keys,
            Resp::Array(vec![Resp::Bulk(b"lock:k".to_vec())]),
            "{name}"
        );
    }
    // Arguments of RELEASE / EXTEND by name.
    let d = c.cmd(&["COMMAND", "DOCS", "lock.release"]);
    let args = d.field("lock.release").unwrap().field("arguments").unwrap();
    let arg_names: Vec<String> = args
        .items()
        .iter()
        .map(|a| a.field("name").unwrap().text())
        .collect();
    assert_eq!(arg_names, ["key", "token"]);
    // COMMAND LIST FILTERBY MODULE lists every command.
    let listed = names(&c.cmd(&["COMMAND", "LIST", "FILTERBY", "MODULE", "lock"]));
    for (name, ..) in table {
        assert!(listed.contains(*name), "{name} not in {listed:?}");
    }
    // The commands of several keys (numkeys first) and the session command (no key):
    // documented, listed, and their keys found.
    for (name, getkeys, want) in [
        (
            "lock.acquireall",
            &["2", "k1", "k2", "MODES", "SHARED", "EXCLUSIVE", "PX", "10"][..],
            &["k1", "k2"][..],
        ),
        ("lock.releaseall", &["2", "k1", "k2", "tok"], &["k1", "k2"]),
        ("lock.extendall", &["1", "k1", "tok", "PX", "5"], &["k1"]),
    ] {
        let keys = c.cmd(&[&["COMMAND", "GETKEYS", name][..], getkeys].concat());
        let want: Vec<Resp> = want
            .iter()
            .map(|k| Resp::Bulk(k.as_bytes().to_vec()))
            .collect();
        assert_eq!(keys, Resp::Array(want), "{name} keys");
    }
    for name in [
        "lock.acquireall",
        "lock.releaseall",
        "lock.extendall",
        "lock.session",
    ] {
        let d = c.cmd(&["COMMAND", "DOCS", name]);
        let doc = d
            .field(name)
            .unwrap_or_else(|| panic!("COMMAND DOCS {name}: {d:?}"));
        assert!(!doc.field("summary").unwrap().text().is_empty(), "{name}");
        assert!(doc.field("arguments").is_some(), "{name} arguments");
        assert!(listed.contains(name), "{name} not in {listed:?}");
    }
    // The internal commands: replication (write, dangerous) and debugging (admin), their
    // arity (the shortest form each may arrive in: `LOCK.REPL key <op>;<fields>`,
    // `LOCK.SREPL <op>;<fields>`) and the option tokens COMMAND DOCS names.
    for (name, arity, toks, cats) in [
        (
            "lock.repl",
            -3,
            "OWNER FLOOR LOCKDELAY SESSION",
            &["@write", "@dangerous", "@slow", "@lock"][..],
        ),
        (
            "lock.srepl",
            -2,
            "",
            &["@write", "@dangerous", "@slow", "@lock"],
        ),
        (
            "lock.sync",
            -8,
            "OWNER FLOOR",
            &["@write", "@dangerous", "@slow", "@lock"],
        ),
        (
            "lock.debug",
            -2,
            "",
            &["@admin", "@dangerous", "@slow", "@lock"],
        ),
    ] {
        let r = c.cmd(&["COMMAND", "INFO", name]);
        let entry = r.items()[0].items();
        assert_eq!(entry[0].text(), name);
        assert_eq!(entry[1], Resp::Int(arity), "{name} arity");
        let d = c.cmd(&["COMMAND", "DOCS", name]);
        let mut found = HashSet::new();
        tokens(&d, &mut found);
        let want: HashSet<String> = toks.split_whitespace().map(String::from).collect();
        assert_eq!(found, want, "{name} argument tokens");
        let want: HashSet<String> = if categorised {
            cats.iter().map(|s| s.to_string()).collect()
        } else {
            HashSet::new()
        };
        assert_eq!(acl_categories(&entry), want, "{name} ACL categories");
        assert!(listed.contains(name), "{name} not in {listed:?}");
    }
}

/// `MODULE LIST` reports the crate's version as the server numbers its own modules'
/// versions: major * 10000 + minor * 100 + patch (0.1.0 is 100, 1.2.3 is 10203).
#[test]
fn module_list_reports_the_crate_version() {
    let part = |s: &str| s.parse::<i64>().expect("a Cargo version part");
    let want = part(env!("CARGO_PKG_VERSION_MAJOR")) * 10_000
        + part(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + part(env!("CARGO_PKG_VERSION_PATCH"));
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    let list = c.cmd(&["MODULE", "LIST"]);
    let lock = list
        .items()
        .into_iter()
        .find(|m| m.field("name").map(|n| n.text()) == Some("lock".into()))
        .unwrap_or_else(|| panic!("no module 'lock' in MODULE LIST: {list:?}"));
    assert_eq!(
        lock.field("ver").map(|v| v.int()),
        Some(want),
        "MODULE LIST ver for {}: {lock:?}",
        env!("CARGO_PKG_VERSION")
    );
}

/// Every string anywhere in a reply.
fn strings(r: &Resp) -> Vec<String> {
    match r {
        Resp::Bulk(_) | Resp::Simple(_) => vec![r.text()],
        Resp::Array(v) | Resp::Set(v) | Resp::Push(v) => v.iter().flat_map(strings).collect(),
        Resp::Verbatim(_, b) => vec![String::from_utf8_lossy(b).into_owned()],
        Resp::Map(m) => m
            .iter()
            .flat_map(|(k, v)| strings(k).into_iter().chain(strings(v)))
            .collect(),
        _ => Vec::new(),
    }
}

/// `d` in ms, less 10%: a lower bound of what the server measures over `d`.
fn at_least(d: Duration) -> i64 {
    d.as_millis() as i64 * 9 / 10
}

/// `d` in ms, plus 10%: an upper bound of what the server measures over `d`.
fn within(d: Duration) -> i64 {
    d.as_millis() as i64 * 11 / 10 + 1
}

/// One entry of a `waiter-list` as (client-id, client-addr, owner, mode, waited).
fn waiter_entry(r: &Resp) -> (i64, String, Option<String>, String, i64) {
    let f = |k: &str| {
        r.field(k)
            .unwrap_or_else(|| panic!("waiter lacks {k}: {r:?}"))
    };
    let owner = match f("owner") {
        Resp::Nil => None,
        o => Some(o.text()),
    };
    (
        f("client-id").int(),
        f("client-addr").text(),
        owner,
        f("mode").text(),
        f("waited").int(),
    )
}

/// `LOCK.INFO key WAITERS n` names the first n waiters (client id and address, owner
/// label, mode asked, ms waited; never a token), `longest-wait` is the first one's wait,
/// and `INFO lock` has the longest current wait and the total of finished waits. Each is
/// at least the time this test slept while they waited, at most the time it has run; both
/// with 10% to spare, since the server's monotonic clock (which Redis may count in CPU
/// ticks) can run a little off this process's.
#[test]
fn lock_info_names_the_waiters_and_how_long_they_wait() {
    use common::raw::Waiter;
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    let holder = "holder---------------tok";
    let (w1_tok, w2_tok) = ("waiter-1-------------tok", "waiter-2-------------tok");
    c.cmd(&["LOCK.ACQUIRE", "lock:q", "TOKEN", holder, "PX", "60000"]);
    // Before anyone waits: no wait to show.
    let r = c.cmd(&["LOCK.INFO", "lock:q", "WAITERS", "10"]);
    assert_eq!(r.field("longest-wait"), Some(Resp::Int(0)), "{r:?}");
    assert_eq!(
        r.field("waiter-list"),
        Some(Resp::Array(Vec::new())),
        "{r:?}"
    );
    assert_eq!(common::lock_stat(&mut c, "longest_wait_ms"), 0);
    assert_eq!(common::lock_stat(&mut c, "waited_ms"), 0);

    let started = std::time::Instant::now();
    let mut w1 = Waiter::send(
        server.port,
        0,
        "lock:q",
        &["BLOCK", "30000", "TOKEN", w1_tok, "OWNER", "job-1"],
    );
    common::raw::wait_queued(&mut c, "lock:q", 1);
    let mut w2 = Waiter::send(
        server.port,
        0,
        "lock:q",
        &["SHARED", "BLOCK", "30000", "TOKEN", w2_tok],
    );
    common::raw::wait_queued(&mut c, "lock:q", 2);
    let slept = Duration::from_millis(300);
    std::thread::sleep(slept);
    // The waiters' own connections are blocked: their addresses come from CLIENT LIST.
    let list = c.cmd(&["CLIENT", "LIST"]).text();
    let addr_of = |id: i64| -> String {
        list.lines()
            .find(|l| l.split_whitespace().any(|f| f == format!("id={id}")))
            .and_then(|l| {
                l.split_whitespace()
                    .find_map(|f| f.strip_prefix("addr=").map(str::to_string))
            })
            .unwrap_or_else(|| panic!("client {id} not in CLIENT LIST: {list}"))
    };

    for resp3 in [false, true] {
        let mut q = if resp3 {
            RawConn::connect_resp3(server.port)
        } else {
            RawConn::connect(server.port)
        };
        let r = q.cmd(&["LOCK.INFO", "lock:q", "WAITERS", "10"]);
        let upper = within(started.elapsed());
        assert_eq!(r.field("waiters"), Some(Resp::Int(2)), "{r:?}");
        let list = r
            .field("waiter-list")
            .unwrap_or_else(|| panic!("no waiter-list: {r:?}"))
            .items();
        assert_eq!(list.len(), 2, "{r:?}");
        let (id1, addr1, owner1, mode1, waited1) = waiter_entry(&list[0]);
        let (id2, addr2, owner2, mode2, waited2) = waiter_entry(&list[1]);
        assert_eq!((id1, id2), (w1.id, w2.id), "in queue order: {r:?}");
        assert_eq!((addr1, addr2), (addr_of(w1.id), addr_of(w2.id)));
        assert_eq!((owner1.as_deref(), owner2), (Some("job-1"), None));
        assert_eq!((mode1.as_str(), mode2.as_str()), ("exclusive", "shared"));
        let min = at_least(slept);
        assert!(
            waited1 >= min && waited1 <= upper && waited2 >= min && waited2 <= waited1,
            "waited {waited1} and {waited2} ms: want at least {min}, at most {upper}"
        );
        let longest = r.field("longest-wait").map(|v| v.int());
        assert!(
            longest.is_some_and(|l| l >= waited1 && l <= upper),
            "longest-wait {longest:?}, first waiter {waited1}"
        );
        // Never a token.
        let shown = strings(&r);
        for t in [holder, w1_tok, w2_tok] {
            assert!(!shown.iter().any(|s| s.contains(t)), "LOCK.INFO showed {t}");
        }
    }
    // WAITERS n shows the first n; without WAITERS there is no list.
    let r = c.cmd(&["LOCK.INFO", "lock:q", "WAITERS", "1"]);
    let one = r.field("waiter-list").expect("waiter-list").items();
    assert_eq!(one.len(), 1);
    assert_eq!(waiter_entry(&one[0]).0, w1.id);
    let r = c.cmd(&["LOCK.INFO", "lock:q"]);
    assert_eq!(r.field("waiter-list"), None, "{r:?}");
    assert!(r
        .field("longest-wait")
        .is_some_and(|l| l.int() >= at_least(slept)));
    for bad in ["-1", "1001", "x"] {
        let e = c.cmd(&["LOCK.INFO", "lock:q", "WAITERS", bad]);
        assert!(
            e.is_error() && starts_with_error_code(&e.err()),
            "WAITERS {bad}: {e:?}"
        );
    }
    // INFO lock: the longest wait now, over every key.
    let longest = common::lock_stat(&mut c, "longest_wait_ms");
    assert!(
        longest >= at_least(slept) && longest <= within(started.elapsed()),
        "lock_longest_wait_ms {longest}"
    );
    // Hand-offs end both waits: the total of finished waits grows by at least both.
    assert_eq!(release(&mut c, "lock:q", holder), 1);
    assert_eq!(grant(&w1.reply()).0, w1_tok.as_bytes());
    assert_eq!(release(&mut c, "lock:q", w1_tok), 1);
    assert_eq!(grant(&w2.reply()).0, w2_tok.as_bytes());
    assert_eq!(common::lock_stat(&mut c, "longest_wait_ms"), 0);
    let waited = common::lock_stat(&mut c, "waited_ms");
    assert!(
        waited >= 2 * at_least(slept) && waited <= 2 * within(started.elapsed()),
        "lock_waited_ms {waited}"
    );
    let r = c.cmd(&["LOCK.INFO", "lock:q", "WAITERS", "5"]);
    assert_eq!(r.field("longest-wait"), Some(Resp::Int(0)), "{r:?}");
}
