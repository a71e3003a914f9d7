//! The integration tests' harness: a thin layer over the shared test kit
//! (`testkit/`, crate `redis-lock-testkit`), which starts throw-away `redis-server` /
//! `valkey-server` processes on free loopback ports, speaks RESP by hand and knows the
//! lock commands. This file keeps the names every `tests/*.rs` file (and the client
//! crate's tests, which include it) has always used; the environment variables are the
//! kit's: `LOCK_SERVER_BIN`, `LOCK_MODULE`, `LOCK_KEEP_DIRS`.
//!
//! Each integration test file uses `mod common;` and only some of this API.
#![allow(dead_code, unused_imports)]

pub use redis_lock_testkit::lock::{info_map, lock_stat};
pub use redis_lock_testkit::{
    free_port, key_slot, module_path, parse_flavor, server_bin, server_flavor,
    starts_with_error_code, temp_dir, unix_ms, wait_until, Cluster, Flavor, RawConn, Resp, Server,
    ServerBuilder, CLUSTER_TIMEOUT, IO_TIMEOUT, START_TIMEOUT,
};

use std::collections::BTreeMap;
use std::time::Duration;

/// How long a test waits for a queue count, a counter, a reply or a replica to show up.
pub const SETTLE: Duration = Duration::from_secs(10);

/// The shortest TOKEN `LOCK.ACQUIRE` takes by default (`lock.min-token-length`).
pub const MIN_TOKEN_LEN: usize = 16;

/// A token unique to `name`, padded to at least [`MIN_TOKEN_LEN`] bytes (24 for a short
/// name: `name`, dashes up to 20 bytes, then `-tok`). Tests that check the refusal of a
/// short token use a short one on purpose.
pub fn tok(name: &str) -> String {
    format!("{name:-<20}-tok")
}

/// The words of `s`: a command line or its arguments written on one line (arguments
/// without spaces).
pub fn words(s: &str) -> Vec<&str> {
    s.split(' ').collect()
}

/// True when `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Every file below `dir` (recursively) that contains `needle`; panics when `dir`
/// cannot be read.
pub fn files_with(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_with(&p, needle));
        } else if std::fs::read(&p).is_ok_and(|b| contains(&b, needle)) {
            out.push(p);
        }
    }
    out
}

/// `tests/fixtures/<release>`: files an old release wrote.
pub fn fixtures(release: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(release)
}

/// A new temporary directory holding a copy of `fixtures(release)/from` (a file or a
/// directory) named `to`.
pub fn with_fixture(release: &str, from: &str, to: &str) -> std::path::PathBuf {
    fn copy(from: &std::path::Path, to: &std::path::Path) {
        if from.is_dir() {
            std::fs::create_dir_all(to).unwrap();
            for e in std::fs::read_dir(from).unwrap() {
                let e = e.unwrap();
                copy(&e.path(), &to.join(e.file_name()));
            }
        } else {
            std::fs::copy(from, to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
        }
    }
    let dir = temp_dir();
    copy(&fixtures(release).join(from), &dir.join(to));
    dir
}

/// `n` keys `{prefix}{i}` that expire in `ttl_ms` (Redis's own expiry samples them
/// too: a lock among them is not found at once by sampling).
pub fn volatile_keys(c: &mut redis::Connection, prefix: &str, n: usize, ttl_ms: u64) {
    let mut pipe = redis::pipe();
    for i in 0..n {
        pipe.cmd("SET")
            .arg(format!("{prefix}{i}"))
            .arg("x")
            .arg("PX")
            .arg(ttl_ms)
            .ignore();
    }
    let _: () = pipe.query(c).unwrap();
}

/// A fence 59 minutes ahead of the clock (MINFENCE may lead it by an hour).
pub fn far_fence() -> u64 {
    ((unix_ms() + 3_540_000) as u64) << redis_lock_testkit::lock::FENCE_SHIFT
}

/// A replica of `primary` started from `builder` (`replicaof` in its config), once its
/// link is up and the first sync is done.
pub fn start_replica_of(primary: &Server, builder: ServerBuilder) -> Server {
    builder
        .try_start_replica_of(primary, SETTLE)
        .unwrap_or_else(|e| panic!("replica of {}: {e}", primary.port))
}

/// A [`primary`], a synced replica of it, and a [`RawConn`] to each.
pub fn raw_pair() -> (Server, Server, RawConn, RawConn) {
    let p = primary().start();
    let r = start_replica_of(&p, ServerBuilder::new());
    let (pc, rc) = (RawConn::connect(p.port), RawConn::connect(r.port));
    (p, r, pc, rc)
}

/// Waits up to `timeout` for [`Server::persistence_idle`].
pub fn wait_persistence_idle(s: &Server, timeout: Duration) {
    assert!(
        wait_until(timeout, || s.persistence_idle()),
        "background save/rewrite did not finish\n{}",
        s.log_tail()
    );
}

/// A server with `LOCK.DEBUG` enabled.
pub fn debug_server() -> ServerBuilder {
    ServerBuilder::new().module_args(&["debug-commands", "yes"])
}

/// A primary that starts a replica's full sync at once (Redis 7.0 waits 5 s by default
/// before a diskless sync).
pub fn primary() -> ServerBuilder {
    ServerBuilder::new().arg("repl-diskless-sync-delay", "0")
}

/// Lock commands over a `redis` crate connection (`redis::Value` replies).
pub mod conn {
    use super::*;
    use redis::Value;

    /// `LOCK.INFO` as field -> value.
    pub type Info = BTreeMap<String, Value>;

    /// A `redis` crate reply as the kit's [`Resp`] (the types a lock command answers
    /// with; anything else becomes an `Error` naming it).
    pub fn to_resp(v: &Value) -> Resp {
        match v {
            Value::Nil => Resp::Nil,
            Value::Int(i) => Resp::Int(*i),
            Value::BulkString(b) => Resp::Bulk(b.clone()),
            Value::SimpleString(s) => Resp::Simple(s.clone()),
            Value::Okay => Resp::Simple("OK".into()),
            Value::Array(items) => Resp::Array(items.iter().map(to_resp).collect()),
            other => Resp::Error(format!("not a lock reply: {other:?}")),
        }
    }

    /// [`raw::grant`] of a `redis` crate reply.
    pub fn grant(v: &Value) -> Option<(Vec<u8>, i64)> {
        raw::grant(&to_resp(v))
    }

    /// `LOCK.ACQUIRE key args...`: `[token, fence]`, None when not granted.
    pub fn acquire(
        c: &mut impl redis::ConnectionLike,
        key: &str,
        args: &[&str],
    ) -> Option<(Vec<u8>, i64)> {
        let v: Value = redis::cmd("LOCK.ACQUIRE")
            .arg(key)
            .arg(args)
            .query(c)
            .unwrap();
        grant(&v)
    }

    /// Runs the command `args` and returns its integer reply.
    pub fn int(c: &mut impl redis::ConnectionLike, args: &[&str]) -> i64 {
        redis::cmd(args[0]).arg(&args[1..]).query(c).unwrap()
    }

    /// `SET key value NX PX px`: a lock taken the classic way (asserted).
    pub fn set_nx_px(c: &mut impl redis::ConnectionLike, key: &str, value: &str, px: u64) {
        let ok: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(px)
            .query(c)
            .unwrap();
        assert_eq!(ok.as_deref(), Some("OK"), "SET {key} NX PX {px}");
    }

    /// `LOCK.RELEASE key token`: 1 released, 0 not held by `token`.
    pub fn release(c: &mut impl redis::ConnectionLike, key: &str, token: &[u8]) -> i64 {
        redis::cmd("LOCK.RELEASE")
            .arg(key)
            .arg(token)
            .query(c)
            .unwrap()
    }

    /// `LOCK.INFO` as a field map (RESP2 flat array or RESP3 map), None when free.
    pub fn lock_info(c: &mut impl redis::ConnectionLike, key: &str) -> Option<Info> {
        let v: Value = redis::cmd("LOCK.INFO").arg(key).query(c).unwrap();
        let pairs: Vec<(Value, Value)> = match v {
            Value::Nil => return None,
            Value::Map(kv) => kv,
            Value::Array(items) => {
                assert!(items.len() % 2 == 0, "odd LOCK.INFO reply {items:?}");
                let mut it = items.into_iter();
                let mut out = Vec::new();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    out.push((k, v));
                }
                out
            }
            other => panic!("unexpected LOCK.INFO reply {other:?}"),
        };
        Some(
            pairs
                .into_iter()
                .map(|(k, v)| (redis::from_redis_value::<String>(k).unwrap(), v))
                .collect(),
        )
    }

    /// An integer field of `LOCK.INFO`; panics when it is missing or not an integer.
    pub fn int_field(info: &Info, f: &str) -> i64 {
        match info.get(f) {
            Some(Value::Int(i)) => *i,
            other => panic!("LOCK.INFO {f} is {other:?}: {info:?}"),
        }
    }

    /// A string field of `LOCK.INFO`, None when missing or nil.
    pub fn bytes_field(info: &Info, f: &str) -> Option<Vec<u8>> {
        match info.get(f) {
            Some(Value::Nil) | None => None,
            Some(v) => Some(redis::from_redis_value_ref(v).unwrap()),
        }
    }

    /// The fields of LOCK.INFO that tell when a lease ends: the time left and the
    /// server's wall-clock estimate of the end (`expires-at`: wall now + time left, so it
    /// moves by a few ms between two calls, and a replica's or a restarted server's is
    /// later, never earlier). [`assert_deadlines`] compares them.
    const CLOCKED: [&str; 2] = ["ttl", "expires-at"];

    /// The fields that must survive a restart or reach a replica unchanged: everything
    /// but the deadlines (`ttl` and `expires-at`, also inside each holder of
    /// `holder-list`) and the queue (per server).
    pub fn durable(info: &Info) -> Info {
        info.iter()
            .filter(|(k, _)| !CLOCKED.contains(&k.as_str()) && k.as_str() != "waiters")
            .map(|(k, v)| (k.clone(), without_clocked(v)))
            .collect()
    }

    /// A holder list with each holder's `ttl` and `expires-at` pairs left out.
    fn without_clocked(v: &Value) -> Value {
        let clocked = |k: &Value| {
            CLOCKED
                .iter()
                .any(|c| *k == Value::BulkString(c.as_bytes().to_vec()))
        };
        match v {
            Value::Array(holders) => Value::Array(
                holders
                    .iter()
                    .map(|h| match h {
                        Value::Array(kv) => Value::Array(
                            kv.chunks(2)
                                .filter(|p| !clocked(&p[0]))
                                .flatten()
                                .cloned()
                                .collect(),
                        ),
                        other => other.clone(),
                    })
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    /// `expires-at` of the lock and of each holder in `holder-list`, in order.
    pub fn expiries(info: &Info) -> Vec<i64> {
        let mut v = vec![int_field(info, "expires-at")];
        if let Some(Value::Array(holders)) = info.get("holder-list") {
            for h in holders {
                let Value::Array(kv) = h else {
                    panic!("holder {h:?}")
                };
                let at = kv
                    .chunks(2)
                    .find(|p| p[0] == Value::BulkString(b"expires-at".to_vec()))
                    .unwrap_or_else(|| panic!("no expires-at in {h:?}"));
                match at[1] {
                    Value::Int(i) => v.push(i),
                    ref other => panic!("expires-at {other:?}"),
                }
            }
        }
        v
    }

    /// Each deadline of `got` (a copy: a replica's, after a restart, a RESTORE) is no
    /// earlier than the same one in `want` (the original) less 5 ms of rounding, and at
    /// most `later` ms after it. A copy carries each lease's time left, so it ends no
    /// earlier; it may end later by the time the lease took to reach it whole (callers
    /// pass the time since the grant, or since the save).
    #[track_caller]
    pub fn assert_deadlines(want: &Info, got: &Info, later: i64, what: &str) {
        let (w, g) = (expiries(want), expiries(got));
        assert_eq!(w.len(), g.len(), "{what}: holders {w:?} / {g:?}");
        for (w, g) in w.iter().zip(&g) {
            assert!(
                *g >= w - 5 && *g <= w + later,
                "{what}: expires-at {g}, expected {w} (-5 ms, +{later} ms)"
            );
        }
    }

    /// `LOCK.ACQUIRE key args... MINFENCE far`, `far` a [`far_fence`]: the grant and
    /// `far`.
    pub fn acquire_far(
        c: &mut impl redis::ConnectionLike,
        key: &str,
        args: &[&str],
    ) -> ((Vec<u8>, i64), u64) {
        let far = far_fence();
        let far_s = far.to_string();
        let args = [args, &["MINFENCE", &far_s]].concat();
        (acquire(c, key, &args).unwrap(), far)
    }

    /// A quorum client's two rounds on `key`: an acquisition with token `tq` (lease
    /// `px` ms), then the idempotent renew with a MINFENCE floor far above the clock
    /// term ([`far_fence`]), which must keep the token and the fence. The floor.
    pub fn renew_with_floor(c: &mut impl redis::ConnectionLike, key: &str, px: &str) -> u64 {
        let tq = tok("tq");
        let (t, f) = acquire(c, key, &["PX", px, "TOKEN", &tq]).unwrap();
        let floor = far_fence();
        let renew = ["PX", px, "TOKEN", &tq, "MINFENCE", &floor.to_string()];
        let (t2, f2) = acquire(c, key, &renew).unwrap();
        assert_eq!(
            (t, t2, f2),
            (tq.as_bytes().to_vec(), tq.as_bytes().to_vec(), f),
            "a renew keeps its fence"
        );
        floor
    }

    pub fn pexpiretime(c: &mut impl redis::ConnectionLike, key: &str) -> i64 {
        redis::cmd("PEXPIRETIME").arg(key).query(c).unwrap()
    }

    pub fn exists(c: &mut impl redis::ConnectionLike, key: &str) -> bool {
        redis::cmd("EXISTS").arg(key).query::<i64>(c).unwrap() == 1
    }

    pub fn key_type(c: &mut impl redis::ConnectionLike, key: &str) -> String {
        redis::cmd("TYPE").arg(key).query(c).unwrap()
    }

    /// The fence counter a server has (`LOCK.DEBUG FENCE`; `debug-commands yes`): what
    /// persistence or the replication stream brought back, which the start-up jump of
    /// the next grant after a restart or a promotion would hide.
    pub fn counter(c: &mut impl redis::ConnectionLike) -> i64 {
        redis::cmd("LOCK.DEBUG").arg("FENCE").query(c).unwrap()
    }
}

/// Lock commands over a [`RawConn`] (`Resp` replies).
pub mod raw {
    use super::*;

    /// `[token, fence]` of a LOCK.ACQUIRE reply, None for nil; panics on anything else.
    pub fn grant(r: &Resp) -> Option<(Vec<u8>, i64)> {
        match r {
            Resp::Nil => None,
            Resp::Array(items) => match items.as_slice() {
                [Resp::Bulk(t), Resp::Int(f)] => Some((t.clone(), *f)),
                _ => panic!("unexpected LOCK.ACQUIRE reply {r:?}"),
            },
            _ => panic!("unexpected LOCK.ACQUIRE reply {r:?}"),
        }
    }

    /// The `LOCK.ACQUIRE key args...` command line.
    pub fn acquire_cmd<'a>(key: &'a str, args: &[&'a str]) -> Vec<&'a str> {
        let mut argv = vec!["LOCK.ACQUIRE", key];
        argv.extend_from_slice(args);
        argv
    }

    /// The reply to `LOCK.ACQUIRE key args...`.
    pub fn acquire_reply(c: &mut RawConn, key: &str, args: &[&str]) -> Resp {
        c.cmd(&acquire_cmd(key, args))
    }

    /// `LOCK.ACQUIRE key args...`: `[token, fence]`, None when not granted.
    pub fn acquire(c: &mut RawConn, key: &str, args: &[&str]) -> Option<(Vec<u8>, i64)> {
        grant(&acquire_reply(c, key, args))
    }

    /// An integer field of `LOCK.INFO key`, None when the key is free (or lacks it).
    pub fn info_int(c: &mut RawConn, key: &str, field: &str) -> Option<i64> {
        match c.cmd(&["LOCK.INFO", key]) {
            Resp::Nil => None,
            r => r.field(field).and_then(|v| v.as_int()),
        }
    }

    /// Clients queued on `key` (0 when the key is free).
    pub fn queued(c: &mut RawConn, key: &str) -> i64 {
        info_int(c, key, "waiters").unwrap_or(0)
    }

    /// Waits (up to [`SETTLE`]) until `n` clients are queued on `key`.
    pub fn wait_queued(c: &mut RawConn, key: &str, n: i64) {
        assert!(
            wait_until(SETTLE, || queued(c, key) == n),
            "expected {n} waiters on {key}, have {}",
            queued(c, key)
        );
    }

    /// A client that sent `LOCK.ACQUIRE ... BLOCK` and has not read the reply yet.
    pub struct Waiter {
        pub conn: RawConn,
        pub id: i64,
    }

    impl Waiter {
        /// Connects to `port` (and `db`), sends `LOCK.ACQUIRE key args...`, returns
        /// without reading.
        pub fn send(port: u16, db: i64, key: &str, args: &[&str]) -> Waiter {
            let mut conn = RawConn::connect(port);
            if db != 0 {
                assert_eq!(
                    conn.cmd(&["SELECT", &db.to_string()]),
                    Resp::Simple("OK".into())
                );
            }
            let id = conn.cmd(&["CLIENT", "ID"]).int();
            conn.send(&acquire_cmd(key, args));
            Waiter { conn, id }
        }

        /// The reply, waiting at most `within`; Err on a timeout or a closed connection.
        pub fn reply_within(&mut self, within: Duration) -> std::io::Result<Resp> {
            self.conn.set_read_timeout(Some(within));
            let r = self.conn.read();
            self.conn.set_read_timeout(Some(IO_TIMEOUT));
            r
        }

        /// The reply (waiting up to [`SETTLE`]).
        pub fn reply(&mut self) -> Resp {
            self.reply_within(SETTLE)
                .unwrap_or_else(|e| panic!("waiter {} got no reply: {e}", self.id))
        }

        /// The fence of the grant it must get (within [`SETTLE`]).
        pub fn granted(&mut self) -> i64 {
            grant(&self.reply())
                .unwrap_or_else(|| panic!("waiter {} got nil", self.id))
                .1
        }

        /// True when no reply comes within 250 ms.
        pub fn waiting(&mut self) -> bool {
            self.reply_within(Duration::from_millis(250)).is_err()
        }
    }
}

/// `[token, fence]` of a grant; panics on anything else.
#[track_caller]
pub fn grant(r: &Resp) -> (String, i64) {
    let (t, f) = r
        .grant()
        .unwrap_or_else(|| panic!("expected a grant, got {r:?}"));
    (String::from_utf8_lossy(&t).into_owned(), f as i64)
}

#[track_caller]
pub fn acquire(c: &mut RawConn, key: &str, opts: &[&str]) -> (String, i64) {
    let mut args = vec!["LOCK.ACQUIRE", key];
    args.extend_from_slice(opts);
    grant(&c.cmd(&args))
}

/// `LOCK.RELEASE key token` over a [`RawConn`]: 1 released, 0 not held by `token`.
pub fn release(c: &mut RawConn, key: &str, token: &str) -> i64 {
    c.cmd(&["LOCK.RELEASE", key, token]).int()
}

pub fn ok() -> Resp {
    Resp::Simple("OK".into())
}

pub fn bulk(s: &str) -> Resp {
    Resp::Bulk(s.as_bytes().to_vec())
}

/// Plain AOF contents (RESP arrays, no RDB preamble) and the replication command forms
/// of the builds before the op word moved into the fields' argument.
pub mod aof {
    /// The RESP arrays of an AOF file (plain commands, no RDB preamble).
    pub fn commands(mut b: &[u8]) -> Vec<Vec<Vec<u8>>> {
        fn line<'a>(b: &mut &'a [u8]) -> &'a [u8] {
            let i = b.windows(2).position(|w| w == b"\r\n").expect("a CRLF");
            let l = &b[..i];
            *b = &b[i + 2..];
            l
        }
        let num = |l: &[u8], tag: u8| -> usize {
            assert_eq!(l.first(), Some(&tag), "{}", String::from_utf8_lossy(l));
            std::str::from_utf8(&l[1..]).unwrap().parse().unwrap()
        };
        let mut out = Vec::new();
        while !b.is_empty() {
            let n = num(line(&mut b), b'*');
            let mut argv = Vec::new();
            for _ in 0..n {
                let len = num(line(&mut b), b'$');
                argv.push(b[..len].to_vec());
                b = &b[len + 2..];
            }
            out.push(argv);
        }
        out
    }

    /// `cmds` as RESP arrays (an AOF's contents, or a replication stream).
    pub fn bytes(cmds: &[Vec<Vec<u8>>]) -> Vec<u8> {
        let mut out = Vec::new();
        for argv in cmds {
            let args: Vec<&[u8]> = argv.iter().map(Vec::as_slice).collect();
            redis_lock_testkit::encode(&mut out, &args);
        }
        out
    }

    /// Turns this build's `LOCK.REPL key OP;fields ...` into `LOCK.REPL key OP fields
    /// ...` and `LOCK.SREPL OP;a;b ...` into `LOCK.SREPL OP a b ...`, the forms the
    /// builds before it wrote; `"LOCK.REPL OP"` (or `"LOCK.SREPL OP"`) when it did,
    /// None for any other command.
    pub fn split_op_word(argv: &mut Vec<Vec<u8>>) -> Option<String> {
        let (at, whole) = match argv.first()?.as_slice() {
            b"LOCK.REPL" => (2, false),
            b"LOCK.SREPL" => (1, true),
            _ => return None,
        };
        let packed = argv[at].clone();
        let i = packed.iter().position(|&b| b == b';');
        let i = i.unwrap_or_else(|| panic!("{:?}", String::from_utf8_lossy(&packed)));
        let op = String::from_utf8(packed[..i].to_vec()).unwrap();
        let parts: Vec<Vec<u8>> = match whole {
            true => packed.split(|&b| b == b';').map(<[u8]>::to_vec).collect(),
            false => vec![packed[..i].to_vec(), packed[i + 1..].to_vec()],
        };
        let what = format!("{} {op}", String::from_utf8_lossy(&argv[0]));
        argv.splice(at..at + 1, parts);
        Some(what)
    }
}
