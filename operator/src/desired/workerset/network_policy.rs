//! The NetworkPolicy of a WorkerSet's pods: the engine's serving port only from the router
//! pods, the sidecar's admin port (`/metrics`, `/healthz`) from anywhere. The KV-event
//! sockets are bound to loopback and need no rule.

use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvroute_crds::workerset::InferenceWorkerSet;

use super::{Meta, labels, meta, selector_labels};
use crate::desired::network_policy::{allow, ingress_policy, pods_in, tcp};
use crate::desired::{DesiredError, OperatorConfig, owner_ref, router};

/// The WorkerSet's NetworkPolicy (same name as the WorkerSet).
pub fn desired_network_policy(
    ws: &InferenceWorkerSet,
    cfg: &OperatorConfig,
) -> Result<NetworkPolicy, DesiredError> {
    let Meta { name, namespace } = meta(ws)?;
    let spec = &ws.spec;
    let metadata = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(namespace),
        labels: Some(labels(&name)),
        owner_references: Some(vec![owner_ref(ws)?]),
        ..Default::default()
    };
    Ok(ingress_policy(
        metadata,
        selector_labels(&name),
        vec![
            allow(
                vec![tcp(spec.engine.port)],
                vec![pods_in(&cfg.router_namespace, router::selector())],
            ),
            allow(vec![tcp(spec.sidecar.admin_port)], Vec::new()),
        ],
    ))
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::{cfg, ws};
    use super::*;

    #[test]
    fn only_routers_reach_the_engine_and_anyone_the_sidecar_metrics() {
        let w = ws("model: {name: m}\n");
        let p = desired_network_policy(&w, &cfg()).expect("builds");
        let spec = p.spec.expect("spec");
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        assert_eq!(
            spec.pod_selector.and_then(|s| s.match_labels),
            Some(selector_labels("qwen"))
        );
        let rules = spec.ingress.expect("ingress");
        assert_eq!(rules.len(), 2);
        let engine = &rules[0];
        let port = |r: &k8s_openapi::api::networking::v1::NetworkPolicyIngressRule| {
            r.ports.clone().unwrap_or_default()[0].port.clone()
        };
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        assert_eq!(port(engine), Some(IntOrString::Int(w.spec.engine.port)));
        let from = engine.from.clone().expect("engine port has a source");
        assert_eq!(
            from[0].pod_selector.clone().and_then(|s| s.match_labels),
            Some(router::selector())
        );
        assert_eq!(
            from[0]
                .namespace_selector
                .clone()
                .and_then(|s| s.match_labels)
                .and_then(|l| l
                    .get(crate::desired::network_policy::NAMESPACE_NAME_LABEL)
                    .cloned()),
            Some(cfg().router_namespace)
        );
        assert_eq!(
            port(&rules[1]),
            Some(IntOrString::Int(w.spec.sidecar.admin_port))
        );
        assert!(rules[1].from.is_none());
    }
}
