//! The WorkerSet's status, from what the API server says about its Deployment and pods:
//! replicas, one entry per worker, Ready / Progressing / Degraded conditions, and the
//! transitions among them worth an event.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kvroute_crds::condition::{
    self, Condition, ConditionStatus, DEGRADED, PROGRESSING, READY, Reason, Time,
};
use kvroute_crds::validation::{SpecIssue, summary};
use kvroute_crds::workerset::{
    InferenceWorkerSet, InferenceWorkerSetSpec, InferenceWorkerSetStatus, WorkerStatus,
};

use super::{ENGINE_CONTAINER, SIDECAR_CONTAINER, selector_string};
use crate::desired::{Notable, Severity};

fn container_ready(pod: &Pod, container: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == container))
        .is_some_and(|c| c.ready)
}

/// One status entry per live worker pod, sorted by name.
pub fn worker_statuses(spec: &InferenceWorkerSetSpec, pods: &[Pod]) -> Vec<WorkerStatus> {
    let mut workers: Vec<WorkerStatus> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let pod = p.metadata.name.clone()?;
            let ip = p
                .status
                .as_ref()
                .and_then(|s| s.pod_ip.clone())
                .unwrap_or_default();
            let has_sidecar = p
                .spec
                .as_ref()
                .is_some_and(|s| s.containers.iter().any(|c| c.name == SIDECAR_CONTAINER));
            Some(WorkerStatus {
                pod,
                address: (!ip.is_empty()).then(|| format!("{ip}:{}", spec.engine.port)),
                ready: container_ready(p, ENGINE_CONTAINER),
                sidecar_connected: has_sidecar.then(|| container_ready(p, SIDECAR_CONTAINER)),
            })
        })
        .collect();
    workers.sort_by(|a, b| a.pod.cmp(&b.pod));
    workers
}

/// A reason a pod cannot serve, taken from its status (first one found).
fn pod_trouble(pods: &[Pod]) -> Option<(Reason, String)> {
    for p in pods {
        let name = p.metadata.name.as_deref().unwrap_or("?");
        let Some(status) = &p.status else { continue };
        if let Some(c) = status.conditions.iter().flatten().find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        }) {
            return Some((
                Reason::WorkerUnschedulable,
                format!(
                    "pod {name} cannot be scheduled: {}",
                    c.message.as_deref().unwrap_or("no message")
                ),
            ));
        }
        for cs in status.container_statuses.iter().flatten() {
            let Some(w) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
                continue;
            };
            let ours = match w.reason.as_deref() {
                Some("CrashLoopBackOff") => Reason::WorkerCrashLoopBackOff,
                Some("ImagePullBackOff") => Reason::WorkerImagePullBackOff,
                Some("ErrImagePull") => Reason::WorkerErrImagePull,
                Some("CreateContainerConfigError") => Reason::WorkerCreateContainerConfigError,
                _ => continue,
            };
            let reason = w.reason.as_deref().unwrap_or_default();
            return Some((ours, format!("pod {name} container {}: {reason}", cs.name)));
        }
    }
    None
}

/// What the Deployment reports, reduced to what status needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RolloutFacts {
    /// The Deployment exists.
    pub exists: bool,
    /// Its controller has seen its latest spec.
    pub observed: bool,
    /// `status.replicas`.
    pub replicas: i32,
    /// `status.readyReplicas`.
    pub ready: i32,
    /// `status.updatedReplicas`.
    pub updated: i32,
    /// A `ReplicaFailure` condition is True (e.g. quota).
    pub replica_failure: bool,
}

impl RolloutFacts {
    /// Reads a Deployment as the API server returned it.
    pub fn from_deployment(d: Option<&Deployment>) -> Self {
        let Some(d) = d else { return Self::default() };
        let st = d.status.clone().unwrap_or_default();
        Self {
            exists: true,
            observed: st.observed_generation.is_some()
                && st.observed_generation >= d.metadata.generation,
            replicas: st.replicas.unwrap_or(0),
            ready: st.ready_replicas.unwrap_or(0),
            updated: st.updated_replicas.unwrap_or(0),
            replica_failure: st
                .conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "ReplicaFailure" && c.status == "True"),
        }
    }
}

/// The WorkerSet status. `issues` non-empty means the spec was rejected and no children were
/// written; `now` stamps condition transitions.
pub fn desired_status(
    ws: &InferenceWorkerSet,
    issues: &[SpecIssue],
    rollout: RolloutFacts,
    pods: &[Pod],
    now: &Time,
) -> InferenceWorkerSetStatus {
    let generation = ws.metadata.generation;
    let name = ws.metadata.name.clone().unwrap_or_default();
    let previous = ws.status.clone().unwrap_or_default();
    let cond = |t, s, r: Reason, m: String| condition::condition(t, s, r, m, generation, now);
    let workers = worker_statuses(&ws.spec, pods);
    let desired = ws.spec.replicas;
    let conditions = if !issues.is_empty() {
        let msg = summary(issues);
        vec![
            cond(
                READY,
                ConditionStatus::False,
                Reason::InvalidSpec,
                msg.clone(),
            ),
            cond(
                PROGRESSING,
                ConditionStatus::False,
                Reason::InvalidSpec,
                "spec rejected; nothing was changed".into(),
            ),
            cond(DEGRADED, ConditionStatus::True, Reason::InvalidSpec, msg),
        ]
    } else {
        let ready_msg = format!("{}/{} workers ready", rollout.ready, desired);
        let ready = if desired == 0 {
            cond(
                READY,
                ConditionStatus::True,
                Reason::ScaledToZero,
                "0 workers requested".into(),
            )
        } else if rollout.ready >= desired {
            cond(
                READY,
                ConditionStatus::True,
                Reason::WorkersReady,
                ready_msg.clone(),
            )
        } else {
            cond(
                READY,
                ConditionStatus::False,
                Reason::WorkersNotReady,
                ready_msg.clone(),
            )
        };
        let progressing = if !rollout.exists || !rollout.observed {
            cond(
                PROGRESSING,
                ConditionStatus::True,
                Reason::Reconciling,
                "deployment update not yet observed".into(),
            )
        } else if rollout.updated < desired {
            cond(
                PROGRESSING,
                ConditionStatus::True,
                Reason::RollingOut,
                format!("{}/{} workers updated", rollout.updated, desired),
            )
        } else if rollout.replicas != desired || rollout.ready < desired {
            cond(
                PROGRESSING,
                ConditionStatus::True,
                Reason::Scaling,
                format!(
                    "{} workers, {} ready, {} requested",
                    rollout.replicas, rollout.ready, desired
                ),
            )
        } else {
            cond(
                PROGRESSING,
                ConditionStatus::False,
                Reason::RolloutComplete,
                ready_msg.clone(),
            )
        };
        let degraded = match pod_trouble(pods) {
            Some((reason, msg)) => cond(DEGRADED, ConditionStatus::True, reason, msg),
            None if rollout.replica_failure => cond(
                DEGRADED,
                ConditionStatus::True,
                Reason::ReplicaFailure,
                "the deployment cannot create pods (see its ReplicaFailure condition)".into(),
            ),
            None => cond(
                DEGRADED,
                ConditionStatus::False,
                Reason::AsExpected,
                ready_msg,
            ),
        };
        vec![
            ready,
            progressing,
            degraded,
            tokenizer_source(ws, generation, now),
        ]
    };
    InferenceWorkerSetStatus {
        observed_generation: generation,
        replicas: if rollout.exists { rollout.replicas } else { 0 },
        ready_replicas: rollout.ready,
        selector: Some(selector_string(&name)),
        workers,
        conditions: condition::merge_conditions(&previous.conditions, conditions),
    }
}

/// Condition type naming where the routers load this WorkerSet's tokenizer from.
pub const TOKENIZER_SOURCE: &str = "TokenizerSource";

/// The [`TOKENIZER_SOURCE`] condition: the source the routers resolve (whether a router has
/// loaded it is that router's `/readyz?model=NAME`; what it does meanwhile is the pool's
/// `TokenizerRouting` condition).
fn tokenizer_source(ws: &InferenceWorkerSet, generation: Option<i64>, now: &Time) -> Condition {
    use kvroute_crds::workerset::ResolvedTokenizer;
    let served = ws.spec.model.served();
    let (reason, from) = match ws.spec.model.tokenizer_source() {
        ResolvedTokenizer::Hub {
            repo,
            revision,
            token,
        } => (
            Reason::HubRepository,
            format!(
                "Hugging Face repository {repo}@{revision}{}",
                if token.is_some() {
                    " (with a token)"
                } else {
                    ""
                }
            ),
        ),
        ResolvedTokenizer::ConfigMap(name) => (
            Reason::ConfigMap,
            format!("ConfigMap {name} in the router's namespace"),
        ),
        ResolvedTokenizer::Path(path) => (Reason::Path, format!("the router's directory {path}")),
    };
    condition::condition(
        TOKENIZER_SOURCE,
        ConditionStatus::True,
        reason,
        format!("routers tokenize model {served} with the tokenizer from {from}"),
        generation,
        now,
    )
}

/// Events for transitions from `old` to `new` conditions: becoming ready, losing readiness,
/// becoming degraded (or invalid), recovering.
pub fn notable_transitions(old: &[Condition], new: &[Condition]) -> Vec<Notable> {
    let mut out = Vec::new();
    let changed = |t: &str| {
        let n = condition::find(new, t)?;
        let o = condition::find(old, t);
        (o.map(|o| (&o.status, &o.reason)) != Some((&n.status, &n.reason))).then_some(n)
    };
    if let Some(c) = changed(DEGRADED) {
        if c.status == "True" {
            out.push(Notable {
                severity: Severity::Warning,
                reason: c.reason.clone(),
                note: c.message.clone(),
            });
        } else if condition::is_true(old, DEGRADED) {
            out.push(Notable {
                severity: Severity::Normal,
                reason: Reason::Recovered.as_str().into(),
                note: c.message.clone(),
            });
        }
    }
    // A new resource starts not ready; only say so once it has been ready or is ready now.
    if let Some(c) = changed(READY)
        && c.reason != "InvalidSpec"
        && (c.status == "True" || condition::find(old, READY).is_some())
    {
        let severity = if c.status == "True" {
            Severity::Normal
        } else {
            Severity::Warning
        };
        out.push(Notable {
            severity,
            reason: c.reason.clone(),
            note: c.message.clone(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{now, ws};
    use super::*;

    fn pod(name: &str, ip: Option<&str>, engine_ready: bool, sidecar_ready: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "engine"}, {"name": "sidecar"}]},
            "status": {"podIP": ip, "containerStatuses": [
                {"name": "engine", "ready": engine_ready, "restartCount": 0, "image": "i", "imageID": ""},
                {"name": "sidecar", "ready": sidecar_ready, "restartCount": 0, "image": "i", "imageID": ""}]}
        }))
        .expect("pod")
    }

    #[test]
    fn status_lists_workers_and_reports_ready() {
        let w = ws("model: {name: m}\nreplicas: 2\n");
        let pods = [
            pod("qwen-b", Some("10.0.0.2"), true, false),
            pod("qwen-a", Some("10.0.0.1"), true, true),
        ];
        let facts = RolloutFacts {
            exists: true,
            observed: true,
            replicas: 2,
            ready: 2,
            updated: 2,
            replica_failure: false,
        };
        let st = desired_status(&w, &[], facts, &pods, &now());
        assert_eq!(st.ready_replicas, 2);
        assert_eq!(st.selector.as_deref(), Some("kvroute.dev/workerset=qwen"));
        assert_eq!(st.observed_generation, Some(3));
        assert_eq!(st.workers[0].pod, "qwen-a");
        assert_eq!(st.workers[0].address.as_deref(), Some("10.0.0.1:8000"));
        assert_eq!(st.workers[1].sidecar_connected, Some(false));
        assert!(condition::is_true(&st.conditions, READY));
        assert!(!condition::is_true(&st.conditions, PROGRESSING));
        assert!(!condition::is_true(&st.conditions, DEGRADED));
        let source = condition::find(&st.conditions, TOKENIZER_SOURCE).expect("tokenizer source");
        assert_eq!(source.reason, "HubRepository");
        assert!(source.message.contains("@main"), "{source:?}");
    }

    #[test]
    fn status_while_rolling_and_for_invalid_spec() {
        let w = ws("model: {name: m}\nreplicas: 3\n");
        let facts = RolloutFacts {
            exists: true,
            observed: true,
            replicas: 3,
            ready: 1,
            updated: 1,
            replica_failure: false,
        };
        let st = desired_status(&w, &[], facts, &[], &now());
        assert_eq!(
            condition::find(&st.conditions, PROGRESSING).map(|c| c.reason.as_str()),
            Some("RollingOut")
        );
        assert_eq!(
            condition::find(&st.conditions, READY).map(|c| c.message.as_str()),
            Some("1/3 workers ready")
        );
        let w = ws("model: {name: m}\ngpu: {product: bogus}\n");
        let issues = w.spec.validate();
        let st = desired_status(&w, &issues, RolloutFacts::default(), &[], &now());
        let degraded = condition::find(&st.conditions, DEGRADED).expect("degraded");
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "InvalidSpec")
        );
        assert!(degraded.message.contains("unknown GPU product \"bogus\""));
    }

    #[test]
    fn env_or_volume_clashing_with_the_operators_is_an_invalid_spec_condition() {
        let w = ws(
            "model: {name: m}\nenv: [{name: KVROUTE_SIDECAR_ROUTER, value: x}]\nvolumes: [{name: dshm, emptyDir: {}}]\n",
        );
        let issues = w.spec.validate();
        assert_eq!(issues.len(), 2, "{issues:?}");
        let st = desired_status(&w, &issues, RolloutFacts::default(), &[], &now());
        let degraded = condition::find(&st.conditions, DEGRADED).expect("degraded");
        assert_eq!(
            (degraded.status.as_str(), degraded.reason.as_str()),
            ("True", "InvalidSpec")
        );
        assert!(
            degraded
                .message
                .contains("spec.env[0].name: env \"KVROUTE_SIDECAR_ROUTER\" is reserved")
                && degraded
                    .message
                    .contains("spec.volumes[0].name: volume name \"dshm\" is reserved"),
            "{}",
            degraded.message
        );
        let ready = condition::find(&st.conditions, READY).expect("ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSpec")
        );
    }

    #[test]
    fn crash_looping_pod_degrades_and_transitions_become_events() {
        let w = ws("model: {name: m}\n");
        let crashing: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "qwen-x"},
            "status": {"containerStatuses": [{"name": "engine", "ready": false, "restartCount": 4, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
        }))
        .expect("pod");
        let facts = RolloutFacts {
            exists: true,
            observed: true,
            replicas: 1,
            ready: 0,
            updated: 1,
            replica_failure: false,
        };
        let st = desired_status(&w, &[], facts, &[crashing], &now());
        let degraded = condition::find(&st.conditions, DEGRADED).expect("degraded");
        assert_eq!(degraded.reason, "WorkerCrashLoopBackOff");
        let events = notable_transitions(&[], &st.conditions);
        assert_eq!(events[0].severity, Severity::Warning);
        assert_eq!(events[0].reason, "WorkerCrashLoopBackOff");
        // Same status again: nothing new to say.
        assert!(notable_transitions(&st.conditions, &st.conditions).is_empty());
    }
}
