//! The redis-cli sessions shown in docs/commands.md and README.md, run again on this
//! server: each marked block must be what its source in docs/sessions/ answers now, up to
//! what differs from run to run (fences and other numbers of 6+ digits, UUIDs, client ids,
//! client-address ports, `ttl` within 3 s; see tools/docsessions/src/norm.rs). A reply
//! that changes shape or text fails here; `make docs-sessions` writes the new transcripts
//! into the docs when the change is meant.
//!
//! Every server answers the documented sessions alike (checked on Redis 7.0.15, 8.2.3 and
//! Valkey 8.1.8): no block needs a per-server exception. Where one would, it belongs in
//! [`server_differences`], spelled out.

mod common;

use std::time::Instant;

use common::{server_flavor, Flavor, ServerBuilder};
use redis_lock_docsessions::{load, load_all, norm, repo_root, run_doc};

/// Rewrites of a doc block that make it what this server legitimately answers instead:
/// (block, text in the doc, text on this server). None so far.
fn server_differences(_f: Flavor) -> Vec<(&'static str, &'static str, &'static str)> {
    Vec::new()
}

fn check_doc(path: &str) {
    let root = repo_root();
    let doc = load(&root, path).unwrap_or_else(|e| panic!("{e}"));
    assert!(!doc.blocks.is_empty(), "{path} has no session blocks");
    let flavor = server_flavor();
    let server = ServerBuilder::new().start();
    let t0 = Instant::now();
    let runs = run_doc(&doc, server.port).unwrap_or_else(|e| panic!("{path}: {e}"));
    let took = t0.elapsed();
    let differences = server_differences(flavor);
    let mut failures = Vec::new();
    for (b, (name, got)) in doc.blocks.iter().zip(&runs) {
        assert_eq!(&b.name, name);
        let mut expected = b.text.clone();
        for (block, doc_text, here) in &differences {
            if block == name {
                expected = expected.replace(doc_text, here);
            }
        }
        if let Err(diff) = norm::compare(&expected, got) {
            failures.push(format!(
                "{path}:{} (docs/sessions/{name}.txt) on {}:\n{diff}\n  the whole run:\n{}",
                b.line,
                flavor.label(),
                got.lines()
                    .map(|l| format!("    | {l}\n"))
                    .collect::<String>()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} blocks differ from what the server answers now (if the change is meant, \
         run `make docs-sessions` and review the diff):\n{}",
        failures.len(),
        doc.blocks.len(),
        failures.join("\n")
    );
    eprintln!(
        "{path}: {} sessions on {} in {:.1} s",
        runs.len(),
        flavor.label(),
        took.as_secs_f64()
    );
}

redis_lock_testkit::cases!(check_doc:
    commands_md_sessions_are_what_the_server_answers => "docs/commands.md",
    readme_sessions_are_what_the_server_answers => "README.md",
);

/// Every source has its block and every block its source (no server needed).
#[test]
fn every_session_source_is_shown_once() {
    let docs = load_all(&repo_root()).unwrap_or_else(|e| panic!("{e}"));
    let n: usize = docs.iter().map(|d| d.blocks.len()).sum();
    assert!(n >= 18, "expected the 18 documented sessions, found {n}");
}
