//! A pure, deterministic model of vLLM V1's engine core: continuous batching with chunked
//! prefill, a paged KV cache with automatic prefix caching, LRU eviction and preemption, and a
//! step-time model from a [`Profile`]. No I/O, no clock: time is `f64` simulated seconds passed in.
//! (Why one file of ~950 lines: like vLLM's own `Scheduler.schedule()`, one engine step admits,
//! chunks, preempts and frees against one KV cache state; its invariants are easier to keep
//! where the whole step can be read at once. The block pool is `blocks.rs`, tests `tests.rs`.)
//!
//! ```text
//!  submit(req, now) --> waiting (FCFS) --step(now)--> running --> StepOutput at now + duration
//!                                   ^                  |          (FirstToken, Token, Finished,
//!                                   +-- preempted -----+           Kv(BlockStored/Removed/...))
//! ```
//!
//! Driving it (a discrete-event simulation or the real-time driver):
//! 1. [`Engine::submit`] requests as they arrive.
//! 2. When [`Engine::next_step_at`] is `Some(t)`, call [`Engine::step`] at `max(now, t)`; it
//!    schedules one batch, applies it, and returns its `duration` and the events that become
//!    visible at `start + duration` ([`StepOutput::end`]). Don't call `step` again before `end`
//!    (an early call is treated as starting at `end`).
//! 3. `next_step_at` is `None` when there is nothing to run; submit more work to wake it.
//!
//! [`Engine::run_until`] does 2. for every step that starts before a given time.
//!
//! The engine is `Clone`, so a policy can fork it to ask "what if".

mod blocks;
mod profile;

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;

use kvroute_vllm_wire::{BlockRemoved, BlockStored, KvEvent, RawExtraKey};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::vllm_hash::{self, BlockDigest, ExtraKeys, HashAlgo};
use blocks::{BlockId, BlockPool};
pub use profile::{DEFAULT_PROFILE, Profile, ProfileError};

/// Engine settings (vLLM's `--block-size`, `--max-num-batched-tokens`, ...).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Blocks in the KV cache.
    pub num_blocks: usize,
    /// Token budget of one step, shared by decodes and prefill chunks.
    pub max_num_batched_tokens: usize,
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Longest prompt + output; longer prompts are rejected.
    pub max_model_len: usize,
    /// Automatic prefix caching (`--enable-prefix-caching`, on by default in V1).
    pub enable_prefix_caching: bool,
    /// Hash function of the published block hashes.
    pub hash_algo: HashAlgo,
    /// Seed of the generated tokens; request `id` is mixed in.
    pub seed: u64,
    /// Generated tokens are drawn uniformly from this range.
    pub sample_token_range: Range<u32>,
    /// End-of-sequence token, if the model has one.
    pub eos_token_id: Option<u32>,
    /// Chance that a generated token is EOS (unless the request ignores EOS).
    pub eos_probability: f64,
    /// Build [`KvEvent`]s (costs allocations; a simulation may not need them).
    pub kv_events: bool,
}

impl EngineConfig {
    /// The profile's defaults: block size, budget, sequence limit, model length, and as many
    /// blocks as `kv_capacity_tokens` holds.
    pub fn from_profile(profile: &Profile) -> Self {
        let block_size = profile.block_size.max(1) as usize;
        Self {
            block_size,
            num_blocks: (profile.kv_capacity_tokens as usize / block_size).max(1),
            max_num_batched_tokens: profile.max_num_batched_tokens as usize,
            max_num_seqs: profile.max_num_seqs as usize,
            max_model_len: profile.max_model_len as usize,
            enable_prefix_caching: true,
            hash_algo: HashAlgo::Sha256Cbor,
            seed: 0,
            sample_token_range: 0..32_000,
            eos_token_id: None,
            eos_probability: 0.0,
            kv_events: true,
        }
    }

    /// Changes the block size and recomputes `num_blocks` for the profile's KV capacity.
    pub fn with_block_size(mut self, profile: &Profile, block_size: usize) -> Self {
        self.block_size = block_size.max(1);
        self.num_blocks = (profile.kv_capacity_tokens as usize / self.block_size).max(1);
        self
    }
}

/// One generation request, already tokenized.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineRequest {
    /// Unique among live requests of this engine.
    pub id: u64,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Most tokens to generate (at least 1 is generated).
    pub max_tokens: u32,
    /// Keep generating past EOS.
    pub ignore_eos: bool,
    /// vLLM `cache_salt`: mixed into the first block's hash.
    pub cache_salt: Option<String>,
    /// LoRA adapter name: published in events; separates the adapter's cache from the base's.
    pub lora_name: Option<String>,
}

/// Why a request could not be submitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The prompt is longer than `max_model_len` (vLLM's 400 message).
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, your request has {prompt_tokens} input tokens. Please reduce the length of the input messages."
    )]
    PromptTooLong {
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// The engine's maximum context length.
        max_model_len: usize,
    },
    /// The prompt alone needs more KV blocks than the whole cache holds.
    #[error("the prompt needs {needed} KV blocks but the cache has {available}")]
    LargerThanCache {
        /// Blocks the prompt needs.
        needed: usize,
        /// Blocks in the cache.
        available: usize,
    },
    /// Another live request has this id.
    #[error("request id {0} is already in use")]
    DuplicateId(u64),
}

/// Why a request finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// Reached `max_tokens` or `max_model_len` (OpenAI `length`).
    Length,
    /// Generated EOS (OpenAI `stop`).
    Stop,
}

impl FinishReason {
    /// OpenAI / vLLM spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Length => "length",
            Self::Stop => "stop",
        }
    }
}

/// Token counts of a finished request, as vLLM reports them in `usage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache when the request was first scheduled.
    pub cached_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
}

/// When things happened to a request, simulated seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RequestTiming {
    /// When the engine received it.
    pub arrival: f64,
    /// Start of the first step that computed part of it.
    pub first_scheduled: f64,
    /// End of the step that produced its first token.
    pub first_token: f64,
    /// End of the step that finished it.
    pub finished: f64,
}

/// What happened during a step; all of it becomes visible at the step's end.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// The request's first output token exists (its TTFT point).
    FirstToken {
        /// The request.
        id: u64,
        /// End of the step that produced the token, in simulated seconds.
        at: f64,
    },
    /// One generated token (every token, the first included, after `FirstToken`).
    Token {
        /// The request.
        id: u64,
        /// The token id.
        token: u32,
    },
    /// The request is done; its blocks are released (and stay cached until evicted).
    Finished {
        /// The request.
        id: u64,
        /// Token counts for the response's `usage`.
        usage: Usage,
        /// Why it stopped.
        reason: FinishReason,
        /// When it arrived, was first scheduled, got its first token and finished.
        timing: RequestTiming,
    },
    /// A KV-cache event as vLLM publishes it (GPU tier, group 0: one full-attention group).
    Kv(KvEvent),
}

/// The result of one step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepOutput {
    /// Simulated time the step started.
    pub start: f64,
    /// How long it ran.
    pub duration: f64,
    /// Events, in the order vLLM would produce them (KV events first).
    pub events: Vec<EngineEvent>,
    /// Tokens of prefill computed in this step.
    pub prefill_tokens: usize,
    /// Sequences that decoded one token in this step.
    pub decode_seqs: usize,
}

impl StepOutput {
    /// When the step's results become visible.
    pub fn end(&self) -> f64 {
        self.start + self.duration
    }
}

/// A snapshot of the engine's load (what `/metrics` and `/get_load` show).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Load {
    /// Requests not yet scheduled.
    pub waiting: usize,
    /// Requests being prefilled or decoded.
    pub running: usize,
    /// Fraction of blocks referenced by requests (vLLM `kv_cache_usage_perc`, 0..1).
    pub kv_cache_usage: f64,
    /// Prompt tokens not computed yet, over waiting and running requests.
    pub waiting_prefill_tokens: usize,
    /// Tokens still to generate (upper bound: `max_tokens` minus generated) over all requests.
    pub pending_decode_tokens: usize,
    /// KV blocks in the cache (`kv_capacity_tokens / block_size`).
    pub num_blocks: usize,
    /// Blocks held by live requests (the rest are free or only cached).
    pub used_blocks: usize,
    /// Distinct block hashes in the prefix cache.
    pub cached_blocks: usize,
    /// End of the last step.
    pub busy_until: f64,
}

/// Cumulative counters (vLLM's `_total` metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: u64,
    /// Of those, tokens found.
    pub prefix_cache_hits: u64,
    /// Prompt tokens of requests that produced their first token.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generation_tokens: u64,
    /// Times a running request was preempted to free blocks.
    pub num_preemptions: u64,
    /// Engine steps run.
    pub steps: u64,
    /// Requests finished (stop or length).
    pub finished: u64,
    /// Requests aborted before they finished (client gone).
    pub aborted: u64,
}

#[derive(Clone, Debug)]
struct Request {
    /// Prompt followed by the generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    max_tokens: usize,
    ignore_eos: bool,
    cache_salt: Option<Arc<str>>,
    lora_name: Option<Arc<str>>,
    num_computed: usize,
    blocks: Vec<BlockId>,
    /// Digests of the full blocks of `tokens` computed so far.
    digests: Vec<BlockDigest>,
    hashes: Vec<u64>,
    /// Leading blocks of `blocks` that are in the prefix cache (hits or stored by us).
    num_cached_blocks: usize,
    cached_tokens: Option<usize>,
    scheduled_once: bool,
    timing: RequestTiming,
    rng: ChaCha8Rng,
}

impl Request {
    fn output_len(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

/// The simulated vLLM engine core. See the module docs for how to drive it.
#[derive(Clone, Debug)]
pub struct Engine {
    profile: Profile,
    config: EngineConfig,
    pool: BlockPool,
    requests: HashMap<u64, Request>,
    waiting: VecDeque<u64>,
    running: Vec<u64>,
    /// KV events produced outside a step (a reset), sent at the head of the next step's batch.
    pending_kv: Vec<KvEvent>,
    busy_until: f64,
    stats: EngineStats,
    none_hash: BlockDigest,
    scratch: Vec<u8>,
    evicted: Vec<u64>,
}

impl Engine {
    /// An idle engine with an empty cache.
    pub fn new(profile: Profile, config: EngineConfig) -> Self {
        let mut config = config;
        config.block_size = config.block_size.max(1);
        config.num_blocks = config.num_blocks.max(1);
        config.max_num_batched_tokens = config.max_num_batched_tokens.max(1);
        config.max_num_seqs = config.max_num_seqs.max(1);
        if config.sample_token_range.is_empty() {
            config.sample_token_range = 0..1;
        }
        Self {
            pool: BlockPool::new(config.num_blocks),
            none_hash: vllm_hash::none_hash(config.hash_algo),
            profile,
            config,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            pending_kv: Vec::new(),
            busy_until: 0.0,
            stats: EngineStats::default(),
            scratch: Vec::with_capacity(256),
            evicted: Vec::new(),
        }
    }

    /// The timing profile the engine simulates.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// The engine's configuration (cache geometry, limits, EOS).
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Queues a request (FCFS). Rejects prompts that can never run.
    pub fn submit(&mut self, req: EngineRequest, now: f64) -> Result<(), SubmitError> {
        let EngineRequest {
            id,
            prompt,
            max_tokens,
            ignore_eos,
            cache_salt,
            lora_name,
        } = req;
        if prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if prompt.len() > self.config.max_model_len {
            return Err(SubmitError::PromptTooLong {
                prompt_tokens: prompt.len(),
                max_model_len: self.config.max_model_len,
            });
        }
        let needed = prompt.len().div_ceil(self.config.block_size);
        if needed > self.config.num_blocks {
            return Err(SubmitError::LargerThanCache {
                needed,
                available: self.config.num_blocks,
            });
        }
        if self.requests.contains_key(&id) {
            return Err(SubmitError::DuplicateId(id));
        }
        let prompt_len = prompt.len();
        let mut r = Request {
            tokens: prompt,
            prompt_len,
            max_tokens: (max_tokens as usize).max(1),
            ignore_eos,
            cache_salt: cache_salt.map(Arc::from),
            lora_name: lora_name.map(Arc::from),
            num_computed: 0,
            blocks: Vec::new(),
            digests: Vec::new(),
            hashes: Vec::new(),
            num_cached_blocks: 0,
            cached_tokens: None,
            scheduled_once: false,
            timing: RequestTiming {
                arrival: now,
                ..RequestTiming::default()
            },
            rng: ChaCha8Rng::seed_from_u64(self.config.seed ^ id),
        };
        if self.config.enable_prefix_caching {
            self.extend_hashes(&mut r);
        }
        self.requests.insert(id, r);
        self.waiting.push_back(id);
        Ok(())
    }

    /// Removes a request wherever it is; its blocks are released. False if unknown.
    pub fn abort(&mut self, id: u64) -> bool {
        let Some(req) = self.requests.remove(&id) else {
            return false;
        };
        self.waiting.retain(|&w| w != id);
        self.running.retain(|&r| r != id);
        self.free_blocks(&req.blocks);
        self.stats.aborted += 1;
        true
    }

    /// When the next step can start: `None` when there is nothing to run, otherwise the end of
    /// the previous step (possibly in the past: then start it now).
    pub fn next_step_at(&self) -> Option<f64> {
        if self.waiting.is_empty() && self.running.is_empty() {
            None
        } else {
            Some(self.busy_until)
        }
    }

    /// Whether any request is waiting or running.
    pub fn has_work(&self) -> bool {
        !(self.waiting.is_empty() && self.running.is_empty())
    }

    /// Schedules and runs one step starting at `max(now, end of previous step)`. `None` when
    /// nothing could be scheduled (idle, or the head of the queue does not fit yet).
    pub fn step(&mut self, now: f64) -> Option<StepOutput> {
        let start = now.max(self.busy_until);
        let mut events: Vec<EngineEvent> = Vec::new();
        let scheduled = self.schedule(&mut events);
        if scheduled.is_empty() {
            if self.running.is_empty() && !self.waiting.is_empty() {
                // The head of the queue can never fit (a preempted request grew past the
                // cache): end it rather than stall the queue forever.
                return Some(self.drop_unfittable_head(start, events));
            }
            return None;
        }
        let mut prefill_tokens = 0;
        let mut decode_seqs = 0;
        let mut kv_read = 0;
        for &(id, n) in &scheduled {
            if let Some(r) = self.requests.get(&id) {
                let is_decode = n == 1 && r.num_computed >= r.prompt_len;
                if is_decode {
                    decode_seqs += 1;
                } else {
                    prefill_tokens += n;
                }
                kv_read += r.num_computed;
            }
        }
        let duration = self.profile.step_time(prefill_tokens, decode_seqs, kv_read);
        let end = start + duration;
        self.busy_until = end;
        self.stats.steps += 1;
        self.apply(&scheduled, start, end, &mut events);
        Some(StepOutput {
            start,
            duration,
            events,
            prefill_tokens,
            decode_seqs,
        })
    }

    /// Runs every step that starts before `until` (each at the end of the previous one, or at
    /// `from` when idle): what a simulation calls before delivering an arrival at `until`.
    /// The last step may end after `until`; its events carry their own end time.
    pub fn run_until(&mut self, from: f64, until: f64) -> Vec<StepOutput> {
        let mut outs = Vec::new();
        while let Some(t) = self.next_step_at() {
            let start = t.max(from);
            if start >= until {
                break;
            }
            match self.step(start) {
                Some(out) => outs.push(out),
                None => break,
            }
        }
        outs
    }

    /// Current load.
    pub fn load(&self) -> Load {
        let mut waiting_prefill_tokens = 0;
        let mut pending_decode_tokens = 0;
        for r in self.requests.values() {
            waiting_prefill_tokens += r.prompt_len.saturating_sub(r.num_computed);
            pending_decode_tokens += r.max_tokens.saturating_sub(r.output_len());
        }
        let num_blocks = self.pool.num_blocks();
        let used_blocks = num_blocks - self.pool.num_free();
        Load {
            waiting: self.waiting.len(),
            running: self.running.len(),
            kv_cache_usage: used_blocks as f64 / num_blocks as f64,
            waiting_prefill_tokens,
            pending_decode_tokens,
            num_blocks,
            used_blocks,
            cached_blocks: self.pool.num_cached(),
            busy_until: self.busy_until,
        }
    }

    /// Cumulative counters.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// The block hashes (as the KV events carry them) of every block cached now, sorted.
    pub fn cached_block_hashes(&self) -> Vec<u64> {
        let mut v = self.pool.cached_hashes();
        v.sort_unstable();
        v
    }

    /// Prompt tokens a new request with this prompt would find in the cache now.
    pub fn cached_prefix_tokens(&self, prompt: &[u32]) -> usize {
        self.cached_prefix_tokens_with(prompt, None, None)
    }

    /// [`Self::cached_prefix_tokens`] for a request with a `cache_salt`.
    pub fn cached_prefix_tokens_with(
        &self,
        prompt: &[u32],
        cache_salt: Option<&str>,
        lora_name: Option<&str>,
    ) -> usize {
        if !self.config.enable_prefix_caching || prompt.is_empty() {
            return 0;
        }
        let bs = self.config.block_size;
        let max_blocks = (prompt.len() - 1) / bs;
        let mut parent = self.none_hash;
        let mut scratch = Vec::with_capacity(64 + bs * 5);
        for (i, chunk) in prompt.chunks_exact(bs).take(max_blocks).enumerate() {
            let extra = ExtraKeys {
                lora_name,
                cache_salt: if i == 0 { cache_salt } else { None },
            };
            parent = vllm_hash::block_digest(
                self.config.hash_algo,
                &parent,
                chunk,
                &extra,
                &mut scratch,
            );
            if self
                .pool
                .lookup(vllm_hash::digest_to_u64(&parent))
                .is_none()
            {
                return i * bs;
            }
        }
        max_blocks * bs
    }

    /// Clears the prefix cache (vLLM `/reset_prefix_cache`). Fails while any block is in use.
    /// `AllBlocksCleared` rides at the head of the next step's events.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.pool.num_free() != self.pool.num_blocks() {
            return false;
        }
        self.pool.clear_cache();
        if self.config.kv_events {
            self.pending_kv.push(KvEvent::Cleared);
        }
        true
    }

    /// Takes the KV events produced outside a step (a reset) without waiting for a step.
    pub fn take_pending_kv_events(&mut self) -> Vec<KvEvent> {
        std::mem::take(&mut self.pending_kv)
    }

    /// Whether the request is still known (waiting or running).
    pub fn contains(&self, id: u64) -> bool {
        self.requests.contains_key(&id)
    }

    // ---- scheduling ----

    /// Picks this step's work: `(request id, tokens to compute)`.
    fn schedule(&mut self, events: &mut Vec<EngineEvent>) -> Vec<(u64, usize)> {
        let mut budget = self.config.max_num_batched_tokens;
        let mut scheduled: Vec<(u64, usize)> = Vec::with_capacity(self.running.len() + 4);
        let mut preempted_any = false;
        let max_len = self.config.max_model_len;

        // Running requests first, in order; preempt from the back when blocks run out.
        let mut idx = 0;
        while idx < self.running.len() && budget > 0 {
            let id = self.running[idx];
            let Some(r) = self.requests.get(&id) else {
                self.running.remove(idx);
                continue;
            };
            let remaining = r.tokens.len().saturating_sub(r.num_computed);
            let n = remaining
                .min(budget)
                .min(max_len.saturating_sub(r.num_computed));
            if n == 0 {
                idx += 1;
                continue;
            }
            let mut scheduled_self = false;
            loop {
                if self.allocate_slots(id, n) {
                    scheduled_self = true;
                    break;
                }
                // Preempt the lowest-priority running request (the last one).
                let Some(victim) = self.running.pop() else {
                    break;
                };
                self.preempt(victim);
                preempted_any = true;
                if victim == id {
                    break;
                }
            }
            if !scheduled_self {
                break;
            }
            scheduled.push((id, n));
            budget -= n;
            idx += 1;
        }

        // Then waiting requests, FCFS, unless this step preempted something.
        if !preempted_any {
            while budget > 0 && self.running.len() < self.config.max_num_seqs {
                let Some(&id) = self.waiting.front() else {
                    break;
                };
                let Some(n) = self.admit(id, budget) else {
                    break;
                };
                self.waiting.pop_front();
                self.running.push(id);
                scheduled.push((id, n));
                budget -= n;
            }
        }

        // Evictions caused by allocation, one BlockRemoved per hash like vLLM.
        if self.config.kv_events {
            for kv in self.pending_kv.drain(..) {
                events.push(EngineEvent::Kv(kv));
            }
            for h in self.evicted.drain(..) {
                events.push(EngineEvent::Kv(KvEvent::Removed(BlockRemoved::on_gpu(
                    vec![h],
                ))));
            }
        } else {
            self.evicted.clear();
        }
        scheduled
    }

    /// Tries to admit the head of the queue: takes its prefix-cache hits and allocates blocks
    /// for its first chunk. Returns the chunk size.
    fn admit(&mut self, id: u64, budget: usize) -> Option<usize> {
        let bs = self.config.block_size;
        let r = self.requests.get(&id)?;
        // Look up cached blocks (the last token is always recomputed).
        let mut hits: Vec<BlockId> = Vec::new();
        if r.num_computed == 0 && self.config.enable_prefix_caching {
            let max_blocks = (r.tokens.len() - 1) / bs;
            for &h in r.hashes.iter().take(max_blocks) {
                match self.pool.lookup(h) {
                    Some(b) => hits.push(b),
                    None => break,
                }
            }
        }
        let hit_tokens = hits.len() * bs;
        let n = (r.tokens.len() - hit_tokens).min(budget);
        let needed = (hit_tokens + n).div_ceil(bs) - hits.len();
        // Hits on free blocks leave the free queue, so they count against it.
        let free_hits = hits.iter().filter(|&&b| self.pool.is_free(b)).count();
        if needed + free_hits > self.pool.num_free() {
            return None;
        }
        let prompt_tokens = r.tokens.len();
        let first_time = r.cached_tokens.is_none();
        for &b in &hits {
            self.pool.touch(b);
        }
        let mut new_blocks = Vec::with_capacity(needed);
        for _ in 0..needed {
            // Cannot fail: checked above.
            if let Some(b) = self.pool.allocate(&mut self.evicted) {
                new_blocks.push(b);
            }
        }
        let r = self.requests.get_mut(&id)?;
        r.blocks = hits;
        r.num_cached_blocks = r.blocks.len();
        r.blocks.extend(new_blocks);
        r.num_computed = hit_tokens;
        if first_time {
            r.cached_tokens = Some(hit_tokens);
            self.stats.prefix_cache_queries += prompt_tokens as u64;
            self.stats.prefix_cache_hits += hit_tokens as u64;
        }
        Some(n)
    }

    /// Makes sure a running request has blocks for `n` more tokens.
    fn allocate_slots(&mut self, id: u64, n: usize) -> bool {
        let bs = self.config.block_size;
        let Some(r) = self.requests.get(&id) else {
            return false;
        };
        let needed = (r.num_computed + n)
            .div_ceil(bs)
            .saturating_sub(r.blocks.len());
        if needed > self.pool.num_free() {
            return false;
        }
        let mut new_blocks = Vec::with_capacity(needed);
        for _ in 0..needed {
            if let Some(b) = self.pool.allocate(&mut self.evicted) {
                new_blocks.push(b);
            }
        }
        if let Some(r) = self.requests.get_mut(&id) {
            r.blocks.extend(new_blocks);
        }
        true
    }

    /// Recompute-style preemption: drop the request's blocks and requeue it at the front.
    fn preempt(&mut self, id: u64) {
        let blocks = match self.requests.get_mut(&id) {
            Some(r) => {
                r.num_computed = 0;
                r.num_cached_blocks = 0;
                std::mem::take(&mut r.blocks)
            }
            None => return,
        };
        self.free_blocks(&blocks);
        self.waiting.push_front(id);
        self.stats.num_preemptions += 1;
    }

    /// Releases blocks tail first, so a request's last blocks are evicted before its first.
    fn free_blocks(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            self.pool.release(b);
        }
    }

    // ---- execution ----

    fn apply(
        &mut self,
        scheduled: &[(u64, usize)],
        start: f64,
        end: f64,
        events: &mut Vec<EngineEvent>,
    ) {
        let mut finished: Vec<u64> = Vec::new();
        let mut token_events: Vec<EngineEvent> = Vec::new();
        for &(id, n) in scheduled {
            let Some(mut r) = self.requests.remove(&id) else {
                continue;
            };
            if !r.scheduled_once {
                r.scheduled_once = true;
                r.timing.first_scheduled = start;
            }
            r.num_computed += n;
            self.cache_full_blocks(&mut r, events);
            if r.num_computed >= r.tokens.len() {
                let token = self.sample(&mut r);
                r.tokens.push(token);
                self.stats.generation_tokens += 1;
                if r.output_len() == 1 {
                    self.stats.prompt_tokens += r.prompt_len as u64;
                    r.timing.first_token = end;
                    token_events.push(EngineEvent::FirstToken { id, at: end });
                }
                token_events.push(EngineEvent::Token { id, token });
                let eos = !r.ignore_eos && Some(token) == self.config.eos_token_id;
                let reason = if eos {
                    Some(FinishReason::Stop)
                } else if r.output_len() >= r.max_tokens
                    || r.tokens.len() >= self.config.max_model_len
                {
                    Some(FinishReason::Length)
                } else {
                    None
                };
                if let Some(reason) = reason {
                    r.timing.finished = end;
                    token_events.push(EngineEvent::Finished {
                        id,
                        usage: Usage {
                            prompt_tokens: r.prompt_len,
                            cached_tokens: r.cached_tokens.unwrap_or(0),
                            completion_tokens: r.output_len(),
                        },
                        reason,
                        timing: r.timing,
                    });
                    self.free_blocks(&r.blocks);
                    self.stats.finished += 1;
                    finished.push(id);
                    continue;
                }
                if self.config.enable_prefix_caching {
                    self.extend_hashes(&mut r);
                }
            }
            self.requests.insert(id, r);
        }
        if !finished.is_empty() {
            self.running.retain(|id| !finished.contains(id));
        }
        events.extend(token_events);
    }

    fn drop_unfittable_head(&mut self, start: f64, mut events: Vec<EngineEvent>) -> StepOutput {
        if let Some(id) = self.waiting.pop_front()
            && let Some(r) = self.requests.remove(&id)
        {
            let mut timing = r.timing;
            timing.finished = start;
            self.stats.finished += 1;
            events.push(EngineEvent::Finished {
                id,
                usage: Usage {
                    prompt_tokens: r.prompt_len,
                    cached_tokens: r.cached_tokens.unwrap_or(0),
                    completion_tokens: r.output_len(),
                },
                reason: FinishReason::Length,
                timing,
            });
        }
        StepOutput {
            start,
            duration: 0.0,
            events,
            prefill_tokens: 0,
            decode_seqs: 0,
        }
    }

    fn sample(&self, r: &mut Request) -> u32 {
        if let Some(eos) = self.config.eos_token_id
            && !r.ignore_eos
            && self.config.eos_probability > 0.0
            && r.rng.random::<f64>() < self.config.eos_probability
        {
            return eos;
        }
        r.rng.random_range(self.config.sample_token_range.clone())
    }

    /// Computes digests for every full block of `tokens` not hashed yet.
    fn extend_hashes(&mut self, r: &mut Request) {
        let bs = self.config.block_size;
        let full = r.tokens.len() / bs;
        while r.digests.len() < full {
            let i = r.digests.len();
            let parent = if i == 0 {
                self.none_hash
            } else {
                r.digests[i - 1]
            };
            let extra = ExtraKeys {
                lora_name: r.lora_name.as_deref(),
                cache_salt: if i == 0 {
                    r.cache_salt.as_deref()
                } else {
                    None
                },
            };
            let d = vllm_hash::block_digest(
                self.config.hash_algo,
                &parent,
                &r.tokens[i * bs..(i + 1) * bs],
                &extra,
                &mut self.scratch,
            );
            r.hashes.push(vllm_hash::digest_to_u64(&d));
            r.digests.push(d);
        }
    }

    /// Marks the request's newly computed full blocks as cached and emits one BlockStored.
    fn cache_full_blocks(&mut self, r: &mut Request, events: &mut Vec<EngineEvent>) {
        if !self.config.enable_prefix_caching {
            return;
        }
        let bs = self.config.block_size;
        let full = (r.num_computed / bs).min(r.blocks.len());
        if full <= r.num_cached_blocks {
            return;
        }
        self.extend_hashes(r);
        let full = full.min(r.hashes.len());
        let first = r.num_cached_blocks;
        let mut stored: Vec<u64> = Vec::new();
        for i in first..full {
            // A duplicate (another request cached the same hash first) stays uncached.
            if self.pool.cache(r.blocks[i], r.hashes[i]) {
                stored.push(r.hashes[i]);
            }
        }
        r.num_cached_blocks = full;
        if !self.config.kv_events || stored.is_empty() {
            return;
        }
        if stored.len() != full - first {
            // Rare: some were duplicates. Publish each stored block on its own so parents stay right.
            for i in first..full {
                if self.pool.lookup(r.hashes[i]) == Some(r.blocks[i]) {
                    events.push(EngineEvent::Kv(self.block_stored(r, i, i + 1)));
                }
            }
            return;
        }
        events.push(EngineEvent::Kv(self.block_stored(r, first, full)));
    }

    fn block_stored(&self, r: &Request, from: usize, to: usize) -> KvEvent {
        let bs = self.config.block_size;
        // Per block: the bare extra keys vLLM publishes (LoRA name, then the cache salt on
        // block 0); none is vLLM's `None`.
        let extra_keys = (from..to)
            .map(|i| {
                let mut keys = Vec::new();
                if let Some(l) = &r.lora_name {
                    keys.push(RawExtraKey::Str(l.to_string()));
                }
                if i == 0
                    && let Some(s) = &r.cache_salt
                {
                    keys.push(RawExtraKey::Str(s.to_string()));
                }
                keys
            })
            .collect();
        KvEvent::Stored(BlockStored {
            block_hashes: r.hashes[from..to].to_vec(),
            parent: from.checked_sub(1).map(|p| r.hashes[p]),
            token_ids: r.tokens[from * bs..to * bs].to_vec(),
            block_size: u32::try_from(bs).ok(),
            lora_name: r.lora_name.as_deref().map(str::to_string),
            extra_keys,
            ..BlockStored::on_gpu()
        })
    }
}

#[cfg(test)]
mod tests;
