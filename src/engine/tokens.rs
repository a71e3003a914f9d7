//! The engine's cache of token digests.

use crate::lock::value::{digest, Digest};

/// The digests of tokens seen lately, by the token: an acquire computes one, and the
/// extends and the release that follow with the same token find it here (the digest is a
/// tenth of an acquire). In memory only, like the arguments the token arrives in.
#[derive(Default)]
pub(super) struct TokenCache(Vec<Cached>);

struct Cached {
    len: u8,
    token: [u8; 48],
    digest: Digest,
}

impl TokenCache {
    const SLOTS: usize = 4096;

    fn slot(token: &[u8]) -> usize {
        (super::word_hash(token.len() as u64, token) >> 52) as usize % Self::SLOTS
    }

    pub(super) fn digest(&mut self, token: &[u8]) -> Digest {
        if token.len() > 48 {
            return digest(token);
        }
        if self.0.is_empty() {
            self.0 = (0..Self::SLOTS)
                .map(|_| Cached {
                    len: 0,
                    token: [0; 48],
                    digest: [0; 16],
                })
                .collect();
        }
        let e = &mut self.0[Self::slot(token)];
        if usize::from(e.len) == token.len() && e.len > 0 && e.token[..token.len()] == *token {
            return e.digest;
        }
        let d = digest(token);
        e.len = token.len() as u8;
        e.token[..token.len()].copy_from_slice(token);
        e.digest = d;
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_digests_equal_fresh_ones() {
        let mut c = TokenCache::default();
        let long = [7u8; 49];
        for t in [
            &b"token-a-0000000000"[..],
            b"token-b-0000000000",
            b"",
            &long,
        ] {
            assert_eq!(c.digest(t), digest(t));
            assert_eq!(c.digest(t), digest(t), "second look of {t:?}");
        }
        // Two tokens in one slot: the later one replaces the earlier, neither is confused.
        let a = b"x".repeat(20);
        let slot = TokenCache::slot(&a);
        let b = (0u32..)
            .map(|i| format!("y{i:019}").into_bytes())
            .find(|b| TokenCache::slot(b) == slot)
            .expect("a colliding token");
        assert_eq!(c.digest(&a), digest(&a));
        assert_eq!(c.digest(&b), digest(&b));
        assert_eq!(c.digest(&a), digest(&a));
    }
}
