//! The leader-election loop: reads the coordination.k8s.io/v1 Lease, applies the pure
//! [`Elector`] decision, and writes with the read resourceVersion (a PUT, so a concurrent
//! writer makes ours fail with 409 instead of silently overwriting). Leadership is published on
//! a `watch` channel; controllers run only while it reads `true`.
//!
//! Deadlines, on this process's (tokio) clock: a leader must renew within the *renew
//! deadline* (2/3 of the lease duration), so that it stops writing before any other candidate
//! can consider the lease expired (a full duration without change). Each round (read +
//! write) therefore runs under a timeout: [`LeaseLoop::round_timeout`] (half the renew
//! deadline), and for a leader never past its renew deadline. A leader whose renewals fail
//! or hang until that deadline steps down: it publishes `false` (controllers stop) and
//! competes again as a plain candidate.
//!
//! ```text
//! renewed at t ---- rounds fail / time out ---- t + renew_deadline: step down ---- t + duration:
//!                                                (controllers stop)                others may take over
//! ```

use std::time::Duration;

use tokio::time::Instant;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::election::{Decision, Elector, LeaseRecord};
use crate::metrics::OperatorMetrics;

/// The leader-election task.
pub struct LeaseLoop {
    api: Api<Lease>,
    name: String,
    elector: Elector,
    tick: Duration,
    renew_deadline: Duration,
    round_timeout: Duration,
    leader: watch::Sender<bool>,
    metrics: OperatorMetrics,
}

fn record_of(lease: &Lease) -> LeaseRecord {
    let spec = lease.spec.clone().unwrap_or_default();
    LeaseRecord {
        holder: spec.holder_identity,
        renew_time: spec.renew_time.map(|t| t.0.to_string()),
        duration_seconds: spec.lease_duration_seconds,
        transitions: spec.lease_transitions.unwrap_or(0),
    }
}

impl LeaseLoop {
    /// A loop for Lease `name` in the namespace of `api`. It checks every lease duration / 5;
    /// the renew deadline is 2/3 of the duration, a round's timeout half of that.
    pub fn new(
        api: Api<Lease>,
        name: String,
        elector: Elector,
        leader: watch::Sender<bool>,
        metrics: OperatorMetrics,
    ) -> Self {
        let tick = (elector.lease_duration() / 5).max(Duration::from_millis(200));
        let renew_deadline = elector.lease_duration().mul_f64(2.0 / 3.0);
        Self {
            api,
            name,
            elector,
            tick,
            renew_deadline,
            round_timeout: renew_deadline / 2,
            leader,
            metrics,
        }
    }

    /// How long a leader may go without a successful renewal before it steps down.
    pub fn renew_deadline(&self) -> Duration {
        self.renew_deadline
    }

    /// The longest one round may take (a leader's round also ends at its renew deadline).
    pub fn round_timeout(&self) -> Duration {
        self.round_timeout
    }

    /// One round: read, decide, write. Returns whether we lead afterwards and who holds the lease.
    async fn round(&mut self) -> Result<(bool, String), kube::Error> {
        let current = self.api.get_opt(&self.name).await?;
        let record = current.as_ref().map(record_of);
        let decision = self
            .elector
            .decide(record.as_ref(), Instant::now().into_std());
        let Some(next) = self
            .elector
            .record_for(&decision, record.as_ref(), String::new())
        else {
            let holder = record.and_then(|r| r.holder).unwrap_or_default();
            return Ok((false, holder));
        };
        let now = MicroTime(Timestamp::now());
        let acquired = !matches!(decision, Decision::Renew);
        let old_spec = current
            .as_ref()
            .and_then(|l| l.spec.clone())
            .unwrap_or_default();
        let spec = LeaseSpec {
            holder_identity: next.holder,
            lease_duration_seconds: next.duration_seconds,
            lease_transitions: Some(next.transitions),
            renew_time: Some(now.clone()),
            acquire_time: if acquired {
                Some(now)
            } else {
                old_spec.acquire_time
            },
            ..old_spec
        };
        let result = match current {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Some(mut lease) => {
                // metadata.resourceVersion stays as read: the API server refuses the write if
                // anyone wrote in between.
                lease.spec = Some(spec);
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match result {
            Ok(_) => Ok((true, self.elector.identity().to_string())),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                self.elector.reset();
                Ok((false, String::new()))
            }
            Err(e) => Err(e),
        }
    }

    /// Runs until `shutdown`; then releases the lease if held, so a standby takes over at once.
    pub async fn run(mut self, shutdown: CancellationToken) {
        // Start of the last round that renewed (a conservative stand-in for the renew time).
        let mut last_renew: Option<Instant> = None;
        let mut holder_seen = String::new();
        loop {
            let started = Instant::now();
            let deadline = self.leading_deadline(last_renew);
            if deadline.is_some_and(|d| started >= d) {
                self.step_down("renew deadline passed");
                last_renew = None;
            }
            let budget = match self.leading_deadline(last_renew) {
                Some(d) => d.saturating_duration_since(started).min(self.round_timeout),
                None => self.round_timeout,
            };
            let outcome = tokio::select! {
                _ = shutdown.cancelled() => break,
                r = tokio::time::timeout(budget, self.round()) => r,
            };
            let leading = match outcome {
                Ok(Ok((leading, holder))) => {
                    if leading {
                        last_renew = Some(started);
                    }
                    if !holder.is_empty() && holder != holder_seen {
                        tracing::info!(holder = %holder, me = %self.elector.identity(), "lease holder changed");
                        self.metrics.set_holder(&holder);
                        holder_seen = holder;
                    }
                    leading
                }
                Ok(Err(e)) => {
                    // Keep leading only while the last renewal is fresh enough that nobody
                    // else can have taken over.
                    tracing::warn!(error = %e, "lease round failed");
                    self.still_leading(last_renew)
                }
                Err(_) => {
                    tracing::warn!(timeout_s = budget.as_secs_f64(), "lease round timed out");
                    // What the unanswered write did is unknown: read afresh next round.
                    self.elector.reset();
                    self.still_leading(last_renew)
                }
            };
            if leading {
                self.publish(true);
            } else if *self.leader.borrow() {
                self.step_down("lease lost, or not renewed by the renew deadline");
                last_renew = None;
            } else {
                self.publish(false);
            }
            // Wake at the renew deadline if it comes before the next round.
            let mut pause = self.tick;
            if let Some(d) = self.leading_deadline(last_renew) {
                pause = pause.min(d.saturating_duration_since(Instant::now()));
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(pause) => {}
            }
        }
        if *self.leader.borrow() {
            self.publish(false);
            if let Err(e) = self.release().await {
                tracing::warn!(error = %e, "could not release the lease");
            }
        }
    }

    /// The renew deadline while leading.
    fn leading_deadline(&self, last_renew: Option<Instant>) -> Option<Instant> {
        last_renew
            .filter(|_| *self.leader.borrow())
            .map(|t| t + self.renew_deadline)
    }

    fn still_leading(&self, last_renew: Option<Instant>) -> bool {
        self.leading_deadline(last_renew)
            .is_some_and(|d| Instant::now() < d)
    }

    fn step_down(&self, why: &str) {
        if *self.leader.borrow() {
            tracing::warn!(identity = %self.elector.identity(), why, "stepping down");
        }
        self.publish(false);
    }

    fn publish(&self, leading: bool) {
        if leading != *self.leader.borrow() {
            tracing::info!(leading, identity = %self.elector.identity(), "leadership changed");
        }
        self.metrics.leader.set(i64::from(leading));
        self.leader.send_replace(leading);
    }

    async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.elector.identity()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await?;
        tracing::info!(identity = %self.elector.identity(), "lease released");
        Ok(())
    }
}
