//! `make bench-cluster` (issue 27): what a cluster sustains, and what the fence exchange
//! costs on the cluster bus. Per server: acquire/release loops on 1 and 3 primaries with
//! the module messages counted; then a node that keeps receiving slots by `CLUSTER
//! SETSLOT` while clients acquire keys of slots it always had and of slots that arrived
//! earlier, against the same load with nothing moving. Saved as docs/data/cluster.json
//! and rendered into docs/BENCHMARKS.md.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redis_lock_report::cluster::{ClusterRun, ClusterServer, Moving, Scale};
use redis_lock_testkit::lock::Routed;
use redis_lock_testkit::{flavor_of, key_slot, Cluster, RawConn, Resp, Rng, ServerBuilder};

use crate::config::Config;

/// Keys the loops of the scale part pick from.
const KEYS: u64 = 1000;
/// How long a cluster gets before a measurement (its slots confirmed, caches warm).
const WARM: Duration = Duration::from_millis(1500);

fn io_err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// A cluster of `masters` primaries, with the module or (`plain`) without it.
fn start(bin: &Path, cfg: &Config, masters: usize, plain: bool) -> io::Result<Cluster> {
    let module = cfg.path(&cfg.module);
    Cluster::try_start_with(masters, |b: ServerBuilder| {
        let b = b
            .bin(bin.to_path_buf())
            .start_timeout(Duration::from_secs(30));
        match plain {
            true => b.no_module(),
            false => b.module(&module),
        }
    })
    .map_err(io_err)
}

fn ports(c: &Cluster) -> Vec<u16> {
    c.nodes.iter().map(|n| n.port).collect()
}

/// Module messages the nodes sent on the cluster bus so far.
fn bus_sent(c: &Cluster) -> u64 {
    (c.nodes.iter())
        .filter_map(|n| n.try_raw(Duration::from_secs(10)).ok())
        .map(|mut conn| {
            let text = conn.cmd(&["CLUSTER", "INFO"]).as_text().unwrap_or_default();
            (text.lines())
                .find_map(|l| l.strip_prefix("cluster_stats_messages_module_sent:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// One acquire and its release; `Some(true)` when granted, `Some(false)` for TRYAGAIN,
/// `None` when busy. `plain`: the same with `SET NX PX` and `DEL` (no module).
fn cycle(c: &mut RawConn, key: &str, token: &str, plain: bool) -> io::Result<Option<bool>> {
    if plain {
        return match c.call(&["SET", key, token, "NX", "PX", "10000"])? {
            Resp::Nil => Ok(None),
            Resp::Error(e) => Err(io_err(format!("SET {key}: {e}"))),
            _ => c.call(&["DEL", key]).map(|_| Some(true)),
        };
    }
    match c.call(&["LOCK.ACQUIRE", key, "PX", "10000", "TOKEN", token])? {
        Resp::Error(e) if e.starts_with("TRYAGAIN") => Ok(Some(false)),
        Resp::Error(e) => Err(io_err(format!("LOCK.ACQUIRE {key}: {e}"))),
        Resp::Nil => Ok(None),
        _ => {
            c.call(&["LOCK.RELEASE", key, token])?;
            Ok(Some(true))
        }
    }
}

/// `clients` loops of acquire and release on random keys through a cluster client.
fn scale(bin: &Path, cfg: &Config, masters: usize) -> io::Result<Scale> {
    let cluster = start(bin, cfg, masters, false)?;
    thread::sleep(WARM);
    let idle_from = bus_sent(&cluster);
    let idle_t = Instant::now();
    thread::sleep(Duration::from_secs(2));
    let idle = (bus_sent(&cluster) - idle_from) as f64 / idle_t.elapsed().as_secs_f64();
    let ports = ports(&cluster);
    let grants = Arc::new(AtomicU64::new(0));
    let secs = Duration::from_secs_f64(cfg.cluster_secs);
    let from = bus_sent(&cluster);
    let t = Instant::now();
    let until = t + secs;
    let workers: Vec<_> = (0..cfg.cluster_clients)
        .map(|i| {
            let (ports, grants) = (ports.clone(), Arc::clone(&grants));
            thread::spawn(move || -> io::Result<()> {
                let mut r = Routed::connect(&ports)?;
                let mut rng = Rng::new(i as u64);
                let token = format!("bench-cluster-client-{i:04}");
                while Instant::now() < until {
                    let key = format!("bc:{}", rng.below(KEYS));
                    let cmd = ["LOCK.ACQUIRE", &key, "PX", "10000", "TOKEN", &token];
                    let reply = r.call(key.as_bytes(), &cmd, Duration::from_secs(10))?;
                    if reply.grant().is_some() {
                        r.call(
                            key.as_bytes(),
                            &["LOCK.RELEASE", &key, &token],
                            Duration::from_secs(10),
                        )?;
                        grants.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join().map_err(|_| io_err("a client panicked"))??;
    }
    let elapsed = t.elapsed().as_secs_f64();
    let bus = bus_sent(&cluster) - from;
    let grants = grants.load(Ordering::Relaxed);
    Ok(Scale {
        masters,
        clients: cfg.cluster_clients,
        secs: elapsed,
        grants,
        grants_per_sec: grants as f64 / elapsed,
        bus_messages: bus,
        bus_per_grant: bus as f64 / grants.max(1) as f64,
        idle_bus_per_sec: idle,
    })
}

/// A key of each slot below `n` (`mv:<i>` for the first `i` that hashes there).
fn keys_below(n: u16) -> HashMap<u16, String> {
    let mut keys = HashMap::new();
    for i in 0.. {
        let k = format!("mv:{i}");
        let s = key_slot(k.as_bytes());
        if s < n {
            keys.entry(s).or_insert(k);
            if keys.len() == usize::from(n) {
                break;
            }
        }
    }
    keys
}

/// Slots that arrived on node 1, and when.
type Arrivals = Arc<Mutex<Vec<(u16, Instant)>>>;

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

const FROM: usize = 0;
const TO: usize = 1;
/// Slots moved before the measurement, so that there are keys of arrived slots from the
/// start; the moves take slots from here on.
const EARLY: u16 = 100;
const LAST: u16 = 8000;
const SETTLED: Duration = Duration::from_millis(200);

/// What the clients count, per state (0: quiet, 1: moving).
#[derive(Default)]
struct Counts {
    home: [AtomicU64; 2],
    arrived: [AtomicU64; 2],
    tryagain_home: [AtomicU64; 2],
    tryagain_arrived: [AtomicU64; 2],
}

/// The state all threads follow: whether slots move now, and whether to stop.
#[derive(Default)]
struct Switch {
    moving: AtomicBool,
    stop: AtomicBool,
}

impl Switch {
    fn state(&self) -> usize {
        usize::from(self.moving.load(Ordering::Relaxed))
    }
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// A loop of acquire/release on node `port` until stopped, counting its grants and
/// TRYAGAIN by the state they came in; keys from `pick` (None: nothing to pick yet).
fn client(
    (port, plain): (u16, bool),
    sw: Arc<Switch>,
    count: impl Fn(&Counts, bool, usize) + Send + 'static,
    counts: Arc<Counts>,
    mut pick: impl FnMut(&mut Rng) -> Option<String> + Send + 'static,
) -> thread::JoinHandle<io::Result<()>> {
    thread::spawn(move || {
        let mut c = RawConn::open(([127, 0, 0, 1], port).into(), Duration::from_secs(10))?;
        let mut rng = Rng::new(u64::from(port));
        let token = format!("bench-cluster-client-{port}-0000");
        while !sw.stopped() {
            let Some(key) = pick(&mut rng) else {
                thread::sleep(Duration::from_millis(1));
                continue;
            };
            if let Some(granted) = cycle(&mut c, &key, &token, plain)? {
                count(&counts, granted, sw.state());
                if !granted {
                    // TRYAGAIN: back off a millisecond, as cluster clients do.
                    thread::sleep(Duration::from_millis(1));
                }
            }
        }
        Ok(())
    })
}

/// Node 1 keeps receiving slots from node 0 in some windows and not in others, many
/// short windows in turn, so that both states see the same machine (other load on these
/// cores comes and goes over seconds). `plain`: no module, `SET NX PX` and `DEL`.
fn moving(bin: &Path, cfg: &Config, plain: bool) -> io::Result<Moving> {
    let cluster = Arc::new(start(bin, cfg, 2, plain)?);
    let mut conns: Vec<RawConn> = (cluster.nodes.iter())
        .map(|n| n.try_raw(Duration::from_secs(10)))
        .collect::<io::Result<_>>()?;
    let ids = Cluster::ids_of(&mut conns).map_err(io_err)?;
    let keys = Arc::new(keys_below(LAST));
    let home: Arc<Vec<String>> = Arc::new(
        (0..)
            .map(|i| format!("home:{i}"))
            .filter(|k| key_slot(k.as_bytes()) >= 8192)
            .take(100)
            .collect(),
    );
    let arrivals: Arrivals = Arc::new(Mutex::new(Vec::new()));
    let move_slot = |conns: &mut [RawConn], slot: u16, arrivals: &Arrivals| -> io::Result<()> {
        (cluster.move_slot(conns, &ids, slot, FROM, TO, Duration::ZERO)).map_err(io_err)?;
        arrivals
            .lock()
            .map_err(io_err)?
            .push((slot, Instant::now()));
        Ok(())
    };
    for slot in 0..EARLY {
        move_slot(&mut conns, slot, &arrivals)?;
    }
    thread::sleep(WARM);
    let sw = Arc::new(Switch::default());
    let counts = Arc::new(Counts::default());
    let node = (cluster.nodes[TO].port, plain);
    let add = |c: &[AtomicU64; 2], state: usize| c[state].fetch_add(1, Ordering::Relaxed);
    let home_loop = {
        let home = Arc::clone(&home);
        let count = move |c: &Counts, granted: bool, state: usize| {
            add(if granted { &c.home } else { &c.tryagain_home }, state);
        };
        client(
            node,
            Arc::clone(&sw),
            count,
            Arc::clone(&counts),
            move |rng| Some(rng.pick(&home).clone()),
        )
    };
    let arrived_loop = {
        let (arrivals, keys) = (Arc::clone(&arrivals), Arc::clone(&keys));
        let count = move |c: &Counts, granted: bool, state: usize| {
            add(
                if granted {
                    &c.arrived
                } else {
                    &c.tryagain_arrived
                },
                state,
            );
        };
        client(
            node,
            Arc::clone(&sw),
            count,
            Arc::clone(&counts),
            move |rng| {
                // In arrival order: the settled ones are a prefix.
                let a = arrivals.lock().ok()?;
                let n = a.partition_point(|(_, at)| at.elapsed() >= SETTLED);
                (n > 0).then(|| keys[&a[rng.below(n as u64) as usize].0].clone())
            },
        )
    };
    // The mover: a slot every gap while moving; otherwise as many round trips to both
    // nodes, read-only, at the same pace (an idle machine answers a lone client more
    // slowly than a busy one: without them the quiet windows ran slower).
    let mover = {
        let (sw, arrivals) = (Arc::clone(&sw), Arc::clone(&arrivals));
        let gap = Duration::from_millis(cfg.cluster_gap_ms);
        let cluster = Arc::clone(&cluster);
        let ids = ids.clone();
        thread::spawn(move || -> io::Result<u64> {
            let (mut slot, mut moved) = (EARLY, 0);
            while !sw.stopped() {
                if sw.state() == 1 && slot < LAST {
                    (cluster.move_slot(&mut conns, &ids, slot, FROM, TO, Duration::ZERO))
                        .map_err(io_err)?;
                    arrivals
                        .lock()
                        .map_err(io_err)?
                        .push((slot, Instant::now()));
                    slot += 1;
                    moved += 1;
                } else {
                    let s = (LAST + slot % 100).to_string();
                    for i in [TO, FROM, FROM, FROM, TO, FROM] {
                        conns[i].call(&["CLUSTER", "COUNTKEYSINSLOT", &s])?;
                    }
                }
                thread::sleep(gap);
            }
            Ok(moved)
        })
    };
    // The probe: right after a slot arrived, a key of it, retried on TRYAGAIN.
    let probe = {
        let (sw, arrivals, keys) = (Arc::clone(&sw), Arc::clone(&arrivals), Arc::clone(&keys));
        thread::spawn(move || -> io::Result<Vec<f64>> {
            let mut c = RawConn::open(([127, 0, 0, 1], node.0).into(), Duration::from_secs(10))?;
            let (mut waits, mut seen) = (Vec::new(), EARLY);
            let token = "bench-cluster-probe-00000000";
            while !plain && !sw.stopped() {
                let last = arrivals.lock().map_err(io_err)?.last().copied();
                let Some((slot, at)) = last.filter(|(s, _)| *s >= seen) else {
                    thread::sleep(Duration::from_millis(1));
                    continue;
                };
                seen = slot + 1;
                while cycle(&mut c, &keys[&slot], token, false)? != Some(true) {
                    thread::sleep(Duration::from_micros(200));
                }
                waits.push(at.elapsed().as_secs_f64() * 1000.0);
                thread::sleep(Duration::from_millis(50));
            }
            Ok(waits)
        })
    };
    // The windows: quiet and moving in turn (which comes first alternates by pair).
    let window = Duration::from_millis(cfg.cluster_window_ms);
    let pairs = (cfg.cluster_secs * 1000.0 / window.as_millis() as f64)
        .ceil()
        .max(1.0) as usize;
    let mut spent = [0.0f64; 2];
    let bus_from = bus_sent(&cluster);
    for pair in 0..pairs {
        for half in 0..2 {
            let state = (pair + half) % 2;
            sw.moving.store(state == 1, Ordering::Relaxed);
            let t = Instant::now();
            thread::sleep(window);
            spent[state] += t.elapsed().as_secs_f64();
        }
    }
    sw.stop.store(true, Ordering::Relaxed);
    let bus = bus_sent(&cluster) - bus_from;
    let joined = |h: thread::JoinHandle<io::Result<()>>| {
        h.join().map_err(|_| io_err("a client panicked"))?
    };
    joined(home_loop)?;
    joined(arrived_loop)?;
    let moved = mover.join().map_err(|_| io_err("the mover panicked"))??;
    let mut waits = probe.join().map_err(|_| io_err("the probe panicked"))??;
    waits.sort_by(f64::total_cmp);
    let rate =
        |c: &[AtomicU64; 2], state: usize| c[state].load(Ordering::Relaxed) as f64 / spent[state];
    let total = |c: &[AtomicU64; 2]| c[1].load(Ordering::Relaxed);
    Ok(Moving {
        secs: spent[1],
        windows: pairs,
        window_ms: cfg.cluster_window_ms,
        slots_moved: moved,
        gap_ms: cfg.cluster_gap_ms,
        settled_ms: SETTLED.as_millis() as u64,
        home_quiet: rate(&counts.home, 0),
        home_moving: rate(&counts.home, 1),
        arrived_quiet: rate(&counts.arrived, 0),
        arrived_moving: rate(&counts.arrived, 1),
        plain_home_ratio: f64::NAN,
        plain_arrived_ratio: f64::NAN,
        tryagain_home: total(&counts.tryagain_home),
        tryagain_arrived: total(&counts.tryagain_arrived),
        first_grant_p50_ms: percentile(&waits, 0.5),
        first_grant_p99_ms: percentile(&waits, 0.99),
        first_grant_max_ms: waits.last().copied().unwrap_or(f64::NAN),
        probes: waits.len() as u64,
        bus_per_slot: bus as f64 / moved.max(1) as f64,
    })
}

fn server(bin: &Path, cfg: &Config) -> io::Result<ClusterServer> {
    let label = flavor_of(bin).map_err(io_err)?.label();
    eprintln!("== {label} ({})", bin.display());
    let scale = [1, 3]
        .iter()
        .map(|&m| {
            let s = scale(bin, cfg, m)?;
            eprintln!(
                "  {m} primaries: {:.0} grants/s, {} bus messages ({:.4} per grant), {:.0}/s idle",
                s.grants_per_sec, s.bus_messages, s.bus_per_grant, s.idle_bus_per_sec
            );
            Ok(s)
        })
        .collect::<io::Result<Vec<_>>>()?;
    let mut m = moving(bin, cfg, false)?;
    let plain = moving(bin, cfg, true)?;
    (m.plain_home_ratio, m.plain_arrived_ratio) = (plain.home_ratio(), plain.arrived_ratio());
    eprintln!(
        "  slots arriving ({} in {:.1} s): home {:.0} -> {:.0}/s ({:.2}x), arrived {:.0} -> {:.0}/s ({:.2}x); first grant p50 {:.1} ms p99 {:.1} ms; {:.1} bus messages per slot; without the module (SET NX/DEL) {:.2}x / {:.2}x",
        m.slots_moved, m.secs, m.home_quiet, m.home_moving, m.home_ratio(), m.arrived_quiet,
        m.arrived_moving, m.arrived_ratio(), m.first_grant_p50_ms, m.first_grant_p99_ms, m.bus_per_slot,
        m.plain_home_ratio, m.plain_arrived_ratio
    );
    Ok(ClusterServer {
        label,
        scale,
        moving: m,
    })
}

pub fn run(cfg: &Config) -> io::Result<()> {
    let started = Instant::now();
    let date = redis_lock_report::fmt::now_utc();
    let load_start = redis_lock_report::fmt::loadavg();
    let servers = (cfg.servers.0.iter())
        .map(|b| server(&cfg.path(b), cfg))
        .collect::<io::Result<Vec<_>>>()?;
    let run = ClusterRun {
        date,
        command: "make bench-cluster".into(),
        minutes: started.elapsed().as_secs_f64() / 60.0,
        machine: redis_lock_report::fmt::machine(),
        load_start,
        load_end: redis_lock_report::fmt::loadavg(),
        settings: serde_json::json!({
            "BENCH_CLUSTER_SECS": cfg.cluster_secs,
            "BENCH_CLUSTER_CLIENTS": cfg.cluster_clients,
            "BENCH_CLUSTER_WINDOW_MS": cfg.cluster_window_ms,
            "BENCH_CLUSTER_GAP_MS": cfg.cluster_gap_ms,
        }),
        servers,
    };
    let json = (cfg.cluster_json.clone())
        .unwrap_or_else(|| cfg.root.join(redis_lock_report::CLUSTER_JSON));
    redis_lock_report::save(&json, &run).map_err(io_err)?;
    eprintln!("saved {}", json.display());
    let root = json.ancestors().nth(3).unwrap_or(Path::new("."));
    let wrote = redis_lock_report::render_all(root).map_err(io_err)?;
    eprintln!("rendered {wrote:?}");
    Ok(())
}
