//! What the fake kubelet runs for a Pod: a pure translation of the Pod spec into local process
//! launches (no I/O, so every rule is unit-tested).
//!
//! ```text
//! Pod spec + PodFacts (name, namespace, 127.0.0.N, node) + resolved Secret/ConfigMap keys
//!   -> per container: kvroute subcommand, args, env (downward API substituted, $(VAR)
//!      expanded, wildcard/loopback hosts rewritten to the pod's own address, test rewrites)
//!   -> readiness check (httpGet / tcpSocket probe, or "running")
//!   -> preStop hook (httpGet only: the images are distroless, an exec hook has no shell)
//! ```
//!
//! Every pod gets its own loopback address, so the container ports of the spec are kept as they
//! are: a client that found the pod through its `podIP` and a container port (the router, an
//! Endpoints reader) reaches the process that the fake kubelet started.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{Container, EnvVar, Pod, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The `kvroute` subcommands the fake kubelet knows how to run. `operator` is the operator's
/// Deployment (deploy/operator.yaml): its image's `kvroute-operator` binary is the code of
/// `kvroute operator`, with the same flags and environment variables.
pub const RUNNABLE: [&str; 4] = ["mock-vllm", "sidecar", "router", "operator"];

/// Image of harness self-tests: the container's `command` + `args` run as a plain program.
pub const EXEC_IMAGE: &str = "kvroute-e2e/exec";

/// The process a container becomes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Program {
    /// `kvroute <subcommand> <args>`.
    Kvroute(String),
    /// `<program> <args>` (only for [`EXEC_IMAGE`]).
    Exec(String),
}

/// Facts about the pod that the downward API exposes.
#[derive(Clone, Debug)]
pub struct PodFacts {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.uid`.
    pub uid: String,
    /// The loopback address the fake kubelet gave the pod (`status.podIP`).
    pub ip: Ipv4Addr,
    /// `spec.nodeName` (the fake node).
    pub node_name: String,
}

/// A key of a Secret or ConfigMap referenced by an env var (`secretKeyRef`, `configMapKeyRef`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyRef {
    /// `Secret` or `ConfigMap`.
    pub kind: &'static str,
    /// Object name (in the pod's namespace).
    pub name: String,
    /// Key inside `data`.
    pub key: String,
}

/// How the fake kubelet decides that a container is ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// `GET http://<podIP>:<port><path>` answers 2xx/3xx.
    Http {
        /// Resolved port number.
        port: u16,
        /// Request path.
        path: String,
    },
    /// A TCP connect to `<podIP>:<port>` succeeds.
    Tcp {
        /// Resolved port number.
        port: u16,
    },
    /// No probe the fake kubelet can run: ready while the process runs.
    Running,
}

/// One container as a local process.
#[derive(Clone, Debug)]
pub struct ContainerPlan {
    /// Container name.
    pub name: String,
    /// Image (reported back in `containerStatuses`).
    pub image: String,
    /// What runs.
    pub program: Program,
    /// Arguments after the subcommand or program.
    pub args: Vec<String>,
    /// Environment, downward API values substituted.
    pub env: Vec<(String, String)>,
    /// Readiness rule.
    pub readiness: Readiness,
    /// The preStop hook, run before SIGTERM when the pod terminates.
    pub pre_stop: Option<PreStop>,
}

/// A container's preStop hook, as the fake kubelet runs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreStop {
    /// `GET http://<podIP>:<port><path>`; the kubelet waits for the answer (within the grace).
    Http {
        /// Resolved port number.
        port: u16,
        /// Request path.
        path: String,
    },
    /// A hook the fake kubelet cannot run (`exec`): noted, then skipped.
    Unsupported(String),
}

/// The whole pod as local processes.
#[derive(Clone, Debug)]
pub struct PodPlan {
    /// One entry per container, in spec order.
    pub containers: Vec<ContainerPlan>,
    /// Every TCP port declared or probed, which must be free on the pod's address.
    pub ports: Vec<u16>,
}

/// Why a pod cannot run as local processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// A container whose image/command is not one of the `kvroute` subcommands.
    Unsupported {
        /// Container name.
        container: String,
        /// Its image.
        image: String,
    },
    /// A probe or env var names a port that the container does not declare.
    UnknownPort {
        /// Container name.
        container: String,
        /// The port name.
        port: String,
    },
    /// A Secret/ConfigMap key that env needs is missing (and not optional).
    MissingKey {
        /// Container name.
        container: String,
        /// Env var name.
        var: String,
        /// Secret or ConfigMap.
        kind: &'static str,
        /// Object name.
        name: String,
        /// Key.
        key: String,
    },
    /// The pod has no spec.
    NoSpec,
}

impl std::fmt::Display for PlanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unsupported { container, image } => write!(
                f,
                "container {container:?} (image {image:?}) is not a kvroute mock-vllm/sidecar/router/operator container; the fake kubelet runs only those"
            ),
            Self::UnknownPort { container, port } => {
                write!(f, "container {container:?}: unknown named port {port:?}")
            }
            Self::MissingKey {
                container,
                var,
                kind,
                name,
                key,
            } => {
                write!(
                    f,
                    "container {container:?}: env {var}: {kind} {name:?} has no key {key:?}"
                )
            }
            Self::NoSpec => write!(f, "pod has no spec"),
        }
    }
}

impl std::error::Error for PlanError {}

/// The Secret/ConfigMap keys that the pod's env refers to (the caller fetches them).
pub fn key_refs(pod: &Pod) -> Vec<KeyRef> {
    let mut out = Vec::new();
    let containers = pod.spec.iter().flat_map(|s| s.containers.iter());
    for var in containers.flat_map(|c| c.env.iter().flatten()) {
        let Some(from) = &var.value_from else {
            continue;
        };
        if let Some(s) = &from.secret_key_ref {
            out.push(KeyRef {
                kind: "Secret",
                name: s.name.clone(),
                key: s.key.clone(),
            });
        }
        if let Some(c) = &from.config_map_key_ref {
            out.push(KeyRef {
                kind: "ConfigMap",
                name: c.name.clone(),
                key: c.key.clone(),
            });
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Translates `pod` into processes. `keys` holds the values of [`key_refs`] that exist;
/// `rewrites` are (from, to) substring replacements applied last to args and env values (a
/// test maps a Service DNS name to the local address of the process that serves it).
pub fn plan_pod(
    pod: &Pod,
    facts: &PodFacts,
    keys: &BTreeMap<KeyRef, String>,
    rewrites: &[(String, String)],
) -> Result<PodPlan, PlanError> {
    let spec = pod.spec.as_ref().ok_or(PlanError::NoSpec)?;
    let mut containers = Vec::with_capacity(spec.containers.len());
    let mut ports = Vec::new();
    for c in &spec.containers {
        let (program, raw_args) = runnable(c).ok_or_else(|| PlanError::Unsupported {
            container: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
        })?;
        let env = container_env(pod, c, facts, keys)?;
        let args = raw_args
            .iter()
            .map(|a| rewrite(&rewrite_hosts(&expand(a, &env), facts.ip), rewrites))
            .collect();
        let env = env
            .into_iter()
            .map(|(k, v)| (k, rewrite(&rewrite_hosts(&v, facts.ip), rewrites)))
            .collect();
        let readiness = readiness(c, c.readiness_probe.as_ref())?;
        let pre_stop = pre_stop(c)?;
        ports.extend(
            c.ports
                .iter()
                .flatten()
                .map(|p| p.container_port)
                .filter_map(|p| u16::try_from(p).ok()),
        );
        if let Readiness::Http { port, .. } | Readiness::Tcp { port } = readiness {
            ports.push(port);
        }
        containers.push(ContainerPlan {
            name: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            program,
            args,
            env,
            readiness,
            pre_stop,
        });
    }
    ports.sort_unstable();
    ports.dedup();
    Ok(PodPlan { containers, ports })
}

/// The `kvroute` subcommand and its arguments, from `command` + `args`, or from the image name
/// when the container relies on the image's entrypoint.
fn runnable(c: &Container) -> Option<(Program, Vec<String>)> {
    if c.image.as_deref() == Some(EXEC_IMAGE) {
        let mut tokens = c
            .command
            .iter()
            .flatten()
            .chain(c.args.iter().flatten())
            .cloned();
        let program = tokens.next()?;
        return Some((Program::Exec(program), tokens.collect()));
    }
    let sub = |s: &str| Program::Kvroute(s.to_string());
    let tokens: Vec<&String> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .collect();
    for (i, t) in tokens.iter().enumerate() {
        let base = t.rsplit('/').next().unwrap_or(t);
        if base == "kvroute"
            && let Some(next) = tokens.get(i + 1)
            && RUNNABLE.contains(&next.as_str())
        {
            return Some((
                sub(next),
                tokens[i + 2..].iter().map(|s| s.to_string()).collect(),
            ));
        }
        if let Some(name) = base.strip_prefix("kvroute-")
            && RUNNABLE.contains(&name)
        {
            return Some((
                sub(name),
                tokens[i + 1..].iter().map(|s| s.to_string()).collect(),
            ));
        }
    }
    if c.command.as_ref().is_some_and(|cmd| !cmd.is_empty()) {
        return None;
    }
    // Entrypoint of the image: guess the component from the image's repository name.
    let image = c.image.as_deref().unwrap_or_default();
    let repo = image.rsplit('/').next().unwrap_or(image);
    let repo = repo.split([':', '@']).next().unwrap_or(repo);
    let name = if repo.contains("mock-vllm") || repo.contains("mock-worker") {
        "mock-vllm"
    } else if repo.contains("sidecar") {
        "sidecar"
    } else if repo.contains("router") {
        "router"
    } else {
        return None;
    };
    Some((sub(name), c.args.clone().unwrap_or_default()))
}

fn container_env(
    pod: &Pod,
    c: &Container,
    facts: &PodFacts,
    keys: &BTreeMap<KeyRef, String>,
) -> Result<Vec<(String, String)>, PlanError> {
    let mut env: Vec<(String, String)> = Vec::new();
    for EnvVar {
        name,
        value,
        value_from,
    } in c.env.iter().flatten()
    {
        let v = match (value, value_from) {
            (Some(v), _) => expand(v, &env),
            (None, None) => String::new(),
            (None, Some(from)) => {
                if let Some(f) = &from.field_ref {
                    field_value(pod, &f.field_path, facts)
                } else if let Some(r) = &from.resource_field_ref {
                    resource_value(pod, c, &r.resource, r.container_name.as_deref())
                } else {
                    let (kind, name_, key, optional) = if let Some(s) = &from.secret_key_ref {
                        (
                            "Secret",
                            s.name.clone(),
                            s.key.clone(),
                            s.optional.unwrap_or(false),
                        )
                    } else if let Some(m) = &from.config_map_key_ref {
                        (
                            "ConfigMap",
                            m.name.clone(),
                            m.key.clone(),
                            m.optional.unwrap_or(false),
                        )
                    } else {
                        continue;
                    };
                    match keys.get(&KeyRef {
                        kind,
                        name: name_.clone(),
                        key: key.clone(),
                    }) {
                        Some(v) => v.clone(),
                        None if optional => continue,
                        None => {
                            return Err(PlanError::MissingKey {
                                container: c.name.clone(),
                                var: name.clone(),
                                kind,
                                name: name_,
                                key,
                            });
                        }
                    }
                }
            }
        };
        env.retain(|(k, _)| k != name);
        env.push((name.clone(), v));
    }
    Ok(env)
}

/// The downward-API value of `path` (`metadata.name`, `status.podIP`, `metadata.labels['k']`, ...).
fn field_value(pod: &Pod, path: &str, facts: &PodFacts) -> String {
    let meta = &pod.metadata;
    let lookup = |map: &Option<BTreeMap<String, String>>, key: &str| {
        map.as_ref()
            .and_then(|m| m.get(key))
            .cloned()
            .unwrap_or_default()
    };
    let bracket = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("['"))
            .and_then(|rest| rest.strip_suffix("']"))
            .map(str::to_string)
    };
    match path {
        "metadata.name" => facts.name.clone(),
        "metadata.namespace" => facts.namespace.clone(),
        "metadata.uid" => facts.uid.clone(),
        "status.podIP" | "status.podIPs" | "status.hostIP" | "status.hostIPs" => {
            facts.ip.to_string()
        }
        "spec.nodeName" => facts.node_name.clone(),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
        _ => {
            if let Some(k) = bracket("metadata.labels") {
                lookup(&meta.labels, &k)
            } else if let Some(k) = bracket("metadata.annotations") {
                lookup(&meta.annotations, &k)
            } else {
                String::new()
            }
        }
    }
}

/// `resourceFieldRef`: the quantity from the (named) container's resources, or "0".
fn resource_value(pod: &Pod, c: &Container, resource: &str, container: Option<&str>) -> String {
    let target = match container.filter(|n| !n.is_empty()) {
        Some(n) => pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().find(|x| x.name == n))
            .unwrap_or(c),
        None => c,
    };
    let Some((kind, name)) = resource.split_once('.') else {
        return "0".into();
    };
    let res = target.resources.as_ref();
    let map = match kind {
        "limits" => res.and_then(|r| r.limits.as_ref()),
        "requests" => res.and_then(|r| r.requests.as_ref()),
        _ => None,
    };
    map.and_then(|m| m.get(name))
        .map(|q| q.0.clone())
        .unwrap_or_else(|| "0".into())
}

/// Kubernetes `$(VAR)` expansion: known variables are replaced, `$$` escapes `$`, unknown
/// references stay as written.
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match env.iter().rev().find(|(k, _)| k == name) {
                Some((_, v)) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Wildcard and loopback hosts become the pod's own address: in a real pod they mean "this
/// pod's network namespace", which here is `ip`.
///
/// A ZMQ `tcp://*:N` becomes `tcp://[::ffff:<ip>]:N`, the IPv4-mapped IPv6 form of the pod
/// address: vLLM (and the mock) bind an endpoint only when it contains `*` or `::` and connect
/// otherwise, so the plain `tcp://<ip>:N` would turn a publisher that binds into one that
/// connects. The mapped address keeps the bind and still accepts IPv4 clients on `<ip>:N`.
pub fn rewrite_hosts(s: &str, ip: Ipv4Addr) -> String {
    let ip = ip.to_string();
    s.replace("tcp://*:", &format!("tcp://[::ffff:{ip}]:"))
        .replace("[::]", &ip)
        .replace("0.0.0.0", &ip)
        .replace("127.0.0.1", &ip)
        .replace("localhost", &ip)
}

/// Applies `rewrites` in one pass: at each position the first rule that matches is replaced
/// and the scan continues after it, so what a rule wrote is never rewritten again (a local
/// directory that still contains the mount path it stands for stays as written).
pub fn rewrite(s: &str, rewrites: &[(String, String)]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    'scan: while let Some(c) = rest.chars().next() {
        for (from, to) in rewrites {
            if !from.is_empty()
                && let Some(after) = rest.strip_prefix(from.as_str())
            {
                out.push_str(to);
                rest = after;
                continue 'scan;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

fn readiness(c: &Container, probe: Option<&Probe>) -> Result<Readiness, PlanError> {
    let Some(probe) = probe else {
        return Ok(Readiness::Running);
    };
    if let Some(h) = &probe.http_get {
        let port = resolve_port(c, &h.port)?;
        let path = h.path.clone().unwrap_or_else(|| "/".into());
        return Ok(Readiness::Http { port, path });
    }
    if let Some(t) = &probe.tcp_socket {
        return Ok(Readiness::Tcp {
            port: resolve_port(c, &t.port)?,
        });
    }
    Ok(Readiness::Running)
}

fn pre_stop(c: &Container) -> Result<Option<PreStop>, PlanError> {
    let Some(hook) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) else {
        return Ok(None);
    };
    if let Some(h) = &hook.http_get {
        let port = resolve_port(c, &h.port)?;
        let path = h.path.clone().unwrap_or_else(|| "/".into());
        return Ok(Some(PreStop::Http { port, path }));
    }
    let kind = if hook.exec.is_some() {
        "exec"
    } else if hook.tcp_socket.is_some() {
        "tcpSocket"
    } else {
        "empty"
    };
    Ok(Some(PreStop::Unsupported(kind.to_string())))
}

fn resolve_port(c: &Container, port: &IntOrString) -> Result<u16, PlanError> {
    let unknown = |p: String| PlanError::UnknownPort {
        container: c.name.clone(),
        port: p,
    };
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| unknown(n.to_string())),
        IntOrString::String(name) => {
            if let Ok(n) = name.parse::<u16>() {
                return Ok(n);
            }
            c.ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| unknown(name.clone()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn facts() -> PodFacts {
        PodFacts {
            name: "ws-abc-1".into(),
            namespace: "team-a".into(),
            uid: "u-1".into(),
            ip: Ipv4Addr::new(127, 0, 0, 7),
            node_name: "fake-node".into(),
        }
    }

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).expect("test pod")
    }

    fn mock_pod() -> Pod {
        pod(json!({
            "metadata": {"name": "ws-abc-1", "namespace": "team-a", "labels": {"app": "ws"}},
            "spec": {"containers": [
                {"name": "engine", "image": "ghcr.io/kvroute/mock-vllm:0.1",
                 "args": ["--host", "0.0.0.0", "--port", "8000", "--kv-events-endpoint", "tcp://*:5557"],
                 "ports": [{"name": "http", "containerPort": 8000}, {"containerPort": 5557}],
                 "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
                 "lifecycle": {"preStop": {"httpGet": {"path": "/drain", "port": "http"}}}},
                {"name": "sidecar", "image": "ghcr.io/kvroute/kvroute:0.1",
                 "command": ["/usr/local/bin/kvroute", "sidecar"],
                 "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
                 "args": ["--worker-id", "$(POD_NAME)", "--vllm-url", "http://localhost:8000", "--router", "kvroute-router.team-a.svc:9000"],
                 "env": [
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                    {"name": "ADDR", "value": "$(POD_IP):8000"},
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}}
                 ]}
            ]}
        }))
    }

    #[test]
    fn mock_worker_and_sidecar_become_local_processes() {
        let keys = BTreeMap::from([(
            KeyRef {
                kind: "Secret",
                name: "s".into(),
                key: "token".into(),
            },
            "t0k".into(),
        )]);
        let rewrites = vec![(
            "kvroute-router.team-a.svc:9000".to_string(),
            "127.0.0.1:4242".to_string(),
        )];
        let plan = plan_pod(&mock_pod(), &facts(), &keys, &rewrites).expect("plan");
        let [engine, sidecar] = &plan.containers[..] else {
            panic!("two containers")
        };
        assert_eq!(engine.program, Program::Kvroute("mock-vllm".into()));
        assert_eq!(
            engine.args,
            [
                "--host",
                "127.0.0.7",
                "--port",
                "8000",
                "--kv-events-endpoint",
                "tcp://[::ffff:127.0.0.7]:5557"
            ]
        );
        assert_eq!(
            engine.readiness,
            Readiness::Http {
                port: 8000,
                path: "/health".into()
            }
        );
        assert_eq!(sidecar.program, Program::Kvroute("sidecar".into()));
        assert_eq!(
            sidecar.args,
            [
                "--worker-id",
                "ws-abc-1",
                "--vllm-url",
                "http://127.0.0.7:8000",
                "--router",
                "127.0.0.1:4242"
            ]
        );
        let env: BTreeMap<_, _> = sidecar.env.iter().cloned().collect();
        assert_eq!(env["POD_IP"], "127.0.0.7");
        assert_eq!(env["NS"], "team-a");
        assert_eq!(env["APP"], "ws");
        assert_eq!(env["ADDR"], "127.0.0.7:8000");
        assert_eq!(env["TOKEN"], "t0k");
        assert_eq!(sidecar.readiness, Readiness::Running);
        assert_eq!(
            engine.pre_stop,
            Some(PreStop::Http {
                port: 8000,
                path: "/drain".into()
            })
        );
        assert_eq!(sidecar.pre_stop, Some(PreStop::Unsupported("exec".into())));
        assert_eq!(plan.ports, [5557, 8000]);
    }

    #[test]
    fn missing_secret_key_is_an_error_unless_optional() {
        let err = plan_pod(&mock_pod(), &facts(), &BTreeMap::new(), &[]).expect_err("missing key");
        assert!(
            matches!(err, PlanError::MissingKey { ref key, .. } if key == "token"),
            "{err}"
        );
        assert_eq!(
            key_refs(&mock_pod()),
            [KeyRef {
                kind: "Secret",
                name: "s".into(),
                key: "token".into()
            }]
        );
    }

    #[test]
    fn gpu_vllm_container_is_unsupported() {
        let p = pod(json!({"metadata": {"name": "x"}, "spec": {"containers": [
            {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0", "args": ["--model", "Qwen/Qwen3-8B"]}
        ]}}));
        let err = plan_pod(&p, &facts(), &BTreeMap::new(), &[]).expect_err("unsupported");
        assert_eq!(
            err,
            PlanError::Unsupported {
                container: "vllm".into(),
                image: "vllm/vllm-openai:v0.11.0".into()
            }
        );
        assert!(err.to_string().contains("vllm/vllm-openai"));
    }

    #[test]
    fn command_forms() {
        let c =
            |v: serde_json::Value| -> Container { serde_json::from_value(v).expect("container") };
        let r = runnable(&c(
            json!({"name": "a", "command": ["kvroute-router"], "args": ["--x"]}),
        ));
        assert_eq!(
            r,
            Some((Program::Kvroute("router".into()), vec!["--x".into()]))
        );
        // The operator's Deployment names its binary (deploy/operator.yaml).
        let r = runnable(&c(
            json!({"name": "operator", "image": "ghcr.io/kvroute/kvroute-operator:0.1.0",
                   "command": ["kvroute-operator"]}),
        ));
        assert_eq!(r, Some((Program::Kvroute("operator".into()), vec![])));
        let r = runnable(&c(
            json!({"name": "a", "image": "kvroute:1", "args": ["kvroute", "mock-vllm", "--p"]}),
        ));
        assert_eq!(
            r,
            Some((Program::Kvroute("mock-vllm".into()), vec!["--p".into()]))
        );
        assert_eq!(
            runnable(&c(
                json!({"name": "a", "image": "busybox", "command": ["sh"]})
            )),
            None
        );
        let r = runnable(&c(
            json!({"name": "a", "image": "r.io/kvroute-sidecar@sha256:00"}),
        ));
        assert_eq!(r, Some((Program::Kvroute("sidecar".into()), vec![])));
        let r = runnable(&c(
            json!({"name": "a", "image": EXEC_IMAGE, "command": ["sleep"], "args": ["9"]}),
        ));
        assert_eq!(r, Some((Program::Exec("sleep".into()), vec!["9".into()])));
    }

    #[test]
    fn expansion_follows_kubernetes_rules() {
        let env = vec![("A".to_string(), "1".to_string())];
        assert_eq!(expand("x$(A)y", &env), "x1y");
        assert_eq!(expand("$$(A)", &env), "$(A)");
        assert_eq!(expand("$(B)", &env), "$(B)");
        assert_eq!(expand("$(A", &env), "$(A");
        assert_eq!(expand("a$", &env), "a$");
    }

    #[test]
    fn named_probe_port_must_exist() {
        let p = pod(json!({"metadata": {"name": "x"}, "spec": {"containers": [
            {"name": "e", "image": "mock-vllm", "readinessProbe": {"tcpSocket": {"port": "nope"}}}
        ]}}));
        let err = plan_pod(&p, &facts(), &BTreeMap::new(), &[]).expect_err("unknown port");
        assert!(matches!(err, PlanError::UnknownPort { .. }));
    }

    #[test]
    fn rewrites_apply_once_so_a_local_path_keeps_the_mount_path_it_contains() {
        let rules = vec![
            (
                "/var/run/kvroute".to_string(),
                "/tmp/p/var/run/kvroute".to_string(),
            ),
            ("/run/kvroute".to_string(), "/tmp/p/run/kvroute".to_string()),
        ];
        assert_eq!(
            rewrite(
                "--secrets-dir=/var/run/kvroute/secrets /run/kvroute/gpu",
                &rules
            ),
            "--secrets-dir=/tmp/p/var/run/kvroute/secrets /tmp/p/run/kvroute/gpu"
        );
        assert_eq!(rewrite("", &rules), "");
        assert_eq!(rewrite("é/run/kvroute", &rules), "é/tmp/p/run/kvroute");
    }
}
