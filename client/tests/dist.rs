//! Installable like a library: the LICENSE files, the Debian package (built by
//! scripts/build-deb.sh from the module and CLI under test, unpacked into a fresh
//! directory with `dpkg-deb -x` and used: a server loads the module through the
//! package's configuration snippet, the package's CLI takes a lock), every command of
//! docs/quickstart-cli.md run as written with its output checked, and links of the docs
//! that stay inside the repository.
//!
//! `QUICKSTART_INSTALLED=1` (set by `make test-deb`, as root): the quickstart's
//! `sudo apt install ./redis-lock_*.deb` is run for real (scripts/test-deb.sh removes the
//! package afterwards and checks that nothing is left).

mod util;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use redis_lock_testkit::{free_port, module_path, server_bin, temp_dir, RawConn, ServerBuilder};
use util::setup;

const CLI: &str = env!("CARGO_BIN_EXE_redis-lock");

/// The names of the modules `server` has loaded (`MODULE LIST`).
fn modules(server: &redis_lock_testkit::Server) -> Vec<String> {
    server
        .raw()
        .cmd(&["MODULE", "LIST"])
        .items()
        .iter()
        .filter_map(|m| m.get("name").and_then(|n| n.as_text()))
        .collect()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The package: `$QUICKSTART_DEB` (the artifact of `make dist-deb`, from `make
/// test-deb`), else built once per test binary from the module and the CLI under test.
fn deb() -> &'static Path {
    static DEB: OnceLock<PathBuf> = OnceLock::new();
    DEB.get_or_init(|| {
        setup();
        if let Some(given) = std::env::var_os("QUICKSTART_DEB") {
            return PathBuf::from(given);
        }
        let out = temp_dir();
        let so = module_path();
        let printed = run(Command::new("bash")
            .arg(repo().join("scripts/build-deb.sh"))
            .args(["--fast", "--so"])
            .arg(&so)
            .arg("--cli")
            .arg(CLI)
            .arg("--out")
            .arg(&out));
        PathBuf::from(printed.trim())
    })
}

/// The package unpacked into a fresh directory, its snippet pointing at the module
/// there (the one change from an install, which puts it at /usr/lib/redis/modules).
fn unpacked() -> PathBuf {
    let root = temp_dir();
    run(Command::new("dpkg-deb").arg("-x").arg(deb()).arg(&root));
    let conf = root.join("etc/redis/modules/redis-lock.conf");
    let text = fs::read_to_string(&conf).unwrap();
    let moved = text.replace(
        "loadmodule /usr/lib/redis/modules/",
        &format!("loadmodule {}/usr/lib/redis/modules/", root.display()),
    );
    assert_ne!(text, moved, "the snippet loads the installed module");
    fs::write(&conf, moved).unwrap();
    root
}

#[test]
fn licenses_are_mit_at_the_root_and_in_the_client() {
    for dir in [repo(), repo().join("client")] {
        let text = fs::read_to_string(dir.join("LICENSE")).unwrap();
        assert!(text.starts_with("MIT License\n"), "{}", dir.display());
        assert!(text.contains("Permission is hereby granted, free of charge"));
    }
    let manifest = fs::read_to_string(repo().join("client/Cargo.toml")).unwrap();
    assert!(manifest.contains("license = \"MIT\""));
}

#[test]
fn the_deb_installs_the_module_the_snippet_and_the_cli_and_they_work() {
    let deb = deb();
    let name = deb.file_name().unwrap().to_string_lossy().into_owned();
    let arch = run(Command::new("dpkg").arg("--print-architecture"));
    assert_eq!(
        name,
        format!(
            "redis-lock_{}_{}.deb",
            env!("CARGO_PKG_VERSION"),
            arch.trim()
        )
    );
    let info = run(Command::new("dpkg-deb").arg("-f").arg(deb));
    for field in [
        "Package: redis-lock",
        "Section: database",
        "Depends: libc6 (>= 2.",
    ] {
        assert!(info.contains(field), "{field:?} in\n{info}");
    }
    let contents = run(Command::new("dpkg-deb").arg("-c").arg(deb));
    for path in [
        "./usr/lib/redis/modules/redis-lock.so",
        "./etc/redis/modules/redis-lock.conf",
        "./usr/bin/redis-lock",
        "./usr/share/doc/redis-lock/copyright",
    ] {
        assert!(
            contents.lines().any(|l| l.ends_with(path)),
            "{path} in\n{contents}"
        );
    }
    let conffiles = run(Command::new("dpkg-deb").arg("-I").arg(deb).arg("conffiles"));
    assert_eq!(conffiles.trim(), "/etc/redis/modules/redis-lock.conf");

    // Used from a fresh directory: the server under test loads the module through the
    // snippet (the `include` line docs/quickstart-cli.md gives for redis.conf), and the
    // package's own CLI takes and releases a lock there.
    let root = unpacked();
    let conf = root.join("etc/redis/modules/redis-lock.conf");
    let server = ServerBuilder::new()
        .no_module()
        .arg("include", &conf.display().to_string())
        .start();
    // (Redis 8 loads modules of its own too, e.g. vectorset.)
    assert!(
        modules(&server).iter().any(|m| m == "lock"),
        "{:?}",
        modules(&server)
    );
    let cli = root.join("usr/bin/redis-lock");
    let url = server.url();
    let out = run(Command::new(&cli).args(["acquire", "--json", "--url", &url, "k"]));
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let token = v["token"].as_str().unwrap();
    assert!(v["fence"].as_str().unwrap().parse::<u64>().unwrap() > 0);
    run(Command::new(&cli).args(["release", "--url", &url, "k", token]));
    let ran = run(Command::new(&cli).args(["run", "--url", &url, "job", "--", "echo", "ran"]));
    assert_eq!(ran, "ran\n");
    let _ = fs::remove_dir_all(&root);
}

// ---- docs/quickstart-cli.md, run as written --------------------------------------

/// One `$ command` of a console block and the output shown under it.
#[derive(Debug)]
struct Step {
    cmd: String,
    shown: Vec<String>,
}

/// The `console` blocks' steps and the `conf` blocks' lines of a Markdown file.
fn parse_doc(text: &str) -> (Vec<Step>, Vec<String>) {
    let (mut steps, mut conf) = (Vec::<Step>::new(), Vec::new());
    let mut block: Option<&str> = None;
    for line in text.lines() {
        match (block, line.strip_prefix("```")) {
            (None, Some(lang)) => block = Some(if lang.is_empty() { "-" } else { lang }),
            (Some(_), Some("")) => block = None,
            (Some("console"), _) => match line.strip_prefix("$ ") {
                Some(cmd) => steps.push(Step {
                    cmd: cmd.to_string(),
                    shown: Vec::new(),
                }),
                None => steps
                    .last_mut()
                    .expect("output after a command")
                    .shown
                    .push(line.to_string()),
            },
            (Some("conf"), _) => conf.push(line.to_string()),
            _ => {}
        }
    }
    (steps, conf)
}

/// Output with what differs between runs (fences, lease times, tokens) as `<n>` and
/// `<uuid>`: runs of 4 or more digits and UUIDs.
fn normalize(line: &str) -> String {
    let b = line.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        let is_uuid = b.len() >= i + 36
            && b[i..i + 36].iter().enumerate().all(|(k, c)| match k {
                8 | 13 | 18 | 23 => *c == b'-',
                _ => c.is_ascii_hexdigit(),
            });
        if is_uuid {
            out.push_str("<uuid>");
            i += 36;
            continue;
        }
        let digits = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
        if digits >= 4 {
            out.push_str("<n>");
            i += digits;
        } else if digits > 0 {
            out.push_str(&line[i..i + digits]);
            i += digits;
        } else {
            let ch = line[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Where the quickstart's shell runs.
struct Env<'a> {
    work: &'a Path,
    path: &'a str,
}

/// Runs `steps` (numbered from `first`) in one bash, as `adapt` turns them into this
/// machine's commands, and checks each step's output against the doc's.
fn run_steps(env: &Env<'_>, steps: &[Step], first: usize, adapt: &dyn Fn(&str) -> String) {
    let mut script = String::from("exec 2>&1\n");
    for (i, s) in steps.iter().enumerate() {
        script.push_str(&format!(
            "echo '@@step {}@@'\n{}\n",
            first + i,
            adapt(&s.cmd)
        ));
    }
    script.push_str("echo '@@end@@'\n");
    // Bounded: a step that never ends (a server that never answers) fails the test.
    let out = Command::new("timeout")
        .args(["120", "bash", "-c"])
        .arg(&script)
        .current_dir(env.work)
        .env("PATH", env.path)
        .env_remove("REDIS_LOCK_URL")
        .env_remove("REDIS_URL")
        .env_remove("REDIS_LOCK_PASSWORD")
        .env_remove("REDIS_LOCK_REPLICAS")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let all = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        all.contains("@@end@@"),
        "the quickstart stopped early:\n{all}"
    );
    let mut outputs: Vec<Vec<String>> = Vec::new();
    for line in all.lines() {
        if line.starts_with("@@step ") || line == "@@end@@" {
            outputs.push(Vec::new());
        } else if let Some(o) = outputs.last_mut() {
            o.push(line.to_string());
        }
    }
    for (i, s) in steps.iter().enumerate() {
        // The package manager's own chatter is not the doc's to show.
        if s.cmd.starts_with("sudo ") {
            continue;
        }
        // A server's warnings about this machine (`# WARNING Memory overcommit ...`,
        // printed before it daemonizes) are not the doc's to show either.
        let got: Vec<String> = outputs[i]
            .iter()
            .filter(|l| !l.contains(" # WARNING "))
            // Valkey 9 names the user in a refusal where Redis says "this user".
            .map(|l| normalize(&l.replace("NOPERM User locker has", "NOPERM this user has")))
            .collect();
        let shown: Vec<String> = s.shown.iter().map(|l| normalize(l)).collect();
        assert_eq!(
            got,
            shown,
            "step {}: $ {}\nfull run:\n{all}",
            first + i,
            s.cmd
        );
    }
}

/// Stops the scratch server of the quickstart, however the run ended.
struct Shutdown(u16);

impl Drop for Shutdown {
    fn drop(&mut self) {
        if let Ok(mut c) = RawConn::open(
            ([127, 0, 0, 1], self.0).into(),
            std::time::Duration::from_secs(1),
        ) {
            let _ = c.call(&["SHUTDOWN", "NOSAVE"]);
        }
    }
}

#[test]
fn the_cli_quickstart_runs_as_written() {
    setup();
    let installed = std::env::var("QUICKSTART_INSTALLED").is_ok_and(|v| v == "1");
    let text = fs::read_to_string(repo().join("docs/quickstart-cli.md")).unwrap();
    let (steps, conf) = parse_doc(&text);
    assert!(steps.len() >= 15, "{steps:?}");

    // Where it runs: a scratch directory holding the package; `redis-server` is the
    // server under test; without a real install the package is unpacked into ROOT.
    let work = temp_dir();
    fs::copy(deb(), work.join(deb().file_name().unwrap())).unwrap();
    let bin = work.join("bin");
    fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(server_bin(), bin.join("redis-server")).unwrap();
    let root = work.join("root");
    let port = free_port();
    let _shutdown = Shutdown(port);
    let path = if installed {
        format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        )
    } else {
        format!(
            "{}:{}:{}",
            bin.display(),
            root.join("usr/bin").display(),
            std::env::var("PATH").unwrap_or_default()
        )
    };
    let adapt = |cmd: &str| -> String {
        let mut c = cmd.replace("6399", &port.to_string());
        if !installed {
            c = match c.as_str() {
                "sudo apt install ./redis-lock_*.deb" => format!(
                    "dpkg-deb -x ./redis-lock_*.deb {r} && sed -i \
                     's|loadmodule /usr/lib/redis/modules/|loadmodule {r}/usr/lib/redis/modules/|' \
                     {r}/etc/redis/modules/redis-lock.conf",
                    r = root.display()
                ),
                "sudo apt purge redis-lock" => format!("rm -rf {}", root.display()),
                _ => c.replace(
                    "/etc/redis/modules/",
                    &format!("{}/etc/redis/modules/", root.display()),
                ),
            };
        } else if let Some(rest) = c.strip_prefix("sudo ") {
            c = format!("DEBIAN_FRONTEND=noninteractive {rest} -y -q -o DPkg::Lock::Timeout=120");
        }
        c
    };
    // One shell for the steps (exports and eval carry over), each step's output framed
    // and checked; the removal of the package runs after the check that the `include`
    // line of the conf block loads the installed module.
    let purge = steps
        .iter()
        .position(|s| s.cmd == "sudo apt purge redis-lock")
        .expect("the quickstart removes the package at the end");
    let env = Env {
        work: &work,
        path: &path,
    };
    run_steps(&env, &steps[..purge], 0, &adapt);

    assert_eq!(conf, ["include /etc/redis/modules/redis-lock.conf"]);
    let snippet = if installed {
        "/etc/redis/modules/redis-lock.conf".to_string()
    } else {
        root.join("etc/redis/modules/redis-lock.conf")
            .display()
            .to_string()
    };
    let server = ServerBuilder::new()
        .no_module()
        .arg("include", &snippet)
        .start();
    assert!(
        modules(&server).iter().any(|m| m == "lock"),
        "the include line of the conf block"
    );
    drop(server);

    run_steps(&env, &steps[purge..], purge, &adapt);
    if !installed {
        assert!(!root.exists(), "the last step removed the package");
    }
    let _ = fs::remove_dir_all(&work);
}

#[test]
fn the_readme_cron_line_holds_the_lock_for_its_period() {
    let readme = fs::read_to_string(repo().join("README.md")).unwrap();
    let cron: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("0 3 * * * redis-lock run"))
        .collect();
    assert!(!cron.is_empty());
    for line in cron {
        assert!(line.contains(" --hold "), "{line}");
    }
}

#[test]
fn doc_links_stay_inside_the_repository() {
    let repo = repo().canonicalize().unwrap();
    let mut files = vec![repo.join("README.md")];
    for dir in ["docs", "client", "clients/python", "clients/node"] {
        if let Ok(entries) = fs::read_dir(repo.join(dir)) {
            files.extend(
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "md")),
            );
        }
    }
    let mut outside = Vec::new();
    for f in &files {
        let text = fs::read_to_string(f).unwrap();
        for (i, _) in text.match_indices("](") {
            let target = text[i + 2..].split([')', '#', ' ']).next().unwrap_or("");
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            // Resolve lexically: the target need not exist to be outside.
            let mut p = f.parent().unwrap().to_path_buf();
            for part in Path::new(target).components() {
                match part {
                    std::path::Component::ParentDir => {
                        p.pop();
                    }
                    std::path::Component::Normal(n) => p.push(n),
                    _ => {}
                }
            }
            if !p.starts_with(&repo) {
                outside.push(format!("{}: {target}", f.display()));
            }
        }
    }
    assert!(
        outside.is_empty(),
        "links outside the repository: {outside:#?}"
    );
}
