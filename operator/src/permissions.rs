//! The single source of truth for RBAC: what the operator calls and what the router it deploys
//! reads. `kvroute crdgen` turns these into the CSV's `clusterPermissions`/`permissions` and into
//! `deploy/rbac.yaml`; the operator turns [`ROUTER_RULES`] into the router's Role. A controller
//! test records every request the reconcilers make and checks it against [`OPERATOR_RULES`].

use k8s_openapi::api::rbac::v1::PolicyRule;

/// One RBAC rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// API groups (`""` is core).
    pub api_groups: &'static [&'static str],
    /// Resources (with `/subresource` where needed).
    pub resources: &'static [&'static str],
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// Object names the rule is limited to; empty = every object. Kubernetes cannot limit
    /// `create` (or `list`/`watch`) by name: the name is not known when it authorizes those.
    pub resource_names: &'static [&'static str],
}

const READ: &[&str] = &["get", "list", "watch"];
/// Server-side apply is a PATCH; creating through apply also needs `create`.
const APPLY: &[&str] = &["get", "list", "watch", "create", "patch"];

/// Every kvroute kind.
pub const KVROUTE_RESOURCES: &[&str] = &[
    "inferenceworkersets",
    "inferencepools",
    "inferencepolicies",
    "inferenceproviders",
    "gatewaybackends",
];

/// What the operator needs wherever it watches (cluster-wide when `--namespace` is empty).
pub const OPERATOR_RULES: &[Rule] = &[
    Rule {
        api_groups: &["kvroute.dev"],
        resources: KVROUTE_RESOURCES,
        verbs: READ,
        resource_names: &[],
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
        verbs: &["get", "patch", "update"],
        resource_names: &[],
    },
    Rule {
        api_groups: &["apps"],
        resources: &["deployments"],
        verbs: APPLY,
        resource_names: &[],
    },
    Rule {
        api_groups: &[""],
        resources: &["services", "serviceaccounts"],
        verbs: APPLY,
        resource_names: &[],
    },
    Rule {
        api_groups: &[""],
        resources: &["pods", "secrets"],
        verbs: READ,
        resource_names: &[],
    },
    // The PKI's two Secrets (crate::pki): read and rewritten by name only. The operator
    // never lists or watches Secrets.
    Rule {
        api_groups: &[""],
        resources: &["secrets"],
        verbs: &["get", "update", "patch"],
        resource_names: &[crate::pki::CA_SECRET, crate::pki::MTLS_SECRET],
    },
    // Creating them (first start, a new namespace): `create` cannot be limited by name.
    Rule {
        api_groups: &[""],
        resources: &["secrets"],
        verbs: &["create"],
        resource_names: &[],
    },
    // cert-manager mode: one Certificate per identity, server-side applied; read back for the
    // pool's TransportSecurity condition.
    Rule {
        api_groups: &["cert-manager.io"],
        resources: &["certificates"],
        verbs: &["get", "create", "patch"],
        resource_names: &[],
    },
    Rule {
        api_groups: &["rbac.authorization.k8s.io"],
        resources: &[
            "roles",
            "rolebindings",
            "clusterroles",
            "clusterrolebindings",
        ],
        verbs: APPLY,
        resource_names: &[],
    },
    Rule {
        api_groups: &["events.k8s.io"],
        resources: &["events"],
        verbs: &["create", "patch"],
        resource_names: &[],
    },
];

/// What the operator needs in its own namespace only: the leader-election Lease.
pub const OPERATOR_NAMESPACE_RULES: &[Rule] = &[Rule {
    api_groups: &["coordination.k8s.io"],
    resources: &["leases"],
    verbs: &["get", "create", "update"],
    resource_names: &[],
}];

/// What the router reads: the kvroute resources, worker pods, and Secrets for backend
/// credentials. Nothing else, and never a write.
pub const ROUTER_RULES: &[Rule] = &[
    Rule {
        api_groups: &["kvroute.dev"],
        resources: KVROUTE_RESOURCES,
        verbs: READ,
        resource_names: &[],
    },
    Rule {
        api_groups: &[""],
        resources: &["pods", "secrets"],
        verbs: READ,
        resource_names: &[],
    },
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
            resource_names: (!r.resource_names.is_empty()).then(|| strings(r.resource_names)),
            ..Default::default()
        })
        .collect()
}

/// True when `rules` allow `verb` on `group`/`resource` (for some object name: a rule
/// limited by `resource_names` counts).
pub fn allows(rules: &[Rule], group: &str, resource: &str, verb: &str) -> bool {
    rules.iter().any(|r| {
        r.api_groups.contains(&group) && r.resources.contains(&resource) && r.verbs.contains(&verb)
    })
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

/// Parses a request path into (group, resource incl. subresource, named): `/api/v1/namespaces/ns/pods/x`,
/// `/apis/apps/v1/namespaces/ns/deployments/x/status`, cluster-scoped forms too.
pub fn parse_path(path: &str) -> Option<(String, String, bool)> {
    let path = path.split('?').next().unwrap_or_default();
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match *parts.first()? {
        "api" => ("", parts.get(2..)?),
        "apis" => (*parts.get(1)?, parts.get(3..)?),
        _ => return None,
    };
    let rest = if rest.first() == Some(&"namespaces") && rest.len() > 2 {
        &rest[2..]
    } else {
        rest
    };
    let resource = rest.first()?.to_string();
    let named = rest.len() > 1;
    let resource = match rest.get(2) {
        Some(sub) => format!("{resource}/{sub}"),
        None => resource,
    };
    Some((group.to_string(), resource, named))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_rules_are_a_read_only_subset_of_the_operators() {
        for r in ROUTER_RULES {
            for g in r.api_groups {
                for res in r.resources {
                    for v in r.verbs {
                        assert!(READ.contains(v), "router must not {v}");
                        assert!(
                            allows(OPERATOR_RULES, g, res, v),
                            "operator cannot grant {v} {g}/{res}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn paths_parse_into_group_resource_and_name() {
        assert_eq!(
            parse_path("/api/v1/namespaces/a/pods?labelSelector=x"),
            Some((String::new(), "pods".into(), false))
        );
        assert_eq!(
            parse_path("/apis/kvroute.dev/v1alpha1/namespaces/a/inferenceworkersets/q/status"),
            Some((
                "kvroute.dev".into(),
                "inferenceworkersets/status".into(),
                true
            ))
        );
        assert_eq!(
            parse_path("/apis/rbac.authorization.k8s.io/v1/clusterroles/kvroute-router"),
            Some((
                "rbac.authorization.k8s.io".into(),
                "clusterroles".into(),
                true
            ))
        );
        assert_eq!(
            parse_path("/apis/apps/v1/deployments"),
            Some(("apps".into(), "deployments".into(), false))
        );
        assert_eq!(parse_path("/healthz"), None);
        assert_eq!(verb_of("GET", false, true), "watch");
        assert_eq!(verb_of("PATCH", true, false), "patch");
    }
}
