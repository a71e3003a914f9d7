//! RESP by hand: one reply type for RESP2 and RESP3, and a blocking connection for commands,
//! pipelines, raw (malformed) bytes, or a command left unanswered (a blocked client).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::IO_TIMEOUT;

/// Largest bulk string or aggregate accepted from a server (a guard against garbage).
const MAX_BULK: usize = 512 * 1024 * 1024;
const MAX_ITEMS: i64 = 1 << 24;

/// One reply as the server sent it. `Nil` covers RESP2 `$-1` / `*-1` and RESP3 `_`.
#[derive(Debug, Clone, PartialEq)]
pub enum Resp {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Resp>),
    Map(Vec<(Resp, Resp)>),
    Set(Vec<Resp>),
    Push(Vec<Resp>),
    Double(String),
    Bool(bool),
    BigNum(String),
    Verbatim(String, Vec<u8>),
}

impl Resp {
    pub fn is_error(&self) -> bool {
        matches!(self, Resp::Error(_))
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Resp::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The bytes of a bulk, simple or verbatim string.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Resp::Bulk(b) | Resp::Verbatim(_, b) => Some(b),
            Resp::Simple(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    pub fn as_text(&self) -> Option<String> {
        self.as_bytes().map(lossy)
    }

    /// The elements of an array, set or push reply.
    pub fn as_items(&self) -> Option<&[Resp]> {
        match self {
            Resp::Array(v) | Resp::Set(v) | Resp::Push(v) => Some(v),
            _ => None,
        }
    }

    /// `v`, or a panic naming the reply kind `what` that was expected.
    fn want<T>(&self, v: Option<T>, what: &str) -> T {
        v.unwrap_or_else(|| panic!("expected {what}, got {self:?}"))
    }

    /// The integer of an `Int` reply; panics otherwise.
    pub fn int(&self) -> i64 {
        self.want(self.as_int(), "an integer reply")
    }

    /// The bytes of a string reply; panics otherwise.
    pub fn bytes(&self) -> Vec<u8> {
        self.want(self.as_bytes(), "a string reply").to_vec()
    }

    /// `bytes()` as UTF-8 (lossy).
    pub fn text(&self) -> String {
        lossy(&self.bytes())
    }

    /// The elements of an aggregate reply; panics otherwise.
    pub fn items(&self) -> Vec<Resp> {
        self.want(self.as_items(), "an array reply").to_vec()
    }

    /// The error text (`"ERR ..."`); panics when the reply is not an error.
    pub fn err(&self) -> String {
        match self {
            Resp::Error(e) => e.clone(),
            other => panic!("expected an error reply, got {other:?}"),
        }
    }

    /// `[token, fence]` of a granted `LOCK.ACQUIRE`.
    pub fn grant(&self) -> Option<(Vec<u8>, u64)> {
        match self.as_items()? {
            [t, f] => Some((t.as_bytes()?.to_vec(), u64::try_from(f.as_int()?).ok()?)),
            _ => None,
        }
    }

    /// Field/value pairs of a RESP3 map or a RESP2 flat field/value array.
    pub fn try_pairs(&self) -> Option<Vec<(String, Resp)>> {
        match self {
            Resp::Map(m) => m
                .iter()
                .map(|(k, v)| Some((k.as_text()?, v.clone())))
                .collect(),
            Resp::Array(a) if a.len() % 2 == 0 => a
                .chunks(2)
                .map(|p| Some((p[0].as_text()?, p[1].clone())))
                .collect(),
            _ => None,
        }
    }

    /// [`try_pairs`](Self::try_pairs), panicking on anything else.
    pub fn pairs(&self) -> Vec<(String, Resp)> {
        self.want(self.try_pairs(), "a map or a flat field/value array")
    }

    /// One field of [`try_pairs`](Self::try_pairs) (case-insensitive name).
    pub fn get(&self, name: &str) -> Option<Resp> {
        find(self.try_pairs()?, name)
    }

    /// One field of [`pairs`](Self::pairs) (panics when the reply has no fields).
    pub fn field(&self, name: &str) -> Option<Resp> {
        find(self.pairs(), name)
    }
}

fn find(pairs: Vec<(String, Resp)>, name: &str) -> Option<Resp> {
    let mut it = pairs.into_iter();
    it.find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v)
}

/// True when `text` starts with an error code: one or more of `A-Z`, then (optionally)
/// `0-9`/`_`/`A-Z`, ended by a space or the end of the text (`ERR ...`, `WRONGTYPE ...`).
pub fn starts_with_error_code(text: &str) -> bool {
    let code = text.split(' ').next().unwrap_or("");
    code.as_bytes().first().is_some_and(u8::is_ascii_uppercase)
        && code
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// Appends `*n\r\n$len\r\narg\r\n...` to `out`, allocation-free (a load generator's hot path).
pub fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    // Writing into a Vec cannot fail.
    let _ = write!(out, "*{}\r\n", args.len());
    for a in args {
        let _ = write!(out, "${}\r\n", a.len());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Anything that can be one command argument (see [`args!`](crate::args)).
pub trait Arg {
    fn arg(&self) -> Vec<u8>;
}
impl<T: Arg + ?Sized> Arg for &T {
    fn arg(&self) -> Vec<u8> {
        (**self).arg()
    }
}
/// Byte strings go as they are, integers as their decimal digits.
macro_rules! arg_impls {
    ($($bytes:ty),* ; $($int:ty),*) => {
        $(impl Arg for $bytes {
            fn arg(&self) -> Vec<u8> {
                AsRef::<[u8]>::as_ref(self).to_vec()
            }
        })*
        $(impl Arg for $int {
            fn arg(&self) -> Vec<u8> {
                self.to_string().into_bytes()
            }
        })*
    };
}
arg_impls!(str, [u8], String, Vec<u8>; u64, i64, u32, i32, usize, u16);

/// `args![a, b, c]`: one command as a `Vec<Vec<u8>>` from mixed argument types.
#[macro_export]
macro_rules! args {
    ($($a:expr),* $(,)?) => {
        ::std::vec::Vec::<::std::vec::Vec<u8>>::from([$($crate::resp::Arg::arg(&$a)),*])
    };
}

/// A plain TCP connection speaking RESP: callers see exactly what the server sent.
pub struct RawConn {
    reader: BufReader<TcpStream>,
    out: Vec<u8>,
}

impl RawConn {
    /// A RESP2 connection to `127.0.0.1:port` with [`IO_TIMEOUT`]; panics on failure.
    pub fn connect(port: u16) -> RawConn {
        RawConn::open(([127, 0, 0, 1], port).into(), IO_TIMEOUT)
            .unwrap_or_else(|e| panic!("connect to 127.0.0.1:{port}: {e}"))
    }

    /// A connection switched to RESP3 with `HELLO 3` (panics when the server refuses).
    pub fn connect_resp3(port: u16) -> RawConn {
        let mut c = RawConn::connect(port);
        let hello = c.cmd(&["HELLO", "3"]);
        assert!(
            matches!(hello, Resp::Map(_)),
            "HELLO 3 should answer a RESP3 map, got {hello:?}"
        );
        c
    }

    /// Connects to `addr`; `timeout` bounds the connect and every read and write.
    pub fn open(addr: SocketAddr, timeout: Duration) -> io::Result<RawConn> {
        RawConn::from_stream(TcpStream::connect_timeout(&addr, timeout)?, timeout)
    }

    pub fn from_stream(s: TcpStream, timeout: Duration) -> io::Result<RawConn> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        Ok(RawConn {
            reader: BufReader::with_capacity(64 * 1024, s),
            out: Vec::with_capacity(4096),
        })
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) {
        self.try_set_read_timeout(t).expect("set_read_timeout");
    }

    pub fn try_set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.reader.get_ref().set_read_timeout(t)
    }

    /// Encodes one command into the output buffer (sent by [`flush`](Self::flush)).
    pub fn queue<A: AsRef<[u8]>>(&mut self, args: &[A]) {
        let args: Vec<&[u8]> = args.iter().map(AsRef::as_ref).collect();
        encode(&mut self.out, &args);
    }

    /// Queues bytes as they are (malformed protocol for fuzzing).
    pub fn queue_raw(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    /// Writes everything queued.
    pub fn flush(&mut self) -> io::Result<()> {
        let r = self.reader.get_mut().write_all(&self.out);
        self.out.clear();
        r
    }

    /// Sends one command without reading its reply; panics on an I/O error.
    pub fn send<A: AsRef<[u8]>>(&mut self, args: &[A]) {
        self.queue(args);
        self.flush().expect("write command");
    }

    /// Sends one command without reading its reply.
    pub fn try_send(&mut self, args: &[&[u8]]) -> io::Result<()> {
        self.queue(args);
        self.flush()
    }

    /// Sends bytes as they are.
    pub fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.queue_raw(bytes);
        self.flush()
    }

    /// Sends a command and reads its reply; an error reply is an `Err` too.
    pub fn ok(&mut self, args: &[&[u8]]) -> io::Result<Resp> {
        match self.call(args)? {
            Resp::Error(e) => Err(io::Error::other(format!("{} -> {e}", name_of(args)))),
            r => Ok(r),
        }
    }

    /// Sends a command and reads its reply.
    pub fn call<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<Resp> {
        self.queue(args);
        self.flush()?;
        self.read()
    }

    /// Sends a command and reads its reply; panics on an I/O error or timeout.
    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Resp {
        let r = self.call(args);
        r.unwrap_or_else(|e| panic!("reading the reply to {}: {e}", name_of(args)))
    }

    /// Sends several commands in one write and reads all their replies.
    pub fn pipeline<A: AsRef<[u8]>>(&mut self, cmds: &[Vec<A>]) -> io::Result<Vec<Resp>> {
        for c in cmds {
            self.queue(c);
        }
        self.flush()?;
        cmds.iter().map(|_| self.read()).collect()
    }

    /// Reads one reply (RESP3 attributes are skipped).
    pub fn read(&mut self) -> io::Result<Resp> {
        loop {
            if let Some(r) = read_resp(&mut self.reader)? {
                return Ok(r);
            }
        }
    }

    /// `INFO <section>` as (field, value) pairs (comments and blank lines left out).
    pub fn info(&mut self, section: &str) -> io::Result<Vec<(String, String)>> {
        let r = self.call(&["INFO", section])?;
        let text = r
            .as_text()
            .ok_or_else(|| io::Error::other(format!("INFO answered {r:?}")))?;
        Ok(text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.trim_end().split_once(':'))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    /// One numeric `INFO` field.
    pub fn info_u64(&mut self, section: &str, field: &str) -> io::Result<u64> {
        let all = self.info(section)?;
        all.iter()
            .find(|(k, _)| k == field)
            .and_then(|(_, v)| v.parse().ok())
            .ok_or_else(|| io::Error::other(format!("INFO {section} has no numeric {field}")))
    }
}

/// The command name of `args` ("" when empty), for messages.
fn name_of<A: AsRef<[u8]>>(args: &[A]) -> String {
    args.first().map_or(String::new(), |a| lossy(a.as_ref()))
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

fn read_line(r: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    r.take(MAX_BULK as u64).read_until(b'\n', &mut line)?;
    if line.is_empty() {
        let closed = io::ErrorKind::UnexpectedEof;
        return Err(io::Error::new(closed, "connection closed"));
    }
    if !line.ends_with(b"\r\n") {
        let text = String::from_utf8_lossy(&line);
        return Err(bad(format!("line without CRLF: {text:?}")));
    }
    line.truncate(line.len() - 2);
    Ok(line)
}

fn len_of(s: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(s)
        .ok()
        .and_then(|s| s.parse::<i64>().ok())
        .ok_or_else(|| bad(format!("bad length {:?}", String::from_utf8_lossy(s))))
}

fn blob(r: &mut impl BufRead, n: i64) -> io::Result<Vec<u8>> {
    let n = usize::try_from(n).map_err(|_| bad("negative length"))?;
    if n > MAX_BULK {
        return Err(bad("bulk too long"));
    }
    let mut b = vec![0u8; n + 2];
    r.read_exact(&mut b)?;
    if !b.ends_with(b"\r\n") {
        return Err(bad("blob without CRLF"));
    }
    b.truncate(n);
    Ok(b)
}

fn many(r: &mut impl BufRead, n: i64) -> io::Result<Vec<Resp>> {
    if !(0..=MAX_ITEMS).contains(&n) {
        return Err(bad("aggregate length out of range"));
    }
    let mut v = Vec::new();
    while (v.len() as i64) < n {
        if let Some(x) = read_resp(r)? {
            v.push(x);
        }
    }
    Ok(v)
}

/// One RESP2/RESP3 value; `None` for an attribute (which precedes the real reply).
fn read_resp(r: &mut impl BufRead) -> io::Result<Option<Resp>> {
    let line = read_line(r)?;
    let (&kind, rest) = line.split_first().ok_or_else(|| bad("empty line"))?;
    let text = || lossy(rest);
    Ok(Some(match kind {
        b'+' => Resp::Simple(text()),
        b'-' => Resp::Error(text()),
        b':' => Resp::Int(len_of(rest)?),
        b'$' => match len_of(rest)? {
            -1 => Resp::Nil,
            n => Resp::Bulk(blob(r, n)?),
        },
        b'*' => match len_of(rest)? {
            -1 => Resp::Nil,
            n => Resp::Array(many(r, n)?),
        },
        b'_' => Resp::Nil,
        b'#' => Resp::Bool(rest == b"t"),
        b',' => Resp::Double(text()),
        b'(' => Resp::BigNum(text()),
        b'!' => Resp::Error(lossy(&blob(r, len_of(rest)?)?)),
        b'=' => {
            let b = blob(r, len_of(rest)?)?;
            match b.get(3) {
                Some(b':') => Resp::Verbatim(lossy(&b[..3]), b[4..].to_vec()),
                _ => Resp::Verbatim(String::new(), b),
            }
        }
        b'~' => Resp::Set(many(r, len_of(rest)?)?),
        b'>' => Resp::Push(many(r, len_of(rest)?)?),
        b'%' => {
            let flat = many(r, len_of(rest)?.saturating_mul(2))?;
            let pairs = flat.chunks(2).map(|p| (p[0].clone(), p[1].clone()));
            Resp::Map(pairs.collect())
        }
        b'|' => {
            many(r, len_of(rest)?.saturating_mul(2))?;
            return Ok(None);
        }
        other => {
            let line = String::from_utf8_lossy(&line);
            return Err(bad(format!(
                "unknown RESP type byte {:?} in {line:?}",
                other as char
            )));
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn encodes_and_parses_every_reply_kind() {
        let mut out = Vec::new();
        encode(&mut out, &[b"SET", b"k", b"", b"7"]);
        assert_eq!(out, b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n$1\r\n7\r\n");
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf).unwrap();
            s.write_all(
                b"+OK\r\n-ERR x y\r\n:-5\r\n$4\r\na\r\nb\r\n$-1\r\n*2\r\n$1\r\nt\r\n:7\r\n*-1\r\n\
                  %1\r\n+k\r\n#t\r\n|1\r\n+a\r\n+b\r\n_\r\n=7\r\ntxt:abc\r\n~1\r\n,1.5\r\n?\r\n",
            )
            .unwrap();
        });
        let mut c = RawConn::open(addr, Duration::from_secs(5)).unwrap();
        c.queue_raw(b"PING\r\n");
        c.flush().unwrap();
        assert_eq!(c.read().unwrap(), Resp::Simple("OK".into()));
        assert_eq!(c.read().unwrap().err(), "ERR x y");
        assert_eq!(c.read().unwrap().int(), -5);
        assert_eq!(c.read().unwrap().bytes(), b"a\r\nb");
        assert_eq!(c.read().unwrap(), Resp::Nil);
        assert_eq!(c.read().unwrap().grant(), Some((b"t".to_vec(), 7)));
        assert_eq!(c.read().unwrap(), Resp::Nil);
        let m = c.read().unwrap();
        assert_eq!(m.get("K"), Some(Resp::Bool(true)));
        assert_eq!(c.read().unwrap(), Resp::Nil, "the attribute is skipped");
        assert_eq!(c.read().unwrap().text(), "abc");
        assert_eq!(
            c.read().unwrap(),
            Resp::Set(vec![Resp::Double("1.5".into())])
        );
        assert!(c.read().is_err(), "an unknown type byte is an error");
        t.join().unwrap();
    }

    #[test]
    fn error_codes() {
        assert!(starts_with_error_code("WRONGTYPE Operation"));
        assert!(starts_with_error_code("ERR"));
        assert!(!starts_with_error_code("err x") && !starts_with_error_code("1ERR"));
    }
}
