//! A minimal RESP2 client: enough to send any command (valid or not) and read every
//! reply kind, with pipelining and timeouts. Own code rather than a client crate so that
//! the fuzzer can also write raw, malformed bytes on the same kind of connection.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Largest bulk string or array accepted from a server (a guard against garbage).
const MAX_BULK: usize = 64 * 1024 * 1024;
const MAX_ARRAY: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Reply>),
}

impl Reply {
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Reply::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Reply::Bulk(b) => Some(b),
            Reply::Simple(s) => Some(s.as_bytes()),
            _ => None,
        }
    }

    pub fn as_text(&self) -> Option<String> {
        self.as_bytes()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// `[token, fence]` of a granted LOCK.ACQUIRE.
    pub fn grant(&self) -> Option<(Vec<u8>, u64)> {
        match self {
            Reply::Array(a) if a.len() == 2 => {
                let token = a[0].as_bytes()?.to_vec();
                let fence = u64::try_from(a[1].as_int()?).ok()?;
                Some((token, fence))
            }
            _ => None,
        }
    }

    /// A field of a flat field/value array (LOCK.INFO in RESP2).
    pub fn field(&self, name: &str) -> Option<&Reply> {
        match self {
            Reply::Array(a) => a
                .chunks(2)
                .find(|kv| kv.len() == 2 && kv[0].as_bytes() == Some(name.as_bytes()))
                .map(|kv| &kv[1]),
            _ => None,
        }
    }
}

/// Anything that can be sent as one command argument.
pub trait Arg {
    fn arg(&self) -> Vec<u8>;
}
impl Arg for &str {
    fn arg(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}
impl Arg for String {
    fn arg(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}
impl Arg for &String {
    fn arg(&self) -> Vec<u8> {
        self.as_bytes().to_vec()
    }
}
impl Arg for &[u8] {
    fn arg(&self) -> Vec<u8> {
        self.to_vec()
    }
}
impl Arg for Vec<u8> {
    fn arg(&self) -> Vec<u8> {
        self.clone()
    }
}
impl Arg for &Vec<u8> {
    fn arg(&self) -> Vec<u8> {
        self.to_vec()
    }
}
macro_rules! int_arg {
    ($($t:ty),*) => {$(
        impl Arg for $t {
            fn arg(&self) -> Vec<u8> {
                self.to_string().into_bytes()
            }
        }
    )*};
}
int_arg!(u64, i64, u32, i32, usize, u16);

/// `args![a, b, c]`: a `Vec<Vec<u8>>` of mixed argument types.
#[macro_export]
macro_rules! args {
    ($($a:expr),* $(,)?) => {
        vec![$($crate::resp::Arg::arg(&$a)),*]
    };
}

pub struct Conn {
    reader: BufReader<TcpStream>,
    out: Vec<u8>,
}

impl Conn {
    pub fn connect(addr: SocketAddr, timeout: Duration) -> io::Result<Conn> {
        let s = TcpStream::connect_timeout(&addr, timeout)?;
        Conn::from_stream(s, timeout)
    }

    pub fn from_stream(s: TcpStream, timeout: Duration) -> io::Result<Conn> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        Ok(Conn {
            reader: BufReader::with_capacity(64 * 1024, s),
            out: Vec::with_capacity(4096),
        })
    }

    pub fn set_read_timeout(&self, t: Duration) -> io::Result<()> {
        self.reader.get_ref().set_read_timeout(Some(t))
    }

    /// Encodes one command into the output buffer (sent by `flush`).
    pub fn queue(&mut self, args: &[Vec<u8>]) {
        self.out
            .extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            self.out
                .extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            self.out.extend_from_slice(a);
            self.out.extend_from_slice(b"\r\n");
        }
    }

    /// Queues raw bytes as they are (malformed protocol for the fuzzer).
    pub fn queue_raw(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
    }

    pub fn flush(&mut self) -> io::Result<()> {
        let r = self.reader.get_mut().write_all(&self.out);
        self.out.clear();
        r
    }

    pub fn cmd(&mut self, args: &[Vec<u8>]) -> io::Result<Reply> {
        self.queue(args);
        self.flush()?;
        self.read()
    }

    /// Sends several commands in one write and reads all their replies.
    pub fn pipeline(&mut self, cmds: &[Vec<Vec<u8>>]) -> io::Result<Vec<Reply>> {
        for c in cmds {
            self.queue(c);
        }
        self.flush()?;
        cmds.iter().map(|_| self.read()).collect()
    }

    fn line(&mut self) -> io::Result<Vec<u8>> {
        let mut buf = Vec::new();
        let n = (&mut self.reader)
            .take(MAX_BULK as u64)
            .read_until(b'\n', &mut buf)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        if buf.len() < 2 || buf[buf.len() - 2] != b'\r' {
            return Err(bad("line without CRLF"));
        }
        buf.truncate(buf.len() - 2);
        Ok(buf)
    }

    pub fn read(&mut self) -> io::Result<Reply> {
        let line = self.line()?;
        let (kind, rest) = line.split_first().ok_or_else(|| bad("empty reply line"))?;
        let text = || String::from_utf8_lossy(rest).into_owned();
        let num = || -> io::Result<i64> {
            std::str::from_utf8(rest)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| bad("bad integer in reply"))
        };
        match kind {
            b'+' => Ok(Reply::Simple(text())),
            b'-' => Ok(Reply::Error(text())),
            b':' => Ok(Reply::Int(num()?)),
            b'$' => {
                let n = num()?;
                if n < 0 {
                    return Ok(Reply::Nil);
                }
                let n = usize::try_from(n).map_err(|_| bad("bulk length"))?;
                if n > MAX_BULK {
                    return Err(bad("bulk too long"));
                }
                let mut buf = vec![0u8; n + 2];
                self.reader.read_exact(&mut buf)?;
                if &buf[n..] != b"\r\n" {
                    return Err(bad("bulk without CRLF"));
                }
                buf.truncate(n);
                Ok(Reply::Bulk(buf))
            }
            b'*' => {
                let n = num()?;
                if n < 0 {
                    return Ok(Reply::Nil);
                }
                let n = usize::try_from(n).map_err(|_| bad("array length"))?;
                if n > MAX_ARRAY {
                    return Err(bad("array too long"));
                }
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.read()?);
                }
                Ok(Reply::Array(items))
            }
            _ => Err(bad("unknown reply type")),
        }
    }
}

fn bad(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn parses_every_reply_kind() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf).unwrap();
            s.write_all(
                b"+OK\r\n-ERR x y\r\n:-5\r\n$4\r\na\r\nb\r\n$-1\r\n*2\r\n$1\r\nt\r\n:7\r\n*-1\r\n",
            )
            .unwrap();
        });
        let mut c = Conn::connect(addr, Duration::from_secs(5)).unwrap();
        c.queue(&args!["PING"]);
        c.flush().unwrap();
        assert_eq!(c.read().unwrap(), Reply::Simple("OK".into()));
        assert_eq!(c.read().unwrap(), Reply::Error("ERR x y".into()));
        assert_eq!(c.read().unwrap(), Reply::Int(-5));
        assert_eq!(c.read().unwrap(), Reply::Bulk(b"a\r\nb".to_vec()));
        assert_eq!(c.read().unwrap(), Reply::Nil);
        let g = c.read().unwrap();
        assert_eq!(g.grant(), Some((b"t".to_vec(), 7)));
        assert_eq!(c.read().unwrap(), Reply::Nil);
        t.join().unwrap();
    }
}
