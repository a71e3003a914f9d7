//! Shared (read-write) and counted (semaphore) guards against real servers: readers
//! coexist and a writer waits for all of them, n permits, renewal and the loss signal per
//! holder, WRONGMODE / LIMITMISMATCH as errors, the fallback refusing what it cannot do,
//! LOCK.INFO over RESP3, and Redlock: shared allowed (with quorum fencing), counted
//! refused.

mod util;

use std::time::{Duration, Instant};

use redis_lock_client::{AcquireOptions, ClientOptions, Error, LockClient, LockMode, LossReason};
use redis_lock_testkit::{wait_until, ServerBuilder};
use util::{
    client, granted, is_free, lift_fence_counter, lock_stat, lost_within, ms, probe_fence,
    raw_fences, redlock, renewing, server_with_client, servers, setup, urls,
};

fn opts(ttl_ms: u64) -> AcquireOptions {
    AcquireOptions::new(ms(ttl_ms))
}

/// The reason `lost` gives (within `limit`), and how long it took.
async fn lost_after(
    limit: Duration,
    lost: impl std::future::Future<Output = Option<LossReason>>,
) -> (LossReason, Duration) {
    let t = Instant::now();
    let reason = lost_within(limit, lost).await;
    (reason, t.elapsed())
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_guards_coexist_and_a_writer_waits_for_all() {
    let (server, mut c, a) = server_with_client(ServerBuilder::new()).await;
    let b = client(&server.url()).await;

    let r1 = a
        .acquire_with("lock:rw", &opts(10_000).shared().owner("reader-1"))
        .await
        .unwrap()
        .expect("a free key is granted");
    let r2 = b
        .acquire_with("lock:rw", &opts(10_000).shared().owner("reader-2"))
        .await
        .unwrap()
        .expect("a second reader shares it");
    assert_eq!((r1.mode(), r2.mode()), (LockMode::Shared, LockMode::Shared));
    let (f1, f2) = (r1.fence().unwrap(), r2.fence().unwrap());
    assert!(f2 > f1);
    assert_ne!(r1.token(), r2.token(), "each holder has its own token");
    assert_eq!(raw_fences(&server, "lock:rw"), vec![f1, f2]);

    // LOCK.INFO through the client: the mode and both holders, no top-level holder.
    let info = a.info("lock:rw").await.unwrap().expect("held");
    assert_eq!(info.mode, Some(LockMode::Shared));
    assert_eq!(info.holders, Some(2));
    assert_eq!(info.fence, None);
    let owners: Vec<_> = info
        .holder_list
        .iter()
        .map(|h| (h.fence, h.owner.clone()))
        .collect();
    assert_eq!(
        owners,
        vec![
            (f1, Some("reader-1".to_string())),
            (f2, Some("reader-2".to_string()))
        ]
    );

    // A writer (exclusive) is refused while readers hold it, and waits for all of them.
    assert!(b
        .acquire("lock:rw", ms(10_000), None)
        .await
        .unwrap()
        .is_none());
    let w = client(&server.url()).await;
    let writer = tokio::spawn(async move {
        let g = w
            .acquire_with("lock:rw", &opts(10_000).wait(ms(10_000)).owner("writer"))
            .await
            .unwrap()
            .expect("the writer gets it after the readers");
        (Instant::now(), g)
    });
    tokio::time::sleep(ms(300)).await;
    assert!(r1.release().await.unwrap());
    tokio::time::sleep(ms(300)).await;
    assert!(!writer.is_finished(), "one reader still holds it");
    // A reader arriving after the queued writer waits too (no writer starvation).
    assert!(a
        .acquire_with("lock:rw", &opts(10_000).shared())
        .await
        .unwrap()
        .is_none());
    let released_at = Instant::now();
    assert!(r2.release().await.unwrap());
    let (got_at, wg) = writer.await.unwrap();
    assert!(got_at >= released_at);
    assert_eq!(wg.mode(), LockMode::Exclusive);
    assert!(wg.fence().unwrap() > f2);
    let info = a.info("lock:rw").await.unwrap().unwrap();
    assert_eq!(info.mode, Some(LockMode::Exclusive));
    assert_eq!(
        info.fence,
        wg.fence(),
        "exclusive: the top-level holder fields"
    );
    assert_eq!(info.owner.as_deref(), Some("writer"));
    assert_eq!(info.holder_list.len(), 1);
    assert!(wg.release().await.unwrap());
    assert!(is_free(&mut c, "lock:rw"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counted_guards_take_n_permits_and_the_next_waits_for_one() {
    let (server, mut c, locks) = server_with_client(ServerBuilder::new()).await;
    let o = opts(10_000).limit(3);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(
            locks
                .acquire_with("lock:sem", &o)
                .await
                .unwrap()
                .expect("a free permit"),
        );
    }
    assert!(held.iter().all(|g| g.mode() == LockMode::Counted(3)));
    let fences: Vec<u64> = held.iter().map(|g| g.fence().unwrap()).collect();
    assert_eq!(raw_fences(&server, "lock:sem"), sorted(fences.clone()));
    assert!(
        locks.acquire_with("lock:sem", &o).await.unwrap().is_none(),
        "all 3 permits taken"
    );
    let info = locks.info("lock:sem").await.unwrap().unwrap();
    assert_eq!(info.mode, Some(LockMode::Counted(3)));
    assert_eq!((info.limit, info.holders), (Some(3), Some(3)));

    // A fourth waits in the queue and gets the permit the first one gives back.
    let l2 = locks.clone();
    let waiter = tokio::spawn(async move {
        l2.acquire_with("lock:sem", &opts(10_000).limit(3).wait(ms(10_000)))
            .await
            .unwrap()
    });
    tokio::time::sleep(ms(300)).await;
    assert!(!waiter.is_finished());
    let first = held.remove(0);
    assert!(first.release().await.unwrap());
    let g4 = waiter.await.unwrap().expect("handed the free permit");
    assert!(g4.fence().unwrap() > fences[2]);
    assert_eq!(
        raw_fences(&server, "lock:sem"),
        sorted(vec![fences[1], fences[2], g4.fence().unwrap()])
    );
    for g in held {
        assert!(g.release().await.unwrap());
    }
    assert!(g4.release().await.unwrap());
    assert!(is_free(&mut c, "lock:sem"));
}

/// For a shared and a counted key: holder A renews a 2 s lease, holder B has the same
/// lease and no renewal. B's lease ends (its loss signal fires, the server drops it), A
/// stays held past two TTLs. (2 s, not 300 ms: a renewal may then come 667 ms late on a
/// loaded machine before A's guard gives the lease up.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_one_holder_while_another_holders_lease_ends() {
    let (server, mut c, locks) = server_with_client(ServerBuilder::new()).await;
    let ttl = ms(2_000);
    for mode in [LockMode::Shared, LockMode::Counted(2)] {
        let key = &format!("lock:renew-{}", mode.name());
        let a = granted(locks.acquire_with(key, &renewing(2_000).mode(mode))).await;
        let a_granted = Instant::now();
        let b = granted(locks.acquire_with(key, &opts(2_000).mode(mode))).await;
        let (fa, fb) = (a.fence().unwrap(), b.fence().unwrap());
        assert_eq!(raw_fences(&server, key), vec![fa, fb]);
        let a_lost = a.lost();
        tokio::pin!(a_lost);
        let (reason, took) = lost_after(ms(10_000), b.lost()).await;
        assert_eq!(reason, LossReason::Expired, "{mode} (after {took:?})");
        // B goes on the server by its lease's end (its loss signal comes the drift
        // before that)...
        assert!(
            wait_until(ms(10_000), || raw_fences(&server, key) == vec![fa]),
            "{mode}: {:?}",
            raw_fences(&server, key)
        );
        // ...and A is still a holder when a check sent two TTLs after its grant arrives.
        loop {
            tokio::select! {
                r = &mut a_lost => panic!("{mode}: A lost its lease: {r:?}"),
                _ = tokio::time::sleep(ms(200)) => {}
            }
            let sent = a_granted.elapsed();
            assert_eq!(raw_fences(&server, key), vec![fa], "{mode} at {sent:?}");
            if sent > 2 * ttl {
                break;
            }
        }
        assert!(a.is_held());
        let info = locks.info(key).await.unwrap().unwrap();
        assert_eq!((info.mode, info.holders), (Some(mode), Some(1)));
        assert!(info.holder_list[0].ttl_ms <= 2_000);
        assert!(a.release().await.unwrap());
        assert!(!b.release().await.unwrap(), "B's lease had ended");
        assert!(is_free(&mut c, key));
    }
    let expired = lock_stat(&server, "lock_expired");
    assert!(expired >= 2, "lock_expired {expired}");
}

/// `LOCK.FORCERELEASE key FENCE f` removes one holder: that guard's loss signal fires
/// (`NotHeld`, at its next renewal); the other holder keeps renewing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_signal_when_forcerelease_removes_this_holder() {
    let (server, mut c, locks) = server_with_client(ServerBuilder::new()).await;
    for mode in [LockMode::Shared, LockMode::Counted(5)] {
        let key = &format!("lock:fr-{}", mode.name());
        // 2.4 s: renewals every 800 ms, each may come 800 ms late (a loaded machine)
        // before a guard gives its lease up.
        let o = renewing(2_400).mode(mode);
        let (a, b) = (
            granted(locks.acquire_with(key, &o)).await,
            granted(locks.acquire_with(key, &o)).await,
        );
        let (fa, fb) = (a.fence().unwrap(), b.fence().unwrap());
        let b_lost = b.lost();
        tokio::pin!(b_lost);
        let removed: i64 = redis::cmd("LOCK.FORCERELEASE")
            .arg(key)
            .arg("FENCE")
            .arg(fa)
            .query(&mut c)
            .unwrap();
        assert_eq!(removed, 1);
        // The next renewal is answered 0: NotHeld (a lease that ran out is Expired).
        let (reason, took) = lost_after(ms(10_000), a.lost()).await;
        assert_eq!(reason, LossReason::NotHeld, "{mode} (after {took:?})");
        assert!(!a.is_held());
        // B is untouched and keeps renewing past its TTL.
        tokio::select! {
            r = &mut b_lost => panic!("{mode}: B lost its lease: {r:?}"),
            _ = tokio::time::sleep(ms(3_000)) => {}
        }
        assert!(b.is_held());
        assert_eq!(raw_fences(&server, key), vec![fb], "{mode}");
        assert!(!a.release().await.unwrap());
        assert!(b.release().await.unwrap());
        assert!(is_free(&mut c, key));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrongmode_and_limitmismatch_are_errors_not_waits() {
    let (server, _, locks) = server_with_client(ServerBuilder::new()).await;
    let sem = locks
        .acquire_with("lock:m", &opts(10_000).limit(2))
        .await
        .unwrap()
        .unwrap();
    let code = |r: Result<_, Error>| match r {
        Err(e) => {
            assert!(e.is_usage_error(), "{e}");
            e.server_code().map(str::to_string)
        }
        Ok(g) => panic!("expected an error, got {g:?}"),
    };
    for wait in [None, Some(ms(5_000))] {
        let t = Instant::now();
        let with = |o: AcquireOptions| {
            let mut o = o;
            o.wait = wait;
            o
        };
        assert_eq!(
            code(locks.acquire_with("lock:m", &with(opts(1_000))).await).as_deref(),
            Some("WRONGMODE"),
            "exclusive on a counted key"
        );
        assert_eq!(
            code(
                locks
                    .acquire_with("lock:m", &with(opts(1_000).shared()))
                    .await
            )
            .as_deref(),
            Some("WRONGMODE"),
            "shared on a counted key"
        );
        let e = locks
            .acquire_with("lock:m", &with(opts(1_000).limit(3)))
            .await
            .unwrap_err();
        assert_eq!(e.server_code(), Some("LIMITMISMATCH"));
        assert!(e.to_string().contains("LIMIT 2"), "{e}");
        assert!(
            // Three calls; the wait is 5 s: room for a loaded machine's pauses.
            t.elapsed() < ms(4_000),
            "errors at once, not after the wait ({wait:?}): {:?}",
            t.elapsed()
        );
    }
    // LIMIT on an exclusive key and on a shared key.
    let x = granted(locks.acquire("lock:x", ms(10_000), None)).await;
    assert_eq!(
        code(locks.acquire_with("lock:x", &opts(1_000).limit(2)).await).as_deref(),
        Some("WRONGMODE")
    );
    let s = granted(locks.acquire_with("lock:s", &opts(10_000).shared())).await;
    assert_eq!(
        code(locks.acquire_with("lock:s", &opts(1_000).limit(2)).await).as_deref(),
        Some("WRONGMODE")
    );
    // Nothing changed on the server; the holders release as usual.
    assert_eq!(raw_fences(&server, "lock:m"), vec![sem.fence().unwrap()]);
    for g in [sem, x, s] {
        assert!(g.release().await.unwrap());
    }
    // A limit the module does not accept never leaves the client.
    assert!(matches!(
        locks.acquire_with("lock:m", &opts(1_000).limit(0)).await,
        Err(Error::Invalid(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_module_shared_and_counted_are_refused() {
    let (server, mut c, locks) = server_with_client(ServerBuilder::new().no_module()).await;
    for o in [
        opts(1_000).shared(),
        opts(1_000).limit(2),
        // Waits of 10 s: an answer within 5 s did not poll for them, with room for a
        // loaded machine's pauses.
        opts(1_000).shared().wait(ms(10_000)),
        opts(1_000).limit(2).wait(ms(10_000)),
    ] {
        let t = Instant::now();
        let token = "kinds-token-0123456789abcdef";
        match locks
            .acquire_with("lock:plain", &o.clone().token(token))
            .await
        {
            Err(e @ Error::ModuleMissing { .. }) => {
                let m = e.to_string();
                assert!(
                    m.starts_with(&format!(
                        "the redis-lock module is not loaded on {}; see ",
                        server.addr()
                    )),
                    "{m}"
                );
                assert!(!m.contains(token), "{m}");
                assert!(e.is_usage_error());
            }
            other => panic!("{:?}: expected Error::ModuleMissing, got {other:?}", o.mode),
        }
        assert!(t.elapsed() < ms(5_000), "no polling: {:?}", t.elapsed());
        assert!(locks.module_missing());
        let exists: i64 = redis::cmd("EXISTS")
            .arg("lock:plain")
            .query(&mut c)
            .unwrap();
        assert_eq!(exists, 0, "no exclusive lock taken instead");
    }
    // Exclusive still takes the classic lock.
    let g = locks
        .acquire("lock:plain", ms(5_000), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((g.fence(), g.mode()), (None, LockMode::Exclusive));
    assert!(g.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_over_resp3_has_the_holders() {
    setup();
    let server = ServerBuilder::new().start();
    let resp3 = LockClient::connect_with(
        &format!("{}/?protocol=resp3", server.url()),
        ClientOptions {
            cluster: Some(false),
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    let a = resp3
        .acquire_with("lock:r3", &opts(10_000).limit(4).owner("p-1"))
        .await
        .unwrap()
        .unwrap();
    let b = resp3
        .acquire_with("lock:r3", &opts(10_000).limit(4))
        .await
        .unwrap()
        .unwrap();
    // Check the connection really speaks RESP3: LOCK.INFO is a map there.
    let mut raw = redis::Client::open(format!("{}/?protocol=resp3", server.url()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let v: redis::Value = redis::cmd("LOCK.INFO")
        .arg("lock:r3")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(matches!(v, redis::Value::Map(_)), "{v:?}");
    let info = resp3.info("lock:r3").await.unwrap().unwrap();
    assert_eq!(info.mode, Some(LockMode::Counted(4)));
    assert_eq!(
        (info.limit, info.holders, info.waiters),
        (Some(4), Some(2), 0)
    );
    let fences: Vec<u64> = info.holder_list.iter().map(|h| h.fence).collect();
    assert_eq!(fences, vec![a.fence().unwrap(), b.fence().unwrap()]);
    assert_eq!(info.holder_list[0].owner.as_deref(), Some("p-1"));
    assert!(info.holder_list[0].client_addr.is_some());
    assert!(info.holder_list[1].acquired_at_ms.is_some());
    a.release().await.unwrap();
    b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_shared_works_with_quorum_fencing_and_limit_is_refused() {
    setup();
    let s = servers(3);
    // Every node is up here: a node limit only bounds a hang (300 ms could pass for a
    // loaded server's answer, and a quorum of 2 of 3 then fails).
    let rl = redlock(&urls(&s), ms(2_000));
    let rl2 = redlock(&urls(&s), ms(2_000));

    // Node 0's counter just below what it accepts (an hour ahead of its clock), so the
    // others grant lower fences and round 2 (MINFENCE, renewing in SHARED mode) runs.
    tokio::time::sleep(ms(100)).await;
    let ahead = lift_fence_counter(&s[0], 50);
    assert!(probe_fence(&s[1]) < ahead, "node 1 is behind node 0");

    // 2.4 s: a renewal over the quorum may come 800 ms late before the guard gives up.
    let o = opts(2_400).shared().auto_renew(Duration::from_secs(60));
    let r1 = rl.acquire_with("lock:rl-rw", &o).await.unwrap().unwrap();
    let r2 = rl2.acquire_with("lock:rl-rw", &o).await.unwrap().unwrap();
    assert_eq!(r1.mode(), LockMode::Shared);
    let (f1, f2) = (r1.fence().unwrap(), r2.fence().unwrap());
    assert!(
        f1 > ahead && f2 > f1,
        "quorum fences {f1} {f2} (node 0 at {ahead})"
    );
    // Round 2 lifted every node's counter above the quorum fence.
    for (i, server) in s.iter().enumerate() {
        assert!(probe_fence(server) > f2, "node {i}");
        assert_eq!(raw_fences(server, "lock:rl-rw").len(), 2, "node {i}");
    }
    // A writer gets no majority while readers hold it.
    assert!(rl2
        .acquire("lock:rl-rw", ms(5_000), None)
        .await
        .unwrap()
        .is_none());
    // Renewal over the quorum keeps both readers past their TTL.
    tokio::time::sleep(ms(3_000)).await;
    assert!(r1.is_held() && r2.is_held());
    for server in &s {
        assert_eq!(raw_fences(server, "lock:rl-rw").len(), 2);
    }
    assert!(r1.release().await.unwrap());
    assert!(r2.release().await.unwrap());
    let w = rl2
        .acquire("lock:rl-rw", ms(5_000), None)
        .await
        .unwrap()
        .expect("the writer after the readers");
    assert!(w.fence().unwrap() > f2);
    assert!(w.release().await.unwrap());

    // A counted lock over a quorum is refused before anything is sent.
    match rl.acquire_with("lock:rl-sem", &opts(5_000).limit(2)).await {
        Err(Error::Invalid(m)) => assert!(m.contains("Redlock cannot hold a counted lock"), "{m}"),
        other => panic!("expected Error::Invalid, got {other:?}"),
    }
    for server in &s {
        assert!(is_free(&mut server.conn(), "lock:rl-sem"));
    }

    // A mode error from a node ends the acquisition with that error, and no node keeps
    // a partial grant.
    let _: redis::Value = redis::cmd("LOCK.ACQUIRE")
        .arg("lock:rl-mixed")
        .arg("LIMIT")
        .arg(2)
        .arg("PX")
        .arg(10_000)
        .query(&mut s[2].conn())
        .unwrap();
    let e = rl
        .acquire_with("lock:rl-mixed", &opts(5_000).shared().wait(ms(3_000)))
        .await
        .unwrap_err();
    assert_eq!(e.server_code(), Some("WRONGMODE"), "{e}");
    assert!(wait_until(ms(10_000), || is_free(
        &mut s[0].conn(),
        "lock:rl-mixed"
    ) && is_free(
        &mut s[1].conn(),
        "lock:rl-mixed"
    )));
}
