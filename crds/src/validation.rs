//! Spec checks the API server may not run. Every CEL rule in the schemas
//! (`x-kubernetes-validations`) has a twin here with the same meaning, because API servers
//! before 1.25 accept CEL rules without enforcing them; the operator runs these checks and
//! reports failures as a `Degraded` condition instead of acting on a bad spec.

use std::fmt;

/// One problem with a spec: the JSON path of the offending field and a sentence for users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecIssue {
    /// Path below the object, e.g. `spec.gpu.product`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl SpecIssue {
    /// Builds an issue.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for SpecIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Joins issues into one condition message.
pub fn summary(issues: &[SpecIssue]) -> String {
    issues
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Checks that `value` is a DNS-1123 label-ish name usable as an object name
/// (lowercase alphanumerics and `-`, at most 63 characters, starting and ending alphanumeric).
pub fn is_dns_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(|b| *b != b'-')
        && bytes.last().is_some_and(|b| *b != b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        assert!(is_dns_label("qwen3-0-6b"));
        assert!(!is_dns_label("Qwen"));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label(""));
        assert!(!is_dns_label(&"a".repeat(64)));
    }
}
