//! Durability of the embedded store, through the API: a restart keeps every object exactly (resourceVersions
//! included), and a SIGKILL in the middle of a write burst loses no write that was acknowledged.

mod common;
use common::objects::{dynamic as obj, rv, svm_api, svm_json};
use common::*;

use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const API_VERSION: &str = "migration.k8s.io/v1alpha1";

fn api(c: &kube::Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("migration.k8s.io", "v1alpha1", kind), plural);
    Api::all_with(c.clone(), &ar)
}

fn states(c: &kube::Client) -> Api<DynamicObject> {
    api(c, "StorageState", "storagestates")
}

fn svm(name: &str, labels: Value) -> DynamicObject {
    let mut v = svm_json(name);
    v["metadata"]["labels"] = labels;
    obj(v)
}

/// Every object of a list as JSON, by name, plus the list's resourceVersion.
async fn snapshot(a: &Api<DynamicObject>) -> (BTreeMap<String, Value>, u64) {
    let l = a.list(&ListParams::default()).await.expect("list");
    let rev = l.metadata.resource_version.as_deref().expect("list resourceVersion").parse().expect("numeric");
    let items = l
        .items
        .into_iter()
        .map(|o| (o.metadata.name.clone().expect("name"), serde_json::to_value(&o).expect("json")))
        .collect();
    (items, rev)
}

#[tokio::test]
async fn restart_keeps_all_data() {
    let mut s = Server::start(&[]);
    let c = s.client().await;
    let pp = PostParams::default();
    let merge = |v: Value| Patch::Merge(v);

    // A little of everything: labels, annotations, spec changes (generation 2), status, a terminating object.
    for i in 0..5 {
        svm_api(&c).create(&pp, &svm(&format!("keep-{i}"), json!({"i": i.to_string()}))).await.expect("create");
    }
    svm_api(&c)
        .patch("keep-1", &PatchParams::default(), &merge(json!({"spec": {"continueToken": "t"}})))
        .await
        .expect("spec");
    svm_api(&c)
        .patch_status(
            "keep-2",
            &PatchParams::default(),
            &merge(json!({"status": {"migratedObjects": 12, "conditions": [{"type": "Succeeded", "status": "True", "reason": "Done"}]}})),
        )
        .await
        .expect("status");
    svm_api(&c)
        .patch(
            "keep-3",
            &PatchParams::default(),
            &merge(json!({"metadata": {"annotations": {"a": "b"}, "finalizers": ["example.com/hold"]}})),
        )
        .await
        .expect("finalizer");
    svm_api(&c).delete("keep-3", &Default::default()).await.expect("delete marks it");
    svm_api(&c).delete("keep-4", &Default::default()).await.expect("delete");
    for (res, group) in [("pods", ""), ("deployments", "apps")] {
        let name = if group.is_empty() { res.to_string() } else { format!("{res}.{group}") };
        states(&c)
            .create(
                &pp,
                &obj(json!({"apiVersion": API_VERSION, "kind": "StorageState", "metadata": {"name": name},
                "spec": {"resource": {"group": group, "resource": res}}})),
            )
            .await
            .expect("create state");
        states(&c)
            .patch_status(
                &name,
                &PatchParams::default(),
                &merge(
                    json!({"status": {"currentStorageVersionHash": "abc", "persistedStorageVersionHashes": ["abc"]}}),
                ),
            )
            .await
            .expect("state status");
    }
    let (svm_before, rev_before) = snapshot(&svm_api(&c)).await;
    let (ss_before, _) = snapshot(&states(&c)).await;
    assert_eq!(svm_before.keys().collect::<Vec<_>>(), ["keep-0", "keep-1", "keep-2", "keep-3"]);
    assert_eq!(svm_before["keep-1"]["metadata"]["generation"], 2);
    assert!(svm_before["keep-3"]["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(ss_before["pods"]["status"]["currentStorageVersionHash"], "abc");

    s.restart();
    let c = s.client().await;

    // Everything is as it was, to the byte of every field, resourceVersions included.
    let (svm_after, rev_after) = snapshot(&svm_api(&c)).await;
    let (ss_after, _) = snapshot(&states(&c)).await;
    assert_eq!(svm_after, svm_before);
    assert_eq!(ss_after, ss_before);
    assert!(rev_after >= rev_before, "the store's revision never goes back: {rev_after} < {rev_before}");
    for (name, before) in &svm_before {
        let got = serde_json::to_value(svm_api(&c).get(name).await.expect("get")).expect("json");
        assert_eq!(&got, before, "{name}");
    }
    svm_api(&c).get("keep-4").await.expect_err("a deleted object stays deleted");

    // New writes get newer resourceVersions than anything from before the restart.
    let max_before = svm_before
        .values()
        .chain(ss_before.values())
        .map(|v| v["metadata"]["resourceVersion"].as_str().expect("rv").parse::<u64>().expect("n"))
        .max()
        .expect("objects");
    let created = svm_api(&c).create(&pp, &svm("after", json!({}))).await.expect("create after restart");
    assert!(rv(&created) > max_before && rv(&created) > rev_before, "{} vs {max_before}/{rev_before}", rv(&created));
    let patched = svm_api(&c)
        .patch("keep-0", &PatchParams::default(), &merge(json!({"metadata": {"labels": {"x": "y"}}})))
        .await
        .expect("patch");
    assert!(rv(&patched) > rv(&created));
    // The terminating object still finishes its deletion when its finalizer goes.
    svm_api(&c)
        .patch("keep-3", &PatchParams::default(), &merge(json!({"metadata": {"finalizers": null}})))
        .await
        .expect("remove finalizer");
    svm_api(&c).get("keep-3").await.expect_err("finalized object is gone");
    // uids are unique across the restart.
    let uids: BTreeSet<String> = svm_api(&c)
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .iter()
        .map(|o| o.metadata.uid.clone().expect("uid"))
        .collect();
    assert_eq!(uids.len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_during_write_burst_loses_no_acknowledged_write() {
    const WRITERS: usize = 6;
    let mut s = Server::start(&[]);
    let c = s.client().await;
    let acked = Arc::new(Mutex::new(Vec::<String>::new()));
    let attempted = Arc::new(Mutex::new(BTreeSet::<String>::new()));

    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (a, acked, attempted) = (svm_api(&c), acked.clone(), attempted.clone());
        writers.push(tokio::spawn(async move {
            // Writes until a write fails: the server going away ends every writer.
            for i in 0.. {
                let name = format!("burst-{w}-{i:05}");
                attempted.lock().expect("lock").insert(name.clone());
                match a.create(&PostParams::default(), &svm(&name, json!({"writer": w.to_string()}))).await {
                    Ok(o) => {
                        assert_eq!(o.metadata.name.as_deref(), Some(name.as_str()));
                        acked.lock().expect("lock").push(name);
                    }
                    Err(_) => return,
                }
            }
        }));
    }

    // Let the burst run: about a second, or 1000 acknowledged writes, whichever is first.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
    let hard = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let n = acked.lock().expect("lock").len();
        let now = tokio::time::Instant::now();
        if (n >= 1000 || now >= deadline) && n >= 20 {
            break;
        }
        assert!(now < hard, "only {n} writes acknowledged in 20 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    s.kill9();
    let acked_at_kill = acked.lock().expect("lock").len();
    // Each writer ends by itself: its next write fails against the dead server. (A flag set after the kill made
    // a writer that had just been answered stop without writing again: a race, not the server's.)
    for w in writers {
        tokio::time::timeout(Duration::from_secs(20), w)
            .await
            .expect("every writer's next write fails once the server is killed")
            .expect("writer task");
    }
    let acked: Vec<String> = acked.lock().expect("lock").clone();
    assert!(acked.len() >= acked_at_kill);
    let attempted = attempted.lock().expect("lock").clone();
    eprintln!(
        "kill -9 after {acked_at_kill} acknowledged writes ({} acknowledged in all, {} attempted)",
        acked.len(),
        attempted.len()
    );

    s.restart();
    let c = s.client().await;
    let list = svm_api(&c).list(&ListParams::default()).await.expect("list after kill -9");
    let mut present = BTreeSet::new();
    let mut uids = BTreeSet::new();
    let mut revs = BTreeSet::new();
    for o in &list.items {
        let name = o.metadata.name.clone().expect("name");
        assert!(present.insert(name.clone()), "{name} listed twice");
        assert!(attempted.contains(&name), "{name} was never written: garbage after recovery");
        assert!(uids.insert(o.metadata.uid.clone().expect("uid")), "duplicate uid on {name}");
        assert!(revs.insert(rv(o)), "duplicate resourceVersion on {name}");
        let writer = name.split('-').nth(1).expect("writer");
        assert_eq!(
            o.metadata.labels.as_ref().and_then(|l| l.get("writer")).map(String::as_str),
            Some(writer),
            "{name}"
        );
        assert_eq!(
            o.data["spec"]["resource"],
            json!({"group": "apps", "version": "v1", "resource": "deployments"}),
            "{name}"
        );
        assert_eq!(o.metadata.generation, Some(1));
    }
    let lost: Vec<&String> = acked.iter().filter(|n| !present.contains(*n)).collect();
    assert!(lost.is_empty(), "{} of {} acknowledged writes lost after kill -9: {lost:?}", lost.len(), acked.len());
    // At most the writes in flight at the kill (one per writer) may have landed without an acknowledgement.
    let unacked = present.len() - acked.len();
    assert!(unacked <= WRITERS, "{unacked} objects present that were never acknowledged");

    // The recovered server is fully usable: writes get newer resourceVersions, watches see them.
    let max = revs.iter().max().copied().unwrap_or(0);
    let o = svm_api(&c)
        .create(&PostParams::default(), &svm("after-crash", json!({})))
        .await
        .expect("create after recovery");
    assert!(rv(&o) > max, "{} <= {max}", rv(&o));
    let o = svm_api(&c).get(&acked[0]).await.expect("an acknowledged object");
    assert_eq!(o.metadata.name.as_deref(), Some(acked[0].as_str()));
}
