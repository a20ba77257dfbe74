use super::test_fixtures::*;
use super::*;
use crate::api::storage_version_migration::{
    GroupVersionResource, StorageVersionMigration, CONDITION_FAILED, CONDITION_RUNNING, CONDITION_SUCCEEDED,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::time::Duration;

#[test]
fn ordering_uses_the_sub_second_request_time() {
    let mut early =
        desired_migration(&gvr(), Some(A), Timestamp::from_nanosecond(1_700_000_000_100_000_000).expect("ts"));
    early.metadata.name = Some("zzz".into());
    let mut late =
        desired_migration(&gvr(), Some(B), Timestamp::from_nanosecond(1_700_000_000_900_000_000).expect("ts"));
    late.metadata.name = Some("aaa".into());
    let both = [late.clone(), early.clone()];
    assert_eq!(latest(&both).and_then(|m| m.metadata.name.as_deref()), Some("aaa"));
}

#[test]
fn supersede_and_prune_selection() {
    let ms = vec![
        svm("m1", A, 1, Some((CONDITION_SUCCEEDED, "Done"))),
        svm("m2", A, 2, Some((CONDITION_FAILED, REASON_SUPERSEDED))),
        svm("m3", A, 3, Some((CONDITION_FAILED, "Forbidden"))),
        svm("m4", B, 4, Some((CONDITION_RUNNING, "Running"))),
        svm("m5", B, 5, None),
    ];
    let names = |v: Vec<&StorageVersionMigration>| v.iter().map(|m| name_of(m).to_string()).collect::<Vec<_>>();
    assert_eq!(names(to_supersede(&ms, "m5")), ["m4"]);
    assert_eq!(to_prune(&ms, 2), ["m1"]);
    assert_eq!(to_prune(&ms, 1), ["m1", "m2"]);
    assert!(to_prune(&ms, 5).is_empty());
}

#[test]
fn superseded_status_never_reverts_a_terminal_condition() {
    let running = svm("m1", A, 1, Some((CONDITION_RUNNING, "Running")));
    let st = superseded_status(&running, &superseded_by("m2"), ts(5)).expect("status");
    let by_type = |t: &str| st.conditions.iter().find(|c| c.type_ == t).cloned().expect("condition");
    assert_eq!(by_type(CONDITION_FAILED).status, "True");
    assert_eq!(by_type(CONDITION_FAILED).reason.as_deref(), Some(REASON_SUPERSEDED));
    assert!(by_type(CONDITION_FAILED).message.expect("message").contains("m2"));
    assert_eq!(by_type(CONDITION_RUNNING).status, "False");
    // Valid per the API's own rules.
    let mut m = running.clone();
    m.status = Some(st);
    assert!(
        crate::registry::strategy::Kind::validate(&m).is_empty(),
        "{:?}",
        crate::registry::strategy::Kind::validate(&m)
    );
    for done in [CONDITION_SUCCEEDED, CONDITION_FAILED] {
        assert!(superseded_status(&svm("m1", A, 1, Some((done, "X"))), "m2", ts(5)).is_none());
    }
}

#[test]
fn desired_migration_names_and_labels() {
    let m = desired_migration(&gvr(), Some(A), ts(0));
    assert_eq!(m.metadata.generate_name.as_deref(), Some("shootstates.core.gardener.cloud-"));
    let labels = m.metadata.labels.clone().expect("labels");
    assert_eq!(labels[LABEL_RESOURCE], "shootstates.core.gardener.cloud");
    let ann = m.metadata.annotations.clone().expect("annotations");
    assert_eq!(ann[ANNOTATION_HASH], A);
    assert!(!ann.contains_key(ANNOTATION_RESOURCE));
    assert_eq!(m.spec.resource, gvr());
    // Core group.
    let pods = GroupVersionResource { group: String::new(), version: "v1".into(), resource: "pods".into() };
    let m = desired_migration(&pods, Some(A), ts(0));
    assert_eq!(m.metadata.generate_name.as_deref(), Some("pods-"));
    assert_eq!(m.metadata.labels.expect("labels")[LABEL_RESOURCE], "pods");
    // Too long for a label value: shortened with a hash, full name in the annotation.
    let group = format!("{}.example.com", "very-long-group-name".repeat(3));
    let long = GroupVersionResource { group: group.clone(), version: "v1".into(), resource: "widgets".into() };
    let m = desired_migration(&long, None, ts(0));
    let label = m.metadata.labels.expect("labels")[LABEL_RESOURCE].clone();
    assert!(label.len() <= 63, "{label}");
    assert!(label.starts_with("widgets.very-long") && label.chars().last().is_some_and(|c| c.is_ascii_alphanumeric()));
    let ann = m.metadata.annotations.expect("annotations");
    assert_eq!(ann[ANNOTATION_RESOURCE], format!("widgets.{group}"));
    assert!(!ann.contains_key(ANNOTATION_HASH));
    // Different long names get different labels.
    let other = resource_label_value(&group, "gadgets").0;
    assert_ne!(other, label);
}

fn api_resource(name: &str, verbs: &[&str], hash: Option<&str>) -> APIResource {
    APIResource {
        name: name.into(),
        kind: "K".into(),
        namespaced: true,
        singular_name: String::new(),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        storage_version_hash: hash.map(str::to_string),
        ..Default::default()
    }
}

fn list(gv: &str, resources: Vec<APIResource>) -> APIResourceList {
    APIResourceList { group_version: gv.into(), resources }
}

const RW: &[&str] = &["create", "delete", "get", "list", "patch", "update", "watch"];

#[test]
fn group_resources_prefers_the_preferred_version_and_skips_subresources() {
    let lists = vec![
        (
            "v1beta1".to_string(),
            list("g/v1beta1", vec![api_resource("a", RW, Some(A)), api_resource("a/status", &["get"], None)]),
        ),
        (
            "v1alpha1".to_string(),
            list("g/v1alpha1", vec![api_resource("a", RW, Some(A)), api_resource("b", RW, Some(B))]),
        ),
    ];
    let rs = group_resources("g", &lists);
    assert_eq!(rs.len(), 2);
    assert_eq!((rs[0].resource.as_str(), rs[0].version.as_str()), ("a", "v1beta1"));
    assert_eq!(rs[0].versions, ["v1beta1", "v1alpha1"]);
    assert_eq!(rs[0].hash.as_deref(), Some(A));
    // Only in a non-preferred version: that version.
    assert_eq!((rs[1].resource.as_str(), rs[1].version.as_str()), ("b", "v1alpha1"));
}

#[test]
fn initializer_rule() {
    let mut d = Discovery::default();
    d.resources.extend(group_resources(
        "",
        &[(
            "v1".into(),
            list(
                "v1",
                vec![
                    api_resource("pods", RW, Some(A)),
                    api_resource("events", RW, Some(A)),
                    api_resource("bindings", &["create"], None),
                ],
            ),
        )],
    ));
    d.resources.extend(group_resources(
        "events.k8s.io",
        &[("v1".into(), list("events.k8s.io/v1", vec![api_resource("events", RW, Some(A))]))],
    ));
    d.resources.extend(group_resources(
        "core.gardener.cloud",
        &[
            ("v1beta1".into(), list("core.gardener.cloud/v1beta1", vec![api_resource("shootstates", RW, Some(B))])),
            ("v1alpha1".into(), list("core.gardener.cloud/v1alpha1", vec![api_resource("shootstates", RW, Some(B))])),
        ],
    ));
    d.resources.extend(group_resources(
        "crd.example.com",
        &[
            ("v2".into(), list("crd.example.com/v2", vec![api_resource("widgets", RW, Some(A))])),
            ("v1".into(), list("crd.example.com/v1", vec![api_resource("widgets", RW, Some(A))])),
        ],
    ));
    d.resources.extend(group_resources(
        "metrics.k8s.io",
        &[("v1beta1".into(), list("metrics.k8s.io/v1beta1", vec![api_resource("pods", &["get", "list"], None)]))],
    ));
    d.resources.extend(group_resources(
        "extensions",
        &[("v1beta1".into(), list("extensions/v1beta1", vec![api_resource("ingresses", RW, Some(A))]))],
    ));
    d.resources.extend(group_resources(
        "networking.k8s.io",
        &[(
            "v1".into(),
            list("networking.k8s.io/v1", vec![api_resource("ingresses", &["get", "list", "patch"], Some(A))]),
        )],
    ));
    d.resources.extend(group_resources(
        "readonly.io",
        &[
            ("v2".into(), list("readonly.io/v2", vec![api_resource("things", &["get", "list"], Some(A))])),
            ("v1".into(), list("readonly.io/v1", vec![api_resource("things", &["get", "list"], Some(A))])),
        ],
    ));
    let crds = BTreeSet::from(["crd.example.com".to_string()]);
    let aggregated = BTreeSet::from(["metrics.k8s.io".to_string()]);
    let got: Vec<String> = migratable_resources(&d, &crds, &aggregated)
        .iter()
        .map(|r| format!("{}/{}", r.gvr().display(), r.hash.clone().unwrap_or_default()))
        .collect();
    // shootstates: 2 versions; ingresses: 2 groups, the first in discovery order; pods only once (the
    // aggregated metrics group does not count); events never; CRDs never; things cannot be updated.
    assert_eq!(
        got,
        [format!("shootstates.v1beta1.core.gardener.cloud/{B}"), format!("ingresses.v1beta1.extensions/{A}")]
    );
}

/// A target with canned discovery documents: one group answers 503.
fn canned_target() -> kube::Client {
    use axum::routing::get;
    use axum::Json;
    let rl = |gv: &str, name: &str, hash: &str| {
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": [
            {"name": name, "singularName": "", "namespaced": true, "kind": "K", "verbs": ["get", "list", "update"], "storageVersionHash": hash},
            {"name": format!("{name}/status"), "singularName": "", "namespaced": true, "kind": "K", "verbs": ["get", "update"]},
        ]})
    };
    let group = |name: &str, versions: &[&str]| {
        let vs: Vec<Value> =
            versions.iter().map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v})).collect();
        json!({"name": name, "versions": vs, "preferredVersion": vs[0]})
    };
    let apis = json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group("good.io", &["v2", "v1"]), group("broken.io", &["v1"])]});
    let (good2, good1) = (rl("good.io/v2", "widgets", A), rl("good.io/v1", "widgets", A));
    let core = rl("v1", "pods", B);
    let router = axum::Router::new()
        .route("/api", get(|| async { Json(json!({"kind": "APIVersions", "versions": ["v1"]})) }))
        .route("/api/v1", get(move || async move { Json(core) }))
        .route("/apis", get(move || async move { Json(apis) }))
        .route("/apis/good.io/v2", get(move || async move { Json(good2) }))
        .route("/apis/good.io/v1", get(move || async move { Json(good1) }))
        .route(
            "/apis/broken.io/v1",
            get(|| async {
                let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503,
                                    "reason": "ServiceUnavailable", "message": "the server is currently unable to handle the request"});
                (axum::http::StatusCode::SERVICE_UNAVAILABLE, Json(status))
            }),
        );
    crate::client::in_process_client(router)
}

#[tokio::test]
async fn discovery_reports_failing_groups_and_keeps_the_rest() {
    let d = discover(&canned_target(), Duration::from_secs(5)).await.expect("discovery");
    let got: Vec<(String, String, Vec<String>, Option<String>)> =
        d.resources.iter().map(|r| (r.qualified(), r.version.clone(), r.versions.clone(), r.hash.clone())).collect();
    assert_eq!(
        got,
        [
            ("pods".to_string(), "v1".to_string(), vec!["v1".to_string()], Some(B.to_string())),
            (
                "widgets.good.io".to_string(),
                "v2".to_string(),
                vec!["v2".to_string(), "v1".to_string()],
                Some(A.to_string())
            ),
        ]
    );
    assert_eq!(d.failed.keys().collect::<Vec<_>>(), ["broken.io"]);
    assert!(d.failed["broken.io"].contains("unable to handle"), "{:?}", d.failed);
    // `migrate` names the failed groups when a resource is not found.
    assert!(resolve_resource(&d, "things.broken.io")
        .unwrap_err()
        .to_string()
        .contains("discovery failed for: broken.io"));
    // Without the group list there is nothing to work with.
    let router = axum::Router::new();
    let err = discover(&crate::client::in_process_client(router), Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(err.path, "/apis");
}

#[test]
fn resolve_by_qualified_or_unique_name() {
    let mut d = Discovery::default();
    d.resources.extend(group_resources("", &[("v1".into(), list("v1", vec![api_resource("pods", RW, Some(A))]))]));
    d.resources.extend(group_resources(
        "apps",
        &[("v1".into(), list("apps/v1", vec![api_resource("deployments", RW, Some(B))]))],
    ));
    d.resources.extend(group_resources(
        "metrics.k8s.io",
        &[("v1beta1".into(), list("metrics.k8s.io/v1beta1", vec![api_resource("pods", &["get"], None)]))],
    ));
    assert_eq!(resolve_resource(&d, "deployments.apps").expect("found").version, "v1");
    assert_eq!(resolve_resource(&d, "deployments").expect("found").group, "apps");
    assert_eq!(resolve_resource(&d, "pods").expect("found").group, "");
    assert_eq!(resolve_resource(&d, "pods.metrics.k8s.io").expect("found").group, "metrics.k8s.io");
    assert!(resolve_resource(&d, "widgets").unwrap_err().to_string().contains("doesn't have a resource type"));
}
