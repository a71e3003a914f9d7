//! The marked blocks of a Markdown file: a line `<!-- session: NAME -->` right before a
//! fenced code block names the session (docs/sessions/NAME.txt) whose transcript the
//! block holds.

/// One marked block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub name: String,
    /// The marker's line number (from 1).
    pub line: usize,
    /// Index of the opening fence line and of the closing one (0-based).
    open: usize,
    close: usize,
    /// What is between the fences, each line ending with `\n`.
    pub text: String,
}

const MARK_OPEN: &str = "<!-- session:";
const MARK_CLOSE: &str = "-->";

fn marker(line: &str) -> Option<&str> {
    let name = line
        .trim()
        .strip_prefix(MARK_OPEN)?
        .strip_suffix(MARK_CLOSE)?;
    Some(name.trim())
}

fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('/')
        && !name.contains("..")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '/'))
}

/// The marked blocks of `doc` (its path `path`, for messages), in order.
pub fn blocks(path: &str, doc: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = doc.split('\n').collect();
    let mut out: Vec<Block> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(name) = marker(lines[i]) else {
            i += 1;
            continue;
        };
        let at = format!("{path}:{}", i + 1);
        if !name_ok(name) {
            return Err(format!("{at}: bad session name '{name}'"));
        }
        if out.iter().any(|b| b.name == name) {
            return Err(format!("{at}: session '{name}' is marked twice"));
        }
        let open = i + 1;
        if lines.get(open).map(|l| l.trim_end()) != Some("```") {
            return Err(format!(
                "{at}: the line after a session marker must open a code block (```)"
            ));
        }
        let close = (open + 1..lines.len())
            .find(|&j| lines[j].trim_end() == "```")
            .ok_or_else(|| format!("{at}: the code block after the marker is not closed"))?;
        let text: String = lines[open + 1..close]
            .iter()
            .map(|l| format!("{l}\n"))
            .collect();
        out.push(Block {
            name: name.to_string(),
            line: i + 1,
            open,
            close,
            text,
        });
        i = close + 1;
    }
    Ok(out)
}

/// `doc` with the block of every session in `transcripts` replaced by its transcript.
pub fn splice(path: &str, doc: &str, transcripts: &[(String, String)]) -> Result<String, String> {
    let found = blocks(path, doc)?;
    let lines: Vec<&str> = doc.split('\n').collect();
    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    let mut next = 0;
    for b in &found {
        let Some((_, t)) = transcripts.iter().find(|(n, _)| *n == b.name) else {
            continue;
        };
        out.extend(lines[next..=b.open].iter().map(|l| l.to_string()));
        out.extend(t.lines().map(str::to_string));
        next = b.close;
    }
    out.extend(lines[next..].iter().map(|l| l.to_string()));
    Ok(out.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "# T\n\n<!-- session: a/one -->\n```\nold 1\nold 2\n```\n\ntext\n\
                       <!-- session: two -->\n```\n```\nend\n";

    #[test]
    fn finds_and_replaces_blocks() {
        let b = blocks("d.md", DOC).unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!((b[0].name.as_str(), b[0].line), ("a/one", 3));
        assert_eq!(b[0].text, "old 1\nold 2\n");
        assert_eq!(b[1].text, "");
        let new = splice(
            "d.md",
            DOC,
            &[
                ("two".into(), "x\n".into()),
                ("a/one".into(), "new\n".into()),
            ],
        )
        .unwrap();
        assert_eq!(
            new,
            "# T\n\n<!-- session: a/one -->\n```\nnew\n```\n\ntext\n\
             <!-- session: two -->\n```\nx\n```\nend\n"
        );
        // Blocks without a transcript stay as they are.
        assert_eq!(splice("d.md", DOC, &[]).unwrap(), DOC);
    }

    #[test]
    fn refuses_malformed_markers() {
        assert!(blocks("d.md", "<!-- session: x -->\ntext\n").is_err());
        assert!(blocks("d.md", "<!-- session: x -->\n```\nopen\n").is_err());
        assert!(blocks("d.md", "<!-- session: ../x -->\n```\n```\n").is_err());
        let twice = "<!-- session: x -->\n```\n```\n<!-- session: x -->\n```\n```\n";
        assert!(blocks("d.md", twice).is_err());
    }
}
