//! Where each worker is in its engine step, from the streamed chunks the router relays.
//!
//! ```text
//! chunk of any streaming request from w at t --> StepClocks::observe(w, t)
//!     (chunks within `merge_s` of the last are one step's)
//! step length = t - previous step's end        (none above `max_step_s`: the worker idled)
//! left(w, now) = max(0, step length - (now - last step's end))
//! ```
//!
//! vLLM's engine runs in steps: a step decodes one token of every running request and
//! prefills chunks of waiting ones, and a request that arrives mid-step is scheduled only
//! when that step ends. Its first token therefore comes after whatever is left of the
//! running step, then its own prefill. A streaming response carries one chunk per step per
//! running request, so the time between two steps' chunks is the length of a step, and the
//! time since the last chunk is how far the running one has got. The next step is taken to
//! be as long as the last: the TTFT model adds a share of what would be left of it
//! (`Candidate::step_s`) and learns the rest (`predict.rs`). Without chunks (no
//! streaming request running there, or the data path is not the router's) nothing is left.
//! Pure: time is the caller's `f64` seconds.

use super::workers::WorkerId;

/// Settings of the step clocks.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct StepConfig {
    /// Share of the running step's remainder a prediction counts (`Candidate::step_s`):
    /// 1, all of it, as a request waits for the whole step. The remainder takes the running
    /// step to be as long as the last, which it often is not (a step's prefill chunks come
    /// and go); bench/README.md ("The running engine step") measures 0, 0.5, 0.75 and 1.
    /// 0 counts none: the fit's overhead then takes the phase's mean.
    pub share: f64,
    /// Chunks closer than this to the last one belong to the same step (the engine emits
    /// one step's chunks together; the network spreads them a little).
    pub merge_s: f64,
    /// A gap between chunks longer than this is no step: the worker idled, or ran steps no
    /// streaming request saw. Its length is then unknown until the next gap.
    pub max_step_s: f64,
    /// Decode-only steps: when no prompt awaits its first token on a worker (none of this
    /// router's or its peers', none reported waiting), or the only ones waiting are this
    /// router's and were all sent after the running step began (at or after its last
    /// step's chunks: the engine schedules a step's prompts when it begins, and has begun
    /// the next step by the time a step's chunks are seen), the running step computes no
    /// prefill chunk, so it may be taken to be as long as the shortest of the worker's last
    /// [`RECENT_STEPS`] steps, not the last one, which may have carried a prompt's prefill
    /// and lasted several times as long. See [`DecodeSteps`] for where the shorter length
    /// counts.
    pub decode_steps: DecodeSteps,
}

/// Where [`StepConfig::decode_steps`]'s shorter running step counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DecodeSteps {
    /// Nowhere: the running step is always as long as the last one.
    Off,
    /// In the published prediction only (the one the router reports, bounds and counts its
    /// error by); the choice and the fit keep the last step's length, so routing is as with
    /// `Off`. The default: it brings simulated multi-turn's median error within 10% on
    /// every seed set and routes exactly as `Off` (bench/README.md, "Decode-only steps").
    #[default]
    Published,
    /// In the choice, the fit and the published prediction. It halves multi-turn's
    /// simulated prediction error but lengthens its TTFT tail (bench/README.md,
    /// "Decode-only steps").
    On,
}

impl std::str::FromStr for DecodeSteps {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(Self::Off),
            "published" => Ok(Self::Published),
            "on" => Ok(Self::On),
            _ => Err(format!(
                "decode steps {s:?} is not one of off, published, on (where a decode-only step's shorter length counts)"
            )),
        }
    }
}

/// Steps remembered per worker for [`StepConfig::decode_steps`].
pub const RECENT_STEPS: usize = 8;

impl Default for StepConfig {
    fn default() -> Self {
        Self {
            share: 1.0,
            merge_s: 0.005,
            max_step_s: 2.0,
            decode_steps: DecodeSteps::Published,
        }
    }
}

impl StepConfig {
    /// `share` when it is one (0 to 1), else why not.
    pub fn check_share(share: f64) -> Result<f64, String> {
        if share.is_finite() && (0.0..=1.0).contains(&share) {
            Ok(share)
        } else {
            Err(format!(
                "step share {share} is not between 0 and 1 (the share of the running engine step a prediction counts)"
            ))
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct StepClock {
    /// When the last step's chunks arrived.
    last_end: f64,
    /// The last step's length, if the gap before it was a step.
    len: Option<f64>,
}

/// A worker's last step lengths, kept unless [`StepConfig::decode_steps`] is off (a ring;
/// `0.0` slots are empty).
#[derive(Clone, Copy, Debug, Default)]
struct RecentSteps {
    lens: [f64; RECENT_STEPS],
    /// Where the next length goes.
    next: usize,
}

/// One clock per worker id.
#[derive(Clone, Debug, Default)]
pub struct StepClocks {
    clocks: Vec<Option<StepClock>>,
    /// Per worker id, unless [`StepConfig::decode_steps`] is off (empty then). Apart from
    /// the clocks so that they stay small: a data path copies both for each decision.
    recent: Vec<RecentSteps>,
}

impl StepClocks {
    /// A chunk of a streaming response from `w` arrived at `at`. Chunks older than the last
    /// one seen are ignored (reports can race).
    pub fn observe(&mut self, cfg: &StepConfig, w: WorkerId, at: f64) {
        if !at.is_finite() {
            return;
        }
        let i = w.index();
        if self.clocks.len() <= i {
            self.clocks.resize(i + 1, None);
        }
        let slot = &mut self.clocks[i];
        match slot {
            None => {
                *slot = Some(StepClock {
                    last_end: at,
                    len: None,
                })
            }
            Some(c) => {
                let gap = at - c.last_end;
                if gap < cfg.merge_s {
                    return;
                }
                c.len = (gap <= cfg.max_step_s).then_some(gap);
                c.last_end = at;
                if cfg.decode_steps != DecodeSteps::Off
                    && let Some(len) = c.len
                {
                    if self.recent.len() <= i {
                        self.recent.resize(i + 1, RecentSteps::default());
                    }
                    let r = &mut self.recent[i];
                    r.lens[r.next] = len;
                    r.next = (r.next + 1) % RECENT_STEPS;
                }
            }
        }
    }

    /// Seconds left of the step `w` runs at `now`, taken to be as long as its last one; 0
    /// when its last step's length is unknown or it should have ended already.
    pub fn left(&self, w: WorkerId, now: f64) -> f64 {
        let Some(Some(c)) = self.clocks.get(w.index()) else {
            return 0.0;
        };
        c.len.map_or(0.0, |len| remainder(len, now - c.last_end))
    }

    /// Seconds left of the step `w` runs at `now` when it computes no prefill: taken to be
    /// as long as the shortest of its last [`RECENT_STEPS`] steps (see
    /// [`StepConfig::decode_steps`]); 0 as for [`StepClocks::left`].
    pub fn left_decode(&self, w: WorkerId, now: f64) -> f64 {
        let Some(Some(c)) = self.clocks.get(w.index()) else {
            return 0.0;
        };
        let Some(r) = c.len.and(self.recent.get(w.index())) else {
            return 0.0;
        };
        let shortest = r
            .lens
            .iter()
            .copied()
            .filter(|&l| l > 0.0)
            .fold(f64::INFINITY, f64::min);
        if shortest.is_finite() {
            remainder(shortest, now - c.last_end)
        } else {
            0.0
        }
    }

    /// When the chunks of `w`'s last step arrived: the running step began no later.
    pub fn last_end(&self, w: WorkerId) -> Option<f64> {
        Some(self.clocks.get(w.index()).copied().flatten()?.last_end)
    }

    /// The length of `w`'s last step, when the gap before it was one.
    pub fn step_len(&self, w: WorkerId) -> Option<f64> {
        self.clocks.get(w.index()).copied().flatten()?.len
    }

    /// Forgets `w` (retired; its id may be reused).
    pub fn forget(&mut self, w: WorkerId) {
        if let Some(c) = self.clocks.get_mut(w.index()) {
            *c = None;
        }
        if let Some(r) = self.recent.get_mut(w.index()) {
            *r = RecentSteps::default();
        }
    }

    /// Copies `other`'s clocks into these, reusing the allocation.
    pub fn copy_from(&mut self, other: &StepClocks) {
        self.clocks.clone_from(&other.clocks);
        self.recent.clone_from(&other.recent);
    }
}

/// What is left of a step `len` long, `elapsed` after it began (0 to `len`).
fn remainder(len: f64, elapsed: f64) -> f64 {
    let left = len - elapsed;
    if left.is_finite() {
        left.clamp(0.0, len)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_remainder_of_a_step_as_long_as_the_last() {
        let cfg = StepConfig::default();
        let mut s = StepClocks::default();
        let w = WorkerId(1);
        assert_eq!(s.left(w, 1.0), 0.0, "no chunk yet");
        s.observe(&cfg, w, 1.0);
        assert_eq!(
            s.left(w, 1.01),
            0.0,
            "one step's end: its length is unknown"
        );
        // A second step 60 ms later; chunks of the same step 2 ms apart are one.
        s.observe(&cfg, w, 1.06);
        s.observe(&cfg, w, 1.062);
        assert!(s.step_len(w).is_some_and(|l| (l - 0.06).abs() < 1e-9));
        assert!((s.left(w, 1.08) - 0.04).abs() < 1e-9, "{}", s.left(w, 1.08));
        assert_eq!(s.left(w, 1.2), 0.0, "overdue: nothing left");
        // Another worker is untouched.
        assert_eq!(s.left(WorkerId(0), 1.08), 0.0);
        // A gap longer than any step: the worker idled; the length is unknown again.
        s.observe(&cfg, w, 5.0);
        assert_eq!(s.left(w, 5.01), 0.0);
        s.observe(&cfg, w, 5.4);
        assert!((s.left(w, 5.5) - 0.3).abs() < 1e-9);
        // Out-of-order and absurd chunks are ignored.
        s.observe(&cfg, w, 5.1);
        s.observe(&cfg, w, f64::NAN);
        assert!((s.left(w, 5.5) - 0.3).abs() < 1e-9);
        // A clock read before its last chunk never says more than a step.
        assert!((s.left(w, 5.0) - 0.4).abs() < 1e-9);
        let mut copy = StepClocks::default();
        copy.copy_from(&s);
        assert!((copy.left(w, 5.5) - 0.3).abs() < 1e-9);
        s.forget(w);
        assert_eq!(s.left(w, 5.5), 0.0);
        s.forget(WorkerId(9));
    }

    #[test]
    fn a_decode_step_is_as_long_as_the_shortest_recent_one() {
        let cfg = StepConfig {
            decode_steps: DecodeSteps::On,
            ..StepConfig::default()
        };
        let mut s = StepClocks::default();
        let w = WorkerId(0);
        assert_eq!(s.left_decode(w, 1.0), 0.0, "no chunk yet");
        s.observe(&cfg, w, 1.0);
        assert_eq!(s.left_decode(w, 1.0), 0.0, "no step's length known");
        // Decode steps of 20 ms, then one 60 ms step that carried a prefill chunk.
        for t in [1.02, 1.04, 1.06, 1.12] {
            s.observe(&cfg, w, t);
        }
        assert!((s.left(w, 1.13) - 0.05).abs() < 1e-9, "{}", s.left(w, 1.13));
        assert!(
            (s.left_decode(w, 1.13) - 0.01).abs() < 1e-9,
            "{}",
            s.left_decode(w, 1.13)
        );
        assert_eq!(s.left_decode(w, 1.2), 0.0, "overdue");
        // The ring keeps the last RECENT_STEPS lengths: eight 60 ms steps push the 20 ms
        // ones out.
        let mut t = 1.12;
        for _ in 0..RECENT_STEPS {
            t += 0.06;
            s.observe(&cfg, w, t);
        }
        assert!((s.left_decode(w, t) - 0.06).abs() < 1e-9);
        // An idle gap: the worker may be idle, nothing is left, as for `left`.
        s.observe(&cfg, w, t + 5.0);
        assert_eq!(s.left_decode(w, t + 5.0), 0.0);
        assert_eq!(s.left(w, t + 5.0), 0.0);
        s.forget(w);
        assert_eq!(s.left_decode(w, t + 5.0), 0.0);
    }
}
