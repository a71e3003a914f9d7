//! Feeds arbitrary argument vectors to every parser of the module (src/args.rs, compiled
//! in directly: the module crate is a cdylib) and checks what a successful parse
//! promises: lengths and ranges within their bounds. A panic is a finding.
#![no_main]

#[allow(dead_code)]
#[path = "../../../../src/args.rs"]
mod args;
#[allow(dead_code)]
#[path = "../../../../src/error.rs"]
mod error;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First byte: which parser and the limits; the rest: arguments split on 0xFF.
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let argv: Vec<&[u8]> = if rest.is_empty() {
        Vec::new()
    } else {
        rest.split(|&b| b == 0xFF).collect()
    };
    let lim = args::Limits {
        default_ttl: 30_000,
        max_ttl: if sel & 0x80 != 0 { 1_000 } else { 86_400_000 },
    };
    match sel % 4 {
        0 => {
            if let Ok(a) = args::parse_acquire(&argv, &lim) {
                assert!(a.ttl >= 1 && a.ttl <= lim.max_ttl);
                assert!(a
                    .token
                    .is_none_or(|t| (1..=args::MAX_TOKEN_LEN).contains(&t.len())));
                assert!(a
                    .owner
                    .is_none_or(|o| (1..=args::MAX_OWNER_LEN).contains(&o.len())));
                assert!(a.min_fence <= args::MAX_FENCE);
            }
        }
        1 => {
            // Any single argument is a token to compare; only the arity is checked.
            assert_eq!(args::parse_release(&argv).is_ok(), argv.len() == 1);
        }
        2 => {
            if let Ok(e) = args::parse_extend(&argv, &lim) {
                assert!(e.ttl >= 1 && e.ttl <= lim.max_ttl);
            }
        }
        _ => {
            if let Ok(s) = args::parse_sync(&argv) {
                assert!(s.fence >= 1 && s.fence <= args::MAX_FENCE);
                assert!((1..=args::MAX_TOKEN_LEN).contains(&s.token.len()));
            }
        }
    }
    if let Some(first) = argv.first() {
        if let Some(v) = args::parse_i64(first) {
            assert_eq!(v.to_string().as_bytes(), *first);
        }
    }
});
