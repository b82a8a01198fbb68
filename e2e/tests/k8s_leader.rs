//! Leader election of two operator replicas on their own API server: the second stays standby
//! (no controllers, no writes) while the first holds the Lease, and takes over when the first
//! is killed.
//!
//! Needs the binaries of `bash e2e/k8s/setup.sh` and `target/<profile>/kvroute`.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, PostParams};
use kvroute_crds::workerset::InferenceWorkerSet;
use kvroute_e2e::harness::{Cluster, OperatorProcess, install_crds};
use kvroute_e2e::procs::wait_for;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const LEASE_SECONDS: u64 = 4;

fn workerset(name: &str) -> InferenceWorkerSet {
    serde_json::from_value(json!({
        "apiVersion": "kvroute.dev/v1alpha1", "kind": "InferenceWorkerSet",
        "metadata": {"name": name},
        "spec": {"model": {"name": "Qwen/Qwen3-0.6B"}, "replicas": 1, "engine": {"mode": "mock"}},
    }))
    .expect("workerset")
}

async fn holder(leases: &Api<Lease>) -> anyhow::Result<Option<String>> {
    let lease = leases.get_opt("kvroute-operator").await?;
    Ok(lease
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_replica_stays_standby_until_the_leader_dies() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let client = cluster.client().await?;
    install_crds(&client).await?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let lease_flags = [
        "--lease-duration-seconds".to_string(),
        LEASE_SECONDS.to_string(),
    ];

    let mut first = OperatorProcess::start(&cluster, "operator-a", "op-a", &lease_flags).await?;
    wait_for("op-a to hold the lease", WAIT, || async {
        Ok(holder(&leases).await?.filter(|h| h == "op-a"))
    })
    .await?;
    wait_for("op-a to report leading", WAIT, || async {
        Ok((first.metric("kvroute_operator_leader").await? == Some(1.0)).then_some(()))
    })
    .await?;

    let second = OperatorProcess::start(&cluster, "operator-b", "op-b", &lease_flags).await?;
    // Standby: op-b sees op-a as the holder and reports not leading.
    wait_for("op-b to see op-a holding the lease", WAIT, || async {
        let text = second.metrics().await?;
        Ok(text
            .contains("kvroute_operator_lease_holder{holder=\"op-a\"} 1")
            .then_some(()))
    })
    .await?;
    assert_eq!(second.metric("kvroute_operator_leader").await?, Some(0.0));

    // Work while op-a leads: op-a reconciles, op-b does not touch it.
    let sets: Api<InferenceWorkerSet> = Api::namespaced(client.clone(), "default");
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), "default");
    sets.create(&PostParams::default(), &workerset("while-a"))
        .await?;
    wait_for("Deployment while-a", WAIT, || async {
        Ok(deploys.get_opt("while-a").await?)
    })
    .await?;
    let b_metrics = second.metrics().await?;
    assert!(
        !b_metrics.lines().any(|l| l.starts_with("kvroute_operator_reconciliations_total{") && !l.ends_with(" 0")),
        "standby op-b reconciled:\n{b_metrics}"
    );
    assert!(
        !second.log().contains("leading: starting controllers"),
        "op-b started controllers:\n{}",
        second.log()
    );
    assert_eq!(holder(&leases).await?.as_deref(), Some("op-a"));
    first.check_up().await?;

    // Kill op-a without a chance to release: op-b takes over after the lease expires.
    first.child.kill_group();
    drop(first);
    wait_for("op-b to take the lease", WAIT, || async {
        Ok(holder(&leases).await?.filter(|h| h == "op-b"))
    })
    .await?;
    wait_for("op-b to report leading", WAIT, || async {
        Ok((second.metric("kvroute_operator_leader").await? == Some(1.0)).then_some(()))
    })
    .await?;
    let lease = leases.get("kvroute-operator").await?;
    assert!(lease.spec.and_then(|s| s.lease_transitions).unwrap_or(0) >= 1);
    sets.create(&PostParams::default(), &workerset("after-a"))
        .await?;
    wait_for("Deployment after-a (reconciled by op-b)", WAIT, || async {
        Ok(deploys.get_opt("after-a").await?)
    })
    .await?;
    Ok(())
}
