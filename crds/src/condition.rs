//! Conditions shared by every kvroute resource status, and the pure helpers that keep them
//! tidy (a condition's `lastTransitionTime` only moves when its status actually changes).

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition type: the resource takes effect (WorkerSet: all replicas ready; Pool: a primary
/// target is ready). False with reason `NotEnforced` for a kind the router does not act on yet.
pub const READY: &str = "Ready";
/// Condition type: the spec is valid and the operator has taken it in (Pool, Policy, Provider,
/// GatewayBackend). Accepted is not Ready: see [`READY`].
pub const ACCEPTED: &str = "Accepted";
/// Condition type: a rollout or scale is in flight.
pub const PROGRESSING: &str = "Progressing";
/// Condition type: the resource is running below what it asked for, or its spec is invalid.
pub const DEGRADED: &str = "Degraded";
/// Condition type: every object the spec names exists (Pool, Policy, Provider, GatewayBackend).
pub const RESOLVED_REFS: &str = "ResolvedRefs";

/// Declares [`Reason`] and, from the same list, [`Reason::ALL`] and [`Reason::as_str`], so a
/// new reason cannot be missing from either.
macro_rules! reasons {
    (
        $(#[$enum_meta:meta])*
        pub enum Reason { $($(#[$meta:meta])* $v:ident,)* }
    ) => {
        $(#[$enum_meta])*
        pub enum Reason { $($(#[$meta])* $v,)* }

        impl Reason {
            /// Every reason, in declaration order.
            pub const ALL: &[Reason] = &[$(Reason::$v),*];

            /// The reason as it appears in `status.conditions[].reason`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$v => stringify!($v)),*
                }
            }
        }
    };
}

reasons! {
    /// Every `reason` the operator writes into a condition (and `Recovered`, the reason of the
    /// event for a Degraded condition turning False): the one list of them, so
    /// docs/troubleshooting.md can be checked to explain each ([`Reason::ALL`]).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum Reason {
        /// The spec is valid (Accepted=True).
        Accepted,
        /// The spec breaks a rule `validate()` checks; nothing was changed.
        InvalidSpec,
        /// Every object the spec names exists (ResolvedRefs=True).
        Resolved,
        /// An object the spec names does not exist.
        RefNotFound,
        /// A Pool has a ready primary target.
        Ready,
        /// A Pool has no ready primary target.
        NoReadyTargets,
        /// The router acts on the resource.
        Enforced,
        /// The router does not act on this part of the resource yet.
        NotEnforced,
        /// A Policy's route action names an InferenceProvider.
        UnroutableTarget,
        /// A Provider's GatewayBackend is accepted but not Ready.
        BackendNotReady,
        /// A Provider's GatewayBackend is not accepted or its Secrets do not resolve.
        BackendNotAccepted,
        /// OpenAI requests are not translated to an Anthropic provider (OpenAIClients=False).
        NotTranslated,
        /// A GatewayBackend verifies no certificate (TLSVerified=False).
        InsecureSkipVerify,
        /// A Pool routes on load alone while a tokenizer loads (TokenizerRouting).
        LoadOnlyAllowed,
        /// A Pool's requests wait for the tokenizer (TokenizerRouting).
        TokenizerRequired,
        /// The router verifies a Pool's tenants (TenantIdentity=True).
        Verified,
        /// A Pool has no `spec.auth` (TenantIdentity=False).
        Anonymous,
        /// A JWKS Secret a Pool names holds no usable key (TenantIdentity=False).
        InvalidJWKS,
        /// Every Secret is in place and mounted (SecretsMounted, GatewayTLS).
        Mounted,
        /// A Secret named is the operator's own and never mounted (SecretsMounted).
        ReservedSecret,
        /// A Secret named does not exist in the router's namespace (SecretsMounted, GatewayTLS).
        SecretNotFound,
        /// A Secret lacks the key named (SecretsMounted).
        KeyNotFound,
        /// The router Deployment does not mount a Secret yet (SecretsMounted).
        MountPending,
        /// Key pairs issued by the operator's CA are in place (TransportSecurity).
        OperatorCA,
        /// cert-manager Certificates are Ready (TransportSecurity).
        CertManager,
        /// The mTLS Secret lacks key pairs (TransportSecurity).
        CertificatesPending,
        /// cert-manager Certificates are missing or not Ready (TransportSecurity).
        CertificatesNotReady,
        /// Pools name different cert-manager issuers (TransportSecurity).
        IssuerConflict,
        /// The operator runs without `--mtls` (GatewayTLS).
        NotEnabled,
        /// The gateway Secret lacks `tls.crt` or `tls.key` (GatewayTLS).
        SecretKeysMissing,
        /// Another pool named a different gateway Secret first (GatewayTLS).
        ConflictingSecret,
        /// A WorkerSet asks for 0 workers (Ready=True).
        ScaledToZero,
        /// All of a WorkerSet's workers are ready.
        WorkersReady,
        /// Fewer workers are ready than asked for.
        WorkersNotReady,
        /// The Deployment's controller has not seen the latest spec (Progressing).
        Reconciling,
        /// Workers are being replaced with the new template (Progressing).
        RollingOut,
        /// The worker count moves towards the requested one (Progressing).
        Scaling,
        /// Every worker runs the latest template (Progressing=False).
        RolloutComplete,
        /// Nothing is wrong (Degraded=False).
        AsExpected,
        /// The Deployment cannot create pods (Degraded).
        ReplicaFailure,
        /// A worker pod cannot be scheduled (Degraded).
        WorkerUnschedulable,
        /// A worker container keeps crashing (Degraded).
        WorkerCrashLoopBackOff,
        /// A worker image cannot be pulled; backing off (Degraded).
        WorkerImagePullBackOff,
        /// A worker image pull failed (Degraded).
        WorkerErrImagePull,
        /// A worker container's config is broken (Degraded).
        WorkerCreateContainerConfigError,
        /// Routers load the tokenizer from a Hugging Face repository (TokenizerSource).
        HubRepository,
        /// Routers load the tokenizer from a ConfigMap (TokenizerSource).
        ConfigMap,
        /// Routers load the tokenizer from a directory (TokenizerSource).
        Path,
        /// Event only: Degraded went back to False.
        Recovered,
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `status` value of a condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionStatus {
    /// `"True"`.
    True,
    /// `"False"`.
    False,
    /// `"Unknown"`.
    Unknown,
}

impl ConditionStatus {
    /// The string Kubernetes expects.
    pub fn as_str(self) -> &'static str {
        match self {
            ConditionStatus::True => "True",
            ConditionStatus::False => "False",
            ConditionStatus::Unknown => "Unknown",
        }
    }

    /// `True` when `ok`, otherwise `False`.
    pub fn from_bool(ok: bool) -> Self {
        if ok {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        }
    }
}

/// Builds a condition; `now` is an input so callers (and tests) control time. An empty message
/// becomes the reason: Kubernetes requires the field, and some API servers read an empty
/// string in an apply patch as null.
pub fn condition(
    type_: &str,
    status: ConditionStatus,
    reason: Reason,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: &Time,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: status.as_str().to_string(),
        reason: reason.as_str().to_string(),
        message: Some(message.into())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| reason.as_str().to_string()),
        observed_generation,
        last_transition_time: now.clone(),
    }
}

/// Merges `next` into `previous`: each condition in `next` keeps the previous
/// `lastTransitionTime` when its status did not change, so repeated reconciles do not make the
/// status flap. Conditions only in `previous` are dropped (the reconciler owns the whole list).
pub fn merge_conditions(previous: &[Condition], next: Vec<Condition>) -> Vec<Condition> {
    next.into_iter()
        .map(|mut c| {
            if let Some(old) = previous
                .iter()
                .find(|old| old.type_ == c.type_ && old.status == c.status)
            {
                c.last_transition_time = old.last_transition_time.clone();
            }
            c
        })
        .collect()
}

/// Finds a condition by type.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// True when the condition `type_` is present with status `"True"`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("valid timestamp"))
    }

    #[test]
    fn merge_keeps_transition_time_when_status_is_unchanged() {
        let old = vec![condition(
            READY,
            ConditionStatus::True,
            Reason::Ready,
            "",
            Some(1),
            &at(10),
        )];
        let next = vec![condition(
            READY,
            ConditionStatus::True,
            Reason::Ready,
            "",
            Some(2),
            &at(20),
        )];
        let merged = merge_conditions(&old, next);
        assert_eq!(merged[0].last_transition_time, at(10));
        assert_eq!(merged[0].observed_generation, Some(2));
    }

    #[test]
    fn merge_moves_transition_time_when_status_flips() {
        let old = vec![condition(
            READY,
            ConditionStatus::True,
            Reason::Ready,
            "",
            Some(1),
            &at(10),
        )];
        let next = vec![condition(
            READY,
            ConditionStatus::False,
            Reason::NoReadyTargets,
            "",
            Some(1),
            &at(20),
        )];
        let merged = merge_conditions(&old, next);
        assert_eq!(merged[0].last_transition_time, at(20));
        assert!(!is_true(&merged, READY));
    }

    #[test]
    fn reasons_are_distinct_camel_case_words() {
        let mut seen = std::collections::BTreeSet::new();
        for r in Reason::ALL {
            let s = r.as_str();
            assert!(
                s.chars().next().is_some_and(|c| c.is_ascii_uppercase()),
                "{s}"
            );
            assert!(s.chars().all(|c| c.is_ascii_alphanumeric()), "{s}");
            assert!(seen.insert(s), "{s} twice");
        }
        assert_eq!(Reason::Accepted.to_string(), "Accepted");
    }

    #[test]
    fn every_reason_has_a_troubleshooting_heading() {
        let doc = include_str!("../../docs/troubleshooting.md");
        let missing: Vec<&str> = Reason::ALL
            .iter()
            .map(|r| r.as_str())
            .filter(|r| {
                let needle = format!("`{r}`");
                !doc.lines()
                    .any(|l| l.starts_with('#') && l.contains(&needle))
            })
            .collect();
        assert!(
            missing.is_empty(),
            "docs/troubleshooting.md lacks {missing:?}"
        );
    }
}
