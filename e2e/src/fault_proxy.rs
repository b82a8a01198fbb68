//! An in-process TCP fault proxy: it sits between a client and a server on loopback (in the
//! fault suite, between every sidecar and one router replica's gRPC port) and passes bytes
//! through, holds them (a blackhole: nothing gets through either way, connections stay open,
//! as when packets are dropped and TCP keeps retransmitting), or cuts every connection.
//!
//! ```text
//! sidecar --TCP--> FaultProxy (127.0.0.1:port) --TCP--> router gRPC
//!                    mode: Pass | Stall | Drop   (FaultProxy::set)
//! ```
//!
//! `Stall` reads at most one buffer per direction and then stops reading, so the sender's
//! socket buffers fill and its writes block, as they would on a blackholed path; when the mode
//! goes back to `Pass` the held bytes are delivered in order (TCP's retransmission would
//! deliver them too). `Drop` closes every open connection with a reset and refuses new ones
//! until the mode changes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    /// Bytes pass both ways.
    Pass,
    /// Bytes are held both ways; connections stay open (a blackhole).
    Stall,
    /// Every connection is reset; new ones are accepted and reset at once.
    Drop,
}

/// A running proxy; the listener and every connection end when it is dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    accepted: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    /// Listens on `127.0.0.1:0` and forwards each connection to `upstream`, in `Pass` mode.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (mode, rx) = watch::channel(ProxyMode::Pass);
        let accepted = Arc::new(AtomicU64::new(0));
        let counter = accepted.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                counter.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(serve(client, upstream, rx.clone()));
            }
        });
        Ok(Self {
            addr,
            mode,
            accepted,
            task,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches the mode for every open and future connection.
    pub fn set(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    /// The mode now.
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }

    /// Connections accepted so far (each reconnect of a client counts).
    pub fn connections_accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        // Ends every connection's pumps (they watch the mode).
        self.mode.send_replace(ProxyMode::Drop);
    }
}

/// Resets `s` (linger 0) and closes it.
fn reset(s: TcpStream) {
    let _ = s.set_zero_linger();
    drop(s);
}

async fn serve(client: TcpStream, upstream: SocketAddr, mode: watch::Receiver<ProxyMode>) {
    if *mode.borrow() == ProxyMode::Drop {
        reset(client);
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        reset(client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = tokio::spawn(pump(cr, sw, mode.clone()));
    let down = tokio::spawn(pump(sr, cw, mode.clone()));
    let (up, down) = (up.await, down.await);
    // Whichever side reset, the pair is gone; a Drop ends both with a reset.
    if let (Ok(Some((cr, sw))), Ok(Some((sr, cw)))) = (up, down)
        && *mode.borrow() == ProxyMode::Drop
    {
        if let Ok(c) = cr.reunite(cw) {
            reset(c);
        }
        if let Ok(s) = sr.reunite(sw) {
            reset(s);
        }
    }
}

type Halves = (
    tokio::net::tcp::OwnedReadHalf,
    tokio::net::tcp::OwnedWriteHalf,
);

/// Copies `rd` to `wr` while the mode allows; returns the halves when a `Drop` ended it (so
/// the connection can be reset), `None` when the connection ended by itself.
async fn pump(
    mut rd: tokio::net::tcp::OwnedReadHalf,
    mut wr: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<ProxyMode>,
) -> Option<Halves> {
    let mut dropped = mode.clone();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            r = rd.read(&mut buf) => match r {
                Ok(n) => n,
                Err(_) => return None,
            },
            _ = dropped.wait_for(|m| *m == ProxyMode::Drop) => return Some((rd, wr)),
        };
        if n == 0 {
            let _ = wr.shutdown().await;
            return None;
        }
        // Hold the bytes while stalled.
        match mode.wait_for(|m| *m != ProxyMode::Stall).await.map(|m| *m) {
            Ok(ProxyMode::Pass) => {}
            _ => return Some((rd, wr)),
        }
        if wr.write_all(&buf[..n]).await.is_err() {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
        let addr = l.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn passes_stalls_then_delivers_and_drops() {
        let proxy = FaultProxy::start(echo_server().await).await.expect("proxy");
        let mut c = TcpStream::connect(proxy.addr()).await.expect("connect");
        let mut buf = [0u8; 5];
        c.write_all(b"hello").await.expect("write");
        c.read_exact(&mut buf).await.expect("echo");
        assert_eq!(&buf, b"hello");

        proxy.set(ProxyMode::Stall);
        c.write_all(b"world").await.expect("write");
        let held = tokio::time::timeout(
            std::time::Duration::from_millis(300),
            c.read_exact(&mut buf),
        )
        .await;
        assert!(held.is_err(), "nothing passes while stalled");
        proxy.set(ProxyMode::Pass);
        c.read_exact(&mut buf)
            .await
            .expect("delivered after the stall");
        assert_eq!(&buf, b"world");

        proxy.set(ProxyMode::Drop);
        let mut rest = Vec::new();
        let end =
            tokio::time::timeout(std::time::Duration::from_secs(10), c.read_to_end(&mut rest))
                .await
                .expect("the connection ends");
        assert!(end.is_err() || rest.is_empty(), "{end:?} {rest:?}");
        assert_eq!(proxy.connections_accepted(), 1);
    }
}
