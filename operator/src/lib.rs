//! kvroute-operator: reconciles kvroute's custom resources into running workers and a router.
//!
//! ```text
//!  Lease (coordination.k8s.io/v1) --lease.rs/election.rs--> leading? (watch channel)
//!                                                               | only while true
//!  InferenceWorkerSet --controller/workerset.rs--> Deployment (vLLM|mock + sidecar), headless Service,
//!                                                  NetworkPolicy
//!  InferencePool/Policy/Provider, GatewayBackend --controller/refs.rs (one generic reconciler)--> status
//!  (installation) --controller/router.rs--> router Deployment, Services, ServiceAccount, RBAC,
//!                                           NetworkPolicy (RBAC rules: permissions.rs)
//!  (installation, --mtls) --controller/pki.rs (pki.rs pure)--> Secrets kvroute-ca, kvroute-mtls
//!                             or cert-manager Certificates
//!                      every write: desired/*.rs (pure) -> server-side apply "kvroute-operator"
//!  admin.rs: /metrics, /healthz
//! ```

pub mod admin;
pub mod bundle;
pub mod controller;
pub mod crdgen;
pub mod desired;
pub mod election;
pub mod generated;
pub mod helm;
pub mod lease;
pub mod metrics;
pub mod monitoring;
pub mod permissions;
pub mod pki;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use prometheus::Registry;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::controller::Ctx;
use crate::desired::{FIELD_MANAGER, OperatorConfig};
use crate::election::Elector;
use crate::lease::LeaseLoop;
use crate::metrics::OperatorMetrics;

/// Default image registry path of kvroute's images.
pub const IMAGE_REPO: &str = "ghcr.io/kvroute";

/// Command-line flags of `kvroute operator` / `kvroute-operator`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Namespace to watch; all namespaces when empty.
    #[arg(long, env = "KVROUTE_OPERATOR_NAMESPACE", default_value = "")]
    pub namespace: String,
    /// Router image.
    #[arg(
        long,
        env = "KVROUTE_OPERATOR_ROUTER_IMAGE",
        default_value_t = bundle::component_image("router")
    )]
    pub router_image: String,
    /// Sidecar image (WorkerSets may override it).
    #[arg(
        long,
        env = "KVROUTE_OPERATOR_SIDECAR_IMAGE",
        default_value_t = bundle::component_image("sidecar")
    )]
    pub sidecar_image: String,
    /// Mock worker image for `engine.mode: mock`.
    #[arg(
        long,
        env = "KVROUTE_OPERATOR_MOCK_IMAGE",
        default_value_t = bundle::component_image("mock-vllm")
    )]
    pub mock_image: String,
    /// Router replicas.
    #[arg(long, env = "KVROUTE_OPERATOR_ROUTER_REPLICAS", default_value_t = bundle::ROUTER_REPLICAS)]
    pub router_replicas: i32,
    /// Gateway API Inference Extension: the GIE InferencePools the router takes workers from
    /// (`NAME`, `NAMESPACE/NAME` or `*`, comma-separated; the router's
    /// `--gie-inference-pool`); also opens the router's endpoint picker on the Service's
    /// `epp` port (9002). Empty: off (docs/gateway-api.md).
    #[arg(
        long,
        env = "KVROUTE_OPERATOR_ROUTER_GIE_INFERENCE_POOL",
        default_value = ""
    )]
    pub router_gie_inference_pool: String,
    /// OTLP/gRPC collector the router exports its routing-decision traces to (the router's
    /// `--otlp-endpoint`, e.g. `http://otel-collector.observability:4317`). Empty: no
    /// traces (docs/tracing.md).
    #[arg(
        long,
        env = "KVROUTE_OPERATOR_ROUTER_OTLP_ENDPOINT",
        default_value = ""
    )]
    pub router_otlp_endpoint: String,
    /// Longest one attempt to fetch a model's tokenizer files may take, in seconds (the
    /// router's `--tokenizer-fetch-timeout-s`): a slower attempt counts as failed
    /// (`reason="timeout"`) and is retried. Raise it where the Hub is reached through a slow
    /// proxy (docs/tokenizers.md).
    #[arg(
        long,
        env = "KVROUTE_OPERATOR_ROUTER_TOKENIZER_FETCH_TIMEOUT_SECONDS",
        default_value_t = desired::TokenizerFetch::DEFAULT_S,
        value_parser = clap::value_parser!(u64).range(1..=desired::TokenizerFetch::MAX_S)
    )]
    pub router_tokenizer_fetch_timeout_seconds: u64,
    /// Longest wait between two attempts to fetch a tokenizer, in seconds (the router's
    /// `--tokenizer-retry-max-s`; waits double from 1 s up to this).
    #[arg(
        long,
        env = "KVROUTE_OPERATOR_ROUTER_TOKENIZER_RETRY_MAX_SECONDS",
        default_value_t = desired::TokenizerFetch::DEFAULT_S,
        value_parser = clap::value_parser!(u64).range(1..=desired::TokenizerFetch::MAX_S)
    )]
    pub router_tokenizer_retry_max_seconds: u64,
    /// Namespace of the router; the lease namespace when empty.
    #[arg(long, env = "KVROUTE_OPERATOR_ROUTER_NAMESPACE", default_value = "")]
    pub router_namespace: String,
    /// Deploy and manage the router (turn off to run the router yourself).
    #[arg(long, env = "KVROUTE_OPERATOR_MANAGE_ROUTER", default_value_t = true, action = clap::ArgAction::Set)]
    pub manage_router: bool,
    /// Name of the leader-election Lease.
    #[arg(
        long,
        env = "KVROUTE_OPERATOR_LEASE_NAME",
        default_value = "kvroute-operator"
    )]
    pub lease_name: String,
    /// Namespace of the Lease; the pod's namespace (service account) or the kubeconfig's
    /// namespace when empty.
    #[arg(long, env = "KVROUTE_OPERATOR_LEASE_NAMESPACE", default_value = "")]
    pub lease_namespace: String,
    /// Lease duration in seconds: a dead leader is replaced after about this long.
    #[arg(
        long,
        env = "KVROUTE_OPERATOR_LEASE_DURATION_SECONDS",
        default_value_t = 15
    )]
    pub lease_duration_seconds: u64,
    /// Identity in the Lease; the pod name (HOSTNAME) when empty.
    #[arg(long, env = "KVROUTE_OPERATOR_IDENTITY", default_value = "")]
    pub identity: String,
    /// Admin HTTP address (/metrics, /healthz); port 0 picks a free port.
    #[arg(
        long,
        env = "KVROUTE_OPERATOR_ADMIN_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    pub admin_addr: SocketAddr,
    /// Periodic requeue of every resource, in seconds.
    #[arg(long, env = "KVROUTE_OPERATOR_REQUEUE_SECONDS", default_value_t = 300)]
    pub requeue_seconds: u64,
    /// Issue mTLS certificates (own CA in Secret `kvroute-ca`, pairs in `kvroute-mtls`, or
    /// cert-manager when a pool names an issuer) and pass the TLS flags to routers and
    /// sidecars (on by default; `--mtls=false` leaves the gRPC listener unauthenticated, which
    /// the router reports in `kvroute_router_grpc_unauthenticated`).
    #[arg(long, env = "KVROUTE_OPERATOR_MTLS", default_value_t = true, action = clap::ArgAction::Set)]
    pub mtls: bool,
    /// Life of a leaf certificate in seconds; renewed at two thirds.
    #[arg(
        long,
        env = "KVROUTE_OPERATOR_CERT_LIFETIME_SECONDS",
        default_value_t = 7 * 24 * 3600
    )]
    pub cert_lifetime_seconds: u64,
    /// Life of the operator's CA in seconds; a successor is staged at two thirds.
    #[arg(
        long,
        env = "KVROUTE_OPERATOR_CA_LIFETIME_SECONDS",
        default_value_t = 365 * 24 * 3600
    )]
    pub ca_lifetime_seconds: u64,
    /// Seconds a staged CA is only trusted (in every bundle) before it starts signing.
    #[arg(
        long,
        env = "KVROUTE_OPERATOR_CA_OVERLAP_SECONDS",
        default_value_t = 24 * 3600
    )]
    pub ca_overlap_seconds: u64,
}

const SA_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

fn default_identity() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        })
        .map(|h| format!("{h}-{}", std::process::id()))
        .unwrap_or_else(|| format!("kvroute-operator-{}", std::process::id()))
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Runs the operator: admin server, leader election, and (while leading) the controllers.
/// Reads cluster access from `KUBECONFIG` / `~/.kube/config` or the in-cluster service account.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let Args {
        namespace,
        router_image,
        sidecar_image,
        mock_image,
        router_replicas,
        router_gie_inference_pool,
        router_otlp_endpoint,
        router_tokenizer_fetch_timeout_seconds,
        router_tokenizer_retry_max_seconds,
        router_namespace,
        manage_router,
        lease_name,
        lease_namespace,
        lease_duration_seconds,
        identity,
        admin_addr,
        requeue_seconds,
        mtls,
        cert_lifetime_seconds,
        ca_lifetime_seconds,
        ca_overlap_seconds,
    } = args;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .try_init();

    let client = Client::try_default()
        .await
        .context("connecting to the Kubernetes API (KUBECONFIG or in-cluster)")?;
    let lease_namespace = if !lease_namespace.is_empty() {
        lease_namespace
    } else if let Ok(ns) = std::fs::read_to_string(SA_NAMESPACE_FILE) {
        ns.trim().to_string()
    } else {
        client.default_namespace().to_string()
    };
    let identity = if identity.is_empty() {
        default_identity()
    } else {
        identity
    };
    let cfg = OperatorConfig {
        sidecar_image,
        mock_image,
        router_image,
        router_replicas,
        router_namespace: if router_namespace.is_empty() {
            lease_namespace.clone()
        } else {
            router_namespace
        },
        watch_namespace: namespace,
        mtls,
        gie_inference_pool: router_gie_inference_pool,
        otlp_endpoint: router_otlp_endpoint,
        tokenizer_fetch: desired::TokenizerFetch {
            timeout_s: router_tokenizer_fetch_timeout_seconds,
            retry_max_s: router_tokenizer_retry_max_seconds,
        },
    };
    let pki = controller::pki::PkiSettings {
        ca_namespace: lease_namespace.clone(),
        lifetimes: pki::Lifetimes {
            leaf: Duration::from_secs(cert_lifetime_seconds.max(1)),
            ca: Duration::from_secs(ca_lifetime_seconds.max(1)),
            ca_overlap: Duration::from_secs(ca_overlap_seconds),
        },
    };

    let registry = Registry::new();
    let metrics = OperatorMetrics::register(&registry).context("registering metrics")?;
    let (bound, admin) = admin::bind(admin_addr, registry)
        .await
        .with_context(|| format!("binding {admin_addr}"))?;
    tracing::info!(admin = %bound, identity = %identity, lease = %format!("{lease_namespace}/{lease_name}"),
        watch = %if cfg.watch_namespace.is_empty() { "all namespaces" } else { cfg.watch_namespace.as_str() },
        "kvroute-operator starting");
    let admin = tokio::spawn(admin);

    let shutdown = CancellationToken::new();
    let (leader_tx, mut leader_rx) = watch::channel(false);
    let elector = Elector::new(
        identity.clone(),
        Duration::from_secs(lease_duration_seconds.max(1)),
    );
    let lease_loop = LeaseLoop::new(
        Api::<Lease>::namespaced(client.clone(), &lease_namespace),
        lease_name,
        elector,
        leader_tx,
        metrics.clone(),
    );
    let lease_task = tokio::spawn(lease_loop.run(shutdown.clone()));

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: FIELD_MANAGER.to_string(),
            instance: Some(identity.clone()),
        },
    );
    let ctx = Arc::new(
        Ctx::new(
            client.clone(),
            cfg,
            metrics,
            recorder,
            leader_rx.clone(),
            Duration::from_secs(requeue_seconds.max(1)),
        )
        .with_pki(pki),
    );

    let signal = shutdown_signal();
    tokio::pin!(signal);
    let result = loop {
        // Standby: wait for leadership (or the end).
        tokio::select! {
            _ = &mut signal => break Ok(()),
            changed = leader_rx.wait_for(|leading| *leading) => {
                if changed.is_err() { break Err(anyhow::anyhow!("leader election stopped")); }
            }
        }
        tracing::info!(identity = %identity, "leading: starting controllers");
        let stop = CancellationToken::new();
        let controllers = async {
            let router = async {
                if manage_router {
                    controller::router::run(ctx.clone(), stop.clone()).await;
                }
            };
            let pki = async {
                if ctx.cfg.mtls {
                    controller::pki::run(ctx.clone(), stop.clone()).await;
                }
            };
            tokio::join!(
                controller::workerset::run(client.clone(), ctx.clone()),
                controller::refs::run(client.clone(), ctx.clone()),
                router,
                pki,
            );
        };
        tokio::select! {
            _ = &mut signal => { stop.cancel(); break Ok(()) }
            _ = leader_rx.wait_for(|leading| !*leading) => {
                stop.cancel();
                tracing::warn!(identity = %identity, "lost the lease: controllers stopped, back to standby");
            }
            _ = controllers => break Err(anyhow::anyhow!("controllers ended unexpectedly")),
        }
    };
    shutdown.cancel();
    let _ = lease_task.await;
    admin.abort();
    tracing::info!("kvroute-operator stopped");
    result
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: super::Args,
    }

    fn parse(extra: &[&str]) -> Result<super::Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("kvroute-operator").chain(extra.iter().copied()))
            .map(|c| c.args)
    }

    #[test]
    fn tokenizer_fetch_flags_default_to_the_routers_and_refuse_zero_or_more_than_a_day() {
        let a = parse(&[]).expect("defaults");
        assert_eq!(
            (
                a.router_tokenizer_fetch_timeout_seconds,
                a.router_tokenizer_retry_max_seconds
            ),
            (300, 300)
        );
        let a = parse(&["--router-tokenizer-fetch-timeout-seconds", "1200"]).expect("1200");
        assert_eq!(a.router_tokenizer_fetch_timeout_seconds, 1200);
        for bad in ["0", "86401", "-5", "1.5", "soon"] {
            let flag = format!("--router-tokenizer-retry-max-seconds={bad}");
            let e = parse(&[&flag])
                .err()
                .unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(
                e.to_string().contains("router-tokenizer-retry-max-seconds"),
                "{e}"
            );
        }
    }
}
