//! Events served standalone, in the core group and in events.k8s.io/v1, one storage: written through one group and
//! read through the other by the Python `kubernetes` client and kubectl (`get events`, field selectors,
//! `describe`), watched, validated as kube-apiserver validates them, and expired `--event-ttl` after their last
//! write.

mod common;
use common::requests::*;
use common::status::table_columns;
use common::*;
use serde_json::{json, Value};
use std::time::Duration;

/// A StorageVersionMigration to be the object events are about (cluster-scoped, as the recorder's are); its uid.
fn create_svm(s: &Server, name: &str) -> String {
    let manifest = format!(
        "apiVersion: migration.k8s.io/v1alpha1\nkind: StorageVersionMigration\nmetadata: {{name: {name}}}\n\
         spec: {{resource: {{group: apps, version: v1, resource: deployments}}}}\n"
    );
    s.kubectl_ok_stdin(&["create", "-f", "-"], &manifest);
    s.kubectl_ok(&["get", "storageversionmigrations.migration.k8s.io", name, "-o", "jsonpath={.metadata.uid}"])
}

/// An events.k8s.io/v1 Event about the migration `svm` (`uid`), valid for the new API.
fn new_event(name: &str, svm: &str, uid: &str, note: &str) -> Value {
    json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": "default"},
        "eventTime": chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
        "reportingController": "migration.k8s.io/storage-version-migrator", "reportingInstance": "replica-1",
        "action": "Migrate", "reason": "Succeeded", "note": note, "type": "Normal",
        "regarding": {"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration", "name": svm, "uid": uid},
    })
}

/// Must-show: the Python client creates through events.k8s.io/v1 (`EventsV1Api`) and reads back through core/v1
/// with kubectl's field selectors; kubectl lists, selects, prints and describes.
#[test]
fn events_written_in_one_group_read_in_the_other() {
    let s = Server::start(&["--disable-scheduler"]);
    let uid = create_svm(&s, "svm-a");
    let other_uid = create_svm(&s, "svm-b");
    let script = r#"
import json, sys
from kubernetes import client, config
config.load_kube_config(config_file=sys.argv[1])
api = client.ApiClient()
events, core = client.EventsV1Api(api), client.CoreV1Api(api)
for body in json.loads(sys.argv[2]):
    events.create_namespaced_event("default", body)
selector = "involvedObject.kind=StorageVersionMigration,involvedObject.name=svm-a,involvedObject.namespace=,involvedObject.uid=" + sys.argv[3]
selected = core.list_namespaced_event("default", field_selector=selector).items
everywhere = core.list_event_for_all_namespaces(field_selector="involvedObject.name=svm-b").items
regarding = events.list_namespaced_event("default", field_selector="regarding.name=svm-a").items
print(json.dumps({
    "selected": [(e.metadata.name, e.message, e.reporting_component, e.involved_object.uid) for e in selected],
    "everywhere": [e.metadata.name for e in everywhere],
    "regarding": [(e.metadata.name, e.note) for e in regarding],
}))
"#;
    let bodies =
        json!([new_event("a-1", "svm-a", &uid, "migrated 7 objects"), new_event("b-1", "svm-b", &other_uid, "b")]);
    let out = python(&["-c", script, &s.kubeconfig().display().to_string(), &bodies.to_string(), &uid]);
    let answer: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let controller = "migration.k8s.io/storage-version-migrator";
    assert_eq!(answer["selected"], json!([["a-1", "migrated 7 objects", controller, uid]]), "{answer}");
    assert_eq!(answer["everywhere"], json!(["b-1"]), "{answer}");
    assert_eq!(answer["regarding"], json!([["a-1", "migrated 7 objects"]]), "{answer}");

    let all = s.kubectl_ok(&["get", "events", "-A"]);
    let header: Vec<&str> = all.lines().next().unwrap_or_default().split("  ").filter(|c| !c.is_empty()).collect();
    let header: Vec<&str> = header.iter().map(|c| c.trim()).collect();
    assert_eq!(header, ["NAMESPACE", "LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"], "{all}");
    assert!(all.contains("storageversionmigration/svm-a") && all.contains("migrated 7 objects"), "{all}");
    let selected = s.kubectl_ok(&[
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        "involvedObject.kind=StorageVersionMigration",
        "-o",
        "name",
    ]);
    assert_eq!(selected.lines().collect::<Vec<_>>(), ["event/a-1", "event/b-1"]);
    let yaml = s.kubectl_ok(&["get", "ev", "-n", "default", "a-1", "-o", "yaml"]);
    assert!(
        yaml.contains("apiVersion: v1\n")
            && yaml.contains("involvedObject:")
            && yaml.contains("message: migrated 7 objects"),
        "{yaml}"
    );
    let wide = s.kubectl_ok(&["get", "events", "-n", "default", "-o", "wide"]);
    assert!(wide.contains("migration.k8s.io/storage-version-migrator, replica-1"), "{wide}");

    // kubectl describe finds a cluster-scoped object's events (in namespace default) by its field selector.
    let described = s.kubectl_ok(&["describe", "storageversionmigrations.migration.k8s.io", "svm-a"]);
    let events = described.split("Events:").nth(1).unwrap_or_else(|| panic!("no Events section: {described}"));
    assert!(events.contains("Succeeded") && events.contains("migrated 7 objects"), "{described}");
    assert!(!events.contains(" b\n"), "only svm-a's events: {described}");
}

/// A watch through the core group sees an event written through events.k8s.io, and one through events.k8s.io sees
/// a merge patch written through the core group, each in its own version's form.
#[test]
fn watches_see_writes_through_either_group() {
    let s = Server::start(&["--disable-scheduler"]);
    let uid = create_svm(&s, "svm-w");
    let script = r#"
import json, sys
from kubernetes import client, config, watch
config.load_kube_config(config_file=sys.argv[1])
api = client.ApiClient()
events, core = client.EventsV1Api(api), client.CoreV1Api(api)
rv = core.list_namespaced_event("default").metadata.resource_version
events.create_namespaced_event("default", json.loads(sys.argv[2]))
seen = []
for ev in watch.Watch().stream(core.list_namespaced_event, "default", resource_version=rv, timeout_seconds=10):
    seen.append((ev["type"], ev["object"].metadata.name, ev["object"].message))
    break
rv = events.list_namespaced_event("default").metadata.resource_version
core.patch_namespaced_event("w-1", "default", {"count": 3}, _content_type="application/merge-patch+json")
for ev in watch.Watch().stream(events.list_namespaced_event, "default", resource_version=rv, timeout_seconds=10):
    seen.append((ev["type"], ev["object"].metadata.name, ev["object"].deprecated_count))
    break
print(json.dumps(seen))
"#;
    let body = new_event("w-1", "svm-w", &uid, "watched");
    let out = python(&["-c", script, &s.kubeconfig().display().to_string(), &body.to_string()]);
    let seen: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(seen, json!([["ADDED", "w-1", "watched"], ["MODIFIED", "w-1", 3]]));
}

/// Validation as kube-apiserver's: events.k8s.io/v1 requires the new API's fields (422 naming them), core/v1 is
/// lenient; an update through events.k8s.io keeps what was written; field labels outside the kind's are a 400.
#[tokio::test]
async fn validation_and_field_labels() {
    let s = Server::start(&["--disable-scheduler"]);
    let c = s.client().await;
    let bare = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "bare", "namespace": "default"},
                      "regarding": {"kind": "StorageVersionMigration", "name": "x"}, "note": "n"});
    let status = post(&c, "/apis/events.k8s.io/v1/namespaces/default/events", &bare).await.status_err(422, "Invalid");
    let mut fields: Vec<&str> =
        status["details"]["causes"].as_array().expect("causes").iter().filter_map(|c| c["field"].as_str()).collect();
    fields.dedup();
    assert_eq!(fields, ["eventTime", "type"], "{status}");
    assert_eq!(status["details"]["kind"], "Event", "{status}");
    assert_eq!(status["details"]["group"], "events.k8s.io", "{status}");

    let mut incomplete = bare.clone();
    incomplete["eventTime"] = json!("2026-11-26T10:00:00.000000Z");
    incomplete["type"] = json!("Normal");
    let status =
        post(&c, "/apis/events.k8s.io/v1/namespaces/default/events", &incomplete).await.status_err(422, "Invalid");
    let mut fields: Vec<&str> =
        status["details"]["causes"].as_array().expect("causes").iter().filter_map(|c| c["field"].as_str()).collect();
    fields.dedup();
    assert_eq!(fields, ["reportingController", "reportingInstance", "action", "reason"], "{status}");

    // The same event as an old core/v1 client writes it (no eventTime): accepted.
    let old_style = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "old", "namespace": "default"},
                           "involvedObject": {"kind": "StorageVersionMigration", "name": "x"}, "message": "n"});
    post(&c, "/api/v1/namespaces/default/events", &old_style).await.ok(201);
    // core/v1 with an involved object in another namespace: the legacy rule.
    let mut elsewhere = old_style.clone();
    elsewhere["metadata"]["name"] = json!("elsewhere");
    elsewhere["involvedObject"]["namespace"] = json!("kube-system");
    let status = post(&c, "/api/v1/namespaces/default/events", &elsewhere).await.status_err(422, "Invalid");
    assert_eq!(status["details"]["causes"][0]["field"], "involvedObject.namespace", "{status}");

    // Written through events.k8s.io: the note (message) cannot change there; through core/v1 it can.
    let uid = create_svm(&s, "svm-v");
    post(&c, "/apis/events.k8s.io/v1/namespaces/default/events", &new_event("v-1", "svm-v", &uid, "first"))
        .await
        .ok(201);
    let status = merge_patch(&c, "/apis/events.k8s.io/v1/namespaces/default/events/v-1", &json!({"note": "second"}))
        .await
        .status_err(422, "Invalid");
    assert_eq!(status["details"]["causes"][0]["field"], "message", "{status}");
    let patched = merge_patch(&c, "/api/v1/namespaces/default/events/v-1", &json!({"message": "second"})).await.ok(200);
    assert_eq!(patched["message"], "second");
    let read = get(&c, "/apis/events.k8s.io/v1/namespaces/default/events/v-1").await.ok(200);
    assert_eq!((read["apiVersion"].as_str(), read["note"].as_str()), (Some("events.k8s.io/v1"), Some("second")));

    for (path, label) in [
        ("/api/v1/events?fieldSelector=spec.x%3D1", "spec.x"),
        ("/apis/events.k8s.io/v1/events?fieldSelector=involvedObject.name%3Dx", "involvedObject.name"),
        ("/apis/events.k8s.io/v1/namespaces/default/events?fieldSelector=note%3Dx", "note"),
    ] {
        let status = get(&c, path).await.status_err(400, "BadRequest");
        assert_eq!(status["message"], format!("field label not supported: {label}"), "{path}");
    }
    let listed = get(
        &c,
        "/apis/events.k8s.io/v1/events?fieldSelector=reportingController%3Dmigration.k8s.io/storage-version-migrator",
    )
    .await
    .ok(200);
    let names: Vec<&str> =
        listed["items"].as_array().expect("items").iter().filter_map(|i| i["metadata"]["name"].as_str()).collect();
    assert_eq!(names, ["v-1"]);
    let listed =
        get(&c, "/api/v1/events?fieldSelector=source%3Dmigration.k8s.io/storage-version-migrator").await.ok(200);
    assert_eq!(listed["items"].as_array().map(Vec::len), Some(1), "source falls back to reportingComponent: {listed}");
}

/// Discovery lists events in both groups with kube-apiserver's short name; the Table has kube-apiserver's event
/// printer columns (no NAME first, no AGE; the wide ones with priority 1).
#[tokio::test]
async fn discovery_and_table() {
    let s = Server::start(&["--disable-scheduler"]);
    let c = s.client().await;
    for path in ["/api/v1", "/apis/events.k8s.io/v1"] {
        let list = get(&c, path).await.ok(200);
        let events = list["resources"].as_array().expect("resources").iter().find(|r| r["name"] == "events").cloned();
        let events = events.unwrap_or_else(|| panic!("no events in {path}: {list}"));
        assert_eq!((events["kind"].as_str(), events["namespaced"].as_bool()), (Some("Event"), Some(true)), "{path}");
        assert_eq!(events["shortNames"], json!(["ev"]), "{path}");
        // kube-apiserver's hash of the storage version, core/v1 Event, for both groups.
        assert_eq!(events["storageVersionHash"], "r2yiGXH7wu8=", "{path}");
    }
    let uid = create_svm(&s, "svm-t");
    post(&c, "/apis/events.k8s.io/v1/namespaces/default/events", &new_event("t-1", "svm-t", &uid, "table"))
        .await
        .ok(201);
    for path in ["/api/v1/namespaces/default/events", "/apis/events.k8s.io/v1/namespaces/default/events"] {
        let table = get_accept(&c, path, "application/json;as=Table;v=v1;g=meta.k8s.io").await.ok(200);
        let columns = table_columns(&table);
        let want = [
            ("Last Seen", 0),
            ("Type", 0),
            ("Reason", 0),
            ("Object", 0),
            ("Subobject", 1),
            ("Source", 1),
            ("Message", 0),
            ("First Seen", 1),
            ("Count", 1),
            ("Name", 1),
        ];
        assert_eq!(columns, want.map(|(n, p)| (n.to_string(), p)), "{path}");
        let cells = table["rows"][0]["cells"].as_array().cloned().unwrap_or_default();
        let source = "migration.k8s.io/storage-version-migrator, replica-1";
        let want = json!(["Normal", "Succeeded", "storageversionmigration/svm-t", "", source, "table"]);
        assert_eq!(Value::from(cells.get(1..7).unwrap_or_default().to_vec()), want, "{path}: {table}");
        assert_eq!((cells[8].as_i64(), cells[9].as_str()), (Some(1), Some("t-1")), "{path}: {table}");
    }
}

/// `--event-ttl`: an event goes TTL after its last write; one written again meanwhile lives on, then goes TTL
/// after that write.
#[tokio::test]
async fn events_expire_ttl_after_their_last_write() {
    let s = Server::start(&["--disable-scheduler", "--event-ttl", "2s"]);
    let c = s.client().await;
    let uid = create_svm(&s, "svm-x");
    let started = std::time::Instant::now();
    for name in ["kept", "left"] {
        post(&c, "/apis/events.k8s.io/v1/namespaces/default/events", &new_event(name, "svm-x", &uid, name))
            .await
            .ok(201);
    }
    let path = |name: &str| format!("/api/v1/namespaces/default/events/{name}");
    // "kept" is written again at every poll, so its TTL starts anew each time; "left" is not.
    let mut count = 1;
    loop {
        count += 1;
        merge_patch(&c, &path("kept"), &json!({"count": count})).await.ok(200);
        if get(&c, &path("left")).await.status == 404 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "\"left\" not expired after 30s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(started.elapsed() >= Duration::from_secs(2), "expired before its TTL: {:?}", started.elapsed());
    get(&c, &path("kept")).await.ok(200);
    let last_write = std::time::Instant::now();
    loop {
        if get(&c, &path("kept")).await.status == 404 {
            break;
        }
        assert!(last_write.elapsed() < Duration::from_secs(30), "\"kept\" not expired 30s after its last write");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(last_write.elapsed() >= Duration::from_millis(1500), "expired before its TTL");
}

/// Events found at start count from their last write as managedFields record it: after a restart, an event last
/// written an hour ago goes at once under a 30 minute TTL, one written just now stays.
#[test]
fn events_found_at_start_count_from_their_last_write() {
    if etcd_backend_selected() {
        return; // The events are planted in the embedded store's file; the mechanism is the same on etcd.
    }
    let mut s = Server::start(&["--disable-scheduler"]);
    s.stop();
    for (name, age) in [("old", chrono::Duration::hours(1)), ("fresh", chrono::Duration::zero())] {
        let written = (chrono::Utc::now() - age).format("%Y-%m-%dT%H:%M:%SZ").to_string();
        let stored = json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "default", "uid": name, "creationTimestamp": written,
                         "managedFields": [{"manager": "recorder", "operation": "Update", "apiVersion": "v1", "time": written,
                                            "fieldsType": "FieldsV1", "fieldsV1": {"f:message": {}}}]},
            "involvedObject": {"kind": "StorageVersionMigration", "name": "m"}, "message": name});
        s.write_raw(&format!("/registry/events/default/{name}"), &serde_json::to_vec(&stored).expect("json"));
    }
    // And one no reader can take: it does not stop the others from expiring.
    s.write_raw("/registry/events/default/unreadable", b"\x00\x01 not json");
    s.restart_with(&["--disable-scheduler", "--event-ttl", "30m"]);
    let exists = |name: &str| s.kubectl(&["get", "events", "-n", "default", name]).status.success();
    eventually("the hour-old event to go", Duration::from_secs(20), || (!exists("old")).then_some(()));
    assert!(exists("fresh"), "the event written just now stays");
    // A list through either group fails with a store read error, as for any kind.
    for resource in ["events", "events.v1.events.k8s.io"] {
        let out = s.kubectl(&["get", resource, "-n", "default"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("(StorageReadError)"), "{resource}: {err}");
    }
}

/// kube-runtime's event Recorder (events.k8s.io/v1: a create, then merge patches of the event's series) publishes
/// here as to kube-apiserver, and `kubectl describe` shows the series.
#[tokio::test]
async fn kube_runtime_recorder_publishes_a_series() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let s = Server::start(&["--disable-scheduler"]);
    let uid = create_svm(&s, "svm-k");
    let reference = ObjectReference {
        api_version: Some("migration.k8s.io/v1alpha1".into()),
        kind: Some("StorageVersionMigration".into()),
        name: Some("svm-k".into()),
        uid: Some(uid),
        ..Default::default()
    };
    let reporter =
        Reporter { controller: "migration.k8s.io/storage-version-migrator".into(), instance: Some("replica-1".into()) };
    let recorder = Recorder::new(s.client().await, reporter);
    let event = Event {
        type_: EventType::Warning,
        reason: "Retrying".into(),
        note: Some("the target answered 503".into()),
        action: "Migrate".into(),
        secondary: None,
    };
    for _ in 0..3 {
        recorder.publish(&event, &reference).await.expect("published");
    }
    let described = s.kubectl_ok(&["describe", "storageversionmigrations.migration.k8s.io", "svm-k"]);
    let events = described.split("Events:").nth(1).unwrap_or_else(|| panic!("no Events section: {described}"));
    assert!(
        events.contains("Retrying") && events.contains("(x3 over") && events.contains("the target answered 503"),
        "{described}"
    );
}
