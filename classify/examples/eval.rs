//! Precision and recall of the PII labeller on a labelled set (default: the shipped
//! `testdata/pii/labelled.jsonl`), as a markdown table, then each wrong sample's line and
//! note.
//!
//! `cargo run -p kvroute-classify --example eval [-- FILE]`

use std::process::ExitCode;

use kvroute_classify::{Classifier, eval};

fn main() -> ExitCode {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../testdata/pii/labelled.jsonl"
        )
        .to_string()
    });
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cannot read {path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let samples = match eval::parse_set(&text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = eval::evaluate(&Classifier::default(), &samples);
    println!("{path}: {report}");
    for (idx, label, predicted) in &report.errors {
        let what = if *predicted { "false alarm" } else { "missed" };
        let note = samples[*idx].note.as_deref().unwrap_or("");
        println!("sample {}: {label} {what} ({note})", idx + 1);
    }
    ExitCode::SUCCESS
}
