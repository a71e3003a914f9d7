//! One holder of a lock: the digest of its token, its fence, its lease, when it was
//! granted, its owner label and its client, and the field half of the validity rule.

use std::fmt;
use std::net::IpAddr;

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
/// Laid out to keep an exclusive lock in one 64-byte heap block: the common case (an
/// IPv4 client, no owner label) is inline; an owner label or another kind of address
/// goes to a second block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub digest: Digest,
    pub fence: u64,
    /// The lease's end on the server's monotonic clock, in microseconds. The lease is
    /// over once the clock reaches it.
    pub deadline: i64,
    /// When it was granted, unix ms (shown by LOCK.INFO; no rule depends on it).
    pub acquired_at: i64,
    pub client_id: u64,
    v4: PackedV4,
    extra: Option<Box<Extra>>,
}

/// An IPv4 address and port, or a note that the address is elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PackedV4 {
    kind: AddrKind,
    ip: [u8; 4],
    port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum AddrKind {
    /// None, or kept in `Extra`.
    NotV4,
    V4,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Extra {
    owner: Option<Box<[u8]>>,
    addr: Addr,
    /// Lock-delay (ms): if this holder's lease ends without a release, the key is not
    /// granted for this long after (its writes may still be in flight).
    lock_delay: u32,
    /// The session this grant belongs to (the digest of its id): its lease is the
    /// session's, and the session's end releases it.
    session: Option<Digest>,
}

impl Extra {
    fn none() -> Box<Extra> {
        Box::new(Extra {
            owner: None,
            addr: Addr::None,
            lock_delay: 0,
            session: None,
        })
    }
}

impl Holder {
    pub fn new(
        digest: Digest,
        fence: u64,
        deadline: i64,
        acquired_at: i64,
        client_id: u64,
        addr: Addr,
        owner: Option<Box<[u8]>>,
    ) -> Holder {
        let (v4, rest) = match addr {
            Addr::V4(ip, port) => (
                PackedV4 {
                    kind: AddrKind::V4,
                    ip,
                    port,
                },
                Addr::None,
            ),
            other => (
                PackedV4 {
                    kind: AddrKind::NotV4,
                    ip: [0; 4],
                    port: 0,
                },
                other,
            ),
        };
        let extra = (owner.is_some() || rest != Addr::None).then(|| {
            Box::new(Extra {
                owner,
                addr: rest,
                lock_delay: 0,
                session: None,
            })
        });
        Holder {
            digest,
            fence,
            deadline,
            acquired_at,
            client_id,
            v4,
            extra,
        }
    }

    pub fn addr(&self) -> Addr {
        match (self.v4.kind, &self.extra) {
            (AddrKind::V4, _) => Addr::V4(self.v4.ip, self.v4.port),
            (AddrKind::NotV4, Some(e)) => e.addr.clone(),
            (AddrKind::NotV4, None) => Addr::None,
        }
    }

    pub fn owner(&self) -> Option<&[u8]> {
        self.extra.as_ref().and_then(|e| e.owner.as_deref())
    }

    /// The lock-delay of this holder (ms; 0: none).
    pub fn lock_delay(&self) -> u32 {
        self.extra.as_ref().map_or(0, |e| e.lock_delay)
    }

    /// Sets (or clears) the owner label.
    pub fn set_owner(&mut self, owner: Option<Box<[u8]>>) {
        match (&mut self.extra, owner) {
            (Some(e), o) => e.owner = o,
            (None, None) => {}
            (None, Some(o)) => {
                let mut e = Extra::none();
                e.owner = Some(o);
                self.extra = Some(e);
            }
        }
    }

    /// The session this grant belongs to (the digest of the session's id).
    pub fn session(&self) -> Option<&Digest> {
        self.extra.as_ref().and_then(|e| e.session.as_ref())
    }

    /// This holder in the session `s` (or in none).
    pub fn with_session(mut self, s: Option<Digest>) -> Holder {
        if s.is_some() || self.extra.is_some() {
            self.extra.get_or_insert_with(Extra::none).session = s;
        }
        self
    }

    /// This holder with a lock-delay of `ms`.
    pub fn with_lock_delay(mut self, ms: u32) -> Holder {
        if ms > 0 || self.extra.is_some() {
            self.extra.get_or_insert_with(Extra::none).lock_delay = ms;
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
        self.extra.as_ref().map_or(0, |e| {
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
        if self.client_id > i64::MAX as u64 {
            return Err(Problem::ClientId);
        }
        Ok(())
    }
}
