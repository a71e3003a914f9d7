//! One cell: N client threads, a connection each, loop acquire → hold c ms → release until
//! the time is up, then finish the attempt they are in (every command is an acquisition's).

use std::sync::{Barrier, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crate::cpu;
use crate::methods::{Client, Family, Method, Scripts};
use crate::stats::{summarize, Acquisition, ClientLog, Role, Rule};
use crate::Error;
use redis_lock_report::contention::{Cell, RoleStats};
use redis_lock_testkit::{info_field, Rng, Server};

/// A client still waiting this long after the cell's end gives up (its wait is reported).
pub const GIVE_UP_AFTER_END: Duration = Duration::from_secs(15);

/// A `redis` connection to the server; a hung call fails the run instead of waiting.
pub fn connect(server: &Server) -> Result<redis::Connection, Error> {
    // TCP_NODELAY, as every client library measured against sets it.
    let info = server.client().get_connection_info().clone();
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    let c = redis::Client::open(info.set_tcp_settings(tcp))?
        .get_connection_with_timeout(Duration::from_secs(5))?;
    c.set_read_timeout(Some(Duration::from_secs(60)))?;
    c.set_write_timeout(Some(Duration::from_secs(10)))?;
    Ok(c)
}

/// One line of a cell's figures (its readers' and writers' too).
pub fn print_row(c: &Cell) {
    let s = &c.summary;
    let group = |name: &str, g: &Option<RoleStats>| {
        g.as_ref().map_or(String::new(), |g| {
            format!(
                "  {name} {:>7.1}/s wait p50 {:.1} p99 {:.1} max {:.1} ms gave up {}",
                g.per_second, g.wait_p50_ms, g.wait_p99_ms, g.wait_max_ms, g.gave_up
            )
        })
    };
    println!(
        "{:<42} {} n={:<3} c={}ms {:>8.1} acq/s{}{}  hand-off p50 {:>7.1} µs p99 {:>8.1} µs (n={}) same {:>3.0}%  wait p99 {:.1} max {:.1} ms  gave up {}  cmds/acq {:.2} rt/acq {:.2}  holders peak {} mean {:.2}  hold {:.2}/{:.1} ms  jain {:.3}  violations {}  overtakes {} (most {})  other procs {:.2} cores  commands: server {} clients {}",
        c.label, c.family, c.clients, c.hold_ms, s.all.per_second,
        group("readers", &s.readers), group("writers", &s.writers),
        s.handoff_p50_us, s.handoff_p99_us, s.handoffs, s.same_client_again * 100.0,
        s.all.wait_p99_ms, s.all.wait_max_ms, s.all.gave_up,
        s.commands_per_acquisition, s.round_trips_per_acquisition, s.peak_holders,
        s.mean_holders, s.hold_mean_ms, s.hold_max_ms, s.all.jain, s.violations, s.overtakes,
        s.overtakes_most, c.other_cores.unwrap_or(f64::NAN), c.server_commands, c.client_commands,
    );
}

/// Who contends in a cell: one role per client, and the permits of a semaphore.
#[derive(Debug, Clone)]
pub struct Shape {
    pub family: Family,
    pub roles: Vec<Role>,
    pub limit: u32,
}

impl Shape {
    /// N clients for one mutex.
    pub fn mutex(n: usize) -> Shape {
        Shape {
            family: Family::Mutex,
            roles: vec![Role::Writer; n],
            limit: 1,
        }
    }

    /// Readers first, then writers (client ids in that order).
    pub fn read_write(readers: usize, writers: usize) -> Shape {
        let mut roles = vec![Role::Reader; readers];
        roles.extend(vec![Role::Writer; writers]);
        Shape {
            family: Family::ReadWrite,
            roles,
            limit: 1,
        }
    }

    pub fn semaphore(n: usize, limit: u32) -> Shape {
        Shape {
            family: Family::Semaphore,
            roles: vec![Role::Permit; n],
            limit,
        }
    }

    fn count(&self, role: Role) -> usize {
        self.roles.iter().filter(|&&r| r == role).count()
    }

    /// What may hold the lock at once with `method` (a mutex method: one, whatever asked).
    pub fn rule(&self, method: Method) -> Rule {
        match (self.family, method) {
            (
                Family::ReadWrite,
                Method::Shared | Method::RwScript | Method::RwScriptWriterFirst,
            ) => Rule::ReadWrite,
            (Family::Semaphore, _) => Rule::Limit(self.limit),
            _ => Rule::Limit(1),
        }
    }
}

/// Where and for how long cells run.
#[derive(Clone, Copy)]
pub struct Bench<'a> {
    pub server: &'a Server,
    pub scripts: &'a Scripts,
    pub duration: Duration,
}

impl Bench<'_> {
    /// A cell: `method`'s clients of `shape`, each holding the lock `hold_ms`; what they
    /// recorded, and what the server and the machine said.
    pub fn cell(&self, method: Method, shape: &Shape, hold_ms: u64) -> Result<Cell, Error> {
        let (server, scripts, duration) = (self.server, self.scripts, self.duration);
        let n = shape.roles.len();
        let key = format!(
            "contention:{}:{}:{n}:{hold_ms}",
            shape.family.id(),
            method.id()
        );
        let mut admin = connect(server)?;
        let _: () = redis::cmd("FLUSHALL").query(&mut admin)?;
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut admin)?;

        // Connect everyone before the clock starts.
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n {
            conns.push(connect(server)?);
        }
        let cpu_before = cpu::sample(server.pid());
        let barrier = Barrier::new(n + 1);
        let start: OnceLock<Instant> = OnceLock::new();
        let logs: Vec<Result<ClientLog, Error>> = thread::scope(|s| {
            let handles: Vec<_> = conns
                .into_iter()
                .zip(&shape.roles)
                .enumerate()
                .map(|(i, (conn, &role))| {
                    let (barrier, start, key) = (&barrier, &start, key.as_str());
                    s.spawn(move || {
                        let mut client = Client {
                            conn,
                            method,
                            key,
                            signal_key: format!("lock-signal:{key}"),
                            scripts,
                            rng: Rng::new(i as u64 + 1),
                            name: format!("c{i}"),
                            serial: 0,
                            role,
                            limit: shape.limit,
                            commands: 0,
                            round_trips: 0,
                            first_sent: None,
                        };
                        barrier.wait();
                        let start = *start.get().ok_or("start time not set")?;
                        client_loop(&mut client, i, start, duration, hold_ms)
                    })
                })
                .collect();
            let _ = start.set(Instant::now());
            barrier.wait();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("client thread panicked".into()))
                })
                .collect()
        });
        let cpu_after = cpu::sample(server.pid());
        let logs: Vec<ClientLog> = logs.into_iter().collect::<Result<_, _>>()?;
        let sem = shape.family == Family::Semaphore;
        Ok(Cell {
            family: shape.family.id().to_string(),
            method: method.id().to_string(),
            label: method.label(shape.family).to_string(),
            readers: shape.count(Role::Reader),
            writers: shape.count(Role::Writer) * usize::from(shape.family != Family::Mutex),
            clients: n,
            limit: sem.then_some(shape.limit),
            hold_ms,
            summary: summarize(&logs, &shape.roles, shape.rule(method)),
            server_commands: command_calls(&mut admin, method.sent_commands())?,
            client_commands: logs.iter().map(|l| l.commands).sum(),
            other_cores: cpu_before
                .zip(cpu_after)
                .map(|(a, b)| cpu::other_cores(a, b)),
        })
    }
}

fn client_loop(
    client: &mut Client<'_>,
    id: usize,
    start: Instant,
    duration: Duration,
    hold_ms: u64,
) -> Result<ClientLog, Error> {
    let ns = |t: Instant| t.duration_since(start).as_nanos() as u64;
    let end = start + duration;
    let give_up = end + GIVE_UP_AFTER_END;
    let mut log = ClientLog::default();
    while Instant::now() < end {
        let wanted = Instant::now();
        let Some(token) = client.acquire(give_up)? else {
            log.gave_up_after = Some(ns(Instant::now()) - ns(wanted));
            break;
        };
        let granted = Instant::now();
        let asked = client.first_sent.unwrap_or(wanted);
        if hold_ms > 0 {
            thread::sleep(Duration::from_millis(hold_ms));
        }
        let releasing = Instant::now();
        client.release(&token)?;
        let released = Instant::now();
        log.acquisitions.push(Acquisition {
            client: id,
            wanted: ns(wanted),
            asked: ns(asked),
            granted: ns(granted),
            releasing: ns(releasing),
            released: ns(released),
        });
    }
    log.commands = client.commands;
    log.round_trips = client.round_trips;
    Ok(log)
}

/// Sum of `calls` over the commands clients send (`sent`), from INFO commandstats
/// (commands run inside scripts have their own entries and are not counted).
fn command_calls(admin: &mut redis::Connection, sent: &[&str]) -> Result<u64, Error> {
    let text: String = redis::cmd("INFO").arg("commandstats").query(admin)?;
    let calls = |name: &&str| -> Result<u64, Error> {
        let Some(stats) = info_field(&text, &format!("cmdstat_{name}")) else {
            return Ok(0);
        };
        let calls = stats.split(',').find_map(|f| f.strip_prefix("calls="));
        let calls = calls.and_then(|v| v.trim().parse().ok());
        calls.ok_or_else(|| format!("no calls= in cmdstat_{name}:{stats}").into())
    };
    sent.iter().map(calls).sum()
}
