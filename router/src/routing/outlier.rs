//! Passive health (outlier detection): what the data path saw of each worker's answers
//! ejects a worker that keeps failing, for a back-off that grows with each ejection, then
//! lets it back in. Nothing is probed: only real requests' outcomes count.
//!
//! ```text
//! gateway / Pick API report --outcome(w, Success | Failure(kind), now)--> Health (in the worker's slot)
//!    failures in a row >= consecutive_failures, or timeouts in a row >= consecutive_timeouts
//!       --> ejected until now + min(base x ejections, max)   (refused past max_ejection_percent)
//! plan(now): ejected workers are no candidates (Plan::ejected says which and why), unless every
//!            allowed live worker is ejected: then they all stay candidates (never an empty pool)
//! ```
//!
//! The ejection count falls by one for every `base_ejection_s` a worker spends admitted
//! without a new ejection, so a worker that failed once long ago starts again from the base
//! time, and one that fails again right after readmission stays out longer each time.
//! A success (a request that completed) ends a run of failures. The state lives in the
//! worker's slot of the worker table, so it goes when the worker is retired.

use serde::Serialize;

use super::workers::WorkerId;

/// Settings of passive health. `consecutive_failures == 0 && consecutive_timeouts == 0`
/// turns ejection off (outcomes are still counted for `/debug/workers`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct OutlierConfig {
    /// Failures of any kind in a row that eject a worker (0: never on failures).
    pub consecutive_failures: u32,
    /// Timeouts in a row that eject a worker (0: never on timeouts alone; they still count
    /// as failures).
    pub consecutive_timeouts: u32,
    /// Ejection time of a first ejection, seconds; the n-th ejection in a row lasts n times
    /// this.
    pub base_ejection_s: f64,
    /// Longest ejection, seconds.
    pub max_ejection_s: f64,
    /// Most workers ejected at once, as a percentage of the workers with an open report
    /// stream; an ejection past it is refused (counted) and the worker stays a candidate.
    pub max_ejection_percent: f64,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            consecutive_timeouts: 2,
            base_ejection_s: 30.0,
            max_ejection_s: 300.0,
            max_ejection_percent: 50.0,
        }
    }
}

impl OutlierConfig {
    /// True when some threshold can eject.
    pub fn enabled(&self) -> bool {
        self.consecutive_failures > 0 || self.consecutive_timeouts > 0
    }

    /// How long the `ejections`-th ejection in a row lasts (seconds).
    pub fn ejection_time(&self, ejections: u32) -> f64 {
        let base = if self.base_ejection_s.is_finite() {
            self.base_ejection_s.max(0.0)
        } else {
            0.0
        };
        let max = if self.max_ejection_s.is_finite() {
            self.max_ejection_s.max(0.0)
        } else {
            base
        };
        (base * f64::from(ejections.max(1))).min(max)
    }
}

/// Why a request on a worker failed, as the data path saw it. `label()` is the metric label
/// (a fixed set: never a client's string).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The connection to the worker could not be made.
    Connect,
    /// The worker answered with a 5xx status.
    Http5xx,
    /// The worker's answer broke off before it ended.
    StreamCut,
    /// The worker did not answer (or went silent) within the upstream timeout.
    Timeout,
}

impl FailureKind {
    /// Every kind, for pre-registering metric series.
    pub const ALL: [FailureKind; 4] = [
        FailureKind::Connect,
        FailureKind::Http5xx,
        FailureKind::StreamCut,
        FailureKind::Timeout,
    ];

    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            FailureKind::Connect => "connect",
            FailureKind::Http5xx => "http_5xx",
            FailureKind::StreamCut => "stream_cut",
            FailureKind::Timeout => "timeout",
        }
    }

    /// The kind a Pick API caller names in `ReportAborted.reason` (`connect`, `http_5xx`,
    /// `stream_cut`, `timeout`, ASCII case ignored); any other reason (a client that went
    /// away, a cancelled request) says nothing about the worker.
    pub fn from_report(reason: &str) -> Option<Self> {
        let r = reason.trim();
        Self::ALL
            .into_iter()
            .find(|k| r.eq_ignore_ascii_case(k.label()))
    }
}

/// What became of one request on a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It completed.
    Success,
    /// It failed because of the worker.
    Failure(FailureKind),
}

/// A worker's passive-health record (in its slot of the worker table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Health {
    /// Failures of any kind since its last success.
    pub consecutive_failures: u32,
    /// Timeouts since its last success or other failure.
    pub consecutive_timeouts: u32,
    /// Ejections in a row (decays by one per `base_ejection_s` admitted without one).
    pub ejections: u32,
    /// Ejected until then (seconds, the core's clock; `-inf`: never ejected).
    #[serde(skip)]
    pub ejected_until: f64,
    /// The failure that caused its latest ejection.
    pub reason: Option<FailureKind>,
}

impl Health {
    /// A worker that never failed.
    pub fn new() -> Self {
        Self {
            ejected_until: f64::NEG_INFINITY,
            ..Self::default()
        }
    }

    /// True while ejected at `now`.
    pub fn is_ejected(&self, now: f64) -> bool {
        now < self.ejected_until
    }

    /// Ejections in a row once the time admitted since the last one is counted off.
    fn decayed_ejections(&self, now: f64, cfg: &OutlierConfig) -> u32 {
        if self.ejections == 0 || !self.ejected_until.is_finite() {
            return self.ejections;
        }
        let admitted_for = (now - self.ejected_until).max(0.0);
        if cfg.base_ejection_s <= 0.0 || !cfg.base_ejection_s.is_finite() {
            return 0;
        }
        let periods = (admitted_for / cfg.base_ejection_s).floor();
        let periods = if periods >= f64::from(u32::MAX) {
            u32::MAX
        } else {
            periods as u32
        };
        self.ejections.saturating_sub(periods)
    }

    /// Records an outcome at `now`; returns the failure that should eject the worker (the
    /// caller checks the pool-wide cap, then calls [`Health::eject`]).
    pub fn record(
        &mut self,
        outcome: Outcome,
        cfg: &OutlierConfig,
        now: f64,
    ) -> Option<FailureKind> {
        match outcome {
            Outcome::Success => {
                self.consecutive_failures = 0;
                self.consecutive_timeouts = 0;
                None
            }
            Outcome::Failure(kind) => {
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                if kind == FailureKind::Timeout {
                    self.consecutive_timeouts = self.consecutive_timeouts.saturating_add(1);
                } else {
                    self.consecutive_timeouts = 0;
                }
                if self.is_ejected(now) {
                    // Requests sent before the ejection still end: no second ejection.
                    return None;
                }
                let on_failures = cfg.consecutive_failures > 0
                    && self.consecutive_failures >= cfg.consecutive_failures;
                let on_timeouts = cfg.consecutive_timeouts > 0
                    && self.consecutive_timeouts >= cfg.consecutive_timeouts;
                (on_failures || on_timeouts).then_some(kind)
            }
        }
    }

    /// Ejects the worker at `now` for `reason`: the ejection count (after decay) goes up by
    /// one and sets the time. The failure runs start again. Returns the ejection.
    pub fn eject(&mut self, reason: FailureKind, cfg: &OutlierConfig, now: f64) -> Ejection {
        self.ejections = self.decayed_ejections(now, cfg).saturating_add(1);
        self.ejected_until = now + cfg.ejection_time(self.ejections);
        self.reason = Some(reason);
        self.consecutive_failures = 0;
        self.consecutive_timeouts = 0;
        Ejection {
            reason,
            until: self.ejected_until,
            ejections: self.ejections,
        }
    }
}

/// One ejection.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Ejection {
    /// The failure that caused it.
    pub reason: FailureKind,
    /// Ejected until then (seconds, the core's clock).
    pub until: f64,
    /// Ejections in a row, this one included.
    pub ejections: u32,
}

/// What an outcome did to a worker's standing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OutlierEvent {
    /// Nothing changed (a success, a failure below the thresholds, an unknown worker).
    None,
    /// The worker was ejected.
    Ejected(Ejection),
    /// The worker crossed a threshold but ejecting it would take the ejected workers past
    /// `max_ejection_percent`: it stays a candidate.
    Refused(FailureKind),
}

/// A worker left out of a plan because it is ejected (or kept in because every allowed
/// worker was).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct EjectedWorker {
    /// The worker.
    pub worker: WorkerId,
    /// The failure that ejected it.
    pub reason: FailureKind,
    /// Seconds of ejection left at the plan's time.
    pub remaining_s: f64,
    /// Ejections in a row.
    pub ejections: u32,
    /// Every allowed live worker was ejected, so this one stayed a candidate (the pool is
    /// never emptied by ejections).
    pub kept: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> OutlierConfig {
        OutlierConfig {
            consecutive_failures: 3,
            consecutive_timeouts: 2,
            base_ejection_s: 10.0,
            max_ejection_s: 25.0,
            max_ejection_percent: 50.0,
        }
    }

    #[test]
    fn n_failures_in_a_row_eject_and_a_success_resets_the_run() {
        let c = cfg();
        let mut h = Health::new();
        let fail = Outcome::Failure(FailureKind::Http5xx);
        assert_eq!(h.record(fail, &c, 0.0), None);
        assert_eq!(h.record(fail, &c, 0.0), None);
        assert_eq!(h.record(Outcome::Success, &c, 0.0), None);
        assert_eq!(h.consecutive_failures, 0);
        assert_eq!(h.record(fail, &c, 1.0), None);
        assert_eq!(
            h.record(Outcome::Failure(FailureKind::Connect), &c, 1.0),
            None
        );
        assert_eq!(
            h.record(Outcome::Failure(FailureKind::StreamCut), &c, 1.0),
            Some(FailureKind::StreamCut),
            "the third failure in a row, of any kind"
        );
    }

    #[test]
    fn timeouts_in_a_row_eject_sooner_and_another_failure_breaks_their_run() {
        let c = cfg();
        let mut h = Health::new();
        let timeout = Outcome::Failure(FailureKind::Timeout);
        assert_eq!(h.record(timeout, &c, 0.0), None);
        assert_eq!(
            h.record(Outcome::Failure(FailureKind::Connect), &c, 0.0),
            None
        );
        assert_eq!(h.consecutive_timeouts, 0);
        assert_eq!(
            h.record(timeout, &c, 0.0),
            Some(FailureKind::Timeout),
            "third failure in a row"
        );
        let mut h = Health::new();
        assert_eq!(h.record(timeout, &c, 0.0), None);
        assert_eq!(h.record(timeout, &c, 0.0), Some(FailureKind::Timeout));
    }

    #[test]
    fn ejection_time_grows_per_ejection_up_to_the_max_and_decays_while_admitted() {
        let c = cfg();
        let mut h = Health::new();
        let e1 = h.eject(FailureKind::Connect, &c, 0.0);
        assert_eq!((e1.ejections, e1.until), (1, 10.0));
        assert!(h.is_ejected(9.9) && !h.is_ejected(10.0));
        // Ejected again right after readmission: twice the base.
        let e2 = h.eject(FailureKind::Connect, &c, 11.0);
        assert_eq!((e2.ejections, e2.until), (2, 31.0));
        let e3 = h.eject(FailureKind::Connect, &c, 31.0);
        assert_eq!(
            (e3.ejections, e3.until),
            (3, 56.0),
            "capped at the max (25 s)"
        );
        // Admitted for 25 s (two base periods): two ejections forgotten, so the next is
        // the second in a row.
        let e4 = h.eject(FailureKind::Http5xx, &c, 81.0);
        assert_eq!((e4.ejections, e4.until), (2, 101.0));
        // A long healthy stretch starts again from the base time.
        let e5 = h.eject(FailureKind::Http5xx, &c, 10_000.0);
        assert_eq!((e5.ejections, e5.until), (1, 10_010.0));
    }

    #[test]
    fn failures_of_requests_sent_before_an_ejection_do_not_eject_again() {
        let c = cfg();
        let mut h = Health::new();
        h.eject(FailureKind::Connect, &c, 0.0);
        for _ in 0..10 {
            assert_eq!(
                h.record(Outcome::Failure(FailureKind::Connect), &c, 5.0),
                None
            );
        }
        assert_eq!(h.ejections, 1);
    }

    #[test]
    fn zero_thresholds_never_eject_and_odd_times_are_tamed() {
        let off = OutlierConfig {
            consecutive_failures: 0,
            consecutive_timeouts: 0,
            ..cfg()
        };
        assert!(!off.enabled());
        let mut h = Health::new();
        for _ in 0..100 {
            assert_eq!(
                h.record(Outcome::Failure(FailureKind::Timeout), &off, 0.0),
                None
            );
        }
        let odd = OutlierConfig {
            base_ejection_s: f64::NAN,
            max_ejection_s: f64::INFINITY,
            ..cfg()
        };
        assert_eq!(odd.ejection_time(3), 0.0);
    }

    #[test]
    fn pick_api_reasons_map_to_kinds_and_others_say_nothing() {
        assert_eq!(
            FailureKind::from_report("connect"),
            Some(FailureKind::Connect)
        );
        assert_eq!(
            FailureKind::from_report(" HTTP_5XX "),
            Some(FailureKind::Http5xx)
        );
        assert_eq!(
            FailureKind::from_report("stream_cut"),
            Some(FailureKind::StreamCut)
        );
        assert_eq!(
            FailureKind::from_report("timeout"),
            Some(FailureKind::Timeout)
        );
        assert_eq!(FailureKind::from_report("client_disconnect"), None);
        assert_eq!(FailureKind::from_report(""), None);
    }
}
