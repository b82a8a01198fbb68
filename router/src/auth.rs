//! Who is calling the gRPC services, and what each caller may do.
//!
//! ```text
//! TLS connection --peer certificate--> Identity (kvroute-tls) --+--> Caller::Verified { identity, ip }
//! plaintext connection (no --grpc-tls-dir) ----------------------+--> Caller::Anonymous
//!
//! Ingest stream, first snapshot (worker id W) --RouterState::authorize_stream--> accepted | StreamRefused
//! Pick (model M of pool P) --authorize_pick--> accepted | PickRefused
//! Report*(decision id) --RouterState::ticket(id, caller)--> assignment | PickRefused
//! ```
//!
//! Rules (docs/security.md, "mTLS and identities"):
//! - With `--grpc-tls-dir`, every connection presents a certificate that `ca.crt` verifies
//!   (else the handshake fails). An Ingest stream is accepted only from a WorkerSet identity
//!   `ns/<n>/workerset/<s>`, for a worker id that discovery lists, whose WorkerSet is `<n>/<s>`,
//!   and, when discovery knows the worker's IP, from that IP. `--route-unlisted` never applies
//!   to such streams: an id discovery does not list is refused.
//! - A Pick caller must be a picker identity `ns/<n>/pool/<p>/picker`; a model that comes
//!   from a pool may be picked only by that pool's picker. Reports are accepted only from the
//!   identity the decision id was issued to.
//! - Without TLS every caller is [`Caller::Anonymous`]: the listener is unauthenticated
//!   (a warning at start, and `kvroute_router_grpc_unauthenticated` is 1).

use std::net::IpAddr;

use kvroute_tls::Identity;
use prometheus::{IntCounterVec, IntGauge, Opts, Registry};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::{Request, Status};

/// The owner name of decisions made for anonymous (plaintext) callers.
pub const ANONYMOUS: &str = "anonymous";

/// A gRPC caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Plaintext listener: nobody is authenticated.
    Anonymous,
    /// A verified client certificate naming a kvroute identity.
    Verified {
        /// The certificate's identity.
        identity: Identity,
        /// The TCP peer's address, if known.
        ip: Option<IpAddr>,
    },
}

impl Caller {
    /// The name decisions are bound to: the identity's URI, or [`ANONYMOUS`].
    pub fn owner(&self) -> String {
        match self {
            Caller::Anonymous => ANONYMOUS.to_string(),
            Caller::Verified { identity, .. } => identity.uri(),
        }
    }

    /// Who called `request`. `tls` says whether the listener runs TLS: then a request with
    /// no verified certificate (which the handshake should already have refused) or a
    /// certificate without a kvroute identity is refused.
    pub fn of<T>(request: &Request<T>, tls: bool) -> Result<Caller, Unauthenticated> {
        if !tls {
            return Ok(Caller::Anonymous);
        }
        let info = request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .ok_or(Unauthenticated::NoCertificate)?;
        let certs = info.peer_certs().ok_or(Unauthenticated::NoCertificate)?;
        let leaf = certs.first().ok_or(Unauthenticated::NoCertificate)?;
        let identity = Identity::from_cert(leaf).map_err(|_| Unauthenticated::NoIdentity)?;
        let ip = info.get_ref().remote_addr().map(|a| a.ip().to_canonical());
        Ok(Caller::Verified { identity, ip })
    }
}

/// A TLS caller without a usable identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unauthenticated {
    /// No verified client certificate.
    #[error("no client certificate")]
    NoCertificate,
    /// The certificate names no kvroute identity (or two).
    #[error("the client certificate names no spiffe://kvroute.dev/ identity")]
    NoIdentity,
}

impl Unauthenticated {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Unauthenticated::NoCertificate => "no_certificate",
            Unauthenticated::NoIdentity => "no_identity",
        }
    }

    /// The gRPC status.
    pub fn status(self) -> Status {
        Status::unauthenticated(self.to_string())
    }
}

/// Why an Ingest stream was refused. `label()` is the metric label.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StreamRefused {
    /// No identity at all.
    #[error(transparent)]
    Unauthenticated(#[from] Unauthenticated),
    /// The identity is not a WorkerSet's (a router or picker certificate).
    #[error("identity {0} is not a WorkerSet identity")]
    NotAWorkerSet(String),
    /// Discovery does not list the worker id.
    #[error("worker id `{0}` is not listed by discovery")]
    Unlisted(String),
    /// The worker belongs to another WorkerSet than the certificate's.
    #[error("worker `{worker}` belongs to WorkerSet {listed}, not to {claimed}")]
    ForeignWorkerSet {
        /// The worker id.
        worker: String,
        /// `namespace/name` discovery lists.
        listed: String,
        /// `namespace/name` of the certificate.
        claimed: String,
    },
    /// The connection does not come from the worker's pod IP.
    #[error("worker `{worker}` has IP {expected}; the stream comes from {got}")]
    PeerAddress {
        /// The worker id.
        worker: String,
        /// Its IP per discovery.
        expected: IpAddr,
        /// The TCP peer's IP (`unknown` when not known).
        got: String,
    },
}

impl StreamRefused {
    /// Metric label (a fixed set).
    pub fn label(&self) -> &'static str {
        match self {
            StreamRefused::Unauthenticated(u) => u.label(),
            StreamRefused::NotAWorkerSet(_) => "not_a_workerset",
            StreamRefused::Unlisted(_) => "unlisted",
            StreamRefused::ForeignWorkerSet { .. } => "foreign_workerset",
            StreamRefused::PeerAddress { .. } => "peer_address",
        }
    }

    /// The gRPC status: UNAUTHENTICATED without an identity, else PERMISSION_DENIED.
    pub fn status(&self) -> Status {
        match self {
            StreamRefused::Unauthenticated(u) => u.status(),
            other => Status::permission_denied(other.to_string()),
        }
    }
}

/// Why a Pick or Report call was refused. `label()` is the metric label.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PickRefused {
    /// No identity at all.
    #[error(transparent)]
    Unauthenticated(#[from] Unauthenticated),
    /// The identity is not a picker's.
    #[error("identity {0} is not a picker identity")]
    NotAPicker(String),
    /// A picker of another pool.
    #[error("model `{model}` belongs to pool {pool}; identity {identity} may not pick for it")]
    ForeignPool {
        /// The requested model.
        model: String,
        /// Its pool (`namespace/name`).
        pool: String,
        /// The caller.
        identity: String,
    },
    /// The decision id is malformed, was never issued, or is released already.
    #[error("unknown decision id (never issued, malformed, or already released)")]
    UnknownId,
    /// The decision id was issued to another caller.
    #[error("decision id was issued to another caller")]
    ForeignId,
}

impl PickRefused {
    /// Metric label (a fixed set).
    pub fn label(&self) -> &'static str {
        match self {
            PickRefused::Unauthenticated(u) => u.label(),
            PickRefused::NotAPicker(_) => "not_a_picker",
            PickRefused::ForeignPool { .. } => "foreign_pool",
            PickRefused::UnknownId => "unknown_id",
            PickRefused::ForeignId => "foreign_id",
        }
    }

    /// The gRPC status.
    pub fn status(&self) -> Status {
        match self {
            PickRefused::Unauthenticated(u) => u.status(),
            PickRefused::UnknownId => Status::not_found(self.to_string()),
            other => Status::permission_denied(other.to_string()),
        }
    }
}

/// May `caller` pick for a model of `pool` (`namespace/name`; `None`: a model no pool names)?
/// A GIE InferencePool's view (`gie:namespace/name`) is picked for by the picker identity of
/// the same namespace and name, the pair the operator issues for it.
pub fn authorize_pick(caller: &Caller, model: &str, pool: Option<&str>) -> Result<(), PickRefused> {
    let pool = pool.map(|p| {
        p.strip_prefix(crate::discovery::gie::GIE_WORKER_SET_PREFIX)
            .unwrap_or(p)
    });
    let Caller::Verified { identity, .. } = caller else {
        return Ok(());
    };
    let Identity::Picker {
        namespace,
        pool: own,
    } = identity
    else {
        return Err(PickRefused::NotAPicker(identity.uri()));
    };
    match pool {
        Some(p) if *p != format!("{namespace}/{own}") => Err(PickRefused::ForeignPool {
            model: model.to_string(),
            pool: p.to_string(),
            identity: identity.uri(),
        }),
        _ => Ok(()),
    }
}

/// Label values of `kvroute_router_ingest_refused_total`.
const STREAM_REFUSALS: &[&str] = &[
    "no_certificate",
    "no_identity",
    "not_a_workerset",
    "unlisted",
    "foreign_workerset",
    "peer_address",
];
/// Label values of `kvroute_router_pick_refused_total`.
const PICK_REFUSALS: &[&str] = &[
    "no_certificate",
    "no_identity",
    "not_a_picker",
    "foreign_pool",
    "unknown_id",
    "foreign_id",
];
/// Label values of `kvroute_router_tls_handshake_failures_total`.
const HANDSHAKE_FAILURES: &[&str] = &["no_certificate", "bad_certificate", "timeout", "protocol"];

/// Authentication metrics (part of [`crate::metrics::RouterMetrics`]). Every label set is fixed;
/// all series exist from the start at 0.
#[derive(Clone, Debug)]
pub struct AuthMetrics {
    /// Ingest streams refused, by reason.
    pub ingest_refused: IntCounterVec,
    /// Pick and Report calls refused, by reason.
    pub pick_refused: IntCounterVec,
    /// TLS handshakes that failed on the gRPC listener, by reason.
    pub tls_handshake_failures: IntCounterVec,
    /// Polls of `--grpc-tls-dir` that found changed files, by outcome (reloaded, failed).
    pub tls_reloads: IntCounterVec,
    /// 1 when the gRPC listener (Ingest, Picker) authenticates nobody (no `--grpc-tls-dir`).
    pub grpc_unauthenticated: IntGauge,
}

impl AuthMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let vec = |name: &str, help: &str, label: &str, values: &[&str]| {
            let v = IntCounterVec::new(Opts::new(name, help), &[label])?;
            for value in values {
                v.with_label_values(&[*value]);
            }
            registry.register(Box::new(v.clone()))?;
            Ok::<_, prometheus::Error>(v)
        };
        let m = Self {
            ingest_refused: vec(
                "kvroute_router_ingest_refused_total",
                "Sidecar streams refused by authentication or identity binding, by reason.",
                "reason",
                STREAM_REFUSALS,
            )?,
            pick_refused: vec(
                "kvroute_router_pick_refused_total",
                "Pick and Report calls refused by authentication or decision-id binding, by reason.",
                "reason",
                PICK_REFUSALS,
            )?,
            tls_handshake_failures: vec(
                "kvroute_router_tls_handshake_failures_total",
                "Failed TLS handshakes on the gRPC listener, by reason.",
                "reason",
                HANDSHAKE_FAILURES,
            )?,
            tls_reloads: vec(
                "kvroute_router_tls_reloads_total",
                "Changes of the --grpc-tls-dir files, by outcome (failed: the previous files stay in use).",
                "outcome",
                &["reloaded", "failed"],
            )?,
            grpc_unauthenticated: IntGauge::new(
                "kvroute_router_grpc_unauthenticated",
                "1 when the gRPC listener (Ingest, Picker) runs without TLS and authenticates nobody.",
            )?,
        };
        registry.register(Box::new(m.grpc_unauthenticated.clone()))?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn picker(ns: &str, pool: &str) -> Caller {
        Caller::Verified {
            identity: Identity::Picker {
                namespace: ns.into(),
                pool: pool.into(),
            },
            ip: None,
        }
    }

    #[test]
    fn pick_needs_the_pools_picker() {
        assert_eq!(
            authorize_pick(&Caller::Anonymous, "m", Some("ml/chat")),
            Ok(())
        );
        assert_eq!(
            authorize_pick(&picker("ml", "chat"), "m", Some("ml/chat")),
            Ok(())
        );
        assert_eq!(authorize_pick(&picker("ml", "chat"), "m", None), Ok(()));
        // A GIE pool's view: the picker of the same namespace and name.
        assert_eq!(
            authorize_pick(&picker("ml", "chat"), "m", Some("gie:ml/chat")),
            Ok(())
        );
        assert!(authorize_pick(&picker("ml", "other"), "m", Some("gie:ml/chat")).is_err());
        assert_eq!(
            authorize_pick(&picker("ml", "other"), "m", Some("ml/chat"))
                .expect_err("foreign")
                .label(),
            "foreign_pool"
        );
        assert_eq!(
            authorize_pick(&picker("other", "chat"), "m", Some("ml/chat"))
                .expect_err("foreign namespace")
                .label(),
            "foreign_pool"
        );
        let sidecar = Caller::Verified {
            identity: Identity::WorkerSet {
                namespace: "ml".into(),
                name: "qwen".into(),
            },
            ip: None,
        };
        let e = authorize_pick(&sidecar, "m", None).expect_err("not a picker");
        assert_eq!(e.label(), "not_a_picker");
        assert_eq!(e.status().code(), tonic::Code::PermissionDenied);
    }

    #[test]
    fn metrics_start_at_zero_for_every_reason() {
        let r = Registry::new();
        let m = AuthMetrics::register(&r).expect("register");
        assert_eq!(m.ingest_refused.with_label_values(&["unlisted"]).get(), 0);
        let names: Vec<String> = r.gather().iter().map(|f| f.name().to_string()).collect();
        assert!(names.contains(&"kvroute_router_ingest_refused_total".to_string()));
        assert!(names.contains(&"kvroute_router_grpc_unauthenticated".to_string()));
    }
}
