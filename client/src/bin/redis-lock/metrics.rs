//! `redis-lock metrics`: the module's `INFO lock` figures and per-key waiting figures in
//! the Prometheus text format (version 0.0.4), served over HTTP on `--listen` or printed
//! once with `--once` (for node_exporter's textfile collector).
//!
//! Names: `redis_lock_<field>` for a gauge of `INFO lock` (`held`, `waiters`, ...),
//! `redis_lock_<field>_total` for a counter (`acquired`, ...), a field in ms becomes
//! `..._seconds`; per key: `redis_lock_key_waiters`, `redis_lock_key_holders` and
//! `redis_lock_key_longest_wait_seconds`, labelled `key`. docs/MONITORING.md lists them.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use futures_util::future::join_all;
use redis_lock_client::{LockClient, LockInfo};
use tokio::net::{TcpListener, TcpStream};

use super::{Args, Locker, EXIT_UNAVAILABLE, EXIT_USAGE};

#[derive(ClapArgs, Debug, Clone)]
pub struct MetricsArgs {
    /// Address to serve /metrics on (port 0: a free port, printed on stderr)
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:9379")]
    listen: String,
    /// Print one scrape on stdout and exit instead of serving
    #[arg(long)]
    once: bool,
    /// Report this lock at every scrape, waited for or not (repeatable)
    #[arg(long = "key", value_name = "NAME")]
    keys: Vec<String>,
    /// Keys the server looks at per scrape to find locks with waiters (SCAN ... TYPE
    /// redislock); 0: only the --key locks
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    scan: u64,
    /// Report at most N of the scanned locks with waiters: those waited for longest
    #[arg(long, value_name = "N", default_value_t = 100)]
    max_keys: usize,
}

/// The `INFO lock` fields that only grow from the server's start (the rest are gauges;
/// a field this list does not know yet is shown as a gauge).
const COUNTERS: &[&str] = &[
    "acquired",
    "renewed",
    "contended",
    "released",
    "extended",
    "expired",
    "removed",
    "evicted",
    "restored",
    "handed_off",
    "wait_timeouts",
    "force_released",
    "repaired",
    "refused_eviction",
    "panics",
    "waited_ms",
];

/// What each known `INFO lock` field means (docs/commands.md, "INFO lock").
fn help(field: &str) -> &'static str {
    match field {
        "held" => "Lock keys the server holds now.",
        "waiters" => "Clients waiting (BLOCK) for a lock now.",
        "longest_wait_ms" => "How long the client waiting longest, on any key, has waited.",
        "watchers" => "Clients in LOCK.WATCH now.",
        "acquired" => "Grants, hand-offs included.",
        "renewed" => "Acquires repeated with the token that already held the lock.",
        "contended" => "Acquires that found the lock taken.",
        "released" => "Releases by the holder.",
        "extended" => "Leases extended.",
        "expired" => "Leases that ended without a release.",
        "removed" => "Lock keys the server removed (DEL, RENAME, overwrite, expiry, MIGRATE).",
        "evicted" => "Lock keys evicted (maxmemory).",
        "handed_off" => "Locks handed to a waiting client.",
        "wait_timeouts" => "Waits that ended without the lock (BLOCK timeout).",
        "force_released" => "Holders removed by LOCK.FORCERELEASE.",
        "repaired" => "Values the loader repaired.",
        "waited_ms" => "Time spent waiting by the waits that ended.",
        "panics" => "Panics the module caught.",
        "last_fence" => "The last fencing token this server issued.",
        _ => "",
    }
}

/// `redis-lock metrics`: serve, or print one scrape.
pub async fn run(a: &Args, locker: &Locker) -> i32 {
    let (Some(m), Locker::Single(c)) = (&a.metrics, locker) else {
        log::error!("metrics reads one server (--url), not a Redlock quorum (--nodes)");
        return EXIT_USAGE;
    };
    if c.is_cluster() {
        log::error!(
            "metrics reads one server: {} is a Redis Cluster node, which is not supported yet",
            redis_lock_client::redact_url(&a.url)
        );
        return EXIT_USAGE;
    }
    if m.once {
        let text = scrape(c, m).await;
        use std::io::Write;
        let _ = std::io::stdout().lock().write_all(text.as_bytes());
        return if text.contains("\nredis_lock_up 1\n") {
            0
        } else {
            EXIT_UNAVAILABLE
        };
    }
    let listener = match TcpListener::bind(&m.listen).await {
        Ok(l) => l,
        Err(e) => {
            log::error!("cannot listen on {}: {e}", m.listen);
            return EXIT_UNAVAILABLE;
        }
    };
    match listener.local_addr() {
        Ok(addr) => log::info!("serving metrics on http://{addr}/metrics"),
        Err(e) => log::info!("serving metrics on {} ({e})", m.listen),
    }
    tokio::select! {
        _ = accept_loop(&listener, c, m) => {}
        sig = super::any_signal() => log::debug!("signal {sig}: stopping"),
    }
    0
}

async fn accept_loop(listener: &TcpListener, c: &LockClient, m: &MetricsArgs) {
    loop {
        match listener.accept().await {
            Ok((conn, _)) => {
                let (c, m) = (c.clone(), m.clone());
                tokio::spawn(async move { answer(conn, &c, &m).await });
            }
            Err(e) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                log::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One HTTP/1.1 request on `conn`, answered and closed: `GET /metrics` is a scrape.
async fn answer(conn: TcpStream, c: &LockClient, m: &MetricsArgs) {
    let head = match tokio::time::timeout(Duration::from_secs(10), read_head(&conn)).await {
        Ok(Ok(head)) => head,
        _ => return,
    };
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, kind, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            scrape(c, m).await,
        ),
        ("GET" | "HEAD", "/") => (
            "200 OK",
            "text/plain; charset=utf-8",
            "redis-lock metrics: see /metrics\n".to_string(),
        ),
        ("GET" | "HEAD", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_string(),
        ),
    };
    let body = if method == "HEAD" { "" } else { body.as_str() };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(10), write_all(&conn, reply.as_bytes())).await;
}

/// The request head (up to the blank line, at most 8 KiB).
async fn read_head(conn: &TcpStream) -> std::io::Result<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
        conn.readable().await?;
        match conn.try_read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

async fn write_all(conn: &TcpStream, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        conn.writable().await?;
        match conn.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// One lock's figures.
#[derive(Debug, Clone, PartialEq)]
struct KeyFigures {
    key: String,
    waiters: i64,
    holders: u64,
    longest_wait_ms: i64,
}

impl KeyFigures {
    fn of(key: &str, info: Option<&LockInfo>) -> KeyFigures {
        let longest = info.and_then(|i| {
            i.fields
                .iter()
                .find(|(k, _)| k == "longest-wait")
                .and_then(|(_, v)| v.as_deref()?.parse().ok())
        });
        KeyFigures {
            key: key.to_string(),
            waiters: info.map_or(0, |i| i.waiters),
            // A string lock has one holder and says nothing of holders.
            holders: info.map_or(0, |i| i.holders.unwrap_or(1)),
            longest_wait_ms: longest.unwrap_or(0),
        }
    }
}

/// The figures of `keys`, a few requests at a time on the shared connection; a key
/// whose LOCK.INFO failed is left out (and logged).
async fn figures(c: &LockClient, keys: &[String]) -> Vec<KeyFigures> {
    let mut out = Vec::new();
    for chunk in keys.chunks(64) {
        let infos = join_all(chunk.iter().map(|k| c.info(k))).await;
        for (k, r) in chunk.iter().zip(infos) {
            match r {
                Ok(info) => out.push(KeyFigures::of(k, info.as_ref())),
                Err(e) => log::warn!("LOCK.INFO {k:?}: {e}"),
            }
        }
    }
    out
}

/// The lock keys a bounded SCAN finds: (keys, whether it saw the whole keyspace).
async fn scan(c: &LockClient, budget: u64) -> (Vec<String>, bool) {
    let mut keys = Vec::new();
    let (mut cursor, mut looked) = (0u64, 0u64);
    while looked < budget {
        let count = (budget - looked).min(1000) as u32;
        match c.scan_locks(cursor, count).await {
            Ok((next, found)) => {
                keys.extend(found);
                looked += u64::from(count);
                cursor = next;
                if cursor == 0 {
                    keys.sort();
                    keys.dedup();
                    return (keys, true);
                }
            }
            Err(e) => {
                log::warn!("SCAN: {e}");
                break;
            }
        }
    }
    keys.sort();
    keys.dedup();
    (keys, false)
}

/// One scrape, in the Prometheus text format.
async fn scrape(c: &LockClient, m: &MetricsArgs) -> String {
    let started = Instant::now();
    let stats = match c.server_stats().await {
        Ok(s) if s.is_empty() => {
            log::warn!("INFO lock is empty: the module is not loaded on this server");
            None
        }
        Ok(s) => Some(s),
        Err(e) => {
            log::warn!("INFO lock: {e}");
            None
        }
    };
    let mut keys = Vec::new();
    let mut scanned = None;
    if stats.is_some() {
        keys = figures(c, &m.keys).await;
        if m.scan > 0 {
            let (found, complete) = scan(c, m.scan).await;
            let found: Vec<String> = found.into_iter().filter(|k| !m.keys.contains(k)).collect();
            let mut waited: Vec<KeyFigures> = figures(c, &found)
                .await
                .into_iter()
                .filter(|f| f.waiters > 0)
                .collect();
            waited.sort_by_key(|f| std::cmp::Reverse(f.longest_wait_ms));
            waited.truncate(m.max_keys);
            keys.extend(waited);
            scanned = Some((found.len(), complete));
        }
    }
    render(stats.as_deref(), &keys, scanned, started.elapsed())
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One metric family: `# HELP`, `# TYPE` and its samples (`labels` may be empty).
fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, String)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in samples {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

/// `ms` as seconds, exactly (a whole number of ms has at most 3 decimals).
fn seconds(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

fn render(
    stats: Option<&[(String, u64)]>,
    keys: &[KeyFigures],
    scanned: Option<(usize, bool)>,
    took: Duration,
) -> String {
    let mut out = String::new();
    let up = u8::from(stats.is_some()).to_string();
    family(
        &mut out,
        "redis_lock_up",
        "gauge",
        "1 when the server answered INFO lock with the module's section at this scrape.",
        &[(String::new(), up)],
    );
    for (field, v) in stats.unwrap_or(&[]) {
        let counter = COUNTERS.contains(&field.as_str());
        let (base, value) = match field.strip_suffix("_ms") {
            Some(base) => (format!("{base}_seconds"), seconds(*v)),
            None => (field.clone(), v.to_string()),
        };
        let name = format!("redis_lock_{base}{}", if counter { "_total" } else { "" });
        let text = match help(field) {
            "" => format!("INFO lock field lock_{field}."),
            h => h.to_string(),
        };
        let kind = if counter { "counter" } else { "gauge" };
        family(&mut out, &name, kind, &text, &[(String::new(), value)]);
    }
    if stats.is_some() {
        type Figure = fn(&KeyFigures) -> String;
        let per_key: [(&str, &str, Figure); 3] = [
            (
                "redis_lock_key_waiters",
                "Clients waiting for this lock now.",
                |f| f.waiters.to_string(),
            ),
            (
                "redis_lock_key_holders",
                "Holders of this lock now (0: free).",
                |f| f.holders.to_string(),
            ),
            (
                "redis_lock_key_longest_wait_seconds",
                "How long the first client waiting for this lock has waited.",
                |f| seconds(f.longest_wait_ms.max(0) as u64),
            ),
        ];
        for (name, text, value) in per_key {
            let samples: Vec<(String, String)> = keys
                .iter()
                .map(|f| (format!("{{key=\"{}\"}}", escape(&f.key)), value(f)))
                .collect();
            family(&mut out, name, "gauge", text, &samples);
        }
    }
    if let Some((n, complete)) = scanned {
        family(
            &mut out,
            "redis_lock_scan_keys",
            "gauge",
            "Lock keys the scan of this scrape found.",
            &[(String::new(), n.to_string())],
        );
        family(
            &mut out,
            "redis_lock_scan_complete",
            "gauge",
            "1 when the scan saw the whole keyspace, 0 when --scan cut it short.",
            &[(String::new(), u8::from(complete).to_string())],
        );
    }
    family(
        &mut out,
        "redis_lock_scrape_duration_seconds",
        "gauge",
        "How long this scrape took.",
        &[(String::new(), format!("{:.6}", took.as_secs_f64()))],
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_and_times_are_named_by_the_conventions() {
        let stats: Vec<(String, u64)> = [
            ("held", 2),
            ("longest_wait_ms", 1502),
            ("acquired", 7),
            ("waited_ms", 12),
            ("some_new_field", 3),
        ]
        .map(|(k, v)| (k.to_string(), v))
        .to_vec();
        let keys = [KeyFigures {
            key: "lock:\"q\"".into(),
            waiters: 2,
            holders: 1,
            longest_wait_ms: 1502,
        }];
        let text = render(Some(&stats), &keys, Some((3, true)), Duration::ZERO);
        for line in [
            "redis_lock_up 1",
            "# TYPE redis_lock_held gauge",
            "redis_lock_held 2",
            "# TYPE redis_lock_longest_wait_seconds gauge",
            "redis_lock_longest_wait_seconds 1.502",
            "# TYPE redis_lock_acquired_total counter",
            "redis_lock_acquired_total 7",
            "redis_lock_waited_seconds_total 0.012",
            "# HELP redis_lock_some_new_field INFO lock field lock_some_new_field.",
            "redis_lock_some_new_field 3",
            "redis_lock_key_waiters{key=\"lock:\\\"q\\\"\"} 2",
            "redis_lock_key_longest_wait_seconds{key=\"lock:\\\"q\\\"\"} 1.502",
            "redis_lock_scan_complete 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        let down = render(None, &[], None, Duration::ZERO);
        assert!(down.contains("\nredis_lock_up 0\n") && !down.contains("redis_lock_key"));
    }

    #[test]
    fn figures_of_a_lock_info() {
        let info = LockInfo {
            waiters: 3,
            holders: Some(2),
            fields: vec![("longest-wait".into(), Some("250".into()))],
            ..LockInfo::default()
        };
        let f = KeyFigures::of("k", Some(&info));
        assert_eq!((f.waiters, f.holders, f.longest_wait_ms), (3, 2, 250));
        let free = KeyFigures::of("k", None);
        assert_eq!(
            (free.waiters, free.holders, free.longest_wait_ms),
            (0, 0, 0)
        );
    }
}
