//! The operator's permissions: every (API group, resource, verb) it uses, where, and why. The
//! chart's ClusterRole and Roles are checked against this table, and so is every request the
//! mocked-API-server tests record, so a new call without a rule (or a rule without a call) fails
//! a test instead of a deployment.
//!
//! Every request is namespaced (the operator watches pipelines with `Api::all` or, given
//! namespaces, `Api::namespaced`), so watching listed namespaces needs no cluster-scoped
//! permission at all: the chart then renders only Roles.

/// Where a permission is granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// In every namespace the operator watches: the chart's ClusterRole, bound cluster-wide when
    /// it watches every namespace; a Role in each watched namespace when they are listed.
    Watched,
    /// Only in the operator's own namespace: the chart's Role.
    OperatorNamespace,
}

/// One permission and the call site that needs it.
#[derive(Clone, Copy, Debug)]
pub struct Permission {
    /// API group; empty for the core group.
    pub group: &'static str,
    /// Resource, with `/subresource` where there is one.
    pub resource: &'static str,
    /// RBAC verb.
    pub verb: &'static str,
    /// Where it is granted.
    pub scope: Scope,
    /// The code that makes the request.
    pub needed_by: &'static str,
}

const fn rule(
    group: &'static str,
    resource: &'static str,
    verb: &'static str,
    scope: Scope,
    needed_by: &'static str,
) -> Permission {
    Permission { group, resource, verb, scope, needed_by }
}

use Scope::{OperatorNamespace, Watched};

/// Every permission the operator needs.
pub const PERMISSIONS: &[Permission] = &[
    rule("granary.dev", "inputpipelines", "list", Watched, "controller::run: the InputPipeline watcher"),
    rule("granary.dev", "inputpipelines", "watch", Watched, "controller::run: the InputPipeline watcher"),
    rule("granary.dev", "inputpipelines", "patch", Watched, "reconcile: adds and removes the finalizer"),
    rule("granary.dev", "inputpipelines/status", "patch", Watched, "reconcile: patches status"),
    rule(
        "apps",
        "deployments",
        "get",
        Watched,
        "reconcile: worker counts while an invalid spec keeps the old workers",
    ),
    rule("apps", "deployments", "list", Watched, "controller::run: watches the owned Deployments"),
    rule("apps", "deployments", "watch", Watched, "controller::run: watches the owned Deployments"),
    rule("apps", "deployments", "patch", Watched, "reconcile: server-side apply of the worker Deployment"),
    rule(
        "apps",
        "deployments",
        "create",
        Watched,
        "reconcile: server-side apply creates a missing Deployment",
    ),
    rule("apps", "deployments/scale", "get", Watched, "pool::KubernetesPool::current"),
    rule("apps", "deployments/scale", "patch", Watched, "pool::KubernetesPool::scale_to"),
    rule("", "services", "list", Watched, "controller::run: watches the owned Services"),
    rule("", "services", "watch", Watched, "controller::run: watches the owned Services"),
    rule("", "services", "patch", Watched, "reconcile: server-side apply of the worker Service"),
    rule("", "services", "create", Watched, "reconcile: server-side apply creates a missing Service"),
    rule("events.k8s.io", "events", "create", Watched, "events::Notifier: scaling and caching decisions"),
    rule("", "secrets", "get", Watched, "credentials: reads a pipeline's worker and trainer Secrets"),
    rule("", "secrets", "patch", Watched, "credentials: server-side apply of a pipeline's Secrets"),
    rule("", "secrets", "create", Watched, "credentials: server-side apply creates a missing Secret"),
    rule("", "secrets", "get", OperatorNamespace, "credentials: reads the CA and master-key Secrets"),
    rule("", "secrets", "create", OperatorNamespace, "credentials: makes the CA and master-key Secrets"),
    rule("", "secrets", "update", OperatorNamespace, "credentials: rotates the CA"),
    rule("coordination.k8s.io", "leases", "get", OperatorNamespace, "leader: reads the Lease"),
    rule("coordination.k8s.io", "leases", "create", OperatorNamespace, "leader: creates the Lease"),
    rule("coordination.k8s.io", "leases", "patch", OperatorNamespace, "leader: takes and renews the Lease"),
];

/// The permission a request needs: `(group, resource, verbs)` from its method, path, query and
/// content type, or `None` for a path outside the resource API. A server-side apply needs both
/// `patch` and `create` (it creates what is missing).
pub fn needed(
    method: &str,
    path: &str,
    query: &str,
    content_type: &str,
) -> Option<(String, String, Vec<&'static str>)> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let rest = match parts.as_slice() {
        ["api", "v1", rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let (group, rest) = rest;
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
        other => other,
    };
    let (resource, named) = match rest {
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub] => (format!("{resource}/{sub}"), true),
        _ => return None,
    };
    let watching = query.split('&').any(|kv| kv == "watch=true" || kv == "watch=1");
    let verbs = match (method, named) {
        ("GET", false) if watching => vec!["watch"],
        ("GET", false) => vec!["list"],
        ("GET", true) => vec!["get"],
        ("POST", _) => vec!["create"],
        ("PUT", _) => vec!["update"],
        ("PATCH", _) if content_type.starts_with("application/apply-patch") => vec!["patch", "create"],
        ("PATCH", _) => vec!["patch"],
        ("DELETE", false) => vec!["deletecollection"],
        ("DELETE", true) => vec!["delete"],
        _ => return None,
    };
    Some((group.to_string(), resource, verbs))
}

/// The row granting `verb` on `group`/`resource`, if any.
pub fn grant(group: &str, resource: &str, verb: &str) -> Option<&'static Permission> {
    PERMISSIONS.iter().find(|p| p.group == group && p.resource == resource && p.verb == verb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_map_to_the_verbs_rbac_checks() {
        let n = needed;
        assert_eq!(
            n("GET", "/apis/granary.dev/v1alpha1/inputpipelines", "watch=true&timeoutSeconds=290", ""),
            Some(("granary.dev".into(), "inputpipelines".into(), vec!["watch"]))
        );
        assert_eq!(
            n(
                "PATCH",
                "/apis/apps/v1/namespaces/ns/deployments/p-workers",
                "fieldManager=x",
                "application/apply-patch+yaml"
            ),
            Some(("apps".into(), "deployments".into(), vec!["patch", "create"]))
        );
        assert_eq!(
            n(
                "PATCH",
                "/apis/apps/v1/namespaces/ns/deployments/p-workers/scale",
                "",
                "application/merge-patch+json"
            ),
            Some(("apps".into(), "deployments/scale".into(), vec!["patch"]))
        );
        assert_eq!(
            n("GET", "/api/v1/namespaces/ns/services", "", ""),
            Some(("".into(), "services".into(), vec!["list"]))
        );
        assert_eq!(
            n("POST", "/apis/events.k8s.io/v1/namespaces/ns/events", "", "application/json"),
            Some(("events.k8s.io".into(), "events".into(), vec!["create"]))
        );
        assert_eq!(n("GET", "/version", "", ""), None);
    }

    #[test]
    fn every_row_is_unique_and_says_why() {
        for (i, p) in PERMISSIONS.iter().enumerate() {
            assert!(!p.needed_by.is_empty());
            assert!(
                PERMISSIONS[..i]
                    .iter()
                    .all(|q| (q.group, q.resource, q.verb, q.scope) != (p.group, p.resource, p.verb, p.scope)),
                "{p:?} twice"
            );
        }
    }
}
