//! The per-request TTFT floor: what a request's first token would take on an idle worker
//! that already caches the longest prefix of it that any earlier request made available
//! (or a few blocks less, when that is faster: see [`FloorTracker::arrival`]). No routing can
//! beat it for that request on this profile: a busy worker only adds queueing and batching,
//! and no worker can cache tokens nobody computed before.
//!
//! ```text
//! arrival(prompt) --Shareable::leading_blocks--> shareable tokens
//!                 --idle_ttft (fresh engine: prefill the shareable prefix, then the request)--> floor
//! arrival: Shareable::record(prompt)      finish: Shareable::record(prompt + output)
//! records --summarize--> observed / floor: p50, p90; requests below the floor (0 for a floor)
//! ```
//!
//! "Available" is generous on purpose: the prompt of every request that arrived earlier
//! counts, even one still queued, and so does the output of every finished one, in full
//! blocks and under the same `cache_salt`. The floor is measured with the mock worker's own
//! engine, so it carries the profile's step overhead and chunking.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

use kvroute_mock_vllm::engine::{Engine, EngineConfig, EngineEvent, EngineRequest, Profile};
use serde::Serialize;

use super::sim::RunResult;
use super::stats::quantile;

/// Full-block prefixes computed so far in one run, as chained hashes.
#[derive(Debug, Default)]
pub struct Shareable {
    block_size: usize,
    seen: HashSet<u64>,
}

fn chain(salt: Option<&str>, tokens: &[u32], block_size: usize) -> impl Iterator<Item = u64> {
    let mut h = {
        let mut s = DefaultHasher::new();
        salt.hash(&mut s);
        s.finish()
    };
    tokens.chunks_exact(block_size.max(1)).map(move |block| {
        let mut s = DefaultHasher::new();
        h.hash(&mut s);
        block.hash(&mut s);
        h = s.finish();
        h
    })
}

impl Shareable {
    /// Empty, for blocks of `block_size` tokens.
    pub fn new(block_size: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            seen: HashSet::new(),
        }
    }

    /// Leading full blocks of `tokens` some earlier request made.
    pub fn leading_blocks(&self, salt: Option<&str>, tokens: &[u32]) -> usize {
        chain(salt, tokens, self.block_size)
            .take_while(|h| self.seen.contains(h))
            .count()
    }

    /// Records the full blocks of `tokens` as computed.
    pub fn record(&mut self, salt: Option<&str>, tokens: &[u32]) {
        self.seen.extend(chain(salt, tokens, self.block_size));
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }
}

thread_local! {
    /// Floors already measured: the same requests recur across policies and sweep levels.
    static FLOORS: RefCell<HashMap<u64, f64>> = RefCell::new(HashMap::new());
}

/// TTFT of `prompt` on an idle worker of `profile` whose cache holds its first
/// `cached_tokens` tokens (rounded down to full blocks), in seconds; infinite when the
/// engine refuses the prompt.
pub fn idle_ttft(
    profile: &Profile,
    prompt: &[u32],
    cached_tokens: usize,
    salt: Option<&str>,
    max_tokens: u32,
) -> f64 {
    let key = {
        let mut s = DefaultHasher::new();
        profile.name.hash(&mut s);
        prompt.hash(&mut s);
        cached_tokens.hash(&mut s);
        salt.hash(&mut s);
        max_tokens.hash(&mut s);
        s.finish()
    };
    if let Some(f) = FLOORS.with(|m| m.borrow().get(&key).copied()) {
        return f;
    }
    let f = measure(profile, prompt, cached_tokens, salt, max_tokens);
    FLOORS.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() > 1 << 20 {
            m.clear();
        }
        m.insert(key, f);
    });
    f
}

fn run_to_first_token(e: &mut Engine, req: EngineRequest, at: f64) -> Option<(f64, f64)> {
    let id = req.id;
    e.submit(req, at).ok()?;
    let mut t = at;
    let mut first = None;
    for _ in 0..100_000 {
        let out = e.step(t)?;
        t = out.end();
        for ev in &out.events {
            match ev {
                EngineEvent::FirstToken { id: got, at: ft } if *got == id => first = Some(*ft),
                EngineEvent::Finished { id: got, .. } if *got == id => {
                    return first.map(|f| (f, t));
                }
                _ => {}
            }
        }
    }
    None
}

fn measure(
    profile: &Profile,
    prompt: &[u32],
    cached_tokens: usize,
    salt: Option<&str>,
    max_tokens: u32,
) -> f64 {
    let mut cfg = EngineConfig::from_profile(profile);
    cfg.kv_events = false;
    let block_size = cfg.block_size.max(1);
    let mut e = Engine::new(profile.clone(), cfg);
    let cached = (cached_tokens.min(prompt.len()) / block_size) * block_size;
    let mut at = 0.0;
    if cached > 0 {
        let warm = EngineRequest {
            id: 1,
            prompt: prompt[..cached].to_vec(),
            max_tokens: 1,
            ignore_eos: true,
            cache_salt: salt.map(str::to_owned),
            lora_name: None,
        };
        match run_to_first_token(&mut e, warm, 0.0) {
            Some((_, end)) => at = end,
            None => return f64::INFINITY,
        }
    }
    // Only the first token matters: `max_tokens` is part of the cache key, not of the run.
    let _ = max_tokens;
    let req = EngineRequest {
        id: 2,
        prompt: prompt.to_vec(),
        max_tokens: 1,
        ignore_eos: true,
        cache_salt: salt.map(str::to_owned),
        lora_name: None,
    };
    match run_to_first_token(&mut e, req, at) {
        Some((first, _)) => first - at,
        None => f64::INFINITY,
    }
}

/// A worker's peak prefill throughput as llm-d's calibration recipe measures it:
/// `max_num_batched_tokens` over the TTFT of one prompt of that many tokens on an idle
/// worker (tokens/s).
pub fn peak_prefill_throughput(profile: &Profile) -> f64 {
    let chunk = (profile.max_num_batched_tokens as usize).max(1);
    let prompt: Vec<u32> = (0..chunk as u32).map(|i| 1 + i % 30_000).collect();
    let t = idle_ttft(profile, &prompt, 0, None, 1);
    if t.is_finite() && t > 0.0 {
        chunk as f64 / t
    } else {
        0.0
    }
}

/// Tracks one run's shareable prefixes and measures each request's floor on arrival.
#[derive(Debug)]
pub struct FloorTracker {
    /// The pool's distinct profiles: the floor is the fastest idle worker's.
    profiles: Vec<Profile>,
    shareable: Shareable,
}

impl FloorTracker {
    /// For a pool of `pool` workers (a heterogeneous pool: the floor is the fastest idle
    /// worker's). The block size is the first profile's (a pool shares one).
    pub fn new(pool: &[Profile]) -> Self {
        let block_size = pool
            .first()
            .map_or(16, |p| EngineConfig::from_profile(p).block_size);
        Self {
            profiles: pool.to_vec(),
            shareable: Shareable::new(block_size),
        }
    }

    /// A request arrives: its floor (seconds), then its prompt counts as computed.
    ///
    /// The floor is the lowest idle TTFT over the cached prefixes a worker could hold, from
    /// the longest shareable one down: the profile charges reading cached KV, so when a step
    /// is memory-bound a worker caching a block less is faster by microseconds. The time is
    /// the larger of a rising (KV read) and a falling (prefill) line, so the search stops at
    /// the first block that does not help.
    pub fn arrival(&mut self, salt: Option<&str>, prompt: &[u32], max_tokens: u32) -> f64 {
        let bs = self.shareable.block_size();
        let shareable = self.shareable.leading_blocks(salt, prompt) * bs;
        let mut best = f64::INFINITY;
        for profile in &self.profiles {
            let mut cached = shareable;
            let mut floor = idle_ttft(profile, prompt, cached, salt, max_tokens);
            while cached >= bs {
                let t = idle_ttft(profile, prompt, cached - bs, salt, max_tokens);
                if t >= floor {
                    break;
                }
                floor = t;
                cached -= bs;
            }
            best = best.min(floor);
        }
        self.shareable.record(salt, prompt);
        best
    }

    /// A request finished: its prompt and output count as computed.
    pub fn finished(&mut self, salt: Option<&str>, prompt_and_output: &[u32]) {
        self.shareable.record(salt, prompt_and_output);
    }
}

/// How far a run's TTFTs are from their per-request floors.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FloorSummary {
    /// Requests with a finite floor.
    pub requests: usize,
    /// Median floor, seconds.
    pub floor_p50_s: f64,
    /// Median of observed / floor TTFT.
    pub ratio_p50: f64,
    /// 90th percentile of observed / floor TTFT.
    pub ratio_p90: f64,
    /// Requests whose TTFT beat their floor by more than a microsecond (0 unless the floor
    /// is wrong).
    pub below_floor: usize,
}

/// The floor figures of a run's records.
pub fn summarize(r: &RunResult) -> FloorSummary {
    let pairs: Vec<(f64, f64)> = r
        .records
        .iter()
        .filter(|x| x.floor_ttft.is_finite() && x.floor_ttft > 0.0 && x.ttft.is_finite())
        .map(|x| (x.ttft, x.floor_ttft))
        .collect();
    let ratios: Vec<f64> = pairs.iter().map(|(t, f)| t / f).collect();
    let floors: Vec<f64> = pairs.iter().map(|(_, f)| *f).collect();
    FloorSummary {
        requests: pairs.len(),
        floor_p50_s: quantile(&floors, 0.5),
        ratio_p50: quantile(&ratios, 0.5),
        ratio_p90: quantile(&ratios, 0.9),
        below_floor: pairs.iter().filter(|(t, f)| *t < *f - 1e-6).count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> Profile {
        Profile::load("l40s-qwen3-32b-fp8").expect("builtin profile")
    }

    #[test]
    fn shareable_prefixes_are_full_blocks_under_the_same_salt() {
        let mut s = Shareable::new(16);
        let a: Vec<u32> = (0..100).collect();
        assert_eq!(s.leading_blocks(None, &a), 0);
        s.record(None, &a[..40]);
        assert_eq!(s.leading_blocks(None, &a), 2, "40 tokens = 2 full blocks");
        assert_eq!(
            s.leading_blocks(Some("t1"), &a),
            0,
            "another salt shares nothing"
        );
        let mut b = a.clone();
        b[5] = 999;
        assert_eq!(s.leading_blocks(None, &b), 0);
    }

    #[test]
    fn a_cached_prefix_lowers_the_floor_and_calibration_matches_the_profile() {
        let p = profile();
        let prompt: Vec<u32> = (0..2304).map(|i| 1 + i % 5000).collect();
        let cold = idle_ttft(&p, &prompt, 0, None, 16);
        let warm = idle_ttft(&p, &prompt, 2048, None, 16);
        assert!(cold.is_finite() && warm.is_finite());
        assert!(warm < cold / 3.0, "cold {cold} warm {warm}");
        // One full chunk of prefill on an idle L40S: prefill_s_per_token dominates.
        let r = peak_prefill_throughput(&p);
        let per_token = p.prefill_s_per_token;
        assert!(r > 0.8 / per_token && r < 1.0 / per_token, "{r}");
    }

    #[test]
    fn tracker_counts_earlier_prompts_and_outputs() {
        let p = profile();
        let mut t = FloorTracker::new(std::slice::from_ref(&p));
        let prefix: Vec<u32> = (0..2048).map(|i| 7 + i % 3000).collect();
        let mut q1 = prefix.clone();
        q1.extend(40_000..40_256);
        let mut q2 = prefix.clone();
        q2.extend(50_000..50_256);
        let f1 = t.arrival(None, &q1, 16);
        let f2 = t.arrival(None, &q2, 16);
        assert!(
            f2 < f1 / 3.0,
            "the second sees the first's prefix: {f1} {f2}"
        );
        let mut turn2 = q1.clone();
        turn2.extend(60_000..60_016); // the reply
        t.finished(None, &turn2);
        turn2.extend(70_000..70_256);
        let f3 = t.arrival(None, &turn2, 16);
        assert!(f3 < f1 / 3.0, "{f3}");
    }
}
