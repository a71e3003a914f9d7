//! Upgrading from release 0.1: an RDB file and an AOF written by it (commit a01d003,
//! `tests/fixtures/v0.1/`, made by `scripts/make-v0.1-fixtures.sh`) load, every lock
//! keeps its fence, lease, owner and token, the tokens are stored as digests from then
//! on, and fences keep rising above the ones 0.1 issued (on its `unix_ms << 20` scale).

mod common;

use common::{
    contains, files_with, fixtures, temp_dir, unix_ms, with_fixture, RawConn, Resp, Server,
    ServerBuilder,
};
use std::collections::HashMap;
use std::path::PathBuf;

/// `key field value` lines, and `counter value`.
fn expected(name: &str) -> HashMap<String, i64> {
    let text = std::fs::read_to_string(fixtures("v0.1").join(name)).expect("fixture");
    text.lines()
        .filter_map(|l| {
            let parts: Vec<&str> = l.split_whitespace().collect();
            match parts.as_slice() {
                [k, f, v] => Some((format!("{k} {f}"), v.parse().ok()?)),
                [k, v] => Some((k.to_string(), v.parse().ok()?)),
                _ => None,
            }
        })
        .collect()
}

fn int(r: &Resp, f: &str) -> i64 {
    match r.field(f) {
        Some(Resp::Int(i)) => i,
        other => panic!("{f}: {other:?} in {r:?}"),
    }
}

/// The locks 0.1 wrote are all there, as they were, and usable. Returns the PTTL each
/// lock key had when loaded.
fn check_upgraded(s: &Server, want: &HashMap<String, i64>) -> HashMap<&'static str, i64> {
    let mut c = RawConn::connect(s.port);
    let mut pttl = HashMap::new();
    for key in ["lock:owner", "lock:plain"] {
        pttl.insert(key, c.cmd(&["PTTL", key]).int());
        let i = c.cmd(&["LOCK.INFO", key]);
        assert_ne!(i, Resp::Nil, "{key} was not loaded\n{}", s.log_tail());
        for f in ["fence", "acquired-at"] {
            assert_eq!(int(&i, f), want[&format!("{key} {f}")], "{key} {f}");
        }
        // 0.1 kept the lease's end as a unix-ms deadline; it is loaded onto the monotonic
        // clock, and `expires-at` is the wall-clock estimate of it again (rounded to the
        // ms, so within a few ms either way).
        let (at, was) = (int(&i, "expires-at"), want[&format!("{key} expires-at")]);
        assert!(
            (at - was).abs() <= 5,
            "{key} expires-at {at}, 0.1 wrote {was}"
        );
        assert_eq!(i.field("mode").unwrap().text(), "exclusive");
    }
    let owner = c.cmd(&["LOCK.INFO", "lock:owner"]);
    assert_eq!(owner.field("owner").unwrap().text(), "svc-1");
    let classic = c.cmd(&["LOCK.INFO", "lock:classic"]);
    assert_eq!(classic.field("kind").unwrap().text(), "string");
    // The counter came back (RDB aux data, or LOCK.SYNC's FLOOR in the AOF).
    let counter = c.cmd(&["LOCK.DEBUG", "FENCE"]).int();
    assert!(
        counter >= want["counter"],
        "counter {counter} < {}",
        want["counter"]
    );
    // The tokens, now kept as digests, still work. 0.1's are shorter than
    // lock.min-token-length: EXTEND and RELEASE take them as they are, a renew through
    // LOCK.ACQUIRE is refused until the setting is lowered, and then keeps the fence.
    let plain_fence = want["lock:plain fence"];
    let renew = [
        "LOCK.ACQUIRE",
        "lock:plain",
        "TOKEN",
        "tok-plain",
        "PX",
        "60000",
    ];
    let e = c.cmd(&renew).err();
    assert!(e.starts_with("ERR TOKEN must be 16 to 256 bytes"), "{e}");
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", "lock:plain", "tok-plain", "PX", "60000"])
            .int(),
        1
    );
    assert_eq!(
        int(&c.cmd(&["LOCK.INFO", "lock:plain"]), "fence"),
        plain_fence
    );
    let set = ["CONFIG", "SET", "lock.min-token-length", "9"];
    assert_eq!(c.cmd(&set), Resp::Simple("OK".into()));
    assert_eq!(
        c.cmd(&renew),
        Resp::Array(vec![
            Resp::Bulk(b"tok-plain".to_vec()),
            Resp::Int(plain_fence)
        ])
    );
    let set = ["CONFIG", "SET", "lock.min-token-length", "16"];
    assert_eq!(c.cmd(&set), Resp::Simple("OK".into()));
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:owner", "tok-plain"]).int(), 0);
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:owner", "tok-owner"]).int(), 1);
    assert_eq!(
        c.cmd(&["LOCK.RELEASE", "lock:classic", "classic-token"])
            .int(),
        1
    );
    // Fences go on above everything 0.1 issued, on its scale (the counter is past 2^53).
    let next = match c.cmd(&["LOCK.ACQUIRE", "lock:next"]) {
        Resp::Array(v) => v[1].int(),
        other => panic!("{other:?}"),
    };
    assert!(
        next > counter,
        "fence {next} after the upgrade <= {counter}"
    );
    assert!(next >= unix_ms() << 20, "fence {next} left the 0.1 scale");
    // Nothing the server writes from now on holds the token in clear.
    let dump = c.cmd(&["DUMP", "lock:plain"]).bytes();
    assert!(!contains(&dump, b"tok-plain"), "DUMP shows the old token");
    pttl
}

#[test]
fn an_rdb_file_written_by_0_1_loads() {
    let dir = with_fixture("v0.1", "dump.rdb", "dump.rdb");
    let s = ServerBuilder::new()
        .dir(dir.clone())
        .module_args(&["debug-commands", "yes", "max-ttl", "315360000000"])
        .start();
    check_upgraded(&s, &expected("rdb.expected"));
    let mut c = RawConn::connect(s.port);
    assert_eq!(c.cmd(&["SAVE"]), Resp::Simple("OK".into()));
    assert!(
        files_with(&dir, b"tok-plain").is_empty(),
        "the new RDB holds a token"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_aof_written_by_0_1_loads() {
    let dir = with_fixture("v0.1", "appendonlydir", "appendonlydir");
    let s = ServerBuilder::new()
        .dir(dir.clone())
        .arg("appendonly", "yes")
        .arg("aof-use-rdb-preamble", "no")
        .module_args(&["debug-commands", "yes", "max-ttl", "315360000000"])
        .start();
    let pttl = check_upgraded(&s, &expected("aof.expected"));
    // Loaded from LOCK.SYNC, a lock key has no Redis expiry (from an RDB neither: the
    // module takes the old one off, see the test below).
    for key in ["lock:owner", "lock:plain"] {
        assert_eq!(pttl[key], -1, "{key} has a Redis expiry");
    }
    // A rewrite replaces the 0.1 commands with LOCK.REPL (digests only).
    let mut c = RawConn::connect(s.port);
    c.cmd(&["BGREWRITEAOF"]);
    assert!(common::wait_until(
        std::time::Duration::from_secs(10),
        || {
            let m = common::info_map(&mut c, "persistence");
            m.get("aof_rewrite_in_progress").map(String::as_str) == Some("0")
                && m.get("aof_rewrite_scheduled").map(String::as_str) == Some("0")
        }
    ));
    let base: Vec<PathBuf> = std::fs::read_dir(dir.join("appendonlydir"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".base.aof"))
        .collect();
    assert!(
        base.iter()
            .any(|p| std::fs::read(p).is_ok_and(|b| contains(&b, b"LOCK.REPL"))),
        "no LOCK.REPL in the rewritten AOF"
    );
    assert!(
        !base
            .iter()
            .any(|p| std::fs::read(p).is_ok_and(|b| contains(&b, b"tok-plain"))),
        "the rewritten AOF holds a token"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server that restarts without its data after issuing 0.1 fences would start again on
/// the new, smaller scale; `fence-shift 20` keeps the old one. Anything else is refused
/// at load.
#[test]
fn fence_shift_20_keeps_the_0_1_scale() {
    let s = ServerBuilder::new()
        .module_args(&["fence-shift", "20"])
        .start();
    let mut c = RawConn::connect(s.port);
    let before = unix_ms();
    let fence = match c.cmd(&["LOCK.ACQUIRE", "k"]) {
        Resp::Array(v) => v[1].int(),
        other => panic!("{other:?}"),
    };
    assert!(
        fence >= before << 20,
        "fence {fence} is not on the 0.1 scale"
    );
    let fresh = ServerBuilder::new().start();
    let mut c = RawConn::connect(fresh.port);
    let small = match c.cmd(&["LOCK.ACQUIRE", "k"]) {
        Resp::Array(v) => v[1].int(),
        other => panic!("{other:?}"),
    };
    assert!(
        small < 1 << 53,
        "a new deployment's fence {small} does not fit a double"
    );
    let err = ServerBuilder::new()
        .module_args(&["fence-shift", "16"])
        .try_start()
        .expect_err("fence-shift 16 must be refused");
    assert!(err.contains("fence-shift must be 10 or 20"), "{err}");
}

/// A lock loaded from an RDB that 0.1 or 0.2 wrote comes with the Redis expiry those
/// releases gave its key (the lease's end on the wall clock). Were it kept, Redis would
/// remove the key at the old deadline whatever EXTEND says (and early after a forward step
/// of the wall clock). The module takes it off once loading ends: a module lock key has no
/// Redis expiry (PTTL -1). Here 0.1's RDB is patched so that lock:owner's lease and its
/// key's expiry end 3 s from now (both are 8-byte fields, patched in place; the checksum
/// is zeroed, which Redis reads as "not checked"); before the fix the extended lock was
/// gone 3.5 s later.
#[test]
fn a_lock_loaded_from_a_0_1_rdb_loses_its_old_key_expiry_and_survives_an_extend() {
    let mut rdb = std::fs::read(fixtures("v0.1").join("dump.rdb")).unwrap();
    let want = expected("rdb.expected");
    let old = want["lock:owner expires-at"] as u64;
    let soon = (unix_ms() + 3000) as u64;
    let at_be = find_once(&rdb, &old.to_be_bytes());
    rdb[at_be..at_be + 8].copy_from_slice(&soon.to_be_bytes());
    let mut key_expiry = vec![0xfc];
    key_expiry.extend_from_slice(&old.to_le_bytes());
    let at_le = find_once(&rdb, &key_expiry) + 1;
    rdb[at_le..at_le + 8].copy_from_slice(&soon.to_le_bytes());
    let n = rdb.len();
    rdb[n - 8..].fill(0);
    let dir = temp_dir();
    std::fs::write(dir.join("dump.rdb"), &rdb).unwrap();
    let s = ServerBuilder::new()
        .dir(dir.clone())
        .module_args(&["max-ttl", "315360000000"])
        .start();
    let mut c = RawConn::connect(s.port);
    let i = c.cmd(&["LOCK.INFO", "lock:owner"]);
    let fence = want["lock:owner fence"];
    assert_eq!(
        int(&i, "fence"),
        fence,
        "the patched RDB did not load\n{}",
        s.log_tail()
    );
    assert!(int(&i, "ttl") <= 3000, "{i:?}");
    // The holder extends its lease to a minute, well past the old deadline.
    let extend = ["LOCK.EXTEND", "lock:owner", "tok-owner", "PX", "60000"];
    assert_eq!(c.cmd(&extend).int(), 1);
    let ttl = int(&c.cmd(&["LOCK.INFO", "lock:owner"]), "ttl");
    assert!(ttl > 59_000, "EXTEND gave {ttl} ms");
    let pttl = c.cmd(&["PTTL", "lock:owner"]).int();
    std::thread::sleep(std::time::Duration::from_millis(3500));
    let i = c.cmd(&["LOCK.INFO", "lock:owner"]);
    assert_ne!(
        i,
        Resp::Nil,
        "lock:owner was extended to 60 s but is gone 3.5 s later: Redis removed the key at \
         the expiry 0.1's RDB gave it (PTTL after the EXTEND was {pttl}, not -1)"
    );
    assert_eq!(int(&i, "fence"), fence);
    assert_eq!(
        pttl, -1,
        "a module lock key has a Redis expiry after loading a 0.1 RDB"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The one offset of `needle` in `hay`; panics when it is missing or repeated.
fn find_once(hay: &[u8], needle: &[u8]) -> usize {
    let at: Vec<usize> = hay
        .windows(needle.len())
        .enumerate()
        .filter(|(_, w)| *w == needle)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "{needle:?} found at {at:?}");
    at[0]
}
