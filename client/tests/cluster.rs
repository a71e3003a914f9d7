//! Single-server mode against a three-master Redis Cluster: the client detects the
//! cluster from the URL of any node and routes every command by key.

mod util;

use std::collections::HashSet;
use std::process::Command;
use std::time::Instant;

use redis_lock_client::{AcquireOptions, LockClient};
use redis_lock_testkit::{wait_until, Cluster};
use util::{held_fence, is_free, ms, setup, steady_renewal};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_server_mode_against_a_three_master_cluster() {
    setup();
    let cluster = Cluster::start(3);
    // Any node's URL: the client asks INFO cluster and switches to cluster routing.
    let a = LockClient::connect(&cluster.nodes[1].url()).await.unwrap();
    let b = LockClient::connect(&cluster.nodes[2].url()).await.unwrap();
    assert!(a.is_cluster());

    // Names spread over all three masters.
    let names: Vec<String> = (0..12).map(|i| format!("lock:order-{i}")).collect();
    let owners: HashSet<u16> = names.iter().map(|n| cluster.node_for_key(n).port).collect();
    assert_eq!(owners.len(), 3, "the names cover every master");

    let mut guards = Vec::new();
    for n in &names {
        let g = a
            .acquire_with(
                n,
                // 3 s, renewed every 500 ms: a renewal may come 2.2 s late (a loaded
                // machine) before the guard gives up (a 400 ms lease left 133 ms).
                &AcquireOptions::new(ms(3_000)).renewal(steady_renewal()),
            )
            .await
            .unwrap()
            .expect("granted");
        let fence = g.fence().unwrap();
        let mut c = cluster.node_for_key(n).conn();
        assert_eq!(
            held_fence(&mut c, n),
            Some(fence),
            "held on the owning master"
        );
        assert!(b.acquire(n, ms(1_000), None).await.unwrap().is_none());
        guards.push(g);
    }
    // Renewal keeps every one alive past two TTLs.
    tokio::time::sleep(ms(6_500)).await;
    for (n, g) in names.iter().zip(&guards) {
        assert!(g.is_held(), "{n}");
        assert!(!is_free(&mut cluster.node_for_key(n).conn(), n));
        let info = b.info(n).await.unwrap().expect("held");
        assert_eq!(info.fence, g.fence());
    }

    // A waiter on a cluster key gets it when the holder releases.
    let first = guards.remove(0);
    let name = names[0].clone();
    // Before the spawn: the task may start late on a loaded machine, the release below
    // comes at least 300 ms after this.
    let t = Instant::now();
    let waiter = tokio::spawn(async move {
        let g = b
            .acquire(&name, ms(5_000), Some(ms(5_000)))
            .await
            .unwrap()
            .expect("handed over");
        (t.elapsed(), g)
    });
    tokio::time::sleep(ms(300)).await;
    let f1 = first.fence().unwrap();
    assert!(first.release().await.unwrap());
    let (waited, g) = waiter.await.unwrap();
    assert!(waited >= ms(250));
    assert!(g.fence().unwrap() > f1);
    assert!(g.release().await.unwrap());

    for g in guards {
        assert!(g.release().await.unwrap());
    }
    for n in &names {
        assert!(is_free(&mut cluster.node_for_key(n).conn(), n));
    }

    // The CLI with a cluster node's URL.
    let name = "lock:cron-job";
    let node = cluster.node_for_key(name);
    let other = cluster.nodes.iter().find(|n| n.port != node.port).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_redis-lock"))
        .args(["run", "--url", &other.url(), "--ttl", "500ms", name, "--"])
        .args([
            "sh",
            "-c",
            "sleep 1; test -n \"$REDIS_LOCK_FENCE\" && exit 5",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "{out:?}");
    assert!(wait_until(ms(1_000), || is_free(&mut node.conn(), name)));
}
