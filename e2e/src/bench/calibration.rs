//! How true the router's TTFT predictions are, and a p90 upper bound calibrated online.
//!
//! ```text
//! headline run's requests (arrival, predicted TTFT of the chosen worker, observed TTFT)
//!   sort by arrival; skip the warm-up
//!   error:  median |predicted - observed| / observed
//!   bound:  for request i, the scores s_j = observed_j / predicted_j of the last WINDOW
//!           requests whose first token came before i arrived (split conformal on recent
//!           residuals); bound_i = predicted_i * the ceil(0.9 (n + 1))-th smallest s_j
//!   coverage: share of requests with observed <= bound
//! ```
//!
//! The bound uses only what a router could know when request i arrives (first tokens already
//! seen), so its coverage is what a live router publishing it would get. The scores are
//! ratios because a TTFT's error grows with the TTFT. Split conformal promises 90% coverage
//! when scores are exchangeable; a run whose load drifts breaks that, which is what the
//! measured coverage shows.

use serde::Serialize;

use super::sim::RequestRecord;
use super::stats::quantile;

/// Coverage the bound aims at.
pub const TARGET_COVERAGE: f64 = 0.9;
/// Recent residuals the bound is calibrated on.
pub const WINDOW: usize = 200;
/// Residuals needed before a bound is given.
pub const MIN_CALIBRATION: usize = 20;

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
    /// Share of bounded requests whose TTFT was at most the bound.
    pub p90_bound_coverage: f64,
    /// Median bound / observed TTFT (how loose the bound is).
    pub median_bound_ratio: f64,
}

/// The figures of `records` (any order; those without a finite positive prediction are left
/// out). NaN figures when no request qualifies.
pub fn evaluate(records: &[RequestRecord]) -> PredictionQuality {
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
    // (first token time, score), sorted by first token time.
    let mut seen: Vec<(f64, f64)> = rs
        .iter()
        .map(|r| (r.arrival + r.ttft, r.ttft / r.predicted_ttft))
        .collect();
    seen.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (mut errs, mut bias, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut bounded, mut covered) = (0usize, 0usize);
    for r in &rs[warmup..] {
        errs.push((r.predicted_ttft - r.ttft).abs() / r.ttft);
        bias.push((r.ttft - r.predicted_ttft) / r.ttft);
        let known = seen.partition_point(|s| s.0 <= r.arrival);
        let recent = &seen[known.saturating_sub(WINDOW)..known];
        if let Some(q) = conformal_quantile(recent.iter().map(|s| s.1), TARGET_COVERAGE) {
            let bound = r.predicted_ttft * q;
            bounded += 1;
            if r.ttft <= bound {
                covered += 1;
            }
            ratios.push(bound / r.ttft);
        }
    }
    PredictionQuality {
        requests: errs.len(),
        warmup,
        median_rel_error: quantile(&errs, 0.5),
        mean_rel_error: if errs.is_empty() {
            f64::NAN
        } else {
            errs.iter().sum::<f64>() / errs.len() as f64
        },
        median_rel_bias: quantile(&bias, 0.5),
        bounded,
        p90_bound_coverage: if bounded == 0 {
            f64::NAN
        } else {
            covered as f64 / bounded as f64
        },
        median_bound_ratio: quantile(&ratios, 0.5),
    }
}

/// Split conformal: the `ceil(level (n + 1))`-th smallest of `n` scores (None with fewer
/// than [`MIN_CALIBRATION`] or when that rank is past `n`).
pub fn conformal_quantile(scores: impl Iterator<Item = f64>, level: f64) -> Option<f64> {
    let mut v: Vec<f64> = scores.filter(|x| x.is_finite()).collect();
    if v.len() < MIN_CALIBRATION {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = (level * (v.len() + 1) as f64).ceil() as usize;
    v.get(rank.checked_sub(1)?).copied()
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
        assert!(q.median_rel_error > 0.1, "{q:?}");
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
}
