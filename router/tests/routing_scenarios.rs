//! A small deterministic pool simulation driving the routing core end to end: multi-turn
//! conversations over workers of different speeds, KV events applied when prefill ends,
//! first tokens reported back. Simulated time only (no clocks, no sleeps).

use kvroute_router::routing::{
    CoreConfig, LoadSample, Policy, PromptHashes, RouteRequest, RoutingCore, WorkerId,
    policy_by_name,
};

/// One simulated worker: FCFS prefill at `rate` tokens/s plus `overhead` seconds.
struct SimWorker {
    id: WorkerId,
    rate: f64,
    overhead: f64,
    busy_until: f64,
    queued: Vec<f64>,
}

struct Pending {
    at: f64,
    id: kvroute_router::routing::AssignmentId,
    worker: usize,
    blocks: Vec<u64>,
    ttft: f64,
}

struct Outcome {
    mean_ttft: f64,
    released: usize,
    assigned: usize,
    core: RoutingCore,
    ids: Vec<WorkerId>,
}

fn simulate(policy: &mut dyn Policy) -> Outcome {
    let mut core = RoutingCore::new(CoreConfig::default());
    let speeds = [
        (6_000.0, 0.04),
        (4_000.0, 0.05),
        (3_000.0, 0.08),
        (5_000.0, 0.05),
    ];
    let mut workers: Vec<SimWorker> = speeds
        .iter()
        .enumerate()
        .map(|(i, &(rate, overhead))| SimWorker {
            id: core.snapshot(&format!("pod-{i}"), 16, 1, &[], 0.0),
            rate,
            overhead,
            busy_until: 0.0,
            queued: Vec::new(),
        })
        .collect();
    let ids: Vec<WorkerId> = workers.iter().map(|w| w.id).collect();
    // 12 conversations sharing a 1,024-token system prompt, 8 turns of +384 tokens each.
    let system: Vec<u32> = (0..1_024).collect();
    let mut convs: Vec<Vec<u32>> = (0..12).map(|_| system.clone()).collect();
    let mut pending: Vec<Pending> = Vec::new();
    let (mut sum, mut n, mut released, mut assigned) = (0.0, 0usize, 0usize, 0usize);
    let mut now = 0.0;
    for turn in 0..8u32 {
        for (c, conv) in convs.iter_mut().enumerate() {
            now += 0.35;
            conv.extend((0..384).map(|k| 200_000 + (c as u32) * 10_000 + turn * 400 + k));
            // Deliver first tokens that happened by now: KV events, then the report.
            pending.sort_by(|a, b| a.at.total_cmp(&b.at));
            while pending.first().is_some_and(|p| p.at <= now) {
                let p = pending.remove(0);
                core.stored(workers[p.worker].id, &p.blocks, p.at);
                assert!(core.first_token(p.id, p.at, Some(p.ttft)).is_some());
                assert!(core.finish(p.id).is_some(), "released once");
                assert!(core.finish(p.id).is_none(), "never twice");
                released += 1;
            }
            for w in &mut workers {
                w.queued.retain(|&t| t > now);
                let sample = LoadSample {
                    waiting: w.queued.len() as u32,
                    running: 0,
                    kv_usage: 0.2,
                    ..LoadSample::default()
                };
                core.load(w.id, sample, now);
            }
            let r = RouteRequest {
                tokens: Some(conv),
                model: "m",
                lora: None,
                cache_salt: None,
                max_tokens: None,
            };
            let (plan, d) = core.decide(policy, &r, &ids, now).expect("a decision");
            let wi = workers
                .iter()
                .position(|w| w.id == d.chosen)
                .expect("known worker");
            let blocks = PromptHashes::new(conv, "m", None, None).chain(16).to_vec();
            let cached = core.matched_blocks(d.chosen, &blocks) * 16;
            let id = core.assign(&plan, &d, now);
            assigned += 1;
            let w = &mut workers[wi];
            let start = now.max(w.busy_until);
            let done = start + (conv.len() - cached) as f64 / w.rate + w.overhead;
            w.busy_until = done;
            w.queued.push(done);
            let ttft = done - now;
            sum += ttft;
            n += 1;
            pending.push(Pending {
                at: done,
                id,
                worker: wi,
                blocks,
                ttft,
            });
        }
    }
    for p in pending {
        core.stored(workers[p.worker].id, &p.blocks, p.at);
        assert!(core.first_token(p.id, p.at, Some(p.ttft)).is_some());
        assert!(core.finish(p.id).is_some());
        released += 1;
    }
    Outcome {
        mean_ttft: sum / n as f64,
        released,
        assigned,
        core,
        ids,
    }
}

#[test]
fn kvroute_beats_cache_blind_baselines_and_releases_everything_once() {
    let mut results = Vec::new();
    for name in ["kvroute", "random", "round-robin", "least-loaded"] {
        let mut p = policy_by_name(name, 11).expect("known policy");
        let o = simulate(p.as_mut());
        assert_eq!(o.released, o.assigned, "{name}");
        assert!(o.core.outstanding() == 0, "{name}");
        for &w in &o.ids {
            assert_eq!(o.core.inflight(w).outstanding(), 0);
        }
        results.push((name, o.mean_ttft, o));
    }
    for (name, t, _) in &results {
        println!("{name}: mean TTFT {t:.3} s");
    }
    let kv = results[0].1;
    for (name, t, _) in &results[1..] {
        assert!(kv < *t, "kvroute {kv:.3}s should beat {name} {t:.3}s");
    }
    // The predictor learned from every first token and reports its error.
    let err = *results[0].2.core.prediction_error();
    assert_eq!(err.count, results[0].2.assigned as u64);
    assert!(
        err.mean_abs().is_finite() && err.mean_rel() < 1.0,
        "{err:?}"
    );
}

#[test]
fn every_named_policy_runs_the_scenario() {
    for name in kvroute_router::routing::POLICY_NAMES {
        let mut p = policy_by_name(name, 3).expect("known policy");
        let o = simulate(p.as_mut());
        assert_eq!(o.released, 96, "{name}");
        assert!(o.mean_ttft.is_finite() && o.mean_ttft > 0.0, "{name}");
    }
}
