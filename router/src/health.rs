//! grpc.health.v1 follows the replica's [`Phase`]: gRPC load balancers and external
//! gateways that health-check the Pick API see what the admin `/readyz` says.
//!
//! ```text
//! Readiness (watch) --phase--> HealthTask --set_service_status--> tonic-health reporter
//!   Starting: ""/Picker NOT_SERVING, Ingest SERVING (sidecars stream to a starting replica)
//!   Ready:    all SERVING
//!   Draining: all NOT_SERVING (before the listeners close)
//! ```
//!
//! While starting, the task also re-judges readiness every [`HealthTask::RECHECK`], so a
//! replica becomes ready when its last sidecar stream or tokenizer arrives even if nobody
//! probes `/readyz`.

use std::time::{Duration, Instant};

use kvroute_proto::v1::ingest_server::IngestServer;
use kvroute_proto::v1::picker_server::PickerServer;
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::ingest::IngestService;
use crate::pick::PickerService;
use crate::readiness::Phase;
use crate::state::RouterState;

/// Name of the Ingest service in grpc.health.v1.
pub const INGEST: &str = <IngestServer<IngestService> as NamedService>::NAME;
/// Name of the Picker service in grpc.health.v1.
pub const PICKER: &str = <PickerServer<PickerService> as NamedService>::NAME;

/// What each service reports in `phase`: (overall "", Ingest, Picker).
pub fn statuses(phase: Phase) -> [(&'static str, ServingStatus); 3] {
    let (all, ingest) = match phase {
        Phase::Starting => (ServingStatus::NotServing, ServingStatus::Serving),
        Phase::Ready => (ServingStatus::Serving, ServingStatus::Serving),
        Phase::Draining => (ServingStatus::NotServing, ServingStatus::NotServing),
    };
    [("", all), (INGEST, ingest), (PICKER, all)]
}

/// Keeps the health reporter in step with the readiness phase.
pub struct HealthTask {
    /// The router state (its readiness).
    pub state: RouterState,
    /// The reporter of the served health service.
    pub reporter: HealthReporter,
}

impl HealthTask {
    /// How often a starting replica re-judges its readiness.
    pub const RECHECK: Duration = Duration::from_millis(200);

    /// Sets the statuses of the current phase (call before serving).
    pub async fn apply(&self, phase: Phase) {
        for (service, status) in statuses(phase) {
            self.reporter.set_service_status(service, status).await;
        }
    }

    /// Follows the phase until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let mut phases = self.state.readiness().subscribe();
        let mut recheck = tokio::time::interval(Self::RECHECK);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let phase = *phases.borrow_and_update();
            self.apply(phase).await;
            tracing::info!(?phase, "gRPC health follows the readiness phase");
            loop {
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    changed = phases.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        break;
                    }
                    _ = recheck.tick(), if phase == Phase::Starting => {
                        if let Err(why) = self.state.check_ready(Instant::now()) {
                            tracing::debug!(%why, "not ready yet");
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sidecars_reach_a_starting_replica_and_nothing_reaches_a_draining_one() {
        let of = |phase| statuses(phase).map(|(_, s)| s);
        use ServingStatus::{NotServing as Off, Serving as On};
        assert_eq!(of(Phase::Starting), [Off, On, Off]);
        assert_eq!(of(Phase::Ready), [On, On, On]);
        assert_eq!(of(Phase::Draining), [Off, Off, Off]);
        assert_eq!(INGEST, "kvroute.v1.Ingest");
        assert_eq!(PICKER, "kvroute.v1.Picker");
    }
}
