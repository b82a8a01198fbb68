//! Hot prefixes: which cached prefix each recent request reused, so that kvroute can tell a
//! prefix that carries more traffic than its holders' share of the pool
//! (`PredictedTtftConfig::hot_prefix_window`).
//!
//! ```text
//! ChoiceContext.prefix_anchor --observe--> decayed count per anchor / decayed total = share
//! ```
//!
//! Counts decay per request, not per second: each request multiplies every count (lazily) by
//! `1 - 1/window`, so a count is roughly the requests for that anchor among the last `window`
//! and the total approaches `window`. Traffic is measured in requests this replica routed;
//! every replica sees about the same shares.

use std::collections::HashMap;

/// Decayed request counts per prefix anchor.
#[derive(Clone, Debug)]
pub struct HotPrefixes {
    /// `1 - 1/window`.
    decay: f64,
    /// The share's denominator never falls below this (a window): the first requests of a new
    /// router do not make their prefixes look hot. At half a window, a burst of eleven
    /// requests for one new prefix looked hot to a new router (11 of 32, times 3 workers,
    /// is over 1) where the steady-state rule lets a third of a window through; in the
    /// simulated open loop of bursts of 24 that copied the first six bursts of every run
    /// (bench/README.md, "Why kvroute splits bursts").
    floor: f64,
    /// Requests observed (the clock of the lazy decay).
    tick: u64,
    /// Decayed count of all requests, with or without an anchor.
    total: f64,
    /// Anchor -> (decayed count, tick of its last update).
    counts: HashMap<u64, (f64, u64)>,
}

impl HotPrefixes {
    /// A tracker over about `window` requests (at least 2).
    pub fn new(window: u32) -> Self {
        let w = f64::from(window.max(2));
        Self {
            decay: 1.0 - 1.0 / w,
            floor: w,
            tick: 0,
            total: 0.0,
            counts: HashMap::new(),
        }
    }

    /// Counts one request reusing `anchor` (`None`: it reuses no cached prefix) and returns
    /// that anchor's share of recent requests, this one included (0 without an anchor).
    pub fn observe(&mut self, anchor: Option<u64>) -> f64 {
        self.tick += 1;
        self.total = self.total * self.decay + 1.0;
        let Some(a) = anchor else {
            return 0.0;
        };
        let (tick, decay) = (self.tick, self.decay);
        let entry = self.counts.entry(a).or_insert((0.0, tick));
        let elapsed = i32::try_from(tick - entry.1).unwrap_or(i32::MAX);
        entry.0 = entry.0 * decay.powi(elapsed) + 1.0;
        entry.1 = tick;
        let share = entry.0 / self.total.max(self.floor);
        self.prune();
        share
    }

    /// Anchors tracked now.
    #[cfg(test)]
    pub fn tracked(&self) -> usize {
        self.counts.len()
    }

    /// Keeps the map small: past a bound of a few windows' worth of anchors, drops those
    /// whose decayed count is below half a request.
    fn prune(&mut self) {
        let bound = (4.0 * self.floor).max(64.0) as usize;
        if self.counts.len() <= bound {
            return;
        }
        let (tick, decay) = (self.tick, self.decay);
        self.counts.retain(|_, (count, last)| {
            let elapsed = i32::try_from(tick - *last).unwrap_or(i32::MAX);
            *count * decay.powi(elapsed) >= 0.5
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_in_most_requests_has_most_of_the_share() {
        let mut h = HotPrefixes::new(64);
        let mut last = 0.0;
        for i in 0..400u64 {
            // 60% of requests reuse anchor 1, the rest reuse one of 15 others or nothing.
            let anchor = match i % 10 {
                0..=5 => Some(1),
                6 => None,
                _ => Some(100 + i % 15),
            };
            let s = h.observe(anchor);
            if anchor == Some(1) {
                last = s;
            }
        }
        assert!((last - 0.6).abs() < 0.05, "share {last}");
    }

    #[test]
    fn a_new_router_does_not_call_its_first_prefix_hot() {
        let mut h = HotPrefixes::new(64);
        // Twenty requests, all for one prefix: 20 of a floor of 64, under a third, as a
        // burst of 20 is later, once a window of requests has passed.
        let s = (0..20).map(|_| h.observe(Some(7))).last().unwrap_or(0.0);
        assert!(s < 1.0 / 3.0, "share {s}");
        let mut later = HotPrefixes::new(64);
        for i in 0..200u64 {
            later.observe(Some(1_000 + i));
        }
        let steady = (0..20)
            .map(|_| later.observe(Some(7)))
            .last()
            .unwrap_or(0.0);
        assert!((s - steady).abs() < 0.05, "new {s}, steady {steady}");
        // A hot prefix still shows: 40 in a row is over a third.
        let s = (0..20).map(|_| h.observe(Some(7))).last().unwrap_or(0.0);
        assert!(s > 1.0 / 3.0, "share {s}");
    }

    #[test]
    fn a_burst_fades_and_the_map_stays_bounded() {
        let mut h = HotPrefixes::new(64);
        for _ in 0..12 {
            h.observe(Some(5));
        }
        // Then thousands of distinct anchors.
        for i in 0..10_000u64 {
            h.observe(Some(1_000 + i));
        }
        assert!(h.tracked() <= 8 * 32, "tracked {}", h.tracked());
        // The burst's prefix comes back once: its old count has decayed away.
        let s = h.observe(Some(5));
        assert!(s < 0.05, "share {s}");
    }
}
