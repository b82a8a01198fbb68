use super::*;

fn l40s() -> Profile {
    Profile::builtin(DEFAULT_PROFILE).unwrap()
}

fn engine(profile: Profile, tweak: impl FnOnce(&mut EngineConfig)) -> Engine {
    let mut cfg = EngineConfig::from_profile(&profile);
    cfg.seed = 7;
    tweak(&mut cfg);
    Engine::new(profile, cfg)
}

fn req(id: u64, prompt: Vec<u32>, max_tokens: u32) -> EngineRequest {
    EngineRequest {
        id,
        prompt,
        max_tokens,
        ignore_eos: true,
        ..EngineRequest::default()
    }
}

/// Runs steps until idle; returns every step output.
fn drain(e: &mut Engine, mut now: f64) -> Vec<StepOutput> {
    let mut outs = Vec::new();
    while let Some(t) = e.next_step_at() {
        now = now.max(t);
        let out = e.step(now).expect("work but no step");
        now = out.end();
        outs.push(out);
        assert!(outs.len() < 100_000, "engine does not converge");
    }
    outs
}

fn first_token_at(outs: &[StepOutput], id: u64) -> f64 {
    outs.iter()
        .flat_map(|o| &o.events)
        .find_map(|ev| match ev {
            EngineEvent::FirstToken { id: i, at } if *i == id => Some(*at),
            _ => None,
        })
        .expect("no first token")
}

fn finished(outs: &[StepOutput], id: u64) -> (Usage, FinishReason) {
    outs.iter()
        .flat_map(|o| &o.events)
        .find_map(|ev| match ev {
            EngineEvent::Finished {
                id: i,
                usage,
                reason,
                ..
            } if *i == id => Some((*usage, *reason)),
            _ => None,
        })
        .expect("not finished")
}

fn kv_events(outs: &[StepOutput]) -> Vec<KvEvent> {
    outs.iter()
        .flat_map(|o| &o.events)
        .filter_map(|ev| match ev {
            EngineEvent::Kv(k) => Some(k.clone()),
            _ => None,
        })
        .collect()
}

fn tokens_of(outs: &[StepOutput], id: u64) -> Vec<u32> {
    outs.iter()
        .flat_map(|o| &o.events)
        .filter_map(|ev| match ev {
            EngineEvent::Token { id: i, token } if *i == id => Some(*token),
            _ => None,
        })
        .collect()
}

fn assert_close(a: f64, b: f64) {
    assert!((a - b).abs() < 1e-9, "{a} != {b}");
}

fn prompt(base: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| base + i).collect()
}

#[test]
fn cached_prefix_cuts_ttft_by_the_skipped_prefill() {
    let p = l40s();
    let mut e = engine(p.clone(), |_| {});
    let a = prompt(1000, 1000);
    e.submit(req(1, a.clone(), 4), 0.0).unwrap();
    let outs = drain(&mut e, 0.0);
    let ttft_a = first_token_at(&outs, 1);
    assert_close(ttft_a, p.step_time(1000, 0, 0));

    // Same prompt again: 62 full blocks (992 tokens) are cached; 8 tokens are recomputed.
    assert_eq!(e.cached_prefix_tokens(&a), 992);
    let t0 = 10.0;
    e.submit(req(2, a.clone(), 4), t0).unwrap();
    let outs = drain(&mut e, t0);
    let ttft_b = first_token_at(&outs, 2) - t0;
    assert_close(ttft_b, p.step_time(8, 0, 992));
    assert!(ttft_a - ttft_b > 0.15, "{ttft_a} vs {ttft_b}");
    assert_eq!(finished(&outs, 2).0.cached_tokens, 992);
    assert_eq!(e.stats().prefix_cache_hits, 992);
    assert_eq!(e.stats().prefix_cache_queries, 2000);
}

#[test]
fn a_full_batch_makes_ttft_longer() {
    let p = l40s();
    let mut idle = engine(p.clone(), |_| {});
    idle.submit(req(1, prompt(0, 1500), 8), 0.0).unwrap();
    let alone = first_token_at(&drain(&mut idle, 0.0), 1);

    let mut busy = engine(p, |_| {});
    for id in 0..8u64 {
        busy.submit(req(id, prompt(id as u32 * 5000, 1500), 8), 0.0)
            .unwrap();
    }
    let queued = first_token_at(&drain(&mut busy, 0.0), 7);
    // The last request waits for seven 1,500-token prefills sharing 2,048-token steps.
    assert!(queued > 4.0 * alone, "{queued} vs {alone}");
}

#[test]
fn chunked_prefill_respects_the_token_budget_and_decodes_go_first() {
    let p = l40s();
    let mut e = engine(p, |_| {});
    e.submit(req(1, prompt(0, 100), 50), 0.0).unwrap();
    let first = e.step(0.0).unwrap();
    assert_eq!(first.prefill_tokens, 100);
    e.submit(req(2, prompt(10_000, 5000), 1), first.end())
        .unwrap();
    let second = e.step(first.end()).unwrap();
    assert_eq!(second.decode_seqs, 1);
    assert_eq!(second.prefill_tokens, 2047);
    let third = e.step(second.end()).unwrap();
    assert_eq!((third.decode_seqs, third.prefill_tokens), (1, 2047));
}

#[test]
fn blocks_stored_in_order_including_generated_tokens() {
    let p = l40s();
    let mut e = engine(p, |c| c.block_size = 16);
    let pr = prompt(1, 20);
    e.submit(req(1, pr.clone(), 20), 0.0).unwrap();
    let outs = drain(&mut e, 0.0);
    let kv = kv_events(&outs);
    let generated = tokens_of(&outs, 1);
    assert_eq!(generated.len(), 20);
    // 20 + 20 - 1 = 39 tokens computed: 2 full blocks, stored in two events.
    assert_eq!(kv.len(), 2, "{kv:?}");
    let KvEvent::Stored(BlockStored {
        block_hashes: h0,
        parent: None,
        token_ids: t0,
        ..
    }) = &kv[0]
    else {
        panic!("{:?}", kv[0])
    };
    assert_eq!(h0.len(), 1);
    assert_eq!(t0, &pr[..16]);
    let KvEvent::Stored(BlockStored {
        parent: Some(parent),
        token_ids: t1,
        ..
    }) = &kv[1]
    else {
        panic!("{:?}", kv[1])
    };
    assert_eq!(parent, &h0[0]);
    let mut expected = pr[16..].to_vec();
    expected.extend_from_slice(&generated[..12]);
    assert_eq!(t1, &expected);
}

#[test]
fn golden_hashes_in_events() {
    let p = l40s();
    let mut e = engine(p, |c| c.block_size = 16);
    e.submit(req(1, (1..=33).collect(), 1), 0.0).unwrap();
    let kv = kv_events(&drain(&mut e, 0.0));
    assert!(
        matches!(&kv[0], KvEvent::Stored(BlockStored { block_hashes, .. })
        if block_hashes == &vec![8866452693264111234, 807986237951177663])
    );
}

#[test]
fn prefix_sharing_like_the_vllm_capture() {
    // Capture: block size 32, A has 119 prompt tokens, B shares 94 of them -> 64 cached.
    let p = l40s();
    let mut e = engine(p, |c| c.block_size = 32);
    let a = prompt(1, 119);
    let mut b = a[..94].to_vec();
    b.extend(prompt(5000, 24));
    e.submit(req(1, a, 8), 0.0).unwrap();
    let outs_a = drain(&mut e, 0.0);
    e.submit(req(2, b, 8), 5.0).unwrap();
    let outs_b = drain(&mut e, 5.0);
    assert_eq!(finished(&outs_b, 2).0.cached_tokens, 64);
    let kv_a = kv_events(&outs_a);
    let kv_b = kv_events(&outs_b);
    let KvEvent::Stored(BlockStored {
        block_hashes: ha, ..
    }) = &kv_a[0]
    else {
        panic!()
    };
    assert_eq!(ha.len(), 3);
    let KvEvent::Stored(BlockStored {
        block_hashes: hb,
        parent,
        ..
    }) = &kv_b[0]
    else {
        panic!()
    };
    assert_eq!(hb.len(), 1);
    assert_eq!(parent, &Some(ha[1]));
}

#[test]
fn eviction_is_lru_and_tail_blocks_go_first() {
    let p = l40s();
    // 8 blocks of 16 tokens.
    let mut e = engine(p, |c| c.num_blocks = 8);
    e.submit(req(1, prompt(0, 49), 1), 0.0).unwrap(); // 3 full blocks + 1 partial
    let kv1 = kv_events(&drain(&mut e, 0.0));
    let KvEvent::Stored(BlockStored {
        block_hashes: a, ..
    }) = &kv1[0]
    else {
        panic!()
    };
    e.submit(req(2, prompt(1000, 49), 1), 1.0).unwrap(); // 4 more: cache now full
    drain(&mut e, 1.0);
    e.submit(req(3, prompt(2000, 33), 1), 2.0).unwrap(); // needs 3 blocks
    let kv3 = kv_events(&drain(&mut e, 2.0));
    let removed: Vec<u64> = kv3
        .iter()
        .filter_map(|k| match k {
            KvEvent::Removed(r) => Some(r.block_hashes[0]),
            _ => None,
        })
        .collect();
    // Request 1 freed a2, a1, a0 to the tail (its partial block to the head); request 2 then
    // took the head blocks and put its own partial block at the head. Request 3 takes that
    // partial block, the never-used block, then a2: the least recently freed cached block.
    assert_eq!(removed, vec![a[2]]);
    assert_eq!(e.cached_prefix_tokens(&prompt(0, 49)), 32);
}

#[test]
fn preemption_when_blocks_run_out_and_everyone_finishes() {
    let p = l40s();
    let mut e = engine(p, |c| c.num_blocks = 10);
    // Each needs 3 blocks for the prompt and grows to 6: three of them cannot all fit.
    for id in 0..3u64 {
        e.submit(req(id, prompt(id as u32 * 1000, 40), 50), 0.0)
            .unwrap();
    }
    let outs = drain(&mut e, 0.0);
    assert!(e.stats().num_preemptions > 0);
    for id in 0..3u64 {
        let (usage, reason) = finished(&outs, id);
        assert_eq!(usage.completion_tokens, 50);
        assert_eq!(reason, FinishReason::Length);
        assert_eq!(tokens_of(&outs, id).len(), 50);
    }
    assert_eq!(e.load().used_blocks, 0);
}

#[test]
fn queueing_when_max_num_seqs_is_reached() {
    let p = l40s();
    let mut e = engine(p, |c| c.max_num_seqs = 2);
    for id in 0..3u64 {
        e.submit(req(id, prompt(id as u32 * 1000, 10), 5), 0.0)
            .unwrap();
    }
    e.step(0.0).unwrap();
    let load = e.load();
    assert_eq!((load.running, load.waiting), (2, 1));
    assert!(load.kv_cache_usage > 0.0);
}

#[test]
fn reset_prefix_cache_clears_and_announces_on_the_next_step() {
    let p = l40s();
    let mut e = engine(p, |_| {});
    e.submit(req(1, prompt(0, 64), 40), 0.0).unwrap();
    e.step(0.0).unwrap();
    assert!(!e.reset_prefix_cache(), "blocks are in use");
    drain(&mut e, 0.0);
    assert!(e.cached_prefix_tokens(&prompt(0, 64)) > 0);
    assert!(e.reset_prefix_cache());
    assert_eq!(e.cached_prefix_tokens(&prompt(0, 64)), 0);
    e.submit(req(2, prompt(0, 64), 1), 10.0).unwrap();
    let kv = kv_events(&drain(&mut e, 10.0));
    assert_eq!(kv[0], KvEvent::Cleared);
    assert!(matches!(kv[1], KvEvent::Stored(_)));
}

#[test]
fn rejects_what_can_never_run() {
    let p = l40s();
    let mut e = engine(p, |c| {
        c.max_model_len = 100;
        c.num_blocks = 4;
    });
    assert!(matches!(
        e.submit(req(1, prompt(0, 101), 1), 0.0),
        Err(SubmitError::PromptTooLong {
            prompt_tokens: 101,
            max_model_len: 100
        })
    ));
    assert!(matches!(
        e.submit(req(1, prompt(0, 80), 1), 0.0),
        Err(SubmitError::LargerThanCache { .. })
    ));
    assert_eq!(
        e.submit(req(1, vec![], 1), 0.0),
        Err(SubmitError::EmptyPrompt)
    );
    e.submit(req(1, prompt(0, 10), 1), 0.0).unwrap();
    assert_eq!(
        e.submit(req(1, prompt(0, 10), 1), 0.0),
        Err(SubmitError::DuplicateId(1))
    );
}

#[test]
fn abort_releases_blocks_and_forgets_the_request() {
    let p = l40s();
    let mut e = engine(p, |_| {});
    e.submit(req(1, prompt(0, 100), 100), 0.0).unwrap();
    e.step(0.0).unwrap();
    assert!(e.load().used_blocks > 0);
    assert!(e.abort(1));
    assert!(!e.abort(1));
    assert_eq!(e.load().used_blocks, 0);
    assert_eq!(e.next_step_at(), None);
}

#[test]
fn deterministic_under_a_seed_and_eos_stops() {
    let p = l40s();
    let run = |seed: u64, ignore_eos: bool| {
        let mut e = engine(p.clone(), |c| {
            c.seed = seed;
            c.eos_token_id = Some(99_999);
            c.eos_probability = 0.2;
        });
        let mut r = req(1, prompt(0, 30), 200);
        r.ignore_eos = ignore_eos;
        e.submit(r, 0.0).unwrap();
        let outs = drain(&mut e, 0.0);
        (tokens_of(&outs, 1), finished(&outs, 1).1)
    };
    assert_eq!(run(1, false), run(1, false));
    assert_ne!(run(1, true).0, run(2, true).0);
    let (toks, reason) = run(1, false);
    assert_eq!(reason, FinishReason::Stop);
    assert_eq!(toks.last(), Some(&99_999));
    let (toks, reason) = run(1, true);
    assert_eq!((toks.len(), reason), (200, FinishReason::Length));
}

#[test]
fn cache_salt_separates_caches() {
    let p = l40s();
    let mut e = engine(p, |_| {});
    let mut r = req(1, prompt(0, 64), 1);
    r.cache_salt = Some("tenant-a".into());
    e.submit(r, 0.0).unwrap();
    let kv = kv_events(&drain(&mut e, 0.0));
    assert_eq!(e.cached_prefix_tokens(&prompt(0, 64)), 0);
    assert_eq!(
        e.cached_prefix_tokens_with(&prompt(0, 64), Some("tenant-a"), None),
        48
    );
    let KvEvent::Stored(BlockStored { extra_keys, .. }) = &kv[0] else {
        panic!()
    };
    assert_eq!(extra_keys[0], [RawExtraKey::Str("tenant-a".to_string())]);
    assert_eq!(extra_keys[1], []);
}

#[test]
fn clones_evolve_independently() {
    let p = l40s();
    let mut e = engine(p, |_| {});
    e.submit(req(1, prompt(0, 64), 10), 0.0).unwrap();
    let mut fork = e.clone();
    fork.submit(req(2, prompt(500, 64), 10), 0.0).unwrap();
    assert_eq!(e.load().waiting, 1);
    assert_eq!(fork.load().waiting, 2);
    let a = drain(&mut e, 0.0);
    let b = drain(&mut fork, 0.0);
    assert_eq!(tokens_of(&a, 1), tokens_of(&b, 1));
}

#[test]
fn run_until_stops_before_the_next_arrival() {
    let p = l40s();
    let mut e = engine(p.clone(), |_| {});
    e.submit(req(1, prompt(0, 100), 10), 0.0).unwrap();
    let outs = e.run_until(0.0, 0.2);
    // Steps of ~53 ms: those starting at 0, .05x, .10x, .16x run; the next would start after 0.2.
    assert!(!outs.is_empty());
    assert!(outs.iter().all(|o| o.start < 0.2));
    assert!(e.next_step_at().unwrap() >= 0.2);
    let mut t = 0.0;
    for o in &outs {
        assert!(o.start >= t);
        t = o.end();
    }
    assert!(e.run_until(0.0, 100.0).len() < 10);
    assert_eq!(e.next_step_at(), None);
}
