//! Prometheus metrics of the operator (`kvroute_operator_*`). Label sets are bounded: `kind` is
//! one of the five CRD kinds or `Router`, `error` is an [`crate::controller::Error`] variant
//! name, `holder` is a lease holder identity (one per operator replica).

use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// Operator metrics.
#[derive(Clone)]
pub struct OperatorMetrics {
    /// `kvroute_operator_reconciliations_total{kind}`.
    pub reconciliations: IntCounterVec,
    /// `kvroute_operator_reconcile_errors_total{kind,error}`.
    pub reconcile_errors: IntCounterVec,
    /// `kvroute_operator_reconcile_duration_seconds{kind}`; buckets 5 ms .. 10 s (API round
    /// trips dominate).
    pub reconcile_duration: HistogramVec,
    /// `kvroute_operator_leader`: 1 while this process holds the lease.
    pub leader: IntGauge,
    /// `kvroute_operator_lease_holder{holder}`: 1 for the identity currently holding the lease.
    pub lease_holder: IntGaugeVec,
    /// `kvroute_operator_certificates_issued_total{reason}`: key pairs issued by the operator's
    /// CA, by [`crate::pki::Reason`].
    pub certificates_issued: IntCounterVec,
    /// `kvroute_operator_ca_steps_total{step}`: changes to the CA Secret, by
    /// [`crate::pki::CaStep`].
    pub ca_steps: IntCounterVec,
}

impl OperatorMetrics {
    /// Creates and registers every metric.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let reconciliations = IntCounterVec::new(
            Opts::new(
                "kvroute_operator_reconciliations_total",
                "Reconciliations started, by kind.",
            ),
            &["kind"],
        )?;
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "kvroute_operator_reconcile_errors_total",
                "Reconciliations that failed, by kind and error.",
            ),
            &["kind", "error"],
        )?;
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new(
                "kvroute_operator_reconcile_duration_seconds",
                "Time spent in one reconciliation.",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            &["kind"],
        )?;
        let leader = IntGauge::new(
            "kvroute_operator_leader",
            "1 while this operator replica holds the leader lease.",
        )?;
        let lease_holder = IntGaugeVec::new(
            Opts::new(
                "kvroute_operator_lease_holder",
                "1 for the identity that holds the leader lease, as last seen.",
            ),
            &["holder"],
        )?;
        registry.register(Box::new(reconciliations.clone()))?;
        registry.register(Box::new(reconcile_errors.clone()))?;
        registry.register(Box::new(reconcile_duration.clone()))?;
        registry.register(Box::new(leader.clone()))?;
        let certificates_issued = IntCounterVec::new(
            Opts::new(
                "kvroute_operator_certificates_issued_total",
                "Key pairs issued by the operator's CA, by reason.",
            ),
            &["reason"],
        )?;
        let ca_steps = IntCounterVec::new(
            Opts::new(
                "kvroute_operator_ca_steps_total",
                "Changes to the operator's CA Secret (create, stage, promote, drop), by step.",
            ),
            &["step"],
        )?;
        registry.register(Box::new(lease_holder.clone()))?;
        registry.register(Box::new(certificates_issued.clone()))?;
        registry.register(Box::new(ca_steps.clone()))?;
        Ok(Self {
            reconciliations,
            reconcile_errors,
            reconcile_duration,
            leader,
            lease_holder,
            certificates_issued,
            ca_steps,
        })
    }

    /// Records who holds the lease now (only one series stays at 1).
    pub fn set_holder(&self, holder: &str) {
        self.lease_holder.reset();
        if !holder.is_empty() {
            self.lease_holder.with_label_values(&[holder]).set(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Encoder;

    #[test]
    fn metrics_register_and_render() {
        let registry = Registry::new();
        let m = OperatorMetrics::register(&registry).expect("register");
        m.reconcile_errors
            .with_label_values(&["InferenceWorkerSet", "Kube"])
            .inc();
        m.set_holder("a");
        m.set_holder("b");
        let mut out = Vec::new();
        prometheus::TextEncoder::new()
            .encode(&registry.gather(), &mut out)
            .expect("encode");
        let text = String::from_utf8(out).expect("utf8");
        assert!(text.contains(
            "kvroute_operator_reconcile_errors_total{error=\"Kube\",kind=\"InferenceWorkerSet\"} 1"
        ));
        assert!(text.contains("kvroute_operator_lease_holder{holder=\"b\"} 1"));
        assert!(!text.contains("holder=\"a\""));
        assert!(
            OperatorMetrics::register(&registry).is_err(),
            "double registration is refused"
        );
    }
}
