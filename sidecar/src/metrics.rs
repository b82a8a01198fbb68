//! Prometheus metrics of the sidecar (`kvroute_sidecar_*`). Label sets are bounded: event
//! type, error reason (the `reason()` of typed errors), router endpoint (a handful).

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// `kvroute_sidecar_router_stream_state` value: no stream to that router (waiting to retry).
pub const STREAM_DISCONNECTED: i64 = 0;
/// `kvroute_sidecar_router_stream_state` value: connecting to that router.
pub const STREAM_CONNECTING: i64 = 1;
/// `kvroute_sidecar_router_stream_state` value: the report stream is open.
pub const STREAM_STREAMING: i64 = 2;

/// The sidecar's metrics, registered on one registry and shared by its tasks.
#[derive(Clone)]
pub struct SidecarMetrics {
    /// KV events received, by type (stored, removed, cleared, skipped_<reason>).
    pub events: IntCounterVec,
    /// Blocks applied, by kind (stored, removed).
    pub blocks: IntCounterVec,
    /// Frames or payloads that could not be decoded, by reason.
    pub decode_errors: IntCounterVec,
    /// Live messages received on the SUB socket (before sequencing).
    pub live_messages: IntCounter,
    /// Sequence gaps detected on the live stream.
    pub gaps: IntCounter,
    /// Replays requested, by outcome (complete, lost, failed).
    pub replays: IntCounterVec,
    /// Batches received by replay and applied.
    pub replayed_batches: IntCounter,
    /// State drops (new epoch), by reason (vllm_restart, replay_lost, replay_failed).
    pub resyncs: IntCounterVec,
    /// BlockStored events skipped because the parent was unknown.
    pub unknown_parent: IntCounter,
    /// BlockRemoved hashes never stored.
    pub unknown_removed: IntCounter,
    /// Live batches dropped as duplicates of replayed ones.
    pub duplicates: IntCounter,
    /// Current resident blocks (set at scrape time).
    pub resident_blocks: IntGauge,
    /// Current epoch (set at scrape time).
    pub epoch: IntGauge,
    /// Per router: 0 disconnected, 1 connecting, 2 streaming.
    pub stream_state: IntGaugeVec,
    /// Per router: reports sent but not yet acknowledged.
    pub lag_reports: IntGaugeVec,
    /// Per router: blocks waiting in the queue.
    pub queued_blocks: IntGaugeVec,
    /// Per router: encoded bytes of reports sent, by kind (snapshot, delta, load).
    pub bytes_sent: IntCounterVec,
    /// Per router: reports sent, by kind.
    pub reports_sent: IntCounterVec,
    /// Per router: stream (re)connections.
    pub connects: IntCounterVec,
    /// Per router: connection attempts that failed.
    pub connect_failures: IntCounterVec,
    /// Snapshots sent, by router and reason.
    pub snapshots: IntCounterVec,
    /// Router queue overflows (deltas dropped in favour of a snapshot).
    pub queue_overflows: IntCounterVec,
    /// vLLM /metrics scrapes, by outcome (ok, error).
    pub scrapes: IntCounterVec,
    /// Changes of the --router-tls-dir files, by outcome (reloaded; failed: the previous
    /// files stay in use).
    pub tls_reloads: IntCounterVec,
    /// `/debug/resident` calls refused because they did not come from loopback.
    pub admin_refused: IntCounter,
    /// Polls of vLLM's /v1/models for LoRA adapters, by outcome (ok, error, not_json,
    /// no_data).
    pub lora_polls: IntCounterVec,
    /// LoRA adapters left out of the list sent to routers (over 256, or a name over 256
    /// bytes).
    pub lora_dropped: IntCounter,
    /// LoRA adapters the worker serves (set at scrape time).
    pub lora_adapters: IntGauge,
    /// Tasks alive on the sidecar's tokio runtime (set by
    /// [`SidecarMetrics::refresh_runtime`] at scrape time).
    pub runtime_alive_tasks: IntGauge,
}

impl SidecarMetrics {
    /// Creates every metric and registers it on `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let cv = |name: &str, help: &str, labels: &[&str]| -> prometheus::Result<IntCounterVec> {
            let c = IntCounterVec::new(Opts::new(format!("kvroute_sidecar_{name}"), help), labels)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let c = |name: &str, help: &str| -> prometheus::Result<IntCounter> {
            let c = IntCounter::new(format!("kvroute_sidecar_{name}"), help)?;
            registry.register(Box::new(c.clone()))?;
            Ok(c)
        };
        let gv = |name: &str, help: &str, labels: &[&str]| -> prometheus::Result<IntGaugeVec> {
            let g = IntGaugeVec::new(Opts::new(format!("kvroute_sidecar_{name}"), help), labels)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        let g = |name: &str, help: &str| -> prometheus::Result<IntGauge> {
            let g = IntGauge::new(format!("kvroute_sidecar_{name}"), help)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
        Ok(SidecarMetrics {
            events: cv(
                "kv_events_total",
                "KV events received from vLLM, by type",
                &["type"],
            )?,
            blocks: cv(
                "blocks_total",
                "Resident-set block changes applied, by kind",
                &["kind"],
            )?,
            decode_errors: cv(
                "decode_errors_total",
                "Undecodable ZMQ frames or payloads, by reason",
                &["reason"],
            )?,
            live_messages: c(
                "live_messages_total",
                "Messages received on the KV-event SUB socket",
            )?,
            gaps: c(
                "seq_gaps_total",
                "Sequence gaps detected on the live KV-event stream",
            )?,
            replays: cv(
                "replays_total",
                "Replay requests to vLLM, by outcome",
                &["outcome"],
            )?,
            replayed_batches: c(
                "replayed_batches_total",
                "Event batches received through replay",
            )?,
            resyncs: cv(
                "resyncs_total",
                "Times the worker state was dropped (new epoch), by reason",
                &["reason"],
            )?,
            lora_polls: cv(
                "lora_polls_total",
                "Polls of vLLM /v1/models for LoRA adapters, by outcome",
                &["outcome"],
            )?,
            lora_dropped: c(
                "lora_adapters_dropped_total",
                "LoRA adapters left out of the list sent to routers (over the caps)",
            )?,
            lora_adapters: g(
                "lora_adapters",
                "LoRA adapters the worker serves, as the sidecar sees them",
            )?,
            runtime_alive_tasks: g(
                "runtime_alive_tasks",
                "Tasks alive on the sidecar's tokio runtime (set at scrape time)",
            )?,
            admin_refused: c(
                "admin_refused_total",
                "Calls to /debug/resident refused: not from loopback",
            )?,
            unknown_parent: c(
                "unknown_parent_total",
                "BlockStored events skipped: parent never seen",
            )?,
            unknown_removed: c(
                "unknown_removed_total",
                "BlockRemoved hashes that were never stored",
            )?,
            duplicates: c(
                "duplicate_batches_total",
                "Live batches already applied from a replay",
            )?,
            resident_blocks: g(
                "resident_blocks",
                "Blocks resident on the worker, as the sidecar sees them",
            )?,
            epoch: g("epoch", "Current epoch (low 63 bits)")?,
            stream_state: gv(
                "router_stream_state",
                "0 disconnected, 1 connecting, 2 streaming",
                &["router"],
            )?,
            lag_reports: gv(
                "router_lag_reports",
                "Reports sent but not yet acknowledged",
                &["router"],
            )?,
            queued_blocks: gv(
                "router_queued_blocks",
                "Blocks queued for the router",
                &["router"],
            )?,
            bytes_sent: cv(
                "router_bytes_sent_total",
                "Encoded report bytes sent, by kind",
                &["router", "kind"],
            )?,
            reports_sent: cv(
                "router_reports_sent_total",
                "Reports sent, by kind",
                &["router", "kind"],
            )?,
            connects: cv(
                "router_connects_total",
                "Streams opened to the router",
                &["router"],
            )?,
            connect_failures: cv(
                "router_stream_failures_total",
                "Streams that failed or ended",
                &["router"],
            )?,
            snapshots: cv("router_snapshots_total", "Snapshots sent", &["router"])?,
            queue_overflows: cv(
                "router_queue_overflows_total",
                "Router queue overflows (deltas replaced by a snapshot)",
                &["router"],
            )?,
            scrapes: cv(
                "vllm_scrapes_total",
                "Scrapes of vLLM /metrics, by outcome",
                &["outcome"],
            )?,
            tls_reloads: cv(
                "tls_reloads_total",
                "Changes of the --router-tls-dir files, by outcome (failed: the previous files stay in use)",
                &["outcome"],
            )?,
        })
    }

    /// Sets the runtime gauges from the tokio runtime this is called on (a no-op outside
    /// one): called when `/metrics` is scraped.
    pub fn refresh_runtime(&self) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let n = rt.metrics().num_alive_tasks();
            self.runtime_alive_tasks
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn alive_tasks_gauge_follows_the_runtime() {
        let m = SidecarMetrics::register(&Registry::new()).expect("register");
        let (tx, rx) = tokio::sync::watch::channel(false);
        let held: Vec<_> = (0..4)
            .map(|_| {
                let mut rx = rx.clone();
                tokio::spawn(async move {
                    let _ = rx.wait_for(|go| *go).await;
                })
            })
            .collect();
        m.refresh_runtime();
        assert!(m.runtime_alive_tasks.get() >= 4);
        tx.send_replace(true);
        for h in held {
            h.await.expect("task");
        }
        m.refresh_runtime();
        assert!(m.runtime_alive_tasks.get() < 4);
    }
}
