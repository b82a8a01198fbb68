//! KV admission: when a worker's KV cache is full, a new request waits there until running
//! requests finish and free enough. Pure arithmetic over the router's own assignments.
//!
//! ```text
//! reported usage + router's unreported placements + waiting requests + this request
//!     - capacity = deficit --> kv_wait(deficit, frees in time order) --> seconds
//! ```

/// The router's own KV footprint on one worker (see `RoutingCore::kv_releases`).
pub(super) struct KvReleases {
    pub(super) unreported_tokens: u64,
    /// (expected end, KV tokens freed), earliest first.
    pub(super) frees: Vec<(f64, u64)>,
}

/// Seconds until `deficit` KV tokens are free on a worker whose requests free `frees`
/// ((time, tokens), earliest first): 0 when nothing is missing. When the router's own
/// requests cannot free enough (others' traffic holds the rest), the wait is at least until
/// the last of them ends.
pub(super) fn kv_wait(deficit: f64, frees: &[(f64, u64)], now: f64) -> f64 {
    if deficit.is_nan() || deficit <= 0.0 {
        return 0.0;
    }
    let mut freed = 0.0;
    let mut last = now;
    for &(at, tokens) in frees {
        freed += tokens as f64;
        last = at;
        if freed >= deficit {
            return (at - now).max(0.0);
        }
    }
    (last - now).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_wait_is_the_time_until_enough_requests_finished() {
        let frees = [(1.0, 1_000), (2.0, 500), (4.0, 3_000)];
        assert_eq!(kv_wait(-5.0, &frees, 0.5), 0.0);
        assert_eq!(kv_wait(f64::NAN, &frees, 0.5), 0.0);
        assert!((kv_wait(800.0, &frees, 0.5) - 0.5).abs() < 1e-12);
        assert!((kv_wait(1_200.0, &frees, 0.5) - 1.5).abs() < 1e-12);
        // More than the router's own requests free: at least until the last of them ends.
        assert!((kv_wait(9_000.0, &frees, 0.5) - 3.5).abs() < 1e-12);
        assert_eq!(kv_wait(10.0, &[], 0.5), 0.0);
    }
}
