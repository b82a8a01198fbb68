//! The bounded router: the caps on what a caller can make the router hold, and how hitting
//! one is reported (docs/security.md, "Bounded router").
//!
//! ```text
//! gRPC message  > 4 MiB (Ingest) / --max-body-bytes (Picker) --> RESOURCE_EXHAUSTED
//! Pick          > --max-outstanding-picks unreported ----------> RESOURCE_EXHAUSTED
//! ingest stream > --max-ingest-streams, or no first report in time --> RESOURCE_EXHAUSTED
//! new worker    > --max-workers-per-model / --max-workers (unless discovery lists it) --> refused
//! blocks        > worker's cap, or the index's total (routing::BlockCaps)
//!                                  --> not stored, worker marked, resync when its cap moves
//!                          each: kvroute_router_limit_hits_total{limit}, a log line per interval
//! ```
//!
//! The router buffers no snapshot: every chunk goes into the index as it arrives, within the
//! worker's cap. Per stream it holds one decoded message and a control queue of
//! [`CONTROL_QUEUE`] messages.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

use crate::routing::BlockCaps;

/// Control messages (acks, snapshot requests) queued per ingest stream; when the sidecar does
/// not read them the stream stops reading its reports (HTTP/2 flow control then holds the
/// sidecar back).
pub const CONTROL_QUEUE: usize = 64;

/// Longest identity field (worker id, address, model, WorkerSet) a sidecar may send, bytes:
/// Kubernetes names are at most 253 characters; the router keeps these strings per worker and
/// uses the worker id as a metric label.
pub const MAX_IDENTITY_BYTES: usize = 512;

/// Most GPUs kept from one load sample (a node has at most 8 or 16; each becomes metric
/// series); the rest are dropped.
pub const MAX_GPUS_PER_WORKER: usize = 64;

/// Longest GPU UUID kept (NVML's are about 40 characters); longer ones are cut.
pub const MAX_GPU_UUID_BYTES: usize = 96;

/// Most LoRA adapters kept per worker from a load sample (vLLM serves a handful; the
/// sidecar sends at most as many); the rest are dropped.
pub const MAX_LORA_ADAPTERS_PER_WORKER: usize = 256;

/// Longest LoRA adapter or base model name kept, bytes; an adapter with a longer name is
/// dropped (a cut name would never match a request).
pub const MAX_LORA_NAME_BYTES: usize = 256;

/// Hits of one cap are logged at most this often (each hit is counted).
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The caps (from flags).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Limits {
    /// Workers per model that a sidecar may add (workers discovery lists are always taken).
    pub max_workers_per_model: usize,
    /// Workers in all that a sidecar may add (bounds workers naming many distinct models).
    pub max_workers: usize,
    /// Blocks the index keeps per worker.
    pub worker_blocks: BlockCaps,
    /// Ingest streams open at once.
    pub max_ingest_streams: usize,
    /// How long a new ingest stream may take to send its first report (a sidecar sends its
    /// snapshot at once); a stream that sends nothing would otherwise hold a stream slot.
    pub first_report_timeout: Duration,
    /// Outstanding assignments (not yet reported done or aborted, nor expired) past which
    /// the Picker refuses new Pick calls.
    pub max_outstanding_picks: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_workers_per_model: 256,
            max_workers: 1_024,
            worker_blocks: BlockCaps::default(),
            max_ingest_streams: 1_024,
            first_report_timeout: Duration::from_secs(10),
            max_outstanding_picks: 16_384,
        }
    }
}

/// Which cap was hit: the `limit` label of `kvroute_router_limit_hits_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// An Ingest message over 4 MiB.
    IngestMessageSize,
    /// A Pick request over `--max-body-bytes` (plus framing).
    PickMessageSize,
    /// A Pick while `--max-outstanding-picks` assignments are outstanding.
    OutstandingPicks,
    /// Ingest streams at `--max-ingest-streams`.
    IngestStreams,
    /// A stream sent no report within [`Limits::first_report_timeout`].
    FirstReportTimeout,
    /// An identity field over [`MAX_IDENTITY_BYTES`].
    IdentitySize,
    /// A load sample with more than [`MAX_GPUS_PER_WORKER`] GPUs.
    WorkerGpus,
    /// A new worker over `--max-workers-per-model`.
    WorkersPerModel,
    /// A new worker over `--max-workers`.
    Workers,
    /// A report whose blocks did not all fit the worker's block cap.
    WorkerBlocks,
    /// A report whose blocks did not all fit the index's total (`--max-index-blocks`).
    IndexBlocks,
    /// A load sample with more than [`MAX_LORA_ADAPTERS_PER_WORKER`] LoRA adapters, or a
    /// name over [`MAX_LORA_NAME_BYTES`].
    WorkerLoraAdapters,
}

impl Limit {
    /// Every cap, in label order.
    pub const ALL: [Limit; 12] = [
        Limit::IngestMessageSize,
        Limit::PickMessageSize,
        Limit::OutstandingPicks,
        Limit::IngestStreams,
        Limit::FirstReportTimeout,
        Limit::IdentitySize,
        Limit::WorkerGpus,
        Limit::WorkersPerModel,
        Limit::Workers,
        Limit::WorkerBlocks,
        Limit::IndexBlocks,
        Limit::WorkerLoraAdapters,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Limit::IngestMessageSize => "ingest_message_size",
            Limit::PickMessageSize => "pick_message_size",
            Limit::OutstandingPicks => "outstanding_picks",
            Limit::IngestStreams => "ingest_streams",
            Limit::FirstReportTimeout => "first_report_timeout",
            Limit::IdentitySize => "identity_size",
            Limit::WorkerGpus => "worker_gpus",
            Limit::WorkersPerModel => "workers_per_model",
            Limit::Workers => "workers",
            Limit::WorkerBlocks => "worker_blocks",
            Limit::IndexBlocks => "index_blocks",
            Limit::WorkerLoraAdapters => "worker_lora_adapters",
        }
    }
}

/// Decides when a cap's hits are logged: the first hit, then at most once per `every`, each
/// line saying how many hits it stands for.
#[derive(Debug)]
pub struct LogEvery {
    every: Duration,
    /// Per cap (by [`Limit::ALL`] position): when it was last logged, hits since.
    last: Mutex<[(Option<Instant>, u64); Limit::ALL.len()]>,
}

impl LogEvery {
    /// Logs each cap at most once per `every`.
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: Mutex::new([(None, 0); Limit::ALL.len()]),
        }
    }

    /// A hit of `limit` at `now`: `Some(hits)` when it should be logged now (`hits` counts
    /// this one and those not logged since the last line), else `None`.
    pub fn hit(&self, limit: Limit, now: Instant) -> Option<u64> {
        let i = Limit::ALL.iter().position(|l| *l == limit)?;
        let mut last = self.last.lock();
        let (at, pending) = &mut last[i];
        *pending += 1;
        if at.is_some_and(|t| now.saturating_duration_since(t) < self.every) {
            return None;
        }
        *at = Some(now);
        Some(std::mem::take(pending))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_are_logged_once_per_interval_with_the_count() {
        let log = LogEvery::new(Duration::from_secs(10));
        let t = Instant::now();
        assert_eq!(log.hit(Limit::Workers, t), Some(1));
        assert_eq!(log.hit(Limit::Workers, t + Duration::from_secs(1)), None);
        assert_eq!(log.hit(Limit::Workers, t + Duration::from_secs(2)), None);
        assert_eq!(
            log.hit(Limit::WorkerBlocks, t + Duration::from_secs(2)),
            Some(1),
            "caps are logged independently"
        );
        assert_eq!(
            log.hit(Limit::Workers, t + Duration::from_secs(10)),
            Some(3)
        );
    }

    #[test]
    fn labels_are_distinct() {
        let mut labels: Vec<_> = Limit::ALL.iter().map(|l| l.label()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Limit::ALL.len());
    }
}
