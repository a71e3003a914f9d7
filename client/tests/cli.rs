//! The `redis-lock` binary against real servers: run (busy, exit code passthrough, lost
//! lease), --nodes with nodes down, the acquire/extend/info/release subcommands, the
//! flock-like forms, JSON output, REDIS_URL, a password from the environment and TLS.

#[path = "../../tests/common/mod.rs"]
mod common;
mod util;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::{temp_dir, wait_until, Server, ServerBuilder};
use util::proxy::DelayProxy;
use util::{cli_cmd, expires_at, held_fence, is_free, ms, process_alive, setup};

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
    spawn_env(dir, args, &[])
}

/// Runs the CLI with `env` set on top of an environment without any REDIS_* setting.
fn spawn_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Running {
    let n = fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
    let run_dir = dir.join(format!("run{n}"));
    fs::create_dir_all(&run_dir).unwrap();
    let child = cli_cmd()
        .args(args)
        .envs(env.iter().copied())
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

impl Running {
    /// Waits up to 20 s.
    fn done(self) -> Done {
        self.finish(Duration::from_secs(20))
    }
}

fn cli(dir: &Path, args: &[&str]) -> Done {
    spawn(dir, args).done()
}

fn cli_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Done {
    spawn_env(dir, args, env).done()
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

/// The shell command that creates `path`.
fn touch(path: &Path) -> String {
    format!("touch {}", path.display())
}

/// True when the file at `path` holds a fence (a decimal number).
fn holds_a_fence(path: &Path) -> bool {
    fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse::<u64>()
        .is_ok()
}

/// A test's server (with the module), its URL and a scratch directory for the CLI's
/// output; the directory goes when the test passes.
struct Case {
    server: Server,
    url: String,
    dir: PathBuf,
}

impl Case {
    fn start() -> Case {
        setup();
        let server = ServerBuilder::new().start();
        Case {
            url: server.url(),
            server,
            dir: temp_dir(),
        }
    }

    fn spawn(&self, args: &[&str]) -> Running {
        spawn(&self.dir, args)
    }

    fn cli(&self, args: &[&str]) -> Done {
        cli(&self.dir, args)
    }

    fn cli_env(&self, args: &[&str], env: &[(&str, &str)]) -> Done {
        cli_env(&self.dir, args, env)
    }

    /// `redis-lock run --url URL EXTRA... NAME -- sh -c SCRIPT`, started.
    fn spawn_run(&self, extra: &[&str], name: &str, script: &str) -> Running {
        spawn(&self.dir, &refs(&run_args(&self.url, extra, name, script)))
    }

    /// The same, run to the end.
    fn run(&self, extra: &[&str], name: &str, script: &str) -> Done {
        self.spawn_run(extra, name, script).done()
    }

    /// `spawn_run` with the command `BEFORE touch STARTED; THEN`; returns once the
    /// command runs (STARTED exists).
    fn spawn_started(&self, extra: &[&str], name: &str, before: &str, then: &str) -> Running {
        let started = self.dir.join(format!("{name}.started"));
        let script = format!("{before}{}; {then}", touch(&started));
        let run = self.spawn_run(extra, name, &script);
        assert!(
            soon(|| started.exists()),
            "the command of `run {name}` started"
        );
        run
    }

    /// Two runs of `name` (with `extra`) whose commands wait for each other and then
    /// for the file `go` (see `rendezvous`; `a` and `b` are their marks): returns once
    /// both commands run.
    fn spawn_rendezvous(&self, extra: &[&str], name: &str, [a, b, go]: [&Path; 3]) -> [Running; 2] {
        let ra = self.spawn_run(extra, name, &rendezvous(a, b, go));
        let rb = self.spawn_run(extra, name, &rendezvous(b, a, go));
        assert!(soon(|| a.exists() && b.exists()), "both commands started");
        [ra, rb]
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Polls `f` for up to 10 s.
fn soon(f: impl FnMut() -> bool) -> bool {
    wait_until(Duration::from_secs(10), f)
}

/// True once `name` is held on `server` (within 10 s).
fn held_soon(server: &Server, name: &str) -> bool {
    soon(|| !is_free(&mut server.conn(), name))
}

/// True once one client waits for a lock on `server` (within 10 s).
fn one_waiter_soon(server: &Server) -> bool {
    soon(|| {
        server
            .info_field("lock", "lock_waiters")
            .is_some_and(|n| n == "1")
    })
}

#[test]
fn two_concurrent_runs_one_runs_the_other_exits_75() {
    let case = Case::start();
    let server = &case.server;
    let b_ran = case.dir.join("b-ran");
    // A runs for 5 s: B exits well before (4 s: a process start on a loaded machine).
    let a = case.spawn_started(&["--ttl", "2s"], "daily-report", "", "sleep 5");
    let b = case.run(&[], "daily-report", &touch(&b_ran));
    assert_eq!(b.code, Some(75), "the second run finds the lock busy");
    assert!(!b_ran.exists(), "the second command must not run");
    assert!(b.took < ms(4_000), "{:?}", b.took);
    // The first run finishes normally and releases.
    let a = a.done();
    assert_eq!(a.code, Some(0));
    assert!(is_free(&mut server.conn(), "daily-report"));
    // --wait: a run that waits for the holder runs after it.
    let holder = case.spawn_run(&[], "job2", "sleep 1");
    assert!(held_soon(server, "job2"));
    let waiter = case.run(&["--wait", "10s"], "job2", &touch(&b_ran));
    assert_eq!(waiter.code, Some(0));
    assert!(b_ran.exists());
    assert_eq!(holder.done().code, Some(0));
}

#[test]
fn exit_code_passthrough_and_environment() {
    let case = Case::start();
    let (server, url, dir) = (&case.server, case.url.as_str(), case.dir.as_path());
    let code = |script: &str| case.run(&[], "job", script).code;
    assert_eq!(code("exit 0"), Some(0));
    assert_eq!(code("exit 7"), Some(7));
    assert_eq!(code("exit 75"), Some(75));
    assert_eq!(
        code("kill -9 $$"),
        Some(128 + 9),
        "death by signal N: 128+N"
    );
    let missing = case.cli(&["run", "--url", url, "job", "--", "/nonexistent/cmd"]);
    assert_eq!(missing.code, Some(127));
    assert!(
        is_free(&mut server.conn(), "job"),
        "released after every run"
    );

    // CMD sees the fence and the token; the lock is held while it runs.
    let cron_job = |script: &str| {
        let d = case.run(&["--owner", "cron@host-1"], "job", script);
        assert_eq!(d.code, Some(0));
    };
    let env_out = dir.join("env");
    cron_job(&format!(
        "echo \"$REDIS_LOCK_NAME $REDIS_LOCK_FENCE $REDIS_LOCK_TOKEN\" > {}",
        env_out.display()
    ));
    let line = fs::read_to_string(&env_out).unwrap();
    let parts: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(parts.len(), 3, "{line:?}");
    assert_eq!(parts[0], "job");
    assert!(parts[1].parse::<u64>().unwrap() > 0);
    assert_eq!(parts[2].len(), 36);

    let info_out = dir.join("info");
    cron_job(&format!(
        "{BIN} info --url {url} job > {}; echo $REDIS_LOCK_FENCE >> {}",
        info_out.display(),
        info_out.display()
    ));
    let info = fs::read_to_string(&info_out).unwrap();
    assert!(info.contains("owner: cron@host-1"), "{info}");
    let fence = info.lines().last().unwrap();
    assert!(info.contains(&format!("fence: {fence}")), "{info}");
}

/// Runs `redis-lock run` with a command that records SIGTERM in `marker` and exits 0 on
/// it (and otherwise sleeps 30 s); returns once the command runs.
fn spawn_term_recorder(case: &Case, extra: &[&str], name: &str, marker: &Path) -> Running {
    let trap = format!("trap 'echo term > {}; exit 0' TERM; ", marker.display());
    case.spawn_started(extra, name, &trap, "sleep 30 & wait")
}

#[test]
fn lost_lease_sends_sigterm_and_exits_79() {
    let case = Case::start();
    let marker = case.dir.join("term");
    // 2.4 s: a renewal may come 800 ms late on a loaded machine before the run gives the
    // lease up (600 ms left 200 ms).
    let run = spawn_term_recorder(&case, &["--ttl", "2400ms"], "lease", &marker);
    // Held and renewed past its TTL...
    std::thread::sleep(ms(3_000));
    let mut c = case.server.conn();
    assert!(held_fence(&mut c, "lease").is_some());
    // ...until an administrator takes it away: the next renewal gets 0.
    let t = Instant::now();
    let n: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("lease")
        .query(&mut c)
        .unwrap();
    assert_eq!(n, 1);
    let d = run.done();
    assert_eq!(d.code, Some(79));
    // At the next renewal (every 800 ms), not when the command's 30 s sleep ends.
    assert!(t.elapsed() < ms(10_000), "took {:?}", t.elapsed());
    assert_eq!(fs::read_to_string(&marker).unwrap().trim(), "term");
    assert!(d.stderr.contains("lost"), "{}", d.stderr);
}

#[test]
fn server_death_kills_a_command_that_ignores_sigterm_after_the_grace() {
    let mut case = Case::start();
    let run = case.spawn_started(
        &["--ttl", "900ms", "--grace", "500ms"],
        "lease",
        "trap '' TERM; ",
        "sleep 30",
    );
    let t = Instant::now();
    case.server.kill9();
    let d = run.done();
    assert_eq!(d.code, Some(79));
    // Within the lease (900 ms) plus the grace (500 ms) plus a loaded machine's slack,
    // not when the command's 30 s sleep ends.
    assert!(t.elapsed() < ms(10_000), "took {:?}", t.elapsed());
    assert!(d.stderr.contains("SIGKILL"), "{}", d.stderr);
}

// ---- the command never outlives its lock ------------------------------------------------

/// `redis-lock run` killed with SIGKILL (nothing of it runs afterwards): its command and
/// the command's own children go with it, so that the run that takes the lock when the
/// lease ends runs alone. SIGTERM to `run` ends the whole group too.
#[test]
fn kill_9_of_run_takes_the_command_and_its_children_with_it() {
    let case = Case::start();
    let pid = |p: &Path| -> u32 { fs::read_to_string(p).unwrap().trim().parse().unwrap() };
    for (i, sig) in [libc::SIGKILL, libc::SIGTERM].into_iter().enumerate() {
        let name = format!("orphan{i}");
        let (leader, child) = (
            case.dir.join(format!("{i}.leader")),
            case.dir.join(format!("{i}.child")),
        );
        let before = format!(
            "echo $$ > {}; sleep 100 & echo $! > {}; ",
            leader.display(),
            child.display()
        );
        let mut run = case.spawn_started(&["--ttl", "2s"], &name, &before, "wait");
        let pids = [pid(&leader), pid(&child)];
        assert!(pids.iter().all(|&p| process_alive(p)), "{pids:?} run");
        let t = Instant::now();
        assert!(
            redis_lock_testkit::signal(run.child.id(), sig),
            "signal {sig} to redis-lock"
        );
        let _ = run.child.wait();
        let gone = wait_until(Duration::from_secs(10), || {
            pids.iter().all(|&p| !process_alive(p))
        });
        if !gone {
            for &p in &pids {
                let _ = redis_lock_testkit::signal(p, libc::SIGKILL);
            }
        }
        assert!(
            gone,
            "signal {sig}: the command and its child {pids:?} outlived redis-lock"
        );
        eprintln!(
            "signal {sig}: the command's group gone {:?} after it",
            t.elapsed()
        );
        // The next run takes the lock (at once, or when the lease ends) and runs alone.
        let next = case.run(&["-w", "10s"], &name, "true");
        assert_eq!(next.code, Some(0), "{}", next.stderr);
    }
}

/// With the server unreachable (a proxy that passes nothing and closes nothing, so each
/// renewal gets no answer), the command gets SIGTERM a margin (by default a third of
/// --ttl: 2 s here) before the lease can end on the server, never at or after that end,
/// when the next holder may start. The server's deadline is its own `expires-at`.
#[test]
fn an_unreachable_server_stops_the_command_a_margin_before_the_lease_can_end() {
    let case = Case::start();
    let proxy = DelayProxy::plain(case.server.socket_addr());
    let (stamp, started) = (case.dir.join("term-at"), case.dir.join("started"));
    let script = format!(
        "trap 'date +%s%3N > {}; exit 0' TERM; {}; sleep 30 & wait",
        stamp.display(),
        touch(&started)
    );
    // A 6 s TTL, a 2 s margin: 1.5 s of it left for a loaded machine to run the renewal
    // loop and the trap's `date` late (a 3 s TTL left 500 ms); without the margin the
    // SIGTERM would come the drift (~60 ms) before the end.
    let args = run_args(&proxy.url(), &["--ttl", "6s"], "margin", &script);
    let run = case.spawn(&refs(&args));
    assert!(soon(|| started.exists()), "the command started");
    std::thread::sleep(ms(2_500)); // renewed once (every 2 s) meanwhile
    proxy.freeze();
    std::thread::sleep(ms(200)); // a renewal already on the server is applied
    let deadline = expires_at(&case.server, "margin").expect("held");
    let d = run.finish(Duration::from_secs(15));
    assert_eq!(d.code, Some(79), "{}", d.stderr);
    let at: i64 = fs::read_to_string(&stamp).unwrap().trim().parse().unwrap();
    let ahead = deadline - at;
    eprintln!("SIGTERM {ahead} ms before the server's lease deadline");
    assert!(
        ahead >= 500,
        "SIGTERM only {ahead} ms before the lease could end on the server (margin 2 s)"
    );
}

// ---- loud failures ---------------------------------------------------------------------

/// A weekly job's `--hold 144h` (or `--ttl 48h`) above the server's `lock.max-ttl` (24 h
/// by default) is refused before the command runs, with a message naming the setting
/// and its limit also under -q; with the limit raised it runs and keeps the lock.
#[test]
fn a_hold_or_ttl_above_lock_max_ttl_is_refused_loudly_even_with_q() {
    let case = Case::start();
    let ran = case.dir.join("ran");
    for extra in [&["-q", "--hold", "144h"][..], &["-q", "--ttl", "48h"]] {
        let d = case.run(extra, "weekly", &touch(&ran));
        assert_eq!(d.code, Some(64), "{extra:?}: {}", d.stderr);
        assert!(!ran.exists(), "{extra:?}: the command must not run");
        for needle in ["lock.max-ttl", "86400000 ms"] {
            assert!(
                d.stderr.contains(needle),
                "{extra:?}: {needle}: {}",
                d.stderr
            );
        }
        assert!(is_free(&mut case.server.conn(), "weekly"));
    }
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "lock.max-ttl", "691200000"])
        .query(&mut case.server.conn())
        .unwrap();
    let d = case.run(&["-q", "--hold", "144h"], "weekly", &touch(&ran));
    assert_eq!(d.code, Some(0), "{}", d.stderr);
    assert!(ran.exists());
    let info = case.server.raw().cmd(&["LOCK.INFO", "weekly"]);
    let left = info.get("ttl").and_then(|t| t.as_int()).unwrap_or(0);
    assert!(left > 143 * 3_600_000, "kept for the week: {left} ms");
}

/// Once per period that survives a failed run: five servers start the job one after
/// another with `--hold 1h`; the first one's job fails, so it does not keep the lock and
/// the second one runs the day's job (and keeps it). With `--hold-on-failure` the
/// failed run keeps it and nobody runs the job that day.
#[test]
fn hold_keeps_the_lock_only_when_the_command_succeeded() {
    let case = Case::start();
    let five = |extra: &[&str], name: &str| -> (usize, Vec<Option<i32>>) {
        let log = case.dir.join(format!("{name}.done"));
        let codes = (0..5)
            .map(|i| {
                let job = match i {
                    0 => "exit 1".to_string(),
                    _ => format!("echo done >> {}", log.display()),
                };
                let mut args = vec!["-q", "--hold", "1h"];
                args.extend_from_slice(extra);
                case.run(&args, name, &job).code
            })
            .collect();
        let done = fs::read_to_string(&log).unwrap_or_default().lines().count();
        (done, codes)
    };
    let (done, codes) = five(&[], "report");
    assert_eq!(codes, [Some(1), Some(0), Some(75), Some(75), Some(75)]);
    assert_eq!(done, 1, "the day's job ran once, after the failed run");
    let (done, codes) = five(&["--hold-on-failure"], "report-kept");
    assert_eq!(codes, [Some(1), Some(75), Some(75), Some(75), Some(75)]);
    assert_eq!(done, 0);
}

/// Redlock that cannot ask a majority (a wrong password everywhere, two of three nodes
/// down) is not "busy": exit 69 with a message, also under -q. Busy stays 75.
#[test]
fn nodes_without_a_usable_majority_exit_69_with_a_message_even_with_q() {
    setup();
    let mut s = util::servers_with_password(3, "right-pw");
    let dir = temp_dir();
    let ran = dir.join("ran");
    let nodes = |pw: &str| {
        let urls: Vec<String> = s
            .iter()
            .map(|x| format!("redis://:{pw}@{}", x.addr()))
            .collect();
        urls.join(",")
    };
    let (right, wrong) = (nodes("right-pw"), nodes("s3cret-but-wrong"));
    let run = |nodes: &str| {
        cli(
            &dir,
            &[
                "run",
                "-q",
                "--nodes",
                nodes,
                "nightly",
                "--",
                "touch",
                &ran.display().to_string(),
            ],
        )
    };
    // Busy: held on every node by someone else.
    let held = cli(&dir, &["acquire", "--nodes", &right, "nightly"]);
    assert_eq!(held.code, Some(0), "{}", held.stderr);
    let d = run(&right);
    assert_eq!((d.code, d.stderr.as_str()), (Some(75), ""));
    // A wrong password on every node.
    let d = run(&wrong);
    assert_eq!(d.code, Some(69), "{}", d.stderr);
    assert!(d.stderr.contains("authentication failed"), "{}", d.stderr);
    assert!(d.stderr.contains("majority"), "{}", d.stderr);
    assert!(!d.stderr.contains("s3cret"), "{}", d.stderr);
    // Two of three down.
    s[0].kill9();
    s[1].kill9();
    let d = run(&right);
    assert_eq!(d.code, Some(69), "{}", d.stderr);
    assert!(d.stderr.contains("majority"), "{}", d.stderr);
    assert!(!ran.exists());
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn nodes_with_three_of_five_down_exit_69() {
    setup();
    let mut s: Vec<Server> = (0..5).map(|_| ServerBuilder::new().start()).collect();
    let nodes = s.iter().map(|x| x.url()).collect::<Vec<_>>().join(",");
    let dir = temp_dir();
    let ran = dir.join("ran");
    let args = |script: &str| -> Vec<String> {
        let mut v: Vec<String> = vec!["run".into(), "--nodes".into(), nodes.clone()];
        v.extend(["--ttl".into(), "2s".into(), "nightly".into()]);
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
    assert!(holds_a_fence(&fence_file));
    for x in &s[2..] {
        assert!(is_free(&mut x.conn(), "nightly"));
    }
    // Three down: no majority can be asked, exit 69, CMD never runs, nothing left on the
    // live nodes.
    s[2].kill9();
    let d = cli(&dir, &refs(&args(&touch(&ran))));
    assert_eq!(d.code, Some(69), "{}", d.stderr);
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
    let case = Case::start();
    let (server, url) = (&case.server, case.url.as_str());
    let d = case.cli(&["acquire", "--url", url, "--ttl", "5s", "--owner", "me", "k"]);
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

    assert_eq!(case.cli(&["acquire", "--url", url, "k"]).code, Some(75));
    let t = Instant::now();
    assert_eq!(
        case.cli(&["acquire", "--url", url, "--wait", "300ms", "k"])
            .code,
        Some(75)
    );
    assert!(t.elapsed() >= ms(300));

    let info = case.cli(&["info", "--url", url, "k"]);
    assert_eq!(info.code, Some(0));
    assert!(info.stdout.contains(&format!("fence: {fence}")));
    assert!(info.stdout.contains("owner: me"));

    assert_eq!(
        case.cli(&["extend", "--url", url, "--ttl", "60s", "k", &token])
            .code,
        Some(0)
    );
    // The lease as LOCK.INFO tells it (a module lock has no Redis expiry to read).
    let info = case.cli(&["info", "--url", url, "--json", "k"]);
    let v: serde_json::Value = serde_json::from_str(info.stdout.trim()).unwrap();
    let ttl = v["ttl"].as_i64().unwrap();
    assert!(ttl > 50_000, "extended: {ttl}");
    assert_eq!(
        case.cli(&["extend", "--url", url, "k", "wrong-token"]).code,
        Some(1)
    );
    assert_eq!(
        case.cli(&["release", "--url", url, "k", "wrong"]).code,
        Some(1)
    );
    assert_eq!(
        case.cli(&["release", "--url", url, "k", &token]).code,
        Some(0)
    );
    assert_eq!(
        case.cli(&["release", "--url", url, "k", &token]).code,
        Some(1)
    );
    let info = case.cli(&["info", "--url", url, "k"]);
    assert_eq!(info.code, Some(1));
    assert_eq!(info.stdout.trim(), "free");

    // Usage errors and an unreachable server.
    assert_eq!(case.cli(&["run", "k"]).code, Some(64));
    assert_eq!(case.cli(&["bogus"]).code, Some(64));
    let dead = format!("redis://127.0.0.1:{}", common::free_port());
    let d = case.cli(&["run", "--url", &dead, "k", "--", "true"]);
    assert_eq!(d.code, Some(69));
}

#[test]
fn flock_forms_options_anywhere_and_exit_code_choices() {
    let case = Case::start();
    let (server, url, dir) = (&case.server, case.url.as_str(), case.dir.as_path());
    let out = dir.join("out");
    // Options after NAME, a -c shell command, durations with units.
    let d = case.cli(&[
        "run",
        "job",
        "--ttl",
        "5s",
        "--url",
        url,
        "-c",
        &format!("echo \"$REDIS_LOCK_FENCE\" > {}; exit 4", out.display()),
    ]);
    assert_eq!(d.code, Some(4));
    assert!(holds_a_fence(&out));
    // `run NAME --ttl ... -- CMD` and -n: busy at once, with the code chosen by -E (the
    // holder runs 5 s; 3 s for a process start on a loaded machine).
    let holder = case.spawn(&[
        "run", "job", "--ttl", "5s", "--url", url, "--", "sleep", "5",
    ]);
    assert!(held_soon(server, "job"));
    let d = case.cli(&["run", "-n", "job", "--url", url, "-E", "3", "--", "true"]);
    assert_eq!(d.code, Some(3));
    assert!(d.took < ms(3_000), "{:?}", d.took);
    // -w with a unit: waits for the holder (FIFO), then runs.
    let d = case.cli(&["run", "job", "-w", "10s", "--url", url, "--", "true"]);
    assert_eq!(d.code, Some(0));
    assert!(d.took >= ms(500), "waited for the holder: {:?}", d.took);
    assert_eq!(holder.done().code, Some(0));
    // -w with a bare number means seconds: 0.3 s here (not ms: at least 300 ms; not
    // minutes: it would get the lock when the 5 s holder ends, the bound leaving 3.7 s
    // for a process start on a loaded machine).
    let holder = case.spawn(&["run", "job", "--url", url, "--", "sleep", "5"]);
    assert!(held_soon(server, "job"));
    let d = case.cli(&["acquire", "job", "-w", "0.3", "--url", url]);
    assert_eq!(d.code, Some(75));
    assert!(d.took >= ms(300) && d.took < ms(4_000), "{:?}", d.took);
    assert_eq!(holder.done().code, Some(0));
    // --lost-exit-code keeps the old 76 for scripts that test for it.
    let extra = ["--ttl", "600ms", "--lost-exit-code", "76"];
    let run = spawn_term_recorder(&case, &extra, "lease", &dir.join("term"));
    let _: i64 = redis::cmd("LOCK.FORCERELEASE")
        .arg("lease")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(run.done().code, Some(76));
    // Usage errors exit 64; help exits 0 and is per subcommand.
    assert_eq!(
        case.cli(&["run", "-n", "-w", "1s", "job", "true"]).code,
        Some(64)
    );
    assert_eq!(
        case.cli(&["run", "--ttl", "10 parsecs", "job", "true"])
            .code,
        Some(64)
    );
    let help = case.cli(&["run", "--help"]);
    assert_eq!(help.code, Some(0));
    assert!(help.stdout.contains("--max-hold") && help.stdout.contains("--nonblock"));
    let help = case.cli(&["--help"]);
    assert!(help.stdout.contains("79") && help.stdout.contains("REDIS_URL"));
    let comp = case.cli(&["completions", "bash"]);
    assert_eq!(comp.code, Some(0));
    assert!(comp.stdout.contains("redis-lock") && comp.stdout.contains("--nonblock"));
}

#[test]
fn json_output_redis_url_and_password_from_the_environment() {
    let case = Case::start();
    let (server, url) = (&case.server, case.url.as_str());
    // REDIS_URL when there is no --url (and no REDIS_LOCK_URL).
    let d = case.cli_env(
        &["acquire", "--json", "--owner", "me", "k"],
        &[("REDIS_URL", url)],
    );
    assert_eq!(d.code, Some(0), "{}", d.stderr);
    let v: serde_json::Value = serde_json::from_str(d.stdout.trim()).unwrap();
    let fence = v["fence"].as_str().expect("the fence is a decimal string");
    assert_eq!(
        Some(fence.parse::<u64>().unwrap()),
        held_fence(&mut server.conn(), "k")
    );
    let token = v["token"].as_str().unwrap().to_string();
    assert_eq!(v["name"], "k");
    let d = case.cli(&["info", "k", "--json", "--url", url]);
    assert_eq!(d.code, Some(0));
    let info: serde_json::Value = serde_json::from_str(d.stdout.trim()).unwrap();
    assert_eq!(info["held"], true);
    assert_eq!(info["fence"], fence);
    assert_eq!(info["owner"], "me");
    assert!(info["ttl"].as_i64().unwrap() > 0);
    assert_eq!(
        case.cli_env(
            &["release", "k"],
            &[("REDIS_URL", url), ("REDIS_LOCK_TOKEN", &token)]
        )
        .code,
        Some(0)
    );
    let d = case.cli(&["info", "k", "--json", "--url", url]);
    assert_eq!(d.code, Some(1));
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(d.stdout.trim()).unwrap()["held"],
        false
    );

    // A password (and an ACL user) from the environment, never on the command line.
    let mut c = server.conn();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "locker", "on", ">user-secret", "~*", "+@all"])
        .query(&mut c)
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "s3cret"])
        .query(&mut c)
        .unwrap();
    let run = ["run", "--url", url, "pw", "--", "true"];
    assert_eq!(case.cli(&run).code, Some(69), "no password: refused");
    assert_eq!(
        case.cli_env(&run, &[("REDIS_LOCK_PASSWORD", "s3cret")])
            .code,
        Some(0)
    );
    assert_eq!(
        case.cli_env(&run, &[("REDISCLI_AUTH", "s3cret")]).code,
        Some(0)
    );
    assert_eq!(
        case.cli_env(&run, &[("REDIS_LOCK_PASSWORD", "wrong")]).code,
        Some(69)
    );
    let d = case.cli_env(
        &["run", "--user", "locker", "--url", url, "pw", "--", "true"],
        &[("REDIS_LOCK_PASSWORD", "user-secret")],
    );
    assert_eq!(d.code, Some(0), "{}", d.stderr);
}

// ---- shared and counted locks: --shared and --limit N ------------------------------

/// A shell script that marks `me` as started, waits up to 10 s for `other` to exist,
/// then for `go`, and exits 0 only if `other` appeared: two such commands both exit 0
/// only if they ran at the same time.
fn rendezvous(me: &Path, other: &Path, go: &Path) -> String {
    format!(
        "touch {me}; i=0; while [ ! -e {other} ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; \
         [ -e {other} ] || exit 3; \
         i=0; while [ ! -e {go} ] && [ $i -lt 150 ]; do sleep 0.1; i=$((i+1)); done; touch {me}.end",
        me = me.display(),
        other = other.display(),
        go = go.display()
    )
}

#[test]
fn shared_runs_run_together_and_an_exclusive_run_waits_for_all_of_them() {
    let case = Case::start();
    let (server, url, dir) = (&case.server, case.url.as_str(), case.dir.as_path());
    let (a, b, go) = (dir.join("a"), dir.join("b"), dir.join("go"));
    let readers = ["--shared", "--owner", "reader", "--ttl", "3s"];
    let [ra, rb] = case.spawn_rendezvous(&readers, "catalog", [&a, &b, &go]);

    // info: the mode, both holders, and the holder list (text and JSON).
    let d = case.cli(&["info", "--url", url, "catalog"]);
    assert_eq!(d.code, Some(0));
    for line in ["mode: shared", "holders: 2", "waiters: 0", "holder-list:"] {
        assert!(
            d.stdout.lines().any(|l| l == line),
            "{line:?} in\n{}",
            d.stdout
        );
    }
    assert_eq!(d.stdout.matches("  - fence: ").count(), 2, "{}", d.stdout);
    assert_eq!(
        d.stdout.matches("    owner: reader").count(),
        2,
        "{}",
        d.stdout
    );
    assert!(
        !d.stdout.lines().any(|l| l.starts_with("fence:")),
        "{}",
        d.stdout
    );
    let d = case.cli(&["info", "--url", url, "catalog", "--json"]);
    let v: serde_json::Value = serde_json::from_str(d.stdout.trim()).unwrap();
    assert_eq!(
        (v["mode"].as_str(), v["holders"].as_i64()),
        (Some("shared"), Some(2))
    );
    let holders = v["holder-list"].as_array().unwrap();
    assert_eq!(holders.len(), 2);
    let mut c = server.conn();
    let mut fences: Vec<u64> = holders
        .iter()
        .map(|h| {
            h["fence"]
                .as_str()
                .expect("a string fence")
                .parse()
                .unwrap()
        })
        .collect();
    fences.sort_unstable();
    assert_eq!(
        fences,
        util::raw_fences(server, "catalog"),
        "the fences LOCK.INFO reports"
    );
    assert!(holders.iter().all(|h| h["ttl"].as_i64().unwrap() > 0));

    // An exclusive run without --wait is busy; with --wait it queues behind the readers,
    // and a reader that comes after it is busy (no barging past a queued writer).
    let busy = case.run(&[], "catalog", "exit 0");
    assert_eq!(busy.code, Some(75), "{}", busy.stderr);
    let writer = case.spawn_run(
        &["-w", "20s"],
        "catalog",
        &format!(
            "[ -e {a}.end ] && [ -e {b}.end ] || exit 9; touch {w}",
            a = a.display(),
            b = b.display(),
            w = dir.join("w").display()
        ),
    );
    assert!(one_waiter_soon(server));
    let late = case.run(&["--shared"], "catalog", "exit 0");
    assert_eq!(late.code, Some(75), "a reader behind a queued writer waits");
    assert!(
        late.stderr
            .contains("exclusively (or a writer waits for it)"),
        "{}",
        late.stderr
    );
    assert!(!dir.join("w").exists());

    fs::write(&go, "").unwrap();
    assert_eq!(ra.done().code, Some(0));
    assert_eq!(rb.done().code, Some(0));
    let w = writer.done();
    assert_eq!(w.code, Some(0), "the writer ran after both readers ended");
    assert!(dir.join("w").exists());
    assert!(is_free(&mut c, "catalog"));
}

#[test]
fn limit_runs_n_at_once_the_next_is_busy_or_waits() {
    let case = Case::start();
    let (server, url, dir) = (&case.server, case.url.as_str(), case.dir.as_path());
    let (p1, p2, go) = (dir.join("p1"), dir.join("p2"), dir.join("go"));
    let permits = ["--limit", "2", "--ttl", "3s"];
    let [h1, h2] = case.spawn_rendezvous(&permits, "exports", [&p1, &p2, &go]);

    // The third: busy (75) without running, and busy after a short --wait.
    let third = dir.join("third");
    let touch_third = touch(&third);
    let d = case.run(&["--limit", "2"], "exports", &touch_third);
    assert_eq!(d.code, Some(75));
    assert!(d.stderr.contains("all 2 permits are taken"), "{}", d.stderr);
    let d = case.run(&["--limit", "2", "-w", "300ms"], "exports", &touch_third);
    assert_eq!(d.code, Some(75));
    assert!(d.took >= ms(300));
    assert!(!third.exists());

    // Another limit, or another mode, is an error reply (69), not a wait.
    let d = case.run(&["--limit", "3", "-w", "10s"], "exports", &touch_third);
    assert_eq!(d.code, Some(69));
    assert!(d.stderr.contains("LIMITMISMATCH"), "{}", d.stderr);
    assert!(d.took < ms(5_000));
    let d = case.run(&["--shared"], "exports", &touch_third);
    assert_eq!(d.code, Some(69));
    assert!(d.stderr.contains("WRONGMODE"), "{}", d.stderr);

    let d = case.cli(&["info", "--url", url, "exports"]);
    for line in ["mode: counted", "limit: 2", "holders: 2"] {
        assert!(
            d.stdout.lines().any(|l| l == line),
            "{line:?} in\n{}",
            d.stdout
        );
    }

    // With --wait the third gets the first permit given back.
    let waiter = case.spawn_run(&["--limit", "2", "-w", "20s"], "exports", &touch_third);
    assert!(one_waiter_soon(server));
    assert!(!third.exists());
    fs::write(&go, "").unwrap();
    assert_eq!(h1.done().code, Some(0));
    assert_eq!(h2.done().code, Some(0));
    assert_eq!(waiter.done().code, Some(0));
    assert!(third.exists());
    assert!(is_free(&mut server.conn(), "exports"));

    // acquire --limit / --shared, and the usage errors.
    let take = |extra: &[&str]| {
        let mut args = vec!["acquire", "--url", &url, "--json"];
        args.extend_from_slice(extra);
        let d = case.cli(&args);
        assert_eq!(d.code, Some(0), "{}", d.stderr);
        let v: serde_json::Value = serde_json::from_str(d.stdout.trim()).unwrap();
        v["token"].as_str().unwrap().to_string()
    };
    let t1 = take(&["--limit", "2", "sem"]);
    let t2 = take(&["--limit=2", "sem"]);
    assert_eq!(
        case.cli(&["acquire", "--url", url, "--limit", "2", "sem"])
            .code,
        Some(75)
    );
    let t3 = take(&["-s", "rw"]);
    let t4 = take(&["--shared", "rw"]);
    let info: serde_json::Value = serde_json::from_str(
        case.cli(&["info", "--url", url, "rw", "--json"])
            .stdout
            .trim(),
    )
    .unwrap();
    assert_eq!(info["holder-list"].as_array().unwrap().len(), 2);
    for (name, t) in [("sem", &t1), ("sem", &t2), ("rw", &t3), ("rw", &t4)] {
        assert_eq!(case.cli(&["release", "--url", url, name, t]).code, Some(0));
    }
    assert_eq!(
        case.cli(&["run", "--url", url, "--shared", "--limit", "2", "x", "--", "true"])
            .code,
        Some(64)
    );
    let nodes = format!("{url},{url},{url}");
    let d = case.cli(&["run", "--nodes", &nodes, "--limit", "2", "x", "--", "true"]);
    assert_eq!(d.code, Some(64));
    assert!(
        d.stderr.contains("--limit cannot be used with --nodes"),
        "{}",
        d.stderr
    );
}

// ---- once per period: --hold -----------------------------------------------------

/// The cron case of five servers whose clocks and cron runs are 0 to 2 s apart: five
/// `redis-lock run -q [EXTRA] report -- <0.5 s job>` started 0, 0.5, 1, 1.5 and 2 s
/// after the first (with `one_after_another`, each also not before the one before it
/// ended: a machine too loaded to start them on time cannot make them overlap); returns
/// how many ran the job and the exit codes.
fn five_cron_runs(
    case: &Case,
    extra: &[&str],
    name: &str,
    one_after_another: bool,
) -> (usize, Vec<Option<i32>>) {
    let log = case.dir.join(format!("{name}.runs"));
    let job = format!("echo ran >> {}; sleep 0.5", log.display());
    let t0 = Instant::now();
    let (mut runs, mut codes) = (Vec::new(), Vec::new());
    for i in 0..5u64 {
        let start = t0 + ms(500 * i);
        std::thread::sleep(start.saturating_duration_since(Instant::now()));
        let mut args = vec!["-q"];
        args.extend_from_slice(extra);
        let run = case.spawn_run(&args, name, &job);
        if one_after_another {
            codes.push(run.done().code);
        } else {
            runs.push(run);
        }
    }
    codes.extend(runs.into_iter().map(|r| r.done().code));
    let ran = fs::read_to_string(&log).unwrap_or_default().lines().count();
    (ran, codes)
}

#[test]
fn cron_on_five_servers_with_skew_runs_once_with_hold() {
    let case = Case::start();
    let (ran, mut codes) = five_cron_runs(&case, &["--hold", "1h"], "report", false);
    codes.sort();
    assert_eq!(ran, 1, "exactly one run of the job ({codes:?})");
    assert_eq!(codes, [Some(0), Some(75), Some(75), Some(75), Some(75)]);
    // The lock stays taken for the rest of the hour, nobody holding a connection.
    let d = case.cli(&["info", "--url", &case.url, "--json", "report"]);
    let v: serde_json::Value = serde_json::from_str(d.stdout.trim()).unwrap();
    let ttl = v["ttl"].as_i64().unwrap();
    assert!(
        ttl > 3_590_000 && ttl <= 3_600_000,
        "kept until the hold ends: {ttl} ms"
    );
    // The control: a lock released when the job ends lets every later start run it
    // again (here each starts once the one before has ended, so that this does not
    // depend on how fast the machine starts processes).
    let (ran, codes) = five_cron_runs(&case, &[], "report-released", true);
    assert_eq!(
        ran, 5,
        "without --hold the job ran {ran} time(s) ({codes:?})"
    );
    assert!(is_free(&mut case.server.conn(), "report-released"));
}

// ---- small things: a URL without a scheme, rediss:// on a plain port, help width ------

#[test]
fn url_without_scheme_tls_on_a_plain_port_and_run_help_at_80_columns() {
    let case = Case::start();
    let addr = case.server.addr();
    let d = case.cli(&["run", "--url", &addr, "job", "--", "true"]);
    assert_eq!(d.code, Some(64), "a usage error, not 69");
    assert!(
        d.stderr.contains(&format!("write redis://{addr}")),
        "{}",
        d.stderr
    );

    let d = case.cli(&[
        "info",
        "--timeout",
        "500ms",
        "--url",
        &format!("rediss://{addr}"),
        "k",
    ]);
    assert_eq!(d.code, Some(69));
    assert!(
        d.stderr
            .contains("looks like a TLS handshake against a server without TLS"),
        "{}",
        d.stderr
    );

    for columns in ["80", "200"] {
        let out = Command::new(BIN)
            .args(["run", "--help"])
            .env("COLUMNS", columns)
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        for line in [
            "  REDIS_LOCK_URL=redis://lock-host:6379",
            "  0 3 * * * redis-lock run -q --hold 1h report -- /usr/local/bin/report",
            "  redis-lock run -w 10s deploy -c 'make deploy && make smoke-test'",
        ] {
            assert!(
                help.lines().any(|l| l == line),
                "{line:?} whole at {columns} columns:\n{help}"
            );
        }
        if columns == "80" {
            let wide: Vec<&str> = help.lines().filter(|l| l.chars().count() > 80).collect();
            assert!(wide.is_empty(), "{wide:?}");
        }
    }
}

#[test]
fn a_closed_stdout_is_not_a_crash() {
    // `redis-lock info NAME | head -2` closes the pipe early. Here the reader closes it
    // at once, so the CLI's writes (after its round trips) all meet a pipe without a
    // reader (EPIPE: Rust ignores SIGPIPE, and println! panics on the error).
    let case = Case::start();
    let held = case.cli(&["acquire", "--url", &case.url, "k"]);
    assert_eq!(held.code, Some(0));
    for args in [
        format!("info --url {} k", case.url),
        format!("info --json --url {} k", case.url),
        format!("acquire --url {} other", case.url),
        "completions bash".to_string(),
        "--help".to_string(),
    ] {
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "{BIN} {args} | (exec <&-; sleep 0.3); exit ${{PIPESTATUS[0]}}"
            ))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args}: {stderr}");
        assert_eq!(out.status.code(), Some(0), "{args}: {stderr}");
    }
}
