//! The policy engine: compiles InferencePolicy objects into a [`PolicySet`] and evaluates it
//! per request. Pure: no I/O, no clock, no randomness of its own (weighted draws take the
//! request's seed), so the router, the operator (to say whether a policy is enforceable) and
//! benches share one implementation.
//!
//! ```text
//! [InferencePolicy] --compile--> PolicySet { interned tenants/models/classes/labels,
//!                                  rules in evaluation order, per-pool scopes }
//!                                  | or Err([PolicyIssue { policy, field, message }])
//! RequestFacts + PoolState --PolicySet::evaluate--> Verdict { matched rule, its actions }
//! ```
//!
//! Order: for a request of pool `ns/p`, first the rules of the policies naming `pool: p` in
//! namespace `ns`, then those of the policies of `ns` without a pool; within each group by
//! policy name, within a policy in spec order. The first rule whose every condition holds is
//! the verdict; none is the default (no action). A request without a pool is evaluated
//! against the pool-less policies of every namespace (by namespace, then name).
//!
//! Evaluation allocates nothing: names are interned at compile time, a request's tenant,
//! models and service class are looked up once, its labels become a bitmask on the stack.

mod compile;
mod facts;
mod verdict;

pub use compile::{MAX_DISTINCT_LABELS, PolicyIssue, PolicySet, compile};
pub use facts::{HeaderSource, PoolState, PoolStateBuilder, RequestFacts};
pub use verdict::{
    Action, Limits, Matched, ModelSwitch, Overflow, Reject, Route, ServiceClass, Verdict,
};

/// A 64-bit mix of `seed` (splitmix64's finaliser): the same seed always gives the same draw.
pub fn mix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Index of the weight that `seed` draws, each weight taking its share of the total; `None`
/// when every weight is 0. Deterministic in `seed`.
pub fn weighted_choice(seed: u64, weights: impl Iterator<Item = u32> + Clone) -> Option<usize> {
    let total: u64 = weights.clone().map(u64::from).sum();
    if total == 0 {
        return None;
    }
    let mut roll = mix(seed) % total;
    for (i, w) in weights.enumerate() {
        let w = u64::from(w);
        if roll < w {
            return Some(i);
        }
        roll -= w;
    }
    None
}

/// A stable 64-bit hash of a string (FNV-1a), e.g. of a request id to seed a draw.
pub fn seed_of(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests;
