//! One holder of a lock: the digest of its token, its fence, its lease, when it was
//! granted, its owner label and its client, and the field half of the validity rule.

use std::fmt;
use std::net::IpAddr;

use crate::ffi::tagged::BoxOrBits;

use super::fence::MAX_FENCE;

/// Longest TOKEN and OWNER accepted, in bytes.
pub const MAX_TOKEN_LEN: usize = 256;
pub const MAX_OWNER_LEN: usize = 256;
/// The largest `LIMIT` (permits of a counted lock), and so the most holders of any lock.
pub const MAX_LIMIT: u32 = 1_000_000;
/// Longest client address kept from a replicated or loaded value.
pub const MAX_ADDR_LEN: usize = 128;
/// Why a holder cannot be part of a value (the validity rule's verdicts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    /// Another holder has this token's digest.
    SameToken,
    /// Another holder has this fence.
    SameFence,
    /// The lock has as many holders as its mode allows.
    Full,
    /// A fence of 0, or above the ceiling the caller gave.
    FenceOutOfRange,
    /// An owner label of 0 or more than `MAX_OWNER_LEN` bytes.
    OwnerLength,
    /// A client address of more than `MAX_ADDR_LEN` bytes.
    AddrLength,
    /// A client id above `i64::MAX` (it is replied as a signed integer).
    ClientId,
    /// A mode that cannot exist (LIMIT 0 or above `MAX_LIMIT`).
    BadMode,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Problem::SameToken => "two holders with one token",
            Problem::SameFence => "two holders with one fence",
            Problem::Full => "more holders than the mode allows",
            Problem::FenceOutOfRange => "a fence out of range",
            Problem::OwnerLength => "an owner label of bad length",
            Problem::AddrLength => "a client address too long",
            Problem::ClientId => "a client id out of range",
            Problem::BadMode => "an impossible mode",
        })
    }
}

/// A token is never stored: only this keyed BLAKE3 digest of it is (in the key, RDB,
/// AOF and the replication stream). 128 bits keep a second preimage out of reach; a
/// server-generated token (UUID v4, 122 random bits) cannot be recovered from it.
pub type Digest = [u8; 16];

/// Domain separation for the digest: a fixed key, so that every server (a replica, a
/// restarted primary, another node after a slot migration) computes the same digest.
const DIGEST_KEY: [u8; 32] = *b"redis-lock token digest, v1.....";

pub fn digest(token: &[u8]) -> Digest {
    let full = blake3::keyed_hash(&DIGEST_KEY, token);
    let mut d = [0u8; 16];
    d.copy_from_slice(&full.as_bytes()[..16]);
    d
}

/// The acquiring client's address, packed (an IP and a port take 24 bytes instead of a
/// heap string). Shown as `ip:port`, like `CLIENT LIST`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Addr {
    /// Unknown (AOF replay, a timer, a value from an older file without one).
    #[default]
    None,
    V4([u8; 4], u16),
    V6([u8; 16], u16),
    /// Anything else (a unix socket path), kept as text.
    Text(Box<[u8]>),
}

impl Addr {
    /// From the `ip` text and port the server reports for a client.
    pub fn from_ip_port(ip: &str, port: u16) -> Addr {
        match ip.parse::<IpAddr>() {
            Ok(IpAddr::V4(a)) => Addr::V4(a.octets(), port),
            Ok(IpAddr::V6(a)) => Addr::V6(a.octets(), port),
            Err(_) if ip.is_empty() => Addr::None,
            Err(_) => Addr::Text(format!("{ip}:{port}").into_bytes().into_boxed_slice()),
        }
    }

    /// Parses the text form (`ip:port`, `[v6]:port` or `v6:port` as the server writes
    /// it); anything else is kept as text. Used for replicated and loaded values.
    pub fn parse(text: &[u8]) -> Addr {
        if text.is_empty() {
            return Addr::None;
        }
        let parsed = std::str::from_utf8(text).ok().and_then(|s| {
            let (ip, port) = s.rsplit_once(':')?;
            let port: u16 = port.parse().ok()?;
            let ip = ip.trim_start_matches('[').trim_end_matches(']');
            let a = Addr::from_ip_port(ip, port);
            // Only accept what prints back the same, so nothing is lost.
            (a.to_string().as_bytes() == text).then_some(a)
        });
        parsed.unwrap_or_else(|| Addr::Text(text.to_vec().into_boxed_slice()))
    }

    pub fn text_len(&self) -> usize {
        match self {
            Addr::Text(t) => t.len(),
            _ => self.to_string().len(),
        }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::None => Ok(()),
            Addr::V4(ip, port) => write!(f, "{}:{port}", std::net::Ipv4Addr::from(*ip)),
            Addr::V6(ip, port) => write!(f, "{}:{port}", std::net::Ipv6Addr::from(*ip)),
            Addr::Text(t) => f.write_str(&String::from_utf8_lossy(t)),
        }
    }
}

/// One grant of a lock: its own digest, fence, lease, owner and client.
///
/// 48 bytes, so that an exclusive lock is one block of jemalloc's 48-byte class: the
/// common case (a client id below 2^32, an IPv4 client or none, a grant time near its
/// fence's clock term, no owner label, session or lock-delay) is all inline; anything
/// else moves every field the compact form cannot hold to one boxed [`Extra`].
#[derive(Clone)]
pub struct Holder {
    pub digest: Digest,
    /// Fixed at the grant (nothing changes it): the compact form keeps the grant time
    /// relative to it.
    pub fence: u64,
    /// The lease's end on the server's monotonic clock, in microseconds. The lease is
    /// over once the clock reaches it.
    pub deadline: i64,
    /// Compact form: when it was granted, as [`pack_acquired`] keeps it.
    acquired: i32,
    /// Compact form: the client id.
    client: u32,
    tail: Tail,
}

/// The rest of a holder, in one word: inline (bit 0: there is an address; bits 1..17
/// its port; bits 17..49 its IPv4 address), or the holder's own boxed [`Extra`].
#[derive(Clone)]
struct Tail(BoxOrBits<Extra>);

impl Tail {
    fn inline(v4: Option<([u8; 4], u16)>) -> Tail {
        let bits = v4.map_or(0, |(ip, port)| {
            (u64::from(u32::from_be_bytes(ip)) << 17) | (u64::from(port) << 1) | 1
        });
        Tail(BoxOrBits::bits(bits))
    }

    fn boxed(e: Box<Extra>) -> Tail {
        Tail(BoxOrBits::boxed(e))
    }

    fn extra(&self) -> Option<&Extra> {
        self.0.get()
    }

    fn extra_mut(&mut self) -> Option<&mut Extra> {
        self.0.get_mut()
    }

    /// The inline address, if any.
    fn v4(&self) -> Option<([u8; 4], u16)> {
        let b = self.0.get_bits().filter(|b| b & 1 == 1)?;
        Some((((b >> 17) as u32).to_be_bytes(), (b >> 1) as u16))
    }
}

/// The grant time (unix ms) as the difference from the fence's clock term (`fence >>
/// shift`, shift 10 or 20, the latter in bit 0), when that fits in 31 bits (a grant
/// made or replicated here: its fence was taken from the clock at that time).
#[inline]
fn pack_acquired(fence: u64, acquired_at: i64) -> Option<i32> {
    let fits = |d: i64| (-(1 << 30)..1 << 30).contains(&d);
    let d10 = acquired_at.wrapping_sub((fence >> 10) as i64);
    if fits(d10) {
        return Some((d10 as i32) << 1);
    }
    let d20 = acquired_at.wrapping_sub((fence >> 20) as i64);
    fits(d20).then_some(((d20 as i32) << 1) | 1)
}

fn unpack_acquired(fence: u64, packed: i32) -> i64 {
    let shift = if packed & 1 == 0 { 10 } else { 20 };
    (fence >> shift) as i64 + i64::from(packed >> 1)
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Extra {
    acquired_at: i64,
    client_id: u64,
    addr: Addr,
    owner: Option<Box<[u8]>>,
    /// Lock-delay (ms): if this holder's lease ends without a release, the key is not
    /// granted for this long after (its writes may still be in flight).
    lock_delay: u32,
    /// The session this grant belongs to (the digest of its id): its lease is the
    /// session's, and the session's end releases it.
    session: Option<Digest>,
}

/// Equal when every field is, whichever form holds them.
impl PartialEq for Holder {
    fn eq(&self, o: &Holder) -> bool {
        self.digest == o.digest
            && self.fence == o.fence
            && self.deadline == o.deadline
            && self.acquired_at() == o.acquired_at()
            && self.client_id() == o.client_id()
            && self.addr() == o.addr()
            && self.owner() == o.owner()
            && self.lock_delay() == o.lock_delay()
            && self.session() == o.session()
    }
}

impl Eq for Holder {}

impl fmt::Debug for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Holder")
            .field("digest", &self.digest)
            .field("fence", &self.fence)
            .field("deadline", &self.deadline)
            .field("acquired_at", &self.acquired_at())
            .field("client_id", &self.client_id())
            .field("addr", &self.addr())
            .field("owner", &self.owner())
            .field("lock_delay", &self.lock_delay())
            .field("session", &self.session())
            .finish()
    }
}

impl Holder {
    #[inline]
    pub fn new(
        digest: Digest,
        fence: u64,
        deadline: i64,
        acquired_at: i64,
        client_id: u64,
        addr: Addr,
        owner: Option<Box<[u8]>>,
    ) -> Holder {
        let acquired = pack_acquired(fence, acquired_at);
        let client = u32::try_from(client_id).ok();
        let v4 = match addr {
            Addr::V4(ip, port) => Some(Some((ip, port))),
            Addr::None => Some(None),
            _ => None,
        };
        let (acquired, client, tail) = match (acquired, client, v4, owner) {
            (Some(a), Some(c), Some(v4), None) => (a, c, Tail::inline(v4)),
            (_, _, _, owner) => {
                let e = Extra {
                    acquired_at,
                    client_id,
                    addr,
                    owner,
                    lock_delay: 0,
                    session: None,
                };
                (0, 0, Tail::boxed(Box::new(e)))
            }
        };
        Holder {
            digest,
            fence,
            deadline,
            acquired,
            client,
            tail,
        }
    }

    /// When it was granted, unix ms (shown by LOCK.INFO; no rule depends on it).
    pub fn acquired_at(&self) -> i64 {
        self.tail.extra().map_or_else(
            || unpack_acquired(self.fence, self.acquired),
            |e| e.acquired_at,
        )
    }

    pub fn client_id(&self) -> u64 {
        self.tail
            .extra()
            .map_or(u64::from(self.client), |e| e.client_id)
    }

    /// The boxed form's fields, made from the compact ones if need be.
    fn extra_mut(&mut self) -> &mut Extra {
        if self.tail.extra().is_none() {
            let e = Extra {
                acquired_at: self.acquired_at(),
                client_id: self.client_id(),
                addr: self.addr(),
                owner: None,
                lock_delay: 0,
                session: None,
            };
            (self.acquired, self.client, self.tail) = (0, 0, Tail::boxed(Box::new(e)));
        }
        match self.tail.extra_mut() {
            Some(e) => e,
            None => unreachable!("boxed just above"),
        }
    }

    pub fn addr(&self) -> Addr {
        match self.tail.extra() {
            Some(e) => e.addr.clone(),
            None => self
                .tail
                .v4()
                .map_or(Addr::None, |(ip, port)| Addr::V4(ip, port)),
        }
    }

    pub fn owner(&self) -> Option<&[u8]> {
        self.tail.extra().and_then(|e| e.owner.as_deref())
    }

    /// The lock-delay of this holder (ms; 0: none).
    pub fn lock_delay(&self) -> u32 {
        self.tail.extra().map_or(0, |e| e.lock_delay)
    }

    /// Sets (or clears) the owner label.
    pub fn set_owner(&mut self, owner: Option<Box<[u8]>>) {
        if owner.is_some() || self.tail.extra().is_some() {
            self.extra_mut().owner = owner;
        }
    }

    /// The session this grant belongs to (the digest of the session's id).
    pub fn session(&self) -> Option<&Digest> {
        self.tail.extra().and_then(|e| e.session.as_ref())
    }

    /// This holder in the session `s` (or in none).
    pub fn with_session(mut self, s: Option<Digest>) -> Holder {
        if s.is_some() || self.tail.extra().is_some() {
            self.extra_mut().session = s;
        }
        self
    }

    /// This holder with a lock-delay of `ms`.
    pub fn with_lock_delay(mut self, ms: u32) -> Holder {
        if ms > 0 || self.tail.extra().is_some() {
            self.extra_mut().lock_delay = ms;
        }
        self
    }

    /// When the lock-delay of this holder, ended now by its lease, ends (µs).
    pub fn delay_end(&self) -> Option<i64> {
        let ms = self.lock_delay();
        (ms > 0).then(|| self.deadline.saturating_add(i64::from(ms) * 1000))
    }

    /// Heap bytes beyond the holder itself (for MEMORY USAGE).
    pub fn extra_bytes(&self) -> usize {
        self.tail.extra().map_or(0, |e| {
            let addr = match &e.addr {
                Addr::Text(t) => t.len(),
                _ => 0,
            };
            std::mem::size_of::<Extra>() + e.owner.as_ref().map_or(0, |o| o.len()) + addr
        })
    }

    pub fn live(&self, now: i64) -> bool {
        now < self.deadline
    }

    /// The field half of the validity rule: what a holder must satisfy on its own.
    /// `ceiling` is the largest fence acceptable where it comes from.
    pub fn check(&self, ceiling: u64) -> Result<(), Problem> {
        if self.fence == 0 || self.fence > ceiling.min(MAX_FENCE) {
            return Err(Problem::FenceOutOfRange);
        }
        if self
            .owner()
            .is_some_and(|o| !(1..=MAX_OWNER_LEN).contains(&o.len()))
        {
            return Err(Problem::OwnerLength);
        }
        if self.addr().text_len() > MAX_ADDR_LEN {
            return Err(Problem::AddrLength);
        }
        if self.client_id() > i64::MAX as u64 {
            return Err(Problem::ClientId);
        }
        Ok(())
    }
}
