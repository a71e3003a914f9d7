//! What a lock key holds: its mode and its holders. Pure data with the rules that need
//! no queue: who holds it, when each lease ends, and whether a request fits beside the
//! current holders.

use std::fmt;
use std::net::IpAddr;

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

/// The three kinds of lock. The first acquire of a free key (with no waiters) picks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// One holder (the default).
    Exclusive,
    /// A reader of a read-write lock: any number at once, never beside an exclusive one.
    Shared,
    /// A semaphore with this many permits (>= 1).
    Counted(u32),
}

/// Exclusive and shared holders can meet on one key (a read-write lock); a counted key
/// is a semaphore and takes only counted requests with the same limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    ReadWrite,
    Semaphore(u32),
}

impl Mode {
    pub fn family(self) -> Family {
        match self {
            Mode::Exclusive | Mode::Shared => Family::ReadWrite,
            Mode::Counted(n) => Family::Semaphore(n),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
            Mode::Counted(_) => "counted",
        }
    }
}

/// A request whose family does not match the key's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mismatch {
    /// Exclusive/SHARED on a semaphore, or LIMIT on a read-write lock.
    Mode,
    /// LIMIT n on a semaphore of another size.
    Limit(u32),
}

pub fn check_family(have: Family, want: Mode) -> Result<(), Mismatch> {
    match (have, want.family()) {
        (Family::ReadWrite, Family::ReadWrite) => Ok(()),
        (Family::Semaphore(a), Family::Semaphore(b)) if a == b => Ok(()),
        (Family::Semaphore(a), Family::Semaphore(_)) => Err(Mismatch::Limit(a)),
        _ => Err(Mismatch::Mode),
    }
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
    /// Lease deadline, unix ms. The lease is over once the clock passes it.
    pub expires_at: i64,
    pub acquired_at: i64,
    pub client_id: u64,
    v4: PackedV4,
    extra: Option<Box<Extra>>,
}

/// An IPv4 address and port, or a note that the address is elsewhere. `kind` also gives
/// `LockValue` a spare bit pattern for its own tag (the enum stays 64 bytes).
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
}

impl Holder {
    pub fn new(
        digest: Digest,
        fence: u64,
        expires_at: i64,
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
        let extra =
            (owner.is_some() || rest != Addr::None).then(|| Box::new(Extra { owner, addr: rest }));
        Holder {
            digest,
            fence,
            expires_at,
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

    /// Redis expires a key once `now > deadline`; a lease ends at the same instant.
    pub fn live(&self, now: i64) -> bool {
        now <= self.expires_at
    }
}

/// A lock as stored in a key. The exclusive case, by far the most common, keeps its one
/// holder inline (one heap block per lock); shared and counted locks keep a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockValue {
    Exclusive(Holder),
    Many(Box<ManyHolders>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManyHolders {
    /// `Mode::Shared` or `Mode::Counted(n)`.
    pub mode: Mode,
    /// Never empty while stored in a key.
    pub holders: Vec<Holder>,
}

impl LockValue {
    pub fn new(mode: Mode, first: Holder) -> LockValue {
        match mode {
            Mode::Exclusive => LockValue::Exclusive(first),
            m => LockValue::Many(Box::new(ManyHolders {
                mode: m,
                holders: vec![first],
            })),
        }
    }

    pub fn mode(&self) -> Mode {
        match self {
            LockValue::Exclusive(_) => Mode::Exclusive,
            LockValue::Many(m) => m.mode,
        }
    }

    pub fn holders(&self) -> &[Holder] {
        match self {
            LockValue::Exclusive(h) => std::slice::from_ref(h),
            LockValue::Many(m) => &m.holders,
        }
    }

    pub fn holders_mut(&mut self) -> &mut [Holder] {
        match self {
            LockValue::Exclusive(h) => std::slice::from_mut(h),
            LockValue::Many(m) => &mut m.holders,
        }
    }

    pub fn find(&self, d: &Digest) -> Option<usize> {
        self.holders().iter().position(|h| h.digest == *d)
    }

    pub fn find_fence(&self, fence: u64) -> Option<usize> {
        self.holders().iter().position(|h| h.fence == fence)
    }

    /// Adds a holder to a shared or counted lock (an exclusive one is replaced whole).
    pub fn push(&mut self, h: Holder) {
        match self {
            LockValue::Exclusive(old) => *old = h,
            LockValue::Many(m) => m.holders.push(h),
        }
    }

    /// Removes holder `i`; false when it was the last one (the key must go).
    pub fn remove(&mut self, i: usize) -> bool {
        match self {
            LockValue::Exclusive(_) => false,
            LockValue::Many(m) => {
                if i < m.holders.len() {
                    m.holders.remove(i);
                }
                !m.holders.is_empty()
            }
        }
    }

    /// Drops every holder whose lease is over; returns their fences and whether none is
    /// left (then the caller deletes the key; an exclusive value is left as it was).
    pub fn reap(&mut self, now: i64) -> (Vec<u64>, bool) {
        match self {
            LockValue::Exclusive(h) if !h.live(now) => (vec![h.fence], true),
            LockValue::Exclusive(_) => (Vec::new(), false),
            LockValue::Many(m) => {
                let gone: Vec<u64> = m
                    .holders
                    .iter()
                    .filter(|h| !h.live(now))
                    .map(|h| h.fence)
                    .collect();
                if !gone.is_empty() {
                    m.holders.retain(|h| h.live(now));
                }
                (gone, m.holders.is_empty())
            }
        }
    }

    /// True when a holder is still live at `now`.
    pub fn any_live(&self, now: i64) -> bool {
        self.holders().iter().any(|h| h.live(now))
    }

    /// The key's expiry: the latest lease deadline (the key lives while any lease does).
    pub fn deadline(&self) -> i64 {
        self.holders()
            .iter()
            .map(|h| h.expires_at)
            .max()
            .unwrap_or(i64::MIN)
    }

    /// The first instant at which a lease ends (and a waiter may become grantable).
    pub fn next_lease_end(&self) -> i64 {
        self.holders()
            .iter()
            .map(|h| h.expires_at)
            .min()
            .unwrap_or(i64::MIN)
    }

    /// Whether a new holder of `want` fits beside the live holders at `now` (the family
    /// was checked before).
    pub fn admits(&self, want: Mode, now: i64) -> bool {
        let live = self.holders().iter().filter(|h| h.live(now)).count();
        if live == 0 {
            return true;
        }
        match (self.mode(), want) {
            (Mode::Shared, Mode::Shared) => true,
            (Mode::Counted(n), Mode::Counted(_)) => live < n as usize,
            _ => false,
        }
    }
}

/// Whether a free key (no live holder) of no particular mode admits `want`: always.
/// Kept as a function so that the grant rule reads in one place.
pub fn admits(current: Option<&LockValue>, want: Mode, now: i64) -> bool {
    current.is_none_or(|v| v.admits(want, now))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub fn holder(fence: u64, expires_at: i64) -> Holder {
        Holder::new(
            digest(&fence.to_le_bytes()),
            fence,
            expires_at,
            0,
            1,
            Addr::None,
            None,
        )
    }

    #[test]
    fn digests_are_stable_and_distinct() {
        assert_eq!(digest(b"abc"), digest(b"abc"));
        assert_ne!(digest(b"abc"), digest(b"abd"));
        // Pinned: the digest is part of the RDB/AOF/replication format (cross-checked
        // with the reference implementation: Python's `blake3` package, keyed mode).
        assert_eq!(
            digest(b"token"),
            [227, 227, 21, 212, 75, 13, 78, 245, 149, 30, 189, 29, 58, 80, 77, 46]
        );
    }

    #[test]
    fn addresses_pack_and_print_back() {
        for text in [
            "127.0.0.1:6379",
            "10.1.2.3:1",
            "::1:50000",
            "fe80::1:2",
            "/tmp/redis.sock:0",
            "weird",
        ] {
            let a = Addr::parse(text.as_bytes());
            assert_eq!(a.to_string(), text, "{a:?}");
        }
        assert!(matches!(Addr::parse(b"127.0.0.1:6379"), Addr::V4(..)));
        assert!(matches!(Addr::parse(b"::1:5"), Addr::V6(..)));
        assert_eq!(Addr::parse(b""), Addr::None);
        assert_eq!(
            Addr::from_ip_port("127.0.0.1", 5),
            Addr::V4([127, 0, 0, 1], 5)
        );
        assert!(std::mem::size_of::<Addr>() <= 24);
    }

    #[test]
    fn an_exclusive_lock_is_one_64_byte_block() {
        assert_eq!(std::mem::size_of::<Holder>(), 64);
        assert_eq!(std::mem::size_of::<LockValue>(), 64);
    }

    #[test]
    fn addresses_and_owners_round_trip_through_a_holder() {
        for (addr, owner) in [
            (Addr::V4([1, 2, 3, 4], 5), None),
            (
                Addr::V4([1, 2, 3, 4], 5),
                Some(b"o".to_vec().into_boxed_slice()),
            ),
            (Addr::V6([9; 16], 7), None),
            (
                Addr::Text(b"/s:0".to_vec().into()),
                Some(b"x".to_vec().into()),
            ),
            (Addr::None, None),
        ] {
            let h = Holder::new([1; 16], 2, 3, 4, 5, addr.clone(), owner.clone());
            assert_eq!(h.addr(), addr);
            assert_eq!(h.owner(), owner.as_deref());
        }
        assert_eq!(
            holder(1, 1).extra_bytes(),
            0,
            "no second block without owner"
        );
    }

    #[test]
    fn families() {
        use Mode::*;
        assert_eq!(check_family(Family::ReadWrite, Shared), Ok(()));
        assert_eq!(check_family(Family::ReadWrite, Exclusive), Ok(()));
        assert_eq!(
            check_family(Family::ReadWrite, Counted(2)),
            Err(Mismatch::Mode)
        );
        assert_eq!(
            check_family(Family::Semaphore(2), Shared),
            Err(Mismatch::Mode)
        );
        assert_eq!(
            check_family(Family::Semaphore(2), Counted(3)),
            Err(Mismatch::Limit(2))
        );
        assert_eq!(check_family(Family::Semaphore(2), Counted(2)), Ok(()));
    }

    #[test]
    fn admission() {
        let x = LockValue::new(Mode::Exclusive, holder(1, 100));
        assert!(!x.admits(Mode::Shared, 50));
        assert!(x.admits(Mode::Shared, 101), "an ended lease admits anyone");
        let mut s = LockValue::new(Mode::Shared, holder(1, 100));
        assert!(s.admits(Mode::Shared, 50));
        assert!(!s.admits(Mode::Exclusive, 50));
        s.push(holder(2, 200));
        assert_eq!(s.deadline(), 200);
        assert_eq!(s.next_lease_end(), 100);
        assert_eq!(s.reap(150), (vec![1], false));
        assert_eq!(s.reap(250), (vec![2], true));
        let mut x2 = x.clone();
        assert_eq!(x2.reap(100), (vec![], false));
        assert_eq!(x2.reap(101), (vec![1], true));
        let mut c = LockValue::new(Mode::Counted(2), holder(1, 100));
        assert!(c.admits(Mode::Counted(2), 50));
        c.push(holder(2, 100));
        assert!(!c.admits(Mode::Counted(2), 50));
        assert!(c.remove(0));
        assert!(!c.remove(0), "the last holder is gone");
    }
}
