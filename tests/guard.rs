//! LOCK.IFHELD, LOCK.IFFENCE and LOCK.CHECK (issue 23) against real servers: the wrapped
//! command runs only while the token (fence) holds the lock and its reply passes through
//! unchanged; every refusal runs nothing; every command path gives the same result; what
//! ran is replicated and written to the AOF as itself, never with the token; ACLs, OOM,
//! replicas, the cluster; and hostile input (nesting, secrets of wrapped commands,
//! binary and huge arguments). Lean: one server per test, many checks per server.

mod regress;

use regress::paths::{self, Path};
use regress::*;
use std::io::Read;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

// ---- helpers ----------------------------------------------------------------------------

/// `LOCK.IFHELD key token cmd...`.
fn ifheld<A: AsRef<[u8]>>(c: &mut RawConn, key: &str, token: &str, cmd: &[A]) -> Resp {
    let mut v: Vec<Vec<u8>> = vec![b("LOCK.IFHELD"), b(key), b(token)];
    v.extend(cmd.iter().map(|a| a.as_ref().to_vec()));
    c.cmd(&v)
}

fn iffence(c: &mut RawConn, key: &str, fence: &str, cmd: &[&str]) -> Resp {
    let mut v = vec!["LOCK.IFFENCE", key, fence];
    v.extend_from_slice(cmd);
    c.cmd(&v)
}

fn notheld(r: &Resp) -> bool {
    is_err_with(r, "NOTHELD ")
}

/// `DEBUG DIGEST`: changes with any change of the dataset.
fn digest(c: &mut RawConn) -> Resp {
    c.cmd(&["DEBUG", "DIGEST"])
}

/// `calls` of `INFO commandstats` for a command (0 when it never ran).
fn calls(c: &mut RawConn, cmd: &str) -> u64 {
    let text = c.cmd(&["INFO", "commandstats"]).text();
    let field = format!("cmdstat_{}", cmd.to_ascii_lowercase());
    info_field(&text, &field)
        .and_then(|v| {
            v.split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// An error reply as it reads through any path: the text up to a script's ` script: ...`
/// suffix (EVAL, FCALL add it).
fn normalized(r: &Resp) -> Resp {
    match r {
        Resp::Error(e) => {
            let cut = e.find(" script: ").unwrap_or(e.len());
            Resp::Error(e[..cut].trim_end().to_string())
        }
        other => other.clone(),
    }
}

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

fn resp_of(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    redis_lock_testkit::encode(&mut out, args);
    out
}

/// A fake replica: `SYNC`, then every byte the primary sends (the RDB, then the stream).
struct Tap {
    bytes: Arc<Mutex<Vec<u8>>>,
}

impl Tap {
    fn attach(s: &Server) -> Tap {
        let mut sock = TcpStream::connect(s.socket_addr()).expect("connect tap");
        std::io::Write::write_all(&mut sock, b"SYNC\r\n").expect("SYNC");
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&bytes);
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            let until = Instant::now() + Duration::from_secs(120);
            while Instant::now() < until {
                match sock.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => sink.lock().unwrap().extend_from_slice(&buf[..n]),
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => return,
                }
                if Arc::strong_count(&sink) == 1 {
                    return;
                }
            }
        });
        Tap { bytes }
    }

    /// Waits until the stream (after the RDB) carries writes: a marker written after the
    /// snapshot was taken arrives as a command.
    fn wait_streaming(&self, c: &mut RawConn) {
        for i in 0..100 {
            let key = format!("tap:ready:{i}");
            c.cmd(&["SET", &key, "1"]);
            let cmd = resp_of(&[b"SET", key.as_bytes(), b"1"]);
            if wait_until(Duration::from_millis(200), || has(&self.snapshot(), &cmd)) {
                return;
            }
        }
        panic!("the tap never received the replication stream");
    }

    fn snapshot(&self) -> Vec<u8> {
        self.bytes.lock().unwrap().clone()
    }

    /// Waits until `needle` arrived; the bytes so far.
    fn wait_for(&self, needle: &[u8]) -> Vec<u8> {
        let ok = wait_until(SETTLE, || has(&self.snapshot(), needle));
        let got = self.snapshot();
        assert!(
            ok,
            "the replication stream never carried {:?}: {:?}",
            String::from_utf8_lossy(needle),
            String::from_utf8_lossy(&got[got.len().saturating_sub(400)..])
        );
        got
    }
}

// ---- IFHELD: replies, refusals, holders ----------------------------------------------------

#[test]
fn ifheld_answers_what_the_command_answers_while_held() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    let mut c3 = RawConn::connect_resp3(s.port);
    let t = tok("reply");
    take(&mut c, "lock:r", &t, &[]);
    for cmd in [
        vec!["RPUSH", "data:l", "a", "b", "c"],
        vec!["HSET", "data:h", "f1", "v1", "f2", "v2"],
        vec!["SADD", "data:s", "x", "y"],
        vec!["ZADD", "data:z", "1.5", "m"],
        vec!["SET", "data:str", "hello"],
    ] {
        assert!(!c.cmd(&cmd).is_error());
    }
    // Each read (and a few writes on twin keys) answers through the guard exactly what it
    // answers directly, in RESP2 and in RESP3 (the caller's protocol).
    let reads: &[&[&str]] = &[
        &["GET", "data:str"],
        &["GET", "data:missing"],
        &["STRLEN", "data:str"],
        &["LRANGE", "data:l", "0", "-1"],
        &["HGETALL", "data:h"],
        &["SMEMBERS", "data:s"],
        &["ZSCORE", "data:z", "m"],
        &["ZRANGE", "data:z", "0", "-1", "WITHSCORES"],
        &["HGET", "data:h", "nope"],
        &["LPUSH", "data:str", "x"],
        &["EXISTS", "data:l", "data:h", "data:missing"],
        &["TYPE", "data:h"],
    ];
    for (name, conn) in [("resp2", &mut c), ("resp3", &mut c3)] {
        for cmd in reads {
            let direct = conn.cmd(cmd);
            let guarded = ifheld(conn, "lock:r", &t, cmd);
            k.eq(&guarded, &direct, &format!("{name} {cmd:?}"));
        }
    }
    let m = ifheld(&mut c3, "lock:r", &t, &["HGETALL", "data:h"]);
    k.check(
        matches!(m, Resp::Map(_)),
        format!("RESP3 HGETALL is a map: {m:?}"),
    );
    k.check(
        matches!(
            ifheld(&mut c, "lock:r", &t, &["HGETALL", "data:h"]),
            Resp::Array(_)
        ),
        "RESP2 HGETALL is an array",
    );
    // Writes: the reply of the write and its effect.
    k.eq(
        ifheld(&mut c, "lock:r", &t, &["SET", "data:w", "1"]),
        ok(),
        "SET",
    );
    k.eq(
        ifheld(&mut c, "lock:r", &t, &["INCRBY", "data:w", "41"]),
        Resp::Int(42),
        "INCRBY",
    );
    k.eq(c.cmd(&["GET", "data:w"]), bulk("42"), "the write landed");
    let wt = ifheld(&mut c, "lock:r", &t, &["LPUSH", "data:w", "x"]);
    k.err(&wt, "WRONGTYPE ", "WRONGTYPE passes through");
    k.eq(
        ifheld(&mut c, "lock:r", &t, &["SET", "data:w", "2", "XX", "GET"]),
        bulk("42"),
        "SET ... GET",
    );
    k.eq(
        ifheld(&mut c, "lock:r", &t, &["SET", "data:w", "3", "NX"]),
        Resp::Nil,
        "SET NX on an existing key: nil",
    );
    // Counted in INFO commandstats as the wrapped command ran.
    k.check(
        calls(&mut c, "lock.ifheld") >= 20,
        "commandstats counts LOCK.IFHELD",
    );
    k.finish_alive(&s, "replies");
}

#[test]
fn ifheld_refuses_a_token_that_does_not_hold_the_lock_now() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    assert!(!c.cmd(&["SET", "data:x", "orig"]).is_error());
    let write = ["SET", "data:x", "changed"];
    let untouched = |c: &mut RawConn, k: &mut Checks, what: &str| {
        k.eq(c.cmd(&["GET", "data:x"]), bulk("orig"), what);
    };
    let (a, other) = (tok("holder"), tok("someone-else"));

    // Never held.
    let r = ifheld(&mut c, "lock:n", &a, &write);
    k.check(notheld(&r), format!("free key: {r:?}"));
    untouched(&mut c, &mut k, "free key");

    // Wrong token.
    take(&mut c, "lock:n", &a, &[]);
    let r = ifheld(&mut c, "lock:n", &other, &write);
    k.check(notheld(&r), format!("wrong token: {r:?}"));
    untouched(&mut c, &mut k, "wrong token");
    // A token prefix, the token with a byte more, an empty token.
    for bad in [&a[..a.len() - 1], &format!("{a}x"), ""] {
        let r = ifheld(&mut c, "lock:n", bad, &write);
        k.check(notheld(&r), format!("token {bad:?}: {r:?}"));
    }
    untouched(&mut c, &mut k, "near tokens");

    // Released.
    k.eq(
        c.cmd(&["LOCK.RELEASE", "lock:n", &a]),
        Resp::Int(1),
        "release",
    );
    let r = ifheld(&mut c, "lock:n", &a, &write);
    k.check(notheld(&r), format!("released: {r:?}"));
    untouched(&mut c, &mut k, "released");

    // Lease over.
    let rr = c.cmd(&["LOCK.ACQUIRE", "lock:n", "PX", "100", "TOKEN", &a]);
    granted(&rr);
    sleep(Duration::from_millis(250));
    let r = ifheld(&mut c, "lock:n", &a, &write);
    k.check(notheld(&r), format!("lease over: {r:?}"));
    untouched(&mut c, &mut k, "lease over");

    // FORCERELEASE (all, and by fence).
    take(&mut c, "lock:n", &a, &[]);
    k.eq(
        c.cmd(&["LOCK.FORCERELEASE", "lock:n"]),
        Resp::Int(1),
        "forcerelease",
    );
    let r = ifheld(&mut c, "lock:n", &a, &write);
    k.check(notheld(&r), format!("force-released: {r:?}"));
    let f = take(&mut c, "lock:n", &a, &[]);
    let fs = f.to_string();
    c.cmd(&["LOCK.FORCERELEASE", "lock:n", "FENCE", &fs]);
    let r = ifheld(&mut c, "lock:n", &a, &write);
    k.check(notheld(&r), format!("force-released by fence: {r:?}"));

    // The lock key deleted, or overwritten by another holder.
    take(&mut c, "lock:n", &a, &[]);
    c.cmd(&["DEL", "lock:n"]);
    let r = ifheld(&mut c, "lock:n", &a, &write);
    k.check(notheld(&r), format!("deleted: {r:?}"));
    take(&mut c, "lock:n", &other, &[]);
    let r = ifheld(&mut c, "lock:n", &a, &write);
    k.check(notheld(&r), format!("the next holder's lock: {r:?}"));
    untouched(&mut c, &mut k, "after every refusal");

    // A lock-delay running after a lost holder: nobody holds it.
    c.cmd(&["DEL", "lock:n"]);
    granted(&c.cmd(&[
        "LOCK.ACQUIRE",
        "lock:n",
        "PX",
        "100",
        "TOKEN",
        &a,
        "LOCKDELAY",
        "5000",
    ]));
    sleep(Duration::from_millis(250));
    let r = ifheld(&mut c, "lock:n", &a, &write);
    k.check(notheld(&r), format!("lock-delay: {r:?}"));
    untouched(&mut c, &mut k, "lock-delay");

    // Shared and counted locks: any holder's token.
    let readers = [tok("reader-1"), tok("reader-2"), tok("reader-3")];
    for r in &readers {
        take(&mut c, "lock:sh", r, &["SHARED"]);
    }
    let permits = [tok("permit-1"), tok("permit-2")];
    for p in &permits {
        take(&mut c, "lock:ct", p, &["LIMIT", "3"]);
    }
    for (i, t) in readers.iter().enumerate() {
        let v = format!("shared-{i}");
        let r = ifheld(&mut c, "lock:sh", t, &["SET", "data:sh", &v]);
        k.eq(r, ok(), &format!("shared holder {i}"));
        k.eq(c.cmd(&["GET", "data:sh"]), bulk(&v), "shared write");
    }
    for (i, t) in permits.iter().enumerate() {
        let r = ifheld(&mut c, "lock:ct", t, &["INCR", "data:ct"]);
        k.eq(r, Resp::Int(i as i64 + 1), &format!("counted holder {i}"));
    }
    c.cmd(&["LOCK.RELEASE", "lock:sh", &readers[1]]);
    let r = ifheld(&mut c, "lock:sh", &readers[1], &["SET", "data:sh", "late"]);
    k.check(notheld(&r), format!("a released reader: {r:?}"));
    k.eq(
        c.cmd(&["GET", "data:sh"]),
        bulk("shared-2"),
        "late reader refused",
    );
    let r = ifheld(&mut c, "lock:ct", &a, &["INCR", "data:ct"]);
    k.check(notheld(&r), format!("not a permit holder: {r:?}"));

    // A classic SET NX string lock: its value is the token.
    let classic = tok("classic-string");
    c.cmd(&["SET", "lock:str", &classic, "NX", "PX", "60000"]);
    let r = ifheld(&mut c, "lock:str", &classic, &["SET", "data:str", "ok"]);
    k.eq(r, ok(), "string lock, its value");
    let r = ifheld(&mut c, "lock:str", &a, &["SET", "data:str", "bad"]);
    k.check(notheld(&r), format!("string lock, another value: {r:?}"));
    k.eq(c.cmd(&["GET", "data:str"]), bulk("ok"), "string lock data");
    // A key of another type is no lock.
    c.cmd(&["RPUSH", "lock:list", "x"]);
    let r = ifheld(&mut c, "lock:list", &a, &["SET", "data:x", "changed"]);
    k.err(&r, "WRONGTYPE ", "list as lock key");
    untouched(&mut c, &mut k, "list as lock key");
    k.finish_alive(&s, "refusals");
}

#[test]
fn ifheld_refuses_what_it_cannot_guard_and_runs_nothing() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    let t = tok("refusals");
    take(&mut c, "lock:g", &t, &[]);
    c.cmd(&["RPUSH", "data:l", "job"]);
    c.cmd(&["XADD", "data:s", "1-1", "f", "v"]);
    c.cmd(&["SET", "data:x", "1"]);
    let sha = c
        .cmd(&["SCRIPT", "LOAD", "return redis.call('DEL', 'data:l')"])
        .text();
    paths::load_function_library(&mut c);
    // (the expected error, with '{}' for the command's name; the commands refused so)
    let classes: [(&str, Vec<Vec<&str>>); 6] = [
        (
            "ERR LOCK.IFHELD cannot run '{}': it may block",
            vec![
                vec!["BLPOP", "data:l", "0"],
                vec!["BLMOVE", "data:l", "data:m", "LEFT", "RIGHT", "0"],
                vec!["XREAD", "STREAMS", "data:s", "0"],
                vec!["XREAD", "BLOCK", "0", "STREAMS", "data:s", "$"],
                vec!["LOCK.ACQUIRE", "lock:other"],
                vec!["LOCK.WATCH", "lock:other"],
            ],
        ),
        (
            "ERR LOCK.IFHELD cannot run '{}': transactions, scripts",
            vec![
                vec!["MULTI"],
                vec!["EXEC"],
                vec!["WATCH", "data:x"],
                vec!["EVAL", "return redis.call('DEL', 'data:l')", "1", "data:l"],
                vec!["EVALSHA", &sha, "1", "data:l"],
                vec!["FCALL", "lockpaths_call", "1", "data:l", "DEL", "data:l"],
            ],
        ),
        (
            "ERR LOCK.IFHELD guards data: '{}' must name at least one key",
            vec![
                vec!["PING"],
                vec!["DBSIZE"],
                vec!["FLUSHALL"],
                vec!["FLUSHDB", "ASYNC"],
            ],
        ),
        (
            "ERR LOCK.IFHELD cannot run a command on the lock key itself",
            vec![
                vec!["DEL", "lock:g"],
                vec!["MSET", "data:x", "2", "lock:g", "2"],
                vec!["RENAME", "data:x", "lock:g"],
                vec!["COPY", "data:x", "lock:g", "REPLACE"],
                vec!["LOCK.FORCERELEASE", "lock:g"],
            ],
        ),
        (
            "ERR unknown command '{}'",
            vec![vec!["NOSUCHCOMMAND", "data:x"]],
        ),
        (
            "ERR wrong number of arguments for '{}' command",
            vec![vec!["GET"], vec!["SET", "data:x"]],
        ),
    ];
    let cases = classes.iter().flat_map(|(want, cmds)| {
        cmds.iter()
            .map(move |cmd| (cmd, want.replace("{}", cmd[0])))
    });
    for (cmd, want) in cases {
        let name = cmd[0];
        let (before, ran) = (digest(&mut c), calls(&mut c, name));
        let r = ifheld(&mut c, "lock:g", &t, cmd);
        k.err(&r, &want, format!("{cmd:?}"));
        k.eq(digest(&mut c), before, &format!("{cmd:?} changed nothing"));
        k.eq(calls(&mut c, name), ran, &format!("{cmd:?} did not run"));
        // IFFENCE refuses the same, in its own name.
        let f = info_int(&mut c, "lock:g", "fence").to_string();
        let r = iffence(&mut c, "lock:g", &f, cmd);
        let want_f = want.replace("LOCK.IFHELD", "LOCK.IFFENCE");
        k.err(&r, &want_f, format!("IFFENCE {cmd:?}"));
    }
    // The refusals come before the check: a token that does not hold gets them too
    // (nothing about the lock is learned from a refused command).
    let r = ifheld(&mut c, "lock:g", &tok("nobody"), &["BLPOP", "data:l", "0"]);
    k.err(
        &r,
        "ERR LOCK.IFHELD cannot run 'BLPOP'",
        "BLPOP, a token that holds nothing",
    );
    // Lower-case and mixed-case names are the same commands.
    let r = ifheld(&mut c, "lock:g", &t, &["bLpOp", "data:l", "0"]);
    k.err(&r, "ERR LOCK.IFHELD cannot run 'bLpOp'", "bLpOp");
    k.eq(
        ifheld(&mut c, "lock:g", &t, &["get", "data:x"]),
        bulk("1"),
        "lower case",
    );
    // LOCK.IFHELD's own arity.
    for argv in [
        vec!["LOCK.IFHELD"],
        vec!["LOCK.IFHELD", "lock:g"],
        vec!["LOCK.IFHELD", "lock:g", &t],
        vec!["LOCK.IFFENCE", "lock:g", "1"],
    ] {
        let r = c.cmd(&argv);
        let name = argv[0].to_ascii_lowercase();
        k.check(
            is_err_with(
                &r,
                &format!("ERR wrong number of arguments for '{name}' command"),
            ),
            format!("{argv:?}: {r:?}"),
        );
    }
    for (len, what) in [
        ("LLEN data:l", "the list kept its job"),
        ("XLEN data:s", "the stream kept its entry"),
    ] {
        k.eq(c.cmd(&words(len)), Resp::Int(1), what);
    }
    k.finish_alive(&s, "refusals");
}

// ---- every path ---------------------------------------------------------------------------

#[test]
fn every_command_path_gives_the_same_result() {
    let s = paths::with_helper_module(ServerBuilder::new()).start();
    let mut c = conn(&s);
    paths::load_function_library(&mut c);
    let mut k = Checks::new();
    let mut direct: Vec<(String, Resp)> = Vec::new();
    for path in Path::ALL {
        let n = path.name();
        let (lk, dk) = (format!("lock:{n}"), format!("data:{n}"));
        let t = tok(&format!("path-{n}"));
        let f = take(&mut c, &lk, &t, &[]).to_string();
        let wrong = tok("not-the-holder");
        let (dn, dnone, df) = (format!("{dk}:n"), format!("{dk}:none"), format!("{dk}:f"));
        let steps: Vec<(&str, Vec<String>)> = [
            ("held SET", vec!["LOCK.IFHELD", &lk, &t, "SET", &dk, "v1"]),
            ("held INCR", vec!["LOCK.IFHELD", &lk, &t, "INCR", &dn]),
            ("held GET", vec!["LOCK.IFHELD", &lk, &t, "GET", &dk]),
            ("held GET nil", vec!["LOCK.IFHELD", &lk, &t, "GET", &dnone]),
            (
                "wrong token",
                vec!["LOCK.IFHELD", &lk, &wrong, "SET", &dk, "v2"],
            ),
            ("fence", vec!["LOCK.IFFENCE", &lk, &f, "SET", &df, "vf"]),
            (
                "old fence",
                vec!["LOCK.IFFENCE", &lk, "1", "SET", &df, "old"],
            ),
            ("blocking", vec!["LOCK.IFHELD", &lk, &t, "BLPOP", &dk, "0"]),
            ("keyless", vec!["LOCK.IFHELD", &lk, &t, "PING"]),
            ("lock key", vec!["LOCK.IFHELD", &lk, &t, "DEL", &lk]),
            ("wrongtype", vec!["LOCK.IFHELD", &lk, &t, "LPUSH", &dk, "x"]),
            ("check", vec!["LOCK.CHECK", &lk, &f]),
            ("release", vec!["LOCK.RELEASE", &lk, &t]),
            (
                "after release",
                vec!["LOCK.IFHELD", &lk, &t, "SET", &dk, "v3"],
            ),
            ("check after", vec!["LOCK.CHECK", &lk, &f]),
        ]
        .map(|(what, argv)| (what, argv.iter().map(|a| a.to_string()).collect()))
        .into();
        for (i, (what, argv)) in steps.iter().enumerate() {
            let r = normalized(&paths::send(&mut c, path, argv));
            if path == Path::Direct {
                direct.push((what.to_string(), r));
            } else {
                k.eq(&r, &direct[i].1, &format!("{n}: {what}"));
            }
        }
        k.eq(c.cmd(&["GET", &dk]), bulk("v1"), &format!("{n}: data"));
        k.eq(
            c.cmd(&["GET", &format!("{dk}:f")]),
            bulk("vf"),
            &format!("{n}: fenced data"),
        );
    }
    k.check(
        direct.iter().any(|(w, r)| w == "held SET" && *r == ok()),
        format!("direct answers: {direct:?}"),
    );
    // MULTI: the wrapped write happens at EXEC; a release queued before it makes it
    // NOTHELD, in the same transaction.
    let t = tok("multi-exec");
    take(&mut c, "lock:m", &t, &[]);
    let r = c
        .pipeline(&[
            vec!["MULTI"],
            vec!["LOCK.IFHELD", "lock:m", &t, "SET", "data:m", "queued"],
        ])
        .unwrap();
    k.eq(r[1].clone(), Resp::Simple("QUEUED".into()), "queued");
    let mut other = conn(&s);
    k.eq(
        other.cmd(&["EXISTS", "data:m"]),
        Resp::Int(0),
        "nothing before EXEC",
    );
    let r = c.cmd(&["EXEC"]);
    k.eq(r, Resp::Array(vec![ok()]), "EXEC");
    k.eq(c.cmd(&["GET", "data:m"]), bulk("queued"), "written at EXEC");
    let r = c
        .pipeline(&[
            vec!["MULTI"],
            vec!["LOCK.RELEASE", "lock:m", &t],
            vec![
                "LOCK.IFHELD",
                "lock:m",
                &t,
                "SET",
                "data:m",
                "after-release",
            ],
            vec!["EXEC"],
        ])
        .unwrap();
    let items = r[3].items();
    k.eq(items[0].clone(), Resp::Int(1), "released in MULTI");
    k.check(
        notheld(&items[1]),
        format!("NOTHELD after the release in MULTI: {items:?}"),
    );
    k.eq(c.cmd(&["GET", "data:m"]), bulk("queued"), "unchanged");
    // A lock taken inside the same MULTI holds for the guard after it.
    let r = c
        .pipeline(&[
            vec!["MULTI"],
            vec!["LOCK.ACQUIRE", "lock:m", "TOKEN", &t],
            vec!["LOCK.IFHELD", "lock:m", &t, "SET", "data:m", "same-tx"],
            vec!["EXEC"],
        ])
        .unwrap();
    k.eq(r[3].items()[1].clone(), ok(), "acquired in MULTI");
    k.finish_alive(&s, "paths");
}

// ---- propagation ------------------------------------------------------------------------

#[test]
fn only_the_wrapped_write_travels_and_the_token_never_does() {
    let mut p = primary()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .arg("repl-ping-replica-period", "3600")
        .arg("slowlog-log-slower-than", "0")
        .arg("slowlog-max-len", "1000")
        .start();
    let r = replica_of(&p, ServerBuilder::new());
    let mut c = conn(&p);
    let mut k = Checks::new();
    let t = tok("propagated-secret");
    let f = take(&mut c, "lock:p", &t, &[]);
    let tap = Tap::attach(&p);
    tap.wait_streaming(&mut c);
    let mut mon = conn(&p);
    k.eq(mon.cmd(&["MONITOR"]), ok(), "MONITOR");
    caught_up(&p, &r);

    let value = "guarded-value-0042";
    k.eq(
        ifheld(&mut c, "lock:p", &t, &["SET", "data:p", value]),
        ok(),
        "guarded SET",
    );
    let set = resp_of(&[b"SET", b"data:p", value.as_bytes()]);
    let stream = tap.wait_for(&set);
    k.eq(count(&stream, &set), 1, "the stream carries the SET once");
    let offset_after_set = p.info_field("replication", "master_repl_offset");

    // Refused guards propagate nothing.
    let wrong = tok("not-the-token");
    let r1 = ifheld(&mut c, "lock:p", &wrong, &["SET", "data:p", "refused-1"]);
    let r2 = ifheld(&mut c, "lock:p", &t, &["BLPOP", "data:p", "0"]);
    let r3 = iffence(&mut c, "lock:p", "1", &["SET", "data:p", "refused-3"]);
    k.check(
        notheld(&r1) && r2.is_error() && notheld(&r3),
        format!("{r1:?} {r2:?} {r3:?}"),
    );
    sleep(Duration::from_millis(100));
    k.eq(
        p.info_field("replication", "master_repl_offset"),
        offset_after_set.clone(),
        "refused guards move no replication offset",
    );
    let fence_arg = f.to_string();
    k.eq(
        iffence(&mut c, "lock:p", &fence_arg, &["INCR", "data:n"]),
        Resp::Int(1),
        "fenced INCR",
    );
    let marker = resp_of(&[b"SET", b"data:marker", b"end"]);
    c.cmd(&["SET", "data:marker", "end"]);
    let stream = tap.wait_for(&marker);
    let at_set = stream
        .windows(set.len())
        .position(|w| w == set.as_slice())
        .unwrap();
    let between = &stream[at_set + set.len()..stream.len() - marker.len()];
    let incr = resp_of(&[b"INCR", b"data:n"]);
    k.eq(
        String::from_utf8_lossy(between).into_owned(),
        String::from_utf8_lossy(&incr).into_owned(),
        "between the SET and the marker the stream carries exactly the fenced INCR",
    );
    // What neither the replication stream nor the AOF may carry.
    let never: [&[u8]; 5] = [
        t.as_bytes(),
        b"LOCK.IFHELD",
        b"lock.ifheld",
        b"LOCK.IFFENCE",
        b"refused-",
    ];
    for needle in never {
        k.check(
            !has(&stream, needle),
            format!(
                "the replication stream never carries {:?}",
                String::from_utf8_lossy(needle)
            ),
        );
    }

    // The replica applied exactly the wrapped writes.
    caught_up(&p, &r);
    let mut rc = conn(&r);
    // The guarded SET's value and the fenced INCR's counter, on `c`.
    let data = |c: &mut RawConn, k: &mut Checks, on: &str| {
        k.eq(c.cmd(&["GET", "data:p"]), bulk(value), &format!("{on}data"));
        k.eq(
            c.cmd(&["GET", "data:n"]),
            bulk("1"),
            &format!("{on}counter"),
        );
    };
    data(&mut rc, &mut k, "replica ");
    k.eq(
        calls(&mut rc, "lock.ifheld"),
        0,
        "the replica never ran LOCK.IFHELD",
    );
    k.eq(
        calls(&mut rc, "lock.iffence"),
        0,
        "the replica never ran LOCK.IFFENCE",
    );
    k.check(calls(&mut rc, "set") >= 1, "the replica ran SET");

    // MONITOR and SLOWLOG show the token redacted.
    c.cmd(&["ECHO", "monitor-end"]);
    let lines = monitor_lines(&mut mon, "monitor-end", Duration::from_secs(5));
    let guard_lines: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("\"LOCK.IFHELD\""))
        .collect();
    k.check(
        !guard_lines.is_empty(),
        format!("MONITOR shows LOCK.IFHELD: {lines:?}"),
    );
    k.check(
        guard_lines
            .iter()
            .all(|l| l.contains("\"LOCK.IFHELD\" \"lock:p\" \"(redacted)\"")),
        format!("MONITOR redacts the token: {guard_lines:?}"),
    );
    k.check(
        lines.iter().all(|l| !l.contains(&t) && !l.contains(&wrong)),
        "MONITOR never shows a token",
    );
    let slow = c.cmd(&["SLOWLOG", "GET", "1000"]);
    let mut bytes = Vec::new();
    all_bytes(&slow, &mut bytes);
    k.check(
        !has(&bytes, t.as_bytes()) && !has(&bytes, wrong.as_bytes()),
        "SLOWLOG never shows a token",
    );
    let entries: Vec<Vec<Resp>> = slow
        .items()
        .iter()
        .map(|e| e.items()[3].items())
        .filter(|args| args.first() == Some(&bulk("LOCK.IFHELD")))
        .collect();
    k.check(
        entries.len() >= 3,
        format!("SLOWLOG has the guards: {entries:?}"),
    );
    k.check(
        entries.iter().all(|a| a[2] == bulk("(redacted)")),
        format!("SLOWLOG redacts the token: {entries:?}"),
    );

    // The AOF holds the wrapped commands, neither the guard nor the token; replaying it
    // restores the data, and the lock (so the token still holds after a restart).
    let aof_dir = p.dir.join("appendonlydir");
    let mut aof = Vec::new();
    for e in std::fs::read_dir(&aof_dir)
        .expect("appendonlydir")
        .flatten()
    {
        aof.extend(std::fs::read(e.path()).unwrap_or_default());
    }
    k.check(has(&aof, &set), "the AOF holds the wrapped SET");
    k.check(has(&aof, &incr), "the AOF holds the fenced INCR");
    for needle in never {
        k.check(
            !has(&aof, needle),
            format!("the AOF never holds {:?}", String::from_utf8_lossy(needle)),
        );
    }
    drop((c, mon, rc, tap));
    p.kill9();
    p.try_restart().expect("restart from the AOF");
    let mut c = conn(&p);
    data(&mut c, &mut k, "AOF replay: ");
    k.eq(
        ifheld(&mut c, "lock:p", &t, &["SET", "data:p", "after-restart"]),
        ok(),
        "AOF replay: the token still holds the lock",
    );
    k.eq(
        c.cmd(&["LOCK.CHECK", "lock:p", &fence_arg]),
        Resp::Int(1),
        "AOF replay: fence",
    );
    k.finish_alive(&p, "propagation");
}

#[test]
fn a_lock_carried_by_dump_and_restore_guards_on_the_other_server() {
    let a = ServerBuilder::new().start();
    let bsrv = ServerBuilder::new().start();
    let (mut ca, mut cb) = (conn(&a), conn(&bsrv));
    let mut k = Checks::new();
    let t = tok("carried");
    let f = take(&mut ca, "lock:c", &t, &["SHARED"]).to_string();
    let payload = ca.cmd(&["DUMP", "lock:c"]).bytes();
    k.check(
        !has(&payload, t.as_bytes()),
        "the DUMP payload carries no token",
    );
    let mut restore: Vec<Vec<u8>> = vec![b("RESTORE"), b("lock:c"), b("0"), payload];
    k.eq(cb.cmd(&restore), ok(), "RESTORE");
    k.eq(
        ifheld(&mut cb, "lock:c", &t, &["SET", "data:c", "1"]),
        ok(),
        "the token holds the restored lock",
    );
    k.eq(
        iffence(&mut cb, "lock:c", &f, &["GET", "data:c"]),
        bulk("1"),
        "and its fence",
    );
    let r = ifheld(&mut cb, "lock:c", &tok("other"), &["SET", "data:c", "2"]);
    k.check(notheld(&r), format!("another token: {r:?}"));
    // RESTORE REPLACE of a lock another token holds: the old token stops holding.
    let t2 = tok("carried-2");
    take(&mut ca, "lock:c2", &t2, &[]);
    restore[1] = b("lock:c");
    restore[3] = ca.cmd(&["DUMP", "lock:c2"]).bytes();
    restore.push(b("REPLACE"));
    k.eq(cb.cmd(&restore), ok(), "RESTORE REPLACE");
    let r = ifheld(&mut cb, "lock:c", &t, &["SET", "data:c", "3"]);
    k.check(notheld(&r), format!("replaced: {r:?}"));
    k.eq(
        ifheld(&mut cb, "lock:c", &t2, &["GET", "data:c"]),
        bulk("1"),
        "the restored holder",
    );
    k.finish_alive(&bsrv, "restore");
}

// ---- ACL, OOM, replicas ------------------------------------------------------------------

#[test]
fn acl_applies_to_the_wrapped_command_and_its_keys() {
    let s = ServerBuilder::new().start();
    let mut admin = conn(&s);
    let mut k = Checks::new();
    let t = tok("acl");
    take(&mut admin, "lock:a", &t, &[]);
    admin.cmd(&["SET", "data:x", "orig"]);
    let users: &[(&str, &str)] = &[
        ("noset", "+lock.ifheld +lock.iffence +get ~lock:* ~data:*"),
        (
            "full",
            "+lock.ifheld +lock.iffence +set +get +eval ~lock:* ~data:*",
        ),
        ("nodata", "+lock.ifheld +set +get +eval ~lock:*"),
        ("nolock", "+lock.ifheld +set +get ~data:*"),
        ("readonly", "+lock.ifheld +set +get +eval ~lock:* %R~data:*"),
        ("writeonly", "+lock.ifheld +set +get ~lock:* %W~data:*"),
    ];
    for (u, rules) in users {
        let mut cmd = vec!["ACL", "SETUSER", u, "on", ">pw", "resetkeys"];
        cmd.extend(rules.split(' '));
        k.eq(admin.cmd(&cmd), ok(), &format!("ACL SETUSER {u}"));
    }
    let as_user = |u: &str| {
        let mut c = conn(&s);
        assert_eq!(c.cmd(&["AUTH", u, "pw"]), ok());
        c
    };
    // NOPERM; inside a script Redis 7.0 words a key refusal of a call as its own ERR.
    let nope = |r: &Resp| {
        let e = match r {
            Resp::Error(e) => e.to_ascii_lowercase(),
            _ => String::new(),
        };
        is_err_with(r, "NOPERM")
            || (is_err_with(r, "ERR ")
                && (e.contains("no permissions") || e.contains("can't access")))
    };

    // Every step of every user, in order: how the command goes (through IFHELD with the
    // holder's token, IFHELD with a token that holds nothing, IFFENCE with the holder's
    // fence, or IFHELD inside EVAL with no declared keys, so the script's calls are
    // checked) and the reply it must get, or `None` for a refusal. After a refusal nothing
    // has changed; after an allowed write `data:x` is set back.
    #[derive(Debug, Clone, Copy)]
    enum Via {
        Held,
        WrongToken,
        Fence,
        Eval,
    }
    use Via::*;
    let f = info_int(&mut admin, "lock:a", "fence").to_string();
    // (user, how, command, the reply or None for a refusal)
    let steps: Vec<(&str, Via, &str, Option<Resp>)> = vec![
        ("noset", Held, "SET data:x w", None),
        ("noset", Fence, "SET data:x w", None),
        ("noset", Held, "GET data:x", Some(bulk("orig"))),
        ("full", Held, "SET data:x w", Some(ok())),
        ("full", Held, "SET other:x w", None),
        ("full", Held, "MSET data:y 1 other:y 1", None),
        ("full", Eval, "SET other:x w", None),
        ("full", Eval, "SET data:x e", Some(ok())),
        ("nodata", Held, "SET data:x w", None),
        ("nodata", Eval, "SET data:x w", None),
        // Without the lock key's pattern: refused before anything, whatever the token.
        ("nolock", Held, "SET data:x w", None),
        ("nolock", WrongToken, "SET data:x w", None),
        // %R~ / %W~ (read or write only).
        ("readonly", Held, "GET data:x", Some(bulk("orig"))),
        ("readonly", Held, "SET data:x w", None),
        ("readonly", Eval, "SET data:x w", None),
        ("readonly", Eval, "GET data:x", Some(bulk("orig"))),
        ("writeonly", Held, "SET data:w w", Some(ok())),
        ("writeonly", Held, "GET data:x", None),
    ];
    let wrong = tok("wrong");
    let mut users = std::collections::HashMap::new();
    for (user, via, cmd, want) in steps {
        let c = users.entry(user).or_insert_with(|| as_user(user));
        let cmd = words(cmd);
        let r = match via {
            Held => ifheld(c, "lock:a", &t, &cmd),
            WrongToken => ifheld(c, "lock:a", &wrong, &cmd),
            Fence => iffence(c, "lock:a", &f, &cmd),
            Eval => {
                let mut v = vec!["EVAL", paths::EVAL_SCRIPT, "0", "LOCK.IFHELD", "lock:a", &t];
                v.extend_from_slice(&cmd);
                c.cmd(&v)
            }
        };
        let what = format!("{user}, {via:?} {cmd:?}");
        match want {
            Some(want) => {
                k.eq(r, want, &what);
                admin.cmd(&["SET", "data:x", "orig"]);
            }
            None => {
                k.check(nope(&r), format!("{what} refused: {r:?}"));
                k.eq(
                    admin.cmd(&["GET", "data:x"]),
                    bulk("orig"),
                    &format!("{what}: data:x unchanged"),
                );
                k.eq(
                    admin.cmd(&["EXISTS", "other:x", "data:y", "other:y"]),
                    Resp::Int(0),
                    &format!("{what}: nothing written"),
                );
            }
        }
    }
    k.finish_alive(&s, "acl");
}

#[test]
fn over_maxmemory_a_guarded_write_is_refused_and_a_read_runs() {
    let (s, mut c, mut k) = start(ServerBuilder::new().arg("maxmemory-policy", "noeviction"));
    let t = tok("oom");
    take(&mut c, "lock:o", &t, &[]);
    c.cmd(&["SET", "data:o", "before"]);
    let before = digest(&mut c);
    c.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let r = ifheld(&mut c, "lock:o", &t, &["SET", "data:o", "after"]);
    k.err(&r, "OOM ", "guarded SET over maxmemory");
    let r = ifheld(&mut c, "lock:o", &t, &["SET", "data:new", "x"]);
    k.err(&r, "OOM ", "guarded SET of a new key");
    let f = info_int(&mut c, "lock:o", "fence").to_string();
    let r = iffence(&mut c, "lock:o", &f, &["RPUSH", "data:l", "x"]);
    k.err(&r, "OOM ", "fenced RPUSH");
    let r = c.cmd(&[
        "EVAL",
        paths::EVAL_SCRIPT,
        "0",
        "LOCK.IFHELD",
        "lock:o",
        &t,
        "SET",
        "data:o",
        "e",
    ]);
    k.err(&r, "OOM ", "guarded SET in EVAL");
    k.eq(
        ifheld(&mut c, "lock:o", &t, &["GET", "data:o"]),
        bulk("before"),
        "guarded GET",
    );
    // DEL is not deny-oom: it frees memory.
    k.eq(
        ifheld(&mut c, "lock:o", &t, &["DEL", "data:gone"]),
        Resp::Int(0),
        "guarded DEL",
    );
    c.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    k.eq(digest(&mut c), before, "nothing was written");
    k.finish_alive(&s, "oom");
}

#[test]
fn replicas_refuse_guards_and_answer_checks() {
    let p = primary().start();
    let ro = replica_of(&p, ServerBuilder::new());
    let rw = replica_of(&p, ServerBuilder::new().arg("replica-read-only", "no"));
    let mut c = conn(&p);
    let mut k = Checks::new();
    let t = tok("replicas");
    let f = take(&mut c, "lock:rep", &t, &[]).to_string();
    c.cmd(&["SET", "data:rep", "primary"]);
    caught_up(&p, &ro);
    caught_up(&p, &rw);
    for (name, srv) in [("read-only", &ro), ("writable", &rw)] {
        let mut rc = conn(srv);
        let r = ifheld(&mut rc, "lock:rep", &t, &["SET", "data:rep", "replica"]);
        k.err(&r, "READONLY ", format!("{name} IFHELD"));
        let r = iffence(&mut rc, "lock:rep", &f, &["SET", "data:rep", "replica"]);
        k.err(&r, "READONLY ", format!("{name} IFFENCE"));
        let r = ifheld(&mut rc, "lock:rep", &t, &["GET", "data:rep"]);
        k.err(&r, "READONLY ", format!("{name} IFHELD GET"));
        k.eq(
            rc.cmd(&["GET", "data:rep"]),
            bulk("primary"),
            &format!("{name} data"),
        );
        k.eq(
            rc.cmd(&["LOCK.CHECK", "lock:rep", &f]),
            Resp::Int(1),
            &format!("{name} CHECK"),
        );
        k.eq(
            rc.cmd(&["LOCK.CHECK", "lock:rep", "1"]),
            Resp::Int(0),
            &format!("{name} CHECK old"),
        );
    }
    c.cmd(&["LOCK.RELEASE", "lock:rep", &t]);
    caught_up(&p, &ro);
    k.eq(
        conn(&ro).cmd(&["LOCK.CHECK", "lock:rep", &f]),
        Resp::Int(0),
        "CHECK after release",
    );
    k.finish();
}

// ---- IFFENCE and CHECK --------------------------------------------------------------------

#[test]
fn iffence_runs_for_a_current_fence_only() {
    let (_s, mut c, mut k) = start(ServerBuilder::new());
    let t = tok("fenced");
    let old = take(&mut c, "lock:f", &t, &[]);
    c.cmd(&["LOCK.RELEASE", "lock:f", &t]);
    let cur = take(&mut c, "lock:f", &t, &[]);
    let other = take(&mut c, "lock:f2", &tok("other-key"), &[]);
    k.check(cur > old, "fences increase");
    let (cur_s, old_s, other_s) = (cur.to_string(), old.to_string(), other.to_string());
    k.eq(
        iffence(&mut c, "lock:f", &cur_s, &["SET", "data:f", "ok"]),
        ok(),
        "current",
    );
    for (what, fence) in [
        ("old fence", old_s.as_str()),
        ("another key's fence", other_s.as_str()),
        ("a fence one above", &(cur + 1).to_string()),
    ] {
        let r = iffence(&mut c, "lock:f", fence, &["SET", "data:f", "bad"]);
        k.check(notheld(&r), format!("{what}: {r:?}"));
    }
    for bad in [
        "0",
        "-1",
        "abc",
        "1.5",
        "",
        "9223372036854775807",
        "18446744073709551616",
        " 1",
    ] {
        let r = iffence(&mut c, "lock:f", bad, &["SET", "data:f", "bad"]);
        k.err(&r, "ERR FENCE must be", format!("fence {bad:?}"));
    }
    k.eq(
        c.cmd(&["GET", "data:f"]),
        bulk("ok"),
        "only the current fence wrote",
    );
    // Shared: any holder's fence; a string lock has none.
    let fences: Vec<i64> = (0..3)
        .map(|i| take(&mut c, "lock:fs", &tok(&format!("fs-{i}")), &["SHARED"]))
        .collect();
    for (i, f) in fences.iter().enumerate() {
        let r = iffence(&mut c, "lock:fs", &f.to_string(), &["INCR", "data:fs"]);
        k.eq(r, Resp::Int(i as i64 + 1), &format!("shared fence {i}"));
    }
    c.cmd(&["SET", "lock:fstr", &tok("string-lock"), "PX", "60000"]);
    let r = iffence(&mut c, "lock:fstr", &cur_s, &["SET", "data:f", "bad"]);
    k.check(notheld(&r), format!("string lock: {r:?}"));
    let r = iffence(&mut c, "lock:nolock", &cur_s, &["SET", "data:f", "bad"]);
    k.check(notheld(&r), format!("free key: {r:?}"));
    k.eq(c.cmd(&["GET", "data:f"]), bulk("ok"), "unchanged");
    k.finish();
}

#[test]
fn check_follows_the_holders() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    let check = |c: &mut RawConn, key: &str, f: i64| c.cmd(&["LOCK.CHECK", key, &f.to_string()]);
    let t = tok("check");
    let f1 = take(&mut c, "lock:k", &t, &[]);
    k.eq(check(&mut c, "lock:k", f1), Resp::Int(1), "held");
    k.eq(
        check(&mut c, "lock:k", f1 + 1),
        Resp::Int(0),
        "another fence",
    );
    k.eq(check(&mut c, "lock:other", f1), Resp::Int(0), "another key");
    c.cmd(&["LOCK.RELEASE", "lock:k", &t]);
    k.eq(check(&mut c, "lock:k", f1), Resp::Int(0), "released");
    // Expiry.
    // 1 s: the check that follows the grant comes within the lease on a loaded machine
    // (100 ms need not).
    let (_, f2) = granted(&c.cmd(&["LOCK.ACQUIRE", "lock:k", "PX", "1000"]));
    k.eq(
        check(&mut c, "lock:k", f2),
        Resp::Int(1),
        "short lease held",
    );
    sleep(Duration::from_millis(1_150));
    k.eq(check(&mut c, "lock:k", f2), Resp::Int(0), "lease over");
    // Hand-off: the old fence stops, the new one starts.
    let f3 = take(&mut c, "lock:k", &t, &[]);
    let mut w = Pending::send(s.port, &["LOCK.ACQUIRE", "lock:k", "BLOCK", "5000"]);
    wait_waiters(&mut c, "lock:k", 1);
    c.cmd(&["LOCK.RELEASE", "lock:k", &t]);
    let (_, f4) = granted(&w.reply_within(SETTLE).unwrap());
    k.eq(check(&mut c, "lock:k", f3), Resp::Int(0), "handed off: old");
    k.eq(check(&mut c, "lock:k", f4), Resp::Int(1), "handed off: new");
    // Shared holders, one by one.
    let readers: Vec<(String, i64)> = (0..3)
        .map(|i| {
            let t = tok(&format!("check-reader-{i}"));
            let f = take(&mut c, "lock:sh", &t, &["SHARED"]);
            (t, f)
        })
        .collect();
    for (_, f) in &readers {
        k.eq(check(&mut c, "lock:sh", *f), Resp::Int(1), "reader holds");
    }
    c.cmd(&["LOCK.RELEASE", "lock:sh", &readers[1].0]);
    k.eq(
        check(&mut c, "lock:sh", readers[1].1),
        Resp::Int(0),
        "released reader",
    );
    k.eq(
        check(&mut c, "lock:sh", readers[2].1),
        Resp::Int(1),
        "other reader",
    );
    // Other types.
    c.cmd(&["RPUSH", "lock:list", "x"]);
    let r = check(&mut c, "lock:list", f4);
    k.err(&r, "WRONGTYPE ", "list");
    c.cmd(&["SET", "lock:str", &tok("classic"), "PX", "60000"]);
    k.eq(
        check(&mut c, "lock:str", f4),
        Resp::Int(0),
        "string lock has no fence",
    );
    // Arity and integers.
    for argv in [
        vec!["LOCK.CHECK", "lock:k"],
        vec!["LOCK.CHECK", "lock:k", "1", "2"],
    ] {
        let r = c.cmd(&argv);
        k.err(
            &r,
            "ERR wrong number of arguments for 'lock.check' command",
            format!("{argv:?}"),
        );
    }
    for bad in ["abc", "0", "-5", "1e3", ""] {
        let r = c.cmd(&["LOCK.CHECK", "lock:k", bad]);
        k.err(&r, "ERR ", format!("CHECK {bad:?}"));
    }
    k.finish_alive(&s, "check");
}

// ---- cluster --------------------------------------------------------------------------------

#[test]
fn cluster_guards_keep_to_the_lock_slot() {
    let (cluster, mut k) = start_cluster();
    let lock = "lock:{order:9001}";
    let owner = cluster.node_for_key(lock);
    let mut c = conn(owner);
    let t = tok("cluster");
    take(&mut c, lock, &t, &[]);
    k.eq(
        ifheld(&mut c, lock, &t, &["SET", "stock:{order:9001}", "9"]),
        ok(),
        "same slot",
    );
    k.eq(
        ifheld(
            &mut c,
            lock,
            &t,
            &["MSET", "stock:{order:9001}", "8", "sold:{order:9001}", "1"],
        ),
        ok(),
        "same slot, two keys",
    );
    let r = ifheld(&mut c, lock, &t, &["SET", "stock:{order:9002}", "9"]);
    k.err(&r, "CROSSSLOT ", "another slot");
    let r = ifheld(
        &mut c,
        lock,
        &t,
        &["MSET", "stock:{order:9001}", "7", "stock:{x}", "1"],
    );
    k.err(&r, "CROSSSLOT ", "second key in another slot");
    k.eq(
        c.cmd(&["GET", "stock:{order:9001}"]),
        bulk("8"),
        "nothing else written",
    );
    let keys = c.cmd(&[
        "COMMAND",
        "GETKEYS",
        "LOCK.IFHELD",
        lock,
        &t,
        "MSET",
        "stock:{order:9001}",
        "9",
        "sold:{order:9001}",
        "1",
    ]);
    k.eq(
        keys,
        Resp::Array(vec![
            bulk(lock),
            bulk("stock:{order:9001}"),
            bulk("sold:{order:9001}"),
        ]),
        "COMMAND GETKEYS",
    );
    let keys = c.cmd(&[
        "COMMAND",
        "GETKEYS",
        "LOCK.IFFENCE",
        lock,
        "1",
        "GET",
        "stock:{order:9001}",
    ]);
    k.eq(
        keys,
        Resp::Array(vec![bulk(lock), bulk("stock:{order:9001}")]),
        "COMMAND GETKEYS of IFFENCE",
    );
    let other = cluster.nodes.iter().find(|n| n.port != owner.port).unwrap();
    let r = ifheld(
        &mut conn(other),
        lock,
        &t,
        &["SET", "stock:{order:9001}", "1"],
    );
    k.err(&r, "MOVED ", "another node");
    // Through a cluster client: routed by the guard's keys.
    let client = cluster.cluster_client();
    let mut cc = client.get_connection().unwrap();
    let v: String = redis::cmd("LOCK.IFHELD")
        .arg(lock)
        .arg(&t)
        .arg("INCRBY")
        .arg("sold:{order:9001}")
        .arg(2)
        .query::<i64>(&mut cc)
        .map(|n| n.to_string())
        .unwrap_or_else(|e| format!("error {e}"));
    k.eq(v, "3".to_string(), "cluster client");
    k.finish();
}

// ---- breaking it ----------------------------------------------------------------------------

#[test]
fn nested_guards_need_every_lock_and_stay_bounded() {
    let s = ServerBuilder::new()
        .arg("slowlog-log-slower-than", "0")
        .arg("slowlog-max-len", "1000")
        .start();
    let mut c = conn(&s);
    let mut k = Checks::new();
    let (ta, tb) = (tok("outer-secret"), tok("inner-secret"));
    take(&mut c, "lock:a", &ta, &[]);
    take(&mut c, "lock:b", &tb, &[]);
    let nested = |ta: &str, tb: &str, v: &str| -> Vec<String> {
        [
            "LOCK.IFHELD",
            "lock:a",
            ta,
            "LOCK.IFHELD",
            "lock:b",
            tb,
            "SET",
            "data:n",
            v,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    // Both held: it runs. Either not held: NOTHELD, nothing runs.
    k.eq(c.cmd(&nested(&ta, &tb, "both")), ok(), "both held");
    let r = c.cmd(&nested(&ta, &tok("wrong-inner"), "inner-wrong"));
    k.check(notheld(&r), format!("inner not held: {r:?}"));
    let r = c.cmd(&nested(&tok("wrong-outer"), &tb, "outer-wrong"));
    k.check(notheld(&r), format!("outer not held: {r:?}"));
    k.eq(
        c.cmd(&["GET", "data:n"]),
        bulk("both"),
        "only the first ran",
    );
    let mut getkeys: Vec<String> = vec!["COMMAND".into(), "GETKEYS".into()];
    // (not the real tokens: COMMAND GETKEYS shows its arguments in SLOWLOG)
    getkeys.extend(nested("getkeys-token-a-0000", "getkeys-token-b-0000", "x"));
    k.eq(
        c.cmd(&getkeys),
        Resp::Array(vec![bulk("lock:a"), bulk("lock:b"), bulk("data:n")]),
        "GETKEYS of a nested guard",
    );
    // The inner guard may not name the outer lock key.
    let r = c.cmd(&[
        "LOCK.IFHELD",
        "lock:a",
        &ta,
        "LOCK.IFHELD",
        "lock:a",
        &ta,
        "SET",
        "data:n",
        "x",
    ]);
    k.check(
        is_err_with(
            &r,
            "ERR LOCK.IFHELD cannot run a command on the lock key itself",
        ),
        format!("inner on the outer lock: {r:?}"),
    );
    // Neither token ever shows in SLOWLOG.
    let slow = c.cmd(&["SLOWLOG", "GET", "1000"]);
    let mut bytes = Vec::new();
    all_bytes(&slow, &mut bytes);
    k.check(
        !has(&bytes, ta.as_bytes()) && !has(&bytes, tb.as_bytes()),
        format!(
            "SLOWLOG shows no token of a nested guard: {}",
            String::from_utf8_lossy(&bytes)
        ),
    );
    // A chain thousands deep is refused with an error; the server survives.
    for depth in [9usize, 5000, 100_000] {
        let mut argv: Vec<Vec<u8>> = Vec::new();
        for i in 0..depth {
            argv.extend([b("LOCK.IFHELD"), b(&format!("lock:d{i}")), b(&tok("deep"))]);
        }
        argv.extend([b("SET"), b("data:deep"), b("1")]);
        let mut dc = conn(&s);
        let r = dc.call(&argv);
        k.check(
            matches!(&r, Ok(Resp::Error(e)) if e.starts_with("ERR ")),
            format!(
                "{depth} nested guards: an error, got {:?}",
                r.as_ref()
                    .map(|r| format!("{r:?}").chars().take(200).collect::<String>())
            ),
        );
        getkeys = vec!["COMMAND".into(), "GETKEYS".into()];
        let mut gk: Vec<Vec<u8>> = getkeys.iter().map(|s| b(s)).collect();
        gk.extend(argv);
        let r = dc.call(&gk);
        k.check(
            r.is_ok(),
            format!("{depth} nested guards, COMMAND GETKEYS answers: {r:?}"),
        );
        alive(&s, &mut k, &format!("{depth} nested guards"));
        if s.try_raw(Duration::from_secs(1)).is_err() {
            break;
        }
    }
    k.finish();
}

#[test]
fn wrapped_lock_commands_of_other_keys_and_their_secrets() {
    let s = ServerBuilder::new()
        .arg("slowlog-log-slower-than", "0")
        .arg("slowlog-max-len", "1000")
        .start();
    let target = ServerBuilder::new().start();
    let mut c = conn(&s);
    let mut mon = conn(&s);
    mon.cmd(&["MONITOR"]);
    let mut k = Checks::new();
    let t = tok("guard-holder");
    take(&mut c, "lock:g", &t, &[]);
    let secret = tok("other-lock-secret");

    // RELEASE of another lock (its waiter is served), EXTEND of another lock.
    take(&mut c, "lock:o1", &secret, &[]);
    let mut w = Pending::send(s.port, &["LOCK.ACQUIRE", "lock:o1", "BLOCK", "5000"]);
    wait_waiters(&mut c, "lock:o1", 1);
    k.eq(
        ifheld(
            &mut c,
            "lock:g",
            &t,
            &["LOCK.EXTEND", "lock:o1", &secret, "PX", "90000"],
        ),
        Resp::Int(1),
        "EXTEND",
    );
    k.eq(
        ifheld(&mut c, "lock:g", &t, &["LOCK.RELEASE", "lock:o1", &secret]),
        Resp::Int(1),
        "RELEASE",
    );
    let got = w.reply_within(SETTLE).unwrap();
    k.check(
        got.grant().is_some(),
        format!("the other lock's waiter got it: {got:?}"),
    );
    // A nested guard on another lock and a fenced guard.
    take(&mut c, "lock:o2", &secret, &[]);
    k.eq(
        ifheld(
            &mut c,
            "lock:g",
            &t,
            &["LOCK.IFHELD", "lock:o2", &secret, "SET", "data:o2", "1"],
        ),
        ok(),
        "nested",
    );
    // A refused inner LOCK.ACQUIRE with a TOKEN, and a refused AUTH: nothing runs, no
    // secret shows.
    let r = ifheld(
        &mut c,
        "lock:g",
        &t,
        &["LOCK.ACQUIRE", "lock:o3", "TOKEN", &secret],
    );
    k.check(r.is_error(), format!("ACQUIRE: {r:?}"));
    let r = ifheld(&mut c, "lock:g", &t, &["AUTH", "someone", &secret]);
    k.check(r.is_error(), format!("AUTH: {r:?}"));
    // DEL of another lock key with a waiter: the waiter is served.
    take(&mut c, "lock:o4", &secret, &[]);
    let mut w = Pending::send(s.port, &["LOCK.ACQUIRE", "lock:o4", "BLOCK", "5000"]);
    wait_waiters(&mut c, "lock:o4", 1);
    k.eq(
        ifheld(&mut c, "lock:g", &t, &["DEL", "lock:o4"]),
        Resp::Int(1),
        "DEL of another lock",
    );
    k.check(
        w.reply_within(SETTLE).unwrap().grant().is_some(),
        "DEL served the waiter",
    );
    // MIGRATE of another lock with a waiter: LOCKMOVED, the lock lives on the target.
    take(&mut c, "lock:o5", &secret, &[]);
    let mut w = Pending::send(s.port, &["LOCK.ACQUIRE", "lock:o5", "BLOCK", "5000"]);
    wait_waiters(&mut c, "lock:o5", 1);
    let port = target.port.to_string();
    let r = ifheld(
        &mut c,
        "lock:g",
        &t,
        &["MIGRATE", "127.0.0.1", &port, "lock:o5", "0", "5000"],
    );
    k.eq(r, ok(), "MIGRATE of another lock");
    let r = w.reply_within(SETTLE).unwrap();
    k.err(&r, "LOCKMOVED ", "the waiter of the migrated lock");
    k.eq(
        conn(&target).cmd(&["LOCK.RELEASE", "lock:o5", &secret]),
        Resp::Int(1),
        "the lock moved",
    );
    // RESTORE of a lock value under another name (a copy of another holder's lock).
    take(&mut c, "lock:o6", &secret, &[]);
    let payload = c.cmd(&["DUMP", "lock:o6"]).bytes();
    let mut restore: Vec<Vec<u8>> = vec![
        b("LOCK.IFHELD"),
        b("lock:g"),
        b(&t),
        b("RESTORE"),
        b("lock:o7"),
        b("0"),
        payload,
    ];
    k.eq(c.cmd(&restore), ok(), "RESTORE of a lock");
    restore[4] = b("lock:g");
    let r = c.cmd(&restore);
    k.check(
        is_err_with(
            &r,
            "ERR LOCK.IFHELD cannot run a command on the lock key itself",
        ),
        format!("RESTORE onto the lock key: {r:?}"),
    );
    let gf = info_int(&mut c, "lock:g", "fence").to_string();
    k.eq(
        c.cmd(&["LOCK.CHECK", "lock:g", &gf]),
        Resp::Int(1),
        "the guard's lock is intact",
    );

    // No secret in SLOWLOG or MONITOR.
    let slow = c.cmd(&["SLOWLOG", "GET", "1000"]);
    let mut bytes = Vec::new();
    all_bytes(&slow, &mut bytes);
    k.check(
        !has(&bytes, secret.as_bytes()),
        format!(
            "SLOWLOG shows no wrapped secret: {}",
            String::from_utf8_lossy(&bytes)
        ),
    );
    k.check(!has(&bytes, t.as_bytes()), "SLOWLOG shows no guard token");
    c.cmd(&["ECHO", "monitor-end"]);
    let seen = monitor_lines(&mut mon, "monitor-end", Duration::from_secs(5)).join("\n");
    k.check(
        !seen.contains(&secret),
        format!("MONITOR shows no wrapped secret:\n{seen}"),
    );
    k.check(!seen.contains(&t), "MONITOR shows no guard token");
    alive(&s, &mut k, "wrapped lock commands");
    k.finish_alive(&target, "migrate target");
}

#[test]
fn hostile_arguments_are_answered_and_the_server_survives() {
    let (s, mut c, mut k) = start(ServerBuilder::new());
    // Binary key, token and data, NUL and high bytes included.
    let key: Vec<u8> = b"lock:\x00\xff\r\n bin".to_vec();
    let token: Vec<u8> = (0u8..=255).cycle().take(64).collect();
    let r = c.cmd(&[&b"LOCK.ACQUIRE"[..], &key, b"TOKEN", &token]);
    k.check(r.grant().is_some(), format!("binary acquire: {r:?}"));
    let data: Vec<u8> = b"data:\x00\x01\xfe".to_vec();
    let val: Vec<u8> = vec![0, 13, 10, 255, 0];
    let r = c.cmd(&[&b"LOCK.IFHELD"[..], &key, &token, b"SET", &data, &val]);
    k.eq(r, ok(), "binary guarded SET");
    k.eq(
        c.cmd(&[&b"GET"[..], &data]),
        Resp::Bulk(val.clone()),
        "binary value",
    );
    let mut near = token.clone();
    near[63] ^= 1;
    let r = c.cmd(&[&b"LOCK.IFHELD"[..], &key, &near, b"SET", &data, b"x"]);
    k.check(notheld(&r), format!("a token one bit off: {r:?}"));
    // NUL in the wrapped command's name, an empty name, a name of 1 MB.
    let big = vec![b'A'; 1 << 20];
    for name in [&b"SE\x00T"[..], b"SET\x00", b"", &big] {
        let r = c.cmd(&[&b"LOCK.IFHELD"[..], &key, &token, name, &data, b"x"]);
        k.check(
            is_err_with(&r, "ERR unknown command"),
            format!(
                "wrapped name {:?}: {:?}",
                String::from_utf8_lossy(&name[..name.len().min(8)]),
                format!("{r:?}").chars().take(120).collect::<String>()
            ),
        );
    }
    k.eq(
        c.cmd(&[&b"GET"[..], &data]),
        Resp::Bulk(val.clone()),
        "unchanged by refused names",
    );
    // 1 MB token (NOTHELD), 1 MB value and key through the guard.
    let r = c.cmd(&[&b"LOCK.IFHELD"[..], &key, &big, b"SET", &data, b"x"]);
    k.check(notheld(&r), "a 1 MB token does not hold");
    let mb: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    let r = c.cmd(&[&b"LOCK.IFHELD"[..], &key, &token, b"SET", &data, &mb]);
    k.eq(r, ok(), "1 MB value");
    k.eq(
        c.cmd(&[&b"LOCK.IFHELD"[..], &key, &token, b"GET", &data]),
        Resp::Bulk(mb.clone()),
        "1 MB back",
    );
    let mut bigkey = b"data:".to_vec();
    bigkey.extend(&mb[..1 << 19]);
    let r = c.cmd(&[&b"LOCK.IFHELD"[..], &key, &token, b"SET", &bigkey, b"1"]);
    k.eq(r, ok(), "512 KB key");
    // Huge argument counts: 200,000 keys through the guard, and a lock key among them.
    let mut del: Vec<Vec<u8>> = vec![b("LOCK.IFHELD"), key.clone(), token.clone(), b("DEL")];
    del.extend((0..200_000).map(|i| format!("data:many:{i}").into_bytes()));
    let r = c.cmd(&del);
    k.eq(r, Resp::Int(0), "DEL of 200,000 absent keys");
    del.push(key.clone());
    let r = c.cmd(&del);
    k.check(
        is_err_with(
            &r,
            "ERR LOCK.IFHELD cannot run a command on the lock key itself",
        ),
        format!("the lock key as key 200,001: {r:?}"),
    );
    let mut gk: Vec<Vec<u8>> = vec![b("COMMAND"), b("GETKEYS")];
    gk.extend(del[..del.len() - 1].iter().cloned());
    let r = c.cmd(&gk);
    k.eq(
        r.as_items().map(|v| v.len()),
        Some(200_001),
        "GETKEYS of 200,000 keys",
    );
    // The guard's keys request with too few arguments.
    let r = c.cmd(&["COMMAND", "GETKEYS", "LOCK.IFHELD", "lock:x", "t"]);
    k.check(
        r.is_error(),
        format!("GETKEYS with no wrapped command: {r:?}"),
    );
    let r = c.cmd(&[
        "COMMAND",
        "GETKEYS",
        "LOCK.IFHELD",
        "lock:x",
        "t",
        "NOSUCH",
        "a",
    ]);
    k.check(
        !matches!(r, Resp::Nil),
        format!("GETKEYS of an unknown wrapped command: {r:?}"),
    );
    // A lock key that is the wrapped command's name (no confusion of positions).
    let r = c.cmd(&[&b"LOCK.IFHELD"[..], b"GET", &token, b"GET", b"GET"]);
    k.check(
        is_err_with(
            &r,
            "ERR LOCK.IFHELD cannot run a command on the lock key itself",
        ),
        format!("{r:?}"),
    );
    k.finish_alive(&s, "hostile input");
}
