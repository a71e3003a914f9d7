//! The `redis-lock` binary against real servers: run (busy, exit code passthrough, lost
//! lease), --nodes with nodes down, and the acquire/extend/info/release subcommands.

#[path = "../../tests/common/mod.rs"]
mod common;
mod util;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{temp_dir, wait_until, Server, ServerBuilder};
use util::{held_fence, is_free, ms, setup};

const BIN: &str = env!("CARGO_BIN_EXE_redis-lock");

/// A finished CLI run.
struct Done {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// A running CLI process with its output going to files in `dir`.
struct Running {
    child: Child,
    dir: PathBuf,
    started: Instant,
}

fn spawn(dir: &Path, args: &[&str]) -> Running {
    let n = fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
    let run_dir = dir.join(format!("run{n}"));
    fs::create_dir_all(&run_dir).unwrap();
    let child = Command::new(BIN)
        .args(args)
        .env_remove("REDIS_LOCK_URL")
        .env_remove("REDIS_LOCK_TOKEN")
        .stdin(Stdio::null())
        .stdout(fs::File::create(run_dir.join("out")).unwrap())
        .stderr(fs::File::create(run_dir.join("err")).unwrap())
        .spawn()
        .unwrap();
    Running {
        child,
        dir: run_dir,
        started: Instant::now(),
    }
}

impl Running {
    /// Waits up to `limit` (then kills it and panics).
    fn finish(mut self, limit: Duration) -> Done {
        let mut status = None;
        let ok = wait_until(limit, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        if !ok {
            let _ = self.child.kill();
            let _ = self.child.wait();
            panic!(
                "redis-lock did not finish within {limit:?}; stderr:\n{}",
                fs::read_to_string(self.dir.join("err")).unwrap_or_default()
            );
        }
        let done = Done {
            code: status.and_then(|s| s.code()),
            stdout: fs::read_to_string(self.dir.join("out")).unwrap_or_default(),
            stderr: fs::read_to_string(self.dir.join("err")).unwrap_or_default(),
            took: self.started.elapsed(),
        };
        eprintln!(
            "redis-lock exited {:?} after {:?}; stderr: {}",
            done.code,
            done.took,
            done.stderr.trim()
        );
        done
    }
}

fn cli(dir: &Path, args: &[&str]) -> Done {
    spawn(dir, args).finish(Duration::from_secs(20))
}

fn sh(script: &str) -> Vec<String> {
    vec!["--".into(), "sh".into(), "-c".into(), script.into()]
}

fn run_args(url: &str, extra: &[&str], name: &str, script: &str) -> Vec<String> {
    let mut v: Vec<String> = vec!["run".into(), "--url".into(), url.into()];
    v.extend(extra.iter().map(|s| s.to_string()));
    v.push(name.into());
    v.extend(sh(script));
    v
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn two_concurrent_runs_one_runs_the_other_exits_75() {
    setup();
    let server = ServerBuilder::new().start();
    let dir = temp_dir();
    let a_started = dir.join("a-started");
    let b_ran = dir.join("b-ran");
    let a = spawn(
        &dir,
        &refs(&run_args(
            &server.url(),
            &["--ttl", "2000"],
            "daily-report",
            &format!("touch {}; sleep 2", a_started.display()),
        )),
    );
    assert!(wait_until(Duration::from_secs(10), || a_started.exists()));
    let b = cli(
        &dir,
        &refs(&run_args(
            &server.url(),
            &[],
            "daily-report",
            &format!("touch {}", b_ran.display()),
        )),
    );
    assert_eq!(b.code, Some(75), "the second run finds the lock busy");
    assert!(!b_ran.exists(), "the second command must not run");
    assert!(b.took < ms(2_000));
    // The first run finishes normally and releases.
    let a = a.finish(Duration::from_secs(20));
    assert_eq!(a.code, Some(0));
    assert!(is_free(&mut server.conn(), "daily-report"));
    // --wait: a run that waits for the holder runs after it.
    let holder = spawn(
        &dir,
        &refs(&run_args(&server.url(), &[], "job2", "sleep 1")),
    );
    assert!(wait_until(Duration::from_secs(10), || !is_free(
        &mut server.conn(),
        "job2"
    )));
    let waiter = cli(
        &dir,
        &refs(&run_args(
            &server.url(),
            &["--wait", "10000"],
            "job2",
            &format!("touch {}", b_ran.display()),
        )),
    );
    assert_eq!(waiter.code, Some(0));
    assert!(b_ran.exists());
    assert_eq!(holder.finish(Duration::from_secs(20)).code, Some(0));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn exit_code_passthrough_and_environment() {
    setup();
    let server = ServerBuilder::new().start();
    let url = server.url();
    let dir = temp_dir();
    let code = |script: &str| cli(&dir, &refs(&run_args(&url, &[], "job", script))).code;
    assert_eq!(code("exit 0"), Some(0));
    assert_eq!(code("exit 7"), Some(7));
    assert_eq!(code("exit 75"), Some(75));
    assert_eq!(
        code("kill -9 $$"),
        Some(128 + 9),
        "death by signal N: 128+N"
    );
    let missing = cli(
        &dir,
        &["run", "--url", &url, "job", "--", "/nonexistent/cmd"],
    );
    assert_eq!(missing.code, Some(127));
    assert!(
        is_free(&mut server.conn(), "job"),
        "released after every run"
    );

    // CMD sees the fence and the token; the lock is held while it runs.
    let env_out = dir.join("env");
    let d = cli(
        &dir,
        &refs(&run_args(
            &url,
            &["--owner", "cron@host-1"],
            "job",
            &format!(
                "echo \"$REDIS_LOCK_NAME $REDIS_LOCK_FENCE $REDIS_LOCK_TOKEN\" > {}",
                env_out.display()
            ),
        )),
    );
    assert_eq!(d.code, Some(0));
    let line = fs::read_to_string(&env_out).unwrap();
    let parts: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(parts.len(), 3, "{line:?}");
    assert_eq!(parts[0], "job");
    assert!(parts[1].parse::<u64>().unwrap() > 0);
    assert_eq!(parts[2].len(), 36);

    let info_out = dir.join("info");
    let d = cli(
        &dir,
        &refs(&run_args(
            &url,
            &["--owner", "cron@host-1"],
            "job",
            &format!(
                "{BIN} info --url {url} job > {}; echo $REDIS_LOCK_FENCE >> {}",
                info_out.display(),
                info_out.display()
            ),
        )),
    );
    assert_eq!(d.code, Some(0));
    let info = fs::read_to_string(&info_out).unwrap();
    assert!(info.contains("owner: cron@host-1"), "{info}");
    let fence = info.lines().last().unwrap();
    assert!(info.contains(&format!("fence: {fence}")), "{info}");
    let _ = fs::remove_dir_all(&dir);
}

/// A command that records SIGTERM in `marker` and exits 0 on it.
fn term_recorder(started: &Path, marker: &Path) -> String {
    format!(
        "trap 'echo term > {m}; exit 0' TERM; touch {s}; sleep 30 & wait",
        m = marker.display(),
        s = started.display()
    )
}

#[test]
fn lost_lease_sends_sigterm_and_exits_76() {
    setup();
    let server = ServerBuilder::new().start();
    let dir = temp_dir();
    let started = dir.join("started");
    let marker = dir.join("term");
    let run = spawn(
        &dir,
        &refs(&run_args(
            &server.url(),
            &["--ttl", "600"],
            "lease",
            &term_recorder(&started, &marker),
        )),
    );
    assert!(wait_until(Duration::from_secs(10), || started.exists()));
    // Held and renewed past its TTL...
    std::thread::sleep(ms(1_000));
    let mut c = server.conn();
    assert!(held_fence(&mut c, "lease").is_some());
    // ...until an administrator takes it away: the next renewal gets 0.
    let t = Instant::now();
    let n: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("lease")
        .query(&mut c)
        .unwrap();
    assert_eq!(n, 1);
    let d = run.finish(Duration::from_secs(20));
    assert_eq!(d.code, Some(76));
    assert!(t.elapsed() < ms(2_000), "took {:?}", t.elapsed());
    assert_eq!(fs::read_to_string(&marker).unwrap().trim(), "term");
    assert!(d.stderr.contains("lost"), "{}", d.stderr);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn server_death_kills_a_command_that_ignores_sigterm_after_the_grace() {
    setup();
    let mut server = ServerBuilder::new().start();
    let dir = temp_dir();
    let started = dir.join("started");
    let run = spawn(
        &dir,
        &refs(&run_args(
            &server.url(),
            &["--ttl", "900", "--grace", "500"],
            "lease",
            &format!("trap '' TERM; touch {}; sleep 30", started.display()),
        )),
    );
    assert!(wait_until(Duration::from_secs(10), || started.exists()));
    let t = Instant::now();
    server.kill9();
    let d = run.finish(Duration::from_secs(20));
    assert_eq!(d.code, Some(76));
    // Within the lease (900 ms) plus the grace (500 ms) plus slack.
    assert!(t.elapsed() < ms(3_000), "took {:?}", t.elapsed());
    assert!(d.stderr.contains("SIGKILL"), "{}", d.stderr);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn nodes_with_three_of_five_down_exit_75() {
    setup();
    let mut s: Vec<Server> = (0..5).map(|_| ServerBuilder::new().start()).collect();
    let nodes = s.iter().map(|x| x.url()).collect::<Vec<_>>().join(",");
    let dir = temp_dir();
    let ran = dir.join("ran");
    let args = |script: &str| -> Vec<String> {
        let mut v: Vec<String> = vec!["run".into(), "--nodes".into(), nodes.clone()];
        v.extend(["--ttl".into(), "2000".into(), "nightly".into()]);
        v.extend(sh(script));
        v
    };
    // Two down: still a majority; CMD runs, sees a quorum fence, the lock is released.
    s[0].kill9();
    s[1].kill9();
    let fence_file = dir.join("fence");
    let d = cli(
        &dir,
        &refs(&args(&format!(
            "echo $REDIS_LOCK_FENCE > {}; exit 3",
            fence_file.display()
        ))),
    );
    assert_eq!(d.code, Some(3));
    assert!(fs::read_to_string(&fence_file)
        .unwrap()
        .trim()
        .parse::<u64>()
        .is_ok());
    for x in &s[2..] {
        assert!(is_free(&mut x.conn(), "nightly"));
    }
    // Three down: no majority, exit 75, CMD never runs, nothing left on the live nodes.
    s[2].kill9();
    let d = cli(&dir, &refs(&args(&format!("touch {}", ran.display()))));
    assert_eq!(d.code, Some(75));
    assert!(!ran.exists());
    for x in &s[3..] {
        assert!(is_free(&mut x.conn(), "nightly"));
    }
    // info over the nodes reports each node.
    let d = cli(&dir, &["info", "--nodes", &nodes, "nightly"]);
    assert_eq!(d.code, Some(1));
    assert_eq!(d.stdout.matches("free").count(), 2, "{}", d.stdout);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn acquire_extend_info_release_subcommands() {
    setup();
    let server = ServerBuilder::new().start();
    let url = server.url();
    let dir = temp_dir();
    let d = cli(
        &dir,
        &[
            "acquire", "--url", &url, "--ttl", "5000", "--owner", "me", "k",
        ],
    );
    assert_eq!(d.code, Some(0));
    let token = d
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("REDIS_LOCK_TOKEN="))
        .unwrap()
        .trim_matches('\'')
        .to_string();
    let fence: u64 = d
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("REDIS_LOCK_FENCE="))
        .unwrap()
        .parse()
        .unwrap();
    let mut c = server.conn();
    assert_eq!(
        held_fence(&mut c, "k"),
        Some(fence),
        "acquire leaves it held"
    );

    assert_eq!(cli(&dir, &["acquire", "--url", &url, "k"]).code, Some(75));
    let t = Instant::now();
    assert_eq!(
        cli(&dir, &["acquire", "--url", &url, "--wait", "300", "k"]).code,
        Some(75)
    );
    assert!(t.elapsed() >= ms(300));

    let info = cli(&dir, &["info", "--url", &url, "k"]);
    assert_eq!(info.code, Some(0));
    assert!(info.stdout.contains(&format!("fence: {fence}")));
    assert!(info.stdout.contains("owner: me"));

    assert_eq!(
        cli(
            &dir,
            &["extend", "--url", &url, "--ttl", "60000", "k", &token]
        )
        .code,
        Some(0)
    );
    let pttl: i64 = redis::cmd("PTTL").arg("k").query(&mut c).unwrap();
    assert!(pttl > 50_000, "extended: {pttl}");
    assert_eq!(
        cli(&dir, &["extend", "--url", &url, "k", "wrong-token"]).code,
        Some(1)
    );
    assert_eq!(
        cli(&dir, &["release", "--url", &url, "k", "wrong"]).code,
        Some(1)
    );
    assert_eq!(
        cli(&dir, &["release", "--url", &url, "k", &token]).code,
        Some(0)
    );
    assert_eq!(
        cli(&dir, &["release", "--url", &url, "k", &token]).code,
        Some(1)
    );
    let info = cli(&dir, &["info", "--url", &url, "k"]);
    assert_eq!(info.code, Some(1));
    assert_eq!(info.stdout.trim(), "free");

    // Usage errors and an unreachable server.
    assert_eq!(cli(&dir, &["run", "k"]).code, Some(64));
    assert_eq!(cli(&dir, &["bogus"]).code, Some(64));
    let dead = format!("redis://127.0.0.1:{}", common::free_port());
    let d = cli(&dir, &["run", "--url", &dead, "k", "--", "true"]);
    assert_eq!(d.code, Some(69));
    let _ = fs::remove_dir_all(&dir);
}
