//! The operator end to end: one real API server (+ controller-manager) and one `kvroute
//! operator` process per test binary, one namespace and fake kubelet per test.
//!
//! Needs the binaries of `bash e2e/k8s/setup.sh` and `target/<profile>/kvroute`
//! (`cargo build -p kvroute-cli`); fails naming what is missing.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kvroute_crds::condition::Condition;
use kvroute_crds::pool::InferencePool;
use kvroute_crds::workerset::InferenceWorkerSet;
use kvroute_e2e::harness::{Cluster, TestNamespace, shared_operator};
use kvroute_e2e::procs::wait_for;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);
/// New CRDs are rediscovered by the garbage collector every ~30 s.
const GC_WAIT: Duration = Duration::from_secs(120);

/// The shared cluster, with the shared operator running.
async fn cluster() -> anyhow::Result<&'static Cluster> {
    Ok(shared_operator().await?.0)
}

fn workerset(name: &str, spec: serde_json::Value) -> InferenceWorkerSet {
    serde_json::from_value(json!({
        "apiVersion": "kvroute.dev/v1alpha1", "kind": "InferenceWorkerSet",
        "metadata": {"name": name}, "spec": spec,
    }))
    .expect("workerset")
}

fn mock_spec(replicas: i32) -> serde_json::Value {
    json!({
        "model": {"name": "Qwen/Qwen3-0.6B", "servedName": "qwen3"},
        "replicas": replicas,
        "engine": {"mode": "mock", "speedup": 100.0},
    })
}

fn container<'a>(d: &'a Deployment, name: &str) -> &'a Container {
    let spec = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("pod spec");
    spec.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn args(c: &Container) -> Vec<String> {
    c.command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .cloned()
        .collect()
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn cond<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

async fn ready_workerset(
    env: &TestNamespace,
    name: &str,
    replicas: i32,
) -> anyhow::Result<InferenceWorkerSet> {
    let api: Api<InferenceWorkerSet> = Api::namespaced(env.client.clone(), &env.ns);
    let result = wait_for(
        &format!("WorkerSet {name} Ready with {replicas} ready workers"),
        WAIT,
        || async {
            let ws = api.get(name).await?;
            let Some(st) = &ws.status else {
                return Ok(None);
            };
            let ready = cond(&st.conditions, "Ready").is_some_and(|c| c.status == "True");
            let workers_ready =
                st.workers.len() == replicas as usize && st.workers.iter().all(|w| w.ready);
            let current = st.observed_generation == ws.metadata.generation;
            Ok((ready && st.ready_replicas == replicas && workers_ready && current).then_some(ws))
        },
    )
    .await;
    match result {
        Ok(ws) => Ok(ws),
        Err(e) => Err(e.context(env.describe().await)),
    }
}

async fn live_pods(api: &Api<Pod>, ws: &str) -> anyhow::Result<Vec<Pod>> {
    let pods = api
        .list(&ListParams::default().labels(&format!("kvroute.dev/workerset={ws}")))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mock_workerset_runs_with_sidecars_and_becomes_ready() -> anyhow::Result<()> {
    let cluster = cluster().await?;
    let env = TestNamespace::new(cluster, "mock").await?;
    let api: Api<InferenceWorkerSet> = Api::namespaced(env.client.clone(), &env.ns);
    api.create(&PostParams::default(), &workerset("mock", mock_spec(2)))
        .await?;

    let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
    let d = wait_for("Deployment mock", WAIT, || async {
        Ok(deploys.get_opt("mock").await?)
    })
    .await?;
    let owner = d.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        owner.iter().any(|o| o.kind == "InferenceWorkerSet"
            && o.name == "mock"
            && o.controller == Some(true))
    );
    let engine = container(&d, "engine");
    let engine_args = args(engine);
    assert!(
        engine_args.iter().any(|a| a.contains("mock-vllm")),
        "mock engine: {engine_args:?}"
    );
    assert_eq!(
        flag(&engine_args, "--served-model-name").as_deref(),
        Some("qwen3")
    );
    let gpu = engine
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("nvidia.com/gpu"));
    assert!(gpu.is_none(), "mock workers request no GPU");
    let pod_spec = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod spec");
    assert!(
        !pod_spec
            .node_selector
            .unwrap_or_default()
            .contains_key("nvidia.com/gpu.product"),
        "mock workers select no GPU product"
    );
    let sidecar = container(&d, "sidecar");
    let env_names: Vec<&str> = sidecar
        .env
        .iter()
        .flatten()
        .map(|e| e.name.as_str())
        .collect();
    assert!(
        env_names.contains(&"KVROUTE_SIDECAR_POD_NAME"),
        "{env_names:?}"
    );

    let services: Api<Service> = Api::namespaced(env.client.clone(), &env.ns);
    let svc = wait_for("Service mock", WAIT, || async {
        Ok(services.get_opt("mock").await?)
    })
    .await?;
    assert_eq!(
        svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()),
        Some("None"),
        "headless"
    );

    let ws = ready_workerset(&env, "mock", 2).await?;
    let st = ws.status.expect("status");
    assert_eq!(st.replicas, 2);
    let running = env.kubelet.running();
    for w in &st.workers {
        let pod = running
            .iter()
            .find(|p| p.name == w.pod)
            .unwrap_or_else(|| panic!("{} not run: {running:?}", w.pod));
        assert_eq!(
            w.address.as_deref(),
            Some(format!("{}:8000", pod.ip).as_str())
        );
        assert_eq!(w.sidecar_connected, Some(true));
        // The worker really serves: the mock's OpenAI API on the pod's own address.
        let models: serde_json::Value = reqwest::get(format!(
            "http://{}/v1/models",
            w.address.as_deref().unwrap_or_default()
        ))
        .await?
        .json()
        .await?;
        assert!(models.to_string().contains("qwen3"), "{models}");
    }
    env.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_workerset_requests_gpus_on_the_product_with_vllm_kv_flags() -> anyhow::Result<()> {
    let cluster = cluster().await?;
    let env = TestNamespace::new(cluster, "gpu").await?;
    let api: Api<InferenceWorkerSet> = Api::namespaced(env.client.clone(), &env.ns);
    let spec = json!({
        "model": {"name": "Qwen/Qwen3-32B-FP8"},
        "replicas": 1,
        "blockSize": 32,
        "gpu": {"count": 2, "product": "NVIDIA-H100-80GB-HBM3"},
    });
    api.create(&PostParams::default(), &workerset("h100", spec))
        .await?;
    api.create(
        &PostParams::default(),
        &workerset("default-gpu", json!({"model": {"name": "Qwen/Qwen3-8B"}})),
    )
    .await?;

    let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
    let d = wait_for("Deployment h100", WAIT, || async {
        Ok(deploys.get_opt("h100").await?)
    })
    .await?;
    let engine = container(&d, "engine");
    let limits = engine
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    assert_eq!(
        limits.get("nvidia.com/gpu").map(|q| q.0.as_str()),
        Some("2")
    );
    let pod_spec = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod spec");
    let selector = pod_spec.node_selector.clone().unwrap_or_default();
    assert_eq!(
        selector.get("nvidia.com/gpu.product").map(String::as_str),
        Some("NVIDIA-H100-80GB-HBM3")
    );
    let tolerations = pod_spec.tolerations.clone().unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some("nvidia.com/gpu")),
        "{tolerations:?}"
    );
    let a = args(engine);
    assert!(a.iter().any(|x| x == "--enable-prefix-caching"), "{a:?}");
    assert_eq!(flag(&a, "--block-size").as_deref(), Some("32"));
    assert_eq!(flag(&a, "--tensor-parallel-size").as_deref(), Some("2"));
    let kv: serde_json::Value =
        serde_json::from_str(&flag(&a, "--kv-events-config").expect("--kv-events-config"))?;
    assert_eq!(kv["enable_kv_cache_events"], true);
    assert_eq!(kv["publisher"], "zmq");
    // Loopback only: vLLM's PUB connects to the sidecar's SUB, the replay socket binds
    // 127.0.0.1; no other pod can read the prompts' token ids.
    assert_eq!(kv["endpoint"], "tcp://127.0.0.1:5557");
    assert_eq!(kv["topic"], "");
    assert!(
        kv["replay_endpoint"]
            .as_str()
            .is_some_and(|e| e.starts_with("tcp://127.0.0.1:")),
        "{kv}"
    );
    assert!(pod_spec.containers.iter().any(|c| c.name == "sidecar"));

    let d = wait_for("Deployment default-gpu", WAIT, || async {
        Ok(deploys.get_opt("default-gpu").await?)
    })
    .await?;
    let selector = d
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.node_selector)
        .unwrap_or_default();
    assert_eq!(
        selector.get("nvidia.com/gpu.product").map(String::as_str),
        Some("NVIDIA-L40S")
    );

    // No GPU node here: the pod stays Pending and the WorkerSet says why, without crashing.
    let result = wait_for("h100 reports its unschedulable worker", WAIT, || async {
        let ws = api.get("h100").await?;
        let conds = ws.status.map(|s| s.conditions).unwrap_or_default();
        let not_ready = cond(&conds, "Ready").is_some_and(|c| c.status == "False");
        let why = conds
            .into_iter()
            .find(|c| c.message.contains("cannot be scheduled"));
        Ok(why.filter(|_| not_ready))
    })
    .await;
    let ws = match result {
        Ok(c) => c,
        Err(e) => return Err(e.context(env.describe().await)),
    };
    assert!(ws.message.contains("fake kubelet"), "{}", ws.message);
    env.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_and_spec_changes_roll_the_pods() -> anyhow::Result<()> {
    let cluster = cluster().await?;
    let env = TestNamespace::new(cluster, "roll").await?;
    let api: Api<InferenceWorkerSet> = Api::namespaced(env.client.clone(), &env.ns);
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    api.create(&PostParams::default(), &workerset("roll", mock_spec(1)))
        .await?;
    ready_workerset(&env, "roll", 1).await?;

    // `kubectl scale iws/roll --replicas=3` patches the scale subresource.
    api.patch_scale(
        "roll",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 3}})),
    )
    .await?;
    let scale = api.get_scale("roll").await?;
    assert_eq!(scale.spec.and_then(|s| s.replicas), Some(3));
    let ws = ready_workerset(&env, "roll", 3).await?;
    assert_eq!(
        ws.status.and_then(|s| s.selector).as_deref(),
        Some("kvroute.dev/workerset=roll")
    );
    assert_eq!(
        api.get_scale("roll").await?.status.map(|s| s.replicas),
        Some(3)
    );
    let before: Vec<String> = live_pods(&pods, "roll")
        .await?
        .iter()
        .filter_map(pod_hash)
        .collect();
    assert_eq!(before.len(), 3);

    // A spec change rolls every pod onto a new template.
    api.patch(
        "roll",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"blockSize": 32}})),
    )
    .await?;
    let old = before[0].clone();
    wait_for("3 ready pods on the new template", WAIT, || async {
        let live = live_pods(&pods, "roll").await?;
        let ws = api.get("roll").await?;
        let all_new = live.len() == 3 && live.iter().all(|p| pod_hash(p).is_some_and(|h| h != old));
        let ready = ws.status.as_ref().is_some_and(|s| {
            s.ready_replicas == 3
                && s.observed_generation == ws.metadata.generation
                && s.workers.len() == 3
        });
        Ok((all_new && ready).then_some(()))
    })
    .await?;
    for p in live_pods(&pods, "roll").await? {
        let engine = p
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().find(|c| c.name == "engine").cloned());
        let a = engine.map(|c| args(&c)).unwrap_or_default();
        assert_eq!(flag(&a, "--block-size").as_deref(), Some("32"));
    }
    // The old pods' processes are gone too.
    wait_for("only the new pods running", WAIT, || async {
        Ok((env.kubelet.running().len() == 3).then_some(()))
    })
    .await?;

    // Scale to zero: no pods, no processes.
    api.patch_scale(
        "roll",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 0}})),
    )
    .await?;
    wait_for("no pods", WAIT, || async {
        Ok(
            (live_pods(&pods, "roll").await?.is_empty() && env.kubelet.running().is_empty())
                .then_some(()),
        )
    })
    .await?;
    env.stop().await;
    Ok(())
}

/// The ReplicaSet's `pod-template-hash` label: changes when the template changes.
fn pod_hash(p: &Pod) -> Option<String> {
    p.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("pod-template-hash"))
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_workerset_removes_its_children() -> anyhow::Result<()> {
    let cluster = cluster().await?;
    let env = TestNamespace::new(cluster, "delete").await?;
    let api: Api<InferenceWorkerSet> = Api::namespaced(env.client.clone(), &env.ns);
    let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
    let services: Api<Service> = Api::namespaced(env.client.clone(), &env.ns);
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.ns);
    api.create(&PostParams::default(), &workerset("gone", mock_spec(1)))
        .await?;
    ready_workerset(&env, "gone", 1).await?;
    assert!(services.get_opt("gone").await?.is_some());

    api.delete("gone", &DeleteParams::background()).await?;
    wait_for(
        "Deployment, Service and pods of gone collected",
        GC_WAIT,
        || async {
            let d = deploys.get_opt("gone").await?;
            let s = services.get_opt("gone").await?;
            let p = pods
                .list(&ListParams::default().labels("kvroute.dev/workerset=gone"))
                .await?;
            Ok((d.is_none() && s.is_none() && p.items.is_empty()).then_some(()))
        },
    )
    .await?;
    wait_for("no worker processes", WAIT, || async {
        Ok(env.kubelet.running().is_empty().then_some(()))
    })
    .await?;
    env.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_specs_become_conditions_and_the_operator_stays_up() -> anyhow::Result<()> {
    let cluster = cluster().await?;
    let env = TestNamespace::new(cluster, "bad").await?;
    let api: Api<InferenceWorkerSet> = Api::namespaced(env.client.clone(), &env.ns);

    // An empty model name is refused by the schema (minLength) with the field in the message.
    let err = api
        .create(
            &PostParams::default(),
            &workerset("empty", json!({"model": {"name": ""}})),
        )
        .await
        .expect_err("empty model name is invalid");
    assert!(err.to_string().contains("spec.model.name"), "{err}");

    let gpu = json!({"model": {"name": "m"}, "gpu": {"product": "NVIDIA-RTX-9999"}});
    api.create(&PostParams::default(), &workerset("bad-gpu", gpu))
        .await?;
    api.create(
        &PostParams::default(),
        &workerset("blank-model", json!({"model": {"name": "   "}})),
    )
    .await?;
    let pools: Api<InferencePool> = Api::namespaced(env.client.clone(), &env.ns);
    let pool: InferencePool = serde_json::from_value(json!({
        "apiVersion": "kvroute.dev/v1alpha1", "kind": "InferencePool",
        "metadata": {"name": "dangling"},
        "spec": {"targets": [{"workerSet": "does-not-exist"}]},
    }))?;
    pools.create(&PostParams::default(), &pool).await?;

    let degraded = |name: &'static str, needle: &'static str| {
        let api = api.clone();
        async move {
            wait_for(
                &format!("{name}: a condition mentioning {needle:?}"),
                WAIT,
                || async {
                    let ws = api.get(name).await?;
                    let conds = ws.status.map(|s| s.conditions).unwrap_or_default();
                    Ok(conds
                        .into_iter()
                        .find(|c| c.status != "Unknown" && c.message.contains(needle)))
                },
            )
            .await
        }
    };
    let c = degraded("bad-gpu", "NVIDIA-RTX-9999").await?;
    assert!(
        c.message.contains("NVIDIA-L40S"),
        "the message lists known products: {}",
        c.message
    );
    degraded("blank-model", "model name").await?;
    let deploys: Api<Deployment> = Api::namespaced(env.client.clone(), &env.ns);
    assert!(
        deploys.get_opt("bad-gpu").await?.is_none(),
        "no pods for an invalid spec"
    );

    let c = wait_for("pool reports the missing WorkerSet", WAIT, || async {
        let p = pools.get("dangling").await?;
        let conds = p.status.map(|s| s.conditions).unwrap_or_default();
        Ok(conds
            .into_iter()
            .find(|c| c.type_ == "ResolvedRefs" && c.status == "False"))
    })
    .await?;
    assert!(c.message.contains("does-not-exist"), "{}", c.message);

    // Still up and still reconciling: a good WorkerSet after the bad ones becomes ready.
    shared_operator().await?.1.lock().await.check_up().await?;
    api.create(&PostParams::default(), &workerset("good", mock_spec(1)))
        .await?;
    ready_workerset(&env, "good", 1).await?;
    env.stop().await;
    Ok(())
}
