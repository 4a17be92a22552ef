//! The example blocks of a Markdown document that a doc test checks against the library:
//! fenced blocks whose info string holds `example:KIND`.

/// One example block: its kind, where it starts, and its lines.
#[derive(Debug)]
pub(crate) struct Example {
    /// The `KIND` of its `example:KIND` tag.
    pub(crate) kind: String,
    /// The line of its opening fence (1-based).
    pub(crate) line: usize,
    /// Its lines, each ending with a newline.
    pub(crate) body: String,
}

/// The example blocks of `doc` (named `name` in a failure): every fence toggles a block;
/// only blocks opened with an info string containing `example:KIND` are kept.
pub(crate) fn example_blocks(doc: &str, name: &str) -> Vec<Example> {
    let mut out = Vec::new();
    let mut inside: Option<Option<Example>> = None;
    for (i, line) in doc.lines().enumerate() {
        if let Some(info) = line.trim_start().strip_prefix("```") {
            match inside.take() {
                Some(Some(ex)) => out.push(ex),
                Some(None) => {}
                None => {
                    let ex = info
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("example:"))
                        .map(|kind| Example {
                            kind: kind.to_string(),
                            line: i + 1,
                            body: String::new(),
                        });
                    inside = Some(ex);
                }
            }
            continue;
        }
        if let Some(Some(ex)) = inside.as_mut() {
            ex.body.push_str(line);
            ex.body.push('\n');
        }
    }
    assert!(inside.is_none(), "unclosed fenced block in {name}");
    out
}
