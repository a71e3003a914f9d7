//! `redis-lock-testkit serve` ([`USAGE`]): the kit's servers for the Python and Node suites.
//! `SERVER-ARGS` (`--name value...`) go to every server. Once up it prints one JSON line,
//! `{"servers":[{"port":P,"pid":N,"dir":"..."},...]}`, then answers each stdin command
//! (`stop I`, `cont I`, `kill I`, `restart I` of member I) with `{"ok":true,"pid":N}` or
//! `{"error":"..."}`. Every server goes (killed, directory removed) when stdin closes, on
//! SIGTERM/SIGINT/SIGHUP, when the starting process dies, or after `--secs` (default 3600).

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use redis_lock_testkit::{signal, Cluster, ReplicaPair, Server, ServerBuilder};

const USAGE: &str = "usage: redis-lock-testkit serve [--server BIN] [--module SO | --no-module] \
    [--module-arg A]... [--secs N] single | pair | cluster N | servers N [-- SERVER-ARGS...]";

static QUIT: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    QUIT.store(true, Ordering::SeqCst);
}

fn value(it: &mut impl Iterator<Item = String>, flag: &str) -> Result<String, String> {
    it.next()
        .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
}

fn path(p: String) -> Result<PathBuf, String> {
    std::path::absolute(&p).map_err(|e| format!("{p}: {e}"))
}

/// The command line: the servers' builder, `--secs`, the topology and its N.
fn parse(args: Vec<String>) -> Result<(ServerBuilder, u64, String, usize), String> {
    let mut it = args.into_iter();
    if it.next().as_deref() != Some("serve") {
        return Err(USAGE.into());
    }
    let (mut b, mut secs, mut words) = (ServerBuilder::new().die_with_parent(), 3600, vec![]);
    while let Some(a) = it.next() {
        match a.as_str() {
            // Absolute, as servers run in their own directory (links kept: a server
            // binary may act on the name it was called by).
            "--server" => b = b.bin(path(value(&mut it, &a)?)?),
            "--module" => b = b.module(&path(value(&mut it, &a)?)?),
            "--no-module" => b = b.no_module(),
            "--module-arg" => b = b.module_args(&[&value(&mut it, &a)?]),
            "--secs" => secs = value(&mut it, &a)?.parse().map_err(|_| USAGE)?,
            "--" => break,
            _ => words.push(a),
        }
    }
    // The server's own options: each `--name` with the values up to the next `--name`.
    let rest: Vec<String> = it.collect();
    for (i, name) in rest.iter().enumerate().filter(|(_, a)| a.starts_with("--")) {
        let vals = rest[i + 1..].iter().take_while(|v| !v.starts_with("--"));
        b = b.arg_multi(name, &vals.map(String::as_str).collect::<Vec<_>>());
    }
    let n = match words.get(1).map(|n| n.parse::<usize>()) {
        None => 1,
        Some(Ok(n)) if n > 0 => n,
        _ => return Err(USAGE.into()),
    };
    let topology = words.first().cloned().ok_or(USAGE)?;
    Ok((b, secs, topology, n))
}

fn start(builder: &ServerBuilder, topology: &str, n: usize) -> Result<Vec<Server>, String> {
    let b = || builder.clone();
    match topology {
        "single" => Ok(vec![b().try_start()?]),
        "servers" => (0..n).map(|_| b().try_start()).collect(),
        "pair" => {
            let pair = ReplicaPair::try_start_with(b(), b())?;
            Ok(vec![pair.primary, pair.replica])
        }
        "cluster" => Ok(Cluster::try_start_with(n, |_| b())?.nodes),
        _ => Err(USAGE.into()),
    }
}

fn json_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// One command of stdin applied to `servers`: the pid of the member afterwards.
fn apply(servers: &mut [Server], line: &str) -> Result<u32, String> {
    let (op, i) = line.trim().split_once(' ').ok_or("expected `OP INDEX`")?;
    let index = i.trim().parse::<usize>().ok();
    let member = index.and_then(|i| servers.get_mut(i));
    let s = member.ok_or_else(|| format!("no member {i}"))?;
    // Never signal pid 0 (that would be our own process group).
    let pid = s.try_pid().filter(|_| s.is_running());
    match (op, pid) {
        ("stop", Some(pid)) => _ = signal(pid, libc::SIGSTOP),
        ("cont", Some(pid)) => _ = signal(pid, libc::SIGCONT),
        ("kill" | "restart", pid) => {
            pid.map(|pid| signal(pid, libc::SIGCONT));
            s.kill9();
            if op == "restart" {
                s.try_restart()?;
            }
        }
        ("stop" | "cont", None) => return Err(format!("member {i} is not running")),
        _ => {
            return Err(format!(
                "unknown command {op:?} (stop, cont, kill, restart)"
            ))
        }
    }
    Ok(s.try_pid().unwrap_or(0))
}

fn main() {
    let (builder, secs, topology, n) =
        parse(std::env::args().skip(1).collect()).unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        });
    // SAFETY: a handler that only stores an atomic; prctl asks for SIGTERM when the
    // process that started us dies (stdin may stay open in a grandchild).
    unsafe {
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
    }
    let mut servers = start(&builder, &topology, n).unwrap_or_else(|e| {
        eprintln!("redis-lock-testkit serve: {e}");
        std::process::exit(1)
    });
    let members: Vec<String> = (servers.iter())
        .map(|s| {
            let (port, pid, dir) = (s.port, s.pid(), s.dir.to_string_lossy());
            format!(
                "{{\"port\":{port},\"pid\":{pid},\"dir\":{}}}",
                json_str(&dir)
            )
        })
        .collect();
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{{\"servers\":[{}]}}", members.join(","));
    let _ = out.flush();
    // Lines of stdin, `None` at its end.
    let (tx, rx) = mpsc::channel::<Option<String>>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(Result::ok) {
            let _ = tx.send(Some(line));
        }
        let _ = tx.send(None);
    });
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !QUIT.load(Ordering::SeqCst) && Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Some(line)) => {
                let reply = match apply(&mut servers, &line) {
                    Ok(pid) => format!("{{\"ok\":true,\"pid\":{pid}}}"),
                    Err(e) => format!("{{\"error\":{}}}", json_str(&e)),
                };
                let _ = writeln!(out, "{reply}");
                let _ = out.flush();
            }
            Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    // Dropping a server kills it and removes the directory it made.
    drop(servers);
}
