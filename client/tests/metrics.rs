//! Lock metrics where operators look (docs/MONITORING.md), against real servers:
//! `redis-lock metrics` scraped over loopback (every `INFO lock` field, per-lock waiting
//! figures, a format promtool accepts), the Grafana dashboard's queries against what it
//! exports and run by a real Prometheus, and Debian's prometheus-redis-exporter with the
//! shipped Lua script (and without it, to show what it cannot export by itself).
//!
//! The exporter, Prometheus and promtool come from Debian's packages, unpacked into
//! target/monitoring by `make monitoring-tools` (or installed: /usr/bin).

#[path = "../../tests/common/mod.rs"]
mod common;
mod util;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, wait_until, RawConn, ServerBuilder};
use util::{cli_cmd, setup};

/// Samples of a scrape: `name{labels}` -> value.
type Samples = BTreeMap<String, f64>;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// A monitoring tool: `$env`, else unpacked by `make monitoring-tools`, else installed.
fn tool(env: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let unpacked = workspace().join("target/monitoring/usr/bin").join(name);
    let installed = Path::new("/usr/bin").join(name);
    [unpacked.clone(), installed]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} is missing: run `make monitoring-tools` (unpacks Debian's package \
                 into {}) or set {env}",
                unpacked.display()
            )
        })
}

/// `GET path` on loopback: (status code, body). HTTP/1.0, so that the body comes whole,
/// never in chunks.
fn get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, body.to_string()))
}

fn samples(text: &str) -> Samples {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// `INFO lock` as field (without `lock_`) -> value.
fn info_lock(c: &mut RawConn) -> BTreeMap<String, u64> {
    common::info_map(c, "lock")
        .into_iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("lock_")?.to_string(), v.parse().ok()?)))
        .collect()
}

/// A child process killed when dropped.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `redis-lock --url URL metrics --listen 127.0.0.1:0 ARGS...`, and the address it
/// says it serves on (its first line on stderr).
fn serve_metrics(url: &str, args: &[&str]) -> (Kill, String) {
    let mut child = cli_cmd()
        .args(["--url", url, "metrics", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("redis-lock metrics starts");
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    let mut line = String::new();
    err.read_line(&mut line).expect("a line on stderr");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|r| r.strip_suffix("/metrics\n"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    // Keep draining stderr so that the process never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    (Kill(child), addr)
}

/// The metric name of an `INFO lock` field, as `redis-lock metrics` names it.
fn metric_of(field: &str, text: &str) -> String {
    let base = match field.strip_suffix("_ms") {
        Some(b) => format!("redis_lock_{b}_seconds"),
        None => format!("redis_lock_{field}"),
    };
    if text.contains(&format!("# TYPE {base}_total counter\n")) {
        format!("{base}_total")
    } else {
        base
    }
}

/// A holder of `key` and two clients queued behind it; returns the waiters' connections
/// (they wait as long as they are open).
fn queue_two(port: u16, c: &mut RawConn, key: &str) -> Vec<RawConn> {
    c.cmd(&["LOCK.ACQUIRE", key, "PX", "60000"]);
    let mut waiters = Vec::new();
    for n in 1..=2 {
        let mut w = RawConn::connect(port);
        w.send(&["LOCK.ACQUIRE", key, "BLOCK", "60000"]);
        waiters.push(w);
        assert!(
            wait_until(Duration::from_secs(10), || {
                c.cmd(&["LOCK.INFO", key])
                    .field("waiters")
                    .is_some_and(|w| w.int() == n)
            }),
            "waiter {n} did not queue on {key}"
        );
    }
    waiters
}

#[test]
fn metrics_endpoint_serves_every_info_lock_field_and_the_waiters() {
    setup();
    let server = ServerBuilder::new().start();
    let mut c = server.raw();
    let _waiters = queue_two(server.port, &mut c, "lock:q");
    let queued_at = Instant::now();
    let (_cli, addr) = serve_metrics(&server.url(), &["--key", "lock:named"]);
    std::thread::sleep(Duration::from_millis(300));

    let (code, text) = get(&addr, "/metrics").expect("a scrape");
    assert_eq!(code, 200, "{text}");
    let info = info_lock(&mut c);
    // The server's clock may run a little off this process's (Redis can count it in CPU
    // ticks): 10% to spare below the 300 ms slept, and a second above.
    let waited_upper = queued_at.elapsed().as_secs_f64() * 1.1 + 1.0;
    let s = samples(&text);
    assert_eq!(s.get("redis_lock_up"), Some(&1.0), "{text}");
    // Every INFO lock field, with the server's value (the wait times move: bounds).
    assert!(info.len() >= 18, "INFO lock: {info:?}");
    for (field, v) in &info {
        let name = metric_of(field, &text);
        let got = s
            .get(&name)
            .unwrap_or_else(|| panic!("no {name} for lock_{field} in\n{text}"));
        match field.as_str() {
            "longest_wait_ms" => assert!(*got >= 0.27 && *got <= waited_upper, "{name} {got}"),
            "waited_ms" => assert_eq!(*got, 0.0, "no wait has ended yet"),
            _ => assert_eq!(*got, *v as f64, "{name} against lock_{field}"),
        }
    }
    assert_eq!(s.get("redis_lock_acquired_total"), Some(&1.0));
    assert_eq!(s.get("redis_lock_waiters"), Some(&2.0));
    // Per lock: the queued one (found by the scan) and the named one (free).
    let key = |m: &str, k: &str| s.get(&format!("{m}{{key=\"{k}\"}}")).copied();
    assert_eq!(key("redis_lock_key_waiters", "lock:q"), Some(2.0), "{text}");
    assert_eq!(key("redis_lock_key_holders", "lock:q"), Some(1.0));
    let longest = key("redis_lock_key_longest_wait_seconds", "lock:q").unwrap_or(-1.0);
    assert!(
        longest >= 0.27 && longest <= waited_upper,
        "lock:q waited {longest}"
    );
    assert_eq!(key("redis_lock_key_waiters", "lock:named"), Some(0.0));
    assert_eq!(key("redis_lock_key_holders", "lock:named"), Some(0.0));
    assert_eq!(s.get("redis_lock_scan_keys"), Some(&1.0));
    assert_eq!(s.get("redis_lock_scan_complete"), Some(&1.0));

    // Prometheus's own linter accepts the scrape.
    let mut check = Command::new(tool("PROMTOOL_BIN", "promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    check
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("written");
    let out = check.wait_with_output().expect("promtool ends");
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    assert_eq!(get(&addr, "/elsewhere").expect("answered").0, 404);
    // The server gone: the endpoint still answers, and says so.
    drop(server);
    let (code, text) = get(&addr, "/metrics").expect("a scrape without a server");
    assert_eq!(code, 200);
    assert_eq!(samples(&text).get("redis_lock_up"), Some(&0.0), "{text}");
}

/// Every query of docs/grafana/redis-lock.json (panel targets and variables).
fn dashboard_queries() -> Vec<String> {
    fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    // A panel's `expr`, a query variable's `definition` (the same
                    // query as its `query.query`).
                    match (k.as_str(), v) {
                        ("expr" | "definition", serde_json::Value::String(s)) => {
                            out.push(s.clone())
                        }
                        _ => exprs(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
            _ => {}
        }
    }
    let path = workspace().join("docs/grafana/redis-lock.json");
    let text = std::fs::read_to_string(&path).expect("docs/grafana/redis-lock.json");
    let json: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut all = Vec::new();
    exprs(&json, &mut all);
    all
}

/// Every `redis_lock_*` metric a query of the dashboard names.
fn dashboard_metrics() -> Vec<String> {
    let mut names: Vec<String> = dashboard_queries()
        .iter()
        .flat_map(|e| {
            e.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("redis_lock_"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_dashboard_queries_only_metrics_the_exporter_produces() {
    setup();
    let server = ServerBuilder::new().start();
    let mut c = server.raw();
    let _waiters = queue_two(server.port, &mut c, "lock:d");
    let out = cli_cmd()
        .args(["--url", &server.url(), "metrics", "--once"])
        .output()
        .expect("redis-lock metrics --once");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let exported: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .collect();
    let queried = dashboard_metrics();
    assert!(queried.len() >= 15, "the dashboard queries {queried:?}");
    let unknown: Vec<&String> = queried
        .iter()
        .filter(|q| !exported.contains(&q.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics `redis-lock metrics` does not export: {unknown:?}\n\
         exported: {exported:?}"
    );
}

/// The dashboard's queries, run by a real Prometheus that scrapes `redis-lock metrics`
/// every second: each one parses and returns a series (`$__rate_interval` as 1m, every
/// `$instance`).
#[test]
fn the_dashboard_queries_run_on_prometheus() {
    setup();
    let server = ServerBuilder::new().start();
    let mut c = server.raw();
    let _waiters = queue_two(server.port, &mut c, "lock:p");
    let (_cli, target) = serve_metrics(&server.url(), &[]);
    let dir = common::temp_dir();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: redis-lock\n    static_configs:\n\
             \x20     - targets: [\"{target}\"]\n"
        ),
    )
    .expect("prometheus.yml written");
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let _prometheus = Kill(
        Command::new(tool("PROMETHEUS_BIN", "prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).expect("log file"))
            .spawn()
            .expect("prometheus starts"),
    );
    let query = |q: &str| -> Option<serde_json::Value> {
        let q: String = url::form_urlencoded::byte_serialize(q.as_bytes()).collect();
        let (_, body) = get(&addr, &format!("/api/v1/query?query={q}")).ok()?;
        serde_json::from_str(&body).ok()
    };
    let results = |v: &serde_json::Value| v["data"]["result"].as_array().map_or(0, Vec::len);
    // Three scrapes at least, so that rates over them have two points.
    assert!(
        wait_until(Duration::from_secs(60), || query(
            "count_over_time(redis_lock_up[1m]) >= 3"
        )
        .is_some_and(|v| results(&v) == 1)),
        "Prometheus did not scrape redis-lock metrics three times (log: {})",
        dir.join("prometheus.log").display()
    );
    let mut bad = Vec::new();
    let queries = dashboard_queries();
    for q in &queries {
        let expr = q
            .replace("$__rate_interval", "1m")
            .replace("$instance", ".*");
        let expr = match expr.strip_prefix("label_values(") {
            // A variable's query: label_values(metric, label) is the metric's series.
            Some(rest) => rest.split(',').next().unwrap_or("").to_string(),
            None => expr,
        };
        match query(&expr) {
            Some(v) if v["status"] == "success" && results(&v) > 0 => {}
            other => bad.push(format!("{expr}\n    -> {other:?}")),
        }
    }
    assert!(queries.len() >= 15, "{queries:?}");
    assert!(
        bad.is_empty(),
        "dashboard queries that fail or return nothing:\n{}",
        bad.join("\n")
    );
}

/// Debian's prometheus-redis-exporter on `port`, scraping `server` with `args`.
fn exporter(server_url: &str, port: u16, args: &[&str]) -> Kill {
    let child = Command::new(tool("REDIS_EXPORTER_BIN", "prometheus-redis-exporter"))
        .args([
            "-redis.addr",
            server_url,
            "-web.listen-address",
            &format!("127.0.0.1:{port}"),
            "-redis-only-metrics",
        ])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus-redis-exporter starts");
    Kill(child)
}

fn scrape_when_up(addr: &str) -> String {
    let mut text = String::new();
    assert!(
        wait_until(Duration::from_secs(20), || match get(addr, "/metrics") {
            Ok((200, t)) if t.contains("redis_up 1") => {
                text = t;
                true
            }
            _ => false,
        }),
        "prometheus-redis-exporter on {addr} did not report redis_up 1"
    );
    text
}

#[test]
fn debian_redis_exporter_exports_the_counters_only_with_the_script() {
    setup();
    let server = ServerBuilder::new().start();
    let mut c = server.raw();
    let _waiters = queue_two(server.port, &mut c, "lock:x");
    let url = format!("redis://127.0.0.1:{}", server.port);

    // By itself (even with every optional section on), it exports no lock_* field: INFO
    // ALL leaves module sections out.
    let port = free_port();
    let _plain = exporter(
        &url,
        port,
        &["-include-system-metrics", "-include-config-metrics"],
    );
    let text = scrape_when_up(&format!("127.0.0.1:{port}"));
    assert!(
        !text.contains("lock_acquired") && !text.contains("lock_waiters"),
        "this exporter exports lock_* fields by itself now: update docs/MONITORING.md"
    );

    // With the shipped script, every INFO lock field, as redis_script_values{key=...}.
    let script = workspace().join("scripts/monitoring/redis-exporter-lock.lua");
    let port = free_port();
    let _scripted = exporter(&url, port, &["-script", script.to_str().expect("utf-8")]);
    let text = scrape_when_up(&format!("127.0.0.1:{port}"));
    let info = info_lock(&mut c);
    let s = samples(&text);
    for (field, v) in &info {
        let name = format!("redis_script_values{{key=\"lock_{field}\"}}");
        let got = s
            .get(&name)
            .unwrap_or_else(|| panic!("no {name} in\n{text}"));
        if field == "longest_wait_ms" {
            assert!(*got > 0.0, "{name} {got}");
        } else {
            assert_eq!(*got, *v as f64, "{name} against INFO lock");
        }
    }
    assert_eq!(
        s.get("redis_script_values{key=\"lock_waiters\"}"),
        Some(&2.0)
    );
}
