//! LOCK.WATCH as docs/commands.md describes it: it answers at once when its wait is over
//! (or cannot wait), else when a change ends it (an acquire, a release, a lease ending,
//! FORCERELEASE, DEL, RENAME, FLUSHDB, a hand-off, a relabel), or when its BLOCK time is
//! up; the answer is who holds the key at that moment, never a token. Watchers are
//! bounded by lock.max-waiters, counted in INFO, answered on time while writes are paused,
//! and on a replica woken by what the primary sends.

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::{
    acquire, bulk, grant, lock_stat, ok, raw_pair, release, server_flavor, tok, wait_until, words,
    RawConn, Resp, ServerBuilder, SETTLE,
};

/// Every string in a reply, nested ones included.
fn texts(r: &Resp) -> Vec<String> {
    match r {
        Resp::Bulk(b) => vec![String::from_utf8_lossy(b).into_owned()],
        Resp::Simple(s) | Resp::Error(s) => vec![s.clone()],
        Resp::Array(v) => v.iter().flat_map(texts).collect(),
        Resp::Map(m) => m
            .iter()
            .flat_map(|(k, v)| [texts(k), texts(v)].concat())
            .collect(),
        _ => Vec::new(),
    }
}

/// The summary LOCK.WATCH answers for an exclusive module lock (RESP2).
fn exclusive(fence: i64, owner: Option<&str>) -> Resp {
    let owner = owner.map_or(Resp::Nil, bulk);
    let holder = [
        bulk("fence"),
        Resp::Int(fence),
        bulk("owner"),
        owner.clone(),
    ];
    let fields = [
        ("state", bulk("held")),
        ("kind", bulk("module")),
        ("mode", bulk("exclusive")),
        ("fence", Resp::Int(fence)),
        ("owner", owner),
        ("holders", Resp::Int(1)),
        (
            "holder-list",
            Resp::Array(vec![Resp::Array(holder.to_vec())]),
        ),
    ];
    Resp::Array(fields.into_iter().flat_map(|(k, v)| [bulk(k), v]).collect())
}

/// Sends `LOCK.WATCH key args...` on a new connection and waits until the server counts
/// one more watcher.
#[track_caller]
fn watcher(port: u16, ctl: &mut RawConn, key: &str, args: &[&str]) -> RawConn {
    let before = lock_stat(ctl, "watchers");
    let mut w = RawConn::connect(port);
    let mut a = vec!["LOCK.WATCH", key];
    a.extend_from_slice(args);
    w.send(&a);
    assert!(
        wait_until(SETTLE, || lock_stat(ctl, "watchers") > before),
        "LOCK.WATCH {key} {args:?} does not wait"
    );
    w
}

/// The watcher's answer (within SETTLE).
#[track_caller]
fn answer(w: &mut RawConn) -> Resp {
    w.set_read_timeout(Some(SETTLE));
    w.read().expect("the watcher was not answered")
}

/// Writes paused on `primary` for 20 s (CLIENT PAUSE WRITE): the FENCE watcher `w` is
/// answered nil when its lease ends, long before the pause does.
fn answered_at_the_lease_end_while_paused(primary: &mut RawConn, w: &mut RawConn) {
    assert_eq!(primary.cmd(&["CLIENT", "PAUSE", "20000", "WRITE"]), ok());
    let t0 = Instant::now();
    assert_eq!(answer(w), Resp::Nil);
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
}

/// True if the watcher is still waiting after `ms` (nothing to read).
fn still_waiting(w: &mut RawConn, ms: u64) -> bool {
    w.set_read_timeout(Some(Duration::from_millis(ms)));
    w.read().is_err()
}

#[test]
fn watch_answers_at_once_when_its_wait_is_over_and_never_shows_a_token() {
    let s = ServerBuilder::new().start();
    let mut c = RawConn::connect(s.port);
    // A free key: the wait runs its BLOCK time, then nil (nobody holds it).
    let t0 = Instant::now();
    assert_eq!(c.cmd(&["LOCK.WATCH", "lock:w", "BLOCK", "150"]), Resp::Nil);
    assert!(
        t0.elapsed() >= Duration::from_millis(140),
        "{:?}",
        t0.elapsed()
    );
    // Held: at once, who holds it, never the token.
    let t = tok("watch-holder");
    let (_, f) = acquire(
        &mut c,
        "lock:w",
        &["PX", "60000", "TOKEN", &t, "OWNER", "node-a"],
    );
    let held = exclusive(f, Some("node-a"));
    assert_eq!(c.cmd(&["LOCK.WATCH", "lock:w"]), held);
    // FENCE of something else than the holder: at once.
    let other = (f + 1).to_string();
    assert_eq!(c.cmd(&["LOCK.WATCH", "lock:w", "FENCE", &other]), held);
    // FENCE of the holder, with its label: the BLOCK time runs, then the same answer.
    let fs = f.to_string();
    let t0 = Instant::now();
    let r = c.cmd(&[
        "LOCK.WATCH",
        "lock:w",
        "FENCE",
        &fs,
        "OWNER",
        "node-a",
        "BLOCK",
        "150",
    ]);
    assert_eq!(r, held);
    assert!(
        t0.elapsed() >= Duration::from_millis(140),
        "{:?}",
        t0.elapsed()
    );
    // With another label than the holder's: at once.
    let r = c.cmd(&["LOCK.WATCH", "lock:w", "FENCE", &fs, "OWNER", "node-b"]);
    assert_eq!(r, held);
    // RESP3: a map; no token anywhere.
    let mut c3 = RawConn::connect_resp3(s.port);
    let r = c3.cmd(&["LOCK.WATCH", "lock:w"]);
    assert!(matches!(r, Resp::Map(_)), "{r:?}");
    assert_eq!(r.get("fence"), Some(Resp::Int(f)));
    let all = [texts(&r), texts(&held)].concat();
    assert!(all.iter().all(|x| !x.contains(&t)), "a token in {all:?}");
    // Shared: no fence or owner of its own; the first ten holders by fence.
    let mut fences = Vec::new();
    for i in 0..12 {
        let owner = format!("reader-{i}");
        fences.push(
            acquire(
                &mut c,
                "lock:s",
                &["SHARED", "PX", "60000", "OWNER", &owner],
            )
            .1,
        );
    }
    let r = c.cmd(&["LOCK.WATCH", "lock:s"]);
    assert_eq!(r.get("mode"), Some(bulk("shared")));
    assert_eq!(r.get("fence"), None);
    assert_eq!(r.get("owner"), None);
    assert_eq!(r.get("holders"), Some(Resp::Int(12)));
    let list = r.get("holder-list").expect("holder-list").items();
    let shown: Vec<(Resp, Resp)> = list
        .iter()
        .map(|h| {
            (
                h.get("fence").expect("fence"),
                h.get("owner").expect("owner"),
            )
        })
        .collect();
    let want: Vec<(Resp, Resp)> = (0..10)
        .map(|i| (Resp::Int(fences[i]), bulk(&format!("reader-{i}"))))
        .collect();
    assert_eq!(shown, want);
    // A classic string lock: held, kind string, no fence and no label.
    assert_eq!(
        c.cmd(&words("SET lock:str value-token-0000001 NX PX 60000")),
        ok()
    );
    let r = c.cmd(&["LOCK.WATCH", "lock:str"]);
    assert_eq!(r.get("kind"), Some(bulk("string")));
    assert_eq!(r.get("fence"), Some(Resp::Nil));
    // Inside MULTI and a script it does not wait: it answers as a timeout would.
    let replies = c
        .pipeline(&[
            vec!["MULTI"],
            vec!["LOCK.WATCH", "lock:free"],
            vec!["LOCK.WATCH", "lock:w", "FENCE", &fs],
            vec!["EXEC"],
        ])
        .unwrap();
    assert_eq!(replies[3], Resp::Array(vec![Resp::Nil, held.clone()]));
    let r = c.cmd(&[
        "EVAL",
        "return redis.call('LOCK.WATCH', KEYS[1])",
        "1",
        "lock:free",
    ]);
    assert_eq!(r, Resp::Nil);
    // Errors.
    for (args, start) in [
        (
            &["LOCK.WATCH", "lock:w", "OWNER", "x"][..],
            "ERR syntax error: OWNER needs FENCE",
        ),
        (&["LOCK.WATCH", "lock:w", "FENCE", "0"], "ERR FENCE must be"),
        (
            &["LOCK.WATCH", "lock:w", "BLOCK", "-1"],
            "ERR timeout is negative",
        ),
        (&["LOCK.WATCH", "lock:w", "BOGUS", "1"], "ERR syntax error"),
    ] {
        match c.cmd(args) {
            Resp::Error(e) if e.starts_with(start) => {}
            other => panic!("{args:?}: expected {start}..., got {other:?}"),
        }
    }
    c.cmd(&["RPUSH", "lock:list", "a"]);
    let r = c.cmd(&["LOCK.WATCH", "lock:list"]);
    assert!(
        matches!(&r, Resp::Error(e) if e.starts_with("WRONGTYPE")),
        "{r:?}"
    );
    assert_eq!(lock_stat(&mut c, "watchers"), 0);
}

#[test]
fn a_watcher_is_answered_by_every_change_that_ends_its_wait() {
    let s = ServerBuilder::new().start();
    let port = s.port;
    let mut c = RawConn::connect(port);
    // No FENCE: the first acquire answers it, with the new holder.
    let mut w = watcher(port, &mut c, "lock:a", &[]);
    let (_, f) = acquire(&mut c, "lock:a", &["PX", "60000", "OWNER", "first"]);
    assert_eq!(answer(&mut w), exclusive(f, Some("first")));
    // FENCE f: whatever ends that holder answers it, with who holds the key then (nil).
    type Change = fn(&mut RawConn, &str, &str);
    let changes: [(&str, Change); 6] = [
        ("release", |c, k, t| assert_eq!(release(c, k, t), 1)),
        ("forcerelease", |c, k, _| {
            assert_eq!(c.cmd(&["LOCK.FORCERELEASE", k]).int(), 1)
        }),
        ("del", |c, k, _| assert_eq!(c.cmd(&["DEL", k]).int(), 1)),
        ("rename", |c, k, _| {
            assert_eq!(c.cmd(&["RENAME", k, "lock:elsewhere"]), ok())
        }),
        ("flushdb", |c, _, _| assert_eq!(c.cmd(&["FLUSHDB"]), ok())),
        ("lease end", |_, _, _| {}),
    ];
    for (what, change) in changes {
        let key = format!("lock:{}", what.replace(' ', "-"));
        let px = if what == "lease end" { "1000" } else { "60000" };
        let t = tok(what);
        let (_, f) = acquire(&mut c, &key, &["PX", px, "TOKEN", &t]);
        let mut w = watcher(port, &mut c, &key, &["FENCE", &f.to_string()]);
        change(&mut c, &key, &t);
        assert_eq!(answer(&mut w), Resp::Nil, "{what}");
    }
    // A hand-off: the watcher of the old holder hears of the new one.
    let t = tok("handoff-old");
    let (_, f) = acquire(&mut c, "lock:h", &["PX", "60000", "TOKEN", &t]);
    let mut w = watcher(port, &mut c, "lock:h", &["FENCE", &f.to_string()]);
    let mut waiter = RawConn::connect(port);
    waiter.send(&words("LOCK.ACQUIRE lock:h PX 60000 OWNER next BLOCK 0"));
    assert!(wait_until(SETTLE, || lock_stat(&mut c, "waiters") == 1));
    assert_eq!(release(&mut c, "lock:h", &t), 1);
    let (_, next) = grant(&answer(&mut waiter));
    assert_eq!(answer(&mut w), exclusive(next, Some("next")));
    // FENCE f OWNER label: a relabel (EXTEND ... OWNER) answers it; a plain FENCE f
    // watcher keeps waiting, since f still holds the key.
    let t = tok("relabel");
    let (_, f) = acquire(
        &mut c,
        "lock:l",
        &["PX", "60000", "TOKEN", &t, "OWNER", "node-a"],
    );
    let fs = f.to_string();
    let mut by_label = watcher(port, &mut c, "lock:l", &["FENCE", &fs, "OWNER", "node-a"]);
    let mut by_fence = watcher(port, &mut c, "lock:l", &["FENCE", &fs]);
    let r = c.cmd(&[
        "LOCK.EXTEND",
        "lock:l",
        &t,
        "PX",
        "60000",
        "OWNER",
        "node-a:8080",
    ]);
    assert_eq!(r.int(), 1);
    assert_eq!(answer(&mut by_label), exclusive(f, Some("node-a:8080")));
    assert!(still_waiting(&mut by_fence, 300), "the fence still holds");
    // A reader of a shared lock: another reader leaving does not end the wait.
    let (r1, g1) = acquire(&mut c, "lock:s", &["SHARED", "PX", "60000"]);
    let (r2, _) = acquire(&mut c, "lock:s", &["SHARED", "PX", "60000"]);
    let (_, g3) = acquire(&mut c, "lock:s", &["SHARED", "PX", "60000"]);
    let mut w = watcher(port, &mut c, "lock:s", &["FENCE", &g1.to_string()]);
    assert_eq!(release(&mut c, "lock:s", &r2), 1);
    assert!(still_waiting(&mut w, 300), "another reader left");
    assert_eq!(release(&mut c, "lock:s", &r1), 1);
    let r = answer(&mut w);
    assert_eq!(r.get("holders"), Some(Resp::Int(1)), "{r:?}");
    let list = r.get("holder-list").expect("holder-list").items();
    assert_eq!(list[0].get("fence"), Some(Resp::Int(g3)));
    // The plain FENCE watcher of lock:l ends with its holder.
    assert_eq!(release(&mut c, "lock:l", &t), 1);
    assert_eq!(answer(&mut by_fence), Resp::Nil);
    assert!(wait_until(SETTLE, || lock_stat(&mut c, "watchers") == 0));
}

#[test]
fn watchers_are_bounded_counted_and_leave_when_they_go() {
    let s = ServerBuilder::new().start();
    let mut c = RawConn::connect(s.port);
    let (_, f) = acquire(&mut c, "lock:b", &["PX", "60000", "OWNER", "o"]);
    let fs = f.to_string();
    assert_eq!(c.cmd(&["CONFIG", "SET", "lock.max-waiters", "2"]), ok());
    let w1 = watcher(s.port, &mut c, "lock:b", &["FENCE", &fs]);
    let mut w2 = watcher(s.port, &mut c, "lock:b", &["FENCE", &fs]);
    assert_eq!(lock_stat(&mut c, "watchers"), 2);
    let r = c.cmd(&["LOCK.WATCH", "lock:b", "FENCE", &fs]);
    assert!(
        matches!(&r, Resp::Error(e) if e.starts_with("MAXWAITERS")),
        "a third watcher: {r:?}"
    );
    // A watcher that disconnects leaves.
    drop(w1);
    assert!(wait_until(SETTLE, || lock_stat(&mut c, "watchers") == 1));
    // CLIENT UNBLOCK id TIMEOUT: answered like a timeout where the server allows it
    // (Redis 7.4+, Valkey); refused before Redis 7.4.
    let id = {
        let list = c.cmd(&["CLIENT", "LIST"]).text();
        let line = list
            .lines()
            .find(|l| l.contains("cmd=lock.watch"))
            .unwrap_or_else(|| panic!("no watcher in CLIENT LIST:\n{list}"))
            .to_string();
        line.split(' ')
            .find_map(|kv| kv.strip_prefix("id="))
            .expect("id=")
            .to_string()
    };
    let flavor = server_flavor();
    let r = c.cmd(&["CLIENT", "UNBLOCK", &id, "TIMEOUT"]).int();
    if flavor.is_valkey() || flavor.at_least(7, 4) {
        assert_eq!(r, 1, "CLIENT UNBLOCK of a watcher on {}", flavor.label());
        assert_eq!(answer(&mut w2), exclusive(f, Some("o")));
        assert_eq!(lock_stat(&mut c, "watchers"), 0);
    } else {
        assert_eq!(r, 0, "CLIENT UNBLOCK of a watcher on {}", flavor.label());
        assert!(still_waiting(&mut w2, 200));
        assert_eq!(lock_stat(&mut c, "watchers"), 1);
    }
}

#[test]
fn a_fence_watcher_is_answered_when_the_lease_ends_while_writes_are_paused() {
    let s = ServerBuilder::new().start();
    let mut c = RawConn::connect(s.port);
    let (_, f) = acquire(&mut c, "lock:p", &["PX", "1500"]);
    let mut w = watcher(s.port, &mut c, "lock:p", &["FENCE", &f.to_string()]);
    // Long before the pause ends, and the key is still there: nothing removed it.
    answered_at_the_lease_end_while_paused(&mut c, &mut w);
    assert_eq!(c.cmd(&["EXISTS", "lock:p"]).int(), 1);
    assert_eq!(c.cmd(&["CLIENT", "UNPAUSE"]), ok());
    assert!(wait_until(SETTLE, || c.cmd(&["EXISTS", "lock:p"]).int() == 0));
}

/// A watcher of a free key sees a classic `SET NX` string lock appear once the module
/// listens to keyspace events (after a client waited for a string lock); before, only the
/// keys with acquire waiters were looked at on those events.
#[test]
fn a_watcher_of_a_free_key_sees_a_string_lock_appear_once_key_events_are_on() {
    let s = ServerBuilder::new().start();
    let mut c = RawConn::connect(s.port);
    // Someone waits for a string lock: the module starts listening to key events.
    let set = words("SET lock:s1 classic-token NX PX 200");
    assert_eq!(c.cmd(&set), ok());
    assert!(matches!(
        c.cmd(&["LOCK.ACQUIRE", "lock:s1", "BLOCK", "3000"]),
        Resp::Array(_)
    ));
    let mut w = watcher(s.port, &mut c, "lock:s2", &["BLOCK", "10000"]);
    assert_eq!(
        c.cmd(&["SET", "lock:s2", "classic-token", "NX", "PX", "60000"]),
        ok()
    );
    let r = answer(&mut w);
    assert_eq!(r.get("kind"), Some(bulk("string")), "{r:?}");
}

#[test]
fn watchers_on_a_replica_are_woken_by_what_the_primary_sends() {
    let (_p, r, mut pc, mut rc) = raw_pair();
    let mut w = watcher(r.port, &mut rc, "lock:r", &[]);
    let t = tok("replica-watch");
    let (_, f) = acquire(
        &mut pc,
        "lock:r",
        &["PX", "60000", "TOKEN", &t, "OWNER", "p"],
    );
    assert_eq!(answer(&mut w), exclusive(f, Some("p")));
    let mut w = watcher(r.port, &mut rc, "lock:r", &["FENCE", &f.to_string()]);
    sleep(Duration::from_millis(50));
    assert!(still_waiting(&mut w, 200));
    assert_eq!(release(&mut pc, "lock:r", &t), 1);
    assert_eq!(answer(&mut w), Resp::Nil);
    // The primary removes nothing (its writes are paused): the replica's watcher of a
    // fence is still answered when that lease ends, and its LOCK.INFO treats the lease
    // as over although the key is still there.
    let (_, f) = acquire(&mut pc, "lock:q", &["PX", "1500"]);
    assert_eq!(pc.cmd(&["WAIT", "1", "5000"]).int(), 1);
    let mut w = watcher(r.port, &mut rc, "lock:q", &["FENCE", &f.to_string()]);
    answered_at_the_lease_end_while_paused(&mut pc, &mut w);
    assert_eq!(rc.cmd(&["EXISTS", "lock:q"]).int(), 1);
    assert_eq!(rc.cmd(&["LOCK.INFO", "lock:q"]), Resp::Nil);
    assert_eq!(rc.cmd(&["LOCK.CHECK", "lock:q", &f.to_string()]).int(), 0);
    assert_eq!(pc.cmd(&["CLIENT", "UNPAUSE"]), ok());
}
