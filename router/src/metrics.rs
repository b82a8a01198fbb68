//! Prometheus metrics of the router (`kvroute_router_*`).
//!
//! ```text
//! ingest / pick / gateway --observe--> RouterMetrics --registry--> admin GET /metrics
//!                 RouterState::refresh_gauges() (sizes, at scrape time) --^
//! ```
//!
//! Labels are bounded: `model` (served names from discovery), `worker` (workers from discovery
//! and sidecars), `reason` / `kind` / `event` (fixed sets defined in this crate). Never request
//! ids or tenants.

use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Latency buckets in seconds (TTFT and end-to-end): 5 ms to 2 min.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Inter-token latency buckets in seconds: 1 ms to 2 s.
pub const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0,
];

/// Absolute prediction error buckets in seconds.
pub const ERROR_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Every metric the router exports. Cheap to clone (all handles are reference-counted).
#[derive(Clone, Debug)]
pub struct RouterMetrics {
    registry: Registry,
    /// Routing decisions, by model, chosen worker and decision reason.
    pub requests: IntCounterVec,
    /// Pick failures by model and error kind (`PickError::label`); `model` is a known model
    /// name or `unknown` (never the client's string for a model that does not exist).
    pub pick_errors: IntCounterVec,
    /// Observed time to first token, by model and worker.
    pub ttft: HistogramVec,
    /// Observed inter-token latency, by model and worker.
    pub itl: HistogramVec,
    /// Observed end-to-end latency, by model and worker.
    pub e2e: HistogramVec,
    /// Predicted TTFT of the chosen worker, by model and worker.
    pub predicted_ttft: HistogramVec,
    /// |observed - predicted| TTFT, by model and worker.
    pub ttft_prediction_error: HistogramVec,
    /// First tokens by how they compared with the p90 bound published with their prediction
    /// (`covered`, `missed`, `unbounded`), by model.
    pub ttft_bound: IntCounterVec,
    /// Prompt tokens reported by workers, `kind` = cached | uncached, by model.
    pub prompt_tokens: IntCounterVec,
    /// Decisions made on load alone, by model and reason (no-tokenizer, tokenization-failed).
    pub degraded_decisions: IntCounterVec,
    /// Tokenization failures, by model and reason.
    pub tokenization_failures: IntCounterVec,
    /// Assignments released, by how (`done`, `aborted`, `expired`, `retired`: its worker left).
    pub released: IntCounterVec,
    /// Resident blocks per worker in the KV index (set at scrape time).
    pub index_blocks: IntGaugeVec,
    /// Router-side in-flight assignments per worker (set at scrape time).
    pub in_flight: IntGaugeVec,
    /// 1 for a worker with a degraded GPU (throttled by heat, power brake or HW slowdown,
    /// recent critical XID, uncorrected ECC; see `routing/gpu.rs`), else 0 (set at scrape time).
    pub gpu_degraded: IntGaugeVec,
    /// KV cache usage 0..1 per worker, from its latest load sample (set at scrape time).
    pub worker_kv_usage: GaugeVec,
    /// KV cache size in tokens per worker, from its latest load sample; absent while the
    /// worker has not reported one (set at scrape time).
    pub worker_kv_capacity: IntGaugeVec,
    /// The engine's own queue per worker, `state` = waiting | running, from its latest load
    /// sample (set at scrape time).
    pub worker_engine_requests: IntGaugeVec,
    /// GPU utilisation 0..1 per worker and GPU (NVML index), from load samples.
    pub gpu_utilization: GaugeVec,
    /// GPU temperature per worker and GPU, degrees Celsius.
    pub gpu_temperature: GaugeVec,
    /// GPU memory in use per worker and GPU, bytes.
    pub gpu_memory_used: GaugeVec,
    /// GPU power draw per worker and GPU, watts.
    pub gpu_power: GaugeVec,
    /// Workers by state (`routable`, `stale`, `not_ready`, `disconnected`: stream closed, not
    /// routable until it reconnects, retired if discovery drops it; `unlisted`), at scrape time.
    pub workers: IntGaugeVec,
    /// Open sidecar streams.
    pub sidecar_streams: IntGauge,
    /// Sidecar stream events: opened, closed, gap, stale-epoch, bad-first-report, snapshot-request.
    pub sidecar_stream_events: IntCounterVec,
    /// Reports applied from sidecars, by kind (snapshot-chunk, delta, load, ignored).
    pub ingest_reports: IntCounterVec,
    /// Block operations applied to the index, by kind (stored, removed, cleared, snapshot).
    pub ingest_blocks: IntCounterVec,
    /// Time spent making one routing decision (tokenize + hash + lookup + predict).
    pub decision_duration: Histogram,
    /// Workers retired (gone from discovery, stream closed past the grace period).
    pub workers_retired: IntCounter,
    /// 1 when a discovered model's tokenizer is loaded, else 0 (set at scrape time).
    pub tokenizer_loaded: IntGaugeVec,
    /// Failed tokenizer load attempts, by model and reason (`FetchError::label`).
    pub tokenizer_fetch_failures: IntCounterVec,
    /// Requests a worker failed, by kind (`FailureKind::label`): passive health's input.
    pub worker_failures: IntCounterVec,
    /// Workers ejected by passive health, by the failure that ejected them.
    pub outlier_ejections: IntCounterVec,
    /// Ejections refused because max-ejection-percent workers were ejected already.
    pub outlier_ejections_refused: IntCounterVec,
    /// Workers ejected now (set at scrape time).
    pub outlier_ejected_workers: IntGauge,
    /// Peer-exchange streams open, by direction (`in`: peers sharing with this replica,
    /// `out`: this replica sharing with peers).
    pub peer_streams: IntGaugeVec,
    /// Peer updates sent and received, by direction.
    pub peer_updates: IntCounterVec,
    /// Peer streams or updates refused, by reason.
    pub peer_refused: IntCounterVec,
    /// Peer placements not taken, by reason (`unknown_worker`, `full`).
    pub peer_placements_skipped: IntCounterVec,
    /// Peer placements held now (set at scrape time).
    pub peer_placements: IntGauge,
    /// Tasks alive on the router's main tokio runtime (set when [`RouterMetrics::encode`]
    /// runs).
    pub runtime_alive_tasks: IntGauge,
    /// The runtime the metrics were registered on (the router's main one: `/metrics` is served
    /// from the admin port's own runtime, whose tasks are not the ones that could leak).
    runtime: Option<tokio::runtime::Handle>,
    /// Authentication: refused streams and calls, TLS handshakes and reloads.
    pub auth: crate::auth::AuthMetrics,
    /// InferencePolicy reloads, verdicts, rejections and SLO shedding.
    pub policy: crate::state::PolicyMetrics,
    /// Times a cap of the bounded router was hit, by `limit` (`crate::limits::Limit::label`).
    pub limit_hits: IntCounterVec,
    /// Blocks not stored because their worker was at its block cap.
    pub blocks_over_cap: IntCounter,
}

impl RouterMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self {
            registry: registry.clone(),
            requests: counter_vec(
                "kvroute_router_requests_total",
                "Routing decisions by model, chosen worker and reason.",
                &["model", "worker", "reason"],
            )?,
            pick_errors: counter_vec(
                "kvroute_router_pick_errors_total",
                "Requests that could not be routed, by model and error.",
                &["model", "error"],
            )?,
            ttft: histogram_vec(
                "kvroute_router_ttft_seconds",
                "Observed time to first token.",
                &["model", "worker"],
                LATENCY_BUCKETS,
            )?,
            itl: histogram_vec(
                "kvroute_router_itl_seconds",
                "Observed inter-token latency.",
                &["model", "worker"],
                ITL_BUCKETS,
            )?,
            e2e: histogram_vec(
                "kvroute_router_e2e_seconds",
                "Observed end-to-end request latency.",
                &["model", "worker"],
                LATENCY_BUCKETS,
            )?,
            predicted_ttft: histogram_vec(
                "kvroute_router_predicted_ttft_seconds",
                "Predicted time to first token of the chosen worker.",
                &["model", "worker"],
                LATENCY_BUCKETS,
            )?,
            ttft_prediction_error: histogram_vec(
                "kvroute_router_ttft_prediction_error_seconds",
                "Absolute difference between observed and predicted time to first token.",
                &["model", "worker"],
                ERROR_BUCKETS,
            )?,
            ttft_bound: counter_vec(
                "kvroute_router_ttft_bound_total",
                "First tokens by outcome against the calibrated p90 TTFT bound published with the decision: covered, missed or unbounded (no bound yet).",
                &["model", "outcome"],
            )?,
            prompt_tokens: counter_vec(
                "kvroute_router_prompt_tokens_total",
                "Prompt tokens reported by workers, cached (prefix hit) or uncached.",
                &["model", "kind"],
            )?,
            degraded_decisions: counter_vec(
                "kvroute_router_degraded_decisions_total",
                "Decisions made on load alone (no usable token ids).",
                &["model", "reason"],
            )?,
            tokenization_failures: counter_vec(
                "kvroute_router_tokenization_failures_total",
                "Requests whose prompt could not be tokenized.",
                &["model", "reason"],
            )?,
            released: counter_vec(
                "kvroute_router_assignments_released_total",
                "Assignments released, by how.",
                &["how"],
            )?,
            index_blocks: gauge_vec(
                "kvroute_router_index_blocks",
                "Resident KV blocks per worker in the router's index.",
                &["worker"],
            )?,
            in_flight: gauge_vec(
                "kvroute_router_in_flight",
                "Assignments made by this router and not yet released, per worker.",
                &["worker"],
            )?,
            gpu_degraded: gauge_vec(
                "kvroute_router_worker_gpu_degraded",
                "1 when one of the worker's GPUs is degraded (thermal/power-brake/HW slowdown, XID, uncorrected ECC).",
                &["worker"],
            )?,
            worker_kv_usage: float_gauge_vec(
                "kvroute_router_worker_kv_usage_ratio",
                "KV cache usage (0..1) per worker, from its latest sidecar load sample.",
                &["worker"],
            )?,
            worker_kv_capacity: gauge_vec(
                "kvroute_router_worker_kv_capacity_tokens",
                "KV cache size in tokens per worker, from its latest sidecar load sample.",
                &["worker"],
            )?,
            worker_engine_requests: gauge_vec(
                "kvroute_router_worker_engine_requests",
                "Requests in the engine's own queue per worker, by state (waiting, running), from its latest sidecar load sample.",
                &["worker", "state"],
            )?,
            gpu_utilization: float_gauge_vec(
                "kvroute_router_worker_gpu_utilization_ratio",
                "GPU utilisation (0..1) per worker and GPU, from sidecar load samples.",
                &["worker", "gpu"],
            )?,
            gpu_temperature: float_gauge_vec(
                "kvroute_router_worker_gpu_temperature_celsius",
                "GPU temperature per worker and GPU.",
                &["worker", "gpu"],
            )?,
            gpu_memory_used: float_gauge_vec(
                "kvroute_router_worker_gpu_memory_used_bytes",
                "GPU memory in use per worker and GPU.",
                &["worker", "gpu"],
            )?,
            gpu_power: float_gauge_vec(
                "kvroute_router_worker_gpu_power_watts",
                "GPU power draw per worker and GPU.",
                &["worker", "gpu"],
            )?,
            workers: gauge_vec(
                "kvroute_router_workers",
                "Known workers by state.",
                &["state"],
            )?,
            sidecar_streams: IntGauge::new(
                "kvroute_router_sidecar_streams",
                "Open sidecar report streams.",
            )?,
            sidecar_stream_events: counter_vec(
                "kvroute_router_sidecar_stream_events_total",
                "Sidecar stream lifecycle events.",
                &["event"],
            )?,
            ingest_reports: counter_vec(
                "kvroute_router_ingest_reports_total",
                "Sidecar reports received, by kind.",
                &["kind"],
            )?,
            ingest_blocks: counter_vec(
                "kvroute_router_ingest_blocks_total",
                "Block operations applied to the KV index, by kind.",
                &["kind"],
            )?,
            decision_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "kvroute_router_decision_duration_seconds",
                    "Time to make one routing decision (tokenize, hash, look up, predict).",
                )
                .buckets(vec![
                    0.00001, 0.00005, 0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05,
                ]),
            )?,
            workers_retired: IntCounter::new(
                "kvroute_router_workers_retired_total",
                "Workers retired: no longer listed by discovery and their stream closed.",
            )?,
            tokenizer_loaded: gauge_vec(
                "kvroute_router_tokenizer_loaded",
                "1 when the tokenizer of a model (from discovery) is loaded, else 0.",
                &["model"],
            )?,
            tokenizer_fetch_failures: counter_vec(
                "kvroute_router_tokenizer_fetch_failures_total",
                "Failed attempts to load a model's tokenizer, by reason.",
                &["model", "reason"],
            )?,
            worker_failures: counter_vec(
                "kvroute_router_worker_failures_total",
                "Requests a worker failed (connect error, 5xx, stream cut, timeout), by kind.",
                &["reason"],
            )?,
            outlier_ejections: counter_vec(
                "kvroute_router_outlier_ejections_total",
                "Workers ejected by passive health, by the failure that ejected them.",
                &["reason"],
            )?,
            outlier_ejections_refused: counter_vec(
                "kvroute_router_outlier_ejections_refused_total",
                "Ejections refused because max-ejection-percent of the workers were ejected already.",
                &["reason"],
            )?,
            outlier_ejected_workers: IntGauge::new(
                "kvroute_router_outlier_ejected_workers",
                "Workers ejected by passive health now (set at scrape time).",
            )?,
            peer_streams: gauge_vec(
                "kvroute_router_peer_streams",
                "Peer-exchange streams open, by direction (in: peers sharing here; out: sharing with peers).",
                &["direction"],
            )?,
            peer_updates: counter_vec(
                "kvroute_router_peer_updates_total",
                "Peer-exchange updates sent and received, by direction.",
                &["direction"],
            )?,
            peer_refused: counter_vec(
                "kvroute_router_peer_refused_total",
                "Peer-exchange streams or updates refused, by reason.",
                &["reason"],
            )?,
            peer_placements_skipped: counter_vec(
                "kvroute_router_peer_placements_skipped_total",
                "Peer placements not taken, by reason (unknown_worker, full).",
                &["reason"],
            )?,
            peer_placements: IntGauge::new(
                "kvroute_router_peer_placements",
                "Other replicas' outstanding placements this replica counts (set at scrape time).",
            )?,
            runtime_alive_tasks: IntGauge::new(
                "kvroute_router_runtime_alive_tasks",
                "Tasks alive on the router's main tokio runtime (set at scrape time).",
            )?,
            runtime: tokio::runtime::Handle::try_current().ok(),
            auth: crate::auth::AuthMetrics::register(registry)?,
            policy: crate::state::PolicyMetrics::register(registry)?,
            limit_hits: counter_vec(
                "kvroute_router_limit_hits_total",
                "Times a cap of the bounded router was hit (a message, stream, worker or blocks refused).",
                &["limit"],
            )?,
            blocks_over_cap: IntCounter::new(
                "kvroute_router_ingest_blocks_over_cap_total",
                "Blocks not stored because their worker was at its block cap.",
            )?,
        };
        for l in crate::limits::Limit::ALL {
            m.limit_hits.with_label_values(&[l.label()]);
        }
        for d in ["in", "out"] {
            m.peer_streams.with_label_values(&[d]);
            m.peer_updates.with_label_values(&[d]);
        }
        for k in crate::routing::FailureKind::ALL {
            m.worker_failures.with_label_values(&[k.label()]);
            m.outlier_ejections.with_label_values(&[k.label()]);
            m.outlier_ejections_refused.with_label_values(&[k.label()]);
        }
        registry.register(Box::new(m.requests.clone()))?;
        registry.register(Box::new(m.pick_errors.clone()))?;
        registry.register(Box::new(m.ttft.clone()))?;
        registry.register(Box::new(m.itl.clone()))?;
        registry.register(Box::new(m.e2e.clone()))?;
        registry.register(Box::new(m.predicted_ttft.clone()))?;
        registry.register(Box::new(m.ttft_prediction_error.clone()))?;
        registry.register(Box::new(m.ttft_bound.clone()))?;
        registry.register(Box::new(m.prompt_tokens.clone()))?;
        registry.register(Box::new(m.degraded_decisions.clone()))?;
        registry.register(Box::new(m.tokenization_failures.clone()))?;
        registry.register(Box::new(m.released.clone()))?;
        registry.register(Box::new(m.index_blocks.clone()))?;
        registry.register(Box::new(m.in_flight.clone()))?;
        registry.register(Box::new(m.gpu_degraded.clone()))?;
        registry.register(Box::new(m.worker_kv_usage.clone()))?;
        registry.register(Box::new(m.worker_kv_capacity.clone()))?;
        registry.register(Box::new(m.worker_engine_requests.clone()))?;
        registry.register(Box::new(m.gpu_utilization.clone()))?;
        registry.register(Box::new(m.gpu_temperature.clone()))?;
        registry.register(Box::new(m.gpu_memory_used.clone()))?;
        registry.register(Box::new(m.gpu_power.clone()))?;
        registry.register(Box::new(m.workers.clone()))?;
        registry.register(Box::new(m.sidecar_streams.clone()))?;
        registry.register(Box::new(m.sidecar_stream_events.clone()))?;
        registry.register(Box::new(m.ingest_reports.clone()))?;
        registry.register(Box::new(m.ingest_blocks.clone()))?;
        registry.register(Box::new(m.decision_duration.clone()))?;
        registry.register(Box::new(m.workers_retired.clone()))?;
        registry.register(Box::new(m.tokenizer_loaded.clone()))?;
        registry.register(Box::new(m.tokenizer_fetch_failures.clone()))?;
        registry.register(Box::new(m.limit_hits.clone()))?;
        registry.register(Box::new(m.blocks_over_cap.clone()))?;
        registry.register(Box::new(m.worker_failures.clone()))?;
        registry.register(Box::new(m.outlier_ejections.clone()))?;
        registry.register(Box::new(m.outlier_ejections_refused.clone()))?;
        registry.register(Box::new(m.outlier_ejected_workers.clone()))?;
        registry.register(Box::new(m.peer_streams.clone()))?;
        registry.register(Box::new(m.peer_updates.clone()))?;
        registry.register(Box::new(m.peer_refused.clone()))?;
        registry.register(Box::new(m.peer_placements_skipped.clone()))?;
        registry.register(Box::new(m.peer_placements.clone()))?;
        registry.register(Box::new(m.runtime_alive_tasks.clone()))?;
        Ok(m)
    }

    /// Removes every series labelled `worker` = `key` from the families that carry a
    /// worker label, so that retired workers leave no series behind.
    pub fn forget_worker(&self, key: &str) {
        forget(&self.requests, key);
        forget(&self.ttft, key);
        forget(&self.itl, key);
        forget(&self.e2e, key);
        forget(&self.predicted_ttft, key);
        forget(&self.ttft_prediction_error, key);
        forget(&self.index_blocks, key);
        forget(&self.in_flight, key);
        forget(&self.gpu_degraded, key);
        forget(&self.worker_kv_usage, key);
        forget(&self.worker_kv_capacity, key);
        forget(&self.worker_engine_requests, key);
        forget(&self.gpu_utilization, key);
        forget(&self.gpu_temperature, key);
        forget(&self.gpu_memory_used, key);
        forget(&self.gpu_power, key);
    }

    /// The registry the metrics live in.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Renders every metric of the registry in the Prometheus text format; the alive-task
    /// gauge is read now from the runtime the metrics were registered on (registered outside
    /// one: the caller's runtime, if any; else the gauge keeps its last value).
    pub fn encode(&self) -> String {
        let rt = self
            .runtime
            .clone()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        if let Some(rt) = rt {
            let n = rt.metrics().num_alive_tasks();
            self.runtime_alive_tasks
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let mut buf = Vec::new();
        // Encoding into a Vec cannot fail on I/O; a malformed family is skipped by the encoder.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Removes the series of `vec` whose `worker` label is `key`, whatever its other labels.
fn forget<T: prometheus::core::MetricVecBuilder>(vec: &prometheus::core::MetricVec<T>, key: &str) {
    use prometheus::core::Collector;
    for family in vec.collect() {
        for metric in family.get_metric() {
            let labels: std::collections::HashMap<&str, &str> = metric
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            if labels.get("worker") == Some(&key) {
                // Absent series (removed concurrently) are fine.
                let _ = vec.remove(&labels);
            }
        }
    }
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntCounterVec> {
    IntCounterVec::new(Opts::new(name, help), labels)
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntGaugeVec> {
    IntGaugeVec::new(Opts::new(name, help), labels)
}

fn float_gauge_vec(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<GaugeVec> {
    GaugeVec::new(Opts::new(name, help), labels)
}

fn histogram_vec(
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> prometheus::Result<HistogramVec> {
    HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
}

#[cfg(test)]
#[path = "metrics_doc_tests.rs"]
mod doc_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn alive_tasks_gauge_counts_the_registering_runtime_from_any_thread() {
        let m = RouterMetrics::register(&Registry::new()).expect("register");
        let gauge = |text: &str| -> i64 {
            text.lines()
                .find_map(|l| l.strip_prefix("kvroute_router_runtime_alive_tasks "))
                .and_then(|v| v.parse().ok())
                .expect("the gauge is exported")
        };
        let (tx, rx) = tokio::sync::watch::channel(false);
        let held: Vec<_> = (0..5)
            .map(|_| {
                let mut rx = rx.clone();
                tokio::spawn(async move {
                    let _ = rx.wait_for(|go| *go).await;
                })
            })
            .collect();
        // Scraped from another thread with a runtime of its own, as the admin port is.
        let other = m.clone();
        let text = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("runtime");
            rt.block_on(async move { other.encode() })
        })
        .join()
        .expect("scrape thread");
        assert!(gauge(&text) >= 5, "{text}");
        tx.send_replace(true);
        for h in held {
            h.await.expect("task");
        }
        assert!(gauge(&m.encode()) < 5);
    }

    #[test]
    fn registers_and_encodes_with_router_prefix() {
        let m = RouterMetrics::register(&Registry::new()).expect("register");
        m.requests
            .with_label_values(&["m", "w", "lowest-predicted-ttft"])
            .inc();
        m.sidecar_streams.set(2);
        let text = m.encode();
        assert!(text.contains("kvroute_router_requests_total{model=\"m\",reason=\"lowest-predicted-ttft\",worker=\"w\"} 1"));
        assert!(text.contains("kvroute_router_sidecar_streams 2"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("kvroute_router_"), "{line}");
        }
    }

    #[test]
    fn registering_twice_in_one_registry_fails() {
        let r = Registry::new();
        RouterMetrics::register(&r).expect("first");
        assert!(RouterMetrics::register(&r).is_err());
    }
}
