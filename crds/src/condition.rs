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
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: &Time,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: status.as_str().to_string(),
        reason: reason.to_string(),
        message: Some(message.into())
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| reason.to_string()),
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
            "Ok",
            "",
            Some(1),
            &at(10),
        )];
        let next = vec![condition(
            READY,
            ConditionStatus::True,
            "Ok",
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
            "Ok",
            "",
            Some(1),
            &at(10),
        )];
        let next = vec![condition(
            READY,
            ConditionStatus::False,
            "Bad",
            "",
            Some(1),
            &at(20),
        )];
        let merged = merge_conditions(&old, next);
        assert_eq!(merged[0].last_transition_time, at(20));
        assert!(!is_true(&merged, READY));
    }
}
