//! The sockets: the router's accept loop with TLS handshakes off the accept path, and the
//! client side as a tonic connector.
//!
//! ```text
//! TcpListener --accept--> spawn(handshake with Watched::current(), timeout) --ok--> channel --> tonic serve_with_incoming
//!                                                                           \--err--> on_failure(HandshakeFailure)
//! tonic Endpoint --connect_with_connector(ClientTls)--> TCP (optionally from a bound source IP) --handshake--> h2
//! ```
//!
//! Each handshake takes the configuration current at its start, so a reload never touches
//! connections already established. At most [`MAX_HANDSHAKES`] handshakes run at once; the
//! accept loop waits for a free slot (the kernel's backlog holds the rest).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_stream::wrappers::ReceiverStream;

use crate::ServerStream;
use crate::reload::{WatchedClient, WatchedServer};

/// Handshakes in progress at once, at most.
pub const MAX_HANDSHAKES: usize = 1024;

/// Why a server-side handshake failed. `label()` is the metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// The client presented no certificate.
    NoCertificate,
    /// The client's certificate does not verify (unknown CA, expired, wrong usage).
    BadCertificate,
    /// Not finished within the handshake timeout.
    Timeout,
    /// Anything else: not TLS, no common protocol version or ALPN, a reset.
    Protocol,
}

impl HandshakeFailure {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            HandshakeFailure::NoCertificate => "no_certificate",
            HandshakeFailure::BadCertificate => "bad_certificate",
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::Protocol => "protocol",
        }
    }

    fn of(e: &io::Error) -> Self {
        match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            Some(rustls::Error::NoCertificatesPresented) => HandshakeFailure::NoCertificate,
            Some(rustls::Error::InvalidCertificate(_)) => HandshakeFailure::BadCertificate,
            _ => HandshakeFailure::Protocol,
        }
    }
}

/// Accepts TCP connections on `listener` and yields those whose TLS handshake (with a
/// verified client certificate) succeeds; failures go to `on_failure`. Ends when the
/// returned stream is dropped.
pub fn tls_incoming(
    listener: TcpListener,
    tls: Arc<WatchedServer>,
    timeout: Duration,
    on_failure: impl Fn(HandshakeFailure) + Send + Sync + 'static,
) -> ReceiverStream<io::Result<ServerStream>> {
    let (tx, rx) = mpsc::channel::<io::Result<ServerStream>>(64);
    let on_failure = Arc::new(on_failure);
    let slots = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                biased;
                () = tx.closed() => return,
                a = async {
                    // Never closed, so `acquire_owned` cannot fail.
                    let permit = slots.clone().acquire_owned().await.ok();
                    (permit, listener.accept().await)
                } => a,
            };
            let (tcp, peer) = match accepted {
                (Some(permit), Ok((tcp, peer))) => ((tcp, permit), peer),
                (_, Err(e)) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "gRPC accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                (None, Ok(_)) => return,
            };
            let (tcp, permit) = tcp;
            let acceptor = TlsAcceptor::from(tls.current());
            let tx = tx.clone();
            let on_failure = on_failure.clone();
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                let result = tokio::time::timeout(timeout, acceptor.accept(tcp)).await;
                drop(permit);
                let failure = match result {
                    Ok(Ok(stream)) => {
                        // The server may be shutting down; then the connection just closes.
                        let _ = tx.send(Ok(stream)).await;
                        return;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        HandshakeFailure::of(&e)
                    }
                    Err(_) => HandshakeFailure::Timeout,
                };
                on_failure(failure);
            });
        }
    });
    ReceiverStream::new(rx)
}

/// The client side: a TLS directory, the name the server's certificate must carry, and
/// optionally the local address to connect from.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<WatchedClient>,
    server_name: Option<ServerName<'static>>,
    bind: Option<IpAddr>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("dir", &self.config.dir())
            .field("server_name", &self.server_name)
            .field("bind", &self.bind)
            .finish()
    }
}

fn server_name(name: &str) -> io::Result<ServerName<'static>> {
    ServerName::try_from(name.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
}

impl ClientTls {
    /// Verifies servers as `server_name` (a DNS name, or an IP address literal); `None`:
    /// as the host of the endpoint connected to.
    pub fn new(config: Arc<WatchedClient>, server_name: Option<&str>) -> io::Result<Self> {
        Ok(Self {
            config,
            server_name: server_name.map(self::server_name).transpose()?,
            bind: None,
        })
    }

    /// Connects from this local IP (tests of the peer-address check use 127.0.0.x).
    pub fn bind(mut self, ip: IpAddr) -> Self {
        self.bind = Some(ip);
        self
    }

    /// The watched configuration (for reload tasks).
    pub fn config(&self) -> &Arc<WatchedClient> {
        &self.config
    }

    /// TCP-connects to `uri`'s host and port and runs the handshake with the configuration
    /// current now.
    pub async fn connect(
        &self,
        uri: &http::Uri,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let host = uri
            .host()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "endpoint has no host"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = uri.port_u16().unwrap_or(443);
        let name = match &self.server_name {
            Some(n) => n.clone(),
            None => server_name(host)?,
        };
        let mut last = io::Error::new(io::ErrorKind::NotFound, "endpoint resolves to no address");
        for addr in tokio::net::lookup_host((host, port)).await? {
            match self.tcp(addr).await {
                Ok(tcp) => {
                    let _ = tcp.set_nodelay(true);
                    let connector = TlsConnector::from(self.config.current());
                    return connector.connect(name, tcp).await;
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn tcp(&self, addr: SocketAddr) -> io::Result<TcpStream> {
        let Some(ip) = self.bind else {
            return TcpStream::connect(addr).await;
        };
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.bind(SocketAddr::new(ip, 0))?;
        socket.connect(addr).await
    }

    /// A tonic channel to `endpoint` (an `http://host:port` URI: TLS is done here, not by
    /// tonic). Each (re)connect reads the current configuration.
    pub async fn channel(
        &self,
        endpoint: tonic::transport::Endpoint,
    ) -> Result<tonic::transport::Channel, tonic::transport::Error> {
        let this = self.clone();
        let connector = tower::service_fn(move |uri: http::Uri| {
            let this = this.clone();
            async move { this.connect(&uri).await.map(TokioIo::new) }
        });
        endpoint.connect_with_connector(connector).await
    }
}
