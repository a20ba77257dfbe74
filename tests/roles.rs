//! The ClusterRoles for people (manifests/roles/, aggregated into the built-in view, edit and admin roles): the
//! committed files equal `migration-apiserver roles --output-dir`, and what they grant is what a running server
//! serves: reads of every stored kind for `view`, writes of the namespaced kinds only for `edit` and `admin`.

mod common;

use common::manifests::{files_in, generated};
use common::{repo, Server};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

#[test]
fn committed_roles_equal_the_generated_ones() {
    assert_eq!(
        files_in(&repo().join("manifests/roles")),
        generated("roles"),
        "regenerate: migration-apiserver roles --output-dir manifests/roles"
    );
}

/// (group, resource) -> verbs, over every rule of the rendered roles whose labels aggregate into `builtin`.
fn granted(builtin: &str) -> BTreeMap<(String, String), BTreeSet<String>> {
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(repo().join("manifests/roles"))
        .output()
        .expect("run kubectl kustomize");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf8");
    let mut grants: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for doc in text.split("\n---\n") {
        let role: Value = serde_yaml_ng::from_str(doc).expect("YAML");
        assert_eq!(role["kind"], "ClusterRole");
        let label = format!("rbac.authorization.k8s.io/aggregate-to-{builtin}");
        if role["metadata"]["labels"][&label] != "true" {
            continue;
        }
        for rule in role["rules"].as_array().expect("rules") {
            for group in rule["apiGroups"].as_array().expect("apiGroups") {
                for resource in rule["resources"].as_array().expect("resources") {
                    let verbs =
                        rule["verbs"].as_array().expect("verbs").iter().map(|v| v.as_str().unwrap().to_string());
                    grants
                        .entry((group.as_str().unwrap().into(), resource.as_str().unwrap().into()))
                        .or_default()
                        .extend(verbs);
                }
            }
        }
    }
    grants
}

#[test]
fn roles_grant_what_the_server_serves() {
    let server = Server::start(&[]);
    // Every served resource of our groups, from discovery, with its verbs and scope.
    let mut served: Vec<(String, String, bool, BTreeSet<String>)> = Vec::new();
    for group_version in [
        "migration.k8s.io/v1alpha1",
        "core.gardener.cloud/v1beta1",
        "core.gardener.cloud/v1alpha1",
        "storagemigration.k8s.io/v1",
        "storagemigration.k8s.io/v1beta1",
    ] {
        let list: Value =
            serde_json::from_str(&server.kubectl_ok(&["get", "--raw", &format!("/apis/{group_version}")]))
                .expect("JSON");
        let group = group_version.split('/').next().unwrap();
        for r in list["resources"].as_array().expect("resources") {
            let verbs: BTreeSet<String> =
                r["verbs"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
            let name = r["name"].as_str().unwrap().to_string();
            if !served.iter().any(|(g, n, _, _)| g == group && *n == name) {
                served.push((group.into(), name, r["namespaced"].as_bool().unwrap(), verbs));
            }
        }
    }
    let read: BTreeSet<String> = ["get", "list", "watch"].map(String::from).into();
    let (view, edit, admin) = (granted("view"), granted("edit"), granted("admin"));
    assert_eq!(edit, admin, "admin gets exactly what edit gets");
    for (group, resource, namespaced, verbs) in &served {
        let key = (group.clone(), resource.clone());
        let got_view = view.get(&key).cloned().unwrap_or_default();
        let got_edit = edit.get(&key).cloned().unwrap_or_default();
        // A create-only virtual resource (CSITranslation) stores nothing: no role.
        let stores = verbs.contains("get");
        match resource.split_once('/') {
            None => {
                let want_view: BTreeSet<String> =
                    if stores { verbs.intersection(&read).cloned().collect() } else { BTreeSet::new() };
                assert_eq!(got_view, want_view, "{key:?}: view grants the reads served ({verbs:?})");
                let want_edit: BTreeSet<String> =
                    if stores && *namespaced { verbs.difference(&read).cloned().collect() } else { BTreeSet::new() };
                assert_eq!(got_edit, want_edit, "{key:?}: edit grants the writes of namespaced kinds only");
            }
            // /status: read by view (one rule with the main resource, as the built-in view reads pods/status),
            // written by nobody but cluster admins and the controllers.
            Some((_, "status")) => {
                assert!(got_view.contains("get") && got_view.is_subset(&read), "{key:?}: view reads it: {got_view:?}");
                assert!(got_edit.is_empty(), "{key:?}: edit does not write status: {got_edit:?}");
            }
            Some(_) => assert!(got_view.is_empty() && got_edit.is_empty(), "{key:?}"),
        }
    }
    // Nothing granted that the server does not serve.
    for key in view.keys().chain(edit.keys()) {
        let (group, resource) = key;
        let base = resource.split('/').next().unwrap();
        assert!(served.iter().any(|(g, n, _, _)| g == group && n == base), "{key:?} is granted but not served");
    }
    // The expected shape, spelled out: ShootStates in view and edit; the migration kinds only in view.
    assert!(edit.contains_key(&("core.gardener.cloud".into(), "shootstates".into())));
    for (g, r) in [
        ("migration.k8s.io", "storageversionmigrations"),
        ("migration.k8s.io", "storagestates"),
        ("storagemigration.k8s.io", "storageversionmigrations"),
    ] {
        let key = (g.to_string(), r.to_string());
        assert!(view.contains_key(&key) && !edit.contains_key(&key), "{key:?}");
    }
}
