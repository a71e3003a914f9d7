//! Every call is bounded while the server is stopped (SIGSTOP: connections are accepted
//! by the kernel and never answered), down (refused) or restarting, with an error that
//! names the server: the library's calls and the CLI.

mod util;

use std::future::Future;
use std::time::{Duration, Instant};

use redis_lock_client::{ClientOptions, Error, LockClient};
use redis_lock_testkit::{temp_dir, ServerBuilder};
use util::{cli_cmd, granted, ms, setup, Stopped};

/// Slack on top of a documented limit: a loaded 2-core machine pauses 1-2 s. Below the
/// 2 s defaults' margin over the 400 ms limits used here, so that a call timed by a
/// default (or anything but its own limit) still fails; a call with no limit hangs and
/// fails `fails_within`'s own bound.
const SLACK: Duration = Duration::from_millis(1_500);

fn opts(limit: Duration) -> ClientOptions {
    ClientOptions {
        connect_timeout: limit,
        io_timeout: limit,
        ..ClientOptions::default()
    }
}

/// Runs `call`, asserts it failed within `bound` + slack, returns the error and the time.
async fn fails_within<T>(
    what: &str,
    bound: Duration,
    call: impl Future<Output = redis_lock_client::Result<T>>,
) -> (Error, Duration) {
    let t = Instant::now();
    // The test's own bound, far above the client's: a hang fails here, not in CI's.
    let r = tokio::time::timeout(bound + Duration::from_secs(10), call)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer at all within {bound:?} + 10 s"));
    let took = t.elapsed();
    let Err(e) = r else {
        panic!("{what} succeeded");
    };
    eprintln!("{what}: {took:?}: {e}");
    assert!(
        took <= bound + SLACK,
        "{what} took {took:?}, bound {bound:?}"
    );
    (e, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_bounded_while_the_server_is_stopped_down_or_restarting() {
    setup();
    let mut server = ServerBuilder::new().start();
    let addr = server.addr();
    let limit = ms(400);
    let locks = LockClient::connect_with(&server.url(), opts(limit))
        .await
        .unwrap();
    let g = granted(locks.acquire("held", ms(30_000), None)).await;
    let (token, _) = g.detach();

    // Stopped: the shared connection's calls, a BLOCK wait and a new connection all end
    // at their limits with a Timeout naming the server.
    let stopped = Stopped::new(server.pid());
    let no_answer = |e: &Error, what: &str| {
        assert!(matches!(e, Error::Timeout { .. }), "{what}: {e:?}");
        let m = e.to_string();
        assert!(m.starts_with(&format!("{addr}: ")), "{m}");
        assert!(m.contains("no answer within"), "{m}");
    };
    let (e, _) = fails_within("acquire", limit, locks.acquire("k", ms(5_000), None)).await;
    no_answer(&e, "acquire");
    let wait = ms(600);
    let (e, _) = fails_within(
        "acquire with a wait",
        wait + limit + limit,
        locks.acquire("k", ms(5_000), Some(wait)),
    )
    .await;
    no_answer(&e, "acquire with a wait");
    let (e, _) = fails_within("extend", limit, locks.extend("held", &token, ms(9_000))).await;
    no_answer(&e, "extend");
    // A release is tried again after a timeout (a failover may be settling) for up to
    // 5 s (docs/CLIENT.md, time limits), each try within its limit.
    let (e, took) = fails_within("release", ms(5_000) + limit, locks.release("held", &token)).await;
    assert!(took > limit + limit, "tried again: {took:?}");
    no_answer(&e, "release");
    let (e, _) = fails_within("info", limit, locks.info("held")).await;
    no_answer(&e, "info");
    let (e, _) = fails_within(
        "connect",
        limit + limit,
        LockClient::connect_with(&server.url(), opts(limit)),
    )
    .await;
    no_answer(&e, "connect");
    drop(stopped);

    // Restarted on the same port: the connection made before is dead; the next acquire
    // is sent again on a fresh one and succeeds.
    server.restart();
    let g = locks
        .acquire("after-restart", ms(5_000), None)
        .await
        .expect("the first acquire after a restart")
        .expect("granted");
    assert!(g.fence().is_some());
    drop(g);

    // Down: refused at once, with the server's address.
    server.kill9();
    let (e, took) =
        fails_within("acquire (down)", limit, locks.acquire("k", ms(5_000), None)).await;
    // Refused, not timed out: the kind of error tells (a time under the limit did too,
    // until a loaded machine took longer to be refused).
    assert!(e.is_connection_error(), "{e:?}");
    assert!(!matches!(e, Error::Timeout { .. }), "{e:?}");
    assert!(e.to_string().starts_with(&format!("{addr}: ")), "{e}");
    eprintln!("refused after {took:?}");
    let (e, _) = fails_within(
        "acquire with a wait (down)",
        limit,
        locks.acquire("k", ms(5_000), Some(ms(5_000))),
    )
    .await;
    assert!(e.is_connection_error(), "{e:?}");
}

/// `redis-lock ARGS` with no REDIS_* setting from the test's environment.
fn cli(args: &[&str]) -> (Option<i32>, String, Duration) {
    let t = Instant::now();
    let out = cli_cmd().args(args).output().unwrap();
    let took = t.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!(
        "redis-lock {args:?}: {:?} after {took:?}: {stderr}",
        out.status.code()
    );
    (out.status.code(), stderr, took)
}

#[test]
fn the_cli_exits_69_in_time_when_the_server_is_stopped_or_down() {
    setup();
    let mut server = ServerBuilder::new().start();
    let (url, addr) = (server.url(), server.addr());
    let dir = temp_dir();
    let ran = dir.join("ran");
    let touch = format!("touch {}", ran.display());
    let run = [
        "run",
        "--timeout",
        "500ms",
        "--url",
        &url,
        "job",
        "--",
        "sh",
        "-c",
        &touch,
    ];

    let stopped = Stopped::new(server.pid());
    let (code, stderr, took) = cli(&run);
    drop(stopped);
    assert_eq!(code, Some(69));
    // Connect (500 ms) and INFO cluster within 500 + 500 ms.
    assert!(took < ms(1_000) + SLACK, "{took:?}");
    assert!(
        stderr.contains(&format!("{addr}: ")) && stderr.contains("no answer within"),
        "{stderr}"
    );

    server.kill9();
    let (code, stderr, took) = cli(&run);
    assert_eq!(code, Some(69));
    // Refused at once: said by the error below (a process start on a loaded machine can
    // take longer than the 500 ms --timeout by itself).
    assert!(took < ms(500) + SLACK, "refused at once: {took:?}");
    assert!(
        stderr.contains(&format!("{addr}: ")) && stderr.contains("refused"),
        "{stderr}"
    );
    assert!(!ran.exists(), "CMD never ran");
    let _ = std::fs::remove_dir_all(&dir);
}
