//! The Gateway API Inference Extension endpoint picker (EPP): Envoy's
//! `envoy.service.ext_proc.v3.ExternalProcessor` on its own listener (`--epp-listen`), so
//! any GIE gateway (Envoy Gateway, Istio, kgateway, ...) routes an `InferencePool` with
//! kvroute's decisions. It decides through the gateway's own path (same parsers, tenancy,
//! InferencePolicy verdicts, routing policy and assignment accounting); only the transport
//! differs: the data plane forwards the request itself.
//!
//! ```text
//! Envoy --ext_proc stream (mTLS: a picker certificate)--> EppService --Session-->
//!    decide (decision pool: the gateway's decode, tenancy, Dispatch::pick, rule limits)
//!    <-- x-gateway-destination-endpoint + dynamic_metadata["envoy.lb"] | ImmediateResponse
//!    response phases --> first token / done / abort of the same assignment
//! grpc.health.v1 on the same listener: liveness, readiness, the ext_proc service
//! ```
//!
//! Health: `liveness` is SERVING while the process runs; `readiness`, `""` and
//! `envoy.service.ext_proc.v3.ExternalProcessor` follow the replica's readiness phase
//! ([`crate::readiness`]): SERVING only when ready, NOT_SERVING while starting or draining.
//! Router replicas have no leader (each decides on its own view, as for the HTTP gateway), so
//! no replica reports NOT_SERVING for being a follower.
//!
//! Modules: [`protocol`] (pure message mapping), [`decide`] (one decision), [`service`] (the
//! stream), [`metrics`].

pub mod decide;
pub mod metrics;
pub mod protocol;
pub mod service;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::blocking_pool::BlockingPool;
use crate::grpc::GrpcTls;
use crate::readiness::Phase;
use crate::state::RouterState;

pub use metrics::EppMetrics;
pub use service::EppService;

/// The ext_proc service's name in grpc.health.v1.
pub const EXT_PROC: &str = <ExternalProcessorServer<EppService> as NamedService>::NAME;
/// The liveness service's name in grpc.health.v1.
pub const LIVENESS: &str = "liveness";
/// The readiness service's name in grpc.health.v1.
pub const READINESS: &str = "readiness";

/// Fallback endpoints listed after the primary at most (the decision path ranks this many).
pub const MAX_FALLBACKS: usize = 8;

/// The endpoint picker's flags (flattened into the router's).
#[derive(Debug, Clone, clap::Args)]
pub struct EppArgs {
    /// Serve the Gateway API Inference Extension endpoint picker (Envoy ext_proc, with
    /// grpc.health.v1) on this address. Off unless set.
    #[arg(long, env = "KVROUTE_ROUTER_EPP_LISTEN")]
    pub epp_listen: Option<SocketAddr>,
    /// mTLS for the endpoint picker: a directory with tls.crt, tls.key and ca.crt; the data
    /// plane must present a picker certificate (of the model's pool). Default: the
    /// --grpc-tls-dir directory. Without either the listener is plaintext (development only;
    /// a warning and `kvroute_router_epp_unauthenticated 1`).
    #[arg(long, env = "KVROUTE_ROUTER_EPP_TLS_DIR")]
    pub epp_tls_dir: Option<PathBuf>,
    /// Fallback endpoints listed after the primary in `x-gateway-destination-endpoint`
    /// (0 to 8), the next-best candidates of the same decision.
    #[arg(long, env = "KVROUTE_ROUTER_EPP_FALLBACKS", default_value_t = 2)]
    pub epp_fallbacks: usize,
    /// ext_proc streams (requests in flight through the picker) open at once at most; more
    /// are refused with RESOURCE_EXHAUSTED.
    #[arg(long, env = "KVROUTE_ROUTER_EPP_MAX_STREAMS", default_value_t = 4096)]
    pub epp_max_streams: usize,
}

impl Default for EppArgs {
    /// The flag defaults: off.
    fn default() -> Self {
        Self {
            epp_listen: None,
            epp_tls_dir: None,
            epp_fallbacks: 2,
            epp_max_streams: 4096,
        }
    }
}

/// A bound endpoint picker listener, ready to serve.
pub struct EppListener {
    listener: TcpListener,
    tls: Option<GrpcTls>,
    service: EppService,
    metrics: EppMetrics,
    state: RouterState,
}

impl EppArgs {
    /// Binds the listener when `--epp-listen` is set (`None` otherwise). `grpc_tls_dir` is
    /// the default TLS directory; `reload_every` how often it is re-read.
    pub async fn bind(
        self,
        grpc_tls_dir: Option<PathBuf>,
        reload_every: Duration,
        state: &RouterState,
        pool: &BlockingPool,
    ) -> anyhow::Result<Option<EppListener>> {
        let Self {
            epp_listen,
            epp_tls_dir,
            epp_fallbacks,
            epp_max_streams,
        } = self;
        let Some(addr) = epp_listen else {
            return Ok(None);
        };
        if epp_fallbacks > MAX_FALLBACKS {
            anyhow::bail!("--epp-fallbacks {epp_fallbacks}: expected 0 to {MAX_FALLBACKS}");
        }
        if epp_max_streams == 0 {
            anyhow::bail!("--epp-max-streams 0: expected at least 1");
        }
        let tls = epp_tls_dir
            .or(grpc_tls_dir)
            .map(|dir| GrpcTls::load(dir, reload_every))
            .transpose()
            .context("--epp-tls-dir")?;
        let metrics = EppMetrics::register(state.metrics().registry())?;
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("bind --epp-listen address {addr}"))?;
        let service = EppService::new(service::Ctx {
            state: state.clone(),
            dispatch: Arc::new(state.clone()),
            pool: pool.clone(),
            metrics: metrics.clone(),
            tls: tls.is_some(),
            max_fallbacks: epp_fallbacks,
            streams: Arc::new(Semaphore::new(epp_max_streams)),
        });
        Ok(Some(EppListener {
            listener,
            tls,
            service,
            metrics,
            state: state.clone(),
        }))
    }
}

/// What each health service reports in `phase`: ("" and readiness, liveness, ext_proc).
pub fn statuses(phase: Phase) -> [(&'static str, ServingStatus); 4] {
    let ready = if phase == Phase::Ready {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    [
        ("", ready),
        (LIVENESS, ServingStatus::Serving),
        (READINESS, ready),
        (EXT_PROC, ready),
    ]
}

async fn apply(reporter: &HealthReporter, phase: Phase) {
    for (service, status) in statuses(phase) {
        reporter.set_service_status(service, status).await;
    }
}

/// Keeps the picker's health statuses in step with the readiness phase until `stop`.
async fn follow_phase(state: RouterState, reporter: HealthReporter, stop: CancellationToken) {
    let mut phases = state.readiness().subscribe();
    loop {
        let phase = *phases.borrow_and_update();
        apply(&reporter, phase).await;
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            changed = phases.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}

impl EppListener {
    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves ext_proc and health until `close` fires.
    pub async fn serve(self, close: CancellationToken) -> anyhow::Result<()> {
        let Self {
            listener,
            tls,
            service,
            metrics,
            state,
        } = self;
        let (reporter, health) = tonic_health::server::health_reporter();
        apply(&reporter, state.readiness().phase()).await;
        tokio::spawn(follow_phase(state.clone(), reporter, close.clone()));
        let limit = state.config().max_body_bytes.saturating_add(64 << 10);
        let mut server = tonic::transport::Server::builder();
        let routes = server
            .add_service(health)
            .add_service(ExternalProcessorServer::new(service).max_decoding_message_size(limit));
        match &tls {
            None => {
                metrics.unauthenticated.set(1);
                tracing::warn!(
                    "endpoint picker (ext_proc) runs WITHOUT TLS: any caller can pick and read routing decisions; pass --epp-tls-dir or --grpc-tls-dir outside development"
                );
            }
            Some(t) => {
                metrics.unauthenticated.set(0);
                tracing::info!(
                    dir = %t.config.dir().display(),
                    "endpoint picker requires client certificates (mTLS)"
                );
            }
        }
        let auth = &state.metrics().auth;
        crate::grpc::serve_routes(routes, listener, tls, auth, close, "endpoint picker server")
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_the_phase_and_liveness_stays_up() {
        let of = |phase| statuses(phase).map(|(_, s)| s);
        use ServingStatus::{NotServing as Off, Serving as On};
        assert_eq!(of(Phase::Starting), [Off, On, Off, Off]);
        assert_eq!(of(Phase::Ready), [On, On, On, On]);
        assert_eq!(of(Phase::Draining), [Off, On, Off, Off]);
        assert_eq!(EXT_PROC, "envoy.service.ext_proc.v3.ExternalProcessor");
    }
}
