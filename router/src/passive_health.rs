//! Flags of passive health (`--outlier-*`): how many failed requests in a row eject a
//! worker, for how long, and how much of the pool may be ejected at once. The logic lives in
//! the routing core (`routing/outlier.rs`); the gateway, the Pick API and the endpoint
//! picker feed it (docs/operations.md, "Passive health").
//!
//! ```text
//! --outlier-* flags --OutlierArgs::config()--> OutlierConfig --> RouterConfig.outlier --> RoutingCore
//! ```

use anyhow::bail;

use crate::routing::OutlierConfig;

/// Passive-health flags.
#[derive(Debug, Clone, clap::Args)]
pub struct OutlierArgs {
    /// Requests a worker fails in a row (connect error, 5xx, stream cut, timeout) before it is
    /// ejected: no candidate for a while. 0 turns this trigger off.
    #[arg(
        long,
        env = "KVROUTE_ROUTER_OUTLIER_CONSECUTIVE_FAILURES",
        default_value_t = 5
    )]
    pub outlier_consecutive_failures: u32,
    /// Requests a worker times out on in a row before it is ejected (0: off; timeouts still
    /// count as failures).
    #[arg(
        long,
        env = "KVROUTE_ROUTER_OUTLIER_CONSECUTIVE_TIMEOUTS",
        default_value_t = 2
    )]
    pub outlier_consecutive_timeouts: u32,
    /// Seconds a first ejection lasts; the n-th ejection in a row lasts n times this.
    #[arg(
        long,
        env = "KVROUTE_ROUTER_OUTLIER_BASE_EJECTION_S",
        default_value_t = 30.0
    )]
    pub outlier_base_ejection_s: f64,
    /// Longest ejection, seconds.
    #[arg(
        long,
        env = "KVROUTE_ROUTER_OUTLIER_MAX_EJECTION_S",
        default_value_t = 300.0
    )]
    pub outlier_max_ejection_s: f64,
    /// Most workers ejected at once, as a percentage of those with an open sidecar stream;
    /// past it a failing worker stays a candidate (counted). Whatever it is, a request whose
    /// every allowed worker is ejected is still routed among them.
    #[arg(
        long,
        env = "KVROUTE_ROUTER_OUTLIER_MAX_EJECTION_PERCENT",
        default_value_t = 50.0
    )]
    pub outlier_max_ejection_percent: f64,
}

impl Default for OutlierArgs {
    fn default() -> Self {
        let c = OutlierConfig::default();
        Self {
            outlier_consecutive_failures: c.consecutive_failures,
            outlier_consecutive_timeouts: c.consecutive_timeouts,
            outlier_base_ejection_s: c.base_ejection_s,
            outlier_max_ejection_s: c.max_ejection_s,
            outlier_max_ejection_percent: c.max_ejection_percent,
        }
    }
}

impl OutlierArgs {
    /// The core's settings, or why the flags are invalid.
    pub fn config(&self) -> anyhow::Result<OutlierConfig> {
        let Self {
            outlier_consecutive_failures,
            outlier_consecutive_timeouts,
            outlier_base_ejection_s,
            outlier_max_ejection_s,
            outlier_max_ejection_percent,
        } = *self;
        for (name, v) in [
            ("--outlier-base-ejection-s", outlier_base_ejection_s),
            ("--outlier-max-ejection-s", outlier_max_ejection_s),
        ] {
            if !v.is_finite() || v < 0.0 {
                bail!("{name} must be a finite number of seconds >= 0, got {v}");
            }
        }
        if outlier_max_ejection_s < outlier_base_ejection_s {
            bail!(
                "--outlier-max-ejection-s ({outlier_max_ejection_s}) is below --outlier-base-ejection-s ({outlier_base_ejection_s})"
            );
        }
        if !(0.0..=100.0).contains(&outlier_max_ejection_percent) {
            bail!(
                "--outlier-max-ejection-percent must be within 0..=100, got {outlier_max_ejection_percent}"
            );
        }
        Ok(OutlierConfig {
            consecutive_failures: outlier_consecutive_failures,
            consecutive_timeouts: outlier_consecutive_timeouts,
            base_ejection_s: outlier_base_ejection_s,
            max_ejection_s: outlier_max_ejection_s,
            max_ejection_percent: outlier_max_ejection_percent,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_core_and_bad_values_are_refused() {
        let ok = OutlierArgs::default().config().expect("defaults are valid");
        assert_eq!(ok, OutlierConfig::default());
        let bad = |f: fn(&mut OutlierArgs)| {
            let mut a = OutlierArgs::default();
            f(&mut a);
            a.config().is_err()
        };
        assert!(bad(|a| a.outlier_base_ejection_s = f64::NAN));
        assert!(bad(|a| a.outlier_max_ejection_s = -1.0));
        assert!(bad(|a| a.outlier_max_ejection_s = 1.0));
        assert!(bad(|a| a.outlier_max_ejection_percent = 101.0));
    }
}
