//! Happy paths of every command against a live server: LOCK.ACQUIRE / RELEASE / EXTEND /
//! INFO / FORCERELEASE, server-generated tokens, TTLs, expiry, fencing tokens, MINFENCE,
//! the classic string-lock interop and binary tokens.

mod common;

use common::{tok, unix_ms, wait_until, words, RawConn, Resp, ServerBuilder};
use std::collections::HashSet;
use std::time::Duration;

/// The fields LOCK.INFO shows for every lock, in order (a string lock's all).
const INFO_FIELDS: &str =
    "state kind ttl expires-at fence owner acquired-at client-id client-addr waiters longest-wait";

/// `unix_ms << 10`: the floor of every fence granted at or after `ms`.
fn clock_floor(ms: i64) -> i64 {
    ms << 10
}

/// The largest integer a double (JavaScript's Number, Lua's number) holds exactly.
const MAX_EXACT: i64 = (1 << 53) - 1;

/// A successful acquire's `[token, fence]`; panics on nil or an error.
fn grant(r: &Resp) -> (Vec<u8>, i64) {
    match r {
        Resp::Array(v) if v.len() == 2 => match (&v[0], &v[1]) {
            (Resp::Bulk(t), Resp::Int(f)) => (t.clone(), *f),
            _ => panic!("grant should be [bulk token, integer fence], got {r:?}"),
        },
        _ => panic!("expected a grant [token, fence], got {r:?}"),
    }
}

fn acquire(c: &mut RawConn, args: &[&str]) -> (Vec<u8>, i64) {
    let mut a = vec!["LOCK.ACQUIRE"];
    a.extend_from_slice(args);
    grant(&c.cmd(&a))
}

fn pttl(c: &mut RawConn, key: &str) -> i64 {
    c.cmd(&["PTTL", key]).int()
}

fn exists(c: &mut RawConn, key: &str) -> bool {
    c.cmd(&["EXISTS", key]).int() == 1
}

/// Lowercase hex UUID v4: 8-4-4-4-12, version nibble 4, variant 10xx.
fn is_uuid_v4(t: &[u8]) -> bool {
    let Ok(s) = std::str::from_utf8(t) else {
        return false;
    };
    let groups: Vec<&str> = s.split('-').collect();
    let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    lens == [8, 4, 4, 4, 12]
        && groups.iter().all(|g| {
            g.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
        && groups[2].starts_with('4')
        && matches!(groups[3].as_bytes()[0], b'8' | b'9' | b'a' | b'b')
}

/// A classic string lock's Redis expiry is just under `ttl`.
fn assert_pttl_near(c: &mut RawConn, key: &str, ttl: i64) {
    let p = pttl(c, key);
    // The command ran a moment ago; allow generous slack for a loaded machine.
    assert!(
        p <= ttl && p > ttl - 2000,
        "PTTL {key} = {p}, expected just under {ttl}"
    );
}

/// A module lock's lease (LOCK.INFO `ttl`, on the server's monotonic clock) is just under
/// `ttl`, and the key has no Redis expiry (PTTL and PEXPIRETIME -1): the lease is not the
/// key's expiry.
fn assert_lease_near(c: &mut RawConn, key: &str, ttl: i64) {
    let info = c.cmd(&["LOCK.INFO", key]);
    let lease = info
        .field("ttl")
        .unwrap_or_else(|| panic!("LOCK.INFO {key}: {info:?}"))
        .int();
    assert!(
        lease <= ttl && lease > ttl - 2000,
        "LOCK.INFO {key} ttl = {lease}, expected just under {ttl}"
    );
    assert_eq!(pttl(c, key), -1, "PTTL {key}: a module lock has no expiry");
    assert_eq!(c.cmd(&["PEXPIRETIME", key]), Resp::Int(-1), "{key}");
}

#[test]
fn acquire_release_extend_forcerelease_happy_path() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);

    // ACQUIRE: [token, fence] with a server-made UUID v4 and a clock-based fence.
    let before = unix_ms();
    let (token, fence) = acquire(&mut c, &["lock:a", "PX", "10000"]);
    assert!(
        is_uuid_v4(&token),
        "token {:?} is not a UUID v4",
        String::from_utf8_lossy(&token)
    );
    assert!(
        fence >= clock_floor(before),
        "fence {fence} < {before} << 10"
    );
    assert!(fence <= MAX_EXACT, "fence {fence} does not fit in a double");
    assert_eq!(c.cmd(&["TYPE", "lock:a"]), Resp::Simple("redislock".into()));
    assert_lease_near(&mut c, "lock:a", 10_000);
    // Held: a second acquire without the token gets nil.
    assert_eq!(c.cmd(&["LOCK.ACQUIRE", "lock:a"]), Resp::Nil);

    // Tokens differ between grants (and are all v4).
    let mut seen = HashSet::new();
    seen.insert(token.clone());
    for i in 0..20 {
        let k = format!("lock:uuid:{i}");
        let (t, _) = acquire(&mut c, &[&k]);
        assert!(is_uuid_v4(&t), "{:?}", String::from_utf8_lossy(&t));
        assert!(seen.insert(t), "a server-generated token repeated");
    }

    // EXTEND 1 with a lease to match (shorter as well as longer); the fence does not
    // change.
    let tok_s = String::from_utf8(token.clone()).unwrap();
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", "lock:a", &tok_s, "PX", "60000"]),
        Resp::Int(1)
    );
    assert_lease_near(&mut c, "lock:a", 60_000);
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", "lock:a", &tok_s, "EX", "120"]),
        Resp::Int(1)
    );
    assert_lease_near(&mut c, "lock:a", 120_000);
    // Without PX/EX the lease becomes lock.default-ttl (30000).
    assert_eq!(c.cmd(&["LOCK.EXTEND", "lock:a", &tok_s]), Resp::Int(1));
    assert_lease_near(&mut c, "lock:a", 30_000);
    let info = c.cmd(&["LOCK.INFO", "lock:a"]);
    assert_eq!(info.field("fence"), Some(Resp::Int(fence)));

    // RELEASE 1, then 0; the key is gone, EXTEND of a released lock is 0.
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:a", &tok_s]), Resp::Int(1));
    assert!(!exists(&mut c, "lock:a"));
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:a", &tok_s]), Resp::Int(0));
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", "lock:a", &tok_s, "PX", "1000"]),
        Resp::Int(0)
    );
    assert!(!exists(&mut c, "lock:a"), "EXTEND must not create a key");
    assert_eq!(c.cmd(&["LOCK.INFO", "lock:a"]), Resp::Nil);
    // RELEASE of a lock that never existed.
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:never", "x"]), Resp::Int(0));

    // FORCERELEASE 1 whoever holds it, then 0.
    let (_, f2) = acquire(&mut c, &["lock:a", "OWNER", "someone"]);
    assert!(f2 > fence);
    let mut other = RawConn::connect(server.port);
    assert_eq!(other.cmd(&["LOCK.FORCERELEASE", "lock:a"]), Resp::Int(1));
    assert!(!exists(&mut c, "lock:a"));
    assert_eq!(other.cmd(&["LOCK.FORCERELEASE", "lock:a"]), Resp::Int(0));
    // Free again: anyone can take it.
    let (_, f3) = acquire(&mut other, &["lock:a"]);
    assert!(f3 > f2);
}

#[test]
fn non_owner_release_and_extend_leave_the_lock_intact() {
    let server = ServerBuilder::new().start();
    let mut owner = RawConn::connect(server.port);
    let mut thief = RawConn::connect(server.port);
    let (token, fence) = acquire(&mut owner, &["lock:b", "PX", "20000", "OWNER", "svc-1"]);
    let before = owner.cmd(&["LOCK.INFO", "lock:b"]);

    for wrong in ["wrong", "", "x".repeat(300).as_str()] {
        assert_eq!(thief.cmd(&["LOCK.RELEASE", "lock:b", wrong]), Resp::Int(0));
        assert_eq!(
            thief.cmd(&["LOCK.EXTEND", "lock:b", wrong, "PX", "90000"]),
            Resp::Int(0)
        );
    }
    // A prefix or an extension of the real token is not the token.
    let mut longer = token.clone();
    longer.push(b'0');
    for t in [&token[..token.len() - 1], &longer[..]] {
        assert_eq!(
            thief.cmd(&[&b"LOCK.RELEASE"[..], b"lock:b", t]),
            Resp::Int(0)
        );
    }

    let after = owner.cmd(&["LOCK.INFO", "lock:b"]);
    let ttl = after.field("ttl").unwrap().int();
    assert!(ttl <= 20_000, "a wrong EXTEND changed the lease: ttl {ttl}");
    for f in ["fence", "owner", "acquired-at", "client-id", "kind"] {
        assert_eq!(before.field(f), after.field(f), "field {f} changed");
    }
    // `expires-at` is the server's wall-clock estimate of the deadline (wall now plus the
    // lease left): two LOCK.INFO calls may differ by a few ms, a 90 s EXTEND by 70 s.
    let (e0, e1) = (
        before.field("expires-at").unwrap().int(),
        after.field("expires-at").unwrap().int(),
    );
    assert!((e1 - e0).abs() <= 5, "expires-at moved from {e0} to {e1}");
    assert_eq!(after.field("fence"), Some(Resp::Int(fence)));
    assert_eq!(
        owner.cmd(&[&b"LOCK.RELEASE"[..], b"lock:b", &token]),
        Resp::Int(1)
    );
}

#[test]
fn info_fields_in_resp2_and_resp3() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    let my_id = c.cmd(&["CLIENT", "ID"]).int();
    let client_info = c.cmd(&["CLIENT", "INFO"]).text();
    let my_addr = client_info
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .expect("addr= in CLIENT INFO")
        .to_string();

    let t0 = unix_ms();
    let (token, fence) = acquire(&mut c, &["lock:i", "PX", "10000", "OWNER", "worker-7"]);
    let t1 = unix_ms();

    // RESP2: a flat field/value array, every value with the right type.
    let info = c.cmd(&["LOCK.INFO", "lock:i"]);
    let Resp::Array(flat) = &info else {
        panic!("RESP2 LOCK.INFO should be a flat array, got {info:?}")
    };
    assert!(flat.len() >= 18 && flat.len() % 2 == 0, "{info:?}");
    for (i, v) in flat.iter().enumerate().step_by(2) {
        assert!(matches!(v, Resp::Bulk(_)), "field name #{i} is {v:?}");
    }
    let names: Vec<String> = info.pairs().into_iter().map(|(k, _)| k).collect();
    for f in words(&format!("{INFO_FIELDS} holders holder-list cursor")) {
        assert!(
            names.iter().any(|n| n == f),
            "LOCK.INFO lacks {f}: {names:?}"
        );
    }
    check_module_info(&info, fence, "worker-7", t0, t1, my_id, &my_addr);
    // The token (the capability) is never shown.
    for (_, v) in info.pairs() {
        if let Resp::Bulk(b) = v {
            assert_ne!(b, token, "LOCK.INFO revealed the token");
        }
    }

    // RESP3: a real map with the same content; nil is `_`.
    let mut c3 = RawConn::connect_resp3(server.port);
    let info3 = c3.cmd(&["LOCK.INFO", "lock:i"]);
    assert!(matches!(info3, Resp::Map(_)), "RESP3 LOCK.INFO: {info3:?}");
    check_module_info(&info3, fence, "worker-7", t0, t1, my_id, &my_addr);
    assert_eq!(info.pairs().len(), info3.pairs().len());
    assert_eq!(c3.cmd(&["LOCK.INFO", "lock:free"]), Resp::Nil);
    assert_eq!(c.cmd(&["LOCK.INFO", "lock:free"]), Resp::Nil);

    // RESP3 grant is still [token, fence]; nil on contention; owner absent is nil.
    let (t3, f3) = grant(&c3.cmd(&["LOCK.ACQUIRE", "lock:i3", "PX", "5000"]));
    assert!(f3 > fence);
    assert_eq!(c3.cmd(&["LOCK.ACQUIRE", "lock:i3"]), Resp::Nil);
    let i3 = c3.cmd(&["LOCK.INFO", "lock:i3"]);
    assert_eq!(i3.field("owner"), Some(Resp::Nil));
    assert_eq!(
        c.cmd(&["LOCK.INFO", "lock:i3"]).field("owner"),
        Some(Resp::Nil)
    );
    // The acquiring connection's id and address are the RESP3 client's.
    let id3 = c3.cmd(&["CLIENT", "ID"]).int();
    assert_eq!(i3.field("client-id"), Some(Resp::Int(id3)));
    assert_ne!(id3, my_id);
    assert_eq!(
        c3.cmd(&[&b"LOCK.RELEASE"[..], b"lock:i3", &t3]),
        Resp::Int(1)
    );
    assert_eq!(
        c3.cmd(&[&b"LOCK.EXTEND"[..], b"lock:i", &token, b"PX", b"5000"]),
        Resp::Int(1)
    );
    assert_eq!(c3.cmd(&["LOCK.FORCERELEASE", "lock:i"]), Resp::Int(1));
}

fn check_module_info(
    info: &Resp,
    fence: i64,
    owner: &str,
    t0: i64,
    t1: i64,
    client_id: i64,
    addr: &str,
) {
    let f = |n: &str| {
        info.field(n)
            .unwrap_or_else(|| panic!("no {n} in {info:?}"))
    };
    assert_eq!(f("state").text(), "held");
    assert_eq!(f("kind").text(), "module");
    let ttl = f("ttl").int();
    assert!(ttl > 0 && ttl <= 10_000, "ttl {ttl}");
    let exp = f("expires-at").int();
    assert!(
        exp >= t0 + 10_000 - 5 && exp <= t1 + 10_000 + 5,
        "expires-at {exp} not in [{t0}, {t1}] + 10000"
    );
    assert_eq!(f("fence"), Resp::Int(fence));
    assert_eq!(f("owner").text(), owner);
    let at = f("acquired-at").int();
    assert!(
        at >= t0 - 5 && at <= t1 + 5,
        "acquired-at {at} not in [{t0}, {t1}]"
    );
    assert_eq!(f("client-id"), Resp::Int(client_id));
    assert_eq!(f("client-addr").text(), addr);
    assert_eq!(f("waiters"), Resp::Int(0));
    // One holder, all of it in the list: the list is complete (cursor 0).
    assert_eq!(f("holders"), Resp::Int(1));
    assert_eq!(f("holder-list").items().len(), 1);
    assert_eq!(
        f("holder-list").items()[0].field("fence"),
        Some(Resp::Int(fence))
    );
    assert_eq!(f("cursor"), Resp::Int(0));
}

#[test]
fn idempotent_token_retry_keeps_the_fence_and_resets_the_ttl() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    let (t1, t2) = (tok("my-token-1"), tok("my-token-2"));
    let (token, fence) = acquire(&mut c, &["lock:r", "PX", "3000", "TOKEN", &t1]);
    assert_eq!(token, t1.as_bytes());
    assert_lease_near(&mut c, "lock:r", 3000);
    std::thread::sleep(Duration::from_millis(20));

    // The retry (e.g. after a lost reply) gets the same grant and a fresh lease.
    let (tok2, fence2) = acquire(&mut c, &["lock:r", "PX", "60000", "TOKEN", &t1]);
    assert_eq!((tok2.as_slice(), fence2), (t1.as_bytes(), fence));
    assert_lease_near(&mut c, "lock:r", 60_000);
    // Also from another connection, and with the default TTL.
    let mut c2 = RawConn::connect(server.port);
    let (_, fence3) = acquire(&mut c2, &["lock:r", "TOKEN", &t1]);
    assert_eq!(fence3, fence);
    assert_lease_near(&mut c, "lock:r", 30_000);
    // A different token still gets nil.
    assert_eq!(c2.cmd(&["LOCK.ACQUIRE", "lock:r", "TOKEN", &t2]), Resp::Nil);
    // The two retries count as renews; an EXTEND is not a renew (it counts as extended).
    assert_eq!(common::lock_stat(&mut c, "renewed"), 2);
    assert_eq!(common::lock_stat(&mut c, "extended"), 0);
    assert_eq!(c.cmd(&["LOCK.EXTEND", "lock:r", &t1]), Resp::Int(1));
    assert_eq!(common::lock_stat(&mut c, "renewed"), 2);
    assert_eq!(common::lock_stat(&mut c, "extended"), 1);
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:r", &t1]), Resp::Int(1));
    // After release the same token is a fresh grant with a new fence.
    let (_, fence4) = acquire(&mut c, &["lock:r", "TOKEN", &t1]);
    assert!(fence4 > fence);
}

#[test]
fn ttl_options_expiry_and_reacquire() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);

    let t0 = unix_ms();
    acquire(&mut c, &["lock:px", "PX", "5000"]);
    assert_lease_near(&mut c, "lock:px", 5000);
    acquire(&mut c, &["lock:ex", "EX", "7"]);
    assert_lease_near(&mut c, "lock:ex", 7000);
    acquire(&mut c, &["lock:default"]);
    assert_lease_near(&mut c, "lock:default", 30_000);
    // Lower-case option names work too.
    acquire(&mut c, &["lock:lower", "px", "4000", "owner", "o"]);
    assert_lease_near(&mut c, "lock:lower", 4000);
    // LOCK.INFO expires-at is the wall-clock estimate of the deadline: wall now plus the
    // lease left, so between the grant's wall time and now, plus the lease.
    let info = c.cmd(&["LOCK.INFO", "lock:px"]);
    let t1 = unix_ms();
    let exp = info.field("expires-at").unwrap().int();
    assert!(
        exp >= t0 + 5000 - 5 && exp <= t1 + 5000 + 5,
        "expires-at {exp} not in [{t0}, {t1}] + 5000"
    );

    // Expiry: a short lease ends, the key is gone, the next grant has a higher fence.
    let (_, f1) = acquire(&mut c, &["lock:exp", "PX", "100"]);
    assert!(
        wait_until(Duration::from_secs(5), || !exists(&mut c, "lock:exp")),
        "lock:exp did not expire"
    );
    assert_eq!(c.cmd(&["LOCK.INFO", "lock:exp"]), Resp::Nil);
    let (_, f2) = acquire(&mut c, &["lock:exp", "PX", "100"]);
    assert!(f2 > f1, "{f2} <= {f1}");
    // The module removes the key at the lease's end without anyone touching it (the key
    // has no Redis expiry that could).
    assert!(
        wait_until(Duration::from_secs(5), || c.cmd(&["DBSIZE"]).int() == 4),
        "lock:exp was not removed when its lease ended"
    );
}

#[test]
fn type_is_redislock_and_scan_type_lists_locks() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    let mut locks = HashSet::new();
    for i in 0..25 {
        let k = format!("lock:scan:{i}");
        acquire(&mut c, &[&k, "PX", "60000"]);
        locks.insert(k);
    }
    c.cmd(&["SET", "plain:string", "v"]);
    c.cmd(&["SET", "lock:classic", "tok", "NX", "PX", "60000"]);
    c.cmd(&["RPUSH", "plain:list", "a"]);
    assert_eq!(
        c.cmd(&["TYPE", "lock:scan:0"]),
        Resp::Simple("redislock".into())
    );
    assert_eq!(
        c.cmd(&["TYPE", "lock:classic"]),
        Resp::Simple("string".into())
    );

    let mut found = HashSet::new();
    let mut cursor = "0".to_string();
    for _ in 0..1000 {
        let r = c.cmd(&["SCAN", &cursor, "TYPE", "redislock", "COUNT", "7"]);
        let items = r.items();
        cursor = items[0].text();
        for k in items[1].items() {
            found.insert(k.text());
        }
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(cursor, "0", "SCAN did not finish");
    assert_eq!(found, locks);
    // Generic commands see the module type as well.
    assert_eq!(c.cmd(&["EXISTS", "lock:scan:1"]), Resp::Int(1));
    assert_eq!(c.cmd(&["DBSIZE"]), Resp::Int(28));
}

#[test]
fn fences_strictly_increase_across_release_expiry_and_forcerelease() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    let mut last = 0i64;
    let keys = ["lock:f1", "lock:f2", "lock:f3"];
    for i in 0..300 {
        let key = keys[i % keys.len()];
        let before = unix_ms();
        let short = i % 30 == 0;
        let ttl = if short { "20" } else { "10000" };
        let (tok, fence) = acquire(&mut c, &[key, "PX", ttl]);
        assert!(fence > last, "grant #{i}: fence {fence} <= previous {last}");
        assert!(
            fence >= clock_floor(before),
            "grant #{i}: fence {fence} < unix_ms<<10 ({})",
            clock_floor(before)
        );
        last = fence;
        if short {
            assert!(
                wait_until(Duration::from_secs(5), || !exists(&mut c, key)),
                "{key} did not expire"
            );
        } else if i % 2 == 0 {
            assert_eq!(
                c.cmd(&[&b"LOCK.RELEASE"[..], key.as_bytes(), &tok]),
                Resp::Int(1)
            );
        } else {
            assert_eq!(c.cmd(&["LOCK.FORCERELEASE", key]), Resp::Int(1));
        }
    }
    assert_eq!(common::lock_stat(&mut c, "last_fence"), last);
    assert_eq!(common::lock_stat(&mut c, "acquired"), 300);
    assert_eq!(common::lock_stat(&mut c, "expired"), 10);
}

#[test]
fn minfence_raises_grants_and_renewals_raise_later_grants() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    // MINFENCE may lead this server's clock term by an hour, and a fresh server's counter
    // starts an hour ahead of its clock: let the clock move on by two seconds so that
    // there is room between the counter and the bound.
    let (_, f0) = acquire(&mut c, &["lock:start"]);
    std::thread::sleep(Duration::from_millis(2200));
    let ms = 1 << 10;
    let (t, tn) = (tok("t"), tok("tn"));
    // A floor above the counter: the grant gets exactly that fence.
    let floor = f0 + 500 * ms;
    let (_, f) = acquire(
        &mut c,
        &["lock:m", "MINFENCE", &floor.to_string(), "TOKEN", &t],
    );
    assert_eq!(f, floor);
    // A floor below the counter changes nothing: the next fence is still higher.
    let (_, g) = acquire(&mut c, &["lock:m2", "MINFENCE", "1"]);
    assert!(g > f, "{g} <= {f}");

    // The brief's case: renew with MINFENCE f+1000, release, acquire -> fence > f+1000.
    let (_, h) = acquire(&mut c, &["lock:n", "TOKEN", &tn]);
    let (_, h_renew) = acquire(
        &mut c,
        &["lock:n", "TOKEN", &tn, "MINFENCE", &(h + 1000).to_string()],
    );
    assert_eq!(h_renew, h, "a renew keeps its fence");
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:n", &tn]), Resp::Int(1));
    let (_, k) = acquire(&mut c, &["lock:n"]);
    assert!(k > h + 1000, "{k} <= {h} + 1000");

    // The same with a floor far above the counter, so only the renew's MINFENCE can
    // explain the later grant's fence.
    let far = f0 + 1500 * ms;
    let (_, r) = acquire(
        &mut c,
        &["lock:m", "TOKEN", &t, "MINFENCE", &far.to_string()],
    );
    assert_eq!(r, f, "a renew keeps its fence");
    assert_eq!(
        c.cmd(&["LOCK.INFO", "lock:m"]).field("fence"),
        Some(Resp::Int(f))
    );
    let (_, next) = acquire(&mut c, &["lock:other"]);
    assert_eq!(next, far + 1);
    assert_eq!(common::lock_stat(&mut c, "last_fence"), next);

    // More than an hour ahead of the clock is refused, for a grant and a renew alike,
    // and does not move the counter.
    let too_far = clock_floor(unix_ms() + 2 * 3600 * 1000);
    let too_far = too_far.to_string();
    for args in [
        &["LOCK.ACQUIRE", "lock:far", "MINFENCE", &too_far][..],
        &["LOCK.ACQUIRE", "lock:m", "TOKEN", &t, "MINFENCE", &too_far],
    ] {
        let r = c.cmd(args);
        assert!(
            matches!(&r, Resp::Error(e) if e.starts_with("ERR ")),
            "{args:?}: {r:?}"
        );
    }
    assert_eq!(c.cmd(&["EXISTS", "lock:far"]), Resp::Int(0));
    let (_, after) = acquire(&mut c, &["lock:far"]);
    assert_eq!(after, next + 1);
}

#[test]
fn classic_string_locks_interoperate() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    assert_eq!(
        c.cmd(&["SET", "lock:s", "tok", "NX", "PX", "5000"]),
        Resp::Simple("OK".into())
    );
    // Held for ACQUIRE. Its value "tok" is shorter than lock.min-token-length: a TOKEN
    // ACQUIRE refuses, while RELEASE and EXTEND below take it.
    assert_eq!(c.cmd(&["LOCK.ACQUIRE", "lock:s"]), Resp::Nil);
    let r = c.cmd(&["LOCK.ACQUIRE", "lock:s", "TOKEN", "tok"]);
    assert!(
        matches!(&r, Resp::Error(e) if e.starts_with("ERR TOKEN must be 16 to 256 bytes")),
        "{r:?}"
    );
    assert_eq!(c.cmd(&["LOCK.ACQUIRE", "lock:s", "BLOCK", "50"]), Resp::Nil);
    // Held also for ACQUIRE with the same token: a string is not a module grant to renew.
    let long = tok("classic");
    assert_eq!(
        c.cmd(&["SET", "lock:s2", &long, "NX", "PX", "5000"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(
        c.cmd(&["LOCK.ACQUIRE", "lock:s2", "TOKEN", &long]),
        Resp::Nil
    );
    assert_eq!(
        c.cmd(&["GET", "lock:s2"]),
        Resp::Bulk(long.clone().into_bytes())
    );
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:s2", &long]), Resp::Int(1));

    let info = c.cmd(&["LOCK.INFO", "lock:s"]);
    assert_eq!(info.field("state").unwrap().text(), "held");
    assert_eq!(info.field("kind").unwrap().text(), "string");
    assert_eq!(info.field("fence"), Some(Resp::Nil));
    assert_eq!(info.field("owner"), Some(Resp::Nil));
    assert_eq!(info.field("waiters"), Some(Resp::Int(0)));
    let ttl = info.field("ttl").unwrap().int();
    assert!(ttl > 0 && ttl <= 5000, "ttl {ttl}");
    // Exactly these fields: the holder's nil, and nothing a string lock cannot have
    // (no mode, lock-delay, holders, holder-list or cursor).
    let names: Vec<String> = info.pairs().into_iter().map(|(k, _)| k).collect();
    assert_eq!(names, words(INFO_FIELDS));
    let mut c3 = RawConn::connect_resp3(server.port);
    let info3 = c3.cmd(&["LOCK.INFO", "lock:s"]);
    assert_eq!(info3.field("kind").unwrap().text(), "string");
    assert_eq!(info3.field("fence"), Some(Resp::Nil));

    // EXTEND: wrong token 0, right token sets its PTTL (a classic lock keeps its Redis
    // expiry) and keeps it a string.
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", "lock:s", "nope", "PX", "20000"]),
        Resp::Int(0)
    );
    assert!(pttl(&mut c, "lock:s") <= 5000);
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", "lock:s", "tok", "PX", "20000"]),
        Resp::Int(1)
    );
    assert_pttl_near(&mut c, "lock:s", 20_000);
    let ttl = c.cmd(&["LOCK.INFO", "lock:s"]).field("ttl").unwrap().int();
    assert!(ttl > 18_000 && ttl <= 20_000, "LOCK.INFO ttl {ttl}");
    assert_eq!(c.cmd(&["TYPE", "lock:s"]), Resp::Simple("string".into()));
    assert_eq!(c.cmd(&["GET", "lock:s"]), Resp::Bulk(b"tok".to_vec()));

    // RELEASE: wrong token 0 (kept), right token 1 (deleted).
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:s", "nope"]), Resp::Int(0));
    assert!(exists(&mut c, "lock:s"));
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:s", "tok"]), Resp::Int(1));
    assert!(!exists(&mut c, "lock:s"));
    // Free now: the module takes it, and the classic recipe then fails.
    let (_, _f) = acquire(&mut c, &["lock:s", "PX", "5000"]);
    assert_eq!(
        c.cmd(&["SET", "lock:s", "tok", "NX", "PX", "5000"]),
        Resp::Nil
    );

    // A string lock without a TTL: ttl -1, expires-at nil; FORCERELEASE removes it.
    c.cmd(&["SET", "lock:forever", "tok2"]);
    let i = c.cmd(&["LOCK.INFO", "lock:forever"]);
    assert_eq!(i.field("ttl"), Some(Resp::Int(-1)));
    assert_eq!(i.field("expires-at"), Some(Resp::Nil));
    assert_eq!(c.cmd(&["LOCK.FORCERELEASE", "lock:forever"]), Resp::Int(1));
    assert!(!exists(&mut c, "lock:forever"));
}

#[test]
fn binary_tokens_round_trip() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    // 16 bytes before the NUL (so the part a C string would keep is itself a token
    // ACQUIRE takes), then CR LF and bytes that are not UTF-8.
    let tok: &[u8] = b"binary-token-16b\0b\r\nc\xff\xfe end";
    let cut: &[u8] = b"binary-token-16b";
    let r = c.cmd(&[
        &b"LOCK.ACQUIRE"[..],
        b"lock:bin",
        b"PX",
        b"10000",
        b"TOKEN",
        tok,
    ]);
    let (got, fence) = grant(&r);
    assert_eq!(got, tok);
    // The renew with the same bytes matches; a string cut at the NUL does not.
    let r2 = c.cmd(&[&b"LOCK.ACQUIRE"[..], b"lock:bin", b"TOKEN", tok]);
    assert_eq!(grant(&r2), (tok.to_vec(), fence));
    assert_eq!(
        c.cmd(&[&b"LOCK.ACQUIRE"[..], b"lock:bin", b"TOKEN", cut]),
        Resp::Nil
    );
    for wrong in [cut, b"binary"] {
        assert_eq!(
            c.cmd(&[&b"LOCK.RELEASE"[..], b"lock:bin", wrong]),
            Resp::Int(0)
        );
    }
    assert_eq!(
        c.cmd(&[&b"LOCK.EXTEND"[..], b"lock:bin", tok, b"PX", b"50000"]),
        Resp::Int(1)
    );
    assert_lease_near(&mut c, "lock:bin", 50_000);
    // A binary key and a 256-byte token of every byte value.
    let all: Vec<u8> = (0..=255u8).collect();
    let key: &[u8] = b"lock:\0\xff\r\n";
    let (got, _) = grant(&c.cmd(&[&b"LOCK.ACQUIRE"[..], key, b"TOKEN", &all]));
    assert_eq!(got, all);
    assert_eq!(c.cmd(&[&b"LOCK.RELEASE"[..], key, &all]), Resp::Int(1));
    assert_eq!(
        c.cmd(&[&b"LOCK.RELEASE"[..], b"lock:bin", tok]),
        Resp::Int(1)
    );
    assert_eq!(c.cmd(&["DBSIZE"]), Resp::Int(0));
}

/// Voluntary context switches of the server's main thread (Linux): each sleep of the
/// event loop counts one, so an idle server with `hz 10` makes about 10 a second.
fn main_thread_switches(pid: u32) -> i64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/status"))
        .expect("read /proc/<pid>/task/<pid>/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches in /proc status")
}

/// The lease stored in the lock decides, not the key's expiry: a generic PEXPIRE that
/// keeps the key past the lease does not keep the lock held, and PERSIST (there is no
/// expiry to remove from a lock key) never extends a lease.
#[test]
fn a_lease_ends_even_if_pexpire_or_persist_keeps_the_key() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    let (a, b, w) = (tok("a"), tok("b"), tok("w"));
    // Leases of 1 and 2 s: the commands that follow each grant must reach the server
    // before its lease ends, which 200 and 300 ms need not leave on a loaded machine.
    let (_, f1) = acquire(&mut c, &["lock:g", "PX", "1000", "TOKEN", &a]);
    assert_eq!(c.cmd(&["PEXPIRE", "lock:g", "60000"]), Resp::Int(1));
    assert!(
        wait_until(Duration::from_secs(10), || c.cmd(&["LOCK.INFO", "lock:g"])
            == Resp::Nil),
        "the lease of lock:g did not end"
    );
    // The old holder has lost it; someone else gets it with a higher fence, and the
    // expiry PEXPIRE gave the old lock's key does not carry over to the new lock.
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", "lock:g", &a, "PX", "1000"]),
        Resp::Int(0)
    );
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:g", &a]), Resp::Int(0));
    let (_, f2) = acquire(&mut c, &["lock:g", "PX", "10000", "TOKEN", &b]);
    assert!(f2 > f1);
    assert_lease_near(&mut c, "lock:g", 10_000);

    // PERSIST with a waiter: 0 on a lock key (no expiry), 1 after a PEXPIRE gave it one;
    // neither keeps the lease: the waiter gets the lock when the lease ends.
    let (_, f3) = acquire(&mut c, &["lock:p", "PX", "2000", "TOKEN", &a]);
    assert_eq!(c.cmd(&["PERSIST", "lock:p"]), Resp::Int(0));
    assert_eq!(c.cmd(&["PEXPIRE", "lock:p", "60000"]), Resp::Int(1));
    assert_eq!(c.cmd(&["PERSIST", "lock:p"]), Resp::Int(1));
    let t = std::time::Instant::now();
    let (got, f4) = grant(&c.cmd(&["LOCK.ACQUIRE", "lock:p", "BLOCK", "9000", "TOKEN", &w]));
    assert_eq!(got, w.as_bytes());
    assert!(f4 > f3);
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "the waiter got the lock only after {:?}",
        t.elapsed()
    );
    assert_lease_near(&mut c, "lock:p", 30_000);

    // And nothing keeps the event loop busy afterwards (it once spun a 1 ms timer).
    let pid = server.pid();
    let before = main_thread_switches(pid);
    std::thread::sleep(Duration::from_secs(1));
    let per_sec = main_thread_switches(pid) - before;
    assert!(
        per_sec < 300,
        "the server's event loop woke {per_sec} times in 1 s while idle (~10 with hz 10)"
    );
}

/// `LOCK.EXTEND key token ... OWNER label`: the holder takes the new label and keeps its
/// fence (a leader publishes a new value without giving up its term); another token
/// changes nothing; a classic string lock has no label.
#[test]
fn extend_owner_relabels_the_holder_and_keeps_its_fence() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    let t = tok("relabel-leader");
    let (_, f) = acquire(
        &mut c,
        &["lock:l", "PX", "10000", "TOKEN", &t, "OWNER", "node-a"],
    );
    let r = c.cmd(&[
        "LOCK.EXTEND",
        "lock:l",
        &t,
        "PX",
        "30000",
        "OWNER",
        "node-a:8080",
    ]);
    assert_eq!(r, Resp::Int(1));
    let info = c.cmd(&["LOCK.INFO", "lock:l"]);
    assert_eq!(
        info.field("owner"),
        Some(Resp::Bulk(b"node-a:8080".to_vec()))
    );
    assert_eq!(info.field("fence"), Some(Resp::Int(f)));
    let ttl = info.field("ttl").expect("ttl").int();
    assert!(
        ttl > 20_000 && ttl <= 30_000,
        "ttl {ttl} after EXTEND PX 30000"
    );
    // Another token: 0, and the label stays.
    let other = tok("relabel-other");
    let r = c.cmd(&["LOCK.EXTEND", "lock:l", &other, "OWNER", "intruder"]);
    assert_eq!(r, Resp::Int(0));
    let info = c.cmd(&["LOCK.INFO", "lock:l"]);
    assert_eq!(
        info.field("owner"),
        Some(Resp::Bulk(b"node-a:8080".to_vec()))
    );
    // One reader of a shared lock takes a new label; the other keeps its own.
    let (r1, g1) = acquire(&mut c, &["lock:s", "SHARED", "PX", "60000", "OWNER", "x"]);
    let (_, g2) = acquire(&mut c, &["lock:s", "SHARED", "PX", "60000", "OWNER", "y"]);
    let r1 = String::from_utf8(r1).unwrap();
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", "lock:s", &r1, "OWNER", "z"]),
        Resp::Int(1)
    );
    let list = c
        .cmd(&["LOCK.INFO", "lock:s"])
        .field("holder-list")
        .unwrap();
    let labels: Vec<(Resp, Resp)> = list
        .items()
        .iter()
        .map(|h| (h.field("fence").unwrap(), h.field("owner").unwrap()))
        .collect();
    assert_eq!(
        labels,
        vec![
            (Resp::Int(g1), Resp::Bulk(b"z".to_vec())),
            (Resp::Int(g2), Resp::Bulk(b"y".to_vec()))
        ]
    );
    // A string lock: EXTEND works, EXTEND ... OWNER is an error.
    let classic = tok("relabel-classic");
    let set = c.cmd(&["SET", "lock:c", &classic, "NX", "PX", "10000"]);
    assert_eq!(set, Resp::Simple("OK".into()));
    match c.cmd(&["LOCK.EXTEND", "lock:c", &classic, "OWNER", "x"]) {
        Resp::Error(e) => assert!(e.starts_with("ERR OWNER needs a module lock"), "{e}"),
        other => panic!("EXTEND OWNER of a string lock: {other:?}"),
    }
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", "lock:c", &classic, "PX", "20000"]),
        Resp::Int(1)
    );
    // An empty label is refused.
    match c.cmd(&["LOCK.EXTEND", "lock:l", &t, "OWNER", ""]) {
        Resp::Error(e) => assert!(e.starts_with("ERR OWNER must be 1 to 256 bytes"), "{e}"),
        other => panic!("EXTEND OWNER '': {other:?}"),
    }
}

/// A holder records the client that acquired: the connection's id and address, or, for a
/// lock taken inside a script or function, the server's script client (its own id, no
/// address: no module API names the script's caller), as docs/commands.md says.
#[test]
fn a_holder_records_its_connection_or_the_script_client() {
    let s = ServerBuilder::new().start();
    let mut c = RawConn::connect(s.port);
    let me = match c.cmd(&["CLIENT", "ID"]) {
        Resp::Int(i) => i,
        other => panic!("CLIENT ID answered {other:?}"),
    };
    let field = |c: &mut RawConn, key: &str, f: &str| c.cmd(&["LOCK.INFO", key]).field(f);
    acquire(&mut c, &["lock:direct", "PX", "60000"]);
    assert_eq!(
        field(&mut c, "lock:direct", "client-id"),
        Some(Resp::Int(me))
    );
    let addr = field(&mut c, "lock:direct", "client-addr").and_then(|a| a.as_text());
    assert!(
        addr.as_deref().is_some_and(|a| a.starts_with("127.0.0.1:")),
        "client-addr of a direct acquire: {addr:?}"
    );
    let script = "return redis.call('LOCK.ACQUIRE', KEYS[1], 'PX', '60000')";
    grant(&c.cmd(&["EVAL", script, "1", "lock:script"]));
    let id = field(&mut c, "lock:script", "client-id");
    assert!(
        matches!(id, Some(Resp::Int(i)) if i != me),
        "client-id of a script's acquire: {id:?} (the caller is {me})"
    );
    let addr = field(&mut c, "lock:script", "client-addr").and_then(|a| a.as_text());
    assert_eq!(
        addr.as_deref(),
        Some(""),
        "client-addr of a script's acquire"
    );
}
