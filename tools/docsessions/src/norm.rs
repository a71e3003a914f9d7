//! What may differ between two runs of a session, taken out before they are compared:
//!
//! - numbers of 6 or more digits standing alone (fences, unix-ms times) and UUIDs
//!   (generated tokens)
//!   become `<n1>`, `<n2>`, ... and `<uuid1>`, ... numbered by first appearance in the
//!   block, so that a value repeated (a retry's fence, a fence passed to LOCK.CHECK) must
//!   still be repeated, and two different values must still differ;
//! - the value after `"client-id"` becomes `<client-id>`, and the port of a quoted
//!   `"127.0.0.1:port"` (a `client-addr`) becomes `<port>`;
//! - the value after `"ttl"` becomes `<ttl>`, and the two values must be within
//!   [`TTL_TOLERANCE_MS`] of each other.
//!
//! Everything else (reply types, nesting, the order of fields, error codes and texts,
//! small numbers) must be equal.

use std::collections::HashMap;
use std::sync::OnceLock;

use regex::{Captures, Regex};

/// How far apart the `ttl` of a block in the doc and of a run may be (ms): time passes
/// between the command that set a lease and the LOCK.INFO that shows it, more on a busy
/// machine.
pub const TTL_TOLERANCE_MS: i64 = 3000;

/// One line, normalized, and the `ttl` it carried (if any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub text: String,
    pub ttl: Option<i64>,
}

struct Res {
    uuid: Regex,
    addr: Regex,
    int: Regex,
}

fn res() -> &'static Res {
    static R: OnceLock<Res> = OnceLock::new();
    R.get_or_init(|| Res {
        uuid: Regex::new(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
            .expect("uuid regex"),
        addr: Regex::new(r#""127\.0\.0\.1:[0-9]+""#).expect("address regex"),
        int: Regex::new(r"\(integer\) (-?[0-9]+)$").expect("integer regex"),
    })
}

/// Numbers each distinct value by first appearance.
#[derive(Default)]
struct Numbering(HashMap<String, usize>);

impl Numbering {
    fn of(&mut self, v: &str) -> usize {
        let next = self.0.len() + 1;
        *self.0.entry(v.to_string()).or_insert(next)
    }
}

/// Replaces every number of 6+ digits that stands alone (not part of a word such as
/// `wrong-token-0000000000` or a hex token) with its `<nK>`.
fn numbers(line: &str, nums: &mut Numbering) -> String {
    let b = line.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
    let mut out = String::with_capacity(line.len());
    let (mut i, mut copied) = (0, 0);
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let alone = (start == 0 || !word(b[start - 1])) && (i == b.len() || !word(b[i]));
        if alone && i - start >= 6 {
            out.push_str(&line[copied..start]);
            out.push_str(&format!("<n{}>", nums.of(&line[start..i])));
            copied = i;
        }
        // A digit run inside a word: skip the rest of the word.
        while i < b.len() && word(b[i]) {
            i += 1;
        }
    }
    out.push_str(&line[copied..]);
    out
}

/// Normalizes a transcript (see the module's documentation).
pub fn normalize(text: &str) -> Vec<Line> {
    let r = res();
    let mut uuids = Numbering::default();
    let mut nums = Numbering::default();
    let mut prev_field: Option<&str> = None;
    let mut out = Vec::new();
    for raw in text.lines() {
        let raw = raw.trim_end();
        let mut ttl = None;
        let mut line = raw.to_string();
        if let Some(f @ ("ttl" | "client-id")) = prev_field {
            if let Some(c) = r.int.captures(&line) {
                if let (Some(all), Some(v)) = (c.get(0), c.get(1)) {
                    if f == "ttl" {
                        ttl = v.as_str().parse().ok();
                    }
                    line = format!("{}(integer) <{f}>", &line[..all.start()]);
                }
            }
        }
        prev_field = ["\"ttl\"", "\"client-id\""]
            .iter()
            .find(|f| raw.ends_with(**f))
            .map(|f| f.trim_matches('"'));
        let line = r.addr.replace_all(&line, "\"127.0.0.1:<port>\"");
        let line = r
            .uuid
            .replace_all(&line, |c: &Captures| format!("<uuid{}>", uuids.of(&c[0])));
        let line = numbers(&line, &mut nums);
        out.push(Line { text: line, ttl });
    }
    out
}

/// Compares the block of a doc with a run's transcript of the same session; `Err` has a
/// line-by-line account of what differs.
pub fn compare(expected: &str, actual: &str) -> Result<(), String> {
    let (e, a) = (normalize(expected), normalize(actual));
    let (el, al): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
    let mut diffs = Vec::new();
    for i in 0..e.len().max(a.len()) {
        let same = e.get(i).zip(a.get(i)).is_some_and(|(x, y)| {
            x.text == y.text
                && match (x.ttl, y.ttl) {
                    (Some(p), Some(q)) => (p - q).abs() <= TTL_TOLERANCE_MS,
                    (p, q) => p == q,
                }
        });
        if !same {
            diffs.push(format!(
                "  line {}:\n    doc: {}\n    run: {}",
                i + 1,
                el.get(i).copied().unwrap_or("(none)"),
                al.get(i).copied().unwrap_or("(none)"),
            ));
        }
    }
    diffs
        .is_empty()
        .then_some(())
        .ok_or_else(|| diffs.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "127.0.0.1:6379> LOCK.ACQUIRE k\n\
                       1) \"8e078eab-0ebe-4160-bdea-a03de73739e5\"\n\
                       2) (integer) 1839275466401792\n\
                       127.0.0.1:6379> LOCK.CHECK k 1839275466401792\n\
                       (integer) 1\n\
                       127.0.0.1:6379> LOCK.INFO k\n\
                        7) \"ttl\"\n\
                        8) (integer) 29960\n\
                       17) \"client-id\"\n\
                       18) (integer) 25\n\
                       19) \"client-addr\"\n\
                       20) \"127.0.0.1:36242\"\n";

    fn run_with(uuid: &str, fence: &str, ttl: &str, id: &str, port: &str) -> String {
        DOC.replace("8e078eab-0ebe-4160-bdea-a03de73739e5", uuid)
            .replace("1839275466401792", fence)
            .replace("29960", ttl)
            .replace("(integer) 25", &format!("(integer) {id}"))
            .replace("36242", port)
    }

    #[test]
    fn what_varies_from_run_to_run_is_ignored() {
        let run = run_with(
            "0fc4a94e-f8c0-4d69-a312-014d7232c6c7",
            "1900000000000001",
            "28100",
            "7",
            "51234",
        );
        assert_eq!(compare(DOC, &run), Ok(()));
    }

    #[test]
    fn only_numbers_standing_alone_are_numbered() {
        let n =
            normalize("A 1234567 wrong-token-0000000000 x1234567 1234567-a (integer) 7654321\n");
        assert_eq!(
            n[0].text,
            "A <n1> wrong-token-0000000000 x1234567 1234567-a (integer) <n2>"
        );
        assert_eq!(normalize("12345 123456\n")[0].text, "12345 <n1>");
    }

    #[test]
    fn what_the_commands_answer_is_not() {
        // A fence that no longer repeats (the retry got a new one).
        let run = DOC.replacen("1839275466401792", "1839275466401793", 1);
        assert!(compare(DOC, &run).is_err());
        // Another reply, another error text, another shape.
        assert!(compare(DOC, &DOC.replace("(integer) 1\n", "(integer) 0\n")).is_err());
        assert!(compare(DOC, &DOC.replace("\"ttl\"", "\"lease\"")).is_err());
        assert!(compare(DOC, &DOC.replace("2) (integer) 1839", "2) \"1839")).is_err());
        let shorter: String = DOC.lines().take(5).map(|l| format!("{l}\n")).collect();
        assert!(compare(DOC, &shorter).is_err());
        // A ttl out of tolerance.
        let run = run_with(
            "0fc4a94e-f8c0-4d69-a312-014d7232c6c7",
            "1900000000000001",
            "9960",
            "7",
            "1",
        );
        let err = compare(DOC, &run).unwrap_err();
        assert!(err.contains("line 8"), "{err}");
        // The prompt's port is not a client address: it is compared.
        assert!(compare(DOC, &DOC.replace("6379>", "6380>")).is_err());
    }
}
