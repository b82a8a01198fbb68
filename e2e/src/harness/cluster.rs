//! A real etcd + kube-apiserver + kube-controller-manager on free loopback ports, started by
//! `e2e/k8s/k8s-up.sh` in a temporary directory.
//!
//! ```text
//! Cluster::start()  -> own instance, killed (process group) and removed on drop
//! Cluster::start_with(ClusterOptions { audit: true }) -> the same, with an audit log of every
//!                      service account's requests (log/audit.log, JSON lines)
//! Cluster::shared() -> one instance per test binary (OnceCell); a watchdog started by
//!                      k8s-up.sh kills it, and every process group registered with its
//!                      Reaper, when the test binary exits
//! cluster.restart_api_server(down) -> SIGTERM kube-apiserver, wait `down`, start it again
//!                      with the same flags (etcd keeps the state); for a cluster of its own
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::json;
use tokio::sync::OnceCell;

use super::kubelet::ServiceAccountAuth;
use crate::procs;

/// Directory holding `kube-apiserver` and `kube-controller-manager`:
/// `$KVROUTE_K8S_BIN`, else `/opt/k8s-e2e/bin`.
pub fn k8s_bin_dir() -> PathBuf {
    std::env::var_os("KVROUTE_K8S_BIN")
        .map_or_else(|| PathBuf::from("/opt/k8s-e2e/bin"), PathBuf::from)
}

/// Fails with the set-up command when a binary the tier needs is missing.
pub fn check_binaries() -> anyhow::Result<PathBuf> {
    let dir = k8s_bin_dir();
    check_binaries_in(&dir)?;
    Ok(dir)
}

/// [`check_binaries`] for a given directory.
pub fn check_binaries_in(dir: &Path) -> anyhow::Result<()> {
    let mut missing: Vec<String> = ["kube-apiserver", "kube-controller-manager"]
        .iter()
        .filter(|b| !dir.join(b).is_file())
        .map(|b| dir.join(b).display().to_string())
        .collect();
    for tool in ["etcd", "openssl", "curl"] {
        if !on_path(tool) {
            missing.push(format!("`{tool}` on PATH"));
        }
    }
    if !missing.is_empty() {
        bail!(
            "the Kubernetes e2e tier needs {}; run `bash e2e/k8s/setup.sh` once on this machine \
             (or point KVROUTE_K8S_BIN at a directory with kube-apiserver and kube-controller-manager)",
            missing.join(", ")
        );
    }
    Ok(())
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Process groups to kill when the test binary exits (written to `<state>/pgids`, read by the
/// watchdog that k8s-up.sh started).
#[derive(Clone, Debug)]
pub struct Reaper {
    file: PathBuf,
}

impl Reaper {
    /// Registers the process group `pgid` (a child started in its own group).
    pub fn register(&self, pgid: u32) {
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.file)
            .and_then(|mut f| writeln!(f, "{pgid}"));
        if let Err(e) = appended {
            tracing::warn!(file = %self.file.display(), error = %e, "cannot register process group with the reaper");
        }
    }
}

/// How to start a cluster.
#[derive(Clone, Debug, Default)]
pub struct ClusterOptions {
    /// Write an audit log (Metadata level) of every request a service account makes to
    /// [`Cluster::audit_log`].
    pub audit: bool,
}

/// A running API server.
pub struct Cluster {
    dir: PathBuf,
    pgid: u32,
    api_port: u16,
}

static SHARED: OnceCell<Cluster> = OnceCell::const_new();

impl Cluster {
    /// Starts an instance of its own, on free ports; stopped when dropped.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(ClusterOptions::default()).await
    }

    /// [`Cluster::start`] with options.
    pub async fn start_with(opts: ClusterOptions) -> anyhow::Result<Self> {
        let bin = check_binaries()?;
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s/k8s-up.sh");
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let mut last_err = None;
        // A port found free may be taken before etcd binds it: one retry on fresh ports.
        for _ in 0..2 {
            let n = SEQ.fetch_add(1, Ordering::Relaxed);
            let dir =
                std::env::temp_dir().join(format!("kvroute-k8s-e2e-{}-{n}", std::process::id()));
            let api_port = procs::free_local_port()?;
            let mut cmd = tokio::process::Command::new("bash");
            cmd.arg(&script)
                .arg(&dir)
                .env("K8S_BIN", &bin)
                .env("API_PORT", api_port.to_string())
                .env("ETCD_PORT", procs::free_local_port()?.to_string())
                .env("ETCD_PEER_PORT", procs::free_local_port()?.to_string())
                .env("K8S_OWNER_PID", std::process::id().to_string())
                .env("K8S_AUDIT", if opts.audit { "1" } else { "0" })
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0);
            let child = cmd
                .spawn()
                .with_context(|| format!("start {}", script.display()))?;
            let pgid = child.id().context("k8s-up.sh has no pid")?;
            let cluster = Self {
                dir,
                pgid,
                api_port,
            };
            let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
                .await
                .context("k8s-up.sh did not finish within 120 s")??;
            if out.status.success() {
                cluster.wait_ready().await?;
                return Ok(cluster);
            }
            last_err = Some(anyhow::anyhow!(
                "k8s-up.sh failed ({}):\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
            // `cluster` is dropped here: its processes are killed and its directory removed.
        }
        Err(last_err.unwrap_or_else(|| anyhow::anyhow!("k8s-up.sh failed")))
    }

    /// One instance per test binary, with the CRDs of `crds/` installed. Never dropped: the
    /// watchdog stops it when the test binary exits.
    pub async fn shared() -> anyhow::Result<&'static Self> {
        SHARED
            .get_or_try_init(|| async {
                let c = Self::start().await?;
                install_crds(&c.client().await?).await?;
                Ok(c)
            })
            .await
    }

    /// Path of the admin kubeconfig (a static token in `system:masters`).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// The audit log (JSON lines) of a cluster started with [`ClusterOptions::audit`].
    pub fn audit_log(&self) -> PathBuf {
        self.dir.join("log").join("audit.log")
    }

    /// A kubeconfig that authenticates as the service account `namespace/name` with the
    /// token its Secret holds (made by the controller-manager's token controller), so RBAC
    /// applies to whoever uses it. Waits up to 30 s for the token.
    pub async fn service_account_kubeconfig(
        &self,
        client: &kube::Client,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<PathBuf> {
        let token = service_account_token(client, namespace, name).await?;
        let auth = self.service_account_auth();
        write_token_kubeconfig(&auth, namespace, name, &token)
    }

    /// What a fake kubelet needs to give pods their service account's identity
    /// ([`crate::harness::KubeletOptions::service_accounts`]).
    pub fn service_account_auth(&self) -> ServiceAccountAuth {
        ServiceAccountAuth {
            server: format!("https://127.0.0.1:{}", self.api_port),
            ca_file: self.dir.join("pki").join("ca.crt"),
            dir: self.dir.clone(),
        }
    }

    /// The state directory (logs under `log/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The API server's HTTPS port on 127.0.0.1.
    pub fn api_port(&self) -> u16 {
        self.api_port
    }

    /// Stops kube-apiserver (SIGTERM; SIGKILL after 30 s), leaves it down for `down`, then
    /// starts it again with the same flags (`apiserver.sh`, written by k8s-up.sh) and waits
    /// until it answers. etcd and the controller-manager keep running, as when a control
    /// plane node's API server restarts. Returns how long the API server was unreachable.
    pub async fn restart_api_server(&self, down: Duration) -> anyhow::Result<Duration> {
        let pids_file = self.dir.join("pids");
        let pids = std::fs::read_to_string(&pids_file)?;
        let mut lines: Vec<String> = pids.lines().map(str::to_string).collect();
        let old = lines
            .get(1)
            .and_then(|l| l.trim().parse::<u32>().ok())
            .context("no kube-apiserver pid on line 2 of pids")?;
        let stopped_at = std::time::Instant::now();
        procs::signal(old, "TERM");
        let gone = || !Path::new(&format!("/proc/{old}")).exists();
        let term_deadline = stopped_at + Duration::from_secs(30);
        while !gone() && std::time::Instant::now() < term_deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if !gone() {
            procs::signal(old, "KILL");
        }
        tokio::time::sleep(down).await;
        // Not waited for: it runs until the cluster stops (tokio reaps it once it exits).
        let child = tokio::process::Command::new("bash")
            .arg(self.dir.join("apiserver.sh"))
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .context("start kube-apiserver again")?;
        let pid = child
            .id()
            .context("the restarted kube-apiserver has no pid")?;
        // Its own process group: registered so the test binary's watchdog and Drop kill it.
        self.reaper().register(pid);
        lines[1] = pid.to_string();
        std::fs::write(&pids_file, lines.join("\n") + "\n")?;
        let client = self.client().await?;
        procs::wait_for(
            "the restarted kube-apiserver answers",
            Duration::from_secs(60),
            || {
                let api: Api<Namespace> = Api::all(client.clone());
                async move {
                    Ok(api
                        .list(&kube::api::ListParams::default().limit(1))
                        .await
                        .ok()
                        .map(|_| ()))
                }
            },
        )
        .await
        .with_context(|| self.log_tail("kube-apiserver", 20))?;
        // The core API answers before the custom resources do: a restarted API server serves
        // each CRD's resources only once its CRD controller has loaded them, and until then a
        // request for them is a 404. Wait until every CRD's resources list again.
        procs::wait_for(
            "the restarted kube-apiserver serves every custom resource",
            Duration::from_secs(60),
            || {
                let client = client.clone();
                async move { Ok(serves_every_crd(&client).await.then_some(())) }
            },
        )
        .await
        .with_context(|| self.log_tail("kube-apiserver", 20))?;
        Ok(stopped_at.elapsed())
    }

    /// Registers process groups to kill when the test binary exits.
    pub fn reaper(&self) -> Reaper {
        Reaper {
            file: self.dir.join("pgids"),
        }
    }

    /// A new client. Each tokio runtime (each `#[tokio::test]`) needs its own.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let kc = Kubeconfig::read_from(self.kubeconfig())?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// Creates a fresh namespace `<prefix>-<n>`.
    pub async fn namespace(&self, client: &kube::Client, prefix: &str) -> anyhow::Result<String> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = format!("{prefix}-{}", SEQ.fetch_add(1, Ordering::Relaxed));
        let api: Api<Namespace> = Api::all(client.clone());
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        api.patch(
            &name,
            &PatchParams::apply("kvroute-e2e").force(),
            &Patch::Apply(&ns),
        )
        .await
        .with_context(|| format!("create namespace {name}"))?;
        // Pods are refused until the namespace's default service account has its token.
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), &name);
        procs::wait_for(
            &format!("the service account token of namespace {name}"),
            Duration::from_secs(30),
            || async {
                let sa = sas.get_opt("default").await?;
                Ok(sa
                    .filter(|sa| sa.secrets.as_ref().is_some_and(|s| !s.is_empty()))
                    .map(|_| ()))
            },
        )
        .await?;
        Ok(name)
    }

    /// The tail of one of the cluster's logs (`etcd`, `kube-apiserver`,
    /// `kube-controller-manager`), for failure messages.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join("log").join(format!("{component}.log")))
            .unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The log lines of every container of pod `namespace/pod` run by a fake kubelet with
    /// [`super::kubelet_options`], those containing any of `needles` (all lines when empty),
    /// at most `lines` per container, each prefixed with the container's name.
    pub fn pod_log_lines(
        &self,
        namespace: &str,
        pod: &str,
        needles: &[&str],
        lines: usize,
    ) -> String {
        let dir = self.dir.join("pods").join(format!("{namespace}_{pod}"));
        let mut logs: Vec<_> = std::fs::read_dir(&dir)
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        logs.sort();
        let mut out = String::new();
        for log in logs {
            let container = log
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let picked: Vec<&str> = text
                .lines()
                .filter(|l| needles.is_empty() || needles.iter().any(|n| l.contains(n)))
                .collect();
            for l in &picked[picked.len().saturating_sub(lines)..] {
                out += &format!("  [{container}] {l}\n");
            }
        }
        out
    }

    async fn wait_ready(&self) -> anyhow::Result<()> {
        let client = self.client().await?;
        procs::wait_for(
            "the default service account token controller",
            Duration::from_secs(60),
            || {
                let client = client.clone();
                async move {
                    // The controller-manager is up once it has made the default namespace's
                    // service account (needed before any Pod can be created).
                    let api: Api<k8s_openapi::api::core::v1::ServiceAccount> =
                        Api::namespaced(client, "default");
                    Ok(api.get_opt("default").await?.map(|_| ()))
                }
            },
        )
        .await
        .with_context(|| self.log_tail("kube-controller-manager", 20))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let pgids = std::fs::read_to_string(self.dir.join("pgids")).unwrap_or_default();
        for g in pgids
            .lines()
            .filter_map(|l| l.trim().parse::<u32>().ok())
            .chain([self.pgid])
        {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{g}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes `<auth.dir>/sa-<namespace>-<name>.kubeconfig` authenticating with `token`.
pub fn write_token_kubeconfig(
    auth: &ServiceAccountAuth,
    namespace: &str,
    name: &str,
    token: &str,
) -> anyhow::Result<PathBuf> {
    let path = auth.dir.join(format!("sa-{namespace}-{name}.kubeconfig"));
    let kc = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {
            "server": auth.server,
            "certificate-authority": auth.ca_file,
        }}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": name, "namespace": namespace}}],
        "current-context": "e2e",
    });
    std::fs::write(&path, serde_json::to_vec_pretty(&kc)?)
        .with_context(|| format!("write {}", path.display()))?;
    Ok(path)
}

/// The bearer token of service account `namespace/name`, from the Secret the token controller
/// made for it.
pub async fn service_account_token(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<String> {
    use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    procs::wait_for(
        &format!("the token of service account {namespace}/{name}"),
        Duration::from_secs(30),
        || async {
            let Some(sa) = sas.get_opt(name).await? else {
                return Ok(None);
            };
            for r in sa.secrets.into_iter().flatten() {
                let Some(secret_name) = r.name else { continue };
                let token = secrets
                    .get_opt(&secret_name)
                    .await?
                    .and_then(|s| s.data)
                    .and_then(|d| d.get("token").cloned());
                if let Some(t) = token {
                    return Ok(Some(String::from_utf8(t.0)?));
                }
            }
            Ok(None)
        },
    )
    .await
}

/// Directory of the CRD YAML (`crds/` at the repository root).
pub fn crds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds")
}

/// True when every CustomResourceDefinition's resources can be listed (the first served
/// version of each).
async fn serves_every_crd(client: &kube::Client) -> bool {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let Ok(list) = crds.list(&kube::api::ListParams::default()).await else {
        return false;
    };
    for crd in list.items {
        let spec = &crd.spec;
        let Some(version) = spec.versions.iter().find(|v| v.served) else {
            continue;
        };
        let gvk = kube::api::GroupVersionKind::gvk(&spec.group, &version.name, &spec.names.kind);
        let resource = kube::discovery::ApiResource::from_gvk_with_plural(&gvk, &spec.names.plural);
        let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
        if api
            .list(&kube::api::ListParams::default().limit(1))
            .await
            .is_err()
        {
            return false;
        }
    }
    true
}

/// Applies every CustomResourceDefinition in `crds/*.yaml` and waits until each is established.
pub async fn install_crds(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    let dir = crds_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    // The CRDs need 1.25 (CEL rules; docs/crds.md), but the API server that builds here is
    // 1.20, which does not know `x-kubernetes-validations`. Install them without the rules on
    // such a server, so the tier tests what the operator does; the rules are then checked
    // only by the operator's `validate()` (their twins), which the e2e tests rely on.
    let cel = server_has_cel(client).await?;
    let prepare = |crd: CustomResourceDefinition| {
        if cel {
            crd
        } else {
            kvroute_crds::without_cel(&crd)
        }
    };
    let mut names = Vec::new();
    for file in &files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("read {}", file.display()))?;
        let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text)
            .with_context(|| format!("parse {}", file.display()))?;
        for doc in docs
            .into_iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
        {
            let crd: CustomResourceDefinition = serde_json::from_value(doc)
                .with_context(|| format!("a CRD in {}", file.display()))?;
            let name = crd.metadata.name.clone().context("CRD without a name")?;
            create_or_replace(&api, prepare(crd)).await?;
            names.push(name);
        }
    }
    if names.is_empty() {
        // Before `kvroute crdgen` has written crds/*.yaml: the same CRDs from the Rust types
        // (the crds golden test keeps the two identical).
        tracing::warn!(dir = %dir.display(), "no CRD YAML found; installing kvroute_crds::crds()");
        for crd in kvroute_crds::crds() {
            let name = crd.metadata.name.clone().context("CRD without a name")?;
            create_or_replace(&api, prepare(crd)).await?;
            names.push(name);
        }
    }
    for name in &names {
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(api.clone(), name, conditions::is_crd_established()),
        )
        .await
        .with_context(|| format!("CRD {name} not established within 30 s"))??;
    }
    Ok(names)
}

/// The Gateway API Inference Extension's InferencePool CRD (`inference.networking.k8s.io/v1`),
/// a test fixture written from GIE's documented v1 schema (see the file's header): GIE owns
/// the CRD, kvroute never installs it in a real cluster.
pub fn gie_crd_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s/gie-inferencepool-crd.yaml")
}

/// Installs the GIE InferencePool CRD fixture ([`gie_crd_path`]) and waits until it is
/// established (CEL rules dropped on servers before 1.25, as for kvroute's own CRDs).
pub async fn install_gie_crd(client: &kube::Client) -> anyhow::Result<()> {
    let file = gie_crd_path();
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("read {}", file.display()))?;
    let doc: serde_json::Value =
        serde_saphyr::from_str(&text).with_context(|| format!("parse {}", file.display()))?;
    let mut crd: CustomResourceDefinition =
        serde_json::from_value(doc).with_context(|| format!("the CRD in {}", file.display()))?;
    if !server_has_cel(client).await? {
        crd = kvroute_crds::without_cel(&crd);
    }
    let name = crd.metadata.name.clone().context("CRD without a name")?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    create_or_replace(&api, crd).await?;
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(api, &name, conditions::is_crd_established()),
    )
    .await
    .with_context(|| format!("CRD {name} not established within 30 s"))??;
    Ok(())
}

/// Whether the API server evaluates CEL validation rules (1.25 and later).
async fn server_has_cel(client: &kube::Client) -> anyhow::Result<bool> {
    let info = client
        .apiserver_version()
        .await
        .context("API server version")?;
    Ok(cel_supported(&info.major, &info.minor))
}

/// `major.minor` is 1.25 or later; minor versions may carry a suffix (`25+` on some
/// distributions).
fn cel_supported(major: &str, minor: &str) -> bool {
    let number = |s: &str| {
        s.trim_end_matches(|c: char| !c.is_ascii_digit())
            .parse::<u32>()
            .unwrap_or(0)
    };
    (number(major), number(minor)) >= (1, 25)
}

/// Create, or replace at the current resourceVersion. Not server-side apply: the 1.20 API
/// server's apply schema lacks `x-kubernetes-validations` and refuses CRDs with CEL rules,
/// while create/update accept them (and drop the rules, which 1.20 cannot evaluate).
async fn create_or_replace(
    api: &Api<CustomResourceDefinition>,
    mut crd: CustomResourceDefinition,
) -> anyhow::Result<()> {
    let name = crd.metadata.name.clone().context("CRD without a name")?;
    match api.get_opt(&name).await? {
        None => {
            api.create(&PostParams::default(), &crd)
                .await
                .with_context(|| format!("create CRD {name}"))?;
        }
        Some(existing) => {
            crd.metadata.resource_version = existing.metadata.resource_version;
            api.replace(&name, &PostParams::default(), &crd)
                .await
                .with_context(|| format!("replace CRD {name}"))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cel_rules_are_kept_from_1_25_on() {
        assert!(!cel_supported("1", "20"));
        assert!(!cel_supported("1", "24+"));
        assert!(cel_supported("1", "25"));
        assert!(cel_supported("1", "33+"));
        assert!(!cel_supported("", ""));
    }
}
