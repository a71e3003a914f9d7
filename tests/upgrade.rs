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

/// An RDB file with nothing in it, written by a server with this module loaded: what a
/// stand-in primary sends as its full sync.
fn empty_rdb() -> Vec<u8> {
    let donor = ServerBuilder::new().start();
    let mut d = RawConn::connect(donor.port);
    assert_eq!(d.cmd(&["SAVE"]), Resp::Simple("OK".into()));
    let name = d.cmd(&["CONFIG", "GET", "dbfilename"]).items()[1].text();
    std::fs::read(donor.dir.join(name)).expect("the donor's RDB")
}

/// A stand-in for a primary of an earlier build, on a free loopback port: it speaks the
/// replication handshake to the one replica that connects, sends an empty RDB as the
/// full sync, then (once `go` is sent or dropped) `stream` (RESP commands as that
/// primary wrote them), and keeps the link up until `done` is sent or 30 s pass.
struct StandIn {
    port: u16,
    go: std::sync::mpsc::Sender<()>,
    done: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

fn stand_in_primary(stream: Vec<u8>) -> StandIn {
    use std::io::Write;
    use std::net::TcpListener;
    use std::time::Duration;
    let rdb = empty_rdb();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let (done, done_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let (stream_in, _) = listener.accept().expect("the replica connects");
        let mut out = stream_in.try_clone().expect("clone");
        let mut p = RawConn::from_stream(stream_in, Duration::from_secs(10)).expect("conn");
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
        let _ = go_rx.recv_timeout(Duration::from_secs(30));
        let mut all = Vec::new();
        redis_lock_testkit::encode(&mut all, &[b"SELECT", b"0"]);
        all.extend_from_slice(&stream);
        out.write_all(&all).expect("the stream");
        // Keep the link up until the test has looked.
        let _ = done_rx.recv_timeout(Duration::from_secs(30));
    });
    StandIn {
        port,
        go,
        done,
        thread,
    }
}

/// A replica of a 0.1 primary receives `LOCK.SYNC` with the token in clear. It applies
/// it (as a digest), and the token stays out of the replica's MONITOR and SLOWLOG, which
/// show the commands of its master as they show anyone's. The primary here is a
/// [`stand_in_primary`] that sends one `LOCK.SYNC` as 0.1 wrote it (its `unix_ms << 20`
/// fence scale: the replica runs with `fence-shift 20`, as a server that took over 0.1's
/// data does).
#[test]
fn a_lock_sync_from_a_0_1_primary_is_applied_and_its_token_is_not_logged() {
    use std::time::{Duration, Instant};
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
    let mut stream = Vec::new();
    let args: Vec<&[u8]> = sync.iter().map(|s| s.as_bytes()).collect();
    redis_lock_testkit::encode(&mut stream, &args);
    let primary = stand_in_primary(stream);
    let _ = primary.go.send(());
    let primary_port = primary.port;
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
    let _ = primary.done.send(());
    drop(mon);
    c.cmd(&["REPLICAOF", "NO", "ONE"]);
    primary.thread.join().expect("the stand-in primary");
}

/// The builds before this one wrote the op word of `LOCK.REPL` and `LOCK.SREPL` as an
/// argument of its own (`LOCK.REPL key ADD <fields>`, `LOCK.SREPL OPEN <digest> <lease>
/// <ttl>`). A replica of such a primary applies every change it sends, and passes each
/// on as received to a replica of its own (whose arity check the shorter form must pass
/// too). The stream is this build's own, from a server's AOF, with the op words split
/// off again, sent by a [`stand_in_primary`] to R1 while R2 is attached to R1. The
/// source's own replica Q1 and Q1's replica Q2 get this build's packed form the same way.
#[test]
fn a_replica_of_a_primary_of_the_build_before_applies_the_op_word_as_an_argument_and_passes_it_on()
{
    use common::conn::{durable, lock_info};
    use common::{aof, debug_server, tok, wait_until, SETTLE};
    use redis_lock_testkit::lock::FENCE_SHIFT;
    use std::collections::BTreeSet;
    let source = ServerBuilder::new()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .arg("repl-diskless-sync-delay", "0")
        .start();
    let loaded = unix_ms();
    // This build's own form through a chain too: Q1 replicates the source, Q2 Q1.
    let q1 = common::start_replica_of(&source, debug_server().arg("repl-diskless-sync-delay", "0"));
    let q2 = common::start_replica_of(&q1, debug_server());
    let mut c = RawConn::connect(source.port);
    let granted = |r: Resp| r.grant().unwrap_or_else(|| panic!("not granted: {r:?}"));
    granted(c.cmd(&[
        "LOCK.ACQUIRE",
        "up:excl",
        "PX",
        "5000",
        "TOKEN",
        &tok("ex"),
        "OWNER",
        "svc;a b",
    ]));
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", "up:excl", &tok("ex"), "PX", "120000"])
            .int(),
        1
    );
    for t in ["r1", "r2"] {
        granted(c.cmd(&[
            "LOCK.ACQUIRE",
            "up:shared",
            "SHARED",
            "PX",
            "120000",
            "TOKEN",
            &tok(t),
        ]));
        granted(c.cmd(&[
            "LOCK.ACQUIRE",
            "up:limit",
            "LIMIT",
            "3",
            "PX",
            "120000",
            "TOKEN",
            &tok(t),
        ]));
    }
    assert_eq!(c.cmd(&["LOCK.RELEASE", "up:shared", &tok("r1")]).int(), 1);
    granted(c.cmd(&[
        "LOCK.ACQUIRE",
        "up:delayed",
        "PX",
        "100",
        "LOCKDELAY",
        "100000",
    ]));
    let delayed = |c: &mut RawConn| {
        c.cmd(&["LOCK.INFO", "up:delayed"]).field("state") == Some(Resp::Bulk(b"delayed".to_vec()))
    };
    assert!(wait_until(SETTLE, || delayed(&mut c)), "no lock-delay");
    // Sessions: one kept alive with a lock, one closed (its lock released with it).
    let (kept, closed) = ("up-session-kept-00000001", "up-session-closed-0000001");
    for id in [kept, closed] {
        let open = ["LOCK.SESSION", "OPEN", id, "PX", "120000", "OWNER", "svc;s"];
        assert_eq!(c.cmd(&open).int(), 1);
    }
    granted(c.cmd(&["LOCK.ACQUIRE", "up:session", "SESSION", kept]));
    granted(c.cmd(&["LOCK.ACQUIRE", "up:closed", "SESSION", closed]));
    assert_eq!(
        c.cmd(&["LOCK.SESSION", "KEEPALIVE", kept, "PX", "110000"])
            .int(),
        1
    );
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", closed]).int(), 1);
    let (gone, _) = granted(c.cmd(&["LOCK.ACQUIRE", "up:released", "PX", "120000"]));
    assert_eq!(
        c.cmd(&[&b"LOCK.RELEASE"[..], b"up:released", &gone]).int(),
        1
    );

    // Last, a renew that lifts the counter above every fence issued (FLOOR; no grant
    // after it carries as high a fence, so the replicas' counters get there by it alone):
    // a MINFENCE past the start-up jump of the counter (an hour ahead of the module's
    // load), which MINFENCE's own bound (an hour ahead of the clock) allows once a second
    // has gone by. Then a plain key that marks the end of the stream.
    assert!(wait_until(SETTLE, || unix_ms() > loaded + 1000));
    let floor = (((unix_ms() + 3_599_000) as u64) << FENCE_SHIFT).to_string();
    let renew = [
        "LOCK.ACQUIRE",
        "up:floor",
        "PX",
        "120000",
        "TOKEN",
        &tok("fl"),
    ];
    granted(c.cmd(&renew));
    granted(c.cmd(&[&renew[..], &["MINFENCE", &floor]].concat()));
    assert_eq!(c.cmd(&["SET", "up:end", "1"]), Resp::Simple("OK".into()));
    // The source's AOF (fsync always) in the earlier form.
    let (mut cmds, mut ops) = (Vec::new(), BTreeSet::new());
    let dir = source.dir.join("appendonlydir");
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        if e.file_name().to_string_lossy().ends_with(".incr.aof") {
            cmds.extend(aof::commands(&std::fs::read(e.path()).unwrap()));
        }
    }
    for argv in &mut cmds {
        ops.extend(aof::split_op_word(argv));
    }
    let floored = |a: &Vec<Vec<u8>>| {
        a.windows(2)
            .any(|w| w[0] == b"FLOOR" && w[1] == floor.as_bytes())
    };
    assert!(cmds.iter().any(floored), "no FLOOR {floor} in the stream");
    let want: BTreeSet<String> = [
        "LOCK.REPL ADD",
        "LOCK.REPL RENEW",
        "LOCK.REPL DROP",
        "LOCK.REPL DELAY",
        "LOCK.SREPL OPEN",
        "LOCK.SREPL RENEW",
        "LOCK.SREPL END",
    ]
    .map(String::from)
    .into();
    assert_eq!(ops, want, "the changes the source wrote");

    let primary = stand_in_primary(aof::bytes(&cmds));
    let r1 = debug_server().arg("repl-diskless-sync-delay", "0").start();
    let mut c1 = RawConn::connect(r1.port);
    let port = primary.port.to_string();
    assert_eq!(
        c1.cmd(&["REPLICAOF", "127.0.0.1", &port]),
        Resp::Simple("OK".into())
    );
    let linked =
        |s: &Server| s.info_field("replication", "master_link_status").as_deref() == Some("up");
    assert!(
        wait_until(SETTLE, || linked(&r1)),
        "R1 not linked\n{}",
        r1.log_tail()
    );
    let r2 = common::start_replica_of(&r1, debug_server());
    let mut mon = RawConn::connect(r2.port);
    assert_eq!(mon.cmd(&["MONITOR"]), Resp::Simple("OK".into()));
    let _ = primary.go.send(());

    let keys = ["up:excl", "up:floor", "up:shared", "up:limit", "up:session"];
    let mut sc = source.conn();
    let chain = [
        ("R1 (the form before)", &r1),
        ("R2 (chained, the form before)", &r2),
        ("Q1", &q1),
        ("Q2 (chained)", &q2),
    ];
    for (name, s) in chain {
        let mut rc = s.conn();
        let arrived = wait_until(SETTLE, || {
            redis::cmd("EXISTS")
                .arg("up:end")
                .query::<i64>(&mut rc)
                .is_ok_and(|n| n == 1)
        });
        assert!(
            arrived,
            "{name}: the stream did not arrive\n{}",
            s.log_tail()
        );
        // What is left of the lock-delay counts down (and ends no earlier there).
        let left = |i: &mut common::conn::Info| match i.remove("lock-delay") {
            Some(redis::Value::Int(ms)) => ms,
            other => panic!("lock-delay {other:?}"),
        };
        let (mut d, mut dr) = (
            lock_info(&mut sc, "up:delayed"),
            lock_info(&mut rc, "up:delayed"),
        );
        let (ms, ms_there) = (left(d.as_mut().unwrap()), left(dr.as_mut().unwrap()));
        assert!(
            ms_there >= ms - 5 && ms_there <= 100_000,
            "{name}: lock-delay {ms_there}, {ms} here"
        );
        assert_eq!(
            dr.map(|i| durable(&i)),
            d.map(|i| durable(&i)),
            "{name}: up:delayed"
        );
        for key in keys {
            let want = lock_info(&mut sc, key).map(|i| durable(&i));
            assert_eq!(
                lock_info(&mut rc, key).map(|i| durable(&i)),
                want,
                "{name}: {key}"
            );
        }
        for key in ["up:closed", "up:released"] {
            assert_eq!(lock_info(&mut rc, key), None, "{name}: {key}");
        }
    }
    for (name, s) in chain {
        let rc = &mut RawConn::connect(s.port);
        assert!(delayed(rc), "{name}: up:delayed is not in its lock-delay");
        let s = rc.cmd(&["LOCK.SESSION", "INFO", kept]);
        for (f, v) in [
            ("owner", Resp::Bulk(b"svc;s".to_vec())),
            ("lease", Resp::Int(110_000)),
            ("locks", Resp::Int(1)),
        ] {
            assert_eq!(s.field(f), Some(v), "{name}: session {f} in {s:?}");
        }
        assert_eq!(
            rc.cmd(&["LOCK.SESSION", "INFO", closed]),
            Resp::Nil,
            "{name}"
        );
        let counter = rc.cmd(&["LOCK.DEBUG", "FENCE"]).int();
        assert!(
            counter >= floor.parse::<i64>().unwrap(),
            "{name}: counter {counter} < FLOOR {floor}"
        );
    }
    // R2 got the earlier form as R1 received it.
    mon.set_read_timeout(Some(std::time::Duration::from_millis(300)));
    let mut seen = String::new();
    let found = wait_until(SETTLE, || {
        if let Ok(r) = mon.read() {
            seen.push_str(&r.text());
            seen.push('\n');
        }
        seen.contains(r#""LOCK.REPL" "up:shared" "DROP""#) && seen.contains(r#""LOCK.SREPL" "END""#)
    });
    assert!(found, "R2's MONITOR:\n{seen}");
    let _ = primary.done.send(());
    drop(mon);
    c1.cmd(&["REPLICAOF", "NO", "ONE"]);
    primary.thread.join().expect("the stand-in primary");
}
