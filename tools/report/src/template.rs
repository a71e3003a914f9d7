//! The templates in docs/templates/, built in (an edit needs only `make docs`), and the
//! filters they format numbers with.

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Value;
use minijinja::{AutoEscape, Environment, UndefinedBehavior};

use crate::{fmt, Error};

/// (name, text) of each template in docs/templates/.
macro_rules! templates {
    ($($name:literal),*) => {
        [$(($name, include_str!(concat!("../../../docs/templates/", $name)))),*]
    };
}

const TEMPLATES: [(&str, &str); 8] = templates![
    "perf.md.j2",
    "cluster.md.j2",
    "headline.md.j2",
    "callgrind.md.j2",
    "contention.md.j2",
    "contention-kinds.md.j2",
    "RELIABILITY.md.j2",
    "reliability-row.md.j2"
];

/// A number filter: a missing value prints as `f` prints NaN (`–`).
fn num(f: fn(f64) -> String) -> impl Fn(Option<f64>) -> String + Send + Sync + 'static {
    move |v| f(v.unwrap_or(f64::NAN))
}

fn environment() -> Result<Environment<'static>, Error> {
    let mut env = Environment::new();
    // A block tag on a line of its own leaves no trace of that line.
    env.set_syntax(
        SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(true)
            .build()?,
    );
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_undefined_behavior(UndefinedBehavior::SemiStrict);
    for (name, text) in TEMPLATES {
        env.add_template(name, text)?;
    }
    env.add_filter("rate", num(fmt::rate));
    env.add_filter("x", num(fmt::x));
    env.add_filter("x3", num(fmt::x3));
    env.add_filter("ir", num(fmt::ir));
    env.add_filter("us", num(fmt::us));
    env.add_filter("ms", num(fmt::ms));
    env.add_filter("per_sec", num(fmt::per_sec));
    env.add_filter("verdict", fmt::verdict);
    // A count with thousands separators (one never counted is 0); `part` as a
    // percentage of `whole` (`n/a` of 0).
    env.add_filter("n", |v: Option<f64>| fmt::ir(v.unwrap_or(0.0)));
    env.add_filter("pct", |part: f64, whole: f64| {
        fmt::pct(part as u64, whole as u64)
    });
    // `{:.N}`, and Rust's own shortest form (`1`, `0.45`) for goals and settings.
    env.add_filter("f", |v: f64, dec: usize| format!("{v:.dec$}"));
    env.add_filter("signed", |v: f64, dec: usize| format!("{v:+.dec$}"));
    env.add_filter("num", |v: f64| v.to_string());
    // `part` as a percentage of `whole`, `dec` decimals (no sign).
    env.add_filter("share", |part: f64, whole: f64, dec: usize| {
        format!("{:.dec$}", part / whole * 100.0)
    });
    // Cores kept busy by other processes, `?` when unknown.
    env.add_filter("cores", |v: Option<f64>| {
        v.map_or("?".into(), |v| format!("{v:.1}"))
    });
    // A markdown table cell: no `|`, no line break.
    env.add_filter("cell", |s: String| s.replace('|', "\\|").replace('\n', " "));
    // The second item of the first `[key, value]` pair of `list` with that key.
    env.add_function("lookup", |list: Value, key: Value| -> Result<Value, _> {
        for item in list.try_iter()? {
            if item.get_item_by_index(0)? == key {
                return item.get_item_by_index(1);
            }
        }
        Ok(Value::from(()))
    });
    Ok(env)
}

/// Renders the template `name` (a file name in docs/templates/) with `ctx`.
pub fn render(name: &str, ctx: Value) -> Result<String, Error> {
    let env = environment()?;
    Ok(env.get_template(name)?.render(ctx)?)
}
