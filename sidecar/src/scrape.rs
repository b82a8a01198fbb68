//! Load from vLLM's Prometheus `/metrics`: queue lengths, KV-cache usage, and the cache
//! configuration (block size, hash algorithm) from `vllm:cache_config_info`.
//!
//! ```text
//! GET {vllm}/metrics --parse_metrics--> VllmMetrics --(+ GPU stats)--> LoadSample --> Hub
//! ```
//!
//! [`parse_metrics`] is pure; [`Scraper`] is the polling loop.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kvroute_proto::v1::LoadSample;
use tokio_util::sync::CancellationToken;

use crate::gpu::GpuProbe;
use crate::hub::Hub;
use crate::metrics::SidecarMetrics;

/// What kvroute reads from vLLM's metrics. Series with several label sets (engines) are
/// summed for queue lengths, and the maximum is taken for KV usage.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct VllmMetrics {
    /// `vllm:num_requests_waiting`, summed over engines.
    pub waiting: Option<f64>,
    /// `vllm:num_requests_running`, summed over engines.
    pub running: Option<f64>,
    /// `vllm:kv_cache_usage_perc` (or the older `gpu_cache_usage_perc`), the largest over engines.
    pub kv_cache_usage: Option<f64>,
    /// `block_size` of `vllm:cache_config_info`.
    pub block_size: Option<u32>,
    /// `num_gpu_blocks` of `vllm:cache_config_info` (KV cache size in blocks).
    pub num_gpu_blocks: Option<u64>,
    /// `prefix_caching_hash_algo` of `vllm:cache_config_info` (logged, not used).
    pub hash_algo: Option<String>,
    /// `process_start_time_seconds` of the vLLM API process: changes when vLLM restarts.
    pub process_start_time: Option<f64>,
}

/// Parses the Prometheus text exposition format, tolerating anything it does not know.
pub fn parse_metrics(text: &str) -> VllmMetrics {
    let mut m = VllmMetrics::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, labels, rest) = match line.find('{') {
            Some(open) => match line[open..].find('}') {
                Some(close) => (
                    &line[..open],
                    &line[open + 1..open + close],
                    &line[open + close + 1..],
                ),
                None => continue,
            },
            None => match line.split_once(char::is_whitespace) {
                Some((n, r)) => (n, "", r),
                None => continue,
            },
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        match name {
            "vllm:num_requests_waiting" => *m.waiting.get_or_insert(0.0) += value,
            "vllm:num_requests_running" => *m.running.get_or_insert(0.0) += value,
            "vllm:kv_cache_usage_perc" | "vllm:gpu_cache_usage_perc" => {
                m.kv_cache_usage = Some(m.kv_cache_usage.map_or(value, |u| u.max(value)))
            }
            "process_start_time_seconds" => m.process_start_time = Some(value),
            "vllm:cache_config_info" => {
                if let Some(bs) = label(labels, "block_size").and_then(|v| v.parse().ok()) {
                    m.block_size = Some(bs);
                }
                if let Some(n) = label(labels, "num_gpu_blocks").and_then(|v| v.parse().ok()) {
                    m.num_gpu_blocks = Some(n);
                }
                if let Some(algo) = label(labels, "prefix_caching_hash_algo") {
                    m.hash_algo = Some(algo.to_owned());
                }
            }
            _ => {}
        }
    }
    m
}

/// Value of `key="value"` inside a label block (values without escaped quotes suffice here).
fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = labels;
    while let Some(eq) = rest.find("=\"") {
        let name = rest[..eq].trim_start_matches([',', ' ']);
        let after = &rest[eq + 2..];
        let end = after.find('"')?;
        if name == key {
            return Some(&after[..end]);
        }
        rest = &after[end + 1..];
    }
    None
}

/// Builds the load sample sent to routers.
pub fn load_sample(m: &VllmMetrics, scrape_failed: bool, now_ms: u64) -> LoadSample {
    let clamp = |v: Option<f64>| v.map_or(0, |v| v.max(0.0).min(f64::from(u32::MAX)) as u32);
    LoadSample {
        timestamp_ms: now_ms,
        num_requests_waiting: clamp(m.waiting),
        num_requests_running: clamp(m.running),
        kv_cache_usage: m.kv_cache_usage.unwrap_or(0.0).clamp(0.0, 1.0),
        gpu: None,
        gpus: Vec::new(),
        scrape_failed,
        kv_capacity_tokens: match (m.num_gpu_blocks, m.block_size) {
            (Some(n), Some(bs)) => n.saturating_mul(u64::from(bs)),
            _ => 0,
        },
        lora_adapters: None,
    }
}

/// Polls vLLM's `/metrics` and feeds load samples to the hub.
pub struct Scraper {
    /// vLLM's `/metrics` URL.
    pub url: String,
    /// Time between scrapes.
    pub interval: Duration,
    /// Receives the load samples, the block size and vLLM restarts.
    pub hub: Arc<Hub>,
    /// Scrape outcomes are counted here.
    pub metrics: SidecarMetrics,
    /// Adds GPU figures to each sample.
    pub gpu: GpuProbe,
}

impl Scraper {
    /// Scrapes every `interval` until `shutdown` and sends the hub a load sample each time (on a
    /// failed scrape: the last figures, marked failed).
    pub async fn run(mut self, shutdown: CancellationToken) {
        let client = match reqwest::Client::builder()
            .timeout(self.interval.max(Duration::from_millis(200)) * 4)
            .build()
        {
            Ok(c) => c,
            Err(error) => {
                tracing::error!(%error, "cannot build HTTP client; load scraping disabled");
                return;
            }
        };
        let url = format!("{}/metrics", self.url.trim_end_matches('/'));
        let mut last = VllmMetrics::default();
        let mut warned_algo = false;
        let mut tick = tokio::time::interval(self.interval.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let fetched = async {
                client
                    .get(&url)
                    .send()
                    .await?
                    .error_for_status()?
                    .text()
                    .await
            }
            .await;
            let failed = match fetched {
                Ok(text) => {
                    self.metrics.scrapes.with_label_values(&["ok"]).inc();
                    last = parse_metrics(&text);
                    if let Some(bs) = last.block_size {
                        self.hub.learn_block_size(bs);
                    }
                    if let Some(start) = last.process_start_time
                        && self.hub.observe_vllm_start(start)
                    {
                        tracing::warn!(
                            start,
                            "vLLM process start time changed: vLLM restarted, resyncing"
                        );
                        self.metrics
                            .resyncs
                            .with_label_values(&["vllm_restart_metrics"])
                            .inc();
                    }
                    if !warned_algo && let Some(algo) = &last.hash_algo {
                        warned_algo = true;
                        tracing::info!(hash_algo = %algo, "vLLM prefix-caching hash algorithm (kvroute re-hashes; informational)");
                    }
                    false
                }
                Err(error) => {
                    self.metrics.scrapes.with_label_values(&["error"]).inc();
                    tracing::debug!(%error, "vLLM /metrics scrape failed");
                    true
                }
            };
            let now = now_ms();
            let mut sample = load_sample(&last, failed, now);
            sample.gpus = self.gpu.sample(now);
            sample.gpu = sample.gpus.first().cloned();
            self.hub.set_load(sample);
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_real_vllm_metrics() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../testdata/vllm-capture/metrics.txt"
        ))
        .unwrap();
        let m = parse_metrics(&text);
        assert_eq!(m.block_size, Some(32));
        assert_eq!(m.hash_algo.as_deref(), Some("sha256"));
        assert_eq!(m.waiting, Some(0.0));
        assert_eq!(m.running, Some(0.0));
        assert!(m.kv_cache_usage.is_some());
        assert_eq!(m.process_start_time, Some(1.79605012132e9));
    }

    #[test]
    fn sums_engines_and_tolerates_junk() {
        let text = "vllm:num_requests_waiting{engine=\"0\"} 2\nvllm:num_requests_waiting{engine=\"1\"} 3\n\
                    garbage line\nvllm:kv_cache_usage_perc 0.5\nvllm:num_requests_running{x=\"}\n";
        let m = parse_metrics(text);
        assert_eq!(m.waiting, Some(5.0));
        assert_eq!(m.kv_cache_usage, Some(0.5));
        let s = load_sample(&m, false, 7);
        assert_eq!((s.num_requests_waiting, s.timestamp_ms), (5, 7));
        assert_eq!(s.kv_capacity_tokens, 0, "unknown without cache_config_info");
    }

    #[test]
    fn kv_capacity_from_cache_config_info() {
        let text = "vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"1625\",prefix_caching_hash_algo=\"sha256_cbor\"} 1.0\n";
        let m = parse_metrics(text);
        assert_eq!((m.block_size, m.num_gpu_blocks), (Some(16), Some(1_625)));
        assert_eq!(load_sample(&m, false, 0).kv_capacity_tokens, 26_000);
        let m =
            parse_metrics("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1\n");
        assert_eq!(load_sample(&m, false, 0).kv_capacity_tokens, 0);
    }
}
