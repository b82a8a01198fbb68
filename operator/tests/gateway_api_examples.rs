//! The Gateway API example (`deploy/examples/gateway-api/`, docs/gateway-api.md) read with
//! kvroute's types: the GIE InferencePool is usable by the router (model annotation, target
//! port, selector) and names the operator's router Service on its `epp` port; the model
//! servers it selects listen on its target port; every HTTPRoute sends to that pool through a
//! Gateway of the same file, all in the pool's namespace (GIE references are namespace-local).

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use kvroute_crds::gie::{FailureMode, GIE_GROUP, GieInferencePool};
use kvroute_crds::{AnyResource, parse_documents};
use kvroute_operator::desired::router::{EPP_PORT, ROUTER_NAME};
use serde_json::Value;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/gateway-api")
}

fn docs(file: &str) -> Vec<Value> {
    let path = dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn pools() -> Vec<GieInferencePool> {
    docs("inferencepool.yaml")
        .into_iter()
        .filter(|d| d["kind"] == "InferencePool")
        .map(|d| {
            let text = serde_json::to_string(&d).expect("json");
            match parse_documents(&text).expect("parses").pop() {
                Some(AnyResource::GiePool(p)) => p,
                other => panic!("not a GIE InferencePool: {other:?}"),
            }
        })
        .collect()
}

#[test]
fn the_pool_is_usable_and_names_the_routers_epp_port() {
    let pools = pools();
    assert_eq!(pools.len(), 1);
    let pool = &pools[0];
    assert!(pool.issues().is_empty(), "{:?}", pool.issues());
    let epp = &pool.spec.endpoint_picker_ref;
    let port = u16::try_from(EPP_PORT).expect("port");
    assert!(epp.names_service(ROUTER_NAME, port), "{epp:?}");
    assert_ne!(epp.failure_mode(), FailureMode::Unknown);

    let servers: Vec<Deployment> = docs("inferencepool.yaml")
        .into_iter()
        .filter(|d| d["kind"] == "Deployment")
        .map(|d| serde_json::from_value(d).expect("a Deployment"))
        .collect();
    assert!(!servers.is_empty());
    for d in servers {
        assert_eq!(d.metadata.namespace, pool.metadata.namespace);
        let template = d.spec.expect("spec").template;
        let labels = template.metadata.and_then(|m| m.labels).unwrap_or_default();
        assert!(pool.selects(&labels), "the pool does not select {labels:?}");
        let ports: Vec<i32> = template
            .spec
            .expect("pod spec")
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten().map(|p| p.container_port))
            .collect();
        let target = i32::from(pool.target_port().expect("target port"));
        assert!(ports.contains(&target), "{ports:?} lacks {target}");
    }
}

#[test]
fn every_route_reaches_the_pool_through_a_gateway_of_its_file() {
    let pools = pools();
    let pool = &pools[0];
    let ns = pool.metadata.namespace.clone().expect("namespace");
    let name = pool.metadata.name.clone().expect("name");
    for file in ["envoy-gateway.yaml", "istio.yaml"] {
        let docs = docs(file);
        let gateways: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Gateway").collect();
        let routes: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "HTTPRoute").collect();
        assert_eq!((gateways.len(), routes.len()), (1, 1), "{file}");
        for d in &docs {
            assert_eq!(
                d["metadata"]["namespace"],
                Value::from(ns.as_str()),
                "{file}"
            );
            assert_eq!(d["apiVersion"], "gateway.networking.k8s.io/v1", "{file}");
        }
        let gateway = gateways[0]["metadata"]["name"].clone();
        for route in routes {
            let parents = route["spec"]["parentRefs"].as_array().expect("parentRefs");
            assert!(parents.iter().all(|p| p["name"] == gateway), "{file}");
            let backends: Vec<&Value> = route["spec"]["rules"]
                .as_array()
                .expect("rules")
                .iter()
                .flat_map(|r| r["backendRefs"].as_array().into_iter().flatten())
                .collect();
            assert!(!backends.is_empty(), "{file}");
            for b in backends {
                assert_eq!(b["group"], GIE_GROUP, "{file}");
                assert_eq!(b["kind"], "InferencePool", "{file}");
                assert_eq!(b["name"], Value::from(name.as_str()), "{file}");
            }
        }
    }
}
