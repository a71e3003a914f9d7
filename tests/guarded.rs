//! LOCK.CHECK, LOCK.IFHELD and LOCK.IFFENCE as docs/commands.md describes them: whether
//! a fence holds a lock now, and a command of the server run only while the token (or
//! the fence) holds it, in the same step, answered as it answers, as the caller would run
//! it (ACL, protocol, maxmemory), replicated as the command it ran and never with the
//! token; what a guard cannot run is refused before anything runs.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::{
    acquire, bulk, files_with, lock_stat, ok, primary, release, start_replica_of, tok, wait_until,
    words, RawConn, Resp, Server, ServerBuilder, SETTLE,
};

const HELD_TEXT: &str = "NOTHELD the token does not hold this lock now; the command did not run";
const FENCE_TEXT: &str = "NOTHELD that fence does not hold this lock now; the command did not run";

/// Every string in a reply, nested ones included.
fn texts(r: &Resp) -> Vec<String> {
    match r {
        Resp::Bulk(b) => vec![String::from_utf8_lossy(b).into_owned()],
        Resp::Simple(s) | Resp::Error(s) => vec![s.clone()],
        Resp::Array(v) => v.iter().flat_map(texts).collect(),
        _ => Vec::new(),
    }
}

#[track_caller]
fn check(c: &mut RawConn, key: &str, fence: i64) -> i64 {
    c.cmd(&["LOCK.CHECK", key, &fence.to_string()]).int()
}

/// A server, a connection to it, and `key` held for a minute by `tok(name)`: that
/// token and its fence.
fn held(key: &str, name: &str) -> (Server, RawConn, String, i64) {
    let s = ServerBuilder::new().start();
    let mut c = RawConn::connect(s.port);
    let t = tok(name);
    let (_, f) = acquire(&mut c, key, &["PX", "60000", "TOKEN", &t]);
    (s, c, t, f)
}

/// `LOCK.IFFENCE key fence INCR data:n`.
fn fenced_incr(c: &mut RawConn, key: &str, fence: i64) -> Resp {
    c.cmd(&["LOCK.IFFENCE", key, &fence.to_string(), "INCR", "data:n"])
}

#[track_caller]
fn assert_err(r: &Resp, code_and_start: &str) {
    match r {
        Resp::Error(e) if e.starts_with(code_and_start) => {}
        other => panic!("expected an error starting {code_and_start:?}, got {other:?}"),
    }
}

#[test]
fn check_answers_whether_a_fence_holds_the_lock_now() {
    // An exclusive lock: its holder's fence only, and only while it holds.
    let (_s, mut c, t, f) = held("lock:x", "check-x");
    assert_eq!(check(&mut c, "lock:x", f), 1);
    assert_eq!(check(&mut c, "lock:x", f + 1), 0);
    assert_eq!(check(&mut c, "lock:x", f - 1), 0);
    assert_eq!(release(&mut c, "lock:x", &t), 1);
    assert_eq!(check(&mut c, "lock:x", f), 0, "released");
    // Shared and counted: the fence of any current holder.
    let (r1, f1) = acquire(&mut c, "lock:s", &["SHARED", "PX", "60000"]);
    let (_, f2) = acquire(&mut c, "lock:s", &["SHARED", "PX", "60000"]);
    assert_eq!(
        (check(&mut c, "lock:s", f1), check(&mut c, "lock:s", f2)),
        (1, 1)
    );
    assert_eq!(release(&mut c, "lock:s", &r1), 1);
    assert_eq!(
        (check(&mut c, "lock:s", f1), check(&mut c, "lock:s", f2)),
        (0, 1)
    );
    let (_, p1) = acquire(&mut c, "lock:n", &["LIMIT", "2", "PX", "60000"]);
    let (_, p2) = acquire(&mut c, "lock:n", &["LIMIT", "2", "PX", "60000"]);
    assert_eq!(
        (check(&mut c, "lock:n", p1), check(&mut c, "lock:n", p2)),
        (1, 1)
    );
    // A lease that is over does not hold, although nothing removed the key yet: while
    // writes are paused the module leaves the key alone, and LOCK.CHECK (read-only) runs.
    let (_, fp) = acquire(&mut c, "lock:p", &["PX", "1000"]);
    assert_eq!(c.cmd(&["CLIENT", "PAUSE", "10000", "WRITE"]), ok());
    sleep(Duration::from_millis(1300));
    assert_eq!(
        c.cmd(&["EXISTS", "lock:p"]).int(),
        1,
        "the pause keeps the key"
    );
    assert_eq!(check(&mut c, "lock:p", fp), 0, "a lease that is over");
    assert_eq!(c.cmd(&["CLIENT", "UNPAUSE"]), ok());
    // A classic string lock has no fence; a free key none either.
    assert_eq!(
        c.cmd(&words("SET lock:str value-token-0000001 NX PX 60000")),
        ok()
    );
    assert_eq!(check(&mut c, "lock:str", f), 0);
    assert_eq!(check(&mut c, "lock:free", f), 0);
    // Bad fences and another type.
    for v in ["0", "-1", "abc", "9223372036854775807"] {
        assert_err(
            &c.cmd(&["LOCK.CHECK", "lock:x", v]),
            "ERR FENCE must be an integer from 1 to 9223372036854775806",
        );
    }
    c.cmd(&["RPUSH", "lock:list", "a"]);
    assert_err(&c.cmd(&["LOCK.CHECK", "lock:list", "1"]), "WRONGTYPE");
    assert_err(
        &c.cmd(&["LOCK.CHECK", "lock:x"]),
        "ERR wrong number of arguments",
    );
}

#[test]
fn ifheld_and_iffence_run_the_command_only_while_the_lock_is_held() {
    let s = ServerBuilder::new().start();
    let mut c = RawConn::connect(s.port);
    let t = tok("guard-holder");
    let wrong = tok("guard-other");
    assert_eq!(c.cmd(&["SET", "data:n", "10"]), ok());
    let (_, f) = acquire(&mut c, "lock:g", &["PX", "60000", "TOKEN", &t]);
    let fs = f.to_string();
    // The wrapped command's own reply, whatever its type.
    let held = |c: &mut RawConn, args: &[&str]| {
        let mut a = vec!["LOCK.IFHELD", "lock:g", t.as_str()];
        a.extend_from_slice(args);
        c.cmd(&a)
    };
    assert_eq!(
        held(&mut c, &["INCR", "data:n"]),
        Resp::Int(11),
        "LOCK.IFHELD with the holder's token must run the command"
    );
    assert_eq!(held(&mut c, &["GET", "data:n"]), bulk("11"));
    assert_eq!(held(&mut c, &["GET", "data:none"]), Resp::Nil);
    assert_eq!(held(&mut c, &["MSET", "data:a", "1", "data:b", "2"]), ok());
    assert_eq!(
        held(&mut c, &["MGET", "data:a", "data:b"]),
        Resp::Array(vec![bulk("1"), bulk("2")])
    );
    assert_eq!(
        c.cmd(&["LOCK.IFFENCE", "lock:g", &fs, "INCR", "data:n"]),
        Resp::Int(12)
    );
    // A wrapped command that fails answers its own error (the check passed).
    assert_err(&held(&mut c, &["LPUSH", "data:n", "x"]), "WRONGTYPE");
    // NOTHELD, and nothing runs: another token, another fence.
    let r = c.cmd(&["LOCK.IFHELD", "lock:g", &wrong, "INCR", "data:n"]);
    assert_eq!(r, Resp::Error(HELD_TEXT.into()));
    for other in [f - 1, f + 1] {
        let r = fenced_incr(&mut c, "lock:g", other);
        assert_eq!(r, Resp::Error(FENCE_TEXT.into()));
    }
    assert_eq!(c.cmd(&["GET", "data:n"]), bulk("12"));
    // Released: neither the token nor the fence holds it any more; a free key neither.
    assert_eq!(release(&mut c, "lock:g", &t), 1);
    assert_eq!(
        held(&mut c, &["INCR", "data:n"]),
        Resp::Error(HELD_TEXT.into())
    );
    let r = c.cmd(&["LOCK.IFFENCE", "lock:g", &fs, "INCR", "data:n"]);
    assert_eq!(r, Resp::Error(FENCE_TEXT.into()));
    assert_eq!(c.cmd(&["GET", "data:n"]), bulk("12"));
    // A lease that ended: refused as well.
    let t2 = tok("guard-short");
    let (_, f2) = acquire(&mut c, "lock:short", &["PX", "100", "TOKEN", &t2]);
    sleep(Duration::from_millis(250));
    let r = c.cmd(&["LOCK.IFHELD", "lock:short", &t2, "INCR", "data:n"]);
    assert_eq!(r, Resp::Error(HELD_TEXT.into()));
    let r = fenced_incr(&mut c, "lock:short", f2);
    assert_eq!(r, Resp::Error(FENCE_TEXT.into()));
    assert_eq!(c.cmd(&["GET", "data:n"]), bulk("12"));
    // Every reader of a shared lock holds it.
    let (r1, g1) = acquire(&mut c, "lock:sh", &["SHARED", "PX", "60000"]);
    let (r2, g2) = acquire(&mut c, "lock:sh", &["SHARED", "PX", "60000"]);
    for (reader, fence) in [(&r1, g1), (&r2, g2)] {
        let r = c.cmd(&["LOCK.IFHELD", "lock:sh", reader, "INCR", "data:sh"]);
        assert!(matches!(r, Resp::Int(_)), "a reader's token: {r:?}");
        let r = c.cmd(&[
            "LOCK.IFFENCE",
            "lock:sh",
            &fence.to_string(),
            "INCR",
            "data:sh",
        ]);
        assert!(matches!(r, Resp::Int(_)), "a reader's fence: {r:?}");
    }
    assert_eq!(c.cmd(&["GET", "data:sh"]), bulk("4"));
    // A classic string lock is held by the token that is its value, and has no fence.
    let classic = tok("guard-classic");
    assert_eq!(
        c.cmd(&["SET", "lock:classic", &classic, "NX", "PX", "60000"]),
        ok()
    );
    let r = c.cmd(&["LOCK.IFHELD", "lock:classic", &classic, "INCR", "data:c"]);
    assert_eq!(r, Resp::Int(1));
    let r = c.cmd(&["LOCK.IFHELD", "lock:classic", &wrong, "INCR", "data:c"]);
    assert_eq!(r, Resp::Error(HELD_TEXT.into()));
    let r = c.cmd(&["LOCK.IFFENCE", "lock:classic", "1", "INCR", "data:c"]);
    assert_eq!(r, Resp::Error(FENCE_TEXT.into()));
    // A lock key of another type; a bad fence.
    c.cmd(&["RPUSH", "lock:list", "a"]);
    assert_err(
        &c.cmd(&["LOCK.IFHELD", "lock:list", &t, "INCR", "data:n"]),
        "WRONGTYPE",
    );
    assert_err(
        &c.cmd(&["LOCK.IFFENCE", "lock:g", "0", "INCR", "data:n"]),
        "ERR FENCE must be",
    );
    assert_eq!(c.cmd(&["GET", "data:n"]), bulk("12"));
    assert_eq!(lock_stat(&mut c, "panics"), 0);
}

#[test]
fn what_a_guard_cannot_run_is_refused_before_anything_runs() {
    let (_s, mut c, t, f) = held("lock:r", "refuse-holder");
    let fs = f.to_string();
    let wrong = tok("refuse-other");
    // (wrapped command, what the error says)
    let cases: &[(&[&str], &str)] = &[
        (
            &["NOSUCHCOMMAND", "data:x"],
            "unknown command 'NOSUCHCOMMAND'",
        ),
        (&["GET"], "wrong number of arguments for 'GET' command"),
        (
            &["BLPOP", "data:l", "0"],
            "cannot run 'BLPOP': it may block",
        ),
        (
            &["XREAD", "BLOCK", "0", "STREAMS", "data:s", "$"],
            "cannot run 'XREAD': it may block",
        ),
        (&["MULTI"], "cannot run 'MULTI'"),
        (&["EXEC"], "cannot run 'EXEC'"),
        (&["WATCH", "data:x"], "cannot run 'WATCH'"),
        (&["EVAL", "return 1", "0"], "cannot run 'EVAL'"),
        (&["FCALL", "f", "0"], "cannot run 'FCALL'"),
        (&["PING"], "guards data: 'PING' must name at least one key"),
        (
            &["DEL", "lock:r"],
            "cannot run a command on the lock key itself",
        ),
        (
            &["MSET", "data:x", "1", "lock:r", "2"],
            "cannot run a command on the lock key itself",
        ),
    ];
    for (wrapped, says) in cases {
        // With the holder's token, with another one, and with the fence: the same error,
        // before the check.
        let creds = [
            ("LOCK.IFHELD", t.as_str()),
            ("LOCK.IFHELD", wrong.as_str()),
            ("LOCK.IFFENCE", fs.as_str()),
        ];
        for (cmd, cred) in creds {
            let mut a = vec![cmd, "lock:r", cred];
            a.extend_from_slice(wrapped);
            match c.cmd(&a) {
                Resp::Error(e) if e.starts_with("ERR ") && e.contains(says) => {}
                other => panic!("{a:?}: expected ERR ...{says}..., got {other:?}"),
            }
        }
    }
    // Nothing ran, and the lock is as it was.
    assert_eq!(c.cmd(&["EXISTS", "data:x"]).int(), 0);
    assert_eq!(check(&mut c, "lock:r", f), 1);
    assert_eq!(lock_stat(&mut c, "panics"), 0);
}

#[test]
fn the_wrapped_command_runs_as_the_caller() {
    let (s, mut admin, t, f) = held("lock:a", "caller-holder");
    let fs = f.to_string();
    // A user who may guard reads but not writes, on lock:* and data:* keys.
    let r = admin.cmd(&words(
        "ACL SETUSER reader on >pw ~lock:* ~data:* +lock.ifheld +lock.iffence +get",
    ));
    assert_eq!(r, ok());
    // One who may write, but only lock:* keys.
    let r = admin.cmd(&words(
        "ACL SETUSER lockonly on >pw ~lock:* +lock.ifheld +set",
    ));
    assert_eq!(r, ok());
    let mut reader = RawConn::connect(s.port);
    assert_eq!(reader.cmd(&["AUTH", "reader", "pw"]), ok());
    assert_eq!(
        reader.cmd(&["LOCK.IFHELD", "lock:a", &t, "GET", "data:a"]),
        Resp::Nil
    );
    assert_err(
        &reader.cmd(&["LOCK.IFHELD", "lock:a", &t, "SET", "data:a", "v"]),
        "NOPERM",
    );
    assert_err(
        &reader.cmd(&["LOCK.IFFENCE", "lock:a", &fs, "SET", "data:a", "v"]),
        "NOPERM",
    );
    let mut lockonly = RawConn::connect(s.port);
    assert_eq!(lockonly.cmd(&["AUTH", "lockonly", "pw"]), ok());
    assert_err(
        &lockonly.cmd(&["LOCK.IFHELD", "lock:a", &t, "SET", "data:a", "v"]),
        "NOPERM",
    );
    assert_eq!(admin.cmd(&["EXISTS", "data:a"]).int(), 0, "nothing ran");
    // The reply comes in the caller's protocol.
    admin.cmd(&["HSET", "data:h", "f", "v"]);
    let r2 = admin.cmd(&["LOCK.IFHELD", "lock:a", &t, "HGETALL", "data:h"]);
    assert_eq!(r2, Resp::Array(vec![bulk("f"), bulk("v")]), "RESP2");
    let mut c3 = RawConn::connect_resp3(s.port);
    let r3 = c3.cmd(&["LOCK.IFHELD", "lock:a", &t, "HGETALL", "data:h"]);
    assert_eq!(r3, Resp::Map(vec![(bulk("f"), bulk("v"))]), "RESP3");
    // Over maxmemory a deny-oom command is refused; a read still runs.
    assert_eq!(admin.cmd(&["CONFIG", "SET", "maxmemory", "1"]), ok());
    assert_err(
        &admin.cmd(&["LOCK.IFHELD", "lock:a", &t, "SET", "data:oom", "v"]),
        "OOM",
    );
    assert_eq!(
        admin.cmd(&["LOCK.IFHELD", "lock:a", &t, "GET", "data:oom"]),
        Resp::Nil
    );
    assert_eq!(admin.cmd(&["CONFIG", "SET", "maxmemory", "0"]), ok());
    assert_eq!(admin.cmd(&["EXISTS", "data:oom"]).int(), 0);
}

#[test]
fn guards_run_in_multi_and_scripts_and_wait_out_a_write_pause() {
    let (s, mut c, t, f) = held("lock:m", "multi-holder");
    let wrong = tok("multi-other");
    let replies = c
        .pipeline(&[
            vec!["MULTI"],
            vec!["LOCK.IFHELD", "lock:m", &t, "INCR", "data:m"],
            vec!["LOCK.IFHELD", "lock:m", &wrong, "INCR", "data:m"],
            vec!["LOCK.IFFENCE", "lock:m", &f.to_string(), "INCR", "data:m"],
            vec!["EXEC"],
        ])
        .unwrap();
    assert_eq!(
        replies[4],
        Resp::Array(vec![
            Resp::Int(1),
            Resp::Error(HELD_TEXT.into()),
            Resp::Int(2)
        ]),
        "{replies:?}"
    );
    let script = "return redis.call('LOCK.IFHELD', KEYS[1], ARGV[1], 'INCR', KEYS[2])";
    let r = c.cmd(&["EVAL", script, "2", "lock:m", "data:m", &t]);
    assert_eq!(r, Resp::Int(3));
    let r = c.cmd(&["EVAL", script, "2", "lock:m", "data:m", &wrong]);
    assert!(
        matches!(&r, Resp::Error(e) if e.contains("NOTHELD")),
        "a refused guard inside a script: {r:?}"
    );
    assert_eq!(c.cmd(&["GET", "data:m"]), bulk("3"));
    // LOCK.IFHELD is a write command: CLIENT PAUSE WRITE holds it back even when it
    // wraps a read, while LOCK.CHECK (read-only) is answered.
    assert_eq!(c.cmd(&["CLIENT", "PAUSE", "20000", "WRITE"]), ok());
    let mut g = RawConn::connect(s.port);
    g.send(&["LOCK.IFHELD", "lock:m", &t, "GET", "data:m"]);
    assert_eq!(check(&mut c, "lock:m", f), 1);
    g.set_read_timeout(Some(Duration::from_millis(300)));
    let early = g.read();
    assert!(early.is_err(), "answered during the pause: {early:?}");
    assert_eq!(c.cmd(&["CLIENT", "UNPAUSE"]), ok());
    g.set_read_timeout(Some(SETTLE));
    assert_eq!(g.read().expect("the guard after the pause"), bulk("3"));
}

#[test]
fn a_guarded_write_travels_as_the_command_it_ran_and_never_with_the_token() {
    let p = primary()
        .arg("appendonly", "yes")
        .arg("appendfsync", "always")
        .arg("slowlog-log-slower-than", "0")
        .start();
    let r = start_replica_of(&p, ServerBuilder::new());
    let mut c = RawConn::connect(p.port);
    let t = tok("travel-secret-token");
    let (_, f) = acquire(&mut c, "lock:t", &["PX", "60000", "TOKEN", &t]);
    let fs = f.to_string();
    assert_eq!(c.cmd(&["SLOWLOG", "RESET"]), ok());
    let mut mon = RawConn::connect(p.port);
    assert_eq!(mon.cmd(&["MONITOR"]), ok());
    assert_eq!(
        c.cmd(&["LOCK.IFHELD", "lock:t", &t, "SET", "data:t", "written"]),
        ok()
    );
    assert_eq!(
        c.cmd(&["LOCK.IFFENCE", "lock:t", &fs, "INCR", "data:cnt"]),
        Resp::Int(1)
    );
    assert_eq!(c.cmd(&["WAIT", "1", "5000"]).int(), 1);
    // The replica has what ran; it answers LOCK.CHECK and refuses the guards.
    let mut rc = RawConn::connect(r.port);
    assert_eq!(rc.cmd(&["GET", "data:t"]), bulk("written"));
    assert_eq!(rc.cmd(&["GET", "data:cnt"]), bulk("1"));
    assert_eq!(check(&mut rc, "lock:t", f), 1);
    assert_err(
        &rc.cmd(&["LOCK.IFHELD", "lock:t", &t, "SET", "data:t", "x"]),
        "READONLY",
    );
    assert_err(
        &rc.cmd(&["LOCK.IFFENCE", "lock:t", &fs, "GET", "data:t"]),
        "READONLY",
    );
    // The AOF holds the SET, not the guard and not its token.
    let aof = p.dir.join("appendonlydir");
    assert!(
        wait_until(SETTLE, || !files_with(&aof, b"data:t").is_empty()),
        "the SET never reached the AOF in {}",
        aof.display()
    );
    for needle in [
        t.as_bytes(),
        b"LOCK.IFHELD",
        b"lock.ifheld",
        b"LOCK.IFFENCE",
    ] {
        let found = files_with(&aof, needle);
        assert!(
            found.is_empty(),
            "{:?} is in {found:?}",
            String::from_utf8_lossy(needle)
        );
    }
    // MONITOR saw the guard (up to the PING), never its token.
    assert_eq!(c.cmd(&["PING"]), Resp::Simple("PONG".into()));
    mon.set_read_timeout(Some(SETTLE));
    let mut seen = Vec::new();
    while let Ok(line) = mon.read() {
        let line = texts(&line).join(" ");
        let end = line.contains("\"PING\"");
        seen.push(line);
        if end {
            break;
        }
    }
    assert!(
        seen.iter()
            .any(|l| l.to_ascii_lowercase().contains("lock.ifheld")),
        "MONITOR did not show the guard: {seen:?}"
    );
    assert!(
        seen.iter().all(|l| !l.contains(&t)),
        "MONITOR shows the token: {seen:?}"
    );
    // SLOWLOG shows the guard with its token redacted.
    let text = texts(&c.cmd(&["SLOWLOG", "GET", "100"])).join(" ");
    assert!(
        text.contains("LOCK.IFHELD") || text.contains("lock.ifheld"),
        "{text}"
    );
    assert!(!text.contains(&t), "the token is in SLOWLOG: {text}");
    assert!(text.contains("(redacted)"), "{text}");
}
