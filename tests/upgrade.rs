//! Upgrading from release 0.1: an RDB file and an AOF written by it (commit a01d003,
//! `tests/fixtures/v0.1/`, made by `scripts/make-v0.1-fixtures.sh`) load, every lock
//! keeps its fence, lease, owner and token, the tokens are stored as digests from then
//! on, and fences keep rising above the ones 0.1 issued (on its `unix_ms << 20` scale).

mod common;

use common::{contains, files_with, temp_dir, unix_ms, RawConn, Resp, Server, ServerBuilder};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.1")
}

/// `key field value` lines, and `counter value`.
fn expected(name: &str) -> HashMap<String, i64> {
    let text = std::fs::read_to_string(fixtures().join(name)).expect("fixture");
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

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

fn int(r: &Resp, f: &str) -> i64 {
    match r.field(f) {
        Some(Resp::Int(i)) => i,
        other => panic!("{f}: {other:?} in {r:?}"),
    }
}

/// The locks 0.1 wrote are all there, as they were, and usable.
fn check_upgraded(s: &Server, want: &HashMap<String, i64>) {
    let mut c = RawConn::connect(s.port);
    for key in ["lock:owner", "lock:plain"] {
        let i = c.cmd(&["LOCK.INFO", key]);
        assert_ne!(i, Resp::Nil, "{key} was not loaded\n{}", s.log_tail());
        for f in ["fence", "expires-at", "acquired-at"] {
            assert_eq!(int(&i, f), want[&format!("{key} {f}")], "{key} {f}");
        }
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
    // The tokens, now kept as digests, still work: a renew keeps the fence, a wrong
    // token releases nothing, the right one does.
    let plain_fence = want["lock:plain fence"];
    let renew = c.cmd(&[
        "LOCK.ACQUIRE",
        "lock:plain",
        "TOKEN",
        "tok-plain",
        "PX",
        "60000",
    ]);
    assert_eq!(
        renew,
        Resp::Array(vec![
            Resp::Bulk(b"tok-plain".to_vec()),
            Resp::Int(plain_fence)
        ])
    );
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
}

#[test]
fn an_rdb_file_written_by_0_1_loads() {
    let dir = temp_dir();
    std::fs::copy(fixtures().join("dump.rdb"), dir.join("dump.rdb")).unwrap();
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
    let dir = temp_dir();
    copy_dir(
        &fixtures().join("appendonlydir"),
        &dir.join("appendonlydir"),
    );
    let s = ServerBuilder::new()
        .dir(dir.clone())
        .arg("appendonly", "yes")
        .arg("aof-use-rdb-preamble", "no")
        .module_args(&["debug-commands", "yes", "max-ttl", "315360000000"])
        .start();
    check_upgraded(&s, &expected("aof.expected"));
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
