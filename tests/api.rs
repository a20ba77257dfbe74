//! The REST API at the wire level, against the real binary over TLS: discovery, OpenAPI, CRUD and metadata,
//! validation, dry-run, field validation, request bodies, lists, watch, tables, finalizers, authentication and
//! metrics. Requests go through a `kube::Client` (typed `Api<DynamicObject>` where a user would use it, raw
//! `http::Request`s where status codes, headers and `Status` bodies are the subject).

mod common;
use common::objects::{rv, svm_api, svm_json as svm};
use common::requests::*;
use common::status::cause_pairs;
use common::*;

use axum::http::{HeaderName, HeaderValue, Method};
use base64::Engine;
use futures::{StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const GROUP: &str = "migration.k8s.io";
const API_VERSION: &str = "migration.k8s.io/v1alpha1";
const SVM_PATH: &str = "/apis/migration.k8s.io/v1alpha1/storageversionmigrations";
const SS_PATH: &str = "/apis/migration.k8s.io/v1alpha1/storagestates";
const TABLE_ACCEPT: &str =
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
const CONFLICT_TAIL: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

// ---------------------------------------------------------------------------------------------------------------
// helpers

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, "v1alpha1", kind), plural)
}

fn ss_api(c: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(c.clone(), &resource("StorageState", "storagestates"))
}

fn svm_labeled(name: &str, labels: Value) -> Value {
    let mut o = svm(name);
    o["metadata"]["labels"] = labels;
    o
}

/// A StorageState must be named `<resource>.<group>` (`<resource>` for the core group).
fn ss(resource: &str, group: &str) -> Value {
    let name = if group.is_empty() { resource.to_string() } else { format!("{resource}.{group}") };
    json!({
        "apiVersion": API_VERSION, "kind": "StorageState",
        "metadata": {"name": name},
        "spec": {"resource": {"group": group, "resource": resource}},
    })
}

fn dynobj(v: &Value) -> DynamicObject {
    serde_json::from_value(v.clone()).expect("DynamicObject")
}

/// An HTTP response read to the end.
async fn create_ok(c: &kube::Client, path: &str, body: &Value) -> Value {
    post(c, path, body).await.ok(201)
}

fn names(items: &Value) -> Vec<String> {
    items.as_array().expect("items").iter().map(|o| o["metadata"]["name"].as_str().expect("name").to_string()).collect()
}

fn cause_set(status: &Value) -> BTreeSet<(String, String)> {
    cause_pairs(status).into_iter().collect()
}

fn pairs(p: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    p.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

/// A media type as (essence, parameters), so that parameter order does not matter.
fn media_type(ct: &str) -> (String, BTreeMap<String, String>) {
    let mut parts = ct.split(';').map(str::trim);
    let essence = parts.next().unwrap_or_default().to_ascii_lowercase();
    let params = parts
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (essence, params)
}

/// The current revision of a collection (metadata.resourceVersion of an unfiltered list).
async fn list_rv(c: &kube::Client, path: &str) -> u64 {
    get(c, path).await.ok(200)["metadata"]["resourceVersion"].as_str().expect("list rv").parse().expect("number")
}

/// A client that presents no client certificate, with optional extra headers on every request.
async fn anonymous_client(s: &Server, headers: Vec<(HeaderName, HeaderValue)>) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(s.kubeconfig()).expect("kubeconfig");
    let mut cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.expect("config");
    cfg.auth_info = Default::default();
    cfg.headers = headers;
    kube::Client::try_from(cfg).expect("client")
}

/// A watch response body, read as newline-delimited JSON events.
struct Watch {
    body: kube::client::Body,
    buf: Vec<u8>,
    ended: bool,
}

impl Watch {
    async fn open(c: &kube::Client, path: &str, headers: &[(&str, &str)]) -> Watch {
        match Watch::try_open(c, path, headers).await {
            Ok(w) => w,
            Err(r) => panic!("watch {path}: {} {}", r.status, r.text()),
        }
    }

    /// The watch, or the complete response when it is not a 200.
    async fn try_open(c: &kube::Client, path: &str, headers: &[(&str, &str)]) -> Result<Watch, Resp> {
        let resp = tokio::time::timeout(Duration::from_secs(20), c.send(request(Method::GET, path, headers, vec![])))
            .await
            .expect("watch response in 20s")
            .expect("watch request");
        if resp.status() != 200 {
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            let body = resp.into_body().collect().await.expect("body").to_bytes().to_vec();
            return Err(Resp { status, headers, body });
        }
        Ok(Watch { body: resp.into_body(), buf: Vec::new(), ended: false })
    }

    /// The next event, or None when the server ended the stream; panics if nothing arrives within `within`.
    async fn next_within(&mut self, within: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(i) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=i).collect();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Some(
                    serde_json::from_slice(&line)
                        .unwrap_or_else(|e| panic!("watch line is not JSON ({e}): {}", String::from_utf8_lossy(&line))),
                );
            }
            if self.ended {
                assert!(
                    self.buf.iter().all(u8::is_ascii_whitespace),
                    "partial event at end: {}",
                    String::from_utf8_lossy(&self.buf)
                );
                return None;
            }
            match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Err(_) => panic!("no watch event within {within:?} (buffered: {})", String::from_utf8_lossy(&self.buf)),
                Ok(None) => self.ended = true,
                Ok(Some(Err(e))) => panic!("watch body: {e}"),
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    async fn next(&mut self) -> Value {
        self.next_within(Duration::from_secs(5)).await.expect("watch ended early")
    }

    /// The next event that is not a BOOKMARK.
    async fn next_change(&mut self) -> Value {
        loop {
            let e = self.next().await;
            if e["type"] != "BOOKMARK" {
                return e;
            }
        }
    }
}

fn event(e: &Value) -> (String, String) {
    (
        e["type"].as_str().unwrap_or_default().to_string(),
        e["object"]["metadata"]["name"].as_str().unwrap_or_default().to_string(),
    )
}

// ---------------------------------------------------------------------------------------------------------------
// discovery

#[tokio::test]
async fn discovery_documents() {
    let s = Server::start(&[]);
    let c = s.client().await;

    // Plain /apis: an APIGroupList.
    let r = get(&c, "/apis").await;
    let v = r.ok(200);
    assert_eq!(r.header("content-type").as_deref(), Some("application/json"));
    assert_eq!(v["kind"], "APIGroupList");
    assert_eq!(v["apiVersion"], "v1");
    let groups = v["groups"].as_array().expect("groups").clone();
    let group_names: BTreeSet<&str> = groups.iter().filter_map(|g| g["name"].as_str()).collect();
    assert_eq!(group_names.len(), groups.len(), "each group once: {v}");
    let ours = groups.iter().find(|g| g["name"] == GROUP).unwrap_or_else(|| panic!("{GROUP} missing: {v}"));
    assert_eq!(ours["versions"], json!([{"groupVersion": API_VERSION, "version": "v1alpha1"}]));
    assert_eq!(ours["preferredVersion"], json!({"groupVersion": API_VERSION, "version": "v1alpha1"}));
    let r = get_accept(&c, "/apis", "application/json").await;
    assert_eq!(r.ok(200)["kind"], "APIGroupList");

    // The legacy group-version document, with the storage version hash of the storage GVK.
    let v = get(&c, "/apis/migration.k8s.io/v1alpha1").await.ok(200);
    assert_eq!(v["kind"], "APIResourceList");
    assert_eq!(v["groupVersion"], API_VERSION);
    let resources = v["resources"].as_array().expect("resources");
    // storagestates, storageversionmigrations, their /status, and the create-only csitranslations.
    assert_eq!(resources.len(), 5, "{v}");
    let find = |name: &str| {
        resources.iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("{name} missing: {v}")).clone()
    };
    let all_verbs: BTreeSet<&str> =
        ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"].into();
    let mut legacy_categories = BTreeMap::new();
    for (plural, singular, kind, short) in [
        ("storagestates", "storagestate", "StorageState", "ss"),
        ("storageversionmigrations", "storageversionmigration", "StorageVersionMigration", "svm"),
    ] {
        let r = find(plural);
        let digest = Sha256::digest(format!("{GROUP}/v1alpha1/{kind}").as_bytes());
        let hash = base64::engine::general_purpose::STANDARD.encode(&digest[..8]);
        assert_eq!(r["storageVersionHash"], hash, "{r}");
        assert_eq!(r["singularName"], singular);
        assert_eq!(r["namespaced"], false);
        assert_eq!(r["kind"], kind);
        assert_eq!(r["shortNames"], json!([short]));
        assert_eq!(r["categories"], json!(["migration"]), "{r}");
        legacy_categories.insert(plural, r["categories"].clone());
        let verbs: BTreeSet<&str> =
            r["verbs"].as_array().expect("verbs").iter().map(|x| x.as_str().expect("verb")).collect();
        assert_eq!(verbs, all_verbs);
        let st = find(&format!("{plural}/status"));
        assert_eq!(st["verbs"], json!(["get", "patch", "update"]), "{st}");
        assert_eq!(st["kind"], kind);
        assert_eq!(st["namespaced"], false);
        assert_eq!(st["singularName"], "");
        assert!(st.get("storageVersionHash").is_none(), "{st}");
    }
    // A create-only virtual resource (like TokenReview): only "create", no storage version.
    let r = find("csitranslations");
    assert_eq!(r["verbs"], json!(["create"]), "{r}");
    assert_eq!(r["kind"], "CSITranslation");
    assert!(r.get("storageVersionHash").is_none(), "{r}");
    let r = get(&c, "/apis/migration.k8s.io").await.ok(200);
    assert_eq!(r["kind"], "APIGroup");
    assert_eq!(r["name"], GROUP);
    get(&c, "/apis/migration.k8s.io/v9").await.status_err(404, "NotFound");
    get(&c, "/apis/nope.example.com/v1").await.status_err(404, "NotFound");

    // Aggregated discovery, v2 and v2beta1, chosen by Accept.
    for dv in ["v2", "v2beta1"] {
        let want_ct = format!("application/json;g=apidiscovery.k8s.io;v={dv};as=APIGroupDiscoveryList");
        let accept = format!("{want_ct},application/json");
        let r = get_accept(&c, "/apis", &accept).await;
        let doc = r.ok(200);
        assert_eq!(media_type(&r.header("content-type").expect("content-type")), media_type(&want_ct));
        let etag = r.header("etag").expect("ETag");
        assert!(etag.len() > 2 && etag.starts_with('"') && etag.ends_with('"'), "{etag}");
        let vary = r.header("vary").expect("Vary");
        assert!(vary.split(',').any(|x| x.trim().eq_ignore_ascii_case("accept")), "{vary}");
        assert_eq!(doc["kind"], "APIGroupDiscoveryList");
        assert_eq!(doc["apiVersion"], format!("apidiscovery.k8s.io/{dv}"));
        let items = doc["items"].as_array().expect("items");
        let item_names: BTreeSet<&str> = items.iter().filter_map(|g| g["metadata"]["name"].as_str()).collect();
        assert_eq!(item_names, group_names, "the same groups as the APIGroupList");
        assert_eq!(items.len(), groups.len());
        let item = items.iter().find(|g| g["metadata"]["name"] == GROUP).expect("our group");
        assert_eq!(item["versions"].as_array().map(Vec::len), Some(1));
        let ver = &item["versions"][0];
        assert_eq!(ver["version"], "v1alpha1");
        assert_eq!(ver["freshness"], "Current");
        let res = ver["resources"].as_array().expect("resources");
        assert_eq!(res.len(), 3, "{ver}");
        let csi = res.iter().find(|r| r["resource"] == "csitranslations").expect("csitranslations");
        assert_eq!(csi["verbs"], json!(["create"]), "{csi}");
        assert_eq!(csi["subresources"], json!([]), "{csi}");
        for (plural, singular, kind, short) in [
            ("storagestates", "storagestate", "StorageState", "ss"),
            ("storageversionmigrations", "storageversionmigration", "StorageVersionMigration", "svm"),
        ] {
            let r = res.iter().find(|r| r["resource"] == plural).unwrap_or_else(|| panic!("{plural} missing"));
            let rk = json!({"group": GROUP, "version": "v1alpha1", "kind": kind});
            assert_eq!(r["responseKind"], rk);
            assert_eq!(r["scope"], "Cluster");
            assert_eq!(r["singularResource"], singular);
            assert_eq!(r["shortNames"], json!([short]));
            assert_eq!(r["categories"], legacy_categories[plural]);
            assert!(r.get("storageVersionHash").is_none(), "aggregated discovery has no storageVersionHash: {r}");
            let verbs: BTreeSet<&str> =
                r["verbs"].as_array().expect("verbs").iter().map(|x| x.as_str().expect("verb")).collect();
            assert_eq!(verbs, all_verbs);
            assert_eq!(
                r["subresources"],
                json!([{"subresource": "status", "responseKind": rk, "verbs": ["get", "patch", "update"]}])
            );
        }
        // A matching If-None-Match is a 304 without a body; a stale one gets the document.
        let r = call(&c, Method::GET, "/apis", &[("accept", &accept), ("if-none-match", &etag)], vec![]).await;
        assert_eq!(r.status, 304, "{}", r.text());
        assert!(r.body.is_empty());
        assert_eq!(r.header("etag").as_deref(), Some(etag.as_str()));
        let r = call(&c, Method::GET, "/apis", &[("accept", &accept), ("if-none-match", "\"stale\"")], vec![]).await;
        assert_eq!(r.ok(200)["kind"], "APIGroupDiscoveryList");
    }
    // kubectl's Accept prefers v2.
    let kubectl = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
    assert_eq!(get_accept(&c, "/apis", kubectl).await.ok(200)["apiVersion"], "apidiscovery.k8s.io/v2");
    // Only an unserved aggregated version: 406 (a 404 would mark the APIService stale in some kube versions).
    let r = get_accept(&c, "/apis", "application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList").await;
    r.status_err(406, "NotAcceptable");
}

// ---------------------------------------------------------------------------------------------------------------
// OpenAPI

#[tokio::test]
async fn openapi_documents() {
    let s = Server::start(&[]);
    let c = s.client().await;

    // The root lists exactly the group-versions this server serves (those of its discovery), nothing else: the
    // core group's under /api (standalone: v1, for namespaces), the others under /apis.
    let mut served: BTreeSet<String> = get(&c, "/apis").await.ok(200)["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["versions"].as_array().expect("versions").clone())
        .map(|v| format!("apis/{}", v["groupVersion"].as_str().expect("groupVersion")))
        .collect();
    let core = get(&c, "/api").await.ok(200)["versions"].as_array().expect("versions").clone();
    served.extend(core.iter().map(|v| format!("api/{}", v.as_str().expect("version"))));
    assert!(served.contains("apis/migration.k8s.io/v1alpha1") && served.contains("api/v1"), "{served:?}");
    let root = get(&c, "/openapi/v3").await.ok(200);
    let paths = root["paths"].as_object().expect("paths");
    assert_eq!(paths.keys().cloned().collect::<BTreeSet<_>>(), served, "{root}");
    let url =
        paths["apis/migration.k8s.io/v1alpha1"]["serverRelativeURL"].as_str().expect("serverRelativeURL").to_string();
    let hash = url.strip_prefix("/openapi/v3/apis/migration.k8s.io/v1alpha1?hash=").unwrap_or_else(|| panic!("{url}"));
    assert_eq!(hash.len(), 128, "SHA-512 hex: {hash}");
    assert!(hash.chars().all(|c| c.is_ascii_hexdigit()), "{hash}");

    // The current hash: immutable, with ETag; If-None-Match gives 304.
    let r = get(&c, &url).await;
    let doc = r.ok(200);
    assert_eq!(r.header("cache-control").as_deref(), Some("public, immutable"));
    let etag = r.header("etag").expect("ETag");
    assert!(r.header("vary").is_some_and(|v| v.to_ascii_lowercase().contains("accept")));
    let r304 = call(&c, Method::GET, &url, &[("if-none-match", &etag)], vec![]).await;
    assert_eq!(r304.status, 304, "{}", r304.text());
    // A wrong hash: 301 to the current one.
    let r = get(&c, "/openapi/v3/apis/migration.k8s.io/v1alpha1?hash=0123456789ABCDEF").await;
    assert_eq!(r.status, 301, "{}", r.text());
    assert_eq!(r.header("location").as_deref(), Some(url.as_str()));
    // No hash: served, but not immutable.
    let r = get(&c, "/openapi/v3/apis/migration.k8s.io/v1alpha1").await;
    assert_eq!(r.ok(200), doc);
    assert_ne!(r.header("cache-control").as_deref(), Some("public, immutable"));
    get(&c, "/openapi/v3/apis/nope.example.com/v1").await.status_err(404, "NotFound");

    assert_eq!(doc["openapi"], "3.0.0");
    let paths = doc["paths"].as_object().expect("paths");
    let mut ops = 0;
    for (path, item) in paths {
        assert!(path.starts_with("/apis/migration.k8s.io/v1alpha1/"), "only this group-version's paths: {path}");
        for (method, op) in item.as_object().expect("path item") {
            if method == "parameters" {
                continue;
            }
            ops += 1;
            let gvk = &op["x-kubernetes-group-version-kind"];
            assert!(gvk.is_object(), "{method} {path}: x-kubernetes-group-version-kind must be an object: {op}");
            assert_eq!(gvk["group"], GROUP, "{method} {path}");
            assert_eq!(gvk["version"], "v1alpha1", "{method} {path}");
            let kind = gvk["kind"].as_str().unwrap_or_default();
            let want = if path.contains("/storagestates") {
                "StorageState"
            } else if path.contains("/csitranslations") {
                assert_eq!(method, "post", "a create-only resource has only POST: {path}");
                "CSITranslation"
            } else {
                "StorageVersionMigration"
            };
            assert_eq!(kind, want, "{method} {path}");
        }
    }
    assert!(ops >= 2 * 10, "every path has operations: {ops}");
    // kubectl explain: the GET of the named path, then the schema whose GVK array contains it.
    let get_op = &doc["paths"]["/apis/migration.k8s.io/v1alpha1/storagestates/{name}"]["get"];
    assert_eq!(
        get_op["x-kubernetes-group-version-kind"],
        json!({"group": GROUP, "version": "v1alpha1", "kind": "StorageState"})
    );
    let schema = &doc["components"]["schemas"]["io.k8s.migration.v1alpha1.StorageState"];
    let gvks =
        schema["x-kubernetes-group-version-kind"].as_array().unwrap_or_else(|| panic!("schema GVK array: {schema}"));
    assert!(gvks.contains(&json!({"group": GROUP, "version": "v1alpha1", "kind": "StorageState"})), "{gvks:?}");
    // PATCH advertises exactly what is served: no strategic merge (client-side kubectl apply would use it).
    let want: BTreeSet<&str> =
        ["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"].into();
    for plural in ["storagestates", "storageversionmigrations"] {
        for sub in ["", "/status"] {
            let p = format!("/apis/migration.k8s.io/v1alpha1/{plural}/{{name}}{sub}");
            let patch = &doc["paths"][&p]["patch"];
            let content = patch["requestBody"]["content"].as_object().unwrap_or_else(|| panic!("{p}: {patch}"));
            assert_eq!(content.keys().map(String::as_str).collect::<BTreeSet<_>>(), want, "{p}");
            let params: Vec<&str> =
                patch["parameters"].as_array().expect("params").iter().filter_map(|x| x["name"].as_str()).collect();
            assert!(params.contains(&"fieldValidation") && params.contains(&"dryRun"), "{p}: {params:?}");
            assert!(params.contains(&"fieldManager") && params.contains(&"force"), "{p}: {params:?}");
        }
    }

    // Swagger 2.0 as JSON, or as protobuf for kubectl's client-side validation (see openapi::proto); else 406.
    let r = get_accept(&c, "/openapi/v2", "application/json").await;
    let v2 = r.ok(200);
    assert_eq!(r.header("content-type").as_deref(), Some("application/json"));
    assert_eq!(v2["swagger"], "2.0");
    let op = &v2["paths"]["/apis/migration.k8s.io/v1alpha1/storageversionmigrations/{name}"]["patch"];
    assert_eq!(op["x-kubernetes-group-version-kind"]["kind"], "StorageVersionMigration", "{op}");
    let def = &v2["definitions"]["io.k8s.migration.v1alpha1.StorageVersionMigration"];
    let gvks = def["x-kubernetes-group-version-kind"].as_array().unwrap_or_else(|| panic!("GVK array: {def}"));
    assert!(gvks.contains(&json!({"group": GROUP, "version": "v1alpha1", "kind": "StorageVersionMigration"})), "{def}");
    // Every kind's schema keeps its GVK list in v2 as in v3 (kubectl explain reads it).
    for (name, d) in v2["definitions"].as_object().expect("definitions") {
        assert!(!d.get("x-kubernetes-group-version-kind").is_some_and(Value::is_null), "{name} has a null GVK list");
    }
    let r = get_accept(&c, "/openapi/v2", "application/com.github.proto-openapi.spec.v2@v1.0+protobuf").await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type").as_deref(), Some("application/com.github.proto-openapi.spec.v2.v1.0+protobuf"));
    assert!(r.body.starts_with(b"\x0a\x032.0"), "gnostic Document.swagger first");
    // As kube-openapi: a bare 406.
    let r = get_accept(&c, "/openapi/v2", "application/yaml").await;
    assert_eq!((r.status, r.body.len()), (406, 0), "{}", r.text());
}

// ---------------------------------------------------------------------------------------------------------------
// CRUD and metadata

#[tokio::test]
async fn create_get_update_delete_and_metadata() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let path = |n: &str| format!("{SVM_PATH}/{n}");

    let before = chrono::Utc::now();
    let r = post(&c, SVM_PATH, &svm("crud")).await;
    let created = r.ok(201);
    assert_eq!(r.header("content-type").as_deref(), Some("application/json"));
    assert_eq!(created["apiVersion"], API_VERSION);
    assert_eq!(created["kind"], "StorageVersionMigration");
    let uid = created["metadata"]["uid"].as_str().expect("uid");
    uuid::Uuid::parse_str(uid).unwrap_or_else(|e| panic!("uid {uid} is not a UUID: {e}"));
    let ts = created["metadata"]["creationTimestamp"].as_str().expect("creationTimestamp");
    assert!(ts.ends_with('Z') && !ts.contains('.'), "RFC3339 seconds in UTC: {ts}");
    let t = chrono::DateTime::parse_from_rfc3339(ts).expect("RFC3339");
    assert!((t.timestamp() - before.timestamp()).abs() <= 5, "{ts} vs {before}");
    assert_eq!(created["metadata"]["generation"], 1);
    assert!(rv(&created) > 0);
    assert!(created.get("status").is_none(), "{created}");
    // GET returns exactly what create returned.
    assert_eq!(get(&c, &path("crud")).await.ok(200), created);
    // The typed client agrees.
    let api = svm_api(&c);
    let typed = api.get("crud").await.expect("kube get");
    assert_eq!(typed.metadata.uid.as_deref(), Some(uid));
    assert_eq!(typed.metadata.resource_version, Some(rv(&created).to_string()));

    // generateName: prefix plus five random characters, a new name each time.
    let gen = json!({"apiVersion": API_VERSION, "kind": "StorageVersionMigration", "metadata": {"generateName": "gen-"},
        "spec": {"resource": {"version": "v1", "resource": "pods"}}});
    let a = create_ok(&c, SVM_PATH, &gen).await;
    let b = create_ok(&c, SVM_PATH, &gen).await;
    let (na, nb) = (a["metadata"]["name"].as_str().expect("name"), b["metadata"]["name"].as_str().expect("name"));
    assert!(na.starts_with("gen-") && na.len() == 9, "{na}");
    assert!(nb.starts_with("gen-") && nb.len() == 9, "{nb}");
    assert_ne!(na, nb);
    assert_eq!(a["metadata"]["generateName"], "gen-");
    assert_eq!(get(&c, &path(na)).await.ok(200)["metadata"]["uid"], a["metadata"]["uid"]);
    // A long prefix (a DNS label's 63 characters, ShootState) is cut to 58 before the suffix, as apimachinery's name
    // generator does; only a prefix that is no valid label with its trailing dash masked is refused.
    let shoots = "/apis/core.gardener.cloud/v1beta1/namespaces/gen/shootstates";
    let long = format!("{}-", "g".repeat(61));
    let shoot = |prefix: &str| json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState", "metadata": {"generateName": prefix}});
    let made = create_ok(&c, shoots, &shoot(&long)).await;
    let name = made["metadata"]["name"].as_str().expect("name");
    assert!(name.len() == 63 && name.starts_with(&"g".repeat(58)), "{name}");
    let st = post(&c, shoots, &shoot(&"g".repeat(64))).await.status_err(422, "Invalid");
    assert_eq!(st["details"]["causes"][0]["field"], "metadata.generateName", "{st}");

    // AlreadyExists.
    let st = post(&c, SVM_PATH, &svm("crud")).await.status_err(409, "AlreadyExists");
    assert_eq!(st["message"], "storageversionmigrations.migration.k8s.io \"crud\" already exists");
    assert_eq!(st["details"], json!({"name": "crud", "group": GROUP, "kind": "storageversionmigrations"}));
    match api.create(&PostParams::default(), &dynobj(&svm("crud"))).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists")),
        other => panic!("expected AlreadyExists, got {other:?}"),
    }

    // NotFound, with kube's message, for both kinds.
    let st = get(&c, &format!("{SS_PATH}/x")).await.status_err(404, "NotFound");
    assert_eq!(st["message"], "storagestates.migration.k8s.io \"x\" not found");
    assert_eq!(st["details"], json!({"name": "x", "group": GROUP, "kind": "storagestates"}));
    match ss_api(&c).get("x").await {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"));
            assert_eq!(s.message, "storagestates.migration.k8s.io \"x\" not found");
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    let st = get(&c, &path("missing")).await.status_err(404, "NotFound");
    assert_eq!(st["message"], "storageversionmigrations.migration.k8s.io \"missing\" not found");
    // PUT does not create (no create-on-update), PATCH and DELETE of a missing object are 404.
    put(&c, &path("missing"), &svm("missing")).await.status_err(404, "NotFound");
    merge_patch(&c, &path("missing"), &json!({"metadata": {"labels": {"a": "b"}}})).await.status_err(404, "NotFound");
    delete(&c, &path("missing"), None).await.status_err(404, "NotFound");
    // The URL name wins over a different body name.
    put(&c, &path("crud"), &svm("other")).await.status_err(400, "BadRequest");

    // Stale resourceVersion: 409 Conflict with kube's message.
    let labeled = merge_patch(&c, &path("crud"), &json!({"metadata": {"labels": {"x": "1"}}})).await.ok(200);
    assert!(rv(&labeled) > rv(&created));
    let mut stale = created.clone();
    stale["metadata"]["labels"] = json!({"x": "2"});
    let st = put(&c, &path("crud"), &stale).await.status_err(409, "Conflict");
    assert_eq!(
        st["message"],
        format!("Operation cannot be fulfilled on storageversionmigrations.migration.k8s.io \"crud\": {CONFLICT_TAIL}")
    );
    assert_eq!(st["details"], json!({"name": "crud", "group": GROUP, "kind": "storageversionmigrations"}));
    // A merge patch carrying a stale resourceVersion is a conflict too.
    let st = merge_patch(
        &c,
        &path("crud"),
        &json!({"metadata": {"resourceVersion": rv(&created).to_string(), "labels": {"x": "3"}}}),
    )
    .await
    .status_err(409, "Conflict");
    assert!(st["message"].as_str().unwrap_or_default().ends_with(CONFLICT_TAIL), "{st}");
    // A PUT with the current resourceVersion succeeds and returns a newer one.
    let mut fresh = labeled.clone();
    fresh["metadata"]["labels"] = json!({"x": "4"});
    let updated = put(&c, &path("crud"), &fresh).await.ok(200);
    assert_eq!(updated["metadata"]["labels"], json!({"x": "4"}));
    assert!(rv(&updated) > rv(&labeled));
    assert_eq!(updated["metadata"]["uid"], created["metadata"]["uid"]);
    assert_eq!(updated["metadata"]["creationTimestamp"], created["metadata"]["creationTimestamp"]);

    // uid precondition mismatch, on update and on delete.
    let other_uid = uuid::Uuid::new_v4().to_string();
    let mut wrong = updated.clone();
    wrong["metadata"]["uid"] = json!(other_uid);
    let st = put(&c, &path("crud"), &wrong).await.status_err(409, "Conflict");
    assert_eq!(
        st["message"],
        format!("Operation cannot be fulfilled on storageversionmigrations.migration.k8s.io \"crud\": Precondition failed: UID in precondition: {other_uid}, UID in object meta: {uid}")
    );
    let opts = json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": other_uid}});
    let st = delete(&c, &path("crud"), Some(&opts)).await.status_err(409, "Conflict");
    assert!(st["message"].as_str().unwrap_or_default().contains("Precondition failed: UID in precondition"), "{st}");
    let opts = json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"resourceVersion": rv(&created).to_string()}});
    delete(&c, &path("crud"), Some(&opts)).await.status_err(409, "Conflict");
    assert_eq!(get(&c, &path("crud")).await.ok(200), updated, "failed preconditions change nothing");

    // Delete with matching preconditions: a Success naming the deleted object, as kube-apiserver's generic registry
    // answers (the resource where the kind would be), then it is gone.
    let opts = json!({"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid, "resourceVersion": rv(&updated).to_string()}});
    let gone = delete(&c, &path("crud"), Some(&opts)).await.ok(200);
    assert_eq!(gone["kind"], "Status", "{gone}");
    assert_eq!(gone["status"], "Success", "{gone}");
    assert_eq!(
        gone["details"],
        json!({"name": "crud", "group": "migration.k8s.io", "kind": "storageversionmigrations", "uid": uid})
    );
    get(&c, &path("crud")).await.status_err(404, "NotFound");
    // The name is free again: a new object with a new uid.
    let again = create_ok(&c, SVM_PATH, &svm("crud")).await;
    assert_ne!(again["metadata"]["uid"], uid);
    assert!(rv(&again) > rv(&updated));
}

#[tokio::test]
async fn generation_and_status_subresource() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let p = format!("{SVM_PATH}/gen");
    let st = format!("{p}/status");

    let mut with_status = svm("gen");
    with_status["status"] = json!({"migratedObjects": 9, "conditions": [{"type": "Running", "status": "True"}]});
    let created = create_ok(&c, SVM_PATH, &with_status).await;
    assert!(created.get("status").is_none(), "status on create is ignored: {created}");
    assert_eq!(created["metadata"]["generation"], 1);
    assert!(get(&c, &p).await.ok(200).get("status").is_none());

    // Labels and annotations: no generation bump.
    let o =
        merge_patch(&c, &p, &json!({"metadata": {"labels": {"a": "b"}, "annotations": {"note": "x"}}})).await.ok(200);
    assert_eq!(o["metadata"]["generation"], 1);
    assert!(rv(&o) > rv(&created));
    // Spec: bump.
    let o = merge_patch(&c, &p, &json!({"spec": {"continueToken": "t1"}})).await.ok(200);
    assert_eq!(o["metadata"]["generation"], 2);
    // The same spec again: a no-op, no new resourceVersion, no bump.
    let same = merge_patch(&c, &p, &json!({"spec": {"continueToken": "t1"}})).await.ok(200);
    assert_eq!(same["metadata"]["generation"], 2);
    assert_eq!(rv(&same), rv(&o), "a no-op patch does not write");
    // Clients cannot set generation.
    let o = merge_patch(&c, &p, &json!({"metadata": {"generation": 42}})).await.ok(200);
    assert_eq!(o["metadata"]["generation"], 2);

    // Status through the main resource is ignored (PUT and PATCH); the rest of the update applies.
    let mut body = get(&c, &p).await.ok(200);
    body["status"] = json!({"migratedObjects": 5});
    body["metadata"]["labels"] = json!({"a": "c"});
    let o = put(&c, &p, &body).await.ok(200);
    assert!(o.get("status").is_none(), "{o}");
    assert_eq!(o["metadata"]["labels"], json!({"a": "c"}));
    assert_eq!(o["metadata"]["generation"], 2);
    let o = merge_patch(&c, &p, &json!({"status": {"migratedObjects": 6}})).await.ok(200);
    assert!(o.get("status").is_none(), "{o}");

    // /status: status changes, spec and metadata do not, generation stays.
    let before = get(&c, &p).await.ok(200);
    let o = merge_patch(
        &c,
        &st,
        &json!({"spec": {"continueToken": "ignored"}, "metadata": {"labels": {"a": "ignored"}},
        "status": {"migratedObjects": 3}}),
    )
    .await
    .ok(200);
    assert_eq!(o["status"]["migratedObjects"], 3);
    assert_eq!(o["spec"], before["spec"]);
    assert_eq!(o["metadata"]["labels"], json!({"a": "c"}));
    assert_eq!(o["metadata"]["generation"], 2);
    assert!(rv(&o) > rv(&before));
    let mut full = o.clone();
    full["spec"]["resource"]["version"] = json!("v2");
    full["status"]["remainingObjectsEstimate"] = json!(10);
    let o2 = put(&c, &st, &full).await.ok(200);
    assert_eq!(o2["spec"], before["spec"], "PUT /status leaves spec alone");
    assert_eq!(o2["status"], json!({"migratedObjects": 3, "remainingObjectsEstimate": 10}));
    assert_eq!(o2["metadata"]["generation"], 2);
    // GET /status returns the whole object.
    assert_eq!(get(&c, &st).await.ok(200), o2);
    assert_eq!(get(&c, &p).await.ok(200), o2);
    // Other subresources do not exist; DELETE on /status is not allowed.
    get(&c, &format!("{p}/scale")).await.status_err(404, "NotFound");
    delete(&c, &st, None).await.status_err(405, "MethodNotAllowed");

    // StorageState: create defaults the status to "persisted: Unknown" whatever the client sent.
    let mut body = ss("pods", "");
    body["status"] = json!({"persistedStorageVersionHashes": ["abc"], "currentStorageVersionHash": "abc"});
    let o = create_ok(&c, SS_PATH, &body).await;
    assert_eq!(o["status"], json!({"persistedStorageVersionHashes": ["Unknown"]}));
    let sp = format!("{SS_PATH}/pods");
    let o =
        merge_patch(&c, &format!("{sp}/status"), &json!({"status": {"currentStorageVersionHash": "h1"}})).await.ok(200);
    assert_eq!(o["status"], json!({"persistedStorageVersionHashes": ["Unknown"], "currentStorageVersionHash": "h1"}));
    assert_eq!(o["metadata"]["generation"], 1);
    let o = merge_patch(&c, &sp, &json!({"status": {"currentStorageVersionHash": "h2"}})).await.ok(200);
    assert_eq!(o["status"]["currentStorageVersionHash"], "h1");
}

// ---------------------------------------------------------------------------------------------------------------
// validation (422)

#[tokio::test]
async fn invalid_objects_list_every_cause() {
    let s = Server::start(&[]);
    let c = s.client().await;

    // Several invalid fields: every one is a cause, and the message lists them all.
    let body = json!({"apiVersion": API_VERSION, "kind": "StorageVersionMigration",
        "metadata": {"name": "Bad_Name", "labels": {"ok": "-bad-"}}, "spec": {"resource": {"group": "apps"}}});
    let st = post(&c, SVM_PATH, &body).await.status_err(422, "Invalid");
    assert_eq!(
        cause_set(&st),
        pairs(&[
            ("FieldValueInvalid", "metadata.name"),
            ("FieldValueInvalid", "metadata.labels"),
            ("FieldValueRequired", "spec.resource.resource"),
            ("FieldValueRequired", "spec.resource.version"),
        ]),
        "{st}"
    );
    assert_eq!(cause_pairs(&st).len(), 4, "{st}");
    let msg = st["message"].as_str().expect("message");
    assert!(msg.starts_with("StorageVersionMigration.migration.k8s.io \"Bad_Name\" is invalid: ["), "{msg}");
    for c in st["details"]["causes"].as_array().expect("causes") {
        assert!(msg.contains(c["message"].as_str().expect("cause message")), "{msg} lacks {c}");
    }
    assert!(msg.contains("spec.resource.resource: Required value"), "{msg}");
    assert_eq!(st["details"]["name"], "Bad_Name");
    assert_eq!(st["details"]["group"], GROUP);
    assert_eq!(st["details"]["kind"], "StorageVersionMigration");
    get(&c, &format!("{SVM_PATH}/Bad_Name")).await.status_err(404, "NotFound");
    // No name at all.
    let mut nameless = svm("x");
    nameless["metadata"] = json!({});
    let st = post(&c, SVM_PATH, &nameless).await.status_err(422, "Invalid");
    assert_eq!(cause_pairs(&st), vec![("FieldValueRequired".to_string(), "metadata.name".to_string())]);

    // StorageState: the name must be <resource>.<group> of spec.resource.
    let mut body = ss("deployments", "apps");
    body["metadata"]["name"] = json!("pods");
    let st = post(&c, SS_PATH, &body).await.status_err(422, "Invalid");
    assert_eq!(cause_pairs(&st), vec![("FieldValueInvalid".to_string(), "metadata.name".to_string())], "{st}");
    assert!(st["message"].as_str().unwrap_or_default().contains("must be \"deployments.apps\""), "{st}");
    assert!(
        st["message"].as_str().unwrap_or_default().starts_with("StorageState.migration.k8s.io \"pods\" is invalid: "),
        "{st}"
    );
    create_ok(&c, SS_PATH, &ss("deployments", "apps")).await;
    create_ok(&c, SS_PATH, &ss("pods", "")).await;
    // spec.resource is immutable on a StorageState too.
    let st = merge_patch(&c, &format!("{SS_PATH}/pods"), &json!({"spec": {"resource": {"resource": "services"}}}))
        .await
        .status_err(422, "Invalid");
    assert!(cause_set(&st).contains(&("FieldValueInvalid".to_string(), "spec.resource".to_string())), "{st}");

    // StorageVersionMigration: spec.resource is immutable (PUT and PATCH), other spec fields are not.
    let created = create_ok(&c, SVM_PATH, &svm("imm")).await;
    let p = format!("{SVM_PATH}/imm");
    let mut changed = created.clone();
    changed["spec"]["resource"]["version"] = json!("v2");
    let st = put(&c, &p, &changed).await.status_err(422, "Invalid");
    assert_eq!(cause_pairs(&st), vec![("FieldValueInvalid".to_string(), "spec.resource".to_string())], "{st}");
    assert!(st["message"].as_str().unwrap_or_default().contains("field is immutable"), "{st}");
    let st = merge_patch(&c, &p, &json!({"spec": {"resource": {"group": "batch"}}})).await.status_err(422, "Invalid");
    assert_eq!(cause_pairs(&st), vec![("FieldValueInvalid".to_string(), "spec.resource".to_string())], "{st}");
    merge_patch(&c, &p, &json!({"spec": {"continueToken": "x"}})).await.ok(200);
    assert_eq!(get(&c, &p).await.ok(200)["spec"]["resource"], created["spec"]["resource"]);

    // Conditions (through /status).
    let sp = format!("{p}/status");
    let cond = |conds: Value| json!({"status": {"conditions": conds}});
    let st = merge_patch(
        &c,
        &sp,
        &cond(json!([{"type": "Succeeded", "status": "True"}, {"type": "Failed", "status": "True"}])),
    )
    .await
    .status_err(422, "Invalid");
    assert_eq!(cause_pairs(&st), vec![("FieldValueInvalid".to_string(), "status.conditions".to_string())], "{st}");
    assert!(
        st["message"].as_str().unwrap_or_default().contains("Both success and failed conditions cannot be true"),
        "{st}"
    );
    let st = merge_patch(
        &c,
        &sp,
        &cond(json!([{"type": "Running", "status": "True"}, {"type": "Succeeded", "status": "True"}])),
    )
    .await
    .status_err(422, "Invalid");
    assert_eq!(cause_pairs(&st), vec![("FieldValueInvalid".to_string(), "status.conditions".to_string())], "{st}");
    assert!(st["message"].as_str().unwrap_or_default().contains("Running condition cannot be true"), "{st}");
    let st = merge_patch(&c, &sp, &cond(json!([{"type": "Running", "status": "True", "reason": "not a reason!"}])))
        .await
        .status_err(422, "Invalid");
    assert_eq!(
        cause_pairs(&st),
        vec![("FieldValueInvalid".to_string(), "status.conditions[0].reason".to_string())],
        "{st}"
    );
    let st =
        merge_patch(&c, &sp, &cond(json!([{"type": "Running", "status": "Maybe"}]))).await.status_err(422, "Invalid");
    assert_eq!(
        cause_pairs(&st),
        vec![("FieldValueNotSupported".to_string(), "status.conditions[0].status".to_string())],
        "{st}"
    );
    let st = merge_patch(&c, &sp, &json!({"status": {"migratedObjects": -1}})).await.status_err(422, "Invalid");
    assert_eq!(cause_pairs(&st), vec![("FieldValueInvalid".to_string(), "status.migratedObjects".to_string())], "{st}");
    assert!(get(&c, &p).await.ok(200).get("status").is_none(), "rejected status writes change nothing");
    // Valid conditions pass; a reason with ',' and ':' is valid.
    let o = merge_patch(&c, &sp, &cond(json!([{"type": "Running", "status": "True", "reason": "Started:Chunk_1,A"}])))
        .await
        .ok(200);
    assert_eq!(o["status"]["conditions"][0]["reason"], "Started:Chunk_1,A");
}

// ---------------------------------------------------------------------------------------------------------------
// dry run

#[tokio::test]
async fn dry_run_changes_nothing() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let api = svm_api(&c);
    let base = create_ok(&c, SVM_PATH, &svm("dry")).await;
    let p = format!("{SVM_PATH}/dry");
    let rev = list_rv(&c, SVM_PATH).await;

    // create
    let pp = PostParams { dry_run: true, ..Default::default() };
    let o = api.create(&pp, &dynobj(&svm("dry-new"))).await.expect("dry-run create");
    assert_eq!(o.metadata.name.as_deref(), Some("dry-new"));
    assert!(
        o.metadata.uid.is_some() && o.metadata.creation_timestamp.is_some(),
        "dry run returns the object as it would be"
    );
    let r = post(&c, &format!("{SVM_PATH}?dryRun=All"), &svm("dry-new")).await;
    assert_eq!(r.ok(201)["metadata"]["name"], "dry-new");
    get(&c, &format!("{SVM_PATH}/dry-new")).await.status_err(404, "NotFound");
    // A dry-run create of an existing name still fails like the real one.
    post(&c, &format!("{SVM_PATH}?dryRun=All"), &svm("dry")).await.status_err(409, "AlreadyExists");

    // update
    let mut body = base.clone();
    body["metadata"]["labels"] = json!({"dry": "put"});
    let o = put(&c, &format!("{p}?dryRun=All"), &body).await.ok(200);
    assert_eq!(o["metadata"]["labels"], json!({"dry": "put"}));
    // patch
    let o = merge_patch(
        &c,
        &format!("{p}?dryRun=All"),
        &json!({"metadata": {"labels": {"dry": "patch"}}, "spec": {"continueToken": "t"}}),
    )
    .await
    .ok(200);
    assert_eq!(o["metadata"]["labels"], json!({"dry": "patch"}));
    assert_eq!(o["metadata"]["generation"], 2);
    let o = api
        .patch(
            "dry",
            &PatchParams { dry_run: true, ..Default::default() },
            &Patch::Merge(json!({"metadata": {"labels": {"dry": "kube"}}})),
        )
        .await
        .expect("dry-run patch");
    assert_eq!(o.metadata.labels.as_ref().and_then(|l| l.get("dry")).map(String::as_str), Some("kube"));
    // status
    let o =
        merge_patch(&c, &format!("{p}/status?dryRun=All"), &json!({"status": {"migratedObjects": 1}})).await.ok(200);
    assert_eq!(o["status"]["migratedObjects"], 1);
    // delete
    let o = delete(&c, &format!("{p}?dryRun=All"), None).await.ok(200);
    assert_eq!(o["details"]["name"], "dry", "{o}");
    let dp = DeleteParams { dry_run: true, ..Default::default() };
    api.delete("dry", &dp).await.expect("dry-run delete");
    let opts = json!({"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]});
    delete(&c, &p, Some(&opts)).await.ok(200);
    // deletecollection
    let r = call(&c, Method::DELETE, &format!("{SVM_PATH}?dryRun=All"), &[], vec![]).await;
    assert_eq!(names(&r.ok(200)["items"]), vec!["dry"]);

    // Nothing changed: the object is as created and no revision was used.
    assert_eq!(get(&c, &p).await.ok(200), base);
    assert_eq!(list_rv(&c, SVM_PATH).await, rev);
    assert_eq!(names(&get(&c, SVM_PATH).await.ok(200)["items"]), vec!["dry"]);

    // An unsupported dryRun value is kube-apiserver's 422 on the CreateOptions (ValidateCreateOptions).
    post(&c, &format!("{SVM_PATH}?dryRun=Yes"), &svm("dry-x")).await.status_err(422, "Invalid");
}

// ---------------------------------------------------------------------------------------------------------------
// fieldValidation

#[tokio::test]
async fn field_validation_strict_warn_ignore() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let unknown = |name: &str| {
        let mut o = svm(name);
        o["spec"]["foo"] = json!(1);
        o
    };
    let prefix = "StorageVersionMigration in version \"v1alpha1\" cannot be handled as a StorageVersionMigration: ";

    // Strict: 400 naming the field, nothing created.
    let st = post(&c, &format!("{SVM_PATH}?fieldValidation=Strict"), &unknown("fv-strict"))
        .await
        .status_err(400, "BadRequest");
    assert_eq!(st["message"], format!("{prefix}strict decoding error: unknown field \"spec.foo\""));
    get(&c, &format!("{SVM_PATH}/fv-strict")).await.status_err(404, "NotFound");
    // A duplicate field in the raw body is reported under Strict too (serde_json would silently keep the last).
    let dup =
        br#"{"apiVersion":"migration.k8s.io/v1alpha1","kind":"StorageVersionMigration","metadata":{"name":"fv-dup"},
        "spec":{"resource":{"group":"apps","group":"apps","version":"v1","resource":"deployments"}}}"#;
    let r = call(
        &c,
        Method::POST,
        &format!("{SVM_PATH}?fieldValidation=Strict"),
        &[("content-type", "application/json")],
        dup.to_vec(),
    )
    .await;
    let st = r.status_err(400, "BadRequest");
    assert_eq!(st["message"], format!("{prefix}strict decoding error: duplicate field \"spec.resource.group\""));
    // Both kinds of problem in one body: both reported.
    let both =
        br#"{"apiVersion":"migration.k8s.io/v1alpha1","kind":"StorageVersionMigration","metadata":{"name":"fv-both"},
        "spec":{"foo":1,"resource":{"version":"v1","version":"v1","resource":"pods"}}}"#;
    let r = call(
        &c,
        Method::POST,
        &format!("{SVM_PATH}?fieldValidation=Strict"),
        &[("content-type", "application/json")],
        both.to_vec(),
    )
    .await;
    let msg = r.status_err(400, "BadRequest")["message"].as_str().unwrap_or_default().to_string();
    assert!(
        msg.contains("unknown field \"spec.foo\"") && msg.contains("duplicate field \"spec.resource.version\""),
        "{msg}"
    );

    // Warn: created, the field dropped, one Warning header per problem.
    let r = post(&c, &format!("{SVM_PATH}?fieldValidation=Warn"), &unknown("fv-warn")).await;
    let o = r.ok(201);
    assert_eq!(r.header_all("warning"), vec![r#"299 - "unknown field \"spec.foo\"""#.to_string()]);
    assert!(o["spec"].get("foo").is_none(), "{o}");
    assert!(get(&c, &format!("{SVM_PATH}/fv-warn")).await.ok(200)["spec"].get("foo").is_none());
    let r = call(
        &c,
        Method::POST,
        &format!("{SVM_PATH}?fieldValidation=Warn"),
        &[("content-type", "application/json")],
        dup.to_vec(),
    )
    .await;
    r.ok(201);
    assert_eq!(r.header_all("warning"), vec![r#"299 - "duplicate field \"spec.resource.group\"""#.to_string()]);
    // Warn is the default.
    let r = post(&c, SVM_PATH, &unknown("fv-default")).await;
    r.ok(201);
    assert_eq!(r.header_all("warning"), vec![r#"299 - "unknown field \"spec.foo\"""#.to_string()]);
    // Ignore: created, no warning.
    let r = post(&c, &format!("{SVM_PATH}?fieldValidation=Ignore"), &unknown("fv-ignore")).await;
    r.ok(201);
    assert!(r.header_all("warning").is_empty(), "{:?}", r.header_all("warning"));
    // A clean body under Strict: no warning either.
    let r = post(&c, &format!("{SVM_PATH}?fieldValidation=Strict"), &svm("fv-clean")).await;
    r.ok(201);
    assert!(r.header_all("warning").is_empty());

    // Updates and patches honour it as well.
    let p = format!("{SVM_PATH}/fv-clean");
    let st = merge_patch(&c, &format!("{p}?fieldValidation=Strict"), &json!({"spec": {"foo": 1}}))
        .await
        .status_err(400, "BadRequest");
    assert_eq!(st["message"], format!("{prefix}strict decoding error: unknown field \"spec.foo\""));
    let mut body = get(&c, &p).await.ok(200);
    body["metadata"]["bogus"] = json!(true);
    let st = put(&c, &format!("{p}?fieldValidation=Strict"), &body).await.status_err(400, "BadRequest");
    assert!(st["message"].as_str().unwrap_or_default().ends_with("unknown field \"metadata.bogus\""), "{st}");
    let r = put(&c, &format!("{p}?fieldValidation=Warn"), &body).await;
    r.ok(200);
    assert_eq!(r.header_all("warning"), vec![r#"299 - "unknown field \"metadata.bogus\"""#.to_string()]);

    // An unknown fieldValidation value: 400.
    let st =
        post(&c, &format!("{SVM_PATH}?fieldValidation=Bogus"), &svm("fv-bogus")).await.status_err(400, "BadRequest");
    assert!(st["message"].as_str().unwrap_or_default().contains("fieldValidation"), "{st}");
    get(&c, &format!("{SVM_PATH}/fv-bogus")).await.status_err(404, "NotFound");
}

// ---------------------------------------------------------------------------------------------------------------
// request bodies

#[tokio::test]
async fn request_body_errors() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let created = create_ok(&c, SVM_PATH, &svm("body")).await;
    let p = format!("{SVM_PATH}/body");

    // Over 3 MiB: 413 before anything is decoded.
    let mut big = svm("big");
    big["metadata"]["annotations"] = json!({"big": "x".repeat(3 * 1024 * 1024)});
    let st = post(&c, SVM_PATH, &big).await.status_err(413, "RequestEntityTooLarge");
    assert!(st["message"].as_str().unwrap_or_default().contains("too large"), "{st}");
    // Under the request limit, but the object is larger than what may be stored: 413 as well.
    let mut large = svm("large");
    large["spec"]["continueToken"] = json!("y".repeat(2 * 1024 * 1024));
    post(&c, SVM_PATH, &large).await.status_err(413, "RequestEntityTooLarge");
    get(&c, &format!("{SVM_PATH}/large")).await.status_err(404, "NotFound");

    // Patch types that are not served: 415 naming what is.
    for ct in ["application/strategic-merge-patch+json", "application/apply-patch+cbor", "text/plain"] {
        let r = call(&c, Method::PATCH, &p, &[("content-type", ct)], br#"{"metadata":{"labels":{"a":"b"}}}"#.to_vec())
            .await;
        let st = r.status_err(415, "UnsupportedMediaType");
        assert!(st["message"].as_str().unwrap_or_default().contains("application/merge-patch+json"), "{st}");
    }
    // POST in something else than JSON: 415.
    let r = call(&c, Method::POST, SVM_PATH, &[("content-type", "application/yaml")], b"metadata: {name: y}".to_vec())
        .await;
    r.status_err(415, "UnsupportedMediaType");

    // Malformed JSON: 400 Status.
    let r = call(
        &c,
        Method::POST,
        SVM_PATH,
        &[("content-type", "application/json")],
        br#"{"metadata": {"name": "#.to_vec(),
    )
    .await;
    r.status_err(400, "BadRequest");
    let r = call(&c, Method::POST, SVM_PATH, &[("content-type", "application/json")], vec![]).await;
    r.status_err(400, "BadRequest");
    let r = call(&c, Method::POST, SVM_PATH, &[("content-type", "application/json")], b"[1,2]".to_vec()).await;
    r.status_err(400, "BadRequest");
    // A body of the wrong kind or version: 400.
    let mut wrong_kind = svm("wk");
    wrong_kind["kind"] = json!("StorageState");
    post(&c, SVM_PATH, &wrong_kind).await.status_err(400, "BadRequest");
    let mut wrong_version = svm("wv");
    wrong_version["apiVersion"] = json!("migration.k8s.io/v1");
    post(&c, SVM_PATH, &wrong_version).await.status_err(400, "BadRequest");
    // A field of the wrong type: 400.
    let mut wrong_type = svm("wt");
    wrong_type["spec"]["resource"] = json!("deployments");
    post(&c, SVM_PATH, &wrong_type).await.status_err(400, "BadRequest");
    let r =
        call(&c, Method::PATCH, &p, &[("content-type", "application/merge-patch+json")], b"{not json".to_vec()).await;
    r.status_err(400, "BadRequest");
    let r =
        call(&c, Method::PATCH, &p, &[("content-type", "application/json-patch+json")], br#"{"op":"add"}"#.to_vec())
            .await;
    r.status_err(400, "BadRequest");

    // A JSON patch whose test fails: a 422 Status, not a 500, and nothing changes.
    let st = json_patch(
        &c,
        &p,
        &json!([{"op": "test", "path": "/spec/resource/group", "value": "nope"},
        {"op": "replace", "path": "/spec/continueToken", "value": "changed"}]),
    )
    .await
    .status_err(422, "Invalid");
    assert!(
        st["message"]
            .as_str()
            .unwrap_or_default()
            .contains("the server rejected our request due to an error in our request"),
        "{st}"
    );
    // Removing a path that does not exist: also rejected as a client error.
    let r = json_patch(&c, &p, &json!([{"op": "remove", "path": "/spec/nothing/here"}])).await;
    assert!(r.status == 422 || r.status == 400, "{} {}", r.status, r.text());
    assert_eq!(r.json()["kind"], "Status");
    assert_eq!(get(&c, &p).await.ok(200), created);
    // A passing test applies the rest.
    let o = json_patch(
        &c,
        &p,
        &json!([{"op": "test", "path": "/spec/resource/group", "value": "apps"},
        {"op": "add", "path": "/spec/continueToken", "value": "changed"}]),
    )
    .await
    .ok(200);
    assert_eq!(o["spec"]["continueToken"], "changed");

    // Unknown verbs on a collection.
    let r = call(&c, Method::PUT, SVM_PATH, &[("content-type", "application/json")], b"{}".to_vec()).await;
    r.status_err(405, "MethodNotAllowed");
}

// ---------------------------------------------------------------------------------------------------------------
// lists

#[tokio::test]
async fn list_chunking_and_selectors() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let labels = [
        json!({"env": "prod", "tier": "web"}),
        json!({"env": "prod"}),
        json!({"env": "prod"}),
        json!({"env": "dev", "tier": "web"}),
        json!({"env": "dev"}),
        json!({"tier": "web"}),
        json!({}),
    ];
    for (i, l) in labels.iter().enumerate() {
        create_ok(&c, SVM_PATH, &svm_labeled(&format!("list-{i}"), l.clone())).await;
    }
    let all: Vec<String> = (0..7).map(|i| format!("list-{i}")).collect();

    // The full list: kind, apiVersion, items with kind/apiVersion, in name order, no continue.
    let list = get(&c, SVM_PATH).await.ok(200);
    assert_eq!(list["kind"], "StorageVersionMigrationList");
    assert_eq!(list["apiVersion"], API_VERSION);
    assert_eq!(names(&list["items"]), all);
    for it in list["items"].as_array().expect("items") {
        assert_eq!(it["kind"], "StorageVersionMigration");
        assert_eq!(it["apiVersion"], API_VERSION);
    }
    assert!(
        list["metadata"].get("continue").is_none() && list["metadata"].get("remainingItemCount").is_none(),
        "{}",
        list["metadata"]
    );

    // Pages of 3: 3 + 3 + 1, remainingItemCount 4 then 1, each object exactly once, one snapshot throughout.
    let p1 = get(&c, &format!("{SVM_PATH}?limit=3")).await.ok(200);
    assert_eq!(names(&p1["items"]), all[..3]);
    assert_eq!(p1["metadata"]["remainingItemCount"], 4, "{}", p1["metadata"]);
    let cont = p1["metadata"]["continue"].as_str().expect("continue").to_string();
    let snapshot = p1["metadata"]["resourceVersion"].clone();
    // Written after the first page: not part of this paged list.
    create_ok(&c, SVM_PATH, &svm("list-9")).await;
    merge_patch(&c, &format!("{SVM_PATH}/list-5"), &json!({"metadata": {"labels": {"late": "yes"}}})).await.ok(200);
    let mut seen = names(&p1["items"]);
    let mut cont = Some(cont);
    let mut pages = 1;
    while let Some(token) = cont {
        let page = get(&c, &format!("{SVM_PATH}?limit=3&continue={token}")).await.ok(200);
        pages += 1;
        assert_eq!(page["metadata"]["resourceVersion"], snapshot, "continued pages read the first page's revision");
        for it in page["items"].as_array().expect("items") {
            if it["metadata"]["name"] == "list-5" {
                assert!(it["metadata"]["labels"].get("late").is_none(), "snapshot: {it}");
            }
        }
        seen.extend(names(&page["items"]));
        cont = page["metadata"]["continue"].as_str().map(str::to_string);
        match cont {
            Some(_) => assert_eq!(page["metadata"]["remainingItemCount"], 1, "{}", page["metadata"]),
            None => assert!(page["metadata"].get("remainingItemCount").is_none(), "{}", page["metadata"]),
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, all, "every object exactly once");
    // The typed client pages the same way.
    let api = svm_api(&c);
    let first = api.list(&ListParams::default().limit(3)).await.expect("kube list");
    assert_eq!(first.items.len(), 3);
    assert_eq!(first.metadata.remaining_item_count, Some(5));
    assert!(first.metadata.continue_.is_some());

    // Invalid continue tokens: 400.
    get(&c, &format!("{SVM_PATH}?limit=3&continue=garbage!!")).await.status_err(400, "BadRequest");
    let forged =
        base64::engine::general_purpose::URL_SAFE.encode(br#"{"v":"meta.k8s.io/v1","rv":1,"start":"../x\u0000"}"#);
    get(&c, &format!("{SVM_PATH}?limit=3&continue={forged}")).await.status_err(400, "BadRequest");

    // Label selectors, set-based.
    let sel = |q: &'static str| {
        let c = c.clone();
        async move {
            let enc: String = form_urlencoded::byte_serialize(q.as_bytes()).collect();
            names(&get(&c, &format!("{SVM_PATH}?labelSelector={enc}")).await.ok(200)["items"])
        }
    };
    let n = |ix: &[usize]| ix.iter().map(|i| format!("list-{i}")).collect::<Vec<_>>();
    assert_eq!(sel("env in (prod,dev)").await, n(&[0, 1, 2, 3, 4]));
    assert_eq!(sel("env notin (prod)").await, [n(&[3, 4, 5, 6]), vec!["list-9".to_string()]].concat());
    assert_eq!(sel("!env").await, [n(&[5, 6]), vec!["list-9".to_string()]].concat());
    assert_eq!(sel("tier").await, n(&[0, 3, 5]));
    assert_eq!(sel("env=prod,tier").await, n(&[0]));
    assert_eq!(sel("env==dev,!tier").await, n(&[4]));
    assert_eq!(sel("env!=prod,tier in (web)").await, n(&[3, 5]));
    assert_eq!(sel("env=nope").await, Vec::<String>::new());
    // kube's ListParams send the same.
    let l = api.list(&ListParams::default().labels("env in (dev),tier")).await.expect("kube list");
    assert_eq!(l.items.iter().map(|o| o.metadata.name.clone().unwrap_or_default()).collect::<Vec<_>>(), n(&[3]));
    // Filtered pages: no remainingItemCount (unknown), all matches found.
    let enc: String = form_urlencoded::byte_serialize(b"env in (prod,dev)").collect();
    let page = get(&c, &format!("{SVM_PATH}?limit=2&labelSelector={enc}")).await.ok(200);
    assert_eq!(names(&page["items"]), n(&[0, 1]));
    assert!(page["metadata"].get("remainingItemCount").is_none(), "{}", page["metadata"]);
    let mut seen = names(&page["items"]);
    let mut cont = page["metadata"]["continue"].as_str().map(str::to_string);
    while let Some(t) = cont {
        let page = get(&c, &format!("{SVM_PATH}?limit=2&labelSelector={enc}&continue={t}")).await.ok(200);
        seen.extend(names(&page["items"]));
        cont = page["metadata"]["continue"].as_str().map(str::to_string);
    }
    assert_eq!(seen, n(&[0, 1, 2, 3, 4]));
    get(&c, &format!("{SVM_PATH}?labelSelector=env%20in%20prod")).await.status_err(400, "BadRequest");

    // Field selectors: metadata.name; anything else is a 400.
    assert_eq!(
        names(&get(&c, &format!("{SVM_PATH}?fieldSelector=metadata.name%3Dlist-3")).await.ok(200)["items"]),
        n(&[3])
    );
    let not3 = names(&get(&c, &format!("{SVM_PATH}?fieldSelector=metadata.name!%3Dlist-3")).await.ok(200)["items"]);
    assert_eq!(not3.len(), 7);
    assert!(!not3.contains(&"list-3".to_string()));
    let l = api.list(&ListParams::default().fields("metadata.name=list-6")).await.expect("kube list");
    assert_eq!(l.items.len(), 1);
    get(&c, &format!("{SVM_PATH}?fieldSelector=spec.foo%3Dx")).await.status_err(400, "BadRequest");
    get(&c, &format!("{SVM_PATH}?limit=abc")).await.status_err(400, "BadRequest");
}

// ---------------------------------------------------------------------------------------------------------------
// watch

#[tokio::test]
async fn watch_streams() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let api = svm_api(&c);
    create_ok(&c, SVM_PATH, &svm_labeled("w-1", json!({"sel": "yes"}))).await;
    create_ok(&c, SVM_PATH, &svm_labeled("w-2", json!({"sel": "no"}))).await;

    // From a list's resourceVersion: exactly the later changes, in order, resourceVersions increasing.
    let rv0 = list_rv(&c, SVM_PATH).await;
    let mut w = Watch::open(&c, &format!("{SVM_PATH}?watch=true&resourceVersion={rv0}"), &[]).await;
    let mut kw = api.watch(&WatchParams::default(), &rv0.to_string()).await.expect("kube watch").boxed();
    let a = create_ok(&c, SVM_PATH, &svm("w-a")).await;
    let m = merge_patch(&c, &format!("{SVM_PATH}/w-a"), &json!({"metadata": {"labels": {"k": "v"}}})).await.ok(200);
    delete(&c, &format!("{SVM_PATH}/w-a"), None).await.ok(200);
    let (e1, e2, e3) = (w.next_change().await, w.next_change().await, w.next_change().await);
    assert_eq!(event(&e1), ("ADDED".into(), "w-a".into()), "{e1}");
    assert_eq!(event(&e2), ("MODIFIED".into(), "w-a".into()), "{e2}");
    assert_eq!(event(&e3), ("DELETED".into(), "w-a".into()), "{e3}");
    assert_eq!(rv(&e1["object"]), rv(&a));
    assert_eq!(rv(&e2["object"]), rv(&m));
    assert!(rv0 < rv(&e1["object"]) && rv(&e1["object"]) < rv(&e2["object"]) && rv(&e2["object"]) < rv(&e3["object"]));
    assert_eq!(e1["object"]["kind"], "StorageVersionMigration");
    assert_eq!(e1["object"]["apiVersion"], API_VERSION);
    assert_eq!(e2["object"]["metadata"]["labels"], json!({"k": "v"}));
    // The typed watch sees the same sequence.
    let mut kinds = Vec::new();
    while kinds.len() < 3 {
        let ev = tokio::time::timeout(Duration::from_secs(5), kw.try_next())
            .await
            .expect("kube event in time")
            .expect("kube event")
            .expect("stream open");
        match ev {
            WatchEvent::Added(o) => kinds.push(("ADDED", o.metadata.name.unwrap_or_default())),
            WatchEvent::Modified(o) => kinds.push(("MODIFIED", o.metadata.name.unwrap_or_default())),
            WatchEvent::Deleted(o) => kinds.push(("DELETED", o.metadata.name.unwrap_or_default())),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => panic!("watch error {e:?}"),
        }
    }
    assert_eq!(kinds, [("ADDED", "w-a".to_string()), ("MODIFIED", "w-a".to_string()), ("DELETED", "w-a".to_string())]);
    drop(kw);
    drop(w);

    // No resourceVersion: synthetic ADDED for what exists, then changes.
    let mut w = Watch::open(&c, &format!("{SVM_PATH}?watch=true"), &[]).await;
    let mut initial = vec![event(&w.next_change().await), event(&w.next_change().await)];
    initial.sort();
    assert_eq!(initial, [("ADDED".to_string(), "w-1".to_string()), ("ADDED".to_string(), "w-2".to_string())]);
    create_ok(&c, SVM_PATH, &svm("w-b")).await;
    assert_eq!(event(&w.next_change().await), ("ADDED".into(), "w-b".into()));
    drop(w);

    // A label-selector watch: leaving the selection is a DELETED, entering it an ADDED, others are invisible.
    let rv1 = list_rv(&c, SVM_PATH).await;
    let mut w =
        Watch::open(&c, &format!("{SVM_PATH}?watch=true&labelSelector=sel%3Dyes&resourceVersion={rv1}"), &[]).await;
    create_ok(&c, SVM_PATH, &svm_labeled("w-c", json!({"sel": "no"}))).await;
    merge_patch(&c, &format!("{SVM_PATH}/w-1"), &json!({"metadata": {"labels": {"sel": "no"}}})).await.ok(200);
    merge_patch(&c, &format!("{SVM_PATH}/w-2"), &json!({"metadata": {"labels": {"sel": "yes"}}})).await.ok(200);
    merge_patch(&c, &format!("{SVM_PATH}/w-2"), &json!({"metadata": {"annotations": {"x": "y"}}})).await.ok(200);
    let e = w.next_change().await;
    assert_eq!(event(&e), ("DELETED".into(), "w-1".into()), "{e}");
    assert_eq!(e["object"]["metadata"]["labels"]["sel"], "no", "DELETED carries the object as it is now");
    assert_eq!(event(&w.next_change().await), ("ADDED".into(), "w-2".into()));
    assert_eq!(event(&w.next_change().await), ("MODIFIED".into(), "w-2".into()));
    drop(w);
    // A field-selector watch on one name (what kubectl delete --wait uses).
    let rv2 = list_rv(&c, SVM_PATH).await;
    let mut w =
        Watch::open(&c, &format!("{SVM_PATH}?watch=true&fieldSelector=metadata.name%3Dw-c&resourceVersion={rv2}"), &[])
            .await;
    delete(&c, &format!("{SVM_PATH}/w-b"), None).await.ok(200);
    delete(&c, &format!("{SVM_PATH}/w-c"), None).await.ok(200);
    assert_eq!(event(&w.next_change().await), ("DELETED".into(), "w-c".into()));
    drop(w);

    // timeoutSeconds ends the stream.
    let started = Instant::now();
    let mut w = Watch::open(&c, &format!("{SVM_PATH}?watch=true&resourceVersion={rv2}&timeoutSeconds=1"), &[]).await;
    let mut events = 0;
    while let Some(e) = w.next_within(Duration::from_secs(5)).await {
        assert_ne!(e["type"], "ERROR", "{e}");
        events += 1;
    }
    let took = started.elapsed();
    assert_eq!(events, 2, "the two deletions after rv2, then the end");
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(4), "{took:?}");

    // sendInitialEvents: ADDED for each object, then a BOOKMARK marking the end of the initial events.
    let current = names(&get(&c, SVM_PATH).await.ok(200)["items"]);
    let mut w = Watch::open(
        &c,
        &format!(
            "{SVM_PATH}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
        ),
        &[],
    )
    .await;
    let mut added = Vec::new();
    let mut max_rv = 0;
    let bookmark = loop {
        let e = w.next().await;
        match e["type"].as_str() {
            Some("ADDED") => {
                max_rv = max_rv.max(rv(&e["object"]));
                added.push(event(&e).1);
            }
            Some("BOOKMARK") => break e,
            _ => panic!("unexpected before the bookmark: {e}"),
        }
    };
    added.sort();
    assert_eq!(added, current);
    assert_eq!(bookmark["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true", "{bookmark}");
    assert_eq!(bookmark["object"]["kind"], "StorageVersionMigration");
    assert_eq!(bookmark["object"]["apiVersion"], API_VERSION);
    assert!(rv(&bookmark["object"]) >= max_rv, "{bookmark}");
    create_ok(&c, SVM_PATH, &svm("w-d")).await;
    assert_eq!(event(&w.next_change().await), ("ADDED".into(), "w-d".into()));
    drop(w);
    // sendInitialEvents without bookmarks is invalid.
    let r = Watch::try_open(
        &c,
        &format!("{SVM_PATH}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"),
        &[],
    )
    .await
    .err()
    .expect("rejected");
    r.status_err(422, "Invalid");

    // Table watch: one-row Tables; only the first event carries the column definitions.
    let rv3 = list_rv(&c, SVM_PATH).await;
    let mut w =
        Watch::open(&c, &format!("{SVM_PATH}?watch=true&resourceVersion={rv3}"), &[("accept", TABLE_ACCEPT)]).await;
    create_ok(&c, SVM_PATH, &svm("w-t1")).await;
    create_ok(&c, SVM_PATH, &svm("w-t2")).await;
    let (t1, t2) = (w.next_change().await, w.next_change().await);
    assert_eq!(t1["type"], "ADDED");
    assert_eq!(t1["object"]["kind"], "Table");
    assert_eq!(t1["object"]["apiVersion"], "meta.k8s.io/v1");
    let cols: Vec<&str> = t1["object"]["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(cols, ["Name", "Resource", "Status", "Migrated", "Progress", "Remaining", "Age", "Reason", "Message"]);
    assert_eq!(t1["object"]["rows"].as_array().map(Vec::len), Some(1));
    assert_eq!(t1["object"]["rows"][0]["cells"][0], "w-t1");
    assert_eq!(t1["object"]["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    let later = &t2["object"]["columnDefinitions"];
    assert!(later.is_null() || later.as_array().is_some_and(Vec::is_empty), "{t2}");
    assert_eq!(t2["object"]["rows"][0]["cells"][0], "w-t2");
}

/// A chunked list stays consistent at its first page's revision however many writes follow, even when they push
/// that revision out of the watch history (the embedded store reads the snapshot the first page pinned; etcd its
/// MVCC history, until a compaction).
#[tokio::test]
async fn continue_tokens_outlive_the_watch_history() {
    let s = Server::start(&["--watch-history", "5"]);
    let c = s.client().await;
    for i in 0..12 {
        create_ok(&c, SVM_PATH, &svm(&format!("c-{i:02}"))).await;
    }
    let versions = |list: &Value| -> Vec<(String, String)> {
        let items = list["items"].as_array().cloned().unwrap_or_default();
        items
            .iter()
            .map(|o| (o["metadata"]["name"].to_string(), o["metadata"]["resourceVersion"].to_string()))
            .collect()
    };
    let before = versions(&get(&c, SVM_PATH).await.ok(200));
    let p1 = get(&c, &format!("{SVM_PATH}?limit=4")).await.ok(200);
    assert_eq!(p1["metadata"]["remainingItemCount"], 8, "{}", p1["metadata"]);
    for round in 0..3 {
        for i in 0..12 {
            let patch = json!({"metadata": {"labels": {"round": round.to_string()}}});
            merge_patch(&c, &format!("{SVM_PATH}/c-{i:02}"), &patch).await.ok(200);
        }
    }
    delete(&c, &format!("{SVM_PATH}/c-05"), None).await.ok(200);
    create_ok(&c, SVM_PATH, &svm("c-055")).await;
    let mut seen = versions(&p1);
    let mut cont = p1["metadata"]["continue"].as_str().map(str::to_string);
    let mut remaining = Vec::new();
    while let Some(token) = cont {
        let page = get(&c, &format!("{SVM_PATH}?limit=4&continue={token}")).await.ok(200);
        assert_eq!(page["metadata"]["resourceVersion"], p1["metadata"]["resourceVersion"]);
        remaining.push(page["metadata"]["remainingItemCount"].clone());
        seen.extend(versions(&page));
        cont = page["metadata"]["continue"].as_str().map(str::to_string);
    }
    assert_eq!(remaining, [json!(4), Value::Null]);
    assert_eq!(seen, before, "the pages show the first page's state, every object once");
}

#[tokio::test]
async fn watch_bookmarks_and_expired_history() {
    // The embedded store keeps a chunked list's snapshot 500 ms after its last page (the token is used after the
    // 1 s watch below), so the continue token falls back to the 5-event history, which has moved on.
    let mut s = Server::start(&[
        "--watch-bookmark-interval",
        "200ms",
        "--watch-history",
        "5",
        "--list-snapshot-timeout",
        "500ms",
    ]);
    let c = s.client().await;
    let old = create_ok(&c, SVM_PATH, &svm("h-0")).await;
    let old_rv = rv(&old);

    // Paged list started now, continued after the history moved on: 410 with an inconsistent continuation.
    create_ok(&c, SVM_PATH, &svm("h-1")).await;
    let page = get(&c, &format!("{SVM_PATH}?limit=1")).await.ok(200);
    let token = page["metadata"]["continue"].as_str().expect("continue").to_string();

    // Bookmarks arrive when asked for.
    let from = list_rv(&c, SVM_PATH).await;
    let mut w =
        Watch::open(&c, &format!("{SVM_PATH}?watch=true&resourceVersion={from}&allowWatchBookmarks=true"), &[]).await;
    let b = w.next_within(Duration::from_secs(3)).await.expect("a bookmark");
    assert_eq!(b["type"], "BOOKMARK", "{b}");
    assert_eq!(b["object"]["kind"], "StorageVersionMigration");
    assert_eq!(b["object"]["apiVersion"], API_VERSION);
    assert!(rv(&b["object"]) >= from, "{b}");
    assert!(b["object"].get("spec").is_none(), "bookmarks carry only metadata: {b}");
    drop(w);
    // ... and never when not asked for: within a 1 s watch, nothing at all.
    let mut w = Watch::open(&c, &format!("{SVM_PATH}?watch=true&resourceVersion={from}&timeoutSeconds=1"), &[]).await;
    assert!(w.next_within(Duration::from_secs(4)).await.is_none(), "no events, no bookmarks");

    // Many writes push old revisions out of the 5-event history.
    for i in 2..20 {
        create_ok(&c, SVM_PATH, &svm(&format!("h-{i}"))).await;
    }
    // On etcd, lists read etcd's own history, which only a compaction removes (the server compacts every
    // --etcd-compaction-interval; here the operator does it now).
    if let Some(etcd) = s.etcd() {
        let mut ec = etcd.client().await;
        let now = ec.get("/", None).await.expect("etcd get").header().expect("header").revision();
        ec.compact(now, None).await.expect("compact");
    }
    // A watch from an old revision: 410 Expired (as the response, or as an ERROR event like kube's watch cache).
    match Watch::try_open(&c, &format!("{SVM_PATH}?watch=true&resourceVersion={old_rv}"), &[]).await {
        Err(r) => {
            r.status_err(410, "Expired");
        }
        Ok(mut w) => {
            let e = w.next().await;
            assert_eq!(e["type"], "ERROR", "{e}");
            assert_eq!(e["object"]["kind"], "Status");
            assert_eq!(e["object"]["code"], 410, "{e}");
            assert_eq!(e["object"]["reason"], "Expired", "{e}");
        }
    }
    // An exact list at that revision: 410 too.
    get(&c, &format!("{SVM_PATH}?resourceVersion={old_rv}&resourceVersionMatch=Exact"))
        .await
        .status_err(410, "Expired");
    // The stale continue token: 410 with a continuation that still works (reading the latest state).
    let st = get(&c, &format!("{SVM_PATH}?limit=1&continue={token}")).await.status_err(410, "Expired");
    let inconsistent = st["metadata"]["continue"].as_str().expect("inconsistent continue token").to_string();
    let rest = get(&c, &format!("{SVM_PATH}?continue={inconsistent}")).await.ok(200);
    assert_eq!(names(&rest["items"]).len(), 19, "everything after h-0: {}", rest["metadata"]);
    // A recent revision still works.
    let recent = list_rv(&c, SVM_PATH).await;
    let mut w = Watch::open(&c, &format!("{SVM_PATH}?watch=true&resourceVersion={recent}"), &[]).await;
    create_ok(&c, SVM_PATH, &svm("h-new")).await;
    assert_eq!(event(&w.next_change().await), ("ADDED".into(), "h-new".into()));
}

// ---------------------------------------------------------------------------------------------------------------
// Table and PartialObjectMetadata

#[tokio::test]
async fn tables_and_partial_metadata() {
    let s = Server::start(&[]);
    let c = s.client().await;
    create_ok(&c, SVM_PATH, &svm("t-a")).await;
    create_ok(&c, SVM_PATH, &svm("t-b")).await;
    merge_patch(
        &c,
        &format!("{SVM_PATH}/t-b/status"),
        &json!({"status": {"migratedObjects": 7, "conditions": [{"type": "Succeeded", "status": "True", "reason": "Done"}]}}),
    )
    .await
    .ok(200);
    create_ok(&c, SS_PATH, &ss("jobs", "batch")).await;

    let r = get_accept(&c, SVM_PATH, TABLE_ACCEPT).await;
    let t = r.ok(200);
    assert_eq!(
        media_type(&r.header("content-type").expect("ct")),
        media_type("application/json;as=Table;v=v1;g=meta.k8s.io")
    );
    assert_eq!(t["kind"], "Table");
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
    assert!(t["metadata"]["resourceVersion"].as_str().is_some_and(|s| !s.is_empty()), "{t}");
    let cols = t["columnDefinitions"].as_array().expect("columns");
    let col_names: Vec<&str> = cols.iter().filter_map(|c| c["name"].as_str()).collect();
    // AGE, then the wide columns (priority 1).
    assert_eq!(
        col_names,
        ["Name", "Resource", "Status", "Migrated", "Progress", "Remaining", "Age", "Reason", "Message"]
    );
    assert_eq!((cols[0]["type"].as_str(), cols[0]["format"].as_str()), (Some("string"), Some("name")));
    assert_eq!(cols[6]["type"], "date");
    assert_eq!(cols[3]["type"], "integer");
    let rows = t["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2);
    let cells = |row: &Value| row["cells"].as_array().expect("cells").clone();
    assert_eq!(cells(&rows[0])[..4], [json!("t-a"), json!("deployments.v1.apps"), json!("Pending"), json!(0)]);
    assert_eq!(cells(&rows[1])[..4], [json!("t-b"), json!("deployments.v1.apps"), json!("Succeeded"), json!(7)]);
    // PROGRESS and REMAINING: unknown while Pending, 100% and the estimate once Succeeded.
    assert_eq!(cells(&rows[0])[4..6], [Value::Null, Value::Null]);
    assert_eq!(cells(&rows[1])[4], json!("100%"));
    let age = rows[0]["cells"][6].as_str().expect("age");
    assert!(age.ends_with('s') && age[..age.len() - 1].parse::<u64>().is_ok(), "age {age}");
    for row in rows {
        let o = &row["object"];
        assert_eq!(o["kind"], "PartialObjectMetadata", "{row}");
        assert_eq!(o["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(o["metadata"]["name"], row["cells"][0]);
        assert!(o["metadata"]["uid"].is_string());
        assert!(o.get("spec").is_none() && o.get("status").is_none(), "{o}");
    }
    // includeObject=Object: the whole object; None: no object.
    let t = get_accept(&c, &format!("{SVM_PATH}?includeObject=Object"), TABLE_ACCEPT).await.ok(200);
    assert_eq!(t["rows"][1]["object"]["kind"], "StorageVersionMigration");
    assert_eq!(t["rows"][1]["object"]["status"]["migratedObjects"], 7);
    let t = get_accept(&c, &format!("{SVM_PATH}?includeObject=None"), TABLE_ACCEPT).await.ok(200);
    for row in t["rows"].as_array().expect("rows") {
        assert!(row.get("object").is_none_or(Value::is_null), "{row}");
    }
    get_accept(&c, &format!("{SVM_PATH}?includeObject=Everything"), TABLE_ACCEPT).await.status_err(400, "BadRequest");
    // One object as a Table; v1beta1 when that is all that is asked for; selectors apply.
    let t = get_accept(&c, &format!("{SVM_PATH}/t-b"), TABLE_ACCEPT).await.ok(200);
    assert_eq!(t["rows"].as_array().map(Vec::len), Some(1));
    let t = get_accept(&c, SVM_PATH, "application/json;as=Table;v=v1beta1;g=meta.k8s.io").await.ok(200);
    assert_eq!(t["apiVersion"], "meta.k8s.io/v1beta1");
    let t = get_accept(&c, &format!("{SVM_PATH}?fieldSelector=metadata.name%3Dt-a"), TABLE_ACCEPT).await.ok(200);
    assert_eq!(t["rows"].as_array().map(Vec::len), Some(1));
    // StorageState columns.
    let t = get_accept(&c, SS_PATH, TABLE_ACCEPT).await.ok(200);
    let col_names: Vec<&str> =
        t["columnDefinitions"].as_array().expect("columns").iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(
        col_names,
        ["Name", "Current", "Persisted", "Heartbeat", "Write Key", "Keys In Use", "Rotation", "Age", "Reporters"]
    );
    assert_eq!(cells(&t["rows"][0])[..3], [json!("jobs.batch"), json!(""), json!("Unknown")]);

    // The metadata client of the garbage collector and namespace controller.
    let gc = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let l = get_accept(&c, SVM_PATH, gc).await.ok(200);
    assert_eq!(l["kind"], "PartialObjectMetadataList");
    assert_eq!(l["apiVersion"], "meta.k8s.io/v1");
    assert!(l["metadata"]["resourceVersion"].is_string());
    assert_eq!(names(&l["items"]), ["t-a", "t-b"]);
    for it in l["items"].as_array().expect("items") {
        assert_eq!(it["kind"], "PartialObjectMetadata");
        assert!(it["metadata"]["resourceVersion"].is_string() && it["metadata"]["uid"].is_string());
        assert!(it.get("spec").is_none() && it.get("status").is_none(), "{it}");
    }
    let one =
        get_accept(&c, &format!("{SVM_PATH}/t-a"), "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1")
            .await
            .ok(200);
    assert_eq!(one["kind"], "PartialObjectMetadata");
    assert_eq!(one["metadata"]["name"], "t-a");
    let typed = svm_api(&c).list_metadata(&ListParams::default()).await.expect("kube list_metadata");
    assert_eq!(typed.items.len(), 2);
    // Nothing acceptable: 406.
    get_accept(&c, SVM_PATH, "application/vnd.kubernetes.protobuf").await.status_err(406, "NotAcceptable");
    get_accept(&c, SVM_PATH, "application/json;as=Table;v=v2;g=meta.k8s.io").await.status_err(406, "NotAcceptable");
}

// ---------------------------------------------------------------------------------------------------------------
// finalizers and deletecollection

#[tokio::test]
async fn finalizers_hold_deletion() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let p = format!("{SVM_PATH}/fin");
    let mut body = svm("fin");
    body["metadata"]["finalizers"] = json!(["example.com/hold"]);
    create_ok(&c, SVM_PATH, &body).await;

    let rev = list_rv(&c, SVM_PATH).await;
    let mut w = Watch::open(&c, &format!("{SVM_PATH}?watch=true&resourceVersion={rev}"), &[]).await;
    let o = delete(&c, &p, None).await.ok(200);
    let ts = o["metadata"]["deletionTimestamp"].as_str().expect("deletionTimestamp").to_string();
    chrono::DateTime::parse_from_rfc3339(&ts).expect("RFC3339");
    assert_eq!(o["metadata"]["finalizers"], json!(["example.com/hold"]));
    let g = get(&c, &p).await.ok(200);
    assert_eq!(g["metadata"]["deletionTimestamp"], ts.as_str());
    assert_eq!(g["metadata"]["finalizers"], json!(["example.com/hold"]));
    assert_eq!(event(&w.next_change().await), ("MODIFIED".into(), "fin".into()));
    // Deleting again changes nothing.
    let again = delete(&c, &p, None).await.ok(200);
    assert_eq!(again["metadata"]["deletionTimestamp"], ts.as_str());
    assert_eq!(rv(&again), rv(&g));

    // No new finalizers while terminating; other updates are fine.
    let st = merge_patch(&c, &p, &json!({"metadata": {"finalizers": ["example.com/hold", "example.com/other"]}}))
        .await
        .status_err(422, "Invalid");
    assert_eq!(cause_pairs(&st), vec![("FieldValueForbidden".to_string(), "metadata.finalizers".to_string())], "{st}");
    let o = merge_patch(&c, &p, &json!({"metadata": {"labels": {"still": "here"}}})).await.ok(200);
    assert_eq!(o["metadata"]["deletionTimestamp"], ts.as_str());
    // The deletion timestamp cannot be cleared by an update.
    let o = merge_patch(&c, &p, &json!({"metadata": {"deletionTimestamp": null}})).await.ok(200);
    assert_eq!(o["metadata"]["deletionTimestamp"], ts.as_str());
    assert_eq!(event(&w.next_change().await), ("MODIFIED".into(), "fin".into()));

    // Removing the last finalizer deletes it.
    json_patch(&c, &p, &json!([{"op": "remove", "path": "/metadata/finalizers"}])).await.ok(200);
    get(&c, &p).await.status_err(404, "NotFound");
    assert_eq!(event(&w.next_change().await), ("DELETED".into(), "fin".into()));
}

#[tokio::test]
async fn delete_collection_by_label() {
    let s = Server::start(&[]);
    let c = s.client().await;
    for (i, team) in ["a", "a", "a", "b", "b"].iter().enumerate() {
        create_ok(&c, SVM_PATH, &svm_labeled(&format!("dc-{i}"), json!({"team": team}))).await;
    }
    create_ok(&c, SS_PATH, &ss("pods", "")).await;

    let r = call(&c, Method::DELETE, &format!("{SVM_PATH}?labelSelector=team%3Da"), &[], vec![]).await;
    let l = r.ok(200);
    assert_eq!(l["kind"], "StorageVersionMigrationList");
    assert_eq!(names(&l["items"]), ["dc-0", "dc-1", "dc-2"]);
    assert_eq!(names(&get(&c, SVM_PATH).await.ok(200)["items"]), ["dc-3", "dc-4"]);
    assert_eq!(names(&get(&c, SS_PATH).await.ok(200)["items"]), ["pods"], "other resources are untouched");
    // Through the typed client, with a selector that matches nothing, then with one that matches the rest.
    let api = svm_api(&c);
    api.delete_collection(&DeleteParams::default(), &ListParams::default().labels("team=zzz"))
        .await
        .expect("deletecollection");
    assert_eq!(names(&get(&c, SVM_PATH).await.ok(200)["items"]), ["dc-3", "dc-4"]);
    api.delete_collection(&DeleteParams::default(), &ListParams::default().labels("team in (b)"))
        .await
        .expect("deletecollection");
    assert_eq!(names(&get(&c, SVM_PATH).await.ok(200)["items"]), Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------------------------
// authentication

#[tokio::test]
async fn authentication_and_public_paths() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let tokens = tmp.path().join("tokens.csv");
    std::fs::write(&tokens, "s3cret-token,alice,uid-alice,\"devs,ops\"\n").expect("write tokens");
    // alice is not in system:masters: standalone, only AlwaysAllow lets her in (authorization: tests/auth.rs).
    let s = Server::start(&[
        "--token-auth-file",
        tokens.to_str().expect("utf-8 path"),
        "--authorization-mode",
        "AlwaysAllow",
    ]);

    // No client certificate, no token.
    let anon = anonymous_client(&s, vec![]).await;
    for path in [SVM_PATH, "/apis", "/apis/migration.k8s.io/v1alpha1", "/openapi/v3", "/metrics"] {
        let st = get(&anon, path).await.status_err(401, "Unauthorized");
        assert_eq!(st["message"], "Unauthorized", "{path}");
    }
    post(&anon, SVM_PATH, &svm("anon")).await.status_err(401, "Unauthorized");
    // Health and version are public.
    for path in ["/healthz", "/livez", "/readyz"] {
        let r = get(&anon, path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(r.text(), "ok");
    }
    let v = get(&anon, "/version").await.ok(200);
    assert!(v["gitVersion"].as_str().is_some_and(|g| g.starts_with('v')), "{v}");
    assert!(v["major"].is_string() && v["minor"].is_string() && v["platform"].is_string(), "{v}");

    // A bearer token from --token-auth-file.
    let bearer = |t: &str| {
        vec![(HeaderName::from_static("authorization"), HeaderValue::from_str(&format!("Bearer {t}")).expect("header"))]
    };
    let alice = anonymous_client(&s, bearer("s3cret-token")).await;
    assert_eq!(get(&alice, SVM_PATH).await.ok(200)["kind"], "StorageVersionMigrationList");
    create_ok(&alice, SVM_PATH, &svm("by-alice")).await;
    let list = svm_api(&alice).list(&ListParams::default()).await.expect("typed list with a token");
    assert_eq!(list.items.len(), 1);
    let wrong = anonymous_client(&s, bearer("not-the-token")).await;
    get(&wrong, SVM_PATH).await.status_err(401, "Unauthorized");
    // The client certificate still works.
    let admin = s.client().await;
    assert_eq!(names(&get(&admin, SVM_PATH).await.ok(200)["items"]), ["by-alice"]);
}

// ---------------------------------------------------------------------------------------------------------------
// metrics

/// The value of the sample of `metric` whose labels include all of `want`.
fn sample(text: &str, metric: &str, want: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| l.starts_with(&format!("{metric}{{"))).find_map(|l| {
        let (labels, value) = l.rsplit_once(' ')?;
        let ok = want.iter().all(|(k, v)| labels.contains(&format!("{k}=\"{v}\"")));
        ok.then(|| value.parse().ok()).flatten()
    })
}

#[tokio::test]
async fn metrics_count_requests() {
    let s = Server::start(&[]);
    let c = s.client().await;
    get(&c, SS_PATH).await.ok(200);
    create_ok(&c, SS_PATH, &ss("pods", "")).await;
    get(&c, &format!("{SS_PATH}/nope")).await.status_err(404, "NotFound");

    let r = get(&c, "/metrics").await;
    assert_eq!(r.status, 200);
    let text = r.text();
    let list =
        [("verb", "LIST"), ("group", GROUP), ("version", "v1alpha1"), ("resource", "storagestates"), ("code", "200")];
    let n_list =
        sample(&text, "apiserver_request_total", &list).unwrap_or_else(|| panic!("LIST counter missing:\n{text}"));
    assert_eq!(n_list, 1.0);
    let post = [("verb", "POST"), ("resource", "storagestates"), ("code", "201")];
    assert_eq!(sample(&text, "apiserver_request_total", &post), Some(1.0), "{text}");
    let nf = [("verb", "GET"), ("resource", "storagestates"), ("code", "404")];
    assert_eq!(sample(&text, "apiserver_request_total", &nf), Some(1.0), "{text}");
    let h = [("verb", "LIST"), ("resource", "storagestates"), ("le", "+Inf")];
    assert_eq!(sample(&text, "apiserver_request_duration_seconds_bucket", &h), Some(1.0), "{text}");
    assert_eq!(
        sample(&text, "apiserver_request_duration_seconds_count", &[("verb", "LIST"), ("resource", "storagestates")]),
        Some(1.0)
    );
    assert!(sample(
        &text,
        "apiserver_request_duration_seconds_sum",
        &[("verb", "POST"), ("resource", "storagestates")]
    )
    .is_some());

    // Two more lists: the counter moves by exactly two.
    get(&c, SS_PATH).await.ok(200);
    get(&c, SS_PATH).await.ok(200);
    let text = get(&c, "/metrics").await.text();
    assert_eq!(sample(&text, "apiserver_request_total", &list), Some(3.0), "{text}");
}
