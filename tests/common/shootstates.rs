//! ShootStates (`core.gardener.cloud`), the objects the migration suites migrate: one builder of the object, its
//! typed client, and the targets holding some. Spelled out here, never taken from the crate (as in [`super::objects`]).

use super::requests::call;
use super::Server;
use axum::http::Method;
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};

/// The StorageState (and migration label) name of ShootStates.
pub const SHOOTSTATES: &str = "shootstates.core.gardener.cloud";

/// A ShootState `namespace/name` of `core.gardener.cloud/<version>` whose one gardener entry, a secret, holds
/// `data`: a value that differs per object, so that no two are stored alike.
pub fn shootstate(version: &str, namespace: &str, name: &str, data: Value) -> Value {
    json!({"apiVersion": format!("core.gardener.cloud/{version}"), "kind": "ShootState",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"gardener": [{"name": "ca", "type": "secret", "data": data}]}})
}

/// `n` v1beta1 ShootStates in `namespace`, named by `name(i)`, the `i`-th holding `{"index": i}`.
pub fn numbered_shootstates(namespace: &str, n: usize, name: impl Fn(usize) -> String) -> Vec<Value> {
    (0..n).map(|i| shootstate("v1beta1", namespace, &name(i), json!({"index": i}))).collect()
}

/// `kubectl create` of `objects` in one call, as a stream of objects (a v1 List would need the core group's
/// schema, which this server does not serve behind an aggregator).
pub fn kubectl_create(s: &Server, objects: &[Value]) {
    let stream: String = objects.iter().map(|o| format!("{o}\n")).collect();
    s.kubectl_ok_stdin(&["create", "-f", "-"], &stream);
}

/// The v1beta1 ShootStates of `namespace` through kube's dynamic client.
pub fn shootstates_api(c: &kube::Client, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("core.gardener.cloud", "v1beta1", "ShootState");
    Api::namespaced_with(c.clone(), namespace, &ApiResource::from_gvk_with_plural(&gvk, "shootstates"))
}

/// A target for a migrating server in cluster mode: a server without a scheduler holding `n` ShootStates
/// `garden/s-<i>` (empty specs), created through the API.
pub async fn target_with_shootstates(n: usize) -> Server {
    let target = Server::start(&["--disable-scheduler"]);
    let api = shootstates_api(&target.client().await, "garden");
    for i in 0..n {
        let o = json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
            "metadata": {"name": format!("s-{i}"), "namespace": "garden"}, "spec": {}});
        let o: DynamicObject = serde_json::from_value(o).expect("object");
        api.create(&Default::default(), &o).await.expect("create");
    }
    target
}

/// A server without a scheduler holding `n` ShootStates `garden/s-<i>` stored as v1alpha1 (created 16 at a time),
/// restarted with v1beta1 as their storage version: every object is stale for the next migrator.
pub async fn stale_shootstates(n: usize) -> Server {
    stale_shootstates_in(n, |_| "garden".to_string(), &[]).await
}

/// [`stale_shootstates`] with the `i`-th object in `namespace(i)`, restarted with the further flags `extra`.
pub async fn stale_shootstates_in(n: usize, namespace: impl Fn(usize) -> String, extra: &[&str]) -> Server {
    let mut t = Server::start(&["--disable-scheduler", "--storage-version", &format!("{SHOOTSTATES}=v1alpha1")]);
    let c = t.client().await;
    let created: Vec<u16> = futures::stream::iter(0..n)
        .map(|i| {
            let c = c.clone();
            let ns = namespace(i);
            let body = shootstate("v1alpha1", &ns, &format!("s-{i:05}"), json!({"n": i}));
            async move {
                let path = format!("/apis/core.gardener.cloud/v1alpha1/namespaces/{ns}/shootstates");
                let headers = [("content-type", "application/json")];
                call(&c, Method::POST, &path, &headers, body.to_string().into_bytes()).await.status
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(created.iter().all(|c| *c == 201), "creates: {created:?}");
    let storage_version = format!("{SHOOTSTATES}=v1beta1");
    let mut args = vec!["--disable-scheduler", "--storage-version", &storage_version];
    args.extend_from_slice(extra);
    t.restart_with(&args);
    t
}
