//! What a server says about all of its locks: the module's `INFO lock` counters, and the
//! lock keys it holds (`SCAN ... TYPE redislock`). For monitoring (`redis-lock metrics`).

use redis::Value;

use crate::error::{Error, Result};
use crate::node::Call;
use crate::single::LockClient;

/// The type `TYPE` names for a module lock key.
const LOCK_TYPE: &str = "redislock";

impl LockClient {
    /// `INFO lock`: every numeric field of the module's section, without its `lock_`
    /// prefix, in the server's order (`held`, `waiters`, ..., `last_fence`). Empty when
    /// the module is not loaded. On a Redis Cluster, the node the client routes `INFO` to.
    pub async fn server_stats(&self) -> Result<Vec<(String, u64)>> {
        let node = &self.node;
        let mut cmd = redis::cmd("INFO");
        cmd.arg("lock");
        let text: String = node
            .run(Call::idempotent("INFO lock", &cmd, node.opts.io_timeout))
            .await?;
        Ok(parse_info_lock(&text))
    }

    /// One step of `SCAN cursor TYPE redislock COUNT count`: the next cursor (0 when the
    /// whole keyspace has been seen) and the lock keys of this step (module locks only;
    /// a classic `SET NX PX` lock is a plain string). `count` is how many keys the server
    /// looks at, not how many it returns.
    pub async fn scan_locks(&self, cursor: u64, count: u32) -> Result<(u64, Vec<String>)> {
        let node = &self.node;
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("COUNT")
            .arg(count.max(1))
            .arg("TYPE")
            .arg(LOCK_TYPE);
        let v: Value = node
            .run(Call::idempotent("SCAN", &cmd, node.opts.io_timeout))
            .await?;
        parse_scan(&v)
    }
}

/// The `lock_*` fields of an `INFO lock` reply that are numbers.
fn parse_info_lock(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| l.trim_end().split_once(':'))
        .filter_map(|(k, v)| Some((k.strip_prefix("lock_")?.to_string(), v.parse().ok()?)))
        .collect()
}

fn parse_scan(v: &Value) -> Result<(u64, Vec<String>)> {
    let bad = || Error::Protocol(format!("SCAN answered {v:?}"));
    let Value::Array(parts) = v else {
        return Err(bad());
    };
    let [cursor, keys] = parts.as_slice() else {
        return Err(bad());
    };
    let cursor = match cursor {
        Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()),
        Value::SimpleString(s) => s.parse().ok(),
        Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    }
    .ok_or_else(bad)?;
    let Value::Array(keys) = keys else {
        return Err(bad());
    };
    let keys = keys
        .iter()
        .map(|k| match k {
            Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Ok(s.clone()),
            _ => Err(bad()),
        })
        .collect::<Result<_>>()?;
    Ok((cursor, keys))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_lock_fields_without_their_prefix() {
        let text = "# lock\r\nlock_held:2\r\nlock_waiters:0\r\nlock_last_fence:1839476\r\n\
                    other_field:5\r\nlock_note:text\r\n";
        assert_eq!(
            parse_info_lock(text),
            [("held", 2), ("waiters", 0), ("last_fence", 1839476)]
                .map(|(k, v)| (k.to_string(), v))
                .to_vec()
        );
        assert!(parse_info_lock("").is_empty());
    }

    #[test]
    fn scan_replies() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let v = Value::Array(vec![bulk("17"), Value::Array(vec![bulk("lock:a")])]);
        assert_eq!(parse_scan(&v).unwrap(), (17, vec!["lock:a".to_string()]));
        let done = Value::Array(vec![bulk("0"), Value::Array(vec![])]);
        assert_eq!(parse_scan(&done).unwrap(), (0, vec![]));
        assert!(parse_scan(&Value::Array(vec![bulk("x"), Value::Array(vec![])])).is_err());
        assert!(parse_scan(&Value::Nil).is_err());
    }
}
