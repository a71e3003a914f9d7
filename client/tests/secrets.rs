//! No credential in any message, log line, `--json` output or error of the CLI or the
//! library; no token in an error; a missing module reported as such.

mod util;

use redis_lock_client::{AcquireOptions, ClientOptions, LockClient};
use redis_lock_testkit::{free_port, Server, ServerBuilder};
use util::{cli_cmd, ms, setup};

const PASSWORD: &str = "hunter2-Pw0rd";
const TOKEN: &str = "tok-Secret-0123456789abcdef";

struct Out {
    code: Option<i32>,
    all: String,
}

/// `redis-lock ARGS` with `env` on top of an environment without REDIS_* settings;
/// stdout and stderr together.
fn cli(args: &[&str], env: &[(&str, &str)]) -> Out {
    let out = cli_cmd()
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("redis-lock {args:?}: {:?}\n{all}", out.status.code());
    Out {
        code: out.status.code(),
        all,
    }
}

/// Asserts that no output of `o` shows the password (in any form a URL would carry it)
/// or the token.
fn clean(o: &Out, what: &str) {
    for secret in [PASSWORD, "hunter2", TOKEN] {
        assert!(
            !o.all.contains(secret),
            "{what} shows {secret:?}:\n{}",
            o.all
        );
    }
}

/// A server with the module whose default user's password is `another-one` (set after
/// the start: the kit's readiness check has no password).
fn guarded_server() -> Server {
    let server = ServerBuilder::new().start();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "another-one"][..])
        .query(&mut server.conn())
        .unwrap();
    server
}

fn user_url(server: &Server) -> String {
    format!("redis://locker:{PASSWORD}@{}/", server.addr())
}

#[test]
fn the_cli_never_prints_a_password_or_a_token() {
    setup();
    let server = guarded_server();
    let (url, addr) = (server.url(), server.addr());
    let pw = [("REDIS_LOCK_PASSWORD", PASSWORD)];
    let run = ["run", "-q", "--url", &url, "job", "--", "true"];

    // The report's case: a wrong password from the environment, with -q and with -v.
    let o = cli(&run, &pw);
    assert_eq!(o.code, Some(69));
    assert!(
        o.all.contains(&format!("{addr}: authentication failed")),
        "{}",
        o.all
    );
    clean(&o, "run -q, wrong password");
    let o = cli(&["run", "-v", "--url", &url, "job", "--", "true"], &pw);
    assert_eq!(o.code, Some(69));
    clean(&o, "run -v, wrong password");
    // In the URL, and through REDISCLI_AUTH.
    let in_url = format!("redis://:{PASSWORD}@{addr}/");
    let o = cli(&["info", "--url", &in_url, "job", "--json"], &[]);
    assert_eq!(o.code, Some(69));
    clean(&o, "info --json, password in the URL");
    let o = cli(
        &["acquire", "--url", &url, "--token", TOKEN, "k"],
        &[("REDISCLI_AUTH", PASSWORD)],
    );
    assert_eq!(o.code, Some(69));
    clean(&o, "acquire --token, REDISCLI_AUTH");
    // Nothing listening, and a URL that does not parse.
    let down = format!("redis://:{PASSWORD}@127.0.0.1:{}/", free_port());
    let o = cli(&["run", "-v", "--url", &down, "job", "--", "true"], &[]);
    assert_eq!(o.code, Some(69));
    clean(&o, "run, refused");
    let o = cli(
        &["info", "--url", &format!(":{PASSWORD}@{addr}"), "job"],
        &[],
    );
    assert_eq!(o.code, Some(64));
    clean(&o, "a --url that is not a URL");

    // Right credentials (an ACL user): the output shows the token it was asked for (that
    // is what acquire prints) but never the password; --nodes info prints URLs without it.
    let mut c = redis::Client::open(format!("redis://:another-one@{addr}/"))
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "locker",
                "on",
                &format!(">{PASSWORD}"),
                "~*",
                "+@all",
            ][..],
        )
        .query(&mut c)
        .unwrap();
    let ok = cli(
        &["acquire", "-v", "--json", "--url", &user_url(&server), "k"],
        &[],
    );
    assert_eq!(ok.code, Some(0), "{}", ok.all);
    for secret in [PASSWORD, "hunter2"] {
        assert!(!ok.all.contains(secret), "{}", ok.all);
    }
    let nodes = [user_url(&server), user_url(&server), user_url(&server)].join(",");
    let o = cli(&["info", "--json", "--nodes", &nodes, "k"], &[]);
    assert_eq!(o.code, Some(0), "held on every node");
    clean(&o, "info --nodes --json");
    let v: serde_json::Value = serde_json::from_str(o.all.lines().next().unwrap()).unwrap();
    assert_eq!(v["nodes"][0]["url"], format!("redis://{addr}/"));
    assert_eq!(v["nodes"][0]["held"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn library_errors_show_neither_password_nor_token() {
    setup();
    let server = guarded_server();
    let url = format!("redis://:{PASSWORD}@{}/", server.addr());
    let opts = ClientOptions {
        cluster: Some(false),
        ..ClientOptions::default()
    };
    let locks = LockClient::connect_with(&url, opts).await.unwrap();
    let Err(e) = locks
        .acquire_with("k", &AcquireOptions::new(ms(1_000)).token(TOKEN))
        .await
    else {
        panic!("authentication must fail");
    };
    for text in [e.to_string(), format!("{e:?}")] {
        assert!(text.starts_with(&format!("{}: ", server.addr())) || text.starts_with("Redis("));
        assert!(!text.contains("hunter2") && !text.contains(TOKEN), "{text}");
    }
    assert!(e.to_string().contains("authentication failed"), "{e}");
}

#[test]
fn a_missing_module_is_reported_as_such_without_the_arguments() {
    setup();
    let server = ServerBuilder::new().no_module().start();
    let (url, addr) = (server.url(), server.addr());
    let missing = format!("the redis-lock module is not loaded on {addr}; see ");
    // A shared lock needs the module: an error (69), not the fallback.
    let o = cli(
        &["acquire", "--url", &url, "--shared", "--token", TOKEN, "k"],
        &[],
    );
    assert_eq!(o.code, Some(69));
    assert!(o.all.contains(&missing), "{}", o.all);
    assert!(
        !o.all.contains("unknown command") && !o.all.contains("Falling back"),
        "{}",
        o.all
    );
    clean(&o, "acquire --shared without the module");
    // An exclusive run falls back to SET NX PX, and says why.
    let o = cli(&["run", "--url", &url, "job", "--", "true"], &[]);
    assert_eq!(o.code, Some(0));
    assert!(
        o.all.contains(&missing) && o.all.contains("Falling back"),
        "{}",
        o.all
    );
    assert!(!o.all.contains("with args"), "{}", o.all);
}
