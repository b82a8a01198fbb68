//! vLLM's Prometheus metrics (names, labels `model_name` and `engine`, histogram buckets of
//! vLLM 0.33). All durations are simulated seconds. Counters follow the engine's cumulative
//! [`EngineStats`]; gauges are set from [`Load`] after each step.

use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry,
};

use crate::engine::{EngineConfig, EngineStats, Load, RequestTiming};

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// The finish reasons vLLM labels `request_success_total` with.
pub const FINISH_REASONS: &[&str] = &["stop", "length", "abort", "error", "repetition"];

/// The mock's metrics, registered on one registry.
#[derive(Clone)]
pub struct Metrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    running: Gauge,
    waiting: Gauge,
    kv_usage: Gauge,
    prefix_queries: IntCounter,
    prefix_hits: IntCounter,
    prompt_cached: IntCounter,
    preemptions: IntCounter,
    prompt_tokens: IntCounter,
    generation_tokens: IntCounter,
    success: IntCounterVec,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue: Histogram,
    prefill: Histogram,
    decode: Histogram,
    cache_config: GaugeVec,
    process_start: Gauge,
}

fn hist(name: &str, help: &str, buckets: &[f64], model: &str) -> prometheus::Result<Histogram> {
    Histogram::with_opts(
        HistogramOpts::new(name, help)
            .const_label("model_name", model)
            .const_label("engine", "0")
            .buckets(buckets.to_vec()),
    )
}

impl Metrics {
    /// Creates and registers every metric for one served model name.
    pub fn register(model: &str) -> prometheus::Result<Self> {
        let registry = Registry::new();
        let opts = |name: &str, help: &str| {
            Opts::new(name, help)
                .const_label("model_name", model)
                .const_label("engine", "0")
        };
        let m = Self {
            running: Gauge::with_opts(opts(
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
            ))?,
            waiting: Gauge::with_opts(opts(
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
            ))?,
            kv_usage: Gauge::with_opts(opts(
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
            ))?,
            prefix_queries: IntCounter::with_opts(opts(
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
            ))?,
            prefix_hits: IntCounter::with_opts(opts(
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
            ))?,
            prompt_cached: IntCounter::with_opts(opts(
                "vllm:prompt_tokens_cached_total",
                "Number of cached prompt tokens (local + external).",
            ))?,
            preemptions: IntCounter::with_opts(opts(
                "vllm:num_preemptions_total",
                "Cumulative number of preemption from the engine.",
            ))?,
            prompt_tokens: IntCounter::with_opts(opts(
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
            ))?,
            generation_tokens: IntCounter::with_opts(opts(
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
            ))?,
            success: IntCounterVec::new(
                opts(
                    "vllm:request_success_total",
                    "Count of successfully processed requests.",
                ),
                &["finished_reason"],
            )?,
            ttft: hist(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS,
                model,
            )?,
            itl: hist(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                ITL_BUCKETS,
                model,
            )?,
            e2e: hist(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                REQUEST_BUCKETS,
                model,
            )?,
            queue: hist(
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                REQUEST_BUCKETS,
                model,
            )?,
            prefill: hist(
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                REQUEST_BUCKETS,
                model,
            )?,
            decode: hist(
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                REQUEST_BUCKETS,
                model,
            )?,
            process_start: Gauge::new(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
            )?,
            cache_config: GaugeVec::new(
                Opts::new(
                    "vllm:cache_config_info",
                    "Information of the LLMEngine CacheConfig",
                ),
                &[
                    "block_size",
                    "cache_dtype",
                    "enable_prefix_caching",
                    "engine",
                    "num_gpu_blocks",
                    "kv_cache_size_tokens",
                    "prefix_caching_hash_algo",
                ],
            )?,
            registry,
        };
        let r = &m.registry;
        r.register(Box::new(m.running.clone()))?;
        r.register(Box::new(m.waiting.clone()))?;
        r.register(Box::new(m.kv_usage.clone()))?;
        r.register(Box::new(m.prefix_queries.clone()))?;
        r.register(Box::new(m.prefix_hits.clone()))?;
        r.register(Box::new(m.prompt_cached.clone()))?;
        r.register(Box::new(m.preemptions.clone()))?;
        r.register(Box::new(m.prompt_tokens.clone()))?;
        r.register(Box::new(m.generation_tokens.clone()))?;
        r.register(Box::new(m.success.clone()))?;
        for h in [&m.ttft, &m.itl, &m.e2e, &m.queue, &m.prefill, &m.decode] {
            r.register(Box::new(h.clone()))?;
        }
        r.register(Box::new(m.cache_config.clone()))?;
        r.register(Box::new(m.process_start.clone()))?;
        for reason in FINISH_REASONS {
            m.success.with_label_values(&[*reason]);
        }
        Ok(m)
    }

    /// Sets `process_start_time_seconds` (vLLM exports it from its Prometheus client's process
    /// collector, without labels). The mock sets it when it starts and again when its engine
    /// restarts: a restart of the mock's engine stands for a restart of vLLM, whose new
    /// process would report a new start time (sidecars resync on it).
    pub fn set_start_time(&self, unix_s: f64) {
        self.process_start.set(unix_s);
    }

    /// Sets `vllm:cache_config_info` for the engine's configuration.
    pub fn set_cache_config(&self, config: &EngineConfig) {
        self.cache_config.reset();
        self.cache_config
            .with_label_values(&[
                config.block_size.to_string().as_str(),
                "auto",
                if config.enable_prefix_caching {
                    "True"
                } else {
                    "False"
                },
                "0",
                config.num_blocks.to_string().as_str(),
                (config.num_blocks * config.block_size).to_string().as_str(),
                config.hash_algo.name(),
            ])
            .set(1.0);
    }

    /// Gauges from the current load.
    pub fn set_load(&self, load: &Load) {
        self.running.set(load.running as f64);
        self.waiting.set(load.waiting as f64);
        self.kv_usage.set(load.kv_cache_usage);
    }

    /// Advances counters by the difference between two stats snapshots of one engine.
    pub fn add_stats(&self, before: &EngineStats, after: &EngineStats) {
        let d = |a: u64, b: u64| b.saturating_sub(a);
        self.prefix_queries
            .inc_by(d(before.prefix_cache_queries, after.prefix_cache_queries));
        let hits = d(before.prefix_cache_hits, after.prefix_cache_hits);
        self.prefix_hits.inc_by(hits);
        self.prompt_cached.inc_by(hits);
        self.preemptions
            .inc_by(d(before.num_preemptions, after.num_preemptions));
        self.prompt_tokens
            .inc_by(d(before.prompt_tokens, after.prompt_tokens));
        self.generation_tokens
            .inc_by(d(before.generation_tokens, after.generation_tokens));
    }

    /// Records a finished request.
    pub fn finished(&self, reason: &str, timing: &RequestTiming) {
        self.success.with_label_values(&[reason]).inc();
        let t = timing;
        self.ttft.observe((t.first_token - t.arrival).max(0.0));
        self.e2e.observe((t.finished - t.arrival).max(0.0));
        self.queue.observe((t.first_scheduled - t.arrival).max(0.0));
        self.prefill
            .observe((t.first_token - t.first_scheduled).max(0.0));
        self.decode.observe((t.finished - t.first_token).max(0.0));
    }

    /// Counts a request that ended without finishing (client gone, restart).
    pub fn aborted(&self) {
        self.success.with_label_values(&["abort"]).inc();
    }

    /// One inter-token gap.
    pub fn inter_token(&self, seconds: f64) {
        self.itl.observe(seconds.max(0.0));
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        use prometheus::Encoder as _;
        let mut buf = Vec::new();
        let _ = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}
