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
use util::{cli_cmd, held_fence, is_free, ms, setup};

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
    let a = case.spawn_started(&["--ttl", "2s"], "daily-report", "", "sleep 2");
    let b = case.run(&[], "daily-report", &touch(&b_ran));
    assert_eq!(b.code, Some(75), "the second run finds the lock busy");
    assert!(!b_ran.exists(), "the second command must not run");
    assert!(b.took < ms(2_000));
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
    let run = spawn_term_recorder(&case, &["--ttl", "600ms"], "lease", &marker);
    // Held and renewed past its TTL...
    std::thread::sleep(ms(1_000));
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
    assert!(t.elapsed() < ms(2_000), "took {:?}", t.elapsed());
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
    // Within the lease (900 ms) plus the grace (500 ms) plus slack.
    assert!(t.elapsed() < ms(3_000), "took {:?}", t.elapsed());
    assert!(d.stderr.contains("SIGKILL"), "{}", d.stderr);
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
    // Three down: no majority, exit 75, CMD never runs, nothing left on the live nodes.
    s[2].kill9();
    let d = cli(&dir, &refs(&args(&touch(&ran))));
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
    // `run NAME --ttl ... -- CMD` and -n: busy at once, with the code chosen by -E.
    let holder = case.spawn(&[
        "run", "job", "--ttl", "5s", "--url", url, "--", "sleep", "2",
    ]);
    assert!(held_soon(server, "job"));
    let d = case.cli(&["run", "-n", "job", "--url", url, "-E", "3", "--", "true"]);
    assert_eq!(d.code, Some(3));
    assert!(d.took < ms(1_500));
    // -w with a unit: waits for the holder (FIFO), then runs.
    let d = case.cli(&["run", "job", "-w", "10s", "--url", url, "--", "true"]);
    assert_eq!(d.code, Some(0));
    assert!(d.took >= ms(500), "waited for the holder: {:?}", d.took);
    assert_eq!(holder.done().code, Some(0));
    // -w with a bare number means seconds: 0.3 s here.
    let holder = case.spawn(&["run", "job", "--url", url, "--", "sleep", "2"]);
    assert!(held_soon(server, "job"));
    let d = case.cli(&["acquire", "job", "-w", "0.3", "--url", url]);
    assert_eq!(d.code, Some(75));
    assert!(d.took >= ms(300) && d.took < ms(1_800), "{:?}", d.took);
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

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (Debian package openssl) runs");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A CA and a server certificate for 127.0.0.1 signed by it, in `dir`.
fn make_certs(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=redis-lock test CA",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
}

#[test]
fn tls_with_a_self_signed_ca() {
    setup();
    let dir = temp_dir();
    make_certs(&dir);
    let tls_port = common::free_port();
    let tls = |b: ServerBuilder| {
        b.arg("tls-port", &tls_port.to_string())
            .arg(
                "tls-cert-file",
                &dir.join("server.crt").display().to_string(),
            )
            .arg(
                "tls-key-file",
                &dir.join("server.key").display().to_string(),
            )
            .arg(
                "tls-ca-cert-file",
                &dir.join("ca.crt").display().to_string(),
            )
            .arg("tls-auth-clients", "no")
    };
    // Not every server binary is built with TLS; Debian's redis-server 7.0.15 is.
    let server = match tls(ServerBuilder::new()).try_start() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("this server has no TLS ({e}); using /usr/bin/redis-server");
            tls(ServerBuilder::new().bin("/usr/bin/redis-server".into())).start()
        }
    };
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let ca = dir.join("ca.crt").display().to_string();
    let d = cli(
        &dir,
        &[
            "acquire", "--json", "--cacert", &ca, "--url", &url, "tls-lock",
        ],
    );
    assert_eq!(d.code, Some(0), "{}", d.stderr);
    let v: serde_json::Value = serde_json::from_str(d.stdout.trim()).unwrap();
    let fence: u64 = v["fence"].as_str().unwrap().parse().unwrap();
    assert_eq!(held_fence(&mut server.conn(), "tls-lock"), Some(fence));
    // The same through SSL_CERT_FILE, and a run over TLS.
    let d = cli_env(
        &dir,
        &["run", "--url", &url, "tls-run", "--", "true"],
        &[("SSL_CERT_FILE", &ca)],
    );
    assert_eq!(d.code, Some(0), "{}", d.stderr);
    // An untrusted certificate is refused; #insecure skips the check.
    let d = cli(&dir, &["info", "--url", &url, "tls-lock"]);
    assert_eq!(d.code, Some(69), "the test CA is not trusted by default");
    let d = cli(
        &dir,
        &["info", "--url", &format!("{url}/#insecure"), "tls-lock"],
    );
    assert_eq!(d.code, Some(0), "{}", d.stderr);
    // A plain-text client on the TLS port gets nothing usable.
    let d = cli(
        &dir,
        &[
            "info",
            "--timeout",
            "500ms",
            "--url",
            &format!("redis://127.0.0.1:{tls_port}"),
            "tls-lock",
        ],
    );
    assert_eq!(d.code, Some(69));
    let _ = fs::remove_dir_all(&dir);
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
