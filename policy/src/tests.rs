use kvroute_crds::InferencePolicy;

use super::*;

fn policy(ns: &str, name: &str, spec_yaml: &str) -> InferencePolicy {
    let spec = serde_saphyr::from_str(spec_yaml).expect("spec parses");
    let mut p = InferencePolicy::new(name, spec);
    p.metadata.namespace = Some(ns.into());
    p
}

fn set(policies: &[InferencePolicy]) -> PolicySet {
    compile(policies).expect("compiles")
}

fn facts(model: &str) -> RequestFacts<'_> {
    let mut f = RequestFacts::for_model(model);
    f.pool = Some("ml/chat");
    f
}

fn rule_of(s: &PolicySet, f: &RequestFacts<'_>, pool: &PoolState) -> Option<String> {
    s.evaluate(f, pool).rule().map(str::to_string)
}

const ORDERED: &str = r#"
rules:
- name: first
  match: {models: [m]}
  actions: {route: {localOnly: true}}
- name: second
  actions: {reject: {status: 451, message: no}}
"#;

#[test]
fn first_match_wins_and_the_default_is_no_action() {
    let s = set(&[policy("ml", "p", ORDERED)]);
    let none = PoolState::default();
    let v = s.evaluate(&facts("m"), &none);
    assert_eq!((v.policy(), v.rule()), (Some("ml/p"), Some("first")));
    assert!(v.local_only());
    assert_eq!(v.matched.map(|m| m.index), Some(0));
    let v = s.evaluate(&facts("other"), &none);
    assert_eq!(v.rule(), Some("second"));
    assert_eq!(
        v.reject().map(|r| (r.status, &*r.message)),
        Some((451, "no"))
    );
    // Another namespace: no policy applies.
    let mut f = facts("m");
    f.pool = Some("other/chat");
    assert_eq!(s.evaluate(&f, &none), Verdict::default());
    assert_eq!(s.evaluate(&f, &none).action(), None);
}

#[test]
fn pool_policies_come_before_namespace_policies_and_names_order_policies() {
    let ns_wide = policy(
        "ml",
        "a-everywhere",
        "rules: [{name: ns, actions: {route: {localOnly: true}}}]",
    );
    let pooled = policy(
        "ml",
        "z-chat",
        "pool: chat\nrules: [{name: pool, actions: {route: {localOnly: true}}}]",
    );
    let other_pool = policy(
        "ml",
        "b-other",
        "pool: other\nrules: [{name: other, actions: {route: {localOnly: true}}}]",
    );
    let s = set(&[ns_wide, pooled, other_pool]);
    let none = PoolState::default();
    assert_eq!(rule_of(&s, &facts("m"), &none).as_deref(), Some("pool"));
    let mut f = facts("m");
    f.pool = Some("ml/embeddings");
    assert_eq!(rule_of(&s, &f, &none).as_deref(), Some("ns"));
    f.pool = None;
    assert_eq!(rule_of(&s, &f, &none).as_deref(), Some("ns"));
    assert_eq!(s.policies().len(), 3);
    assert_eq!(s.rule_count(), 3);
}

#[test]
fn each_request_matcher() {
    let s = set(&[policy(
        "ml",
        "p",
        r#"
rules:
- name: tenant
  match: {tenants: [acme]}
  actions: {route: {localOnly: true}}
- name: alias
  match: {models: [qwen-backend]}
  actions: {route: {localOnly: true}}
- name: labels
  match: {labels: [pii, "pii:email"]}
  actions: {route: {localOnly: true}}
- name: header
  match: {headers: [{name: X-Team, value: red}]}
  actions: {route: {localOnly: true}}
- name: header-any
  match: {headers: [{name: x-debug}]}
  actions: {route: {localOnly: true}}
- name: class
  match: {serviceClasses: [batch]}
  actions: {route: {localOnly: true}}
- name: big
  match: {promptTokens: {atLeast: 4000}}
  actions: {route: {localOnly: true}}
- name: long-output
  match: {maxOutputTokens: {atLeast: 1000, below: 2000}}
  actions: {route: {localOnly: true}}
"#,
    )]);
    let none = PoolState::default();
    let check = |f: &RequestFacts<'_>, want: Option<&str>| {
        assert_eq!(rule_of(&s, f, &none).as_deref(), want, "{f:?}");
    };
    let mut f = facts("m");
    check(&f, None);
    f.tenant = Some("acme");
    check(&f, Some("tenant"));
    f.tenant = Some("other");
    check(&f, None);

    let mut f = facts("chat");
    f.backend_model = Some("qwen-backend");
    check(&f, Some("alias"));

    let mut f = facts("m");
    f.labels = &["pii"];
    check(&f, None); // both labels are required
    f.labels = &["size:small", "pii:email", "pii"];
    check(&f, Some("labels"));
    f.labels = &["unknown-label"];
    check(&f, None);

    let red: &[(&str, &str)] = &[("x-team", "red")];
    let blue: &[(&str, &str)] = &[("X-TEAM", "blue")];
    let debug: &[(&str, &str)] = &[("X-Debug", "")];
    let mut f = facts("m");
    f.headers = &red;
    check(&f, Some("header"));
    f.headers = &blue;
    check(&f, None);
    f.headers = &debug;
    check(&f, Some("header-any"));

    let mut f = facts("m");
    f.service_class = Some("batch");
    check(&f, Some("class"));
    f.service_class = Some("interactive");
    check(&f, None);

    let mut f = facts("m");
    f.prompt_tokens = 3999;
    check(&f, None);
    f.prompt_tokens = 4000;
    check(&f, Some("big"));

    let mut f = facts("m");
    f.max_output_tokens = Some(1500);
    check(&f, Some("long-output"));
    f.max_output_tokens = Some(2000);
    check(&f, None);
    f.max_output_tokens = None;
    check(&f, None);
}

#[test]
fn each_pool_state_matcher_and_unknown_figures() {
    let s = set(&[policy(
        "ml",
        "p",
        r#"
rules:
- name: slow
  match: {poolState: {bestTtftMs: {atLeast: 2000}}}
  actions: {route: {localOnly: true}}
- name: best-queue
  match: {poolState: {bestQueue: {atLeast: 8}}}
  actions: {route: {localOnly: true}}
- name: total-queue
  match: {poolState: {totalQueue: {atLeast: 20}}}
  actions: {route: {localOnly: true}}
- name: kv-full
  match: {poolState: {minKvUsagePercent: {atLeast: 90}}}
  actions: {route: {localOnly: true}}
- name: kv-mean
  match: {poolState: {meanKvUsagePercent: {atLeast: 70}}}
  actions: {route: {localOnly: true}}
- name: gpu-min
  match: {poolState: {minGpuUsagePercent: {atLeast: 95}}}
  actions: {route: {localOnly: true}}
- name: gpu-idle
  match: {poolState: {meanGpuUsagePercent: {below: 10}}}
  actions: {route: {localOnly: true}}
"#,
    )]);
    let f = facts("m");
    let state = |fill: &dyn Fn(&mut PoolState)| {
        let mut p = PoolState::default();
        fill(&mut p);
        rule_of(&s, &f, &p)
    };
    assert_eq!(state(&|_| {}), None, "unknown figures match no range");
    assert_eq!(
        state(&|p| p.best_ttft_s = Some(2.5)).as_deref(),
        Some("slow")
    );
    assert_eq!(state(&|p| p.best_ttft_s = Some(1.999)), None);
    assert_eq!(
        state(&|p| p.best_queue = Some(8)).as_deref(),
        Some("best-queue")
    );
    assert_eq!(
        state(&|p| p.total_queue = Some(25)).as_deref(),
        Some("total-queue")
    );
    assert_eq!(
        state(&|p| p.kv_usage_min = Some(0.95)).as_deref(),
        Some("kv-full")
    );
    assert_eq!(
        state(&|p| p.kv_usage_mean = Some(0.75)).as_deref(),
        Some("kv-mean")
    );
    assert_eq!(
        state(&|p| p.gpu_usage_min = Some(0.97)).as_deref(),
        Some("gpu-min")
    );
    assert_eq!(
        state(&|p| p.gpu_usage_mean = Some(0.05)).as_deref(),
        Some("gpu-idle")
    );
}

#[test]
fn pool_state_builder_folds_candidates() {
    let mut b = PoolStateBuilder::default();
    assert_eq!(b.finish(), PoolState::default());
    b.add(0.5, 3, 0.4, Some(0.9));
    b.add(0.2, 7, 0.8, None);
    b.add(f64::NAN, 1, 0.6, Some(0.5));
    let p = b.finish();
    assert_eq!(p.best_ttft_s, Some(0.2));
    assert_eq!(p.best_queue, Some(7));
    assert_eq!(p.total_queue, Some(11));
    assert_eq!(p.kv_usage_min, Some(0.4));
    assert!((p.kv_usage_mean.expect("mean") - 0.6).abs() < 1e-9);
    assert_eq!(p.gpu_usage_min, Some(0.5));
    assert!((p.gpu_usage_mean.expect("mean") - 0.7).abs() < 1e-9);
}

#[test]
fn each_action_compiles_to_its_verdict() {
    let s = set(&[policy(
        "ml",
        "p",
        r#"
rules:
- name: all-but-reject
  actions:
    route:
      allowedTargets: [a, b]
      preferredTargets: [a]
      weights: [{target: a, weight: 3}, {target: b, weight: 1}]
    overflow: {provider: cloud, ttftThresholdMs: 1500, queueThreshold: 4}
    limits: {requestsPerMinute: 60, tokensPerMinute: 1000, maxConcurrency: 2}
    serviceClass: {name: batch, ttftTargetMs: 800, sheddable: true}
"#,
    )]);
    let v = s.evaluate(&facts("m"), &PoolState::default());
    let route = v.route().expect("route");
    assert!(route.allows("a") && route.allows("b") && !route.allows("c"));
    assert!(route.prefers("a") && !route.prefers("b"));
    assert!(!v.local_only());
    let o = v.overflow().expect("overflow");
    assert_eq!(&*o.provider, "cloud");
    assert_eq!(o.ttft_threshold_s, Some(1.5));
    assert_eq!(o.queue_threshold, Some(4));
    let busy = PoolState {
        best_ttft_s: Some(0.1),
        best_queue: Some(5),
        total_queue: Some(5),
        ..PoolState::default()
    };
    let slow = PoolState {
        best_ttft_s: Some(2.0),
        best_queue: Some(0),
        total_queue: Some(0),
        ..PoolState::default()
    };
    let calm = PoolState {
        best_ttft_s: Some(0.1),
        best_queue: Some(1),
        total_queue: Some(1),
        ..PoolState::default()
    };
    assert!(o.triggered(&busy) && o.triggered(&slow) && !o.triggered(&calm));
    assert!(o.triggered(&PoolState::default()), "no local candidate");
    assert_eq!(
        v.limits().copied(),
        Some(Limits {
            requests_per_minute: Some(60),
            tokens_per_minute: Some(1000),
            max_concurrency: Some(2),
        })
    );
    let c = v.service_class().expect("class");
    assert_eq!(
        (c.name.as_deref(), c.ttft_target_s, c.sheddable),
        (Some("batch"), Some(0.8), true)
    );
    // Weighted draws: deterministic per seed, in proportion over many seeds.
    assert_eq!(route.weighted_target(42), route.weighted_target(42));
    let a = (0..4000u64)
        .filter(|s| route.weighted_target(*s) == Some("a"))
        .count();
    // Binomial(4000, 0.75): sd ≈ 27.4; 5 sd either side.
    assert!((2863..=3137).contains(&a), "{a}");
}

#[test]
fn a_route_model_compiles_to_a_switch_that_keeps_when_faster_by_default() {
    let s = set(&[policy(
        "ml",
        "p",
        r#"
rules:
- name: small-to-8b
  match: {labels: [size:small]}
  actions: {route: {model: llama-8b, localOnly: true}}
- name: always
  actions: {route: {model: llama-8b, keepWhenCached: false}}
"#,
    )]);
    let mut f = facts("llama-70b");
    f.labels = &["size:small"];
    let v = s.evaluate(&f, &PoolState::default());
    let switch = v.route().and_then(|r| r.switch.as_ref()).expect("switch");
    assert_eq!(
        (&*switch.model, switch.keep_when_cached),
        ("llama-8b", true)
    );
    assert!(v.local_only());
    let v = s.evaluate(&facts("llama-70b"), &PoolState::default());
    let switch = v.route().and_then(|r| r.switch.as_ref()).expect("switch");
    assert!(!switch.keep_when_cached);
    // A model switch names no WorkerSets: targets of one model cannot restrict it.
    let issues = compile(&[policy(
        "ml",
        "bad",
        "rules: [{name: r, actions: {route: {model: m8, allowedTargets: [big]}}}]",
    )])
    .expect_err("refused");
    assert_eq!(issues[0].field, "spec.rules[0].actions.route.model");
}

#[test]
fn local_only_suppresses_overflow() {
    let s = set(&[policy(
        "ml",
        "p",
        "rules: [{name: pii, actions: {route: {localOnly: true}, overflow: {provider: x, queueThreshold: 1}}}]",
    )]);
    let v = s.evaluate(&facts("m"), &PoolState::default());
    assert!(v.local_only());
    assert_eq!(v.overflow(), None);
}

#[test]
fn invalid_policies_are_reported_by_name() {
    let good = policy("ml", "good", ORDERED);
    let bad = policy(
        "ml",
        "bad",
        r#"
rules:
- name: r
  match: {labels: [PII], headers: [{name: "bad header"}]}
  actions: {reject: {}, route: {}}
- name: r
  actions: {limits: {requestsPerMinute: 0}}
"#,
    );
    let issues = compile(&[good.clone(), bad]).expect_err("refused");
    assert!(issues.iter().all(|i| i.policy == "ml/bad"), "{issues:?}");
    let text: Vec<String> = issues.iter().map(ToString::to_string).collect();
    let all = text.join("\n");
    for want in [
        "policy ml/bad: spec.rules[0].actions: reject cannot be combined",
        "spec.rules[1].name: duplicate rule name",
        "spec.rules[0].match.labels: label \"PII\" must be lowercase",
        "spec.rules[0].match.headers: \"bad header\" is not a valid header name",
        "spec.rules[1].actions.limits.requestsPerMinute: must be positive",
    ] {
        assert!(all.contains(want), "missing {want:?} in\n{all}");
    }
    // The same name twice (possible in a static file) is refused too.
    let issues = compile(&[good.clone(), good]).expect_err("duplicate");
    assert_eq!(issues[0].field, "metadata.name");
    // An empty set compiles and matches nothing.
    assert_eq!(
        compile(&[])
            .expect("empty")
            .evaluate(&facts("m"), &PoolState::default()),
        Verdict::default()
    );
}

#[test]
fn too_many_distinct_labels_are_refused() {
    let labels: Vec<String> = (0..=MAX_DISTINCT_LABELS).map(|i| format!("l{i}")).collect();
    let yaml = format!(
        "rules: [{{name: r, match: {{labels: [{}]}}, actions: {{route: {{localOnly: true}}}}}}]",
        labels.join(", ")
    );
    let issues = compile(&[policy("ml", "p", &yaml)]).expect_err("too many");
    assert!(issues[0].message.contains("distinct labels"), "{issues:?}");
}

#[test]
fn weighted_choice_and_seeds() {
    assert_eq!(weighted_choice(1, [0u32, 0].into_iter()), None);
    assert_eq!(weighted_choice(1, [0u32, 5].into_iter()), Some(1));
    assert_eq!(seed_of("req-1"), seed_of("req-1"));
    assert_ne!(seed_of("req-1"), seed_of("req-2"));
    assert_ne!(mix(1), mix(2));
}
