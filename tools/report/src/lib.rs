//! The one renderer of the measured docs, from the JSON the runs save in docs/data/ (so
//! prose and layout change without a rerun: `make docs`): the figures the templates in
//! docs/templates/ show (ratios, goals, verdicts) and the charts.

pub mod chart;
pub mod cluster;
pub mod contention;
pub mod contention_kinds;
pub mod fmt;
pub mod perf;
pub mod reliability;
pub mod template;

use std::fs;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

pub const PERF_JSON: &str = "docs/data/perf.json";
pub const CONTENTION_JSON: &str = "docs/data/contention.json";
pub const RELIABILITY_JSON: &str = "docs/data/reliability.json";
pub const CLUSTER_JSON: &str = "docs/data/cluster.json";

/// Writes `value` as pretty JSON (creating the directory).
pub fn save<T: Serialize>(path: &Path, value: &T) -> Result<(), Error> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()).into())
}

pub fn load<T: DeserializeOwned>(path: &Path) -> Result<T, Error> {
    let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()).into())
}

/// Replaces what lies between `<!-- name:begin -->` and `<!-- name:end -->` in `doc`
/// (markers kept), or appends a new marked section when the markers are missing.
pub fn splice(doc: &str, name: &str, section: &str) -> Result<String, String> {
    let (begin, end) = (
        format!("<!-- {name}:begin -->"),
        format!("<!-- {name}:end -->"),
    );
    let body = format!("{begin}\n{}\n{end}", section.trim_end());
    match (doc.find(&begin), doc.find(&end)) {
        (Some(b), Some(e)) if b < e => Ok(format!("{}{body}{}", &doc[..b], &doc[e + end.len()..])),
        (None, None) => {
            let mut out = doc.trim_end().to_string();
            if !out.is_empty() {
                out.push_str("\n\n");
            }
            out.push_str(&body);
            out.push('\n');
            Ok(out)
        }
        _ => Err(format!("broken {begin} / {end} pair; fix it by hand")),
    }
}

fn splice_file(doc: &Path, name: &str, section: &str) -> Result<(), Error> {
    let text = fs::read_to_string(doc).unwrap_or_else(|_| "# Benchmarks\n".to_string());
    let text = splice(&text, name, section).map_err(|e| format!("{}: {e}", doc.display()))?;
    Ok(fs::write(doc, text)?)
}

/// Renders every document whose JSON exists under `root`; returns the files written.
pub fn render_all(root: &Path) -> Result<Vec<PathBuf>, Error> {
    let mut wrote = Vec::new();
    let bench_md = root.join("docs/BENCHMARKS.md");
    if root.join(CONTENTION_JSON).is_file() {
        let run: contention::ContentionRun = load(&root.join(CONTENTION_JSON))?;
        splice_file(&bench_md, "contention", &contention::section(&run)?)?;
        contention::draw(&root.join("docs/contention.png"), &run)?;
        wrote.extend([bench_md.clone(), root.join("docs/contention.png")]);
        if run.cells.iter().any(|c| c.family != "mutex") {
            let png = root.join("docs/contention-kinds.png");
            contention_kinds::draw(&png, &run)?;
            wrote.push(png);
        }
    }
    if root.join(PERF_JSON).is_file() {
        let run: perf::PerfRun = load(&root.join(PERF_JSON))?;
        splice_file(&bench_md, "perf", &perf::perf_section(&run)?)?;
        chart::perf(&root.join("docs/perf.png"), &run)?;
        wrote.extend([bench_md.clone(), root.join("docs/perf.png")]);
    }
    if root.join(CLUSTER_JSON).is_file() {
        let run: cluster::ClusterRun = load(&root.join(CLUSTER_JSON))?;
        splice_file(&bench_md, "cluster", &cluster::section(&run)?)?;
        wrote.push(bench_md.clone());
    }
    if root.join(RELIABILITY_JSON).is_file() {
        let run: reliability::ReliabilityRun = load(&root.join(RELIABILITY_JSON))?;
        let out = root.join("docs/RELIABILITY.md");
        fs::write(&out, reliability::render(&run)?)?;
        wrote.push(out);
    }
    wrote.sort();
    wrote.dedup();
    Ok(wrote)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_replaces_only_its_own_section() {
        let doc = "# B\n\n<!-- perf:begin -->\nperf\n<!-- perf:end -->\n\n<!-- contention:begin -->\nold\n<!-- contention:end -->\n\ntail\n";
        let out = splice(doc, "contention", "new table\n").unwrap();
        assert_eq!(out, doc.replace("\nold\n", "\nnew table\n"));
        assert_eq!(
            splice(&out, "contention", "new table").unwrap(),
            out,
            "idempotent"
        );
        let added = splice("# B\n", "perf", "p").unwrap();
        assert_eq!(added, "# B\n\n<!-- perf:begin -->\np\n<!-- perf:end -->\n");
        assert!(splice("<!-- perf:end -->\n<!-- perf:begin -->\n", "perf", "t").is_err());
        assert!(splice("<!-- perf:begin -->\nno end\n", "perf", "t").is_err());
    }
}
