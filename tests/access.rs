//! Who may do what: ACL key patterns and command rules apply to the lock commands through
//! their key specs, and a Rust panic inside a command becomes an error reply instead of
//! taking the server down.

mod common;

use common::{
    debug_server, lock_stat, server_flavor, starts_with_error_code, tok, RawConn, Resp,
    ServerBuilder,
};

#[track_caller]
fn assert_code(r: &Resp, code: &str, what: &str) {
    let Resp::Error(e) = r else {
        panic!("{what}: expected {code}, got {r:?}")
    };
    assert!(starts_with_error_code(e), "{what}: {e:?}");
    assert_eq!(e.split(' ').next(), Some(code), "{what}: {e:?}");
}

#[track_caller]
fn ok(r: Resp) {
    assert_eq!(r, Resp::Simple("OK".into()));
}

fn login(port: u16, user: &str) -> RawConn {
    let mut c = RawConn::connect(port);
    ok(c.cmd(&["AUTH", user, "pw"]));
    c
}

fn grant(r: &Resp) -> (String, i64) {
    match r {
        Resp::Array(v) if v.len() == 2 => (v[0].text(), v[1].int()),
        other => panic!("expected [token, fence], got {other:?}"),
    }
}

/// Every lock command on `key`, with plausible arguments (RELEASE and EXTEND with the
/// token `tok("t")`, the one `other:a` is held with: were the ACL not applied, they would
/// change it).
fn all_commands(key: &str) -> Vec<Vec<String>> {
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let t = tok("t");
    vec![
        v(&["LOCK.ACQUIRE", key, "PX", "10000"]),
        v(&["LOCK.ACQUIRE", key, "BLOCK", "0"]),
        v(&["LOCK.RELEASE", key, &t]),
        v(&["LOCK.EXTEND", key, &t, "PX", "1000"]),
        v(&["LOCK.INFO", key]),
        v(&["LOCK.FORCERELEASE", key]),
    ]
}

#[test]
fn acl_key_patterns_and_command_rules_apply() {
    let server = ServerBuilder::new().start();
    let mut admin = RawConn::connect(server.port);
    // +@all (or naming them) grants the module's commands on every server: on 7.0 they are
    // in no ACL category, on 8.2 and Valkey 8.1 in categories (tests/holes.rs row 7).
    ok(admin.cmd(&["ACL", "SETUSER", "app", "on", ">pw", "~lock:*", "+@all"]));
    ok(admin.cmd(&[
        "ACL",
        "SETUSER",
        "narrow",
        "on",
        ">pw",
        "~lock:*",
        "+lock.acquire",
        "+lock.release",
        "+ping",
    ]));
    ok(admin.cmd(&["ACL", "SETUSER", "ro", "on", ">pw", "%R~lock:*", "+@all"]));
    ok(admin.cmd(&["ACL", "SETUSER", "wo", "on", ">pw", "%W~lock:*", "+@all"]));

    // `app`: everything on lock:*, nothing elsewhere (a BLOCK does not wait first).
    let mut app = login(server.port, "app");
    let (token, fence) = grant(&app.cmd(&["LOCK.ACQUIRE", "lock:a", "PX", "60000"]));
    assert_eq!(
        app.cmd(&["LOCK.EXTEND", "lock:a", &token, "PX", "60000"]),
        Resp::Int(1)
    );
    assert_eq!(
        app.cmd(&["LOCK.INFO", "lock:a"]).field("fence"),
        Some(Resp::Int(fence))
    );
    let t = tok("t");
    let (_, other_fence) = grant(&admin.cmd(&["LOCK.ACQUIRE", "other:a", "TOKEN", &t]));
    for cmd in all_commands("other:a") {
        assert_code(&app.cmd(&cmd), "NOPERM", &cmd.join(" "));
    }
    assert_eq!(app.cmd(&["PING"]), Resp::Simple("PONG".into()));
    // other:a is untouched by the refused commands: still held by `t` with its fence
    // (the renew answers the same grant) and its 30 s default lease, not EXTEND's 1 s.
    let ttl = admin
        .cmd(&["LOCK.INFO", "other:a"])
        .field("ttl")
        .unwrap()
        .int();
    assert!(
        ttl > 20_000,
        "a refused EXTEND changed the lease: ttl {ttl}"
    );
    assert_eq!(
        grant(&admin.cmd(&["LOCK.ACQUIRE", "other:a", "TOKEN", &t])),
        (t.clone(), other_fence)
    );

    // `narrow`: only the commands it was given.
    let mut narrow = login(server.port, "narrow");
    let (t2, _) = grant(&narrow.cmd(&["LOCK.ACQUIRE", "lock:n"]));
    assert_code(
        &narrow.cmd(&["LOCK.INFO", "lock:n"]),
        "NOPERM",
        "narrow LOCK.INFO",
    );
    assert_code(
        &narrow.cmd(&["LOCK.FORCERELEASE", "lock:n"]),
        "NOPERM",
        "narrow LOCK.FORCERELEASE",
    );
    assert_code(
        &narrow.cmd(&["LOCK.EXTEND", "lock:n", &t2]),
        "NOPERM",
        "narrow LOCK.EXTEND",
    );
    assert_code(
        &narrow.cmd(&["LOCK.ACQUIRE", "other:n"]),
        "NOPERM",
        "narrow on other:n",
    );
    assert_eq!(narrow.cmd(&["LOCK.RELEASE", "lock:n", &t2]), Resp::Int(1));

    // `ro` (%R~lock:*): may look, may not take, extend, release or force.
    let mut ro = login(server.port, "ro");
    let info = ro.cmd(&["LOCK.INFO", "lock:a"]);
    assert_eq!(info.field("fence"), Some(Resp::Int(fence)), "{info:?}");
    assert_eq!(ro.cmd(&["LOCK.INFO", "lock:free"]), Resp::Nil);
    for key in ["lock:a", "lock:new"] {
        for cmd in all_commands(key) {
            if cmd[0] == "LOCK.INFO" {
                continue;
            }
            assert_code(&ro.cmd(&cmd), "NOPERM", &format!("ro: {}", cmd.join(" ")));
        }
    }
    assert_code(
        &ro.cmd(&["LOCK.RELEASE", "lock:a", &token]),
        "NOPERM",
        "ro with the right token",
    );
    assert_code(&ro.cmd(&["LOCK.INFO", "other:a"]), "NOPERM", "ro other:a");

    // `wo` (%W~lock:*): LOCK.INFO reads, so it is refused.
    let mut wo = login(server.port, "wo");
    assert_code(&wo.cmd(&["LOCK.INFO", "lock:a"]), "NOPERM", "wo LOCK.INFO");

    // The lock of `app` survived all of the above.
    assert_eq!(admin.cmd(&["EXISTS", "lock:new"]), Resp::Int(0));
    assert_eq!(
        admin.cmd(&["LOCK.INFO", "lock:a"]).field("fence"),
        Some(Resp::Int(fence))
    );
    assert_eq!(app.cmd(&["LOCK.RELEASE", "lock:a", &token]), Resp::Int(1));
    // The refusals are in the ACL log, naming the key.
    let log = admin.cmd(&["ACL", "LOG"]);
    let objects: Vec<String> = log
        .items()
        .iter()
        .filter_map(|e| e.field("object").map(|o| o.text()))
        .collect();
    assert!(
        objects.iter().any(|o| o == "other:a"),
        "ACL LOG objects {objects:?}"
    );
}

#[test]
fn a_panic_in_a_command_is_an_error_reply_and_the_server_survives() {
    let server = debug_server().start();
    let mut c = RawConn::connect(server.port);
    let (tok, fence) = grant(&c.cmd(&["LOCK.ACQUIRE", "lock:p", "PX", "60000"]));
    assert_eq!(lock_stat(&mut c, "panics"), 0);

    let r = c.cmd(&["LOCK.DEBUG", "PANIC"]);
    let Resp::Error(e) = &r else {
        panic!("LOCK.DEBUG PANIC answered {r:?}")
    };
    assert!(e.starts_with("ERR "), "{e:?}");
    assert_eq!(c.cmd(&["PING"]), Resp::Simple("PONG".into()));
    assert_eq!(lock_stat(&mut c, "panics"), 1);
    let log = server.log();
    assert!(
        log.contains("LOCK.DEBUG PANIC was called"),
        "the panic message is not in the log:\n{}",
        server.log_tail()
    );
    assert!(log.contains("redis-lock"), "{}", server.log_tail());

    // The lock taken before the panic is intact, and everything keeps working.
    assert_eq!(
        c.cmd(&["LOCK.INFO", "lock:p"]).field("fence"),
        Some(Resp::Int(fence))
    );
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:p", &tok]), Resp::Int(1));
    let (t2, f2) = grant(&c.cmd(&["LOCK.ACQUIRE", "lock:p"]));
    assert!(f2 > fence);
    assert_eq!(
        c.cmd(&["LOCK.DEBUG", "FENCE"]),
        Resp::Int(lock_stat(&mut c, "last_fence"))
    );
    assert_eq!(c.cmd(&["LOCK.DEBUG", "FENCE"]), Resp::Int(f2));

    // A panic inside MULTI/EXEC fails only that command of the transaction.
    ok(c.cmd(&["MULTI"]));
    assert_eq!(
        c.cmd(&["LOCK.DEBUG", "PANIC"]),
        Resp::Simple("QUEUED".into())
    );
    assert_eq!(
        c.cmd(&["LOCK.RELEASE", "lock:p", &t2]),
        Resp::Simple("QUEUED".into())
    );
    let exec = c.cmd(&["EXEC"]).items();
    assert!(
        matches!(&exec[0], Resp::Error(e) if e.starts_with("ERR ")),
        "{exec:?}"
    );
    assert_eq!(exec[1], Resp::Int(1));
    // And over RESP3.
    let mut c3 = RawConn::connect_resp3(server.port);
    assert!(c3.cmd(&["LOCK.DEBUG", "PANIC"]).err().starts_with("ERR "));
    assert_eq!(lock_stat(&mut c, "panics"), 3);
    // Unknown subcommand: an ordinary error, not a panic.
    assert!(c.cmd(&["LOCK.DEBUG", "NOPE"]).err().starts_with("ERR "));
    assert_eq!(lock_stat(&mut c, "panics"), 3);
    assert!(matches!(
        c.cmd(&["LOCK.ACQUIRE", "lock:after"]),
        Resp::Array(_)
    ));
}

/// LOCK.DEBUG exists only with `debug-commands yes`; without it the module adds 16
/// commands, so that where the server keeps its commands in a dict that doubles when an
/// insert finds it full (Redis; Valkey from 8.1 has its own hashtable), the module does
/// not make it double where the server's own commands fit. A doubling moves each chain in
/// reverse order: on Redis 7.0.15 (240 commands, 257 with LOCK.DEBUG) every lookup of
/// SET then met one or two other names first, about 2% of SET NX PX in instructions.
#[test]
fn lock_debug_exists_only_with_the_module_argument_and_the_command_table_keeps_its_size() {
    let count = |b: ServerBuilder| {
        let s = b.start();
        RawConn::connect(s.port).cmd(&["COMMAND", "COUNT"]).int()
    };
    let plain = count(ServerBuilder::new().no_module());
    let with = count(ServerBuilder::new());
    let debug = count(debug_server());
    let f = server_flavor();
    if !(f.is_valkey() && f.at_least(8, 1)) {
        let size = |n: i64| (n as u64).next_power_of_two();
        assert_eq!(
            size(with),
            size(plain),
            "{f}: {plain} commands alone, {with} with the module: the module makes the command table double"
        );
    }
    assert_eq!(
        debug,
        with + 1,
        "LOCK.DEBUG is the one command the switch adds"
    );

    let server = ServerBuilder::new().start();
    let mut c = RawConn::connect(server.port);
    for sub in ["PANIC", "FENCE"] {
        let e = c.cmd(&["LOCK.DEBUG", sub]).err();
        assert!(e.starts_with("ERR unknown command"), "{e:?}");
    }
    assert_eq!(lock_stat(&mut c, "panics"), 0);
    let info = c.cmd(&["COMMAND", "INFO", "lock.debug"]);
    assert_eq!(info, Resp::Array(vec![Resp::Nil]), "{info:?}");
    // `debug-commands no` is the same as leaving it out.
    let server = ServerBuilder::new()
        .module_args(&["debug-commands", "no"])
        .start();
    let mut c = RawConn::connect(server.port);
    assert!(c
        .cmd(&["LOCK.DEBUG", "PANIC"])
        .err()
        .starts_with("ERR unknown command"));
    assert_eq!(lock_stat(&mut c, "panics"), 0);
}
