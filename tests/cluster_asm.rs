//! Issue 27: Valkey 9's atomic slot migration (`CLUSTER MIGRATESLOTS`) with locks in the
//! slot. The tests that migrate need Valkey 9 and are marked `#[ignore]`: `make
//! integration` runs them (`--ignored`) on a Valkey 9 server only, so they are never
//! counted as passing on a server without the command. The first test runs everywhere.

mod regress;

use redis_lock_testkit::lock::Routed;
use redis_lock_testkit::{key_slot, Cluster, Rng};
use regress::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// The keys of these tests share one slot.
const TAG: &str = "{asm}";

fn key(name: &str) -> String {
    format!("{TAG}:{name}")
}

fn slot() -> u16 {
    key_slot(TAG.as_bytes())
}

/// A cluster of `masters` primaries, `LOCK.DEBUG` on, and the node serving [`slot`].
fn cluster(masters: usize) -> (Cluster, usize) {
    let c = Cluster::start_with(masters, |b| b.module_args(&["debug-commands", "yes"]));
    let owner = c.slot_owner(slot()).expect("an owner of the slot");
    (c, owner)
}

fn asm_server() -> bool {
    let f = server_flavor();
    f.is_valkey() && f.at_least(9, 0)
}

fn require_asm() {
    assert!(
        asm_server(),
        "{}: CLUSTER MIGRATESLOTS needs Valkey 9 (make integration runs these tests only there)",
        server_flavor()
    );
}

/// The newest entry of `CLUSTER GETSLOTMIGRATIONS` on node `i` for [`slot`], as fields.
fn job(cluster: &Cluster, i: usize, operation: &str) -> Option<Vec<(String, Resp)>> {
    let range = format!("{0}-{0}", slot());
    let jobs = conn(&cluster.nodes[i]).cmd(&["CLUSTER", "GETSLOTMIGRATIONS"]);
    (jobs.items().into_iter()).map(|j| j.pairs()).find(|p| {
        let field = |k: &str| {
            p.iter()
                .find(|(n, _)| n == k)
                .and_then(|(_, v)| v.as_text())
        };
        field("slot_ranges").as_deref() == Some(range.as_str())
            && field("operation").as_deref() == Some(operation)
    })
}

fn field(job: &[(String, Resp)], name: &str) -> String {
    (job.iter().find(|(n, _)| n == name))
        .and_then(|(_, v)| v.as_text())
        .unwrap_or_default()
}

/// Starts moving [`slot`] from node `from` to node `to` with `CLUSTER MIGRATESLOTS`.
fn start_move(cluster: &Cluster, from: usize, to: usize) {
    let to_id = conn(&cluster.nodes[to]).cmd(&["CLUSTER", "MYID"]).text();
    let s = slot().to_string();
    let r = conn(&cluster.nodes[from]).cmd(&[
        "CLUSTER",
        "MIGRATESLOTS",
        "SLOTSRANGE",
        &s,
        &s,
        "NODE",
        &to_id,
    ]);
    assert_eq!(r, ok(), "CLUSTER MIGRATESLOTS");
}

/// Waits until the export of [`slot`] on node `from` is in `state` (`success`,
/// `failed`, `cancelled`, `waiting-to-pause`...), or panics with what it is.
fn wait_export(cluster: &Cluster, from: usize, state: &str) {
    let mut last = String::new();
    let done = wait_until(SETTLE, || {
        last = job(cluster, from, "EXPORT").map_or("none".into(), |j| field(&j, "state"));
        last == state
    });
    assert!(
        done,
        "export of slot {} on node {from}: {last}, not {state}",
        slot()
    );
}

/// Moves [`slot`] from node `from` to node `to` and waits until every node agrees.
fn migrate(cluster: &Cluster, from: usize, to: usize) {
    start_move(cluster, from, to);
    wait_export(cluster, from, "success");
    assert!(
        cluster.wait_slot_owner(slot(), to, SETTLE),
        "slot {}: not every node sees node {to} serve it",
        slot()
    );
}

/// `LOCK.ACQUIRE` through a cluster client (TRYAGAIN while the new owner confirms).
fn acquire_routed(r: &mut Routed, key: &str, args: &[&str]) -> Resp {
    r.call(key.as_bytes(), &acq(key, args), SETTLE).unwrap()
}

/// Mode, state and (fence, owner) per holder.
type Shape = (Option<String>, Option<String>, Vec<(i64, Option<String>)>);

/// What a lock is, as the target must receive it: mode, lock-delay running, and per
/// holder its fence and owner label (not the lease, which only shrinks).
fn shape(r: &Resp) -> Shape {
    let holders = match r.get("holder-list") {
        Some(list) => list
            .items()
            .iter()
            .map(|h| {
                let fence = h.get("fence").and_then(|f| f.as_int()).unwrap_or(0);
                (fence, h.get("owner").and_then(|o| o.as_text()))
            })
            .collect(),
        None => Vec::new(),
    };
    let text = |f: &str| r.get(f).and_then(|v| v.as_text());
    (text("mode"), text("state"), holders)
}

#[test]
fn atomic_slot_migration_is_declared_only_where_it_exists() {
    let (cluster, owner) = cluster(2);
    let other = 1 - owner;
    let mut c = conn(&cluster.nodes[owner]);
    let t = tok("asm-declared");
    granted(&c.cmd(&acq(&key("a"), &["PX", "60000", "TOKEN", &t])));
    let to_id = conn(&cluster.nodes[other]).cmd(&["CLUSTER", "MYID"]).text();
    let s = slot().to_string();
    let r = c.cmd(&[
        "CLUSTER",
        "MIGRATESLOTS",
        "SLOTSRANGE",
        &s,
        &s,
        "NODE",
        &to_id,
    ]);
    if asm_server() {
        assert_eq!(
            r,
            ok(),
            "{}: the module declares atomic slot migration",
            server_flavor()
        );
        wait_export(&cluster, owner, "success");
    } else {
        // Redis and Valkey 8 have no such command: the module loads and works there.
        let e = error_text(&r, "CLUSTER MIGRATESLOTS");
        assert!(e.contains("nknown") || e.contains("ERR"), "{e}");
        assert_eq!(c.cmd(&["LOCK.RELEASE", &key("a"), &t]), Resp::Int(1));
    }
}

#[test]
#[ignore = "needs Valkey 9 (CLUSTER MIGRATESLOTS); make integration runs it there"]
fn held_shared_limit_delayed_and_free_locks_arrive_whole() {
    require_asm();
    let (cluster, from) = cluster(2);
    let to = 1 - from;
    let mut s = conn(&cluster.nodes[from]);
    let (tx, ts1, ts2, tl) = (tok("asm-x"), tok("asm-s1"), tok("asm-s2"), tok("asm-l"));
    granted(&s.cmd(&acq(
        &key("x"),
        &[
            "PX",
            "60000",
            "TOKEN",
            &tx,
            "OWNER",
            "holder-x",
            "LOCKDELAY",
            "700",
        ],
    )));
    granted(&s.cmd(&acq(
        &key("s"),
        &["SHARED", "PX", "60000", "TOKEN", &ts1, "OWNER", "r1"],
    )));
    granted(&s.cmd(&acq(&key("s"), &["SHARED", "PX", "30000", "TOKEN", &ts2])));
    granted(&s.cmd(&acq(
        &key("l"),
        &["LIMIT", "3", "PX", "60000", "TOKEN", &tl],
    )));
    granted(&s.cmd(&acq(&key("l"), &["LIMIT", "3", "PX", "60000"])));
    // A holder whose own lock-delay must follow it: it runs once its lease ends there.
    granted(&s.cmd(&acq(&key("xd"), &["PX", "1500", "LOCKDELAY", "20000"])));
    // A holder gone with a 20 s lock-delay behind it: the key holds nothing, and is
    // granted to nobody until the delay ends.
    granted(&s.cmd(&acq(&key("d"), &["PX", "50", "LOCKDELAY", "20000"])));
    thread::sleep(Duration::from_millis(150));
    assert_eq!(s.cmd(&acq(&key("d"), &["PX", "1000"])), Resp::Nil);
    // A free key whose last fence was lifted an hour ahead (MINFENCE), then released.
    let lift = ((redis_lock_testkit::unix_ms() + 3_600_000 - 2_000) as u64)
        << redis_lock_testkit::lock::FENCE_SHIFT;
    let tf = tok("asm-f");
    let (_, f) = granted(&s.cmd(&acq(
        &key("f"),
        &["PX", "60000", "TOKEN", &tf, "MINFENCE", &lift.to_string()],
    )));
    assert_eq!(s.cmd(&["LOCK.RELEASE", &key("f"), &tf]), Resp::Int(1));
    let before: Vec<_> = ["x", "s", "l", "d"]
        .iter()
        .map(|k| (k, shape(&info(&mut s, &key(k)))))
        .collect();
    // From before the read: the time between the two reads is within `spent`, however
    // long a loaded machine pauses between this read and the move.
    let moved_at = Instant::now();
    let ttl_before = info_int(&mut s, &key("x"), "ttl");

    migrate(&cluster, from, to);

    let mut d = conn(&cluster.nodes[to]);
    let source_counter = s.cmd(&["LOCK.DEBUG", "FENCE"]).int();
    for (k, shape_before) in &before {
        assert_eq!(
            &shape(&info(&mut d, &key(k))),
            shape_before,
            "{}: on the target",
            key(k)
        );
    }
    // The lease goes on from what was left (less the time the move took).
    let ttl = info_int(&mut d, &key("x"), "ttl");
    let spent = moved_at.elapsed().as_millis() as i64;
    assert!(
        ttl <= ttl_before && ttl >= ttl_before - spent - 1000,
        "ttl {ttl} after {ttl_before}, {spent} ms"
    );
    let state = |d: &mut RawConn| info(d, &key("xd")).get("state").and_then(|v| v.as_text());
    let delayed = wait_until(SETTLE, || state(&mut d).as_deref() == Some("delayed"));
    assert!(
        delayed,
        "the holder's lock-delay on the target: {:?}",
        state(&mut d)
    );
    // Held means held: another client gets nil, the holders' tokens work.
    let mut r = Routed::connect(&cluster.nodes.iter().map(|n| n.port).collect::<Vec<_>>()).unwrap();
    assert_eq!(
        acquire_routed(&mut r, &key("x"), &["PX", "1000"]),
        Resp::Nil
    );
    assert_eq!(
        acquire_routed(&mut r, &key("d"), &["PX", "1000"]),
        Resp::Nil,
        "the lock-delay runs on"
    );
    assert_eq!(
        acquire_routed(&mut r, &key("s"), &["PX", "1000"]),
        Resp::Nil,
        "an exclusive acquire of a shared lock"
    );
    granted(&acquire_routed(
        &mut r,
        &key("s"),
        &["SHARED", "PX", "1000"],
    ));
    let e = error_text(
        &acquire_routed(&mut r, &key("l"), &["SHARED", "PX", "1000"]),
        "family",
    );
    assert!(e.starts_with("WRONGMODE") || e.contains("LIMIT"), "{e}");
    for (k, t) in [("x", &tx), ("s", &ts1), ("s", &ts2), ("l", &tl)] {
        assert_eq!(
            d.cmd(&["LOCK.RELEASE", &key(k), t]),
            Resp::Int(1),
            "{}: release on the target",
            key(k)
        );
    }
    // Fences go on above every fence the source gave (and its counter).
    let (_, next) = granted(&acquire_routed(&mut r, &key("f"), &["PX", "1000"]));
    assert!(
        next > f && next > source_counter,
        "fence {next} after {f} (source counter {source_counter})"
    );
    // Nothing of the slot is left on the source.
    let count = s
        .cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot().to_string()])
        .int();
    assert_eq!(count, 0, "keys left on the source");
}

#[test]
#[ignore = "needs Valkey 9 (CLUSTER MIGRATESLOTS); make integration runs it there"]
fn waiters_and_watchers_on_the_source_get_lockmoved_at_the_cut_over() {
    require_asm();
    let (cluster, from) = cluster(2);
    let to = 1 - from;
    let port = cluster.nodes[from].port;
    let mut s = conn(&cluster.nodes[from]);
    let t = tok("asm-held");
    let (_, fence) = granted(&s.cmd(&acq(&key("w"), &["PX", "60000", "TOKEN", &t])));
    let mut waiters: Vec<Pending> = (0..2)
        .map(|_| Pending::send(port, &acq(&key("w"), &["PX", "60000", "BLOCK", "20000"])))
        .collect();
    wait_waiters(&mut s, &key("w"), 2);
    let f = fence.to_string();
    let mut watcher = Pending::send(
        port,
        &["LOCK.WATCH", &key("w"), "FENCE", &f, "BLOCK", "20000"],
    );
    let mut held_watcher = Pending::send(port, &["LOCK.WATCH", &key("none"), "BLOCK", "20000"]);
    assert!(wait_until(SETTLE, || s
        .info_u64("lock", "lock_watchers")
        .ok()
        == Some(2)));

    migrate(&cluster, from, to);

    for w in waiters.iter_mut().chain([&mut watcher, &mut held_watcher]) {
        let r = w
            .reply_within(Duration::from_secs(5))
            .expect("an answer at the cut-over");
        assert!(is_err_with(&r, "LOCKMOVED"), "{r:?}");
    }
    // The lock lives on the target, with its holder; nobody was granted on the source.
    let mut d = conn(&cluster.nodes[to]);
    assert_eq!(holder_fences(&info(&mut d, &key("w"))), vec![fence]);
    assert_eq!(d.cmd(&["LOCK.RELEASE", &key("w"), &t]), Resp::Int(1));
    assert_eq!(
        s.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot().to_string()])
            .int(),
        0
    );
}

/// What the source holds in the slot: every lock's shape and digest.
fn source_state(c: &mut RawConn, keys: &[&str]) -> Vec<(String, Resp)> {
    keys.iter()
        .map(|k| (k.to_string(), c.cmd(&["DEBUG", "DIGEST-VALUE", &key(k)])))
        .collect()
}

#[test]
#[ignore = "needs Valkey 9 (CLUSTER MIGRATESLOTS); make integration runs it there"]
fn a_cancelled_or_failed_migration_leaves_the_source_as_it_was() {
    require_asm();
    let (mut cluster, from) = cluster(2);
    let to = 1 - from;
    let port = cluster.nodes[from].port;
    let mut s = conn(&cluster.nodes[from]);
    let t = tok("asm-cancel");
    granted(&s.cmd(&acq(&key("c"), &["PX", "60000", "TOKEN", &t, "OWNER", "o"])));
    granted(&s.cmd(&acq(&key("cs"), &["SHARED", "PX", "60000"])));
    let mut waiter = Pending::send(port, &acq(&key("c"), &["PX", "60000", "BLOCK", "30000"]));
    wait_waiters(&mut s, &key("c"), 1);
    let keys = ["c", "cs"];
    let before = source_state(&mut s, &keys);

    // Cancelled while it streams (the source never pauses).
    assert_eq!(
        s.cmd(&["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "1"]),
        ok()
    );
    start_move(&cluster, from, to);
    wait_export(&cluster, from, "waiting-to-pause");
    assert_eq!(s.cmd(&["CLUSTER", "CANCELSLOTMIGRATIONS"]), ok());
    wait_export(&cluster, from, "cancelled");
    assert_eq!(
        source_state(&mut s, &keys),
        before,
        "the source after the cancel"
    );
    assert!(
        waiter.reply_within(Duration::from_millis(300)).is_err(),
        "the waiter waits on"
    );
    let slot_keys = |c: &mut RawConn| {
        c.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot().to_string()])
            .int()
    };
    let mut d = conn(&cluster.nodes[to]);
    assert!(
        wait_until(SETTLE, || slot_keys(&mut d) == 0),
        "the target kept keys"
    );

    // Failed: the target dies while the slot streams.
    start_move(&cluster, from, to);
    wait_export(&cluster, from, "waiting-to-pause");
    cluster.nodes[to].kill9();
    wait_export(&cluster, from, "failed");
    assert_eq!(
        source_state(&mut s, &keys),
        before,
        "the source after the failure"
    );
    assert_eq!(cluster.slot_owner(slot()), Some(from));
    // It goes on serving: the waiter gets the lock when the holder releases it.
    assert_eq!(s.cmd(&["LOCK.RELEASE", &key("c"), &t]), Resp::Int(1));
    let r = waiter
        .reply_within(Duration::from_secs(5))
        .expect("the waiter's grant");
    granted(&r);
}

#[test]
#[ignore = "needs Valkey 9 (CLUSTER MIGRATESLOTS); make integration runs it there"]
fn guarded_writes_in_flight_follow_the_lock() {
    require_asm();
    let (cluster, from) = cluster(2);
    let to = 1 - from;
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    let mut s = conn(&cluster.nodes[from]);
    let t = tok("asm-guard");
    granted(&s.cmd(&acq(&key("g"), &["PX", "60000", "TOKEN", &t])));
    // Writes guarded by the lock, while the slot streams, pauses and moves.
    assert_eq!(
        s.cmd(&["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "1"]),
        ok()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, ports, t) = (Arc::clone(&stop), ports.clone(), t.clone());
        thread::spawn(move || {
            let mut r = Routed::connect(&ports).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let k = key("g");
                let cmd = ["LOCK.IFHELD", &k, &t, "INCR", &key("data")];
                let reply = r.call(k.as_bytes(), &cmd, SETTLE).unwrap();
                n += 1;
                assert_eq!(reply, Resp::Int(n as i64), "guarded INCR number {n}");
            }
            n
        })
    };
    start_move(&cluster, from, to);
    wait_export(&cluster, from, "waiting-to-pause");
    thread::sleep(Duration::from_millis(200));
    assert_eq!(
        s.cmd(&["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "0"]),
        ok()
    );
    wait_export(&cluster, from, "success");
    thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let n = writer.join().unwrap();
    let mut d = conn(&cluster.nodes[to]);
    assert_eq!(
        d.cmd(&["GET", &key("data")]),
        Resp::Bulk(n.to_string().into_bytes())
    );
    assert_eq!(
        d.cmd(&["LOCK.IFHELD", &key("g"), &t, "DEL", &key("data")]),
        Resp::Int(1)
    );
}

#[test]
#[ignore = "needs Valkey 9 (CLUSTER MIGRATESLOTS); make integration runs it there"]
fn changes_while_the_slot_streams_arrive_and_leases_end_on_the_target() {
    require_asm();
    let (cluster, from) = cluster(2);
    let to = 1 - from;
    let mut s = conn(&cluster.nodes[from]);
    let (t1, t2) = (tok("asm-stream-1"), tok("asm-stream-2"));
    granted(&s.cmd(&acq(&key("v"), &["PX", "60000", "TOKEN", &t1])));
    let prevent_pause = |s: &mut RawConn, on: &str| {
        assert_eq!(
            s.cmd(&["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", on]),
            ok()
        );
    };
    prevent_pause(&mut s, "1");
    start_move(&cluster, from, to);
    wait_export(&cluster, from, "waiting-to-pause");
    // Longer than the module's once-a-second look at who receives its changes.
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(s.cmd(&["LOCK.RELEASE", &key("v"), &t1]), Resp::Int(1));
    granted(&s.cmd(&acq(&key("v"), &["PX", "60000", "TOKEN", &t2])));
    // A lease that ends while writes are paused on the source (which then does not end
    // it) and the slot moves: the target ends it once it serves the slot.
    granted(&s.cmd(&acq(&key("short"), &["PX", "200"])));
    assert_eq!(s.cmd(&["CLIENT", "PAUSE", "10000", "WRITE"]), ok());
    thread::sleep(Duration::from_millis(500));
    prevent_pause(&mut s, "0");
    wait_export(&cluster, from, "success");
    let mut d = conn(&cluster.nodes[to]);
    assert_eq!(d.cmd(&["LOCK.RELEASE", &key("v"), &t1]), Resp::Int(0));
    assert_eq!(d.cmd(&["LOCK.RELEASE", &key("v"), &t2]), Resp::Int(1));
    let exists = |d: &mut RawConn| d.cmd(&["EXISTS", &key("short")]).int();
    assert!(
        wait_until(SETTLE, || exists(&mut d) == 0),
        "a lease over on the target stays"
    );
    assert_eq!(s.cmd(&["CLIENT", "UNPAUSE"]), ok());
}

#[test]
#[ignore = "needs Valkey 9 (CLUSTER MIGRATESLOTS); make integration runs it there"]
fn replicas_of_both_sides_agree() {
    require_asm();
    let (cluster, from) = cluster(2);
    let to = 1 - from;
    let ids: Vec<String> = (cluster.nodes.iter())
        .map(|n| conn(n).cmd(&["CLUSTER", "MYID"]).text())
        .collect();
    // One replica per primary, joined to the cluster.
    let replicas: Vec<Server> = (0..2)
        .map(|i| {
            let r = ServerBuilder::new()
                .arg("cluster-enabled", "yes")
                .arg("cluster-config-file", "nodes.conf")
                .arg("cluster-node-timeout", "5000")
                .module_args(&["debug-commands", "yes"])
                .start();
            let mut c = conn(&r);
            let port = cluster.nodes[i].port.to_string();
            assert_eq!(c.cmd(&["CLUSTER", "MEET", "127.0.0.1", &port]), ok());
            assert!(wait_until(SETTLE, || c.cmd(&[
                "CLUSTER",
                "REPLICATE",
                &ids[i]
            ]) == ok()));
            r
        })
        .collect();
    for (r, p) in replicas.iter().zip(&cluster.nodes) {
        assert!(
            paths::wait_replica_caught_up(p, r, SETTLE),
            "replica of {}",
            p.port
        );
    }
    let mut s = conn(&cluster.nodes[from]);
    granted(&s.cmd(&acq(&key("r"), &["PX", "60000", "OWNER", "o"])));
    granted(&s.cmd(&acq(&key("rs"), &["SHARED", "PX", "60000"])));
    granted(&s.cmd(&acq(&key("rs"), &["SHARED", "PX", "60000"])));
    migrate(&cluster, from, to);
    // A change after the move reaches the target's replica too.
    let mut d = conn(&cluster.nodes[to]);
    let mut r = Routed::connect(&cluster.nodes.iter().map(|n| n.port).collect::<Vec<_>>()).unwrap();
    granted(&acquire_routed(&mut r, &key("after"), &["PX", "60000"]));
    for (r, p) in replicas.iter().zip(&cluster.nodes) {
        assert!(
            paths::wait_replica_caught_up(p, r, SETTLE),
            "replica of {}",
            p.port
        );
    }
    let digest = |c: &mut RawConn| {
        c.cmd(&["READONLY"]);
        ["r", "rs", "after"].map(|k| c.cmd(&["DEBUG", "DIGEST-VALUE", &key(k)]))
    };
    let mut target_replica = conn(&replicas[to]);
    assert_eq!(
        digest(&mut target_replica),
        digest(&mut d),
        "the target's replica"
    );
    let count = |c: &mut RawConn| {
        c.cmd(&["CLUSTER", "COUNTKEYSINSLOT", &slot().to_string()])
            .int()
    };
    assert_eq!(
        count(&mut conn(&replicas[from])),
        0,
        "the source's replica kept keys"
    );
    assert_eq!(count(&mut target_replica), 3);
}

/// One grant as a client saw it.
struct Seen {
    asked: u128,
    answered: u128,
    fence: i64,
}

#[test]
#[ignore = "needs Valkey 9 (CLUSTER MIGRATESLOTS); make integration runs it there"]
fn fifty_moves_back_and_forth_under_an_acquire_release_loop() {
    require_asm();
    let (cluster, first) = cluster(2);
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    const BLOCK_MS: u64 = 300;
    let clients: Vec<_> = (0..3u64)
        .map(|i| {
            let (ports, stop) = (ports.clone(), Arc::clone(&stop));
            thread::spawn(move || {
                let mut r = Routed::connect(&ports).unwrap();
                let mut rng = Rng::new(i);
                let (mut seen, mut moved, mut slowest) = (Vec::new(), 0u32, Duration::ZERO);
                let t = tok(&format!("asm-loop-{i}"));
                let k = key("loop");
                while !stop.load(Ordering::Relaxed) {
                    let block = BLOCK_MS.to_string();
                    let args = ["PX", "2000", "TOKEN", &t, "BLOCK", &block];
                    let asked = t0.elapsed();
                    let reply = acquire_routed(&mut r, &k, &args);
                    let answered = t0.elapsed();
                    slowest = slowest.max(answered - asked);
                    let Some((_, fence)) = reply.grant() else {
                        match &reply {
                            Resp::Nil => {}
                            Resp::Error(e) if e.starts_with("LOCKMOVED") => moved += 1,
                            other => panic!("{other:?}"),
                        }
                        continue;
                    };
                    let fence = fence as i64;
                    seen.push(Seen {
                        asked: asked.as_nanos(),
                        answered: answered.as_nanos(),
                        fence,
                    });
                    // The holder's writes, guarded: a second holder would overwrite them.
                    let mine = format!("{i}:{fence}");
                    let set = ["LOCK.IFHELD", &k, &t, "SET", &key("owner"), &mine];
                    let get = ["LOCK.IFHELD", &k, &t, "GET", &key("owner")];
                    let wrote = r.call(k.as_bytes(), &set, SETTLE).unwrap();
                    thread::sleep(Duration::from_millis(rng.below(3)));
                    let read = r.call(k.as_bytes(), &get, SETTLE).unwrap();
                    if wrote == ok() {
                        let alone = read == Resp::Bulk(mine.clone().into_bytes());
                        assert!(
                            alone || is_err_with(&read, "NOTHELD"),
                            "{mine}: another holder wrote {read:?}"
                        );
                    }
                    let released = r
                        .call(k.as_bytes(), &["LOCK.RELEASE", &k, &t], SETTLE)
                        .unwrap();
                    assert!(matches!(released, Resp::Int(0 | 1)), "{released:?}");
                }
                (seen, moved, slowest)
            })
        })
        .collect();
    let mut at = first;
    for _ in 0..50 {
        let to = 1 - at;
        migrate(&cluster, at, to);
        at = to;
    }
    stop.store(true, Ordering::Relaxed);
    let (mut seen, mut moved, mut slowest) = (Vec::new(), 0, Duration::ZERO);
    for c in clients {
        let (s, m, w) = c.join().unwrap();
        seen.extend(s);
        moved += m;
        slowest = slowest.max(w);
    }
    // Fences per key: a grant answered before another was asked has the lower fence.
    let mut by_answer: Vec<&Seen> = seen.iter().collect();
    by_answer.sort_by_key(|g| g.answered);
    let mut by_ask: Vec<&Seen> = seen.iter().collect();
    by_ask.sort_by_key(|g| g.asked);
    let (mut i, mut top, mut regressions) = (0, i64::MIN, 0);
    for g in by_ask {
        while i < by_answer.len() && by_answer[i].answered < g.asked {
            top = top.max(by_answer[i].fence);
            i += 1;
        }
        regressions += usize::from(g.fence <= top);
    }
    eprintln!(
        "{} grants, {moved} LOCKMOVED, slowest call {slowest:?} over 50 moves",
        seen.len()
    );
    assert!(seen.len() >= 50, "{} grants over 50 moves", seen.len());
    assert_eq!(
        regressions,
        0,
        "fence regressions over {} grants",
        seen.len()
    );
    // Every waiter was answered: no call outlived its BLOCK time by more than 5 s.
    assert!(
        slowest < Duration::from_millis(BLOCK_MS + 5000),
        "a call took {slowest:?}"
    );
}

#[test]
#[ignore = "needs Valkey 9 (CLUSTER MIGRATESLOTS); make integration runs it there"]
fn session_locks_move_with_their_lease_and_a_keepalive_in_flight() {
    require_asm();
    let (cluster, from) = cluster(2);
    let to = 1 - from;
    let port = cluster.nodes[from].port;
    let mut s = conn(&cluster.nodes[from]);
    let sid = "asm-session-id-000000001";
    assert_eq!(
        s.cmd(&["LOCK.SESSION", "OPEN", sid, "PX", "4000", "OWNER", "mover"]),
        Resp::Int(1)
    );
    let (ta, fa) = granted(&s.cmd(&acq(&key("sa"), &["SESSION", sid])));
    let (m1, m2) = (key("m1"), key("m2"));
    let all = s.cmd(&["LOCK.ACQUIREALL", "2", &m1, &m2, "SESSION", sid]);
    let tm = all.items()[0].bytes();
    // A multi-key waiter on the source, behind the session's lock.
    let mut waiter = Pending::send(
        port,
        &[
            "LOCK.ACQUIREALL",
            "2",
            &m1,
            &key("free"),
            "PX",
            "60000",
            "BLOCK",
            "20000",
        ],
    );
    wait_waiters(&mut s, &m1, 1);
    assert_eq!(
        s.cmd(&["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "1"]),
        ok()
    );
    start_move(&cluster, from, to);
    wait_export(&cluster, from, "waiting-to-pause");
    thread::sleep(Duration::from_millis(1500));
    // The client keeps its session alive where it took the locks, while they stream.
    assert_eq!(
        s.cmd(&["LOCK.SESSION", "KEEPALIVE", sid, "PX", "60000"]),
        Resp::Int(1)
    );
    assert_eq!(
        s.cmd(&["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "0"]),
        ok()
    );
    wait_export(&cluster, from, "success");
    let r = waiter
        .reply_within(Duration::from_secs(5))
        .expect("an answer at the cut-over");
    assert!(is_err_with(&r, "LOCKMOVED"), "{r:?}");
    let mut d = conn(&cluster.nodes[to]);
    assert_eq!(holder_fences(&info(&mut d, &key("sa"))), vec![fa]);
    let ttl = info_int(&mut d, &key("sa"), "ttl");
    assert!(
        ttl > 30_000,
        "the keepalive before the cut-over: ttl {ttl} on the target"
    );
    // Past the session's first lease: the locks are still held there.
    thread::sleep(Duration::from_millis(3000));
    for k in [&key("sa"), &m1, &m2] {
        assert!(info(&mut d, k) != Resp::Nil, "{k}: held on the target");
    }
    let session = d.cmd(&["LOCK.SESSION", "INFO", sid]);
    assert_eq!(session.get("locks"), Some(Resp::Int(3)), "{session:?}");
    assert_eq!(
        session.get("owner"),
        Some(Resp::Bulk(b"mover".to_vec())),
        "{session:?}"
    );
    assert_eq!(
        d.cmd(&["LOCK.SESSION", "KEEPALIVE", sid, "PX", "60000"]),
        Resp::Int(1)
    );
    let tm = String::from_utf8(tm).unwrap();
    assert_eq!(
        d.cmd(&["LOCK.RELEASEALL", "2", &m1, &m2, &tm]),
        Resp::Int(2)
    );
    assert_eq!(
        d.cmd(&["LOCK.RELEASE", &key("sa"), &String::from_utf8(ta).unwrap()]),
        Resp::Int(1)
    );
    assert_eq!(d.cmd(&["LOCK.SESSION", "CLOSE", sid]), Resp::Int(0));
}

#[test]
#[ignore = "needs Valkey 9 (CLUSTER MIGRATESLOTS); make integration runs it there"]
fn a_session_closed_or_lapsed_while_its_slot_streams_leaves_nothing_on_the_target() {
    require_asm();
    let (cluster, from) = cluster(2);
    let to = 1 - from;
    let mut s = conn(&cluster.nodes[from]);
    let (closed, lapsed) = ("asm-session-closed-0001", "asm-session-lapsed-0001");
    assert_eq!(
        s.cmd(&["LOCK.SESSION", "OPEN", closed, "PX", "60000"]),
        Resp::Int(1)
    );
    assert_eq!(
        s.cmd(&["LOCK.SESSION", "OPEN", lapsed, "PX", "2500"]),
        Resp::Int(1)
    );
    granted(&s.cmd(&acq(&key("c1"), &["SESSION", closed])));
    granted(&s.cmd(&acq(&key("c2"), &["SHARED", "SESSION", closed])));
    let (_, own) = granted(&s.cmd(&acq(&key("c2"), &["SHARED", "PX", "60000"])));
    let all = s.cmd(&[
        "LOCK.ACQUIREALL",
        "2",
        &key("l1"),
        &key("l2"),
        "SESSION",
        lapsed,
    ]);
    assert_eq!(all.items().len(), 2, "{all:?}");
    assert_eq!(
        s.cmd(&["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "1"]),
        ok()
    );
    start_move(&cluster, from, to);
    wait_export(&cluster, from, "waiting-to-pause");
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(s.cmd(&["LOCK.SESSION", "CLOSE", closed]), Resp::Int(2));
    // The other session's lease runs out while the slot streams.
    assert!(wait_until(SETTLE, || s
        .cmd(&["EXISTS", &key("l1"), &key("l2")])
        .int()
        == 0));
    assert_eq!(
        s.cmd(&["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "0"]),
        ok()
    );
    wait_export(&cluster, from, "success");
    let mut d = conn(&cluster.nodes[to]);
    assert_eq!(
        d.cmd(&["EXISTS", &key("c1"), &key("l1"), &key("l2")]),
        Resp::Int(0),
        "locks of ended sessions on the target"
    );
    assert_eq!(holder_fences(&info(&mut d, &key("c2"))), vec![own]);
}

#[test]
#[ignore = "needs Valkey 9 (CLUSTER MIGRATESLOTS); make integration runs it there"]
fn twenty_moves_under_an_acquireall_loop_in_sessions_open_on_both_nodes() {
    require_asm();
    let (cluster, first) = cluster(2);
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let clients: Vec<_> = (0..3u64)
        .map(|i| {
            let (ports, stop) = (ports.clone(), Arc::clone(&stop));
            thread::spawn(move || {
                let mut r = Routed::connect(&ports).unwrap();
                let mut seen = Vec::new();
                let mut other = 0u32;
                let t = tok(&format!("asm-all-{i}"));
                // Each client's session, open on both nodes: its locks move between them.
                // A node its lock left no longer keeps the session (NOSESSION there): the
                // client opens it again, as it would after the loss.
                let sid = format!("asm-all-session-{i:08}");
                let open = |first: bool| {
                    for p in &ports {
                        let mut c = RawConn::connect(*p);
                        let opened = c.cmd(&["LOCK.SESSION", "OPEN", &sid, "PX", "60000"]);
                        assert!(matches!(opened, Resp::Int(0..=1)), "{opened:?}");
                        assert!(!first || opened == Resp::Int(1));
                    }
                };
                open(true);
                let (k1, k2) = (key("all1"), key("all2"));
                while !stop.load(Ordering::Relaxed) {
                    let args = [
                        "LOCK.ACQUIREALL",
                        "2",
                        &k1,
                        &k2,
                        "SESSION",
                        &sid,
                        "TOKEN",
                        &t,
                        "BLOCK",
                        "300",
                    ];
                    let asked = t0.elapsed();
                    let reply = r.call(k1.as_bytes(), &args, SETTLE).unwrap();
                    let answered = t0.elapsed();
                    let fence = match &reply {
                        Resp::Array(a) if a.len() == 2 => a[1].items()[0].int(),
                        Resp::Nil => continue,
                        Resp::Error(e) if e.starts_with("LOCKMOVED") => {
                            other += 1;
                            continue;
                        }
                        Resp::Error(e) if e.starts_with("NOSESSION") => {
                            open(false);
                            continue;
                        }
                        other => panic!("{other:?}"),
                    };
                    seen.push(Seen {
                        asked: asked.as_nanos(),
                        answered: answered.as_nanos(),
                        fence,
                    });
                    let mine = format!("{i}:{fence}");
                    let set = ["LOCK.IFHELD", &k2, &t, "SET", &key("allowner"), &mine];
                    let get = ["LOCK.IFHELD", &k2, &t, "GET", &key("allowner")];
                    let wrote = r.call(k1.as_bytes(), &set, SETTLE).unwrap();
                    let read = r.call(k1.as_bytes(), &get, SETTLE).unwrap();
                    if wrote == ok() {
                        let alone = read == Resp::Bulk(mine.clone().into_bytes());
                        assert!(
                            alone || is_err_with(&read, "NOTHELD"),
                            "{mine}: another holder wrote {read:?}"
                        );
                    }
                    let rel = ["LOCK.RELEASEALL", "2", &k1, &k2, &t];
                    let released = r.call(k1.as_bytes(), &rel, SETTLE).unwrap();
                    assert!(matches!(released, Resp::Int(0..=2)), "{released:?}");
                }
                (seen, other)
            })
        })
        .collect();
    let mut at = first;
    for _ in 0..20 {
        let to = 1 - at;
        migrate(&cluster, at, to);
        at = to;
    }
    stop.store(true, Ordering::Relaxed);
    let mut seen = Vec::new();
    let mut moved = 0;
    for c in clients {
        let (s, m) = c.join().unwrap();
        seen.extend(s);
        moved += m;
    }
    let mut by_answer: Vec<&Seen> = seen.iter().collect();
    by_answer.sort_by_key(|g| g.answered);
    let mut by_ask: Vec<&Seen> = seen.iter().collect();
    by_ask.sort_by_key(|g| g.asked);
    let (mut i, mut top, mut regressions) = (0, i64::MIN, 0);
    for g in by_ask {
        while i < by_answer.len() && by_answer[i].answered < g.asked {
            top = top.max(by_answer[i].fence);
            i += 1;
        }
        regressions += usize::from(g.fence <= top);
    }
    eprintln!(
        "{} multi-key grants, {moved} LOCKMOVED over 20 moves",
        seen.len()
    );
    assert!(seen.len() >= 20, "{} grants over 20 moves", seen.len());
    assert_eq!(
        regressions,
        0,
        "fence regressions over {} grants",
        seen.len()
    );
}

#[test]
#[ignore = "needs Valkey 9 (CLUSTER MIGRATESLOTS); make integration runs it there"]
fn a_keepalive_renewing_locks_of_several_slots_reaches_the_target_of_one() {
    require_asm();
    let (cluster, from) = cluster(2);
    let to = 1 - from;
    let mut s = conn(&cluster.nodes[from]);
    // A key of another slot the source keeps.
    let stays = key_served_by(&cluster, from, slot(), "stays");
    let sid = "asm-session-two-slots-01";
    assert_eq!(
        s.cmd(&["LOCK.SESSION", "OPEN", sid, "PX", "4000"]),
        Resp::Int(1)
    );
    granted(&s.cmd(&acq(&stays, &["SESSION", sid])));
    granted(&s.cmd(&acq(&key("goes"), &["SESSION", sid])));
    granted(&s.cmd(&acq(&key("goes2"), &["SHARED", "SESSION", sid])));
    assert_eq!(
        s.cmd(&["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "1"]),
        ok()
    );
    start_move(&cluster, from, to);
    wait_export(&cluster, from, "waiting-to-pause");
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        s.cmd(&["LOCK.SESSION", "KEEPALIVE", sid, "PX", "60000"]),
        Resp::Int(1)
    );
    assert_eq!(
        s.cmd(&["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "0"]),
        ok()
    );
    wait_export(&cluster, from, "success");
    let mut d = conn(&cluster.nodes[to]);
    for k in [key("goes"), key("goes2")] {
        let ttl = info_int(&mut d, &k, "ttl");
        assert!(ttl > 30_000, "{k}: ttl {ttl} on the target");
    }
    assert!(info_int(&mut s, &stays, "ttl") > 30_000);
}

/// A session one of whose locks an atomic slot migration took to another node is no
/// longer kept alive on the source once the export completes (see the same test of a
/// legacy MIGRATE in `tests/cluster_moves.rs`): its keepalive there answers 0, its other
/// lock on the source ends with its lease, never sooner, and the moved lock on the target
/// is untouched by the source's refusal.
#[test]
#[ignore = "needs Valkey 9 (CLUSTER MIGRATESLOTS); make integration runs it there"]
fn a_session_that_lost_a_lock_to_a_slot_migration_is_not_kept_alive_on_the_source() {
    require_asm();
    let (cluster, from) = cluster(2);
    let to = 1 - from;
    let other = key_served_by(&cluster, from, slot(), "stays");
    let mut s = conn(&cluster.nodes[from]);
    let sid = "asm-session-lost-lock-001";
    let lease = 10_000;
    let opened = Instant::now();
    assert_eq!(
        s.cmd(&["LOCK.SESSION", "OPEN", sid, "PX", &lease.to_string()]),
        Resp::Int(1)
    );
    let (_, fm) = granted(&s.cmd(&acq(&key("moving"), &["SESSION", sid])));
    granted(&s.cmd(&acq(&other, &["SESSION", sid])));
    migrate(&cluster, from, to);
    let mut d = conn(&cluster.nodes[to]);
    assert_eq!(holder_fences(&info(&mut d, &key("moving"))), vec![fm]);
    // Its holder keeps the session alive where the lock is now.
    assert_eq!(
        d.cmd(&["LOCK.SESSION", "KEEPALIVE", sid, "PX", "60000"]),
        Resp::Int(1)
    );
    source_lets_moved_session_go(&cluster.nodes[from], sid, &other, opened, lease);
    assert_eq!(holder_fences(&info(&mut d, &key("moving"))), vec![fm]);
    assert_eq!(
        d.cmd(&["LOCK.SESSION", "KEEPALIVE", sid, "PX", "60000"]),
        Resp::Int(1)
    );
    assert!(info_int(&mut d, &key("moving"), "ttl") > 50_000);
}

/// While a slot exports, the module replicates keyless commands (`LOCK.SREPL` for
/// sessions, a `PING` that only counts a change) from every kind of context: MULTI, EVAL,
/// FCALL, the timer that ends a lapsed session, and the events of a DEL or UNLINK of a
/// session's lock. Valkey 9's `RM_Replicate` reads a keyless command's slot flags from an
/// uninitialised local while an export runs and fails the export as cross-slot when stale
/// stack bits say so; the module scrubs the stack before each such call. The export must
/// go on through all of it and then succeed (without the scrub it failed in the first
/// round: "A module replicated a cross-slot command").
#[test]
#[ignore = "needs Valkey 9 (CLUSTER MIGRATESLOTS); make integration runs it there"]
fn keyless_replication_from_every_context_does_not_fail_an_export() {
    require_asm();
    let (c, from) = cluster(2);
    let to = 1 - from;
    // A hash-tagged key this node serves, in another slot than the exported one: the
    // keys below that begin with it share its slot.
    let other = key_served_by(&c, from, slot(), "k");
    let mut s = conn(&c.nodes[from]);
    let lib = "#!lua name=asmk\nredis.register_function('sop', function(k, a) \
               return redis.call('LOCK.SESSION', a[1], a[2], 'PX', a[3]) end)";
    assert_eq!(s.cmd(&["FUNCTION", "LOAD", lib]).text(), "asmk");
    assert_eq!(
        s.cmd(&["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "1"]),
        ok()
    );
    start_move(&c, from, to);
    wait_export(&c, from, "waiting-to-pause");
    let sid = |what: &str, i: usize| format!("asm-keyless-session-{what}-{i:04}");
    for i in 0..40 {
        // MULTI: open, a lock of another slot in the session, keepalive, close.
        let m = sid("multi", i);
        assert_eq!(s.cmd(&["MULTI"]), ok());
        s.cmd(&["LOCK.SESSION", "OPEN", &m, "PX", "60000"]);
        s.cmd(&["LOCK.ACQUIRE", &format!("{other}:m{i}"), "SESSION", &m]);
        s.cmd(&["LOCK.SESSION", "KEEPALIVE", &m, "PX", "60000"]);
        s.cmd(&["LOCK.SESSION", "CLOSE", &m]);
        let exec = s.cmd(&["EXEC"]);
        assert_eq!(exec.items().len(), 4, "{exec:?}");
        // EVAL and FCALL.
        let e = sid("eval", i);
        let call = "return redis.call('LOCK.SESSION', ARGV[1], ARGV[2], 'PX', '60000')";
        assert_eq!(s.cmd(&["EVAL", call, "0", "OPEN", &e]), Resp::Int(1));
        assert_eq!(s.cmd(&["EVAL", call, "0", "KEEPALIVE", &e]), Resp::Int(1));
        let f = sid("fcall", i);
        assert_eq!(
            s.cmd(&["FCALL", "sop", "0", "OPEN", &f, "60000"]),
            Resp::Int(1)
        );
        assert_eq!(
            s.cmd(&["FCALL", "sop", "0", "KEEPALIVE", &f, "60000"]),
            Resp::Int(1)
        );
        // Timers: sessions that lapse, with a lock of another slot and without locks.
        let t = sid("lapse", i);
        s.cmd(&["LOCK.SESSION", "OPEN", &t, "PX", "150"]);
        s.cmd(&["LOCK.ACQUIRE", &format!("{other}:t{i}"), "SESSION", &t]);
        s.cmd(&["LOCK.SESSION", "OPEN", &sid("bare", i), "PX", "120"]);
        // Keyspace events: DEL and UNLINK of a session's locks, in both slots.
        let d = sid("del", i);
        s.cmd(&["LOCK.SESSION", "OPEN", &d, "PX", "60000"]);
        s.cmd(&["LOCK.ACQUIRE", &format!("{other}:d{i}"), "SESSION", &d]);
        s.cmd(&["LOCK.ACQUIRE", &key(&format!("d{i}")), "SESSION", &d]);
        s.cmd(&["DEL", &format!("{other}:d{i}")]);
        s.cmd(&["UNLINK", &key(&format!("d{i}"))]);
        thread::sleep(Duration::from_millis(60));
        let state = job(&c, from, "EXPORT").map_or("none".into(), |j| field(&j, "state"));
        assert_eq!(
            state, "waiting-to-pause",
            "round {i}: the export is {state}"
        );
    }
    // Let the last sessions lapse (their timers replicate) before the cut-over.
    thread::sleep(Duration::from_millis(500));
    wait_export(&c, from, "waiting-to-pause");
    assert_eq!(
        s.cmd(&["DEBUG", "SLOTMIGRATION", "PREVENT-PAUSE", "0"]),
        ok()
    );
    wait_export(&c, from, "success");
}
