//! Contracts between components that are configured by another component: the operator
//! starts the router with environment variables, and every one of them must be a flag the
//! router actually reads (clap ignores unknown env vars silently, so a typo would go unseen),
//! or one of the Hugging Face variables its tokenizer download reads.

use clap::CommandFactory;
use kvroute_operator::desired::OperatorConfig;
use kvroute_operator::desired::router::desired_router;

#[derive(clap::Parser)]
struct RouterCli {
    #[command(flatten)]
    args: kvroute_router::Args,
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
            mtls: false,
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
                var.value.as_deref().is_some_and(|v| !v.is_empty()),
                "{} is empty",
                var.name
            );
        }
    }
}
