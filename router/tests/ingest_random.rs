//! Randomized model test of the sidecar ingest protocol (`ingest::Session::on_report`).
//!
//! Thousands of seeded report sequences -- well-formed streams mixed with duplicates, gaps,
//! snapshot continuations without their start, older epochs, bad identities, a second stream
//! taking the worker over, streams that end -- go through real `Session`s over one
//! `RouterState`. A naive model written from the protocol rules (the `ingest` module doc)
//! predicts every answer; after each report [`Harness::step`] checks:
//!
//! * the outcome: the acks and snapshot requests sent back, or the status code that ends the
//!   stream (a refused stream is then closed, as the socket loop does);
//! * the `/debug/workers` view serializes, and per worker its connection, sync state, epoch,
//!   block count and truncation (stores past its block cap, which its reported KV capacity
//!   sets) equal the model's; the index's pairs and distinct blocks equal the model's; so
//!   does the number of open streams.
//!
//! ```text
//! ChaCha8(seed) --> Step { slot, report, close } --> Session[slot].on_report --> RouterState
//!                                           \---> Model::on_report ----------> expected view
//! ```
//!
//! The fuzz target `router/fuzz/fuzz_targets/ingest_session.rs` includes this file
//! (`#[path]`) and drives the same [`Harness`] with decoded protobuf bytes instead.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use kvroute_proto::v1::{
    Delta, DeltaOp, IngestControl, LoadSample, SnapshotChunk, WorkerIdentity, WorkerReport,
    delta_op, ingest_control, worker_report,
};
use kvroute_router::ingest::Session;
use kvroute_router::metrics::RouterMetrics;
use kvroute_router::routing::BlockCaps;
use kvroute_router::state::{RouterConfig, RouterState};
use prost::Message;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// gRPC codes that end an ingest stream (tonic `Code` as `i32`).
pub const INVALID_ARGUMENT: i32 = 3;
/// An older epoch.
pub const FAILED_PRECONDITION: i32 = 9;
/// A newer stream owns the worker.
pub const ABORTED: i32 = 10;

/// What one report produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The stream continues; each control sent back: `Some(seq)` an ack, `None` a snapshot
    /// request.
    Sent(Vec<Option<u64>>),
    /// The stream is refused with this gRPC code.
    Ended(i32),
}

fn controls(out: Vec<IngestControl>) -> Outcome {
    Outcome::Sent(
        out.into_iter()
            .map(|c| match c.body {
                Some(ingest_control::Body::Ack(a)) => Some(a.seq),
                _ => None,
            })
            .collect(),
    )
}

// ------------------------------------------------------------------------------ the model

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    AwaitingFirst,
    InSnapshot,
    Live,
    AwaitingSnapshot,
}

/// One worker as the model sees it.
#[derive(Clone, Debug, Default)]
struct MWorker {
    epoch: u64,
    blocks: HashSet<u64>,
    owner: usize,
    open: bool,
    synced: bool,
    /// `scrape_failed` of the last load sample shown (a NaN usage counts as a failed scrape).
    load_failed: Option<bool>,
    block_size: u64,
    /// KV capacity in blocks from the last applied load sample that gave one.
    capacity_blocks: u64,
    /// A store was refused at the cap since the last snapshot began.
    truncated: bool,
}

impl MWorker {
    /// The router's default caps: what `RouterConfig::default()` runs with.
    fn cap(&self) -> u64 {
        BlockCaps::default().cap(self.capacity_blocks)
    }

    /// Stores `blocks` in order while there is room; the rest are refused.
    fn store(&mut self, blocks: &[u64]) {
        for &b in blocks {
            if (self.blocks.len() as u64) < self.cap() {
                self.blocks.insert(b);
            } else {
                self.truncated = true;
            }
        }
    }
}

/// One stream as the model sees it.
#[derive(Clone, Debug)]
struct MStream {
    id: usize,
    worker: Option<String>,
    /// The identity of the stream's last accepted snapshot (a snapshot without one reuses it).
    identity: Option<WorkerIdentity>,
    next_seq: u64,
    phase: Phase,
}

#[derive(Debug, Default)]
struct Model {
    workers: BTreeMap<String, MWorker>,
    streams: usize,
    /// Snapshot requests sent because a worker's block cap moved.
    cap_resyncs: u64,
}

impl Model {
    fn open(&mut self) -> MStream {
        self.streams += 1;
        MStream {
            id: self.streams,
            worker: None,
            identity: None,
            next_seq: 0,
            phase: Phase::AwaitingFirst,
        }
    }

    fn close(&mut self, s: &MStream) {
        if let Some(w) = s.worker.as_ref().and_then(|w| self.workers.get_mut(w))
            && w.owner == s.id
        {
            w.open = false;
        }
    }

    /// A snapshot's first chunk: validate, take the worker over, replace its blocks.
    fn start(
        &mut self,
        s: &mut MStream,
        id: &WorkerIdentity,
        blocks: &[u64],
        last: bool,
    ) -> Result<(), i32> {
        if id.worker_id.is_empty() || id.model.is_empty() || id.block_size == 0 {
            return Err(INVALID_ARGUMENT);
        }
        let fields = [&id.worker_id, &id.address, &id.model, &id.worker_set];
        if fields
            .iter()
            .any(|f| f.len() > kvroute_router::limits::MAX_IDENTITY_BYTES)
        {
            return Err(INVALID_ARGUMENT);
        }
        let w = self.workers.entry(id.worker_id.clone()).or_default();
        if w.owner != 0 && id.epoch < w.epoch {
            return Err(FAILED_PRECONDITION);
        }
        let keep_synced = w.owner != 0 && w.synced && w.epoch == id.epoch;
        *w = MWorker {
            epoch: id.epoch,
            blocks: HashSet::new(),
            owner: s.id,
            open: true,
            synced: keep_synced || last,
            load_failed: w.load_failed,
            block_size: u64::from(id.block_size),
            capacity_blocks: w.capacity_blocks,
            truncated: false,
        };
        w.store(blocks);
        s.worker = Some(id.worker_id.clone());
        s.identity = Some(id.clone());
        s.phase = if last { Phase::Live } else { Phase::InSnapshot };
        Ok(())
    }

    /// The worker `s` reports for, if `s` still owns it.
    fn owned(&mut self, s: &MStream) -> Result<&mut MWorker, i32> {
        s.worker
            .as_ref()
            .and_then(|w| self.workers.get_mut(w))
            .filter(|w| w.owner == s.id)
            .ok_or(ABORTED)
    }

    fn on_report(&mut self, s: &mut MStream, r: &WorkerReport) -> Outcome {
        match self.report(s, r) {
            Ok(out) => Outcome::Sent(out),
            Err(code) => Outcome::Ended(code),
        }
    }

    fn report(&mut self, s: &mut MStream, r: &WorkerReport) -> Result<Vec<Option<u64>>, i32> {
        let seq = r.seq;
        let Some(body) = &r.body else {
            return Ok(Vec::new());
        };
        if s.phase == Phase::AwaitingFirst {
            let worker_report::Body::Snapshot(c) = body else {
                return Err(INVALID_ARGUMENT);
            };
            let (true, Some(id)) = (c.first, c.identity.as_ref()) else {
                return Err(INVALID_ARGUMENT);
            };
            self.start(s, id, &c.blocks, c.last)?;
            s.next_seq = seq.saturating_add(1);
            return Ok(vec![Some(seq)]);
        }
        let mut out = Vec::new();
        if seq < s.next_seq {
            return Ok(out);
        }
        if seq > s.next_seq && s.phase != Phase::AwaitingSnapshot {
            s.phase = Phase::AwaitingSnapshot;
            out.push(None);
        }
        s.next_seq = seq.saturating_add(1);
        let applied = match body {
            worker_report::Body::Snapshot(c) if c.first => {
                let id = match &c.identity {
                    Some(id) if Some(&id.worker_id) != s.worker.as_ref() => {
                        return Err(INVALID_ARGUMENT);
                    }
                    Some(id) => id.clone(),
                    None => s.identity.clone().unwrap_or_default(),
                };
                self.start(s, &id, &c.blocks, c.last)?;
                true
            }
            worker_report::Body::Snapshot(c) => {
                if s.phase == Phase::InSnapshot {
                    let w = self.owned(s)?;
                    w.store(&c.blocks);
                    if c.last {
                        w.synced = true;
                        s.phase = Phase::Live;
                    }
                    true
                } else {
                    if s.phase != Phase::AwaitingSnapshot {
                        s.phase = Phase::AwaitingSnapshot;
                        out.push(None);
                    }
                    false
                }
            }
            worker_report::Body::Delta(d) => {
                if s.phase == Phase::AwaitingSnapshot {
                    false
                } else {
                    let w = self.owned(s)?;
                    for op in &d.ops {
                        match delta_op::Kind::try_from(op.kind) {
                            Ok(delta_op::Kind::Stored) => w.store(&op.blocks),
                            Ok(delta_op::Kind::Removed) => {
                                for b in &op.blocks {
                                    w.blocks.remove(b);
                                }
                            }
                            Ok(delta_op::Kind::Cleared) => w.blocks.clear(),
                            Ok(delta_op::Kind::Unspecified) | Err(_) => {}
                        }
                    }
                    true
                }
            }
            worker_report::Body::Load(l) => {
                let w = self.owned(s)?;
                let failed = l.scrape_failed || l.kv_cache_usage.is_nan();
                w.load_failed = Some(failed);
                if !failed {
                    // A capacity moves the cap; a move past what the index holds asks for a
                    // snapshot (unless one is asked for already).
                    let before = w.cap();
                    if l.kv_capacity_tokens > 0 {
                        w.capacity_blocks = l.kv_capacity_tokens.div_ceil(w.block_size);
                    }
                    let after = w.cap();
                    let resync = (after > before && w.truncated)
                        || (after < before && w.blocks.len() as u64 > after);
                    if resync && s.phase != Phase::AwaitingSnapshot {
                        out.push(None);
                        self.cap_resyncs += 1;
                    }
                }
                s.phase != Phase::AwaitingSnapshot
            }
        };
        if applied {
            out.push(Some(seq));
        }
        Ok(out)
    }
}

// ------------------------------------------------------------------------------ the harness

/// Real sessions over one `RouterState`, checked against the model after every report.
pub struct Harness {
    state: RouterState,
    model: Model,
    /// Open stream slots: the real session and its model twin.
    slots: Vec<Option<(Session, MStream)>>,
    now: Instant,
    /// What the reports produced, by kind (coverage of the generator or fuzzer).
    pub seen: BTreeMap<&'static str, u64>,
}

impl Harness {
    /// A fresh state with `slots` concurrent stream slots.
    pub fn new(slots: usize) -> Self {
        let metrics =
            RouterMetrics::register(&prometheus::Registry::new()).expect("metrics register");
        let state = RouterState::new(RouterConfig::default(), metrics).expect("router state");
        Self {
            state,
            model: Model::default(),
            slots: (0..slots).map(|_| None).collect(),
            now: Instant::now(),
            seen: BTreeMap::new(),
        }
    }

    /// Feeds `report` to the stream in `slot` (opening one if the slot is free), checks the
    /// outcome and the state; `close` then ends that stream. Panics on any divergence.
    pub fn step(&mut self, slot: usize, report: WorkerReport, close: bool) -> Outcome {
        let n = self.slots.len();
        let slot = slot % n;
        self.now += Duration::from_millis(10);
        let (mut session, mut ms) = match self.slots[slot].take() {
            Some(open) => open,
            None => (Session::new(&self.state), self.model.open()),
        };
        let expected = self.model.on_report(&mut ms, &report);
        let got = match session.on_report(&self.state, report.clone(), self.now) {
            Ok(out) => controls(out),
            Err(status) => Outcome::Ended(status.code().into()),
        };
        assert_eq!(got, expected, "outcome of {report:?}");
        self.count(&got);
        if self.model.workers.values().any(|w| w.truncated) {
            *self.seen.entry("truncated").or_default() += 1;
        }
        *self.seen.entry("cap_resync").or_default() = self.model.cap_resyncs;
        let ended = matches!(got, Outcome::Ended(_));
        assert_eq!(session.worker(), ms.worker.as_deref(), "stream's worker");
        if ended || close {
            session.close(&self.state);
            self.model.close(&ms);
        } else {
            self.slots[slot] = Some((session, ms));
        }
        self.check();
        got
    }

    fn count(&mut self, got: &Outcome) {
        let mut kinds = vec!["report"];
        match got {
            Outcome::Sent(out) if out.is_empty() => kinds.push("ignored"),
            Outcome::Sent(out) => {
                kinds.extend(out.iter().map(|c| {
                    if c.is_some() {
                        "ack"
                    } else {
                        "snapshot_request"
                    }
                }));
            }
            Outcome::Ended(INVALID_ARGUMENT) => kinds.push("invalid_argument"),
            Outcome::Ended(FAILED_PRECONDITION) => kinds.push("failed_precondition"),
            Outcome::Ended(ABORTED) => kinds.push("aborted"),
            Outcome::Ended(_) => kinds.push("other_code"),
        }
        for k in kinds {
            *self.seen.entry(k).or_default() += 1;
        }
    }

    /// Ends every open stream and checks once more.
    pub fn close_all(&mut self) {
        for slot in &mut self.slots {
            if let Some((session, ms)) = slot.take() {
                session.close(&self.state);
                self.model.close(&ms);
            }
        }
        self.check();
    }

    /// The `/debug/workers` view against the model.
    fn check(&self) {
        let view = self.state.workers_report(self.now);
        serde_json::to_string(&view).expect("/debug/workers serializes");
        let ids: Vec<&str> = view.workers.iter().map(|w| w.id.as_str()).collect();
        let known: Vec<&str> = self.model.workers.keys().map(String::as_str).collect();
        assert_eq!(ids, known, "workers listed");
        let mut union = HashSet::new();
        let mut pairs = 0u64;
        for (w, m) in view.workers.iter().zip(self.model.workers.values()) {
            assert_eq!(w.index_blocks, m.blocks.len() as u64, "blocks of {}", w.id);
            assert_eq!(w.epoch, m.epoch, "epoch of {}", w.id);
            assert_eq!(w.sidecar_connected, m.open, "connection of {}", w.id);
            assert_eq!(w.synced, m.synced, "sync of {}", w.id);
            assert_eq!(w.blocks_truncated, m.truncated, "truncation of {}", w.id);
            let failed = w.load.as_ref().map(|l| l.scrape_failed);
            assert_eq!(failed, m.load_failed, "load sample of {}", w.id);
            if let Some(load) = &w.load {
                assert!(
                    (0.0..=1.0).contains(&load.kv_usage),
                    "KV usage of {} is {}",
                    w.id,
                    load.kv_usage
                );
            }
            union.extend(m.blocks.iter().copied());
            pairs += m.blocks.len() as u64;
        }
        assert_eq!(view.index_pairs, pairs, "index pairs");
        assert_eq!(view.index_distinct_blocks, union.len(), "distinct blocks");
        let open = self.model.workers.values().filter(|w| w.open).count();
        assert_eq!(self.state.open_streams(), open, "open streams");
    }
}

// ------------------------------------------------------------------------------ bytes

/// Enough reports for long protocol histories, few enough to keep a fuzz input fast.
pub const MAX_FRAMES: usize = 256;

/// Feeds framed protobuf reports to `h` (the fuzz target's input format): repeated
/// `[header, len, len bytes]`; bit 0 of `header` picks the stream slot, bit 7 closes that
/// stream after the report. A chunk that does not decode is skipped, as tonic would refuse
/// it. Returns how many reports were fed.
pub fn feed(h: &mut Harness, data: &[u8]) -> usize {
    let mut rest = data;
    let mut fed = 0;
    while let [header, len, tail @ ..] = rest
        && fed < MAX_FRAMES
    {
        let (chunk, next) = tail.split_at(usize::from(*len).min(tail.len()));
        rest = next;
        let Ok(report) = WorkerReport::decode(chunk) else {
            continue;
        };
        h.step(usize::from(header & 1), report, header & 0x80 != 0);
        fed += 1;
    }
    fed
}

// ------------------------------------------------------------------------------ generation

/// Draws report sequences that are mostly well-formed, with every kind of fault mixed in.
pub struct Gen {
    rng: ChaCha8Rng,
    /// Next sequence number per slot, as a well-behaved sidecar would send it.
    seq: HashMap<usize, u64>,
    /// Slots asked for a snapshot (a well-behaved sidecar sends one next).
    resync: HashSet<usize>,
}

impl Gen {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            seq: HashMap::new(),
            resync: HashSet::new(),
        }
    }

    fn blocks(&mut self, max: usize) -> Vec<u64> {
        let n = self.rng.random_range(0..=max);
        // A small universe so stores, removals and workers overlap.
        (0..n).map(|_| self.rng.random_range(0..24u64)).collect()
    }

    fn identity(&mut self) -> WorkerIdentity {
        let r = self.rng.random_range(0..100);
        WorkerIdentity {
            worker_id: if r < 3 {
                String::new()
            } else {
                format!("w{}", self.rng.random_range(0..2))
            },
            address: "10.0.0.1:8000".into(),
            model: if (3..6).contains(&r) {
                String::new()
            } else {
                "m".into()
            },
            block_size: if (6..9).contains(&r) { 0 } else { 16 },
            epoch: match self.rng.random_range(0..10) {
                0 => 0,
                1 => 2,
                _ => 1,
            },
            worker_set: "ws".into(),
            ..WorkerIdentity::default()
        }
    }

    /// One step: (slot, report, close after it).
    pub fn step(&mut self, slots: usize) -> (usize, WorkerReport, bool) {
        // Mostly the first slot; sometimes a second stream for the same worker.
        let slot = if self.rng.random_bool(0.85) {
            0
        } else {
            self.rng.random_range(0..slots)
        };
        // A new stream mostly starts as the protocol says: a first snapshot chunk.
        let fresh = (!self.seq.contains_key(&slot) || self.resync.remove(&slot))
            && self.rng.random_bool(0.9);
        let next = self.seq.entry(slot).or_insert(0);
        let seq = match self.rng.random_range(0..100) {
            0..5 => next.saturating_sub(self.rng.random_range(1..3)),
            5..10 => *next + self.rng.random_range(1..4),
            _ => *next,
        };
        *next = seq + 1;
        let kind = if fresh {
            3
        } else {
            self.rng.random_range(0..100)
        };
        let body = match kind {
            0..3 => None,
            3..25 => {
                let first = fresh || self.rng.random_bool(0.6);
                Some(worker_report::Body::Snapshot(SnapshotChunk {
                    identity: (first || self.rng.random_bool(0.1))
                        .then(|| self.identity())
                        .filter(|_| fresh || self.rng.random_bool(0.95)),
                    first,
                    last: self.rng.random_bool(0.5),
                    blocks: self.blocks(6),
                }))
            }
            25..85 => {
                let ops = (0..self.rng.random_range(0..4))
                    .map(|_| {
                        let kind = match self.rng.random_range(0..20) {
                            0 => 3,
                            1 => 0,
                            2 => 7,
                            3..12 => 1,
                            _ => 2,
                        };
                        DeltaOp {
                            kind,
                            blocks: self.blocks(5),
                        }
                    })
                    .collect();
                Some(worker_report::Body::Delta(Delta { ops }))
            }
            _ => Some(worker_report::Body::Load(LoadSample {
                num_requests_waiting: self.rng.random_range(0..4),
                num_requests_running: self.rng.random_range(0..4),
                kv_cache_usage: if self.rng.random_bool(0.02) {
                    f64::NAN
                } else {
                    self.rng.random_range(-0.5..1.5)
                },
                scrape_failed: self.rng.random_bool(0.1),
                kv_capacity_tokens: self.rng.random_range(0..1000),
                ..LoadSample::default()
            })),
        };
        let close = self.rng.random_bool(0.02);
        (slot, WorkerReport { seq, body }, close)
    }
}

/// Runs `sequences` seeded sequences of `len` reports over `slots` stream slots; returns
/// what the reports produced, by kind.
pub fn run(seed: u64, sequences: u64, len: usize, slots: usize) -> BTreeMap<&'static str, u64> {
    let mut seen = BTreeMap::new();
    for i in 0..sequences {
        let mut g = Gen::new(seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut h = Harness::new(slots);
        for _ in 0..len {
            let (slot, report, close) = g.step(slots);
            if let Outcome::Sent(out) = h.step(slot, report, close)
                && out.contains(&None)
            {
                g.resync.insert(slot);
            }
            // A refused or closed stream's slot starts over at seq 0 with a new stream.
            if h.slots[slot].is_none() {
                g.seq.remove(&slot);
            }
        }
        h.close_all();
        for (k, n) in h.seen {
            *seen.entry(k).or_default() += n;
        }
    }
    seen
}

#[test]
fn random_report_sequences_match_the_model() {
    let seen = run(0x006b_7672_6f75_7465, 2_000, 40, 2);
    println!("{seen:?}");
    // The generator must reach every answer, and mostly the happy path.
    for kind in [
        "ack",
        "snapshot_request",
        "ignored",
        "invalid_argument",
        "failed_precondition",
        "aborted",
        "truncated",
        "cap_resync",
    ] {
        assert!(
            seen.get(kind).is_some_and(|&n| n > 0),
            "never {kind}: {seen:?}"
        );
    }
    assert!(seen["ack"] > seen["report"] / 2, "{seen:?}");
}

/// The fuzz seeds are golden inputs too: each decodes to whole reports that follow the
/// protocol as its name says, and the model agrees with the session on every one.
#[test]
fn fuzz_seeds_match_the_model() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/seeds/ingest_session");
    let expect: [(&str, usize, &[&str]); 3] = [
        ("happy_path", 6, &[]),
        ("gap_resync", 7, &["snapshot_request"]),
        (
            "takeover",
            6,
            &["aborted", "failed_precondition", "invalid_argument"],
        ),
    ];
    for (name, reports, kinds) in expect {
        let data = std::fs::read(format!("{dir}/{name}")).expect("seed file");
        let mut h = Harness::new(2);
        assert_eq!(feed(&mut h, &data), reports, "{name}: every frame decodes");
        h.close_all();
        for kind in kinds {
            assert!(h.seen.contains_key(kind), "{name}: no {kind}: {:?}", h.seen);
        }
    }
}
