//! How true the router's TTFT predictions are, and the coverage of a p90 upper bound
//! calibrated online.
//!
//! ```text
//! one run's requests (arrival, predicted TTFT of the chosen worker, observed TTFT)
//!   sort by arrival; skip the warm-up
//!   error:  median |predicted - observed| / observed
//!   bound:  replay the run through the router's own TtftBound (routing/bound.rs): at each
//!           arrival, first every first token seen by then (in time order), then
//!           adaptive: bound_i = TtftBound::bound(predicted_i)
//!           split:    predicted_i * the ceil(0.9 (n + 1))-th smallest of the same window
//!                     (a fixed level, for comparison)
//!   coverage: share of requests with observed <= bound (each kind), and of those the router
//!             published a bound for (RequestRecord::published_bound), observed <= it
//! ```
//!
//! The bounds use only what a router could know when request i arrives (first tokens already
//! seen), so their coverage is what a live router publishing them would get; the published
//! one is what it did get (in simulation the two differ only where first tokens fall on the
//! same instant and the routing core applies them in another order). Split conformal promises
//! 90% coverage when scores are exchangeable; a run whose load drifts breaks that (the early,
//! larger errors stay in the window while the predictor settles, so the bound comes out
//! loose). Adaptive conformal inference (Gibbs and Candès, "Adaptive Conformal Inference
//! Under Distribution Shift", NeurIPS 2021) steers the level by the misses it has seen:
//! unclamped, over T bounded requests its miss rate is within (0.9 + gamma) / (gamma T) of
//! 10% whatever the drift (about 5.5% for T = 346 and gamma = 0.05). The rank stays within
//! the scores, so the bound is never infinite (with exact predictions it is the prediction),
//! and that guarantee no longer holds as such: the measured coverage is what counts. The
//! level may go below 0 (misses owed, down to `BoundConfig::alpha_floor`), so misses beyond
//! the largest score are repaid rather than forgotten. Gamma was fixed from that formula
//! before any run, not tuned on one (`BoundConfig::default`).

use kvroute_router::routing::{BoundConfig, TtftBound};
use serde::Serialize;

use super::sim::RequestRecord;
use super::stats::quantile;

/// Prediction figures of one policy's run.
#[derive(Clone, Debug, Serialize)]
pub struct PredictionQuality {
    /// Requests with a prediction after the warm-up.
    pub requests: usize,
    /// Requests skipped as warm-up (the first tenth by arrival, at least 20).
    pub warmup: usize,
    /// Median |predicted - observed| / observed TTFT after the warm-up.
    pub median_rel_error: f64,
    /// Mean of the same.
    pub mean_rel_error: f64,
    /// Median (observed - predicted) / observed: > 0 when predictions are too low.
    pub median_rel_bias: f64,
    /// Requests that had a calibrated bound (enough residuals seen before they arrived).
    pub bounded: usize,
    /// Share of bounded requests whose TTFT was at most the adaptive bound.
    pub p90_bound_coverage: f64,
    /// Median adaptive bound / observed TTFT (how loose the bound is).
    pub median_bound_ratio: f64,
    /// Share of bounded requests whose TTFT was at most the split conformal bound (fixed
    /// level 0.9).
    pub split_bound_coverage: f64,
    /// Median split bound / observed TTFT.
    pub split_bound_ratio: f64,
    /// Requests after the warm-up that carried the router's own published bound
    /// (`RequestRecord::published_bound`).
    pub published_bounded: usize,
    /// Share of those whose TTFT was at most it.
    pub published_bound_coverage: f64,
    /// Live runs of kvroute's own router: first tokens of the headline run that the router
    /// counted against the bound it published (`kvroute_router_ttft_bound_total`, covered
    /// plus missed; every bounded request, warm-up included), and the share it counted
    /// covered. The router times the first token as it serves it (from its receipt of the
    /// request); `published_bound_coverage` times it as the client does, after the warm-up.
    /// 0 and NaN where unknown (simulation, external routers).
    pub router_bounded: u64,
    /// See `router_bounded`.
    pub router_bound_coverage: f64,
}

/// `(covered, missed)` summed over models from the router's `/metrics` text (the
/// `kvroute_router_ttft_bound_total` counter); None when it counted neither.
pub fn router_bound_counts(metrics: &str) -> Option<(u64, u64)> {
    let count = |outcome: &str| {
        let labels = format!("outcome=\"{outcome}\"");
        crate::harness::metric_sum(metrics, "kvroute_router_ttft_bound_total", &labels).max(0.0)
            as u64
    };
    let (covered, missed) = (count("covered"), count("missed"));
    (covered + missed > 0).then_some((covered, missed))
}

/// The figures of `records` (any order; those without a finite positive prediction are left
/// out). NaN figures when no request qualifies.
pub fn evaluate(records: &[RequestRecord]) -> PredictionQuality {
    let mut t = PredictionTally::default();
    t.add_run(records);
    t.figures()
}

/// The figures of several independent runs pooled (see [`PredictionTally`]). None when no
/// request of any run carries a prediction (policies that predict nothing).
pub fn evaluate_predicted(runs: &[&[RequestRecord]]) -> Option<PredictionQuality> {
    let mut t = PredictionTally::default();
    for run in runs {
        t.add_run(run);
    }
    t.quality()
}

/// Per-request outcomes after the warm-up, gathered over independent runs, each with its own
/// warm-up and bound as each starts a fresh router (e.g. the headline runs of `--repeats`,
/// whose arrival clocks all start at 0).
#[derive(Default)]
pub struct PredictionTally {
    predicted: bool,
    warmup: usize,
    errs: Vec<f64>,
    bias: Vec<f64>,
    ratios: Vec<f64>,
    split_ratios: Vec<f64>,
    bounded: usize,
    covered: usize,
    split_covered: usize,
    published: usize,
    published_covered: usize,
}

impl PredictionTally {
    /// Adds one run's requests (any order).
    pub fn add_run(&mut self, records: &[RequestRecord]) {
        self.predicted |= records.iter().any(|r| r.predicted_ttft.is_finite());
        let mut rs: Vec<&RequestRecord> = records
            .iter()
            .filter(|r| {
                r.predicted_ttft.is_finite()
                    && r.predicted_ttft > 0.0
                    && r.ttft.is_finite()
                    && r.ttft > 0.0
            })
            .collect();
        rs.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
        let warmup = (rs.len() / 10).max(20).min(rs.len());
        self.warmup += warmup;
        let first_token = |r: &RequestRecord| r.arrival + r.ttft;
        // Indices in first-token order; equal times in arrival order (stable sort).
        let mut due: Vec<usize> = (0..rs.len()).collect();
        due.sort_by(|&a, &b| first_token(rs[a]).total_cmp(&first_token(rs[b])));
        let mut due = due.into_iter().peekable();
        let mut online = TtftBound::new(BoundConfig::default());
        let coverage = online.config().coverage;
        // The bound each request was given at its arrival (NaN: none).
        let mut given = vec![f64::NAN; rs.len()];
        for (i, r) in rs.iter().enumerate() {
            while let Some(j) = due.next_if(|&j| first_token(rs[j]) <= r.arrival) {
                online.observe(rs[j].predicted_ttft, given[j], rs[j].ttft);
            }
            let bound = online.bound(r.predicted_ttft);
            given[i] = bound;
            if i < warmup {
                continue;
            }
            if r.published_bound.is_finite() {
                self.published += 1;
                self.published_covered += usize::from(r.ttft <= r.published_bound);
            }
            self.errs.push((r.predicted_ttft - r.ttft).abs() / r.ttft);
            self.bias.push((r.ttft - r.predicted_ttft) / r.ttft);
            let split = split_rank(online.sorted_scores(), coverage);
            if let (true, Some(q)) = (bound.is_finite(), split) {
                let split = r.predicted_ttft * q;
                self.bounded += 1;
                self.covered += usize::from(r.ttft <= bound);
                self.split_covered += usize::from(r.ttft <= split);
                self.ratios.push(bound / r.ttft);
                self.split_ratios.push(split / r.ttft);
            }
        }
    }

    /// The pooled figures; None when no request carried a prediction.
    pub fn quality(&self) -> Option<PredictionQuality> {
        self.predicted.then(|| self.figures())
    }

    fn figures(&self) -> PredictionQuality {
        let share = |n: usize, of: usize| {
            if of == 0 {
                f64::NAN
            } else {
                n as f64 / of as f64
            }
        };
        PredictionQuality {
            requests: self.errs.len(),
            warmup: self.warmup,
            median_rel_error: quantile(&self.errs, 0.5),
            mean_rel_error: if self.errs.is_empty() {
                f64::NAN
            } else {
                self.errs.iter().sum::<f64>() / self.errs.len() as f64
            },
            median_rel_bias: quantile(&self.bias, 0.5),
            bounded: self.bounded,
            p90_bound_coverage: share(self.covered, self.bounded),
            median_bound_ratio: quantile(&self.ratios, 0.5),
            split_bound_coverage: share(self.split_covered, self.bounded),
            split_bound_ratio: quantile(&self.split_ratios, 0.5),
            published_bounded: self.published,
            published_bound_coverage: share(self.published_covered, self.published),
            router_bounded: 0,
            router_bound_coverage: f64::NAN,
        }
    }
}

/// Split conformal: the `ceil(level (n + 1))`-th smallest of `n` ascending scores (None when
/// that rank is past `n` or there are none).
fn split_rank(sorted: &[f64], level: f64) -> Option<f64> {
    let rank = (level * (sorted.len() + 1) as f64).ceil() as usize;
    sorted.get(rank.checked_sub(1)?).copied()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_routers_bound_counter_is_summed_over_models() {
        let text = "\
# HELP kvroute_router_ttft_bound_total First tokens by outcome.
# TYPE kvroute_router_ttft_bound_total counter
kvroute_router_ttft_bound_total{model=\"a\",outcome=\"covered\"} 90
kvroute_router_ttft_bound_total{model=\"a\",outcome=\"missed\"} 8
kvroute_router_ttft_bound_total{model=\"a\",outcome=\"unbounded\"} 20
kvroute_router_ttft_bound_total{model=\"b\",outcome=\"covered\"} 10
kvroute_router_ttft_bound_total{model=\"b\",outcome=\"missed\"} 2
kvroute_router_ttft_seconds_count{model=\"a\",worker=\"w\"} 118
";
        assert_eq!(super::router_bound_counts(text), Some((100, 10)));
        assert_eq!(
            super::router_bound_counts("kvroute_router_ttft_seconds_count 3\n"),
            None
        );
    }

    use super::*;

    fn rec(arrival: f64, predicted: f64, ttft: f64) -> RequestRecord {
        RequestRecord {
            worker: 0,
            arrival,
            ttft,
            e2e: ttft + 1.0,
            prompt_tokens: 100,
            cached_tokens: 0,
            predicted_ttft: predicted,
            published_bound: f64::NAN,
            floor_ttft: f64::NAN,
            true_ttfts: Vec::new(),
            predicted_ttfts: Vec::new(),
            scores: Vec::new(),
            candidates: None,
            reason: None,
            first_token: None,
        }
    }

    #[test]
    fn split_rank_is_the_split_conformal_one() {
        let s: Vec<f64> = (1..=99).map(f64::from).collect();
        // ceil(0.9 * 100) = 90th smallest.
        assert_eq!(split_rank(&s, 0.9), Some(90.0));
        // With 5 scores the rank is ceil(5.4) = 6: past them.
        assert_eq!(split_rank(&s[..5], 0.9), None);
        // With 20 scores the rank is ceil(18.9) = 19.
        assert_eq!(split_rank(&s[..20], 0.9), Some(19.0));
        assert_eq!(split_rank(&[], 0.9), None);
    }

    #[test]
    fn exact_predictions_have_no_error_and_a_tight_covering_bound() {
        let rs: Vec<_> = (0..200).map(|i| rec(i as f64, 1.0, 1.0)).collect();
        let q = evaluate(&rs);
        assert_eq!(q.warmup, 20);
        assert_eq!(q.requests, 180);
        assert_eq!(q.median_rel_error, 0.0);
        assert_eq!(q.p90_bound_coverage, 1.0);
        assert_eq!(q.median_bound_ratio, 1.0);
        assert_eq!(q.split_bound_coverage, 1.0);
    }

    #[test]
    fn noisy_predictions_are_covered_about_ninety_percent() {
        // Observed = predicted x a factor cycling through 0.5..1.5 in 100 steps: exchangeable
        // enough that the bound's coverage lands near 90%.
        let rs: Vec<_> = (0..2_000)
            .map(|i| rec(i as f64, 2.0, 2.0 * (0.5 + ((i * 37) % 100) as f64 / 100.0)))
            .collect();
        let q = evaluate(&rs);
        assert!((q.p90_bound_coverage - 0.9).abs() < 0.03, "{q:?}");
        assert!((q.split_bound_coverage - 0.9).abs() < 0.03, "{q:?}");
        assert!(q.median_rel_error > 0.1, "{q:?}");
    }

    #[test]
    fn the_adaptive_bound_holds_coverage_while_errors_shrink_and_the_split_one_does_not() {
        // The prediction improves steadily: observed = predicted x (1 + spread u), the
        // spread falling from 2 to 0.1, u cycling through 0..1. A window of past ratios then
        // always holds larger errors than the next request's: the split bound over-covers.
        let n = 3_000;
        let rs: Vec<_> = (0..n)
            .map(|i| {
                let spread = 2.0 - 1.9 * i as f64 / n as f64;
                let u = ((i * 37) % 100) as f64 / 100.0;
                rec(i as f64, 2.0, 2.0 * (1.0 + spread * u))
            })
            .collect();
        let q = evaluate(&rs);
        assert!(q.split_bound_coverage > 0.95, "{q:?}");
        assert!((q.p90_bound_coverage - 0.9).abs() <= 0.03, "{q:?}");
        assert!(q.median_bound_ratio < q.split_bound_ratio, "{q:?}");
    }

    #[test]
    fn only_first_tokens_seen_before_arrival_calibrate() {
        // Every request takes 100 s: none has finished its first token when the next ones
        // arrive, so no bound can be given.
        let rs: Vec<_> = (0..100).map(|i| rec(i as f64, 1.0, 100.0)).collect();
        let q = evaluate(&rs);
        assert_eq!(q.bounded, 0);
        assert!(q.p90_bound_coverage.is_nan());
        assert!((q.median_rel_error - 0.99).abs() < 1e-9);
    }

    #[test]
    fn pooled_runs_each_skip_their_own_warm_up() {
        // Two runs whose clocks both start at 0: 50 exact predictions, then 50 requests
        // whose TTFT is twice the prediction. Interleaved by arrival as one run, the second
        // run's first requests would calibrate on the first run's first tokens.
        let exact: Vec<_> = (0..50).map(|i| rec(i as f64, 1.0, 1.0)).collect();
        let slow: Vec<_> = (0..50).map(|i| rec(i as f64, 1.0, 2.0)).collect();
        let q = evaluate_predicted(&[&exact, &slow]).expect("predicted");
        assert_eq!(q.warmup, 40, "20 per run");
        assert_eq!(q.requests, 60);
        // Half the errors are 0, half are 0.5.
        assert!((q.mean_rel_error - 0.25).abs() < 1e-9, "{q:?}");
        // Each run's bound is its own: its predictions are off by one constant ratio.
        assert!((q.p90_bound_coverage - 1.0).abs() < 1e-9, "{q:?}");
        assert!((q.median_bound_ratio - 1.0).abs() < 1e-9, "{q:?}");
        let none: Vec<_> = (0..30).map(|i| rec(i as f64, f64::NAN, 1.0)).collect();
        assert!(evaluate_predicted(&[&none]).is_none());
    }

    #[test]
    fn the_routers_published_bound_is_checked_after_the_warm_up() {
        // 100 requests bounded by the router at 1.5 s; every fourth took 2 s.
        let rs: Vec<_> = (0..100)
            .map(|i| RequestRecord {
                published_bound: 1.5,
                ..rec(i as f64, 1.0, if i % 4 == 0 { 2.0 } else { 1.0 })
            })
            .collect();
        let q = evaluate(&rs);
        assert_eq!(q.published_bounded, 80);
        assert!((q.published_bound_coverage - 0.75).abs() < 1e-9, "{q:?}");
    }
}
