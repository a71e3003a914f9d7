//! `make docs`: renders docs/BENCHMARKS.md, docs/RELIABILITY.md, docs/perf.png,
//! docs/contention.png and docs/contention-kinds.png from the JSON in docs/data/ (no
//! measurement runs).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(about = "Render the measured docs from docs/data/*.json")]
struct Args {
    /// The repository root (the docs are under ROOT/docs).
    #[arg(long, env = "DOCS_ROOT", default_value = ".")]
    root: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match redis_lock_report::render_all(&args.root) {
        Ok(files) => {
            for f in files {
                println!("wrote {}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("redis-lock-docs: {e}");
            ExitCode::FAILURE
        }
    }
}
