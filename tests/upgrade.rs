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
    s.rewrite_aof(std::time::Duration::from_secs(10)).unwrap();
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

/// A replica of a 0.1 primary receives `LOCK.SYNC` with the token in clear. It applies
/// it (as a digest), and the token stays out of the replica's MONITOR and SLOWLOG, which
/// show the commands of its master as they show anyone's. The primary here is a stand-in
/// that speaks the replication handshake, sends an empty RDB made by this module, then
/// one `LOCK.SYNC` as 0.1 wrote it (its `unix_ms << 20` fence scale: the replica runs
/// with `fence-shift 20`, as a server that took over 0.1's data does).
#[test]
fn a_lock_sync_from_a_0_1_primary_is_applied_and_its_token_is_not_logged() {
    use std::io::Write;
    use std::net::TcpListener;
    use std::time::{Duration, Instant};
    let rdb = {
        let donor = ServerBuilder::new().start();
        let mut d = RawConn::connect(donor.port);
        assert_eq!(d.cmd(&["SAVE"]), Resp::Simple("OK".into()));
        let name = d.cmd(&["CONFIG", "GET", "dbfilename"]).items()[1].text();
        std::fs::read(donor.dir.join(name)).expect("the donor's RDB")
    };
    let token = "clear-0.1-token-of-the-primary";
    let now = unix_ms();
    let fence = ((now as u64) << 20) + 7;
    let sync: Vec<String> = [
        "LOCK.SYNC",
        "lock:from01",
        token,
        &fence.to_string(),
        &(now + 60_000).to_string(),
        &now.to_string(),
        "6",
        "127.0.0.1:5000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let primary_port = listener.local_addr().expect("addr").port();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let primary = std::thread::spawn(move || {
        let (stream, _) = listener.accept().expect("the replica connects");
        let mut out = stream.try_clone().expect("clone");
        let mut p = RawConn::from_stream(stream, Duration::from_secs(10)).expect("conn");
        loop {
            let cmd = p.read().expect("a handshake command").items();
            let name = cmd.first().map(|c| c.text().to_ascii_uppercase());
            match name.as_deref() {
                Some("PSYNC") | Some("SYNC") => break,
                Some("PING") => out.write_all(b"+PONG\r\n").expect("reply"),
                _ => out.write_all(b"+OK\r\n").expect("reply"),
            }
        }
        let mut full =
            format!("+FULLRESYNC {} 0\r\n${}\r\n", "a".repeat(40), rdb.len()).into_bytes();
        full.extend_from_slice(&rdb);
        out.write_all(&full).expect("the RDB");
        let mut stream = Vec::new();
        let sel: [&[u8]; 2] = [b"SELECT", b"0"];
        redis_lock_testkit::encode(&mut stream, &sel);
        let args: Vec<&[u8]> = sync.iter().map(|s| s.as_bytes()).collect();
        redis_lock_testkit::encode(&mut stream, &args);
        out.write_all(&stream).expect("LOCK.SYNC");
        // Keep the link up until the test has looked.
        let _ = done_rx.recv_timeout(Duration::from_secs(30));
    });
    let replica = ServerBuilder::new()
        .module_args(&["fence-shift", "20"])
        .start();
    let mut c = RawConn::connect(replica.port);
    c.cmd(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]);
    let mut mon = RawConn::connect(replica.port);
    assert_eq!(mon.cmd(&["MONITOR"]), Resp::Simple("OK".into()));
    let port = primary_port.to_string();
    assert_eq!(
        c.cmd(&["REPLICAOF", "127.0.0.1", &port]),
        Resp::Simple("OK".into())
    );
    let applied = common::wait_until(Duration::from_secs(10), || {
        let i = c.cmd(&["LOCK.INFO", "lock:from01"]);
        i != Resp::Nil && i.field("fence") == Some(Resp::Int(fence as i64))
    });
    assert!(applied, "LOCK.SYNC was not applied\n{}", replica.log_tail());
    let mut seen = String::new();
    mon.set_read_timeout(Some(Duration::from_millis(300)));
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until && !seen.contains("LOCK.SYNC") {
        match mon.read() {
            Ok(r) => seen.push_str(&format!("{r:?}\n")),
            Err(_) => continue,
        }
    }
    assert!(
        seen.contains("LOCK.SYNC"),
        "MONITOR shows LOCK.SYNC:\n{seen}"
    );
    assert!(!seen.contains(token), "MONITOR shows the token:\n{seen}");
    // Each SLOWLOG entry: id, time, duration, the arguments, ...
    let logged: Vec<Vec<String>> = c
        .cmd(&["SLOWLOG", "GET", "1000"])
        .items()
        .iter()
        .map(|e| e.items()[3].items().iter().map(Resp::text).collect())
        .collect();
    assert!(
        logged.iter().any(|a| a[0] == "LOCK.SYNC"),
        "SLOWLOG shows LOCK.SYNC: {logged:?}"
    );
    assert!(
        !logged.iter().flatten().any(|a| a.contains(token)),
        "SLOWLOG shows the token: {logged:?}"
    );
    let _ = done_tx.send(());
    drop(mon);
    c.cmd(&["REPLICAOF", "NO", "ONE"]);
    primary.join().expect("the stand-in primary");
}
