//! Leader election and guarded writes against a real server: three candidates elected
//! in FIFO order as leaders resign, terms strictly increasing, an observer that sees
//! every leader, every proclaim and the gap, with its LOCK.WATCH calls counted in
//! `INFO commandstats`; a leader killed with SIGKILL (the CLI, as a child process); a
//! proclaim after the leadership was lost; `if_held` / `if_fence` / `check`; an observer
//! that survives a killed connection, quiet periods and a `MIGRATE` of the key
//! (`LOCKMOVED`); `redis-lock elect` and `redis-lock observe` end to end.

mod util;

use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redis_lock_client::{CampaignOptions, Error, Leader, LockClient, LossReason, ObserveOptions};
use redis_lock_testkit::{temp_dir, wait_until, Server, ServerBuilder};
use tokio::sync::mpsc;
use util::{cli_cmd, client, granted, lost_within, ms, setup};

const BIN: &str = env!("CARGO_BIN_EXE_redis-lock");

/// `cmdstat_lock.watch`'s `calls` in `INFO commandstats` (0 before the first call).
fn watch_calls(server: &Server) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_lock.watch:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Waiters queued on `key` (`LOCK.INFO`'s `waiters`; 0 when free).
fn waiters(server: &Server, key: &str) -> i64 {
    let v: redis::Value = redis::cmd("LOCK.INFO")
        .arg(key)
        .query(&mut server.conn())
        .unwrap();
    let redis::Value::Array(items) = v else {
        return 0;
    };
    items
        .chunks(2)
        .find_map(|kv| match (&kv[0], &kv[1]) {
            (redis::Value::BulkString(k), redis::Value::Int(n)) if k == b"waiters" => Some(*n),
            _ => None,
        })
        .unwrap_or(0)
}

/// An observer of `key` running in a task: every state it yields goes into the channel.
fn observe_into(
    locks: &LockClient,
    key: &str,
    block: Duration,
) -> mpsc::UnboundedReceiver<Option<Leader>> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut observer = locks.observe(key, ObserveOptions { block });
    tokio::spawn(async move {
        while let Some(item) = observer.next().await {
            if tx
                .send(item.expect("observe fails only on fatal errors"))
                .is_err()
            {
                return;
            }
        }
    });
    rx
}

/// The next state the observer saw, within `limit`.
async fn next_seen(
    rx: &mut mpsc::UnboundedReceiver<Option<Leader>>,
    limit: Duration,
) -> Option<Leader> {
    tokio::time::timeout(limit, rx.recv())
        .await
        .expect("the observer saw a change in time")
        .expect("the observer is running")
}

/// A server (after [`setup`]) and its URL.
fn start() -> (Server, String) {
    setup();
    let server = ServerBuilder::new().start();
    let url = server.url();
    (server, url)
}

fn campaign_opts(ttl_ms: u64) -> CampaignOptions {
    CampaignOptions::default().ttl(ms(ttl_ms))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_candidates_lead_in_fifo_order_and_one_observer_sees_every_change() {
    let (server, url) = start();
    let key = "election:fifo";
    let (a, b, c, watcher) = (
        client(&url).await,
        client(&url).await,
        client(&url).await,
        client(&url).await,
    );
    let before = watch_calls(&server);
    let started = Instant::now();
    let block = Duration::from_secs(5);
    let mut seen = observe_into(&watcher, key, block);
    let limit = Duration::from_secs(3);
    assert_eq!(next_seen(&mut seen, limit).await, None, "nobody leads yet");
    assert_eq!(a.leader(key).await.unwrap(), None);

    // A campaigns first and leads at once. A 20 s lease: a hand-over that waited for it
    // to run out (not the resign's release) would miss the 10 s bound below.
    let mut la = a
        .campaign(key, "node-a", &campaign_opts(20_000))
        .await
        .unwrap()
        .expect("elected");
    let term_a = la.term();
    let first = next_seen(&mut seen, limit).await.expect("a leader");
    assert_eq!(
        first,
        Leader {
            value: "node-a".into(),
            term: term_a
        }
    );
    assert_eq!(b.leader(key).await.unwrap(), Some(first));

    // B, then C, queue behind it, in that order.
    let cb = tokio::spawn(async move {
        let l = b.campaign(key, "node-b", &campaign_opts(2_000)).await;
        (l, Instant::now(), b)
    });
    assert!(wait_until(limit, || waiters(&server, key) == 1));
    let cc = tokio::spawn(async move {
        let l = c.campaign(key, "node-c", &campaign_opts(2_000)).await;
        (l, Instant::now(), c)
    });
    assert!(wait_until(limit, || waiters(&server, key) == 2));

    // A proclaims a new value: same term, and the observer sees it.
    la.proclaim("node-a:8080").await.unwrap();
    assert_eq!(la.value(), "node-a:8080");
    let proclaimed = Leader {
        value: "node-a:8080".into(),
        term: term_a,
    };
    assert_eq!(next_seen(&mut seen, limit).await, Some(proclaimed.clone()));
    assert_eq!(watcher.leader(key).await.unwrap(), Some(proclaimed));

    // A resigns: B leads at once (well before A's lease could end; the 10 s leave room
    // for a loaded machine's pauses), with a larger term.
    let t0 = Instant::now();
    assert!(la.resign().await.unwrap(), "A still led");
    let (lb, at, b) = cb.await.unwrap();
    let lb = lb.unwrap().expect("B elected");
    let handover = at - t0;
    assert!(
        handover < Duration::from_secs(10),
        "hand-over to B took {handover:?}"
    );
    let term_b = lb.term();
    assert!(term_b > term_a, "{term_b} > {term_a}");
    assert_eq!(
        next_seen(&mut seen, limit).await,
        Some(Leader {
            value: "node-b".into(),
            term: term_b
        })
    );
    assert!(lb.is_leader());

    // B resigns: C leads.
    assert!(lb.resign().await.unwrap());
    let (lc, _, _c) = cc.await.unwrap();
    let lc = lc.unwrap().expect("C elected");
    assert!(lc.term() > term_b);
    assert_eq!(
        next_seen(&mut seen, limit).await,
        Some(Leader {
            value: "node-c".into(),
            term: lc.term()
        })
    );

    // C resigns: nobody leads, and the observer sees the gap.
    assert!(lc.resign().await.unwrap());
    assert_eq!(next_seen(&mut seen, limit).await, None);
    assert_eq!(b.leader(key).await.unwrap(), None);

    // Six states seen (none, A, A's new value, B, C, none): the first from LOCK.INFO,
    // then one LOCK.WATCH per change, plus one per `block` that passed without one. A
    // poller would have called many times more.
    let elapsed = started.elapsed();
    let calls = watch_calls(&server) - before;
    let timeouts = elapsed.as_millis() as u64 / block.as_millis() as u64;
    assert!(
        (5..=5 + timeouts + 1).contains(&calls),
        "{calls} LOCK.WATCH calls for 5 changes in {elapsed:?}"
    );
    println!("fifo: hand-over {handover:?}, {calls} LOCK.WATCH calls for 5 changes in {elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_with_sigkill_keeps_its_term_until_its_lease_ends() {
    let (server, url) = start();
    let key = "election:killed";
    let dir = temp_dir();
    let pidfile = dir.join("cmd.pid");
    // The leader: the CLI, as a child process, whose command records its own pid.
    let mut leader = Command::new(BIN)
        .args([
            "elect", "--url", &url, key, "--value", "doomed", "-t", "3s", "-c",
        ])
        .arg(format!("echo $$ > {}; exec sleep 30", pidfile.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let locks = client(&url).await;
    let mut observed = None;
    for _ in 0..250 {
        observed = locks.leader(key).await.unwrap();
        if observed.is_some() && pidfile.exists() {
            break;
        }
        tokio::time::sleep(ms(20)).await;
    }
    let doomed = observed.expect("the child leads");
    assert_eq!(doomed.value, "doomed");
    let mut seen = observe_into(&locks, key, Duration::from_secs(5));
    assert_eq!(next_seen(&mut seen, ms(3_000)).await, Some(doomed.clone()));

    let next = client(&url).await;
    let campaign = tokio::spawn(async move {
        (
            next.campaign(key, "heir", &campaign_opts(1_000)).await,
            Instant::now(),
        )
    });
    assert!(wait_until(ms(3_000), || waiters(&server, key) == 1));

    // SIGKILL: no resign, no renewal. The heir leads once the lease has run out: never
    // before the lease left as read just before the kill (from before that read was
    // sent; a renewal after it only moves the end later), 20 ms allowed for the server's
    // ms clock. Up to 3 s were left (a renewal every second), 2 s unless the child's
    // renewal ran late on a loaded machine; the upper bound is a hang guard.
    let sent = Instant::now();
    let left = locks.info(key).await.unwrap().expect("held").ttl_ms;
    let killed_at = Instant::now();
    leader.kill().unwrap();
    leader.wait().unwrap();
    let (heir, at) = campaign.await.unwrap();
    let heir = heir.unwrap().expect("the heir is elected");
    let waited = at - killed_at;
    let ended = ms(u64::try_from(left).unwrap_or(0)).saturating_sub(ms(20));
    assert!(
        at - sent >= ended,
        "elected {waited:?} after the kill, {:?} after {left} ms were left",
        at - sent
    );
    assert!(
        waited <= Duration::from_secs(10),
        "elected {waited:?} after the kill"
    );
    assert!(heir.term() > doomed.term);
    // The observer sees the heir; where the lease ran out (rather than a release
    // handing over), the server may answer the watcher with "nobody" a moment before
    // the heir's grant.
    let heir_seen = Leader {
        value: "heir".into(),
        term: heir.term(),
    };
    let mut states = vec![next_seen(&mut seen, ms(3_000)).await];
    if states[0].is_none() {
        states.push(next_seen(&mut seen, ms(3_000)).await);
    }
    assert_eq!(states.last(), Some(&Some(heir_seen)), "{states:?}");
    if let Some(pid) = fs::read_to_string(&pidfile)
        .ok()
        .and_then(|p| p.trim().parse::<i32>().ok())
    {
        // SAFETY: kill(2) of the sleep our child started.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
    println!(
        "killed leader: heir elected {waited:?} after SIGKILL ({left} ms left, lease 3 s); observed {states:?}"
    );
    heir.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proclaim_after_the_leadership_was_lost_fails_and_the_loss_is_signalled() {
    let (server, url) = start();
    let locks = client(&url).await;
    let key = "election:lost";
    let mut l = locks
        .campaign(key, "node-a", &campaign_opts(3_000))
        .await
        .unwrap()
        .unwrap();
    let token = l.guard().token().to_string();
    let lost = l.lost();
    let n: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg(key)
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(n, 1);
    let e = l.proclaim("node-a:2").await.unwrap_err();
    assert!(e.is_not_held(), "{e:?}");
    let text = format!("{e} {e:?}");
    assert!(
        text.contains("not published") && !text.contains(&token),
        "{text}"
    );
    assert_eq!(lost_within(ms(5_000), lost).await, LossReason::NotHeld);
    assert!(!l.is_leader());
    assert_eq!(l.value(), "node-a", "the value did not change");
    assert_eq!(locks.leader(key).await.unwrap(), None);
    // Once lost, a proclaim fails without asking the server.
    assert!(l.proclaim("node-a:3").await.unwrap_err().is_not_held());
    assert!(!l.resign().await.unwrap(), "nothing left to resign");
    // Values the module would refuse fail before any I/O.
    assert!(matches!(
        locks.campaign(key, "", &campaign_opts(1_000)).await,
        Err(Error::Invalid(_))
    ));
    // A campaign that waits less than the leader holds: not elected.
    let _holder = granted(locks.acquire(key, ms(5_000), None)).await;
    let t = Instant::now();
    let none = locks
        .campaign(key, "late", &campaign_opts(1_000).wait(ms(300)))
        .await
        .unwrap();
    assert!(none.is_none() && t.elapsed() >= ms(280));
    assert_eq!(
        waiters(&server, key),
        0,
        "the timed-out candidate left the queue"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_campaign_leaves_the_queue_and_holds_nothing() {
    let (server, url) = start();
    let locks = client(&url).await;
    let key = "election:cancel";
    let holder = granted(locks.acquire(key, ms(10_000), None)).await;
    let other = locks.clone();
    let campaign =
        tokio::spawn(async move { other.campaign(key, "quitter", &campaign_opts(5_000)).await });
    assert!(wait_until(ms(3_000), || waiters(&server, key) == 1));
    campaign.abort();
    assert!(wait_until(ms(3_000), || waiters(&server, key) == 0));
    holder.release().await.unwrap();
    tokio::time::sleep(ms(100)).await;
    assert_eq!(
        locks.leader(key).await.unwrap(),
        None,
        "nobody was handed the lock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guarded_writes_run_while_held_and_are_refused_after_the_lease() {
    setup();
    let server = ServerBuilder::new().start();
    let mut conn = server.conn();
    let locks = client(&server.url()).await;
    let key = "lock:product:9001";
    let _: () = redis::cmd("SET")
        .arg("stock:9001")
        .arg(10)
        .query(&mut conn)
        .unwrap();

    // A: a 1 s lease, no renewal.
    let a = granted(locks.acquire(key, ms(1_000), None)).await;
    let fence_a = a.fence().unwrap();
    let left: i64 = a
        .if_held(redis::cmd("DECRBY").arg("stock:9001").arg(1))
        .await
        .unwrap();
    assert_eq!(left, 9);
    let ok: String = locks
        .if_fence(key, fence_a, redis::cmd("SET").arg("price:9001").arg(1999))
        .await
        .unwrap();
    assert_eq!(ok, "OK");
    assert!(a.check().await.unwrap());
    assert!(locks.check(key, fence_a).await.unwrap());
    // The wrapped command's own error comes back as it is.
    let e = a
        .if_held::<i64>(redis::cmd("LPUSH").arg("stock:9001").arg("x"))
        .await
        .unwrap_err();
    assert_eq!(e.server_code(), Some("WRONGTYPE"), "{e:?}");
    assert!(a
        .if_held::<()>(&redis::Cmd::new())
        .await
        .is_err_and(|e| e.is_usage_error()));

    // A "pauses" past its lease; B takes the lock and sells one.
    tokio::time::sleep(ms(1_200)).await;
    let b = granted(locks.acquire(key, ms(5_000), None)).await;
    let left: i64 = b
        .if_held(redis::cmd("DECRBY").arg("stock:9001").arg(1))
        .await
        .unwrap();
    assert_eq!(left, 8);
    // A wakes up: its guarded write is refused and nothing ran.
    let e = a
        .if_held::<i64>(redis::cmd("DECRBY").arg("stock:9001").arg(1))
        .await
        .unwrap_err();
    assert!(e.is_not_held(), "{e:?}");
    let text = format!("{e} {e:?}");
    assert!(!text.contains(a.token()), "{text}");
    assert!(text.contains("the guarded command did not run"), "{text}");
    let e = locks
        .if_fence::<String>(key, fence_a, redis::cmd("SET").arg("price:9001").arg(1))
        .await
        .unwrap_err();
    assert!(e.is_not_held(), "{e:?}");
    let stock: i64 = redis::cmd("GET")
        .arg("stock:9001")
        .query(&mut conn)
        .unwrap();
    let price: i64 = redis::cmd("GET")
        .arg("price:9001")
        .query(&mut conn)
        .unwrap();
    assert_eq!((stock, price), (8, 1999), "the late writes changed nothing");
    assert!(!a.check().await.unwrap());
    assert!(locks.check(key, b.fence().unwrap()).await.unwrap());
    assert!(!matches!(
        a.status(),
        redis_lock_client::LeaseStatus::Held { .. }
    ));

    // A refused guarded write of a live guard fires its loss signal.
    let c = granted(locks.acquire("lock:other", ms(5_000), None)).await;
    let lost = c.lost();
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("lock:other")
        .query(&mut conn)
        .unwrap();
    let e = c
        .if_held::<String>(redis::cmd("SET").arg("other:data").arg(1))
        .await
        .unwrap_err();
    assert!(e.is_not_held());
    // A hang guard: the refusal itself marks the guard lost.
    assert_eq!(lost_within(ms(5_000), lost).await, LossReason::NotHeld);
    b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_survives_quiet_periods_a_killed_connection_and_lockmoved() {
    setup();
    let server = ServerBuilder::new().start();
    let other = ServerBuilder::new().start();
    let url = server.url();
    let locks = client(&url).await;
    let key = "election:survive";
    let before = watch_calls(&server);
    let mut seen = observe_into(&locks, key, ms(200));
    assert_eq!(next_seen(&mut seen, ms(2_000)).await, None);
    // Quiet: each 200 ms BLOCK ends without a change, and nothing is yielded.
    assert!(tokio::time::timeout(ms(1_000), seen.recv()).await.is_err());
    let quiet = watch_calls(&server) - before;
    assert!(
        (3..=7).contains(&quiet),
        "{quiet} calls in 1 s of 200 ms blocks"
    );

    let l = locks
        .campaign(key, "node-a", &campaign_opts(5_000))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        next_seen(&mut seen, ms(2_000)).await.unwrap().value,
        "node-a"
    );

    // Its connection killed: it reconnects and sees the next change.
    let mut c = server.conn();
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut c).unwrap();
    let id = list
        .lines()
        .find(|l| l.contains("cmd=lock.watch"))
        .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .expect("the observer's connection")
        .to_string();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(&id)
        .query(&mut c)
        .unwrap();
    assert_eq!(killed, 1);
    let mut l = l;
    l.proclaim("node-a:2").await.unwrap();
    assert_eq!(
        next_seen(&mut seen, ms(3_000)).await.unwrap().value,
        "node-a:2"
    );

    // The key moves to another server (MIGRATE): the watcher gets LOCKMOVED, the
    // observer reads again and finds nobody leading here.
    let port = other.socket_addr().port().to_string();
    let moved: String = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(&port)
        .arg(key)
        .arg(0)
        .arg(5_000)
        .query(&mut c)
        .unwrap();
    assert_eq!(moved, "OK");
    assert_eq!(next_seen(&mut seen, ms(3_000)).await, None);
    drop(l);
}

// ---- the CLI ------------------------------------------------------------------------

#[test]
fn cli_elect_and_observe_end_to_end() {
    let (server, url) = start();
    let dir = temp_dir();
    let spawn = |name: &str, args: &[&str]| {
        cli_cmd()
            .args(args)
            .stdout(fs::File::create(dir.join(format!("{name}.out"))).unwrap())
            .stderr(fs::File::create(dir.join(format!("{name}.err"))).unwrap())
            .spawn()
            .unwrap()
    };
    let read = |name: &str| fs::read_to_string(dir.join(name)).unwrap_or_default();
    let key = "election:cli";
    let mut observe = spawn(
        "observe",
        &[
            "observe", "--url", &url, key, "--json", "--count", "4", "--for", "20s", "--block",
            "5s",
        ],
    );
    assert!(wait_until(Duration::from_secs(5), || read("observe.out")
        .lines()
        .count()
        == 1));
    let env_line = "echo \"$REDIS_LOCK_VALUE $REDIS_LOCK_TERM $REDIS_LOCK_FENCE\"";
    let a_script = format!("{env_line}; sleep 1");
    let mut a = spawn(
        "a",
        &[
            "elect", "--url", &url, key, "--value", "node-a", "-t", "2s", "-c", &a_script,
        ],
    );
    assert!(wait_until(Duration::from_secs(5), || !read("a.out").is_empty()));
    // B leads for half a second: an observer reports who holds the key when it looks,
    // so a leadership shorter than its round trip (an echo and an exit) may be skipped.
    let b_script = format!("{env_line}; sleep 0.5; exit 7");
    let mut b = spawn(
        "b",
        &[
            "elect", "--url", &url, key, "--value", "node-b", "-t", "2s", "-c", &b_script,
        ],
    );
    // B waits for A (its command ends after 1 s), runs, and exits with its command's code.
    let a_code = a.wait().unwrap().code();
    let b_code = b.wait().unwrap().code();
    assert_eq!(
        (a_code, b_code),
        (Some(0), Some(7)),
        "{} {}",
        read("a.err"),
        read("b.err")
    );
    let status = observe.wait().unwrap();
    assert_eq!(status.code(), Some(0), "{}", read("observe.err"));
    let lines: Vec<serde_json::Value> = read("observe.out")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(lines[0]["leader"], false);
    assert_eq!(lines[3]["leader"], false);
    let term = |i: usize| lines[i]["term"].as_str().unwrap().parse::<u64>().unwrap();
    assert_eq!(
        (lines[1]["value"].as_str(), lines[2]["value"].as_str()),
        (Some("node-a"), Some("node-b"))
    );
    assert!(term(2) > term(1));
    // What each command saw in its environment: its value and term (= its fence).
    for (file, value, i) in [("a.out", "node-a", 1), ("b.out", "node-b", 2)] {
        let out = read(file);
        let f: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(
            f,
            vec![value, &term(i).to_string(), &term(i).to_string()],
            "{out}"
        );
    }

    // Busy within --wait: 75, the command never runs; observe --for without --count: 0.
    let holder = spawn(
        "h",
        &["elect", "--url", &url, key, "--value", "h", "-c", "sleep 5"],
    );
    assert!(wait_until(Duration::from_secs(5), || {
        redis::cmd("LOCK.INFO")
            .arg(key)
            .query::<redis::Value>(&mut server.conn())
            .is_ok_and(|v| v != redis::Value::Nil)
    }));
    let t = Instant::now();
    let late = Command::new(BIN)
        .args(["elect", "--url", &url, key, "-w", "300ms", "--", "touch"])
        .arg(dir.join("never"))
        .output()
        .unwrap();
    assert_eq!(late.status.code(), Some(75));
    assert!(t.elapsed() >= ms(280) && !dir.join("never").exists());
    let once = Command::new(BIN)
        .args(["observe", "--url", &url, key, "--for", "300ms"])
        .output()
        .unwrap();
    assert_eq!(once.status.code(), Some(0));
    let text = String::from_utf8_lossy(&once.stdout);
    assert!(
        text.starts_with("leader ") && text.trim_end().ends_with(" h"),
        "{text}"
    );
    let short = Command::new(BIN)
        .args([
            "observe", "--url", &url, key, "--count", "2", "--for", "300ms",
        ])
        .output()
        .unwrap();
    assert_eq!(
        short.status.code(),
        Some(1),
        "--count not reached within --for"
    );
    // SIGTERM while campaigning: the candidate leaves the queue, exit 128+15.
    let mut waiting = spawn("w", &["elect", "--url", &url, key, "--", "true"]);
    assert!(wait_until(Duration::from_secs(5), || waiters(&server, key) == 1));
    // SAFETY: kill(2) of our child.
    unsafe {
        libc::kill(waiting.id() as i32, libc::SIGTERM);
    }
    assert_eq!(waiting.wait().unwrap().code(), Some(128 + 15));
    assert!(wait_until(Duration::from_secs(3), || waiters(&server, key) == 0));
    let mut holder = holder;
    let _ = holder.kill();
    let _ = holder.wait();

    // Help within 80 columns.
    for sub in ["elect", "observe"] {
        let out = Command::new(BIN)
            .args([sub, "--help"])
            .env("COLUMNS", "80")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        let wide: Vec<&str> = help.lines().filter(|l| l.chars().count() > 80).collect();
        assert!(wide.is_empty(), "{sub}: {wide:?}");
        assert!(
            help.contains("LOCK.IFHELD") || help.contains("LOCK.WATCH"),
            "{help}"
        );
    }
}
