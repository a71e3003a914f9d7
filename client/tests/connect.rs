//! How the client and the CLI reach a server: an application's own `redis::Client`, TLS
//! as Redis ships it (client certificates required), a Sentinel that fails the primary
//! over, and a least-privilege ACL user.

mod util;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use redis_lock_client::{AcquireOptions, ClientOptions, Confirm, LockClient, Tls};
use redis_lock_testkit::{
    free_port, server_bin, server_flavor, temp_dir, wait_until, RawConn, ReplicaPair, Resp, Server,
    ServerBuilder,
};
use util::{
    cli_cmd, expires_at, granted, held_fence, is_free, ms, renewing, setup, steady_renewal,
};

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `redis-lock ARGS` with `env` on top of an environment without REDIS_* settings.
fn cli(args: &[&str], env: &[(&str, &str)]) -> Out {
    let out = cli_cmd()
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let o = Out {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    eprintln!(
        "redis-lock {args:?}: exit {:?}; stderr: {}",
        o.code,
        o.stderr.trim()
    );
    o
}

// ---- an application's own redis::Client ----------------------------------------------

/// An application on the current `redis` crate hands the lock client a `redis::Client`
/// it configured itself, and passes its own `redis::Cmd` to a guarded write: both are
/// the crate's types (re-exported as `redis_lock_client::redis`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_hands_over_its_own_redis_client() {
    setup();
    let server = ServerBuilder::new().start();
    let app: redis::Client = redis::Client::open(server.url()).unwrap();
    let same: fn(redis::Client) -> redis_lock_client::redis::Client = |c| c;
    let locks = LockClient::from_client(same(app), ClientOptions::default());
    let g = granted(locks.acquire("lock:app", ms(10_000), None)).await;
    let n: i64 = g
        .if_held(redis::cmd("INCR").arg("lock:app-writes"))
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(held_fence(&mut server.conn(), "lock:app"), g.fence());
    assert!(g.release().await.unwrap());
}

// ---- TLS as Redis ships it ------------------------------------------------------------

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (Debian package openssl) runs");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A certificate `name.crt` / `name.key` with `subject`, signed by the CA in `dir`.
fn signed(dir: &Path, name: &str, subject: &str, ext: &str) {
    let (key, csr, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subject,
        ],
    );
    let ext_file = format!("{name}.ext");
    fs::write(dir.join(&ext_file), ext).unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext_file,
        ],
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, in `dir`.
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
    signed(
        dir,
        "server",
        "/CN=127.0.0.1",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    );
    signed(
        dir,
        "client",
        "/CN=redis-lock test client",
        "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
    );
}

/// Redis's own TLS set-up: `tls-auth-clients` left at its default (`yes`), so every
/// client must show a certificate signed by the CA. The CLI with `--cacert`, `--cert`
/// and `--key` (a `rediss://` URL, or `--tls` with `redis://`), and the library with
/// [`Tls`]; without a client certificate the error says what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates_as_redis_ships_it() {
    setup();
    let dir = temp_dir();
    make_certs(&dir);
    let file = |name: &str| dir.join(name).display().to_string();
    let tls_port = free_port();
    let tls = |b: ServerBuilder| {
        b.arg("tls-port", &tls_port.to_string())
            .arg("tls-cert-file", &file("server.crt"))
            .arg("tls-key-file", &file("server.key"))
            .arg("tls-ca-cert-file", &file("ca.crt"))
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
    let (ca, cert, key) = (file("ca.crt"), file("client.crt"), file("client.key"));
    let certs = ["--cacert", &ca, "--cert", &cert, "--key", &key];
    fn with<'a>(certs: &[&'a str], args: &[&'a str]) -> Vec<&'a str> {
        [certs, args].concat()
    }

    let d = cli(
        &with(&certs, &["acquire", "--json", "--url", &url, "tls-lock"]),
        &[],
    );
    assert_eq!(d.code, Some(0), "{}", d.stderr);
    let v: serde_json::Value = serde_json::from_str(d.stdout.trim()).unwrap();
    let fence: u64 = v["fence"].as_str().unwrap().parse().unwrap();
    assert_eq!(held_fence(&mut server.conn(), "tls-lock"), Some(fence));
    // --tls with a redis:// URL; a run; the CA from SSL_CERT_FILE.
    let plain_url = format!("redis://127.0.0.1:{tls_port}");
    let d = cli(
        &with(&certs, &["info", "--tls", "--url", &plain_url, "tls-lock"]),
        &[],
    );
    assert_eq!(d.code, Some(0), "{}", d.stderr);
    let d = cli(
        &with(&certs, &["run", "--url", &url, "tls-run", "--", "true"]),
        &[],
    );
    assert_eq!(d.code, Some(0), "{}", d.stderr);
    let d = cli(
        &[
            "info", "--cert", &cert, "--key", &key, "--url", &url, "tls-lock",
        ],
        &[("SSL_CERT_FILE", &ca)],
    );
    assert_eq!(d.code, Some(0), "{}", d.stderr);
    // No client certificate: refused, and the message says what is missing.
    let d = cli(&["info", "--cacert", &ca, "--url", &url, "tls-lock"], &[]);
    assert_eq!(d.code, Some(69));
    assert!(
        d.stderr.contains("client certificate") && d.stderr.contains("--cert"),
        "{}",
        d.stderr
    );
    // An untrusted server certificate is refused; #insecure skips the check.
    let d = cli(
        &[
            "info", "--cert", &cert, "--key", &key, "--url", &url, "tls-lock",
        ],
        &[],
    );
    assert_eq!(d.code, Some(69), "the test CA is not trusted by default");
    let insecure = format!("{url}/#insecure");
    let d = cli(
        &[
            "info", "--cert", &cert, "--key", &key, "--url", &insecure, "tls-lock",
        ],
        &[],
    );
    assert_eq!(d.code, Some(0), "{}", d.stderr);
    // --cert without --key (and the reverse) is a usage error.
    let d = cli(&["info", "--cert", &cert, "--url", &url, "tls-lock"], &[]);
    assert_eq!(d.code, Some(64), "{}", d.stderr);
    // A plain-text client on the TLS port gets nothing usable.
    let d = cli(
        &[
            "info",
            "--timeout",
            "500ms",
            "--url",
            &plain_url,
            "tls-lock",
        ],
        &[],
    );
    assert_eq!(d.code, Some(69));

    // The library: the same certificates as ClientOptions::tls.
    let opts = ClientOptions {
        tls: Some(Tls::from_files(Some(&ca), Some(&cert), Some(&key)).unwrap()),
        ..ClientOptions::default()
    };
    let locks = LockClient::connect_with(&url, opts).await.unwrap();
    let g = granted(locks.acquire("tls-lib", ms(10_000), None)).await;
    assert_eq!(held_fence(&mut server.conn(), "tls-lib"), g.fence());
    assert!(g.release().await.unwrap());
    let _ = fs::remove_dir_all(&dir);
}

// ---- Sentinel -------------------------------------------------------------------------

/// A Sentinel (the server binary with `--sentinel`) watching `mymaster`, quorum 1,
/// declaring it down after 1 s.
struct Sentinel {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Sentinel {
    fn start(master: &Server) -> Sentinel {
        let (dir, port) = (temp_dir(), free_port());
        let conf = dir.join("sentinel.conf");
        fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nlogfile {}\n\
                 sentinel monitor mymaster 127.0.0.1 {} 1\n\
                 sentinel down-after-milliseconds mymaster 1000\n\
                 sentinel failover-timeout mymaster 10000\n",
                dir.display(),
                dir.join("sentinel.log").display(),
                master.port
            ),
        )
        .unwrap();
        let child = Command::new(server_bin())
            .arg(&conf)
            .arg("--sentinel")
            .spawn()
            .expect("the server binary runs as a sentinel");
        let s = Sentinel { child, port, dir };
        assert!(
            wait_until(Duration::from_secs(10), || s.ask(&["PING"]).is_some()),
            "the sentinel answers"
        );
        s
    }

    fn ask(&self, args: &[&str]) -> Option<Resp> {
        let addr = format!("127.0.0.1:{}", self.port).parse().ok()?;
        let mut c = RawConn::open(addr, Duration::from_secs(2)).ok()?;
        c.call(args).ok()
    }

    /// The port `SENTINEL GET-MASTER-ADDR-BY-NAME mymaster` names.
    fn master_port(&self) -> Option<u16> {
        let r = self.ask(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster"])?;
        r.as_items()?.get(1)?.as_text()?.parse().ok()
    }

    /// `total_commands_processed` of `INFO stats` (this `INFO` included).
    fn commands(&self) -> Option<u64> {
        let info = self.ask(&["INFO", "stats"])?.as_text()?;
        info.lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))?
            .trim()
            .parse()
            .ok()
    }

    /// True once the sentinel sees a replica of mymaster whose link to it is up.
    fn knows_a_replica(&self) -> bool {
        self.ask(&["SENTINEL", "REPLICAS", "mymaster"])
            .and_then(|r| r.as_items().map(|i| i.to_vec()))
            .is_some_and(|replicas| {
                replicas.iter().any(|r| {
                    r.get("master-link-status")
                        .and_then(|v| v.as_text())
                        .as_deref()
                        == Some("ok")
                })
            })
    }
}

/// While a failover settles, as a client sees it: the Sentinel names no primary for
/// `mymaster` (`SENTINEL REMOVE`) and every client connection to the primary is closed,
/// so that a client's next call asks the Sentinel and gets
/// `MasterNameNotFoundBySentinel`. [`asked`](Self::asked) tells when a client has asked
/// since; [`end`](Self::end) names the primary again (nothing is lost on it).
struct Unsettled<'a> {
    sentinel: &'a Sentinel,
    primary: &'a Server,
    /// Commands the Sentinel had processed at the start, and how many of them were this
    /// struct's own `INFO`s since (each adds one).
    base: u64,
    polls: u64,
}

impl<'a> Unsettled<'a> {
    fn start(sentinel: &'a Sentinel, primary: &'a Server) -> Unsettled<'a> {
        let r = sentinel.ask(&["SENTINEL", "REMOVE", "mymaster"]);
        assert_eq!(r.and_then(|r| r.as_text()).as_deref(), Some("OK"));
        let killed = primary.raw().cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
        assert!(killed.as_int().is_some_and(|n| n >= 1), "{killed:?}");
        let base = sentinel.commands().expect("the sentinel answers INFO");
        Unsettled {
            sentinel,
            primary,
            base,
            polls: 0,
        }
    }

    /// True once someone else than this test has sent the Sentinel a command since
    /// the start (a client that looked for the primary and found none).
    fn asked(&mut self) -> bool {
        let Some(n) = self.sentinel.commands() else {
            return false;
        };
        self.polls += 1;
        n > self.base + self.polls
    }

    /// The Sentinel names the primary again.
    fn end(self) {
        let port = self.primary.port.to_string();
        let r = self
            .sentinel
            .ask(&["SENTINEL", "MONITOR", "mymaster", "127.0.0.1", &port, "1"]);
        assert_eq!(r.and_then(|r| r.as_text()).as_deref(), Some("OK"));
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("sentinel log kept in {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// `redis+sentinel://` for the library and the CLI: a guard renewed through a failover
/// (the primary SIGKILLed, Sentinel promotes its replica) stays held and is renewed on
/// the new primary; a `run` started before the failover ends normally (exit 0, not 79)
/// and releases on the new primary; a new acquire lands there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_and_the_library_follow_a_sentinel_failover() {
    setup();
    let fast = ServerBuilder::new().arg("repl-diskless-sync-delay", "0");
    let mut pair = ReplicaPair::try_start_with(fast, ServerBuilder::new()).unwrap();
    let sentinel = Sentinel::start(&pair.primary);
    assert!(
        wait_until(Duration::from_secs(20), || sentinel.knows_a_replica()),
        "the sentinel found the replica"
    );
    let url = format!("redis+sentinel://127.0.0.1:{}/mymaster", sentinel.port);

    let locks = LockClient::connect(&url).await.unwrap();
    let guard = granted(locks.acquire_with("lock:lib", &renewing(10_000))).await;
    let lost = guard.lost();
    let dir = temp_dir();
    let (started, go) = (dir.join("started"), dir.join("go"));
    let script = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.1; done",
        started.display(),
        go.display()
    );
    let run = cli_cmd()
        .args([
            "run", "--url", &url, "--ttl", "10s", "lock:cli", "--", "sh", "-c", &script,
        ])
        .spawn()
        .unwrap();
    let run = ChildGuard(run);
    assert!(wait_until(Duration::from_secs(10), || started.exists()));

    let t = Instant::now();
    pair.primary.kill9();
    let new_port = pair.replica.port;
    assert!(
        wait_until(Duration::from_secs(30), || sentinel.master_port()
            == Some(new_port)
            && pair.replica.role().as_deref() == Some("master")),
        "Sentinel promoted the replica"
    );
    eprintln!("failover done {:?} after the SIGKILL", t.elapsed());
    // Both locks are renewed on the new primary: their deadlines move on there.
    let first = [
        expires_at(&pair.replica, "lock:lib"),
        expires_at(&pair.replica, "lock:cli"),
    ];
    assert!(first.iter().all(Option::is_some), "{first:?}: replicated");
    let renewed = wait_until(Duration::from_secs(10), || {
        let now = [
            expires_at(&pair.replica, "lock:lib"),
            expires_at(&pair.replica, "lock:cli"),
        ];
        now.iter().zip(&first).all(|(n, f)| n > f)
    });
    assert!(renewed, "renewed on the new primary");
    assert!(guard.is_held(), "{:?}", guard.status());

    fs::write(&go, "").unwrap();
    let mut run = run;
    let status = wait_child(&mut run.0, Duration::from_secs(20));
    assert_eq!(status, Some(0), "the run ended normally after the failover");
    assert!(
        is_free(&mut pair.replica.conn(), "lock:cli"),
        "released there"
    );
    assert!(guard.release().await.unwrap());
    assert_eq!(lost.await, None, "released, never lost");

    let g = granted(locks.acquire("lock:after", ms(10_000), None)).await;
    assert_eq!(
        held_fence(&mut pair.replica.conn(), "lock:after"),
        g.fence()
    );
    let d = cli(&["info", "--url", &url, "lock:after"], &[]);
    assert_eq!(d.code, Some(0), "{}", d.stderr);
    let _ = fs::remove_dir_all(&dir);
}

/// A release (`release_now`, `release_after`'s keep, a session's close, by token) that
/// meets a failover still settling (the Sentinel names no primary yet) is tried again
/// until the primary is named, within what is left of the lease: the lock is free (or
/// kept for the hold) on the server when the call returns. The first try always fails
/// here: the Sentinel is named again only once a client asked it and found nothing.
/// When the primary stays unnamed, the release gives up with the error, not before its
/// lease was nearly over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_during_a_settling_failover_is_tried_again_within_the_lease() {
    setup();
    let primary = ServerBuilder::new().start();
    let sentinel = Sentinel::start(&primary);
    let url = format!("redis+sentinel://127.0.0.1:{}/mymaster", sentinel.port);
    let locks = LockClient::connect(&url).await.unwrap();
    let ttl = ms(60_000);

    // Each path: take the lock, unsettle, give it up in a task, name the primary
    // again once the first try asked the Sentinel, then the outcome.
    async fn through<T: Send + 'static>(
        sentinel: &Sentinel,
        primary: &Server,
        end: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        let mut u = Unsettled::start(sentinel, primary);
        let task = tokio::spawn(end);
        let asked =
            tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), || u.asked()));
        assert!(asked, "the release asked the Sentinel for the primary");
        u.end();
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("the release ends")
            .unwrap()
    }

    let g = granted(locks.acquire("lock:now", ttl, None)).await;
    let released = through(&sentinel, &primary, g.release_now()).await;
    assert!(released.unwrap(), "released: it was held");
    assert!(
        is_free(&mut primary.conn(), "lock:now"),
        "free on the server"
    );

    // release_after: the hold's keep (LOCK.EXTEND confirmed) is tried again too.
    let g = granted(locks.acquire("lock:hold", ttl, None)).await;
    let kept = through(&sentinel, &primary, g.release_after(ms(3_600_000))).await;
    assert!(kept.unwrap(), "kept for the hold");
    let left = lease_left(&primary, "lock:hold");
    assert!(
        left > Some(1_800_000),
        "kept for the hour's rest: {left:?} ms"
    );

    // A session's close, and a release by token.
    let session = locks
        .session(&redis_lock_client::SessionOptions::new(ttl))
        .await
        .unwrap();
    let _in_session = session.acquire("lock:session", None).await.unwrap();
    let closed = through(&sentinel, &primary, session.close()).await;
    assert_eq!(closed.unwrap(), 1, "its one lock released");
    assert!(is_free(&mut primary.conn(), "lock:session"));
    let g = granted(locks.acquire("lock:token", ttl, None)).await;
    let token = g.detach().0;
    let by_token = locks.clone();
    let released = through(&sentinel, &primary, async move {
        by_token.release("lock:token", &token).await
    })
    .await;
    assert!(released.unwrap());
    assert!(is_free(&mut primary.conn(), "lock:token"));

    // No primary named for the rest of a 3 s lease: the release gives up with the
    // Sentinel's error, and only near the lease's end (the server frees it then).
    let g = granted(locks.acquire("lock:short", ms(3_000), None)).await;
    let valid_until = g.valid_until().unwrap();
    let u = Unsettled::start(&sentinel, &primary);
    let outcome = tokio::time::timeout(Duration::from_secs(30), g.release_now())
        .await
        .expect("the release gives up");
    let e = outcome.expect_err("no primary to release on");
    assert!(e.is_failover_pending(), "{e}");
    assert!(
        Instant::now() + ms(500) >= valid_until,
        "tried again until the last pause before the lease ends"
    );
    u.end();
}

/// `redis-lock run` ends while a failover settles (the Sentinel names no primary yet):
/// its release is tried again until the primary is named, so the lock is free when
/// `run` exits; with `--hold` the lock is kept for the hold. (A flake of the failover
/// test above: the release met `MasterNameNotFoundBySentinel` once, was only logged,
/// and the lock stayed taken until its lease ended.)
#[test]
fn a_run_that_ends_during_a_settling_failover_releases_or_keeps_its_lock() {
    setup();
    let primary = ServerBuilder::new().start();
    let sentinel = Sentinel::start(&primary);
    let url = format!("redis+sentinel://127.0.0.1:{}/mymaster", sentinel.port);
    let dir = temp_dir();
    for (name, hold) in [("lock:run", None), ("lock:run-hold", Some("1h"))] {
        let (started, go) = (
            dir.join(format!("{name}.started")),
            dir.join(format!("{name}.go")),
        );
        let script = format!(
            "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
            started.display(),
            go.display()
        );
        // A 60 s lease: no renewal in the few moments the test takes.
        let mut args = vec!["run", "--url", &url, "--ttl", "60s"];
        if let Some(h) = hold {
            args.extend(["--hold", h]);
        }
        args.extend([name, "--", "sh", "-c", &script]);
        let mut run = ChildGuard(cli_cmd().args(&args).spawn().unwrap());
        assert!(wait_until(Duration::from_secs(10), || started.exists()));
        let mut u = Unsettled::start(&sentinel, &primary);
        fs::write(&go, "").unwrap();
        assert!(
            wait_until(Duration::from_secs(10), || u.asked()),
            "{name}: the run asked the Sentinel at its end"
        );
        u.end();
        let status = wait_child(&mut run.0, Duration::from_secs(30));
        assert_eq!(status, Some(0), "{name}: the run ended normally");
        match hold {
            None => assert!(is_free(&mut primary.conn(), name), "{name}: released"),
            Some(_) => {
                let left = lease_left(&primary, name);
                assert!(
                    left > Some(1_800_000),
                    "{name}: kept for the hour: {left:?} ms"
                );
            }
        }
    }
    let _ = fs::remove_dir_all(&dir);
}

/// The `ttl` of `LOCK.INFO key` (ms), `None` when free.
fn lease_left(server: &Server, key: &str) -> Option<i64> {
    server.raw().cmd(&["LOCK.INFO", key]).get("ttl")?.as_int()
}

/// Kills the child when the test ends early.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The exit code of `child` within `limit` (`None`: it did not end, or died of a signal).
fn wait_child(child: &mut Child, limit: Duration) -> Option<i32> {
    let mut code = None;
    wait_until(limit, || match child.try_wait() {
        Ok(Some(s)) => {
            code = s.code();
            true
        }
        _ => false,
    });
    code
}

// ---- least-privilege ACL --------------------------------------------------------------

/// The least a client needs: acquire, release, extend (renew) and info on the lock keys,
/// and for the confirmation `WAIT` and `ROLE` (the replicas online). One line for Redis
/// 7.0 (no `@lock` category there), 7.2+ and Valkey, and for every client of this
/// repository.
const LEAST: &str = "~lock:* +lock.acquire +lock.release +lock.extend +lock.info +wait +role";

fn set_user(server: &Server, rules: &str) {
    let mut args = vec!["ACL", "SETUSER", "locker", "reset", "on", ">locker-pw"];
    args.extend(rules.split(' '));
    let r = server.raw().cmd(&args);
    assert!(!r.is_error(), "ACL SETUSER {rules}: {r:?}");
}

fn as_locker(server: &Server) -> String {
    format!("redis://locker:locker-pw@{}", server.addr())
}

/// The least-privilege line: the CLI's `run` (default confirmation, a replica, renewals)
/// and the library acquire, confirm, renew and release; the user can do nothing else
/// (read or write the keys, other keys, FORCERELEASE, INFO, CONFIG, KEYS).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_acl_acquires_confirms_renews_releases_and_nothing_more() {
    setup();
    let fast = ServerBuilder::new().arg("repl-diskless-sync-delay", "0");
    let pair = ReplicaPair::try_start_with(fast, ServerBuilder::new()).unwrap();
    set_user(&pair.primary, LEAST);
    let url = as_locker(&pair.primary);

    // Renewed past its TTL: 3 s renewed every second with a 300 ms margin, so that a
    // renewal may come 1.7 s late on a loaded machine (a 1 s TTL left 333 ms).
    let d = cli(
        &[
            "run", "--url", &url, "--ttl", "3s", "--margin", "300ms", "lock:job", "--", "sleep",
            "4",
        ],
        &[],
    );
    assert_eq!(d.code, Some(0), "{}", d.stderr);
    assert!(is_free(&mut pair.primary.conn(), "lock:job"));

    let opts = ClientOptions {
        confirm_timeout: ms(10_000),
        ..ClientOptions::default()
    };
    let locks = LockClient::connect_with(&url, opts).await.unwrap();
    // Leases long enough for a confirmation on a loaded machine (a 300 ms lease could
    // end before its WAIT answered: seen in CI), short enough to be renewed in the test;
    // a renewal may come 2.2 s late (a 1 s lease renewed every third left 333 ms).
    let g = granted(locks.acquire_with(
        "lock:lib",
        &redis_lock_client::AcquireOptions::new(ms(3_000)).renewal(steady_renewal()),
    ))
    .await;
    // Confirmed: on the replica when acquire returned.
    assert_eq!(held_fence(&mut pair.replica.conn(), "lock:lib"), g.fence());
    tokio::time::sleep(ms(3_500)).await;
    assert!(g.is_held(), "renewed past its 3 s lease: {:?}", g.status());
    assert!(g.release().await.unwrap());

    let mut c = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    for cmd in [
        "GET lock:lib",
        "SET lock:lib x",
        "DEL lock:lib",
        "LOCK.FORCERELEASE lock:lib",
        "LOCK.ACQUIRE other:key PX 1000",
        "INFO",
        "CONFIG GET maxmemory",
        "KEYS *",
    ] {
        let mut args = cmd.split(' ');
        let mut q = redis::cmd(args.next().unwrap());
        q.arg(args.collect::<Vec<_>>());
        let r: redis::RedisResult<redis::Value> = q.query(&mut c);
        let e = r.expect_err(cmd);
        assert_eq!(e.code(), Some("NOPERM"), "{cmd}: {e}");
    }
}

/// A release refused for good is not tried again: `NOPERM` (a user without
/// `+lock.release`) comes back after one try (the ACL log counts one denial) and the
/// lock stays taken; a token that does not hold the lock is one `LOCK.RELEASE`,
/// answered 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_refused_for_good_is_not_tried_again() {
    setup();
    let server = ServerBuilder::new().start();
    set_user(&server, &LEAST.replace(" +lock.release", ""));
    let locks = LockClient::connect(&as_locker(&server)).await.unwrap();
    let g = granted(locks.acquire("lock:denied", ms(60_000), None)).await;
    let fence = g.fence();
    let e = g.release_now().await.expect_err("release is not allowed");
    assert_eq!(e.server_code(), Some("NOPERM"), "{e}");
    let log = server.raw().cmd(&["ACL", "LOG"]);
    let denials: i64 = log
        .items()
        .iter()
        .filter(|entry| {
            entry.get("object").and_then(|o| o.as_text()).as_deref() == Some("lock.release")
        })
        .filter_map(|entry| entry.get("count").and_then(|c| c.as_int()))
        .sum();
    assert_eq!(denials, 1, "one try: {log:?}");
    assert_eq!(held_fence(&mut server.conn(), "lock:denied"), fence);

    let admin = LockClient::connect(&server.url()).await.unwrap();
    let r = server.raw().cmd(&["CONFIG", "RESETSTAT"]);
    assert!(!r.is_error(), "{r:?}");
    let wrong = "00000000-0000-4000-8000-000000000000";
    assert!(
        !admin.release("lock:denied", wrong).await.unwrap(),
        "not held by it"
    );
    let stats = server.raw().cmd(&["INFO", "commandstats"]).text();
    let calls = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_lock.release:calls="))
        .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok());
    assert_eq!(calls, Some(1), "{stats}");
    assert_eq!(held_fence(&mut server.conn(), "lock:denied"), fence);
}

/// The line the docs used to suggest (`~lock:* +@lock -@dangerous`; on Redis 7.0 the
/// module's commands by name): without `ROLE`/`INFO` and `WAIT`, `--no-confirm` and
/// `--replicas 0` need nothing more; the default confirmation says what to grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_commands_alone_work_with_no_confirm_or_replicas_0() {
    setup();
    let server = ServerBuilder::new().start();
    let flavor = server_flavor();
    let rules = if flavor.is_valkey() || flavor.at_least(7, 2) {
        "~lock:* +@lock -@dangerous"
    } else {
        "~lock:* +lock.acquire +lock.release +lock.extend +lock.info +lock.check \
         +lock.watch +lock.ifheld +lock.iffence"
    };
    set_user(&server, rules);
    let url = as_locker(&server);
    for extra in ["--no-confirm", "--replicas=0"] {
        let d = cli(
            &["run", extra, "--url", &url, "lock:job", "--", "true"],
            &[],
        );
        assert_eq!(d.code, Some(0), "{extra}: {}", d.stderr);
    }
    let d = cli(&["run", "--url", &url, "lock:job", "--", "true"], &[]);
    assert_eq!(d.code, Some(69), "{}", d.stderr);
    assert!(
        d.stderr.contains("+role") && d.stderr.contains("--no-confirm"),
        "{}",
        d.stderr
    );

    for confirm in [Confirm::Off, Confirm::Replicas(0)] {
        let opts = ClientOptions {
            confirm,
            ..ClientOptions::default()
        };
        let locks = LockClient::connect_with(&url, opts).await.unwrap();
        let g = granted(locks.acquire_with("lock:lib", &AcquireOptions::new(ms(5_000)))).await;
        assert!(g.release().await.unwrap());
    }
}
