//! Arbitrary bytes as text (UTF-8, or lossily converted) through the PII labeller and the
//! classifier: never a panic; every span lies inside the text on char boundaries, covers
//! ASCII only, and spans come in order without overlapping; the classifier's per-kind counts
//! and labels agree with the findings. The same text cut into two messages must not panic
//! either (a split can fall anywhere).
//!
//! `cargo +nightly fuzz run labeller corpus/labeller seeds/labeller`

#![no_main]

use kvroute_classify::{Classifier, ClassifyInput, Label, PiiKind, pii_findings};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let owned;
    let text = match std::str::from_utf8(data) {
        Ok(t) => t,
        Err(_) => {
            owned = String::from_utf8_lossy(data).into_owned();
            owned.as_str()
        }
    };
    let findings = pii_findings(text);
    let mut prev_end = 0;
    for f in &findings {
        assert!(f.span.start < f.span.end, "empty span {f:?}");
        assert!(f.span.end <= text.len(), "span past the end {f:?}");
        assert!(
            text.is_char_boundary(f.span.start) && text.is_char_boundary(f.span.end),
            "span off a char boundary {f:?}"
        );
        assert!(f.span.start >= prev_end, "overlapping spans {findings:?}");
        assert!(text[f.span.clone()].is_ascii(), "non-ASCII span {f:?}");
        prev_end = f.span.end;
    }

    let classifier = Classifier::default();
    let texts = [text];
    let out = classifier.classify(&ClassifyInput {
        texts: &texts,
        prompt_tokens: data.len() / 4,
        max_tokens: None,
        messages: 1,
    });
    for kind in PiiKind::ALL {
        let n = findings.iter().filter(|f| f.kind == kind).count();
        assert_eq!(out.pii.get(kind) as usize, n, "{kind:?} count");
        assert_eq!(out.labels.has(kind.label()), n > 0, "{kind:?} label");
    }
    assert_eq!(out.labels.has(Label::Pii), !findings.is_empty());
    let sizes = [Label::SizeSmall, Label::SizeMedium, Label::SizeLarge];
    assert_eq!(sizes.iter().filter(|l| out.labels.has(**l)).count(), 1);

    // The same text as two messages, split at a char boundary.
    let mut cut = data.first().map_or(0, |&b| usize::from(b)) % (text.len() + 1);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    let (a, b) = text.split_at(cut);
    let two = [a, b];
    let _ = classifier.classify(&ClassifyInput {
        texts: &two,
        prompt_tokens: 0,
        max_tokens: Some(u32::MAX),
        messages: 2,
    });
});
