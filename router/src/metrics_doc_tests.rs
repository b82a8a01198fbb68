//! docs/operations.md lists every metric the router, the sidecar and the operator define, with
//! the right type and labels. The metrics are found where they are defined: each string
//! literal `kvroute_<component>_...` in the three crates' sources outside tests (and, in the
//! sidecar, the names its `cv`/`c`/`gv`/`g` helpers prefix with `kvroute_sidecar_`); the
//! labels are read from the call when it lists them (`&["model", "worker"]`, or one label
//! literal as in `AuthMetrics`). Adding a metric without a row, or a row for a metric that no
//! longer exists, fails here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A metric as its definition spells it.
#[derive(Debug)]
struct Defined {
    /// Labels listed at the call site; `None` when the call does not list them (a helper
    /// that fixes them, or a metric without labels).
    labels: Option<Vec<String>>,
    file: PathBuf,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// String literals of `src` with their byte ranges (plain `"..."` with escapes; enough for
/// metric names and help texts).
fn literals(src: &str) -> Vec<(usize, usize, String)> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'\'' => {
                // A char literal such as '"' must not open a string; lifetimes pass through.
                if b.get(i + 2) == Some(&b'\'') {
                    i += 3;
                    continue;
                }
                if b.get(i + 1) == Some(&b'\\') && b.get(i + 3) == Some(&b'\'') {
                    i += 4;
                    continue;
                }
                i += 1;
            }
            b'"' => {
                let start = i;
                i += 1;
                let mut text = String::new();
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    if let Some(c) = src[i..].chars().next() {
                        text.push(c);
                        i += c.len_utf8();
                    } else {
                        break;
                    }
                }
                out.push((start, i + 1, text));
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

/// The labels listed right after the help text, up to the `)?` that ends the call.
fn labels_after(src: &str, from: usize) -> Option<Vec<String>> {
    let end = src[from..].find(")?")? + from;
    if end - from > 600 {
        return None;
    }
    let mut w = &src[from..=end];
    loop {
        w = w.trim_start_matches([' ', '\n', ',', ')']);
        if let Some(rest) = w.strip_prefix('.') {
            // A builder call such as `.buckets(B.to_vec())`: skip to its closing paren.
            let mut depth = 0;
            let mut cut = rest.len();
            for (j, c) in rest.char_indices() {
                match c {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            cut = j + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            w = &rest[cut..];
            continue;
        }
        break;
    }
    if w.starts_with('"') {
        return literals(w).into_iter().next().map(|(_, _, l)| vec![l]);
    }
    if let Some(list) = w.strip_prefix("&[") {
        let list = &list[..list.find(']')?];
        return Some(literals(list).into_iter().map(|(_, _, l)| l).collect());
    }
    None
}

fn defined() -> BTreeMap<String, Defined> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = BTreeMap::new();
    for component in ["router", "sidecar", "operator"] {
        let mut files = Vec::new();
        rust_files(&root.join(component).join("src"), &mut files);
        files.sort();
        for file in files {
            let name = file
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.ends_with("tests.rs") {
                continue;
            }
            let Ok(full) = std::fs::read_to_string(&file) else {
                continue;
            };
            let src = match full.find("#[cfg(test)]\nmod tests") {
                Some(i) => &full[..i],
                None => full.as_str(),
            };
            let lits = literals(src);
            for (k, (start, _, text)) in lits.iter().enumerate() {
                let prefix = format!("kvroute_{component}_");
                let metric = if text.starts_with(&prefix)
                    && text[prefix.len()..]
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                    && text.len() > prefix.len()
                {
                    text.clone()
                } else if component == "sidecar" && name == "metrics.rs" && {
                    let before = src[..*start].trim_end();
                    ["cv(", "c(", "gv(", "g(", "hv(", "h("].iter().any(|h| {
                        before.ends_with(h)
                            && !before[..before.len() - h.len()]
                                .ends_with(|c: char| c.is_alphanumeric() || c == '_')
                    })
                } {
                    format!("{prefix}{text}")
                } else {
                    continue;
                };
                let labels = lits
                    .get(k + 1)
                    .and_then(|(_, end, _)| labels_after(src, *end));
                out.insert(
                    metric,
                    Defined {
                        labels,
                        file: file.clone(),
                    },
                );
            }
        }
    }
    out
}

/// A row of the metrics tables: (type, labels).
fn documented() -> BTreeMap<String, (String, Vec<String>)> {
    let doc = include_str!("../../docs/operations.md");
    doc.lines()
        .filter(|l| l.starts_with("| `kvroute_"))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let name = cells[1].trim_matches('`').to_string();
            let ty = cells.get(2).copied().unwrap_or_default().to_string();
            let labels = cells
                .get(3)
                .copied()
                .unwrap_or_default()
                .split(',')
                .map(|s| s.trim().trim_matches('`').to_string())
                .filter(|s| !s.is_empty() && s != "-")
                .collect();
            (name, (ty, labels))
        })
        .collect()
}

#[test]
fn the_source_scan_finds_the_metrics_it_should() {
    let d = defined();
    assert!(d.len() >= 90, "{} metrics found", d.len());
    let requests = &d["kvroute_router_requests_total"];
    assert_eq!(
        requests.labels.as_deref(),
        Some(&["model".to_string(), "worker".into(), "reason".into()][..])
    );
    assert_eq!(
        d["kvroute_router_ingest_refused_total"].labels.as_deref(),
        Some(&["reason".to_string()][..])
    );
    assert!(d.contains_key("kvroute_sidecar_seq_gaps_total"));
    assert!(d.contains_key("kvroute_operator_leader"));
}

#[test]
fn operations_doc_lists_every_metric_with_its_type_and_labels() {
    let defined = defined();
    let documented = documented();
    let undocumented: Vec<String> = defined
        .iter()
        .filter(|(n, _)| !documented.contains_key(*n))
        .map(|(n, d)| format!("{n} ({})", d.file.display()))
        .collect();
    assert!(
        undocumented.is_empty(),
        "docs/operations.md lacks {undocumented:#?}"
    );
    let gone: Vec<&String> = documented
        .keys()
        .filter(|n| !defined.contains_key(*n))
        .collect();
    assert!(
        gone.is_empty(),
        "docs/operations.md lists metrics that no longer exist: {gone:?}"
    );
    for (name, (ty, labels)) in &documented {
        // The naming rule (docs/STYLE.md, 9): counters end in _total, histograms of
        // durations in _seconds; the rest are gauges.
        let expected = if name.ends_with("_total") {
            "counter"
        } else if name.ends_with("_seconds") {
            "histogram"
        } else {
            "gauge"
        };
        assert_eq!(ty, expected, "{name}");
        if let Some(src_labels) = defined.get(name).and_then(|d| d.labels.as_ref()) {
            assert_eq!(labels, src_labels, "{name}: labels");
        }
    }
}

/// Every `kvroute_<component>_...` name the operations and troubleshooting pages mention (in
/// alert expressions and prose) is a metric that exists; histogram series (`_bucket`,
/// `_sum`, `_count`) count as their histogram.
#[test]
fn the_pages_mention_only_metrics_that_exist() {
    let defined = defined();
    for (page, text) in [
        ("operations.md", include_str!("../../docs/operations.md")),
        (
            "troubleshooting.md",
            include_str!("../../docs/troubleshooting.md"),
        ),
    ] {
        let mut unknown = Vec::new();
        for (i, _) in text.match_indices("kvroute_") {
            let word: String = text[i..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            if !["kvroute_router_", "kvroute_sidecar_", "kvroute_operator_"]
                .iter()
                .any(|p| word.starts_with(p) && word.len() > p.len())
            {
                continue;
            }
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| word.strip_suffix(s).filter(|b| defined.contains_key(*b)))
                .unwrap_or(&word);
            if !defined.contains_key(base) {
                unknown.push(word);
            }
        }
        assert!(
            unknown.is_empty(),
            "docs/{page} names unknown metrics {unknown:?}"
        );
    }
}
