//! A churn workload for the worker lifecycle, driven through [`RouterState`]'s public API as
//! discovery and the ingest service drive it: shared by the churn test
//! (`router/tests/churn.rs`) and the churn benchmark (`cargo bench --bench churn`).
//!
//! ```text
//! cycle i: catalog lists pod-i --> snapshot of N blocks (stream opens) --> one pick
//!          --> stream closes --> catalog drops pod-i --> maintain(): retired, every trace gone
//! ```

use std::time::{Duration, Instant};

use crate::state::{
    Catalog, DiscoveredWorker, PickInput, Prompt, RouterState, SidecarIdentity, Usage,
};

/// Model every churned worker serves.
pub const MODEL: &str = "churn-model";
/// Block size of every churned worker.
pub const BLOCK_SIZE: usize = 16;

/// Drives worker lifecycles against one state: `live` long-lived workers plus one that comes
/// and goes per cycle.
pub struct Churn {
    state: RouterState,
    live: Vec<DiscoveredWorker>,
    blocks: usize,
    stream: u64,
    now: Instant,
    prompt: Vec<u32>,
}

impl Churn {
    /// `live` workers that stay, each with a snapshot of `blocks` blocks; churned workers get
    /// `blocks` blocks each too. The state should have `retire_after` = 0 (retire at once).
    pub fn new(state: RouterState, live: usize, blocks: usize) -> Self {
        let mut c = Self {
            state,
            live: (0..live).map(|i| worker(&format!("live-{i}"))).collect(),
            blocks,
            stream: 0,
            now: Instant::now(),
            prompt: (0..(BLOCK_SIZE * 8) as u32).collect(),
        };
        c.set_catalog(None);
        let ids: Vec<String> = c.live.iter().map(|w| w.id.clone()).collect();
        for (i, id) in ids.iter().enumerate() {
            c.open(id, (1 << 40) + (i * blocks) as u64);
        }
        c
    }

    /// The state.
    pub fn state(&self) -> &RouterState {
        &self.state
    }

    /// The ids of the long-lived workers.
    pub fn live_ids(&self) -> Vec<String> {
        self.live.iter().map(|w| w.id.clone()).collect()
    }

    /// One cycle: pod `i` appears, streams its snapshot, takes and finishes one request,
    /// its stream closes, discovery drops it, upkeep retires it. Returns how many workers
    /// the upkeep retired.
    pub fn cycle(&mut self, i: u64) -> usize {
        let id = format!("pod-{i}");
        self.set_catalog(Some(worker(&id)));
        let stream = self.open(&id, i * self.blocks as u64);
        // One request on it, so that its series exist in every worker-labelled family.
        let input = PickInput {
            model: MODEL,
            prompt: Prompt::Tokens(&self.prompt),
            cache_salt: None,
            lora: None,
            headers: None,
            resolved: None,
            exclude: &[],
            max_tokens: Some(8),
            tenant: None,
            labels: &[],
            seed: None,
        };
        if let Ok(p) = self.state.pick(&input, self.now) {
            self.state.first_token(p.assignment, Some(0.05), self.now);
            self.state.done(p.assignment, Usage::default());
        }
        self.state.sidecar_closed(stream, &id, self.now);
        self.set_catalog(None);
        self.now += Duration::from_millis(1);
        self.state.maintain(self.now).1
    }

    fn open(&mut self, id: &str, first_block: u64) -> u64 {
        self.stream += 1;
        let identity = SidecarIdentity {
            worker_id: id.to_string(),
            address: format!("{id}:8000"),
            model: MODEL.to_string(),
            block_size: BLOCK_SIZE,
            epoch: 1,
            worker_set: "churn".to_string(),
        };
        let blocks: Vec<u64> = (first_block..first_block + self.blocks as u64).collect();
        // A refused snapshot (impossible here: fresh ids, epoch 1) only skips the worker.
        let _ = self
            .state
            .sidecar_snapshot_start(self.stream, &identity, &blocks, self.now);
        self.state
            .sidecar_snapshot_chunk(self.stream, id, &[], true, self.now);
        self.stream
    }

    fn set_catalog(&self, extra: Option<DiscoveredWorker>) {
        let mut workers = self.live.clone();
        workers.extend(extra);
        self.state.set_catalog(Catalog {
            pools: Vec::new(),
            workers,
        });
    }
}

fn worker(id: &str) -> DiscoveredWorker {
    DiscoveredWorker {
        id: id.to_string(),
        address: format!("{id}:8000"),
        model: MODEL.to_string(),
        worker_set: "churn".to_string(),
        namespace: String::new(),
        pod_ip: None,
        ready: true,
        origin: Default::default(),
        step_budget_tokens: None,
    }
}
