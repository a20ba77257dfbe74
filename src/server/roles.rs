//! ClusterRoles for people, generated from the kinds: they carry the `rbac.authorization.k8s.io/aggregate-to-*`
//! labels, so kube-apiserver's ClusterRole aggregation adds their rules to the built-in `view`, `edit` and `admin`
//! roles (as the Kubernetes documentation asks of CRD and aggregated API authors). `migration-apiserver roles`
//! prints them or writes `manifests/roles/`; `migration-apiserver manifests` writes them with the other generated
//! manifests (see `server::manifests`).
//!
//! - `view` reads every stored kind and its `/status` (as the built-in `view` reads `deployments/status`);
//! - `edit` (and through its label `admin`) writes the namespaced kinds: ShootStates belong to the teams whose
//!   namespaces hold them;
//! - the cluster-scoped kinds (StorageVersionMigration, StorageState) are only read: creating a migration rewrites a
//!   whole resource cluster-wide, which is for cluster admins (`cluster-admin` has every verb already);
//! - create-only virtual kinds (CSITranslation) store nothing and get no role.

use crate::registry::strategy::Strategy;
use crate::server::discovery;
use crate::server::manifests::{kustomization, resources_with_status, GENERATED_HEADER};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

const READ_VERBS: [&str; 3] = ["get", "list", "watch"];
const LABEL_PREFIX: &str = "rbac.authorization.k8s.io/aggregate-to-";

/// One aggregated ClusterRole: its name suffix, the built-in roles it aggregates into, and what it grants.
struct Role {
    suffix: &'static str,
    aggregate_to: &'static [&'static str],
    /// Whether a kind is in the role.
    covers: fn(&dyn Strategy) -> bool,
    /// The verbs granted on the main resource, from those the kind serves.
    grants: fn(&str) -> bool,
    /// Whether the `/status` subresource is granted too (reads only).
    status: bool,
}

const ROLES: [Role; 2] = [
    Role { suffix: "view", aggregate_to: &["view"], covers: |_| true, grants: is_read, status: true },
    Role {
        suffix: "edit",
        aggregate_to: &["admin", "edit"],
        covers: |k| k.info().namespaced,
        grants: |v| !is_read(v),
        status: false,
    },
];

fn is_read(verb: &str) -> bool {
    READ_VERBS.contains(&verb)
}

/// The kinds that get roles: those that store objects.
fn stored(kinds: &[Arc<dyn Strategy>]) -> impl Iterator<Item = &dyn Strategy> {
    kinds.iter().map(|k| k.as_ref()).filter(|k| !k.info().create_only)
}

fn cluster_role(role: &Role, kinds: &[Arc<dyn Strategy>]) -> Value {
    // One rule per group, resources in the kinds' order.
    let mut groups: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut verbs: Vec<&str> = Vec::new();
    for k in stored(kinds).filter(|k| (role.covers)(*k)) {
        let info = k.info();
        let resources = groups.entry(info.group).or_default();
        if role.status {
            resources.extend(resources_with_status(k));
        } else {
            resources.push(info.plural.to_string());
        }
        for verb in discovery::verbs(info).iter().filter(|v| (role.grants)(v)) {
            if !verbs.contains(verb) {
                verbs.push(verb);
            }
        }
    }
    let rules: Vec<Value> = groups
        .into_iter()
        .map(|(group, resources)| json!({ "apiGroups": [group], "resources": resources, "verbs": verbs }))
        .collect();
    let mut labels = serde_json::Map::new();
    labels.insert("app.kubernetes.io/name".into(), "migration-apiserver".into());
    for to in role.aggregate_to {
        labels.insert(format!("{LABEL_PREFIX}{to}"), "true".into());
    }
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": { "name": format!("migration-apiserver:aggregate-to-{}", role.suffix), "labels": labels },
        "rules": rules,
    })
}

/// Every generated file of `manifests/roles/` (name, content): one ClusterRole per built-in role it extends, and
/// the kustomization listing them.
pub fn files(kinds: &[Arc<dyn Strategy>]) -> Result<Vec<(String, String)>, serde_yaml_ng::Error> {
    let mut out = Vec::new();
    for role in &ROLES {
        let name = format!("aggregate-to-{}.yaml", role.suffix);
        out.push((name, format!("{GENERATED_HEADER}{}", serde_yaml_ng::to_string(&cluster_role(role, kinds))?)));
    }
    out.push(kustomization(&out)?);
    Ok(out)
}

/// All roles as one YAML stream (for `kubectl apply -f -`).
pub fn stream(kinds: &[Arc<dyn Strategy>]) -> Result<String, serde_yaml_ng::Error> {
    let docs: Vec<String> =
        ROLES.iter().map(|r| serde_yaml_ng::to_string(&cluster_role(r, kinds))).collect::<Result<_, _>>()?;
    Ok(format!("{GENERATED_HEADER}{}", docs.join("---\n")))
}
