//! How true the router's TTFT predictions are, and a p90 upper bound calibrated online.
//!
//! ```text
//! headline run's requests (arrival, predicted TTFT of the chosen worker, observed TTFT)
//!   sort by arrival; skip the warm-up
//!   error:  median |predicted - observed| / observed
//!   bound:  for request i, the scores s_j = observed_j / predicted_j of the last WINDOW
//!           requests whose first token came before i arrived;
//!           split:    bound_i = predicted_i * the ceil(0.9 (n + 1))-th smallest s_j
//!           adaptive: the same at level 1 - alpha_i (rank clamped to the scores), where
//!                     alpha starts at 0.1 and, each time a bounded request's first token
//!                     arrives, moves by GAMMA * (0.1 - [it was above its bound]), kept
//!                     within 0..1
//!   coverage: share of requests with observed <= bound (each kind)
//! ```
//!
//! The bounds use only what a router could know when request i arrives (first tokens already
//! seen), so their coverage is what a live router publishing them would get. The scores are
//! ratios because a TTFT's error grows with the TTFT. Split conformal promises 90% coverage
//! when scores are exchangeable; a run whose load drifts breaks that (the early, larger
//! errors stay in the window while the predictor settles, so the bound comes out loose).
//! Adaptive conformal inference (Gibbs and Candès, "Adaptive Conformal Inference Under
//! Distribution Shift", NeurIPS 2021) steers the level by the misses it has seen: unclamped,
//! over T bounded requests its miss rate is within (0.9 + GAMMA) / (GAMMA T) of 10% whatever
//! the drift (about 5.5% for T = 346 and GAMMA = 0.05). Here the rank stays within the
//! scores, so the bound is never infinite (with exact predictions it is the prediction), and
//! that guarantee no longer holds as such: the measured coverage is what counts. GAMMA was
//! fixed from that formula before any run, not tuned on one. The reported bound is
//! the adaptive one; the split one's coverage is kept next to it.

use serde::Serialize;

use super::sim::RequestRecord;
use super::stats::quantile;

/// Coverage the bound aims at.
pub const TARGET_COVERAGE: f64 = 0.9;
/// Recent residuals the bound is calibrated on.
pub const WINDOW: usize = 200;
/// Residuals needed before a bound is given.
pub const MIN_CALIBRATION: usize = 20;
/// Step of the adaptive level (adaptive conformal inference's gamma).
pub const GAMMA: f64 = 0.05;

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
}

/// The figures of `records` (any order; those without a finite positive prediction are left
/// out). NaN figures when no request qualifies.
pub fn evaluate(records: &[RequestRecord]) -> PredictionQuality {
    evaluate_runs(&[records])
}

/// The figures of several independent runs pooled (each its own warm-up and bound, as each
/// starts a fresh router): e.g. the headline runs of `--repeats`, whose arrival clocks all
/// start at 0. None when no request of any run carries a prediction (policies that predict
/// nothing).
pub fn evaluate_predicted(runs: &[&[RequestRecord]]) -> Option<PredictionQuality> {
    runs.iter()
        .flat_map(|r| r.iter())
        .any(|r| r.predicted_ttft.is_finite())
        .then(|| evaluate_runs(runs))
}

/// Per-request outcomes after the warm-up, gathered over runs.
#[derive(Default)]
struct Tally {
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

fn evaluate_runs(runs: &[&[RequestRecord]]) -> PredictionQuality {
    let mut t = Tally::default();
    for records in runs {
        tally(records, &mut t);
    }
    let share = |n: usize| {
        if t.bounded == 0 {
            f64::NAN
        } else {
            n as f64 / t.bounded as f64
        }
    };
    PredictionQuality {
        requests: t.errs.len(),
        warmup: t.warmup,
        median_rel_error: quantile(&t.errs, 0.5),
        mean_rel_error: if t.errs.is_empty() {
            f64::NAN
        } else {
            t.errs.iter().sum::<f64>() / t.errs.len() as f64
        },
        median_rel_bias: quantile(&t.bias, 0.5),
        bounded: t.bounded,
        p90_bound_coverage: share(t.covered),
        median_bound_ratio: quantile(&t.ratios, 0.5),
        split_bound_coverage: share(t.split_covered),
        split_bound_ratio: quantile(&t.split_ratios, 0.5),
        published_bounded: t.published,
        published_bound_coverage: if t.published == 0 {
            f64::NAN
        } else {
            t.published_covered as f64 / t.published as f64
        },
    }
}

/// Adds one run's requests to `t`.
fn tally(records: &[RequestRecord], t: &mut Tally) {
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
    t.warmup += warmup;
    // (first token time, score), sorted by first token time.
    let mut seen: Vec<(f64, f64)> = rs
        .iter()
        .map(|r| (r.arrival + r.ttft, r.ttft / r.predicted_ttft))
        .collect();
    seen.sort_by(|a, b| a.0.total_cmp(&b.0));
    // Adaptive level: alpha, and the bounded requests whose first token is still to come
    // (first token time, above their bound), applied in first-token order.
    let mut alpha = 1.0 - TARGET_COVERAGE;
    // Kept sorted latest first, so the next first token to come is the last element.
    let mut waiting: Vec<(f64, bool)> = Vec::new();
    for (i, r) in rs.iter().enumerate() {
        while waiting.last().is_some_and(|w| w.0 <= r.arrival) {
            if let Some((_, missed)) = waiting.pop() {
                let miss = if missed { 1.0 } else { 0.0 };
                alpha = (alpha + GAMMA * ((1.0 - TARGET_COVERAGE) - miss)).clamp(0.0, 1.0);
            }
        }
        let known = seen.partition_point(|s| s.0 <= r.arrival);
        let recent = &seen[known.saturating_sub(WINDOW)..known];
        let bounds = if recent.len() >= MIN_CALIBRATION {
            // One sorted window serves both quantiles.
            let window = sorted_finite(recent.iter().map(|s| s.1));
            let split = split_rank(&window, TARGET_COVERAGE);
            let adaptive = adaptive_rank(&window, 1.0 - alpha);
            split.map(|q| (r.predicted_ttft * q, r.predicted_ttft * adaptive))
        } else {
            None
        };
        if let Some((_, bound)) = bounds {
            let first_token = r.arrival + r.ttft;
            // After every later or equal one: equal times come due in arrival order.
            let at = waiting.partition_point(|w| w.0.total_cmp(&first_token).is_ge());
            waiting.insert(at, (first_token, r.ttft > bound));
        }
        if i < warmup {
            continue;
        }
        if r.published_bound.is_finite() {
            t.published += 1;
            t.published_covered += usize::from(r.ttft <= r.published_bound);
        }
        t.errs.push((r.predicted_ttft - r.ttft).abs() / r.ttft);
        t.bias.push((r.ttft - r.predicted_ttft) / r.ttft);
        if let Some((split, bound)) = bounds {
            t.bounded += 1;
            t.covered += usize::from(r.ttft <= bound);
            t.split_covered += usize::from(r.ttft <= split);
            t.ratios.push(bound / r.ttft);
            t.split_ratios.push(split / r.ttft);
        }
    }
}

/// The adaptive bound's quantile of `scores` at `level`: the split conformal rank
/// `ceil(level (n + 1))`, clamped to the scores (from the smallest to the largest, so the
/// bound is never infinite; NaN without scores).
pub fn adaptive_quantile(scores: impl Iterator<Item = f64>, level: f64) -> f64 {
    adaptive_rank(&sorted_finite(scores), level)
}

/// Split conformal: the `ceil(level (n + 1))`-th smallest of `n` scores (None with fewer
/// than [`MIN_CALIBRATION`] or when that rank is past `n`).
pub fn conformal_quantile(scores: impl Iterator<Item = f64>, level: f64) -> Option<f64> {
    split_rank(&sorted_finite(scores), level)
}

/// The finite `scores`, ascending.
fn sorted_finite(scores: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = scores.filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    v
}

/// [`adaptive_quantile`] of scores already sorted by [`sorted_finite`].
fn adaptive_rank(sorted: &[f64], level: f64) -> f64 {
    let rank = (level.max(0.0) * (sorted.len() + 1) as f64).ceil() as usize;
    sorted
        .get(rank.clamp(1, sorted.len().max(1)) - 1)
        .copied()
        .unwrap_or(f64::NAN)
}

/// [`conformal_quantile`] of scores already sorted by [`sorted_finite`].
fn split_rank(sorted: &[f64], level: f64) -> Option<f64> {
    if sorted.len() < MIN_CALIBRATION {
        return None;
    }
    let rank = (level * (sorted.len() + 1) as f64).ceil() as usize;
    sorted.get(rank.checked_sub(1)?).copied()
}

#[cfg(test)]
mod tests {
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
            first_token: None,
        }
    }

    #[test]
    fn conformal_rank_is_the_split_conformal_one() {
        let s = (1..=99).map(f64::from);
        // ceil(0.9 * 100) = 90th smallest.
        assert_eq!(conformal_quantile(s, 0.9), Some(90.0));
        assert_eq!(conformal_quantile((1..=5).map(f64::from), 0.9), None);
        // With 20 scores the rank is ceil(18.9) = 19.
        assert_eq!(conformal_quantile((1..=20).map(f64::from), 0.9), Some(19.0));
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
    fn adaptive_quantile_clamps_its_level() {
        let s = || (1..=99).map(f64::from);
        assert_eq!(adaptive_quantile(s(), 0.9), 90.0);
        assert_eq!(adaptive_quantile(s(), 0.995), 99.0);
        assert_eq!(adaptive_quantile(s(), 1.0), 99.0);
        assert_eq!(adaptive_quantile(s(), 0.0), 1.0);
        assert_eq!(adaptive_quantile(s(), -0.2), 1.0);
        assert!(adaptive_quantile(std::iter::empty(), 0.9).is_nan());
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
