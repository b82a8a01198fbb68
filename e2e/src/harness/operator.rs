//! The operator as a process: `kvroute operator` authenticated as its service account with
//! the RBAC deploy/ ships (`install::operator_kubeconfig`), its own lease identity and an
//! admin port on 127.0.0.1 (`/healthz`, `/metrics`). k8s_rbac_audit.rs runs the shipped
//! Deployment itself, through the fake kubelet.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::sync::{Mutex, OnceCell};

use super::Cluster;
use super::install::operator_kubeconfig;
use crate::procs::{self, Child, SpawnOptions};

/// A running `kvroute operator`.
pub struct OperatorProcess {
    /// The process (killed when dropped).
    pub child: Child,
    /// Its lease identity (`--identity`).
    pub identity: String,
    /// Its admin address.
    pub admin: SocketAddr,
}

impl OperatorProcess {
    /// Starts `kvroute operator --identity <identity> --admin-addr 127.0.0.1:<free>
    /// --lease-namespace default <extra>` against `cluster` as the operator's service account,
    /// with the shipped RBAC and its Role granted in `default` and in any `--router-namespace`
    /// of `extra` (docs/security.md), and waits for `/healthz`. The log is
    /// `<cluster dir>/log/<name>.log`.
    pub async fn start(
        cluster: &Cluster,
        name: &str,
        identity: &str,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let mut args = vec!["--lease-namespace".to_string(), "default".to_string()];
        args.extend(extra.iter().cloned());
        let mut namespaces = vec!["default"];
        namespaces.extend(flag_values(extra, "--router-namespace"));
        let kubeconfig = operator_kubeconfig(cluster, &namespaces).await?;
        Self::start_as(cluster, &kubeconfig, name, identity, &args).await
    }

    /// [`OperatorProcess::start`] authenticated by `kubeconfig` (e.g. a service account's,
    /// [`Cluster::service_account_kubeconfig`]) and with no `--lease-namespace` of its own:
    /// the Lease goes to the kubeconfig's namespace unless `extra` names one.
    pub async fn start_as(
        cluster: &Cluster,
        kubeconfig: &std::path::Path,
        name: &str,
        identity: &str,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let admin = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), procs::free_local_port()?);
        let mut args = vec![
            "--identity".to_string(),
            identity.to_string(),
            "--admin-addr".to_string(),
            admin.to_string(),
        ];
        args.extend(extra.iter().cloned());
        let env = vec![
            ("KUBECONFIG".to_string(), kubeconfig.display().to_string()),
            (
                "RUST_LOG".to_string(),
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
            ),
        ];
        let log = Some(cluster.dir().join("log").join(format!("{name}.log")));
        let mut child = procs::spawn_kvroute(name, "operator", &args, &SpawnOptions { env, log })?;
        if let Some(pid) = child.id() {
            cluster.reaper().register(pid);
        }
        procs::wait_http_ok(
            &format!("http://{admin}/healthz"),
            Duration::from_secs(30),
            Some(&mut child),
        )
        .await?;
        Ok(Self {
            child,
            identity: identity.to_string(),
            admin,
        })
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        Ok(reqwest::get(format!("http://{}/metrics", self.admin))
            .await?
            .error_for_status()?
            .text()
            .await?)
    }

    /// The value of an unlabelled metric line `name <value>`, if present.
    pub async fn metric(&self, name: &str) -> anyhow::Result<Option<f64>> {
        let text = self.metrics().await?;
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok()))
    }

    /// Fails with the log tail when the process has exited or `/healthz` does not answer.
    pub async fn check_up(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            anyhow::bail!(
                "operator {} exited ({status}):\n{}",
                self.identity,
                self.child.log_tail(40)
            );
        }
        let url = format!("http://{}/healthz", self.admin);
        procs::wait_http_ok(&url, Duration::from_secs(5), Some(&mut self.child)).await
    }

    /// The log so far.
    pub fn log(&self) -> String {
        self.child
            .log_path()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }
}

/// The values `args` give `flag` (`--flag=value` or `--flag value`).
fn flag_values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == flag {
            if let Some(v) = it.next() {
                out.push(v.as_str());
            }
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            out.push(v);
        }
    }
    out
}

/// The shared cluster ([`Cluster::shared`]) with one operator (identity `op-shared`) running
/// against it, for every test of the binary. The operator dies with the test binary.
pub async fn shared_operator() -> anyhow::Result<(&'static Cluster, &'static Mutex<OperatorProcess>)>
{
    static OPERATOR: OnceCell<Mutex<OperatorProcess>> = OnceCell::const_new();
    let cluster = Cluster::shared().await?;
    let op = OPERATOR
        .get_or_try_init(|| async {
            let op = OperatorProcess::start(cluster, "operator-shared", "op-shared", &[]).await?;
            anyhow::Ok(Mutex::new(op))
        })
        .await?;
    Ok((cluster, op))
}
