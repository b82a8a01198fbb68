//! Least privilege, proven against a real API server: the operator and the router run as
//! their service accounts with exactly the RBAC that `kvroute crdgen` generates
//! (deploy/rbac.yaml, the router's ClusterRole the operator writes), the API server keeps an
//! audit log, and the log is compared with the rules.
//!
//! ```text
//! cluster (K8S_AUDIT=1: Metadata-level audit of every service account's request)
//!   admin applies deploy/operator.yaml (its Deployment included) + deploy/rbac.yaml
//!   fake kubelet runs the shipped operator Deployment's 2 pods with the token of
//!   kvroute-system/kvroute-operator; one leads
//!   fake kubelet runs the router pods with the token of kvroute-system/kvroute-router, and
//!   the worker pods with none (automountServiceAccountToken: false)
//!   workload: one kind of each, a Secret the GatewayBackend names, an invalid WorkerSet;
//!   each router replica answers; the leader's pod is deleted, another takes the Lease
//!   then (Deployment scaled to 0) the operator as a process, watching one namespace (the
//!   router's Role instead of the ClusterRole)
//! audit.log --> every request of either account: allowed by its rules (no 403)
//!           --> every grant: used, or listed with its reason in permissions::NOT_EXERCISED
//! ```
//!
//! Needs the binaries of `bash e2e/k8s/setup.sh` and `target/<profile>/kvroute`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kvroute_crds::workerset::InferenceWorkerSet;
use kvroute_e2e::harness::{
    Cluster, ClusterOptions, FakeKubelet, IMAGE_TOKENIZERS, OperatorProcess, RunningPod,
    install::{CreateOptions, create_file},
    install_crds, router_pod_options,
};
use kvroute_e2e::procs::wait_for;
use kvroute_operator::bundle::{DEPLOY_NAMESPACE, OPERATOR_NAME};
use kvroute_operator::desired::router::{ADMIN_PORT, HF_HOME, HTTP_PORT};
use kvroute_operator::permissions::{
    LEASE_NAME, NOT_EXERCISED, OPERATOR_NAMESPACE_RULES, OPERATOR_RULES, ROUTER_NAME, ROUTER_RULES,
    Rule, allows, grants,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);
const TEAM: &str = "team-audit";
const SERVED: &str = "qwen3-mock";
/// The Secret the GatewayBackend names; the operator mounts it into the router pods.
const BACKEND_SECRET: &str = "openai-credentials";

fn user(sa: &str) -> String {
    format!("system:serviceaccount:{DEPLOY_NAMESPACE}:{sa}")
}

/// One audited request, reduced to what RBAC decides on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Request {
    verb: String,
    group: String,
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
    code: i64,
}

/// The resource requests of `username` in the audit log (non-resource requests such as
/// `/version` are left out: every authenticated user may make them).
fn requests_of(log: &str, username: &str) -> Vec<Request> {
    let mut out = BTreeSet::new();
    for line in log.lines() {
        let Ok(ev) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if ev["user"]["username"] != username {
            continue;
        }
        let obj = &ev["objectRef"];
        let Some(resource) = obj["resource"].as_str() else {
            continue;
        };
        let resource = match obj["subresource"].as_str() {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource.to_string(),
        };
        out.insert(Request {
            verb: ev["verb"].as_str().unwrap_or_default().to_string(),
            group: obj["apiGroup"].as_str().unwrap_or_default().to_string(),
            resource,
            namespace: obj["namespace"].as_str().map(str::to_string),
            name: obj["name"].as_str().map(str::to_string),
            code: ev["responseStatus"]["code"].as_i64().unwrap_or(0),
        });
    }
    out.into_iter().collect()
}

/// What one service account did against what it was granted: the problems found, and the
/// (group, resource, verb) it used.
fn compare(
    who: &str,
    requests: &[Request],
    cluster_rules: &[Rule],
    namespace_rules: &[Rule],
) -> (Vec<String>, BTreeSet<(String, String, String)>) {
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for r in requests {
        // A server-side apply that made the object (201) was also authorized as `create`.
        let created = r.verb == "patch" && r.code == 201 && !r.resource.contains('/');
        let verbs = std::iter::once(r.verb.as_str()).chain(created.then_some("create"));
        for verb in verbs {
            let name = r.name.as_deref();
            let allowed = allows(cluster_rules, &r.group, &r.resource, verb, name)
                || (r.namespace.as_deref() == Some(DEPLOY_NAMESPACE)
                    && allows(namespace_rules, &r.group, &r.resource, verb, name));
            if !allowed {
                problems.push(format!("{who}: {verb} not granted: {r:?}"));
            }
            used.insert((r.group.clone(), r.resource.clone(), verb.to_string()));
        }
        // The documented install applies deploy/operator.yaml before deploy/rbac.yaml (the
        // Role lives in the namespace operator.yaml makes), so an operator pod may start and
        // be refused before its grants exist. A refusal is a problem unless the same request
        // also succeeded: a missing grant never does.
        let same = |o: &Request| {
            (&o.verb, &o.group, &o.resource, &o.namespace, &o.name)
                == (&r.verb, &r.group, &r.resource, &r.namespace, &r.name)
        };
        if r.code == 403 && !requests.iter().any(|o| o.code != 403 && same(o)) {
            problems.push(format!("{who}: refused (403): {r:?}"));
        }
    }
    let all: Vec<Rule> = [cluster_rules, namespace_rules].concat();
    for (g, res, v) in grants(&all) {
        let key = (g.to_string(), res.to_string(), v.to_string());
        let excused = NOT_EXERCISED
            .iter()
            .any(|(c, eg, er, ev, _)| *c == who && (*eg, *er, *ev) == (g, res, v));
        if !used.contains(&key) && !excused {
            problems.push(format!(
                "{who}: granted but never used, and not in NOT_EXERCISED: {v} {g}/{res}"
            ));
        }
    }
    (problems, used)
}

/// Applies deploy/operator.yaml (Namespace, ServiceAccount, the operator's Deployment,
/// NetworkPolicy) and deploy/rbac.yaml, as a cluster admin installing kvroute would. Returns
/// the operator's Deployment as shipped.
async fn install_operator(admin: &kube::Client) -> anyhow::Result<Deployment> {
    let shipped = create_file(admin, "deploy/operator.yaml", CreateOptions::default()).await?;
    assert_eq!(
        shipped.kinds,
        ["Namespace", "ServiceAccount", "Deployment", "NetworkPolicy"]
    );
    let rbac = create_file(admin, "deploy/rbac.yaml", CreateOptions::default()).await?;
    let mut kinds = [shipped.kinds, rbac.kinds].concat();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "Namespace",
            "NetworkPolicy",
            "Role",
            "RoleBinding",
            "ServiceAccount"
        ]
    );
    shipped
        .deployment
        .context("no Deployment in deploy/operator.yaml")
}

/// The value of env var `name` of the shipped operator's first container.
fn shipped_env(d: &Deployment, name: &str) -> Option<String> {
    d.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .containers
        .first()?
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)?
        .value
        .clone()
}

/// The last lines of every operator pod's log, deleted pods included
/// ([`Cluster::pod_log_lines`] of each `<namespace>_<pod>` directory), for failure messages.
fn operator_pod_logs(cluster: &Cluster) -> String {
    let prefix = format!("{DEPLOY_NAMESPACE}_{OPERATOR_NAME}-");
    let mut pods: Vec<String> = std::fs::read_dir(cluster.dir().join("pods"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| {
                    e.file_name()
                        .to_str()?
                        .strip_prefix(&prefix)
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default();
    pods.sort();
    pods.iter()
        .map(|p| {
            let pod = format!("{OPERATOR_NAME}-{p}");
            format!(
                "--- {pod} ---\n{}",
                cluster.pod_log_lines(DEPLOY_NAMESPACE, &pod, &[], 30)
            )
        })
        .collect()
}

/// The operator's pods the fake kubelet runs.
fn operator_pods(kubelet: &FakeKubelet) -> Vec<RunningPod> {
    kubelet
        .running()
        .into_iter()
        .filter(|p| p.namespace == DEPLOY_NAMESPACE && p.name.starts_with(OPERATOR_NAME))
        .collect()
}

/// One resource of every kvroute kind in `TEAM` (and the Secret the backend names), so that
/// every controller reads and writes what it can; plus a WorkerSet that fails validation.
async fn workload(admin: &kube::Client) -> anyhow::Result<()> {
    let ns: Namespace = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TEAM}}),
    )?;
    Api::<Namespace>::all(admin.clone())
        .patch(
            TEAM,
            &PatchParams::apply("kvroute-e2e").force(),
            &Patch::Apply(&ns),
        )
        .await?;
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": BACKEND_SECRET},
        "stringData": {"apiKey": "sk-test"},
    }))?;
    // In the router's namespace: the router mounts it from there, and the operator looks it
    // up there (its Secret get is a Role in its own namespace).
    Api::<Secret>::namespaced(admin.clone(), DEPLOY_NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await?;
    let docs = [
        json!({"apiVersion": "kvroute.dev/v1alpha1", "kind": "InferenceWorkerSet",
               "metadata": {"name": "qwen"},
               "spec": {"model": {"name": "Qwen/Qwen3-0.6B", "servedName": SERVED},
                        "replicas": 1,
                        "engine": {"mode": "mock", "speedup": 50.0,
                                   "args": ["--tokenizer", format!("{IMAGE_TOKENIZERS}/qwen3")]}}}),
        // Fails the operator's validation (a blank model name): its Deployment is read back,
        // never written.
        json!({"apiVersion": "kvroute.dev/v1alpha1", "kind": "InferenceWorkerSet",
               "metadata": {"name": "invalid"},
               "spec": {"model": {"name": "  "}, "engine": {"mode": "mock"}}}),
        json!({"apiVersion": "kvroute.dev/v1alpha1", "kind": "InferencePool",
               "metadata": {"name": "chat"},
               "spec": {"targets": [{"workerSet": "qwen"}, {"provider": "openai", "role": "overflow"}]}}),
        json!({"apiVersion": "kvroute.dev/v1alpha1", "kind": "InferencePolicy",
               "metadata": {"name": "default"},
               "spec": {"pool": "chat", "rules": [{"name": "local", "actions": {"route": {"localOnly": true}}}]}}),
        json!({"apiVersion": "kvroute.dev/v1alpha1", "kind": "InferenceProvider",
               "metadata": {"name": "openai"},
               "spec": {"kind": "openai", "models": [SERVED], "gatewayBackendRef": {"name": "openai"}}}),
        json!({"apiVersion": "kvroute.dev/v1alpha1", "kind": "GatewayBackend",
               "metadata": {"name": "openai"},
               "spec": {"url": "https://api.openai.com",
                        "auth": {"secretRef": {"name": BACKEND_SECRET, "key": "apiKey"}, "type": "bearer"}}}),
    ];
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        let obj: kube::api::DynamicObject = serde_json::from_value(doc)?;
        let plural = format!("{}s", kind.to_lowercase()).replace("policys", "policies");
        let ar = kube::api::ApiResource {
            group: "kvroute.dev".into(),
            version: "v1alpha1".into(),
            api_version: "kvroute.dev/v1alpha1".into(),
            kind: kind.clone(),
            plural,
        };
        Api::<kube::api::DynamicObject>::namespaced_with(admin.clone(), TEAM, &ar)
            .create(&PostParams::default(), &obj)
            .await
            .with_context(|| format!("create {kind}"))?;
    }
    Ok(())
}

/// Waits until every kvroute resource in `TEAM` has a status with conditions (each status
/// subresource was written).
async fn statuses_written(admin: &kube::Client) -> anyhow::Result<()> {
    for plural in [
        "inferenceworkersets",
        "inferencepools",
        "inferencepolicies",
        "inferenceproviders",
        "gatewaybackends",
    ] {
        let ar = kube::api::ApiResource {
            group: "kvroute.dev".into(),
            version: "v1alpha1".into(),
            api_version: "kvroute.dev/v1alpha1".into(),
            kind: String::new(),
            plural: plural.into(),
        };
        let api = Api::<kube::api::DynamicObject>::namespaced_with(admin.clone(), TEAM, &ar);
        wait_for(&format!("every {plural} has a status"), WAIT, || async {
            let list = api.list(&Default::default()).await?;
            Ok(list
                .items
                .iter()
                .all(|o| {
                    o.data["status"]["conditions"]
                        .as_array()
                        .is_some_and(|c| !c.is_empty())
                })
                .then_some(()))
        })
        .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_and_router_use_exactly_the_generated_rbac() -> anyhow::Result<()> {
    let cluster = Cluster::start_with(ClusterOptions { audit: true }).await?;
    let admin = cluster.client().await?;
    install_crds(&admin).await?;

    let (_hub, mut opts) = router_pod_options(&cluster, DEPLOY_NAMESPACE, HF_HOME).await?;
    opts.namespace = None;
    opts.service_accounts = Some(cluster.service_account_auth());
    // Sidecars resolve the headless ingest Service as in a cluster, so they follow the router
    // pod when the operator rolls it (mounting the GatewayBackend's Secret changes its
    // template after the workload appears).
    opts.cluster_dns = true;
    let kubelet = FakeKubelet::start(admin.clone(), opts).await?;

    // The operator as users install it: deploy/operator.yaml's Deployment, whose pods the
    // fake kubelet runs from their spec (command, env from the downward API, probes) as the
    // kvroute-operator service account, watching every namespace (the deploy/ default).
    let shipped = install_operator(&admin).await?;
    let operator_replicas = shipped.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let router_replicas: i32 = shipped_env(&shipped, "KVROUTE_OPERATOR_ROUTER_REPLICAS")
        .context("the shipped operator sets no KVROUTE_OPERATOR_ROUTER_REPLICAS")?
        .parse()?;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), DEPLOY_NAMESPACE);
    let leases: Api<Lease> = Api::namespaced(admin.clone(), DEPLOY_NAMESPACE);
    // Every replica ready (its readiness probe is the pod spec's /healthz on the admin port),
    // and one of them, named by the downward API, holds the Lease.
    let leader = wait_for(
        "the shipped operator Deployment is available and one of its pods leads",
        WAIT,
        || async {
            let d = deployments.get(OPERATOR_NAME).await?;
            let available = d.status.and_then(|s| s.available_replicas) == Some(operator_replicas);
            let pods = operator_pods(&kubelet);
            let holder = leases
                .get_opt(LEASE_NAME)
                .await?
                .and_then(|l| l.spec?.holder_identity);
            let leads = holder.filter(|h| pods.iter().any(|p| &p.name == h && p.ready));
            Ok(leads.filter(|_| available && pods.len() == operator_replicas as usize))
        },
    )
    .await
    .with_context(|| {
        format!(
            "kubelet problems: {:?}\nkubelet journal (last 30): {:#?}\noperator pods:\n{}",
            kubelet.problems(),
            kubelet.journal().iter().rev().take(30).collect::<Vec<_>>(),
            operator_pod_logs(&cluster)
        )
    })?;
    println!("the shipped operator runs {operator_replicas} pods; {leader} leads");
    workload(&admin).await?;

    // The router, as its service account, discovers the worker, which streams to it; the
    // worker pod runs without any token. Its Deployment is followed until the template that
    // mounts the GatewayBackend's Secret has rolled out: a pod of an earlier template may be
    // replaced before it ever turns ready.
    wait_for(
        "the router Deployment mounts the backend Secret and has rolled out",
        WAIT,
        || async {
            let Some(d) = deployments.get_opt(ROUTER_NAME).await? else {
                return Ok(None);
            };
            let mounts = d
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|p| p.volumes.as_ref())
                .is_some_and(|vs| {
                    vs.iter().any(|v| {
                        v.secret.as_ref().and_then(|s| s.secret_name.as_deref())
                            == Some(BACKEND_SECRET)
                    })
                });
            let st = d.status.unwrap_or_default();
            let rolled_out = d.metadata.generation.is_some()
                && st.observed_generation == d.metadata.generation
                && st.replicas == Some(router_replicas)
                && st.updated_replicas == Some(router_replicas)
                && st.available_replicas == Some(router_replicas);
            Ok((mounts && rolled_out).then_some(()))
        },
    )
    .await
    .with_context(|| {
        format!(
            "kubelet problems: {:?}\nkubelet journal (last 30): {:#?}\noperator pods:\n{}",
            kubelet.problems(),
            kubelet.journal().iter().rev().take(30).collect::<Vec<_>>(),
            operator_pod_logs(&cluster)
        )
    })?;
    // Every router replica is ready with its tokenizer and answers (the sidecar streams to
    // each of them).
    let routers: Vec<RunningPod> = kubelet
        .running()
        .into_iter()
        .filter(|p| p.name.starts_with(ROUTER_NAME) && p.ready)
        .collect();
    assert_eq!(
        routers.len(),
        router_replicas as usize,
        "ready router pods in the kubelet: {routers:?}"
    );
    let http = reqwest::Client::new();
    for router in &routers {
        let admin_url = format!("http://{}:{ADMIN_PORT}", router.ip);
        wait_for("the router is ready with its tokenizer", WAIT, || async {
            let r = http
                .get(format!("{admin_url}/readyz?model={SERVED}"))
                .send()
                .await?;
            Ok(r.status().is_success().then_some(()))
        })
        .await
        .with_context(|| {
            format!(
                "{}: kubelet problems: {:?}",
                router.name,
                kubelet.problems()
            )
        })?;
        let answer = http
            .post(format!(
                "http://{}:{HTTP_PORT}/v1/chat/completions",
                router.ip
            ))
            .json(&json!({"model": SERVED, "max_tokens": 4,
                          "messages": [{"role": "user", "content": "hello"}]}))
            .send()
            .await?;
        let status = answer.status();
        let body = answer.text().await?;
        assert!(status.is_success(), "{}: {status}: {body}", router.name);
    }
    statuses_written(&admin).await?;
    let sets: Api<InferenceWorkerSet> = Api::namespaced(admin.clone(), TEAM);
    wait_for("the WorkerSet reports its ready worker", WAIT, || async {
        let ws = sets.get("qwen").await?;
        Ok((ws.status.map(|s| s.ready_replicas) == Some(1)).then_some(()))
    })
    .await?;

    // The leader's pod goes (a node drain, an eviction): another replica takes the Lease,
    // and the Deployment brings the count back.
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), DEPLOY_NAMESPACE)
        .delete(&leader, &Default::default())
        .await?;
    let successor = wait_for("another operator pod takes the Lease", WAIT, || async {
        let holder = leases
            .get_opt(LEASE_NAME)
            .await?
            .and_then(|l| l.spec?.holder_identity);
        Ok(holder.filter(|h| h != &leader && !h.is_empty()))
    })
    .await
    .with_context(|| operator_pod_logs(&cluster))?;
    wait_for("the operator Deployment is whole again", WAIT, || async {
        let d = deployments.get(OPERATOR_NAME).await?;
        let available = d.status.and_then(|s| s.available_replicas) == Some(operator_replicas);
        Ok(
            (available && operator_pods(&kubelet).len() == operator_replicas as usize)
                .then_some(()),
        )
    })
    .await?;
    println!("{leader} deleted; {successor} leads");

    // The other watch scope: an operator watching only TEAM writes the router's Role and
    // RoleBinding there instead. The shipped Deployment is scaled to zero first, and the Lease
    // deleted so that it need not expire.
    deployments
        .patch(
            OPERATOR_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await?;
    wait_for("the operator's pods are gone", WAIT, || async {
        Ok(operator_pods(&kubelet).is_empty().then_some(()))
    })
    .await?;
    leases.delete(LEASE_NAME, &Default::default()).await?;
    let kubeconfig = cluster
        .service_account_kubeconfig(&admin, DEPLOY_NAMESPACE, OPERATOR_NAME)
        .await?;
    let operator = OperatorProcess::start_as(
        &cluster,
        &kubeconfig,
        "operator-audit-ns",
        "op-audit-ns",
        &[
            "--router-replicas=1".to_string(),
            format!("--namespace={TEAM}"),
        ],
    )
    .await?;
    let roles: Api<Role> = Api::namespaced(admin.clone(), TEAM);
    let bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), TEAM);
    wait_for(
        "the router's Role and RoleBinding in the watched namespace",
        WAIT,
        || async {
            let both = roles.get_opt(ROUTER_NAME).await?.is_some()
                && bindings.get_opt(ROUTER_NAME).await?.is_some();
            Ok(both.then_some(()))
        },
    )
    .await
    .with_context(|| operator.log())?;

    // A watch is audited when it ends: stop both components, then wait until every resource
    // they listed (each list starts a watch) shows its watch in the log.
    drop(operator);
    kubelet.stop(Duration::from_secs(5)).await;
    let audit_log = cluster.audit_log();
    let watched = || {
        let log = std::fs::read_to_string(&audit_log).unwrap_or_default();
        [OPERATOR_NAME, ROUTER_NAME].iter().all(|sa| {
            let reqs = requests_of(&log, &user(sa));
            reqs.iter().filter(|r| r.verb == "list").all(|l| {
                reqs.iter().any(|w| {
                    w.verb == "watch" && (&w.group, &w.resource) == (&l.group, &l.resource)
                })
            })
        })
    };
    // (Past the deadline the comparison below names what is missing.)
    let _ = wait_for(
        "every watch is in the audit log",
        Duration::from_secs(30),
        || async { Ok(watched().then_some(())) },
    )
    .await;

    // The comparison.
    let log = std::fs::read_to_string(cluster.audit_log()).context("audit log")?;
    let op_requests = requests_of(&log, &user(OPERATOR_NAME));
    let router_requests = requests_of(&log, &user(ROUTER_NAME));
    let (mut problems, op_used) = compare(
        "operator",
        &op_requests,
        OPERATOR_RULES,
        OPERATOR_NAMESPACE_RULES,
    );
    let (router_problems, router_used) = compare("router", &router_requests, ROUTER_RULES, &[]);
    problems.extend(router_problems);
    // A worker pod has no token: nothing in its namespace ran as a service account.
    let default_sa = format!("system:serviceaccount:{TEAM}:");
    let worker_calls = log.lines().filter(|l| l.contains(&default_sa)).count();
    if worker_calls > 0 {
        problems.push(format!(
            "{worker_calls} requests by {TEAM}'s service accounts"
        ));
    }

    // The figures docs/security.md quotes.
    let mut counts: BTreeMap<(&str, String), usize> = BTreeMap::new();
    for (who, reqs) in [("operator", &op_requests), ("router", &router_requests)] {
        for r in reqs {
            *counts
                .entry((who, format!("{} {}/{}", r.verb, r.group, r.resource)))
                .or_default() += 1;
        }
    }
    println!(
        "audit: operator {} distinct requests, {} grants used; router {} distinct requests, {} grants used",
        op_requests.len(),
        op_used.len(),
        router_requests.len(),
        router_used.len()
    );
    for ((who, what), n) in &counts {
        println!("audit: {who:8} {what} x{n}");
    }
    if !problems.is_empty() {
        // The cluster's directory goes with it: keep the log for whoever reads the failure.
        let kept = std::env::temp_dir().join("kvroute-rbac-audit.log");
        let _ = std::fs::write(&kept, &log);
        bail!(
            "RBAC and the audit log disagree (log kept in {}):\n{}",
            kept.display(),
            problems.join("\n")
        );
    }
    Ok(())
}
