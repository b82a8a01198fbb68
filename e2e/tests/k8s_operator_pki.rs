//! The operator's PKI against a real API server: with `--mtls` it keeps a CA in Secret
//! `kvroute-ca`, one key pair per identity in each namespace's `kvroute-mtls`, mounts each
//! pod's own pair with `items:` and passes the TLS flags; short lifetimes rotate only what is
//! due; the fake kubelet (like kubelet) writes Secret volumes into the pods' directories and
//! refreshes them. cert-manager mode is checked against a minimal Certificate CRD this test
//! installs: cert-manager itself does not run here, so the test plays its part by marking the
//! Certificates Ready.
//!
//! ```text
//! operator --mtls --cert-lifetime-seconds 45 (--namespace ns)
//!   --> Secret default/kvroute-ca, Secret ns/kvroute-mtls, Deployments with volumes + flags
//!   --> fake kubelet: <pods>/<ns>_<pod>/volumes/kvroute-tls/{tls.crt,tls.key,ca.crt}
//! test: chains, SANs, flags, rotation (new serial; nothing reissued before its time),
//!       Pool conditions TransportSecurity and GatewayTLS
//! ```
//!
//! The router and sidecar of this branch may not know the TLS flags yet: their processes
//! may exit and restart, which does not matter here; the volumes are written before a pod's
//! processes start and kept in sync while the pod exists.
//!
//! Needs the binaries of `bash e2e/k8s/setup.sh` and `target/<profile>/kvroute`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Secret, Volume};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kvroute_crds::InferencePool;
use kvroute_crds::workerset::InferenceWorkerSet;
use kvroute_e2e::harness::{Cluster, FakeKubelet, OperatorProcess, kubelet_options};
use kvroute_e2e::procs::wait_for;
use kvroute_operator::desired::router::ROUTER_NAME;
use kvroute_operator::desired::tls;
use kvroute_operator::pki::{self, CaSet, CertFacts};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);
/// Leaf life: renewed at 30 s, so a rotation shows within the test's deadline.
const LIFETIME_S: u64 = 45;
/// The harness runs operators with `--lease-namespace default`: the CA lives there.
const OPERATOR_NS: &str = "default";

fn worker_set(name: &str) -> anyhow::Result<InferenceWorkerSet> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "kvroute.dev/v1alpha1", "kind": "InferenceWorkerSet",
        "metadata": {"name": name},
        "spec": {"model": {"name": "m", "servedName": format!("{name}-mock")},
                 "replicas": 1, "engine": {"mode": "mock"}},
    }))?)
}

fn pool(name: &str, target: &str, extra: Value) -> anyhow::Result<InferencePool> {
    let mut spec = json!({"targets": [{"workerSet": target}]});
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "kvroute.dev/v1alpha1", "kind": "InferencePool",
        "metadata": {"name": name}, "spec": spec,
    }))?)
}

fn data(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    s.data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

async fn secret_data(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<Option<BTreeMap<String, Vec<u8>>>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    Ok(api.get_opt(name).await?.map(|s| data(&s)))
}

fn facts(d: &BTreeMap<String, Vec<u8>>, stem: &str) -> anyhow::Result<CertFacts> {
    let crt = d
        .get(&pki::cert_key(stem))
        .with_context(|| format!("no {stem}.crt"))?;
    Ok(pki::cert_facts(crt)?)
}

/// The pool's condition `type_` as (status, reason).
async fn pool_condition(
    pools: &Api<InferencePool>,
    name: &str,
    type_: &str,
) -> anyhow::Result<Option<(String, String)>> {
    let p = pools.get(name).await?;
    Ok(p.status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone())))
}

fn pod_parts(d: &Deployment, container: &str) -> anyhow::Result<(Vec<Volume>, Container)> {
    let pod = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .context("no pod spec")?;
    let c = pod
        .containers
        .iter()
        .find(|c| c.name == container)
        .cloned()
        .with_context(|| format!("no container {container}"))?;
    Ok((pod.volumes.unwrap_or_default(), c))
}

fn flag(c: &Container, name: &str) -> Option<String> {
    let args = c.args.clone().unwrap_or_default();
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1).cloned()
}

/// (secret name, [(key, path)]) of the volume mounted at `path` in `c`.
fn mounted_at(
    volumes: &[Volume],
    c: &Container,
    path: &str,
) -> Option<(String, Vec<(String, String)>)> {
    let m = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == path)?;
    let s = volumes.iter().find(|v| v.name == m.name)?.secret.as_ref()?;
    Some((
        s.secret_name.clone().unwrap_or_default(),
        s.items
            .iter()
            .flatten()
            .map(|i| (i.key.clone(), i.path.clone()))
            .collect(),
    ))
}

fn items(stem: &str) -> Vec<(String, String)> {
    vec![
        (pki::cert_key(stem), "tls.crt".to_string()),
        (pki::private_key_key(stem), "tls.key".to_string()),
        ("ca.crt".to_string(), "ca.crt".to_string()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_ca_issues_mounts_and_rotates_key_pairs() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    let ns = cluster.namespace(&client, "pki").await?;
    let kubelet = FakeKubelet::start(client.clone(), kubelet_options(cluster, &ns)).await?;
    let _operator = OperatorProcess::start(
        cluster,
        &format!("operator-{ns}"),
        "op-pki-e2e",
        &[
            format!("--namespace={ns}"),
            format!("--router-namespace={ns}"),
            "--router-replicas=1".to_string(),
            "--requeue-seconds=5".to_string(),
            "--mtls=true".to_string(),
            format!("--cert-lifetime-seconds={LIFETIME_S}"),
        ],
    )
    .await?;
    let sets: Api<InferenceWorkerSet> = Api::namespaced(client.clone(), &ns);
    let pools: Api<InferencePool> = Api::namespaced(client.clone(), &ns);
    sets.create(&PostParams::default(), &worker_set("qwen")?)
        .await?;
    pools
        .create(
            &PostParams::default(),
            &pool(
                "chat",
                "qwen",
                json!({"gateway": {"tls": {"secretName": "gw-tls"}}}),
            )?,
        )
        .await?;

    // Every identity's pair, the bundle and the admin token.
    let want = [
        "router.crt",
        "router.key",
        "workerset-qwen.crt",
        "workerset-qwen.key",
        "picker-chat.crt",
        "picker-chat.key",
        "ca.crt",
        "admin-token",
    ];
    let first = wait_for("kvroute-mtls holds every identity", WAIT, || async {
        let d = secret_data(&client, &ns, pki::MTLS_SECRET).await?;
        Ok(d.filter(|d| want.iter().all(|k| d.contains_key(*k))))
    })
    .await?;
    let ca_data = secret_data(&client, OPERATOR_NS, pki::CA_SECRET)
        .await?
        .context("no kvroute-ca")?;
    let cas = CaSet::from_data(&ca_data)?.context("kvroute-ca holds no CA")?;
    assert_eq!(
        String::from_utf8_lossy(&first["ca.crt"]).trim(),
        cas.bundle(0).trim(),
        "the bundle is the CA Secret's"
    );
    for stem in ["router", "workerset-qwen", "picker-chat"] {
        assert!(
            pki::signed_by(&first[&pki::cert_key(stem)], cas.signing.cert.as_bytes()),
            "{stem} does not chain to kvroute-ca"
        );
    }
    let router = facts(&first, "router")?;
    assert_eq!(
        router.uris,
        BTreeSet::from([format!("spiffe://kvroute.dev/ns/{ns}/pool/chat/router")])
    );
    for dns in [
        ROUTER_NAME.to_string(),
        format!("{ROUTER_NAME}.{ns}"),
        format!("kvroute-router-ingest.{ns}.svc"),
        format!("kvroute-router-ingest.{ns}.svc.cluster.local"),
    ] {
        assert!(
            router.dns.contains(&dns),
            "router cert lacks {dns}: {router:?}"
        );
    }
    assert_eq!(
        facts(&first, "workerset-qwen")?.uris,
        BTreeSet::from([format!("spiffe://kvroute.dev/ns/{ns}/workerset/qwen")])
    );
    assert_eq!(
        facts(&first, "picker-chat")?.uris,
        BTreeSet::from([format!("spiffe://kvroute.dev/ns/{ns}/pool/chat/picker")])
    );
    let life = router.not_after - router.not_before;
    assert!(
        life <= LIFETIME_S as i64 + 5,
        "leaf life {life}s, asked for {LIFETIME_S}s"
    );

    // The Deployments mount each pod's own pair and pass the flags.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let (volumes, c) = wait_for("the router mounts the gateway Secret", WAIT, || async {
        let d = deployments.get_opt(ROUTER_NAME).await?;
        let Some(d) = d else { return Ok(None) };
        let (v, c) = pod_parts(&d, "router")?;
        Ok(flag(&c, tls::FLAG_GATEWAY_TLS_DIR)
            .is_some()
            .then_some((v, c)))
    })
    .await?;
    assert_eq!(flag(&c, "--grpc-tls-dir").as_deref(), Some(tls::TLS_DIR));
    assert_eq!(
        flag(&c, "--admin-token-file").as_deref(),
        Some("/var/run/kvroute/admin/admin-token")
    );
    assert_eq!(
        flag(&c, "--gateway-tls-dir").as_deref(),
        Some(tls::GATEWAY_TLS_DIR)
    );
    assert_eq!(
        mounted_at(&volumes, &c, tls::TLS_DIR),
        Some(("kvroute-mtls".to_string(), items("router")))
    );
    assert_eq!(
        mounted_at(&volumes, &c, tls::ADMIN_TOKEN_DIR),
        Some((
            "kvroute-mtls".to_string(),
            vec![("admin-token".into(), "admin-token".into())]
        ))
    );
    assert_eq!(
        mounted_at(&volumes, &c, tls::GATEWAY_TLS_DIR).map(|(s, _)| s),
        Some("gw-tls".to_string())
    );
    // The worker Deployment is reconciled separately from the router's: wait for it.
    let (volumes, sidecar) = wait_for("the worker sidecar mounts the mTLS pair", WAIT, || async {
        let Some(d) = deployments.get_opt("qwen").await? else {
            return Ok(None);
        };
        let (v, c) = pod_parts(&d, "sidecar")?;
        Ok(flag(&c, "--router-tls-dir").is_some().then_some((v, c)))
    })
    .await?;
    let worker = deployments.get("qwen").await?;
    assert_eq!(
        flag(&sidecar, "--router-tls-dir").as_deref(),
        Some(tls::TLS_DIR)
    );
    assert_eq!(
        flag(&sidecar, "--router-tls-server-name"),
        Some(format!("kvroute-router-ingest.{ns}.svc"))
    );
    assert_eq!(
        mounted_at(&volumes, &sidecar, tls::TLS_DIR),
        Some(("kvroute-mtls".to_string(), items("workerset-qwen")))
    );
    let (_, engine) = pod_parts(&worker, "engine")?;
    assert!(
        engine
            .volume_mounts
            .iter()
            .flatten()
            .all(|m| m.mount_path != tls::TLS_DIR)
    );

    // Pool conditions: certificates in place; the gateway Secret is missing, then found.
    wait_for("TransportSecurity is True/OperatorCA", WAIT, || async {
        let c = pool_condition(&pools, "chat", tls::TRANSPORT_SECURITY).await?;
        Ok((c == Some(("True".into(), "OperatorCA".into()))).then_some(()))
    })
    .await?;
    wait_for("GatewayTLS is False/SecretNotFound", WAIT, || async {
        let c = pool_condition(&pools, "chat", tls::GATEWAY_TLS).await?;
        Ok((c == Some(("False".into(), "SecretNotFound".into()))).then_some(()))
    })
    .await?;
    let gw: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gw-tls"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": "x", "tls.key": "y"},
    }))?;
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &gw)
        .await?;
    wait_for("GatewayTLS is True/Mounted", WAIT, || async {
        let c = pool_condition(&pools, "chat", tls::GATEWAY_TLS).await?;
        Ok((c == Some(("True".into(), "Mounted".into()))).then_some(()))
    })
    .await?;

    // A second WorkerSet later: its pair is added, nothing else is reissued for it.
    sets.create(&PostParams::default(), &worker_set("llama")?)
        .await?;
    let with_llama = wait_for("the new WorkerSet gets a pair", WAIT, || async {
        let d = secret_data(&client, &ns, pki::MTLS_SECRET).await?;
        Ok(d.filter(|d| d.contains_key("workerset-llama.key")))
    })
    .await?;

    // Rotation: the router's pair gets a new serial once past two thirds of its life.
    let rotated = wait_for("the router's pair is reissued", WAIT, || async {
        let d = secret_data(&client, &ns, pki::MTLS_SECRET).await?;
        Ok(d.filter(|d| facts(d, "router").is_ok_and(|f| f.serial != router.serial)))
    })
    .await?;
    // Nothing was reissued before it was due, and the token never changes.
    for stem in ["router", "workerset-qwen", "picker-chat", "workerset-llama"] {
        let (old, new) = (facts(&with_llama, stem)?, facts(&rotated, stem)?);
        if old.serial != new.serial {
            let backdate = (LIFETIME_S / 10) as i64;
            assert!(
                new.not_before + backdate + 1 >= old.renew_at(),
                "{stem} reissued at {} before it was due at {}",
                new.not_before + backdate,
                old.renew_at()
            );
        } else {
            assert_eq!(
                with_llama[&pki::private_key_key(stem)],
                rotated[&pki::private_key_key(stem)]
            );
        }
    }
    assert_eq!(first["admin-token"], rotated["admin-token"]);
    assert_eq!(
        first["workerset-qwen.key"] != rotated["workerset-qwen.key"],
        facts(&first, "workerset-qwen")?.serial != facts(&rotated, "workerset-qwen")?.serial,
        "a key changes exactly when its certificate does"
    );
    // ... and the router pod's mounted files follow the Secret, as kubelet's would.
    let pods_dir = cluster.dir().join("pods");
    let volume_dir = wait_for("a router pod's tls.crt is the new one", WAIT, || async {
        let d = secret_data(&client, &ns, pki::MTLS_SECRET)
            .await?
            .unwrap_or_default();
        for pod in kubelet.running() {
            if !pod.name.starts_with(ROUTER_NAME) {
                continue;
            }
            let dir = pods_dir
                .join(format!("{ns}_{}", pod.name))
                .join("volumes")
                .join(tls::TLS_VOLUME);
            let file = |f: &str| std::fs::read(dir.join(f)).ok();
            let crt = file("tls.crt");
            let current = crt.as_ref() == d.get("router.crt")
                && file("tls.key").as_ref() == d.get("router.key")
                && file("ca.crt").as_ref() == d.get("ca.crt");
            let renewed =
                crt.is_some_and(|c| pki::cert_facts(&c).is_ok_and(|f| f.serial != router.serial));
            if current && renewed {
                return Ok(Some(dir));
            }
        }
        Ok(None)
    })
    .await
    .with_context(|| format!("kubelet: {:?} {:?}", kubelet.running(), kubelet.problems()))?;
    // kubelet's layout: the keys link through `..data` to the current version directory.
    assert!(std::fs::read_link(volume_dir.join("..data")).is_ok());
    let files: BTreeSet<String> = std::fs::read_dir(&volume_dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".."))
        .collect();
    assert_eq!(
        files,
        ["ca.crt", "tls.crt", "tls.key"].map(String::from).into(),
        "the pod sees only its own pair"
    );
    kubelet.stop(Duration::from_secs(2)).await;
    Ok(())
}

/// A minimal stand-in for cert-manager's Certificate CRD: the group, version, kind and status
/// subresource the operator uses, with a schema that keeps any fields.
async fn install_certificate_crd(client: &kube::Client) -> anyhow::Result<()> {
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "certificates.cert-manager.io"},
        "spec": {
            "group": "cert-manager.io", "scope": "Namespaced",
            "names": {"plural": "certificates", "singular": "certificate", "kind": "Certificate"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    }))?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    match api.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    wait_for("the Certificate CRD is established", WAIT, || async {
        let c = api.get("certificates.cert-manager.io").await?;
        let ok = c
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .any(|c| c.type_ == "Established" && c.status == "True");
        Ok(ok.then_some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_naming_an_issuer_gets_cert_manager_certificates() -> anyhow::Result<()> {
    let cluster = Cluster::shared().await?;
    let client = cluster.client().await?;
    install_certificate_crd(&client).await?;
    let ns = cluster.namespace(&client, "pkicm").await?;
    let _operator = OperatorProcess::start(
        cluster,
        &format!("operator-{ns}"),
        "op-pki-cm-e2e",
        &[
            format!("--namespace={ns}"),
            format!("--router-namespace={ns}"),
            "--router-replicas=1".to_string(),
            "--requeue-seconds=5".to_string(),
            "--mtls=true".to_string(),
        ],
    )
    .await?;
    let sets: Api<InferenceWorkerSet> = Api::namespaced(client.clone(), &ns);
    let pools: Api<InferencePool> = Api::namespaced(client.clone(), &ns);
    sets.create(&PostParams::default(), &worker_set("qwen")?)
        .await?;
    pools
        .create(
            &PostParams::default(),
            &pool(
                "chat",
                "qwen",
                json!({"tls": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}),
            )?,
        )
        .await?;

    let certs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &tls::certificate_resource());
    let names = [
        "kvroute-mtls-router",
        "kvroute-mtls-workerset-qwen",
        "kvroute-mtls-picker-chat",
    ];
    let found = wait_for("a Certificate per identity", WAIT, || async {
        let mut out = BTreeMap::new();
        for n in names {
            match certs.get_opt(n).await? {
                Some(c) => {
                    out.insert(n, c);
                }
                None => return Ok(None),
            }
        }
        Ok(Some(out))
    })
    .await?;
    for (name, c) in &found {
        let spec = &c.data["spec"];
        assert_eq!(spec["secretName"], json!(name), "{name}");
        assert_eq!(
            spec["issuerRef"],
            json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
        );
        assert_eq!(spec["privateKey"]["algorithm"], "ECDSA");
        assert_eq!(spec["privateKey"]["rotationPolicy"], "Always");
    }
    let router = &found["kvroute-mtls-router"].data["spec"];
    assert_eq!(
        router["uris"],
        json!([format!("spiffe://kvroute.dev/ns/{ns}/pool/chat/router")])
    );
    assert!(
        router["dnsNames"]
            .as_array()
            .is_some_and(|d| d.contains(&json!(format!("kvroute-router-ingest.{ns}.svc")))),
        "{router}"
    );
    assert!(
        router["usages"]
            .as_array()
            .is_some_and(|u| u.contains(&json!("server auth")))
    );
    let sidecar = &found["kvroute-mtls-workerset-qwen"].data["spec"];
    assert_eq!(
        sidecar["uris"],
        json!([format!("spiffe://kvroute.dev/ns/{ns}/workerset/qwen")])
    );
    assert!(
        sidecar["usages"]
            .as_array()
            .is_some_and(|u| !u.contains(&json!("server auth")))
    );

    // Pods mount the Secret cert-manager writes for their identity.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let (volumes, sidecar) = wait_for(
        "the worker mounts its Certificate's Secret",
        WAIT,
        || async {
            let Some(d) = deployments.get_opt("qwen").await? else {
                return Ok(None);
            };
            let (v, c) = pod_parts(&d, "sidecar")?;
            let secret = mounted_at(&v, &c, tls::TLS_DIR).map(|(s, _)| s);
            Ok((secret.as_deref() == Some("kvroute-mtls-workerset-qwen")).then_some((v, c)))
        },
    )
    .await?;
    assert_eq!(
        mounted_at(&volumes, &sidecar, tls::TLS_DIR).map(|(_, i)| i),
        Some(vec![
            ("tls.crt".to_string(), "tls.crt".to_string()),
            ("tls.key".into(), "tls.key".into()),
            ("ca.crt".into(), "ca.crt".into()),
        ])
    );
    // The router moves to its Certificate's Secret once the operator has seen the pool's
    // issuer (it may still mount the operator CA's Secret at first).
    let (volumes, rc) = wait_for(
        "the router mounts its Certificate's Secret",
        WAIT,
        || async {
            let Some(d) = deployments.get_opt(ROUTER_NAME).await? else {
                return Ok(None);
            };
            let (v, c) = pod_parts(&d, "router")?;
            let secret = mounted_at(&v, &c, tls::TLS_DIR).map(|(s, _)| s);
            Ok((secret.as_deref() == Some("kvroute-mtls-router")).then_some((v, c)))
        },
    )
    .await?;
    assert_eq!(
        mounted_at(&volumes, &rc, tls::TLS_DIR)
            .map(|(s, _)| s)
            .as_deref(),
        Some("kvroute-mtls-router")
    );
    // The admin token is still the operator's.
    assert_eq!(
        mounted_at(&volumes, &rc, tls::ADMIN_TOKEN_DIR)
            .map(|(s, _)| s)
            .as_deref(),
        Some("kvroute-mtls")
    );

    // Not Ready until cert-manager (here: the test) says so; then the pool reports the mode.
    wait_for(
        "TransportSecurity is False/CertificatesNotReady",
        WAIT,
        || async {
            let c = pool_condition(&pools, "chat", tls::TRANSPORT_SECURITY).await?;
            Ok((c == Some(("False".into(), "CertificatesNotReady".into()))).then_some(()))
        },
    )
    .await?;
    let ready = json!({"status": {"conditions": [{"type": "Ready", "status": "True",
        "reason": "Issued", "message": "played by the test"}]}});
    for n in ["kvroute-mtls-workerset-qwen", "kvroute-mtls-picker-chat"] {
        certs
            .patch_status(n, &PatchParams::default(), &Patch::Merge(&ready))
            .await?;
    }
    wait_for("TransportSecurity is True/CertManager", WAIT, || async {
        let c = pool_condition(&pools, "chat", tls::TRANSPORT_SECURITY).await?;
        Ok((c == Some(("True".into(), "CertManager".into()))).then_some(()))
    })
    .await?;
    // The operator issued nothing itself here but the admin token.
    let mtls = secret_data(&client, &ns, pki::MTLS_SECRET)
        .await?
        .context("no kvroute-mtls")?;
    let keys: BTreeSet<&str> = mtls.keys().map(String::as_str).collect();
    if keys != BTreeSet::from(["admin-token", "ca.crt"]) {
        bail!("kvroute-mtls in cert-manager mode holds {keys:?}");
    }
    Ok(())
}
