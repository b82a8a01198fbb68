//! The task that keeps tenant credentials fresh: every 2 s it re-reads the API-key and JWKS
//! Secrets the pools reference (rotation without a restart), fetches JWKS URLs that are due,
//! and reports the pools that have no `auth` block (a warning when one appears, and
//! `kvroute_router_tenant_open_pools`).
//!
//! ```text
//! tick (2 s) --RouterState::pool_auths--> referenced Secrets / JWKS sources / open pools
//!    --SecretFiles::refresh, JwksStore::refresh_secrets, refresh_urls--> caches
//! ```

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::Tenants;
use crate::state::RouterState;

/// How often Secrets are re-read.
pub const PERIOD: Duration = Duration::from_secs(2);

/// Refreshes tenant credentials until shutdown.
pub struct RefreshTask {
    tenants: Arc<Tenants>,
    state: RouterState,
    open: BTreeSet<String>,
}

impl RefreshTask {
    /// A task for `state`'s pools.
    pub fn new(state: RouterState) -> Self {
        Self {
            tenants: state.tenants().clone(),
            state,
            open: BTreeSet::new(),
        }
    }

    /// One round: Secrets re-read, due URLs fetched, open pools reported.
    pub async fn tick(&mut self, now: Instant) {
        let pools = self.state.pool_auths();
        let mut key_secrets = Vec::new();
        let mut jwks = Vec::new();
        let mut open = BTreeSet::new();
        for (name, auth) in &pools {
            match auth {
                Some(a) => {
                    key_secrets.extend(a.api_key_secrets.iter().cloned());
                    if let Some(j) = &a.jwt {
                        jwks.push(j.jwks.clone());
                    }
                }
                None => {
                    open.insert(name.clone());
                }
            }
        }
        let auth = &self.tenants.authenticator;
        auth.secrets().refresh(&key_secrets);
        auth.jwks().refresh_secrets(&jwks);
        auth.jwks().refresh_urls(now).await;
        for pool in open.difference(&self.open) {
            tracing::warn!(
                pool,
                "pool has no auth block: it serves anonymous requests (no tenant, no per-tenant limits)"
            );
        }
        self.tenants
            .metrics
            .open_pools
            .set(i64::try_from(open.len()).unwrap_or(i64::MAX));
        self.open = open;
        self.tenants
            .metrics
            .limiter_entries
            .set(i64::try_from(self.tenants.limiter.entries()).unwrap_or(i64::MAX));
    }

    /// Runs until `shutdown`.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                _ = tick.tick() => self.tick(Instant::now()).await,
            }
        }
    }
}
