//! The stale holder (Kleppmann's pause): a holder process is SIGSTOPped for twice its TTL
//! between its lease check and its write while another client takes the lock and writes;
//! the fenced store (scripts/reliability/fenced_store.lua) must refuse the stale write,
//! the plain control shows the corruption.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
pub use redis_lock_report::reliability::FENCED_STORE_LUA;

/// How long the holder waits between its lease check and its write (the window in
/// which it is stopped).
const WINDOW_MS: u64 = 150;

/// A write of the fenced store (`sha`: its script), or a plain one: accepted or not.
fn store_write(
    c: &mut Conn,
    fenced: bool,
    sha: &str,
    rkey: &str,
    fence: u64,
    value: &str,
) -> Result<bool, String> {
    let r = match fenced {
        true => cmd(c, &args!["EVALSHA", sha, 1u64, rkey, fence, value])?,
        false => cmd(c, &args!["HSET", rkey, "value", value, "fence", fence])?,
    };
    match (fenced, &r) {
        (true, Reply::Int(1)) | (false, Reply::Int(_)) => Ok(true),
        (true, Reply::Int(0)) => Ok(false),
        _ => Err(format!("store write answered {r:?}")),
    }
}

/// The holder process: `stale-holder LOCK_ADDR STORE_ADDR KEY RKEY TTL MODE SHA`.
pub fn holder_main(a: &[String]) -> ExitCode {
    match holder(a) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            println!("ERROR {e}");
            ExitCode::from(1)
        }
    }
}

fn holder(a: &[String]) -> Result<(), String> {
    let [lock, store, key, rkey, ttl, mode, sha] = a else {
        return Err("usage: stale-holder LOCK STORE KEY RKEY TTL fenced|plain SHA".into());
    };
    let lock: SocketAddr = lock.parse().map_err(|_| "bad lock address")?;
    let store: SocketAddr = store.parse().map_err(|_| "bad store address")?;
    let ttl: u64 = ttl.parse().map_err(|_| "bad ttl")?;
    let fenced = mode == "fenced";
    let t = Duration::from_secs(5);
    let mut lc = Conn::open(lock, t).map_err(|e| e.to_string())?;
    let mut sc = Conn::open(store, t).map_err(|e| e.to_string())?;
    let acquired = Instant::now();
    let (_, fence) = acquire(&mut lc, key, ttl)?;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "GRANTED {fence}");
    // Read-modify-write: read, check the lease, (pause here), write.
    cmd(&mut sc, &args!["HGET", rkey, "value"])?;
    if acquired.elapsed() >= Duration::from_millis(ttl) {
        return Err("lease already over before the pause".into());
    }
    // Timed from before the parent can see CHECKED (and stop us).
    let checked = Instant::now();
    let _ = writeln!(out, "CHECKED");
    let _ = out.flush();
    std::thread::sleep(Duration::from_millis(WINDOW_MS));
    let value = format!("holder-{fence}");
    let ok = store_write(&mut sc, fenced, sha, rkey, fence, &value)?;
    let verdict = if ok { "accepted" } else { "rejected" };
    let ms = checked.elapsed();
    let _ = writeln!(out, "WROTE {verdict} {}", ms.as_millis());
    Ok(())
}

fn read_line(r: &mut BufReader<std::process::ChildStdout>) -> Result<String, String> {
    let mut l = String::new();
    r.read_line(&mut l).map_err(|e| e.to_string())?;
    if l.is_empty() {
        return Err("holder exited early".into());
    }
    if let Some(e) = l.strip_prefix("ERROR ") {
        return Err(format!("holder: {}", e.trim()));
    }
    Ok(l.trim().to_string())
}

struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One pause: whether the stale write was accepted and the newer data lost; None when the
/// stop did not land between the holder's check and its write.
type Trial = Option<(bool, bool)>;

fn trial(
    env: &Env,
    [lock, store]: [&Server; 2],
    mode: &str,
    sha: &str,
    i: u64,
    ttl: u64,
) -> Result<Trial, String> {
    let key = format!("rel:stale:{i}:{mode}");
    let rkey = format!("resource:{i}:{mode}");
    let child = Command::new(&env.exe)
        .arg("stale-holder")
        .arg(lock.socket_addr().to_string())
        .arg(store.socket_addr().to_string())
        .args([&key, &rkey, &ttl.to_string(), mode, sha])
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn holder: {e}"))?;
    let mut child = KillOnDrop(child);
    let pid = child.0.id();
    let mut out = BufReader::new(child.0.stdout.take().ok_or("no stdout")?);
    let granted = read_line(&mut out)?;
    let fence = granted
        .strip_prefix("GRANTED ")
        .and_then(|f| f.parse::<u64>().ok());
    let holder_fence = fence.ok_or(format!("holder said {granted:?}"))?;
    let checked = read_line(&mut out)?;
    if checked != "CHECKED" {
        return Err(format!("holder said {checked:?}"));
    }
    redis_lock_testkit::signal(pid, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(2 * ttl));
    // The lease is over: another client takes the lock and writes.
    let (mut lc, mut sc) = (connect(lock)?, connect(store)?);
    let (token, fence) = acquire(&mut lc, &key, 10_000)
        .map_err(|e| format!("second client could not acquire after 2x TTL: {e}"))?;
    if fence <= holder_fence {
        return Err(format!(
            "new fence {fence} not above the paused holder's {holder_fence}"
        ));
    }
    let newer = format!("newer-{fence}");
    if !store_write(&mut sc, mode == "fenced", sha, &rkey, fence, &newer)? {
        return Err("the current holder's write was refused".into());
    }
    redis_lock_testkit::signal(pid, libc::SIGCONT);
    let wrote = read_line(&mut out)?;
    let mut parts = wrote.split_whitespace();
    let (tag, verdict, elapsed) = (parts.next(), parts.next(), parts.next());
    if tag != Some("WROTE") {
        return Err(format!("holder said {wrote:?}"));
    }
    let elapsed: u64 = elapsed.and_then(|e| e.parse().ok()).unwrap_or(0);
    let _ = child.0.wait();
    let value = cmd(&mut sc, &args!["HGET", &rkey, "value"])?.as_text();
    let _ = lc.call(&args!["LOCK.RELEASE", &key, &token]);
    // The stop must have landed between the check and the write.
    let lost = value.unwrap_or_default() != newer;
    Ok((elapsed >= 2 * ttl).then_some((verdict == Some("accepted"), lost)))
}

pub const TITLE: &str = "Stale holder (SIGSTOP for 2x TTL, Kleppmann's pause)";
pub const TARGET: &str =
    "fenced store refuses 100% of stale writes; the unfenced control shows the corruption";

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    let lock = env.start("stale-lock")?;
    let store = env.builder("stale-store").no_module().try_start()?;
    let sha = cmd(
        &mut connect(&store)?,
        &args!["SCRIPT", "LOAD", FENCED_STORE_LUA],
    )?;
    let sha = sha.as_text().ok_or("SCRIPT LOAD failed")?;
    let trials = env.n(20.0, 3.0);
    let ttl = if env.short { 200 } else { 300 };
    // Per mode: valid runs, stale writes accepted, runs corrupted, runs discarded.
    let mut stats = [(0u64, 0u64, 0u64, 0u64); 2];
    for (st, mode) in stats.iter_mut().zip(["fenced", "plain"]) {
        let mut attempts = 0;
        while st.0 < trials && attempts < trials * 3 {
            attempts += 1;
            match trial(env, [&lock, &store], mode, &sha, attempts, ttl)? {
                None => st.3 += 1,
                Some((stale, lost)) => {
                    st.0 += 1;
                    st.1 += u64::from(stale);
                    st.2 += u64::from(lost);
                }
            }
        }
    }
    let (fv, fa, fc, _) = stats[0];
    let (pv, _, pc, _) = stats[1];
    o.put("ttl", ttl);
    o.put("fenced", stats[0]);
    o.put("plain", stats[1]);
    o.fail_if(
        fv == 0 || fa > 0 || fc > 0,
        format!("fenced store accepted {fa} of {fv} stale writes"),
    );
    o.fail_if(
        pv == 0 || pc == 0,
        "the control run did not show the corruption (the pause did not take effect)",
    );
    o.healthy(&lock, "the lock server");
    Ok(())
}
