//! Grants confirmed on the replicas by default (`WAIT` after the grant, on the same
//! connection): the only replica stopped makes an acquire (and a hand-off) fail closed
//! with the lock released; confirmation off succeeds; a confirmed grant survives a
//! SIGKILL of the primary and the promotion of its replica, where an unconfirmed one
//! can be lost; Redlock counts a node only once its replicas confirmed.

mod util;

use std::time::{Duration, Instant};

use redis_lock_client::{
    AcquireOptions, ClientOptions, Confirm, Error, LockClient, Redlock, RedlockOptions,
};
use redis_lock_testkit::{temp_dir, wait_until, ReplicaPair, ServerBuilder};
use util::proxy::DelayProxy;
use util::{cli_cmd, granted, held_fence, is_free, ms, setup, Stopped};

/// A primary that starts a replica's full sync at once (not after the default 5 s).
fn fast_sync() -> ServerBuilder {
    ServerBuilder::new().arg("repl-diskless-sync-delay", "0")
}

fn replica_pair() -> ReplicaPair {
    ReplicaPair::try_start_with(fast_sync(), ServerBuilder::new()).unwrap()
}

fn opts(confirm: Confirm) -> ClientOptions {
    ClientOptions {
        cluster: Some(false),
        confirm,
        confirm_timeout: ms(500),
        ..ClientOptions::default()
    }
}

async fn client(url: &str, confirm: Confirm) -> LockClient {
    LockClient::connect_with(url, opts(confirm)).await.unwrap()
}

/// Options for grants a test expects to be confirmed: time for a replica on a loaded
/// machine to acknowledge (500 ms was seen to be too short).
fn patient(confirm: Confirm) -> ClientOptions {
    ClientOptions {
        confirm_timeout: ms(10_000),
        ..opts(confirm)
    }
}

/// A grant whose lease runs out while a slow replica confirms it is an error that says
/// so (not "held elsewhere": nobody else holds it), and the lock is left free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_over_before_its_confirmation_is_an_error_not_busy() {
    setup();
    let pair = replica_pair();
    let url = pair.primary.url();
    let locks = LockClient::connect_with(&url, patient(Confirm::Auto))
        .await
        .unwrap();
    // Warm: the replica count is known and cached before the replica stops.
    let g = granted(locks.acquire("warm", ms(10_000), None)).await;
    assert!(g.release().await.unwrap());

    let stopped = Stopped::new(pair.replica.pid());
    let acquire = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.acquire("short", ms(100), None).await })
    };
    tokio::time::sleep(ms(400)).await;
    drop(stopped);
    match acquire.await.unwrap() {
        Err(e @ Error::NotHeld { .. }) => {
            let text = e.to_string();
            assert!(
                text.contains("short") && text.contains("longer TTL"),
                "{text}"
            );
        }
        other => panic!("expected NotHeld, got {:?}", other.map(|g| g.is_some())),
    }
    assert!(is_free(&mut pair.primary.conn(), "short"));
}

/// The acquisition failed as unconfirmed (with `confirmed` of `needed` replicas).
fn unconfirmed(
    r: redis_lock_client::Result<Option<redis_lock_client::LockGuard>>,
    confirmed: u32,
    needed: u32,
) -> Error {
    match r {
        Err(e @ Error::Unconfirmed { .. }) => {
            let Error::Unconfirmed {
                confirmed: c,
                needed: n,
                ..
            } = &e
            else {
                unreachable!()
            };
            assert_eq!((*c, *n), (confirmed, needed), "{e}");
            e
        }
        Err(e) => panic!("expected Unconfirmed, got {e:?}"),
        Ok(g) => panic!("expected Unconfirmed, got a grant: {g:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_replica_makes_grants_and_hand_offs_fail_closed() {
    setup();
    let pair = replica_pair();
    let (url, addr) = (pair.primary.url(), pair.primary.addr());
    let mut c = pair.primary.conn();
    let auto = client(&url, Confirm::Auto).await;
    let off = client(&url, Confirm::Off).await;

    // Replica running: confirmed, and on the replica when acquire returns.
    let patient = LockClient::connect_with(&url, patient(Confirm::Auto))
        .await
        .unwrap();
    let g = granted(patient.acquire("k1", ms(10_000), None)).await;
    assert_eq!(
        held_fence(&mut pair.replica.conn(), "k1"),
        g.fence(),
        "on the replica"
    );
    assert!(g.release().await.unwrap());

    let stopped = Stopped::new(pair.replica.pid());
    // Non-blocking: WAIT 1 times out, the grant is given back before the error returns.
    let t = Instant::now();
    let e = unconfirmed(auto.acquire("k2", ms(10_000), None).await, 0, 1);
    let took = t.elapsed();
    // It waited for the WAIT (the upper bound only guards against a hang).
    assert!(took >= ms(450) && took < ms(10_000), "{took:?}");
    assert!(
        e.to_string()
            .starts_with(&format!("{addr}: the grant was confirmed by 0 of 1")),
        "{e}"
    );
    assert!(is_free(&mut c, "k2"), "given back");

    // A hand-off received by a waiting acquire: the same.
    let holder = granted(off.acquire("k3", ms(10_000), None)).await;
    let waiter = {
        let auto = auto.clone();
        tokio::spawn(async move { auto.acquire("k3", ms(10_000), Some(ms(5_000))).await })
    };
    assert!(wait_until(Duration::from_secs(5), || pair
        .primary
        .info_field("lock", "lock_waiters")
        .is_some_and(|n| n == "1")));
    assert!(holder.release().await.unwrap());
    unconfirmed(waiter.await.unwrap(), 0, 1);
    assert!(is_free(&mut c, "k3"), "the hand-off was given back");

    // Confirmation off: the same acquire succeeds.
    let g = granted(off.acquire("k4", ms(10_000), None)).await;
    assert!(g.release().await.unwrap());

    // The deployment expects two replicas and has one: refused before any WAIT.
    // (WAIT calls counted by the server: a time bound for "no WAIT" failed on a loaded
    // machine, where two round trips can take longer than a WAIT.)
    let waits = || {
        let stat = pair.primary.info_field("commandstats", "cmdstat_wait");
        stat.and_then(|v| {
            v.split(',')
                .next()?
                .strip_prefix("calls=")?
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(0)
    };
    let two = client(&url, Confirm::Replicas(2)).await;
    let waits_before = waits();
    assert!(waits_before > 0, "the WAITs above are counted");
    let e = unconfirmed(two.acquire("k5", ms(10_000), None).await, 0, 2);
    assert_eq!(waits(), waits_before, "no WAIT");
    assert!(
        e.to_string()
            .contains("only 1 replica(s) online, 2 expected"),
        "{e}"
    );
    assert!(is_free(&mut c, "k5"));

    // The CLI: exit 69 without running CMD; --no-confirm runs it.
    let dir = temp_dir();
    let ran = dir.join("ran");
    let touch = format!("touch {}", ran.display());
    let cli = |extra: &[&str]| {
        let mut args = vec!["run", "--confirm-timeout", "500ms", "--url", &url];
        args.extend_from_slice(extra);
        args.extend(["job", "--", "sh", "-c", &touch]);
        let out = cli_cmd().args(&args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = cli(&[]);
    assert_eq!(code, Some(69), "{stderr}");
    assert!(
        stderr.contains("confirmed by 0 of 1 replica(s)"),
        "{stderr}"
    );
    assert!(!ran.exists() && is_free(&mut c, "job"));
    let (code, stderr) = cli(&["--no-confirm"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(ran.exists());
    drop(stopped);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The state of the replica on `port` as its primary's `INFO replication` shows it
/// (`wait_bgsave`, `send_bulk`, `online`, ...).
fn replica_state(primary: &redis_lock_testkit::Server, port: u16) -> Option<String> {
    let info = primary.info_section("replication")?;
    let needle = format!("port={port},state=");
    let at = info.find(&needle)? + needle.len();
    Some(info[at..].split(',').next()?.to_string())
}

/// One rule for "confirmed": the replicas online. A replica in its full sync (slowed
/// here: 20,000 keys saved 100 µs apart, about 2 s) is not counted: the library and the
/// CLI grant at once without waiting for it, and it receives the grant with its sync.
/// `--replicas 1` (the deployment expects one replica) refuses meanwhile instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_in_its_full_sync_is_not_counted_and_gets_the_grant_with_it() {
    setup();
    let primary = fast_sync().arg("rdb-key-save-delay", "100").start();
    let mut c = primary.conn();
    let _: () = redis::cmd("DEBUG")
        .arg(&["POPULATE", "20000", "filler"])
        .query(&mut c)
        .unwrap();
    let replica = ServerBuilder::new()
        .arg_multi("replicaof", &["127.0.0.1", &primary.port.to_string()])
        .start();
    let syncing = || replica_state(&primary, replica.port).is_some_and(|s| s != "online");
    assert!(
        wait_until(Duration::from_secs(5), syncing),
        "the replica's full sync runs"
    );
    let auto = client(&primary.url(), Confirm::Auto).await;
    let g = granted(auto.acquire("synced", ms(60_000), None)).await;
    let (dir, url) = (temp_dir(), primary.url());
    let ran = dir.join("ran");
    let cli = |extra: &[&str]| {
        let mut args = vec!["run", "--url", &url];
        args.extend_from_slice(extra);
        args.extend(["job", "--", "touch"]);
        let out = cli_cmd().args(&args).arg(&ran).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = cli(&[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(ran.exists());
    let (code, stderr) = cli(&["--replicas", "1"]);
    assert_eq!(code, Some(69), "{stderr}");
    assert!(
        stderr.contains("only 0 replica(s) online, 1 expected"),
        "{stderr}"
    );
    assert!(syncing(), "all of this happened during the sync");
    // The replica gets the grant with its sync.
    replica.wait_synced(Duration::from_secs(30)).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || held_fence(
            &mut replica.conn(),
            "synced"
        ) == g.fence()),
        "the replica has the grant after its sync"
    );
    assert!(g.release().await.unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_grant_survives_sigkill_of_the_primary_and_promotion() {
    setup();
    let mut primary = fast_sync().start();
    // The replication stream reaches the replica 300 ms late, and what is in flight when
    // the primary dies never arrives.
    let proxy = DelayProxy::start(primary.socket_addr(), ms(300));
    let replica = ServerBuilder::new()
        .arg_multi("replicaof", &["127.0.0.1", &proxy.port.to_string()])
        .start();
    replica.wait_synced(Duration::from_secs(20)).unwrap();
    let auto = LockClient::connect_with(&primary.url(), patient(Confirm::Auto))
        .await
        .unwrap();
    let off = client(&primary.url(), Confirm::Off).await;

    let t = Instant::now();
    let confirmed = granted(auto.acquire("confirmed", ms(60_000), None)).await;
    assert!(
        t.elapsed() >= ms(250),
        "WAIT waited for the late replica: {:?}",
        t.elapsed()
    );
    let unconfirmed = granted(off.acquire("unconfirmed", ms(60_000), None)).await;
    // The primary's machine dies: what is on the way to the replica is lost with it.
    proxy.cut();
    primary.kill9();

    let mut r = replica.conn();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut r)
        .unwrap();
    assert_eq!(
        held_fence(&mut r, "confirmed"),
        confirmed.fence(),
        "the confirmed grant survived"
    );
    assert!(
        is_free(&mut r, "unconfirmed"),
        "the control: an unconfirmed grant in flight is lost"
    );
    let (_, _) = (confirmed.detach(), unconfirmed.detach());
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_counts_a_node_only_once_its_replicas_confirmed() {
    setup();
    let pair = replica_pair();
    let others = [ServerBuilder::new().start(), ServerBuilder::new().start()];
    let urls = [pair.primary.url(), others[0].url(), others[1].url()];
    let rl = Redlock::with_options(
        &urls,
        RedlockOptions {
            client: opts(Confirm::Auto),
            ..RedlockOptions::default()
        },
    )
    .unwrap();
    let stopped = Stopped::new(pair.replica.pid());
    let g = rl
        .acquire_with("nightly", &AcquireOptions::new(ms(10_000)))
        .await
        .unwrap()
        .expect("a majority of the other two");
    assert!(g.fence().is_some());
    assert!(
        is_free(&mut pair.primary.conn(), "nightly"),
        "the unconfirmed node gave it back"
    );
    for s in &others {
        assert!(held_fence(&mut s.conn(), "nightly").is_some());
    }
    assert!(g.release().await.unwrap());
    drop(stopped);
}
