//! The redis-cli sessions shown in the docs, made reproducible (docs/sessions/README.md):
//! each marked block ([`doc`]) of [`DOCS`] is the transcript of a source ([`script`]), run
//! in block order on one fresh server per doc ([`run`]); `make docs-sessions` writes them
//! in, tests/docs_sessions.rs compares them on every server ([`norm`]).

pub mod doc;
pub mod norm;
pub mod run;
pub mod script;

use std::fs;
use std::path::{Path, PathBuf};

pub use script::Session;

/// The docs with session blocks, relative to the repository root.
pub const DOCS: &[&str] = &["docs/commands.md", "README.md"];
/// Where the session sources are, relative to the repository root.
pub const SESSIONS_DIR: &str = "docs/sessions";

pub fn repo_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    here.canonicalize().unwrap_or(here)
}

fn read(path: &Path) -> Result<String, String> {
    fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Every `.txt` under docs/sessions, as session names (`commands/state`).
fn source_names(root: &Path) -> Result<Vec<String>, String> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) -> Result<(), String> {
        let entries = fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for e in entries {
            let p = e.map_err(|e| format!("{}: {e}", dir.display()))?.path();
            if p.is_dir() {
                walk(&p, base, out)?;
            } else if p.extension().is_some_and(|x| x == "txt") {
                let rel = p.strip_prefix(base).map_err(|e| e.to_string())?;
                out.push(rel.with_extension("").to_string_lossy().into_owned());
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(&root.join(SESSIONS_DIR), &root.join(SESSIONS_DIR), &mut out)?;
    out.sort();
    Ok(out)
}

/// One doc: its text, its marked blocks and their parsed sessions, in order.
pub struct Doc {
    pub path: String,
    pub text: String,
    pub blocks: Vec<doc::Block>,
    pub sessions: Vec<Session>,
}

/// Loads a doc and the sources of its blocks.
pub fn load(root: &Path, path: &str) -> Result<Doc, String> {
    let text = read(&root.join(path))?;
    let blocks = doc::blocks(path, &text)?;
    let sessions = blocks
        .iter()
        .map(|b| {
            let src = root.join(SESSIONS_DIR).join(format!("{}.txt", b.name));
            let body = read(&src).map_err(|e| format!("{path}:{}: {e}", b.line))?;
            script::parse(&b.name, &body)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Doc {
        path: path.to_string(),
        text,
        blocks,
        sessions,
    })
}

/// Every doc of [`DOCS`], once each source under docs/sessions has exactly one block.
pub fn load_all(root: &Path) -> Result<Vec<Doc>, String> {
    let docs = DOCS
        .iter()
        .map(|p| load(root, p))
        .collect::<Result<Vec<_>, _>>()?;
    let mut marked: Vec<String> = docs
        .iter()
        .flat_map(|d| d.blocks.iter().map(|b| b.name.clone()))
        .collect();
    marked.sort();
    if let Some(w) = marked.windows(2).find(|w| w[0] == w[1]) {
        return Err(format!("session '{}' is marked in two docs", w[0]));
    }
    let orphans: Vec<String> = source_names(root)?
        .into_iter()
        .filter(|n| marked.binary_search(n).is_err())
        .collect();
    if !orphans.is_empty() {
        return Err(format!(
            "sources without a marked block in {DOCS:?}: {}",
            orphans.join(", ")
        ));
    }
    Ok(docs)
}

/// Runs the sessions of `doc` in order on a fresh server on `127.0.0.1:port`.
pub fn run_doc(doc: &Doc, port: u16) -> Result<Vec<(String, String)>, String> {
    run::Runner::new(port)?.run_all(&doc.sessions)
}
