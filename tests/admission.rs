//! The admission webhooks (`/mutate`, `/validate`) with real AdmissionReview JSON as kube-apiserver sends it for our
//! kinds installed as CRDs, against the running binary over TLS; and the shipped manifests: the generated ones
//! (CRDs, roles, APIServices, webhook configurations, RBAC of our kinds) equal `migration-apiserver manifests`
//! output, and both manifest directories render with kustomize.

mod common;
use common::admission::*;
use common::manifests::{files_in, generated};
use common::requests::{call, post, Resp};
use common::status::cause_fields;
use common::*;

use axum::http::{Method, Request};
use base64::Engine;
use serde_json::{json, Value};

const SVM_API_VERSION: &str = "migration.k8s.io/v1alpha1";

// ---------------------------------------------------------------------------------------------------------------
// helpers

/// A failure `Status` with this code.
fn failure(resp: &Resp, code: u16) -> Value {
    assert_eq!(resp.status, code, "expected {code}, got {}: {}", resp.status, resp.text());
    let s = resp.json();
    assert_eq!(s["kind"], "Status", "{s}");
    assert_eq!(s["code"], code, "{s}");
    s
}

async fn post_raw(c: &kube::Client, path: &str, body: Vec<u8>) -> Resp {
    call(c, Method::POST, path, &[("content-type", "application/json")], body).await
}

/// The AdmissionReview kube-apiserver sends for a write of `object` (kind from its apiVersion/kind).
fn review(uid: &str, operation: &str, object: Option<&Value>, old: Option<&Value>, sub_resource: &str) -> Value {
    let o = object.or(old).expect("an object");
    let api_version = o["apiVersion"].as_str().expect("apiVersion");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let kind = o["kind"].as_str().expect("kind");
    let resource = format!("{}s", kind.to_lowercase());
    let of = ReviewOf {
        group,
        version,
        kind,
        resource: &resource,
        operation,
        username: ADMIN_USERNAME,
        groups: ADMIN_GROUPS,
    };
    let mut r = admission_review(uid, &of, object, old);
    let req = &mut r["request"];
    req["name"] = o["metadata"]["name"].clone();
    let options = operation[..1].to_string() + &operation[1..].to_lowercase();
    req["options"] = json!({"apiVersion": "meta.k8s.io/v1", "kind": format!("{options}Options")});
    if let Some(namespace) = o.pointer("/metadata/namespace").filter(|ns| !ns.is_null()) {
        req["namespace"] = namespace.clone();
    }
    if !sub_resource.is_empty() {
        req["subResource"] = json!(sub_resource);
    }
    r
}

fn with_dry_run(mut r: Value) -> Value {
    r["request"]["dryRun"] = json!(true);
    r
}

fn storage_state(name: &str, resource: &str, group: &str) -> Value {
    json!({
        "apiVersion": SVM_API_VERSION, "kind": "StorageState",
        "metadata": {"name": name, "uid": "6b0bd3a4-6a4e-4e0c-9d43-1c5f0c7e5a01", "creationTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {"resource": {"group": group, "resource": resource}},
    })
}

fn svm(name: &str, resource: &str) -> Value {
    json!({
        "apiVersion": SVM_API_VERSION, "kind": "StorageVersionMigration",
        "metadata": {"name": name, "uid": "0d1f3c5e-2b4a-4c6e-8f10-32547698badc", "generation": 1,
                     "resourceVersion": "42", "creationTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {"resource": {"group": "apps", "version": "v1", "resource": resource}},
    })
}

fn shoot_state(version: &str, gardener: Value) -> Value {
    json!({
        "apiVersion": format!("core.gardener.cloud/{version}"), "kind": "ShootState",
        "metadata": {"name": "crd-shoot", "namespace": "garden-dev"},
        "spec": {"gardener": gardener, "extensions": [{"kind": "Infrastructure", "state": {"vpc": "vpc-1"}}]},
    })
}

/// The base64 JSON Patch of a mutating answer, decoded.
fn patch_of(resp: &Value) -> json_patch::Patch {
    assert_eq!(resp["patchType"], "JSONPatch", "{resp}");
    let raw = base64::engine::general_purpose::STANDARD.decode(resp["patch"].as_str().expect("patch is a string"));
    serde_json::from_slice(&raw.expect("patch is base64")).expect("patch is a JSON Patch")
}

/// A denial: allowed false, the 422 Invalid Status the aggregated API would send, no patch.
fn denied(resp: &Value) -> Value {
    assert_eq!(resp["allowed"], false, "{resp}");
    assert!(resp.get("patch").is_none() && resp.get("patchType").is_none(), "{resp}");
    let st = resp["status"].clone();
    assert_eq!(st["code"], 422, "{resp}");
    assert_eq!(st["reason"], "Invalid", "{resp}");
    st
}

fn allowed_without_patch(resp: &Value) {
    assert_eq!(resp["allowed"], true, "{resp}");
    assert!(resp.get("patch").is_none() && resp.get("patchType").is_none(), "{resp}");
    assert!(resp.get("status").is_none(), "{resp}");
}

/// Both answers equal except for the uid.
fn same_answer(a: &Value, b: &Value) {
    let strip = |v: &Value| {
        let mut v = v.clone();
        v["uid"] = Value::Null;
        v
    };
    assert_eq!(strip(a), strip(b));
}

// ---------------------------------------------------------------------------------------------------------------
// mutation

#[tokio::test]
async fn mutate_defaults_with_an_idempotent_json_patch() {
    let s = Server::start(&[]);
    let c = s.client().await;

    // CREATE of a StorageState without status: the patch adds the kind's default, nothing else (no uid,
    // resourceVersion or timestamps: kube-apiserver stores the object, not us).
    let obj = storage_state("deployments.apps", "deployments", "apps");
    let r = post(&c, "/mutate", &review("m-1", "CREATE", Some(&obj), None, "")).await.review("m-1");
    assert_eq!(r["allowed"], true, "{r}");
    assert!(r.get("status").is_none(), "{r}");
    let patch = patch_of(&r);
    let mut patched = obj.clone();
    json_patch::patch(&mut patched, &patch).expect("the patch applies to the object sent");
    let mut expected = obj.clone();
    expected["status"] = json!({"persistedStorageVersionHashes": ["Unknown"]});
    assert_eq!(patched, expected);

    // Reinvocation (IfNeeded) with the patched object: nothing left to do, so no patch at all.
    let again = post(&c, "/mutate", &review("m-2", "CREATE", Some(&patched), None, "")).await.review("m-2");
    allowed_without_patch(&again);

    // dryRun: the same answer.
    let dry = post(&c, "/mutate", &with_dry_run(review("m-3", "CREATE", Some(&obj), None, ""))).await.review("m-3");
    same_answer(&dry, &r);

    // A status with an empty list of persisted hashes: defaulted in place. Fields the typed decoder would merely
    // normalize (an empty group) are left as sent.
    let mut partial = storage_state("pods", "pods", "");
    partial["status"] = json!({"persistedStorageVersionHashes": [], "currentStorageVersionHash": "abc="});
    let r = post(&c, "/mutate", &review("m-4", "CREATE", Some(&partial), None, "")).await.review("m-4");
    let mut patched = partial.clone();
    json_patch::patch(&mut patched, &patch_of(&r)).expect("applies");
    assert_eq!(patched["status"]["persistedStorageVersionHashes"], json!(["Unknown"]));
    assert_eq!(patched["status"]["currentStorageVersionHash"], "abc=");
    assert_eq!(patched["spec"]["resource"]["group"], "");

    // UPDATE of /status (decode defaults, no prepare_for_create) with an empty list: defaulted too.
    let mut old = storage_state("pods", "pods", "");
    old["status"] = json!({"persistedStorageVersionHashes": ["Unknown"]});
    let mut new = old.clone();
    new["status"] = json!({"currentStorageVersionHash": "abc="});
    let r = post(&c, "/mutate", &review("m-5", "UPDATE", Some(&new), Some(&old), "status")).await.review("m-5");
    let mut patched = new.clone();
    json_patch::patch(&mut patched, &patch_of(&r)).expect("applies");
    assert_eq!(
        patched["status"],
        json!({"currentStorageVersionHash": "abc=", "persistedStorageVersionHashes": ["Unknown"]})
    );
    // An UPDATE of the main resource without status: decode defaults only, nothing to patch.
    let r = post(&c, "/mutate", &review("m-6", "UPDATE", Some(&obj), Some(&obj), "")).await.review("m-6");
    allowed_without_patch(&r);

    // Kinds without defaults: allowed, no patch. DELETE: allowed, no patch.
    let m = svm("svm-a", "deployments");
    allowed_without_patch(&post(&c, "/mutate", &review("m-7", "CREATE", Some(&m), None, "")).await.review("m-7"));
    let sh = shoot_state("v1beta1", json!([{"name": "ca", "type": "secret", "data": {"k": "v"}}]));
    allowed_without_patch(&post(&c, "/mutate", &review("m-8", "CREATE", Some(&sh), None, "")).await.review("m-8"));
    allowed_without_patch(&post(&c, "/mutate", &review("m-9", "DELETE", None, Some(&obj), "")).await.review("m-9"));
}

// ---------------------------------------------------------------------------------------------------------------
// validation

#[tokio::test]
async fn validate_create_update_status_delete() {
    let s = Server::start(&[]);
    let c = s.client().await;

    // CREATE of a valid StorageState: allowed, no patch.
    let ok = storage_state("deployments.apps", "deployments", "apps");
    let r = post(&c, "/validate", &review("v-1", "CREATE", Some(&ok), None, "")).await.review("v-1");
    allowed_without_patch(&r);

    // CREATE of a StorageState whose name disagrees with spec.resource: denied, the field named in the causes and
    // in the message, as the aggregated API's 422.
    let bad = storage_state("pods", "deployments", "apps");
    let r = post(&c, "/validate", &review("v-2", "CREATE", Some(&bad), None, "")).await.review("v-2");
    let st = denied(&r);
    assert_eq!(cause_fields(&st), ["metadata.name"], "{st}");
    let msg = st["message"].as_str().unwrap_or_default();
    assert!(
        msg.starts_with("StorageState.migration.k8s.io \"pods\" is invalid: metadata.name: Invalid value: \"pods\""),
        "{msg}"
    );
    assert_eq!(st["details"]["name"], "pods");
    // Every invalid field is listed: a bad name and a missing resource at once.
    let mut worse = storage_state("Not_A_Name", "", "apps");
    worse["metadata"]["labels"] = json!({"bad key!": "x"});
    let st = denied(&post(&c, "/validate", &review("v-3", "CREATE", Some(&worse), None, "")).await.review("v-3"));
    let fields = cause_fields(&st);
    for f in ["metadata.name", "metadata.labels", "spec.resource.resource"] {
        assert!(fields.iter().any(|x| x == f), "{f} missing from {fields:?}");
        assert!(st["message"].as_str().unwrap_or_default().contains(f), "{st}");
    }
    // dryRun: the same answer. Without request.kind, request.resource picks the kind: the same answer again.
    let dry = post(&c, "/validate", &with_dry_run(review("v-2d", "CREATE", Some(&bad), None, ""))).await.review("v-2d");
    same_answer(&dry, &r);
    let mut by_resource = review("v-2r", "CREATE", Some(&bad), None, "");
    by_resource["request"].as_object_mut().unwrap().remove("kind");
    same_answer(&post(&c, "/validate", &by_resource).await.review("v-2r"), &r);

    // Unknown fields: allowed, with a warning naming the field (kube-apiserver shows it to the client).
    let mut unknown = ok.clone();
    unknown["spec"]["bogus"] = json!(1);
    let r = post(&c, "/validate", &review("v-4", "CREATE", Some(&unknown), None, "")).await.review("v-4");
    assert_eq!(r["allowed"], true, "{r}");
    assert!(r["warnings"].to_string().contains("spec.bogus"), "{r}");

    // StorageVersionMigration UPDATE changing spec.resource: denied (immutable).
    let old = svm("svm-1", "deployments");
    let new = svm("svm-1", "statefulsets");
    let st = denied(&post(&c, "/validate", &review("v-5", "UPDATE", Some(&new), Some(&old), "")).await.review("v-5"));
    assert_eq!(cause_fields(&st), ["spec.resource"], "{st}");
    assert!(st["message"].as_str().unwrap_or_default().contains("field is immutable"), "{st}");
    let dry = post(&c, "/validate", &with_dry_run(review("v-5d", "UPDATE", Some(&new), Some(&old), ""))).await;
    assert_eq!(dry.review("v-5d")["status"], st);
    // An UPDATE that changes labels only: allowed.
    let mut labeled = old.clone();
    labeled["metadata"]["labels"] = json!({"team": "a"});
    allowed_without_patch(
        &post(&c, "/validate", &review("v-6", "UPDATE", Some(&labeled), Some(&old), "")).await.review("v-6"),
    );

    // /status UPDATE reverting a terminal condition: denied with the status rule; the same change is allowed
    // while the migration is still running.
    let mut succeeded = old.clone();
    succeeded["status"] =
        json!({"conditions": [{"type": "Succeeded", "status": "True", "lastUpdateTime": "2025-01-01T00:00:00Z"}]});
    let mut reverted = old.clone();
    reverted["status"] = json!({"conditions": [{"type": "Running", "status": "True"}]});
    let r = post(&c, "/validate", &review("v-7", "UPDATE", Some(&reverted), Some(&succeeded), "status")).await;
    let st = denied(&r.review("v-7"));
    assert_eq!(cause_fields(&st), ["status.conditions"], "{st}");
    assert!(
        st["message"]
            .as_str()
            .unwrap_or_default()
            .contains("Succeeded condition cannot be set to False or removed once it is True"),
        "{st}"
    );
    let mut running = old.clone();
    running["status"] = json!({"conditions": [{"type": "Running", "status": "True"}]});
    allowed_without_patch(
        &post(&c, "/validate", &review("v-8", "UPDATE", Some(&succeeded), Some(&running), "status"))
            .await
            .review("v-8"),
    );
    // Invalid status content on /status: every field listed.
    let mut broken = old.clone();
    broken["status"] = json!({"conditions": [{"type": "Exploded", "status": "Maybe"}], "migratedObjects": -1});
    let st = denied(
        &post(&c, "/validate", &review("v-9", "UPDATE", Some(&broken), Some(&old), "status")).await.review("v-9"),
    );
    assert_eq!(
        cause_fields(&st),
        ["status.conditions[0].type", "status.conditions[0].status", "status.migratedObjects"]
    );

    // DELETE: allowed (also with dryRun), no patch.
    let r = post(&c, "/validate", &review("v-10", "DELETE", None, Some(&old), "")).await.review("v-10");
    allowed_without_patch(&r);
    let r = post(&c, "/validate", &with_dry_run(review("v-11", "DELETE", None, Some(&old), ""))).await.review("v-11");
    allowed_without_patch(&r);

    // A kind we do not serve: allowed with a warning, so an over-broad webhook configuration cannot block writes.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}});
    let r = post(&c, "/validate", &review("v-12", "CREATE", Some(&cm), None, "")).await.review("v-12");
    assert_eq!(r["allowed"], true, "{r}");
    assert!(r["warnings"].to_string().contains("does not serve"), "{r}");
    let r = post(&c, "/mutate", &review("v-13", "CREATE", Some(&cm), None, "")).await.review("v-13");
    assert_eq!(r["allowed"], true, "{r}");
    assert!(r.get("patch").is_none(), "{r}");
}

#[tokio::test]
async fn validate_shoot_state_in_both_versions() {
    let s = Server::start(&[]);
    let c = s.client().await;
    for version in ["v1alpha1", "v1beta1"] {
        let ok = shoot_state(version, json!([{"name": "ca", "type": "secret", "data": {"ca.crt": "LS0t"}}]));
        allowed_without_patch(
            &post(&c, "/validate", &review("s-1", "CREATE", Some(&ok), None, "")).await.review("s-1"),
        );

        // An empty gardener[].name: denied at the exact field path, Invalid as in Gardener.
        let unnamed = shoot_state(
            version,
            json!([{"name": "ca", "type": "secret", "data": {}}, {"name": "etcd", "type": "secret", "data": {}},
                   {"name": "", "type": "secret", "data": {}}]),
        );
        let st = denied(&post(&c, "/validate", &review("s-2", "CREATE", Some(&unnamed), None, "")).await.review("s-2"));
        assert_eq!(cause_fields(&st), ["spec.gardener[2].name"], "{st}");
        assert_eq!(st["details"]["causes"][0]["reason"], "FieldValueInvalid", "{st}");
        assert!(
            st["message"].as_str().unwrap_or_default().contains(
                "spec.gardener[2].name: Invalid value: \"\": name of data required to generate resources cannot be empty"
            ),
            "{st}"
        );

        // The same rules on UPDATE; and a ShootState name must be a DNS label.
        let st =
            denied(&post(&c, "/validate", &review("s-3", "UPDATE", Some(&unnamed), Some(&ok), "")).await.review("s-3"));
        assert_eq!(cause_fields(&st), ["spec.gardener[2].name"], "{st}");
        let mut dotted = ok.clone();
        dotted["metadata"]["name"] = json!("a.b");
        let st = denied(&post(&c, "/validate", &review("s-4", "CREATE", Some(&dotted), None, "")).await.review("s-4"));
        assert_eq!(cause_fields(&st), ["metadata.name"], "{st}");
    }
    // An array for a struct of the object: denied with the decoder's 400 naming it, as the aggregated API answers.
    let listed = shoot_state("v1beta1", json!([["ca", "secret"]]));
    let r = post(&c, "/validate", &review("s-6", "CREATE", Some(&listed), None, "")).await.review("s-6");
    assert_eq!(r["allowed"], false, "{r}");
    assert_eq!((r["status"]["code"].clone(), r["status"]["reason"].clone()), (json!(400), json!("BadRequest")), "{r}");
    assert_eq!(
        r["status"]["message"],
        "error decoding ShootState at spec.gardener[0]: invalid type: sequence, expected struct GardenerResourceData",
        "{r}"
    );
    // An object whose apiVersion disagrees with request.kind: denied with the decoder's 400.
    let mut mismatched = review("s-5", "CREATE", Some(&shoot_state("v1beta1", json!([]))), None, "");
    mismatched["request"]["kind"]["version"] = json!("v1alpha1");
    let r = post(&c, "/validate", &mismatched).await.review("s-5");
    assert_eq!(r["allowed"], false, "{r}");
    assert_eq!(r["status"]["code"], 400, "{r}");
}

// ---------------------------------------------------------------------------------------------------------------
// malformed reviews and authentication

/// A review answers the same whatever the order of its fields and the escapes in its text: patches, denials and
/// warnings alike, with the objects before the kind, the request before the review's own fields, or an escape in
/// the kind's version.
#[tokio::test]
async fn reviews_answer_the_same_in_any_field_order() {
    let s = Server::start(&[]);
    let c = s.client().await;
    // The request's fields in reverse order (objects first), the review's own fields after the request.
    let reversed = |r: &Value, uid: &str| {
        let req = r["request"].as_object().expect("request");
        let fields: Vec<String> = req
            .iter()
            .rev()
            .map(|(k, v)| format!("{}:{}", json!(k), if k == "uid" { json!(uid) } else { v.clone() }))
            .collect();
        format!(r#"{{"request":{{{}}},"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}}"#, fields.join(","))
    };
    // An escape in the kind object's version: no hint of the kind up front.
    let escaped = |r: &Value, uid: &str| {
        let mut r = r.clone();
        r["request"]["uid"] = json!(uid);
        let text = r.to_string();
        let kind = format!("{}", r["request"]["kind"]);
        assert!(text.contains(&kind));
        let version = format!("{}", r["request"]["kind"]["version"]);
        text.replacen(&kind, &kind.replacen(&version, &version.replacen('v', "\\u0076", 1), 1), 1)
    };
    let mut unknown = storage_state("deployments.apps", "deployments", "apps");
    unknown["spec"]["bogus"] = json!(1);
    let old = svm("svm-1", "deployments");
    let cases = [
        ("/mutate", review("o-1", "CREATE", Some(&storage_state("pods", "pods", "")), None, "")),
        ("/validate", review("o-2", "CREATE", Some(&storage_state("pods", "deployments", "apps")), None, "")),
        ("/validate", review("o-3", "CREATE", Some(&unknown), None, "")),
        ("/validate", review("o-4", "UPDATE", Some(&svm("svm-1", "statefulsets")), Some(&old), "")),
        ("/mutate", review("o-5", "UPDATE", Some(&unknown), Some(&unknown), "")),
    ];
    for (path, r) in &cases {
        let uid = r["request"]["uid"].as_str().expect("uid");
        let first = post(&c, path, r).await.review(uid);
        for (how, text) in [("reversed", reversed(r, "u-r")), ("escaped", escaped(r, "u-e"))] {
            assert!(text.contains("\"object\":{"), "{text}");
            let uid = if how == "reversed" { "u-r" } else { "u-e" };
            let again = post_raw(&c, path, text.into_bytes()).await.review(uid);
            assert_eq!(again["uid"], uid);
            same_answer(&again, &first);
        }
    }
}

#[tokio::test]
async fn malformed_reviews_are_400() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let good = review("x-1", "CREATE", Some(&storage_state("pods", "pods", "")), None, "");
    for path in ["/validate", "/mutate"] {
        post(&c, path, &good).await.review("x-1");
        let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
        let mut v = good.clone();
        v["apiVersion"] = json!("admission.k8s.io/v1beta1");
        cases.push(("apiVersion", serde_json::to_vec(&v).unwrap()));
        let mut v = good.clone();
        v["kind"] = json!("AdmissionResponse");
        cases.push(("kind", serde_json::to_vec(&v).unwrap()));
        let mut v = good.clone();
        v.as_object_mut().unwrap().remove("request");
        cases.push(("request is missing", serde_json::to_vec(&v).unwrap()));
        let mut v = good.clone();
        v["request"].as_object_mut().unwrap().remove("uid");
        cases.push(("request.uid", serde_json::to_vec(&v).unwrap()));
        let mut v = good.clone();
        v["request"]["object"] = Value::Null;
        cases.push(("request.object", serde_json::to_vec(&v).unwrap()));
        let mut v = good.clone();
        v["request"]["operation"] = json!("UPDATE");
        cases.push(("request.oldObject", serde_json::to_vec(&v).unwrap()));
        let mut v = good.clone();
        v["request"]["operation"] = json!("PATCH");
        cases.push(("request.operation", serde_json::to_vec(&v).unwrap()));
        // An array is no struct, as Go decodes the review (serde alone reads its items as the fields in order).
        let mut v = good.clone();
        v["request"] = json!(["x-1", null, null, "", "pods", "", "CREATE", {}]);
        cases.push((
            "request: invalid type: sequence, expected struct AdmissionRequest",
            serde_json::to_vec(&v).unwrap(),
        ));
        let mut v = good.clone();
        v["request"]["kind"] = json!(["migration.k8s.io", "v1alpha1", "StorageState"]);
        cases.push((
            "request.kind: invalid type: sequence, expected struct GroupVersionKind",
            serde_json::to_vec(&v).unwrap(),
        ));
        cases.push(("invalid JSON", b"{\"apiVersion\": \"admission.k8s.io/v1\",".to_vec()));
        cases.push(("invalid JSON", Vec::new()));
        for (what, body) in cases {
            let st = failure(&post_raw(&c, path, body).await, 400);
            assert_eq!(st["reason"], "BadRequest", "{st}");
            let msg = st["message"].as_str().unwrap_or_default();
            assert!(msg.starts_with("malformed AdmissionReview") && msg.contains(what), "{path} {what}: {msg}");
        }
        // Over the 3 MiB request limit: 413 before parsing.
        let mut big = good.clone();
        big["request"]["object"]["metadata"]["annotations"] = json!({"big": "x".repeat(3 * 1024 * 1024)});
        let st = failure(&post(&c, path, &big).await, 413);
        assert_eq!(st["reason"], "RequestEntityTooLarge", "{st}");
    }
    // Only POST.
    let req = Request::builder().method(Method::GET).uri("/validate").body(kube::client::Body::empty()).unwrap();
    assert_eq!(c.send(req).await.expect("answer").status().as_u16(), 405);

    // Without a client certificate (or token): 401, like every non-public path.
    let kc = kube::config::Kubeconfig::read_from(s.kubeconfig()).expect("kubeconfig");
    let mut cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.expect("config");
    cfg.auth_info = Default::default();
    let anonymous = kube::Client::try_from(cfg).expect("client");
    failure(&post(&anonymous, "/validate", &good).await, 401);
}

// ---------------------------------------------------------------------------------------------------------------
// manifests

#[test]
fn committed_crds_equal_the_generated_ones() {
    let generated = generated("crds");
    let committed = files_in(&repo().join("manifests/crds"));
    let names = |v: &[(String, String)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&committed),
        names(&generated),
        "regenerate: migration-apiserver crds --output-dir manifests/crds"
    );
    for ((name, c), (_, g)) in committed.iter().zip(&generated) {
        assert!(c == g, "manifests/crds/{name} differs from the generated one: run migration-apiserver crds --output-dir manifests/crds");
    }

    // Without --output-dir: the same CRDs as one stream.
    let out = std::process::Command::new(BIN).arg("crds").output().expect("run");
    assert!(out.status.success());
    let stream = String::from_utf8(out.stdout).expect("utf8");
    let docs: Vec<Value> = stream
        .split("\n---\n")
        .map(|d| serde_yaml_ng::from_str(d).unwrap_or_else(|e| panic!("YAML: {e}\n{d}")))
        .collect();
    let all = migration_apiserver::api::kinds(&Default::default()).expect("kinds");
    // Create-only virtual kinds (CSITranslation) store nothing: no CRD.
    let kinds: Vec<_> = all.iter().filter(|k| !k.info().create_only).collect();
    assert_eq!(docs.len(), kinds.len());
    for (doc, k) in docs.iter().zip(&kinds) {
        let i = k.info();
        assert_eq!(doc["kind"], "CustomResourceDefinition");
        assert_eq!(doc["metadata"]["name"], format!("{}.{}", i.plural, i.group));
        let file = repo().join(format!("manifests/crds/{}_{}.yaml", i.group, i.plural));
        let committed: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(file).expect("read")).expect("YAML");
        assert_eq!(doc, &committed);
        let versions: Vec<&str> =
            doc["spec"]["versions"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
        assert_eq!(versions, i.versions);
    }
}

/// `migration-apiserver manifests` regenerates every generated manifest (CRDs, roles, APIServices, webhook
/// configurations, the migrator's RBAC for our kinds): each equals the committed file, and no committed file
/// carrying the generated header is missing from them (a removed kind's file).
#[test]
fn committed_manifests_equal_the_generated_ones() {
    let generated = generated("manifests");
    assert!(generated.len() >= 10, "{generated:?}");
    for (name, content) in &generated {
        let committed = std::fs::read_to_string(repo().join(name)).unwrap_or_default();
        assert!(&committed == content, "{name} differs from the generated one: run make manifests");
    }
    let committed: Vec<(String, String)> = ["manifests", "apiservice"]
        .into_iter()
        .flat_map(|dir| files_in(&repo().join(dir)).into_iter().map(move |(name, c)| (format!("{dir}/{name}"), c)))
        .collect();
    let header = migration_apiserver::server::manifests::GENERATED_HEADER;
    for (name, _) in committed.iter().filter(|(_, c)| c.starts_with(header)) {
        assert!(generated.iter().any(|(g, _)| g == name), "{name} is no longer generated: remove it");
    }
}

#[test]
fn manifests_render_with_kustomize() {
    for dir in ["manifests/crds", "manifests/webhooks"] {
        let out = std::process::Command::new("kubectl")
            .arg("kustomize")
            .arg(repo().join(dir))
            .output()
            .expect("run kubectl kustomize");
        assert!(out.status.success(), "kubectl kustomize {dir}: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8(out.stdout).expect("utf8");
        let kinds: Vec<String> = text
            .split("\n---\n")
            .map(|d| {
                serde_yaml_ng::from_str::<Value>(d).expect("YAML")["kind"].as_str().unwrap_or_default().to_string()
            })
            .collect();
        match dir {
            "manifests/crds" => {
                assert!(kinds.len() == 4 && kinds.iter().all(|k| k == "CustomResourceDefinition"), "{kinds:?}")
            }
            _ => {
                let mut kinds = kinds;
                kinds.sort();
                // Ours (CRD form) and the CSI migration webhooks with their RBAC.
                assert_eq!(
                    kinds,
                    [
                        "ClusterRole",
                        "ClusterRole",
                        "ClusterRoleBinding",
                        "ClusterRoleBinding",
                        "MutatingWebhookConfiguration",
                        "MutatingWebhookConfiguration",
                        "ValidatingWebhookConfiguration",
                        "ValidatingWebhookConfiguration"
                    ]
                )
            }
        }
    }
}

#[test]
fn webhook_configurations_cover_every_kind() {
    let kinds = migration_apiserver::api::kinds(&Default::default()).expect("kinds");
    for (file, path) in [("validating", "/validate"), ("mutating", "/mutate")] {
        let p = repo().join(format!("manifests/webhooks/{file}-webhook-configuration.yaml"));
        let doc: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&p).expect("read")).expect("YAML");
        assert!(doc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].is_string(), "{file}");
        let hooks = doc["webhooks"].as_array().expect("webhooks");
        for h in hooks {
            assert_eq!(h["admissionReviewVersions"], json!(["v1"]), "{file}");
            assert_eq!(h["sideEffects"], "None");
            assert_eq!(h["failurePolicy"], "Fail");
            assert_eq!(h["matchPolicy"], "Equivalent");
            assert_eq!(h["timeoutSeconds"], 10);
            assert_eq!(
                h["clientConfig"]["service"],
                json!({"namespace": "migration-apiserver", "name": "migration-apiserver", "path": path, "port": 443})
            );
            if file == "mutating" {
                assert_eq!(h["reinvocationPolicy"], "IfNeeded");
            }
        }
        for k in kinds.iter().filter(|k| !k.info().create_only) {
            let i = k.info();
            let mut wanted = vec![i.plural.to_string()];
            if k.serves(migration_apiserver::registry::Subresource::Status) {
                wanted.push(format!("{}/status", i.plural));
            }
            for resource in wanted {
                let covered = hooks.iter().flat_map(|h| h["rules"].as_array().cloned().unwrap_or_default()).any(|r| {
                    r["apiGroups"].as_array().unwrap().iter().any(|g| g == i.group)
                        && r["resources"].as_array().unwrap().iter().any(|x| x == resource.as_str())
                        && r["apiVersions"] == json!(["*"])
                        && r["operations"] == json!(["CREATE", "UPDATE"])
                        && r["scope"] == if i.namespaced { "Namespaced" } else { "Cluster" }
                });
                assert!(covered, "{file}: no rule for {resource}.{}", i.group);
            }
        }
    }
}
