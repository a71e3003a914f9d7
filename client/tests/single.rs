//! The single-server client against a real server: guard acquire/release, renewal,
//! the loss signal, the renewal cap, FIFO waiting, and the fallback without the module.

mod util;

use std::time::{Duration, Instant};

use redis_lock_client::{
    AcquireOptions, ClientOptions, LeaseStatus, LockClient, LossReason, Renewal,
};
use redis_lock_testkit::{wait_until, ServerBuilder};
use util::proxy::DelayProxy;
use util::{
    client, expires_at, granted, held_fence, is_free, lock_stat, lost_within, ms, renewing,
    server_with_client, setup, steady_renewal, Stopped,
};

/// True when `c` is refused `key` (after waiting `wait`, if given).
async fn busy(c: &LockClient, key: &str, ttl: Duration, wait: Option<Duration>) -> bool {
    c.acquire(key, ttl, wait).await.unwrap().is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guard_acquire_and_release() {
    let (server, mut c, a) = server_with_client(ServerBuilder::new()).await;
    let b = client(&server.url()).await;
    assert!(!a.is_cluster());

    let g = a
        .acquire("lock:a", Duration::from_secs(10), None)
        .await
        .unwrap()
        .expect("free lock is granted");
    let fence = g.fence().expect("the module gives a fence");
    assert_eq!(held_fence(&mut c, "lock:a"), Some(fence));
    assert_eq!(g.name(), "lock:a");
    assert_eq!(g.token().len(), 36, "a UUID token");
    assert!(g.is_held());

    // Someone else: busy, and also busy after a short wait.
    assert!(busy(&b, "lock:a", ms(10_000), None).await);
    let t = Instant::now();
    assert!(busy(&b, "lock:a", ms(10_000), Some(ms(200))).await);
    assert!(t.elapsed() >= ms(180), "waited {:?}", t.elapsed());

    // LOCK.INFO through the client.
    let info = b.info("lock:a").await.unwrap().expect("held");
    assert_eq!(info.kind, "module");
    assert_eq!(info.fence, Some(fence));

    // Explicit release, then the next grant has a higher fence.
    let mut watch = g.watch();
    assert!(g.release().await.unwrap());
    assert_eq!(watch.lost().await, None, "released, not lost");
    assert!(is_free(&mut c, "lock:a"));
    assert!(b.info("lock:a").await.unwrap().is_none());
    let g2 = granted(b.acquire("lock:a", ms(10_000), None)).await;
    assert!(g2.fence().unwrap() > fence);

    // Release on drop (spawned): free again soon.
    drop(g2);
    assert!(wait_until(Duration::from_secs(2), || is_free(
        &mut c, "lock:a"
    )));

    // Release/extend by token on the client (as another process would).
    let g3 = granted(a.acquire("lock:a", ms(10_000), None)).await;
    let (token, _) = g3.detach();
    assert!(b.extend("lock:a", &token, ms(20_000)).await.unwrap());
    assert!(!b
        .extend("lock:a", "not-the-token", ms(20_000))
        .await
        .unwrap());
    assert!(!b.release("lock:a", "not-the-token").await.unwrap());
    assert!(!is_free(&mut c, "lock:a"), "detach keeps the lock");
    assert!(b.release("lock:a", &token).await.unwrap());
    assert!(is_free(&mut c, "lock:a"));
}

/// Auto-renewal keeps a lease through work longer than two TTLs, and dropping the guard
/// releases it. The guard gives a lease up when a renewal is not answered by a third of
/// the TTL before the lease can end: with a 3 s TTL a renewal may come 1 s late (a
/// loaded CI machine) where a 300 ms lease left it 100 ms. What counts is when the
/// server still showed the grant, not how many checks or renewals fitted in a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_lease_through_two_ttls_of_work_then_drop_releases_it() {
    setup();
    let server = ServerBuilder::new().start();
    let a = client(&server.url()).await;
    let mut check = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let ttl = ms(3_000);
    let g = a
        .acquire_with("lock:renew", &renewing(3_000))
        .await
        .unwrap()
        .unwrap();
    // The lease started before this instant.
    let granted_at = Instant::now();
    let fence = g.fence().unwrap();
    let lost = g.lost();
    tokio::pin!(lost);

    // "Work", checking the server now and then that the lock is still ours, until a
    // check sent more than two TTLs after the grant found it held by the same grant.
    let mut held_for = Duration::ZERO;
    while held_for <= 2 * ttl {
        tokio::select! {
            r = &mut lost => panic!("lease lost after {held_for:?} of work: {r:?}"),
            _ = tokio::time::sleep(ms(200)) => {}
        }
        let sent = granted_at.elapsed();
        let v: redis::Value = redis::cmd("LOCK.INFO")
            .arg("lock:renew")
            .query_async(&mut check)
            .await
            .unwrap();
        let redis::Value::Array(items) = v else {
            panic!("lock gone {sent:?} after the grant (held at {held_for:?}): {v:?}");
        };
        assert!(
            items.contains(&redis::Value::Int(fence as i64)),
            "same grant (fence)"
        );
        assert!(g.is_held());
        held_for = sent;
    }
    let renewed = lock_stat(&server, "lock_extended");
    assert!(
        renewed >= 2,
        "held {held_for:?} of a {ttl:?} lease with {renewed} renewals"
    );

    // The work ends: dropping the guard releases the lock (it does not run out).
    drop(g);
    let mut c = server.conn();
    assert!(wait_until(Duration::from_secs(10), || is_free(
        &mut c,
        "lock:renew"
    )));
    assert_eq!(lock_stat(&server, "lock_released"), 1, "released on drop");
    assert_eq!(lock_stat(&server, "lock_expired"), 0, "not run out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_signal_fires_when_the_server_is_killed() {
    setup();
    let mut server = ServerBuilder::new().start();
    let a = client(&server.url()).await;
    let ttl = ms(6_000);
    let g = granted(a.acquire_with("lock:kill", &renewing(6_000))).await;
    let lost = g.lost();
    tokio::time::sleep(ms(300)).await;
    assert!(g.is_held());
    let t = Instant::now();
    server.kill9();
    // Renewals meet a refused connection and are retried until the margin before the
    // lease's end: then `Failed`, which a signal at the deadline (`Expired`) is not. It
    // must come before the lease can end (the holder learns in time); a 6 s lease leaves
    // a loaded machine's 1-2 s of lateness room before that.
    let reason = lost_within(ttl + ms(5_000), lost).await;
    let after = t.elapsed();
    eprintln!("loss signal {after:?} after SIGKILL: {reason}");
    assert!(matches!(reason, LossReason::Failed(_)), "{reason:?}");
    assert!(
        after < ttl,
        "the loss signal came {after:?} after the kill, past the lease"
    );
    assert!(!g.is_held());
    assert!(matches!(g.status(), LeaseStatus::Lost { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_signal_fires_at_the_deadline_when_the_server_hangs_or_no_renewal() {
    setup();
    let server = ServerBuilder::new().start();
    let a = client(&server.url()).await;

    // No renewal: fires at the lease deadline (TTL - drift), never before (`t` is taken
    // before the request, the deadline counts from it); after it, within a hang guard
    // (a loaded machine runs a timer 1-2 s late).
    let t = Instant::now();
    let g = granted(a.acquire("lock:plain", ms(500), None)).await;
    let reason = lost_within(ms(5_000), g.lost()).await;
    assert_eq!(reason, LossReason::Expired);
    let after = t.elapsed();
    assert!(after >= ms(480), "fired at {after:?}");

    // A stopped (SIGSTOP) server: renewals time out, the signal fires by the deadline,
    // not when a renewal's I/O limit ends: that limit is 30 s here, the bound 5 s past
    // the 1 s lease (room for a loaded machine's timer lateness).
    let slow = LockClient::connect_with(
        &server.url(),
        ClientOptions {
            io_timeout: Duration::from_secs(30),
            ..ClientOptions::default()
        },
    )
    .await
    .unwrap();
    let ttl = ms(1_000);
    let g = granted(slow.acquire_with("lock:stop", &renewing(1_000))).await;
    let t = Instant::now();
    let stopped = Stopped::new(server.pid());
    let reason = lost_within(ttl + ms(5_000), g.lost()).await;
    let after = t.elapsed();
    drop(stopped);
    eprintln!("loss signal {after:?} after SIGSTOP: {reason}");
    assert_eq!(reason, LossReason::Expired);
}

/// With the server unreachable (a proxy that passes nothing and closes nothing), the
/// loss signal of an auto-renewed guard comes a margin (by default a third of the TTL)
/// before the lease can end on the server (its own `expires-at`), so that the work can
/// stop before the next holder may start. A 6 s TTL (a 2 s margin): the signal must come
/// at least 500 ms before the end, which leaves 1.5 s for timer lateness on a loaded
/// machine; without the margin it would come the drift (~60 ms) before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_signal_comes_a_margin_before_the_lease_can_end() {
    setup();
    let server = ServerBuilder::new().start();
    let proxy = DelayProxy::plain(server.socket_addr());
    let a = client(&proxy.url()).await;
    let ttl = ms(6_000);
    let g = granted(a.acquire_with("lock:margin", &renewing(6_000))).await;
    let lost = g.lost();
    tokio::time::sleep(ms(2_500)).await; // renewed once (every 2 s) meanwhile
    proxy.freeze();
    tokio::time::sleep(ms(200)).await; // a renewal already on the server is applied
    let deadline = expires_at(&server, "lock:margin").expect("held");
    let reason = lost_within(ttl + ms(5_000), lost).await;
    let ahead = deadline - redis_lock_testkit::unix_ms();
    eprintln!("loss signal ({reason}) {ahead} ms before the server's lease deadline");
    assert_eq!(reason, LossReason::Expired);
    assert!(
        ahead >= 500,
        "the loss signal came only {ahead} ms before the lease could end (margin 2 s)"
    );
    assert!(
        !is_free(&mut server.conn(), "lock:margin"),
        "still held on the server"
    );
}

/// The renewal cap: renewed past the TTL, never past the cap. TTL 2.4 s (renewals every
/// 800 ms, each may come 800 ms late before the guard gives up; a 300 ms TTL left 100 ms)
/// and a 6 s cap; the lease's end is read on the server (`expires-at`), and the lock runs
/// out there by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_cap_is_enforced() {
    setup();
    let server = ServerBuilder::new().start();
    let a = client(&server.url()).await;
    let (ttl, cap) = (ms(2_400), ms(6_000));
    let t = Instant::now();
    let g = granted(a.acquire_with(
        "lock:cap",
        &AcquireOptions::new(ttl).renewal(Renewal::capped(cap)),
    ))
    .await;
    // The cap runs from the grant, which came before this.
    let granted_wall = redis_lock_testkit::unix_ms();
    let lost = g.lost();
    tokio::pin!(lost);
    let mut c = server.conn();
    // Renewed past the first TTL...
    tokio::select! {
        r = &mut lost => panic!("lost before the cap: {r:?} at {:?}", t.elapsed()),
        _ = tokio::time::sleep(ttl + ms(1_100)) => {}
    }
    assert!(
        !is_free(&mut c, "lock:cap"),
        "renewal keeps it past its TTL"
    );
    // ...but not past the cap: the loss signal comes the margin (a third of the TTL)
    // before the last stretch ends, never earlier.
    let reason = lost_within(Duration::from_secs(10), &mut lost).await;
    let fired = t.elapsed();
    assert_eq!(reason, LossReason::CapReached);
    assert!(fired >= cap - ttl / 3 - ms(50), "fired at {fired:?}");
    // The last stretch ends by the cap on the server (plus the one-way time of the last
    // LOCK.EXTEND)...
    if let Some(end) = expires_at(&server, "lock:cap") {
        let past = end - granted_wall - cap.as_millis() as i64;
        assert!(
            past <= 1_000,
            "the last stretch ends {past} ms past the cap"
        );
    }
    // ...and the lock runs out there without any release.
    assert!(wait_until(Duration::from_secs(10), || is_free(
        &mut c, "lock:cap"
    )));
    eprintln!(
        "cap {cap:?}: loss signal at {fired:?}, free on the server by {:?}",
        t.elapsed()
    );
    // A read may show the lease over before the server's timer removes it (and counts
    // the expiry): polled, not read once.
    assert!(
        wait_until(Duration::from_secs(10), || lock_stat(
            &server,
            "lock_expired"
        ) == 1),
        "ran out on the server"
    );
    assert_eq!(lock_stat(&server, "lock_released"), 0, "not released");
    assert!(!g.is_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_takes_the_lock_in_turn_with_a_higher_fence() {
    setup();
    let server = ServerBuilder::new().start();
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let g = granted(a.acquire("lock:q", ms(10_000), None)).await;
    let f1 = g.fence().unwrap();
    // Before the spawn: the task may start late on a loaded machine, the release below
    // comes at least 300 ms after this.
    let t = Instant::now();
    let waiter = tokio::spawn(async move {
        let g2 = b
            .acquire_with(
                "lock:q",
                &AcquireOptions::new(ms(3_000))
                    .wait(ms(5_000))
                    .owner("waiter")
                    .renewal(steady_renewal()),
            )
            .await
            .unwrap()
            .expect("handed over");
        (t.elapsed(), g2)
    });
    tokio::time::sleep(ms(300)).await;
    assert!(g.release().await.unwrap());
    let (waited, g2) = waiter.await.unwrap();
    assert!(waited >= ms(250), "waited {waited:?}");
    assert!(g2.fence().unwrap() > f1);
    let info = a.info("lock:q").await.unwrap().unwrap();
    assert_eq!(info.owner.as_deref(), Some("waiter"));
    // Renewal after a BLOCK grant works as after a plain one: held past its TTL.
    tokio::time::sleep(ms(3_500)).await;
    assert!(g2.is_held());
    assert!(g2.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn falls_back_to_set_nx_and_lua_without_the_module() {
    let (server, mut c, a) = server_with_client(ServerBuilder::new().no_module()).await;
    let b = client(&server.url()).await;
    let g = granted(a.acquire_with(
        "lock:plain",
        &AcquireOptions::new(ms(3_000)).renewal(steady_renewal()),
    ))
    .await;
    assert!(a.module_missing());
    assert_eq!(g.fence(), None, "no fence without the module");
    let v: String = redis::cmd("GET").arg("lock:plain").query(&mut c).unwrap();
    assert_eq!(v, g.token(), "a classic SET NX PX lock");
    // Renewal (owner-checked PEXPIRE in Lua) keeps it past two TTLs.
    tokio::time::sleep(ms(6_500)).await;
    assert!(g.is_held());
    assert!(busy(&b, "lock:plain", ms(1_000), None).await);
    let info = b.info("lock:plain").await.unwrap().unwrap();
    assert_eq!(info.kind, "string");
    // A waiter polls and gets it after the release (compare-and-delete in Lua).
    let waiter = tokio::spawn(async move {
        b.acquire("lock:plain", ms(5_000), Some(ms(3_000)))
            .await
            .unwrap()
    });
    tokio::time::sleep(ms(200)).await;
    assert!(g.release().await.unwrap());
    let g2 = waiter.await.unwrap().expect("polling waiter gets it");
    assert!(!a.release("lock:plain", "wrong").await.unwrap());
    assert!(g2.release().await.unwrap());
    let exists: i64 = redis::cmd("EXISTS")
        .arg("lock:plain")
        .query(&mut c)
        .unwrap();
    assert_eq!(exists, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_keeps_the_lock_after_release_until_its_period_ends() {
    let (server, mut c, a) = server_with_client(ServerBuilder::new()).await;
    let b = client(&server.url()).await;
    // 3 s: the lock must still be kept when it is read after the release (a 1.5 s hold
    // left 1.3 s for a loaded machine's pauses between them).
    let hold = ms(3_000);
    let t = Instant::now();
    let g =
        granted(a.acquire_with("lock:daily", &AcquireOptions::new(ms(10_000)).hold(hold))).await;
    assert_eq!(g.hold(), Some(hold));
    tokio::time::sleep(ms(200)).await; // the work
    assert!(
        g.release().await.unwrap(),
        "still held at the end of the work"
    );
    // Kept, with a lease of what is left of the hold (the hold runs from the grant,
    // after `t`; the work took 200 ms at least), and busy for everyone else.
    let info = b
        .info("lock:daily")
        .await
        .unwrap()
        .expect("kept after release");
    let left_at_least = 3_000 - t.elapsed().as_millis() as i64 - 5;
    assert!(
        info.ttl_ms >= left_at_least && info.ttl_ms <= 2_800,
        "lease left: {} (at least {left_at_least})",
        info.ttl_ms
    );
    assert!(busy(&b, "lock:daily", ms(1_000), None).await);
    // Free by itself once the hold has passed, not before (and not at the end of the
    // 10 s lease it was taken with).
    assert!(wait_until(Duration::from_secs(8), || is_free(
        &mut c,
        "lock:daily"
    )));
    let free_at = t.elapsed();
    assert!(
        free_at >= ms(2_900) && free_at < ms(9_000),
        "free at {free_at:?}"
    );

    // release_after on a guard without the option; a hold already over releases now;
    // release_now ignores the option.
    let g = granted(a.acquire("lock:daily", ms(10_000), None)).await;
    assert!(g.release_after(Duration::from_secs(60)).await.unwrap());
    let info = b.info("lock:daily").await.unwrap().expect("kept");
    assert!(info.ttl_ms > 55_000, "{}", info.ttl_ms);
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("lock:daily")
        .query(&mut c)
        .unwrap();
    let g = granted(a.acquire("lock:daily", ms(10_000), None)).await;
    tokio::time::sleep(ms(50)).await;
    assert!(g.release_after(ms(10)).await.unwrap());
    assert!(is_free(&mut c, "lock:daily"), "the hold was over: released");
    let g =
        granted(a.acquire_with("lock:daily", &AcquireOptions::new(ms(10_000)).hold(hold))).await;
    assert!(g.release_now().await.unwrap());
    assert!(is_free(&mut c, "lock:daily"));
}
