//! Replies as values: the engine answers with a [`Reply`], built whole before anything is
//! written, and one function of the shell (`ffi::reply::send`) writes it, counting the
//! elements itself. A panic while a reply is built can no longer leave half of one on the
//! client's connection.

use crate::error::LockError;

/// Bytes a reply carries: borrowed from the request, a generated token, or owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bytes<'a> {
    Ref(&'a [u8]),
    Uuid([u8; 36]),
    Own(Vec<u8>),
}

impl Bytes<'_> {
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Ref(b) => b,
            Bytes::Uuid(u) => u,
            Bytes::Own(v) => v,
        }
    }

    pub fn into_owned(self) -> Vec<u8> {
        match self {
            Bytes::Own(v) => v,
            other => other.as_slice().to_vec(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<'a> {
    /// RESP2 null bulk / RESP3 null.
    Nil,
    Int(i64),
    /// `+OK`.
    Ok,
    Bulk(Bytes<'a>),
    /// `[token, fence]`: a grant (kept apart so the common reply needs no allocation).
    Grant(Bytes<'a>, u64),
    Array(Vec<Reply<'a>>),
    /// A map in RESP3, a flat field/value array in RESP2.
    Map(Vec<(&'static str, Reply<'a>)>),
    Error(LockError),
}

impl<'a> Reply<'a> {
    pub fn text(s: &'static str) -> Reply<'a> {
        Reply::Bulk(Bytes::Ref(s.as_bytes()))
    }

    pub fn bool(b: bool) -> Reply<'a> {
        Reply::Int(i64::from(b))
    }

    pub fn opt_bytes(b: Option<&'a [u8]>) -> Reply<'a> {
        b.map_or(Reply::Nil, |b| Reply::Bulk(Bytes::Ref(b)))
    }
}

impl Reply<'_> {
    /// The same reply owning all its bytes.
    pub fn into_static(self) -> Reply<'static> {
        match self {
            Reply::Nil => Reply::Nil,
            Reply::Int(i) => Reply::Int(i),
            Reply::Ok => Reply::Ok,
            Reply::Bulk(b) => Reply::Bulk(Bytes::Own(b.into_owned())),
            Reply::Grant(b, f) => Reply::Grant(Bytes::Own(b.into_owned()), f),
            Reply::Array(v) => Reply::Array(v.into_iter().map(Reply::into_static).collect()),
            Reply::Map(v) => Reply::Map(v.into_iter().map(|(k, r)| (k, r.into_static())).collect()),
            Reply::Error(e) => Reply::Error(e),
        }
    }
}

impl From<LockError> for Reply<'_> {
    fn from(e: LockError) -> Self {
        Reply::Error(e)
    }
}
