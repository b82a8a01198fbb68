//! mTLS for kvroute's gRPC links: sidecar -> router (Ingest) and external gateway -> router
//! (Picker). Both ends read a directory laid out like a mounted `kubernetes.io/tls` Secret
//! (`tls.crt`, `tls.key`, `ca.crt`), re-read it when it changes, and name each other by the
//! SPIFFE URI in the certificate's subject alternative names ([`Identity`]).
//!
//! ```text
//! DIR/{tls.crt,tls.key,ca.crt} --material::read--> Material --server_config / client_config--> rustls config
//!        ^ polled by Watched::watch (changed and valid: swap; invalid: keep the old one, report)
//! router:  TcpListener --net::tls_incoming (handshake, client cert required)--> tonic serve_with_incoming
//! sidecar: tonic Endpoint --net::ClientTls::channel (TCP + handshake per connect)--> Channel
//! peer certificate --Identity::from_cert--> WorkerSet / Router / Picker identity
//! ```
//!
//! A reload swaps the configuration used for *new* handshakes only: connections already
//! established keep their session, so no stream is dropped by a rotation. During a CA
//! rotation `ca.crt` holds both CAs, and either verifies.

pub mod identity;
pub mod material;
pub mod net;
pub mod reload;
#[cfg(any(test, feature = "test-pki"))]
pub mod testpki;

pub use identity::{Identity, IdentityError, TRUST_DOMAIN, cert_valid_for_dns_name};
pub use material::{CA_FILE, CERT_FILE, KEY_FILE, Material, TlsError};
pub use net::{ClientTls, HandshakeFailure, tls_incoming};
pub use reload::{Watched, WatchedClient, WatchedServer};

/// The TLS connection type the router's gRPC server sees.
pub type ServerStream = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
