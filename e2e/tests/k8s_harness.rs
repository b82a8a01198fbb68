//! The e2e harness itself against a real API server: the cluster comes up with the CRDs, and
//! the fake kubelet runs, reports, restarts and finalizes pods of a plain Deployment (programs
//! from the `kvroute-e2e/exec` test image, so this needs nothing from the operator or workers).
//!
//! Needs the binaries of `bash e2e/k8s/setup.sh`; fails naming that command when they are absent.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kvroute_e2e::harness::{Cluster, TestNamespace, check_binaries_in, podspec::EXEC_IMAGE};
use kvroute_e2e::procs::wait_for;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

fn deployment(
    name: &str,
    replicas: i32,
    command: &[&str],
    probe: Option<serde_json::Value>,
) -> Deployment {
    let mut container = json!({"name": "main", "image": EXEC_IMAGE, "command": command});
    if let Some(p) = probe {
        container["readinessProbe"] = p;
        container["ports"] = json!([{"name": "http", "containerPort": 18080}]);
    }
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [container]}},
        },
    }))
    .expect("deployment")
}

async fn pods(api: &Api<Pod>, app: &str) -> anyhow::Result<Vec<Pod>> {
    Ok(api
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?
        .items)
}

/// The process exists and is not a zombie.
fn pid_alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // "pid (comm) S ...": the state follows the last ')'.
    stat.rsplit_once(')')
        .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X']))
}

#[test]
fn missing_binaries_name_the_setup_command() {
    let dir = std::env::temp_dir().join("kvroute-e2e-no-k8s-binaries");
    let err = check_binaries_in(&dir).expect_err("no binaries there");
    let msg = format!("{err:#}");
    assert!(msg.contains("bash e2e/k8s/setup.sh"), "{msg}");
    assert!(msg.contains("kube-apiserver"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_has_the_kvroute_crds() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let names: Vec<String> = crds
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    for kind in [
        "inferenceworkersets",
        "inferencepools",
        "inferencepolicies",
        "inferenceproviders",
        "gatewaybackends",
    ] {
        let want = format!("{kind}.kvroute.dev");
        assert!(
            names.contains(&want),
            "{want} not installed; have {names:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_kubelet_runs_scales_and_finalizes_deployment_pods() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let env = TestNamespace::new(cluster, "kubelet").await?;
    let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
    let pod_api: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    deploys
        .create(
            &PostParams::default(),
            &deployment("sleeper", 2, &["sleep", "600"], None),
        )
        .await?;

    wait_for("2 available sleeper replicas", WAIT, || async {
        let d = deploys.get("sleeper").await?;
        Ok((d.status.and_then(|s| s.available_replicas) == Some(2)).then_some(()))
    })
    .await?;
    let running = env.kubelet.running();
    assert_eq!(running.len(), 2, "{running:?}");
    assert!(running.iter().all(|p| p.ready));
    assert_ne!(running[0].ip, running[1].ip, "each pod has its own address");
    for pod in pods(&pod_api, "sleeper").await? {
        let status = pod.status.clone().expect("status");
        let ip = status.pod_ip.clone().expect("podIP");
        assert!(ip.starts_with("127."), "{ip}");
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(
            pod.spec.and_then(|s| s.node_name),
            Some(format!("fake-node-{}", env.ns))
        );
    }

    // Scale down: the ReplicaSet deletes a pod gracefully; the fake kubelet stops it and
    // confirms the deletion, as a kubelet does.
    deploys
        .patch_scale(
            "sleeper",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await?;
    wait_for("one sleeper pod left", WAIT, || async {
        let n = pods(&pod_api, "sleeper").await?.len();
        Ok((n == 1 && env.kubelet.running().len() == 1).then_some(()))
    })
    .await?;
    env.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_kubelet_reports_probes_crashes_and_unsupported_pods() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let env = TestNamespace::new(cluster, "probes").await?;
    let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
    let pod_api: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);

    // A readiness probe on a port nothing listens on: running, never ready.
    let probe = json!({"tcpSocket": {"port": "http"}});
    deploys
        .create(
            &PostParams::default(),
            &deployment("unready", 1, &["sleep", "600"], Some(probe)),
        )
        .await?;
    // A container that exits: restarted with backoff, reported in CrashLoopBackOff.
    deploys
        .create(
            &PostParams::default(),
            &deployment("crasher", 1, &["sh", "-c", "echo boom; exit 3"], None),
        )
        .await?;
    // A real vLLM pod: cannot run here, stays Pending with the reason.
    let vllm: Pod = serde_json::from_value(json!({
        "metadata": {"name": "vllm", "labels": {"app": "vllm"}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}]},
    }))?;
    pod_api.create(&PostParams::default(), &vllm).await?;

    let crash = wait_for(
        "crasher restarted and reported CrashLoopBackOff",
        WAIT,
        || async {
            let Some(pod) = pods(&pod_api, "crasher").await?.into_iter().next() else {
                return Ok(None);
            };
            let cs = pod
                .status
                .and_then(|s| s.container_statuses)
                .unwrap_or_default();
            Ok(cs.into_iter().find(|c| {
                c.restart_count >= 1
                    && !c.ready
                    && c.state
                        .as_ref()
                        .and_then(|s| s.waiting.as_ref())
                        .and_then(|w| w.reason.as_deref())
                        == Some("CrashLoopBackOff")
            }))
        },
    )
    .await?;
    let message = crash
        .state
        .and_then(|s| s.waiting)
        .and_then(|w| w.message)
        .unwrap_or_default();
    assert!(
        message.contains("boom"),
        "the log tail is in the message: {message}"
    );
    assert_eq!(
        crash
            .last_state
            .and_then(|s| s.terminated)
            .map(|t| t.exit_code),
        Some(3)
    );

    let pending = wait_for("vllm pod reported unschedulable", WAIT, || async {
        let pod = pod_api.get("vllm").await?;
        let cond = pod
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "PodScheduled");
        Ok(cond.filter(|c| c.status == "False"))
    })
    .await?;
    assert_eq!(pending.reason.as_deref(), Some("Unschedulable"));
    assert!(
        pending
            .message
            .unwrap_or_default()
            .contains("vllm/vllm-openai")
    );

    let unready = pods(&pod_api, "unready").await?;
    let status = unready
        .first()
        .and_then(|p| p.status.clone())
        .expect("unready pod status");
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let ready = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready");
    assert_eq!(ready.map(|c| c.status).as_deref(), Some("False"));

    // Dropping the kubelet (as a panicking test does) kills its processes at once.
    let unready_name = unready[0].metadata.name.clone().expect("name");
    let log_dir = cluster
        .dir()
        .join("pods")
        .join(format!("{}_{unready_name}", env.ns));
    assert!(
        log_dir.join("main.log").exists(),
        "container log in {}",
        log_dir.display()
    );
    let running_before = env.kubelet.running();
    assert!(
        running_before.iter().any(|p| p.name == unready_name),
        "{running_before:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_kubelet_kills_its_processes() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let env = TestNamespace::new(cluster, "drop").await?;
    let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
    // The container writes its pid where the test can read it.
    let marker = cluster.dir().join(format!("{}-pid", env.ns));
    // `$$` is the escape of `$` in Kubernetes args, as in a real pod.
    let script = format!("echo $$$$ > {}; exec sleep 600", marker.display());
    deploys
        .create(
            &PostParams::default(),
            &deployment("pidfile", 1, &["sh", "-c", &script], None),
        )
        .await?;
    let pid: u32 = wait_for("the container's pid file", WAIT, || async {
        Ok(std::fs::read_to_string(&marker)
            .ok()
            .and_then(|s| s.trim().parse().ok()))
    })
    .await?;
    assert!(pid_alive(pid));
    drop(env);
    wait_for(
        "the container process to be gone",
        Duration::from_secs(10),
        || async { Ok((!pid_alive(pid)).then_some(())) },
    )
    .await?;
    Ok(())
}
