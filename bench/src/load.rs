//! The load generator: one thread, `poll(2)` over N non-blocking connections, each
//! sending a batch of `pipeline` commands and waiting for all their replies before the
//! next batch (what `redis-benchmark -P` does). Every reply is checked against what the
//! workload expects, so a run whose keys were not in the intended state is caught
//! instead of being measured.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// The outline of one reply, enough to check it against an expectation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `+OK` and other simple strings; `true` when it is exactly `OK`.
    Status(bool),
    Error,
    Int(i64),
    Nil,
    Bulk,
    Array(usize),
}

/// Scans one complete reply at the start of `buf`. `Ok(None)` when more bytes are
/// needed; `Err` on a protocol violation.
pub fn scan(buf: &[u8]) -> Result<Option<(Shape, usize)>, String> {
    let Some(line_end) = find_crlf(buf) else {
        return Ok(None);
    };
    if line_end == 0 {
        return Err("empty reply line".into());
    }
    let line = &buf[1..line_end];
    let after = line_end + 2;
    match buf[0] {
        b'+' => Ok(Some((Shape::Status(line == b"OK"), after))),
        b'-' => Ok(Some((Shape::Error, after))),
        b':' => Ok(Some((Shape::Int(num(line)?), after))),
        b'$' => {
            let n = num(line)?;
            if n < 0 {
                return Ok(Some((Shape::Nil, after)));
            }
            let end = after + n as usize + 2;
            if buf.len() < end {
                return Ok(None);
            }
            Ok(Some((Shape::Bulk, end)))
        }
        b'*' => {
            let n = num(line)?;
            if n < 0 {
                return Ok(Some((Shape::Nil, after)));
            }
            let mut pos = after;
            for _ in 0..n {
                match scan(&buf[pos..])? {
                    Some((_, used)) => pos += used,
                    None => return Ok(None),
                }
            }
            Ok(Some((Shape::Array(n as usize), pos)))
        }
        b'_' => Ok(Some((Shape::Nil, after))),
        other => Err(format!("unexpected reply type byte {other:#x}")),
    }
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

fn num(line: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad number {:?}", String::from_utf8_lossy(line)))
}

/// What a reply must look like for the operation to count as the intended one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Anything but an error.
    Any,
    /// `+OK` (a `SET ... NX` that did set).
    Ok,
    /// This integer (`1` for a release or extend that found its token).
    Int(i64),
    /// A two-element array (`[token, fence]` of a grant).
    Grant,
}

impl Expect {
    fn accepts(self, s: Shape) -> bool {
        match self {
            Expect::Any => s != Shape::Error,
            Expect::Ok => s == Shape::Status(true),
            Expect::Int(n) => s == Shape::Int(n),
            Expect::Grant => s == Shape::Array(2),
        }
    }
}

pub trait Workload {
    /// Appends operation `i` of connection `conn` to `out`.
    fn encode(&self, conn: usize, i: u64, out: &mut Vec<u8>);
    fn expect(&self, conn: usize, i: u64) -> Expect;
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub ops: u64,
    pub secs: f64,
    pub bad: u64,
    pub first_bad: Option<String>,
}

impl Outcome {
    pub fn rate(&self) -> f64 {
        if self.secs > 0.0 {
            self.ops as f64 / self.secs
        } else {
            0.0
        }
    }

    /// An error unless every reply was the expected one.
    pub fn checked(self, what: &str) -> io::Result<Outcome> {
        if self.bad > 0 {
            return Err(io::Error::other(format!(
                "{what}: {} of {} replies were not the expected ones (first: {})",
                self.bad,
                self.ops,
                self.first_bad.as_deref().unwrap_or("?")
            )));
        }
        Ok(self)
    }
}

struct Client {
    stream: TcpStream,
    out: Vec<u8>,
    out_pos: usize,
    inbuf: Vec<u8>,
    in_pos: usize,
    sent: u64,
    replied: u64,
}

/// Longest time without a single reply before the run is declared stuck.
const STALL: Duration = Duration::from_secs(60);

/// Runs `ops_per_conn` operations on each of `conns` connections, `pipeline` at a time.
pub fn run(
    port: u16,
    conns: usize,
    pipeline: usize,
    ops_per_conn: u64,
    w: &dyn Workload,
) -> io::Result<Outcome> {
    let pipeline = pipeline.max(1) as u64;
    let mut clients = Vec::with_capacity(conns);
    for _ in 0..conns {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        clients.push(Client {
            stream: s,
            out: Vec::with_capacity(16 * 1024),
            out_pos: 0,
            inbuf: Vec::with_capacity(64 * 1024),
            in_pos: 0,
            sent: 0,
            replied: 0,
        });
    }
    let mut bad = 0u64;
    let mut first_bad = None;
    let mut buf = vec![0u8; 256 * 1024];
    let start = Instant::now();
    let mut last_progress = start;
    for (id, c) in clients.iter_mut().enumerate() {
        next_batch(c, id, pipeline, ops_per_conn, w);
        flush(c)?;
    }
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(conns);
    let mut map: Vec<usize> = Vec::with_capacity(conns);
    loop {
        fds.clear();
        map.clear();
        for (id, c) in clients.iter().enumerate() {
            if c.replied < ops_per_conn {
                let mut events = libc::POLLIN;
                if c.out_pos < c.out.len() {
                    events |= libc::POLLOUT;
                }
                fds.push(libc::pollfd {
                    fd: c.stream.as_raw_fd(),
                    events,
                    revents: 0,
                });
                map.push(id);
            }
        }
        if fds.is_empty() {
            break;
        }
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1000) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            if last_progress.elapsed() > STALL {
                return Err(io::Error::other(format!(
                    "load stalled: no reply for {STALL:?}"
                )));
            }
            continue;
        }
        for (pfd, &id) in fds.iter().zip(&map) {
            if pfd.revents == 0 {
                continue;
            }
            let c = &mut clients[id];
            if pfd.revents & libc::POLLOUT != 0 {
                flush(c)?;
            }
            if pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                loop {
                    match c.stream.read(&mut buf) {
                        Ok(0) => {
                            return Err(io::Error::new(
                                ErrorKind::UnexpectedEof,
                                "server closed a benchmark connection",
                            ))
                        }
                        Ok(k) => c.inbuf.extend_from_slice(&buf[..k]),
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(e) => return Err(e),
                    }
                }
                while let Some((shape, used)) =
                    scan(&c.inbuf[c.in_pos..]).map_err(io::Error::other)?
                {
                    let i = c.replied;
                    let exp = w.expect(id, i);
                    if !exp.accepts(shape) {
                        bad += 1;
                        if first_bad.is_none() {
                            first_bad = Some(format!(
                                "op {i} on connection {id}: got {shape:?}, expected {exp:?}"
                            ));
                        }
                    }
                    c.replied += 1;
                    c.in_pos += used;
                    last_progress = Instant::now();
                }
                if c.in_pos == c.inbuf.len() {
                    c.inbuf.clear();
                    c.in_pos = 0;
                } else if c.in_pos > 32 * 1024 {
                    c.inbuf.drain(..c.in_pos);
                    c.in_pos = 0;
                }
                if c.replied == c.sent && c.sent < ops_per_conn {
                    next_batch(c, id, pipeline, ops_per_conn, w);
                    flush(c)?;
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(Outcome {
        ops: ops_per_conn * conns as u64,
        secs,
        bad,
        first_bad,
    })
}

fn next_batch(c: &mut Client, id: usize, pipeline: u64, total: u64, w: &dyn Workload) {
    c.out.clear();
    c.out_pos = 0;
    let n = pipeline.min(total - c.sent);
    for _ in 0..n {
        w.encode(id, c.sent, &mut c.out);
        c.sent += 1;
    }
}

fn flush(c: &mut Client) -> io::Result<()> {
    while c.out_pos < c.out.len() {
        match c.stream.write(&c.out[c.out_pos..]) {
            Ok(k) => c.out_pos += k,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A workload made of closures, for the one-off loads (pre-filling keys and the like).
pub struct FnLoad<E, X>
where
    E: Fn(usize, u64, &mut Vec<u8>),
    X: Fn(usize, u64) -> Expect,
{
    pub enc: E,
    pub exp: X,
}

impl<E, X> Workload for FnLoad<E, X>
where
    E: Fn(usize, u64, &mut Vec<u8>),
    X: Fn(usize, u64) -> Expect,
{
    fn encode(&self, conn: usize, i: u64, out: &mut Vec<u8>) {
        (self.enc)(conn, i, out)
    }
    fn expect(&self, conn: usize, i: u64) -> Expect {
        (self.exp)(conn, i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_replies() {
        assert_eq!(scan(b"+OK\r\n").unwrap(), Some((Shape::Status(true), 5)));
        assert_eq!(scan(b"+PONG\r\n").unwrap(), Some((Shape::Status(false), 7)));
        assert_eq!(scan(b":1\r\n:2").unwrap(), Some((Shape::Int(1), 4)));
        assert_eq!(scan(b"$-1\r\n").unwrap(), Some((Shape::Nil, 5)));
        assert_eq!(scan(b"$3\r\nab").unwrap(), None);
        assert_eq!(scan(b"$3\r\nabc\r\n").unwrap(), Some((Shape::Bulk, 9)));
        let grant = b"*2\r\n$3\r\ntok\r\n:77\r\n";
        assert_eq!(scan(grant).unwrap(), Some((Shape::Array(2), grant.len())));
        assert_eq!(scan(&grant[..grant.len() - 1]).unwrap(), None);
        assert_eq!(scan(b"-ERR x\r\n").unwrap(), Some((Shape::Error, 8)));
        assert!(scan(b"?\r\n").is_err());
    }
}
