//! Unit tests of the state over its public API (no sockets).
use super::*;

fn state(route_unlisted: bool) -> RouterState {
    let metrics = RouterMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let cfg = RouterConfig {
        route_unlisted,
        seed: 3,
        ..RouterConfig::default()
    };
    RouterState::new(cfg, metrics).expect("state")
}

fn identity(id: &str, model: &str) -> SidecarIdentity {
    SidecarIdentity {
        worker_id: id.into(),
        address: format!("{id}:8000"),
        model: model.into(),
        block_size: 4,
        epoch: 1,
        worker_set: "ws".into(),
    }
}

fn report(s: &RouterState, stream: u64, id: &str, model: &str) {
    let now = Instant::now();
    s.sidecar_snapshot_start(stream, &identity(id, model), &[], now)
        .expect("snapshot");
    assert!(s.sidecar_snapshot_chunk(stream, id, &[], true, now));
}

fn input<'a>(model: &'a str, tokens: &'a [u32]) -> PickInput<'a> {
    PickInput {
        model,
        prompt: Prompt::Tokens(tokens),
        cache_salt: None,
        lora: None,
        headers: None,
        resolved: None,
        exclude: &[],
        max_tokens: None,
        tenant: None,
        labels: &[],
        seed: None,
    }
}

#[test]
fn max_tokens_of_reads_openai_and_anthropic_limits() {
    let body = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
    assert_eq!(
        max_tokens_of(&body(serde_json::json!({"max_tokens": 64}))),
        Some(64)
    );
    assert_eq!(
        max_tokens_of(&body(
            serde_json::json!({"max_tokens": 64, "max_completion_tokens": 32})
        )),
        Some(32)
    );
    assert_eq!(
        max_tokens_of(&body(serde_json::json!({"max_tokens": 1e12}))),
        None,
        "not an integer"
    );
    assert_eq!(
        max_tokens_of(&body(serde_json::json!({"max_tokens": 99_999_999_999u64}))),
        Some(u32::MAX)
    );
    assert_eq!(
        max_tokens_of(&body(serde_json::json!({"max_tokens": -1}))),
        None
    );
    assert_eq!(max_tokens_of(&body(serde_json::json!({}))), None);
}

#[test]
fn models_come_from_pools_aliases_and_workers() {
    let s = state(false);
    s.set_catalog(Catalog {
        pools: vec![PoolView {
            name: "ns/p".into(),
            models: vec![
                ServedModel {
                    name: "m".into(),
                    backend_model: "m".into(),
                    split: Vec::new(),
                },
                ServedModel {
                    name: "alias".into(),
                    backend_model: "m".into(),
                    split: Vec::new(),
                },
            ],
            worker_sets: vec!["ws".into()],
            auth: None,
        }],
        workers: vec![DiscoveredWorker {
            id: "w".into(),
            address: "w:1".into(),
            model: "other".into(),
            worker_set: "x".into(),
            namespace: String::new(),
            pod_ip: None,
            ready: true,
            ..Default::default()
        }],
    });
    let ids: Vec<String> = s.models().into_iter().map(|m| m.id).collect();
    assert_eq!(ids, vec!["alias", "m", "other"]);
    assert_eq!(
        s.resolve_model("alias"),
        Some(Resolved {
            backend_model: "m".into(),
            pool: Some("ns/p".into()),
            alias: None,
            lora_base: None,
        })
    );
    assert_eq!(s.resolve_model("nope"), None);
}

#[test]
fn unlisted_workers_route_only_when_allowed() {
    let strict = state(false);
    report(&strict, 1, "w", "m");
    let tokens = [1, 2, 3, 4];
    assert_eq!(
        strict
            .pick(&input("m", &tokens), Instant::now())
            .map(|a| a.worker),
        Err(PickError::UnknownModel("m".into()))
    );
    let open = state(true);
    report(&open, 1, "w", "m");
    let a = open
        .pick(&input("m", &tokens), Instant::now())
        .expect("pick");
    assert_eq!((a.worker.as_str(), a.address.as_str()), ("w", "w:8000"));
    let excluded = PickInput {
        exclude: &["w".to_string()],
        ..input("m", &tokens)
    };
    assert_eq!(
        open.pick(&excluded, Instant::now()).map(|a| a.worker),
        Err(PickError::NoReadyWorker("m".into()))
    );
}

#[test]
fn release_happens_once_and_degraded_is_counted() {
    let s = state(true);
    report(&s, 1, "w", "m");
    let a = s
        .pick(
            &PickInput {
                prompt: Prompt::Unavailable,
                ..input("m", &[])
            },
            Instant::now(),
        )
        .expect("pick");
    assert!(a.degraded);
    assert_eq!(s.in_flight(), 1);
    assert!(s.first_token(a.assignment, Some(0.1), Instant::now()));
    assert!(!s.first_token(a.assignment, Some(0.1), Instant::now()));
    assert!(s.done(a.assignment, Usage::default()));
    assert!(!s.done(a.assignment, Usage::default()));
    assert!(!s.abort(a.assignment, "late"));
    assert_eq!(s.in_flight(), 0);
    let text = s.metrics().encode();
    assert!(
        text.contains(
            "kvroute_router_degraded_decisions_total{model=\"m\",reason=\"no_prompt\"} 1"
        ),
        "{text}"
    );
}

#[test]
fn a_superseded_stream_cannot_touch_the_worker() {
    let s = state(true);
    report(&s, 1, "w", "m");
    report(&s, 2, "w", "m");
    let now = Instant::now();
    assert!(!s.sidecar_delta(1, "w", &[DeltaOp::Stored(&[1])], now));
    s.sidecar_closed(1, "w", now);
    let row = s
        .workers_report(now)
        .workers
        .into_iter()
        .find(|w| w.id == "w")
        .expect("row");
    assert!(row.sidecar_connected && !row.stale, "{row:?}");
    s.sidecar_closed(2, "w", now);
    let row = s
        .workers_report(now)
        .workers
        .into_iter()
        .find(|w| w.id == "w")
        .expect("row");
    assert!(
        !row.sidecar_connected && row.stale && !row.routable,
        "a closed stream is not routable: {row:?}"
    );
}

#[test]
fn classifies_bodies_by_path_then_fields() {
    let chat = serde_json::json!({"model": "m", "messages": []});
    let comp = serde_json::json!({"model": "m", "prompt": "hi"});
    assert_eq!(BodyKind::of("/v1/chat/completions", &chat), BodyKind::Chat);
    assert_eq!(
        BodyKind::of("/v1/completions?x=1", &comp),
        BodyKind::Completion
    );
    assert_eq!(BodyKind::of("", &chat), BodyKind::Chat);
    assert_eq!(BodyKind::of("", &comp), BodyKind::Completion);
    assert_eq!(BodyKind::of("/v1/messages", &chat), BodyKind::Other);
    let obj = chat.as_object().cloned().unwrap_or_default();
    let input = PickInput::from_body("m", BodyKind::Completion, &obj, None, &[]);
    assert!(matches!(input.prompt, Prompt::Unavailable));
    let obj = serde_json::json!({"model": "m", "prompt": "hi", "cache_salt": "s", "max_tokens": 9});
    let obj = obj.as_object().cloned().unwrap_or_default();
    let input = PickInput::from_body("m", BodyKind::Completion, &obj, None, &[]);
    assert!(matches!(input.prompt, Prompt::Completion(_)));
    assert_eq!((input.cache_salt, input.max_tokens), (Some("s"), Some(9)));
}

fn policy(spec_yaml: &str) -> kvroute_crds::InferencePolicy {
    let indented: String = spec_yaml.lines().map(|l| format!("  {l}\n")).collect();
    let doc = format!(
        "apiVersion: kvroute.dev/v1alpha1\nkind: InferencePolicy\nmetadata: {{name: p}}\nspec:\n{indented}"
    );
    match kvroute_crds::parse_documents(&doc)
        .expect("policy parses")
        .pop()
    {
        Some(kvroute_crds::AnyResource::Policy(p)) => p,
        other => panic!("not a policy: {other:?}"),
    }
}

#[test]
fn the_verdict_reaches_the_pick_for_the_limiter_and_the_relay() {
    let s = state(true);
    report(&s, 1, "w", "m");
    let tokens = [1, 2, 3, 4, 5, 6, 7, 8];
    let rules = "rules:\n- name: tenant-a\n  match: {tenants: [a], labels: [pii]}\n  actions:\n    limits: {requestsPerMinute: 5, maxConcurrency: 2}\n    overflow: {provider: cloud, queueThreshold: 0}\n- name: plain\n  actions: {limits: {tokensPerMinute: 100}}\n";
    assert_eq!(s.set_policies(&[policy(rules)]), Ok(2));
    let labels = ["pii"];
    let tenant_a = PickInput {
        tenant: Some("a"),
        labels: &labels,
        ..input("m", &tokens)
    };
    let a = s.pick(&tenant_a, Instant::now()).expect("pick");
    assert_eq!(
        a.policy.rule,
        Some(("default/p".to_string(), "tenant-a".to_string()))
    );
    assert_eq!(
        a.policy
            .limits
            .map(|l| (l.requests_per_minute, l.max_concurrency)),
        Some((Some(5), Some(2)))
    );
    // No waiting request at the best worker: the queue threshold (0) is not crossed.
    assert_eq!(a.policy.overflow, Some(("cloud".to_string(), false)));
    assert!(!a.policy.local_only);
    let b = s.pick(&input("m", &tokens), Instant::now()).expect("pick");
    assert_eq!(b.policy.rule.map(|r| r.1), Some("plain".to_string()));
    assert_eq!(b.policy.overflow, None);
    // An invalid set is refused and the last good one stays.
    let bad = "rules:\n- name: x\n  actions: {reject: {}, route: {}}\n";
    let issues = s.set_policies(&[policy(bad)]).expect_err("refused");
    assert_eq!(issues[0].policy, "default/p");
    let report = s.policies_report();
    assert_eq!((report.generation, report.refused, report.rules), (1, 1, 2));
    let c = s.pick(&input("m", &tokens), Instant::now()).expect("pick");
    assert_eq!(c.policy.rule.map(|r| r.1), Some("plain".to_string()));
}

#[test]
fn a_watched_policy_set_holds_readiness_until_its_first_list() {
    let s = state(true);
    s.set_discovery_synced();
    s.await_policies();
    assert_eq!(
        s.check_ready(Instant::now()),
        Err("InferencePolicies not listed yet".to_string())
    );
    // Even a refused first list unblocks: the router then runs without policies, counted.
    let bad = "rules:\n- name: x\n  actions: {}\n";
    assert!(s.set_policies(&[policy(bad)]).is_err());
    assert_eq!(s.check_ready(Instant::now()), Ok(()));
}

#[test]
fn per_worker_kv_and_engine_queue_gauges_follow_the_latest_load_sample() {
    let s = state(true);
    report(&s, 1, "w", "m");
    let now = Instant::now();
    let load = |kv_usage: f32, waiting: u32, scrape_failed: bool| LoadView {
        waiting,
        running: 2,
        kv_usage,
        scrape_failed,
        kv_capacity_tokens: 4096,
        gpus: Vec::new(),
        lora_adapters: None,
    };
    assert!(matches!(
        s.sidecar_load(1, "w", load(0.25, 3, false), now),
        LoadApplied::Applied
    ));
    s.refresh_gauges(now);
    let text = s.metrics().encode();
    for line in [
        "kvroute_router_worker_kv_usage_ratio{worker=\"w\"} 0.25",
        "kvroute_router_worker_kv_capacity_tokens{worker=\"w\"} 4096",
        "kvroute_router_worker_engine_requests{state=\"waiting\",worker=\"w\"} 3",
        "kvroute_router_worker_engine_requests{state=\"running\",worker=\"w\"} 2",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    // A newer sample replaces the figures.
    s.sidecar_load(1, "w", load(0.5, 0, false), now);
    s.refresh_gauges(now);
    let text = s.metrics().encode();
    assert!(text.contains("kvroute_router_worker_kv_usage_ratio{worker=\"w\"} 0.5"));
    assert!(
        text.contains("kvroute_router_worker_engine_requests{state=\"waiting\",worker=\"w\"} 0")
    );
    // A sample whose scrape failed says nothing about KV: no stale figure is exported.
    s.sidecar_load(1, "w", load(0.9, 7, true), now);
    s.refresh_gauges(now);
    let text = s.metrics().encode();
    assert!(
        !text.contains("kvroute_router_worker_kv_usage_ratio{"),
        "{text}"
    );
    assert!(
        !text.contains("kvroute_router_worker_engine_requests{"),
        "{text}"
    );
}

#[test]
fn forgetting_a_worker_drops_its_kv_and_queue_series() {
    let m = RouterMetrics::register(&prometheus::Registry::new()).expect("metrics");
    m.worker_kv_usage.with_label_values(&["gone"]).set(0.5);
    m.worker_kv_capacity.with_label_values(&["gone"]).set(10);
    m.worker_engine_requests
        .with_label_values(&["gone", "running"])
        .set(1);
    m.worker_kv_usage.with_label_values(&["kept"]).set(0.1);
    m.forget_worker("gone");
    let text = m.encode();
    assert!(!text.contains("worker=\"gone\""), "{text}");
    assert!(text.contains("kvroute_router_worker_kv_usage_ratio{worker=\"kept\"} 0.1"));
}

fn gie_worker(id: &str, ready: bool) -> DiscoveredWorker {
    DiscoveredWorker {
        id: id.into(),
        address: format!("{id}:8000"),
        model: "m".into(),
        worker_set: "gie:pool".into(),
        namespace: "ns".into(),
        pod_ip: None,
        ready,
        origin: WorkerOrigin::InferencePool,
        step_budget_tokens: None,
    }
}

#[test]
fn inference_pool_workers_route_without_a_sidecar_until_one_reports_them() {
    let metrics = RouterMetrics::register(&prometheus::Registry::new()).expect("metrics");
    let cfg = RouterConfig {
        retire_after: Duration::from_secs(5),
        seed: 3,
        ..RouterConfig::default()
    };
    let s = RouterState::new(cfg, metrics).expect("state");
    let t0 = Instant::now();
    s.set_catalog_at(
        Catalog {
            pools: Vec::new(),
            workers: vec![gie_worker("a", true), gie_worker("b", false)],
        },
        t0,
    );
    // No stream at all, yet `a` is routable (pod Ready) and `b` is not.
    assert_eq!(s.open_streams(), 0);
    let report = s.workers_report(t0);
    let row = |id: &str| {
        report
            .workers
            .iter()
            .find(|w| w.id == id)
            .cloned()
            .expect("row")
    };
    assert!(row("a").routable && row("a").load_only && !row("a").sidecar_connected);
    assert!(!row("b").routable && row("b").load_only);
    let picked = s.pick(&input("m", &[1, 2, 3, 4]), t0).expect("routed");
    assert_eq!(picked.worker, "a");
    let rec = s
        .explain(&input("m", &[1, 2, 3, 4]), t0)
        .expect("explained");
    assert!(rec.candidates.iter().all(|c| c.load_only), "{rec:?}");
    assert_eq!(rec.candidates[0].figures.cached_tokens, 0);
    assert!(s.done(picked.assignment, Usage::default()));

    // A sidecar of its own takes `a` over: it is then an ordinary reported worker.
    let mut id = identity("a", "m");
    id.epoch = 0;
    s.sidecar_snapshot_start(7, &id, &[], t0).expect("snapshot");
    assert!(s.sidecar_snapshot_chunk(7, "a", &[], true, t0));
    let a = s
        .workers_report(t0)
        .workers
        .into_iter()
        .find(|w| w.id == "a");
    assert!(a.is_some_and(|a| a.sidecar_connected && !a.load_only && a.routable));
    let rec = s
        .explain(&input("m", &[1, 2, 3, 4]), t0)
        .expect("explained");
    assert!(rec.candidates.iter().all(|c| !c.load_only), "{rec:?}");
    // Its stream ends: upkeep hands it back to discovery, load-only again.
    s.sidecar_closed(7, "a", t0);
    s.maintain(t0);
    let a = s
        .workers_report(t0)
        .workers
        .into_iter()
        .find(|w| w.id == "a");
    assert!(a.is_some_and(|a| a.load_only && a.routable));

    // Discovery drops both: no longer candidates at once, retired after `retire_after`.
    s.set_catalog_at(Catalog::default(), t0);
    assert!(matches!(
        s.pick(&input("m", &[1]), t0),
        Err(PickError::UnknownModel(_))
    ));
    assert_eq!(s.workers_report(t0).workers.len(), 2, "kept until retired");
    assert_eq!(s.maintain(t0 + Duration::from_secs(6)).1, 2);
    assert!(s.workers_report(t0).workers.is_empty());
}

#[test]
fn a_calibrated_p90_bound_is_published_after_twenty_first_tokens() {
    let s = state(true);
    report(&s, 1, "w", "m");
    let tokens: Vec<u32> = (0..64).collect();
    let explain = |s: &RouterState| {
        s.explain(&input("m", &tokens), Instant::now())
            .expect("explain")
            .ttft_p90_bound_s
    };
    for i in 0..20 {
        let a = s.pick(&input("m", &tokens), Instant::now()).expect("pick");
        assert!(a.predicted_ttft_s > 0.0, "{a:?}");
        assert!(
            a.ttft_p90_bound_s.is_nan(),
            "no bound before 20 first tokens ({i})"
        );
        // Every first token takes twice its prediction.
        assert!(s.first_token(a.assignment, Some(2.0 * a.predicted_ttft_s), Instant::now()));
        assert!(s.done(a.assignment, Usage::default()));
    }
    assert!(explain(&s).is_finite());
    let a = s.pick(&input("m", &tokens), Instant::now()).expect("pick");
    // The scores are all 2: the bound is twice the prediction.
    assert!(
        (a.ttft_p90_bound_s - 2.0 * a.predicted_ttft_s).abs() < 1e-9,
        "{a:?}"
    );
    assert!(s.first_token(a.assignment, Some(1.5 * a.predicted_ttft_s), Instant::now()));
    let text = s.metrics().encode();
    for line in [
        "kvroute_router_ttft_bound_total{model=\"m\",outcome=\"unbounded\"} 20",
        "kvroute_router_ttft_bound_total{model=\"m\",outcome=\"covered\"} 1",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

#[test]
fn inter_token_gaps_are_observed_from_the_first_token_until_release_or_expiry() {
    let s = state(true);
    report(&s, 1, "w", "m");
    let now = Instant::now();
    let pick = || s.pick(&input("m", &[1, 2, 3]), now).expect("pick");
    let itl_count = |s: &RouterState| {
        let text = s.metrics().encode();
        text.lines()
            .find(|l| l.starts_with("kvroute_router_itl_seconds_count{model=\"m\",worker=\"w\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let a = pick();
    // Before its first token a gap means nothing.
    s.observe_itl(a.assignment, 0.01);
    assert_eq!(itl_count(&s), 0);
    assert!(s.first_token(a.assignment, Some(0.1), now));
    s.observe_itl(a.assignment, 0.01);
    s.observe_itl(a.assignment, 0.02);
    s.observe_itl(a.assignment, f64::NAN);
    s.observe_itl(a.assignment, -1.0);
    assert_eq!(itl_count(&s), 2);
    assert!(s.done(a.assignment, Usage::default()));
    s.observe_itl(a.assignment, 0.01);
    assert_eq!(itl_count(&s), 2, "released: nothing more");
    // An expired assignment keeps no handle either.
    let b = pick();
    assert!(s.first_token(b.assignment, Some(0.1), now));
    assert_eq!(s.expire(now + Duration::from_secs(3600)), 1);
    s.observe_itl(b.assignment, 0.01);
    assert_eq!(itl_count(&s), 2);
    assert!(
        s.0.taps.lock().streams.is_empty(),
        "no handle outlives its assignment"
    );
}

#[test]
fn relayed_chunks_keep_each_workers_step_clock() {
    let s = state(true);
    report(&s, 1, "w", "m");
    let now = Instant::now();
    let a = s.pick(&input("m", &[1, 2, 3]), now).expect("pick");
    assert!(s.first_token(a.assignment, Some(0.1), now));
    let w = s.0.taps.lock().streams.get(&a.assignment).map(|(w, _)| *w);
    let w = w.expect("a stream past its first token");
    assert_eq!(
        s.0.taps.lock().steps.step_len(w),
        None,
        "one step end: no length"
    );
    // The next chunk, more than the merge window later, ends the next step.
    std::thread::sleep(Duration::from_millis(20));
    s.observe_itl(a.assignment, 0.02);
    let len = s.0.taps.lock().steps.step_len(w);
    assert!(len.is_some_and(|l| l >= 0.015), "{len:?}");
    // Retired, the worker's clock goes with it: a worker that reuses its id starts with none.
    s.sidecar_closed(1, "w", now);
    let later = now + s.0.config.retire_after + Duration::from_secs(1);
    assert_eq!(s.retire_gone(later), 1);
    assert_eq!(s.0.taps.lock().steps.step_len(w), None);
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_decision_log_has_one_line_per_pick_only_when_enabled() {
    let s = state(true);
    report(&s, 1, "w0", "m");
    report(&s, 2, "w1", "m");
    let tokens = [1, 2, 3, 4, 5, 6, 7, 8];
    let pick_with = |filter: &str| {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let a = tracing::subscriber::with_default(subscriber, || {
            s.pick(&input("m", &tokens), Instant::now()).expect("pick")
        });
        let text = String::from_utf8(out.0.lock().expect("buffer").clone()).expect("utf-8");
        (a, text)
    };
    let (a, text) = pick_with("warn,kvroute_router::decisions=debug");
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("decision=")).collect();
    assert_eq!(lines.len(), 1, "{text}");
    let json = lines[0].split_once("decision=").expect("field").1;
    let v: serde_json::Value = serde_json::from_str(json).expect("one JSON object");
    assert_eq!(v["chosen"], a.worker.as_str());
    assert_eq!(v["assignment"], a.assignment.0);
    assert_eq!(v["prompt_tokens"], 8);
    let workers: Vec<&str> = v["candidates"]
        .as_array()
        .expect("candidates")
        .iter()
        .filter_map(|c| c["worker"].as_str())
        .collect();
    assert_eq!(workers.len(), 2);
    assert!(workers.contains(&"w0") && workers.contains(&"w1"));
    assert!(v["candidates"][0]["predicted_ttft"].is_number());
    assert!(!json.contains("\"model\""), "no client model name: {json}");
    // Off (the default filter): nothing.
    let (_, text) = pick_with("warn");
    assert!(!text.contains("decision="), "{text}");
}

#[test]
fn a_listed_workers_step_budget_reaches_the_core_in_either_order() {
    // The TTFT model's whole-steps line counts in each engine's step budget, which
    // discovery reads off the worker's WorkerSet (routing::PredictorConfig's is the default).
    let s = state(true);
    let now = Instant::now();
    let listed = |id: &str, budget: Option<f64>| DiscoveredWorker {
        id: id.into(),
        address: format!("{id}:1"),
        model: "m".into(),
        ready: true,
        step_budget_tokens: budget,
        ..Default::default()
    };
    let budget = |id: &str| {
        let core = s.0.core.lock();
        let w = core.routing.worker_id(id).expect("known");
        core.routing.worker(w).expect("slot").step_budget_tokens
    };
    // Listed first, then its sidecar: set at the snapshot.
    s.set_catalog(Catalog {
        workers: vec![listed("a", Some(8_192.0))],
        ..Default::default()
    });
    s.sidecar_snapshot_start(1, &identity("a", "m"), &[], now)
        .expect("snapshot");
    assert_eq!(budget("a"), Some(8_192.0));
    // Its sidecar first, then listed: set when the catalog arrives; a WorkerSet edit
    // changes it; one that no longer says goes back to the default.
    s.sidecar_snapshot_start(2, &identity("b", "m"), &[], now)
        .expect("snapshot");
    assert_eq!(budget("b"), None);
    s.set_catalog(Catalog {
        workers: vec![listed("a", Some(8_192.0)), listed("b", Some(4_096.0))],
        ..Default::default()
    });
    assert_eq!(budget("b"), Some(4_096.0));
    s.set_catalog(Catalog {
        workers: vec![listed("a", Some(8_192.0)), listed("b", None)],
        ..Default::default()
    });
    assert_eq!(budget("b"), None);
    // /debug/workers shows the budget in use: the set's, else the router's default.
    let shown: Vec<(String, Option<f64>)> = s
        .workers_report(now)
        .workers
        .into_iter()
        .map(|w| (w.id, w.step_budget_tokens))
        .collect();
    assert_eq!(
        shown,
        vec![("a".into(), Some(8_192.0)), ("b".into(), Some(2_048.0))]
    );
}

#[test]
fn a_sidecars_worker_set_is_its_speed_class() {
    // Prefill rates pool only within a speed class (routing::CoreConfig::rate_pool): the
    // WorkerSet a sidecar names, one GPU type per set.
    let s = state(true);
    let now = Instant::now();
    let with_set = |id: &str, set: &str, epoch: u64| SidecarIdentity {
        worker_set: set.into(),
        epoch,
        ..identity(id, "m")
    };
    s.sidecar_snapshot_start(1, &with_set("a", "l40s", 1), &[], now)
        .expect("snapshot");
    s.sidecar_snapshot_start(2, &with_set("b", "h100", 1), &[], now)
        .expect("snapshot");
    let class = |id: &str| {
        let core = s.0.core.lock();
        let w = core.routing.worker_id(id).expect("known");
        core.routing.worker(w).expect("slot").speed_class.clone()
    };
    assert_eq!((class("a"), class("b")), ("l40s".into(), "h100".into()));
    // A later snapshot naming another set moves the worker.
    s.sidecar_snapshot_start(3, &with_set("b", "l40s", 2), &[], now)
        .expect("snapshot");
    assert_eq!(class("b"), "l40s");
    // Sets are per namespace (ids are namespace/pod); no set is no class.
    s.sidecar_snapshot_start(4, &with_set("ns1/p", "l40s", 1), &[], now)
        .expect("snapshot");
    s.sidecar_snapshot_start(5, &with_set("ns2/p", "l40s", 1), &[], now)
        .expect("snapshot");
    s.sidecar_snapshot_start(6, &with_set("ns1/q", "", 1), &[], now)
        .expect("snapshot");
    assert_eq!(class("ns1/p"), "ns1/l40s");
    assert_eq!(class("ns2/p"), "ns2/l40s");
    assert_eq!(class("ns1/q"), "");
}
