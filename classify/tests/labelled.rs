//! Regression guard on the shipped labelled set (`testdata/pii/labelled.jsonl`): per-label
//! precision and recall stay at or above the figures measured when the set was written
//! (docs/control-plane.md, `## Classifiers`) minus a small margin. A change that trades
//! one label's recall for another's precision shows here with the sample notes.

use kvroute_classify::{Classifier, Label, eval};

/// (label, precision floor, recall floor): measured minus about 0.02.
const FLOORS: [(Label, f64, f64); 6] = [
    (Label::Pii, 0.96, 0.96),
    (Label::PiiEmail, 0.96, 0.96),
    (Label::PiiPhone, 0.94, 0.95),
    (Label::PiiIban, 0.98, 0.98),
    (Label::PiiCard, 0.98, 0.98),
    (Label::PiiNationalId, 0.98, 0.94),
];

#[test]
fn precision_and_recall_hold() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../testdata/pii/labelled.jsonl"
    );
    let text = std::fs::read_to_string(path).expect("the labelled set is in the repository");
    let samples = eval::parse_set(&text).expect("the labelled set parses");
    assert!(samples.len() >= 300, "the set shrank to {}", samples.len());
    let report = eval::evaluate(&Classifier::default(), &samples);
    let mut failures = Vec::new();
    for (label, p_floor, r_floor) in FLOORS {
        let s = report.score(label);
        // Every label has positives in the set, so recall is not vacuously 1.
        assert!(
            s.tp + s.fn_ >= 40,
            "{label}: only {} positives",
            s.tp + s.fn_
        );
        if s.precision() < p_floor || s.recall() < r_floor {
            failures.push(format!(
                "{label}: precision {:.3} (floor {p_floor}), recall {:.3} (floor {r_floor})",
                s.precision(),
                s.recall()
            ));
        }
    }
    let errors: Vec<String> = report
        .errors
        .iter()
        .map(|(idx, label, predicted)| {
            let note = samples[*idx].note.as_deref().unwrap_or("");
            format!("line {}: {label} predicted={predicted} ({note})", idx + 1)
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{failures:#?}\nwrong samples:\n{}",
        errors.join("\n")
    );
}
