//! A Service's addresses as the cluster publishes them, read from its EndpointSlices.
//!
//! Pods here have loopback addresses (127.A.B.C), which the API server refuses in `Endpoints`
//! objects ("may not be in the loopback range"), so the endpoints controller cannot publish
//! them; the EndpointSlice controller can. Both the fake cluster DNS and the tests' stand-in
//! for kube-proxy read slices: `discovery.k8s.io/v1`, or `v1beta1` on API servers before
//! 1.21 (the 1.20 one here).

use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use serde_json::Value;

/// Every EndpointSlice in `namespace` (all namespaces when `None`), as JSON.
pub async fn endpoint_slices(
    client: &kube::Client,
    namespace: Option<&str>,
) -> anyhow::Result<Vec<Value>> {
    let mut last = None;
    for version in ["v1", "v1beta1"] {
        let ar = ApiResource {
            group: "discovery.k8s.io".into(),
            version: version.into(),
            api_version: format!("discovery.k8s.io/{version}"),
            kind: "EndpointSlice".into(),
            plural: "endpointslices".into(),
        };
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        match api.list(&ListParams::default()).await {
            Ok(list) => {
                return Ok(list
                    .items
                    .into_iter()
                    .filter_map(|o| serde_json::to_value(o).ok())
                    .collect());
            }
            Err(kube::Error::Api(s)) if s.code == 404 => last = Some(kube::Error::Api(s)),
            Err(e) => return Err(e.into()),
        }
    }
    Err(last.map_or_else(|| anyhow::anyhow!("no EndpointSlice API"), Into::into))
}

/// The ready addresses of Service `namespace/service` in `slices`, sorted and deduplicated
/// (an endpoint without a `ready` condition counts as ready, as the API documents).
pub fn ready_addresses(slices: &[Value], namespace: &str, service: &str) -> Vec<String> {
    let mut out: Vec<String> = slices
        .iter()
        .filter(|s| {
            s["metadata"]["namespace"] == namespace
                && s["metadata"]["labels"]["kubernetes.io/service-name"] == service
        })
        .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
        .filter(|e| e["conditions"]["ready"] != Value::Bool(false))
        .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn ready_endpoints_of_the_named_service_only() {
        let slices = vec![
            json!({"metadata": {"namespace": "a", "labels": {"kubernetes.io/service-name": "ingest"}},
                   "endpoints": [
                       {"addresses": ["127.9.0.3"], "conditions": {"ready": true}},
                       {"addresses": ["127.9.0.4"], "conditions": {"ready": false}},
                       {"addresses": ["127.9.0.2"]}]}),
            json!({"metadata": {"namespace": "a", "labels": {"kubernetes.io/service-name": "ingest"}},
                   "endpoints": [{"addresses": ["127.9.0.3"], "conditions": {"ready": true}}]}),
            json!({"metadata": {"namespace": "b", "labels": {"kubernetes.io/service-name": "ingest"}},
                   "endpoints": [{"addresses": ["127.9.0.7"]}]}),
            json!({"metadata": {"namespace": "a", "labels": {"kubernetes.io/service-name": "web"}},
                   "endpoints": [{"addresses": ["127.9.0.8"]}]}),
        ];
        assert_eq!(
            ready_addresses(&slices, "a", "ingest"),
            ["127.9.0.2", "127.9.0.3"]
        );
        assert!(ready_addresses(&slices, "a", "none").is_empty());
    }
}
