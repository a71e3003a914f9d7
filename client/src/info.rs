//! `LOCK.INFO`, parsed.

use redis::Value;

use crate::error::{Error, Result};
use crate::options::LockMode;

/// What `LOCK.INFO` says about a held lock (it never reveals a token).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockInfo {
    /// `module` (taken with LOCK.ACQUIRE) or `string` (a classic `SET NX PX` lock).
    pub kind: String,
    /// Exclusive, shared or counted (with its limit); `None` for a string lock (or a mode
    /// this client does not know: `fields` still has it).
    pub mode: Option<LockMode>,
    /// Milliseconds until the latest lease ends (-1: no expiry).
    pub ttl_ms: i64,
    /// The latest lease deadline, unix ms (server clock).
    pub expires_at_ms: Option<i64>,
    /// The holder of an exclusive lock (`None` for a shared or counted lock, whose
    /// holders are in [`holder_list`](Self::holder_list), and for a string lock).
    pub fence: Option<u64>,
    pub owner: Option<String>,
    pub acquired_at_ms: Option<i64>,
    pub client_id: Option<i64>,
    pub client_addr: Option<String>,
    /// The permits of a counted lock.
    pub limit: Option<u32>,
    /// How many holders (`None` for a string lock, which has one).
    pub holders: Option<u64>,
    /// Clients queued with BLOCK.
    pub waiters: i64,
    /// One entry per holder, in the server's order (empty for a string lock).
    pub holder_list: Vec<HolderInfo>,
    /// Every top-level field as the server sent it, in order (`None` = nil), for display.
    /// `holder-list` is rendered on one line (`[{fence: 1, owner: a, ...}, {...}]`).
    pub fields: Vec<(String, Option<String>)>,
}

/// One holder of a lock, from the `holder-list` of `LOCK.INFO`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HolderInfo {
    /// This holder's fencing token (`LOCK.FORCERELEASE key FENCE f` removes it).
    pub fence: u64,
    pub owner: Option<String>,
    /// Milliseconds until this holder's lease ends.
    pub ttl_ms: i64,
    /// This holder's lease deadline, unix ms (server clock).
    pub expires_at_ms: Option<i64>,
    pub acquired_at_ms: Option<i64>,
    pub client_id: Option<i64>,
    pub client_addr: Option<String>,
    /// Every field as the server sent it, in order, for display.
    pub fields: Vec<(String, Option<String>)>,
}

/// A scalar reply as text (`None` for nil); `Err` for an aggregate.
fn text(v: &Value) -> Result<Option<String>> {
    Ok(match v {
        Value::Nil => None,
        Value::Int(i) => Some(i.to_string()),
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Okay => Some("OK".into()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Double(d) => Some(d.to_string()),
        Value::Boolean(b) => Some(b.to_string()),
        Value::BigNumber(n) => Some(n.to_string()),
        other => return Err(Error::Protocol(format!("LOCK.INFO field value {other:?}"))),
    })
}

/// Any reply as one line of text, for fields this client does not know.
fn render(v: &Value) -> Option<String> {
    match v {
        Value::Array(items) | Value::Set(items) => Some(format!(
            "[{}]",
            items
                .iter()
                .map(|i| render(i).unwrap_or_else(|| "(nil)".into()))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Value::Map(m) => Some(render_pairs(m.iter().map(|(k, v)| {
            (
                render(k).unwrap_or_default(),
                render(v).unwrap_or_else(|| "(nil)".into()),
            )
        }))),
        other => text(other).unwrap_or_else(|_| Some(format!("{other:?}"))),
    }
}

fn render_pairs(pairs: impl Iterator<Item = (String, String)>) -> String {
    let inner: Vec<String> = pairs.map(|(k, v)| format!("{k}: {v}")).collect();
    format!("{{{}}}", inner.join(", "))
}

/// The field/value pairs of a RESP2 flat array or a RESP3 map.
fn pairs<'a>(v: &'a Value, what: &str) -> Result<Vec<(&'a Value, &'a Value)>> {
    match v {
        Value::Array(items) if items.len() % 2 == 0 => {
            Ok(items.chunks_exact(2).map(|c| (&c[0], &c[1])).collect())
        }
        Value::Map(m) => Ok(m.iter().map(|(k, v)| (k, v)).collect()),
        other => Err(Error::Protocol(format!("{what} {other:?}"))),
    }
}

/// A field's value as a number of the type asked for (`None` when nil or not one).
fn num<T: std::str::FromStr>(v: &Option<String>) -> Option<T> {
    v.as_deref().and_then(|s| s.parse().ok())
}

impl HolderInfo {
    fn from_value(v: &Value) -> Result<HolderInfo> {
        let mut h = HolderInfo::default();
        let mut fence = None;
        for (k, v) in pairs(v, "LOCK.INFO holder-list entry")? {
            let key = text(k)?.unwrap_or_default();
            let val = text(v)?;
            match key.as_str() {
                "fence" => fence = num(&val),
                "owner" => h.owner = val.clone(),
                "ttl" => h.ttl_ms = num(&val).unwrap_or(-1),
                "expires-at" => h.expires_at_ms = num(&val),
                "acquired-at" => h.acquired_at_ms = num(&val),
                "client-id" => h.client_id = num(&val),
                "client-addr" => h.client_addr = val.clone(),
                _ => {}
            }
            h.fields.push((key, val));
        }
        h.fence = fence
            .ok_or_else(|| Error::Protocol("LOCK.INFO holder-list entry without a fence".into()))?;
        Ok(h)
    }

    /// `{fence: 1, owner: (nil), ttl: 900, ...}`
    fn render(&self) -> String {
        render_pairs(
            self.fields
                .iter()
                .map(|(k, v)| (k.clone(), v.clone().unwrap_or_else(|| "(nil)".to_string()))),
        )
    }
}

impl LockInfo {
    /// Parses the RESP2 flat field/value array or the RESP3 map; `Ok(None)` for nil.
    pub(crate) fn from_value(v: &Value) -> Result<Option<LockInfo>> {
        if let Value::Nil = v {
            return Ok(None);
        }
        let mut info = LockInfo::default();
        let mut mode = None;
        for (k, v) in pairs(v, "LOCK.INFO reply")? {
            let key = text(k)?.unwrap_or_default();
            if key == "holder-list" {
                let Value::Array(items) = v else {
                    return Err(Error::Protocol(format!("LOCK.INFO holder-list {v:?}")));
                };
                info.holder_list = items
                    .iter()
                    .map(HolderInfo::from_value)
                    .collect::<Result<_>>()?;
                let shown: Vec<String> = info.holder_list.iter().map(HolderInfo::render).collect();
                info.fields
                    .push((key, Some(format!("[{}]", shown.join(", ")))));
                continue;
            }
            let val = match v {
                Value::Array(_) | Value::Map(_) | Value::Set(_) => render(v),
                _ => text(v)?,
            };
            match key.as_str() {
                "kind" => info.kind = val.clone().unwrap_or_default(),
                "mode" => mode = val.clone(),
                "ttl" => info.ttl_ms = num(&val).unwrap_or(-1),
                "expires-at" => info.expires_at_ms = num(&val),
                "fence" => info.fence = num(&val),
                "owner" => info.owner = val.clone(),
                "acquired-at" => info.acquired_at_ms = num(&val),
                "client-id" => info.client_id = num(&val),
                "client-addr" => info.client_addr = val.clone(),
                "limit" => info.limit = num(&val),
                "holders" => info.holders = num(&val),
                "waiters" => info.waiters = num(&val).unwrap_or(0),
                _ => {}
            }
            info.fields.push((key, val));
        }
        info.mode = match (mode.as_deref(), info.limit) {
            (Some("exclusive"), _) => Some(LockMode::Exclusive),
            (Some("shared"), _) => Some(LockMode::Shared),
            (Some("counted"), Some(n)) => Some(LockMode::Counted(n)),
            _ => None,
        };
        Ok(Some(info))
    }
}

/// What `LOCK.SESSION INFO` says of an open session (never its id or a token).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionInfo {
    /// Milliseconds until its lease ends.
    pub ttl_ms: i64,
    /// Its lease deadline, unix ms (server clock).
    pub expires_at_ms: Option<i64>,
    /// The lease a keepalive gives by default, ms.
    pub lease_ms: Option<i64>,
    pub owner: Option<String>,
    /// Bound to a connection (it ends `grace_ms` after that connection closes).
    pub bound: bool,
    pub grace_ms: Option<i64>,
    /// Ms left of a bound session whose connection closed (`None` otherwise).
    pub ending_in_ms: Option<i64>,
    /// How many locks it holds on this server.
    pub locks: u64,
    /// Up to 100 of them: (key, fence, db).
    pub lock_list: Vec<(String, u64, i64)>,
    /// Every field but `lock-list` as the server sent it, in order, for display.
    pub fields: Vec<(String, Option<String>)>,
}

impl SessionInfo {
    /// Parses the RESP2 flat field/value array or the RESP3 map; `Ok(None)` for nil.
    pub(crate) fn from_value(v: &Value) -> Result<Option<SessionInfo>> {
        if let Value::Nil = v {
            return Ok(None);
        }
        let mut info = SessionInfo::default();
        for (k, v) in pairs(v, "LOCK.SESSION INFO reply")? {
            let key = text(k)?.unwrap_or_default();
            if key == "lock-list" {
                let Value::Array(items) = v else {
                    return Err(Error::Protocol(format!(
                        "LOCK.SESSION INFO lock-list {v:?}"
                    )));
                };
                for item in items {
                    match item {
                        Value::Array(e) if e.len() == 3 => {
                            let (name, fence, db) = (text(&e[0])?, text(&e[1])?, text(&e[2])?);
                            match (name, num(&fence), num(&db)) {
                                (Some(name), Some(fence), Some(db)) => {
                                    info.lock_list.push((name, fence, db))
                                }
                                _ => {
                                    return Err(Error::Protocol(
                                        "LOCK.SESSION INFO lock-list entry is not [key, fence, db]"
                                            .into(),
                                    ))
                                }
                            }
                        }
                        other => {
                            return Err(Error::Protocol(format!(
                                "LOCK.SESSION INFO lock-list entry {other:?}"
                            )))
                        }
                    }
                }
                continue;
            }
            let val = match v {
                Value::Array(_) | Value::Map(_) | Value::Set(_) => render(v),
                _ => text(v)?,
            };
            match key.as_str() {
                "ttl" => info.ttl_ms = num(&val).unwrap_or(-1),
                "expires-at" => info.expires_at_ms = num(&val),
                "lease" => info.lease_ms = num(&val),
                "owner" => info.owner = val.clone(),
                "bound" => info.bound = num::<i64>(&val).is_some_and(|b| b != 0),
                "grace" => info.grace_ms = num(&val),
                "ending-in" => info.ending_in_ms = num(&val),
                "locks" => info.locks = num(&val).unwrap_or(0),
                _ => {}
            }
            info.fields.push((key, val));
        }
        Ok(Some(info))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    /// A RESP2 flat array from (field, value) pairs.
    fn flat(pairs: Vec<(&str, Value)>) -> Value {
        Value::Array(pairs.into_iter().flat_map(|(k, v)| [bulk(k), v]).collect())
    }

    /// A RESP3 map from (field, value) pairs.
    fn map(pairs: Vec<(&str, Value)>) -> Value {
        Value::Map(pairs.into_iter().map(|(k, v)| (bulk(k), v)).collect())
    }

    fn holder(fence: i64, owner: Option<&str>, ttl: i64, id: i64) -> Vec<(&'static str, Value)> {
        vec![
            ("fence", Value::Int(fence)),
            ("owner", owner.map_or(Value::Nil, bulk)),
            ("ttl", Value::Int(ttl)),
            ("expires-at", Value::Int(1_796_081_613_316)),
            ("acquired-at", Value::Int(1_796_081_553_316)),
            ("client-id", Value::Int(id)),
            ("client-addr", bulk("127.0.0.1:59484")),
        ]
    }

    /// An exclusive lock as the module sends it, with `wrap` making each map.
    fn exclusive(wrap: fn(Vec<(&str, Value)>) -> Value) -> Value {
        wrap(vec![
            ("state", bulk("held")),
            ("kind", bulk("module")),
            ("mode", bulk("exclusive")),
            ("ttl", Value::Int(59_985)),
            ("expires-at", Value::Int(1_796_081_613_316)),
            ("fence", Value::Int(1_839_191_190_761_480)),
            ("owner", bulk("server-1")),
            ("acquired-at", Value::Int(1_796_081_553_316)),
            ("client-id", Value::Int(30)),
            ("client-addr", bulk("127.0.0.1:59484")),
            ("holders", Value::Int(1)),
            ("waiters", Value::Int(2)),
            (
                "holder-list",
                Value::Array(vec![wrap(holder(
                    1_839_191_190_761_480,
                    Some("server-1"),
                    59_985,
                    30,
                ))]),
            ),
        ])
    }

    /// A shared (`limit` None) or counted lock with two holders.
    fn many(wrap: fn(Vec<(&str, Value)>) -> Value, limit: Option<i64>) -> Value {
        let mut f = vec![
            ("state", bulk("held")),
            ("kind", bulk("module")),
            (
                "mode",
                bulk(if limit.is_some() { "counted" } else { "shared" }),
            ),
            ("ttl", Value::Int(59_990)),
            ("expires-at", Value::Int(1_796_081_613_320)),
        ];
        if let Some(n) = limit {
            f.push(("limit", Value::Int(n)));
        }
        f.push(("holders", Value::Int(2)));
        f.push(("waiters", Value::Int(0)));
        f.push((
            "holder-list",
            Value::Array(vec![
                wrap(holder(1_839_191_190_761_476, Some("reader-1"), 59_000, 7)),
                wrap(holder(1_839_191_190_761_477, None, 59_990, 8)),
            ]),
        ));
        wrap(f)
    }

    #[test]
    fn parses_an_exclusive_lock_resp2_and_resp3() {
        for (proto, v) in [("RESP2", exclusive(flat)), ("RESP3", exclusive(map))] {
            let i = LockInfo::from_value(&v).unwrap().unwrap();
            assert_eq!(i.kind, "module", "{proto}");
            assert_eq!(i.mode, Some(LockMode::Exclusive), "{proto}");
            assert_eq!(i.ttl_ms, 59_985);
            assert_eq!(i.expires_at_ms, Some(1_796_081_613_316));
            assert_eq!(i.fence, Some(1_839_191_190_761_480));
            assert_eq!(i.owner.as_deref(), Some("server-1"));
            assert_eq!(i.acquired_at_ms, Some(1_796_081_553_316));
            assert_eq!(i.client_id, Some(30));
            assert_eq!(i.client_addr.as_deref(), Some("127.0.0.1:59484"));
            assert_eq!((i.limit, i.holders, i.waiters), (None, Some(1), 2));
            assert_eq!(i.holder_list.len(), 1);
            let h = &i.holder_list[0];
            assert_eq!(h.fence, 1_839_191_190_761_480);
            assert_eq!(h.owner.as_deref(), Some("server-1"));
            assert_eq!((h.ttl_ms, h.client_id), (59_985, Some(30)));
            assert_eq!(i.fields.len(), 13, "{proto}");
            assert_eq!(i.fields[0], ("state".into(), Some("held".into())));
            let (k, list) = i.fields.last().unwrap();
            assert_eq!(k, "holder-list");
            assert_eq!(
                list.as_deref(),
                Some(
                    "[{fence: 1839191190761480, owner: server-1, ttl: 59985, \
                     expires-at: 1796081613316, acquired-at: 1796081553316, client-id: 30, \
                     client-addr: 127.0.0.1:59484}]"
                )
            );
        }
    }

    #[test]
    fn parses_shared_and_counted_locks_resp2_and_resp3() {
        type Wrap = fn(Vec<(&str, Value)>) -> Value;
        for wrap in [flat as Wrap, map as Wrap] {
            let s = LockInfo::from_value(&many(wrap, None)).unwrap().unwrap();
            assert_eq!(s.mode, Some(LockMode::Shared));
            assert_eq!((s.limit, s.holders, s.waiters), (None, Some(2), 0));
            assert_eq!(
                s.fence, None,
                "no top-level holder fields for a shared lock"
            );
            assert_eq!((s.owner.clone(), s.client_id), (None, None));
            assert_eq!(s.ttl_ms, 59_990);
            let fences: Vec<u64> = s.holder_list.iter().map(|h| h.fence).collect();
            assert_eq!(fences, [1_839_191_190_761_476, 1_839_191_190_761_477]);
            assert_eq!(s.holder_list[0].owner.as_deref(), Some("reader-1"));
            assert_eq!(s.holder_list[1].owner, None);
            assert_eq!(s.holder_list[0].ttl_ms, 59_000);
            assert_eq!(s.holder_list[1].client_id, Some(8));
            assert!(s
                .fields
                .last()
                .unwrap()
                .1
                .as_deref()
                .unwrap()
                .contains("{fence: 1839191190761477, owner: (nil), ttl: 59990,"));

            let c = LockInfo::from_value(&many(wrap, Some(3))).unwrap().unwrap();
            assert_eq!(c.mode, Some(LockMode::Counted(3)));
            assert_eq!((c.limit, c.holders), (Some(3), Some(2)));
            assert_eq!(c.holder_list.len(), 2);
            assert!(c
                .fields
                .iter()
                .any(|(k, v)| k == "limit" && v.as_deref() == Some("3")));
        }
    }

    #[test]
    fn parses_a_string_lock_and_rejects_other_shapes() {
        let v = flat(vec![
            ("state", bulk("held")),
            ("kind", bulk("string")),
            ("ttl", Value::Int(900)),
            ("expires-at", Value::Int(1_796_081_613_316)),
            ("fence", Value::Nil),
            ("owner", Value::Nil),
            ("acquired-at", Value::Nil),
            ("client-id", Value::Nil),
            ("client-addr", Value::Nil),
            ("waiters", Value::Int(1)),
        ]);
        let i = LockInfo::from_value(&v).unwrap().unwrap();
        assert_eq!((i.kind.as_str(), i.mode, i.fence), ("string", None, None));
        assert_eq!((i.ttl_ms, i.waiters, i.holders), (900, 1, None));
        assert!(i.holder_list.is_empty());
        assert_eq!(i.fields.len(), 10);
        assert_eq!(LockInfo::from_value(&Value::Nil).unwrap(), None);
        assert!(LockInfo::from_value(&Value::Int(1)).is_err());
        // A holder without a fence, or a holder list that is not a list: not the module.
        let bad = flat(vec![(
            "holder-list",
            Value::Array(vec![flat(vec![("owner", bulk("x"))])]),
        )]);
        assert!(LockInfo::from_value(&bad).is_err());
        let bad = flat(vec![("holder-list", Value::Int(3))]);
        assert!(LockInfo::from_value(&bad).is_err());
        // An unknown nested field (a later module version) is kept for display.
        let later = flat(vec![
            ("kind", bulk("module")),
            ("extra", Value::Array(vec![Value::Int(1), bulk("a")])),
        ]);
        let i = LockInfo::from_value(&later).unwrap().unwrap();
        assert_eq!(i.fields[1], ("extra".into(), Some("[1, a]".into())));
    }
}
