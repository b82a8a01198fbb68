//! Figures of a run: quantiles, cache hit rate, goodput under an SLO.

use serde::Serialize;

use super::sim::{RunResult, throughput_rpm};

/// The SLOs of goodput: a concurrency level meets one when at least `attainment` of its
/// requests got their first token within `ttft_s`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Slo {
    /// The TTFT bound, seconds.
    pub ttft_s: f64,
    /// The fraction of requests (0..1) that must meet it.
    pub attainment: f64,
}

/// The SLO: 90% of first tokens within 8 s (the vendor benchmark's definition).
pub const BATCH_SLO: Slo = Slo {
    ttft_s: 8.0,
    attainment: 0.9,
};
/// A stricter, interactive SLO: 90% of first tokens within 1 s.
pub const INTERACTIVE_SLO: Slo = Slo {
    ttft_s: 1.0,
    attainment: 0.9,
};

/// The `q` quantile (0..1) of `values` by linear interpolation; NaN when empty.
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let lo = pos.floor() as usize;
    let hi = pos.ceil() as usize;
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// Headline figures of one policy on one workload.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Requests completed.
    pub requests: usize,
    /// Requests the engine refused.
    pub rejected: usize,
    /// Median TTFT, seconds.
    pub ttft_p50_s: f64,
    /// 90th-percentile TTFT, seconds.
    pub ttft_p90_s: f64,
    /// 99th-percentile TTFT, seconds.
    pub ttft_p99_s: f64,
    /// Median end-to-end latency, seconds.
    pub e2e_p50_s: f64,
    /// Cached prompt tokens / prompt tokens (as vLLM reports `cached_tokens`).
    pub cache_hit_rate: f64,
    /// Completed requests per simulated minute.
    pub throughput_rpm: f64,
    /// Requests served by each worker, by index.
    pub requests_per_worker: Vec<usize>,
    /// Mean |predicted - observed| / observed TTFT of the chosen worker (policies that
    /// predict; NaN otherwise).
    pub prediction_error_rel: f64,
}

/// Summarises a run on `workers` workers.
pub fn summarize(r: &RunResult, workers: usize) -> Summary {
    let ttft: Vec<f64> = r.records.iter().map(|x| x.ttft).collect();
    let e2e: Vec<f64> = r.records.iter().map(|x| x.e2e).collect();
    let prompt: usize = r.records.iter().map(|x| x.prompt_tokens).sum();
    let cached: usize = r.records.iter().map(|x| x.cached_tokens).sum();
    let mut per_worker = vec![0; workers];
    for x in &r.records {
        if let Some(c) = per_worker.get_mut(x.worker) {
            *c += 1;
        }
    }
    let errs: Vec<f64> = r
        .records
        .iter()
        .filter(|x| x.predicted_ttft.is_finite() && x.ttft > 0.0)
        .map(|x| (x.predicted_ttft - x.ttft).abs() / x.ttft)
        .collect();
    Summary {
        requests: r.records.len(),
        rejected: r.rejected,
        ttft_p50_s: quantile(&ttft, 0.5),
        ttft_p90_s: quantile(&ttft, 0.9),
        ttft_p99_s: quantile(&ttft, 0.99),
        e2e_p50_s: quantile(&e2e, 0.5),
        cache_hit_rate: if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        },
        throughput_rpm: throughput_rpm(r),
        requests_per_worker: per_worker,
        prediction_error_rel: if errs.is_empty() {
            f64::NAN
        } else {
            errs.iter().sum::<f64>() / errs.len() as f64
        },
    }
}

/// Fraction of requests whose TTFT is within the SLO.
pub fn attainment(r: &RunResult, slo: Slo) -> f64 {
    if r.records.is_empty() {
        return 0.0;
    }
    r.records.iter().filter(|x| x.ttft <= slo.ttft_s).count() as f64 / r.records.len() as f64
}

/// One level of the concurrency sweep.
#[derive(Clone, Debug, Serialize)]
pub struct SweepPoint {
    /// Concurrent clients (closed loop; 0 for an open-loop level).
    pub concurrency: usize,
    /// Open loop: new sessions per simulated second (Poisson); absent for a closed-loop level.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_s: Option<f64>,
    /// Requests completed.
    pub requests: usize,
    /// Completed requests per simulated minute.
    pub throughput_rpm: f64,
    /// Median TTFT, seconds.
    pub ttft_p50_s: f64,
    /// 90th-percentile TTFT, seconds.
    pub ttft_p90_s: f64,
    /// Fraction of requests within the batch SLO's TTFT.
    pub attainment_batch: f64,
    /// Fraction of requests within the interactive SLO's TTFT.
    pub attainment_interactive: f64,
}

impl SweepPoint {
    /// The figures of run `r` at `concurrency`.
    pub fn of(concurrency: usize, r: &RunResult) -> Self {
        let ttft: Vec<f64> = r.records.iter().map(|x| x.ttft).collect();
        SweepPoint {
            concurrency,
            rate_per_s: None,
            requests: r.records.len(),
            throughput_rpm: throughput_rpm(r),
            ttft_p50_s: quantile(&ttft, 0.5),
            ttft_p90_s: quantile(&ttft, 0.9),
            attainment_batch: attainment(r, BATCH_SLO),
            attainment_interactive: attainment(r, INTERACTIVE_SLO),
        }
    }

    /// The figures of run `r`, an open loop of `rate_per_s` new sessions per second.
    pub fn open(rate_per_s: f64, r: &RunResult) -> Self {
        SweepPoint {
            concurrency: 0,
            rate_per_s: Some(rate_per_s),
            ..SweepPoint::of(0, r)
        }
    }
}

/// Peak goodput: the highest throughput (requests/min) among sweep levels that meet the SLO;
/// 0 when none does.
pub fn peak_goodput(points: &[SweepPoint], interactive: bool) -> f64 {
    let slo = if interactive {
        INTERACTIVE_SLO
    } else {
        BATCH_SLO
    };
    points
        .iter()
        .filter(|p| {
            let a = if interactive {
                p.attainment_interactive
            } else {
                p.attainment_batch
            };
            a >= slo.attainment
        })
        .map(|p| p.throughput_rpm)
        .fold(0.0, f64::max)
}

/// Peak goodput under the batch SLO over the open-loop levels (`--rate-sweep`); `None`
/// when none ran.
pub fn peak_goodput_open(points: &[SweepPoint]) -> Option<f64> {
    (!points.is_empty()).then(|| peak_goodput(points, false))
}

/// The log line's open-loop part: empty without open-loop levels.
pub fn open_loop_note(peak: Option<f64>) -> String {
    peak.map_or(String::new(), |g| format!("  open loop {g:>6.1} rpm"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_and_skip_non_finite() {
        assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.5), 2.0);
        assert_eq!(quantile(&[1.0, 2.0], 0.5), 1.5);
        assert_eq!(quantile(&[1.0, f64::NAN, 2.0, 3.0], 1.0), 3.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn peak_goodput_ignores_levels_that_miss_the_slo() {
        let p = |c, rpm, a| SweepPoint {
            concurrency: c,
            rate_per_s: None,
            requests: 10,
            throughput_rpm: rpm,
            ttft_p50_s: 0.0,
            ttft_p90_s: 0.0,
            attainment_batch: a,
            attainment_interactive: 0.0,
        };
        let pts = [p(1, 10.0, 1.0), p(2, 20.0, 0.95), p(4, 40.0, 0.5)];
        assert_eq!(peak_goodput(&pts, false), 20.0);
        assert_eq!(peak_goodput(&pts, true), 0.0);
    }
}
