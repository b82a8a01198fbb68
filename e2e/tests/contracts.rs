//! Contracts between components that are configured by another component: the operator
//! starts the router with environment variables, and every one of them must be a flag the
//! router actually reads (clap ignores unknown env vars silently, so a typo would go unseen),
//! or one of the Hugging Face variables its tokenizer download reads.

use clap::CommandFactory;
use kvroute_operator::desired::OperatorConfig;
use kvroute_operator::desired::router::desired_router;
use kvroute_operator::desired::tls::{TlsMode, Transport, secure_router, secure_workerset};
use kvroute_operator::desired::workerset::deployment::desired_deployment;

#[derive(clap::Parser)]
struct RouterCli {
    #[command(flatten)]
    args: kvroute_router::Args,
}

#[derive(clap::Parser)]
struct SidecarCli {
    #[command(flatten)]
    args: kvroute_sidecar::Args,
}

fn cfg() -> OperatorConfig {
    OperatorConfig {
        sidecar_image: "s".into(),
        mock_image: "m".into(),
        router_image: "r".into(),
        router_replicas: 2,
        router_namespace: "kvroute-system".into(),
        watch_namespace: String::new(),
        mtls: true,
        gie_inference_pool: String::new(),
        otlp_endpoint: String::new(),
        tokenizer_fetch: Default::default(),
    }
}

fn container<'a>(
    d: &'a k8s_openapi::api::apps::v1::Deployment,
    name: &str,
) -> &'a k8s_openapi::api::core::v1::Container {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.iter().find(|c| c.name == name))
        .unwrap_or_else(|| panic!("container {name}"))
}

fn container_args(d: &k8s_openapi::api::apps::v1::Deployment, name: &str) -> Vec<String> {
    container(d, name).args.clone().unwrap_or_default()
}

/// The container's literal env vars as the flags of `cmd` they set, then its arguments: the
/// command line the process effectively gets.
fn effective_args(
    cmd: &clap::Command,
    d: &k8s_openapi::api::apps::v1::Deployment,
    name: &str,
) -> Vec<String> {
    let c = container(d, name);
    let mut out = vec![name.to_string()];
    for var in c.env.iter().flatten() {
        let Some(value) = &var.value else { continue };
        let Some(arg) = cmd
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|e| e == var.name.as_str()))
        else {
            continue;
        };
        let Some(long) = arg.get_long() else { continue };
        if arg.get_action().takes_values() {
            out.push(format!("--{long}={value}"));
        } else if value == "true" {
            out.push(format!("--{long}"));
        }
    }
    out.extend(container_args(d, name));
    out
}

/// The TLS flags the operator passes (as arguments, after `--mtls`) parse as the router's
/// and the sidecar's own flags, with the values the operator meant.
#[test]
fn operator_tls_arguments_are_router_and_sidecar_flags() {
    let cfg = cfg();
    let mut router = desired_router(&cfg, &Default::default()).deployment;
    let transport = Transport {
        mode: TlsMode::OperatorCa,
        gateway_secret: Some("gateway-cert".into()),
        pools: vec![("team-a".into(), "chat".into())],
    };
    secure_router(&mut router, &transport);
    let args = container_args(&router, "router");
    assert!(args.iter().any(|a| a == "--grpc-tls-dir"), "{args:?}");
    let parsed = <RouterCli as clap::Parser>::try_parse_from(effective_args(
        &RouterCli::command(),
        &router,
        "router",
    ))
    .unwrap_or_else(|e| panic!("router rejects the operator's arguments {args:?}: {e}"));
    assert!(parsed.args.grpc_tls_dir.is_some());
    assert!(parsed.args.gateway_tls_dir.is_some());
    assert!(parsed.args.admin_token_file.is_some());

    let ws: kvroute_crds::InferenceWorkerSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "kvroute.dev/v1alpha1", "kind": "InferenceWorkerSet",
        "metadata": {"name": "qwen", "namespace": "team-a", "uid": "u-1"},
        "spec": {"model": {"name": "m"}, "engine": {"mode": "mock"}},
    }))
    .expect("workerset");
    let mut workers = desired_deployment(&ws, &cfg).expect("deployment");
    secure_workerset(&mut workers, &ws, &cfg, &TlsMode::OperatorCa);
    let args = container_args(&workers, "sidecar");
    assert!(args.iter().any(|a| a == "--router-tls-dir"), "{args:?}");
    let parsed = <SidecarCli as clap::Parser>::try_parse_from(effective_args(
        &SidecarCli::command(),
        &workers,
        "sidecar",
    ))
    .unwrap_or_else(|e| panic!("sidecar rejects the operator's arguments {args:?}: {e}"));
    assert!(parsed.args.router_tls_dir.is_some());
    assert_eq!(
        parsed.args.router_tls_server_name,
        "kvroute-router-ingest.kvroute-system.svc"
    );
}

#[test]
fn operator_sets_only_router_flags_that_exist() {
    let known: Vec<String> = RouterCli::command()
        .get_arguments()
        .filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned()))
        .collect();
    for watch in ["", "team-a"] {
        let cfg = OperatorConfig {
            sidecar_image: "s".into(),
            mock_image: "m".into(),
            router_image: "r".into(),
            router_replicas: 2,
            router_namespace: "kvroute-system".into(),
            watch_namespace: watch.into(),
            mtls: true,
            gie_inference_pool: String::new(),
            otlp_endpoint: String::new(),
            tokenizer_fetch: Default::default(),
        };
        let objects = desired_router(&cfg, &Default::default());
        let spec = objects.deployment.spec.expect("deployment spec");
        let pod = spec.template.spec.expect("pod spec");
        let env = pod.containers[0].env.clone().unwrap_or_default();
        assert!(!env.is_empty());
        for var in env {
            assert!(
                known.contains(&var.name)
                    || kvroute_router::tokenizer_source::HUB_ENV.contains(&var.name.as_str()),
                "the router has no flag for {} (known: {known:?})",
                var.name
            );
            assert!(
                var.value.as_deref().is_some_and(|v| !v.is_empty())
                    || var
                        .value_from
                        .as_ref()
                        .and_then(|v| v.field_ref.as_ref())
                        .is_some_and(|f| !f.field_path.is_empty()),
                "{} is empty",
                var.name
            );
        }
    }
}

/// The tokenizer download settings the operator takes reach the router as the numbers the
/// operator was given, and the operator's defaults (which it does not pass on) are the
/// router's own.
#[test]
fn operator_tokenizer_fetch_settings_are_the_routers() {
    use kvroute_operator::desired::TokenizerFetch;
    let parse = |cfg: &OperatorConfig| {
        let router = desired_router(cfg, &Default::default()).deployment;
        <RouterCli as clap::Parser>::try_parse_from(effective_args(
            &RouterCli::command(),
            &router,
            "router",
        ))
        .unwrap_or_else(|e| panic!("router rejects the operator's settings: {e}"))
        .args
    };
    let defaults = parse(&cfg());
    assert_eq!(
        (
            defaults.tokenizer_fetch_timeout_s,
            defaults.tokenizer_retry_max_s
        ),
        (
            TokenizerFetch::DEFAULT_S as f64,
            TokenizerFetch::DEFAULT_S as f64
        )
    );
    let mut other = cfg();
    other.tokenizer_fetch = TokenizerFetch {
        timeout_s: 1_200,
        retry_max_s: 45,
    };
    let set = parse(&other);
    assert_eq!(
        (set.tokenizer_fetch_timeout_s, set.tokenizer_retry_max_s),
        (1_200.0, 45.0)
    );
}
