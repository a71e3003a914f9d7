//! What may differ between two runs of a session, taken out before they are compared:
//! numbers of 6+ digits standing alone (fences, unix-ms times) and UUIDs (tokens) become
//! `<n1>`, `<uuid1>`, ... by first appearance (a repeated value must still repeat); the
//! value after `"client-id"` and the port of a quoted `"127.0.0.1:port"` are masked; the
//! value after a time field ([`TIMES`]: `"ttl"`, `"waited"`, `"longest-wait"`) is masked
//! but must be within [`TTL_TOLERANCE_MS`]. All else is equal.

use std::collections::HashMap;
use std::sync::OnceLock;

use regex::{Captures, Regex};

/// How far apart a time field of the doc and of a run may be (ms): time passes between
/// setting a lease (or starting a wait) and LOCK.INFO, more on a busy machine.
pub const TTL_TOLERANCE_MS: i64 = 3000;

/// The fields whose value is a time in ms that moves from run to run: a lease left, how
/// long a waiter has waited.
pub const TIMES: [&str; 3] = ["ttl", "waited", "longest-wait"];

/// One line, normalized, and the time (ms) it carried (if any).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub text: String,
    pub ms: Option<i64>,
}

/// A UUID, a quoted client address, an integer reply, a word.
fn res() -> &'static [Regex; 4] {
    static R: OnceLock<[Regex; 4]> = OnceLock::new();
    R.get_or_init(|| {
        [
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            r#""127\.0\.0\.1:[0-9]+""#,
            r"\(integer\) (-?[0-9]+)$",
            r"[A-Za-z0-9_-]+",
        ]
        .map(|re| Regex::new(re).expect("a valid regex"))
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

/// Replaces every number of 6+ digits that stands alone (a whole word of `[A-Za-z0-9_-]`:
/// not in `wrong-token-0000000000` or a hex token) with its `<nK>`.
fn numbers(line: &str, word: &Regex, nums: &mut Numbering) -> String {
    let alone = |w: &str| w.len() >= 6 && w.bytes().all(|b| b.is_ascii_digit());
    let number = |c: &Captures| match alone(&c[0]) {
        true => format!("<n{}>", nums.of(&c[0])),
        false => c[0].to_string(),
    };
    word.replace_all(line, number).into_owned()
}

/// Normalizes a transcript (see the module's documentation).
pub fn normalize(text: &str) -> Vec<Line> {
    let [uuid, addr, int, word] = res();
    let mut uuids = Numbering::default();
    let mut nums = Numbering::default();
    let mut prev_field: Option<&str> = None;
    let mut out = Vec::new();
    for raw in text.lines() {
        let raw = raw.trim_end();
        let mut ms = None;
        let mut line = raw.to_string();
        if let Some(f) = prev_field {
            if let Some(c) = int.captures(&line) {
                if let (Some(all), Some(v)) = (c.get(0), c.get(1)) {
                    if f != "client-id" {
                        ms = v.as_str().parse().ok();
                    }
                    line = format!("{}(integer) <{f}>", &line[..all.start()]);
                }
            }
        }
        prev_field = TIMES
            .iter()
            .chain(&["client-id"])
            .find(|f| {
                raw.strip_suffix('"')
                    .and_then(|r| r.strip_suffix(**f))
                    .is_some_and(|r| r.ends_with('"'))
            })
            .copied();
        let line = addr.replace_all(&line, "\"127.0.0.1:<port>\"");
        let line = uuid.replace_all(&line, |c: &Captures| format!("<uuid{}>", uuids.of(&c[0])));
        let line = numbers(&line, word, &mut nums);
        out.push(Line { text: line, ms });
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
                && match (x.ms, y.ms) {
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

    /// DOC with another token, fence and client id, and the given ttl and client port.
    fn run_with(ttl: &str, port: &str) -> String {
        let uuid = "0fc4a94e-f8c0-4d69-a312-014d7232c6c7";
        DOC.replace("8e078eab-0ebe-4160-bdea-a03de73739e5", uuid)
            .replace("1839275466401792", "1900000000000001")
            .replace("29960", ttl)
            .replace("(integer) 25", "(integer) 7")
            .replace("36242", port)
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
    fn what_varies_from_run_to_run_is_ignored_and_what_the_commands_answer_is_not() {
        assert_eq!(compare(DOC, &run_with("28100", "51234")), Ok(()));
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
        let err = compare(DOC, &run_with("9960", "1")).unwrap_err();
        assert!(err.contains("line 8"), "{err}");
        // The prompt's port is not a client address: it is compared.
        assert!(compare(DOC, &DOC.replace("6379>", "6380>")).is_err());
    }

    #[test]
    fn wait_times_are_compared_as_ttls_are() {
        let doc = "   29) \"longest-wait\"\n   30) (integer) 1502\n\
                   \x20        9) \"waited\"\n       10) (integer) 1502\n";
        assert_eq!(compare(doc, &doc.replace("1502", "1650")), Ok(()));
        let err = compare(doc, &doc.replacen("1502", "9000", 1)).unwrap_err();
        assert!(err.contains("line 2") && !err.contains("line 4"), "{err}");
        // Other integers are compared.
        let not_after = "   1) \"waiters\"\n   2) (integer) 2\n";
        assert!(compare(not_after, &not_after.replace("2\n", "3\n")).is_err());
    }
}
