//! This server behind a real kube-apiserver (v1.37.2, `make cluster`): registered by the deploy kit, every
//! APIService of ours Available, and every kind used through kube-apiserver's aggregator as kubectl and the `kube`
//! crate use built-in resources.

mod common;
use common::cluster::{shared, Cluster};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, Patch, PatchParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};
use std::time::Duration;

/// Our APIServices as the deploy kit registered them on this cluster (storagemigration.k8s.io is the cluster's).
const OURS: &[&str] = &["v1alpha1.migration.k8s.io", "v1alpha1.core.gardener.cloud", "v1beta1.core.gardener.cloud"];

#[test]
fn every_apiservice_of_ours_is_available_and_the_in_tree_group_is_left_to_the_cluster() {
    let c = shared();
    for name in OURS {
        let a = c.kubectl_json(&["get", "apiservice", name, "-o", "json"]);
        assert_eq!(a["spec"]["service"]["name"], "migration-apiserver", "{a}");
        let available =
            a["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "Available"));
        assert_eq!(available.map(|c| &c["status"]), Some(&json!("True")), "{a}");
    }
    // kube-apiserver serves the in-tree group (INTREE=on): the kit did not register ours over it.
    let intree = c.kubectl_json(&["get", "apiservice", "v1.storagemigration.k8s.io", "-o", "json"]);
    assert!(intree["spec"].get("service").is_none(), "the cluster's own APIService: {intree}");
    let deploy = c.log("deploy");
    for skipped in ["v1.storagemigration.k8s.io", "v1beta1.storagemigration.k8s.io"] {
        let line = format!(
            "skipping APIService {skipped}: the cluster serves storagemigration.k8s.io itself (APIService \
             v1.storagemigration.k8s.io is local: no spec.service, kube-apiserver's own)"
        );
        assert!(deploy.contains(&line), "{line:?} not in {deploy}");
    }
    let registered: Vec<&str> = deploy
        .lines()
        .filter_map(|l| l.strip_prefix("apiservice.apiregistration.k8s.io/")?.strip_suffix(" created"))
        .collect();
    assert_eq!(registered, OURS_SORTED, "{deploy}");
}

/// [`OURS`] in the order kubectl applies them.
const OURS_SORTED: [&str; 3] =
    ["v1alpha1.core.gardener.cloud", "v1alpha1.migration.k8s.io", "v1beta1.core.gardener.cloud"];

#[test]
fn api_resources_and_explain_through_the_aggregator() {
    let c = shared();
    let out = c.kubectl_ok(&["api-resources", "--api-group=migration.k8s.io"]);
    let line = |name: &str| out.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name}: {out}"));
    let ss = line("storagestates ");
    assert!(ss.contains(" ss ") && ss.contains("migration.k8s.io/v1alpha1") && ss.contains("StorageState"), "{ss}");
    assert!(line("storageversionmigrations ").contains(" svm "), "{out}");
    let gardener = c.kubectl_ok(&["api-resources", "--api-group=core.gardener.cloud"]);
    assert!(gardener.contains("shootstates") && gardener.contains("core.gardener.cloud/v1beta1"), "{gardener}");
    // explain reads the OpenAPI v3 that kube-apiserver aggregated from ours.
    let explain = c.kubectl_ok(&["explain", "storagestate.status"]);
    assert!(
        explain.contains("persistedStorageVersionHashes") && explain.contains("currentStorageVersionHash"),
        "{explain}"
    );
    let explain = c.kubectl_ok(&["explain", "shootstates.spec.gardener", "--api-version=core.gardener.cloud/v1beta1"]);
    assert!(explain.contains("FIELDS:") && explain.contains("name"), "{explain}");
}

#[test]
fn storagestates_print_their_columns_through_kube_apiserver() {
    let c = shared();
    // The scheduler makes a StorageState for each of our resources at its start.
    let names = common::eventually("the scheduler's StorageStates", Duration::from_secs(60), || {
        let out = c.kubectl(&["get", "storagestates", "-o", "name"]);
        let names = String::from_utf8_lossy(&out.stdout).into_owned();
        names.contains("storagestate.migration.k8s.io/shootstates.core.gardener.cloud").then_some(names)
    });
    assert!(names.contains("storagestate.migration.k8s.io/storageversionmigrations.migration.k8s.io"), "{names}");
    let table = c.kubectl_ok(&["get", "storagestates"]);
    let header: Vec<&str> = table.lines().next().expect("header").split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "CURRENT", "PERSISTED", "HEARTBEAT", "WRITE", "KEY", "KEYS", "IN", "USE", "ROTATION", "AGE"],
        "{table}"
    );
    let row = table.lines().find(|l| l.starts_with("shootstates.core.gardener.cloud ")).expect(&table);
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert!(cells[1].ends_with('=') && cells[1].len() == 12, "a storage version hash: {row}");
}

fn shootstate(namespace: &str, name: &str, ca: &str) -> Value {
    json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"gardener": [{"name": "ca", "type": "secret", "data": {"ca.crt": ca}}]}})
}

fn namespace(c: &Cluster, name: &str) {
    let out = c.kubectl(&["create", "namespace", name]);
    assert!(out.status.success() || String::from_utf8_lossy(&out.stderr).contains("AlreadyExists"));
}

#[test]
fn shootstates_create_list_in_chunks_update_apply_and_delete_with_kubectl() {
    let c = shared();
    namespace(c, "garden-chunks");
    let stream: String =
        (0..25).map(|i| format!("{}\n", shootstate("garden-chunks", &format!("s-{i:02}"), "YWJj"))).collect();
    c.kubectl_ok_stdin(&["create", "-f", "-"], &stream);
    // --chunk-size: kube-apiserver passes limit and continue through to us.
    let out = c.kubectl_ok(&["get", "shootstates", "-n", "garden-chunks", "--chunk-size=7", "-v=6"]);
    assert_eq!(out.lines().filter(|l| l.starts_with("s-")).count(), 25, "{out}");
    let listed =
        c.kubectl_ok(&["get", "shootstates.v1alpha1.core.gardener.cloud", "-n", "garden-chunks", "-o", "name"]);
    assert_eq!(listed.lines().count(), 25, "the same objects in the other version: {listed}");

    // Update (replace), server-side apply, and the field manager it records.
    let mut s = c.kubectl_json(&["get", "shootstate", "s-00", "-n", "garden-chunks", "-o", "json"]);
    s["metadata"]["labels"] = json!({"team": "a"});
    c.kubectl_ok_stdin(&["replace", "-f", "-"], &s.to_string());
    let applied = |ca: &str| {
        json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
            "metadata": {"name": "s-applied", "namespace": "garden-chunks", "labels": {"applied": "yes"}},
            "spec": {"gardener": [{"name": "ca", "type": "secret", "data": {"ca.crt": ca}}]}})
        .to_string()
    };
    let apply = ["apply", "--server-side", "--field-manager=cluster-test", "-f", "-"];
    assert!(c.kubectl_ok_stdin(&apply, &applied("eHl6")).contains("serverside-applied"));
    assert!(c.kubectl_ok_stdin(&apply, &applied("YWJj")).contains("serverside-applied"));
    let got = c.kubectl_json(&[
        "get",
        "shootstate",
        "s-applied",
        "-n",
        "garden-chunks",
        "-o",
        "json",
        "--show-managed-fields",
    ]);
    assert_eq!(got["metadata"]["labels"]["applied"], "yes", "{got}");
    assert_eq!(got["spec"]["gardener"][0]["data"]["ca.crt"], "YWJj", "{got}");
    let managers: Vec<&str> = got["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert_eq!(managers, ["cluster-test"], "{got}");
    // Another manager's apply of a field the first one owns is a conflict, as kube-apiserver reports it.
    let out = c.kubectl_as(
        &c.admin(),
        &["apply", "--server-side", "--field-manager=other", "-f", "-"],
        Some(&applied("b3RoZXI=")),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("Apply failed with 1 conflict: conflict with \"cluster-test\""),
        "{stderr}"
    );
    assert_eq!(
        c.kubectl_ok(&["get", "shootstate", "s-00", "-n", "garden-chunks", "-o", "jsonpath={.metadata.labels.team}"]),
        "a"
    );

    c.kubectl_ok(&["delete", "shootstates", "--all", "-n", "garden-chunks", "--wait"]);
    let left = c.kubectl_ok(&["get", "shootstates", "-n", "garden-chunks", "-o", "name"]);
    assert!(left.trim().is_empty(), "{left}");
}

#[test]
fn migrations_are_created_and_deleted_through_the_aggregator() {
    let c = shared();
    // The trigger's first migration of ShootStates (at the server's start) is over: a migration by hand made
    // before it would be superseded by it.
    common::eventually("the trigger's first migration of ShootStates", Duration::from_secs(60), || {
        let out = c.kubectl(&["get", "storagestate", "shootstates.core.gardener.cloud", "-o", "json"]);
        let ss: Value = serde_json::from_slice(&out.stdout).ok()?;
        let current = &ss["status"]["currentStorageVersionHash"];
        (current.is_string() && ss["status"]["persistedStorageVersionHashes"] == json!([current])).then_some(())
    });
    let svm = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
        "metadata": {"name": "shootstates-by-hand"},
        "spec": {"resource": {"group": "core.gardener.cloud", "version": "v1beta1", "resource": "shootstates"}}});
    c.kubectl_ok_stdin(&["create", "-f", "-"], &svm.to_string());
    // Our migrator runs it to the end; its status is read through kube-apiserver.
    common::eventually("the migration to succeed", Duration::from_secs(60), || {
        let out = c.kubectl(&[
            "get",
            "svm",
            "shootstates-by-hand",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Succeeded\")].status}",
        ]);
        (String::from_utf8_lossy(&out.stdout) == "True").then_some(())
    });
    let table = c.kubectl_ok(&["get", "svm", "shootstates-by-hand"]);
    assert!(table.starts_with("NAME") && table.contains("Succeeded"), "{table}");
    c.kubectl_ok(&["delete", "svm", "shootstates-by-hand"]);
    let out = c.kubectl(&["get", "svm", "shootstates-by-hand"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"), "{out:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kube_crate_watches_and_patches_through_the_aggregator() {
    let c = shared();
    namespace(c, "garden-watch");
    let client = c.client().await;
    let gvk = GroupVersionKind::gvk("core.gardener.cloud", "v1beta1", "ShootState");
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, "garden-watch", &ApiResource::from_gvk_with_plural(&gvk, "shootstates"));
    let rv = api.list(&Default::default()).await.expect("list").metadata.resource_version.expect("rv");
    let mut events = api.watch(&WatchParams::default().timeout(30), &rv).await.expect("watch").boxed();
    let obj: DynamicObject = serde_json::from_value(shootstate("garden-watch", "w-1", "YWJj")).expect("object");
    api.create(&Default::default(), &obj).await.expect("create");
    let patch = json!({"metadata": {"labels": {"patched": "yes"}}});
    api.patch("w-1", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("merge patch");
    api.delete("w-1", &Default::default()).await.expect("delete");
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let event = tokio::time::timeout(Duration::from_secs(30), events.try_next())
            .await
            .expect("an event within 30 s")
            .expect("watch error")
            .expect("the watch ended early");
        match event {
            WatchEvent::Added(o) => seen.push(("ADDED", o.metadata.labels)),
            WatchEvent::Modified(o) => seen.push(("MODIFIED", o.metadata.labels)),
            WatchEvent::Deleted(o) => seen.push(("DELETED", o.metadata.labels)),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    assert_eq!(seen.iter().map(|(t, _)| *t).collect::<Vec<_>>(), ["ADDED", "MODIFIED", "DELETED"]);
    assert_eq!(seen[1].1.as_ref().and_then(|l| l.get("patched")).map(String::as_str), Some("yes"));
}

#[tokio::test(flavor = "multi_thread")]
async fn kube_apiserver_aggregates_our_openapi_v2_for_protobuf_clients() {
    let c = shared();
    let client = c.client().await;
    // kubectl's own request for the v2 document: protobuf. kube-apiserver merges ours into it, and refuses the whole
    // document (503) when one of ours does not validate as swagger 2.0.
    let proto = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
    let answer = common::eventually_async("kube-apiserver's aggregated /openapi/v2", Duration::from_secs(60), || {
        let client = client.clone();
        async move {
            let r =
                common::requests::call(&client, axum::http::Method::GET, "/openapi/v2", &[("accept", proto)], vec![])
                    .await;
            (r.status == 200).then_some(r)
        }
    })
    .await;
    assert!(answer.body.len() > 1000, "{} bytes", answer.body.len());
    let log = c.log("kube-apiserver");
    assert!(!log.contains("invalid ParametersItem"), "kube-apiserver refused our document");
    // And what a user sees: kubectl validates a List against it.
    namespace(c, "garden-list");
    let list = json!({"apiVersion": "v1", "kind": "List",
        "items": [shootstate("garden-list", "l-1", "YWJj"), shootstate("garden-list", "l-2", "YWJj")]});
    let out = c.kubectl_ok_stdin(&["create", "-f", "-"], &list.to_string());
    assert_eq!(out.lines().count(), 2, "{out}");
}
