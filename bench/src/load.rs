//! The load generator: one thread, `poll(2)` over N non-blocking connections, each
//! sending a batch and waiting for all its replies (as `redis-benchmark -P` does), every
//! reply checked against the workload's expectation; and [`Peer`], read reply by reply.

use std::collections::VecDeque;
use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};

use redis_lock_testkit::encode;
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

/// Scans one complete reply at the start of `buf`; `Ok(None)` when more bytes are needed.
pub fn scan(buf: &[u8]) -> Result<Option<(Shape, usize)>, String> {
    let Some(line_end) = buf.windows(2).position(|w| w == b"\r\n") else {
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
        b'$' | b'*' if num(line)? < 0 => Ok(Some((Shape::Nil, after))),
        b'$' => {
            let end = after + num(line)? as usize + 2;
            Ok((buf.len() >= end).then_some((Shape::Bulk, end)))
        }
        b'*' => {
            let n = num(line)? as usize;
            let mut pos = after;
            for _ in 0..n {
                match scan(&buf[pos..])? {
                    Some((_, used)) => pos += used,
                    None => return Ok(None),
                }
            }
            Ok(Some((Shape::Array(n), pos)))
        }
        b'_' => Ok(Some((Shape::Nil, after))),
        other => Err(format!("unexpected reply type byte {other:#x}")),
    }
}

fn num(line: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad number {:?}", String::from_utf8_lossy(line)))
}

/// Appends command `i` of connection `conn`; the reply it must get (`None`: not an error).
pub type Workload<'a> = dyn Fn(usize, u64, &mut Vec<u8>) -> Option<Shape> + 'a;

struct Client {
    stream: TcpStream,
    out: Vec<u8>,
    out_pos: usize,
    inbuf: Vec<u8>,
    sent: u64,
    replied: u64,
    /// What the replies still to come must be, in order.
    expect: VecDeque<Option<Shape>>,
}

impl Client {
    fn connect(port: u16) -> io::Result<Client> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        Ok(Client {
            stream,
            out: Vec::with_capacity(16 * 1024),
            out_pos: 0,
            inbuf: Vec::with_capacity(64 * 1024),
            sent: 0,
            replied: 0,
            expect: VecDeque::new(),
        })
    }

    /// Encodes the next batch and starts sending it.
    fn next_batch(&mut self, id: usize, batch: &Batch, total: u64, w: &Workload) -> io::Result<()> {
        self.out.clear();
        self.out_pos = 0;
        for _ in 0..batch.len(self.sent).min(total - self.sent) {
            self.expect.push_back(w(id, self.sent, &mut self.out));
            self.sent += 1;
        }
        self.flush()
    }

    /// Writes what the socket takes of the batch.
    fn flush(&mut self) -> io::Result<()> {
        while self.out_pos < self.out.len() {
            match nonblocking(|| self.stream.write(&self.out[self.out_pos..]))? {
                Some(k) => self.out_pos += k,
                None => break,
            }
        }
        Ok(())
    }

    /// Reads everything the socket has.
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<()> {
        while let Some(k) = nonblocking(|| self.stream.read(buf))? {
            if k == 0 {
                let eof = "server closed a benchmark connection";
                return Err(io::Error::new(ErrorKind::UnexpectedEof, eof));
            }
            self.inbuf.extend_from_slice(&buf[..k]);
        }
        Ok(())
    }
}

/// One read or write on a non-blocking socket, retried when interrupted; `None`: would block.
fn nonblocking(mut f: impl FnMut() -> io::Result<usize>) -> io::Result<Option<usize>> {
    loop {
        match f() {
            Ok(k) => return Ok(Some(k)),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// A pollfd waiting for input on each of `fds`.
pub fn pollfds(fds: impl Iterator<Item = RawFd>) -> Vec<libc::pollfd> {
    let pfd = |fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    fds.map(pfd).collect()
}

/// poll(2) for up to a second, retried when interrupted; the number of ready fds.
pub fn poll(fds: &mut [libc::pollfd]) -> io::Result<i32> {
    loop {
        // SAFETY: poll(2) on a valid array of pollfd structs of ours.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1000) };
        if n >= 0 {
            return Ok(n);
        }
        let e = io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Longest time without a single reply before a run is declared stuck.
pub const STALL: Duration = Duration::from_secs(60);

/// How a connection groups its commands into round trips.
#[derive(Clone, Copy)]
pub enum Batch<'a> {
    /// `n` commands at a time.
    Pipeline(u64),
    /// Operations sent as these round trips: `[1, 1, 3]` is `WATCH`, its reply, `GET`, its
    /// reply, then `MULTI` + `SET` + `EXEC` in one write (as a client library sends them).
    Trips(&'a [u64]),
}

impl Batch<'_> {
    /// Commands in the batch that starts with command number `sent` of the connection.
    fn len(&self, sent: u64) -> u64 {
        match self {
            Batch::Pipeline(n) => (*n).max(1),
            Batch::Trips(trips) => {
                let per_op: u64 = trips.iter().sum();
                let mut at = sent % per_op.max(1);
                for &t in trips.iter() {
                    if at < t {
                        return t - at;
                    }
                    at -= t;
                }
                1
            }
        }
    }
}

impl From<usize> for Batch<'_> {
    fn from(pipeline: usize) -> Self {
        Batch::Pipeline(pipeline as u64)
    }
}

/// Runs `per_conn` commands on each of `conns` connections, grouped as `batch` says;
/// commands per second, or an error (naming `what`) unless every reply was expected.
pub fn run<'b>(
    port: u16,
    conns: usize,
    batch: impl Into<Batch<'b>>,
    per_conn: u64,
    what: &str,
    w: &Workload,
) -> io::Result<f64> {
    let batch = &batch.into();
    let mut clients = (0..conns)
        .map(|_| Client::connect(port))
        .collect::<io::Result<Vec<_>>>()?;
    let mut bad = 0u64;
    let mut first_bad = None;
    let mut buf = vec![0u8; 256 * 1024];
    let start = Instant::now();
    let mut last_progress = start;
    for (id, c) in clients.iter_mut().enumerate() {
        c.next_batch(id, batch, per_conn, w)?;
    }
    // One pollfd per connection, in the same order; a finished one gets fd -1 (ignored).
    let mut fds = pollfds(clients.iter().map(|c| c.stream.as_raw_fd()));
    while clients.iter().any(|c| c.replied < per_conn) {
        for (pfd, c) in fds.iter_mut().zip(&clients) {
            let out = c.out_pos < c.out.len();
            pfd.events = libc::POLLIN | if out { libc::POLLOUT } else { 0 };
            if c.replied == per_conn {
                pfd.fd = -1;
            }
        }
        let n = poll(&mut fds)?;
        if n == 0 && last_progress.elapsed() > STALL {
            bail!("load stalled: no reply for {STALL:?}");
        }
        for (id, (pfd, c)) in fds.iter().zip(clients.iter_mut()).enumerate() {
            if pfd.revents & libc::POLLOUT != 0 {
                c.flush()?;
            }
            if pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) == 0 {
                continue;
            }
            c.fill(&mut buf)?;
            let mut pos = 0;
            while let Some((shape, used)) = scan(&c.inbuf[pos..]).map_err(io::Error::other)? {
                let exp = c.expect.pop_front().flatten();
                if !exp.map_or(shape != Shape::Error, |e| e == shape) {
                    bad += 1;
                    first_bad.get_or_insert_with(|| {
                        let i = c.replied;
                        format!("op {i} on connection {id}: got {shape:?}, expected {exp:?}")
                    });
                }
                c.replied += 1;
                pos += used;
                last_progress = Instant::now();
            }
            c.inbuf.drain(..pos);
            if c.replied == c.sent && c.sent < per_conn {
                c.next_batch(id, batch, per_conn, w)?;
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let ops = per_conn * conns as u64;
    if bad > 0 {
        let first = first_bad.as_deref().unwrap_or("?");
        bail!("{what}: {bad} of {ops} replies were not the expected ones (first: {first})");
    }
    Ok(if secs > 0.0 { ops as f64 / secs } else { 0.0 })
}

/// A connection read reply by reply, or polled with others.
pub struct Peer {
    pub s: TcpStream,
    buf: Vec<u8>,
}

impl Peer {
    pub fn connect(port: u16) -> io::Result<Peer> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(STALL))?;
        Ok(Peer { s, buf: Vec::new() })
    }

    pub fn many(port: u16, n: u64) -> io::Result<Vec<Peer>> {
        (0..n).map(|_| Peer::connect(port)).collect()
    }

    pub fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<()> {
        let (mut out, args) = (vec![], args.iter().map(AsRef::as_ref).collect::<Vec<_>>());
        encode(&mut out, &args);
        self.s.write_all(&out)
    }

    /// A complete reply taken from the buffer, if there is one.
    pub fn take(&mut self) -> io::Result<Option<(Shape, Vec<u8>)>> {
        match scan(&self.buf).map_err(io::Error::other)? {
            Some((shape, used)) => Ok(Some((shape, self.buf.drain(..used).collect()))),
            None => Ok(None),
        }
    }

    /// Reads what the socket has (one read).
    pub fn fill(&mut self) -> io::Result<()> {
        let mut tmp = [0u8; 16 * 1024];
        let n = self.s.read(&mut tmp)?;
        if n == 0 {
            return Err(io::Error::new(ErrorKind::UnexpectedEof, "server closed"));
        }
        self.buf.extend_from_slice(&tmp[..n]);
        Ok(())
    }

    /// The next reply, waiting for it.
    pub fn reply(&mut self) -> io::Result<(Shape, Vec<u8>)> {
        loop {
            if let Some(r) = self.take()? {
                return Ok(r);
            }
            self.fill()?;
        }
    }
}

/// Reads one reply from each peer as they come; when each was complete, and what it was.
pub fn gather(peers: &mut [&mut Peer]) -> io::Result<Vec<(Instant, Shape, Vec<u8>)>> {
    let mut got: Vec<Option<(Instant, Shape, Vec<u8>)>> = vec![None; peers.len()];
    for (g, p) in got.iter_mut().zip(peers.iter_mut()) {
        if let Some((shape, r)) = p.take()? {
            *g = Some((Instant::now(), shape, r));
        }
    }
    let mut fds = pollfds(peers.iter().map(|p| p.s.as_raw_fd()));
    let start = Instant::now();
    while got.iter().any(Option::is_none) {
        for (f, g) in fds.iter_mut().zip(&got) {
            if g.is_some() {
                f.fd = -1;
            }
        }
        poll(&mut fds)?;
        if start.elapsed() > STALL {
            bail!("observe: a watcher or waiter never answered");
        }
        for ((f, p), g) in fds.iter().zip(peers.iter_mut()).zip(got.iter_mut()) {
            if g.is_some() || f.revents == 0 {
                continue;
            }
            p.fill()?;
            if let Some((shape, r)) = p.take()? {
                *g = Some((Instant::now(), shape, r));
            }
        }
    }
    Ok(got.into_iter().flatten().collect())
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

    #[test]
    fn trips_split_each_operation() {
        let b = Batch::Trips(&[1, 1, 3]);
        let lens: Vec<u64> = [0, 1, 2, 5, 6, 7].iter().map(|&s| b.len(s)).collect();
        assert_eq!(lens, [1, 1, 3, 1, 1, 3]);
        assert_eq!(Batch::Pipeline(16).len(3), 16);
    }
}
