//! The etcd backend against a real etcd (Debian's etcd-server): replicas sharing one etcd (cross-replica watch and
//! reads, conflicting writes), an etcd restart under a running server, compaction by the server's own compactor,
//! etcd's request limit, and encryption at rest in etcd. The conformance suite (tests/api.rs) also runs on etcd
//! with `MIGRATION_APISERVER_TEST_BACKEND=etcd` (see the Makefile's `test`).

mod common;
use common::etcd::Etcd;
use common::objects::{item_names, rv, svm_api, svm_object as svm};
use common::*;

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, ListParams, PostParams, ResourceExt, WatchEvent, WatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const SVM_PATH: &str = "/apis/migration.k8s.io/v1alpha1/storageversionmigrations";

fn shoot_api(c: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("core.gardener.cloud", "v1beta1", "ShootState");
    Api::namespaced_with(c.clone(), ns, &ApiResource::from_gvk_with_plural(&gvk, "shootstates"))
}

fn shoot(name: &str, payload: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
        "metadata": {"name": name},
        "spec": {"gardener": [{"name": "ca", "type": "secret", "data": {"note": payload}}]},
    }))
    .expect("object")
}

async fn names(api: &Api<DynamicObject>) -> Vec<String> {
    item_names(&api.list(&ListParams::default()).await.expect("list"))
}

/// The next ADDED/MODIFIED/DELETED event of a kube watch stream (bookmarks skipped), within a deadline.
async fn next_change(
    stream: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<DynamicObject>>> + Unpin),
) -> (String, String) {
    let deadline = Duration::from_secs(20);
    loop {
        let ev = tokio::time::timeout(deadline, stream.try_next())
            .await
            .expect("a watch event in time")
            .expect("watch stream")
            .expect("watch stream ended");
        let (kind, obj) = match ev {
            WatchEvent::Added(o) => ("ADDED", o),
            WatchEvent::Modified(o) => ("MODIFIED", o),
            WatchEvent::Deleted(o) => ("DELETED", o),
            WatchEvent::Bookmark(_) => continue,
            WatchEvent::Error(e) => panic!("watch error: {e:?}"),
        };
        return (kind.to_string(), obj.metadata.name.unwrap_or_default());
    }
}

#[tokio::test]
async fn replicas_share_reads_writes_and_watches() {
    let etcd = Etcd::start();
    let a = Server::start_on_etcd(&etcd, &[]);
    let b = Server::start_on_etcd(&etcd, &[]);
    let (ca, cb) = (a.client().await, b.client().await);

    // A watch on B sees writes made through A, in order, with A's resourceVersions.
    let mut watch = svm_api(&cb).watch(&WatchParams::default(), "0").await.expect("watch on B").boxed();
    let made = svm_api(&ca).create(&PostParams::default(), &svm("from-a")).await.expect("create on A");
    assert_eq!(next_change(&mut watch).await, ("ADDED".into(), "from-a".into()));
    // Read-your-writes across replicas: B reads A's object at once, at a revision not older than A's write.
    let on_b = svm_api(&cb).get("from-a").await.expect("get on B");
    assert_eq!(rv(&on_b), rv(&made));
    let lp = ListParams::default().at(&rv(&made).to_string()).matching(kube::api::VersionMatch::NotOlderThan);
    let list = svm_api(&cb).list(&lp).await.expect("list on B not older than A's write");
    assert!(list.metadata.resource_version.as_deref().and_then(|r| r.parse::<u64>().ok()).unwrap() >= rv(&made));
    // Writes through B reach a watch on A too; deletes as well.
    let mut watch_a = svm_api(&ca).watch(&WatchParams::default(), &rv(&made).to_string()).await.expect("watch").boxed();
    svm_api(&cb).create(&PostParams::default(), &svm("from-b")).await.expect("create on B");
    svm_api(&cb).delete("from-a", &Default::default()).await.expect("delete on B");
    assert_eq!(next_change(&mut watch_a).await, ("ADDED".into(), "from-b".into()));
    assert_eq!(next_change(&mut watch_a).await, ("DELETED".into(), "from-a".into()));
    assert_eq!(next_change(&mut watch).await, ("ADDED".into(), "from-b".into()));
    assert_eq!(next_change(&mut watch).await, ("DELETED".into(), "from-a".into()));
    // Creating a name that exists through the other replica: 409 AlreadyExists.
    let err = svm_api(&ca).create(&PostParams::default(), &svm("from-b")).await.expect_err("exists");
    assert!(matches!(&err, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"), "{err:?}");
}

#[tokio::test]
async fn conflicting_updates_on_two_replicas_exactly_one_wins() {
    let etcd = Etcd::start();
    let a = Server::start_on_etcd(&etcd, &[]);
    let b = Server::start_on_etcd(&etcd, &[]);
    let (ca, cb) = (a.client().await, b.client().await);
    svm_api(&ca).create(&PostParams::default(), &svm("contended")).await.expect("create");
    for round in 0..20 {
        let current = svm_api(&ca).get("contended").await.expect("get");
        // Both replicas replace the same resourceVersion at the same time, with different changes.
        let mut via_a = current.clone();
        via_a.labels_mut().insert("winner".into(), format!("a-{round}"));
        let mut via_b = current.clone();
        via_b.labels_mut().insert("winner".into(), format!("b-{round}"));
        let (api_a, api_b, pp) = (svm_api(&ca), svm_api(&cb), PostParams::default());
        let (ra, rb) = tokio::join!(api_a.replace("contended", &pp, &via_a), api_b.replace("contended", &pp, &via_b));
        let conflict = |r: &kube::Result<DynamicObject>| matches!(r, Err(kube::Error::Api(s)) if s.code == 409 && s.reason == "Conflict");
        let winner = match (&ra, &rb) {
            (Ok(w), r) if conflict(r) => w,
            (r, Ok(w)) if conflict(r) => w,
            _ => panic!("round {round}: exactly one must win, the other get 409: {ra:?} / {rb:?}"),
        };
        // The stored object is the winner's, at the winner's resourceVersion.
        let stored = svm_api(&cb).get("contended").await.expect("get");
        assert_eq!(stored.labels().get("winner"), winner.labels().get("winner"), "round {round}");
        assert_eq!(rv(&stored), rv(winner));
    }
}

#[tokio::test]
async fn etcd_restart_loses_no_acknowledged_write_and_watches_resume() {
    let mut etcd = Etcd::start();
    let s = Server::start_on_etcd(&etcd, &[]);
    let c = s.client_without_retries().await;
    let api = svm_api(&c);
    let mut watch = api.watch(&WatchParams::default(), "0").await.expect("watch").boxed();
    let mut acknowledged = Vec::new();
    for i in 0..20 {
        let name = format!("before-{i}");
        api.create(&PostParams::default(), &svm(&name)).await.expect("create");
        acknowledged.push(name);
    }
    // etcd crashes. Requests fail with a clear, retryable error (503 or a timeout), never a success that is lost.
    etcd.kill9();
    let t = Instant::now();
    let down = api.create(&PostParams::default(), &svm("while-down")).await;
    match &down {
        Err(kube::Error::Api(st)) => {
            assert_eq!(st.code, 503, "{st:?}");
            assert!(st.message.contains("etcd"), "names the cause: {st:?}");
            assert!(t.elapsed() < Duration::from_secs(35), "fails within etcd's request timeout");
        }
        Err(e) => panic!("expected a Status error while etcd is down, got {e:?}"),
        Ok(_) => acknowledged.push("while-down".into()),
    }
    eprintln!("create while down: {:?} after {:?}", down.as_ref().err(), t.elapsed());
    let ready = s.kubectl(&["get", "--raw", "/readyz"]);
    eprintln!("readyz while down after {:?}", t.elapsed());
    assert!(!ready.status.success(), "readyz must fail while etcd is down");
    etcd.restart();
    eprintln!("etcd restarted after {:?}", t.elapsed());
    // The server recovers by itself: writes succeed again within a deadline (no server restart).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match api.create(&PostParams::default(), &svm("after-0")).await {
            Ok(_) => break,
            Err(kube::Error::Api(st)) if st.code == 409 => break,
            Err(e) if Instant::now() < deadline => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the server did not recover after etcd came back: {e}\n{}", s.log()),
        }
    }
    acknowledged.push("after-0".into());
    eprintln!("recovered after {:?}", t.elapsed());
    for i in 1..10 {
        let name = format!("after-{i}");
        api.create(&PostParams::default(), &svm(&name)).await.expect("create after restart");
        acknowledged.push(name);
    }
    let stored = names(&api).await;
    for name in &acknowledged {
        assert!(stored.contains(name), "acknowledged {name} lost: {stored:?}");
    }
    // The watch opened before the crash goes on, without a gap: every acknowledged create, in order.
    for name in &acknowledged {
        assert_eq!(next_change(&mut watch).await, ("ADDED".into(), name.clone()));
    }
    assert!(s.kubectl(&["get", "--raw", "/readyz"]).status.success(), "ready again");
}

#[tokio::test]
async fn compaction_expires_old_watches_and_continue_tokens() {
    let etcd = Etcd::start();
    // The server's own compactor (kube-apiserver's algorithm) every second: history older than one interval goes.
    let s = Server::start_on_etcd(&etcd, &["--etcd-compaction-interval", "1s"]);
    let c = s.client().await;
    let api = svm_api(&c);
    let first = api.create(&PostParams::default(), &svm("c-0")).await.expect("create");
    for i in 1..5 {
        api.create(&PostParams::default(), &svm(&format!("c-{i}"))).await.expect("create");
    }
    let page = api.list(&ListParams::default().limit(2)).await.expect("page");
    let token = page.metadata.continue_.clone().expect("continue token");
    // Poll (deadline) until the compactor has passed the first write: a watch from it is then 410 Expired.
    let old = rv(&first);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        api.create(&PostParams::default(), &svm(&format!("tick-{}", Instant::now().elapsed().as_nanos()))).await.ok();
        let r = raw_get(&c, &format!("{SVM_PATH}?watch=true&resourceVersion={old}&timeoutSeconds=1")).await;
        if r.0 == 410 {
            let st: Value = serde_json::from_slice(&r.1).expect("Status");
            assert_eq!(st["reason"], "Expired", "{st}");
            break;
        }
        assert!(Instant::now() < deadline, "history never compacted: {}", s.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The old continue token: 410 with an inconsistent continuation that still lists the rest.
    let r = raw_get(&c, &format!("{SVM_PATH}?limit=2&continue={token}")).await;
    assert_eq!(r.0, 410, "{}", String::from_utf8_lossy(&r.1));
    let st: Value = serde_json::from_slice(&r.1).expect("Status");
    assert_eq!(st["reason"], "Expired", "{st}");
    let inconsistent = st["metadata"]["continue"].as_str().expect("inconsistent continue token");
    let r = raw_get(&c, &format!("{SVM_PATH}?continue={inconsistent}")).await;
    assert_eq!(r.0, 200);
    let rest: Value = serde_json::from_slice(&r.1).expect("list");
    let rest: Vec<&str> =
        rest["items"].as_array().unwrap().iter().filter_map(|o| o["metadata"]["name"].as_str()).collect();
    assert!(rest.contains(&"c-2") && rest.contains(&"c-4") && !rest.contains(&"c-0"), "{rest:?}");
    // A recent revision still watches.
    let now = api.list(&ListParams::default()).await.expect("list").metadata.resource_version.expect("rv");
    let mut w = api.watch(&WatchParams::default(), &now).await.expect("recent watch").boxed();
    api.create(&PostParams::default(), &svm("fresh")).await.expect("create");
    assert_eq!(next_change(&mut w).await, ("ADDED".into(), "fresh".into()));
}

#[tokio::test]
async fn values_over_etcds_request_limit_get_a_clear_413() {
    // etcd accepting at most 64 KiB per request, below the server's own 1.5 MiB object limit.
    let etcd = Etcd::start_with(&["--max-request-bytes", "65536"]);
    let s = Server::start_on_etcd(&etcd, &[]);
    let c = s.client().await;
    let api = shoot_api(&c, "garden-big");
    let err = api.create(&PostParams::default(), &shoot("big", &"x".repeat(200 * 1024))).await.expect_err("too big");
    match &err {
        kube::Error::Api(st) => {
            assert_eq!(st.code, 413, "{st:?}");
            assert!(st.message.contains("too large"), "{st:?}");
            assert!(!st.message.contains("grpc"), "no raw gRPC error: {st:?}");
        }
        other => panic!("expected a Status, got {other:?}"),
    }
    // Small objects still go through, and nothing of the refused one was stored.
    api.create(&PostParams::default(), &shoot("small", "y")).await.expect("small create");
    assert_eq!(names(&api).await, vec!["small".to_string()]);
}

#[tokio::test]
async fn encryption_at_rest_applies_to_etcd() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("enc.yaml");
    std::fs::write(
        &config,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
         - resources: [shootstates.core.gardener.cloud]\n  providers:\n  - aesgcm:\n      keys:\n      \
         - name: k1\n        secret: MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n  - identity: {}\n",
    )
    .expect("write config");
    let s = Server::start_on_etcd(
        &etcd,
        &["--encryption-provider-config", config.to_str().unwrap(), "--etcd-prefix", "/custom-prefix"],
    );
    let c = s.client().await;
    let api = shoot_api(&c, "garden-enc");
    api.create(&PostParams::default(), &shoot("secret-one", "canary-plaintext-7731")).await.expect("create");
    let back = api.get("secret-one").await.expect("get");
    assert_eq!(back.data["spec"]["gardener"][0]["data"]["note"], "canary-plaintext-7731");
    // In etcd, under --etcd-prefix: kube-apiserver's envelope, and no plaintext.
    let mut ec = etcd.client().await;
    let stored =
        ec.get("/custom-prefix/core.gardener.cloud/shootstates/garden-enc/secret-one", None).await.expect("etcd get");
    let value = stored.kvs().first().expect("stored under the prefix").value().to_vec();
    assert!(value.starts_with(b"k8s:enc:aesgcm:v1:k1:"), "{:?}", String::from_utf8_lossy(&value[..30]));
    assert!(!String::from_utf8_lossy(&value).contains("canary-plaintext"), "plaintext in etcd");
    let everything = ec.get("", Some(etcd_client::GetOptions::new().with_all_keys())).await.expect("etcd get all");
    assert!(everything.kvs().iter().all(|kv| !String::from_utf8_lossy(kv.value()).contains("canary-plaintext")));
    // `storage inspect` reads etcd too: the key, its provider and (with the config) its apiVersion; no plaintext.
    let out = std::process::Command::new(BIN)
        .args(["storage", "inspect", "--etcd-servers", &etcd.endpoint, "--etcd-prefix", "/custom-prefix", "-o", "json"])
        .args(["--encryption-provider-config", config.to_str().unwrap()])
        .output()
        .expect("storage inspect");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("canary-plaintext"), "{text}");
    let v: Value = serde_json::from_str(&text).expect("inspect json");
    let entry = v["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|e| e["key"] == "/registry/core.gardener.cloud/shootstates/garden-enc/secret-one")
        .unwrap_or_else(|| panic!("key listed: {text}"));
    assert_eq!(entry["encryption"], "aesgcm:v1:k1", "{entry}");
    assert_eq!(entry["apiVersion"], "core.gardener.cloud/v1beta1", "{entry}");
}

/// GET through the client's transport: status and body.
async fn raw_get(c: &kube::Client, path: &str) -> (u16, Vec<u8>) {
    use http_body_util::BodyExt;
    let req = http::Request::get(path).body(Vec::new()).expect("request");
    let resp = c.send(req.map(kube::client::Body::from)).await.expect("send");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes().to_vec();
    (status, body)
}

/// A value in etcd that no reader can take (written by another client, corrupt): it takes only itself down. A
/// watch that meets it ends with an ERROR naming its key, the list names it, other objects read, and the unsafe
/// delete removes it (KEP-3926).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_value_in_etcd_is_named_and_removable() {
    let etcd = Etcd::start();
    let s = Server::start_on_etcd(&etcd, &[]);
    let c = s.client_without_retries().await;
    let api = shoot_api(&c, "garden-a");
    let a = api.create(&PostParams::default(), &shoot("a", "fine")).await.expect("create a");
    let wp = WatchParams::default().timeout(20);
    let mut stream = api.watch(&wp, &rv(&a).to_string()).await.expect("watch").boxed();
    const KEY: &str = "/registry/core.gardener.cloud/shootstates/garden-a/bad";
    etcd.client().await.put(KEY, "\u{0}not json", None).await.expect("put");

    let error = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match stream.next().await {
                Some(Ok(WatchEvent::Error(e))) => break e,
                Some(Ok(WatchEvent::Bookmark(_))) => continue,
                other => panic!("expected an ERROR event, got {other:?}"),
            }
        }
    })
    .await
    .expect("the watch ends with an ERROR");
    assert_eq!((error.code, error.reason.as_str()), (500, "StorageReadError"), "{error:?}");
    assert!(error.message.contains("shootstates"), "{error:?}");

    let path = "/apis/core.gardener.cloud/v1beta1/namespaces/garden-a/shootstates";
    let req = http::Request::get(path).body(Vec::new()).expect("request");
    let err = c.request::<Value>(req).await.expect_err("the list fails");
    let kube::Error::Api(status) = err else { panic!("{err:?}") };
    assert_eq!(status.reason, "StorageReadError", "{status:?}");
    let causes = status.details.map(|d| d.causes).unwrap_or_default();
    assert_eq!(causes.iter().map(|c| c.field.as_str()).collect::<Vec<_>>(), [KEY]);
    assert_eq!(api.get("a").await.expect("a reads").metadata.name.as_deref(), Some("a"));

    let unsafe_delete = format!("{path}/bad?ignoreStoreReadErrorWithClusterBreakingPotential=true");
    let out = tokio::task::spawn_blocking(move || {
        let out = s.kubectl_ok(&["delete", "--raw", &unsafe_delete]);
        (s, out)
    })
    .await
    .expect("kubectl");
    assert!(out.1.contains("Success"), "{}", out.1);
    assert!(etcd.client().await.get(KEY, None).await.expect("get").kvs().is_empty(), "removed from etcd");
    assert_eq!(names(&api).await, ["a"]);
}
