//! RESP2 on the wire: encoding commands, scanning replies without allocating (for the
//! load generator) and a small blocking connection (for set-up, INFO and latency).

use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Appends `*n\r\n$len\r\narg\r\n...` to `out`.
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.push(b'*');
    push_num(out, args.len() as u64);
    out.extend_from_slice(b"\r\n");
    for a in args {
        out.push(b'$');
        push_num(out, a.len() as u64);
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Decimal digits of `n` appended to `out`.
pub fn push_num(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// `n` as decimal text, zero-padded to `width` digits.
pub fn padded(n: u64, width: usize) -> Vec<u8> {
    let mut digits = Vec::new();
    push_num(&mut digits, n);
    let mut v = vec![b'0'; width.saturating_sub(digits.len())];
    v.extend_from_slice(&digits);
    v
}

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

/// A fully decoded reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Nil,
    Bulk(Vec<u8>),
    Array(Vec<Reply>),
}

impl Reply {
    pub fn text(&self) -> String {
        match self {
            Reply::Status(s) | Reply::Error(s) => s.clone(),
            Reply::Int(i) => i.to_string(),
            Reply::Nil => "(nil)".into(),
            Reply::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            Reply::Array(a) => format!(
                "[{}]",
                a.iter().map(Reply::text).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

/// A blocking connection for set-up, INFO and the latency loop.
pub struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    out: Vec<u8>,
}

impl Conn {
    pub fn connect(port: u16, timeout: Duration) -> io::Result<Conn> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        Ok(Conn {
            reader: BufReader::with_capacity(64 * 1024, s.try_clone()?),
            writer: s,
            out: Vec::with_capacity(4096),
        })
    }

    /// Sends one command without waiting for its reply.
    pub fn send(&mut self, args: &[&[u8]]) -> io::Result<()> {
        self.out.clear();
        encode(&mut self.out, args);
        self.writer.write_all(&self.out)
    }

    /// Sends raw, already encoded bytes.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.writer.write_all(bytes)
    }

    pub fn read(&mut self) -> io::Result<Reply> {
        read_reply(&mut self.reader)
    }

    /// Sends a command and reads its reply; an error reply becomes an `Err`.
    pub fn call(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        self.send(args)?;
        match self.read()? {
            Reply::Error(e) => Err(io::Error::other(format!(
                "{} -> {e}",
                String::from_utf8_lossy(args.first().copied().unwrap_or(b""))
            ))),
            r => Ok(r),
        }
    }

    /// `INFO section` as (field, value) pairs.
    pub fn info(&mut self, section: &str) -> io::Result<Vec<(String, String)>> {
        let r = self.call(&[b"INFO", section.as_bytes()])?;
        let Reply::Bulk(b) = r else {
            return Err(io::Error::other("INFO did not return a bulk string"));
        };
        Ok(String::from_utf8_lossy(&b)
            .lines()
            .filter_map(|l| {
                let (k, v) = l.split_once(':')?;
                Some((k.trim().to_string(), v.trim().to_string()))
            })
            .collect())
    }

    pub fn info_field(&mut self, section: &str, field: &str) -> io::Result<String> {
        self.info(section)?
            .into_iter()
            .find(|(k, _)| k == field)
            .map(|(_, v)| v)
            .ok_or_else(|| io::Error::other(format!("INFO {section} has no field {field}")))
    }

    pub fn info_u64(&mut self, section: &str, field: &str) -> io::Result<u64> {
        let v = self.info_field(section, field)?;
        v.parse()
            .map_err(|_| io::Error::other(format!("INFO {field} is not a number: {v}")))
    }
}

fn read_line(r: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "server closed the connection",
        ));
    }
    if !line.ends_with(b"\r\n") {
        return Err(io::Error::other("reply line without CRLF"));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn line_num(line: &[u8]) -> io::Result<i64> {
    num(line).map_err(io::Error::other)
}

pub fn read_reply(r: &mut impl BufRead) -> io::Result<Reply> {
    let line = read_line(r)?;
    let Some((&kind, rest)) = line.split_first() else {
        return Err(io::Error::other("empty reply line"));
    };
    let text = || String::from_utf8_lossy(rest).into_owned();
    match kind {
        b'+' => Ok(Reply::Status(text())),
        b'-' => Ok(Reply::Error(text())),
        b':' => Ok(Reply::Int(line_num(rest)?)),
        b'_' => Ok(Reply::Nil),
        b'$' => {
            let n = line_num(rest)?;
            if n < 0 {
                return Ok(Reply::Nil);
            }
            let mut b = vec![0u8; n as usize + 2];
            r.read_exact(&mut b)?;
            b.truncate(n as usize);
            Ok(Reply::Bulk(b))
        }
        b'*' => {
            let n = line_num(rest)?;
            if n < 0 {
                return Ok(Reply::Nil);
            }
            (0..n)
                .map(|_| read_reply(r))
                .collect::<io::Result<_>>()
                .map(Reply::Array)
        }
        other => Err(io::Error::other(format!(
            "unexpected reply type byte {other:#x}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_commands() {
        let mut out = Vec::new();
        encode(&mut out, &[b"SET", b"k", b""]);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n");
        assert_eq!(padded(42, 5), b"00042");
        assert_eq!(padded(123456, 3), b"123456");
    }

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
    fn reads_nested_replies() {
        let mut r = BufReader::new(&b"*2\r\n$3\r\ntok\r\n:77\r\n"[..]);
        assert_eq!(
            read_reply(&mut r).unwrap(),
            Reply::Array(vec![Reply::Bulk(b"tok".to_vec()), Reply::Int(77)])
        );
    }
}
