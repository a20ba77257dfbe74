//! How an in-tree (`storagemigration.k8s.io`) migration fails, against the real binary: a resource not in discovery
//! ends Failed with the in-tree controller's reason and message after its grace (GA: a minute from creation), with
//! no `status.resourceVersion`; and a write of the migration's own state that this server's validation refuses ends
//! the migration Failed with the refusal, logged once, never retried in a loop.

mod common;
use common::*;
use serde_json::{json, Value};
use std::time::Duration;

const IN_TREE: &str = "storageversionmigrations.storagemigration.k8s.io";

fn condition<'a>(m: &'a Value, type_: &str) -> &'a Value {
    m["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == type_)).unwrap_or(&Value::Null)
}

/// Polls until the migration Failed and the runner ended it (Running False, as at GA).
fn failed(s: &Server, name: &str, within: Duration) -> Value {
    eventually(&format!("{name} to fail"), within, || {
        let m = s.kubectl_json(&["get", IN_TREE, name, "-o", "json"]);
        (condition(&m, "Failed")["status"] == "True" && condition(&m, "Running")["status"] != "True").then_some(m)
    })
}

fn seconds(t: &Value) -> i64 {
    let t: k8s_openapi::jiff::Timestamp = t.as_str().expect("a time").parse().expect("RFC 3339");
    t.as_second()
}

fn create(s: &Server, manifest: &Value) -> String {
    let out = s.kubectl_ok_stdin(&["create", "-f", "-", "-o", "jsonpath={.metadata.name}"], &manifest.to_string());
    out.trim().to_string()
}

#[test]
fn a_resource_not_in_discovery_fails_after_the_in_tree_grace() {
    let s = Server::start(&["--disable-trigger"]);
    // Two at once: one migration per resource runs at a time, so the second waits for the first to end, and then
    // fails at once (its own grace has passed by then).
    let manifest = |name: &str| {
        json!({"apiVersion": "storagemigration.k8s.io/v1", "kind": "StorageVersionMigration",
               "metadata": {"name": name},
               "spec": {"resource": {"group": "nothing.example.com", "resource": "widgets"}}})
    };
    let first = create(&s, &manifest("widgets-1"));
    let second = create(&s, &manifest("widgets-2"));
    let m = failed(&s, &first, Duration::from_secs(150));
    let f = condition(&m, "Failed");
    assert_eq!(f["reason"], "StorageVersionMigrationFailed", "{m:#}");
    assert_eq!(f["message"], "resource does not exist in discovery", "{m:#}");
    let waited = seconds(&f["lastTransitionTime"]) - seconds(&m["metadata"]["creationTimestamp"]);
    assert!((60..=90).contains(&waited), "failed {waited} s after its creation (upstream: after a minute): {m:#}");
    assert_eq!(m["status"]["resourceVersion"].as_str().unwrap_or_default(), "", "{m:#}");
    // Promoted before discovery was asked (GA: the runner first), ended by the runner after.
    let running = condition(&m, "Running");
    assert_eq!((&running["status"], &running["reason"]), (&json!("False"), &json!("MigrationCompleted")), "{m:#}");
    let m = failed(&s, &second, Duration::from_secs(60));
    assert_eq!(condition(&m, "Failed")["message"], "resource does not exist in discovery", "{m:#}");
    assert!(!s.log().contains("saving the migration failed"), "no write was refused or retried:\n{}", s.log());
}

#[test]
fn a_refused_write_of_the_migrations_state_fails_it_once() {
    let s = Server::start(&["--disable-trigger"]);
    for i in 0..3 {
        let shoot = json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
                           "metadata": {"name": format!("s-{i}"), "namespace": "garden-dev"},
                           "spec": {"gardener": [{"name": "ca", "type": "secret", "data": {"n": i}}]}});
        s.kubectl_ok_stdin(&["create", "-f", "-"], &shoot.to_string());
    }
    // A user's annotation that leaves 20 bytes of the 256 KiB all annotations may take: the progress annotations
    // the migrator records on the in-tree kind do not fit, and each such write is a 422.
    let key = "example.com/big";
    let value = "x".repeat(256 * 1024 - key.len() - 20);
    let manifest = json!({"apiVersion": "storagemigration.k8s.io/v1", "kind": "StorageVersionMigration",
                          "metadata": {"name": "shootstates-annotated", "annotations": {key: value}},
                          "spec": {"resource": {"group": "core.gardener.cloud", "resource": "shootstates"}}});
    let name = create(&s, &manifest);
    let m = failed(&s, &name, Duration::from_secs(60));
    let message = condition(&m, "Failed")["message"].as_str().expect("message").to_string();
    // The GA migrator's form: `X/Y not yet migrated. ` first once the objects were counted (the refused write may
    // come before or after the first LIST).
    let counted = message.split_once(" not yet migrated. ").filter(|(counts, _)| {
        counts.split_once('/').is_some_and(|(x, y)| x.parse::<u64>().is_ok() && y.parse::<u64>().is_ok())
    });
    let unhandled = counted.map_or(message.as_str(), |(_, rest)| rest);
    assert!(
        unhandled
            .starts_with("migration encountered unhandled error: the server refused to record the migration's state:")
            && message.contains("metadata.annotations: Too long: may not be more than 262144 bytes"),
        "{message}"
    );
    assert_eq!(condition(&m, "Failed")["reason"], "StorageVersionMigrationFailed");
    assert_eq!(
        m["metadata"]["annotations"][key].as_str().map(str::len),
        Some(value.len()),
        "the user's annotation stays"
    );
    // Ended: the refusal logged once, and the migration started once (the scheduler does not start it again).
    eventually("the end in the log", Duration::from_secs(10), || s.log().contains("migration ended").then_some(()));
    let log = s.log();
    let lines = |what: &str| log.lines().filter(|l| l.contains(what) && l.contains(&name)).count();
    assert_eq!(lines("the server refused the migration's state"), 1, "{log}");
    assert_eq!(lines("migration started"), 1, "{log}");
    assert!(!log.contains("saving the migration failed; retrying"), "{log}");
}
