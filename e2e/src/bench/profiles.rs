//! The simulated pool's GPUs and the router's starting point: no home advantage.
//!
//! ```text
//! --profile "l40s-27b-fp8,l40s-27b-fp8,h100-27b-fp8"  --pool()-->  worker i runs profile i % 3
//! router core  <--sim_core_config()--  GENERIC_PRIOR (matches no simulated GPU)
//!        learns each worker's prefill rate and overhead online from its first tokens
//! ```
//!
//! The simulated workers follow the mock engine's profiles (mock-vllm/profiles/*.json, each
//! citing where its numbers come from). The router must not be told those numbers: it starts
//! every worker from [`GENERIC_PRIOR`], a round guess that is deliberately none of the
//! profiles (a unit test checks that it is at least 25% off each one's prefill rate and
//! fixed cost), and learns each worker's speed online (recursive least squares on observed
//! first tokens, router/src/routing/predict.rs). In a heterogeneous pool every worker starts
//! from the same prior, so the router has to find out which one is fast.

use anyhow::{Context, bail};
use kvroute_mock_vllm::engine::Profile;
use kvroute_router::routing::{CoreConfig, PredictorConfig};

/// The router's prior in every simulated run.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct GenericPrior {
    /// Prefill tokens per second before any observation.
    pub prefill_tokens_per_s: f64,
    /// Fixed seconds per request before any observation.
    pub overhead_s: f64,
    /// Seconds per output token before any observation.
    pub itl_s: f64,
}

/// 10,000 prefill tokens/s, 0.1 s fixed, 0.1 s per output token: round figures for "some
/// datacenter GPU serving a mid-sized model", between the simulated L40S (~4,800-5,900
/// tokens/s, ~0.04-0.05 s per step) and H100 (~20,600 tokens/s, ~0.014 s) profiles and equal
/// to neither. The router's learned rate may move 4x either way from it (2,500-40,000
/// tokens/s, `PredictorConfig::rate_range`), which covers every built-in GPU profile.
pub const GENERIC_PRIOR: GenericPrior = GenericPrior {
    prefill_tokens_per_s: 10_000.0,
    overhead_s: 0.1,
    itl_s: 0.1,
};

/// The routing core's settings in the simulation: the defaults with [`GENERIC_PRIOR`].
pub fn sim_core_config() -> CoreConfig {
    CoreConfig {
        predictor: PredictorConfig {
            prior_rate: GENERIC_PRIOR.prefill_tokens_per_s,
            prior_overhead: GENERIC_PRIOR.overhead_s,
            prior_itl: GENERIC_PRIOR.itl_s,
            ..PredictorConfig::default()
        },
        ..CoreConfig::default()
    }
}

/// The profiles of a pool: one name or path, or a comma-separated list that worker `i`
/// takes the `i % len`-th of.
pub fn pool(spec: &str) -> anyhow::Result<Vec<Profile>> {
    let profiles = spec
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| Profile::load(name).with_context(|| format!("profile {name}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if profiles.is_empty() {
        bail!("no worker profile in {spec:?}");
    }
    Ok(profiles)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prefill tokens/s and the fixed cost of an idle one-token prefill, as the router's
    /// model `ttft = tokens / rate + overhead` would see them.
    fn speed(p: &Profile) -> (f64, f64) {
        (
            1.0 / p.prefill_s_per_token,
            p.step_time(1, 0, 0)
                .max(p.weights_read_s + p.step_overhead_s),
        )
    }

    #[test]
    fn the_generic_prior_is_no_simulated_gpu() {
        for name in Profile::builtin_names() {
            let p = Profile::builtin(name).expect("built-in profile");
            let (rate, overhead) = speed(&p);
            let off = |a: f64, b: f64| (a - b).abs() / b;
            assert!(
                off(GENERIC_PRIOR.prefill_tokens_per_s, rate) >= 0.25,
                "{name}: prior rate {} vs {rate}",
                GENERIC_PRIOR.prefill_tokens_per_s
            );
            assert!(
                off(GENERIC_PRIOR.overhead_s, overhead) >= 0.25,
                "{name}: prior overhead {} vs {overhead}",
                GENERIC_PRIOR.overhead_s
            );
        }
        let cfg = sim_core_config();
        assert_eq!(cfg.predictor.prior_rate, 10_000.0);
        assert_ne!(
            cfg.predictor.prior_rate,
            PredictorConfig::default().prior_rate
        );
    }

    #[test]
    fn the_learnable_range_covers_the_gpu_profiles() {
        let range = PredictorConfig::default().rate_range;
        for name in ["l40s-qwen3-32b-fp8", "l40s-27b-fp8", "h100-27b-fp8"] {
            let (rate, _) = speed(&Profile::builtin(name).expect("built-in profile"));
            let prior = GENERIC_PRIOR.prefill_tokens_per_s;
            assert!(
                rate <= prior * range && rate >= prior / range,
                "{name}: {rate}"
            );
        }
    }

    #[test]
    fn a_pool_list_cycles_and_bad_names_fail() {
        let p = pool("l40s-27b-fp8, h100-27b-fp8").expect("two profiles");
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].name, "h100-27b-fp8");
        assert!(pool("nope").is_err());
        assert!(pool(" , ").is_err());
    }
}
