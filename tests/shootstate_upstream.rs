//! ShootState validation held to gardener-apiserver's, case by case, through the REST API (create and update) and
//! the validating admission webhook (CREATE and UPDATE reviews), in v1alpha1 and v1beta1, against the real binary.
//!
//! Upstream: gardener/gardener at commit b312835d1784c3628983205c05452b2eaa95b645.
//! - `upstream_tests()` re-expresses pkg/api/core/validation/shootstate_test.go: every Entry and It, with its input
//!   and its expected errors (type and field, in any order, as its ConsistOf/HaveLen matchers compare them).
//! - `upstream_code()` covers what those tests leave out, derived from the code they test at the same commit:
//!   pkg/api/core/validation/shootstate.go (ValidateShootStateSpec) and utils.go (ValidateResources,
//!   validateCrossVersionObjectReference); its messages are apimachinery v0.36.3's field.Error formats, the version
//!   that commit's go.mod requires.
//!
//! Upstream calls `ValidateShootState` only; `ValidateShootStateUpdate` runs it again on the new object (its spec
//! update check is empty), so every spec case is also run as an update of a valid object. Metadata cases are not:
//! on an update the name and namespace come from the URL and the old object.

mod common;
use common::admission::{admission_review, ReviewOf, ADMIN_GROUPS, ADMIN_USERNAME};
use common::requests::{post, put};
use common::status::cause_pairs;
use common::*;
use serde_json::{json, Value};

struct Case {
    /// The upstream test (Entry/It text) or rule this case follows.
    name: &'static str,
    /// The object's metadata; `None` for upstream's default (`shoot-foo` in `project-foo`), made unique per case.
    metadata: Option<Value>,
    spec: Value,
    /// Expected causes: (reason, field).
    want: &'static [(&'static str, &'static str)],
    /// Text the Status message must hold (Gardener's `field: body` of a cause).
    messages: &'static [&'static str],
}

const REQUIRED: &str = "FieldValueRequired";
const INVALID: &str = "FieldValueInvalid";
const NOT_SUPPORTED: &str = "FieldValueNotSupported";
const DUPLICATE: &str = "FieldValueDuplicate";

fn upstream_tests() -> Vec<Case> {
    vec![
        Case {
            name: "should forbid ShootState with empty metadata",
            metadata: Some(json!({})),
            spec: json!({}),
            want: &[(REQUIRED, "metadata.name"), (REQUIRED, "metadata.namespace")],
            messages: &["metadata.name: Required value: name or generateName is required"],
        },
        Case {
            name: "should forbid ShootState with empty name",
            metadata: Some(json!({"name": "", "namespace": "project-foo"})),
            spec: json!({}),
            want: &[(REQUIRED, "metadata.name")],
            messages: &[],
        },
        Case {
            name: "should forbid ShootState with '.' in the name (not a DNS-1123 label compliant name)",
            metadata: Some(json!({"name": "shoot.test", "namespace": "project-foo"})),
            spec: json!({}),
            want: &[(INVALID, "metadata.name")],
            messages: &[r#"metadata.name: Invalid value: "shoot.test": must not contain dots"#],
        },
        Case {
            name: "should forbid ShootState with '_' in the name (not a DNS-1123 subdomain)",
            metadata: Some(json!({"name": "shoot_test", "namespace": "project-foo"})),
            spec: json!({}),
            want: &[(INVALID, "metadata.name")],
            messages: &[],
        },
        Case {
            name: "should forbid shootState containing data required for gardener resource generation with empty name",
            metadata: None,
            spec: json!({"gardener": [{"name": "", "type": "", "data": null}]}),
            want: &[(INVALID, "spec.gardener[0].name")],
            messages: &[
                r#"spec.gardener[0].name: Invalid value: "": name of data required to generate resources cannot be empty"#,
            ],
        },
        Case {
            name: "should forbid shootState containing extension resource with empty kind",
            metadata: None,
            spec: json!({"extensions": [{"kind": "", "state": {}}]}),
            want: &[(INVALID, "spec.extensions[0].kind")],
            messages: &[r#"spec.extensions[0].kind: Invalid value: "": extension resource kind cannot be empty"#],
        },
        Case {
            name: "should forbid shootState containing extension resource with empty purpose",
            metadata: None,
            spec: json!({"extensions": [{"kind": "ControlPlane", "purpose": "", "state": {}}]}),
            want: &[(INVALID, "spec.extensions[0].purpose")],
            messages: &[r#"spec.extensions[0].purpose: Invalid value: "": extension resource purpose cannot be empty"#],
        },
        Case {
            name: "should forbid shootState containing extension resources w/o names or w/ invalid references",
            metadata: None,
            spec: json!({"extensions": [{"kind": "ControlPlane", "purpose": "purpose", "state": {}, "resources": [{}]}]}),
            want: &[
                (REQUIRED, "spec.resources[0].name"),
                (REQUIRED, "spec.resources[0].resourceRef.kind"),
                (REQUIRED, "spec.resources[0].resourceRef.name"),
                (REQUIRED, "spec.resources[0].resourceRef.apiVersion"),
                (NOT_SUPPORTED, "spec.resources[0].resourceRef"),
            ],
            messages: &[
                "spec.resources[0].name: Required value: field must not be empty",
                "spec.resources[0].resourceRef.apiVersion: Required value: must provide an apiVersion",
                "spec.resources[0].resourceRef.kind: Required value: must provide a kind",
                "spec.resources[0].resourceRef.name: Required value: must provide a name",
                r#"spec.resources[0].resourceRef: Unsupported value: "/, Kind=": supported values: "/v1, Kind=Secret", "/v1, Kind=ConfigMap""#,
            ],
        },
    ]
}

fn secret_ref(name: &str) -> Value {
    json!({"name": name, "resourceRef": {"apiVersion": "v1", "kind": "Secret", "name": "s"}})
}

fn upstream_code() -> Vec<Case> {
    vec![
        Case {
            name: "gardener[].name is not required to be unique",
            metadata: None,
            spec: json!({"gardener": [{"name": "ca", "type": "secret", "data": {}}, {"name": "ca", "type": "secret", "data": {}}]}),
            want: &[],
            messages: &[],
        },
        Case {
            name: "a valid ShootState with every section",
            metadata: None,
            spec: json!({
                "gardener": [{"name": "ca", "type": "secret", "data": {"ca.crt": "YWJj"}, "labels": {"a": "b"}}],
                "extensions": [{"kind": "Worker", "name": "w", "purpose": "p", "state": {"x": 1},
                                "resources": [secret_ref("a"), {"name": "b", "resourceRef": {"apiVersion": "v1", "kind": "ConfigMap", "name": "c"}}]}],
                "resources": [{"apiVersion": "v1", "kind": "Secret", "name": "s", "data": {"k": "v"}}],
            }),
            want: &[],
            messages: &[],
        },
        Case {
            name: "apiVersion \"/v1\" parses as the core group (schema.ParseGroupVersion)",
            metadata: None,
            spec: json!({"resources": [{"apiVersion": "/v1", "kind": "ConfigMap", "name": "c", "data": {}}]}),
            want: &[],
            messages: &[],
        },
        Case {
            name: "an extension resource referring to another kind is NotSupported",
            metadata: None,
            spec: json!({"extensions": [{"kind": "Worker", "resources": [
                {"name": "r", "resourceRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d"}}]}]}),
            want: &[(NOT_SUPPORTED, "spec.resources[0].resourceRef")],
            messages: &[],
        },
        Case {
            name: "WorkloadIdentity is not allowed in a ShootState (allowWorkloadIdentity=false)",
            metadata: None,
            spec: json!({"extensions": [{"kind": "Worker", "resources": [
                {"name": "r", "resourceRef": {"apiVersion": "security.gardener.cloud/v1alpha1", "kind": "WorkloadIdentity", "name": "w"}}]}]}),
            want: &[(NOT_SUPPORTED, "spec.resources[0].resourceRef")],
            messages: &[],
        },
        Case {
            name: "extension resource names are unique within one extension",
            metadata: None,
            spec: json!({"extensions": [
                {"kind": "A", "resources": [secret_ref("r"), secret_ref("r")]},
                {"kind": "B", "resources": [secret_ref("r")]}]}),
            want: &[(DUPLICATE, "spec.resources[1].name")],
            messages: &[r#"spec.resources[1].name: Duplicate value: "r""#],
        },
        Case {
            name: "an apiVersion with two slashes is Invalid with the reference as its JSON",
            metadata: None,
            spec: json!({"extensions": [{"kind": "Worker", "resources": [
                {"name": "r", "resourceRef": {"apiVersion": "a/b/c", "kind": "Secret", "name": "s"}}]}]}),
            want: &[(INVALID, "spec.resources[0].resourceRef")],
            messages: &[
                r#"spec.resources[0].resourceRef: Invalid value: {"kind":"Secret","name":"s","apiVersion":"a/b/c"}: cannot determine GroupVersionKind for specified reference: unexpected GroupVersion string: a/b/c"#,
            ],
        },
        Case {
            name: "top-level resources: apiVersion, kind and name required, the empty kind NotSupported",
            metadata: None,
            spec: json!({"resources": [{"data": {}}]}),
            want: &[
                (REQUIRED, "spec.resources[0].apiVersion"),
                (REQUIRED, "spec.resources[0].kind"),
                (NOT_SUPPORTED, "spec.resources[0]"),
                (REQUIRED, "spec.resources[0].name"),
            ],
            messages: &["spec.resources[0].apiVersion: Required value: must provide an apiVersion"],
        },
        Case {
            name: "a top-level resource of another kind is NotSupported",
            metadata: None,
            spec: json!({"resources": [{"apiVersion": "v1", "kind": "secret", "name": "s", "data": {}}]}),
            want: &[(NOT_SUPPORTED, "spec.resources[0]")],
            messages: &[r#"spec.resources[0]: Unsupported value: "/v1, Kind=secret": "#],
        },
    ]
}

fn sorted(causes: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = causes.iter().map(|(r, f)| (r.to_string(), f.to_string())).collect();
    v.sort();
    v
}

fn causes_of(status: &Value) -> Vec<(String, String)> {
    let mut v = cause_pairs(status);
    v.sort();
    v
}

/// A 422 Invalid Status with exactly the expected causes and messages, or none when nothing is expected.
fn check(what: &str, case: &Case, want: &[(String, String)], status: Option<Value>) {
    let Some(status) = status else {
        assert!(want.is_empty(), "{what}: {}: allowed, expected {want:?}", case.name);
        return;
    };
    assert!(!want.is_empty(), "{what}: {}: refused, expected allowed: {status}", case.name);
    assert_eq!(status["code"], 422, "{what}: {}: {status}", case.name);
    assert_eq!(status["reason"], "Invalid", "{what}: {}: {status}", case.name);
    assert_eq!(causes_of(&status), want, "{what}: {}: {status}", case.name);
    let message = status["message"].as_str().unwrap_or_default();
    for m in case.messages {
        assert!(message.contains(m), "{what}: {}: message lacks {m:?}: {message}", case.name);
    }
}

fn object(version: &str, metadata: &Value, spec: &Value) -> Value {
    json!({"apiVersion": format!("core.gardener.cloud/{version}"), "kind": "ShootState", "metadata": metadata, "spec": spec})
}

fn review(uid: &str, operation: &str, object: &Value, old: Option<&Value>) -> Value {
    let version = object["apiVersion"].as_str().and_then(|a| a.split_once('/')).map(|(_, v)| v).unwrap_or_default();
    let of = ReviewOf {
        group: "core.gardener.cloud",
        version,
        kind: "ShootState",
        resource: "shootstates",
        operation,
        username: ADMIN_USERNAME,
        groups: ADMIN_GROUPS,
    };
    let mut r = admission_review(uid, &of, Some(object), old);
    let req = &mut r["request"];
    // As kube-apiserver, which leaves the name out when the object has none.
    if let Some(name) = object["metadata"]["name"].as_str() {
        req["name"] = json!(name);
    }
    // kube-apiserver sends the namespace of the request; an object without one (upstream's empty metadata) comes
    // with none, and the webhook reports metadata.namespace Required as Gardener does.
    if let Some(ns) = object["metadata"]["namespace"].as_str().filter(|ns| !ns.is_empty()) {
        req["namespace"] = json!(ns);
    }
    r
}

/// The webhook's answer: `None` when allowed, the denial's Status otherwise.
async fn webhook(c: &kube::Client, uid: &str, review: &Value) -> Option<Value> {
    let resp = post(c, "/validate", review).await.ok(200);
    let r = &resp["response"];
    assert_eq!(r["uid"], uid, "{resp}");
    match r["allowed"].as_bool() {
        Some(true) => None,
        Some(false) => Some(r["status"].clone()),
        None => panic!("no allowed in {resp}"),
    }
}

async fn run(c: &kube::Client, table: &str, cases: &[Case]) {
    for (i, case) in cases.iter().enumerate() {
        let want = sorted(case.want);
        for version in ["v1alpha1", "v1beta1"] {
            let metadata = case.metadata.clone().unwrap_or_else(
                || json!({"name": format!("shoot-foo-{table}-{i}-{version}"), "namespace": "project-foo"}),
            );
            let obj = object(version, &metadata, &case.spec);

            // REST create. The URL names the namespace; an object without one takes it from there, so Gardener's
            // metadata.namespace Required cannot arise on this path.
            let ns = metadata["namespace"].as_str().filter(|ns| !ns.is_empty());
            let rest_want: Vec<(String, String)> = match ns {
                Some(_) => want.clone(),
                None => want.iter().filter(|(_, f)| f != "metadata.namespace").cloned().collect(),
            };
            let collection =
                format!("/apis/core.gardener.cloud/{version}/namespaces/{}/shootstates", ns.unwrap_or("project-foo"));
            let resp = post(c, &collection, &obj).await;
            let status = (resp.status != 201).then(|| resp.json());
            check(&format!("POST {version}"), case, &rest_want, status);

            let uid = format!("{table}-{i}-{version}");
            check(
                &format!("CREATE review {version}"),
                case,
                &want,
                webhook(c, &uid, &review(&uid, "CREATE", &obj, None)).await,
            );

            if case.metadata.is_some() {
                continue;
            }
            // Updates of a valid object to this spec.
            let name = format!("shoot-foo-{table}-{i}-{version}-update");
            let base = object(version, &json!({"name": name, "namespace": "project-foo"}), &json!({}));
            let created = post(c, &collection, &base).await.ok(201);
            let mut new = created.clone();
            new["spec"] = case.spec.clone();
            let resp = put(c, &format!("{collection}/{name}"), &new).await;
            let status = (resp.status != 200).then(|| resp.json());
            check(&format!("PUT {version}"), case, &want, status);

            let uid = format!("{uid}-update");
            let review = review(&uid, "UPDATE", &new, Some(&created));
            check(&format!("UPDATE review {version}"), case, &want, webhook(c, &uid, &review).await);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_shootstate_tests() {
    let s = Server::start(&[]);
    let c = s.client().await;
    run(&c, "tests", &upstream_tests()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_shootstate_code() {
    let s = Server::start(&[]);
    let c = s.client().await;
    run(&c, "code", &upstream_code()).await;
}
