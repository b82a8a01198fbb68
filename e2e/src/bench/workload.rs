//! Seeded workload generators. A workload is a list of sessions; a session is a sequence of
//! turns sent one after another (a single-turn session for shared-prefix and independent
//! prompts, a growing conversation for multi-turn chat). Prompts are token ids: the
//! simulation needs no tokenizer, and ids are drawn from a range that real vocabularies
//! cover.
//!
//! ```text
//! WorkloadSpec --generate(seed)--> [Session { turns: [Turn { new tokens, max_tokens }] }]
//!                                   history(turn k) = turn 1..k prompts + generated replies
//! ```

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// Token ids are drawn from this range (inside every real vocabulary, away from special ids).
const TOKEN_RANGE: std::ops::Range<u32> = 1_000..30_000;

/// The workloads `kvroute bench` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// Many requests share one of a few long system prompts (RAG, agents, few-shot).
    SharedPrefix,
    /// Conversations whose history grows turn by turn.
    MultiTurn,
    /// Unrelated prompts: nothing to reuse; shows that cache-awareness costs nothing.
    Independent,
    /// Several tenants, each with its own salt and system prompt, mixing the three above.
    Mixed,
    /// Shared prefixes of very unequal popularity: [`HOT_SHARE`] of the requests use the first
    /// prefix, the rest spread evenly over the others. Following the cache alone piles the hot
    /// prefix's traffic onto the one worker that holds it.
    HotPrefix,
    /// Bursts of one new prefix: consecutive requests, `sessions / prefixes` at a time, share
    /// a prefix no earlier request used, so a burst arrives together before any worker holds
    /// it, and then all of it matches the one worker that took the first request.
    Burst,
    /// Long prompts with short outputs and the reverse, over shared prefixes: half the
    /// requests add `question_tokens` after their prefix and generate
    /// `output_tokens / LONG_SHORT_RATIO`; the other half add `question_tokens /
    /// LONG_SHORT_RATIO` and generate `output_tokens`. Counting requests says nothing about
    /// which worker's queue is long: a worker decoding many long answers has many requests
    /// and no prefill ahead of a new prompt, one with a few long prompts queued has few.
    LongShort,
}

/// `hot-prefix`: the share of requests that use the hot prefix.
pub const HOT_SHARE: f64 = 0.6;

/// `long-short`: how much longer the long side of a request is than its short side (the
/// question and the output).
pub const LONG_SHORT_RATIO: usize = 16;

impl WorkloadKind {
    /// Every kind, in report order.
    pub const ALL: [WorkloadKind; 4] = [
        WorkloadKind::SharedPrefix,
        WorkloadKind::MultiTurn,
        WorkloadKind::Independent,
        WorkloadKind::Mixed,
    ];

    /// Workloads where following the cache and balancing the queue disagree; run by name
    /// (`--workload hot-prefix,burst,long-short`), not part of `all` (the default suite).
    pub const DISAGREE: [WorkloadKind; 3] = [
        WorkloadKind::HotPrefix,
        WorkloadKind::Burst,
        WorkloadKind::LongShort,
    ];

    /// The kind's command-line and report name.
    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::SharedPrefix => "shared-prefix",
            WorkloadKind::MultiTurn => "multi-turn",
            WorkloadKind::Independent => "independent",
            WorkloadKind::Mixed => "mixed",
            WorkloadKind::HotPrefix => "hot-prefix",
            WorkloadKind::Burst => "burst",
            WorkloadKind::LongShort => "long-short",
        }
    }

    /// Every name [`WorkloadKind::parse`] accepts, comma-separated (for messages).
    pub fn names() -> String {
        Self::ALL
            .into_iter()
            .chain(Self::DISAGREE)
            .map(Self::name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The kind named `s`, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain(Self::DISAGREE)
            .find(|k| k.name() == s)
    }
}

/// Parameters of a workload. Defaults follow the issue's reference shapes; every field can be
/// overridden from the command line.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadSpec {
    /// Which generator builds the sessions.
    pub kind: WorkloadKind,
    /// Sessions to generate (each is one request for single-turn workloads).
    pub sessions: usize,
    /// shared-prefix: number of distinct prefixes and their length.
    pub prefixes: usize,
    /// Tokens per shared prefix.
    pub prefix_tokens: usize,
    /// Per-request unique part (the question / user message).
    pub question_tokens: usize,
    /// Tokens generated per request (the fewest, when `max_output_tokens` is set).
    pub output_tokens: u32,
    /// When set, each turn generates a length drawn uniformly from
    /// `output_tokens..=max_output_tokens` instead of exactly `output_tokens`. Left out of
    /// the JSON report when unset, so reports of fixed-length workloads keep their shape.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// multi-turn: turns per conversation and the first turn's length.
    pub turns: usize,
    /// Tokens of the first turn's message.
    pub first_turn_tokens: usize,
    /// mixed: number of tenants.
    pub tenants: usize,
}

impl WorkloadSpec {
    /// The documented default shape of `kind`.
    pub fn default_for(kind: WorkloadKind) -> Self {
        let base = WorkloadSpec {
            kind,
            sessions: 384,
            prefixes: 32,
            prefix_tokens: 2_048,
            question_tokens: 256,
            output_tokens: 256,
            max_output_tokens: None,
            turns: 6,
            first_turn_tokens: 1_024,
            tenants: 4,
        };
        match kind {
            WorkloadKind::SharedPrefix => base,
            // 64 conversations x 6 turns; each turn adds a 256-token user message and the
            // model's 128-token reply to the history.
            WorkloadKind::MultiTurn => WorkloadSpec {
                sessions: 64,
                output_tokens: 128,
                ..base
            },
            // 2,304-token unrelated prompts (same size as a shared-prefix request).
            WorkloadKind::Independent => WorkloadSpec {
                prefixes: 0,
                prefix_tokens: 0,
                question_tokens: 2_304,
                ..base
            },
            WorkloadKind::Mixed => WorkloadSpec {
                prefixes: 8,
                turns: 4,
                ..base
            },
            // One prefix takes 60% of the requests, 15 others share the rest.
            WorkloadKind::HotPrefix => WorkloadSpec {
                prefixes: 16,
                ..base
            },
            // 32 bursts of 12 requests, each burst on a new prefix.
            WorkloadKind::Burst => base,
            // 16 prefixes of 2,048 tokens; half the requests add 6,144 tokens and generate
            // 64, half add 384 and generate 1,024.
            WorkloadKind::LongShort => WorkloadSpec {
                prefixes: 16,
                question_tokens: 6_144,
                output_tokens: 1_024,
                ..base
            },
        }
    }

    /// A small version for smoke tests.
    pub fn quick(mut self) -> Self {
        self.sessions = match self.kind {
            WorkloadKind::MultiTurn => 8,
            _ => 24,
        };
        self.prefixes = self.prefixes.min(4);
        self.prefix_tokens = self.prefix_tokens.min(512);
        self.question_tokens = self.question_tokens.min(128);
        self.output_tokens = self.output_tokens.min(16);
        self.max_output_tokens = self.max_output_tokens.map(|m| m.min(16));
        self.turns = self.turns.min(3);
        self.first_turn_tokens = self.first_turn_tokens.min(256);
        self
    }
}

/// One request of a session: the tokens it adds to the session's history, how many tokens
/// to generate, and the tenant's cache salt.
#[derive(Clone, Debug)]
pub struct Turn {
    /// Appended after the history (previous turns and their replies).
    pub new_tokens: Vec<u32>,
    /// Tokens to generate.
    pub max_tokens: u32,
}

/// Turns sent one after another; turn k's prompt is the history of turns 1..k-1 (prompts and
/// the model's replies) followed by its own `new_tokens`.
#[derive(Clone, Debug)]
pub struct Session {
    /// The turns, in order.
    pub turns: Vec<Turn>,
    /// vLLM `cache_salt` of the tenant, if any.
    pub cache_salt: Option<String>,
    /// Tenant index (mixed workload), for reporting.
    pub tenant: usize,
}

fn tokens(rng: &mut ChaCha8Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(TOKEN_RANGE)).collect()
}

/// A turn's output length. Without a range nothing is drawn, so the sessions of a spec
/// without one stay what they were for a given seed.
fn output_len(rng: &mut ChaCha8Rng, spec: &WorkloadSpec) -> u32 {
    match spec.max_output_tokens {
        Some(max) if max != spec.output_tokens => {
            rng.random_range(spec.output_tokens.min(max)..=spec.output_tokens.max(max))
        }
        _ => spec.output_tokens,
    }
}

/// Generates the sessions of `spec`; the same seed gives the same sessions.
pub fn generate(spec: &WorkloadSpec, seed: u64) -> Vec<Session> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x776f_726b_6c6f_6164);
    match spec.kind {
        WorkloadKind::SharedPrefix => {
            let prefixes = prefixes(&mut rng, spec);
            (0..spec.sessions)
                .map(|_| {
                    let i = rng.random_range(0..prefixes.len());
                    question_after(&mut rng, spec, &prefixes[i])
                })
                .collect()
        }
        WorkloadKind::HotPrefix => {
            let prefixes = prefixes(&mut rng, spec);
            (0..spec.sessions)
                .map(|_| {
                    let i = if prefixes.len() == 1 || rng.random_bool(HOT_SHARE) {
                        0
                    } else {
                        rng.random_range(1..prefixes.len())
                    };
                    question_after(&mut rng, spec, &prefixes[i])
                })
                .collect()
        }
        WorkloadKind::Burst => {
            let burst = spec.sessions.div_ceil(spec.prefixes.max(1)).max(1);
            let mut prefix = Vec::new();
            (0..spec.sessions)
                .map(|i| {
                    if i % burst == 0 {
                        prefix = tokens(&mut rng, spec.prefix_tokens);
                    }
                    question_after(&mut rng, spec, &prefix)
                })
                .collect()
        }
        WorkloadKind::LongShort => {
            let prefixes = prefixes(&mut rng, spec);
            (0..spec.sessions)
                .map(|_| {
                    let prefix = &prefixes[rng.random_range(0..prefixes.len())];
                    let long_prompt = rng.random_bool(0.5);
                    let output = output_len(&mut rng, spec);
                    let (question, output) = if long_prompt {
                        (spec.question_tokens, output / LONG_SHORT_RATIO as u32)
                    } else {
                        (spec.question_tokens / LONG_SHORT_RATIO, output)
                    };
                    single(after(&mut rng, prefix, question), output.max(1), None, 0)
                })
                .collect()
        }
        WorkloadKind::Independent => (0..spec.sessions)
            .map(|_| {
                let t = tokens(&mut rng, spec.prefix_tokens + spec.question_tokens);
                single(t, output_len(&mut rng, spec), None, 0)
            })
            .collect(),
        WorkloadKind::MultiTurn => (0..spec.sessions)
            .map(|_| conversation(&mut rng, spec, Vec::new(), None, 0))
            .collect(),
        WorkloadKind::Mixed => {
            // Each tenant: its own salt and system prompt (lengths 1x..2x prefix_tokens/2).
            let tenants: Vec<(String, Vec<u32>)> = (0..spec.tenants.max(1))
                .map(|i| {
                    let len = spec.prefix_tokens / 2 * (1 + i % 2) + 256 * i;
                    (format!("tenant-{i}"), tokens(&mut rng, len))
                })
                .collect();
            (0..spec.sessions)
                .map(|_| {
                    let tenant = rng.random_range(0..tenants.len());
                    let (salt, system) = &tenants[tenant];
                    let salt = Some(salt.clone());
                    match rng.random_range(0..10) {
                        // 50%: one question over the tenant's system prompt.
                        0..5 => {
                            let mut t = system.clone();
                            t.extend(tokens(&mut rng, spec.question_tokens));
                            single(t, output_len(&mut rng, spec), salt, tenant)
                        }
                        // 30%: a conversation starting from the system prompt.
                        5..8 => conversation(&mut rng, spec, system.clone(), salt, tenant),
                        // 20%: an unrelated prompt.
                        _ => {
                            let t = tokens(&mut rng, spec.prefix_tokens);
                            single(t, output_len(&mut rng, spec), salt, tenant)
                        }
                    }
                })
                .collect()
        }
    }
}

/// `spec.prefixes` (at least one) prefixes of `spec.prefix_tokens` each.
fn prefixes(rng: &mut ChaCha8Rng, spec: &WorkloadSpec) -> Vec<Vec<u32>> {
    (0..spec.prefixes.max(1))
        .map(|_| tokens(rng, spec.prefix_tokens))
        .collect()
}

/// A single-turn session: `prefix` followed by a fresh question of `spec.question_tokens`.
fn question_after(rng: &mut ChaCha8Rng, spec: &WorkloadSpec, prefix: &[u32]) -> Session {
    let t = after(rng, prefix, spec.question_tokens);
    single(t, output_len(rng, spec), None, 0)
}

/// `prefix` followed by `n` fresh tokens.
fn after(rng: &mut ChaCha8Rng, prefix: &[u32], n: usize) -> Vec<u32> {
    let mut t = prefix.to_vec();
    t.extend(tokens(rng, n));
    t
}

fn single(t: Vec<u32>, max_tokens: u32, cache_salt: Option<String>, tenant: usize) -> Session {
    Session {
        turns: vec![Turn {
            new_tokens: t,
            max_tokens,
        }],
        cache_salt,
        tenant,
    }
}

fn conversation(
    rng: &mut ChaCha8Rng,
    spec: &WorkloadSpec,
    system: Vec<u32>,
    cache_salt: Option<String>,
    tenant: usize,
) -> Session {
    let mut turns = Vec::with_capacity(spec.turns);
    let mut first = system;
    first.extend(tokens(rng, spec.first_turn_tokens));
    turns.push(Turn {
        new_tokens: first,
        max_tokens: output_len(rng, spec),
    });
    for _ in 1..spec.turns.max(1) {
        turns.push(Turn {
            new_tokens: tokens(rng, spec.question_tokens),
            max_tokens: output_len(rng, spec),
        });
    }
    Session {
        turns,
        cache_salt,
        tenant,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generators_are_seeded_and_shaped() {
        for kind in WorkloadKind::ALL.into_iter().chain(WorkloadKind::DISAGREE) {
            let spec = WorkloadSpec::default_for(kind).quick();
            let a = generate(&spec, 7);
            let b = generate(&spec, 7);
            let c = generate(&spec, 8);
            assert_eq!(a.len(), spec.sessions, "{kind:?}");
            let first = |s: &[Session]| s[0].turns[0].new_tokens.clone();
            assert_eq!(first(&a), first(&b), "{kind:?} same seed");
            assert_ne!(first(&a), first(&c), "{kind:?} other seed");
        }
    }

    #[test]
    fn shared_prefix_requests_share_one_of_the_prefixes() {
        let spec = WorkloadSpec::default_for(WorkloadKind::SharedPrefix);
        let sessions = generate(&spec, 1);
        let mut prefixes: Vec<&[u32]> = sessions
            .iter()
            .map(|s| &s.turns[0].new_tokens[..spec.prefix_tokens])
            .collect();
        prefixes.sort();
        prefixes.dedup();
        assert!(prefixes.len() <= spec.prefixes && prefixes.len() > spec.prefixes / 2);
        assert_eq!(
            sessions[0].turns[0].new_tokens.len(),
            spec.prefix_tokens + spec.question_tokens
        );
    }

    /// The first `prefix_tokens` of each request, counted per distinct prefix, in order of
    /// first use.
    fn prefix_counts(sessions: &[Session], prefix_tokens: usize) -> Vec<(Vec<u32>, usize)> {
        let mut counts: Vec<(Vec<u32>, usize)> = Vec::new();
        for s in sessions {
            let p = &s.turns[0].new_tokens[..prefix_tokens];
            match counts.iter_mut().find(|(q, _)| q == p) {
                Some((_, n)) => *n += 1,
                None => counts.push((p.to_vec(), 1)),
            }
        }
        counts
    }

    #[test]
    fn one_hot_prefix_takes_most_requests() {
        let spec = WorkloadSpec::default_for(WorkloadKind::HotPrefix);
        let sessions = generate(&spec, 5);
        let counts = prefix_counts(&sessions, spec.prefix_tokens);
        let hot = counts.iter().map(|(_, n)| *n).max().unwrap_or(0);
        let share = hot as f64 / sessions.len() as f64;
        // 384 draws at 0.6: the share lies within 0.5..0.7 (five standard deviations).
        assert!((0.5..0.7).contains(&share), "{share}");
        assert!(counts.len() > spec.prefixes / 2, "{}", counts.len());
        assert!(counts.iter().filter(|(_, n)| *n == hot).count() == 1);
    }

    #[test]
    fn bursts_use_each_prefix_in_one_run_of_requests() {
        let spec = WorkloadSpec::default_for(WorkloadKind::Burst);
        let sessions = generate(&spec, 5);
        let counts = prefix_counts(&sessions, spec.prefix_tokens);
        assert_eq!(counts.len(), spec.prefixes);
        assert!(counts.iter().all(|(_, n)| *n == 12), "{counts:?}");
        // Consecutive: request i uses burst i / 12's prefix.
        for (i, s) in sessions.iter().enumerate() {
            assert_eq!(
                s.turns[0].new_tokens[..spec.prefix_tokens],
                counts[i / 12].0[..]
            );
        }
        assert_eq!(
            WorkloadKind::parse("burst"),
            Some(WorkloadKind::Burst),
            "selectable by name"
        );
    }

    #[test]
    fn long_short_requests_are_long_on_one_side_only() {
        let spec = WorkloadSpec::default_for(WorkloadKind::LongShort);
        let sessions = generate(&spec, 5);
        let (mut long_in, mut long_out) = (0, 0);
        for s in &sessions {
            let t = &s.turns[0];
            let question = t.new_tokens.len() - spec.prefix_tokens;
            if question == 6_144 && t.max_tokens == 64 {
                long_in += 1;
            } else if question == 384 && t.max_tokens == 1_024 {
                long_out += 1;
            } else {
                panic!("question {question}, output {}", t.max_tokens);
            }
        }
        // 384 fair coin flips: each side lies within 142..242 (five standard deviations).
        assert!((142..242).contains(&long_in), "{long_in}");
        assert_eq!(long_in + long_out, sessions.len());
        let counts = prefix_counts(&sessions, spec.prefix_tokens);
        assert_eq!(counts.len(), spec.prefixes);
        assert_eq!(
            WorkloadKind::parse("long-short"),
            Some(WorkloadKind::LongShort)
        );
    }

    #[test]
    fn output_lengths_come_from_the_range_when_one_is_set() {
        let fixed = WorkloadSpec::default_for(WorkloadKind::SharedPrefix).quick();
        let ranged = WorkloadSpec {
            output_tokens: 12,
            max_output_tokens: Some(4),
            ..fixed.clone()
        };
        let lens: Vec<u32> = generate(&ranged, 3)
            .iter()
            .flat_map(|s| s.turns.iter().map(|t| t.max_tokens))
            .collect();
        assert!(lens.iter().all(|n| (4..=12).contains(n)), "{lens:?}");
        assert!(lens.iter().any(|&n| n != lens[0]), "{lens:?}");
        let exact = WorkloadSpec {
            max_output_tokens: Some(fixed.output_tokens),
            ..fixed.clone()
        };
        let a = generate(&fixed, 3);
        let b = generate(&exact, 3);
        assert!(
            a.iter()
                .all(|s| s.turns[0].max_tokens == fixed.output_tokens)
        );
        assert_eq!(a[5].turns[0].new_tokens, b[5].turns[0].new_tokens);
    }

    #[test]
    fn multi_turn_conversations_have_all_turns() {
        let spec = WorkloadSpec::default_for(WorkloadKind::MultiTurn);
        let sessions = generate(&spec, 1);
        assert!(sessions.iter().all(|s| s.turns.len() == spec.turns));
        assert_eq!(
            sessions[0].turns[0].new_tokens.len(),
            spec.first_turn_tokens
        );
    }
}
