//! The headless Service of a WorkerSet: one DNS record per worker pod, ready or not.

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvroute_crds::workerset::InferenceWorkerSet;

use super::{Meta, labels, meta, selector_labels};
use crate::desired::{DesiredError, owner_ref};

/// Headless Service: one DNS record per worker pod, for discovery and for Endpoints readers.
pub fn desired_service(ws: &InferenceWorkerSet) -> Result<Service, DesiredError> {
    let Meta { name, namespace } = meta(ws)?;
    let spec = &ws.spec;
    let sp = |n: &str, p: i32| ServicePort {
        name: Some(n.to_string()),
        port: p,
        target_port: Some(IntOrString::Int(p)),
        protocol: Some("TCP".to_string()),
        ..Default::default()
    };
    Ok(Service {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(namespace),
            labels: Some(labels(&name)),
            owner_references: Some(vec![owner_ref(ws)?]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            selector: Some(selector_labels(&name)),
            // Workers are listed while they load so the router can watch them warm up.
            publish_not_ready_addresses: Some(true),
            ports: Some(vec![
                sp("http", spec.engine.port),
                sp("sidecar-admin", spec.sidecar.admin_port),
            ]),
            ..Default::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::ws;
    use super::*;

    #[test]
    fn headless_service_selects_the_workers() {
        let s = desired_service(&ws("model: {name: m}\n")).expect("builds");
        let spec = s.spec.expect("spec");
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.selector, Some(selector_labels("qwen")));
        assert_eq!(spec.ports.expect("ports")[0].port, 8000);
    }

    #[test]
    fn missing_namespace_is_an_error_not_a_panic() {
        let mut w = ws("model: {name: m}\n");
        w.metadata.namespace = None;
        assert_eq!(
            desired_service(&w).unwrap_err(),
            DesiredError::MissingMetadata("namespace")
        );
    }
}
