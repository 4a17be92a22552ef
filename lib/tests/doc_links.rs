//! Every relative link of the README, BENCHMARKS.md and the documents under `docs/` points
//! at a file that exists and, when it names a section, at a heading of that file (with
//! GitHub's anchors: lowercase, punctuation dropped, spaces as `-`, a repeated heading
//! numbered `-1`, `-2`, ...). Links inside fenced code blocks are not links.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the library sits in the workspace")
        .to_path_buf()
}

/// The Markdown files whose links are checked, relative to the workspace root.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut out = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.expect("a readable entry of docs/").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    out.extend(docs);
    out
}

/// The lines of `text` outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors GitHub gives the headings of `text`.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        if !line.starts_with('#') {
            continue;
        }
        let base = slug(line.trim_start_matches('#'));
        let mut anchor = base.clone();
        let mut n = 0;
        while out.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        out.insert(anchor);
    }
    out
}

/// The targets of the inline links `[text](target)` on `line`.
fn link_targets(line: &str) -> Vec<&str> {
    line.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .collect()
}

#[test]
fn every_relative_link_between_the_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("a readable document");
        let name = doc
            .strip_prefix(root())
            .unwrap_or(&doc)
            .display()
            .to_string();
        for (line_no, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
                let path = if file.is_empty() {
                    doc.clone()
                } else {
                    doc.parent().expect("a document has a folder").join(file)
                };
                if !path.exists() {
                    broken.push(format!("{name}:{line_no}: {target}: no such file"));
                    continue;
                }
                if fragment.is_empty() || path.extension().is_none_or(|ext| ext != "md") {
                    continue;
                }
                let target_text = std::fs::read_to_string(&path).expect("a readable document");
                if !anchors(&target_text).contains(fragment) {
                    broken.push(format!("{name}:{line_no}: {target}: no such heading"));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(checked >= 50, "only {checked} links checked");
}

#[test]
fn anchors_follow_github() {
    let text = "# Configuration\n## `outboxctl enqueue [FILE|-]`\n### Kafka\n### Kafka\n```\n# not a heading\n```\n## 4.3 The lease plan\n";
    let got = anchors(text);
    let want: BTreeSet<String> = [
        "configuration",
        "outboxctl-enqueue-file-",
        "kafka",
        "kafka-1",
        "43-the-lease-plan",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(got, want);
}
