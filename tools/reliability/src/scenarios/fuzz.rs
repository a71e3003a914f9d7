//! Bad input: (a) a live fuzzer of random and malformed commands, PINGing after every
//! batch; (b) hostile RESTORE payloads (real lock DUMPs mutated, CRC64 fixed, so they
//! reach the module's rdb_load); (c) `cargo fuzz` on the argument parser (full run).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crc::{Crc, CRC_64_REDIS};

use crate::common::*;

const BATCH: u64 = 100;
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// The module's command names (some in other cases), and other commands that touch keys.
const NAMES: &str = "LOCK.ACQUIRE LOCK.RELEASE LOCK.EXTEND LOCK.INFO LOCK.FORCERELEASE LOCK.SYNC
    LOCK.DEBUG lock.acquire Lock.Extend";
const OTHERS: &str = "GET SET DEL TYPE DUMP PEXPIRE PERSIST RENAME COPY LPUSH EXPIRE PEXPIREAT
    UNLINK GETDEL OBJECT MEMORY";

/// One word of a list such as [`NAMES`].
fn word(rng: &mut Rng, list: &str) -> Vec<u8> {
    rng.pick(&words(list)).as_bytes().to_vec()
}
const OPTIONS: &[&str] = &[
    "PX", "EX", "TOKEN", "OWNER", "BLOCK", "MINFENCE", "px", "Ex", "token", "BLOCK", "NX", "",
];
/// Edge-case integers and near-integers; and those with spaces, and the empty one.
const NUMBERS: &str = "0 1 -1 2 50 1000 30000 86400000 86400001 9223372036854775807
    9223372036854775806 -9223372036854775808 9223372036854775808 18446744073709551616 1e3
    +5 05 0x10 1.5 -0 99999999999999999999999";
const SPACED: [&str; 3] = [" 5", "5 ", ""];

fn key(rng: &mut Rng) -> Vec<u8> {
    match rng.below(20) {
        0 => Vec::new(),
        1 => rng.bytes_in(1, 40),
        2 => vec![b'k'; 2000],
        _ => format!("fz:{}", rng.below(8)).into_bytes(),
    }
}

fn value(rng: &mut Rng) -> Vec<u8> {
    match rng.below(10) {
        0 => rng.pick(&SPACED).as_bytes().to_vec(),
        1..=3 => word(rng, NUMBERS),
        4 => rng.next_u64().to_string().into_bytes(),
        5 => format!("-{}", rng.below(1 << 40)).into_bytes(),
        6 => rng.bytes_in(0, 300),
        7 if rng.chance(10) => rng.bytes_in(10_000, 100_000),
        7 => b"\r\n\0*3\r\n$".to_vec(),
        _ => rng.pick(OPTIONS).as_bytes().to_vec(),
    }
}

/// Keeps the fuzzer from asking for long waits: any BLOCK value a parser might accept
/// as a wait longer than 50 ms (or 0 = forever) becomes 1..50 or garbage.
fn tame_block(a: &mut [Vec<u8>], rng: &mut Rng) {
    for i in 1..a.len() {
        let digits = !a[i].is_empty() && a[i].iter().all(u8::is_ascii_digit);
        let n: Option<u64> = std::str::from_utf8(&a[i]).ok().and_then(|s| s.parse().ok());
        if a[i - 1].eq_ignore_ascii_case(b"BLOCK") && digits && !matches!(n, Some(1..=50)) {
            a[i] = if rng.chance(50) {
                rng.range(1, 50).to_string().into_bytes()
            } else {
                b"-5".to_vec()
            };
        }
    }
}

/// A well-formed lock command with random values, so that grants, renewals, waits,
/// hand-offs, extends and releases happen between the malformed ones.
fn structured(rng: &mut Rng) -> Vec<Vec<u8>> {
    let k = format!("fz:{}", rng.below(8));
    let tokens = words("t1 fuzz-token-00002 fuzz-token-00003 fuzz-token-00004");
    let tok = *rng.pick(&tokens);
    match rng.below(6) {
        0 | 1 => {
            let mut a = args!["LOCK.ACQUIRE", k];
            if rng.chance(70) {
                a.extend(args!["PX", rng.range(1, 3000)]);
            }
            if rng.chance(60) {
                a.extend(args!["TOKEN", tok]);
            }
            if rng.chance(20) {
                a.extend(args!["OWNER", rng.bytes_in(1, 40)]);
            }
            if rng.chance(15) {
                a.extend(args!["BLOCK", rng.range(1, 50)]);
            }
            if rng.chance(10) {
                a.extend(args!["MINFENCE", rng.next_u64() >> rng.below(64)]);
            }
            a
        }
        2 => args!["LOCK.RELEASE", k, tok],
        3 => args!["LOCK.EXTEND", k, tok, "PX", rng.range(1, 3000)],
        4 => args!["LOCK.INFO", k],
        _ => args!["LOCK.FORCERELEASE", k],
    }
}

fn command(rng: &mut Rng) -> Vec<Vec<u8>> {
    let mut a: Vec<Vec<u8>> = Vec::new();
    match rng.below(100) {
        0..=29 => a = structured(rng),
        30..=79 => {
            a.push(word(rng, NAMES));
            if rng.chance(95) {
                a.push(key(rng));
            }
            for _ in 0..rng.below(11) {
                a.push(if rng.chance(45) {
                    rng.pick(OPTIONS).as_bytes().to_vec()
                } else {
                    value(rng)
                });
            }
        }
        80..=91 => {
            a.push(word(rng, OTHERS));
            a.push(key(rng));
            for _ in 0..rng.below(4) {
                a.push(value(rng));
            }
        }
        92..=95 => {
            let k = words("lock.default-ttl lock.max-ttl lock.max-waiters")[rng.below(3) as usize];
            a.extend(args!["CONFIG", "SET", k, value(rng)]);
        }
        _ => {
            a.push(rng.bytes_in(1, 20));
            for _ in 0..rng.below(5) {
                a.push(value(rng));
            }
        }
    }
    tame_block(&mut a, rng);
    a
}

/// Broken protocol; a ninth of the time random bytes instead.
const MALFORMED: [&[u8]; 8] = [
    b"*-5\r\n",
    b"*2\r\n$12\r\nLOCK.ACQUIRE\r\n$-1\r\n",
    b"*2\r\n$12\r\nLOCK.ACQUIRE\r\n$999999999999\r\n",
    b"*3\r\n$12\r\nLOCK.ACQUIRE\r\n$4\r\nfz:1\r\n$2\r\nPX",
    b"LOCK.ACQUIRE fz:2 PX \"unterminated\r\n",
    b"*1\r\n$x\r\n",
    b"*100000000\r\n",
    b"*4\r\n$12\r\nLOCK.ACQUIRE\r\n$4\r\nfz:3\r\n$5\r\nBLOCK\r\n",
];

fn malformed(rng: &mut Rng) -> Vec<u8> {
    let mut v = match rng.below(9) as usize {
        7 => rng.bytes_in(1, 2000),
        i => MALFORMED[i.min(7)].to_vec(),
    };
    if rng.chance(20) {
        v.extend(rng.bytes(64));
    }
    v
}

/// What a fuzzing connection (or the RESTORE run) saw: commands (payloads), error replies
/// (refused payloads), restored keys that behaved as locks.
#[derive(Default, serde::Serialize)]
struct Tally {
    n: u64,
    malformed: u64,
    errors: u64,
    checked: u64,
    hangs: u64,
    crash: Option<String>,
}

impl Tally {
    fn add(&mut self, o: Tally) {
        (self.n, self.malformed) = (self.n + o.n, self.malformed + o.malformed);
        (self.errors, self.checked) = (self.errors + o.errors, self.checked + o.checked);
        self.hangs += o.hangs;
        self.crash = self.crash.take().or(o.crash);
    }
}

fn ping(c: &mut Conn) -> bool {
    c.try_set_read_timeout(Some(PING_TIMEOUT)).is_ok()
        && c.call(&args!["PING"])
            .is_ok_and(|r| r == Reply::Simple("PONG".into()))
}

const WORKERS: u64 = 4;

/// The server after a batch whose replies came (`answered`) or not must answer a PING
/// within 5 s: Ok(false); Ok(true): a hang, `c` is a new connection that answers; Err: a
/// crash (dead, or alive but not answering a new connection).
fn watch(
    c: &mut Conn,
    answered: bool,
    addr: std::net::SocketAddr,
    pid: Option<u32>,
) -> Result<bool, String> {
    if answered && ping(c) {
        return Ok(false);
    }
    if !pid.is_some_and(|p| redis_lock_testkit::signal(p, 0)) {
        return Err("server died".into());
    }
    let mut n = Conn::open(addr, PING_TIMEOUT)
        .map_err(|_| "server alive but not accepting connections".to_string())?;
    if !ping(&mut n) {
        return Err("server alive but not answering PING".into());
    }
    *c = n;
    Ok(true)
}

/// One fuzzing connection: batches of commands, then a PING.
fn live_worker(addr: std::net::SocketAddr, pid: Option<u32>, total: u64, mut rng: Rng) -> Tally {
    let mut st = Tally::default();
    let connect = || Conn::open(addr, PING_TIMEOUT);
    let Ok(mut c) = connect() else {
        st.crash = Some("cannot connect".into());
        return st;
    };
    while st.n < total {
        if rng.chance(30) {
            // Malformed protocol on a throw-away connection (the server closes it).
            if let Ok(mut junk) = connect() {
                junk.queue_raw(&malformed(&mut rng));
                let _ = junk.flush();
                let _ = junk.try_set_read_timeout(Some(Duration::from_millis(50)));
                let _ = junk.read();
            }
            st.malformed += 1;
            st.n += 1;
        }
        let cmds: Vec<Vec<Vec<u8>>> = (0..BATCH).map(|_| command(&mut rng)).collect();
        for a in &cmds {
            c.queue(a);
        }
        let sent = c.flush();
        let _ = c.try_set_read_timeout(Some(PING_TIMEOUT));
        // Every reply, counting the errors; the first read that fails ends the batch.
        let answered = sent.is_ok()
            && cmds.iter().all(|_| {
                c.read()
                    .map(|r| st.errors += u64::from(r.is_error()))
                    .is_ok()
            });
        st.n += BATCH;
        match watch(&mut c, answered, addr, pid) {
            Ok(hang) => st.hangs += u64::from(hang),
            Err(e) => st.crash = Some(e),
        }
        // A crash ends the run; ten hangs are enough evidence, the rest would only wait.
        if st.crash.is_some() || st.hangs >= 10 {
            break;
        }
    }
    st
}

fn live(server: &Server, total: u64, rng: &mut Rng) -> Result<Tally, String> {
    let addr = server.socket_addr();
    let pid = server.try_pid();
    let handles: Vec<_> = (0..WORKERS)
        .map(|i| {
            let r = rng.fork(i);
            std::thread::spawn(move || live_worker(addr, pid, total.div_ceil(WORKERS), r))
        })
        .collect();
    let mut st = Tally::default();
    joined(handles.into_iter().map(|h| h.join()))?
        .into_iter()
        .for_each(|t| st.add(t));
    Ok(st)
}

fn with_crc(body: &[u8]) -> Vec<u8> {
    let crc = Crc::<u64>::new(&CRC_64_REDIS).checksum(body);
    let mut p = body.to_vec();
    p.extend_from_slice(&crc.to_le_bytes());
    p
}

pub fn mutate(base: &[u8], rng: &mut Rng) -> Vec<u8> {
    // DUMP: [type][module id: 8][module section ...][EOF][rdb version: 2][crc64: 8]
    let body = &base[..base.len() - 8];
    let (head, rest) = body.split_at(9);
    let (section, version) = rest.split_at(rest.len() - 2);
    let mut s = section.to_vec();
    let rounds = rng.range(1, 4);
    for _ in 0..rounds {
        if s.is_empty() {
            s.push(rng.next_u64() as u8);
            continue;
        }
        let at = rng.below(s.len() as u64) as usize;
        match rng.below(8) {
            0 => s[at] ^= 1 << rng.below(8),
            1 => s[at] = rng.next_u64() as u8,
            2 => s[at] = *rng.pick(&[0x00, 0xFF, 0x80, 0xC0, 0x7F, 0x3F]),
            3 => s.truncate(at),
            4 => {
                let extra = rng.bytes_in(1, 16);
                s.splice(at..at, extra);
            }
            5 => {
                // A 32-bit or 64-bit length encoding claiming a huge size.
                let big: &[u8] = if rng.chance(50) {
                    &[0x80, 0xFF, 0xFF, 0xFF, 0xF0]
                } else {
                    &[0x81, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00]
                };
                s.splice(at..(at + 1).min(s.len()), big.iter().copied());
            }
            6 => {
                let end = (at + rng.range(1, 16) as usize).min(s.len());
                let chunk = s[at..end].to_vec();
                s.splice(at..at, chunk);
            }
            _ => {
                let end = (at + rng.range(1, 8) as usize).min(s.len());
                s.drain(at..end);
            }
        }
    }
    let mut out = head.to_vec();
    out.extend(s);
    out.extend_from_slice(version);
    with_crc(&out)
}

fn restore(server: &Server, total: u64, rng: &mut Rng) -> Result<Tally, String> {
    let mut st = Tally::default();
    let mut c = connect(server)?;
    // The live fuzzer may have changed the settings. One CONFIG SET for all of them: the
    // module checks default-ttl <= max-ttl after all of a command's values are set, while
    // two separate commands could each be refused against a fuzzed value of the other.
    let defaults = "CONFIG SET lock.max-ttl 86400000 lock.default-ttl 30000 lock.max-waiters 10000";
    must(&mut c, &words(defaults))?;
    // Real payloads of several shapes: with and without OWNER, 256-byte TOKEN and OWNER.
    let mut bases = Vec::new();
    let (token, owner) = ("x".repeat(256), "o".repeat(256));
    let shapes: [&[&str]; 4] = [
        &[],
        &["OWNER", "worker-7"],
        &["TOKEN", &token],
        &["TOKEN", "a-16-byte-token!", "OWNER", &owner],
    ];
    for (i, extra) in shapes.iter().enumerate() {
        let key = format!("fz:base:{i}");
        let mut a = args!["LOCK.ACQUIRE", &key, "PX", 600_000u64];
        a.extend(extra.iter().map(|x| x.as_bytes().to_vec()));
        grant(&mut c, &a)?;
        let d = cmd(&mut c, &args!["DUMP", &key])?;
        let d = d.as_bytes().filter(|d| d.len() >= 20);
        bases.push(d.ok_or("DUMP of a lock too short or none")?.to_vec());
    }
    // Our CRC must be the server's: an unmutated payload re-signed must load.
    let resigned = with_crc(&bases[0][..bases[0].len() - 8]);
    if resigned != bases[0] {
        return Err("CRC64 (crc::CRC_64_REDIS) does not match the server's DUMP checksum".into());
    }
    let mut i = 0u64;
    while i < total && st.crash.is_none() {
        let base = &bases[rng.below(bases.len() as u64) as usize];
        let payload = mutate(base, rng);
        let key = format!("fz:restore:{}", i % 64);
        (i, st.n) = (i + 1, st.n + 1);
        let r = c.call(&args!["RESTORE", &key, 0u64, &payload, "REPLACE"]);
        match r {
            Ok(Reply::Simple(_)) => {
                // Whatever loaded must behave as a lock.
                let checks = [
                    args!["LOCK.INFO", &key],
                    args!["DUMP", &key],
                    args!["LOCK.EXTEND", &key, "not-the-token", "PX", 1000u64],
                    args!["LOCK.ACQUIRE", &key, "PX", 1000u64],
                    args!["DEL", &key],
                ];
                match c.pipeline(&checks) {
                    Ok(replies) if !replies[0].is_error() => st.checked += 1,
                    Ok(replies) => {
                        st.crash =
                            Some(format!("a restored lock broke LOCK.INFO: {:?}", replies[0]))
                    }
                    Err(_) => {}
                }
            }
            Ok(_) => st.errors += 1,
            Err(_) => {}
        }
        let check = i.is_multiple_of(BATCH)
            || st.crash.is_some()
            || c.try_set_read_timeout(Some(PING_TIMEOUT)).is_err();
        if check {
            match watch(&mut c, true, server.socket_addr(), server.try_pid()) {
                Ok(hang) => st.hangs += u64::from(hang),
                Err(e) => {
                    let n = payload.len();
                    st.crash = Some(format!("{e} on a RESTORE payload ({n} bytes)"));
                }
            }
        }
    }
    Ok(st)
}

/// Runs the cargo-fuzz target for `secs`; Ok((executions, crashed)) or Err(why not run).
fn cargo_fuzz(repo: &Path, secs: u64) -> Result<(u64, Option<String>), String> {
    if redis_lock_testkit::run_cmd(&["cargo", "fuzz", "--version"]).is_err() {
        return Err("cargo-fuzz is not installed (bash scripts/deps-reliability.sh --fuzz)".into());
    }
    let fuzz_dir = repo.join("tools/reliability/fuzz");
    let log = repo.join("target/reliability/cargo-fuzz.log");
    let _ = std::fs::create_dir_all(repo.join("target/reliability"));
    let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let status = Command::new("cargo")
        .current_dir(repo)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_TARGET_DIR", repo.join("target/reliability/fuzz"))
        .args(["fuzz", "run", "parse_args", "--fuzz-dir"])
        .arg(&fuzz_dir)
        .args(["--", "-print_final_stats=1", "-rss_limit_mb=2048"])
        .arg(format!("-max_total_time={secs}"))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .map_err(|e| format!("cargo fuzz: {e}"))?;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let execs = text
        .lines()
        .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
        .and_then(|v| v.trim().parse::<u64>().ok());
    match execs {
        Some(n) if status.success() => Ok((n, None)),
        Some(n) => Ok((
            n,
            Some(format!("cargo fuzz found a failure; see {}", log.display())),
        )),
        None => Err(format!(
            "cargo fuzz did not run ({status}); last lines of {}:\n{}",
            log.display(),
            redis_lock_testkit::server::file_tail(&log, 8)
        )),
    }
}

pub const TITLE: &str = "Bad input (live fuzzer, hostile RESTORE payloads, cargo fuzz)";
pub const TARGET: &str =
    "0 crashes, 0 hangs in >= 100,000 commands; hostile RESTORE refused without a crash";

pub fn run(env: &Env, o: &mut Outcome) -> Result<(), String> {
    let mut rng = Rng::new(env.seed ^ 0x6675_7a7a);
    let mut server = env.start("fuzz")?;
    let t = Instant::now();
    let mut lv = live(&server, env.n(300_000.0, 20_000.0), &mut rng)?;
    let live_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let mut rs = if lv.crash.is_none() {
        restore(&server, env.n(20_000.0, 3_000.0), &mut rng)?
    } else {
        Tally::default()
    };
    let restore_secs = t.elapsed().as_secs_f64();
    let caught = if server.is_running() {
        panics(&server)
    } else {
        for crash in [&mut lv.crash, &mut rs.crash].into_iter().flatten() {
            crash.push_str(&format!("\n{}", server.log_tail()));
        }
        None
    };
    let hangs = lv.hangs + rs.hangs;
    o.put("live", (&lv, live_secs));
    o.put("restore", (&rs, restore_secs));
    o.put("shape", (WORKERS, BATCH));
    o.put("caught", caught);
    for (what, crash) in [("live fuzzer", &lv.crash), ("RESTORE", &rs.crash)] {
        if let Some(c) = crash {
            o.fail(format!("{what}: {c}"));
        }
    }
    let ping = PING_TIMEOUT.as_secs();
    o.fail_if(
        hangs > 0,
        format!("{hangs} batches without a reply within {ping} s"),
    );
    let panicked = format!("{caught:?} Rust panics caught (each is a bug, though not a crash)");
    o.fail_if(caught.is_some_and(|n| n > 0), panicked);
    // cargo fuzz: (executions, failure) or why it did not run; not part of a short run.
    let fuzzed = match env.short {
        true => Err("not part of the short run".to_string()),
        false => cargo_fuzz(&env.repo, env.secs(90.0, 10.0).as_secs()),
    };
    if let Ok((n, Some(e))) = &fuzzed {
        o.fail(format!(
            "cargo fuzz after {} executions: {e}",
            thousands(*n)
        ));
    }
    o.put("cargo_fuzz", fuzzed);
    Ok(())
}
