//! Shared helpers of the regression tests written first for issues 18, 19 and 20
//! (`tests/holes.rs`, `tests/clock.rs`, `tests/cluster_fences.rs`, `tests/paths.rs`,
//! `tests/upgrade_v02.rs`). Each file uses `mod regress;` and only some of this.
#![allow(dead_code, unused_imports)]

pub use redis_lock_testkit::paths;
pub use redis_lock_testkit::{
    info_field, server_flavor, temp_dir, wait_until, RawConn, Resp, Server, ServerBuilder,
};

use std::time::{Duration, Instant};

/// How long a test waits for something that must happen.
pub const SETTLE: Duration = Duration::from_secs(10);

/// A 24-byte token unique to `name` (at least `lock.min-token-length`, 16, long).
pub fn tok(name: &str) -> String {
    format!("{name:-<20}-tok")
}

/// A server that starts a replica's full sync at once.
pub fn primary() -> ServerBuilder {
    ServerBuilder::new().arg("repl-diskless-sync-delay", "0")
}

/// A server with `LOCK.DEBUG` on.
pub fn debug_server() -> ServerBuilder {
    ServerBuilder::new()
        .arg("repl-diskless-sync-delay", "0")
        .module_args(&["debug-commands", "yes"])
}

/// A replica of `primary`, synced.
pub fn replica_of(primary: &Server, b: ServerBuilder) -> Server {
    b.try_start_replica_of(primary, SETTLE)
        .unwrap_or_else(|e| panic!("replica of {}: {e}", primary.port))
}

/// Waits until `replica` processed all `primary` sent; panics after [`SETTLE`].
pub fn caught_up(primary: &Server, replica: &Server) {
    assert!(
        paths::wait_replica_caught_up(primary, replica, SETTLE),
        "replica {} did not catch up with {}",
        replica.port,
        primary.port
    );
}

/// The words of `s`: a command line written on one line (arguments without spaces).
pub fn words(s: &str) -> Vec<&str> {
    s.split(' ').collect()
}

/// The command line `LOCK.ACQUIRE key args...`.
pub fn acq<'a>(key: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["LOCK.ACQUIRE", key];
    v.extend_from_slice(args);
    v
}

/// `[token, fence]` of a grant, None for nil; panics on anything else.
pub fn grant(r: &Resp) -> Option<(Vec<u8>, i64)> {
    let items = match r {
        Resp::Nil => return None,
        Resp::Array(items) => items.as_slice(),
        _ => &[],
    };
    let [Resp::Bulk(t), Resp::Int(f)] = items else {
        panic!("not a grant: {r:?}")
    };
    Some((t.clone(), *f))
}

/// A grant that must be there.
pub fn granted(r: &Resp) -> (Vec<u8>, i64) {
    grant(r).unwrap_or_else(|| panic!("expected a grant, got nil"))
}

/// The text of an error reply; panics on anything else.
pub fn error_text(r: &Resp, what: &str) -> String {
    match r {
        Resp::Error(e) => e.clone(),
        other => panic!("{what}: expected an error, got {other:?}"),
    }
}

/// `LOCK.INFO key` (Nil when free).
pub fn info(c: &mut RawConn, key: &str) -> Resp {
    c.cmd(&["LOCK.INFO", key])
}

/// An integer field of `LOCK.INFO key`; panics when the lock is free or lacks it.
pub fn info_int(c: &mut RawConn, key: &str, field: &str) -> i64 {
    let i = info(c, key);
    match i.get(field) {
        Some(Resp::Int(v)) => v,
        other => panic!("LOCK.INFO {key} {field}: {other:?} in {i:?}"),
    }
}

/// An integer field of `LOCK.INFO key`, None when the lock is free or lacks it.
pub fn info_opt(c: &mut RawConn, key: &str, field: &str) -> Option<i64> {
    info(c, key).get(field).and_then(|v| v.as_int())
}

/// The fences of `LOCK.INFO key`'s `holder-list`.
pub fn holder_fences(r: &Resp) -> Vec<i64> {
    match r.get("holder-list") {
        Some(list) => list
            .items()
            .iter()
            .filter_map(|h| h.get("fence").and_then(|f| f.as_int()))
            .collect(),
        None => Vec::new(),
    }
}

/// `n` ordinary keys of several types, `ord:*`; the count of keys made.
pub fn ordinary_keys(c: &mut RawConn, n: usize) -> i64 {
    let mut cmds: Vec<Vec<String>> = Vec::new();
    for i in 0..n {
        cmds.push(vec!["SET".into(), format!("ord:s{i}"), format!("v{i}")]);
    }
    cmds.push(vec!["HSET".into(), "ord:h".into(), "f".into(), "v".into()]);
    cmds.push(vec!["RPUSH".into(), "ord:l".into(), "a".into(), "b".into()]);
    let replies = c.pipeline(&cmds).unwrap();
    assert!(replies.iter().all(|r| !r.is_error()), "{replies:?}");
    n as i64 + 2
}

/// True when the ordinary keys are all there with their values.
pub fn ordinary_keys_intact(c: &mut RawConn, n: usize) -> bool {
    (0..n)
        .all(|i| c.cmd(&["GET", &format!("ord:s{i}")]) == Resp::Bulk(format!("v{i}").into_bytes()))
        && c.cmd(&["HGET", "ord:h", "f"]) == Resp::Bulk(b"v".to_vec())
        && c.cmd(&["LLEN", "ord:l"]) == Resp::Int(2)
}

pub fn dbsize(c: &mut RawConn) -> i64 {
    c.cmd(&["DBSIZE"]).int()
}

/// Connects to `s`, or panics with its log tail.
pub fn conn(s: &Server) -> RawConn {
    s.try_raw(Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect to {}: {e}\n{}", s.port, s.log_tail()))
}

/// A server started from `b`, a connection to it and an empty [`Checks`].
pub fn start(b: ServerBuilder) -> (Server, RawConn, Checks) {
    let s = b.start();
    let c = conn(&s);
    (s, c, Checks::new())
}

/// A three-node cluster and an empty [`Checks`].
pub fn start_cluster() -> (redis_lock_testkit::Cluster, Checks) {
    (redis_lock_testkit::Cluster::start(3), Checks::new())
}

/// `LOCK.ACQUIRE key PX px TOKEN token extra...`: the fence (panics unless `token` is
/// granted).
pub fn take_px(c: &mut RawConn, key: &str, token: &str, px: u64, extra: &[&str]) -> i64 {
    let px = px.to_string();
    let r = c.cmd(&[&["LOCK.ACQUIRE", key, "PX", &px, "TOKEN", token], extra].concat());
    let (t, f) = granted(&r);
    assert_eq!(t, token.as_bytes(), "{r:?}");
    f
}

/// [`take_px`] with a 60 s lease.
pub fn take(c: &mut RawConn, key: &str, token: &str, extra: &[&str]) -> i64 {
    take_px(c, key, token, 60_000, extra)
}

pub fn ok() -> Resp {
    Resp::Simple("OK".into())
}

/// The server answers PING and its log shows no panic.
pub fn alive(s: &Server, k: &mut Checks, what: &str) {
    let ping = s
        .try_raw(Duration::from_secs(5))
        .and_then(|mut c| c.call(&["PING"]));
    k.check(
        matches!(&ping, Ok(Resp::Simple(p)) if p == "PONG"),
        format!(
            "{what}: the server answers PING ({ping:?})\n{}",
            s.log_tail()
        ),
    );
    k.check(
        !s.log().to_ascii_lowercase().contains("panic"),
        format!("{what}: no panic in the log\n{}", s.log_tail()),
    );
}

/// `SAVE`, kill, start again on the same port and directory; Err with the log tail
/// when the server does not come back (e.g. it refuses its own RDB file).
pub fn save_and_restart(s: &mut Server) -> Result<(), String> {
    let mut c = conn(s);
    // A replica's full sync may still be saving in the background: SAVE waits for it.
    let mut saved = c.cmd(&["SAVE"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while matches!(&saved, Resp::Error(e) if e.contains("in progress")) && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
        saved = c.cmd(&["SAVE"]);
    }
    assert_eq!(saved, Resp::Simple("OK".into()), "SAVE");
    drop(c);
    s.kill9();
    s.try_restart()
}

/// `DEBUG RELOAD` (save the dataset, empty it, load it back): the reply.
pub fn debug_reload(c: &mut RawConn) -> Resp {
    c.cmd(&["DEBUG", "RELOAD"])
}

/// A client that sent a command and has not read the reply.
pub struct Pending {
    pub conn: RawConn,
    pub sent: Instant,
}

impl Pending {
    pub fn send(port: u16, argv: &[&str]) -> Pending {
        let mut conn = RawConn::connect(port);
        conn.send(argv);
        Pending {
            conn,
            sent: Instant::now(),
        }
    }

    /// The reply, waiting at most `within`.
    pub fn reply_within(&mut self, within: Duration) -> std::io::Result<Resp> {
        self.conn.set_read_timeout(Some(within));
        self.conn.read()
    }
}

/// The lines a `MONITOR` connection got, read until the first that contains `last` (or
/// until nothing came for `quiet`).
pub fn monitor_lines(mon: &mut RawConn, last: &str, quiet: Duration) -> Vec<String> {
    mon.set_read_timeout(Some(quiet));
    let mut lines = Vec::new();
    while let Ok(r) = mon.read() {
        let line = r.as_text().unwrap_or_default();
        let end = line.contains(last);
        lines.push(line);
        if end {
            break;
        }
    }
    lines
}

/// Waits until `n` clients are queued on `key` (`LOCK.INFO` waiters).
pub fn wait_waiters(c: &mut RawConn, key: &str, n: i64) {
    let ok = wait_until(SETTLE, || {
        info(c, key).get("waiters").and_then(|w| w.as_int()) == Some(n)
    });
    assert!(ok, "expected {n} waiters on {key}: {:?}", info(c, key));
}

/// True when the server binary has module ACL categories (Redis 7.2+, Valkey 8).
pub fn has_module_acl_categories() -> bool {
    let f = server_flavor();
    f.is_valkey() || f.at_least(7, 2)
}

/// Collects failed expectations so that one run reports every one of them (a test that
/// stops at its first failure would hide, e.g., the data loss behind a holder count).
#[derive(Default)]
pub struct Checks {
    failed: Vec<String>,
}

impl Checks {
    pub fn new() -> Checks {
        Checks::default()
    }

    /// Records `what` as failed unless `ok`.
    pub fn check(&mut self, ok: bool, what: impl Into<String>) -> bool {
        if !ok {
            let what = readable(&what.into());
            eprintln!("FAILED: {what}");
            self.failed.push(what);
        }
        ok
    }

    /// Records `what` with both values unless they are equal.
    pub fn eq<T: PartialEq + std::fmt::Debug>(&mut self, got: T, want: T, what: &str) -> bool {
        let ok = got == want;
        self.check(ok, format!("{what}: got {got:?}, want {want:?}"))
    }

    /// Records `what` with the reply unless `r` is an error whose text starts with `prefix`.
    pub fn err(&mut self, r: &Resp, prefix: &str, what: impl Into<String>) -> bool {
        let what = what.into();
        self.check(
            is_err_with(r, prefix),
            format!("{what}: want an error {prefix:?}..., got {r:?}"),
        )
    }

    /// [`alive`] on `s`, then [`Checks::finish`].
    pub fn finish_alive(mut self, s: &Server, what: &str) {
        alive(s, &mut self, what);
        self.finish()
    }

    /// Panics listing every failed expectation.
    pub fn finish(self) {
        assert!(
            self.failed.is_empty(),
            "{} expectation(s) failed:\n- {}",
            self.failed.len(),
            self.failed.join("\n- ")
        );
    }
}

/// A `Debug` text with every `Bulk([104, 105])` / `[104, 105]` byte list of printable
/// ASCII shown as `"hi"`, so that failure messages can be read.
pub fn readable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('[') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let end = after.find(']').unwrap_or(0);
        let inner = &after[..end];
        let bytes: Option<Vec<u8>> = inner
            .split(", ")
            .map(|n| n.trim().parse::<u8>().ok())
            .collect();
        match bytes {
            Some(b) if end > 0 && b.iter().all(|c| (0x20..0x7f).contains(c)) => {
                out.push_str(&format!("{:?}", String::from_utf8_lossy(&b)));
                rest = &after[end + 1..];
            }
            _ => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Every byte string anywhere in a reply (for "never the token" checks).
pub fn all_bytes(r: &Resp, out: &mut Vec<u8>) {
    match r {
        Resp::Bulk(v) | Resp::Verbatim(_, v) => out.extend_from_slice(v),
        Resp::Simple(s) | Resp::Error(s) | Resp::Double(s) | Resp::BigNum(s) => {
            out.extend_from_slice(s.as_bytes())
        }
        Resp::Array(v) | Resp::Set(v) | Resp::Push(v) => v.iter().for_each(|x| all_bytes(x, out)),
        Resp::Map(m) => m.iter().for_each(|(k, v)| {
            all_bytes(k, out);
            all_bytes(v, out);
        }),
        Resp::Int(i) => out.extend_from_slice(i.to_string().as_bytes()),
        Resp::Nil | Resp::Bool(_) => {}
    }
}

pub fn bulk(s: &str) -> Resp {
    Resp::Bulk(b(s))
}

pub fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

pub fn has(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

pub fn is_err_with(r: &Resp, prefix: &str) -> bool {
    matches!(r, Resp::Error(e) if e.starts_with(prefix))
}

/// A key (`{tag}:name`) whose slot node `node` of `cluster` serves, in another slot than
/// `not_in`.
pub fn key_served_by(
    cluster: &redis_lock_testkit::Cluster,
    node: usize,
    not_in: u16,
    name: &str,
) -> String {
    (0..)
        .map(|n| format!("{{elsewhere-{n}}}:{name}"))
        .find(|k| {
            let slot = redis_lock_testkit::key_slot(k.as_bytes());
            slot != not_in && cluster.slot_owner(slot) == Some(node)
        })
        .unwrap_or_default()
}

/// After a lock of session `sid` left node `src` with its slot, the source no longer keeps
/// the session alive: its KEEPALIVE answers 0 and renews nothing, `LOCK.SESSION INFO`
/// answers nil, an acquire in it NOSESSION; the session's lock there, `other` (taken in
/// the session opened at `opened` with a lease of `lease_ms`, never renewed since), stays
/// held to that lease and is then freed: a waiter has it no sooner, and an OPEN of the
/// same id in between (a new session, answered 1) does not renew it.
pub fn source_lets_moved_session_go(
    src: &Server,
    sid: &str,
    other: &str,
    opened: Instant,
    lease_ms: u64,
) {
    let lease = Duration::from_millis(lease_ms);
    assert!(
        opened.elapsed() + Duration::from_secs(2) < lease,
        "the move took {:?} of the {lease:?} lease: too slow to judge",
        opened.elapsed()
    );
    let mut c = conn(src);
    let fences = holder_fences(&info(&mut c, other));
    assert_eq!(fences.len(), 1, "{other} held in the session on the source");
    assert_eq!(
        c.cmd(&["LOCK.SESSION", "KEEPALIVE", sid, "PX", "60000"]),
        Resp::Int(0),
        "a keepalive on the source after one of the session's locks moved away"
    );
    let ttl = info_int(&mut c, other, "ttl");
    assert!(
        ttl <= lease_ms as i64,
        "{other}: renewed on the source by a refused keepalive (ttl {ttl})"
    );
    assert_eq!(c.cmd(&["LOCK.SESSION", "INFO", sid]), Resp::Nil);
    let spare = format!("{other}-spare");
    let r = c.cmd(&acq(&spare, &["SESSION", sid]));
    assert!(is_err_with(&r, "NOSESSION"), "{r:?}");
    assert_eq!(c.info_u64("lock", "lock_sessions_moved").unwrap(), 1);
    let mut waiter = Pending::send(
        src.port,
        &["LOCK.ACQUIRE", other, "PX", "10000", "BLOCK", "60000"],
    );
    wait_waiters(&mut c, other, 1);
    // An OPEN of the id now: a new session, without the lock the old one still holds.
    assert_eq!(
        c.cmd(&["LOCK.SESSION", "OPEN", sid, "PX", "60000"]),
        Resp::Int(1)
    );
    let s = c.cmd(&["LOCK.SESSION", "INFO", sid]);
    assert_eq!(s.get("locks"), Some(Resp::Int(0)), "{s:?}");
    assert_eq!(
        c.cmd(&["LOCK.SESSION", "KEEPALIVE", sid, "PX", "60000"]),
        Resp::Int(1)
    );
    assert_eq!(holder_fences(&info(&mut c, other)), fences, "still held");
    let r = waiter
        .reply_within(lease + Duration::from_secs(30))
        .expect("the waiter granted once the lease is over");
    assert!(grant(&r).is_some(), "{r:?}");
    assert!(
        opened.elapsed() >= lease,
        "{other} freed {:?} after the session opened, before its {lease:?} lease ended",
        opened.elapsed()
    );
    assert_eq!(c.cmd(&["LOCK.SESSION", "CLOSE", sid]), Resp::Int(0));
}
