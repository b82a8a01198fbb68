//! The single source of truth for RBAC: what the operator calls and what the router it deploys
//! reads. `kvroute crdgen` turns these into the CSV's `clusterPermissions`/`permissions` and into
//! `deploy/rbac.yaml`; the operator turns [`ROUTER_RULES`] into the router's Role or
//! ClusterRole. Two tests hold the rules to what the code does:
//!
//! ```text
//! operator/tests/controller.rs   every request the reconcilers make (mocked API) is allowed
//! e2e/tests/k8s_rbac_audit.rs    the operator and router run as their service accounts against
//!                                a real API server with an audit log: no request is refused,
//!                                and every grant is used or listed in [`NOT_EXERCISED`]
//! ```
//!
//! Least privilege, by rule: the router only lists and watches what discovery reads (no
//! Secrets: tokenizer tokens are mounted files); the operator never lists or watches Secrets,
//! and writes to RBAC objects only by name ([`ROUTER_NAME`]), so it can neither rewrite another
//! ClusterRole nor bind one to somebody else.

use k8s_openapi::api::rbac::v1::PolicyRule;

/// Name of every object the operator writes for the router: ServiceAccount, Role, RoleBinding,
/// ClusterRole, ClusterRoleBinding, Deployment, Service. Fixed, so RBAC can name it: one
/// cluster-wide installation per cluster (two would reconcile the same resources anyway).
pub const ROUTER_NAME: &str = "kvroute-router";
/// Name of the operator's leader-election Lease (`--lease-name`; the Role names it, so a
/// different name needs an edited Role).
pub const LEASE_NAME: &str = "kvroute-operator";
/// The Secret holding the operator's CA, in the operator's namespace.
pub const CA_SECRET: &str = crate::pki::CA_SECRET;
/// The Secret holding the workload certificates and the admin token, one per namespace.
pub const MTLS_SECRET: &str = crate::pki::MTLS_SECRET;

/// One RBAC rule and why it exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// API groups (`""` is core).
    pub api_groups: &'static [&'static str],
    /// Resources (with `/subresource` where needed).
    pub resources: &'static [&'static str],
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// `resourceNames`: the only objects the rule applies to; empty means any name.
    pub names: &'static [&'static str],
    /// Why the component needs it (rendered into docs/security.md's grant table).
    pub why: &'static str,
}

/// Every kvroute kind.
pub const KVROUTE_RESOURCES: &[&str] = &[
    "inferenceworkersets",
    "inferencepools",
    "inferencepolicies",
    "inferenceproviders",
    "gatewaybackends",
];

/// What the operator needs wherever it watches (a ClusterRole: WorkerSets, and so their
/// Deployments, Services and NetworkPolicies, live in any namespace).
pub const OPERATOR_RULES: &[Rule] = &[
    Rule {
        api_groups: &["kvroute.dev"],
        resources: KVROUTE_RESOURCES,
        verbs: &["list", "watch"],
        names: &[],
        why: "one controller per kind watches it; Pools also watch WorkerSets and Providers, \
              Providers watch GatewayBackends",
    },
    Rule {
        api_groups: GIE_POOLS_READ.api_groups,
        resources: GIE_POOLS_READ.resources,
        verbs: GIE_POOLS_READ.verbs,
        names: &[],
        why: "held only to grant it: the router's Role/ClusterRole reads GIE InferencePools \
              (RBAC refuses to grant what the granter lacks); the operator never calls it",
    },
    Rule {
        api_groups: &["kvroute.dev"],
        resources: &[
            "inferenceworkersets/status",
            "inferencepools/status",
            "inferencepolicies/status",
            "inferenceproviders/status",
            "gatewaybackends/status",
        ],
        verbs: &["patch"],
        names: &[],
        why: "status is written by server-side apply on the status subresource",
    },
    Rule {
        api_groups: &["apps"],
        resources: &["deployments"],
        verbs: &["get", "list", "watch", "create", "patch"],
        names: &[],
        why: "worker and router Deployments (server-side apply; create when apply makes one); \
              watched as children; read back when a WorkerSet's spec is invalid",
    },
    Rule {
        api_groups: &[""],
        resources: &["services"],
        verbs: &["list", "watch", "create", "patch"],
        names: &[],
        why: "worker headless Services and the router's Services (server-side apply), watched \
              as children",
    },
    Rule {
        api_groups: &["networking.k8s.io"],
        resources: &["networkpolicies"],
        verbs: &["create", "patch"],
        names: &[],
        why: "one NetworkPolicy per WorkerSet and one for the router (server-side apply); never \
              read back",
    },
    Rule {
        api_groups: &[""],
        resources: &["pods"],
        verbs: &["list", "watch"],
        names: &[],
        why: "worker pods: their readiness is the WorkerSet's status",
    },
    Rule {
        api_groups: &[""],
        resources: &["secrets"],
        verbs: &["get", "patch"],
        names: &[CA_SECRET, MTLS_SECRET],
        why: "certificate issuance (--mtls): the CA and the per-namespace certificate \
              Secrets, read and rewritten by name only",
    },
    Rule {
        api_groups: &[""],
        resources: &["secrets"],
        verbs: &["create"],
        names: &[],
        why: "certificate issuance (--mtls) creates kvroute-ca and kvroute-mtls: a create \
              request names no existing object, so resourceNames cannot narrow it",
    },
    Rule {
        api_groups: &["cert-manager.io"],
        resources: &["certificates"],
        verbs: &["get", "create", "patch"],
        names: &[],
        why: "cert-manager mode (a Pool's spec.tls.issuerRef): one Certificate per identity, \
              server-side applied and read back for the Pool's TransportSecurity condition",
    },
    Rule {
        api_groups: &["rbac.authorization.k8s.io"],
        resources: &["clusterroles", "clusterrolebindings"],
        verbs: &["create", "patch"],
        names: &[ROUTER_NAME],
        why: "the router's read-only ClusterRole and its binding when watching all namespaces; \
              by name only (server-side apply names the object even when it creates it)",
    },
    Rule {
        api_groups: &["rbac.authorization.k8s.io"],
        resources: &["roles", "rolebindings"],
        verbs: &["create", "patch"],
        names: &[ROUTER_NAME],
        why: "the router's read-only Role and its binding in the watched namespace \
              (`--namespace` set); by name only",
    },
    Rule {
        api_groups: &["events.k8s.io"],
        resources: &["events"],
        verbs: &["create", "patch"],
        names: &[],
        why: "Events on condition changes; a repeated Event is patched (its series count)",
    },
];

/// What the operator needs in its own namespace only (a Role): the leader-election Lease and
/// the router's ServiceAccount (the router runs in the operator's namespace unless
/// `--router-namespace` says otherwise; then grant these there too).
pub const OPERATOR_NAMESPACE_RULES: &[Rule] = &[
    Rule {
        api_groups: &["coordination.k8s.io"],
        resources: &["leases"],
        verbs: &["get", "update"],
        names: &[LEASE_NAME],
        why: "leader election: read and renew (or take over) the one Lease",
    },
    Rule {
        api_groups: &["coordination.k8s.io"],
        resources: &["leases"],
        verbs: &["create"],
        names: &[],
        why: "leader election: the first replica creates the Lease (a POST names no existing \
              object, so resourceNames cannot narrow it)",
    },
    Rule {
        api_groups: &[""],
        resources: &["serviceaccounts"],
        verbs: &["create", "patch"],
        names: &[ROUTER_NAME],
        why: "the router's ServiceAccount (server-side apply)",
    },
    Rule {
        api_groups: &[""],
        resources: &["secrets"],
        verbs: &["get"],
        names: &[],
        why: "the Secrets that pools, policies and GatewayBackends name for the router (API \
              keys, JWKS, backend credentials and CAs, the gateway's TLS Secret) live in the \
              router's namespace under user-chosen names, so no role can name them: the \
              operator gets each by name there to report ResolvedRefs and SecretsMounted and \
              keeps only the key names (and a pool's public JWKS); never list or watch, and no \
              Secret of any other namespace",
    },
];

/// What the router reads: the WorkerSets and Pools discovery lists and watches, the policies,
/// providers and backends it enforces, and the worker pods. Nothing else, and never a write.
/// No Secrets: tokenizer tokens, API keys, JWKS and backend credentials are mounted files
/// (`desired::secrets`).
pub const ROUTER_RULES: &[Rule] = &[
    Rule {
        api_groups: &["kvroute.dev"],
        resources: &["inferenceworkersets", "inferencepools"],
        verbs: &["list", "watch"],
        names: &[],
        why: "discovery: models, block sizes, tokenizer sources and pool aliases",
    },
    Rule {
        api_groups: &["kvroute.dev"],
        resources: &["inferencepolicies", "inferenceproviders", "gatewaybackends"],
        verbs: &["list", "watch"],
        names: &[],
        why: "enforcement: policy rules, overflow providers and the backends that reach them, \
              hot-reloaded from the watch (their Secrets are mounted, never read here)",
    },
    Rule {
        api_groups: &[""],
        resources: &["pods"],
        verbs: &["list", "watch"],
        names: &[],
        why: "discovery: worker pods (addresses, readiness)",
    },
    GIE_POOLS_READ,
];

/// Reading Gateway API Inference Extension InferencePools (`--gie-inference-pool`). Granted
/// whether or not the feature is on: the rule is part of the static RBAC (`deploy/rbac.yaml`,
/// the bundle) the operator must hold to grant it, and read access to pool specs (selectors,
/// ports, the picker's Service name) discloses nothing secret; RBAC accepts rules for a CRD
/// that is not installed.
pub const GIE_POOLS_READ: Rule = Rule {
    api_groups: &["inference.networking.k8s.io"],
    resources: &["inferencepools"],
    verbs: &["list", "watch"],
    names: &[],
    why: "discovery from Gateway API Inference Extension InferencePools (their selected pods \
          join the worker table); read-only, used only with --gie-inference-pool",
};

/// Grants the audit test's scenario does not exercise, with the reason each stays.
/// (component, group, resource, verb, reason); component is `operator` or `router`.
pub const NOT_EXERCISED: &[(&str, &str, &str, &str, &str)] = &[
    (
        "operator",
        "cert-manager.io",
        "certificates",
        "get",
        "cert-manager mode only; the audit scenario uses the operator's own CA",
    ),
    (
        "operator",
        "cert-manager.io",
        "certificates",
        "create",
        "cert-manager mode only; the audit scenario uses the operator's own CA",
    ),
    (
        "operator",
        "cert-manager.io",
        "certificates",
        "patch",
        "cert-manager mode only; the audit scenario uses the operator's own CA",
    ),
    (
        "operator",
        "inference.networking.k8s.io",
        "inferencepools",
        "list",
        "held only to grant it to the router",
    ),
    (
        "operator",
        "inference.networking.k8s.io",
        "inferencepools",
        "watch",
        "held only to grant it to the router",
    ),
    (
        "router",
        "inference.networking.k8s.io",
        "inferencepools",
        "list",
        "only with --gie-inference-pool; the audit scenario runs the router without it",
    ),
    (
        "router",
        "inference.networking.k8s.io",
        "inferencepools",
        "watch",
        "only with --gie-inference-pool; the audit scenario runs the router without it",
    ),
    (
        "operator",
        "events.k8s.io",
        "events",
        "patch",
        "only when the same Event repeats within the recorder's cache window",
    ),
];

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// As Kubernetes PolicyRules.
pub fn policy_rules(rules: &[Rule]) -> Vec<PolicyRule> {
    rules
        .iter()
        .map(|r| PolicyRule {
            api_groups: Some(strings(r.api_groups)),
            resources: Some(strings(r.resources)),
            verbs: strings(r.verbs),
            resource_names: (!r.names.is_empty()).then(|| strings(r.names)),
            ..Default::default()
        })
        .collect()
}

/// True when `rules` allow `verb` on `group`/`resource`, for the object `name` (`None`: a
/// request that names no object, such as list, watch or a POST create).
pub fn allows(rules: &[Rule], group: &str, resource: &str, verb: &str, name: Option<&str>) -> bool {
    rules.iter().any(|r| {
        r.api_groups.contains(&group)
            && r.resources.contains(&resource)
            && r.verbs.contains(&verb)
            && (r.names.is_empty() || name.is_some_and(|n| r.names.contains(&n)))
    })
}

/// Every (group, resource, verb) that `rules` grant, in rule order, without repeats.
pub fn grants(rules: &[Rule]) -> Vec<(&'static str, &'static str, &'static str)> {
    let mut out = Vec::new();
    for r in rules {
        for g in r.api_groups {
            for res in r.resources {
                for v in r.verbs {
                    if !out.contains(&(*g, *res, *v)) {
                        out.push((*g, *res, *v));
                    }
                }
            }
        }
    }
    out
}

/// The grant table of docs/security.md ("Least privilege"), rendered from the rules so the
/// two cannot drift (a test compares them).
pub fn grant_table_markdown() -> String {
    let mut out = String::from(
        "| Who | Scope | API group | Resources | Verbs | Names | Why |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let sets: [(&str, &str, &[Rule]); 3] = [
        ("operator", "cluster", OPERATOR_RULES),
        ("operator", "own namespace", OPERATOR_NAMESPACE_RULES),
        ("router", "watched namespace(s)", ROUTER_RULES),
    ];
    for (who, scope, rules) in sets {
        for r in rules {
            let group = r.api_groups.join(", ");
            let names = if r.names.is_empty() {
                "any".to_string()
            } else {
                r.names.join(", ")
            };
            out.push_str(&format!(
                "| {who} | {scope} | {} | {} | {} | {names} | {} |\n",
                if group.is_empty() { "core" } else { &group },
                r.resources.join(", "),
                r.verbs.join(", "),
                r.why.split_whitespace().collect::<Vec<_>>().join(" "),
            ));
        }
    }
    out
}

/// The [`NOT_EXERCISED`] table of docs/security.md, rendered the same way.
pub fn not_exercised_markdown() -> String {
    let mut out = String::from(
        "| Who | Verb | Resource | Why the audit run does not use it |\n|---|---|---|---|\n",
    );
    for (who, g, res, v, why) in NOT_EXERCISED {
        let group = if g.is_empty() { "core" } else { g };
        out.push_str(&format!("| {who} | {v} | {group}/{res} | {why} |\n"));
    }
    out
}

/// The Kubernetes verb of a request, from its method and whether it names one object.
pub fn verb_of(method: &str, named: bool, watch: bool) -> &'static str {
    match (method, named, watch) {
        (_, _, true) => "watch",
        ("GET", true, _) => "get",
        ("GET", false, _) => "list",
        ("POST", _, _) => "create",
        ("PUT", _, _) => "update",
        ("PATCH", _, _) => "patch",
        ("DELETE", true, _) => "delete",
        ("DELETE", false, _) => "deletecollection",
        _ => "unknown",
    }
}

/// A resource request path, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiPath {
    /// API group (`""` is core).
    pub group: String,
    /// Resource, with `/subresource` when there is one.
    pub resource: String,
    /// Namespace, for namespaced requests.
    pub namespace: Option<String>,
    /// The object's name, when the path names one.
    pub name: Option<String>,
}

/// Parses a request path: `/api/v1/namespaces/ns/pods/x`,
/// `/apis/apps/v1/namespaces/ns/deployments/x/status`, cluster-scoped forms too.
pub fn parse_path(path: &str) -> Option<ApiPath> {
    let path = path.split('?').next().unwrap_or_default();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match *parts.first()? {
        "api" => ("", parts.get(2..)?),
        "apis" => (*parts.get(1)?, parts.get(3..)?),
        _ => return None,
    };
    // `namespaces/<ns>/<resource>...`; a bare `namespaces/<ns>` is the Namespace itself.
    let (namespace, rest) = if rest.first() == Some(&"namespaces") && rest.len() > 2 {
        (Some(rest[1].to_string()), &rest[2..])
    } else {
        (None, rest)
    };
    let resource = rest.first()?.to_string();
    let resource = match rest.get(2) {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource,
    };
    Some(ApiPath {
        group: group.to_string(),
        resource,
        namespace,
        name: rest.get(1).map(|n| n.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_rules_are_a_read_only_subset_of_the_operators() {
        for (g, res, v) in grants(ROUTER_RULES) {
            assert!(["get", "list", "watch"].contains(&v), "router must not {v}");
            // RBAC refuses to grant what the granter lacks.
            assert!(
                allows(OPERATOR_RULES, g, res, v, None),
                "operator cannot grant {v} {g}/{res}"
            );
        }
    }

    #[test]
    fn no_secret_is_listed_watched_or_readable_by_the_router() {
        for (g, res, v) in grants(ROUTER_RULES) {
            assert!(!(g.is_empty() && res == "secrets"), "router {v} secrets");
        }
        for rules in [OPERATOR_RULES, OPERATOR_NAMESPACE_RULES] {
            for v in ["list", "watch", "delete", "deletecollection"] {
                assert!(
                    !allows(rules, "", "secrets", v, None),
                    "operator {v} secrets"
                );
            }
            // Writes reach only the two Secrets the operator owns.
            for v in ["update", "patch"] {
                assert!(!allows(rules, "", "secrets", v, Some("user-secret")));
            }
        }
        assert!(allows(
            OPERATOR_RULES,
            "",
            "secrets",
            "patch",
            Some(MTLS_SECRET)
        ));
    }

    #[test]
    fn rbac_writes_are_limited_to_the_routers_objects() {
        let rbac = "rbac.authorization.k8s.io";
        for res in [
            "clusterroles",
            "clusterrolebindings",
            "roles",
            "rolebindings",
        ] {
            for v in ["create", "patch"] {
                assert!(allows(OPERATOR_RULES, rbac, res, v, Some(ROUTER_NAME)));
                assert!(!allows(OPERATOR_RULES, rbac, res, v, Some("cluster-admin")));
                assert!(!allows(OPERATOR_RULES, rbac, res, v, None));
            }
            for v in ["update", "delete", "escalate", "bind", "list", "watch"] {
                assert!(
                    !allows(OPERATOR_RULES, rbac, res, v, Some(ROUTER_NAME)),
                    "{v} {res}"
                );
            }
        }
        // The rendered rules carry the names.
        let rendered = policy_rules(OPERATOR_RULES);
        assert!(rendered.iter().any(|r| {
            r.resources.as_deref()
                == Some(
                    &[
                        "clusterroles".to_string(),
                        "clusterrolebindings".to_string(),
                    ][..],
                )
                && r.resource_names.as_deref() == Some(&[ROUTER_NAME.to_string()][..])
        }));
    }

    #[test]
    fn every_not_exercised_entry_is_a_grant() {
        for (who, g, res, v, why) in NOT_EXERCISED {
            let rules: Vec<Rule> = match *who {
                "operator" => [OPERATOR_RULES, OPERATOR_NAMESPACE_RULES].concat(),
                "router" => ROUTER_RULES.to_vec(),
                other => panic!("unknown component {other}"),
            };
            assert!(
                grants(&rules).contains(&(g, res, v)),
                "{who} {v} {g}/{res} is not granted"
            );
            assert!(!why.is_empty());
        }
    }

    #[test]
    fn docs_security_md_carries_the_rendered_tables() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/security.md");
        let doc = std::fs::read_to_string(path).expect("docs/security.md");
        for table in [grant_table_markdown(), not_exercised_markdown()] {
            assert!(
                doc.contains(&table),
                "docs/security.md lacks this table (paste it in):\n{table}"
            );
        }
    }

    #[test]
    fn paths_parse_into_group_resource_namespace_and_name() {
        let p = parse_path("/api/v1/namespaces/a/pods?labelSelector=x").expect("parses");
        assert_eq!(
            (
                p.group.as_str(),
                p.resource.as_str(),
                p.namespace.as_deref(),
                p.name
            ),
            ("", "pods", Some("a"), None)
        );
        let p = parse_path("/apis/kvroute.dev/v1alpha1/namespaces/a/inferenceworkersets/q/status")
            .expect("parses");
        assert_eq!(
            (p.resource.as_str(), p.name.as_deref()),
            ("inferenceworkersets/status", Some("q"))
        );
        let p = parse_path("/apis/rbac.authorization.k8s.io/v1/clusterroles/kvroute-router")
            .expect("parses");
        assert_eq!(
            (
                p.group.as_str(),
                p.resource.as_str(),
                p.namespace,
                p.name.as_deref()
            ),
            (
                "rbac.authorization.k8s.io",
                "clusterroles",
                None,
                Some("kvroute-router")
            )
        );
        let p = parse_path("/apis/apps/v1/deployments").expect("parses");
        assert_eq!((p.resource.as_str(), p.name), ("deployments", None));
        assert_eq!(parse_path("/healthz"), None);
        assert_eq!(verb_of("GET", false, true), "watch");
        assert_eq!(verb_of("PATCH", true, false), "patch");
    }
}
