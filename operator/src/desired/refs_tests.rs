//! Unit tests of the status-only kinds' status decisions.

use super::*;
use k8s_openapi::jiff::Timestamp;
use kvroute_crds::AnyResource;

fn now() -> Time {
    Time(Timestamp::from_second(1_700_000_000).expect("valid"))
}

fn inventory(yaml: &str) -> Inventory {
    let mut inv = Inventory::default();
    for doc in kvroute_crds::parse_documents(yaml).expect("parses") {
        match doc {
            AnyResource::WorkerSet(w) => inv.worker_sets.push(w),
            AnyResource::Provider(p) => inv.providers.push(p),
            AnyResource::GatewayBackend(b) => inv.backends.push(b),
            AnyResource::Pool(p) => inv.pools.push(p),
            AnyResource::Secret(s) => {
                let keys = s.data.iter().flatten().map(|(k, _)| k.clone());
                let skeys = s.string_data.iter().flatten().map(|(k, _)| k.clone());
                inv.secrets.insert(
                    s.metadata.name.clone().unwrap_or_default(),
                    keys.chain(skeys).collect(),
                );
            }
            AnyResource::Policy(_) | AnyResource::GiePool(_) | AnyResource::Pod(_) => {}
        }
    }
    inv
}

const WORLD: &str = r#"
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: qwen, labels: {tier: gpu}}
spec: {model: {name: Qwen/Qwen3-0.6B, servedName: qwen3}}
status: {replicas: 2, readyReplicas: 2}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: cold, labels: {tier: gpu}}
spec: {model: {name: other}}
status: {replicas: 1, readyReplicas: 0}
---
apiVersion: kvroute.dev/v1alpha1
kind: InferenceProvider
metadata: {name: openai}
spec: {kind: openai, models: [qwen3], gatewayBackendRef: {name: openai}}
status:
  conditions: [{type: Ready, status: "True", reason: Ready, message: "", lastTransitionTime: "2024-01-01T00:00:00Z"}]
---
apiVersion: kvroute.dev/v1alpha1
kind: GatewayBackend
metadata: {name: openai}
spec: {url: "https://api.openai.com", auth: {secretRef: {name: openai, key: token}}}
---
apiVersion: v1
kind: Secret
metadata: {name: openai}
stringData: {token: x}
"#;

fn pool(yaml: &str) -> InferencePoolSpec {
    serde_saphyr::from_str(yaml).expect("pool parses")
}

#[test]
fn pool_lists_ready_targets_per_model_primaries_first() {
    let inv = inventory(WORLD);
    let spec = pool(
        "targets: [{provider: openai, role: overflow}, {workerSetSelector: {matchLabels: {tier: gpu}}}]\nmodelAliases: [{name: chat, model: qwen3}]\n",
    );
    let (models, conds) = pool_status(&spec, Some(1), &[], &inv, &now());
    assert_eq!(models.len(), 1, "cold has no ready workers: {models:?}");
    assert_eq!(models[0].model, "qwen3");
    assert_eq!(models[0].aliases, vec!["chat"]);
    let names: Vec<_> = models[0]
        .ready_targets
        .iter()
        .map(|t| (t.name.as_str(), t.role))
        .collect();
    assert_eq!(
        names,
        vec![
            ("qwen", TargetRole::Primary),
            ("openai", TargetRole::Overflow)
        ]
    );
    assert!(condition::is_true(&conds, READY));
    assert!(condition::is_true(&conds, RESOLVED_REFS));
    let reason = |c: &[Condition]| condition::find(c, TOKENIZER_ROUTING).map(|c| c.reason.clone());
    assert_eq!(reason(&conds).as_deref(), Some("TokenizerRequired"));
    let load_only = pool("targets: [{workerSet: qwen}]\nrouting: {allowLoadOnly: true}\n");
    let (_, conds) = pool_status(&load_only, Some(1), &[], &inv, &now());
    assert_eq!(reason(&conds).as_deref(), Some("LoadOnlyAllowed"));
    // No spec.auth: the pool says its requests are anonymous; the local-only pool has no
    // ProviderTargets condition, the one with a provider target says what the router does.
    let identity = condition::find(&conds, super::super::identity::TENANT_IDENTITY).expect("c");
    assert_eq!(
        (identity.status.as_str(), identity.reason.as_str()),
        ("False", "Anonymous")
    );
    assert!(condition::find(&conds, super::super::identity::PROVIDER_TARGETS).is_none());
    let (_, with_provider) = pool_status(&spec, Some(1), &[], &inv, &now());
    assert!(condition::find(&with_provider, super::super::identity::PROVIDER_TARGETS).is_some());
}

#[test]
fn pool_pointing_at_nothing_says_so() {
    let inv = inventory(WORLD);
    let (models, conds) = pool_status(
        &pool("targets: [{workerSet: ghost}]\n"),
        None,
        &[],
        &inv,
        &now(),
    );
    assert!(models.is_empty());
    let r = condition::find(&conds, READY).expect("ready");
    assert_eq!(
        (r.status.as_str(), r.reason.as_str()),
        ("False", "RefNotFound")
    );
    assert!(r.message.contains("\"ghost\" not found"));
    let (_, conds) = pool_status(
        &pool("targets: [{workerSetSelector: {matchLabels: {tier: tpu}}}]\n"),
        None,
        &[],
        &inv,
        &now(),
    );
    assert!(
        condition::find(&conds, READY)
            .expect("ready")
            .message
            .contains("matches no")
    );
    let (_, conds) = pool_status(
        &pool("targets: [{workerSet: cold}]\n"),
        None,
        &[],
        &inv,
        &now(),
    );
    assert_eq!(
        condition::find(&conds, READY).expect("ready").reason,
        "NoReadyTargets"
    );
}

#[test]
fn backend_secret_must_have_the_key() {
    let inv = inventory(WORLD);
    let spec: GatewayBackendSpec =
        serde_saphyr::from_str("url: https://x\nauth: {secretRef: {name: openai, key: apiKey}}\n")
            .expect("parses");
    let conds = backend_conditions(&spec, None, &[], &inv, &now());
    let r = condition::find(&conds, RESOLVED_REFS).expect("refs");
    assert_eq!(r.status, "False");
    assert!(r.message.contains("has no key \"apiKey\""), "{}", r.message);
    let spec: GatewayBackendSpec =
        serde_saphyr::from_str("url: https://x\nauth: {secretRef: {name: openai, key: token}}\n")
            .expect("parses");
    // Valid and resolved: the router relays through it.
    let conds = backend_conditions(&spec, None, &[], &inv, &now());
    assert!(condition::is_true(&conds, ACCEPTED));
    assert!(condition::is_true(&conds, RESOLVED_REFS));
    let ready = condition::find(&conds, READY).expect("ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", ENFORCED)
    );
    assert_eq!(
        ready.message,
        "the router relays overflow requests through this backend: TLS verified against the platform roots, bearer credential"
    );
    assert!(settled(&conds));
    assert!(condition::find(&conds, TLS_VERIFIED).is_none());
    // Certificate checks off: still relayed, and said so in a False condition.
    let spec: GatewayBackendSpec = serde_saphyr::from_str(
        "url: https://x\ntls: {insecureSkipVerify: true, sni: api.example}\nauth: {secretRef: {name: openai, key: token}, type: header, headerName: x-api-key}\n",
    )
    .expect("parses");
    let conds = backend_conditions(&spec, None, &[], &inv, &now());
    let ready = condition::find(&conds, READY).expect("ready");
    assert_eq!(ready.status, "True");
    assert!(
        ready.message.contains("without certificate verification")
            && ready.message.contains("server name \"api.example\"")
            && ready.message.contains("header \"x-api-key\""),
        "{}",
        ready.message
    );
    let tls = condition::find(&conds, TLS_VERIFIED).expect("tls condition");
    assert_eq!(
        (tls.status.as_str(), tls.reason.as_str()),
        ("False", "InsecureSkipVerify")
    );
    let spec: GatewayBackendSpec =
        serde_saphyr::from_str("url: https://x\nauth: {secretRef: {name: nope, key: token}}\n")
            .expect("parses");
    assert!(
        condition::find(&backend_conditions(&spec, None, &[], &inv, &now()), READY)
            .expect("ready")
            .message
            .contains("not found")
    );
}

#[test]
fn provider_waits_for_its_backend() {
    let inv = inventory(WORLD);
    let spec: InferenceProviderSpec =
        serde_saphyr::from_str("kind: openai\nmodels: [m]\ngatewayBackendRef: {name: openai}\n")
            .expect("parses");
    // The backend exists but has no status yet: wait for it.
    let conds = provider_conditions(&spec, None, &[], &inv, &now());
    assert!(condition::is_true(&conds, RESOLVED_REFS));
    assert_eq!(
        condition::find(&conds, READY).expect("ready").reason,
        "BackendNotAccepted"
    );
    assert!(!settled(&conds));
    // Once the backend is Ready, the router relays to the provider.
    let mut inv = inv;
    let backend_conds = backend_conditions(&inv.backends[0].spec, None, &[], &inv, &now());
    inv.backends[0].status = Some(GatewayBackendStatus {
        observed_generation: None,
        conditions: backend_conds,
    });
    let conds = provider_conditions(&spec, None, &[], &inv, &now());
    let ready = condition::find(&conds, READY).expect("ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", ENFORCED)
    );
    assert_eq!(
        ready.message,
        "the router relays overflow to 1 model(s) via GatewayBackend \"openai\""
    );
    assert!(condition::find(&conds, OPENAI_CLIENTS).is_none());
    // An Anthropic provider with limits: OpenAI clients are not translated to it.
    let anthropic: InferenceProviderSpec = serde_saphyr::from_str(
        "kind: anthropic\nmodels: [c]\nlimits: {requestsPerMinute: 60, maxConcurrency: 4}\ngatewayBackendRef: {name: openai}\n",
    )
    .expect("parses");
    let conds = provider_conditions(&anthropic, None, &[], &inv, &now());
    let ready = condition::find(&conds, READY).expect("ready");
    assert!(
        ready
            .message
            .ends_with("limits 60 requests/min, 4 in flight kept by each router replica"),
        "{}",
        ready.message
    );
    let openai = condition::find(&conds, OPENAI_CLIENTS).expect("openai clients");
    assert_eq!(
        (openai.status.as_str(), openai.reason.as_str()),
        ("False", "NotTranslated")
    );
    let spec: InferenceProviderSpec =
        serde_saphyr::from_str("kind: openai\nmodels: [m]\ngatewayBackendRef: {name: nope}\n")
            .expect("parses");
    assert_eq!(
        condition::find(&provider_conditions(&spec, None, &[], &inv, &now()), READY)
            .expect("r")
            .reason,
        "RefNotFound"
    );
}

#[test]
fn policy_refs_and_invalid_spec() {
    let inv = inventory(WORLD);
    let spec: InferencePolicySpec = serde_saphyr::from_str(
            "pool: chat\nrules: [{name: a, actions: {route: {allowedTargets: [qwen, ghost]}, overflow: {provider: openai, queueThreshold: 4}}}]\n",
        )
        .expect("parses");
    let conds = policy_conditions(&spec, None, &[], &inv, &now());
    let msg = &condition::find(&conds, RESOLVED_REFS)
        .expect("refs")
        .message;
    assert!(
        msg.contains("InferencePool \"chat\" not found") && msg.contains("\"ghost\""),
        "{msg}"
    );
    assert!(!msg.contains("openai"));
    let bad: InferencePolicySpec =
        serde_saphyr::from_str("rules: [{name: a, actions: {}}]\n").expect("parses");
    let conds = policy_conditions(&bad, None, &[], &inv, &now());
    assert_eq!(
        condition::find(&conds, READY).expect("r").reason,
        "InvalidSpec"
    );
    let accepted = condition::find(&conds, ACCEPTED).expect("accepted");
    assert_eq!(
        (accepted.status.as_str(), accepted.reason.as_str()),
        ("False", "InvalidSpec")
    );
    assert!(!settled(&conds));
}

#[test]
fn a_valid_policy_that_compiles_is_ready_and_enforced() {
    let inv = inventory(WORLD);
    let spec: InferencePolicySpec = serde_saphyr::from_str(
            "rules: [{name: a, actions: {route: {allowedTargets: [qwen]}, overflow: {provider: openai, queueThreshold: 4}}}]\n",
        )
        .expect("parses");
    let conds = policy_conditions(&spec, Some(2), &[], &inv, &now());
    let types: Vec<&str> = conds.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, vec![ACCEPTED, RESOLVED_REFS, READY]);
    assert!(condition::is_true(&conds, ACCEPTED));
    assert!(condition::is_true(&conds, RESOLVED_REFS));
    assert!(condition::is_true(&conds, READY));
    let ready = condition::find(&conds, READY).expect("ready");
    assert_eq!(ready.reason, ENFORCED);
    assert_eq!(ready.message, "1 rules enforced by the router");
    assert!(settled(&conds), "nothing to re-check soon");
    let events = ready_events(&[], &conds);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].severity, Severity::Normal);
    assert!(ready_events(&conds, &conds).is_empty());
}

#[test]
fn a_route_model_must_be_served_by_a_worker_set() {
    let inv = inventory(WORLD);
    let served: InferencePolicySpec =
        serde_saphyr::from_str("rules: [{name: a, actions: {route: {model: other}}}]\n")
            .expect("parses");
    let conds = policy_conditions(&served, None, &[], &inv, &now());
    assert!(condition::is_true(&conds, READY), "{conds:?}");
    let ghost: InferencePolicySpec =
        serde_saphyr::from_str("rules: [{name: a, actions: {route: {model: ghost-8b}}}]\n")
            .expect("parses");
    let conds = policy_conditions(&ghost, None, &[], &inv, &now());
    let refs = condition::find(&conds, RESOLVED_REFS).expect("refs");
    assert_eq!(refs.status, "False");
    assert!(
        refs.message
            .contains("route.model: no InferenceWorkerSet serves model \"ghost-8b\""),
        "{}",
        refs.message
    );
    assert!(!condition::is_true(&conds, READY));
}

#[test]
fn a_policy_the_engine_refuses_is_not_accepted_with_its_message() {
    let inv = inventory(WORLD);
    // Valid for the CRD schema, refused by the compiler: an uppercase label, a bad header.
    let spec: InferencePolicySpec = serde_saphyr::from_str(
        "rules: [{name: a, match: {labels: [PII], headers: [{name: \"x y\"}]}, actions: {route: {localOnly: true}}}]\n",
    )
    .expect("parses");
    let conds = policy_conditions(&spec, None, &[], &inv, &now());
    let accepted = condition::find(&conds, ACCEPTED).expect("accepted");
    assert_eq!(accepted.status, "False");
    assert!(
        accepted.message.contains("spec.rules[0].match.labels")
            && accepted.message.contains("lowercase")
            && accepted.message.contains("not a valid header name"),
        "{}",
        accepted.message
    );
    let ready = condition::find(&conds, READY).expect("ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InvalidSpec")
    );
}

#[test]
fn a_provider_as_route_target_is_not_ready() {
    let inv = inventory(WORLD);
    let spec: InferencePolicySpec = serde_saphyr::from_str(
        "rules: [{name: a, actions: {route: {allowedTargets: [openai]}}}]\n",
    )
    .expect("parses");
    let conds = policy_conditions(&spec, None, &[], &inv, &now());
    assert!(condition::is_true(&conds, RESOLVED_REFS));
    let ready = condition::find(&conds, READY).expect("ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", UNROUTABLE_TARGET)
    );
    assert!(ready.message.contains("\"openai\""), "{}", ready.message);
}

#[test]
fn pool_settles_only_when_ready() {
    let inv = inventory(WORLD);
    let (_, conds) = pool_status(
        &pool("targets: [{workerSet: qwen}]\n"),
        None,
        &[],
        &inv,
        &now(),
    );
    assert!(condition::is_true(&conds, ACCEPTED) && condition::is_true(&conds, READY));
    assert!(settled(&conds));
    let (_, waiting) = pool_status(
        &pool("targets: [{workerSet: cold}]\n"),
        None,
        &[],
        &inv,
        &now(),
    );
    assert!(!settled(&waiting));
    let events = ready_events(&conds, &waiting);
    assert_eq!(
        (events[0].severity, events[0].reason.as_str()),
        (Severity::Warning, "NoReadyTargets")
    );
    assert_eq!(ready_events(&waiting, &conds)[0].severity, Severity::Normal);
}

#[test]
fn generic_decision_needs_what_it_reads_and_keeps_transition_times() {
    let backend: GatewayBackend = serde_saphyr::from_str(
            "apiVersion: kvroute.dev/v1alpha1\nkind: GatewayBackend\nmetadata: {name: b, generation: 5}\nspec: {url: 'https://x', tls: {caSecretRef: {name: s, key: ca}}, auth: {secretRef: {name: s, key: token}}}\n",
        )
        .expect("parses");
    let needs = backend.needs();
    assert_eq!(needs.secrets, BTreeSet::from(["s".to_string()]));
    assert!(!needs.worker_sets && !needs.providers && !needs.pools && !needs.backends);
    let mut inv = Inventory::default();
    inv.secrets.insert(
        "s".into(),
        BTreeSet::from(["ca".to_string(), "token".to_string()]),
    );
    inv.router_mounts = Some(BTreeSet::from(["s".to_string()]));
    let first = backend.decide(&inv, &now());
    assert_eq!(first.observed_generation, Some(5));
    let conditions = GatewayBackend::conditions(&first);
    assert_eq!(conditions.len(), 4);
    assert!(condition::is_true(conditions, SECRETS_MOUNTED));
    assert!(settled(conditions));
    inv.router_mounts = Some(BTreeSet::new());
    let pending = backend.decide(&inv, &now());
    let c = condition::find(GatewayBackend::conditions(&pending), SECRETS_MOUNTED).expect("c");
    assert_eq!(c.reason, "MountPending");
    assert!(!settled(GatewayBackend::conditions(&pending)));
    inv.router_mounts = Some(BTreeSet::from(["s".to_string()]));
    let mut seen = backend.clone();
    seen.status = Some(first.clone());
    let later = Time(Timestamp::from_second(1_700_000_600).expect("valid"));
    assert_eq!(
        seen.decide(&inv, &later),
        first,
        "unchanged: nothing to write"
    );
    let policy: InferencePolicy = serde_saphyr::from_str(
            "apiVersion: kvroute.dev/v1alpha1\nkind: InferencePolicy\nmetadata: {name: p}\nspec: {rules: [{name: a, actions: {route: {localOnly: true}}}]}\n",
        )
        .expect("parses");
    let needs = policy.needs();
    assert!(needs.worker_sets && needs.providers && needs.pools && needs.secrets.is_empty());
}

#[test]
fn selector_expressions() {
    let labels = BTreeMap::from([("a".to_string(), "1".to_string())]);
    let sel: LabelSelector = serde_json::from_value(serde_json::json!({"matchExpressions": [
            {"key": "a", "operator": "In", "values": ["1", "2"]}, {"key": "b", "operator": "DoesNotExist"}]})).expect("sel");
    assert!(selector_matches(&sel, &labels));
    let sel: LabelSelector = serde_json::from_value(
        serde_json::json!({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}),
    )
    .expect("sel");
    assert!(!selector_matches(&sel, &labels));
}
