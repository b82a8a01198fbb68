//! Unit tests of the routing core: decisions, lifecycle, assignments, KV admission.

use super::super::choose::{EvictionRule, PredictedTtft, PredictedTtftConfig, Reason};
use super::super::request::PromptHashes;
use super::*;
use crate::routing::{DecodeSteps, FailureKind, Outcome, OutlierEvent};

fn req(tokens: &[u32]) -> RouteRequest<'_> {
    RouteRequest {
        tokens: Some(tokens),
        model: "m",
        lora: None,
        cache_salt: None,
        max_tokens: None,
    }
}

fn chain(tokens: &[u32], bs: usize) -> Vec<u64> {
    PromptHashes::new(tokens, "m", None, None)
        .chain(bs)
        .to_vec()
}

/// Two workers, the prompt (4,096 tokens) fully cached on `warm`.
fn setup() -> (RoutingCore, WorkerId, WorkerId, Vec<u32>) {
    setup_with(CoreConfig::default())
}

fn setup_with(cfg: CoreConfig) -> (RoutingCore, WorkerId, WorkerId, Vec<u32>) {
    let mut core = RoutingCore::new(cfg);
    let warm = core.snapshot("warm", 16, 1, &[], 0.0);
    let cold = core.snapshot("cold", 16, 1, &[], 0.0);
    let tokens: Vec<u32> = (0..4_096).collect();
    core.stored(warm, &chain(&tokens, 16), 0.0);
    core.load(warm, LoadSample::default(), 0.0);
    core.load(cold, LoadSample::default(), 0.0);
    (core, warm, cold, tokens)
}

#[test]
fn prefers_the_warm_worker_when_both_are_idle() {
    let (core, warm, cold, tokens) = setup();
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let (_, d) = core
        .decide(&mut p, &req(&tokens), &[warm, cold], 1.0)
        .expect("decision");
    assert_eq!(d.chosen, warm);
    assert_eq!(d.reason, Reason::LowestPredictedTtft);
    let c = d.chosen_candidate().expect("chosen");
    assert_eq!(
        (c.cached_blocks, c.cached_tokens, c.prompt_blocks),
        (256, 4_096, 256)
    );
    assert!(
        d.candidates
            .iter()
            .any(|r| r.candidate.worker == cold && r.candidate.cached_blocks == 0)
    );
}

#[test]
fn prefers_an_idle_cold_worker_over_a_warm_one_with_a_long_queue() {
    let (mut core, warm, cold, tokens) = setup();
    // 8 waiting requests on the warm one (~8k tokens of prefill ahead) vs 4k to recompute.
    core.load(
        warm,
        LoadSample {
            waiting: 8,
            running: 4,
            kv_usage: 0.5,
            ..LoadSample::default()
        },
        1.0,
    );
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let (_, d) = core
        .decide(&mut p, &req(&tokens), &[warm, cold], 1.0)
        .expect("decision");
    assert_eq!(
        d.chosen,
        cold,
        "{}",
        serde_json::to_string(&d).unwrap_or_default()
    );
}

#[test]
fn own_assignments_count_as_queue_before_reports_catch_up() {
    let (mut core, warm, cold, tokens) = setup();
    let other: Vec<u32> = (10_000..18_000).collect();
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    // Send three cold 8k prompts to `warm` (the router decides where, here by hand).
    let mut plan = core.plan(&req(&other), &[warm], 1.0);
    plan.context.candidates.truncate(1);
    let d = p.choose(&plan.context, 1.0).expect("decision");
    for _ in 0..3 {
        core.assign(&plan, &d, 1.0);
    }
    assert_eq!(
        core.assignments.inflight(warm).waiting_prefill_tokens,
        24_000
    );
    let (_, d) = core
        .decide(&mut p, &req(&tokens), &[warm, cold], 1.1)
        .expect("decision");
    assert_eq!(d.chosen, cold);
}

/// Sends an 8,000-token prompt to `cold` at 1.0 and a 2,000-token one at 1.5.
fn queue_two_prompts(core: &mut RoutingCore, cold: WorkerId) -> Vec<AssignmentId> {
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let first: Vec<u32> = (10_000..18_000).collect();
    let second: Vec<u32> = (20_000..22_000).collect();
    let mut ids = Vec::new();
    for (prompt, at) in [(&first, 1.0), (&second, 1.5)] {
        let mut plan = core.plan(&req(prompt), &[cold], at);
        plan.context.candidates.truncate(1);
        let d = p.choose(&plan.context, at).expect("decision");
        ids.push(core.assign(&plan, &d, at));
    }
    ids
}

/// The prefill tokens queued ahead on `cold` for `tokens` at `now`.
fn queue_tokens(
    core: &RoutingCore,
    tokens: &[u32],
    warm: WorkerId,
    cold: WorkerId,
    now: f64,
) -> f64 {
    core.plan(&req(tokens), &[warm, cold], now)
        .context
        .candidates
        .iter()
        .find(|c| c.worker == cold)
        .map(|c| c.queue_tokens)
        .expect("cold is a candidate")
}

#[test]
fn the_prompt_being_prefilled_leaves_the_queue_as_time_passes() {
    let (mut core, warm, cold, tokens) = setup();
    queue_two_prompts(&mut core, cold);
    let w = core.assignments.inflight(cold);
    assert_eq!(
        (w.waiting_prefill_tokens, w.head_prefill_tokens),
        (10_000, 8_000)
    );
    assert_eq!(
        w.head_since, 1.0,
        "the first prompt has been at the head since it came"
    );
    let rate = core.predictor.params(cold).0;
    let queue = |core: &RoutingCore, now: f64| queue_tokens(core, &tokens, warm, cold, now);
    assert_eq!(queue(&core, 1.0), 10_000.0);
    // Half the first prompt done after 4,000 / rate seconds at the head.
    let half = 1.0 + 4_000.0 / rate;
    assert!(
        (queue(&core, half) - 6_000.0).abs() < 1e-6,
        "{}",
        queue(&core, half)
    );
    // Only the head drains: long after, the second prompt is still ahead in full.
    assert_eq!(queue(&core, 1_000.0), 2_000.0);
    // The head's first token makes the second one the head, from then on.
    let id = core
        .assignments
        .iter()
        .find(|(_, a)| a.worker == cold && a.uncached_tokens == 8_000)
        .map(|(id, _)| id)
        .expect("first assignment");
    core.assignments
        .first_token(id, 3.0, None, 0.0)
        .expect("first token");
    let w = core.assignments.inflight(cold);
    assert_eq!(
        (
            w.waiting_prefill_tokens,
            w.head_prefill_tokens,
            w.head_since
        ),
        (2_000, 2_000, 3.0)
    );
    assert_eq!(queue(&core, 3.0), 2_000.0);
}

#[test]
fn the_model_learns_from_the_queue_before_the_heads_drain() {
    // The second prompt came 0.5 s after the first began: its queue counted 0.5 s of the
    // head's prefill as done, at the rate learned then. Its first token teaches the model
    // the whole head and the 0.5 s, not the drained queue.
    let (mut core, _, cold, _) = setup();
    let ids = queue_two_prompts(&mut core, cold);
    let rate = core.predictor.params(cold).0;
    let a = core.assignment(ids[1]).expect("second").clone();
    assert!((a.queue_drain_s - 0.5).abs() < 1e-9, "{}", a.queue_drain_s);
    assert!((a.undrained_queue_tokens - 8_000.0).abs() < 1e-6);
    // Nothing drains for the first (it heads an empty queue).
    let first = core.assignment(ids[0]).expect("first");
    assert_eq!(
        (first.queue_drain_s, first.undrained_queue_tokens),
        (0.0, 0.0)
    );
    let mut want = core.predictor.clone();
    core.first_token(ids[1], 4.0, None).expect("first token");
    want.observe(
        cold,
        FirstTokenSample {
            drain_s: 0.5,
            ..FirstTokenSample::line_only(8_000.0, 2_000.0, a.predicted_ttft, 2.5)
        },
    );
    assert_eq!(core.predictor.params(cold), want.params(cold));
    let mut drained = core.predictor.clone();
    drained.forget(cold);
    let queue = a.undrained_queue_tokens - a.queue_drain_s * rate;
    drained.observe(
        cold,
        FirstTokenSample::line_only(queue, 2_000.0, a.predicted_ttft, 2.5),
    );
    assert_ne!(core.predictor.params(cold), drained.params(cold));
}

#[test]
fn the_step_that_finishes_a_prompt_counts_for_the_next_one() {
    // The first token of an 8,000-token prompt that came after 9,000 tokens' worth of time
    // at the head: the last step computed 1,000 tokens of the 2,000-token one behind it.
    let (mut core, warm, cold, tokens) = setup();
    let ids = queue_two_prompts(&mut core, cold);
    let rate = core.predictor.params(cold).0;
    let done = 1.0 + 9_000.0 / rate;
    core.first_token(ids[0], done, None).expect("first token");
    let queue = |core: &RoutingCore, now: f64| queue_tokens(core, &tokens, warm, cold, now);
    // The model learned from that first token; the carry used the rate before it did.
    let q = queue(&core, done);
    assert!((q - 1_000.0).abs() < 1e-6, "{q}");
    assert!(
        queue(&core, done + 10.0) < 1e-6,
        "drained to nothing, never below"
    );
}

#[test]
fn stale_workers_are_neither_warm_nor_empty() {
    let (mut core, warm, cold, tokens) = setup();
    // warm last reported at 0, cold reports at 11: past stale_after_s (10) for warm.
    core.load(cold, LoadSample::default(), 11.0);
    let ctx = core.plan(&req(&tokens), &[warm, cold], 11.0).context;
    let w = &ctx.candidates[0];
    let c = &ctx.candidates[1];
    assert!(w.stale && !c.stale);
    assert_eq!(w.cached_tokens, 4_096, "the index still reports its blocks");
    assert!((w.expected_cached_tokens - 2_048.0).abs() < 1e-9);
    // Between a fresh warm prediction and a cold one.
    let fresh = core.predictor.predict(warm, 0.0, 0.0);
    assert!(w.predicted_ttft > fresh + 0.1 - 1e-9 && w.predicted_ttft < c.predicted_ttft);
    // Silence past stale_after_s makes a worker stale too.
    let ctx = core.plan(&req(&tokens), &[cold], 22.0).context;
    assert!(ctx.candidates[0].stale);
}

#[test]
fn a_closed_stream_is_no_candidate_until_a_new_snapshot() {
    let (mut core, warm, cold, tokens) = setup();
    core.stream_closed(warm, 1.0);
    let ctx = core.plan(&req(&tokens), &[warm, cold], 1.0).context;
    assert_eq!(ctx.candidates.len(), 1);
    assert_eq!(ctx.candidates[0].worker, cold);
    assert_eq!(core.blocks_of(warm), 256, "blocks kept for a reconnect");
    let again = core.snapshot("warm", 16, 2, &chain(&tokens, 16)[..10], 2.0);
    assert_eq!(again, warm);
    let ctx = core.plan(&req(&tokens), &[warm, cold], 2.0).context;
    assert_eq!(ctx.candidates.len(), 2);
    assert_eq!(
        ctx.candidates[0].cached_blocks, 10,
        "the snapshot replaced its blocks"
    );
}

#[test]
fn degraded_without_tokens() {
    let (mut core, warm, cold, _) = setup();
    core.load(
        warm,
        LoadSample {
            waiting: 3,
            running: 0,
            kv_usage: 0.1,
            ..LoadSample::default()
        },
        1.0,
    );
    let r = RouteRequest {
        tokens: None,
        model: "m",
        lora: None,
        cache_salt: None,
        max_tokens: None,
    };
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let (_, d) = core
        .decide(&mut p, &r, &[warm, cold], 1.0)
        .expect("decision");
    assert!(d.degraded);
    assert_eq!(d.reason, Reason::DegradedLoadOnly);
    assert_eq!(d.chosen, cold);
    assert!(d.candidates.iter().all(|c| c.candidate.cached_blocks == 0));
}

#[test]
fn mixed_block_sizes_and_unknown_or_removed_workers() {
    let (mut core, warm, cold, tokens) = setup();
    let big = core.snapshot("big", 32, 1, &[], 0.0);
    core.stored(big, &chain(&tokens[..1024], 32), 0.0);
    let gone = core.snapshot("gone", 16, 1, &[], 0.0);
    core.retire(gone);
    let ctx = core
        .plan(&req(&tokens), &[warm, big, WorkerId(77), gone, cold], 1.0)
        .context;
    let got: Vec<(u32, usize, usize)> = ctx
        .candidates
        .iter()
        .map(|c| (c.worker.0, c.cached_blocks, c.prompt_blocks))
        .collect();
    assert_eq!(
        got,
        vec![(warm.0, 256, 256), (big.0, 32, 128), (cold.0, 0, 256)]
    );
    // Scratch state is reset between calls.
    let ctx = core.plan(&req(&tokens[..16]), &[cold, big], 1.0).context;
    assert!(ctx.candidates.iter().all(|c| c.cached_blocks == 0));
}

#[test]
fn each_candidate_is_also_priced_in_whole_engine_steps_and_both_lines_learn() {
    let (mut core, _, cold, tokens) = setup();
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let budget = core.predictor.config().step_budget_tokens;
    assert_eq!(budget, 2_048.0);
    // A running step (chunks 0.4 s apart); the first request finds nothing queued: its own
    // 4,096 tokens. The second (another prompt) finds the first's 4,096 ahead, of which the
    // running step takes 2,048: 6,144 tokens left, three whole steps.
    core.step_observed(cold, 1.0);
    core.step_observed(cold, 1.4);
    let other: Vec<u32> = (100_000..104_096).collect();
    let mut ids = Vec::new();
    for (prompt, want) in [(&tokens, 4_096.0), (&other, 6_144.0)] {
        let (plan, d) = core
            .decide(&mut p, &req(prompt), &[cold], 1.5)
            .expect("decision");
        let c = d.chosen_candidate().expect("chosen");
        let steps = c.ttft_model.whole_steps.expect("priced in whole steps");
        assert_eq!(steps.tokens, want);
        // Nothing learned yet: the line predicts, the whole-steps line only shown.
        assert!(!c.ttft_model.used_whole_steps);
        assert!((c.predicted_ttft - c.ttft_model.line_s - c.step_s).abs() < 1e-9);
        let id = core.assign(&plan, &d, 1.5);
        assert_eq!(core.assignment(id).expect("live").ttft_model, c.ttft_model);
        ids.push((id, c.predicted_ttft));
    }
    let before = core.predictor.model(cold).map(|m| m.steps_line.clone());
    assert!(before.is_none(), "no sample yet");
    for (id, predicted) in ids {
        core.first_token(id, 1.5 + 2.0 * predicted, None);
    }
    let m = core.predictor.model(cold).expect("learned");
    assert_eq!(m.samples, 2);
    let prior = 1_000.0 / core.predictor.config().prior_rate;
    assert!(m.line.sec_per_ktok != prior && m.steps_line.sec_per_ktok != prior);
    // Off: no whole-steps price.
    let mut off = RoutingCore::new(CoreConfig {
        predictor: PredictorConfig {
            step_budget_tokens: 0.0,
            ..PredictorConfig::default()
        },
        ..CoreConfig::default()
    });
    let w = off.snapshot("w", 16, 1, &[], 0.0);
    off.load(w, LoadSample::default(), 0.0);
    let (_, d) = off
        .decide(&mut p, &req(&tokens), &[w], 1.5)
        .expect("decision");
    assert_eq!(
        d.chosen_candidate().expect("chosen").ttft_model.whole_steps,
        None
    );
}

#[test]
fn a_workers_own_step_budget_replaces_the_default_unless_the_line_is_off() {
    let (mut core, _, cold, tokens) = setup();
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let priced = |core: &RoutingCore, p: &mut PredictedTtft| {
        let (_, d) = core
            .decide(p, &req(&tokens[..1_000]), &[cold], 1.0)
            .expect("decision");
        let c = d.chosen_candidate().expect("chosen");
        c.ttft_model.whole_steps.map(|s| s.tokens)
    };
    // Nothing queued: the prompt's own tokens, whatever the budget.
    assert_eq!(priced(&core, &mut p), Some(1_000.0));
    // Behind a queue: whole steps of the worker's own budget, not the default 2,048.
    let other: Vec<u32> = (100_000..105_000).collect();
    let (plan, d) = core
        .decide(&mut p, &req(&other), &[cold], 1.0)
        .expect("decision");
    core.assign(&plan, &d, 1.0);
    assert_eq!(
        priced(&core, &mut p),
        Some(6_144.0),
        "5,000 + 1,000 in 2,048s"
    );
    core.set_step_budget(cold, Some(8_192.0));
    assert_eq!(priced(&core, &mut p), Some(8_192.0), "one 8,192-token step");
    core.set_step_budget(cold, Some(1_000.0));
    assert_eq!(priced(&core, &mut p), Some(6_000.0));
    core.set_step_budget(cold, Some(f64::NAN));
    assert_eq!(core.worker(cold).expect("slot").step_budget_tokens, None);
    // The configured budget at 0 turns the line off for every worker.
    let mut off = RoutingCore::new(CoreConfig {
        predictor: PredictorConfig {
            step_budget_tokens: 0.0,
            ..PredictorConfig::default()
        },
        ..CoreConfig::default()
    });
    let w = off.snapshot("w", 16, 1, &[], 0.0);
    off.load(w, LoadSample::default(), 0.0);
    off.set_step_budget(w, Some(8_192.0));
    let (_, d) = off
        .decide(&mut p, &req(&tokens), &[w], 1.0)
        .expect("decision");
    assert_eq!(
        d.chosen_candidate().expect("chosen").ttft_model.whole_steps,
        None
    );
}

#[test]
fn the_running_steps_remainder_is_predicted_and_taken_off_what_is_learned() {
    let (mut core, _, cold, tokens) = setup();
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let share = core.config().steps.share;
    assert!(share > 0.0 && share <= 1.0);
    let base = core.predictor.predict(cold, 0.0, 4_096.0);
    // Chunks at 1.0 s and 1.4 s: a 0.4 s step; at 1.5 s, 0.3 s of the next one is left.
    core.step_observed(cold, 1.0);
    core.step_observed(cold, 1.4);
    let (plan, d) = core
        .decide(&mut p, &req(&tokens), &[cold], 1.5)
        .expect("decision");
    let c = d.chosen_candidate().expect("chosen");
    assert!((c.step_s - share * 0.3).abs() < 1e-9, "{}", c.step_s);
    assert!((c.predicted_ttft - base - c.step_s).abs() < 1e-9);
    let id = core.assign(&plan, &d, 1.5);
    assert!((core.assignment(id).expect("live").step_s - c.step_s).abs() < 1e-12);
    // The first token comes the predicted time later: the line learns it less the step.
    core.first_token(id, 1.5 + c.predicted_ttft, None);
    let learned = core.predictor.predict(cold, 0.0, 4_096.0);
    assert!((learned - base).abs() < 1e-3, "{learned} vs {base}");
    // Overdue, nothing is left; clocks kept by a data path replace the core's.
    let (_, d) = core
        .decide(&mut p, &req(&tokens), &[cold], 2.0)
        .expect("decision");
    assert_eq!(d.chosen_candidate().expect("chosen").step_s, 0.0);
    let mut kept = StepClocks::default();
    kept.observe(&core.config().steps, cold, 1.8);
    kept.observe(&core.config().steps, cold, 1.9);
    core.set_step_clocks(&kept);
    let (_, d) = core
        .decide(&mut p, &req(&tokens), &[cold], 1.95)
        .expect("decision");
    let step_s = d.chosen_candidate().expect("chosen").step_s;
    assert!((step_s - share * 0.05).abs() < 1e-9, "{step_s}");
    // A share of 0 counts none.
    let mut off = RoutingCore::new(CoreConfig {
        steps: StepConfig {
            share: 0.0,
            ..StepConfig::default()
        },
        ..CoreConfig::default()
    });
    let w = off.snapshot("w", 16, 1, &[], 0.0);
    off.load(w, LoadSample::default(), 0.0);
    off.step_observed(w, 1.0);
    off.step_observed(w, 1.4);
    let (_, d) = off
        .decide(&mut p, &req(&tokens), &[w], 1.5)
        .expect("decision");
    assert_eq!(d.chosen_candidate().expect("chosen").step_s, 0.0);
}

/// `setup` with `decode_steps`, and `w` having run a 0.1 s step, then a 0.4 s one (it
/// carried a prefill chunk) that ended at 1.5 s.
fn setup_steps(decode_steps: DecodeSteps) -> (RoutingCore, WorkerId, Vec<u32>) {
    setup_steps_with(decode_steps, None)
}

/// [`setup_steps`], with a prompt sent to the worker at `sent` (between the chunks at 1.1
/// and 1.5), still awaiting its first token.
fn setup_steps_sent_at(decode_steps: DecodeSteps, sent: f64) -> (RoutingCore, WorkerId, Vec<u32>) {
    setup_steps_with(decode_steps, Some(sent))
}

fn setup_steps_with(
    decode_steps: DecodeSteps,
    sent: Option<f64>,
) -> (RoutingCore, WorkerId, Vec<u32>) {
    let (mut core, _, cold, tokens) = setup_with(CoreConfig {
        steps: StepConfig {
            decode_steps,
            ..StepConfig::default()
        },
        ..CoreConfig::default()
    });
    for t in [1.0, 1.1] {
        core.step_observed(cold, t);
    }
    if let Some(sent) = sent {
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        let (plan, d) = core
            .decide(&mut p, &req(&tokens), &[cold], sent)
            .expect("decision");
        core.assign(&plan, &d, sent);
    }
    core.step_observed(cold, 1.5);
    (core, cold, tokens)
}

#[test]
fn with_no_prompt_awaiting_a_first_token_the_running_step_is_a_decode_step() {
    let (mut core, cold, tokens) = setup_steps(DecodeSteps::On);
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let share = core.config().steps.share;
    assert_eq!(
        StepConfig::default().decode_steps,
        DecodeSteps::Published,
        "in the published prediction by default"
    );
    // Nothing awaits a first token there: the running step is taken as 0.1 s long.
    let (plan, d) = core
        .decide(&mut p, &req(&tokens), &[cold], 1.55)
        .expect("decision");
    let c = d.chosen_candidate().expect("chosen");
    assert!((c.step_s - share * 0.05).abs() < 1e-9, "{}", c.step_s);
    // A prompt sent after the running step began (its last chunks came at 1.5) is not in it:
    // still a decode step.
    core.assign(&plan, &d, 1.55);
    let (_, d) = core
        .decide(&mut p, &req(&tokens), &[cold], 1.56)
        .expect("decision");
    let c = d.chosen_candidate().expect("chosen");
    assert!((c.step_s - share * 0.04).abs() < 1e-9, "{}", c.step_s);
    // One sent before it began may be prefilled in it: the last step's length counts.
    let (core, cold, _) = setup_steps_sent_at(DecodeSteps::On, 1.2);
    let (_, d) = core
        .decide(&mut p, &req(&tokens), &[cold], 1.55)
        .expect("decision");
    let c = d.chosen_candidate().expect("chosen");
    assert!((c.step_s - share * 0.35).abs() < 1e-9, "{}", c.step_s);
    // Off: the last step's length.
    let (off, w, _) = setup_steps(DecodeSteps::Off);
    let (_, d) = off
        .decide(&mut p, &req(&tokens), &[w], 1.55)
        .expect("decision");
    let c = d.chosen_candidate().expect("chosen");
    assert!((c.step_s - share * 0.35).abs() < 1e-9, "{}", c.step_s);
    assert_eq!(c.published_step_s, None);
    assert_eq!(
        d.predicted_ttft(),
        c.predicted_ttft,
        "published as compared"
    );
}

#[test]
fn published_decode_steps_change_the_published_prediction_alone() {
    let (mut core, cold, tokens) = setup_steps(StepConfig::default().decode_steps);
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let share = core.config().steps.share;
    let (plan, d) = core
        .decide(&mut p, &req(&tokens), &[cold], 1.55)
        .expect("decision");
    let c = d.chosen_candidate().expect("chosen").clone();
    // The choice counts the last step (0.4 s, 0.05 s into it); the published prediction
    // the shortest recent one (0.1 s).
    assert!((c.step_s - share * 0.35).abs() < 1e-9, "{}", c.step_s);
    let published = c.published_step_s.expect("decode-only step");
    assert!((published - share * 0.05).abs() < 1e-9, "{published}");
    let want = c.predicted_ttft - c.step_s + published;
    assert!((d.predicted_ttft() - want).abs() < 1e-12);
    assert!(d.predicted_ttft() < c.predicted_ttft);
    // The assignment keeps both: the fit learns from the compared one, the bound is the
    // published one's.
    let id = core.assign(&plan, &d, 1.55);
    let a = core.assignment(id).expect("assigned").clone();
    assert_eq!(a.predicted_ttft, c.predicted_ttft);
    assert_eq!(a.published_ttft, d.predicted_ttft());
    let bound = core.ttft_bound(a.published_ttft);
    assert!(a.ttft_bound == bound || (a.ttft_bound.is_nan() && bound.is_nan()));
    // A prompt now awaits its first token there, sent after the running step began: the
    // published prediction still counts a decode step.
    let (_, d) = core
        .decide(&mut p, &req(&tokens), &[cold], 1.55)
        .expect("decision");
    let c = d.chosen_candidate().expect("chosen");
    assert!(c.published_step_s.is_some());
    // One sent at the very instant of the last chunks (1.5) is not in the step either: the
    // engine had begun it when the chunks came out (in simulation a closed-loop client
    // sends its next request at that instant, after the step-end handling began the next).
    let (mut at_end, w, _) = setup_steps(StepConfig::default().decode_steps);
    let (plan, d) = at_end
        .decide(&mut p, &req(&tokens), &[w], 1.5)
        .expect("decision");
    at_end.assign(&plan, &d, 1.5);
    let (_, d) = at_end
        .decide(&mut p, &req(&tokens), &[w], 1.5)
        .expect("decision");
    let c = d.chosen_candidate().expect("chosen");
    assert!(c.published_step_s.is_some());
    // One sent before the running step began: both count the last step.
    let (core, cold, _) = setup_steps_sent_at(StepConfig::default().decode_steps, 1.2);
    let (_, d) = core
        .decide(&mut p, &req(&tokens), &[cold], 1.55)
        .expect("decision");
    let c = d.chosen_candidate().expect("chosen");
    assert_eq!(c.published_step_s, None);
    assert_eq!(d.predicted_ttft(), c.predicted_ttft);
}

#[test]
fn first_token_teaches_the_model_and_release_is_once() {
    let (mut core, warm, cold, tokens) = setup();
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let (plan, d) = core
        .decide(&mut p, &req(&tokens), &[cold], 0.0)
        .expect("decision");
    let id = core.assign(&plan, &d, 0.0);
    let ft = core.first_token(id, 2.0, None).expect("first token");
    assert!((ft.observed_ttft - 2.0).abs() < 1e-12);
    assert_eq!(core.predictor.error().count, 1);
    assert!(
        core.predictor.params(cold).0 < 4_800.0,
        "slower than predicted -> lower rate"
    );
    assert!(core.first_token(id, 2.5, None).is_none());
    assert!(core.finish(id).is_some());
    assert!(core.abort(id).is_none());
    assert!(core.expire(1e9, 1.0).is_empty());
    let id2 = core.assign(&plan, &d, 3.0);
    assert_eq!(core.retire(cold).map(|r| r.released.len()), Some(1));
    assert!(core.finish(id2).is_none());
    let _ = warm;
}

#[test]
fn a_report_counts_only_waiting_requests_the_router_did_not_send() {
    // The report lags the router's own count: a short prompt the router sent shows as
    // waiting in a report applied before its first token. Counted at the mean prompt's size
    // after that first token, it was a phantom queue the fit then learned from.
    let (mut core, warm, cold, tokens) = setup();
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let (plan, d) = core
        .decide(&mut p, &req(&tokens[..160]), &[cold], 0.0)
        .expect("decision");
    let id = core.assign(&plan, &d, 0.0);
    let waiting = |n: u32| LoadSample {
        waiting: n,
        running: 1,
        ..LoadSample::default()
    };
    core.load(cold, waiting(1), 0.01);
    core.first_token(id, 0.05, None).expect("first token");
    let queue = |core: &RoutingCore| {
        core.plan(&req(&tokens), &[cold], 0.06).context.candidates[0].queue_tokens
    };
    assert_eq!(queue(&core), 0.0, "the one waiting was the router's own");
    // Two more waiting than the router sent: those are someone else's, at the mean size.
    let (plan, d) = core
        .decide(&mut p, &req(&tokens[..160]), &[cold], 0.1)
        .expect("decision");
    let id = core.assign(&plan, &d, 0.1);
    core.load(cold, waiting(3), 0.11);
    let mean = core.mean_uncached;
    let own = core.assignments.inflight(cold).waiting_prefill_tokens as f64;
    let q = queue(&core);
    assert!(
        q >= 2.0 * mean && q <= own + 2.0 * mean + 1e-9,
        "queue {q}, own {own}, mean {mean}"
    );
    core.first_token(id, 0.15, None).expect("first token");
    let q = queue(&core);
    assert!((q - 2.0 * mean).abs() < 1e-9, "still two unknown: {q}");
    let _ = warm;
}

#[test]
fn own_placements_count_as_cached_until_first_token_plus_grace() {
    let mut core = RoutingCore::new(CoreConfig::default());
    let a = core.snapshot("a", 16, 1, &[], 0.0);
    let b = core.snapshot("b", 16, 1, &[], 0.0);
    let tokens: Vec<u32> = (0..4_096).collect();
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    // Nothing reported anywhere; send the prompt to `b` (the only one allowed).
    let (plan, d) = core
        .decide(&mut p, &req(&tokens), &[b], 0.0)
        .expect("decision");
    let id = core.assign(&plan, &d, 0.0);
    let ctx = core.plan(&req(&tokens), &[a, b], 0.1).context;
    let (ca, cb) = (&ctx.candidates[0], &ctx.candidates[1]);
    assert_eq!((ca.pending_blocks, cb.pending_blocks), (0, 256));
    assert_eq!(cb.cached_blocks, 0, "the index itself is untouched");
    assert!((cb.expected_cached_tokens - 4_096.0).abs() < 1e-9);
    // A longer prompt sharing the prefix matches the placed blocks only.
    let longer: Vec<u32> = (0..4_096).chain(90_000..90_512).collect();
    let ctx = core.plan(&req(&longer), &[b], 0.1).context;
    assert_eq!(ctx.candidates[0].pending_blocks, 256);
    // Still there after the first token: within the grace period, and then while the
    // request decodes (its blocks are referenced); gone once it ended and grace passed.
    core.first_token(id, 2.0, None);
    let ctx = core.plan(&req(&tokens), &[b], 2.9).context;
    assert_eq!(ctx.candidates[0].pending_blocks, 256);
    let ctx = core.plan(&req(&tokens), &[b], 3.1).context;
    assert_eq!(ctx.candidates[0].pending_blocks, 256);
    assert_eq!(ctx.candidates[0].kv_need_tokens, 16, "only one new block");
    core.finish(id);
    let ctx = core.plan(&req(&tokens), &[b], 3.1).context;
    assert_eq!(ctx.candidates[0].pending_blocks, 0);
    assert_eq!(ctx.candidates[0].kv_need_tokens, 4_096 + 16);
    // An aborted placement is forgotten at once.
    let (plan, d) = core
        .decide(&mut p, &req(&tokens), &[a], 4.0)
        .expect("decision");
    let id = core.assign(&plan, &d, 4.0);
    assert_eq!(
        core.plan(&req(&tokens), &[a], 4.0).context.candidates[0].pending_blocks,
        256
    );
    core.abort(id);
    assert_eq!(
        core.plan(&req(&tokens), &[a], 4.0).context.candidates[0].pending_blocks,
        0
    );
}

#[test]
fn a_saturated_worker_learns_an_admission_wait_shown_in_the_prediction() {
    let (mut core, warm, cold, tokens) = setup();
    let full = LoadSample {
        waiting: 2,
        running: 20,
        kv_usage: 0.97,
        ..LoadSample::default()
    };
    core.load(warm, full, 0.0);
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let rls_before = core.predictor.params(warm);
    // Requests sent to the full worker wait ~1.5 s for KV beyond the prefill model.
    for i in 0..40 {
        let now = f64::from(i) * 10.0;
        core.load(warm, full, now);
        let mut plan = core.plan(&req(&tokens), &[warm], now);
        plan.context.candidates.truncate(1);
        let d = p.choose(&plan.context, now).expect("decision");
        let c = d.chosen_candidate().expect("chosen");
        let base = c.predicted_ttft - c.admission_wait;
        let id = core.assign(&plan, &d, now);
        core.first_token(id, now + base + 1.5, None);
        core.finish(id);
    }
    assert_eq!(
        core.predictor.params(warm),
        rls_before,
        "prefill model untouched"
    );
    core.load(warm, full, 500.0);
    core.load(cold, LoadSample::default(), 500.0);
    let ctx = core.plan(&req(&tokens), &[warm, cold], 500.0).context;
    let (w, c) = (&ctx.candidates[0], &ctx.candidates[1]);
    // Queue of 2 reported + this request: 3 x ~0.5 s.
    assert!(
        (w.admission_wait - 1.5).abs() < 0.05,
        "{}",
        w.admission_wait
    );
    assert_eq!(c.admission_wait, 0.0);
    let base = core.predictor.predict(warm, w.queue_tokens, 0.0);
    assert!((w.predicted_ttft - base - w.admission_wait).abs() < 1e-9);
    // The cold worker (4k tokens to recompute, ~0.9 s) now beats waiting for KV. (A fresh
    // policy: the one above saw this prompt in all its 40 requests, a hot prefix it would
    // copy anyway; see `hot_prefix_window`.)
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let (_, d) = core
        .decide(&mut p, &req(&tokens), &[warm, cold], 500.0)
        .expect("decision");
    assert_eq!(d.chosen, cold);
    // Once the worker reports free KV the wait is gone and its cache wins again.
    core.load(warm, LoadSample::default(), 501.0);
    core.load(cold, LoadSample::default(), 501.0);
    let (_, d) = core
        .decide(&mut p, &req(&tokens), &[warm, cold], 501.0)
        .expect("decision");
    assert_eq!(d.chosen, warm);
    assert_eq!(d.chosen_candidate().map(|c| c.admission_wait), Some(0.0));
}

/// A worker of 10,000 KV tokens decoding four requests of 2,000 prompt tokens and 100 output
/// tokens (first tokens at 0.5, 1.5, 2.5 and 3.5 s), and its report at `usage`.
fn fill_four(
    core: &mut RoutingCore,
    p: &mut PredictedTtft,
    full: WorkerId,
) -> (Vec<AssignmentId>, fn(f32) -> LoadSample) {
    let mut ids = Vec::new();
    for i in 0..4u32 {
        let t: Vec<u32> = (i * 10_000..i * 10_000 + 2_000).collect();
        let r = RouteRequest {
            max_tokens: Some(100),
            ..req(&t)
        };
        let (plan, d) = core.decide(p, &r, &[full], 0.0).expect("decision");
        let id = core.assign(&plan, &d, 0.0);
        core.first_token(id, 0.5 + f64::from(i), None);
        ids.push(id);
    }
    let report = |usage: f32| LoadSample {
        waiting: 0,
        running: 4,
        kv_usage: usage,
        kv_capacity_tokens: 10_000,
    };
    (ids, report)
}

#[test]
fn a_full_worker_predicts_a_wait_until_its_requests_free_enough_kv() {
    let mut core = RoutingCore::new(CoreConfig::default());
    let full = core.snapshot("full", 16, 1, &[], 0.0);
    let roomy = core.snapshot("roomy", 16, 1, &[], 0.0);
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let capacity = 10_000;
    let (ids, report) = fill_four(&mut core, &mut p, full);
    core.load(full, report(0.85), 5.0);
    core.load(
        roomy,
        LoadSample {
            kv_capacity_tokens: capacity,
            ..LoadSample::default()
        },
        5.0,
    );
    // 8,500 in use + 3,016 needed > 10,000: the first request to finish (first token at
    // 0.5, 100 tokens at the 0.07 s prior) frees 2,116 tokens at 7.5 s.
    let prompt: Vec<u32> = (900_000..903_000).collect();
    let ctx = core.plan(&req(&prompt), &[full, roomy], 5.0).context;
    let (f, r) = (&ctx.candidates[0], &ctx.candidates[1]);
    assert_eq!(f.kv_need_tokens, 3_016);
    assert!(
        (f.admission_wait - 2.5).abs() < 1e-9,
        "{}",
        f.admission_wait
    );
    assert_eq!(r.admission_wait, 0.0);
    let d = p.choose(&ctx, 5.0).expect("decision");
    assert_eq!(d.chosen, roomy);
    // With room to spare there is no wait.
    core.load(full, report(0.5), 5.0);
    let ctx = core.plan(&req(&prompt), &[full], 5.0).context;
    assert_eq!(ctx.candidates[0].admission_wait, 0.0);
    // A request that ended since the report gave its KV back, though the report still
    // counts it: 8,500 - 2,116 + 3,016 fits.
    core.load(full, report(0.85), 5.0);
    assert!(core.plan(&req(&prompt), &[full], 5.0).context.candidates[0].admission_wait > 0.0);
    core.finish(ids[1]);
    let ctx = core.plan(&req(&prompt), &[full], 5.1).context;
    assert_eq!(ctx.candidates[0].admission_wait, 0.0);
    // The next report includes the release itself.
    core.load(full, report(0.85), 5.2);
    assert!(core.plan(&req(&prompt), &[full], 5.2).context.candidates[0].admission_wait > 0.0);
    // Finishing teaches the decode speed: 100 tokens in 3 s.
    core.finish_observed(ids[0], 3.5, 100);
    let itl = core.predictor.itl(full);
    assert!(
        itl < 0.07 && itl > 3.0 / 99.0,
        "moves toward 3 s / 99: {itl}"
    );
    // Unknown capacity: the model is off.
    core.load(
        full,
        LoadSample {
            kv_capacity_tokens: 0,
            ..report(0.99)
        },
        6.0,
    );
    let ctx = core.plan(&req(&prompt), &[full], 6.0).context;
    assert_eq!(ctx.candidates[0].admission_wait, 0.0);
}

#[test]
fn the_wait_for_kv_overlaps_the_prefill_of_the_queue_ahead() {
    // The full worker above, with a 1,000-token request sent after its report and not yet
    // started: 8,500 + 1,016 + 3,016 needs two requests to finish (at 7.5 and 8.5 s), so
    // KV is there 3.49 s after 5.01. The queued request prefills meanwhile: the request
    // starts at the later of the two, and the wait beyond the queue's prefill is what adds.
    let mut core = RoutingCore::new(CoreConfig::default());
    let full = core.snapshot("full", 16, 1, &[], 0.0);
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let (_, report) = fill_four(&mut core, &mut p, full);
    core.load(full, report(0.85), 5.0);
    let queued: Vec<u32> = (700_000..701_000).collect();
    let (plan, d) = core
        .decide(&mut p, &req(&queued), &[full], 5.01)
        .expect("decision");
    core.assign(&plan, &d, 5.01);
    let prompt: Vec<u32> = (900_000..903_000).collect();
    let ctx = core.plan(&req(&prompt), &[full], 5.01).context;
    let c = &ctx.candidates[0];
    assert_eq!(c.kv_need_tokens, 3_016);
    let queue_s = c.queue_tokens / c.pooled_rate;
    assert!(queue_s > 0.1, "the queue takes time: {queue_s}");
    assert!(
        (c.admission_wait + queue_s - 3.49).abs() < 1e-6,
        "KV frees 3.49 s on; the queue's {queue_s} s are not counted twice: {}",
        c.admission_wait
    );
    let base = (c.queue_tokens + 3_000.0) / c.pooled_rate + c.overhead;
    assert!((c.predicted_ttft - base - c.admission_wait).abs() < 1e-9);
}

#[test]
fn requests_sent_after_a_load_report_count_their_kv_until_the_next_one() {
    // A worker of 10,000 KV tokens reports 6,000 in use. A request sent after that report
    // holds its KV once admitted, first token or not, until a report includes it; and when
    // it ends before that report, its KV was never in the reported usage to take off.
    let mut core = RoutingCore::new(CoreConfig::default());
    let w = core.snapshot("w", 16, 1, &[], 0.0);
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    // A request decoding since before the report, so that waiting for KV has an end.
    let old: Vec<u32> = (500_000..502_000).collect();
    let r = RouteRequest {
        max_tokens: Some(100),
        ..req(&old)
    };
    let (plan, d) = core.decide(&mut p, &r, &[w], 0.0).expect("decision");
    let first = core.assign(&plan, &d, 0.0);
    core.first_token(first, 0.5, None);
    core.load(
        w,
        LoadSample {
            waiting: 0,
            running: 1,
            kv_usage: 0.6,
            kv_capacity_tokens: 10_000,
        },
        5.0,
    );
    let wait = |core: &RoutingCore, tokens: usize, now: f64| {
        let prompt: Vec<u32> = (900_000..900_000 + tokens as u32).collect();
        core.plan(&req(&prompt), &[w], now).context.candidates[0].admission_wait
    };
    // 6,000 + 3,016 fits.
    assert_eq!(wait(&core, 3_000, 5.0), 0.0);
    // A request of 1,016 KV tokens sent after the report: 6,000 + 1,016 + 3,016 does not.
    let a: Vec<u32> = (700_000..701_000).collect();
    let r = RouteRequest {
        max_tokens: Some(100),
        ..req(&a)
    };
    let (plan, d) = core.decide(&mut p, &r, &[w], 5.05).expect("decision");
    let sent = core.assign(&plan, &d, 5.05);
    assert!(wait(&core, 3_000, 5.06) > 0.0);
    // Its first token does not give its KV back (the rule before forgot it here).
    core.first_token(sent, 5.1, None);
    assert!(wait(&core, 3_000, 5.11) > 0.0);
    // It ends before the next report: the reported 6,000 stay, as nothing in them ended
    // (the rule before took its 1,116 tokens off them, and 6,000 - 1,116 + 4,016 fit).
    core.finish(sent);
    assert_eq!(wait(&core, 3_000, 5.2), 0.0);
    assert!(wait(&core, 4_000, 5.2) > 0.0);
    // The request sent before the report ends: its KV comes off the reported usage.
    core.finish(first);
    assert_eq!(wait(&core, 4_000, 5.3), 0.0);
}

#[test]
fn a_burst_with_a_new_prefix_stays_on_one_worker_before_reports() {
    let mut core = RoutingCore::new(CoreConfig::default());
    let ws: Vec<WorkerId> = (0..3)
        .map(|i| core.snapshot(&format!("w{i}"), 16, 1, &[], 0.0))
        .collect();
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 7);
    let mut chosen = std::collections::HashSet::new();
    for q in 0..3u32 {
        let tokens: Vec<u32> = (0..2_048)
            .chain(50_000 + q * 256..50_256 + q * 256)
            .collect();
        let (plan, d) = core
            .decide(&mut p, &req(&tokens), &ws, 0.01 * f64::from(q))
            .expect("decision");
        core.assign(&plan, &d, 0.01 * f64::from(q));
        chosen.insert(d.chosen);
    }
    assert_eq!(chosen.len(), 1, "the burst was spread: {chosen:?}");
    // Without the overlay the same burst spreads (each looks like an idle cold worker).
    let mut core = RoutingCore::new(CoreConfig {
        pending_grace_s: 0.0,
        ..CoreConfig::default()
    });
    let ws: Vec<WorkerId> = (0..3)
        .map(|i| core.snapshot(&format!("w{i}"), 16, 1, &[], 0.0))
        .collect();
    let mut chosen = std::collections::HashSet::new();
    for q in 0..3u32 {
        let tokens: Vec<u32> = (0..2_048)
            .chain(50_000 + q * 256..50_256 + q * 256)
            .collect();
        let (plan, d) = core
            .decide(&mut p, &req(&tokens), &ws, 0.0)
            .expect("decision");
        assert_eq!(
            core.plan(&req(&tokens), &ws, 0.0)
                .context
                .candidates
                .iter()
                .map(|c| c.pending_blocks)
                .sum::<usize>(),
            0
        );
        core.assign(&plan, &d, 0.0);
        chosen.insert(d.chosen);
    }
    assert!(chosen.len() > 1, "{chosen:?}");
}

/// A core whose workers keep at most 100 blocks until they report a capacity.
fn capped() -> RoutingCore {
    RoutingCore::new(CoreConfig {
        block_caps: BlockCaps {
            slack: 2.0,
            unknown: 100,
            max: 1_000,
            total: 250,
        },
        ..CoreConfig::default()
    })
}

fn capacity(blocks: u64) -> LoadSample {
    LoadSample {
        kv_capacity_tokens: blocks * 16,
        ..LoadSample::default()
    }
}

#[test]
fn stores_past_the_block_cap_are_refused_and_marked() {
    let mut core = capped();
    let w = core.snapshot("w", 16, 1, &(0..150).collect::<Vec<u64>>(), 0.0);
    assert_eq!(core.blocks_of(w), 100, "the snapshot stops at the cap");
    let slot = core.worker(w).expect("slot");
    assert!(slot.truncated);
    assert_eq!(slot.blocks_dropped, 50);
    // Below the cap, re-stores of held blocks take no room.
    core.removed(w, &[99], 0.5);
    let s = core.stored(w, &(95..101).collect::<Vec<u64>>(), 0.5);
    assert_eq!(
        (s.added, s.dropped),
        (1, 1),
        "95..99 held, 99 back in, 100 over"
    );
    // At the cap every store is refused unread: re-stores of held blocks (90..100) count.
    let s = core.stored(w, &(90..120).collect::<Vec<u64>>(), 1.0);
    assert_eq!((s.added, s.dropped), (0, 30));
    core.removed(w, &[0, 1], 1.0);
    let s = core.stored(w, &[500, 501, 502], 1.0);
    assert_eq!((s.added, s.dropped), (2, 1));
    assert_eq!(core.blocks_of(w), 100);
    // A fresh snapshot that fits clears the mark.
    core.snapshot("w", 16, 1, &[1, 2, 3], 2.0);
    assert!(!core.worker(w).expect("slot").truncated);
    assert_eq!(core.blocks_of(w), 3);
}

#[test]
fn a_reported_capacity_moves_the_cap_and_asks_for_a_resync_when_needed() {
    let mut core = capped();
    let w = core.snapshot("w", 16, 1, &(0..150).collect::<Vec<u64>>(), 0.0);
    // 300 blocks of KV: cap 600; the 50 refused blocks can be had now.
    assert_eq!(
        core.load(w, capacity(300), 1.0),
        Some(CapResync::Raised { cap: 600 })
    );
    assert_eq!(core.block_cap(w), 600);
    assert_eq!(core.load(w, capacity(300), 2.0), None, "once per change");
    core.snapshot("w", 16, 1, &(0..150).collect::<Vec<u64>>(), 3.0);
    assert_eq!(core.blocks_of(w), 150);
    // An unknown capacity keeps the last one; a claimed huge one stops at the max.
    assert_eq!(core.load(w, LoadSample::default(), 4.0), None);
    assert_eq!(core.block_cap(w), 600);
    assert_eq!(core.load(w, capacity(u64::MAX / 32), 5.0), None);
    assert_eq!(core.block_cap(w), 1_000);
    // A capacity below what the index holds: a capped snapshot replaces it.
    assert_eq!(
        core.load(w, capacity(50), 6.0),
        Some(CapResync::Lowered { cap: 100 })
    );
    core.snapshot("w", 16, 1, &(0..150).collect::<Vec<u64>>(), 7.0);
    assert_eq!(core.blocks_of(w), 100);
}

#[test]
fn the_index_as_a_whole_stops_at_its_total() {
    let mut core = capped();
    let a = core.snapshot("a", 16, 1, &(0..100).collect::<Vec<u64>>(), 0.0);
    let b = core.snapshot("b", 16, 1, &(0..100).collect::<Vec<u64>>(), 0.0);
    let c = core.snapshot("c", 16, 1, &[], 0.0);
    let s = core.stored(c, &(1_000..1_100).collect::<Vec<u64>>(), 1.0);
    assert_eq!((s.added, s.dropped, s.index_full), (50, 50, true));
    assert_eq!(core.index_stats().pairs, 250);
    assert!(core.worker(c).expect("slot").truncated);
    // Room freed by one worker is room for the others.
    core.removed(a, &(0..10).collect::<Vec<u64>>(), 2.0);
    let s = core.stored(c, &[2_000], 2.0);
    assert_eq!((s.added, s.dropped), (1, 0));
    assert_eq!(core.blocks_of(b), 100);
}

#[test]
fn the_pending_overlay_stops_at_its_cap() {
    let mut core = RoutingCore::new(CoreConfig {
        pending_max_blocks: 200,
        ..CoreConfig::default()
    });
    let w = core.snapshot("w", 16, 1, &[], 0.0);
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 7);
    let mut ids = Vec::new();
    for q in 0..3u32 {
        // 144 blocks each: the first fits, the others would pass 200.
        let tokens: Vec<u32> = (q * 10_000..q * 10_000 + 2_304).collect();
        let (plan, d) = core
            .decide(&mut p, &req(&tokens), &[w], 0.0)
            .expect("decision");
        ids.push(core.assign(&plan, &d, 0.0));
        assert_eq!(core.pending.blocks(), 144);
    }
    assert_eq!(
        core.outstanding(),
        3,
        "the requests are placed all the same"
    );
    for id in ids {
        core.abort(id);
    }
    assert_eq!(core.pending.blocks(), 0);
}

fn fail(
    core: &mut RoutingCore,
    w: WorkerId,
    kind: FailureKind,
    n: usize,
    now: f64,
) -> OutlierEvent {
    let mut last = OutlierEvent::None;
    for _ in 0..n {
        last = core.outcome(w, Outcome::Failure(kind), now);
    }
    last
}

#[test]
fn a_failing_worker_is_ejected_then_readmitted_and_plan_says_why() {
    let (mut core, warm, cold, tokens) = setup();
    let n = core.config().outlier.consecutive_failures as usize;
    assert_eq!(
        fail(&mut core, warm, FailureKind::Http5xx, n - 1, 1.0),
        OutlierEvent::None
    );
    let OutlierEvent::Ejected(e) = fail(&mut core, warm, FailureKind::Http5xx, 1, 1.0) else {
        panic!("the n-th failure in a row ejects");
    };
    assert_eq!((e.reason, e.ejections), (FailureKind::Http5xx, 1));
    assert_eq!(core.ejected_workers(2.0), 1);
    let plan = core.plan(&req(&tokens), &[warm, cold], 2.0);
    assert_eq!(plan.context.candidates.len(), 1);
    assert_eq!(
        plan.context.candidates[0].worker, cold,
        "the warm one is out"
    );
    assert_eq!(plan.ejected.len(), 1);
    let out = plan.ejected[0];
    assert_eq!(
        (out.worker, out.reason, out.kept),
        (warm, FailureKind::Http5xx, false)
    );
    assert!((out.remaining_s - (e.until - 2.0)).abs() < 1e-9);
    // Back after the ejection time, and preferred again for its cache.
    let back = e.until;
    let plan = core.plan(&req(&tokens), &[warm, cold], back);
    assert!(plan.ejected.is_empty());
    assert_eq!(plan.context.candidates.len(), 2);
    assert_eq!(core.ejected_workers(back), 0);
}

#[test]
fn a_success_ends_the_failure_run() {
    let (mut core, warm, _, _) = setup();
    let n = core.config().outlier.consecutive_failures as usize;
    fail(&mut core, warm, FailureKind::Connect, n - 1, 1.0);
    assert_eq!(
        core.outcome(warm, Outcome::Success, 1.0),
        OutlierEvent::None
    );
    assert_eq!(
        fail(&mut core, warm, FailureKind::Connect, n - 1, 1.0),
        OutlierEvent::None
    );
    assert_eq!(core.ejected_workers(1.0), 0);
}

#[test]
fn ejections_stop_at_the_max_percent_and_the_pool_is_never_emptied() {
    let (mut core, warm, cold, tokens) = setup();
    let n = core.config().outlier.consecutive_failures as usize;
    assert!(matches!(
        fail(&mut core, warm, FailureKind::Connect, n, 1.0),
        OutlierEvent::Ejected(_)
    ));
    // 50% of two workers: the second is refused and stays a candidate.
    assert_eq!(
        fail(&mut core, cold, FailureKind::Connect, n, 1.0),
        OutlierEvent::Refused(FailureKind::Connect)
    );
    assert_eq!(core.ejected_workers(1.0), 1);
    let plan = core.plan(&req(&tokens), &[warm, cold], 1.0);
    assert_eq!(plan.context.candidates.len(), 1);
    // Only the ejected worker allowed (another model's pool, say): it stays a candidate.
    let plan = core.plan(&req(&tokens), &[warm], 1.0);
    assert_eq!(plan.context.candidates.len(), 1);
    assert!(plan.ejected[0].kept);
    // With the cap at 100% both can go, and a plan over both keeps both.
    let mut cfg = CoreConfig::default();
    cfg.outlier.max_ejection_percent = 100.0;
    let mut core = RoutingCore::new(cfg);
    let a = core.snapshot("a", 16, 1, &[], 0.0);
    let b = core.snapshot("b", 16, 1, &[], 0.0);
    fail(&mut core, a, FailureKind::Timeout, 2, 1.0);
    fail(&mut core, b, FailureKind::Timeout, 2, 1.0);
    assert_eq!(core.ejected_workers(1.0), 2);
    let plan = core.plan(&req(&tokens), &[a, b], 1.0);
    assert_eq!(plan.context.candidates.len(), 2);
    assert!(plan.ejected.iter().all(|e| e.kept));
}

#[test]
fn assignment_outcomes_reach_the_worker_and_retirement_forgets_its_health() {
    let (mut core, warm, cold, tokens) = setup();
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    let n = core.config().outlier.consecutive_failures as usize;
    for _ in 0..n {
        let (plan, d) = core
            .decide(&mut p, &req(&tokens), &[warm], 1.0)
            .expect("decision");
        let id = core.assign(&plan, &d, 1.0);
        core.assignment_failed(id, FailureKind::StreamCut, 1.0);
        core.abort(id);
    }
    assert_eq!(core.ejected_workers(1.0), 1);
    let (plan, d) = core
        .decide(&mut p, &req(&tokens), &[warm, cold], 1.0)
        .expect("decision");
    assert_eq!(d.chosen, cold);
    let id = core.assign(&plan, &d, 1.0);
    core.assignment_succeeded(id, 1.0);
    assert!(core.finish(id).is_some());
    core.stream_closed(warm, 2.0);
    core.retire(warm);
    let again = core.snapshot("warm2", 16, 1, &[], 3.0);
    assert_eq!(again, warm, "the id is reused");
    assert_eq!(core.ejected_workers(3.0), 0, "with a clean record");
}

#[test]
fn a_prefix_released_long_ago_is_expected_evicted_by_the_queue_ahead() {
    let mut core = RoutingCore::new(CoreConfig::default());
    let w = core.snapshot("w", 16, 1, &[], 0.0);
    let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
    // Two conversations ran and ended: `old` (64 blocks) first, then `recent` (900 blocks).
    let old: Vec<u32> = (0..1_024).collect();
    let recent: Vec<u32> = (100_000..114_400).collect();
    for (t, at) in [(&old, 0.0), (&recent, 1.0)] {
        let (plan, d) = core.decide(&mut p, &req(t), &[w], at).expect("decision");
        let id = core.assign(&plan, &d, at);
        core.first_token(id, at + 0.5, None);
        core.stored(w, &chain(t, 16), at + 0.5);
        core.finish(id);
    }
    // 1,000 blocks, all free (cached or empty): 36 the router knows nothing of.
    core.load(
        w,
        LoadSample {
            kv_capacity_tokens: 16_000,
            ..LoadSample::default()
        },
        2.0,
    );
    let next_turn = |t: &[u32]| -> Vec<u32> { t.iter().copied().chain(500_000..500_064).collect() };
    let cached = |core: &RoutingCore, t: &[u32]| {
        core.plan(&req(&next_turn(t)), &[w], 3.0).context.candidates[0].expected_cached_tokens
    };
    // Nothing queued: both prefixes count.
    assert_eq!(cached(&core, &old), 1_024.0);
    assert_eq!(cached(&core, &recent), 14_400.0);
    // 100 blocks queued ahead: 36 empty, then the 64 released first go.
    let other: Vec<u32> = (900_000..901_600).collect();
    let (plan, d) = core
        .decide(&mut p, &req(&other), &[w], 3.0)
        .expect("decision");
    core.assign(&plan, &d, 3.0);
    assert_eq!(cached(&core, &old), 0.0);
    assert_eq!(cached(&core, &recent), 14_400.0);
    let rule = |core: &RoutingCore, t: &[u32]| {
        core.plan(&req(&next_turn(t)), &[w], 3.0).context.candidates[0].eviction_expected
    };
    assert_eq!(rule(&core, &old), Some(EvictionRule::FreeQueue));
    assert_eq!(rule(&core, &recent), None);
    // The worker reports the eviction: the index no longer has `old` either.
    core.removed(w, &chain(&old, 16), 3.0);
    assert_eq!(cached(&core, &old), 0.0);
    // Off: the index's prefix counts as it is.
    let mut off = RoutingCore::new(CoreConfig {
        expect_evictions: false,
        ..CoreConfig::default()
    });
    let w = off.snapshot("w", 16, 1, &[], 0.0);
    off.stored(w, &chain(&old, 16), 0.0);
    off.load(
        w,
        LoadSample {
            kv_capacity_tokens: 16_000,
            waiting: 4,
            ..LoadSample::default()
        },
        2.0,
    );
    assert_eq!(
        off.plan(&req(&next_turn(&old)), &[w], 3.0)
            .context
            .candidates[0]
            .expected_cached_tokens,
        1_024.0
    );
}

#[test]
fn an_overcommitted_worker_keeps_only_the_prefix_in_use() {
    let run = |margin: Option<u64>| -> (f64, f64, Option<EvictionRule>) {
        let mut core = RoutingCore::new(CoreConfig {
            overcommit_margin_tokens: margin,
            ..CoreConfig::default()
        });
        let w = core.snapshot("w", 16, 1, &[], 0.0);
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        // A conversation (256 blocks) ran and ended just now: the newest released blocks.
        let conv: Vec<u32> = (0..4_096).collect();
        let (plan, d) = core
            .decide(&mut p, &req(&conv), &[w], 0.0)
            .expect("decision");
        let id = core.assign(&plan, &d, 0.0);
        core.first_token(id, 0.5, None);
        core.stored(w, &chain(&conv, 16), 0.5);
        core.finish(id);
        // Eight long generations now decode there, each holding 1,616 prompt tokens and
        // 1,024 of output at its peak (4x the mean output, the most a `max_tokens` counts
        // for): 21,120 tokens against 16,000 of capacity.
        for k in 0..8u32 {
            let other: Vec<u32> = (1_000_000 * (k + 1)..1_000_000 * (k + 1) + 1_600).collect();
            let r = RouteRequest {
                max_tokens: Some(12_000),
                ..req(&other)
            };
            let (plan, d) = core.decide(&mut p, &r, &[w], 1.0).expect("decision");
            let id = core.assign(&plan, &d, 1.0);
            core.first_token(id, 1.2, None);
        }
        core.load(
            w,
            LoadSample {
                kv_capacity_tokens: 16_000,
                running: 8,
                ..LoadSample::default()
            },
            2.0,
        );
        let next_turn: Vec<u32> = conv.iter().copied().chain(500_000..500_064).collect();
        let plan = core.plan(&req(&next_turn), &[w], 2.0);
        let c = &plan.context.candidates[0];
        (
            c.expected_cached_tokens,
            c.active_kv_tokens as f64,
            c.eviction_expected,
        )
    };
    let (off, committed, rule) = run(None);
    assert_eq!(rule, None, "nothing lowered the expectation");
    assert_eq!(committed, 8.0 * (1_616.0 + 1_024.0));
    assert_eq!(
        off, 4_096.0,
        "free-queue order alone keeps the newest release"
    );
    let (on, _, rule) = run(Some(2_000));
    assert_eq!(on, 0.0, "overcommitted: nothing idle survives");
    assert_eq!(
        rule,
        Some(EvictionRule::Overcommitted),
        "the decision says why"
    );
    // Under the margin the free-queue order decides as before.
    let (loose, _, rule) = run(Some(100_000));
    assert_eq!(loose, 4_096.0);
    assert_eq!(rule, None);
}

#[test]
fn rates_that_chain_within_the_pool_fraction_share_their_mean() {
    use super::super::predict::pooled_rates;
    let harmonic = |rs: &[f64]| rs.len() as f64 / rs.iter().map(|r| 1.0 / r).sum::<f64>();
    // The live multi-turn drift (bench/README.md): three identical workers learned 4,203,
    // 5,741 and 4,652 tokens/s. 4,652 is within 25% of 4,203 and 5,741 of 4,652: one group.
    let drifted = [4_203.0, 5_741.0, 4_652.0];
    let mean = harmonic(&drifted);
    let pooled = pooled_rates(&drifted, Some(0.25));
    for p in &pooled {
        let p = p.expect("pooled");
        assert!((p - mean).abs() < 1e-9, "{p} vs {mean}");
    }
    // Within 10%: 4,652 is 10.7% above 4,203, so no group; off: no group.
    assert_eq!(pooled_rates(&drifted, Some(0.10)), vec![None; 3]);
    assert_eq!(pooled_rates(&drifted, None), vec![None; 3]);
    // A fraction that is no fraction turns it off rather than pooling everything.
    assert_eq!(pooled_rates(&drifted, Some(f64::NAN)), vec![None; 3]);
    assert_eq!(pooled_rates(&drifted, Some(-1.0)), vec![None; 3]);
    // Two L40S and an H100 (3.5x): the L40S pair pools, the H100 keeps its own rate.
    let hetero = [5_900.0, 20_600.0, 5_300.0];
    let pooled = pooled_rates(&hetero, Some(0.25));
    assert_eq!(pooled[1], None);
    let pair = harmonic(&[5_900.0, 5_300.0]);
    assert!((pooled[0].expect("pooled") - pair).abs() < 1e-9);
    assert_eq!(pooled[0], pooled[2]);
    // The chain is transitive: each step within 25%, the ends 1.73x apart.
    let steps = [1_000.0, 1_200.0, 1_440.0, 1_728.0];
    assert!(pooled_rates(&steps, Some(0.25)).iter().all(Option::is_some));
    // Rates that are no rates stay out of every group.
    let odd = [f64::NAN, 4_800.0, 0.0, 4_900.0];
    let pooled = pooled_rates(&odd, Some(0.25));
    assert_eq!((pooled[0], pooled[2]), (None, None));
    assert!(pooled[1].is_some() && pooled[1] == pooled[3]);
    assert_eq!(pooled_rates(&[], Some(0.25)), Vec::<Option<f64>>::new());
    // The default (2x): the live GuideLLM drift, three identical workers learned at 9,865,
    // 11,310 and 5,777 tokens/s (wall, clock x2; 1.71x), is one group; the L40S pair and
    // the H100 above stay apart.
    let default = CoreConfig::default().rate_pool;
    assert!(
        pooled_rates(&[9_865.0, 11_310.0, 5_777.0], default)
            .iter()
            .all(Option::is_some)
    );
    assert_eq!(
        pooled_rates(&[9_865.0, 11_310.0, 5_777.0], Some(0.25))[2],
        None
    );
    assert_eq!(pooled_rates(&hetero, default)[1], None);
}

#[test]
fn only_workers_of_one_speed_class_share_a_rate() {
    use super::super::predict::{pooled_rates, pooled_rates_by_class};
    // Live, clock x2 (bench/README.md): two L40S and an H100 learned 8,092, 12,540 and
    // 17,695 tokens/s, the H100 held near the 4x-prior clamp. Each step is within 2x, so one
    // class pools all three and the H100 is predicted at the L40S's speed.
    let live = [8_092.0, 12_540.0, 17_695.0];
    let default = CoreConfig::default().rate_pool;
    let one = pooled_rates_by_class(&live, &["ws", "ws", "ws"], default);
    assert_eq!(one, pooled_rates(&live, default));
    assert!(one.iter().all(Option::is_some));
    // Two WorkerSets: the L40S pair pools, the H100 keeps its own rate.
    let two = pooled_rates_by_class(&live, &["l40s", "l40s", "h100"], default);
    assert_eq!(two[2], None);
    assert_eq!(two[0], pooled_rates(&live[..2], default)[0]);
    assert_eq!(two[0], two[1]);
    // Classes interleaved in any order; a class of one pools with nobody.
    let mixed = pooled_rates_by_class(
        &[5_000.0, 20_000.0, 5_500.0, 21_000.0, 9_000.0],
        &["a", "b", "a", "b", "c"],
        default,
    );
    assert_eq!(mixed[0], mixed[2]);
    assert_eq!(mixed[1], mixed[3]);
    assert!(mixed[0].is_some() && mixed[1].is_some() && mixed[0] != mixed[1]);
    assert_eq!(mixed[4], None);
    // Rates without a class (a shorter list) pool with nobody.
    assert_eq!(
        pooled_rates_by_class(&[5_000.0, 5_100.0], &["a"], default),
        vec![None, None]
    );
}

#[test]
fn identical_workers_whose_fits_drifted_are_predicted_at_one_rate() {
    let run_in = |rate_pool: Option<f64>, classes: [&str; 2]| {
        let mut core = RoutingCore::new(CoreConfig {
            rate_pool,
            ..CoreConfig::default()
        });
        let a = core.snapshot("a", 16, 1, &[], 0.0);
        let b = core.snapshot("b", 16, 1, &[], 0.0);
        core.set_speed_class(a, classes[0]);
        core.set_speed_class(b, classes[1]);
        core.load(a, LoadSample::default(), 0.0);
        core.load(b, LoadSample::default(), 0.0);
        // One 2,048-token first token each: a's slower than b's.
        for (k, (w, ttft)) in [(a, 0.50), (b, 0.42)].into_iter().enumerate() {
            let t: Vec<u32> = (0..2_048).map(|i| i + 10_000 * k as u32).collect();
            let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
            let (plan, d) = core.decide(&mut p, &req(&t), &[w], 0.0).expect("decision");
            let id = core.assign(&plan, &d, 0.0);
            core.first_token(id, ttft, None);
            core.finish(id);
        }
        let (ra, rb) = (core.predictor_params(a).0, core.predictor_params(b).0);
        assert!(
            ra < rb && rb <= ra * 1.25,
            "the fits drifted apart within 25%: {ra} {rb}"
        );
        let fresh: Vec<u32> = (900_000..902_048).collect();
        let plan = core.plan(&req(&fresh), &[a, b], 1.0);
        plan.context.candidates
    };
    let run = |rate_pool| run_in(rate_pool, ["ws", "ws"]);
    let pooled = run(Some(0.25));
    assert_eq!(pooled[0].pooled_rate, pooled[1].pooled_rate);
    for c in &pooled {
        assert_ne!(
            c.pooled_rate, c.prefill_rate,
            "each keeps its own learned rate"
        );
        let want = 2_048.0 / c.pooled_rate + c.overhead;
        assert!((c.predicted_ttft - want).abs() < 1e-9, "its own overhead");
    }
    let own = run(None);
    for c in &own {
        assert_eq!(c.pooled_rate, c.prefill_rate);
    }
    assert!(
        own[0].predicted_ttft > own[1].predicted_ttft,
        "off: b looks faster"
    );
    // The same fits in two WorkerSets: each keeps its own rate.
    for c in &run_in(Some(0.25), ["l40s", "h100"]) {
        assert_eq!(c.pooled_rate, c.prefill_rate);
    }
}

#[test]
fn the_rate_pool_flag_takes_a_fraction_or_zero_for_off() {
    assert_eq!(rate_pool_from(0.25), Ok(Some(0.25)));
    assert_eq!(rate_pool_from(0.0), Ok(None));
    for bad in [-0.1, 10.5, f64::NAN, f64::INFINITY] {
        let err = rate_pool_from(bad).expect_err("refused");
        assert!(err.contains("outside 0..=10"), "{err}");
    }
}

/// The published p90 bound is calibrated on the time since the gateway received the request
/// (what a client times), the TTFT model on the engine's part. A gateway that spends 40-50 ms
/// per request before sending (parsing, tokenizing, deciding) and reports both: the bound
/// comes to cover the served time. Fed the engine's time alone, as before, it covers that and
/// misses every served first token.
#[test]
fn the_published_bound_covers_the_served_time_and_the_model_learns_the_engines() {
    // Served first tokens within the bound among the last 40 of 100, with and without the
    // served time reported.
    let run = |report_served: bool| {
        let (mut core, warm, _, tokens) = setup();
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        let mut now = 1.0;
        let mut covered = 0;
        for i in 0..100 {
            let (plan, d) = core
                .decide(&mut p, &req(&tokens), &[warm], now)
                .expect("decision");
            let id = core.assign(&plan, &d, now);
            let a = core.assignment(id).expect("live");
            let (predicted, bound) = (a.predicted_ttft, a.ttft_bound);
            // The engine answers as predicted; the gateway adds 40-50 ms before sending.
            let served = predicted + 0.04 + 0.001 * f64::from(i % 11);
            let ft = core
                .first_token_served(
                    id,
                    now + predicted,
                    Some(predicted),
                    report_served.then_some(served),
                )
                .expect("first token");
            // The model learns the engine's time: the gateway's is not taught to it.
            assert!((ft.observed_ttft - predicted).abs() < 1e-12);
            if i >= 60 {
                assert!(bound.is_finite(), "a bound after {i} first tokens");
                covered += usize::from(served <= bound);
            }
            core.finish(id);
            now += 10.0;
        }
        covered
    };
    let with = run(true);
    assert!(
        (32..=40).contains(&with),
        "{with} of 40 served first tokens covered"
    );
    assert_eq!(
        run(false),
        0,
        "calibrated on the engine's time, the bound misses the served"
    );
}

#[test]
fn placements_build_each_workers_working_set_and_a_retired_one_starts_empty() {
    let run = |horizon: u32| {
        let mut core = RoutingCore::new(CoreConfig {
            working_set_horizon: horizon,
            ..CoreConfig::default()
        });
        let a = core.snapshot("a", 16, 1, &[], 0.0);
        let b = core.snapshot("b", 16, 1, &[], 0.0);
        let mut p = PredictedTtft::new(PredictedTtftConfig::default(), 1);
        // Two prompts sharing a 4,096-token prefix (256 blocks), each with its own
        // 512-token question (32 blocks), both sent to `a`.
        for q in [90_000u32, 91_000] {
            let tokens: Vec<u32> = (0..4_096).chain(q..q + 512).collect();
            let (plan, d) = core
                .decide(&mut p, &req(&tokens), &[a], 0.0)
                .expect("decision");
            core.assign(&plan, &d, 0.0);
        }
        let probe: Vec<u32> = (50_000..51_024).collect();
        let ctx = core.plan(&req(&probe), &[a, b], 0.1).context;
        let sets = (
            ctx.candidates[0].working_set_blocks,
            ctx.candidates[1].working_set_blocks,
        );
        core.retire(a);
        let a2 = core.snapshot("a2", 16, 1, &[], 0.2);
        let ctx = core.plan(&req(&probe), &[a2], 0.3).context;
        (sets, ctx.candidates[0].working_set_blocks)
    };
    // The shared prefix and the later question: what `a`'s cache must hold for the prefix
    // to survive; `b` served nothing.
    assert_eq!(run(64), ((256 + 32, 0), 0));
    assert_eq!(run(0), ((0, 0), 0), "off: nothing tracked");
}
