//! Every bad input in SPEC's error list gets an error reply that starts with an error
//! code, leaves the data alone, and the server keeps answering. Ends with a bounded,
//! seeded fuzz of random and malformed LOCK.* commands.

mod common;

use common::{
    far_fence, lock_stat, starts_with_error_code, tok, unix_ms, wait_until, words, RawConn, Resp,
    ServerBuilder,
};
use std::time::{Duration, Instant};

/// Asserts an error reply whose code is `code` (and that the text has a code at all).
#[track_caller]
fn assert_code(r: &Resp, code: &str, what: &str) -> String {
    let Resp::Error(text) = r else {
        panic!("{what}: expected a {code} error, got {r:?}")
    };
    assert!(
        starts_with_error_code(text),
        "{what}: error without a code: {text:?}"
    );
    assert_eq!(
        text.split(' ').next(),
        Some(code),
        "{what}: wrong error code in {text:?}"
    );
    text.clone()
}

#[track_caller]
fn assert_pong(c: &mut RawConn) {
    assert_eq!(c.cmd(&["PING"]), Resp::Simple("PONG".into()));
}

/// Runs `args` and asserts an error with `code` whose text contains `needle`
/// (case-insensitively), then PING.
#[track_caller]
fn expect_err(c: &mut RawConn, args: &[&[u8]], code: &str, needle: &str) {
    let what = args
        .iter()
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let what = if what.len() > 120 {
        format!("{}...", &what[..120])
    } else {
        what
    };
    let text = assert_code(&c.cmd(args), code, &what);
    assert!(
        text.to_lowercase().contains(&needle.to_lowercase()),
        "{what}: error {text:?} should mention {needle:?}"
    );
    assert_pong(c);
}

fn s(v: &[&str]) -> Vec<Vec<u8>> {
    v.iter().map(|a| a.as_bytes().to_vec()).collect()
}

fn refs(v: &[Vec<u8>]) -> Vec<&[u8]> {
    v.iter().map(Vec::as_slice).collect()
}

#[track_caller]
fn expect_err_s(c: &mut RawConn, args: &[&str], code: &str, needle: &str) {
    let owned = s(args);
    expect_err(c, &refs(&owned), code, needle);
}

#[test]
fn wrong_arity_unknown_and_repeated_options() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    // Wrong arity: Redis enforces the arity from COMMAND INFO; the module checks the rest.
    for args in [
        &["LOCK.ACQUIRE"][..],
        &["LOCK.RELEASE"],
        &["LOCK.RELEASE", "k"],
        &["LOCK.RELEASE", "k", "t", "extra"],
        &["LOCK.EXTEND"],
        &["LOCK.EXTEND", "k"],
        &["LOCK.INFO"],
        &["LOCK.FORCERELEASE"],
        &["lock.release", "k"],
    ] {
        expect_err_s(&mut c, args, "ERR", "wrong number of arguments");
    }
    // FORCERELEASE takes an optional FENCE, LOCK.INFO (arity -2) an optional COUNT and
    // AFTER: anything else is an unknown option, named.
    for args in [
        &["LOCK.FORCERELEASE", "k", "extra"][..],
        &["LOCK.INFO", "k", "extra"],
        &["LOCK.INFO", "k", "COUNT", "1", "extra"],
    ] {
        expect_err_s(&mut c, args, "ERR", "unknown option 'extra'");
    }

    // A lock whose state must survive every rejected command below.
    let t1 = tok("t1");
    let (token, fence) = match c.cmd(&["LOCK.ACQUIRE", "lock:e", "PX", "60000", "TOKEN", &t1]) {
        Resp::Array(v) => (v[0].text(), v[1].int()),
        other => panic!("{other:?}"),
    };
    let t1 = t1.as_str();

    // Unknown options and options missing their value.
    for args in [
        &["LOCK.ACQUIRE", "lock:x", "NX"][..],
        &["LOCK.ACQUIRE", "lock:x", "PX", "100", "XX"],
        &["LOCK.ACQUIRE", "lock:x", "100"],
        &["LOCK.ACQUIRE", "lock:x", ""],
        &["LOCK.ACQUIRE", "lock:x", "PXX", "100"],
        &["LOCK.EXTEND", "lock:e", t1, "TOKEN", "x"],
        &["LOCK.EXTEND", "lock:e", t1, "KEEPTTL"],
        &["LOCK.EXTEND", "lock:e", t1, "BLOCK", "1"],
        &["LOCK.INFO", "lock:e", "CURSOR", "0"],
    ] {
        expect_err_s(&mut c, args, "ERR", "unknown option");
    }
    for args in [
        &["LOCK.ACQUIRE", "lock:x", "PX"][..],
        &["LOCK.ACQUIRE", "lock:x", "EX"],
        &["LOCK.ACQUIRE", "lock:x", "TOKEN"],
        &["LOCK.ACQUIRE", "lock:x", "OWNER"],
        &["LOCK.ACQUIRE", "lock:x", "BLOCK"],
        &["LOCK.ACQUIRE", "lock:x", "MINFENCE"],
        &["LOCK.ACQUIRE", "lock:x", "PX", "100", "TOKEN"],
        &["LOCK.EXTEND", "lock:e", t1, "PX"],
        &["LOCK.EXTEND", "lock:e", t1, "EX"],
        &["LOCK.INFO", "lock:e", "COUNT"],
        &["LOCK.INFO", "lock:e", "AFTER"],
        &["LOCK.INFO", "lock:e", "COUNT", "5", "AFTER"],
    ] {
        expect_err_s(&mut c, args, "ERR", "needs a value");
    }
    // A repeated option is named (in its canonical case, whatever case it was given in).
    let (ta, tb) = (tok("a"), tok("b"));
    for (line, name) in [
        ("LOCK.ACQUIRE lock:x PX 100 PX 100", "PX"),
        ("LOCK.ACQUIRE lock:x EX 1 ex 1", "EX"),
        ("LOCK.ACQUIRE lock:x TOKEN $A TOKEN $B", "TOKEN"),
        ("LOCK.ACQUIRE lock:x OWNER a owner b", "OWNER"),
        ("LOCK.ACQUIRE lock:x BLOCK 1 BLOCK 1", "BLOCK"),
        ("LOCK.ACQUIRE lock:x MINFENCE 1 MINFENCE 2", "MINFENCE"),
        ("LOCK.ACQUIRE lock:x SHARED shared", "SHARED"),
        ("LOCK.ACQUIRE lock:x LIMIT 2 LIMIT 2", "LIMIT"),
        ("LOCK.EXTEND lock:e $1 PX 100 PX 100", "PX"),
        ("LOCK.INFO lock:e COUNT 1 count 2", "COUNT"),
        ("LOCK.INFO lock:e AFTER 1 AFTER 1", "AFTER"),
        ("LOCK.FORCERELEASE lock:e FENCE 1 FENCE 2", "FENCE"),
    ] {
        let line = line.replace("$A", &ta).replace("$B", &tb).replace("$1", t1);
        let want = format!("syntax error: option '{name}' given twice");
        expect_err_s(&mut c, &words(&line), "ERR", &want);
    }
    // PX and EX together are not a repetition of one option: the error says what it is.
    for args in [
        &["LOCK.ACQUIRE", "lock:x", "PX", "100", "EX", "1"][..],
        &["LOCK.ACQUIRE", "lock:x", "EX", "1", "PX", "100"],
        &["LOCK.ACQUIRE", "lock:x", "px", "100", "ex", "1"],
        &["LOCK.EXTEND", "lock:e", t1, "PX", "100", "EX", "1"],
        &["LOCK.EXTEND", "lock:e", t1, "EX", "1", "PX", "100"],
    ] {
        expect_err_s(
            &mut c,
            args,
            "ERR",
            "syntax error: PX and EX exclude each other",
        );
    }
    // LOCK.INFO's COUNT out of range (or not a number).
    for v in ["0", "-1", "1001", "9223372036854775807"] {
        let args = ["LOCK.INFO", "lock:e", "COUNT", v];
        expect_err_s(&mut c, &args, "ERR", "COUNT must be");
    }
    for v in ["x", "1.5", ""] {
        let args = ["LOCK.INFO", "lock:e", "COUNT", v];
        expect_err_s(&mut c, &args, "ERR", "not an integer");
    }
    // The bounds themselves are accepted.
    for v in ["1", "1000"] {
        let r = c.cmd(&["LOCK.INFO", "lock:e", "COUNT", v]);
        assert_eq!(r.field("fence"), Some(Resp::Int(fence)), "COUNT {v}: {r:?}");
    }
    assert_lock_unchanged(&mut c, "lock:e", &token, fence);
    assert_eq!(c.cmd(&["EXISTS", "lock:x"]), Resp::Int(0));
}

/// The lock still has its fence and a lease of about 60 s (and, being a module lock, no
/// Redis expiry); no other key was created.
#[track_caller]
fn assert_lock_unchanged(c: &mut RawConn, key: &str, token: &str, fence: i64) {
    let info = c.cmd(&["LOCK.INFO", key]);
    assert_eq!(info.field("fence"), Some(Resp::Int(fence)), "{info:?}");
    let ttl = info.field("ttl").expect("ttl").int();
    assert!(
        ttl > 50_000 && ttl <= 60_000,
        "LOCK.INFO ttl {ttl}: a bad EXTEND moved the lease"
    );
    assert_eq!(
        c.cmd(&["PTTL", key]),
        Resp::Int(-1),
        "a module lock has no expiry"
    );
    // The token still holds it (renew answers the same fence).
    let r = c.cmd(&["LOCK.ACQUIRE", key, "PX", "60000", "TOKEN", token]);
    assert_eq!(r.items()[1], Resp::Int(fence));
}

#[test]
fn bad_ttl_token_owner_block_and_minfence_values() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    let t1 = tok("t1");
    let r = c.cmd(&["LOCK.ACQUIRE", "lock:e", "PX", "60000", "TOKEN", &t1]);
    let fence = r.items()[1].int();
    let t1 = t1.as_str();

    let not_int = [
        "abc", "1.5", "", " 1", "1 ", "+1", "0x10", "1e3", "--1", "-0", "01",
    ];
    let out_of_range = [
        "0",
        "-1",
        "-9223372036854775808",
        "86400001",
        "9223372036854775807",
    ];
    for opt in ["PX", "EX"] {
        // `opt v` is refused by LOCK.ACQUIRE and LOCK.EXTEND alike, with these texts.
        let mut refused = |v: &str, acquire_needle: &str, extend_needle: &str| {
            let acquire = ["LOCK.ACQUIRE", "lock:x", opt, v];
            expect_err_s(&mut c, &acquire, "ERR", acquire_needle);
            let extend = ["LOCK.EXTEND", "lock:e", t1, opt, v];
            expect_err_s(&mut c, &extend, "ERR", extend_needle);
        };
        for v in not_int {
            refused(v, "integer", "integer");
        }
        for v in out_of_range {
            refused(
                v,
                "invalid expire time in 'lock.acquire'",
                "invalid expire time in 'lock.extend'",
            );
        }
    }
    // Just above lock.max-ttl (86400000 ms = 86400 s), and EX that overflows in ms.
    for args in [
        &["LOCK.ACQUIRE", "lock:x", "EX", "86401"][..],
        &["LOCK.ACQUIRE", "lock:x", "EX", "9223372036854775"],
        &["LOCK.ACQUIRE", "lock:x", "EX", "9223372036854776"],
        &["LOCK.EXTEND", "lock:e", t1, "EX", "86401"],
    ] {
        expect_err_s(&mut c, args, "ERR", "invalid expire time");
    }
    // Above the limit the message names the setting, the limit and what was asked, so
    // that a `--hold 144h` refused by a 24 h limit says why.
    for (args, text) in [
        (
            &["LOCK.ACQUIRE", "lock:x", "PX", "518400000"][..],
            "ERR invalid expire time in 'lock.acquire' command: 518400000 ms is above \
             lock.max-ttl (86400000 ms)",
        ),
        (
            &["LOCK.EXTEND", "lock:e", t1, "EX", "86401"],
            "ERR invalid expire time in 'lock.extend' command: 86401000 ms is above \
             lock.max-ttl (86400000 ms)",
        ),
    ] {
        assert_eq!(c.cmd(args), Resp::Error(text.into()), "{args:?}");
    }
    // Also on a key that is not held / held by someone else: the arguments are checked
    // first, so a bad TTL is an error rather than a quiet 0.
    expect_err_s(
        &mut c,
        &["LOCK.EXTEND", "lock:free", t1, "PX", "0"],
        "ERR",
        "invalid expire",
    );
    expect_err_s(
        &mut c,
        &["LOCK.EXTEND", "lock:e", "not-mine", "PX", "-5"],
        "ERR",
        "invalid expire",
    );
    // The limits themselves are accepted.
    let ok = c.cmd(&["LOCK.ACQUIRE", "lock:max", "PX", "86400000"]);
    assert!(matches!(ok, Resp::Array(_)), "{ok:?}");
    let ok = c.cmd(&["LOCK.ACQUIRE", "lock:maxex", "EX", "86400"]);
    assert!(matches!(ok, Resp::Array(_)), "{ok:?}");
    let ok = c.cmd(&["LOCK.ACQUIRE", "lock:min", "PX", "1"]);
    assert!(matches!(ok, Resp::Array(_)), "{ok:?}");

    // TOKEN: lock.min-token-length (16) ..= 256 bytes; OWNER (a label): 1..=256 bytes.
    for (opt, min, needle) in [
        ("TOKEN", 16, "TOKEN must be 16 to 256 bytes long"),
        ("OWNER", 1, "OWNER"),
    ] {
        let short = vec![b'x'; min - 1];
        let long = vec![b'x'; 257];
        for v in [&short[..], &long[..]] {
            expect_err(
                &mut c,
                &[b"LOCK.ACQUIRE", b"lock:x", opt.as_bytes(), v],
                "ERR",
                needle,
            );
        }
        for (n, fill) in [(min, b'z'), (256, b'y')] {
            let v = vec![fill; n];
            let key = format!("lock:len:{opt}:{n}");
            let r = c.cmd(&[b"LOCK.ACQUIRE", key.as_bytes(), opt.as_bytes(), &v]);
            assert!(matches!(r, Resp::Array(_)), "{opt} of {n} bytes: {r:?}");
        }
    }
    let r = c.cmd(&[&b"LOCK.INFO"[..], b"lock:len:OWNER:256"]);
    assert_eq!(r.field("owner"), Some(Resp::Bulk(vec![b'y'; 256])));
    let r = c.cmd(&[&b"LOCK.INFO"[..], b"lock:len:OWNER:1"]);
    assert_eq!(r.field("owner"), Some(Resp::Bulk(b"z".to_vec())));

    // BLOCK: negative or not an integer.
    for v in [
        "-1",
        "-9223372036854775808",
        "x",
        "1.5",
        "",
        "9223372036854775808",
    ] {
        expect_err_s(
            &mut c,
            &["LOCK.ACQUIRE", "lock:e", "BLOCK", v],
            "ERR",
            "timeout",
        );
    }
    // MINFENCE: 0, negative, not an integer, the top value.
    for v in [
        "0",
        "-1",
        "x",
        "9223372036854775807",
        "18446744073709551615",
    ] {
        expect_err_s(
            &mut c,
            &["LOCK.ACQUIRE", "lock:x", "MINFENCE", v],
            "ERR",
            "MINFENCE",
        );
    }
    // LOCKDELAY and AFTER: a value that is not an integer is the generic integer error;
    // an integer out of range names the option.
    for (args, needle) in [
        (
            &["LOCK.ACQUIRE", "lock:x", "LOCKDELAY", "x"][..],
            "value is not an integer",
        ),
        (
            &["LOCK.ACQUIRE", "lock:x", "LOCKDELAY", "1.5"],
            "value is not an integer",
        ),
        (
            &["LOCK.ACQUIRE", "lock:x", "LOCKDELAY", "-1"],
            "LOCKDELAY must be",
        ),
        (
            &["LOCK.ACQUIRE", "lock:x", "LOCKDELAY", "86400001"],
            "LOCKDELAY must be",
        ),
        (
            &["LOCK.INFO", "lock:e", "AFTER", "x"],
            "value is not an integer",
        ),
        (&["LOCK.INFO", "lock:e", "AFTER", "-1"], "AFTER must be"),
    ] {
        expect_err_s(&mut c, args, "ERR", needle);
    }
    // MINFENCE may lead this server's clock term by an hour, not more.
    let ahead = far_fence().to_string();
    let r = c.cmd(&["LOCK.ACQUIRE", "lock:far", "PX", "1000", "MINFENCE", &ahead]);
    assert!(matches!(r, Resp::Array(_)), "MINFENCE 59 min ahead: {r:?}");
    let too_far = (((unix_ms() + 2 * 3_600_000) as u64) << 10).to_string();
    expect_err_s(
        &mut c,
        &["LOCK.ACQUIRE", "lock:x", "MINFENCE", &too_far],
        "ERR",
        "fence is too far ahead of this server's clock",
    );
    assert_lock_unchanged(&mut c, "lock:e", t1, fence);
    assert_eq!(c.cmd(&["EXISTS", "lock:x"]), Resp::Int(0));
    assert_eq!(lock_stat(&mut c, "panics"), 0);
}

#[test]
fn wrongtype_internal_commands_and_maxwaiters() {
    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    c.cmd(&["RPUSH", "lock:list", "a", "b"]);
    c.cmd(&["HSET", "lock:hash", "f", "v"]);
    let t = tok("t");
    for key in ["lock:list", "lock:hash"] {
        for args in [
            &["LOCK.ACQUIRE", key][..],
            &["LOCK.ACQUIRE", key, "PX", "100", "TOKEN", &t],
            &["LOCK.ACQUIRE", key, "BLOCK", "100"],
            &["LOCK.ACQUIRE", key, "BLOCK", "0"],
            &["LOCK.RELEASE", key, "a"],
            &["LOCK.EXTEND", key, "a"],
            &["LOCK.EXTEND", key, "a", "PX", "100"],
            &["LOCK.INFO", key],
            &["LOCK.FORCERELEASE", key],
        ] {
            expect_err_s(&mut c, args, "WRONGTYPE", "wrong kind of value");
        }
    }
    assert_eq!(c.cmd(&["LLEN", "lock:list"]), Resp::Int(2));
    assert_eq!(c.cmd(&["PTTL", "lock:list"]), Resp::Int(-1));
    assert_eq!(
        c.cmd(&["HGET", "lock:hash", "f"]),
        Resp::Bulk(b"v".to_vec())
    );

    // The replication-only command and the disabled debug command refuse with ERR.
    expect_err_s(
        &mut c,
        &words("LOCK.SYNC lock:sync tok 42 99999999999999 1 1 127.0.0.1:1"),
        "ERR",
        "internal",
    );
    // So is this release's replication command, in each of its forms.
    let digest = "0".repeat(32);
    let grant = format!("exclusive;{digest};42;60000;1;1;127.0.0.1:1");
    let packed = format!("ADD;{grant}");
    let session = format!("OPEN;{digest};60000;60000");
    let end = format!("END;{digest}");
    for args in [
        &["LOCK.REPL", "lock:sync", "ADD", &grant][..],
        &["LOCK.REPL", "lock:sync", "RENEW", "42;60000"],
        &["LOCK.REPL", "lock:sync", "DROP", "42"],
        // The op word packed into the fields' argument: one argument fewer, which the
        // arity (-3) lets through to the module, which refuses it all the same.
        &["LOCK.REPL", "lock:sync", &packed],
        &["LOCK.REPL", "lock:sync", &packed, "OWNER", "o"],
        &["LOCK.REPL", "lock:sync", "RENEW;42;60000"],
        &["LOCK.REPL", "lock:sync", "DROP;42"],
        &["LOCK.REPL", "lock:sync", "DELAY;60000"],
        &["LOCK.REPL", "lock:sync", "x"],
        &["LOCK.SREPL", &session],
        &["LOCK.SREPL", &session, "OWNER", "o"],
        &["LOCK.SREPL", &end],
        &["LOCK.SREPL", "OPEN", &digest, "60000", "60000"],
        &["LOCK.SREPL", "x"],
    ] {
        expect_err_s(&mut c, args, "ERR", "internal");
    }
    // Fewer arguments than any form has: the server's arity check.
    for args in [
        &["LOCK.REPL", "lock:sync"][..],
        &["LOCK.REPL"],
        &["LOCK.SREPL"],
    ] {
        expect_err_s(&mut c, args, "ERR", "wrong number of arguments");
    }
    // Nor from a transaction or a script.
    let r = c.pipeline(&[
        vec!["MULTI".to_string()],
        vec!["LOCK.REPL".into(), "lock:sync".into(), packed.clone()],
        vec!["LOCK.SREPL".into(), session.clone()],
        vec!["EXEC".into()],
    ]);
    let r = r.expect("MULTI/EXEC");
    let errs: Vec<String> = match &r[3] {
        Resp::Array(v) => v.iter().map(|e| assert_code(e, "ERR", "EXEC")).collect(),
        other => panic!("EXEC: {other:?}"),
    };
    assert!(errs.iter().all(|e| e.contains("internal")), "{errs:?}");
    for (script, arg) in [
        ("return redis.call('LOCK.REPL', KEYS[1], ARGV[1])", &packed),
        ("return redis.call('LOCK.SREPL', ARGV[1])", &session),
    ] {
        expect_err_s(
            &mut c,
            &["EVAL", script, "1", "lock:sync", arg],
            "ERR",
            "internal",
        );
    }
    assert_eq!(c.cmd(&["EXISTS", "lock:sync"]), Resp::Int(0));
    expect_err_s(&mut c, &["LOCK.DEBUG", "PANIC"], "ERR", "unknown command");
    assert_eq!(lock_stat(&mut c, "panics"), 0);

    // MAXWAITERS: with lock.max-waiters 2, two clients wait and a third fails at once.
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "lock.max-waiters", "2"]),
        Resp::Simple("OK".into())
    );
    let (holder, t1, t2, t3) = (tok("holder"), tok("w1"), tok("w2"), tok("w3"));
    let r = c.cmd(&["LOCK.ACQUIRE", "lock:w", "TOKEN", &holder]);
    assert!(matches!(r, Resp::Array(_)), "{r:?}");
    let mut w1 = RawConn::connect(server.port);
    let mut w2 = RawConn::connect(server.port);
    w1.send(&["LOCK.ACQUIRE", "lock:w", "BLOCK", "0", "TOKEN", &t1]);
    w2.send(&["LOCK.ACQUIRE", "lock:w", "BLOCK", "20000", "TOKEN", &t2]);
    assert!(
        wait_until(Duration::from_secs(5), || c
            .cmd(&["LOCK.INFO", "lock:w"])
            .field("waiters")
            == Some(Resp::Int(2))),
        "the two waiters did not queue"
    );
    let mut w3 = RawConn::connect(server.port);
    let t = Instant::now();
    let r = w3.cmd(&["LOCK.ACQUIRE", "lock:w", "BLOCK", "0", "TOKEN", &t3]);
    assert_code(&r, "MAXWAITERS", "third waiter");
    // Refused at once rather than queued (BLOCK 0 would wait for ever): a hang guard of
    // 10 s, which a loaded machine's 1-2 s pauses fit in (2 s did not always).
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "MAXWAITERS took {:?}",
        t.elapsed()
    );
    assert_pong(&mut w3);
    // A non-blocking acquire is no waiter: plain nil. Other keys still queue.
    assert_eq!(w3.cmd(&["LOCK.ACQUIRE", "lock:w"]), Resp::Nil);
    assert_eq!(lock_stat(&mut c, "waiters"), 2);
    // The queue still works in order once the holder lets go.
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:w", &holder]), Resp::Int(1));
    let g1 = w1.read().expect("w1 reply");
    assert_eq!(g1.items()[0], Resp::Bulk(t1.clone().into_bytes()));
    // Room again for one more waiter.
    w3.send(&["LOCK.ACQUIRE", "lock:w", "BLOCK", "20000", "TOKEN", &t3]);
    assert!(wait_until(Duration::from_secs(5), || c
        .cmd(&["LOCK.INFO", "lock:w"])
        .field("waiters")
        == Some(Resp::Int(2))));
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:w", &t1]), Resp::Int(1));
    assert_eq!(
        w2.read().expect("w2 reply").items()[0],
        Resp::Bulk(t2.clone().into_bytes())
    );
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:w", &t2]), Resp::Int(1));
    assert_eq!(
        w3.read().expect("w3 reply").items()[0],
        Resp::Bulk(t3.clone().into_bytes())
    );
    assert_eq!(lock_stat(&mut c, "waiters"), 0);
    assert_pong(&mut c);

    // Out of memory (maxmemory below use, noeviction): ACQUIRE is deny-oom and gets
    // OOM; RELEASE, EXTEND and INFO still work so holders can let go.
    let (tok, _) = match c.cmd(&["LOCK.ACQUIRE", "lock:oom", "PX", "60000"]) {
        Resp::Array(v) => (v[0].text(), v[1].int()),
        other => panic!("{other:?}"),
    };
    c.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    c.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    expect_err_s(&mut c, &["LOCK.ACQUIRE", "lock:oom2"], "OOM", "");
    assert_eq!(
        c.cmd(&["LOCK.EXTEND", "lock:oom", &tok, "PX", "60000"]),
        Resp::Int(1)
    );
    assert!(matches!(c.cmd(&["LOCK.INFO", "lock:oom"]), Resp::Array(_)));
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:oom", &tok]), Resp::Int(1));
    c.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    assert!(matches!(
        c.cmd(&["LOCK.ACQUIRE", "lock:oom2"]),
        Resp::Array(_)
    ));
}

// ------------------------------------------------------------------------------------
// Fuzz

/// xorshift64*: tiny, seeded, good enough to pick test inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn bytes(&mut self, max_len: u64) -> Vec<u8> {
        let n = self.below(max_len + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

const COMMANDS: &[&str] = &[
    "LOCK.ACQUIRE",
    "LOCK.ACQUIRE",
    "LOCK.ACQUIRE",
    "LOCK.RELEASE",
    "LOCK.EXTEND",
    "LOCK.INFO",
    "LOCK.FORCERELEASE",
    "lock.acquire",
    "Lock.Extend",
    "LOCK.SYNC",
    "LOCK.REPL",
    "LOCK.DEBUG",
];
const KEYS: &[&str] = &["fz:1", "fz:2", "fz:3", "fz:list", "fz:str", ""];
const OPTIONS: &[&str] = &[
    "PX", "EX", "TOKEN", "OWNER", "BLOCK", "MINFENCE", "px", "Ex", "token", "NX", "KEEPTTL",
    "SHARED", "LIMIT", "COUNT", "AFTER", "FENCE",
];
const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "100",
    "86400000",
    "86400001",
    "9223372036854775807",
    "-9223372036854775808",
    "9223372036854775808",
    "18446744073709551615",
    "99999999999999999999999999",
    "1e3",
    "0x10",
    " 1",
    "1.5",
    "-0",
    "",
];
/// Two tokens LOCK.ACQUIRE takes (at least 16 bytes) and `tok`, the value of the classic
/// string lock `fz:str`: too short for an ACQUIRE, which refuses it, while RELEASE and
/// EXTEND take it.
const TOKENS: &[&str] = &["fuzz-token-one-0001", "fuzz-token-two-0002", "tok"];

fn fuzz_arg(rng: &mut Rng) -> Vec<u8> {
    match rng.below(10) {
        0..=2 => rng.pick(OPTIONS).as_bytes().to_vec(),
        3..=4 => rng.pick(NUMBERS).as_bytes().to_vec(),
        5 => rng.below(1 << 40).to_string().into_bytes(),
        6 => rng.pick(TOKENS).as_bytes().to_vec(),
        7 => rng.bytes(12),
        8 => rng.bytes(300),
        _ => rng.pick(KEYS).as_bytes().to_vec(),
    }
}

/// A well-formed command with valid values (so that locks are really taken, renewed,
/// extended, released and waited for).
fn valid_command(rng: &mut Rng) -> Vec<Vec<u8>> {
    let key = rng.pick(&KEYS[..3]).as_bytes().to_vec();
    let tok = rng.pick(TOKENS).as_bytes().to_vec();
    let mut opts: Vec<Vec<Vec<u8>>> = Vec::new();
    let name = match rng.below(6) {
        0..=1 => {
            if rng.chance(50) {
                opts.push(vec![
                    b"PX".to_vec(),
                    (1 + rng.below(3000)).to_string().into_bytes(),
                ]);
            } else if rng.chance(30) {
                opts.push(vec![
                    b"EX".to_vec(),
                    (1 + rng.below(3)).to_string().into_bytes(),
                ]);
            }
            if rng.chance(70) {
                opts.push(vec![b"TOKEN".to_vec(), tok.clone()]);
            }
            if rng.chance(30) {
                opts.push(vec![b"OWNER".to_vec(), rng.bytes(20)]);
            }
            if rng.chance(15) {
                opts.push(vec![b"BLOCK".to_vec(), b"5".to_vec()]);
            }
            if rng.chance(20) {
                // Below the clock term (unix_ms << 10 is about 2^50.7): accepted, no effect.
                let f = 1 + rng.below(1 << 50);
                opts.push(vec![b"MINFENCE".to_vec(), f.to_string().into_bytes()]);
            }
            "LOCK.ACQUIRE"
        }
        2 => {
            opts.push(vec![tok]);
            "LOCK.RELEASE"
        }
        3 => {
            opts.push(vec![tok]);
            if rng.chance(60) {
                opts.push(vec![
                    b"PX".to_vec(),
                    (1 + rng.below(3000)).to_string().into_bytes(),
                ]);
            }
            "LOCK.EXTEND"
        }
        4 => "LOCK.INFO",
        _ => "LOCK.FORCERELEASE",
    };
    // Options come in any order (the token of RELEASE/EXTEND stays first).
    if name == "LOCK.ACQUIRE" {
        for i in (1..opts.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            opts.swap(i, j);
        }
    }
    let mut cmd = vec![name.as_bytes().to_vec(), key];
    cmd.extend(opts.into_iter().flatten());
    cmd
}

/// A random command: a third well-formed, a third well-formed with one random change
/// (an argument replaced, dropped, or inserted), a third random words and bytes.
fn fuzz_command(rng: &mut Rng) -> Vec<Vec<u8>> {
    let mode = rng.below(3);
    let mut cmd = if mode < 2 {
        let mut cmd = valid_command(rng);
        if mode == 1 {
            let at = 1 + rng.below(cmd.len() as u64) as usize;
            match rng.below(3) {
                0 if at < cmd.len() => cmd[at] = fuzz_arg(rng),
                1 if at < cmd.len() => {
                    cmd.remove(at);
                }
                _ => cmd.insert(at.min(cmd.len()), fuzz_arg(rng)),
            }
        }
        cmd
    } else {
        let mut cmd = vec![rng.pick(COMMANDS).as_bytes().to_vec()];
        if rng.chance(97) {
            cmd.push(rng.pick(KEYS).as_bytes().to_vec());
        }
        let n = rng.below(9);
        for _ in 0..n {
            if rng.chance(60) {
                cmd.push(rng.pick(OPTIONS).as_bytes().to_vec());
                if rng.chance(90) {
                    cmd.push(fuzz_arg(rng));
                }
            } else {
                cmd.push(fuzz_arg(rng));
            }
        }
        cmd
    };
    // Keep blocking bounded: any value after a BLOCK word that could be a valid
    // timeout becomes a short one (0 would wait forever).
    for i in 1..cmd.len() {
        if cmd[i - 1].eq_ignore_ascii_case(b"BLOCK") {
            let plausible = std::str::from_utf8(&cmd[i])
                .ok()
                .is_some_and(|s| s.trim().trim_start_matches('+').parse::<u64>().is_ok());
            if plausible {
                cmd[i] = (1 + rng.below(30)).to_string().into_bytes();
            }
        }
    }
    cmd
}

/// Checks that a reply is one this command may give; returns a description if not.
fn check_reply(cmd: &[Vec<u8>], r: &Resp) -> Result<(), String> {
    if let Resp::Error(e) = r {
        if starts_with_error_code(e) && !e.contains('\r') && !e.contains('\n') {
            return Ok(());
        }
        return Err(format!("error without a code: {e:?}"));
    }
    let name = String::from_utf8_lossy(&cmd[0]).to_ascii_uppercase();
    let ok = match name.as_str() {
        "LOCK.ACQUIRE" => match r {
            Resp::Nil => true,
            Resp::Array(v) => {
                v.len() == 2
                    && matches!(v[0], Resp::Bulk(_))
                    && matches!(v[1], Resp::Int(f) if f > 0)
            }
            _ => false,
        },
        "LOCK.RELEASE" | "LOCK.EXTEND" | "LOCK.FORCERELEASE" => {
            matches!(r, Resp::Int(0) | Resp::Int(1))
        }
        "LOCK.INFO" => match r {
            Resp::Nil => true,
            // A module lock's reply ends with the holder list's cursor.
            Resp::Array(_) | Resp::Map(_) => {
                r.field("state").is_some()
                    && (r.field("kind") == Some(Resp::Bulk(b"string".to_vec()))
                        || r.field("cursor").is_some_and(|c| c.as_int().is_some()))
            }
            _ => false,
        },
        _ => false, // LOCK.SYNC / LOCK.REPL / LOCK.DEBUG may only fail here
    };
    if ok {
        Ok(())
    } else {
        Err(format!("unexpected reply {r:?}"))
    }
}

#[test]
fn fuzz_random_lock_commands_never_crash_or_hang() {
    // hz 100: blocked clients' timeouts are served every 10 ms rather than 100 ms.
    let mut server = ServerBuilder::new().arg("hz", "100").start();
    let seed = std::env::var("LOCK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1234_abcd_0001u64);
    let mut rng = Rng(seed);
    let mut conns = [
        RawConn::connect(server.port),
        RawConn::connect_resp3(server.port),
    ];
    for c in &conns {
        // A hang shows up as a read timeout, well before the harness's limits.
        c.set_read_timeout(Some(Duration::from_secs(5)));
    }
    let mut setup = RawConn::connect(server.port);
    setup.cmd(&["RPUSH", "fz:list", "x"]);
    setup.cmd(&["SET", "fz:str", "tok", "PX", "600000"]);

    let (mut errors, mut grants, mut ones) = (0, 0, 0);
    for i in 0..3000 {
        let cmd = fuzz_command(&mut rng);
        let c = &mut conns[i % 2];
        c.send(&cmd);
        let shown = || {
            cmd.iter()
                .map(|a| format!("{:?}", String::from_utf8_lossy(a)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let r = c.read().unwrap_or_else(|e| {
            panic!(
                "fuzz #{i} (seed {seed:#x}): no reply to {}: {e}\n{}",
                shown(),
                server.log_tail()
            )
        });
        if let Err(why) = check_reply(&cmd, &r) {
            panic!("fuzz #{i} (seed {seed:#x}): {}: {why}", shown());
        }
        match r {
            Resp::Error(_) => errors += 1,
            Resp::Array(ref v) if v.len() == 2 => grants += 1,
            Resp::Int(1) => ones += 1,
            _ => {}
        }
        if i % 100 == 99 {
            assert_pong(c);
            // Keep the odd lock from being held for the whole run.
            if i % 500 == 499 {
                for k in ["fz:1", "fz:2", "fz:3", ""] {
                    setup.cmd(&["LOCK.FORCERELEASE", k]);
                }
            }
        }
    }
    eprintln!("fuzz: {errors} errors, {grants} grants, {ones} times 1");
    assert!(server.is_running(), "server died\n{}", server.log_tail());
    assert_pong(&mut setup);
    assert_eq!(lock_stat(&mut setup, "panics"), 0, "a command panicked");
    // The fuzz reached both the parsers' error paths and real grants.
    assert!(
        errors > 300 && grants > 100 && ones > 100,
        "errors {errors}, grants {grants}, replies of 1 {ones}"
    );
    // Data that only took errors is unchanged.
    assert_eq!(
        setup.cmd(&["LRANGE", "fz:list", "0", "-1"]).items().len(),
        1
    );
    // Everything still works.
    let z = tok("z");
    let r = setup.cmd(&["LOCK.ACQUIRE", "fz:after", "TOKEN", &z]);
    assert!(matches!(r, Resp::Array(_)), "{r:?}");
    assert_eq!(setup.cmd(&["LOCK.RELEASE", "fz:after", &z]), Resp::Int(1));
}
