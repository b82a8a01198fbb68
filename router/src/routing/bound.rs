//! A p90 upper bound on each predicted TTFT, calibrated online by adaptive conformal
//! inference (pure).
//!
//! ```text
//! first token of an assignment (predicted p, bound b, observed o: the served TTFT, from
//! the gateway's receipt of the request when it reports one; see RoutingCore::first_token_served)
//!   score o / p  -> window of the last `window` scores (kept sorted too)
//!   b was given  -> alpha += gamma * ((1 - coverage) - [o > b]), kept within
//!                   alpha_floor..1 (below 0: misses still owed, see below)
//! new assignment with prediction p
//!   window >= min_scores: bound = p * the ceil((1 - alpha) (n + 1))-th smallest score
//!                         (rank clamped to 1..n, so never infinite: alpha <= 0 gives the
//!                         largest score)
//!   else                  no bound (NaN)
//! ```
//!
//! Scores are ratios because a TTFT's error grows with the TTFT. Split conformal (a fixed
//! level) assumes the scores are exchangeable; a router's are not: the predictor is still
//! learning at first and load drifts. Adaptive conformal inference (Gibbs and Candès,
//! "Adaptive Conformal Inference Under Distribution Shift", NeurIPS 2021) moves the level by
//! the misses it sees, so the long-run miss rate stays near 10% whatever the drift. The
//! benchmark replays its records through this same type (`e2e/src/bench/calibration.rs`) and
//! reports its coverage; the router publishes it with every decision that has a prediction
//! (`x-kvroute-ttft-p90-bound-ms`, the Pick API's `ttft_p90_bound_seconds`).
//!
//! The method's guarantee (miss rate within `(1 + gamma) / (gamma T)` of the aim over T
//! bounded requests) needs alpha unclamped. Below 0 the bound is already the largest score,
//! so clamping alpha at 0 forgot the misses of a burst the window's scores did not cover
//! (multi-turn's waves of KV stalls): coverage settled near 87% instead of 90%. Alpha may go
//! down to `alpha_floor` (-1: paying that back takes `1 / (gamma (1 - coverage))` = 200
//! covered requests, one window), so a burst's misses are owed and repaid by a bound held at
//! the largest score until they are. Above 1 the bound is the smallest score; credit beyond
//! that is not kept, so a long run of covered requests does not buy a long run of misses.

use std::collections::VecDeque;

use serde::Serialize;

/// Settings of the bound. The defaults are the benchmark's (`calibration.rs`), fixed before
/// any run: gamma from the method's miss-rate bound, not tuned.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct BoundConfig {
    /// Coverage aimed at (0.9: a p90 bound).
    pub coverage: f64,
    /// Recent scores the bound is calibrated on.
    pub window: usize,
    /// Scores needed before a bound is given.
    pub min_scores: usize,
    /// Step of the adaptive level.
    pub gamma: f64,
    /// Lowest the adaptive miss rate may go (<= 0): below 0 it counts misses owed.
    pub alpha_floor: f64,
}

impl Default for BoundConfig {
    fn default() -> Self {
        Self {
            coverage: 0.9,
            window: 200,
            min_scores: 20,
            gamma: 0.05,
            alpha_floor: -1.0,
        }
    }
}

/// What a first token showed about the bound its request was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoundOutcome {
    /// The request had no bound (too few scores yet, or no prediction).
    Unbounded,
    /// Its TTFT was at most its bound.
    Covered,
    /// Its TTFT exceeded its bound.
    Missed,
}

impl BoundOutcome {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unbounded => "unbounded",
            Self::Covered => "covered",
            Self::Missed => "missed",
        }
    }
}

/// The online bound: recent scores and the adaptive level.
#[derive(Clone, Debug)]
pub struct TtftBound {
    cfg: BoundConfig,
    /// Scores in arrival order (oldest first).
    recent: VecDeque<f64>,
    /// The same scores, ascending.
    sorted: Vec<f64>,
    /// Miss rate aimed at now (starts at 1 - coverage).
    alpha: f64,
}

impl TtftBound {
    /// An empty bound (gives none until `min_scores` first tokens were seen).
    pub fn new(cfg: BoundConfig) -> Self {
        Self {
            cfg,
            recent: VecDeque::with_capacity(cfg.window.max(1)),
            sorted: Vec::with_capacity(cfg.window.max(1)),
            alpha: (1.0 - cfg.coverage).clamp(0.0, 1.0),
        }
    }

    /// The bound for a request predicted to take `predicted` seconds; NaN when there is no
    /// usable prediction or too few scores yet.
    pub fn bound(&self, predicted: f64) -> f64 {
        if !(predicted.is_finite() && predicted > 0.0)
            || self.sorted.len() < self.cfg.min_scores.max(1)
        {
            return f64::NAN;
        }
        let n = self.sorted.len();
        let level = (1.0 - self.alpha).max(0.0);
        let rank = ((level * (n + 1) as f64).ceil() as usize).clamp(1, n);
        predicted * self.sorted[rank - 1]
    }

    /// A first token: the request was predicted `predicted` seconds, given `bound` (NaN for
    /// none) and took `observed`. Learns the score and steers the level.
    pub fn observe(&mut self, predicted: f64, bound: f64, observed: f64) -> BoundOutcome {
        if !(observed.is_finite() && observed > 0.0) {
            return BoundOutcome::Unbounded;
        }
        let outcome = if bound.is_finite() {
            let missed = observed > bound;
            let miss = if missed { 1.0 } else { 0.0 };
            let floor = self.cfg.alpha_floor.min(0.0);
            self.alpha = (self.alpha + self.cfg.gamma * ((1.0 - self.cfg.coverage) - miss))
                .clamp(floor, 1.0);
            if missed {
                BoundOutcome::Missed
            } else {
                BoundOutcome::Covered
            }
        } else {
            BoundOutcome::Unbounded
        };
        if predicted.is_finite() && predicted > 0.0 {
            self.push(observed / predicted);
        }
        outcome
    }

    fn push(&mut self, score: f64) {
        if !score.is_finite() || self.cfg.window == 0 {
            return;
        }
        if self.recent.len() == self.cfg.window
            && let Some(old) = self.recent.pop_front()
        {
            let at = self.sorted.partition_point(|s| *s < old);
            if self.sorted.get(at) == Some(&old) {
                self.sorted.remove(at);
            }
        }
        self.recent.push_back(score);
        let at = self.sorted.partition_point(|s| *s < score);
        self.sorted.insert(at, score);
    }

    /// The scores held (observed / predicted of the last `window` first tokens), ascending.
    pub fn sorted_scores(&self) -> &[f64] {
        &self.sorted
    }

    /// The settings.
    pub fn config(&self) -> BoundConfig {
        self.cfg
    }

    /// Scores held.
    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    /// No score held yet.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The adaptive level's current miss rate.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_bound_until_enough_first_tokens() {
        let mut b = TtftBound::new(BoundConfig::default());
        for _ in 0..19 {
            assert!(b.bound(1.0).is_nan());
            assert_eq!(b.observe(1.0, f64::NAN, 1.5), BoundOutcome::Unbounded);
        }
        assert!(b.bound(1.0).is_nan());
        b.observe(1.0, f64::NAN, 1.5);
        assert!((b.bound(2.0) - 3.0).abs() < 1e-12, "prediction x score");
        assert!(b.bound(f64::NAN).is_nan() && b.bound(0.0).is_nan());
    }

    #[test]
    fn rank_is_the_conformal_one_and_the_window_slides() {
        let cfg = BoundConfig {
            window: 99,
            ..BoundConfig::default()
        };
        let mut b = TtftBound::new(cfg);
        // Scores 1..=99 in a shuffled order.
        for i in 0..99u32 {
            let s = f64::from((i * 37) % 99 + 1);
            b.observe(1.0, f64::NAN, s);
        }
        // ceil(0.9 * 100) = 90th smallest.
        assert_eq!(b.bound(1.0), 90.0);
        // 99 more scores of 0.5 push every old one out.
        for _ in 0..99 {
            b.observe(1.0, f64::NAN, 0.5);
        }
        assert_eq!(b.len(), 99);
        assert_eq!(b.bound(1.0), 0.5);
    }

    #[test]
    fn misses_raise_the_level_and_covers_lower_it() {
        let mut b = TtftBound::new(BoundConfig::default());
        for _ in 0..20 {
            b.observe(1.0, f64::NAN, 1.0);
        }
        let a0 = b.alpha();
        assert_eq!(b.observe(1.0, 1.0, 2.0), BoundOutcome::Missed);
        assert!(b.alpha() < a0, "a miss asks for a higher level");
        let a1 = b.alpha();
        assert_eq!(b.observe(1.0, 1.0, 0.5), BoundOutcome::Covered);
        assert!(b.alpha() > a1);
        assert!((b.alpha() - (a1 + 0.05 * 0.1)).abs() < 1e-12);
    }

    #[test]
    fn the_level_stays_within_the_scores() {
        let mut b = TtftBound::new(BoundConfig::default());
        for i in 1..=99u32 {
            b.observe(1.0, f64::NAN, f64::from(i));
        }
        assert_eq!(b.bound(1.0), 90.0);
        // Misses without end drive alpha to its floor: the largest score, never infinity.
        for _ in 0..200 {
            b.observe(1.0, 1.0, 1e9);
        }
        assert_eq!(b.alpha(), -1.0);
        assert_eq!(b.bound(1.0), *b.sorted_scores().last().expect("scores"));
        // Covers without end drive it to 1: the smallest score.
        let mut b = TtftBound::new(BoundConfig::default());
        for i in 1..=99u32 {
            b.observe(1.0, f64::NAN, f64::from(i));
        }
        for _ in 0..10_000 {
            let s = b.sorted_scores()[50];
            b.observe(1.0, 1e12, s);
        }
        assert_eq!(b.alpha(), 1.0);
        assert_eq!(b.bound(1.0), b.sorted_scores()[0]);
    }

    #[test]
    fn noisy_predictions_are_covered_about_ninety_percent() {
        // Observed = predicted x a spread of factors that drifts upward over time: the
        // adaptive level follows it.
        let mut b = TtftBound::new(BoundConfig::default());
        let (mut covered, mut bounded) = (0u32, 0u32);
        for i in 0..4_000u32 {
            let noise = 0.5 + f64::from((i * 7_919) % 1_000) / 1_000.0;
            let drift = 1.0 + f64::from(i) / 2_000.0;
            let predicted = 1.0 + f64::from(i % 5);
            let observed = predicted * noise * drift;
            let bound = b.bound(predicted);
            match b.observe(predicted, bound, observed) {
                BoundOutcome::Covered => {
                    covered += 1;
                    bounded += 1;
                }
                BoundOutcome::Missed => bounded += 1,
                BoundOutcome::Unbounded => {}
            }
        }
        let share = f64::from(covered) / f64::from(bounded);
        assert!((share - 0.9).abs() <= 0.03, "{share}");
    }

    #[test]
    fn a_burst_of_misses_beyond_the_scores_is_repaid() {
        // Predictions right within a factor of 2, then a burst of 30 requests whose first
        // tokens take 50 times their prediction and arrive only after all 30 were given a
        // bound (a KV stall: nothing of it is seen until it ends), then as before. The
        // misses are owed: the bound stays at the largest score until they are repaid, and
        // the run's coverage is 90% after all. Clamped at 0 (the rule before), most of the
        // burst's misses are forgotten and coverage ends well below.
        let run = |floor: f64| {
            let cfg = BoundConfig {
                alpha_floor: floor,
                ..BoundConfig::default()
            };
            let mut b = TtftBound::new(cfg);
            let (mut covered, mut bounded, mut lowest) = (0u32, 0u32, f64::INFINITY);
            let mut tally = |o: BoundOutcome| match o {
                BoundOutcome::Covered => {
                    covered += 1;
                    bounded += 1;
                }
                BoundOutcome::Missed => bounded += 1,
                BoundOutcome::Unbounded => {}
            };
            let mut stalled = Vec::new();
            for i in 0..1_000u32 {
                let noise = 0.5 + 1.5 * f64::from((i * 7_919) % 1_000) / 1_000.0;
                let bound = b.bound(1.0);
                if (300..330).contains(&i) {
                    stalled.push(bound);
                    if i == 329 {
                        for &given in &stalled {
                            tally(b.observe(1.0, given, 50.0));
                        }
                    }
                } else {
                    tally(b.observe(1.0, bound, noise));
                }
                lowest = lowest.min(b.alpha());
            }
            (f64::from(covered) / f64::from(bounded), lowest)
        };
        let (share, lowest) = run(-1.0);
        assert!(lowest < -0.5, "the burst left misses owed: {lowest}");
        assert!((share - 0.9).abs() <= 0.01, "{share}");
        let (clamped, _) = run(0.0);
        assert!(clamped < 0.88, "{clamped}");
    }

    #[test]
    fn absurd_observations_teach_nothing() {
        let mut b = TtftBound::new(BoundConfig::default());
        for x in [f64::NAN, f64::INFINITY, -1.0, 0.0] {
            assert_eq!(b.observe(1.0, 1.0, x), BoundOutcome::Unbounded);
        }
        b.observe(f64::NAN, f64::NAN, 1.0);
        assert!(b.is_empty());
    }
}
