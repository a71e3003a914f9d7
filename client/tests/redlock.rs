//! Redlock over 5 independent servers: node failures (SIGKILL / SIGSTOP), no partial
//! locks left behind, mutual exclusion under chaos, and quorum fencing.

mod util;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis_lock_client::{AcquireOptions, ClientOptions, Error, Redlock, RedlockOptions};
use redis_lock_testkit::{wait_until, Server, ServerBuilder};
use util::{
    granted, held_fence, is_free, lift_fence_counter, lock_stat, lost_within, ms, probe_fence,
    redlock, renewing, servers, setup, urls, Stopped,
};

/// Five servers with the module and a Redlock over them (`node_timeout_ms` per node).
fn five(node_timeout_ms: u64) -> (Vec<Server>, Redlock) {
    setup();
    let s = servers(5);
    let rl = redlock(&urls(&s), ms(node_timeout_ms));
    (s, rl)
}

/// How long an acquisition that must be granted may retry. A node limit short enough
/// that a stopped node costs little (100-300 ms) is also one that a live node misses on a
/// loaded machine (1-2 s pauses), failing one attempt: retried, as a caller would, and the
/// guarantee is the same (a grant, within this bound, despite the nodes down).
const RETRY: Duration = Duration::from_secs(10);

/// A node limit for tests where no node is stopped: a killed node refuses at once, so
/// only a live node's answer has to fit in it, scheduling on a loaded machine included.
const LIVE_NODE_LIMIT: u64 = 2_000;

/// Freed by the release on every node in `live`: free within 4 s (a release sent within
/// a node's limit may reach a node that answered that limit late only after the call
/// returned), and not by its lease running out meanwhile (no live node counts an expiry
/// while this waits, so a release that left the lock behind still fails).
fn freed_on(servers: &[Server], live: &[usize], key: &str) -> bool {
    let expired = |i: usize| lock_stat(&servers[i], "lock_expired");
    let before: Vec<i64> = live.iter().map(|&i| expired(i)).collect();
    wait_until(Duration::from_secs(4), || free_on(servers, live, key))
        && live.iter().zip(before).all(|(&i, b)| expired(i) == b)
}

/// True when `rl` finds `key` held elsewhere: a majority answered, and no 30 s lease
/// was granted (after waiting `wait`, if given).
async fn refused(rl: &Redlock, key: &str, wait: Option<Duration>) -> bool {
    rl.acquire(key, ms(30_000), wait).await.unwrap().is_none()
}

/// True when `rl` could not ask a majority of nodes about `key` (`NoQuorum`), and so
/// granted nothing (after waiting `wait`, if given).
async fn unreachable(rl: &Redlock, key: &str, wait: Option<Duration>) -> bool {
    matches!(
        rl.acquire(key, ms(30_000), wait).await,
        Err(Error::NoQuorum { .. })
    )
}

/// One acquisition and release, so that the Redlock has a connection to every node.
async fn warm(rl: &Redlock) {
    let g = granted(rl.acquire("lock:warm", ms(1_000), Some(RETRY))).await;
    g.release().await.unwrap();
}

fn rand_below(n: u64) -> u64 {
    (uuid::Uuid::new_v4().as_u128() as u64) % n
}

/// Every live node in `live` has `key` free.
fn free_on(servers: &[Server], live: &[usize], key: &str) -> bool {
    live.iter().all(|&i| is_free(&mut servers[i].conn(), key))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_down_acquisitions_still_succeed() {
    setup();
    let mut s = servers(5);
    // A node limit of 200 ms, and an I/O limit far above it: a call that ignored the
    // node limit on a stopped node would take 30 s, not the hang guard's 10 s below.
    let rl = Redlock::with_options(
        &urls(&s),
        RedlockOptions {
            node_timeout: Some(ms(200)),
            client: ClientOptions {
                io_timeout: Duration::from_secs(30),
                ..RedlockOptions::default().client
            },
            ..RedlockOptions::default()
        },
    )
    .unwrap();
    assert_eq!(rl.quorum(), 3);

    // Two SIGKILLed.
    s[0].kill9();
    s[3].kill9();
    let mut last = 0;
    for i in 0..5 {
        let g = rl
            .acquire("lock:rl", ms(5_000), Some(RETRY))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("attempt {i} with 2 of 5 killed failed"));
        let f = g.fence().expect("quorum fence");
        assert!(f > last, "fence {f} after {last}");
        last = f;
        for &n in &[1, 2, 4] {
            assert!(held_fence(&mut s[n].conn(), "lock:rl").is_some());
        }
        // Its result counts the nodes that answered within 200 ms: what it left behind
        // is what matters.
        g.release().await.unwrap();
        assert!(freed_on(&s, &[1, 2, 4], "lock:rl"));
    }

    // Two SIGSTOPped (and the two killed ones back: they answer again).
    s[0].restart();
    s[3].restart();
    let stopped = [Stopped::new(s[1].pid()), Stopped::new(s[4].pid())];
    for i in 0..5 {
        // A hang guard: the stopped nodes cost each attempt their 200 ms limit; without
        // it a call to them would wait for the 30 s I/O limit.
        let t = Instant::now();
        let g = tokio::time::timeout(
            Duration::from_secs(10),
            rl.acquire("lock:rl", ms(5_000), Some(Duration::from_secs(5))),
        )
        .await
        .unwrap_or_else(|_| panic!("attempt {i} with 2 of 5 stopped hung"))
        .unwrap()
        .unwrap_or_else(|| panic!("attempt {i} with 2 of 5 stopped failed"));
        eprintln!(
            "granted {:?} after the call with 2 of 5 stopped",
            t.elapsed()
        );
        let f = g.fence().expect("quorum fence");
        assert!(f > last, "fence {f} after {last}");
        last = f;
        g.release().await.unwrap();
        assert!(freed_on(&s, &[0, 2, 3], "lock:rl"));
    }
    drop(stopped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_down_no_acquisition_and_no_partial_lock() {
    let (mut s, rl) = five(200);
    // Connect to every node once, so that later commands to stopped nodes are queued
    // on open connections and applied when the nodes resume.
    warm(&rl).await;

    // Three SIGKILLed: never a grant, and the two live nodes are left clean.
    for &i in &[0, 2, 4] {
        s[i].kill9();
    }
    for _ in 0..5 {
        assert!(unreachable(&rl, "lock:rl3", None).await);
        assert!(
            freed_on(&s, &[1, 3], "lock:rl3"),
            "partial lock left behind"
        );
    }
    // Also while waiting (retries with jitter).
    assert!(unreachable(&rl, "lock:rl3", Some(ms(800))).await);
    assert!(freed_on(&s, &[1, 3], "lock:rl3"));

    // Three SIGSTOPped: the same, and once they resume the acquisitions that reached
    // them late are undone by the releases queued behind them.
    for &i in &[0, 2, 4] {
        s[i].restart();
    }
    warm(&rl).await;
    let stopped: Vec<Stopped> = [1, 2, 3]
        .iter()
        .map(|&i| Stopped::new(s[i].pid()))
        .collect();
    for _ in 0..3 {
        assert!(unreachable(&rl, "lock:rl3s", None).await);
        assert!(
            freed_on(&s, &[0, 4], "lock:rl3s"),
            "partial lock left behind"
        );
    }
    drop(stopped);
    assert!(
        wait_until(Duration::from_secs(5), || free_on(
            &s,
            &[0, 1, 2, 3, 4],
            "lock:rl3s"
        )),
        "a timed-out node kept a lock after it resumed"
    );
}

/// Fewer than a majority of nodes that can be asked at all (a wrong password on every
/// node, two of three down) is an error (`NoQuorum`, naming why), not "busy"; a lock
/// held elsewhere on a majority stays `Ok(None)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_usable_majority_is_an_error_not_busy() {
    setup();
    let mut s = util::servers_with_password(3, "right-pw");
    let with_pw = |pw: &str| -> Vec<String> {
        s.iter()
            .map(|x| format!("redis://:{pw}@{}", x.addr()))
            .collect()
    };
    let rl = redlock(&with_pw("right-pw"), ms(LIVE_NODE_LIMIT));
    let holder = granted(rl.acquire("lock:nq", ms(30_000), None)).await;
    assert!(refused(&rl, "lock:nq", None).await, "held elsewhere: busy");

    let no_quorum = |r: redis_lock_client::Result<Option<redis_lock_client::LockGuard>>,
                     answered: usize| {
        match r {
            Err(e @ Error::NoQuorum { .. }) => {
                let Error::NoQuorum {
                    answered: a,
                    needed,
                    ..
                } = &e
                else {
                    unreachable!()
                };
                assert_eq!((*a, *needed), (answered, 2), "{e}");
                e.to_string()
            }
            other => panic!("expected NoQuorum, got {other:?}"),
        }
    };
    let wrong = redlock(&with_pw("s3cret-but-wrong"), ms(LIVE_NODE_LIMIT));
    let text = no_quorum(wrong.acquire("lock:nq", ms(30_000), None).await, 0);
    assert!(text.contains("authentication failed"), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
    // Also after waiting: the last attempt's error, not None.
    let waited = wrong.acquire("lock:nq2", ms(30_000), Some(ms(400))).await;
    no_quorum(waited, 0);

    s[0].kill9();
    s[1].kill9();
    let text = no_quorum(rl.acquire("lock:nq", ms(30_000), None).await, 1);
    assert!(text.contains("majority"), "{text}");
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_fences_strictly_increase() {
    let (s, rl) = five(200);

    // Node 0's counter ahead of the others (like a node whose clock runs fast), as far
    // as MINFENCE may lift it: just below an hour ahead of its clock term
    // (`unix_ms << 10`). The others started earlier, and their fences start an hour
    // ahead of their start time, so they stay below node 0's for the next hour.
    tokio::time::sleep(ms(200)).await;
    let ahead = lift_fence_counter(&s[0], 100);
    for (i, node) in s.iter().enumerate().skip(1) {
        let f = probe_fence(node);
        assert!(
            f < ahead,
            "node {i}'s counter {f} is not behind node 0's {ahead}"
        );
    }

    // With node 0 in the majority the quorum fence is node 0's (the maximum).
    let g = granted(rl.acquire("lock:f", ms(10_000), Some(RETRY))).await;
    let mut last = g.fence().unwrap();
    assert!(last > ahead);
    // Round 2 (MINFENCE) raised the counters of the nodes that granted a lower fence.
    g.release().await.unwrap();

    // Without node 0 the other nodes' own counters would give less; quorum fencing
    // keeps the order. Then every other pair of nodes down in turn.
    let downs: [&[usize]; 7] = [&[0], &[0, 1], &[2, 3], &[3, 4], &[0, 4], &[1, 2], &[]];
    for down in downs {
        let stopped: Vec<Stopped> = down.iter().map(|&i| Stopped::new(s[i].pid())).collect();
        let g = rl
            .acquire("lock:f", ms(10_000), Some(RETRY))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no grant with {down:?} down"));
        let f = g.fence().unwrap();
        assert!(f > last, "fence {f} not above {last} (down: {down:?})");
        last = f;
        g.release().await.unwrap();
        drop(stopped);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_needs_a_majority() {
    // No node is stopped here, only killed (refusing at once): a node limit and a lease
    // that a loaded machine's 1-2 s pauses fit in (a 600 ms lease renewed every 200 ms
    // under a 150 ms limit was lost with 4 of 5 up when a renewal came late).
    let (mut s, rl) = five(LIVE_NODE_LIMIT);
    let g = granted(rl.acquire_with("lock:ren", &renewing(3_000))).await;
    let lost = g.lost();
    tokio::pin!(lost);
    tokio::time::sleep(ms(400)).await;
    s[0].kill9();
    // Longer than the lease: without renewals reaching the 4 live nodes it is lost.
    tokio::select! {
        r = &mut lost => panic!("lost with 4 of 5 up: {r:?}"),
        _ = tokio::time::sleep(ms(4_000)) => {}
    }
    assert!(g.is_held());
    for &i in &[1, 2, 3, 4] {
        assert!(held_fence(&mut s[i].conn(), "lock:ren").is_some());
    }
    // Two more down: renewals reach 2 of 5, the loss signal fires (the next renewal,
    // within a second, or the margin before the 3 s lease ends; the bound is a hang
    // guard).
    let t = Instant::now();
    s[1].kill9();
    s[2].kill9();
    let reason = lost_within(ms(8_000), &mut lost).await;
    eprintln!(
        "Redlock loss {:?} after the third node died: {reason}",
        t.elapsed()
    );
    assert!(!g.is_held());
    g.release().await.unwrap();
    assert!(freed_on(&s, &[3, 4], "lock:ren"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_without_the_module_take_part_without_fences() {
    setup();
    let mut s = servers(2);
    s.push(ServerBuilder::new().no_module().start());
    let rl = redlock(&urls(&s), ms(LIVE_NODE_LIMIT));
    let g = granted(rl.acquire("lock:mix", ms(5_000), None)).await;
    // Two of three nodes run the module: a majority, so a quorum fence.
    let f = g.fence().expect("2 of 3 fenced nodes make a quorum");
    let v: String = redis::cmd("GET")
        .arg("lock:mix")
        .query(&mut s[2].conn())
        .unwrap();
    assert_eq!(v, g.token(), "SET NX PX on the plain node");
    assert!(g.release().await.unwrap());
    assert!(free_on(&s, &[0, 1], "lock:mix"));
    let exists: i64 = redis::cmd("EXISTS")
        .arg("lock:mix")
        .query(&mut s[2].conn())
        .unwrap();
    assert_eq!(exists, 0, "compare-and-delete on the plain node");

    // With the module on one node only there is no quorum fence, but still a lock.
    s[1] = ServerBuilder::new().no_module().start();
    let rl = redlock(&urls(&s), ms(LIVE_NODE_LIMIT));
    let g = granted(rl.acquire("lock:mix", ms(5_000), None)).await;
    assert_eq!(g.fence(), None);
    assert!(refused(&rl, "lock:mix", None).await);
    assert!(g.release().await.unwrap());
    assert!(rl
        .acquire("lock:mix", ms(5_000), None)
        .await
        .unwrap()
        .is_some());
    assert!(f > 0);
}

/// One critical section as its client saw it: from the acquisition to the end of the
/// work, cut at the lease deadline the client knew.
#[derive(Debug, Clone, Copy)]
struct Section {
    client: usize,
    start: Instant,
    end: Instant,
    fence: Option<u64>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contending_clients_under_node_kills_and_restarts_never_overlap() {
    setup();
    let s = servers(5);
    let urls = urls(&s);
    let ttl = ms(1_000);
    // At least 10 s and 10 critical sections: on a loaded machine, where many attempts
    // miss the 100 ms node limit, the run goes on (up to a minute) until there are that
    // many sections to compare, rather than failing on a count in a fixed window.
    let (run_for, give_up) = (Duration::from_secs(10), Duration::from_secs(60));
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let sections: Arc<Mutex<Vec<Section>>> = Arc::default();
    let misses = Arc::new(Mutex::new(0usize));

    let mut clients = Vec::new();
    for id in 0..3 {
        let rl = redlock(&urls, ms(100));
        let sections = sections.clone();
        let misses = misses.clone();
        let stop = stop.clone();
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let opts = AcquireOptions::new(ttl)
                    .wait(ms(1_500))
                    .auto_renew(ms(3_000));
                let Some(g) = rl.acquire_with("lock:chaos", &opts).await.unwrap() else {
                    *misses.lock().unwrap() += 1;
                    continue;
                };
                let start = Instant::now();
                let work = ms(20 + rand_below(200));
                tokio::select! {
                    _ = tokio::time::sleep(work) => {}
                    _ = g.lost() => {}
                }
                let now = Instant::now();
                let end = g.valid_until().map_or(now, |v| v.min(now));
                sections.lock().unwrap().push(Section {
                    client: id,
                    start,
                    end,
                    fence: g.fence(),
                });
                let _ = g.release().await;
                tokio::time::sleep(ms(rand_below(30))).await;
            }
        }));
    }

    // Chaos: two threads, each disturbing one of its two nodes at a time (so at most
    // two of five are down); node 4 is left alone. A killed node comes back only after
    // a full TTL (a "delayed restart": it lost its locks, so it must not rejoin while
    // one of them could still be valid elsewhere).
    let mut pool = s.into_iter();
    let groups: Vec<Vec<Server>> = vec![
        pool.by_ref().take(2).collect(),
        pool.by_ref().take(2).collect(),
    ];
    let rest: Vec<Server> = pool.collect();
    let mut chaos = Vec::new();
    for mut group in groups {
        let stop = stop.clone();
        chaos.push(tokio::task::spawn_blocking(move || {
            let mut events = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                sleep(ms(200 + rand_below(400)));
                let i = rand_below(2) as usize;
                if rand_below(2) == 0 {
                    group[i].kill9();
                    sleep(ttl + ms(300));
                    group[i].restart();
                    events.push("kill+restart");
                } else {
                    let st = Stopped::new(group[i].pid());
                    sleep(ms(100 + rand_below(1_200)));
                    drop(st);
                    events.push("stop+cont");
                }
            }
            (group, events)
        }));
    }
    loop {
        tokio::time::sleep(ms(200)).await;
        let (n, t) = (sections.lock().unwrap().len(), started.elapsed());
        if (t >= run_for && n >= 10) || t >= give_up {
            break;
        }
    }
    // The chaos first (each thread ends its disruption: every node answers again), then
    // the clients.
    stop.store(true, Ordering::Relaxed);
    let mut events = Vec::new();
    let mut keep = rest;
    for c in chaos {
        let (g, e) = c.await.unwrap();
        keep.extend(g);
        events.extend(e);
    }
    for c in clients {
        c.await.unwrap();
    }

    let mut all = sections.lock().unwrap().clone();
    all.sort_by_key(|s| s.start);
    let overlaps = all
        .windows(2)
        .filter(|w| w[1].start < w[0].end)
        .inspect(|w| eprintln!("OVERLAP: {:?} and {:?}", w[0], w[1]))
        .count();
    let per_client: Vec<usize> = (0..3)
        .map(|id| all.iter().filter(|s| s.client == id).count())
        .collect();
    eprintln!(
        "chaos, {:?}: {} critical sections {per_client:?}, {} failed acquisitions, {} disruptions {events:?}, {overlaps} overlaps",
        started.elapsed(),
        all.len(),
        *misses.lock().unwrap(),
        events.len()
    );
    assert_eq!(overlaps, 0, "overlapping critical sections");
    assert!(events.len() >= 4, "too little chaos: {events:?}");
    assert!(all.len() >= 10, "only {} critical sections", all.len());
    let fences: Vec<u64> = all.iter().filter_map(|s| s.fence).collect();
    assert_eq!(fences.len(), all.len(), "every grant has a quorum fence");
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences not increasing in grant order: {fences:?}"
    );
    drop(keep);
}
