//! Leader election decisions, without I/O. The Lease I/O loop ([`crate::lease`]) reads the
//! Lease, asks [`Elector::decide`] what to do, and writes with the Lease's resourceVersion so
//! two candidates racing for the same record cannot both win (the loser gets 409 Conflict).
//!
//! Expiry is judged on this process's own clock, like client-go: a candidate remembers when it
//! last saw the Lease record change and only takes over after a full lease duration without a
//! change. Comparing the holder's `renewTime` with our wall clock would trust clock sync
//! between machines.

use std::time::{Duration, Instant};

/// The fields of a Lease that matter to the election.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LeaseRecord {
    /// `spec.holderIdentity`; empty or absent means free.
    pub holder: Option<String>,
    /// `spec.renewTime` as written by the holder (opaque here: only compared for change).
    pub renew_time: Option<String>,
    /// `spec.leaseDurationSeconds`.
    pub duration_seconds: Option<i32>,
    /// `spec.leaseTransitions`.
    pub transitions: i32,
}

/// What to do with the Lease now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// There is no Lease: create it holding it ourselves.
    Create,
    /// We hold it: write a fresh renewTime.
    Renew,
    /// Free or expired: take it (transitions + 1).
    Acquire,
    /// Someone else holds a live lease.
    Follow {
        /// Current holder.
        holder: String,
    },
}

/// State of one candidate.
#[derive(Debug, Clone)]
pub struct Elector {
    identity: String,
    lease_duration: Duration,
    observed: Option<(LeaseRecord, Instant)>,
}

impl Elector {
    /// A candidate called `identity`; `lease_duration` is written into Leases it takes.
    pub fn new(identity: impl Into<String>, lease_duration: Duration) -> Self {
        Self {
            identity: identity.into(),
            lease_duration,
            observed: None,
        }
    }

    /// This candidate's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The duration written into Leases this candidate holds.
    pub fn lease_duration(&self) -> Duration {
        self.lease_duration
    }

    /// Decides from the current record (`None`: no Lease object) at `now`.
    pub fn decide(&mut self, record: Option<&LeaseRecord>, now: Instant) -> Decision {
        let Some(record) = record else {
            self.observed = None;
            return Decision::Create;
        };
        // Remember when the record last changed, by our clock.
        let changed = self
            .observed
            .as_ref()
            .is_none_or(|(seen, _)| seen != record);
        if changed {
            self.observed = Some((record.clone(), now));
        }
        let holder = record.holder.clone().filter(|h| !h.is_empty());
        match holder {
            None => Decision::Acquire,
            Some(h) if h == self.identity => Decision::Renew,
            Some(h) => {
                let duration = record
                    .duration_seconds
                    .and_then(|s| u64::try_from(s).ok())
                    .map(Duration::from_secs)
                    .unwrap_or(self.lease_duration);
                let since = self
                    .observed
                    .as_ref()
                    .map(|(_, at)| now.saturating_duration_since(*at))
                    .unwrap_or_default();
                if since > duration {
                    Decision::Acquire
                } else {
                    Decision::Follow { holder: h }
                }
            }
        }
    }

    /// The record to write for `decision` (Create, Renew, Acquire), with `renew_time` supplied
    /// by the caller (a timestamp string is wall-clock and I/O).
    pub fn record_for(
        &self,
        decision: &Decision,
        current: Option<&LeaseRecord>,
        renew_time: String,
    ) -> Option<LeaseRecord> {
        let transitions = current.map(|c| c.transitions).unwrap_or(0);
        let duration_seconds =
            Some(i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX));
        let holder = Some(self.identity.clone());
        match decision {
            Decision::Create => Some(LeaseRecord {
                holder,
                renew_time: Some(renew_time),
                duration_seconds,
                transitions: 0,
            }),
            Decision::Renew => Some(LeaseRecord {
                holder,
                renew_time: Some(renew_time),
                duration_seconds,
                transitions,
            }),
            Decision::Acquire => Some(LeaseRecord {
                holder,
                renew_time: Some(renew_time),
                duration_seconds,
                transitions: transitions + 1,
            }),
            Decision::Follow { .. } => None,
        }
    }

    /// Forgets what was observed (after a write conflict the next read starts fresh).
    pub fn reset(&mut self) {
        self.observed = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(holder: &str, renew: &str) -> LeaseRecord {
        LeaseRecord {
            holder: Some(holder.into()),
            renew_time: Some(renew.into()),
            duration_seconds: Some(15),
            transitions: 2,
        }
    }

    #[test]
    fn missing_lease_is_created_and_own_lease_renewed() {
        let t0 = Instant::now();
        let mut e = Elector::new("a", Duration::from_secs(15));
        assert_eq!(e.decide(None, t0), Decision::Create);
        assert_eq!(e.decide(Some(&rec("a", "1")), t0), Decision::Renew);
        let written = e
            .record_for(&Decision::Renew, Some(&rec("a", "1")), "2".into())
            .expect("record");
        assert_eq!(
            (written.holder.as_deref(), written.transitions),
            (Some("a"), 2)
        );
    }

    #[test]
    fn live_lease_is_followed_until_it_stops_changing_for_a_full_duration() {
        let t0 = Instant::now();
        let mut b = Elector::new("b", Duration::from_secs(15));
        assert_eq!(
            b.decide(Some(&rec("a", "1")), t0),
            Decision::Follow { holder: "a".into() }
        );
        // The holder keeps renewing: never expires, however long we watch.
        assert_eq!(
            b.decide(Some(&rec("a", "2")), t0 + Duration::from_secs(14)),
            Decision::Follow { holder: "a".into() }
        );
        assert_eq!(
            b.decide(Some(&rec("a", "3")), t0 + Duration::from_secs(28)),
            Decision::Follow { holder: "a".into() }
        );
        // It stops: still followed within the duration, taken after it.
        assert_eq!(
            b.decide(Some(&rec("a", "3")), t0 + Duration::from_secs(40)),
            Decision::Follow { holder: "a".into() }
        );
        assert_eq!(
            b.decide(Some(&rec("a", "3")), t0 + Duration::from_secs(44)),
            Decision::Acquire
        );
        let taken = b
            .record_for(&Decision::Acquire, Some(&rec("a", "3")), "9".into())
            .expect("record");
        assert_eq!((taken.holder.as_deref(), taken.transitions), (Some("b"), 3));
    }

    #[test]
    fn released_lease_is_taken_at_once() {
        let mut b = Elector::new("b", Duration::from_secs(15));
        let free = LeaseRecord {
            holder: Some(String::new()),
            ..rec("x", "1")
        };
        assert_eq!(b.decide(Some(&free), Instant::now()), Decision::Acquire);
        assert!(
            b.record_for(&Decision::Follow { holder: "x".into() }, None, "1".into())
                .is_none()
        );
    }
}
