//! docs/RELIABILITY.md, from docs/data/reliability.json (`make reliability`).

use std::collections::BTreeMap;

use minijinja::context;
use minijinja::value::{Serde, Value};
use serde::{Deserialize, Serialize};

use crate::{template, Error};

/// The store side of fencing, printed in the stale-holder section.
pub const FENCED_STORE_LUA: &str = include_str!("../../../scripts/reliability/fenced_store.lua");

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    #[default]
    Pass,
    Fail(String),
    NotRun(String),
}

/// What one scenario measured (`data`: reliability-row.md.j2 makes the row from it).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Outcome {
    pub id: u32,
    pub key: String,
    pub title: String,
    pub target: String,
    #[serde(default)]
    pub data: BTreeMap<String, serde_json::Value>,
    pub status: Status,
    /// Further failures (the first is the status), as the run reported them.
    pub notes: Vec<String>,
    pub secs: f64,
    /// The server of this row, for a scenario that runs on every server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerId>,
    /// A row measured by a later run of some scenarios only (`--only`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RowRun>,
}

/// `Redis 8.2.3` and the binary it ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerId {
    pub label: String,
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowRun {
    pub date: String,
    pub time: String,
    pub short: bool,
    pub scale: f64,
    pub seed: u64,
    pub commit: String,
    pub dirty: bool,
    /// The scenarios that run measured (`--only`).
    pub only: Vec<String>,
}

impl Outcome {
    pub fn new(id: u32, key: &str, title: &str, target: &str) -> Outcome {
        Outcome {
            id,
            key: key.to_string(),
            title: title.to_string(),
            target: target.to_string(),
            ..Outcome::default()
        }
    }

    /// The title, with the server when the row names one.
    pub fn full_title(&self) -> String {
        match &self.server {
            Some(s) => format!("{}, {}", self.title, s.label),
            None => self.title.clone(),
        }
    }

    /// Marks a missed target (keeps the first reason, adds the others to the notes).
    pub fn fail(&mut self, why: impl Into<String>) {
        let why = why.into();
        match &self.status {
            Status::Pass => self.status = Status::Fail(why),
            _ => self.notes.push(format!("Also failed: {why}")),
        }
    }

    /// Records `value` as the datum `name` of the row.
    pub fn put(&mut self, name: &str, value: impl Serialize) {
        let v = serde_json::to_value(value).unwrap_or_else(|e| e.to_string().into());
        self.data.insert(name.to_string(), v);
    }

    /// The row's figure, its trials and the lines of its section, from its data.
    pub fn cells(&self) -> Result<Cells, Error> {
        let ctx = context! { o => Serde(self), d => Serde(&self.data) };
        let text = template::render("reliability-row.md.j2", ctx)?;
        let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
        let (figure, trials) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
        let notes = lines.map(|l| l.trim_start_matches("- ").to_string());
        Ok(Cells {
            figure: figure.to_string(),
            trials: trials.to_string(),
            notes: notes.chain(self.notes.iter().cloned()).collect(),
        })
    }
}

/// What the template makes of a row's data.
#[derive(Debug, Clone, Serialize)]
pub struct Cells {
    pub figure: String,
    pub trials: String,
    pub notes: Vec<String>,
}

/// docs/data/reliability.json: one `make reliability` run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReliabilityRun {
    pub date: String,
    pub time: String,
    pub short: bool,
    pub scale: f64,
    pub seed: u64,
    pub minutes: f64,
    pub server_path: String,
    /// `Redis server v=7.0.15`
    pub server_version: String,
    pub commit: String,
    pub dirty: bool,
    pub cpus: usize,
    pub kernel: String,
    pub fs: String,
    pub outcomes: Vec<Outcome>,
}

impl ReliabilityRun {
    /// Puts `rows` of a later run of `run.only` in place of those scenarios' rows; `order`
    /// gives a scenario's place in the report; rows are numbered again.
    pub fn merge(&mut self, rows: Vec<Outcome>, run: RowRun, order: impl Fn(&str) -> usize) {
        self.outcomes.retain(|o| !run.only.contains(&o.key));
        self.outcomes.extend(rows.into_iter().map(|mut o| {
            o.run = Some(run.clone());
            o
        }));
        // Stable: rows of one scenario keep their order (one per server).
        self.outcomes.sort_by_key(|o| order(&o.key));
        for (i, o) in self.outcomes.iter_mut().enumerate() {
            o.id = i as u32 + 1;
        }
    }
}

/// docs/RELIABILITY.md.
pub fn render(run: &ReliabilityRun) -> Result<String, Error> {
    let cells: Vec<Cells> = run
        .outcomes
        .iter()
        .map(Outcome::cells)
        .collect::<Result<_, _>>()?;
    let row = |(o, c): (&Outcome, &Cells)| {
        let (fail, not_run) = match &o.status {
            Status::Pass => (None, None),
            Status::Fail(w) => (Some(w), None),
            Status::NotRun(w) => (None, Some(w)),
        };
        let o = context! { full_title => o.full_title(), fail, not_run, ..Value::from(Serde(o)) };
        context! { ..Value::from(Serde(c)), ..o }
    };
    let rows: Vec<Value> = run.outcomes.iter().zip(&cells).map(row).collect();
    // The rows of each later run (`--only`), and the servers they name.
    let mut later: Vec<(&RowRun, Vec<&Outcome>, Vec<&ServerId>)> = Vec::new();
    for o in &run.outcomes {
        let Some(r) = &o.run else { continue };
        let i = later.iter().position(|(x, ..)| *x == r).unwrap_or_else(|| {
            later.push((r, vec![], vec![]));
            later.len() - 1
        });
        later[i].1.push(o);
        if let Some(s) = o.server.as_ref().filter(|s| !later[i].2.contains(s)) {
            later[i].2.push(s);
        }
    }
    let later = later.iter().map(|(r, rows, servers)| {
        context! { rows => Serde(rows), servers => Serde(servers), ..Value::from(Serde(r)) }
    });
    // The sections: the rows of one scenario (one per server) share one.
    let mut groups: Vec<Vec<Value>> = Vec::new();
    for (i, o) in run.outcomes.iter().enumerate() {
        match groups.last_mut() {
            Some(g) if run.outcomes[i - 1].key == o.key => g.push(rows[i].clone()),
            _ => groups.push(vec![rows[i].clone()]),
        }
    }
    let ctx = context! {
        run => Serde(run),
        rows,
        passed => run.outcomes.iter().filter(|o| o.status == Status::Pass).count(),
        later => later.collect::<Vec<_>>(),
        groups,
        FENCED_STORE_LUA,
    };
    template::render("RELIABILITY.md.j2", ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, server: Option<&str>) -> Outcome {
        let mut o = Outcome::new(0, key, &format!("Title {key}"), "target");
        o.server = server.map(|s| ServerId {
            label: s.into(),
            path: format!("bin/{s}"),
        });
        o
    }

    /// The committed run with these rows.
    fn run(outcomes: Vec<Outcome>) -> ReliabilityRun {
        let json = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/data/reliability.json"
        );
        let run: ReliabilityRun = crate::load(std::path::Path::new(json)).expect("committed");
        ReliabilityRun { outcomes, ..run }
    }

    #[test]
    fn a_later_run_replaces_only_its_own_rows() {
        let mut r = run(vec![
            row("mutex", None),
            row("chaos", Some("A")),
            row("stale", None),
        ]);
        let later = RowRun {
            date: "2026-02-02".into(),
            time: "12:00".into(),
            short: false,
            scale: 1.0,
            seed: 7,
            commit: "def".into(),
            dirty: false,
            only: vec!["chaos".into()],
        };
        let order = |k: &str| {
            ["mutex", "stale", "chaos"]
                .iter()
                .position(|x| *x == k)
                .unwrap()
        };
        r.merge(
            vec![row("chaos", Some("A")), row("chaos", Some("B"))],
            later,
            order,
        );
        let keys: Vec<(u32, &str)> = r.outcomes.iter().map(|o| (o.id, o.key.as_str())).collect();
        assert_eq!(
            keys,
            [(1, "mutex"), (2, "stale"), (3, "chaos"), (4, "chaos")]
        );
        assert!(r.outcomes[0].run.is_none() && r.outcomes[3].run.as_ref().unwrap().seed == 7);
        let doc = render(&r).unwrap();
        assert!(doc.contains("Rows 3-4 come from a later run"), "{doc}");
        assert!(doc.contains("| 3 | Title chaos, A |") && doc.contains("| 2026-02-02 |"));
        assert!(doc.contains("## 3-4. Title chaos\n") && doc.contains("### 4. B (`bin/B`)"));
        assert!(doc.contains("## 1. Title mutex\n") && !doc.contains("### 1."));
    }
}
