//! The kubectl walk-through of the README, against the real binary over TLS with full verification.

mod common;
use common::*;
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::Duration;

const SVM: &str = r#"apiVersion: migration.k8s.io/v1alpha1
kind: StorageVersionMigration
metadata:
  name: deployments-migration
spec:
  resource:
    group: apps
    version: v1
    resource: deployments
"#;

const SS: &str = r#"apiVersion: migration.k8s.io/v1alpha1
kind: StorageState
metadata:
  name: deployments.apps
spec:
  resource:
    group: apps
    resource: deployments
"#;

fn write(dir: &std::path::Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, body).expect("write manifest");
    p.display().to_string()
}

#[test]
fn discovery_and_explain() {
    let s = Server::start(&[]);
    let out = s.kubectl_ok(&["api-resources", "--api-group=migration.k8s.io"]);
    let line = |name: &str| {
        out.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("{name} missing in:\n{out}")).to_string()
    };
    let ss = line("storagestates ");
    assert!(
        ss.contains(" ss ")
            && ss.contains("migration.k8s.io/v1alpha1")
            && ss.contains("false")
            && ss.contains("StorageState"),
        "{ss}"
    );
    let svm = line("storageversionmigrations ");
    assert!(svm.contains(" svm ") && svm.contains("StorageVersionMigration"), "{svm}");

    let explain = s.kubectl_ok(&["explain", "storagestate.status"]);
    assert!(explain.contains("persistedStorageVersionHashes"), "{explain}");
    assert!(explain.contains("currentStorageVersionHash"), "{explain}");
    let explain = s.kubectl_ok(&["explain", "svm.spec.resource"]);
    assert!(explain.contains("group") && explain.contains("resource"), "{explain}");
}

#[test]
fn apply_get_patch_wait_delete() {
    let s = Server::start(&[]);
    let svm = write(&s.dir, "svm.yaml", SVM);
    let ss = write(&s.dir, "ss.yaml", SS);
    assert!(s.kubectl_ok(&["apply", "-f", &svm]).contains("created"));
    assert!(s.kubectl_ok(&["apply", "-f", &ss]).contains("created"));
    // A second apply goes through kubectl's patch path (JSON merge patch, chosen from OpenAPI).
    let changed =
        SVM.replace("  name: deployments-migration\n", "  name: deployments-migration\n  labels:\n    team: storage\n");
    std::fs::write(&svm, changed).expect("rewrite");
    assert!(s.kubectl_ok(&["apply", "-f", &svm]).contains("configured"));
    assert_eq!(
        s.kubectl_ok(&["get", "svm", "deployments-migration", "-o", "jsonpath={.metadata.labels.team}"]),
        "storage"
    );

    // A bare name is the in-tree group's, first in /apis as through the aggregator (groupPriorityMinimum 15800);
    // `svm` stays migration.k8s.io's.
    let bare = s.kubectl_ok(&["get", "storageversionmigrations", "-o", "name"]);
    assert!(bare.is_empty(), "no storagemigration.k8s.io objects yet: {bare}");
    let short = s.kubectl_ok(&["get", "svm", "-o", "name"]);
    assert!(short.starts_with("storageversionmigration.migration.k8s.io/"), "{short}");
    let table = s.kubectl_ok(&["get", "storageversionmigrations.migration.k8s.io"]);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "RESOURCE", "STATUS", "MIGRATED", "PROGRESS", "REMAINING", "AGE"], "{table}");
    assert!(table.contains("deployments.v1.apps") && table.contains("Pending"), "{table}");
    let table = s.kubectl_ok(&["get", "ss"]);
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    // Split on whitespace: "WRITE KEY" and "KEYS IN USE" are one column each.
    let columns = ["NAME", "CURRENT", "PERSISTED", "HEARTBEAT", "WRITE", "KEY", "KEYS", "IN", "USE", "ROTATION", "AGE"];
    assert_eq!(header, columns, "{table}");
    assert!(table.contains("deployments.apps") && table.contains("Unknown"), "{table}");

    let yaml = s.kubectl_ok(&["get", "ss", "deployments.apps", "-o", "yaml"]);
    for want in [
        "apiVersion: migration.k8s.io/v1alpha1",
        "kind: StorageState",
        "uid:",
        "resourceVersion:",
        "creationTimestamp:",
        "generation: 1",
        "- Unknown",
    ] {
        assert!(yaml.contains(want), "{want} missing:\n{yaml}");
    }

    // merge and JSON patches on the main resource; status patch via the subresource.
    s.kubectl_ok(&[
        "patch",
        "svm",
        "deployments-migration",
        "--type=merge",
        "-p",
        r#"{"spec":{"continueToken":"abc"}}"#,
    ]);
    assert_eq!(s.kubectl_ok(&["get", "svm", "deployments-migration", "-o", "jsonpath={.spec.continueToken}"]), "abc");
    assert_eq!(s.kubectl_ok(&["get", "svm", "deployments-migration", "-o", "jsonpath={.metadata.generation}"]), "2");
    s.kubectl_ok(&[
        "patch",
        "svm",
        "deployments-migration",
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/metadata/annotations","value":{"a":"b"}}]"#,
    ]);
    assert_eq!(s.kubectl_ok(&["get", "svm", "deployments-migration", "-o", "jsonpath={.metadata.annotations.a}"]), "b");
    // Status written through the main resource is ignored.
    s.kubectl_ok(&[
        "patch",
        "svm",
        "deployments-migration",
        "--type=merge",
        "-p",
        r#"{"status":{"migratedObjects":5}}"#,
    ]);
    assert_eq!(s.kubectl_ok(&["get", "svm", "deployments-migration", "-o", "jsonpath={.status.migratedObjects}"]), "");

    // kubectl wait sees the condition set through /status.
    let wait = Command::new("kubectl")
        .args([
            "--kubeconfig",
            &s.kubeconfig().display().to_string(),
            "wait",
            "--for=condition=Succeeded",
            "svm/deployments-migration",
            "--timeout=60s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl wait");
    s.kubectl_ok(&[
        "patch", "svm", "deployments-migration", "--subresource=status", "--type=merge", "-p",
        r#"{"status":{"migratedObjects":7,"conditions":[{"type":"Succeeded","status":"True","reason":"Done","message":"all migrated"}]}}"#,
    ]);
    let out = wait.wait_with_output().expect("wait output");
    assert!(out.status.success(), "kubectl wait: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("condition met"));
    let table = s.kubectl_ok(&["get", "svm"]);
    assert!(table.contains("Succeeded") && table.contains(" 7 "), "{table}");
    // Terminal conditions never revert.
    let out = s.kubectl(&[
        "patch",
        "svm",
        "deployments-migration",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"conditions":[{"type":"Succeeded","status":"False"}]}}"#,
    ]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("status.conditions"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    assert!(s.kubectl_ok(&["delete", "svm", "deployments-migration"]).contains("deleted"));
    let out = s.kubectl(&["get", "svm", "deployments-migration"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NotFound")
            || String::from_utf8_lossy(&out.stderr).contains("not found")
    );
}

#[test]
fn name_must_agree_with_spec_and_stale_writes_conflict() {
    let s = Server::start(&[]);
    let bad = SS.replace("name: deployments.apps", "name: pods");
    let out = s.kubectl_stdin(&["create", "-f", "-"], &bad);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // The field once: kubectl prints each cause's field and message, and the message leaves the field out.
    assert!(
        err.starts_with("The StorageState \"pods\" is invalid: metadata.name: Invalid value: \"pods\": must be "),
        "{err}"
    );
    assert_eq!(err.matches("metadata.name").count(), 1, "{err}");

    s.kubectl_stdin(&["create", "-f", "-"], SS);
    let yaml = s.kubectl_ok(&["get", "ss", "deployments.apps", "-o", "json"]);
    let mut obj: serde_json::Value = serde_json::from_str(&yaml).expect("json");
    // Bump the object, then replace with the stale copy: 409.
    s.kubectl_ok(&["label", "ss", "deployments.apps", "x=y"]);
    obj["metadata"]["labels"] = serde_json::json!({"stale": "true"});
    let out = s.kubectl_stdin(&["replace", "-f", "-"], &obj.to_string());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the object has been modified; please apply your changes to the latest version and try again"),
        "{err}"
    );
}

#[test]
fn chunked_get_and_watch() {
    let s = Server::start(&[]);
    // Watch first; creations must arrive as events.
    let mut w = Command::new("kubectl")
        .args(["--kubeconfig", &s.kubeconfig().display().to_string(), "get", "ss", "-w", "--output-watch-events"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get -w");
    let stdout = w.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let names = ["pods", "deployments.apps", "jobs.batch", "cronjobs.batch", "services", "configmaps"];
    for n in names {
        let (res, group) = n.split_once('.').unwrap_or((n, ""));
        let body = format!("apiVersion: migration.k8s.io/v1alpha1\nkind: StorageState\nmetadata:\n  name: {n}\nspec:\n  resource:\n    group: \"{group}\"\n    resource: {res}\n");
        s.kubectl_ok_stdin(&["create", "-f", "-"], &body);
    }
    let mut seen = std::collections::HashSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < names.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = rx.recv_timeout(left).expect("watch events in time");
        if line.contains("ADDED") {
            if let Some(n) = names.iter().find(|n| line.split_whitespace().nth(1) == Some(**n)) {
                seen.insert(*n);
            }
        }
    }
    let _ = w.kill();
    let _ = w.wait();

    let out = s.kubectl_ok(&["get", "ss", "--chunk-size=2", "-o", "name"]);
    assert_eq!(out.lines().count(), names.len(), "{out}");
    let verbose = s.kubectl(&["get", "ss", "--chunk-size=2", "-v=6"]);
    let log = String::from_utf8_lossy(&verbose.stderr);
    assert!(log.matches("limit=2").count() >= 3, "expected several chunked requests:\n{log}");
}
