//! What tests and tools need to know about the module beyond its commands: its `INFO lock`
//! counters, the digest it stores instead of a token, its fence clock term.

use std::collections::HashMap;

use crate::resp::RawConn;

/// `INFO <section>` of a server as `field -> value`; panics on an I/O error.
pub fn info_map(c: &mut RawConn, section: &str) -> HashMap<String, String> {
    c.info(section)
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"))
        .into_iter()
        .collect()
}

/// One numeric field of `INFO lock` (`lock_` prefix optional); panics when missing.
pub fn lock_stat(c: &mut RawConn, field: &str) -> i64 {
    let name = format!("lock_{}", field.strip_prefix("lock_").unwrap_or(field));
    c.info_u64("lock", &name).unwrap_or_else(|e| panic!("{e}")) as i64
}

/// The digest the module stores instead of a token (its keyed BLAKE3, first 16 bytes;
/// `src/engine/value.rs`): what a test looks for in a DUMP payload, an RDB or an AOF to
/// find a lock's holder without the token being there. Pinned to the module's value by
/// the test below and the module's own unit test.
pub fn token_digest(token: &[u8]) -> [u8; 16] {
    const KEY: [u8; 32] = *b"redis-lock token digest, v1.....";
    let full = blake3::keyed_hash(&KEY, token);
    let mut d = [0u8; 16];
    d.copy_from_slice(&full.as_bytes()[..16]);
    d
}

/// The fence clock term the module uses on a new deployment: `unix_ms << FENCE_SHIFT`.
pub const FENCE_SHIFT: u32 = 10;

#[cfg(test)]
mod digest_tests {
    #[test]
    fn the_digest_is_the_modules() {
        assert_eq!(
            super::token_digest(b"token"),
            [227, 227, 21, 212, 75, 13, 78, 245, 149, 30, 189, 29, 58, 80, 77, 46]
        );
    }
}
