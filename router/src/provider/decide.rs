//! When a request leaves the cluster (pure).
//!
//! ```text
//! policy verdict (OverflowAction) + local state (best predicted TTFT, queue, queue full)
//!     --should_overflow()--> bool
//! request facts (local-only verdict, labels) --must_stay_local()--> bool (wins over the above)
//! ```
//!
//! Overflow happens when the best local predicted TTFT exceeds the action's threshold, when
//! the best local worker's queue exceeds its threshold, or when no local worker can take the
//! request at all (queue full / none ready). Local-only and `pii`-labelled requests never
//! overflow, whatever the action says.

/// An overflow action: the policy engine's verdict maps onto this.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverflowAction {
    /// InferenceProvider name.
    pub provider: String,
    /// Overflow when the best local predicted TTFT exceeds this many milliseconds.
    pub ttft_threshold_ms: Option<u64>,
    /// Overflow when the best local worker has more waiting requests than this.
    pub queue_threshold: Option<u32>,
}

/// Whether `action` sends this request to its provider, given the local pool's state:
/// `best_local_ttft_s` is the chosen local worker's predicted TTFT (`None` or NaN when nothing
/// was predicted), `best_local_queue` its waiting requests if known, `queue_full` that no
/// local worker can take the request now.
pub fn should_overflow(
    best_local_ttft_s: Option<f64>,
    best_local_queue: Option<u32>,
    queue_full: bool,
    action: &OverflowAction,
) -> bool {
    if queue_full {
        return true;
    }
    let slow = match (best_local_ttft_s, action.ttft_threshold_ms) {
        (Some(t), Some(ms)) if t.is_finite() => t * 1000.0 > ms as f64,
        _ => false,
    };
    let queued = match (best_local_queue, action.queue_threshold) {
        (Some(q), Some(max)) => q > max,
        _ => false,
    };
    slow || queued
}

/// A request that must never leave the cluster: the policy said local-only, or a classifier
/// (or the client) labelled it `pii` / `pii:*`.
pub fn must_stay_local<S: AsRef<str>>(local_only: bool, labels: &[S]) -> bool {
    local_only
        || labels.iter().any(|l| {
            let l = l.as_ref();
            l == "pii" || l.starts_with("pii:")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(ttft: Option<u64>, queue: Option<u32>) -> OverflowAction {
        OverflowAction {
            provider: "cloud".into(),
            ttft_threshold_ms: ttft,
            queue_threshold: queue,
        }
    }

    #[test]
    fn thresholds() {
        let a = action(Some(500), None);
        assert!(!should_overflow(Some(0.4), None, false, &a));
        assert!(should_overflow(Some(0.6), None, false, &a));
        assert!(!should_overflow(Some(f64::NAN), None, false, &a));
        assert!(!should_overflow(None, Some(100), false, &a));
        assert!(should_overflow(None, None, true, &a));
        let q = action(None, Some(4));
        assert!(!should_overflow(Some(9.0), Some(4), false, &q));
        assert!(should_overflow(Some(0.0), Some(5), false, &q));
    }

    #[test]
    fn pii_and_local_only_stay_local() {
        assert!(must_stay_local(true, &[] as &[&str]));
        assert!(must_stay_local(false, &["size:small", "pii"]));
        assert!(must_stay_local(false, &["pii:iban"]));
        assert!(!must_stay_local(false, &["size:large", "piig"]));
    }
}
