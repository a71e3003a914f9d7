//! `LOCK.INFO`, parsed.

use redis::Value;

use crate::error::{Error, Result};

/// What `LOCK.INFO` says about a held lock (it never reveals the token).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockInfo {
    /// `module` (taken with LOCK.ACQUIRE) or `string` (a classic `SET NX PX` lock).
    pub kind: String,
    /// Milliseconds left (-1: no expiry).
    pub ttl_ms: i64,
    /// Lease deadline, unix ms (server clock).
    pub expires_at_ms: Option<i64>,
    pub fence: Option<u64>,
    pub owner: Option<String>,
    pub acquired_at_ms: Option<i64>,
    pub client_id: Option<i64>,
    pub client_addr: Option<String>,
    /// Clients queued with BLOCK.
    pub waiters: i64,
    /// Every field as the server sent it, in order (`None` = nil), for display.
    pub fields: Vec<(String, Option<String>)>,
}

fn text(v: &Value) -> Result<Option<String>> {
    Ok(match v {
        Value::Nil => None,
        Value::Int(i) => Some(i.to_string()),
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        other => return Err(Error::Protocol(format!("LOCK.INFO field value {other:?}"))),
    })
}

impl LockInfo {
    /// Parses the RESP2 flat field/value array or the RESP3 map; `Ok(None)` for nil.
    pub(crate) fn from_value(v: &Value) -> Result<Option<LockInfo>> {
        let pairs: Vec<(&Value, &Value)> = match v {
            Value::Nil => return Ok(None),
            Value::Array(items) if items.len() % 2 == 0 => {
                items.chunks_exact(2).map(|c| (&c[0], &c[1])).collect()
            }
            Value::Map(m) => m.iter().map(|(k, v)| (k, v)).collect(),
            other => return Err(Error::Protocol(format!("LOCK.INFO reply {other:?}"))),
        };
        let mut info = LockInfo::default();
        for (k, v) in pairs {
            let key = text(k)?.unwrap_or_default();
            let val = text(v)?;
            let int = || val.as_deref().and_then(|s| s.parse::<i64>().ok());
            match key.as_str() {
                "kind" => info.kind = val.clone().unwrap_or_default(),
                "ttl" => info.ttl_ms = int().unwrap_or(-1),
                "expires-at" => info.expires_at_ms = int(),
                "fence" => info.fence = val.as_deref().and_then(|s| s.parse::<u64>().ok()),
                "owner" => info.owner = val.clone(),
                "acquired-at" => info.acquired_at_ms = int(),
                "client-id" => info.client_id = int(),
                "client-addr" => info.client_addr = val.clone(),
                "waiters" => info.waiters = int().unwrap_or(0),
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

    #[test]
    fn parses_flat_array() {
        let v = Value::Array(vec![
            bulk("state"),
            bulk("held"),
            bulk("kind"),
            bulk("module"),
            bulk("ttl"),
            Value::Int(900),
            bulk("fence"),
            Value::Int(1_900_000_000_000_000_001),
            bulk("owner"),
            Value::Nil,
            bulk("waiters"),
            Value::Int(2),
        ]);
        let i = LockInfo::from_value(&v).unwrap().unwrap();
        assert_eq!(i.kind, "module");
        assert_eq!(i.ttl_ms, 900);
        assert_eq!(i.fence, Some(1_900_000_000_000_000_001));
        assert_eq!(i.owner, None);
        assert_eq!(i.waiters, 2);
        assert_eq!(i.fields.len(), 6);
        assert_eq!(LockInfo::from_value(&Value::Nil).unwrap(), None);
        assert!(LockInfo::from_value(&Value::Int(1)).is_err());
    }
}
