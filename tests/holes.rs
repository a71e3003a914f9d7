//! Regression tests for issue 18 ("holes a hostile review found"), rows 1-10 and the
//! loader repair of item 3, and for issue 19's `BLOCK 0` hang. Written first, against
//! the decided behaviour (see docs/commands.md once the fixes land): on 00e48ee most of
//! them fail, each where its row says.

mod regress;

use regress::*;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Row 1: two waiters with the same TOKEN.

type Durable = Option<Vec<(String, Resp)>>;

/// Records a failure unless `got` is the state `want` ([`paths::same_state`]).
fn same(ck: &mut Checks, want: &Durable, got: &Durable, what: &str) {
    let r = paths::same_state(want, got);
    ck.check(
        r.is_ok(),
        format!("{what}: {}", r.err().unwrap_or_default()),
    );
}

/// The holders the writer side takes before the same-token waiters queue, and the
/// option the waiters send.
#[derive(Clone, Copy, Debug)]
enum Row1 {
    Shared,
    Limit3,
    Exclusive,
}

fn same_token_waiters(kind: Row1) {
    let mut p = primary().start();
    let r1 = replica_of(&p, ServerBuilder::new());
    let mut c = conn(&p);
    let n_ord = 20;
    let ordinary = ordinary_keys(&mut c, n_ord);
    let writer = tok("row1-writer");
    let t = tok("row1-same");
    let (wait_opts, others_left): (Vec<&str>, i64) = match kind {
        Row1::Shared | Row1::Exclusive => {
            granted(&c.cmd(&acq("lock:k", &["PX", "60000", "TOKEN", &writer])));
            let mode = if matches!(kind, Row1::Shared) {
                vec!["SHARED"]
            } else {
                vec![]
            };
            (mode, 0)
        }
        Row1::Limit3 => {
            // All three permits taken; two are given back at once below, the third
            // holder stays.
            for w in ["row1-w1", "row1-w2", "row1-w3"] {
                let tw = tok(w);
                granted(&c.cmd(&acq("lock:k", &["LIMIT", "3", "PX", "60000", "TOKEN", &tw])));
            }
            (vec!["LIMIT", "3"], 1)
        }
    };
    let mut args = wait_opts.clone();
    args.extend(["PX", "60000", "TOKEN", &t, "BLOCK", "5000"]);
    let mut a = Pending::send(p.port, &acq("lock:k", &args));
    wait_waiters(&mut c, "lock:k", 1);
    let mut b = Pending::send(p.port, &acq("lock:k", &args));
    wait_waiters(&mut c, "lock:k", 2);
    match kind {
        Row1::Limit3 => {
            let pipe: Vec<Vec<String>> = ["row1-w1", "row1-w2"]
                .iter()
                .map(|w| vec!["LOCK.RELEASE".into(), "lock:k".into(), tok(w)])
                .collect();
            let r = c.pipeline(&pipe).unwrap();
            assert_eq!(r, vec![Resp::Int(1), Resp::Int(1)]);
        }
        _ => assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:k", &writer]), Resp::Int(1)),
    }
    let mut ck = Checks::new();
    let ra = a.reply_within(Duration::from_secs(3));
    let rb = b.reply_within(Duration::from_secs(3));
    let ga = ra.as_ref().ok().and_then(grant);
    let gb = rb.as_ref().ok().and_then(grant);
    ck.check(ga.is_some(), format!("first same-token waiter: {ra:?}"));
    ck.check(gb.is_some(), format!("second same-token waiter: {rb:?}"));
    if let (Some(ga), Some(gb)) = (&ga, &gb) {
        ck.eq(&ga.0, &t.as_bytes().to_vec(), "first grant's token");
        ck.eq(ga, gb, "both waiters get the same [token, fence]");
    }
    let i = info(&mut c, "lock:k");
    ck.eq(
        i.get("holders").and_then(|h| h.as_int()),
        Some(1 + others_left),
        "LOCK.INFO holders",
    );
    // A replica attached during the grant holds the same holders and fences.
    caught_up(&p, &r1);
    let want = paths::durable_info(&mut c, "lock:k");
    let as_before = |ck: &mut Checks, c: &mut RawConn, what: &str| {
        same(ck, &want, &paths::durable_info(c, "lock:k"), what)
    };
    let mut rc1 = conn(&r1);
    as_before(&mut ck, &mut rc1, "replica attached during the grant");
    // DEBUG RELOAD keeps every key and the lock.
    let keys = ordinary + 1;
    ck.eq(dbsize(&mut c), keys, "DBSIZE before DEBUG RELOAD");
    let reload = debug_reload(&mut c);
    ck.eq(reload.clone(), Resp::Simple("OK".into()), "DEBUG RELOAD");
    ck.eq(dbsize(&mut c), keys, "DBSIZE after DEBUG RELOAD");
    ck.check(
        ordinary_keys_intact(&mut c, n_ord),
        "ordinary keys after DEBUG RELOAD",
    );
    as_before(&mut ck, &mut c, "the lock after DEBUG RELOAD");
    // SAVE + restart loads it.
    drop(c);
    let restarted = save_and_restart(&mut p);
    ck.check(
        restarted.is_ok(),
        format!("SAVE + restart: {:?}", restarted.as_ref().err()),
    );
    if restarted.is_ok() {
        let mut c = conn(&p);
        ck.eq(dbsize(&mut c), keys, "DBSIZE after restart");
        as_before(&mut ck, &mut c, "the lock after restart");
        // A replica that full-syncs afterwards loads it.
        match ServerBuilder::new().try_start_replica_of(&p, SETTLE) {
            Ok(r2) => {
                let mut rc2 = conn(&r2);
                as_before(&mut ck, &mut rc2, "a replica's full sync");
                ck.eq(dbsize(&mut rc2), keys, "DBSIZE on the new replica");
            }
            Err(e) => {
                ck.check(false, format!("a new replica's full sync failed: {e}"));
            }
        }
        // The token releases once.
        let r1st = c.cmd(&["LOCK.RELEASE", "lock:k", &t]);
        let r2nd = c.cmd(&["LOCK.RELEASE", "lock:k", &t]);
        ck.eq(
            (r1st, r2nd),
            (Resp::Int(1), Resp::Int(0)),
            "RELEASE with the token twice",
        );
    }
    ck.finish();
}

redis_lock_testkit::cases!(same_token_waiters:
    row1_same_token_shared_waiters_share_one_grant => Row1::Shared,
    row1_same_token_limit_waiters_share_one_grant => Row1::Limit3,
    row1_same_token_exclusive_waiters_share_one_grant => Row1::Exclusive,
);

// ---------------------------------------------------------------------------------------
// Item 3: the loader repairs what it can read but does not like.

/// (kind, the holders the repaired value keeps; None: the key is gone).
const INJECT_KINDS: [(&str, Option<i64>); 6] = [
    ("dup-digest", Some(1)),
    ("dup-fence", Some(1)),
    ("exclusive-many", Some(1)),
    ("fence-zero", None),
    ("too-many", Some(2)),
    ("empty-owner", None),
];

/// What the loaded copy of an injected value must look like on `c`.
fn check_repaired(
    ck: &mut Checks,
    c: &mut RawConn,
    key: &str,
    kind: &str,
    keep: Option<i64>,
    how: &str,
) {
    let i = info(c, key);
    let holders = i.get("holders").and_then(|h| h.as_int());
    match (kind, keep) {
        ("fence-zero", _) => {
            // The holder with fence 0 is dropped; if none is left the key is gone.
            let fences = holder_fences(&i);
            ck.check(
                !fences.contains(&0),
                format!("{how} {kind}: a holder with fence 0 is kept: {i:?}"),
            );
            // A primary removes what is left empty; a replica keeps the key (no live
            // holder, LOCK.INFO nil) until its primary removes it, as it mirrors the
            // primary's keys.
            if i == Resp::Nil && !how.contains("full sync") {
                let gone = wait_until(Duration::from_secs(5), || {
                    c.cmd(&["EXISTS", key]).int() == 0
                });
                ck.check(gone, format!("{how} {kind}: empty key kept"));
            }
        }
        ("empty-owner", _) => {
            let owners: Vec<Option<Vec<u8>>> = i
                .get("holder-list")
                .map(|l| {
                    l.items()
                        .iter()
                        .map(|h| {
                            h.get("owner")
                                .and_then(|o| o.as_bytes().map(<[u8]>::to_vec))
                        })
                        .collect()
                })
                .unwrap_or_default();
            ck.check(
                !owners.contains(&Some(Vec::new())),
                format!("{how} {kind}: an empty owner label is kept: {i:?}"),
            );
        }
        (_, Some(n)) => {
            ck.eq(holders, Some(n), &format!("{how} {kind}: holders"));
        }
        (_, None) => {}
    }
}

#[test]
fn item3_loader_repairs_injected_values_and_loses_no_other_key() {
    let mut ck = Checks::new();
    for (kind, keep) in INJECT_KINDS {
        let mut p = debug_server().start();
        let mut c = conn(&p);
        let n_ord = 10;
        let ordinary = ordinary_keys(&mut c, n_ord);
        let key = format!("lock:inj-{kind}");
        let r = c.cmd(&["LOCK.DEBUG", "INJECT", &key, kind]);
        if !ck.check(
            !r.is_error(),
            format!("LOCK.DEBUG INJECT {key} {kind}: {r:?}"),
        ) {
            continue;
        }
        // DEBUG RELOAD.
        let reload = debug_reload(&mut c);
        ck.eq(
            reload,
            Resp::Simple("OK".into()),
            &format!("{kind}: DEBUG RELOAD"),
        );
        ck.check(
            ordinary_keys_intact(&mut c, n_ord),
            format!("{kind}: ordinary keys after DEBUG RELOAD"),
        );
        check_repaired(&mut ck, &mut c, &key, kind, keep, "DEBUG RELOAD");
        let repaired =
            redis_lock_testkit::info_field(&c.cmd(&["INFO", "lock"]).text(), "lock_repaired")
                .and_then(|v| v.parse::<i64>().ok());
        ck.check(
            repaired.is_some_and(|n| n > 0),
            format!("{kind}: INFO lock_repaired {repaired:?}"),
        );
        ck.check(
            p.log().contains(&key),
            format!("{kind}: no log line names {key}"),
        );
        // SAVE + restart (inject again: the reload repaired the first one).
        let _ = c.cmd(&["DEL", &key]);
        let r = c.cmd(&["LOCK.DEBUG", "INJECT", &key, kind]);
        ck.check(!r.is_error(), format!("second INJECT {kind}: {r:?}"));
        drop(c);
        match save_and_restart(&mut p) {
            Ok(()) => {
                let mut c = conn(&p);
                ck.check(
                    ordinary_keys_intact(&mut c, n_ord),
                    format!("{kind}: ordinary keys after restart"),
                );
                check_repaired(&mut ck, &mut c, &key, kind, keep, "restart");
            }
            Err(e) => {
                ck.check(false, format!("{kind}: restart failed: {e}"));
                continue;
            }
        }
        // A replica's full sync of a freshly injected value.
        let mut c = conn(&p);
        let _ = c.cmd(&["DEL", &key]);
        let r = c.cmd(&["LOCK.DEBUG", "INJECT", &key, kind]);
        ck.check(!r.is_error(), format!("third INJECT {kind}: {r:?}"));
        let total = dbsize(&mut c);
        match ServerBuilder::new().try_start_replica_of(&p, SETTLE) {
            Ok(rep) => {
                let mut rc = conn(&rep);
                ck.check(
                    ordinary_keys_intact(&mut rc, n_ord),
                    format!("{kind}: ordinary keys on the replica"),
                );
                check_repaired(&mut ck, &mut rc, &key, kind, keep, "full sync");
                let rsize = dbsize(&mut rc);
                ck.check(
                    rsize == total || (keep.is_none() && rsize == ordinary),
                    format!("{kind}: replica DBSIZE {rsize}, primary {total}"),
                );
            }
            Err(e) => {
                ck.check(false, format!("{kind}: full sync failed: {e}"));
            }
        }
    }
    ck.finish();
}

#[test]
fn item3_restore_refuses_a_dump_of_an_injected_value() {
    let s = debug_server().start();
    let mut c = conn(&s);
    ordinary_keys(&mut c, 3);
    let r = c.cmd(&["LOCK.DEBUG", "INJECT", "lock:inj", "dup-digest"]);
    assert!(
        !r.is_error(),
        "LOCK.DEBUG INJECT lock:inj dup-digest: {r:?}"
    );
    let before = dbsize(&mut c);
    let payload = c.cmd(&["DUMP", "lock:inj"]).bytes();
    let r = c.cmd(&[b"RESTORE".as_slice(), b"lock:copy", b"0", &payload]);
    assert!(
        r.is_error(),
        "RESTORE of an injected value was accepted: {r:?}"
    );
    assert_eq!(c.cmd(&["EXISTS", "lock:copy"]).int(), 0);
    assert_eq!(dbsize(&mut c), before, "RESTORE changed the keyspace");
}

// ---------------------------------------------------------------------------------------
// Row 2: MIGRATE by every way it can run.

#[test]
fn row2_migrate_by_every_way_moves_the_lock_and_tells_the_waiter() {
    let s1 = paths::with_helper_module(ServerBuilder::new()).start();
    let s2 = ServerBuilder::new().start();
    let mut c1 = conn(&s1);
    let mut c2 = conn(&s2);
    paths::load_function_library(&mut c1);
    let port2 = s2.port.to_string();
    let mut ck = Checks::new();
    for way in ["plain", "multi", "eval", "fcall", "module-call"] {
        let key = format!("lock:mig-{way}");
        let t = tok(&format!("mig-{way}"));
        let (_, fence) = granted(&c1.cmd(&acq(&key, &["PX", "60000", "TOKEN", &t])));
        let mut waiter = Pending::send(s1.port, &acq(&key, &["BLOCK", "4000"]));
        wait_waiters(&mut c1, &key, 1);
        let migrate = [
            "MIGRATE",
            "127.0.0.1",
            port2.as_str(),
            key.as_str(),
            "0",
            "5000",
        ];
        let r = match way {
            "plain" => paths::send(&mut c1, paths::Path::Direct, &migrate),
            "multi" => paths::send(&mut c1, paths::Path::Multi, &migrate),
            "eval" => paths::send(&mut c1, paths::Path::Eval, &migrate),
            "fcall" => paths::send(&mut c1, paths::Path::Fcall, &migrate),
            _ => paths::send(&mut c1, paths::Path::ModuleCall, &migrate),
        };
        ck.eq(r, Resp::Simple("OK".into()), &format!("{way}: MIGRATE"));
        let reply = waiter.reply_within(Duration::from_secs(6));
        let moved = matches!(&reply, Ok(Resp::Error(e)) if e.starts_with("LOCKMOVED"));
        ck.check(
            moved,
            format!("{way}: the waiter got {reply:?}, not LOCKMOVED"),
        );
        ck.eq(
            c1.cmd(&["EXISTS", &key]).int(),
            0,
            &format!("{way}: lock left on S1"),
        );
        ck.eq(
            info(&mut c2, &key).get("fence").and_then(|f| f.as_int()),
            Some(fence),
            &format!("{way}: the lock's fence on S2"),
        );
    }
    ck.finish();
}

// ---------------------------------------------------------------------------------------
// Row 3: a writable replica refuses lock writes.

#[test]
fn row3_a_writable_replica_refuses_lock_writes() {
    let p = paths::with_helper_module(primary()).start();
    let r = replica_of(
        &p,
        paths::with_helper_module(ServerBuilder::new()).arg("replica-read-only", "no"),
    );
    let mut pc = conn(&p);
    let mut rc = conn(&r);
    // The function library reaches the replica through the stream.
    paths::load_function_library(&mut pc);
    let t = tok("row3-held");
    let (_, fence) = granted(&pc.cmd(&acq("lock:held", &["PX", "60000", "TOKEN", &t])));
    caught_up(&p, &r);
    let held = paths::durable_info(&mut rc, "lock:held");
    assert!(held.is_some(), "the grant did not reach the replica");
    let mut ck = Checks::new();
    let tn = tok("row3-new");
    let cmds: Vec<(&str, Vec<&str>)> = vec![
        (
            "acquire",
            vec!["LOCK.ACQUIRE", "lock:new", "PX", "60000", "TOKEN", &tn],
        ),
        ("release", vec!["LOCK.RELEASE", "lock:held", &t]),
        (
            "extend",
            vec!["LOCK.EXTEND", "lock:held", &t, "PX", "90000"],
        ),
        ("forcerelease", vec!["LOCK.FORCERELEASE", "lock:held"]),
    ];
    for (name, argv) in &cmds {
        for path in paths::Path::ALL {
            let reply = paths::send(&mut rc, path, argv);
            let ok = matches!(&reply, Resp::Error(e) if e.starts_with("READONLY"));
            ck.check(
                ok,
                format!("{name} via {} on the replica: {reply:?}", path.name()),
            );
        }
    }
    ck.eq(
        rc.cmd(&["EXISTS", "lock:new"]).int(),
        0,
        "the replica created lock:new",
    );
    let there = paths::durable_info(&mut rc, "lock:held");
    if let Err(e) = paths::same_state(&held, &there) {
        ck.check(false, format!("lock:held on the replica: {e}"));
    }
    // LOCK.INFO works on it, and a grant on the primary then shows there.
    ck.eq(
        info_opt(&mut rc, "lock:held", "fence"),
        Some(fence),
        "LOCK.INFO on the replica",
    );
    let (_, f2) = granted(&pc.cmd(&acq("lock:new", &["PX", "60000", "TOKEN", &tn])));
    caught_up(&p, &r);
    ck.eq(
        info_opt(&mut rc, "lock:new", "fence"),
        Some(f2),
        "the primary's grant on the replica",
    );
    ck.finish();
}

// ---------------------------------------------------------------------------------------
// Row 4: RESTORE of a fence past 2^53.

const TWO_53: u64 = 1 << 53;

#[test]
fn row4_restore_refuses_a_fence_past_2_pow_53_in_both_encodings() {
    let src = ServerBuilder::new().start();
    let mut sc = conn(&src);
    let t = tok("row4");
    take(&mut sc, "lock:src", &t, &["OWNER", "own"]);
    let real = paths::ModuleDump::parse(&sc.cmd(&["DUMP", "lock:src"]).bytes()).unwrap();
    assert!(real.encver() >= 2, "the current encoding");
    // Encodings 2 and 3: [mode, holders, digest, fence, lease, acquired-at, client-id,
    // client-addr, owner-flag, owner] (the lease is absolute in 2, the time left in 3).
    let mut v3 = real.clone();
    v3.ops[3] = paths::Op::Uint(TWO_53 + 1);
    let mut v2 = real.with_encver(2);
    // Encoding 3 ends each holder with its lock-delay and the value with the delay left.
    v2.ops.truncate(10);
    v2.ops[3] = paths::Op::Uint(TWO_53 + 1);
    let at = paths::Op::Uint((redis_lock_testkit::unix_ms() + 60_000) as u64);
    v2.ops[4] = at.clone();
    // Encoding 1 (release 0.1): [token, fence, expires-at, acquired-at, owner-flag,
    // owner, client-id, client-addr].
    let v1 = paths::ModuleDump {
        ops: vec![
            paths::Op::Str(t.as_bytes().to_vec()),
            paths::Op::Uint(TWO_53 + 1),
            at,
            real.ops[5].clone(),
            paths::Op::Uint(1),
            paths::Op::Str(b"own".to_vec()),
            real.ops[6].clone(),
            real.ops[7].clone(),
        ],
        ..real.with_encver(1)
    };
    let mut ck = Checks::new();
    for (name, payload) in [
        ("encoding 3", v3.encode()),
        ("encoding 2", v2.encode()),
        ("encoding 1", v1.encode()),
    ] {
        let s = ServerBuilder::new().start();
        let mut c = conn(&s);
        let r = c.cmd(&[b"RESTORE".as_slice(), b"lock:hostile", b"0", &payload]);
        ck.check(
            r.is_error(),
            format!("{name}: RESTORE accepted a fence of 2^53+1: {r:?}"),
        );
        let last = redis_lock_testkit::lock::lock_stat(&mut c, "last_fence");
        ck.check(
            (last as u64) < TWO_53,
            format!("{name}: lock_last_fence {last} >= 2^53"),
        );
        let (_, next) = granted(&c.cmd(&acq("lock:next", &[])));
        ck.check(
            (next as u64) < TWO_53,
            format!("{name}: the next fence {next} >= 2^53"),
        );
    }
    ck.finish();
}

// ---------------------------------------------------------------------------------------
// Row 5: tokens never in SLOWLOG or MONITOR.

/// Valkey 8.1+ keeps a command log (COMMANDLOG: slow commands, large requests and
/// replies): the token is redacted there too. Redis has none (the command is unknown).
#[test]
fn row5_tokens_are_redacted_from_the_command_log() {
    let valkey = server_flavor().is_valkey();
    let b = ServerBuilder::new();
    let b = if valkey {
        b.arg("commandlog-execution-slower-than", "0")
            .arg("commandlog-request-larger-than", "0")
    } else {
        b
    };
    let s = b.start();
    let mut c = conn(&s);
    if !valkey {
        let r = c.cmd(&["COMMANDLOG", "GET", "10", "slow"]);
        assert!(r.is_error(), "COMMANDLOG on Redis: {r:?}");
        return;
    }
    let t = "row5-commandlog-token-0123456789";
    granted(&c.cmd(&acq("lock:cl", &["PX", "60000", "TOKEN", t])));
    let r = c.cmd(&["LOCK.EXTEND", "lock:cl", t, "PX", "60000"]);
    assert_eq!(r, Resp::Int(1));
    assert_eq!(c.cmd(&["LOCK.RELEASE", "lock:cl", t]), Resp::Int(1));
    for kind in ["slow", "large-request", "large-reply"] {
        let log = c.cmd(&["COMMANDLOG", "GET", "100", kind]);
        let flat: Vec<String> = log
            .items()
            .iter()
            .flat_map(|e| e.items())
            .flat_map(|f| f.as_items().map(|a| a.to_vec()).unwrap_or_default())
            .filter_map(|a| a.as_text())
            .collect();
        assert!(
            flat.iter().all(|a| !a.contains(t)),
            "COMMANDLOG {kind} shows the token: {flat:?}"
        );
        if kind != "large-reply" {
            assert!(
                flat.iter().any(|a| a.eq_ignore_ascii_case("lock.acquire")),
                "COMMANDLOG {kind} did not log LOCK.ACQUIRE: {flat:?}"
            );
        }
    }
}

#[test]
fn row5_tokens_are_redacted_from_slowlog_and_monitor() {
    let (s, mut mon, mut ck) = start(ServerBuilder::new().arg("slowlog-log-slower-than", "0"));
    assert_eq!(mon.cmd(&["MONITOR"]), Resp::Simple("OK".into()));
    let mut c = conn(&s);
    assert_eq!(c.cmd(&["SLOWLOG", "RESET"]), Resp::Simple("OK".into()));
    let t = "row5-secret-token-0123456789";
    let cmds = |key: &str| -> Vec<Vec<String>> {
        vec![
            vec![
                "LOCK.ACQUIRE".into(),
                key.into(),
                "PX".into(),
                "60000".into(),
                "TOKEN".into(),
                t.into(),
            ],
            vec![
                "LOCK.EXTEND".into(),
                key.into(),
                t.into(),
                "PX".into(),
                "60000".into(),
            ],
            vec!["LOCK.RELEASE".into(), key.into(), t.into()],
        ]
    };
    // Direct.
    for cmd in cmds("lock:direct") {
        assert!(!c.cmd(&cmd).is_error());
    }
    // Pipelined.
    let replies = c.pipeline(&cmds("lock:piped")).unwrap();
    assert!(replies.iter().all(|r| !r.is_error()), "{replies:?}");
    // Inside MULTI.
    let mut multi = vec![vec!["MULTI".to_string()]];
    multi.extend(cmds("lock:multi"));
    multi.push(vec!["EXEC".into()]);
    let replies = c.pipeline(&multi).unwrap();
    assert!(
        matches!(replies.last(), Some(Resp::Array(a)) if a.len() == 3),
        "{replies:?}"
    );
    // Refused commands keep their token hidden too (a parse error once returned before
    // the redaction), while the lock they name is held.
    assert!(!c
        .cmd(&["LOCK.ACQUIRE", "lock:held", "PX", "60000", "TOKEN", t])
        .is_error());
    for refused in [
        &["LOCK.ACQUIRE", "lock:held", "TOKEN", t, "PX", "abc"][..],
        &["LOCK.ACQUIRE", "lock:held", "PX", "0", "TOKEN", t],
        &["LOCK.ACQUIRE", "lock:held", "TOKEN", t, "BOGUS"],
        &["LOCK.ACQUIRE", "lock:held", "TOKEN", t, "TOKEN", t],
        &["LOCK.EXTEND", "lock:held", t, "PX", "abc"],
        &["LOCK.EXTEND", "lock:held", t, "BOGUS"],
        &["LOCK.SYNC", "lock:held", t, "5"],
    ] {
        let r = c.cmd(refused);
        assert!(r.is_error(), "{refused:?} answered {r:?}");
    }
    assert_eq!(c.cmd(&["PING"]), Resp::Simple("PONG".into()));
    let slowlog = c.cmd(&["SLOWLOG", "GET", "100"]);
    let mut leaked = Vec::new();
    for entry in slowlog.items() {
        let items = entry.items();
        if let Some(args) = items.get(3) {
            let argv: Vec<String> = args
                .items()
                .iter()
                .map(|a| String::from_utf8_lossy(&a.bytes()).into_owned())
                .collect();
            if argv.iter().any(|a| a.contains(t)) {
                leaked.push(argv.join(" "));
            }
        }
    }
    ck.check(
        leaked.is_empty(),
        format!("SLOWLOG shows the token in: {leaked:?}"),
    );
    // MONITOR: read what it got (up to the PING).
    let lines = monitor_lines(&mut mon, "\"PING\"", Duration::from_secs(2));
    ck.check(
        lines
            .iter()
            .any(|l| l.contains("LOCK.ACQUIRE") || l.contains("lock.acquire")),
        format!("MONITOR saw no LOCK.ACQUIRE: {lines:?}"),
    );
    let shown: Vec<&String> = lines.iter().filter(|l| l.contains(t)).collect();
    ck.check(
        shown.is_empty(),
        format!("MONITOR shows the token in: {shown:?}"),
    );
    ck.finish();
}

// ---------------------------------------------------------------------------------------
// Row 6: a command that changes nothing signals nothing.

/// The no-op commands of row 6 against a `lock:k` held with token `held`.
fn no_ops() -> Vec<Vec<String>> {
    let wrong = tok("row6-wrong");
    vec![
        vec!["LOCK.RELEASE".into(), "lock:k".into(), wrong.clone()],
        vec![
            "LOCK.EXTEND".into(),
            "lock:k".into(),
            wrong.clone(),
            "PX".into(),
            "60000".into(),
        ],
        vec![
            "LOCK.ACQUIRE".into(),
            "lock:k".into(),
            "TOKEN".into(),
            wrong.clone(),
        ],
        // A guard whose check fails (nothing runs).
        vec![
            "LOCK.IFHELD".into(),
            "lock:k".into(),
            wrong,
            "SET".into(),
            "row6:data".into(),
            "v".into(),
        ],
        vec![
            "LOCK.IFFENCE".into(),
            "lock:k".into(),
            "1".into(),
            "SET".into(),
            "row6:data".into(),
            "v".into(),
        ],
    ]
}

/// A server started from `b`, a connection to it and the token that holds `lock:k` there.
fn row6_held(b: ServerBuilder) -> (Server, RawConn, String) {
    let (s, mut c, _) = start(b);
    let held = tok("row6-held");
    take(&mut c, "lock:k", &held, &[]);
    (s, c, held)
}

/// What a no-op answers: 0, nil, or NOTHELD (a guard whose check failed).
fn is_no_op_reply(r: &Resp) -> bool {
    match r {
        Resp::Int(0) | Resp::Nil => true,
        Resp::Error(e) => e.starts_with("NOTHELD "),
        _ => false,
    }
}

#[test]
fn row6_a_no_op_does_not_abort_watch_but_a_real_change_does() {
    let (s, mut b, held) = row6_held(ServerBuilder::new());
    let mut a = conn(&s);
    let mut ck = Checks::new();
    let exec_after = |a: &mut RawConn, b: &mut RawConn, cmd: &[String]| -> (Resp, Resp) {
        assert_eq!(a.cmd(&["WATCH", "lock:k"]), Resp::Simple("OK".into()));
        let r = b.cmd(cmd);
        let replies = a
            .pipeline(&[vec!["MULTI"], vec!["PING"], vec!["EXEC"]])
            .unwrap();
        (r, replies[2].clone())
    };
    for cmd in no_ops() {
        let (r, exec) = exec_after(&mut a, &mut b, &cmd);
        ck.check(
            is_no_op_reply(&r),
            format!("{cmd:?} should be a no-op: {r:?}"),
        );
        ck.eq(
            exec,
            Resp::Array(vec![Resp::Simple("PONG".into())]),
            &format!("EXEC after the no-op {}", cmd[0]),
        );
    }
    ck.eq(
        b.cmd(&["EXISTS", "row6:data"]),
        Resp::Int(0),
        "a refused guard ran its command",
    );
    // A real change aborts it: extend, release, acquire.
    let real: Vec<Vec<String>> = vec![
        vec![
            "LOCK.EXTEND".into(),
            "lock:k".into(),
            held.clone(),
            "PX".into(),
            "60000".into(),
        ],
        vec!["LOCK.RELEASE".into(), "lock:k".into(), held.clone()],
        vec![
            "LOCK.ACQUIRE".into(),
            "lock:k".into(),
            "PX".into(),
            "60000".into(),
            "TOKEN".into(),
            held.clone(),
        ],
    ];
    for cmd in real {
        let (r, exec) = exec_after(&mut a, &mut b, &cmd);
        ck.check(
            !r.is_error() && r != Resp::Int(0) && r != Resp::Nil,
            format!("{cmd:?} should change the lock: {r:?}"),
        );
        ck.eq(
            exec,
            Resp::Nil,
            &format!("EXEC after the real change {}", cmd[0]),
        );
    }
    ck.finish();
}

#[test]
fn row6_a_no_op_sends_no_keyspace_event_and_no_invalidation() {
    let (s, mut b, held) = row6_held(ServerBuilder::new().arg("notify-keyspace-events", "KEgx"));
    // A keyspace subscriber.
    let mut sub = conn(&s);
    let r = sub.cmd(&["SUBSCRIBE", "__keyspace@0__:lock:k"]);
    assert!(matches!(r, Resp::Array(_)), "{r:?}");
    // A RESP3 tracking client, and a RESP2 one redirecting to an invalidation channel.
    let mut t3 = RawConn::connect_resp3(s.port);
    assert_eq!(
        t3.cmd(&["CLIENT", "TRACKING", "on"]),
        Resp::Simple("OK".into())
    );
    let mut inval = conn(&s);
    let inval_id = inval.cmd(&["CLIENT", "ID"]).int().to_string();
    let r = inval.cmd(&["SUBSCRIBE", "__redis__:invalidate"]);
    assert!(matches!(r, Resp::Array(_)), "{r:?}");
    let mut t2 = conn(&s);
    assert_eq!(
        t2.cmd(&["CLIENT", "TRACKING", "on", "REDIRECT", &inval_id]),
        Resp::Simple("OK".into())
    );
    let track = |t3: &mut RawConn, t2: &mut RawConn| {
        assert_ne!(info(t3, "lock:k"), Resp::Nil);
        assert_ne!(info(t2, "lock:k"), Resp::Nil);
    };
    track(&mut t3, &mut t2);
    let quiet = Duration::from_millis(300);
    let mut ck = Checks::new();
    for cmd in no_ops() {
        let r = b.cmd(&cmd);
        ck.check(is_no_op_reply(&r), format!("{cmd:?}: {r:?}"));
        sub.set_read_timeout(Some(quiet));
        let ev = sub.read();
        ck.check(
            ev.is_err(),
            format!("keyspace event for the no-op {}: {ev:?}", cmd[0]),
        );
        let first = t3.cmd(&["PING"]);
        ck.eq(
            first.clone(),
            Resp::Simple("PONG".into()),
            &format!("RESP3 tracking after the no-op {}", cmd[0]),
        );
        if matches!(first, Resp::Push(_)) {
            let _ = t3.read(); // the PONG
            track(&mut t3, &mut t2);
        }
        inval.set_read_timeout(Some(quiet));
        let m = inval.read();
        ck.check(
            m.is_err(),
            format!("REDIRECT invalidation for the no-op {}: {m:?}", cmd[0]),
        );
        if m.is_ok() {
            track(&mut t3, &mut t2);
        }
    }
    // A real change: one event, one invalidation each.
    let r = b.cmd(&["LOCK.EXTEND", "lock:k", &held, "PX", "60000"]);
    ck.eq(r, Resp::Int(1), "the real extend");
    sub.set_read_timeout(Some(SETTLE));
    let ev = sub.read();
    ck.check(
        matches!(&ev, Ok(Resp::Array(a)) if a.last().and_then(|m| m.as_text()).as_deref() == Some("lock.extend")),
        format!("keyspace event for the real extend: {ev:?}"),
    );
    let first = t3.cmd(&["PING"]);
    ck.check(
        matches!(first, Resp::Push(_)),
        format!("RESP3 invalidation for the real extend: {first:?}"),
    );
    inval.set_read_timeout(Some(SETTLE));
    let m = inval.read();
    ck.check(
        m.is_ok(),
        format!("REDIRECT invalidation for the real extend: {m:?}"),
    );
    ck.finish();
}

// ---------------------------------------------------------------------------------------
// Row 7: ACL categories.

fn acl_user(c: &mut RawConn, rules: &[&str]) -> RawConn {
    let mut argv = vec![
        "ACL",
        "SETUSER",
        "locker",
        "on",
        ">locker-password-1",
        "~*",
        "&*",
    ];
    argv.extend_from_slice(rules);
    assert_eq!(
        c.cmd(&argv),
        Resp::Simple("OK".into()),
        "ACL SETUSER {rules:?}"
    );
    c.clone_for_user()
}

trait AsUser {
    fn clone_for_user(&mut self) -> RawConn;
}

impl AsUser for RawConn {
    fn clone_for_user(&mut self) -> RawConn {
        let port = self.cmd(&["CONFIG", "GET", "port"]).items()[1].text();
        let mut u = RawConn::connect(port.parse().unwrap());
        assert_eq!(
            u.cmd(&["AUTH", "locker", "locker-password-1"]),
            Resp::Simple("OK".into())
        );
        u
    }
}

/// `u`'s `LOCK.FORCERELEASE` of a lock `admin` holds is refused with NOPERM.
fn forcerelease_refused(ck: &mut Checks, admin: &mut RawConn, u: &mut RawConn, who: &str) {
    granted(&admin.cmd(&acq("lock:held", &["PX", "60000"])));
    let r = u.cmd(&["LOCK.FORCERELEASE", "lock:held"]);
    ck.check(
        noperm(&r),
        format!("{who}: LOCK.FORCERELEASE answered {r:?}"),
    );
}

fn noperm(r: &Resp) -> bool {
    matches!(r, Resp::Error(e) if e.starts_with("NOPERM"))
}

/// The user's lock commands that must work: acquire, extend, info, release.
fn lock_commands_work(ck: &mut Checks, u: &mut RawConn, who: &str) {
    let t = tok("row7");
    let r = u.cmd(&acq("lock:acl", &["PX", "60000", "TOKEN", &t]));
    ck.check(
        matches!(r, Resp::Array(_)),
        format!("{who}: LOCK.ACQUIRE: {r:?}"),
    );
    let r = u.cmd(&["LOCK.EXTEND", "lock:acl", &t, "PX", "60000"]);
    ck.eq(r, Resp::Int(1), &format!("{who}: LOCK.EXTEND"));
    let r = u.cmd(&["LOCK.INFO", "lock:acl"]);
    ck.check(r.get("fence").is_some(), format!("{who}: LOCK.INFO: {r:?}"));
    let r = u.cmd(&["LOCK.RELEASE", "lock:acl", &t]);
    ck.eq(r, Resp::Int(1), &format!("{who}: LOCK.RELEASE"));
}

#[test]
fn row7_acl_categories_keep_forcerelease_from_non_dangerous_users() {
    let s = ServerBuilder::new()
        .module_args(&["debug-commands", "yes"])
        .start();
    let mut admin = conn(&s);
    let mut ck = Checks::new();
    if has_module_acl_categories() {
        let mut u = acl_user(&mut admin, &["+@all", "-@dangerous"]);
        forcerelease_refused(&mut ck, &mut admin, &mut u, "+@all -@dangerous");
        let r = u.cmd(&["LOCK.DEBUG", "FENCE"]);
        ck.check(
            noperm(&r),
            format!("+@all -@dangerous: LOCK.DEBUG answered {r:?}"),
        );
        ck.check(
            admin.cmd(&["EXISTS", "lock:held"]).int() == 1,
            "lock:held was force-released",
        );
        lock_commands_work(&mut ck, &mut u, "+@all -@dangerous");
        let names = |r: Resp| -> Vec<String> {
            r.as_items()
                .unwrap_or_default()
                .iter()
                .filter_map(|x| x.as_text())
                .map(|s| s.to_lowercase())
                .collect()
        };
        let cats = names(admin.cmd(&["ACL", "CAT"]));
        ck.check(
            cats.contains(&"lock".to_string()),
            format!("no `lock` category in ACL CAT: {cats:?}"),
        );
        let lock = names(admin.cmd(&["ACL", "CAT", "lock"]));
        for cmd in [
            "lock.acquire",
            "lock.release",
            "lock.extend",
            "lock.info",
            "lock.forcerelease",
        ] {
            ck.check(
                lock.contains(&cmd.to_string()),
                format!("ACL CAT lock lacks {cmd}: {lock:?}"),
            );
        }
        for (cat, cmd) in [
            ("write", "lock.acquire"),
            ("blocking", "lock.acquire"),
            ("read", "lock.info"),
            ("dangerous", "lock.forcerelease"),
            ("dangerous", "lock.debug"),
        ] {
            let list = names(admin.cmd(&["ACL", "CAT", cat]));
            ck.check(
                list.contains(&cmd.to_string()),
                format!("{cmd} is not in @{cat}"),
            );
        }
    } else {
        // Redis 7.0: no module ACL categories; the module loads and by-name grants work.
        let mut u = acl_user(&mut admin, &["+@all", "-lock.forcerelease"]);
        forcerelease_refused(&mut ck, &mut admin, &mut u, "-lock.forcerelease");
        lock_commands_work(&mut ck, &mut u, "+@all -lock.forcerelease");
    }
    ck.finish();
}

// ---------------------------------------------------------------------------------------
// Row 8: errors that name what is wrong.

#[test]
fn row8_errors_name_the_option_that_is_wrong() {
    let (_s, mut c, mut ck) = start(ServerBuilder::new());
    let e = error_text(
        &c.cmd(&acq("lock:x", &["SHARED", "SHARED"])),
        "SHARED SHARED",
    );
    ck.check(e.starts_with("ERR"), format!("SHARED SHARED: {e}"));
    ck.check(
        e.contains("SHARED") && e.contains("twice"),
        format!("SHARED SHARED does not say SHARED was given twice: {e}"),
    );
    ck.check(
        !e.contains("PX") && !e.contains("EX"),
        format!("SHARED SHARED mentions PX/EX: {e}"),
    );
    let e = error_text(&c.cmd(&acq("lock:x", &["PX", "1", "EX", "1"])), "PX 1 EX 1");
    ck.check(e.starts_with("ERR"), format!("PX EX: {e}"));
    ck.check(
        e.contains("PX") && e.contains("EX") && !e.contains("twice"),
        format!("PX 1 EX 1 does not say PX and EX exclude each other: {e}"),
    );
    ck.eq(
        c.cmd(&["EXISTS", "lock:x"]).int(),
        0,
        "a refused acquire created the key",
    );
    ck.finish();
}

// ---------------------------------------------------------------------------------------
// Row 9: 20,000 SHARED holders, LOCK.INFO pages them.

#[test]
fn row9_lock_info_pages_twenty_thousand_shared_holders() {
    let s = ServerBuilder::new().start();
    let mut c = conn(&s);
    const N: usize = 20_000;
    let tokens: Vec<String> = (0..N).map(|i| format!("row9-holder-{i:08}")).collect();
    let mut fences = Vec::with_capacity(N);
    for chunk in tokens.chunks(1000) {
        let cmds: Vec<Vec<&str>> = chunk
            .iter()
            .map(|t| acq("lock:big", &["SHARED", "PX", "300000", "TOKEN", t]))
            .collect();
        for r in c.pipeline(&cmds).unwrap() {
            fences.push(granted(&r).1);
        }
    }
    let mut ck = Checks::new();
    let i = info(&mut c, "lock:big");
    ck.eq(
        i.get("holders").and_then(|h| h.as_int()),
        Some(N as i64),
        "holders",
    );
    let shown = i.get("holder-list").map(|l| l.items().len());
    ck.check(
        shown.is_some_and(|n| n <= 10),
        format!("default holder-list has {shown:?} entries, want at most 10"),
    );
    let cursor = i.get("cursor").and_then(|x| x.as_int());
    ck.check(
        cursor.is_some_and(|x| x != 0),
        format!("default LOCK.INFO cursor {cursor:?}"),
    );
    // Page through everything.
    let mut seen = Vec::new();
    let mut after = 0i64;
    for _ in 0..(N / 1000 + 3) {
        let r = c.cmd(&[
            "LOCK.INFO",
            "lock:big",
            "COUNT",
            "1000",
            "AFTER",
            &after.to_string(),
        ]);
        if !ck.check(
            !r.is_error() && r != Resp::Nil,
            format!("LOCK.INFO COUNT 1000 AFTER {after}: {r:?}"),
        ) {
            break;
        }
        seen.extend(holder_fences(&r));
        match r.get("cursor").and_then(|x| x.as_int()) {
            Some(0) => break,
            Some(next) => after = next,
            None => {
                ck.check(false, "a page without cursor");
                break;
            }
        }
    }
    let mut want = fences.clone();
    want.sort_unstable();
    ck.check(
        seen.windows(2).all(|w| w[0] < w[1]),
        "pages not in increasing fence order",
    );
    ck.check(
        seen == want,
        format!(
            "paging visited {} fences, want every one of {} exactly once",
            seen.len(),
            want.len()
        ),
    );
    // Release and extend of holders in the middle.
    let mid = &tokens[N / 2];
    ck.eq(
        c.cmd(&[
            "LOCK.EXTEND",
            "lock:big",
            &tokens[N / 2 + 1],
            "PX",
            "300000",
        ]),
        Resp::Int(1),
        "extend in the middle",
    );
    ck.eq(
        c.cmd(&["LOCK.RELEASE", "lock:big", mid]),
        Resp::Int(1),
        "release in the middle",
    );
    ck.eq(
        info_opt(&mut c, "lock:big", "holders"),
        Some(N as i64 - 1),
        "holders after the release",
    );
    ck.finish();
}

// ---------------------------------------------------------------------------------------
// Row 10: lock.min-token-length.

#[test]
fn row10_short_tokens_are_refused_by_lock_min_token_length() {
    let (_s, mut c, mut ck) = start(ServerBuilder::new());
    let r = c.cmd(&["CONFIG", "GET", "lock.min-token-length"]);
    ck.eq(
        r.items().get(1).and_then(|v| v.as_text()),
        Some("16".to_string()),
        "default lock.min-token-length",
    );
    let r = c.cmd(&acq("lock:t", &["TOKEN", "fifteen-bytes-x"]));
    ck.check(
        matches!(&r, Resp::Error(e) if e.starts_with("ERR") && e.contains("lock.min-token-length")),
        format!("a 15-byte TOKEN: {r:?}"),
    );
    ck.eq(
        c.cmd(&["EXISTS", "lock:t"]).int(),
        0,
        "a refused short TOKEN created the key",
    );
    let r = c.cmd(&acq("lock:t", &["TOKEN", "sixteen-bytes-xx"]));
    ck.check(
        matches!(r, Resp::Array(_)),
        format!("a 16-byte TOKEN: {r:?}"),
    );
    let r = c.cmd(&["CONFIG", "SET", "lock.min-token-length", "4"]);
    ck.eq(
        r,
        Resp::Simple("OK".into()),
        "CONFIG SET lock.min-token-length 4",
    );
    let r = c.cmd(&acq("lock:t4", &["TOKEN", "four"]));
    ck.check(
        matches!(r, Resp::Array(_)),
        format!("a 4-byte TOKEN after CONFIG SET 4: {r:?}"),
    );
    let r = c.cmd(&acq("lock:t3", &["TOKEN", "thr"]));
    ck.check(
        r.is_error(),
        format!("a 3-byte TOKEN after CONFIG SET 4: {r:?}"),
    );
    // A classic string lock keeps whatever its string is.
    assert_eq!(
        c.cmd(&["SET", "lock:classic", "abc", "NX", "PX", "60000"]),
        Resp::Simple("OK".into())
    );
    ck.eq(
        c.cmd(&["LOCK.RELEASE", "lock:classic", "abc"]),
        Resp::Int(1),
        "release of a classic lock \"abc\"",
    );
    // The load-time argument.
    let s8 = ServerBuilder::new()
        .module_args(&["min-token-length", "8"])
        .try_start();
    match s8 {
        Ok(s8) => {
            let mut c8 = conn(&s8);
            let r = c8.cmd(&["CONFIG", "GET", "lock.min-token-length"]);
            ck.eq(
                r.items().get(1).and_then(|v| v.as_text()),
                Some("8".to_string()),
                "loadmodule min-token-length 8",
            );
        }
        Err(e) => {
            ck.check(
                false,
                format!(
                    "loadmodule ... min-token-length 8 failed: {}",
                    e.lines().last().unwrap_or("")
                ),
            );
        }
    }
    ck.finish();
}

// ---------------------------------------------------------------------------------------
// Issue 19: a BLOCK 0 acquire that arrives while the engine is busy gets a reply.

/// The only single-threaded way into the module while its engine is borrowed: another
/// module's keyspace subscriber that RM_Calls LOCK.ACQUIRE ... BLOCK 0 from inside the
/// `lock.acquire` notification the module fires during its own acquire.
#[test]
fn issue19_a_block_0_acquire_from_inside_the_modules_own_event_gets_a_reply() {
    let s = paths::with_helper_module(ServerBuilder::new().arg("notify-keyspace-events", "KEg"))
        .start();
    let mut c = conn(&s);
    let mut ck = Checks::new();
    // Once on a free key (the nested call could be granted), once on a held key (the
    // nested call would have to wait: it is not allowed to block there).
    let holder = tok("i19-holder");
    granted(&c.cmd(&acq("lock:i19-held", &["PX", "60000", "TOKEN", &holder])));
    for target in ["lock:i19-free", "lock:i19-held"] {
        let r = c.cmd(&[
            "HELPER.ONEVENT",
            "lock.acquire",
            "LOCK.ACQUIRE",
            target,
            "PX",
            "60000",
            "BLOCK",
            "0",
        ]);
        assert_eq!(r, Resp::Simple("OK".into()));
        let started = Instant::now();
        let outer = c.cmd(&acq(&format!("lock:i19-outer-{target}"), &["PX", "60000"]));
        ck.check(
            matches!(outer, Resp::Array(_)),
            format!("outer acquire: {outer:?}"),
        );
        let last = c.cmd(&["HELPER.LAST"]);
        let items = last.items();
        ck.eq(
            items.first().cloned(),
            Some(Resp::Int(1)),
            &format!("{target}: the nested call ran"),
        );
        // A grant, nil or an error: anything but no answer at all (RM_Call returns only
        // when the nested command replied).
        eprintln!(
            "{target}: nested LOCK.ACQUIRE BLOCK 0 answered {:?}",
            items.get(1)
        );
        ck.check(
            items.get(1).is_some(),
            format!("{target}: nested call reply {last:?}"),
        );
        ck.check(
            started.elapsed() < SETTLE,
            format!("{target}: took {:?}", started.elapsed()),
        );
        ck.eq(
            c.cmd(&["PING"]),
            Resp::Simple("PONG".into()),
            "the server answers afterwards",
        );
    }
    ck.finish();
}
