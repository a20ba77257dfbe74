//! Kubernetes' own migration API, `storagemigration.k8s.io`, with a real kube-apiserver and kube-controller-manager
//! (v1.37.2): on a cluster that turned the group off (`make cluster INTREE=off`) the deploy kit registers ours and
//! this server migrates real resources through the aggregator; on a cluster that serves it, kube-controller-manager's
//! controller runs the same migration, and the two report the same conditions; and docs/install/handover.md, followed
//! as written, hands the group from this server to the cluster after an upgrade.

mod common;
use common::cluster::{kube_bin, Cluster, Options};
use serde_json::{json, Value};
use std::io::BufReader;
use std::process::{Command, Stdio};
use std::time::Duration;

const GROUP_OFF: &str = "--runtime-config=storagemigration.k8s.io/v1=false,storagemigration.k8s.io/v1beta1=false";
const CONTROLLER_OFF: &str = "--controllers=*,-storage-version-migrator-controller";

fn intree_off() -> Cluster {
    Cluster::up(Options { in_tree: false, ..Options::default() })
}

/// `n` Deployments in `namespace` (the kit's RBAC lets our migrator list and patch them).
fn deployments(c: &Cluster, namespace: &str, n: usize) {
    c.kubectl_ok(&["create", "namespace", namespace]);
    for i in 0..n {
        c.kubectl_ok(&["create", "deployment", &format!("d-{i}"), "--image=registry.invalid/none", "-n", namespace]);
    }
}

fn migration(name: &str) -> Value {
    json!({"apiVersion": "storagemigration.k8s.io/v1", "kind": "StorageVersionMigration",
        "metadata": {"name": name}, "spec": {"resource": {"group": "apps", "resource": "deployments"}}})
}

/// The migration's conditions as they change, from its creation until one is Succeeded or Failed (or 4 minutes
/// passed: kube-controller-manager's controller starts a migration only once its garbage collector's caches have
/// synced with discovery, which after a hand-over can take a minute or two on 2 busy cores): for each version of
/// the object seen by a watch, its (type, status, reason) triples.
fn condition_sequence(c: &Cluster, name: &str) -> Vec<Vec<(String, String, String)>> {
    let mut watch = Command::new(kube_bin("kubectl"))
        .arg("--kubeconfig")
        .arg(c.admin())
        .args(["get", "storageversionmigrations.storagemigration.k8s.io", "-w", "-o", "json", "--request-timeout=240s"])
        .arg(format!("--field-selector=metadata.name={name}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get -w");
    c.kubectl_ok_stdin(&["create", "-f", "-"], &migration(name).to_string());
    let stream = serde_json::Deserializer::from_reader(BufReader::new(watch.stdout.take().expect("stdout")));
    let mut seen: Vec<Vec<(String, String, String)>> = Vec::new();
    for object in stream.into_iter::<Value>() {
        let object = object.expect("a JSON object from the watch");
        let conditions: Vec<(String, String, String)> = object["status"]["conditions"]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .map(|c| {
                        let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
                        (s("type"), s("status"), s("reason"))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let ended = conditions.iter().any(|(t, s, _)| (t == "Succeeded" || t == "Failed") && s == "True");
        if seen.last() != Some(&conditions) {
            seen.push(conditions);
        }
        if ended {
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    seen
}

#[test]
fn with_the_group_off_this_server_serves_it_and_migrates_real_resources() {
    let c = intree_off();
    // The kit told it from discovery (v1.37.2 with the group off has no APIService of it) and registered ours.
    for name in ["v1.storagemigration.k8s.io", "v1beta1.storagemigration.k8s.io"] {
        let a = c.kubectl_json(&["get", "apiservice", name, "-o", "json"]);
        assert_eq!(a["spec"]["service"]["name"], "migration-apiserver", "{name}: {}", a["spec"]);
    }
    let deploy = c.log("deploy");
    assert!(!deploy.contains("skipping"), "{deploy}");
    let registered: Vec<&str> = deploy
        .lines()
        .filter_map(|l| l.strip_prefix("apiservice.apiregistration.k8s.io/")?.strip_suffix(" created"))
        .collect();
    assert_eq!(
        registered,
        [
            "v1.storagemigration.k8s.io",
            "v1alpha1.core.gardener.cloud",
            "v1alpha1.migration.k8s.io",
            "v1beta1.core.gardener.cloud",
            "v1beta1.storagemigration.k8s.io"
        ],
        "{deploy}"
    );
    let resources = c.kubectl_ok(&["api-resources", "--api-group=storagemigration.k8s.io"]);
    assert!(
        resources.contains("storageversionmigrations") && resources.contains("storagemigration.k8s.io/v1"),
        "{resources}"
    );

    deployments(&c, "intree-off", 3);
    let sequence = condition_sequence(&c, "deployments-off");
    let last = sequence.last().expect("conditions");
    assert!(
        last.iter().any(|(t, s, r)| t == "Succeeded" && s == "True" && r == "StorageVersionMigrationSucceeded"),
        "{sequence:?}"
    );
    // Our migrator ran it (kube-controller-manager's controller is off here).
    let log = c.log("migration-apiserver");
    assert!(log.contains("deployments-off"), "our migrator ran it");
    // kube-controller-manager's own controller does not run on this cluster.
    assert!(!c.log("kube-controller-manager").contains("deployments-off"));
}

#[test]
fn with_the_group_on_kube_controller_manager_runs_it_with_the_conditions_ours_report() {
    let ours = intree_off();
    let theirs = Cluster::up(Options { server: false, ..Options::default() });
    deployments(&ours, "oracle", 3);
    deployments(&theirs, "oracle", 3);
    let our_sequence = condition_sequence(&ours, "deployments-oracle");
    let their_sequence = condition_sequence(&theirs, "deployments-oracle");
    // Upstream's controller sets Running, then Succeeded with Running False: the same final conditions.
    let sorted = |mut v: Vec<(String, String, String)>| {
        v.sort();
        v
    };
    assert_eq!(
        sorted(our_sequence.last().cloned().expect("ours")),
        sorted(their_sequence.last().cloned().expect("theirs")),
        "ours {our_sequence:?}, kube-controller-manager's {their_sequence:?}"
    );
    // Every state ours passed through is one upstream's passes through too (ours may be seen in fewer steps).
    for state in &our_sequence {
        assert!(
            their_sequence.iter().any(|s| sorted(s.clone()) == sorted(state.clone())),
            "ours passed {state:?}, which kube-controller-manager's never shows: {their_sequence:?}"
        );
    }
}

/// The fenced `sh` block of docs/install/handover.md's first section ("Handing over to the in-tree controller").
fn handover_apiservice_block() -> String {
    let doc = std::fs::read_to_string(common::repo().join("docs/install/handover.md")).expect("handover.md");
    let section = doc.split("## Handing over to the in-tree controller").nth(1).expect("the section");
    let section = section.split("\n## ").next().expect("section end");
    let block = section.split("```sh\n").nth(1).expect("a sh block").split("```").next().expect("block end");
    block.lines().map(|l| l.strip_prefix("   ").unwrap_or(l)).collect::<Vec<_>>().join("\n")
}

#[test]
fn the_handover_guide_hands_the_group_to_the_cluster_after_an_upgrade() {
    let c = intree_off();
    deployments(&c, "handover", 2);
    // A migration of ours, before the upgrade.
    let before = condition_sequence(&c, "before-upgrade");
    assert!(before.last().expect("conditions").iter().any(|(t, s, _)| t == "Succeeded" && s == "True"));

    // The upgrade: kube-apiserver and kube-controller-manager now serve and run the group.
    c.restart_with("kube-apiserver", GROUP_OFF, "--runtime-config=storagemigration.k8s.io/v1=true");
    c.restart_with("kube-controller-manager", CONTROLLER_OFF, "--controllers=*");
    // Our APIService is still in the way: kube-apiserver's autoregister leaves an APIService it did not create.
    let ours = c.kubectl_json(&["get", "apiservice", "v1.storagemigration.k8s.io", "-o", "json"]);
    assert_eq!(ours["spec"]["service"]["name"], "migration-apiserver", "{}", ours["spec"]);
    // The server says so (it checks at its start, and every 10 minutes), naming what to delete, and exports it.
    c.restart("migration-apiserver");
    let log = common::eventually("the warning", Duration::from_secs(60), || {
        let log = c.log("migration-apiserver");
        log.contains("kubectl delete apiservice v1beta1.storagemigration.k8s.io").then_some(log)
    });
    let warning = log
        .lines()
        .find(|l| l.contains("kubectl delete apiservice v1.storagemigration.k8s.io "))
        .unwrap_or_else(|| panic!("no warning for v1: {log}"));
    assert!(
        warning.contains("WARN")
            && warning.contains(
                "APIService v1.storagemigration.k8s.io of this server hides storagemigration.k8s.io: the cluster \
                 (v1.37.2) serves storagemigration.k8s.io/v1 itself (built in from v1.37 on); delete it to hand the \
                 group over to kube-apiserver: kubectl delete apiservice v1.storagemigration.k8s.io"
            ),
        "{warning}"
    );
    assert!(!log.contains("kubectl delete apiservice v1alpha1.migration.k8s.io"), "{log}");
    let discovery = c.kubectl_ok(&["get", "--raw", "/apis/migration.k8s.io/v1alpha1"]);
    assert!(discovery.contains("storagestates"), "migration.k8s.io keeps working: {discovery}");
    let hiding = c.server_metric_lines("migration_apiserver_apiservice_hiding_builtin_group");
    assert_eq!(
        hiding,
        [
            "migration_apiserver_apiservice_hiding_builtin_group{apiservice=\"v1.storagemigration.k8s.io\",group=\"storagemigration.k8s.io\"} 1",
            "migration_apiserver_apiservice_hiding_builtin_group{apiservice=\"v1beta1.storagemigration.k8s.io\",group=\"storagemigration.k8s.io\"} 1",
        ]
    );

    // The guide, step by step as written.
    c.kubectl_ok(&[
        "wait",
        "--for=condition=Succeeded",
        "storageversionmigrations.storagemigration.k8s.io",
        "--all",
        "--timeout=1h",
    ]);
    c.kubectl_ok(&["delete", "apiservice", "v1.storagemigration.k8s.io", "v1beta1.storagemigration.k8s.io"]);
    let block = handover_apiservice_block();
    let out = Command::new("bash")
        .arg("-c")
        .arg(&block)
        .env(
            "PATH",
            format!("{}:{}", common::cluster::kube_bin_dir().display(), std::env::var("PATH").unwrap_or_default()),
        )
        .env("KUBECONFIG", c.admin())
        .output()
        .expect("bash");
    assert!(out.status.success(), "{block}\n{}", String::from_utf8_lossy(&out.stderr));

    // kube-apiserver serves the group now, and kube-controller-manager's controller runs its migrations.
    let local = c.kubectl_json(&["get", "apiservice", "v1.storagemigration.k8s.io", "-o", "json"]);
    assert!(local["spec"].get("service").is_none(), "{}", local["spec"]);
    common::eventually("the local APIService Available", Duration::from_secs(60), || {
        let a = c.kubectl_json(&["get", "apiservice", "v1.storagemigration.k8s.io", "-o", "json"]);
        let conditions = a["status"]["conditions"].as_array().cloned().unwrap_or_default();
        conditions.iter().any(|c| c["type"] == "Available" && c["status"] == "True").then_some(())
    });
    let listed = c.kubectl_ok(&["get", "storageversionmigrations.storagemigration.k8s.io", "-o", "name"]);
    assert!(!listed.contains("before-upgrade"), "kube-apiserver's collection starts empty: {listed}");
    let after = condition_sequence(&c, "after-handover");
    let kcm = c.log("kube-controller-manager");
    let kcm_tail: Vec<&str> = kcm.lines().filter(|l| l.contains("storage") || l.contains("garbage")).collect();
    assert!(
        after.last().expect("conditions").iter().any(|(t, s, _)| t == "Succeeded" && s == "True"),
        "{after:?}\n{}",
        kcm_tail[kcm_tail.len().saturating_sub(40)..].join("\n")
    );
    assert!(!c.log("migration-apiserver").contains("after-handover"), "our migrator must not have run it");
}
