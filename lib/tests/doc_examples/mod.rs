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

/// `bytes` as lowercase hex pairs separated by spaces, as the documents write them.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Seconds since the Unix epoch of `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) fn unix_seconds_of(iso: &str) -> i64 {
    assert_eq!(iso.len(), 20, "{iso}: YYYY-MM-DDTHH:MM:SSZ");
    let p = |r: std::ops::Range<usize>| iso[r].parse::<i64>().expect("a date field");
    days_from_civil(p(0..4), p(5..7), p(8..10)) * 86_400
        + p(11..13) * 3600
        + p(14..16) * 60
        + p(17..19)
}
