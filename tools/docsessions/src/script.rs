//! The session mini-language (docs/sessions/README.md): one step a line, parsed whole
//! before anything runs, so that a typo fails before a server is started.

use std::time::Duration;

/// One line of a session source (each described in docs/sessions/README.md).
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// `# text`, shown as it is.
    Comment(String),
    /// A command, shown after the prompt with the reply of `redis-cli --no-raw`.
    Run(String),
    /// `!hidden CMD ...`: run, nothing shown; an error reply fails the session.
    Hidden(String),
    /// `!start NAME CMD ...`: a blocking command in a background `redis-cli`.
    Start { client: String, line: String },
    /// `!reply NAME [PREFIX]`: that client's reply, its lines after `PREFIX ` or indented.
    Reply {
        client: String,
        prefix: Option<String>,
    },
    /// `!sleep SECONDS`.
    Sleep(Duration),
    /// `!fence KEY -> VAR`: VAR = the fence of KEY's (first) holder, from LOCK.INFO.
    Fence { key: String, var: String },
    /// `!prompt TEXT`: the prompt of the commands that follow.
    Prompt(String),
}

/// A parsed session source.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    pub name: String,
    /// Each step with its line number in the source (from 1).
    pub steps: Vec<(usize, Step)>,
}

/// The prompt a session starts with: `redis-cli`'s for the default port (the doc's).
pub const DEFAULT_PROMPT: &str = "127.0.0.1:6379>";

fn var_name_ok(v: &str) -> bool {
    let mut c = v.chars();
    c.next().is_some_and(|f| f.is_ascii_uppercase()) && c.all(|x| x.is_ascii_alphanumeric())
}

fn client_name_ok(v: &str) -> bool {
    !v.is_empty() && v.chars().all(|x| x.is_ascii_alphanumeric() || x == '-')
}

/// Parses a session source (`//` lines and blank lines are skipped).
pub fn parse(name: &str, text: &str) -> Result<Session, String> {
    let mut steps = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim_end();
        let err = |what: &str| format!("docs/sessions/{name}.txt:{n}: {what}: {line}");
        if line.trim().is_empty() || line.trim_start().starts_with("//") {
            continue;
        }
        if line.starts_with('#') {
            steps.push((n, Step::Comment(line.to_string())));
            continue;
        }
        let Some(directive) = line.strip_prefix('!') else {
            split_args(line).map_err(|e| err(&e))?;
            steps.push((n, Step::Run(line.to_string())));
            continue;
        };
        let (word, rest) = directive
            .split_once(' ')
            .map_or((directive, ""), |(w, r)| (w, r.trim()));
        let step = match word {
            "hidden" if !rest.is_empty() => {
                split_args(rest).map_err(|e| err(&e))?;
                Step::Hidden(rest.to_string())
            }
            "start" => {
                let (client, cmd) = rest
                    .split_once(' ')
                    .ok_or_else(|| err("!start NAME COMMAND ..."))?;
                if !client_name_ok(client) {
                    return Err(err("a client name is letters, digits and '-'"));
                }
                split_args(cmd).map_err(|e| err(&e))?;
                Step::Start {
                    client: client.to_string(),
                    line: cmd.trim().to_string(),
                }
            }
            "reply" => {
                let mut w = rest.split_whitespace();
                let client = w.next().ok_or_else(|| err("!reply NAME [PREFIX]"))?;
                let prefix = w.next().map(str::to_string);
                if w.next().is_some() || !client_name_ok(client) {
                    return Err(err("!reply NAME [PREFIX]"));
                }
                Step::Reply {
                    client: client.to_string(),
                    prefix,
                }
            }
            "sleep" => {
                let s: f64 = rest
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 60.0)
                    .ok_or_else(|| err("!sleep SECONDS (0 < s <= 60)"))?;
                Step::Sleep(Duration::from_secs_f64(s))
            }
            "fence" => {
                let (key, var) = rest
                    .split_once(" -> ")
                    .map(|(k, v)| (k.trim(), v.trim()))
                    .filter(|(k, v)| !k.is_empty() && !k.contains(' ') && var_name_ok(v))
                    .ok_or_else(|| err("!fence KEY -> VAR (VAR: an upper-case name)"))?;
                Step::Fence {
                    key: key.to_string(),
                    var: var.to_string(),
                }
            }
            "prompt" if !rest.is_empty() => Step::Prompt(rest.to_string()),
            _ => return Err(err("unknown directive")),
        };
        steps.push((n, step));
    }
    Ok(Session {
        name: name.to_string(),
        steps,
    })
}

/// Replaces `$VAR`, `$(VAR-k)` and `$(VAR+k)` with values of `vars`.
pub fn substitute(line: &str, vars: &dyn Fn(&str) -> Option<u64>) -> Result<String, String> {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (expr, used) = if let Some(inner) = after.strip_prefix('(') {
            let end = inner
                .find(')')
                .ok_or_else(|| format!("unclosed $( in: {line}"))?;
            (&inner[..end], end + 2)
        } else {
            let end = after
                .find(|c: char| !c.is_ascii_alphanumeric())
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        let (name, delta) = match expr.find(['+', '-']) {
            Some(p) => {
                let k: i64 = expr[p + 1..]
                    .trim()
                    .parse()
                    .map_err(|_| format!("bad offset in ${expr}: {line}"))?;
                let k = if &expr[p..=p] == "-" { -k } else { k };
                (expr[..p].trim(), k)
            }
            None => (expr.trim(), 0),
        };
        let v = vars(name).ok_or_else(|| format!("${name} is not set (use !fence): {line}"))?;
        let v = i64::try_from(v)
            .ok()
            .and_then(|v| v.checked_add(delta))
            .ok_or_else(|| format!("${expr} overflows: {line}"))?;
        out.push_str(&v.to_string());
        rest = &after[used..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Splits a line as `redis-cli`'s prompt does: `"..."` with `\"`, `\\`, `\n`, `\r`, `\t`,
/// `\xHH`; `'...'` literal but for `\'`.
pub fn split_args(line: &str) -> Result<Vec<Vec<u8>>, String> {
    let b = line.as_bytes();
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == b.len() {
            break;
        }
        let mut arg = Vec::new();
        let q = b[i];
        if q != b'"' && q != b'\'' {
            while i < b.len() && !b[i].is_ascii_whitespace() {
                arg.push(b[i]);
                i += 1;
            }
            args.push(arg);
            continue;
        }
        i += 1;
        loop {
            // Inside '...' only \' is an escape; inside "..." every \ is one.
            let (c, used) = match (b.get(i), b.get(i + 1)) {
                (None, _) => return Err(format!("unclosed {}", q as char)),
                (Some(&c), _) if c == q => break,
                (Some(b'\\'), Some(&e)) if q == b'"' || e == b'\'' => match e {
                    b'n' if q == b'"' => (b'\n', 2),
                    b'r' if q == b'"' => (b'\r', 2),
                    b't' if q == b'"' => (b'\t', 2),
                    b'x' if q == b'"' => {
                        let hex = line.get(i + 2..i + 4).unwrap_or("");
                        let v = u8::from_str_radix(hex, 16)
                            .map_err(|_| format!("bad \\x escape: {line}"))?;
                        (v, 4)
                    }
                    e => (e, 2),
                },
                (Some(&c), _) => (c, 1),
            };
            arg.push(c);
            i += used;
        }
        i += 1;
        if i < b.len() && !b[i].is_ascii_whitespace() {
            return Err("a closing quote must be followed by a blank".into());
        }
        args.push(arg);
    }
    if args.is_empty() {
        return Err("empty command".into());
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_like_redis_cli() {
        let a = split_args(r#"EVAL "return 1" 0"#).unwrap();
        assert_eq!(
            a,
            vec![b"EVAL".to_vec(), b"return 1".to_vec(), b"0".to_vec()]
        );
        let a = split_args(r#"SET k "a\"b\x41" 'c d\'e'"#).unwrap();
        assert_eq!(a[2], b"a\"bA".to_vec());
        assert_eq!(a[3], b"c d'e".to_vec());
        assert!(split_args(r#"SET k "open"#).is_err());
        assert!(split_args(r#"SET k "a"b"#).is_err());
        assert!(split_args("   ").is_err());
    }

    #[test]
    fn substitutes_variables() {
        let vars = |n: &str| (n == "F").then_some(100u64);
        assert_eq!(
            substitute("LOCK.CHECK k $F", &vars).unwrap(),
            "LOCK.CHECK k 100"
        );
        assert_eq!(substitute("X $(F-1) $(F+2)", &vars).unwrap(), "X 99 102");
        assert!(substitute("X $G", &vars).is_err());
        assert_eq!(substitute("no vars", &vars).unwrap(), "no vars");
    }

    #[test]
    fn parses_every_directive() {
        let s = parse(
            "t",
            "// a note\n# terminal B\n!hidden SET a b\n!start B LOCK.ACQUIRE k BLOCK 0\n\
             !sleep 1.5\nLOCK.RELEASE k t\n!reply B B<\n!fence k -> F\n!prompt W>\n",
        )
        .unwrap();
        let kinds: Vec<_> = s.steps.iter().map(|(n, _)| *n).collect();
        assert_eq!(kinds, vec![2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(
            s.steps[5].1,
            Step::Reply {
                client: "B".into(),
                prefix: Some("B<".into())
            }
        );
        assert_eq!(
            s.steps[6].1,
            Step::Fence {
                key: "k".into(),
                var: "F".into()
            }
        );
        for bad in [
            "!bogus x",
            "!sleep 0",
            "!sleep x",
            "!fence k F",
            "!fence k -> f",
            "!start B",
            "!reply",
            "!hidden",
            "SET \"x",
        ] {
            assert!(parse("t", bad).is_err(), "{bad}");
        }
    }
}
