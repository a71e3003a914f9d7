//! Issue 27: locks keep working while slots move (legacy migration: CLUSTER SETSLOT and
//! MIGRATE). A slot that arrived is confirmed on its own while other slots keep arriving,
//! and a key's fence never goes back however often its slot moves.

mod regress;

use redis_lock_testkit::lock::Routed;
use redis_lock_testkit::{key_slot, Cluster, Rng};
use regress::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// A key of each slot in `slots` (`k:<n>` for the first `n` that hashes there).
fn keys_of(slots: std::ops::Range<u16>) -> HashMap<u16, String> {
    let mut keys = HashMap::new();
    for n in 0.. {
        let k = format!("k:{n}");
        let s = key_slot(k.as_bytes());
        if slots.contains(&s) {
            keys.entry(s).or_insert(k);
        }
        if keys.len() == slots.len() {
            return keys;
        }
    }
    unreachable!()
}

/// Moves empty slots 0, 1, 2... from node 0 to node 1 one at a time, 3 ms apart, as an
/// operator's reshard does, until `stop` or `max` slots; each slot's arrival is recorded.
fn mover(
    cluster: Arc<Cluster>,
    arrived: Arc<Mutex<Vec<(u16, Instant)>>>,
    stop: Arc<AtomicBool>,
    max: u16,
) -> thread::JoinHandle<u16> {
    thread::spawn(move || {
        let mut conns: Vec<RawConn> = cluster.nodes.iter().map(Server::raw).collect();
        let ids = Cluster::ids_of(&mut conns).unwrap();
        let mut slot = 0;
        while slot < max && !stop.load(Ordering::Relaxed) {
            let moved = cluster.move_slot(&mut conns, &ids, slot, 0, 1, Duration::ZERO);
            moved.unwrap_or_else(|e| panic!("moving slot {slot}: {e}"));
            arrived.lock().unwrap().push((slot, Instant::now()));
            slot += 1;
            thread::sleep(Duration::from_millis(3));
        }
        slot
    })
}

#[test]
fn arrived_slots_are_confirmed_while_other_slots_keep_arriving() {
    let cluster = Arc::new(Cluster::start(2));
    const MAX: u16 = 1500;
    let keys = keys_of(0..MAX);
    // A slot node 1 always served (the control).
    let home = (0..)
        .map(|n| format!("home:{n}"))
        .find(|k| key_slot(k.as_bytes()) >= 8192);
    let home = home.unwrap();
    let arrived = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let moving = mover(
        Arc::clone(&cluster),
        Arc::clone(&arrived),
        Arc::clone(&stop),
        MAX,
    );
    let mut c = conn(&cluster.nodes[1]);
    let mut rng = Rng::new(27);
    let (mut arrived_granted, mut home_granted, mut tryagain) = (0u32, 0u32, 0u32);
    let t = tok("moves");
    // Keys of slots that arrived at least 0.2 s ago, until 50 are granted or the moves end.
    while arrived_granted < 50 && !moving.is_finished() {
        let old: Vec<u16> = (arrived.lock().unwrap().iter())
            .filter(|(_, at)| at.elapsed() >= Duration::from_millis(200))
            .map(|(s, _)| *s)
            .collect();
        let key = match old.is_empty() {
            true => &home,
            false => &keys[rng.pick(&old)],
        };
        match c.cmd(&acq(key, &["PX", "10000", "TOKEN", &t])) {
            Resp::Error(e) if e.starts_with("TRYAGAIN") => tryagain += 1,
            r => {
                granted(&r);
                assert_eq!(c.cmd(&["LOCK.RELEASE", key, &t]), Resp::Int(1));
                match key == &home {
                    true => home_granted += 1,
                    false => arrived_granted += 1,
                }
            }
        }
        thread::sleep(Duration::from_millis(2));
    }
    let still_moving = !moving.is_finished();
    stop.store(true, Ordering::Relaxed);
    let moved = moving.join().unwrap();
    assert!(
        still_moving && arrived_granted >= 50,
        "{arrived_granted} grants on slots that arrived at least 0.2 s before ({tryagain} TRYAGAIN, \
         {home_granted} grants on a slot that never moved) while {moved} slots arrived one \
         every few ms: an arriving slot holds up those that arrived before it"
    );
}

/// One grant as a client saw it: when it was asked and answered (ns since the start).
struct Seen {
    key: usize,
    asked: u128,
    answered: u128,
    fence: i64,
}

#[test]
fn fences_never_go_back_per_key_across_many_slot_moves() {
    let cluster = Arc::new(Cluster::start(3));
    let ports: Vec<u16> = cluster.nodes.iter().map(|n| n.port).collect();
    let keys: Arc<Vec<String>> = Arc::new((0..4).map(|i| format!("{{fm{i}}}:lock")).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let clients: Vec<_> = (0..3u64)
        .map(|i| {
            let (ports, keys, stop) = (ports.clone(), Arc::clone(&keys), Arc::clone(&stop));
            thread::spawn(move || {
                let mut r = Routed::connect(&ports).unwrap();
                let mut rng = Rng::new(100 + i);
                let mut seen = Vec::new();
                let t = tok(&format!("fm-client-{i}"));
                while !stop.load(Ordering::Relaxed) {
                    let k = rng.below(keys.len() as u64) as usize;
                    let key = keys[k].as_bytes();
                    let mut cmd = vec!["LOCK.ACQUIRE", &keys[k], "PX", "5000", "TOKEN", &t];
                    if i == 2 {
                        cmd.extend(["BLOCK", "50"]);
                    }
                    let asked = t0.elapsed().as_nanos();
                    let reply = r.call(key, &cmd, SETTLE).unwrap();
                    let answered = t0.elapsed().as_nanos();
                    let Some((_, fence)) = reply.grant() else {
                        // Busy, timed out, or LOCKMOVED (a waiter whose key moved).
                        assert!(
                            matches!(&reply, Resp::Nil)
                                || matches!(&reply, Resp::Error(e) if e.starts_with("LOCKMOVED")),
                            "{}: {reply:?}",
                            keys[k]
                        );
                        continue;
                    };
                    let fence = fence as i64;
                    seen.push(Seen {
                        key: k,
                        asked,
                        answered,
                        fence,
                    });
                    let released = r
                        .call(key, &["LOCK.RELEASE", &keys[k], &t], SETTLE)
                        .unwrap();
                    assert_eq!(released, Resp::Int(1), "{}", keys[k]);
                }
                seen
            })
        })
        .collect();
    // The keys' slots moved around the three nodes, 60 times, 0-20 ms apart.
    let mut conns: Vec<RawConn> = cluster.nodes.iter().map(Server::raw).collect();
    let ids = Cluster::ids_of(&mut conns).unwrap();
    let mut rng = Rng::new(27);
    let mut owners: Vec<(u16, usize)> = (keys.iter())
        .map(|k| {
            let s = key_slot(k.as_bytes());
            (s, cluster.slot_owner(s).unwrap())
        })
        .collect();
    let moves = AtomicUsize::new(0);
    for _ in 0..60 {
        let i = rng.below(owners.len() as u64) as usize;
        let (slot, from) = owners[i];
        let to = (from + 1 + rng.below(2) as usize) % 3;
        let pause = Duration::from_millis(rng.below(20));
        let r = cluster.move_slot(&mut conns, &ids, slot, from, to, pause);
        r.unwrap_or_else(|e| {
            let views: Vec<String> = (cluster.nodes.iter())
                .map(|n| conn(n).cmd(&["CLUSTER", "NODES"]).text())
                .collect();
            panic!(
                "moving slot {slot} from {from} to {to}: {e}\n{}",
                views.join("\n")
            )
        });
        assert!(
            cluster.wait_slot_owner(slot, to, SETTLE),
            "slot {slot}: not every node sees node {to} serve it\n{}",
            cluster.describe()
        );
        owners[i].1 = to;
        moves.fetch_add(1, Ordering::Relaxed);
        thread::sleep(Duration::from_millis(rng.below(20)));
    }
    stop.store(true, Ordering::Relaxed);
    let seen: Vec<Seen> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    // Per key: a grant answered before another was asked has the lower fence.
    let mut regressions = Vec::new();
    for k in 0..keys.len() {
        let mut grants: Vec<&Seen> = seen.iter().filter(|s| s.key == k).collect();
        grants.sort_by_key(|g| g.answered);
        let mut before = 0; // grants answered before `g` was asked
        let mut top = i64::MIN;
        let mut by_asked: Vec<&Seen> = grants.clone();
        by_asked.sort_by_key(|g| g.asked);
        for g in by_asked {
            while before < grants.len() && grants[before].answered < g.asked {
                top = top.max(grants[before].fence);
                before += 1;
            }
            if g.fence <= top {
                regressions.push(format!("{}: fence {} after {top}", keys[k], g.fence));
            }
        }
    }
    let per_key: Vec<usize> = (0..keys.len())
        .map(|k| seen.iter().filter(|s| s.key == k).count())
        .collect();
    assert!(
        per_key.iter().all(|&n| n >= 20),
        "too few grants per key to judge: {per_key:?}"
    );
    assert!(
        regressions.is_empty(),
        "{} fence regressions per key over {} moves and {} grants: {:?}",
        regressions.len(),
        moves.load(Ordering::Relaxed),
        seen.len(),
        &regressions[..regressions.len().min(10)]
    );
}

/// Sessions and multi-key locks meet a legacy slot move (MIGRATE of each key): the
/// session's locks (taken one key and several at once) arrive whole with their session's
/// lease, the target learns the session (its keepalive renews them there), a multi-key
/// waiter on the source gets TRYAGAIN, and ACQUIREALL on the target works once the slot
/// is confirmed there.
#[test]
fn session_and_multi_key_locks_follow_a_legacy_migrate() {
    let cluster = Cluster::start(2);
    let k = |n: &str| format!("{{mvs}}:{n}");
    let slot = key_slot(b"mvs");
    let from = cluster.slot_owner(slot).expect("an owner");
    let to = 1 - from;
    let mut s = conn(&cluster.nodes[from]);
    let sid = "moves-session-id-00000001";
    assert_eq!(
        s.cmd(&["LOCK.SESSION", "OPEN", sid, "PX", "60000", "OWNER", "mv"]),
        Resp::Int(1)
    );
    let (a, b, c) = (k("a"), k("b"), k("c"));
    let t = tok("mvs-all");
    let all = s.cmd(&[
        "LOCK.ACQUIREALL",
        "2",
        &a,
        &b,
        "MODES",
        "EXCLUSIVE",
        "SHARED",
        "SESSION",
        sid,
        "TOKEN",
        &t,
    ]);
    assert_eq!(all.items().len(), 2, "{all:?}");
    let (tc, fc) = granted(&s.cmd(&acq(&c, &["SESSION", sid])));
    let mut waiter = Pending::send(
        cluster.nodes[from].port,
        &[
            "LOCK.ACQUIREALL",
            "2",
            &a,
            &k("d"),
            "PX",
            "60000",
            "BLOCK",
            "20000",
        ],
    );
    wait_waiters(&mut s, &a, 1);
    // What the key is, without the source's waiter.
    let durable = |c: &mut RawConn, key: &str| {
        paths::durable_info(c, key).map(|f| {
            f.into_iter()
                .filter(|(n, _)| n != "longest-wait")
                .collect::<Vec<_>>()
        })
    };
    let before: Vec<_> = [&a, &b, &c]
        .iter()
        .map(|key| durable(&mut s, key))
        .collect();
    let moved = cluster.migrate_slot(slot, to, Duration::ZERO).unwrap();
    assert_eq!(moved, 3, "keys moved");
    let r = waiter
        .reply_within(Duration::from_secs(5))
        .expect("an answer to the waiter");
    // As a one-key waiter there: the client retries and is redirected.
    assert!(is_err_with(&r, "TRYAGAIN"), "{r:?}");
    let mut d = conn(&cluster.nodes[to]);
    for (key, w) in [&a, &b, &c].iter().zip(&before) {
        let got = durable(&mut d, key);
        if let Err(e) = paths::same_state(w, &got) {
            panic!("{key} on the target: {e}");
        }
    }
    let session = d.cmd(&["LOCK.SESSION", "INFO", sid]);
    assert_eq!(session.get("locks"), Some(Resp::Int(3)), "{session:?}");
    assert_eq!(
        d.cmd(&["LOCK.SESSION", "KEEPALIVE", sid, "PX", "90000"]),
        Resp::Int(1)
    );
    assert!(info_int(&mut d, &c, "ttl") > 80_000);
    // A multi-key grant on the target (TRYAGAIN while it confirms the slot).
    let mut got = Resp::Nil;
    assert!(wait_until(SETTLE, || {
        got = d.cmd(&["LOCK.ACQUIREALL", "2", &k("e"), &k("f"), "PX", "60000"]);
        !is_err_with(&got, "TRYAGAIN")
    }));
    assert_eq!(got.items().len(), 2, "{got:?}");
    assert_eq!(fc, holder_fences(&info(&mut d, &c))[0]);
    assert_eq!(
        d.cmd(&["LOCK.RELEASE", &c, &String::from_utf8(tc).unwrap()]),
        Resp::Int(1)
    );
    assert_eq!(d.cmd(&["LOCK.SESSION", "CLOSE", sid]), Resp::Int(2));
    assert_eq!(d.cmd(&["EXISTS", &a, &b]), Resp::Int(0));
}

/// A session one of whose locks a legacy slot move (MIGRATE, as `redis-cli --cluster
/// reshard` does) took to another node is no longer kept alive on the source: the moved
/// lock lasts on its new node only as long as the keepalives that reach it there, so a
/// keepalive on the source answering 1 would tell its holder that everything holds while
/// the moved lock runs out. The session's other lock on the source ends with its lease,
/// never sooner; the moved lock on the target is untouched by the source's refusal.
#[test]
fn a_session_that_lost_a_lock_to_a_migrate_is_not_kept_alive_on_the_source() {
    let cluster = Cluster::start(2);
    let slot = key_slot(b"mvl");
    let moving = "{mvl}:moving".to_string();
    let from = cluster.slot_owner(slot).expect("an owner");
    let to = 1 - from;
    let other = key_served_by(&cluster, from, slot, "stays");
    let mut s = conn(&cluster.nodes[from]);
    let sid = "moves-session-lost-lock-01";
    let lease = 10_000;
    let opened = Instant::now();
    assert_eq!(
        s.cmd(&["LOCK.SESSION", "OPEN", sid, "PX", &lease.to_string()]),
        Resp::Int(1)
    );
    let (_, fm) = granted(&s.cmd(&acq(&moving, &["SESSION", sid])));
    granted(&s.cmd(&acq(&other, &["SESSION", sid])));
    assert_eq!(cluster.migrate_slot(slot, to, Duration::ZERO).unwrap(), 1);
    let mut d = conn(&cluster.nodes[to]);
    assert_eq!(holder_fences(&info(&mut d, &moving)), vec![fm]);
    // Its holder keeps the session alive where the lock is now.
    assert_eq!(
        d.cmd(&["LOCK.SESSION", "KEEPALIVE", sid, "PX", "60000"]),
        Resp::Int(1)
    );
    source_lets_moved_session_go(&cluster.nodes[from], sid, &other, opened, lease);
    // The target kept the moved lock, and keeps the session alive there.
    assert_eq!(holder_fences(&info(&mut d, &moving)), vec![fm]);
    assert_eq!(
        d.cmd(&["LOCK.SESSION", "KEEPALIVE", sid, "PX", "60000"]),
        Resp::Int(1)
    );
    assert!(info_int(&mut d, &moving, "ttl") > 50_000);
}
