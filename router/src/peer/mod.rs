//! Active-active router replicas (docs/replicas.md): each replica streams its own placements
//! to every peer replica (`Peers.Share`, gRPC on the router's gRPC port, the same mTLS), so
//! that each one's pending overlay and load estimate include the others' placements.
//!
//! ```text
//! --peers a:9000,b:9000 (static)  --+
//! --peer-service svc:9000 (DNS of   +--> targets (watch) --PeerDialer--> one task per target:
//!   the headless Service, re-read)--+      connect (mTLS) -> Share(stream): reset + own list, then events
//! RouterState::peer_events (placed / started / ended) ------------------------^
//! PeersService::share <-- a peer's stream: check (wire.rs) -> RouterState::apply_peer_update
//!                          stream ends -> RouterState::peer_lost (its share decays)
//! ```
//!
//! A replica that dials itself (its own address behind the Service) is told so
//! (`FAILED_PRECONDITION`) and does not dial that address again. Under mTLS a peer may share
//! when its certificate is valid for `--peer-tls-server-name` (what the operator's replicas
//! have in common), or names a router identity of the same namespace and pool as this
//! replica's certificate.

pub mod wire;

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvroute_proto::v1::peers_client::PeersClient;
use kvroute_proto::v1::peers_server::{Peers, PeersServer};
use kvroute_proto::v1::{PeerShareEnd, PeerUpdate};
use kvroute_tls::{ClientTls, Identity};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::Caller;
use crate::state::RouterState;
use wire::{PeerEvent, Update, WireLimits};

/// Largest peer update decoded (as an Ingest message).
pub const MAX_MESSAGE_BYTES: usize = kvroute_proto::limits::MAX_MESSAGE_BYTES;

/// The message a replica answers when it is dialled by itself.
const SELF_DIAL: &str = "peer is this replica";

/// Peer-exchange flags.
#[derive(Debug, Clone, clap::Args)]
pub struct PeerArgs {
    /// Other router replicas' gRPC addresses (`host:port`), for the peer exchange outside
    /// Kubernetes; repeat or comma-separate. Empty, with no --peer-service: off.
    #[arg(long, env = "KVROUTE_ROUTER_PEERS", value_delimiter = ',')]
    pub peers: Vec<String>,
    /// A DNS name (`host:port`) whose addresses are the router replicas: the router's
    /// headless Service (`<name>-peers.<namespace>.svc:9000`), re-resolved every
    /// --peer-resolve-interval-s. Empty: off.
    #[arg(long, env = "KVROUTE_ROUTER_PEER_SERVICE", default_value = "")]
    pub peer_service: String,
    /// Seconds between two resolutions of --peer-service.
    #[arg(
        long,
        env = "KVROUTE_ROUTER_PEER_RESOLVE_INTERVAL_S",
        default_value_t = 5.0
    )]
    pub peer_resolve_interval_s: f64,
    /// With --grpc-tls-dir: the name peers' certificates are verified as (the router
    /// Service's DNS name, which every replica's certificate carries); empty: the host dialled.
    #[arg(long, env = "KVROUTE_ROUTER_PEER_TLS_SERVER_NAME", default_value = "")]
    pub peer_tls_server_name: String,
    /// Seconds over which a lost peer's placements decay from full weight to nothing.
    #[arg(long, env = "KVROUTE_ROUTER_PEER_DECAY_S", default_value_t = 10.0)]
    pub peer_decay_s: f64,
}

impl Default for PeerArgs {
    fn default() -> Self {
        Self {
            peers: Vec::new(),
            peer_service: String::new(),
            peer_resolve_interval_s: 5.0,
            peer_tls_server_name: String::new(),
            peer_decay_s: 10.0,
        }
    }
}

impl PeerArgs {
    /// True when a peer source is configured.
    pub fn enabled(&self) -> bool {
        !self.peers.is_empty() || !self.peer_service.is_empty()
    }
}

// ------------------------------------------------------------------------- server

/// The `Peers` gRPC service: takes peers' streams of placements.
#[derive(Clone)]
pub struct PeersService {
    state: RouterState,
    tls: bool,
    /// This replica's own identity (its certificate's), when it has one.
    own: Option<Identity>,
    /// The DNS name every replica's certificate is valid for (`--peer-tls-server-name`, the
    /// name the dialer verifies peers by), when set.
    peer_name: Option<String>,
    limits: WireLimits,
}

impl PeersService {
    /// A service over `state`; `tls`: the listener runs mTLS; `own`: this replica's
    /// certificate identity (peers must hold the same router identity).
    pub fn new(state: RouterState, tls: bool, own: Option<Identity>) -> Self {
        Self {
            state,
            tls,
            own,
            peer_name: None,
            limits: WireLimits::default(),
        }
    }

    /// Also accepts a caller whose certificate is valid for `name` (`--peer-tls-server-name`):
    /// the operator gives every replica one certificate for the router's Services, whose URI
    /// SANs name the pools served (none, or several), so that name, not a single router
    /// identity, is what replicas have in common.
    pub fn peer_name(mut self, name: Option<String>) -> Self {
        self.peer_name = name.filter(|n| !n.is_empty());
        self
    }

    /// Is the caller's (verified) leaf certificate valid for [`Self::peer_name`]?
    fn named_peer<T>(&self, request: &Request<T>) -> bool {
        let Some(name) = self.peer_name.as_deref() else {
            return false;
        };
        if !self.tls {
            return false;
        }
        request
            .extensions()
            .get::<tonic::transport::server::TlsConnectInfo<tonic::transport::server::TcpConnectInfo>>()
            .and_then(|info| info.peer_certs())
            .and_then(|certs| certs.first().cloned())
            .is_some_and(|leaf| kvroute_tls::cert_valid_for_dns_name(&leaf, name))
    }

    /// The tonic server.
    pub fn into_server(self) -> PeersServer<Self> {
        PeersServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn refuse(&self, label: &'static str) {
        self.state
            .metrics()
            .peer_refused
            .with_label_values(&[label])
            .inc();
    }

    /// May `caller` share? Plaintext: anyone (development). mTLS: a router identity of this
    /// replica's namespace and pool.
    fn authorize(&self, caller: &Caller) -> Result<(), Status> {
        let Caller::Verified { identity, .. } = caller else {
            return Ok(());
        };
        let same = match (identity, &self.own) {
            (
                Identity::Router { namespace, pool },
                Some(Identity::Router {
                    namespace: n,
                    pool: p,
                }),
            ) => namespace == n && pool == p,
            // Without an own router identity, any router identity of the trust domain.
            (Identity::Router { .. }, None) => true,
            _ => false,
        };
        if same {
            Ok(())
        } else {
            self.refuse("not_a_peer");
            Err(Status::permission_denied(format!(
                "identity {} is not a router replica of this pool",
                identity.uri()
            )))
        }
    }
}

#[tonic::async_trait]
impl Peers for PeersService {
    async fn share(
        &self,
        request: Request<Streaming<PeerUpdate>>,
    ) -> Result<Response<PeerShareEnd>, Status> {
        if !self.named_peer(&request) {
            let caller = Caller::of(&request, self.tls).map_err(|e| {
                self.refuse("unauthenticated");
                e.status()
            })?;
            self.authorize(&caller)?;
        }
        let mut stream = request.into_inner();
        let m = self.state.metrics().clone();
        let mut replica: Option<String> = None;
        let result = loop {
            let next = match stream.message().await {
                Ok(Some(u)) => u,
                Ok(None) => break Ok(Response::new(PeerShareEnd {})),
                Err(e) => break Err(e),
            };
            let u = match Update::check(next, &self.limits) {
                Ok(u) => u,
                Err(e) => {
                    self.refuse(e.label());
                    break Err(Status::invalid_argument(e.to_string()));
                }
            };
            if u.replica == self.state.replica_id() {
                self.refuse("self");
                break Err(Status::failed_precondition(SELF_DIAL));
            }
            match &replica {
                None => {
                    self.state.peer_connected(&u.replica);
                    m.peer_streams.with_label_values(&["in"]).inc();
                    replica = Some(u.replica.clone());
                }
                Some(r) if *r != u.replica => {
                    self.refuse("replica_changed");
                    break Err(Status::invalid_argument(
                        "the replica id changed within a stream",
                    ));
                }
                Some(_) => {}
            }
            let applied = self.state.apply_peer_update(&u, Instant::now());
            m.peer_updates.with_label_values(&["in"]).inc();
            if applied.unknown_worker > 0 {
                m.peer_placements_skipped
                    .with_label_values(&["unknown_worker"])
                    .inc_by(applied.unknown_worker as u64);
            }
            if applied.refused > 0 {
                m.peer_placements_skipped
                    .with_label_values(&["full"])
                    .inc_by(applied.refused as u64);
            }
        };
        if let Some(r) = replica {
            self.state.peer_lost(&r, Instant::now());
            m.peer_streams.with_label_values(&["in"]).dec();
            tracing::info!(peer = %r, "peer stream ended; its placements decay");
        }
        result
    }
}

// ------------------------------------------------------------------------- targets

/// Keeps the set of peer addresses current: the static list plus, every `interval`, the
/// addresses `service` resolves to. Ends with `shutdown`.
pub async fn resolve_targets(
    statics: Vec<String>,
    service: String,
    interval: Duration,
    tx: watch::Sender<BTreeSet<String>>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let mut set: BTreeSet<String> = statics.iter().cloned().collect();
        if !service.is_empty() {
            match tokio::net::lookup_host(service.as_str()).await {
                Ok(addrs) => set.extend(addrs.map(|a: SocketAddr| a.to_string())),
                Err(e) => {
                    tracing::debug!(service = %service, error = %e, "peer service did not resolve")
                }
            }
        }
        tx.send_if_modified(|cur| {
            if *cur == set {
                false
            } else {
                *cur = set;
                true
            }
        });
    }
}

// ------------------------------------------------------------------------- client

/// Dials every peer address and keeps one `Share` stream open to each.
pub struct PeerDialer {
    /// The state whose placements are shared.
    pub state: RouterState,
    /// The peer addresses (`host:port`).
    pub targets: watch::Receiver<BTreeSet<String>>,
    /// mTLS (`--grpc-tls-dir`'s files as the client certificate); `None`: plaintext.
    pub tls: Option<ClientTls>,
}

impl PeerDialer {
    /// Runs until `shutdown`: one task per current target; targets that go away are dropped,
    /// an address found to be this replica is never dialled again.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut tasks: HashMap<String, CancellationToken> = HashMap::new();
        let (self_tx, mut self_rx) = mpsc::unbounded_channel::<String>();
        let mut own: BTreeSet<String> = BTreeSet::new();
        loop {
            let wanted: BTreeSet<String> = self
                .targets
                .borrow_and_update()
                .iter()
                .filter(|t| !own.contains(*t))
                .cloned()
                .collect();
            tasks.retain(|t, stop| {
                let keep = wanted.contains(t);
                if !keep {
                    stop.cancel();
                }
                keep
            });
            for t in wanted {
                if tasks.contains_key(&t) {
                    continue;
                }
                let stop = shutdown.child_token();
                tasks.insert(t.clone(), stop.clone());
                let link = Link {
                    state: self.state.clone(),
                    target: t,
                    tls: self.tls.clone(),
                    on_self: self_tx.clone(),
                };
                tokio::spawn(link.run(stop));
            }
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                Some(me) = self_rx.recv() => {
                    tracing::info!(address = %me, "peer address is this replica; not dialling it");
                    if let Some(stop) = tasks.remove(&me) {
                        stop.cancel();
                    }
                    own.insert(me);
                }
                changed = self.targets.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// One outbound stream to one peer address, reconnected with back-off.
struct Link {
    state: RouterState,
    target: String,
    tls: Option<ClientTls>,
    on_self: mpsc::UnboundedSender<String>,
}

/// What ended one session of a link.
enum Ended {
    /// Shut down.
    Stopped,
    /// The peer is this replica.
    ItsMe,
    /// Anything else: reconnect after a pause.
    Failed(String),
}

impl Link {
    async fn run(self, stop: CancellationToken) {
        let mut pause = Duration::from_millis(100);
        loop {
            match self.session(&stop).await {
                Ended::Stopped => return,
                Ended::ItsMe => {
                    let _ = self.on_self.send(self.target.clone());
                    return;
                }
                Ended::Failed(why) => {
                    tracing::debug!(peer = %self.target, why, "peer stream ended; reconnecting");
                }
            }
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }

    async fn session(&self, stop: &CancellationToken) -> Ended {
        let uri = format!("http://{}", self.target);
        let endpoint = match tonic::transport::Endpoint::from_shared(uri) {
            Ok(e) => e.connect_timeout(Duration::from_secs(2)).tcp_nodelay(true),
            Err(e) => return Ended::Failed(e.to_string()),
        };
        let channel = tokio::select! {
            biased;
            () = stop.cancelled() => return Ended::Stopped,
            c = async {
                match &self.tls {
                    Some(tls) => tls.channel(endpoint).await,
                    None => endpoint.connect().await,
                }
            } => match c {
                Ok(c) => c,
                Err(e) => return Ended::Failed(format!("connect: {e}")),
            },
        };
        let mut client = PeersClient::new(channel).max_encoding_message_size(MAX_MESSAGE_BYTES);
        // Subscribe before listing, so nothing placed in between is missed (a placement seen
        // twice replaces itself on the peer).
        let mut events = self.state.peer_events();
        let (tx, rx) = mpsc::channel::<PeerUpdate>(16);
        let replica = self.state.replica_id().to_owned();
        let metrics = self.state.metrics().clone();
        let state = self.state.clone();
        let feed_stop = stop.clone();
        let feeder = tokio::spawn(async move {
            let mut seq = 0u64;
            let limits = WireLimits::default();
            let mut full = true;
            loop {
                let mut pending: Vec<PeerEvent> = Vec::new();
                let mut reset = false;
                if full {
                    full = false;
                    reset = true;
                    pending.extend(state.own_placements().into_iter().map(PeerEvent::Placed));
                } else {
                    let first = tokio::select! {
                        biased;
                        () = feed_stop.cancelled() => return,
                        e = events.recv() => e,
                    };
                    match first {
                        Ok(e) => pending.push(e),
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            full = true;
                            continue;
                        }
                        Err(broadcast::error::RecvError::Closed) => return,
                    }
                    loop {
                        match events.try_recv() {
                            Ok(e) => pending.push(e),
                            Err(broadcast::error::TryRecvError::Lagged(_)) => {
                                full = true;
                                break;
                            }
                            Err(_) => break,
                        }
                        if pending.len() >= limits.max_items {
                            break;
                        }
                    }
                    if full {
                        continue;
                    }
                }
                // An empty reset still tells the peer to drop what it held of us.
                loop {
                    seq += 1;
                    let mut u = wire::batch(&replica, seq, &mut pending, limits.max_items);
                    u.reset = reset;
                    reset = false;
                    if tx.send(u).await.is_err() {
                        return;
                    }
                    metrics.peer_updates.with_label_values(&["out"]).inc();
                    if pending.is_empty() {
                        break;
                    }
                }
            }
        });
        self.state
            .metrics()
            .peer_streams
            .with_label_values(&["out"])
            .inc();
        let call = client.share(ReceiverStream::new(rx));
        let ended = tokio::select! {
            biased;
            () = stop.cancelled() => Ended::Stopped,
            r = call => match r {
                Ok(_) => Ended::Failed("the peer ended the stream".into()),
                Err(s) if s.code() == tonic::Code::FailedPrecondition && s.message() == SELF_DIAL => Ended::ItsMe,
                Err(s) => Ended::Failed(format!("{}: {}", s.code(), s.message())),
            },
        };
        feeder.abort();
        self.state
            .metrics()
            .peer_streams
            .with_label_values(&["out"])
            .dec();
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::RouterMetrics;
    use crate::state::RouterConfig;

    fn service(own: Option<Identity>) -> PeersService {
        let metrics = RouterMetrics::register(&prometheus::Registry::new()).expect("metrics");
        let state = RouterState::new(RouterConfig::default(), metrics).expect("state");
        PeersService::new(state, true, own)
    }

    fn router(ns: &str, pool: &str) -> Identity {
        Identity::Router {
            namespace: ns.into(),
            pool: pool.into(),
        }
    }

    fn caller(identity: Identity) -> Caller {
        Caller::Verified { identity, ip: None }
    }

    #[test]
    fn only_router_replicas_of_the_same_pool_may_share() {
        let s = service(Some(router("ns", "pool")));
        assert!(s.authorize(&caller(router("ns", "pool"))).is_ok());
        let refused = |c: Caller| s.authorize(&c).map_err(|e| e.code());
        assert_eq!(
            refused(caller(router("other", "pool"))),
            Err(tonic::Code::PermissionDenied)
        );
        assert_eq!(
            refused(caller(router("ns", "other"))),
            Err(tonic::Code::PermissionDenied)
        );
        let sidecar = Identity::WorkerSet {
            namespace: "ns".into(),
            name: "pool".into(),
        };
        assert_eq!(refused(caller(sidecar)), Err(tonic::Code::PermissionDenied));
        let picker = Identity::Picker {
            namespace: "ns".into(),
            pool: "pool".into(),
        };
        assert_eq!(refused(caller(picker)), Err(tonic::Code::PermissionDenied));
        assert_eq!(
            s.state
                .metrics()
                .peer_refused
                .with_label_values(&["not_a_peer"])
                .get(),
            4
        );
        // Plaintext listeners authenticate nobody (development only, said at start).
        assert!(s.authorize(&Caller::Anonymous).is_ok());
    }
}
