//! Admission control of the generation endpoints: a cap on requests in flight in the whole
//! gateway (`--max-concurrent-requests`: over it, 503 "overloaded") and, optionally, per
//! client address (`--max-concurrent-requests-per-client`: 429). Shed requests get
//! `Retry-After` and an OpenAI- or Anthropic-shaped body, before their body is read.
//!
//! ```text
//! request --admit(peer)--> Ticket (global permit + client count) --handler--> response body
//!            | none left: 503 / 429 + Retry-After          Ticket dropped when the body ends
//! ```
//!
//! A request holds its ticket until its response (a whole SSE stream) has been sent or the
//! client went away, so the cap counts what the router really carries.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::ConnectInfo;
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::GatewayError;
use crate::listener::{ListenerMetrics, Refusal};

/// The gateway's admission limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Generation requests in flight in the gateway at most.
    pub max_concurrent_requests: usize,
    /// Generation requests in flight from one client address at most (0: no such cap; behind
    /// a load balancer every client may share one address).
    pub max_concurrent_requests_per_client: usize,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            max_concurrent_requests: 2048,
            max_concurrent_requests_per_client: 0,
        }
    }
}

/// The gateway's admission state. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Admission {
    global: Arc<Semaphore>,
    per_client_max: usize,
    clients: Clients,
    metrics: ListenerMetrics,
}

/// Held while a request is in flight.
#[derive(Debug)]
pub struct Ticket {
    _client: ClientCount,
    _global: OwnedSemaphorePermit,
}

/// One request counted against its client's cap; given back when dropped.
#[derive(Debug)]
struct ClientCount(Option<(IpAddr, Clients)>);

/// Requests in flight per client address (only addresses with some).
type Clients = Arc<Mutex<HashMap<IpAddr, usize>>>;

impl Drop for ClientCount {
    fn drop(&mut self) {
        if let Some((ip, clients)) = self.0.take() {
            let mut map = clients.lock();
            if let Some(n) = map.get_mut(&ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    map.remove(&ip);
                }
            }
        }
    }
}

impl Admission {
    /// Admission with `cfg`, counting refusals in `metrics` (listener `gateway`).
    pub fn new(cfg: AdmissionConfig, metrics: ListenerMetrics) -> Self {
        Self {
            global: Arc::new(Semaphore::new(
                cfg.max_concurrent_requests.clamp(1, Semaphore::MAX_PERMITS),
            )),
            per_client_max: cfg.max_concurrent_requests_per_client,
            clients: Arc::new(Mutex::new(HashMap::new())),
            metrics,
        }
    }

    /// Admits one request from `peer` (unknown when the server does not say), or refuses it.
    pub fn admit(&self, peer: Option<IpAddr>) -> Result<Ticket, GatewayError> {
        let client = match (peer, self.per_client_max) {
            (Some(ip), max) if max > 0 => {
                let mut map = self.clients.lock();
                let n = map.entry(ip).or_insert(0);
                if *n >= max {
                    drop(map);
                    self.metrics
                        .refuse("gateway", Refusal::ClientConcurrencyLimit);
                    return Err(GatewayError::ClientOverloaded);
                }
                *n += 1;
                ClientCount(Some((ip, self.clients.clone())))
            }
            _ => ClientCount(None),
        };
        // On refusal here `client` is dropped, which gives its count back.
        let Ok(global) = self.global.clone().try_acquire_owned() else {
            self.metrics.refuse("gateway", Refusal::ConcurrencyLimit);
            return Err(GatewayError::Overloaded);
        };
        Ok(Ticket {
            _client: client,
            _global: global,
        })
    }
}

/// The client's address, when the server recorded it.
pub fn peer_ip(extensions: &http::Extensions) -> Option<IpAddr> {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip().to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(global: usize, per_client: usize) -> (Admission, ListenerMetrics) {
        let m = ListenerMetrics::unregistered().expect("metrics");
        (
            Admission::new(
                AdmissionConfig {
                    max_concurrent_requests: global,
                    max_concurrent_requests_per_client: per_client,
                },
                m.clone(),
            ),
            m,
        )
    }

    #[test]
    fn global_cap_sheds_with_503_and_frees_on_drop() {
        let (a, m) = admission(2, 0);
        let t1 = a.admit(None).expect("1");
        let _t2 = a.admit(None).expect("2");
        let e = a.admit(None).expect_err("3");
        assert_eq!((e.status(), e.retry_after()), (503, Some(1)));
        assert_eq!(m.refused("gateway", Refusal::ConcurrencyLimit), 1);
        drop(t1);
        assert!(a.admit(None).is_ok());
    }

    #[test]
    fn per_client_cap_sheds_with_429_and_does_not_leak_counts() {
        let (a, m) = admission(3, 1);
        let ip: IpAddr = "10.0.0.1".parse().expect("ip");
        let other: IpAddr = "10.0.0.2".parse().expect("ip");
        let t = a.admit(Some(ip)).expect("first");
        assert_eq!(a.admit(Some(ip)).expect_err("second").status(), 429);
        assert_eq!(m.refused("gateway", Refusal::ClientConcurrencyLimit), 1);
        let _o = a.admit(Some(other)).expect("another client");
        drop(t);
        let _t = a.admit(Some(ip)).expect("after release");
        // The global cap refuses a client whose count must then be given back.
        let _x = a.admit(None).expect("third global");
        let third: IpAddr = "10.0.0.3".parse().expect("ip");
        assert_eq!(a.admit(Some(third)).expect_err("global").status(), 503);
        assert!(!a.clients.lock().contains_key(&third));
        assert_eq!(a.clients.lock().len(), 2);
    }
}
