//! Sidecar streams on the state's side: which stream owns which worker, applying their
//! snapshots, deltas and load samples to the routing core, and `/debug/workers`.
//!
//! ```text
//! ingest stream --sidecar_snapshot_start(identity)--> core.snapshot --> owns worker id
//!               --sidecar_snapshot_chunk / sidecar_delta / sidecar_load--> core (if owner)
//!               --sidecar_closed--> core.stream_closed (no candidate; retired later)
//! ```
//!
//! Caps ([`crate::limits`]): a new worker that discovery does not list is refused when its
//! model already has `max_workers_per_model` workers or the table `max_workers`; blocks past a
//! worker's cap are not stored (counted, the worker marked truncated); a load sample that
//! moves the cap past what the index holds asks the stream for a snapshot
//! ([`LoadApplied::Resync`]).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use serde::Serialize;

use super::RouterState;
use super::catalog::{DiscoveredWorker, find_sidecar};
use crate::limits::{Limit, Limits, MAX_IDENTITY_BYTES};
use crate::routing::{CapResync, GpuStatus, LoadSample, Stored, WorkerId};

/// Identity of a reporting worker (from the first snapshot chunk).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SidecarIdentity {
    /// Worker id.
    pub worker_id: String,
    /// host:port of its API.
    pub address: String,
    /// Served model.
    pub model: String,
    /// Block size.
    pub block_size: usize,
    /// Epoch.
    pub epoch: u64,
    /// WorkerSet name.
    pub worker_set: String,
}

/// A load sample from a sidecar.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LoadView {
    /// Requests waiting.
    pub waiting: u32,
    /// Requests running.
    pub running: u32,
    /// KV cache usage 0..1.
    pub kv_usage: f32,
    /// The sidecar's last scrape of vLLM failed.
    pub scrape_failed: bool,
    /// KV cache size in tokens (0: unknown).
    pub kv_capacity_tokens: u64,
    /// Its GPUs (empty: no GPU stats), each with why it is degraded if it is.
    pub gpus: Vec<GpuStatus>,
    /// The LoRA adapters it serves, `(name, base model)` (docs/lora.md); `None` from a
    /// sidecar that does not report them (the last list stays).
    #[serde(skip)]
    pub lora_adapters: Option<Vec<(String, String)>>,
}

/// Block changes in one delta op.
#[derive(Clone, Copy, Debug)]
pub enum DeltaOp<'a> {
    /// Blocks became resident.
    Stored(&'a [u64]),
    /// Blocks were evicted.
    Removed(&'a [u64]),
    /// Every block was dropped.
    Cleared,
}

/// Why a snapshot start was refused.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum SnapshotRefused {
    /// Identity is incomplete.
    #[error("identity without worker_id, model or block_size")]
    BadIdentity,
    /// An identity field is longer than the router keeps.
    #[error("identity field over {max} bytes")]
    IdentityTooLong {
        /// The cap ([`crate::limits::MAX_IDENTITY_BYTES`]).
        max: usize,
    },
    /// The router already knows a newer epoch of this worker.
    #[error("epoch {got} is older than the known epoch {known}")]
    OlderEpoch {
        /// The stream's epoch.
        got: u64,
        /// The newest epoch known.
        known: u64,
    },
    /// A new worker whose model already has `--max-workers-per-model` workers.
    #[error(
        "the model has {max} workers already (--max-workers-per-model); discovery does not list this one"
    )]
    TooManyWorkersForModel {
        /// The cap.
        max: usize,
    },
    /// A new worker while the router has `--max-workers` workers.
    #[error(
        "the router has {max} workers already (--max-workers); discovery does not list this one"
    )]
    TooManyWorkers {
        /// The cap.
        max: usize,
    },
}

/// What applying a load sample asks of the stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LoadApplied {
    /// A newer stream owns the worker: nothing was applied.
    NotOwner,
    /// Applied.
    Applied,
    /// Applied, and the worker's block cap moved past what the index holds: ask the sidecar
    /// for a snapshot (the reason says why).
    Resync(CapResync),
}

/// Which stream owns a worker id (the routing core holds everything else about it).
#[derive(Clone, Debug)]
pub(super) struct SidecarView {
    /// The worker's id in the routing core.
    pub(super) worker: WorkerId,
    /// What the owning stream said the worker is.
    pub(super) identity: SidecarIdentity,
    /// The stream currently owning the worker (a newer stream takes over).
    pub(super) stream: u64,
    /// That stream is open.
    pub(super) stream_open: bool,
    /// A snapshot has completed at least once.
    pub(super) synced: bool,
    /// The sidecar's last scrape of vLLM failed (its load sample was not applied).
    pub(super) scrape_failed: bool,
    /// The LoRA adapters the worker serves, `(name, base model)`, from its last load sample
    /// that listed them ([`RouterState::adapter_base`]).
    pub(super) lora_adapters: Vec<(String, String)>,
}

/// One worker as `/debug/workers` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct WorkerReport {
    /// Worker id.
    pub id: String,
    /// Address.
    pub address: String,
    /// Model.
    pub model: String,
    /// WorkerSet.
    pub worker_set: String,
    /// Listed by discovery.
    pub listed: bool,
    /// Pod ready (discovery).
    pub ready: bool,
    /// Sidecar stream open now.
    pub sidecar_connected: bool,
    /// No kvroute sidecar reports it (a GIE InferencePool pod): the router registered it
    /// itself and scores it on its own in-flight count, without a cache view.
    pub load_only: bool,
    /// A snapshot has completed.
    pub synced: bool,
    /// Stale (stream gone or reports too old).
    pub stale: bool,
    /// Routable now.
    pub routable: bool,
    /// Epoch.
    pub epoch: u64,
    /// Block size.
    pub block_size: usize,
    /// Resident blocks in the index.
    pub index_blocks: u64,
    /// The most blocks the index keeps for it (from its reported KV capacity).
    pub block_cap: u64,
    /// Stores refused at its block cap since it joined.
    pub blocks_dropped: u64,
    /// Stores were refused since its last snapshot began: its cache may be under-reported
    /// until the next one.
    pub blocks_truncated: bool,
    /// Seconds since the last report (None: never reported).
    pub last_report_age_s: Option<f64>,
    /// Last load sample.
    pub load: Option<LoadView>,
    /// The LoRA adapters it serves (docs/lora.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lora_adapters: Vec<String>,
    /// One of its GPUs is degraded (`load.gpus[].issues`): kvroute's score penalises it.
    pub gpu_degraded: bool,
    /// Router in-flight assignments (waiting first token + decoding).
    pub in_flight: u32,
    /// Of which waiting for the first token.
    pub waiting_first_token: u32,
    /// Passive health: requests it failed in a row (since its last completed one).
    pub consecutive_failures: u32,
    /// The engine step budget (tokens) its TTFT model's whole-steps line counts in: its
    /// WorkerSet's, else the router's `--step-budget-tokens`; absent when that line is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step_budget_tokens: Option<f64>,
    /// Passive health: ejected now (no candidate until `ejection.remaining_s` passes,
    /// unless every allowed worker is ejected).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ejection: Option<EjectionView>,
}

/// A worker's ejection as `/debug/workers` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct EjectionView {
    /// The failure that ejected it (`connect`, `http_5xx`, `stream_cut`, `timeout`).
    pub reason: &'static str,
    /// Seconds of ejection left.
    pub remaining_s: f64,
    /// Ejections in a row.
    pub ejections: u32,
}

/// `/debug/workers` body.
#[derive(Clone, Debug, Serialize)]
pub struct WorkersReport {
    /// Distinct blocks in the index.
    pub index_distinct_blocks: usize,
    /// (block, worker) pairs.
    pub index_pairs: u64,
    /// Estimated index memory.
    pub index_memory_bytes: usize,
    /// Outstanding assignments (all workers).
    pub in_flight: usize,
    /// The bounded router's caps.
    pub limits: Limits,
    /// Workers.
    pub workers: Vec<WorkerReport>,
}

/// The stream id of a worker that discovery registers itself because no kvroute sidecar is
/// expected to report it ([`crate::state::WorkerOrigin::InferencePool`]); report streams get
/// ids counting up from 0, so they never reach it.
pub(super) const DISCOVERY_STREAM: u64 = u64::MAX;

/// Block size the router registers a sidecar-less worker with. It holds no blocks (no cache
/// view), so the value only shapes an empty index entry.
const LOAD_ONLY_BLOCK_SIZE: usize = 16;

/// Whether a new worker of `model` that discovery does not list fits the caps, given the
/// workers known now (`sidecars`: one per worker in the table).
fn admit(
    limits: &Limits,
    sidecars: &std::collections::HashMap<String, SidecarView>,
    model: &str,
) -> Result<(), SnapshotRefused> {
    if sidecars.len() >= limits.max_workers {
        return Err(SnapshotRefused::TooManyWorkers {
            max: limits.max_workers,
        });
    }
    let same_model = sidecars
        .values()
        .filter(|s| s.identity.model == model)
        .count();
    if same_model >= limits.max_workers_per_model {
        return Err(SnapshotRefused::TooManyWorkersForModel {
            max: limits.max_workers_per_model,
        });
    }
    Ok(())
}

/// A worker id as logs show it: a caller chose it, so at most 128 characters.
fn shown(id: &str) -> &str {
    match id.char_indices().nth(128) {
        Some((i, _)) => &id[..i],
        None => id,
    }
}

impl RouterState {
    /// A new report stream id (a newer stream of the same worker takes it over).
    pub fn new_stream_id(&self) -> u64 {
        self.0.next_stream.fetch_add(1, Ordering::Relaxed)
    }

    /// Starts a snapshot from stream `stream`: registers the worker (the stream now owns it),
    /// refuses older epochs and new workers over the caps, replaces everything known about
    /// its blocks with `blocks` (up to its block cap).
    pub fn sidecar_snapshot_start(
        &self,
        stream: u64,
        identity: &SidecarIdentity,
        blocks: &[u64],
        now: Instant,
    ) -> Result<(), SnapshotRefused> {
        if identity.worker_id.is_empty() || identity.model.is_empty() || identity.block_size == 0 {
            return Err(SnapshotRefused::BadIdentity);
        }
        let longest = [
            &identity.worker_id,
            &identity.address,
            &identity.model,
            &identity.worker_set,
        ]
        .iter()
        .map(|f| f.len())
        .max()
        .unwrap_or(0);
        if longest > MAX_IDENTITY_BYTES {
            self.limit_hit(
                Limit::IdentitySize,
                format_args!("stream refused: an identity field of {longest} bytes"),
            );
            return Err(SnapshotRefused::IdentityTooLong {
                max: MAX_IDENTITY_BYTES,
            });
        }
        let t = self.secs(now);
        // By id only: an address is no identity, and anyone may claim a listed one.
        let (listed, step_budget) = self
            .0
            .catalog
            .read()
            .workers
            .iter()
            .find(|w| w.id == identity.worker_id)
            .map_or((false, None), |w| (true, w.step_budget_tokens));
        let mut sidecars = self.0.sidecars.write();
        let mut core = self.0.core.lock();
        let known = core.routing.worker_id(&identity.worker_id);
        if let Some(known) = known.and_then(|w| core.routing.worker(w)).map(|w| w.epoch)
            && identity.epoch < known
        {
            return Err(SnapshotRefused::OlderEpoch {
                got: identity.epoch,
                known,
            });
        }
        if known.is_none()
            && !listed
            && let Err(refused) = admit(&self.0.config.limits, &sidecars, &identity.model)
        {
            drop(core);
            drop(sidecars);
            let limit = match refused {
                SnapshotRefused::TooManyWorkers { .. } => Limit::Workers,
                _ => Limit::WorkersPerModel,
            };
            self.limit_hit(
                limit,
                format_args!(
                    "new worker {} refused: {refused}",
                    shown(&identity.worker_id)
                ),
            );
            return Err(refused);
        }
        let worker = core.routing.snapshot(
            &identity.worker_id,
            identity.block_size,
            identity.epoch,
            &[],
            t,
        );
        core.routing.set_speed_class(
            worker,
            &speed_class(&identity.worker_id, &identity.worker_set),
        );
        core.routing.set_step_budget(worker, step_budget);
        let stored = core.routing.stored(worker, blocks, t);
        drop(core);
        let view = SidecarView {
            worker,
            identity: identity.clone(),
            stream,
            stream_open: true,
            synced: false,
            scrape_failed: false,
            lora_adapters: Vec::new(),
        };
        match sidecars.get_mut(&identity.worker_id) {
            // A re-snapshot keeps the worker routable (it was synced) while the rest arrives.
            Some(s) => {
                let synced = s.synced && s.identity.epoch == identity.epoch && s.worker == worker;
                *s = SidecarView {
                    synced,
                    scrape_failed: s.scrape_failed,
                    lora_adapters: std::mem::take(&mut s.lora_adapters),
                    ..view
                };
            }
            None => {
                sidecars.insert(identity.worker_id.clone(), view);
            }
        }
        drop(sidecars);
        self.counted(&identity.worker_id, "snapshot", blocks.len(), stored);
        Ok(())
    }

    /// Counts the `announced` blocks of a report by `kind`: those applied, and those refused
    /// at a cap (`stored.dropped`).
    fn counted(&self, worker: &str, kind: &str, announced: usize, stored: Stored) {
        let m = &self.0.metrics;
        m.ingest_blocks
            .with_label_values(&[kind])
            .inc_by(announced.saturating_sub(stored.dropped) as u64);
        if stored.dropped > 0 {
            m.blocks_over_cap.inc_by(stored.dropped as u64);
            let (limit, cap) = if stored.index_full {
                (Limit::IndexBlocks, "the index's total (--max-index-blocks)")
            } else {
                (Limit::WorkerBlocks, "its block cap")
            };
            self.limit_hit(
                limit,
                format_args!(
                    "worker {}: {} blocks over {cap} not stored",
                    shown(worker),
                    stored.dropped
                ),
            );
        }
    }

    /// A later chunk of a snapshot; `last` completes it (the worker becomes routable). False
    /// when the stream no longer owns the worker.
    pub fn sidecar_snapshot_chunk(
        &self,
        stream: u64,
        worker: &str,
        blocks: &[u64],
        last: bool,
        now: Instant,
    ) -> bool {
        let t = self.secs(now);
        let Some(w) = self.owned(stream, worker) else {
            return false;
        };
        let stored = self.0.core.lock().routing.stored(w, blocks, t);
        if last && let Some(s) = self.0.sidecars.write().get_mut(worker) {
            s.synced = true;
        }
        self.counted(worker, "snapshot", blocks.len(), stored);
        true
    }

    /// Applies delta ops in order. False when the stream no longer owns the worker.
    pub fn sidecar_delta(
        &self,
        stream: u64,
        worker: &str,
        ops: &[DeltaOp<'_>],
        now: Instant,
    ) -> bool {
        let t = self.secs(now);
        let Some(w) = self.owned(stream, worker) else {
            return false;
        };
        let (mut announced, mut stored, mut removed, mut cleared) =
            (0, Stored::default(), 0u64, 0u64);
        let mut core = self.0.core.lock();
        for op in ops {
            match *op {
                DeltaOp::Stored(b) => {
                    let s = core.routing.stored(w, b, t);
                    stored.dropped += s.dropped;
                    stored.index_full |= s.index_full;
                    announced += b.len();
                }
                DeltaOp::Removed(b) => {
                    core.routing.removed(w, b, t);
                    removed += b.len() as u64;
                }
                DeltaOp::Cleared => {
                    core.routing.cleared(w, t);
                    cleared += 1;
                }
            }
        }
        drop(core);
        self.counted(worker, "stored", announced, stored);
        let m = &self.0.metrics.ingest_blocks;
        m.with_label_values(&["removed"]).inc_by(removed);
        m.with_label_values(&["cleared"]).inc_by(cleared);
        true
    }

    /// Records a load sample. A sample whose scrape failed is noted for display but neither
    /// feeds the predictor nor counts as a sign of life; its GPU stats (from NVML, not the
    /// scrape) apply either way. Its KV capacity sets the worker's block cap.
    pub fn sidecar_load(
        &self,
        stream: u64,
        worker: &str,
        load: LoadView,
        now: Instant,
    ) -> LoadApplied {
        let t = self.secs(now);
        let Some(w) = self.owned(stream, worker) else {
            return LoadApplied::NotOwner;
        };
        if let Some(s) = self.0.sidecars.write().get_mut(worker) {
            s.scrape_failed = load.scrape_failed;
            if let Some(adapters) = load.lora_adapters {
                s.lora_adapters = adapters;
            }
        }
        let mut core = self.0.core.lock();
        core.routing.gpus(w, load.gpus);
        if !load.scrape_failed {
            let sample = LoadSample {
                waiting: load.waiting,
                running: load.running,
                kv_usage: load.kv_usage,
                kv_capacity_tokens: load.kv_capacity_tokens,
            };
            if let Some(resync) = core.routing.load(w, sample, t) {
                return LoadApplied::Resync(resync);
            }
        }
        LoadApplied::Applied
    }

    /// The stream ended: if it still owns the worker, the worker stops being a candidate (its
    /// blocks are kept for a reconnect; it is retired once discovery drops it too).
    pub fn sidecar_closed(&self, stream: u64, worker: &str, now: Instant) {
        let t = self.secs(now);
        let mut sidecars = self.0.sidecars.write();
        let Some(s) = sidecars.get_mut(worker) else {
            return;
        };
        if s.stream != stream {
            return;
        }
        s.stream_open = false;
        let w = s.worker;
        self.0.core.lock().routing.stream_closed(w, t);
    }

    fn owned(&self, stream: u64, worker: &str) -> Option<WorkerId> {
        self.0
            .sidecars
            .read()
            .get(worker)
            .filter(|s| s.stream == stream)
            .map(|s| s.worker)
    }

    /// Open sidecar streams (workers registered by discovery itself do not count).
    pub fn open_streams(&self) -> usize {
        self.0
            .sidecars
            .read()
            .values()
            .filter(|s| s.stream_open && s.stream != DISCOVERY_STREAM)
            .count()
    }

    /// Registers the workers discovery lists without a sidecar
    /// ([`crate::state::WorkerOrigin::InferencePool`]) as if a stream had sent an empty
    /// snapshot, owned by [`DISCOVERY_STREAM`]: they are candidates scored on the router's own
    /// in-flight count (no cache view, and stale once `stale_after` passes without a report,
    /// which is always). A sidecar that reports such a worker takes it over like any newer
    /// stream; when that stream ends the worker falls back to discovery at the next call.
    /// Workers discovery owns but no longer lists are closed here and retired later like any
    /// other ([`RouterState::retire_gone`]). Called on every catalog change and by upkeep.
    pub(super) fn sync_load_only(&self, now: Instant) {
        let t = self.secs(now);
        let catalog = self.0.catalog.read();
        let mut sidecars = self.0.sidecars.write();
        let mut core = self.0.core.lock();
        let load_only = |id: &str| {
            catalog
                .workers
                .iter()
                .find(|w| w.id == id && w.origin == super::WorkerOrigin::InferencePool)
        };
        for (key, s) in sidecars.iter_mut() {
            if s.stream == DISCOVERY_STREAM && s.stream_open && load_only(key).is_none() {
                s.stream_open = false;
                core.routing.stream_closed(s.worker, t);
            }
        }
        for w in catalog
            .workers
            .iter()
            .filter(|w| w.origin == super::WorkerOrigin::InferencePool)
        {
            let owned = sidecars.get(&w.id);
            if owned.is_some_and(|s| s.stream_open) {
                continue;
            }
            let known = core
                .routing
                .worker_id(&w.id)
                .and_then(|id| core.routing.worker(id));
            let (block_size, epoch) = known.map_or((LOAD_ONLY_BLOCK_SIZE, 0), |k| {
                (k.block_size.max(1), k.epoch)
            });
            let worker = core.routing.snapshot(&w.id, block_size, epoch, &[], t);
            core.routing
                .set_speed_class(worker, &speed_class(&w.id, &w.worker_set));
            sidecars.insert(
                w.id.clone(),
                SidecarView {
                    worker,
                    identity: SidecarIdentity {
                        worker_id: w.id.clone(),
                        address: w.address.clone(),
                        model: w.model.clone(),
                        block_size,
                        epoch,
                        worker_set: w.worker_set.clone(),
                    },
                    stream: DISCOVERY_STREAM,
                    stream_open: true,
                    synced: true,
                    scrape_failed: false,
                    lora_adapters: Vec::new(),
                },
            );
        }
    }

    /// Ids of the workers registered by discovery itself (no sidecar reports them now).
    pub(super) fn load_only_ids(&self) -> Vec<String> {
        self.0
            .sidecars
            .read()
            .iter()
            .filter(|(_, s)| s.stream == DISCOVERY_STREAM && s.stream_open)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Workers, index and load (`/debug/workers`).
    pub fn workers_report(&self, now: Instant) -> WorkersReport {
        let t = self.secs(now);
        let catalog = self.0.catalog.read().clone();
        let sidecars = self.0.sidecars.read().clone();
        let core = self.0.core.lock();
        let routing = &core.routing;
        let route_unlisted = self.0.config.route_unlisted;
        let row = |id: &str, listed: Option<&DiscoveredWorker>, s: Option<&SidecarView>| {
            let w = s.map(|s| s.worker);
            let slot = w.and_then(|w| routing.worker(w));
            let infl = w.map(|w| routing.inflight(w)).unwrap_or_default();
            let stale = w.is_none_or(|w| routing.is_stale(w, t));
            let load_only = s.is_some_and(|s| s.stream == DISCOVERY_STREAM && s.stream_open);
            let open = s.is_some_and(|s| s.stream_open);
            let connected = open && !load_only;
            let synced = s.is_some_and(|s| s.synced);
            let ready = listed.is_some_and(|w| w.ready);
            let pick = |a: Option<String>, b: Option<String>| a.or(b).unwrap_or_default();
            WorkerReport {
                id: id.to_string(),
                address: pick(
                    listed.map(|w| w.address.clone()),
                    s.map(|s| s.identity.address.clone()),
                ),
                model: pick(
                    listed.map(|w| w.model.clone()),
                    s.map(|s| s.identity.model.clone()),
                ),
                worker_set: pick(
                    listed.map(|w| w.worker_set.clone()),
                    s.map(|s| s.identity.worker_set.clone()),
                ),
                listed: listed.is_some(),
                ready,
                sidecar_connected: connected,
                load_only,
                synced,
                stale,
                routable: synced && open && (ready || (listed.is_none() && route_unlisted)),
                epoch: slot.map_or(0, |s| s.epoch),
                block_size: slot.map_or(0, |s| s.block_size),
                index_blocks: w.map_or(0, |w| routing.blocks_of(w)),
                block_cap: w.map_or(0, |w| routing.block_cap(w)),
                blocks_dropped: slot.map_or(0, |s| s.blocks_dropped),
                blocks_truncated: slot.is_some_and(|s| s.truncated),
                last_report_age_s: slot.map(|s| (t - s.last_report).max(0.0)),
                load: slot
                    .filter(|sl| sl.load_at.is_finite() || s.is_some_and(|s| s.scrape_failed))
                    .map(|sl| LoadView {
                        waiting: sl.load.waiting,
                        running: sl.load.running,
                        kv_usage: sl.load.kv_usage,
                        scrape_failed: s.is_some_and(|s| s.scrape_failed),
                        kv_capacity_tokens: sl.load.kv_capacity_tokens,
                        gpus: sl.gpus.clone(),
                        lora_adapters: None,
                    }),
                lora_adapters: s.map_or_else(Vec::new, |s| {
                    s.lora_adapters.iter().map(|a| a.0.clone()).collect()
                }),
                gpu_degraded: slot.is_some_and(|sl| sl.gpu_degraded()),
                in_flight: infl.outstanding(),
                waiting_first_token: infl.waiting,
                consecutive_failures: slot.map_or(0, |s| s.health.consecutive_failures),
                step_budget_tokens: routing.step_budget(w),
                ejection: slot.filter(|s| s.health.is_ejected(t)).and_then(|s| {
                    Some(EjectionView {
                        reason: s.health.reason?.label(),
                        remaining_s: s.health.ejected_until - t,
                        ejections: s.health.ejections,
                    })
                }),
            }
        };
        let mut workers = Vec::new();
        let mut seen = Vec::new();
        for w in &catalog.workers {
            let s = find_sidecar(&sidecars, w);
            if let Some((k, _)) = s {
                seen.push(k.to_string());
            }
            workers.push(row(&w.id, Some(w), s.map(|(_, s)| s)));
        }
        let mut unlisted: Vec<_> = sidecars.iter().filter(|(k, _)| !seen.contains(k)).collect();
        unlisted.sort_by(|a, b| a.0.cmp(b.0));
        for (k, s) in unlisted {
            workers.push(row(k, None, Some(s)));
        }
        let stats = routing.index_stats();
        WorkersReport {
            index_distinct_blocks: stats.distinct_blocks,
            index_pairs: stats.pairs,
            index_memory_bytes: stats.memory_bytes,
            in_flight: routing.outstanding(),
            limits: self.0.config.limits,
            workers,
        }
    }

    /// Sets the scrape-time gauges (index size, in-flight, worker states).
    pub fn refresh_gauges(&self, now: Instant) {
        let report = self.workers_report(now);
        let m = &self.0.metrics;
        m.index_blocks.reset();
        m.in_flight.reset();
        m.gpu_degraded.reset();
        m.worker_kv_usage.reset();
        m.worker_kv_capacity.reset();
        m.worker_engine_requests.reset();
        for g in [
            &m.gpu_utilization,
            &m.gpu_temperature,
            &m.gpu_memory_used,
            &m.gpu_power,
        ] {
            g.reset();
        }
        let mut by_state: BTreeMap<&str, i64> = [
            ("routable", 0),
            ("stale", 0),
            ("not_ready", 0),
            ("disconnected", 0),
            ("unlisted", 0),
        ]
        .into_iter()
        .collect();
        for w in &report.workers {
            m.index_blocks
                .with_label_values(&[&w.id])
                .set(i64::try_from(w.index_blocks).unwrap_or(i64::MAX));
            m.in_flight
                .with_label_values(&[&w.id])
                .set(i64::from(w.in_flight));
            if let Some(load) = w.load.as_ref().filter(|l| !l.scrape_failed) {
                let id = w.id.as_str();
                m.worker_kv_usage
                    .with_label_values(&[id])
                    .set(f64::from(load.kv_usage));
                if load.kv_capacity_tokens > 0 {
                    m.worker_kv_capacity
                        .with_label_values(&[id])
                        .set(i64::try_from(load.kv_capacity_tokens).unwrap_or(i64::MAX));
                }
                m.worker_engine_requests
                    .with_label_values(&[id, "waiting"])
                    .set(i64::from(load.waiting));
                m.worker_engine_requests
                    .with_label_values(&[id, "running"])
                    .set(i64::from(load.running));
            }
            let gpus = w.load.as_ref().map_or(&[][..], |l| l.gpus.as_slice());
            if !gpus.is_empty() {
                m.gpu_degraded
                    .with_label_values(&[&w.id])
                    .set(i64::from(w.gpu_degraded));
            }
            for g in gpus {
                let labels = [w.id.as_str(), &g.index.to_string()];
                m.gpu_utilization
                    .with_label_values(&labels)
                    .set(f64::from(g.utilization_percent) / 100.0);
                m.gpu_temperature
                    .with_label_values(&labels)
                    .set(f64::from(g.temperature_celsius));
                m.gpu_memory_used
                    .with_label_values(&labels)
                    .set(g.memory_used_bytes as f64);
                m.gpu_power
                    .with_label_values(&labels)
                    .set(f64::from(g.power_milliwatts) / 1_000.0);
            }
            let state = if !w.listed && !self.0.config.route_unlisted {
                "unlisted"
            } else if !w.sidecar_connected && !w.load_only {
                "disconnected"
            } else if !w.routable {
                "not_ready"
            } else if w.stale {
                "stale"
            } else {
                "routable"
            };
            *by_state.entry(state).or_default() += 1;
        }
        for (state, n) in by_state {
            m.workers.with_label_values(&[state]).set(n);
        }
        let ejected = report
            .workers
            .iter()
            .filter(|w| w.ejection.is_some())
            .count();
        m.outlier_ejected_workers
            .set(i64::try_from(ejected).unwrap_or(i64::MAX));
        m.peer_placements
            .set(i64::try_from(self.peer_placements()).unwrap_or(i64::MAX));
    }
}

/// A worker's speed class (`RoutingCore::set_speed_class`): its InferenceWorkerSet,
/// qualified by the namespace its id (`namespace/pod`) names, as one set of that name per
/// namespace runs one GPU type; empty for a worker that names no set.
fn speed_class(worker_id: &str, worker_set: &str) -> String {
    if worker_set.is_empty() {
        return String::new();
    }
    match worker_id.split_once('/') {
        Some((namespace, _)) => format!("{namespace}/{worker_set}"),
        None => worker_set.to_owned(),
    }
}
