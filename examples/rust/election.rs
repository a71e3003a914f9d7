//! Leader election with the redis-lock module and the Rust client.
//!
//! Three schedulers campaign for `election:{scheduler}`; exactly one leads at a time,
//! in the order they started campaigning. The leader publishes where it can be reached
//! (`proclaim`), runs its jobs with writes guarded by its leadership (`if_held`: a
//! leader whose lease ended cannot write any more), then resigns, and the next
//! candidate is elected in the same step. An observer prints every change, from
//! LOCK.WATCH, without polling.
//!
//! ```sh
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --release -p redis-lock-client --example election
//! ```
//! Exits non-zero if a check fails (`make test-examples` runs it).

use std::time::Duration;

use redis_lock_client::{CampaignOptions, LockClient, ObserveOptions};

const KEY: &str = "election:{scheduler}";
const RUNS: &str = "scheduler:{scheduler}:runs";

async fn scheduler(url: String, name: &'static str) -> redis_lock_client::Result<u64> {
    let locks = LockClient::connect(&url).await?;
    let opts = CampaignOptions::default().ttl(Duration::from_secs(5));
    // Waits in the FIFO queue until elected (opts.wait: None, no limit).
    let Some(mut leadership) = locks.campaign(KEY, name, &opts).await? else {
        unreachable!("a campaign without a wait limit ends elected or with an error");
    };
    let term = leadership.term();
    leadership.proclaim(format!("{name}:8080")).await?; // where followers find it
    for _ in 0..3 {
        // A job, written only while it leads.
        let _: i64 = leadership.if_held(redis::cmd("INCR").arg(RUNS)).await?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    leadership.resign().await?; // the next candidate leads at once
    Ok(term)
}

#[tokio::main]
async fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let locks = match LockClient::connect(&url).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cannot reach {url}: {e}");
            std::process::exit(2);
        }
    };
    let mut conn = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("a connection for the checks");
    let _: () = redis::cmd("DEL")
        .arg(KEY)
        .arg(RUNS)
        .query(&mut conn)
        .expect("DEL");

    // The observer: who leads now, then every change.
    let mut observer = locks.observe(KEY, ObserveOptions::default());
    let watcher = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(change) = observer.next().await {
            let leader = change.expect("observing");
            match &leader {
                Some(l) => println!("   observer: {} (term {})", l.value, l.term),
                None => println!("   observer: nobody leads"),
            }
            let done = leader.is_none() && seen.len() > 1;
            seen.push(leader.map(|l| l.value));
            if done {
                return seen;
            }
        }
        seen
    });
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut tasks = Vec::new();
    for name in ["scheduler-a", "scheduler-b", "scheduler-c"] {
        tasks.push(tokio::spawn(scheduler(url.clone(), name)));
        tokio::time::sleep(Duration::from_millis(100)).await; // campaign in this order
    }
    let mut terms = Vec::new();
    for t in tasks {
        terms.push(t.await.expect("the scheduler task").expect("the scheduler"));
    }
    let seen = tokio::time::timeout(Duration::from_secs(5), watcher)
        .await
        .expect("the observer saw the end")
        .expect("the observer task");

    let mut failures = 0;
    let mut check = |ok: bool, what: String| {
        println!("{} {what}", if ok { "ok  " } else { "FAIL" });
        failures += usize::from(!ok);
    };
    check(
        terms.windows(2).all(|w| w[0] < w[1]),
        format!("elected in FIFO order, each term larger than the last ({terms:?})"),
    );
    let runs: i64 = redis::cmd("GET").arg(RUNS).query(&mut conn).expect("GET");
    check(runs == 9, format!("9 guarded job runs ({runs})"));
    // Each leader's lasting value, in order. A state that lasts less than a round trip
    // (the campaign value, proclaimed over at once) may be seen or overtaken.
    let names = ["scheduler-a", "scheduler-b", "scheduler-c"];
    let lasting: Vec<Option<String>> = seen
        .iter()
        .filter(|v| v.as_deref().is_none_or(|v| v.ends_with(":8080")))
        .cloned()
        .collect();
    let mut expected = vec![None];
    expected.extend(names.iter().map(|n| Some(format!("{n}:8080"))));
    expected.push(None);
    let allowed = |v: &Option<String>| {
        v.as_deref()
            .is_none_or(|v| names.iter().any(|n| v == *n || v == format!("{n}:8080")))
    };
    check(
        lasting == expected && seen.iter().all(allowed),
        format!("the observer saw each leader in order ({seen:?})"),
    );
    let now = locks.leader(KEY).await.expect("leader");
    check(now.is_none(), "nobody leads at the end".into());
    if failures > 0 {
        eprintln!("{failures} check(s) failed");
        std::process::exit(1);
    }
    println!("all checks passed");
}
