//! The provider's `spec.limits` kept by this router replica (pure: time is an argument).
//!
//! ```text
//! try_acquire(now, estimate) --rpm bucket, tpm bucket, in-flight cap--> Ok(Admitted) | Err(Limited)
//! settle(now, estimate, actual)  (tokens: the estimate is replaced by the provider's usage)
//! release()                      (the request ended: one in-flight slot back)
//! ```
//!
//! Requests and tokens per minute are token buckets that refill continuously (a full minute's
//! worth at most), so a burst of `rpm` requests passes and then one every `60/rpm` seconds.
//! A request takes its estimated tokens (prompt bytes / 4 plus its output limit) on admission;
//! when it ends, the provider's usage replaces the estimate. Limits are per replica: with N
//! router replicas the provider may see up to N times each limit.

use std::time::Instant;

use kvroute_crds::provider::ProviderLimits;

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limited {
    /// `requestsPerMinute`.
    RequestsPerMinute,
    /// `tokensPerMinute`.
    TokensPerMinute,
    /// `maxConcurrency`.
    Concurrency,
}

impl Limited {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::RequestsPerMinute => "requests_per_minute",
            Self::TokensPerMinute => "tokens_per_minute",
            Self::Concurrency => "concurrency",
        }
    }
}

#[derive(Debug, Clone)]
struct Bucket {
    per_minute: f64,
    level: f64,
    at: Instant,
}

impl Bucket {
    fn new(per_minute: i64, now: Instant) -> Self {
        let per_minute = per_minute.max(1) as f64;
        Self {
            per_minute,
            level: per_minute,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + dt * self.per_minute / 60.0).min(self.per_minute);
        self.at = now;
    }
}

/// One provider's limits in this replica.
#[derive(Debug, Clone)]
pub struct Limiter {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
    max_in_flight: Option<u32>,
    in_flight: u32,
}

impl Limiter {
    /// Full buckets for `limits`.
    pub fn new(limits: &ProviderLimits, now: Instant) -> Self {
        Self {
            requests: limits.requests_per_minute.map(|n| Bucket::new(n, now)),
            tokens: limits.tokens_per_minute.map(|n| Bucket::new(n, now)),
            max_in_flight: limits
                .max_concurrency
                .map(|n| u32::try_from(n.max(1)).unwrap_or(1)),
            in_flight: 0,
        }
    }

    /// Takes one request and `estimate` tokens, or says which limit is reached (taking nothing).
    pub fn try_acquire(&mut self, now: Instant, estimate: u64) -> Result<(), Limited> {
        if self.max_in_flight.is_some_and(|max| self.in_flight >= max) {
            return Err(Limited::Concurrency);
        }
        if let Some(b) = &mut self.requests {
            b.refill(now);
            if b.level < 1.0 {
                return Err(Limited::RequestsPerMinute);
            }
        }
        if let Some(b) = &mut self.tokens {
            b.refill(now);
            // A request larger than the whole minute's budget passes on a full bucket rather
            // than never.
            if b.level < (estimate as f64).min(b.per_minute) {
                return Err(Limited::TokensPerMinute);
            }
        }
        if let Some(b) = &mut self.requests {
            b.level -= 1.0;
        }
        if let Some(b) = &mut self.tokens {
            b.level -= estimate as f64;
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Replaces a request's estimate by what the provider reported it used.
    pub fn settle(&mut self, now: Instant, estimate: u64, actual: u64) {
        if let Some(b) = &mut self.tokens {
            b.refill(now);
            b.level = (b.level + estimate as f64 - actual as f64).min(b.per_minute);
        }
    }

    /// A request ended.
    pub fn release(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }
}

/// Tokens a request is expected to use before the provider says: its body's bytes / 4 (a
/// rough prompt size) plus its output limit (`max_tokens` or `max_completion_tokens`).
pub fn estimate_tokens(body_bytes: usize, max_output: Option<u64>) -> u64 {
    (body_bytes as u64).div_ceil(4) + max_output.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits(rpm: Option<i64>, tpm: Option<i64>, conc: Option<i32>) -> ProviderLimits {
        ProviderLimits {
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
            max_concurrency: conc,
        }
    }

    #[test]
    fn requests_per_minute_refill_continuously() {
        let t0 = Instant::now();
        let mut l = Limiter::new(&limits(Some(2), None, None), t0);
        assert_eq!(l.try_acquire(t0, 0), Ok(()));
        assert_eq!(l.try_acquire(t0, 0), Ok(()));
        assert_eq!(l.try_acquire(t0, 0), Err(Limited::RequestsPerMinute));
        // One request comes back every 30 s.
        assert_eq!(
            l.try_acquire(t0 + Duration::from_secs(29), 0),
            Err(Limited::RequestsPerMinute)
        );
        assert_eq!(l.try_acquire(t0 + Duration::from_secs(31), 0), Ok(()));
    }

    #[test]
    fn tokens_are_settled_with_the_real_usage() {
        let t0 = Instant::now();
        let mut l = Limiter::new(&limits(None, Some(1000), None), t0);
        assert_eq!(l.try_acquire(t0, 600), Ok(()));
        assert_eq!(l.try_acquire(t0, 600), Err(Limited::TokensPerMinute));
        // It used 100, not 600: 900 are left.
        l.settle(t0, 600, 100);
        assert_eq!(l.try_acquire(t0, 800), Ok(()));
        // Larger than a minute's budget: passes on a full bucket only.
        let mut l = Limiter::new(&limits(None, Some(1000), None), t0);
        assert_eq!(l.try_acquire(t0, 5000), Ok(()));
        assert_eq!(l.try_acquire(t0, 1), Err(Limited::TokensPerMinute));
    }

    #[test]
    fn concurrency_counts_requests_in_flight() {
        let t0 = Instant::now();
        let mut l = Limiter::new(&limits(None, None, Some(1)), t0);
        assert_eq!(l.try_acquire(t0, 10), Ok(()));
        assert_eq!(l.try_acquire(t0, 10), Err(Limited::Concurrency));
        l.release();
        assert_eq!(l.in_flight(), 0);
        assert_eq!(l.try_acquire(t0, 10), Ok(()));
        // Nothing set: nothing refused.
        let mut free = Limiter::new(&limits(None, None, None), t0);
        for _ in 0..1000 {
            assert_eq!(free.try_acquire(t0, 1 << 20), Ok(()));
        }
        assert_eq!(estimate_tokens(10, Some(5)), 8);
    }
}
