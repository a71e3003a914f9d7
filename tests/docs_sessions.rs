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

/// The prose docs, the rendered docs' templates and the Lua script they include.
fn prose_docs() -> Vec<std::path::PathBuf> {
    let root = repo_root();
    let mut files: Vec<_> = [
        "README.md",
        "clients/python/README.md",
        "clients/node/README.md",
    ]
    .iter()
    .map(|f| root.join(f))
    .collect();
    for dir in ["docs", "docs/templates"] {
        let mut more: Vec<_> = std::fs::read_dir(root.join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "md" || x == "j2"))
            .collect();
        more.sort();
        files.extend(more);
    }
    files.push(root.join("scripts/reliability/fenced_store.lua"));
    files
}

/// The words of a line made of `[A-Za-z0-9_-]` (so a number inside a token is not one).
fn words(line: &str) -> impl Iterator<Item = &str> {
    line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .filter(|w| !w.is_empty())
}

/// A paragraph that speaks of release 0.1's fence scale (`unix_ms << 20`, kept by
/// servers upgraded from it or loaded with `fence-shift 20`), where its figures belong.
fn speaks_of_the_old_scale(paragraph: &str) -> bool {
    ["release 0.1", "0.1 fences", "fence-shift 20"]
        .iter()
        .any(|s| paragraph.contains(s))
}

/// Each line of a text with the paragraph it belongs to (lines up to a blank one).
fn lines_in_paragraphs(text: &str) -> Vec<(usize, &str, String)> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut start = 0;
    for end in 0..=lines.len() {
        if end == lines.len() || lines[end].trim().is_empty() {
            let paragraph = lines[start..end].join("\n");
            for (i, line) in lines.iter().enumerate().take(end).skip(start) {
                out.push((i + 1, *line, paragraph.clone()));
            }
            start = end + 1;
        }
    }
    out
}

/// Every fence a doc shows (an integer of 16 to 19 digits) has as many digits as the
/// fences this server issues now, and no doc gives another size for them (`<< 20`,
/// `10^18`), except where it speaks of release 0.1's scale; the largest fence
/// (9223372036854775806) is a bound, not a fence.
#[test]
fn docs_show_fences_of_the_size_the_server_issues() {
    let server = ServerBuilder::new().start();
    let mut c = common::RawConn::connect(server.port);
    let fence = c
        .cmd(&["LOCK.ACQUIRE", "docs:fence-size"])
        .grant()
        .expect("a grant")
        .1
        .to_string();
    let mut stale = Vec::new();
    for path in prose_docs() {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        for (n, line, paragraph) in lines_in_paragraphs(&text) {
            if speaks_of_the_old_scale(&paragraph) {
                continue;
            }
            let wrong_size = words(line).any(|w| {
                w.len() >= 16
                    && w.len() <= 19
                    && w.bytes().all(|b| b.is_ascii_digit())
                    && w.len() != fence.len()
                    && !w.starts_with("922337203685477580")
            });
            let wrong_claim = ["<< 20", "10^18", "10¹⁸", "·10^18"]
                .iter()
                .any(|s| line.contains(s));
            if wrong_size || wrong_claim {
                stale.push(format!("{}:{n}: {line}", path.display()));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "fences of another size than this server's ({fence}, {} digits):\n{}",
        fence.len(),
        stale.join("\n")
    );
}

/// Every `*.md` a doc names, as a link or in its text, is a file of the repository (a
/// relative link resolves from the doc's folder), unless its paragraph says it is not
/// part of it.
#[test]
fn docs_name_only_files_of_the_repository() {
    let root = repo_root();
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["ls-files", "*.md"])
        .output()
        .expect("git ls-files");
    let tracked = String::from_utf8_lossy(&out.stdout).into_owned();
    let tracked: Vec<&str> = tracked.lines().collect();
    assert!(tracked.contains(&"README.md"), "git ls-files: {tracked:?}");
    let mut missing = Vec::new();
    for path in prose_docs() {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        // A template is rendered into docs/: its links resolve from there.
        let dir = path.parent().expect("a doc in a folder");
        let dir = if dir.ends_with("templates") {
            dir.parent().expect("docs/")
        } else {
            dir
        };
        for (n, line, paragraph) in lines_in_paragraphs(&text) {
            if paragraph.contains("not part of this repository") {
                continue;
            }
            // Links: `](target)`, relative ones only.
            for link in line.split("](").skip(1) {
                let target = link.split(')').next().unwrap_or("");
                let file = target.split('#').next().unwrap_or("");
                if file.is_empty() || file.contains("://") || file.starts_with("mailto:") {
                    continue;
                }
                if !dir.join(file).exists() {
                    missing.push(format!("{}:{n}: link to {file}", path.display()));
                }
            }
            // Names: a word ending in `.md` (a path or a bare file name).
            for name in line
                .split(|c: char| !(c.is_ascii_alphanumeric() || "_-./".contains(c)))
                .filter(|w| w.ends_with(".md") && w.len() > 3)
            {
                let name = name.trim_start_matches("./");
                let found = dir.join(name).exists()
                    || root.join(name).exists()
                    || tracked.iter().any(|t| t.ends_with(&format!("/{name}")));
                if !found {
                    missing.push(format!("{}:{n}: names {name}", path.display()));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs name files that are not in the repository:\n{}",
        missing.join("\n")
    );
}
