//! The gRPC listener (Ingest, Picker, Peers, grpc.health.v1): mTLS with `--grpc-tls-dir`, else
//! plaintext and unauthenticated (said at start and by a gauge).
//!
//! ```text
//! --grpc-tls-dir DIR --WatchedServer--> tls_incoming (client cert required) --+
//!                     \--watch every --tls-reload-interval-ms--> swap config  +--> tonic Server
//! (none) --TcpListenerStream (warning; kvroute_router_grpc_unauthenticated 1)-+
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kvroute_tls::WatchedServer;
use kvroute_tls::reload::ReloadOutcome;
use tokio::net::TcpListener;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

use crate::blocking_pool::BlockingPool;
use crate::ingest::IngestService;
use crate::peer::PeersService;
use crate::pick::PickerService;
use crate::state::RouterState;

/// How long a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS side of the gRPC listener.
#[derive(Clone)]
pub struct GrpcTls {
    /// The server configuration, following its directory.
    pub config: Arc<WatchedServer>,
    /// How often the directory is polled.
    pub reload_every: Duration,
}

impl GrpcTls {
    /// Loads `--grpc-tls-dir` (fails at start when the files are missing or unusable).
    pub fn load(dir: PathBuf, reload_every: Duration) -> anyhow::Result<Self> {
        let config = WatchedServer::server(dir.clone())
            .with_context(|| format!("--grpc-tls-dir {}", dir.display()))?;
        Ok(Self {
            config,
            reload_every,
        })
    }
}

/// Serves the gRPC services on `listener` until `close` fires.
pub async fn serve(
    listener: TcpListener,
    tls: Option<GrpcTls>,
    state: RouterState,
    pool: BlockingPool,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    peer_name: Option<String>,
    close: CancellationToken,
) -> anyhow::Result<()> {
    let authenticated = tls.is_some();
    let own = tls.as_ref().and_then(|t| t.config.identity());
    let mut server = tonic::transport::Server::builder();
    let routes = server
        .add_service(health)
        .add_service(
            IngestService::new(state.clone(), close.clone())
                .tls(authenticated)
                .into_server(),
        )
        .add_service(
            PickerService::new(state.clone(), pool)
                .tls(authenticated)
                .into_server(),
        )
        .add_service(
            PeersService::new(state.clone(), authenticated, own)
                .peer_name(peer_name)
                .into_server(),
        );
    let auth = &state.metrics().auth;
    match &tls {
        None => {
            auth.grpc_unauthenticated.set(1);
            tracing::warn!(
                "gRPC listener (Ingest, Picker) runs WITHOUT TLS: any caller can report for any worker and pick; pass --grpc-tls-dir outside development"
            );
        }
        Some(t) => {
            auth.grpc_unauthenticated.set(0);
            tracing::info!(
                dir = %t.config.dir().display(),
                identity = ?t.config.identity().map(|i| i.uri()),
                "gRPC listener requires client certificates (mTLS)"
            );
        }
    }
    serve_routes(routes, listener, tls, auth, close, "gRPC server").await
}

/// Serves `routes` on `listener` until `close` fires: plaintext without `tls`; with it,
/// mTLS whose key pair is re-read every `tls.reload_every` (reloads counted) and whose
/// failed handshakes are counted in `auth`. `what` names the server in errors. The one
/// serving path of the router's gRPC listeners (ingest/Pick API, endpoint picker).
pub(crate) async fn serve_routes(
    routes: tonic::transport::server::Router,
    listener: TcpListener,
    tls: Option<GrpcTls>,
    auth: &crate::auth::AuthMetrics,
    close: CancellationToken,
    what: &'static str,
) -> anyhow::Result<()> {
    let Some(GrpcTls {
        config,
        reload_every,
    }) = tls
    else {
        // TCP_NODELAY as on the TLS path (kvroute_tls sets it): a Pick answer's frames go
        // out at once instead of waiting for the caller's delayed ACK.
        let incoming = TcpListenerStream::new(listener).map(|conn| {
            if let Ok(tcp) = &conn
                && let Err(e) = tcp.set_nodelay(true)
            {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
            conn
        });
        return routes
            .serve_with_incoming_shutdown(incoming, close.cancelled_owned())
            .await
            .context(what);
    };
    let reloads = auth.tls_reloads.clone();
    tokio::spawn(
        config
            .clone()
            .watch(reload_every, close.clone(), move |outcome| {
                if !matches!(outcome, ReloadOutcome::Unchanged) {
                    reloads.with_label_values(&[outcome.label()]).inc();
                }
            }),
    );
    let failures = auth.tls_handshake_failures.clone();
    let incoming = kvroute_tls::tls_incoming(listener, config, HANDSHAKE_TIMEOUT, move |f| {
        failures.with_label_values(&[f.label()]).inc();
    });
    routes
        .serve_with_incoming_shutdown(incoming, close.cancelled_owned())
        .await
        .context(what)
}
