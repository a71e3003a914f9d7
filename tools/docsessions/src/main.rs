//! `make docs-sessions`: runs the sessions of each doc on a fresh server and, when a block
//! differs from the run (after [`norm`]), rewrites every block of that doc from this one
//! run (so fences agree from block to block); `--check` writes nothing and exits 1 on a
//! difference, `--force` rewrites every doc.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use redis_lock_docsessions::{doc, load_all, norm, repo_root, run_doc};
use redis_lock_testkit::{server_bin, ServerBuilder};

fn main() -> ExitCode {
    let (mut root, mut check, mut force) = (repo_root(), false, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--root" => match args.next() {
                Some(d) => root = PathBuf::from(d),
                None => return usage(),
            },
            "--check" => check = true,
            "--force" => force = true,
            _ => return usage(),
        }
    }
    if check && force {
        return usage();
    }
    match run(&root, check, force) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("docs-sessions: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> ExitCode {
    eprintln!("usage: redis-lock-docsessions [--root DIR] [--check | --force]");
    ExitCode::from(2)
}

fn run(root: &std::path::Path, check: bool, force: bool) -> Result<bool, String> {
    let docs = load_all(root)?;
    let mut all_same = true;
    for d in &docs {
        let t0 = Instant::now();
        let server = ServerBuilder::new().die_with_parent().try_start()?;
        let transcripts = run_doc(d, server.port)?;
        drop(server);
        let mut changed = Vec::new();
        for (b, (_, t)) in d.blocks.iter().zip(&transcripts) {
            if let Err(diff) = norm::compare(&b.text, t) {
                changed.push(b.name.clone());
                eprintln!("{}:{} ({}) differs:\n{diff}", d.path, b.line, b.name);
            }
        }
        all_same &= changed.is_empty();
        let write = !check && (force || !changed.is_empty());
        if write {
            let new = doc::splice(&d.path, &d.text, &transcripts)?;
            std::fs::write(root.join(&d.path), new).map_err(|e| format!("{}: {e}", d.path))?;
        }
        let verdict = match changed.is_empty() {
            true => "every block matches".to_string(),
            false => format!("differ: {}", changed.join(", ")),
        };
        let (n, bin, secs) = (transcripts.len(), server_bin(), t0.elapsed().as_secs_f64());
        let wrote = if write {
            "; rewritten from this run"
        } else {
            ""
        };
        println!(
            "{}: {n} sessions against {} in {secs:.1} s; {verdict}{wrote}",
            d.path,
            bin.display()
        );
    }
    Ok(!check || all_same)
}
