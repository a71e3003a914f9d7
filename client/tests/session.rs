//! Sessions in the client and the CLI against a real server: one keepalive per period
//! keeps any number of locks past their TTL, the loss signal when the session is closed
//! from elsewhere or the server forgets it, NOSESSION, several keys all or none
//! (LOCK.ACQUIREALL), and `redis-lock run` with several keys (held while the job runs,
//! busy for a second run, released within the session TTL, or at once with --bind, when
//! redis-lock is killed with SIGKILL).

mod util;

use std::fs;
use std::process::Child;
use std::time::{Duration, Instant};

use redis_lock_client::{
    Error, LeaseStatus, LockMode, LossReason, SessionLockOptions, SessionOptions,
};
use redis_lock_testkit::{temp_dir, wait_until, Server, ServerBuilder};
use util::{cli_cmd, granted, is_free, lock_stat, lost_within, ms, server_with_client};

fn raw_session(server: &Server, args: &[&str]) -> redis::Value {
    let mut c = redis::cmd("LOCK.SESSION");
    for a in args {
        c.arg(*a);
    }
    c.query(&mut server.conn()).unwrap()
}

/// Eight locks (five one by one, three in one LOCK.ACQUIREALL) in a session of 1.5 s
/// outlive five of their TTLs: the keepalive renews all of them with one command per
/// period (INFO lock counts keepalives; no LOCK.EXTEND is sent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_keepalive_per_period_keeps_every_lock_of_the_session() {
    let (server, mut c, locks) = server_with_client(ServerBuilder::new()).await;
    let ttl = ms(1500);
    let session = locks
        .session(&SessionOptions::new(ttl).owner("batch-7"))
        .await
        .unwrap();
    assert_eq!(session.id().len(), 32);
    assert!(
        !format!("{session:?}").contains(session.id()),
        "Debug hides the id"
    );
    let mut guards = Vec::new();
    for i in 0..5 {
        let g = session.acquire(&format!("s:{i}"), None).await.unwrap();
        guards.push(g.expect("a free lock is granted"));
    }
    let many = session
        .acquire_all(&["m:a", "m:b", "m:c"], &SessionLockOptions::new())
        .await
        .unwrap()
        .expect("free locks are granted");
    let fences: Vec<u64> = many.iter().map(|g| g.fence().unwrap()).collect();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert!(many.iter().all(|g| g.token() == many[0].token()));
    guards.extend(many);

    let keepalives = lock_stat(&server, "session_keepalives");
    let extended = lock_stat(&server, "extended");
    let t = Instant::now();
    tokio::time::sleep(ttl * 5).await;
    let elapsed = t.elapsed();
    for g in &guards {
        assert!(!is_free(&mut c, g.name()), "{} is held", g.name());
        assert!(g.is_held(), "{} is held by its guard", g.name());
    }
    let sent = lock_stat(&server, "session_keepalives") - keepalives;
    let periods = (elapsed.as_millis() / (ttl / 3).as_millis()) as i64;
    eprintln!(
        "{sent} keepalives in {elapsed:?} ({periods} periods) for {} locks",
        guards.len()
    );
    assert!(
        (1..=periods + 1).contains(&sent),
        "one keepalive per period, not per lock: {sent} in {periods} periods"
    );
    assert_eq!(lock_stat(&server, "extended"), extended, "no LOCK.EXTEND");

    let info = session.info().await.unwrap().expect("open");
    assert_eq!(info.locks, 8);
    assert_eq!(info.owner.as_deref(), Some("batch-7"));
    assert!(!info.bound);
    assert_eq!(info.lock_list.len(), 8);
    let lock_info = locks.info("s:0").await.unwrap().expect("held");
    assert_eq!(
        lock_info.owner.as_deref(),
        Some("batch-7"),
        "the session's label"
    );

    // A lock of the session has no lease of its own.
    let e = guards[0].extend(ms(10_000)).await.unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e}");
    // One released by hand; the close releases the other seven at once.
    let one = guards.remove(0);
    assert!(one.release().await.unwrap());
    assert!(is_free(&mut c, "s:0"));
    let mut w = guards[1].watch();
    assert_eq!(session.close().await.unwrap(), 7);
    for g in &guards {
        assert!(
            is_free(&mut c, g.name()),
            "{} released by the close",
            g.name()
        );
        assert_eq!(g.status(), LeaseStatus::Released);
    }
    assert_eq!(w.lost().await, None, "closed, not lost");
    assert_eq!(lock_stat(&server, "sessions"), 0);
}

/// LOCK.SESSION CLOSE from another connection: an acquire in the session is then
/// answered NOSESSION (Error::NoSession), and the loss signal of the session and of
/// every lock's guard fires (NotHeld); without an acquire, the next keepalive finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_from_elsewhere_nosession_and_the_loss_signal() {
    let (server, mut c, locks) = server_with_client(ServerBuilder::new()).await;
    // An acquire meets NOSESSION first.
    let session = locks
        .session(&SessionOptions::new(ms(30_000)))
        .await
        .unwrap();
    let a = granted(session.acquire("c:a", None)).await;
    let b = granted(session.acquire("c:b", None)).await;
    let closed = raw_session(&server, &["CLOSE", session.id()]);
    assert_eq!(closed, redis::Value::Int(2));
    assert!(is_free(&mut c, "c:a") && is_free(&mut c, "c:b"));
    let e = session.acquire("c:c", None).await.unwrap_err();
    assert!(e.is_no_session(), "{e:?}");
    assert!(matches!(e, Error::NoSession { .. }));
    assert_eq!(e.server_code(), None, "its own variant");
    assert!(e.to_string().contains("NOSESSION"), "{e}");
    // The bounds here are hang guards (a loaded machine schedules late).
    assert_eq!(
        lost_within(ms(5000), session.lost()).await,
        LossReason::NotHeld
    );
    for lost in [a.lost(), b.lost()] {
        assert_eq!(lost_within(ms(5000), lost).await, LossReason::NotHeld);
    }
    assert!(!a.is_held());
    assert!(is_free(&mut c, "c:c"), "nothing taken");
    // Once lost, acquires fail at once.
    let e = session.acquire("c:c", None).await.unwrap_err();
    assert!(e.is_no_session(), "{e:?}");

    // No acquire: the keepalive (every 300 ms) finds the session gone.
    let session = locks.session(&SessionOptions::new(ms(900))).await.unwrap();
    let g = granted(session.acquire("c:d", None)).await;
    assert_eq!(
        raw_session(&server, &["CLOSE", session.id()]),
        redis::Value::Int(1)
    );
    assert_eq!(
        lost_within(ms(5000), session.lost()).await,
        LossReason::NotHeld
    );
    assert_eq!(lost_within(ms(5000), g.lost()).await, LossReason::NotHeld);
}

/// A server restarted without persistence has forgotten the session: the keepalive of
/// a bound session (OPEN on the new connection) and of an unbound one (KEEPALIVE)
/// find it gone (NotHeld). A server that stays down: the loss comes the margin before
/// the lease can end (Failed or Expired). Sessions of 6 s (a keepalive every 2 s, the
/// margin 2 s): the restart (a process start, 1-2 s on a loaded machine) must end before
/// the margin, else the keepalives meet a refused connection and the loss is `Failed`;
/// with 1.5 s sessions it had 500 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_forgets_the_session_and_a_dead_server_fire_the_loss_signal() {
    let (mut server, _c, locks) = server_with_client(ServerBuilder::new()).await;
    let bound = locks
        .session(&SessionOptions::new(ms(6000)).bind(ms(1000)))
        .await
        .unwrap();
    let plain = locks.session(&SessionOptions::new(ms(6000))).await.unwrap();
    let g = granted(plain.acquire("r:a", None)).await;
    assert!(bound.info().await.unwrap().expect("open").bound);
    server.restart();
    // Hang guards: the next keepalive (within 2 s of the restart) finds it gone.
    assert_eq!(
        lost_within(ms(10_000), bound.lost()).await,
        LossReason::NotHeld
    );
    assert_eq!(
        lost_within(ms(10_000), plain.lost()).await,
        LossReason::NotHeld
    );
    assert_eq!(lost_within(ms(5000), g.lost()).await, LossReason::NotHeld);
    assert_eq!(
        lock_stat(&server, "sessions"),
        0,
        "the empty session OPEN made was closed"
    );

    // The lease ends at most 6 s after `t` (the last keepalive came before it); the
    // signal is due 2 s before that, which is what a loaded machine may be late by.
    let session = locks.session(&SessionOptions::new(ms(6000))).await.unwrap();
    let g = granted(session.acquire("r:b", None)).await;
    let t = Instant::now();
    server.kill9();
    let reason = lost_within(ms(10_000), session.lost()).await;
    assert!(
        matches!(reason, LossReason::Failed(_) | LossReason::Expired),
        "{reason:?}"
    );
    assert!(
        t.elapsed() < ms(6000),
        "before the lease can end: {:?}",
        t.elapsed()
    );
    assert_eq!(lost_within(ms(5000), g.lost()).await, reason);
}

/// LOCK.ACQUIREALL in a session: one busy key and nothing is taken; with a wait, all
/// keys once the busy one is released; modes per key; a shared or counted lock in a
/// session waits in the key's queue (BLOCK) like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_keys_all_or_nothing_and_modes() {
    let (_server, mut c, locks) = server_with_client(ServerBuilder::new()).await;
    let other = locks.clone();
    let busy = granted(other.acquire("a:b", ms(30_000), None)).await;
    let session = locks
        .session(&SessionOptions::new(ms(30_000)))
        .await
        .unwrap();
    let none = session
        .acquire_all(&["a:a", "a:b", "a:c"], &SessionLockOptions::new())
        .await
        .unwrap();
    assert!(none.is_none(), "one busy key: nothing");
    assert!(
        is_free(&mut c, "a:a") && is_free(&mut c, "a:c"),
        "nothing was taken"
    );

    // Before the spawn: the release comes at least 300 ms after this, however late the
    // task starts.
    let t = Instant::now();
    let release = tokio::spawn(async move {
        tokio::time::sleep(ms(300)).await;
        busy.release().await.unwrap()
    });
    let all = session
        .acquire_all(
            &["a:a", "a:b", "a:c"],
            &SessionLockOptions::new().wait(ms(10_000)),
        )
        .await
        .unwrap()
        .expect("granted once a:b is free");
    assert!(release.await.unwrap());
    assert!(t.elapsed() >= ms(250), "it waited: {:?}", t.elapsed());
    assert_eq!(
        all.iter().map(|g| g.name()).collect::<Vec<_>>(),
        ["a:a", "a:b", "a:c"]
    );
    assert!(all.iter().all(|g| !is_free(&mut c, g.name())));

    // Modes per key: a shared key is shared with a reader outside the session.
    let modes = session
        .acquire_all_modes(
            &[
                ("m:x", LockMode::Exclusive),
                ("m:rates", LockMode::Shared),
                ("m:pool", LockMode::Counted(2)),
            ],
            &SessionLockOptions::new(),
        )
        .await
        .unwrap()
        .expect("granted");
    assert_eq!(modes[1].mode(), LockMode::Shared);
    let reader = other
        .acquire_with(
            "m:rates",
            &redis_lock_client::AcquireOptions::new(ms(30_000)).shared(),
        )
        .await
        .unwrap();
    assert!(reader.is_some(), "a second reader fits");
    let permit = other
        .acquire_with(
            "m:pool",
            &redis_lock_client::AcquireOptions::new(ms(30_000)).limit(2),
        )
        .await
        .unwrap()
        .expect("the second permit");

    // A counted lock in a session waits (BLOCK) for a permit.
    let wait = SessionLockOptions::new().limit(2).wait(ms(10_000));
    let freed = tokio::spawn(async move {
        tokio::time::sleep(ms(300)).await;
        permit.release().await.unwrap()
    });
    let third = session.acquire_with("m:pool", &wait).await.unwrap();
    assert!(freed.await.unwrap());
    assert_eq!(
        third.expect("a permit once one is free").mode(),
        LockMode::Counted(2)
    );
    let try_again = session
        .try_acquire("m:pool", &SessionLockOptions::new().limit(2))
        .await
        .unwrap();
    assert!(try_again.is_none(), "both permits are the session's now");

    assert_eq!(session.close().await.unwrap(), 6);
    for k in ["a:a", "a:b", "a:c", "m:x", "m:pool"] {
        assert!(is_free(&mut c, k), "{k}");
    }
    assert!(
        !is_free(&mut c, "m:rates"),
        "the other reader still holds it"
    );
    // Bad input fails before any I/O.
    let session = locks
        .session(&SessionOptions::new(ms(30_000)))
        .await
        .unwrap();
    let e = session
        .acquire_all(&[], &SessionLockOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e}");
    let hundred_one: Vec<String> = (0..101).map(|i| format!("k{i}")).collect();
    let refs: Vec<&str> = hundred_one.iter().map(String::as_str).collect();
    assert!(session
        .acquire_all(&refs, &SessionLockOptions::new())
        .await
        .is_err());
    drop(session);
}

// ------------------------------------------------------------------------------------
// The CLI

struct Cli {
    child: Child,
    err: std::path::PathBuf,
}

fn spawn_cli(dir: &std::path::Path, args: &[&str]) -> Cli {
    let n = fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
    let err = dir.join(format!("err{n}"));
    let child = cli_cmd()
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    Cli { child, err }
}

impl Cli {
    /// Its exit code, waiting up to 20 s.
    fn code(mut self) -> Option<i32> {
        let mut status = None;
        let ok = wait_until(Duration::from_secs(20), || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        if !ok {
            let _ = self.child.kill();
            let _ = self.child.wait();
            panic!(
                "redis-lock did not finish: {}",
                fs::read_to_string(&self.err).unwrap_or_default()
            );
        }
        eprintln!(
            "stderr: {}",
            fs::read_to_string(&self.err).unwrap_or_default().trim()
        );
        status.and_then(|s| s.code())
    }
}

fn all_held(server: &Server, keys: &[&str]) -> bool {
    let mut c = server.conn();
    keys.iter().all(|k| !is_free(&mut c, k))
}

fn all_free(server: &Server, keys: &[&str]) -> bool {
    let mut c = server.conn();
    keys.iter().all(|k| is_free(&mut c, k))
}

/// `run a --also b --also c`: the command runs with all three held (and their fences in
/// its environment); a second run of one of them, or of an overlapping set, is busy (75)
/// as a single-key run is, or waits with -w; all are released together at the end.
#[test]
fn cli_run_with_several_keys() {
    util::setup();
    let server = ServerBuilder::new().start();
    let url = server.url();
    let dir = temp_dir();
    let keys = ["j:a", "j:b", "j:c"];
    let started = dir.join("started");
    let go = dir.join("go");
    let script = format!(
        "echo \"$REDIS_LOCK_NAME $REDIS_LOCK_FENCE|$REDIS_LOCK_FENCES\" > {}; \
         while [ ! -e {} ]; do sleep 0.05; done",
        started.display(),
        go.display()
    );
    let first = spawn_cli(
        &dir,
        &[
            "run", "--url", &url, "--ttl", "3s", "j:a", "--also", "j:b", "--also", "j:c", "--",
            "sh", "-c", &script,
        ],
    );
    assert!(
        wait_until(Duration::from_secs(10), || started.exists()),
        "the job started"
    );
    assert!(all_held(&server, &keys));
    let env = fs::read_to_string(&started).unwrap();
    let (head, fences) = env.trim().split_once('|').unwrap();
    let fences: Vec<u64> = fences.split(' ').map(|f| f.parse().unwrap()).collect();
    assert_eq!(fences.len(), 3, "{env}");
    assert_eq!(head, format!("j:a {}", fences[0]));
    let info = server.raw().cmd(&["LOCK.INFO", "j:c"]);
    assert_eq!(
        info.get("fence").and_then(|f| f.as_int()),
        Some(fences[2] as i64)
    );

    // Busy, as a single-key run is: one key of the set, and an overlapping set.
    let busy = spawn_cli(&dir, &["run", "--url", &url, "j:b", "--", "true"]).code();
    assert_eq!(busy, Some(75));
    let busy = spawn_cli(
        &dir,
        &["run", "--url", &url, "j:x", "--also", "j:c", "--", "true"],
    )
    .code();
    assert_eq!(busy, Some(75));
    assert!(is_free(&mut server.conn(), "j:x"), "nothing taken");
    // A waiting run of an overlapping set runs once the first ends.
    let waiting = spawn_cli(
        &dir,
        &[
            "run", "--url", &url, "-w", "15s", "j:c", "--also", "j:a", "--", "true",
        ],
    );
    assert!(wait_until(Duration::from_secs(10), || server
        .info_field("lock", "lock_waiters")
        .is_some_and(|n| n != "0")));
    fs::write(&go, "").unwrap();
    assert_eq!(first.code(), Some(0));
    assert_eq!(waiting.code(), Some(0));
    assert!(all_free(&server, &keys), "released together");
    // Sessions are one server's: --nodes is refused.
    let e = spawn_cli(
        &dir,
        &[
            "run",
            "--nodes",
            &format!("{url},{url}"),
            "j:a",
            "--also",
            "j:b",
            "--",
            "true",
        ],
    )
    .code();
    assert_eq!(e, Some(64));
    let _ = fs::remove_dir_all(&dir);
}

/// `kill -9` of redis-lock running a job on several keys: the session ends with its
/// TTL (3 s) and every key is free by then, or at once with --bind 0 (the server ends a
/// bound session when its connection closes), well before a 30 s TTL.
#[test]
fn cli_kill_9_releases_every_key_within_the_session_ttl_or_at_once_with_bind() {
    util::setup();
    let server = ServerBuilder::new().start();
    let url = server.url();
    let dir = temp_dir();
    for (keys, extra, limit) in [
        (["k:a", "k:b"], &["--ttl", "3s"][..], ms(3000)),
        (
            ["k:c", "k:d"],
            &["--ttl", "30s", "--bind", "0"][..],
            ms(10_000),
        ),
    ] {
        let mut args = vec!["run", "--url", &url];
        args.extend(extra);
        args.extend([keys[0], "--also", keys[1], "--", "sleep", "60"]);
        let mut cli = spawn_cli(&dir, &args);
        assert!(wait_until(Duration::from_secs(10), || all_held(
            &server, &keys
        )));
        let t = Instant::now();
        assert!(redis_lock_testkit::signal(cli.child.id(), libc::SIGKILL));
        let _ = cli.child.wait();
        assert!(
            wait_until(limit + ms(1000), || all_free(&server, &keys)),
            "{keys:?} free within {limit:?}"
        );
        eprintln!("{extra:?}: free {:?} after kill -9", t.elapsed());
        // Within the lease (less the time to see it), never before the server's end.
        let next = spawn_cli(
            &dir,
            &[
                "run", "--url", &url, keys[1], "--also", keys[0], "--", "true",
            ],
        )
        .code();
        assert_eq!(next, Some(0));
    }
    let _ = fs::remove_dir_all(&dir);
}
