//! Decoding as Go decodes, for every kind, against the real binary over its REST API: a request body is decoded
//! as kube-apiserver's decoder (sigs.k8s.io/json, `encoding/json`'s rules) decodes it into the kind's Go types. A
//! field of a value type (string, number, struct, slice, map, `metav1.Time`) that is missing or `null` is its zero
//! value, and validation answers for it beside the object's other errors (422), never a 400 `missing field`; a
//! `null` list item or map value is the item's zero value; a pointer field is unset. A value of the wrong JSON type
//! is a 400 naming its path (a JSON array for a struct too, which Go never decodes), an unknown field under `fieldValidation=Strict` a 400 naming it as kube-apiserver
//! does, and a status carried by a create is dropped (kept as stored by a main-resource update) before validation.
//!
//! Each table names the upstream source of its expectations: the kind's Go types (which fields are pointers) and
//! the validation that reports the zero values.

mod common;
use common::requests::{get, post, put, Resp};
use common::Server;
use serde_json::{json, Value};

/// What a request gets.
enum Want {
    /// 201 (or 200 for an update); each JSON pointer of the answer has the value (`None`: the field is absent).
    Ok(Vec<(&'static str, Option<Value>)>),
    /// 422 Invalid whose causes are exactly these, as `field: message` (what kubectl prints).
    Invalid(Vec<&'static str>),
    /// 422 Invalid whose causes include these (the rest is the metadata validators' wording).
    InvalidIncluding(Vec<&'static str>),
    /// 400 BadRequest with this message.
    BadRequest(String),
}

struct Case {
    what: &'static str,
    /// Appended to the path: `?fieldValidation=Strict`, or nothing.
    query: &'static str,
    body: Value,
    want: Want,
}

fn case(what: &'static str, body: Value, want: Want) -> Case {
    Case { what, query: "", body, want }
}

fn strict(what: &'static str, body: Value, want: Want) -> Case {
    Case { what, query: "?fieldValidation=Strict", body, want }
}

fn has(pointer: &'static str, v: Value) -> (&'static str, Option<Value>) {
    (pointer, Some(v))
}

fn absent(pointer: &'static str) -> (&'static str, Option<Value>) {
    (pointer, None)
}

/// The message of a 400 for a value of the wrong type: the kind and the path of the value, then serde's words.
fn wrong_type(kind: &str, path: &str, why: &str) -> Want {
    Want::BadRequest(format!("error decoding {kind} at {path}: {why}"))
}

/// The 400 for a JSON array where the kind has a struct (`expected` as serde names the struct: `struct Name`, or
/// k8s-openapi's bare `Name`): Go's decoder takes no array for a struct, where serde's derived decoders would take
/// its items as the fields in order.
fn array_for(kind: &str, path: &str, expected: &str) -> Want {
    wrong_type(kind, path, &format!("invalid type: sequence, expected {expected}"))
}

/// kube-apiserver's strict decoding error.
fn unknown(kind: &str, version: &str, field: &str) -> Want {
    Want::BadRequest(format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: unknown field \"{field}\""
    ))
}

fn causes(status: &Value) -> Vec<String> {
    let text = |c: &Value, k: &str| c[k].as_str().unwrap_or_default().to_string();
    let causes = status["details"]["causes"].as_array().cloned().unwrap_or_default();
    causes.iter().map(|c| format!("{}: {}", text(c, "field"), text(c, "message"))).collect()
}

fn check(r: &Resp, ok_code: u16, what: &str, want: &Want) {
    match want {
        Want::Ok(fields) => {
            assert_eq!(r.status, ok_code, "{what}: {}", r.text());
            let answer = r.json();
            for (pointer, value) in fields {
                assert_eq!(answer.pointer(pointer), value.as_ref(), "{what}: {pointer} in {answer}");
            }
        }
        Want::Invalid(want) => {
            let st = r.status_err(422, "Invalid");
            assert_eq!(causes(&st), *want, "{what}: {st}");
        }
        Want::InvalidIncluding(want) => {
            let st = r.status_err(422, "Invalid");
            let got = causes(&st);
            for w in want {
                assert!(got.iter().any(|g| g == w), "{what}: {w:?} not in {got:?}");
            }
        }
        Want::BadRequest(message) => {
            let st = r.status_err(400, "BadRequest");
            assert_eq!(st["message"], *message, "{what}");
        }
    }
}

/// Each case POSTed to `collection`.
async fn creates(c: &kube::Client, collection: &str, cases: Vec<Case>) {
    for Case { what, query, body, want } in cases {
        let r = post(c, &format!("{collection}{query}"), &body).await;
        check(&r, 201, what, &want);
    }
}

/// Each case PUT over the object at `path` (the current object with `change` merged in, so that it carries the
/// stored resourceVersion).
async fn updates(c: &kube::Client, path: &str, cases: Vec<Case>) {
    for Case { what, query, body: change, want } in cases {
        let object_path = path.trim_end_matches("/status");
        let mut body = get(c, object_path).await.ok(200);
        json_patch::merge(&mut body, &change);
        // A merge patch drops a key set to null: put the nulls of the change back where they were.
        put_nulls(&mut body, &change);
        let r = put(c, &format!("{path}{query}"), &body).await;
        check(&r, 200, what, &want);
    }
}

/// The `null`s of `change` set in `body` (a merge removes them).
fn put_nulls(body: &mut Value, change: &Value) {
    if let (Some(b), Some(ch)) = (body.as_object_mut(), change.as_object()) {
        for (k, v) in ch {
            match v {
                Value::Null => {
                    b.insert(k.clone(), Value::Null);
                }
                Value::Object(_) => put_nulls(b.entry(k.clone()).or_insert_with(|| json!({})), v),
                _ => {}
            }
        }
    }
}

/// migration.k8s.io/v1alpha1 StorageVersionMigration. Types: kubernetes-sigs/kube-storage-version-migrator
/// pkg/apis/migration/v1alpha1/types.go, where every field is a value (metadata, spec, spec.resource and its three
/// strings, spec.continueToken, status, its conditions and each condition's type, status, lastUpdateTime, reason
/// and message). Validation: the CRD's schema (manifests/storage_migration_crd.yaml: a condition requires `type`
/// and `status`) and this server's own rules of docs/reference/validation.md (spec.resource.resource and
/// .version required, the condition types and statuses allowed); status only through `/status`, as the CRD's
/// status subresource has it.
#[tokio::test]
async fn migration_k8s_io_storage_version_migrations() {
    let s = Server::start(&["--disable-scheduler"]);
    let c = s.client().await;
    let path = "/apis/migration.k8s.io/v1alpha1/storageversionmigrations";
    let svm = |name: &str, spec: Value| json!({"metadata": {"name": name}, "spec": spec});
    let kind = "StorageVersionMigration";
    creates(
        &c,
        path,
        vec![
            case(
                "null spec.resource fields are empty strings, required by our rules",
                svm("m1", json!({"resource": {"group": null, "version": null, "resource": null}})),
                Want::Invalid(vec!["spec.resource.resource: Required value", "spec.resource.version: Required value"]),
            ),
            case(
                "null metadata and spec are zero values; every error comes back at once",
                json!({"apiVersion": null, "kind": null, "metadata": null, "spec": null}),
                Want::Invalid(vec![
                    "metadata.name: Required value: name or generateName is required",
                    "spec.resource.resource: Required value",
                    "spec.resource.version: Required value",
                ]),
            ),
            case(
                "a null group is the core group; a null continueToken is unset",
                svm(
                    "m2",
                    json!({"resource": {"group": null, "version": "v1", "resource": "pods"}, "continueToken": null}),
                ),
                Want::Ok(vec![
                    has("/spec/resource", json!({"version": "v1", "resource": "pods"})),
                    absent("/spec/continueToken"),
                ]),
            ),
            case(
                "a create's status is dropped before validation, however odd",
                json!({"metadata": {"name": "m3"}, "spec": {"resource": {"version": "v1", "resource": "pods"}},
                       "status": {"conditions": [null, {"type": null, "status": "Maybe"}], "migratedObjects": null}}),
                Want::Ok(vec![absent("/status")]),
            ),
            case(
                "a status of the wrong type is still a decode error",
                json!({"metadata": {"name": "m4"}, "spec": {"resource": {"version": "v1", "resource": "pods"}},
                       "status": {"conditions": {"type": "Running"}}}),
                wrong_type(kind, "status.conditions", "invalid type: map, expected a sequence"),
            ),
            case(
                "a number for a string",
                svm("m5", json!({"resource": {"group": 5, "version": "v1", "resource": "pods"}})),
                wrong_type(kind, "spec.resource.group", "invalid type: integer `5`, expected a string"),
            ),
            strict(
                "an unknown field beside null ones",
                svm("m6", json!({"resource": {"group": null, "version": "v1", "resource": "pods", "bogus": 1}})),
                unknown(kind, "v1alpha1", "spec.resource.bogus"),
            ),
            case(
                "an array for spec",
                json!({"metadata": {"name": "m7"}, "spec": []}),
                array_for(kind, "spec", "struct StorageVersionMigrationSpec"),
            ),
            case(
                "an array for metadata",
                json!({"metadata": ["m8"], "spec": {"resource": {"version": "v1", "resource": "pods"}}}),
                array_for(kind, "metadata", "struct ObjectMeta"),
            ),
            case(
                "an array for spec.resource, its fields in order",
                svm("m9", json!({"resource": ["", "v1", "pods"]})),
                array_for(kind, "spec.resource", "struct GroupVersionResource"),
            ),
        ],
    )
    .await;
    updates(
        &c,
        &format!("{path}/m2/status"),
        vec![
            case(
                "conditions without type or status: the CRD's required properties",
                json!({"status": {"conditions": [null, {"type": null, "status": "True"},
                                                 {"type": "Running", "status": null, "lastUpdateTime": null,
                                                  "reason": null, "message": null}]}}),
                Want::Invalid(vec![
                    "status.conditions[0].type: Required value",
                    "status.conditions[0].status: Required value",
                    "status.conditions[1].type: Required value",
                    "status.conditions[2].status: Required value",
                ]),
            ),
            case(
                "null optional condition fields are unset",
                json!({"status": {"conditions": [{"type": "Running", "status": "True", "lastUpdateTime": null,
                                                  "reason": null, "message": null}], "migratedObjects": null}}),
                Want::Ok(vec![
                    has("/status/conditions", json!([{"type": "Running", "status": "True"}])),
                    absent("/status/migratedObjects"),
                ]),
            ),
            strict(
                "an unknown field in a condition, named with its index",
                json!({"status": {"conditions": [null, {"type": "Running", "status": "True", "bogus": 1}]}}),
                unknown(kind, "v1alpha1", "status.conditions[1].bogus"),
            ),
            case(
                "an array for a condition",
                json!({"status": {"conditions": [{"type": "Running", "status": "True"}, ["Succeeded", "True"]]}}),
                array_for(kind, "status.conditions[1]", "struct MigrationCondition"),
            ),
        ],
    )
    .await;
    updates(
        &c,
        &format!("{path}/m2"),
        vec![case(
            "a main-resource update keeps the stored status, whatever status it carries",
            json!({"status": {"conditions": [null], "migratedObjects": null}}),
            Want::Ok(vec![has("/status/conditions", json!([{"type": "Running", "status": "True"}]))]),
        )],
    )
    .await;
}

/// migration.k8s.io/v1alpha1 StorageState. Types: kube-storage-version-migrator's types.go (every field a value:
/// spec.resource's group and resource, status.persistedStorageVersionHashes, currentStorageVersionHash,
/// lastHeartbeatTime) and this server's additions to status, decoded alike. Validation: the CRD requires nothing;
/// spec.resource.resource and the hashes' entries are required by this server's rules (docs/reference/validation.md).
/// Status only through `/status`; a new StorageState starts with `persistedStorageVersionHashes: [Unknown]`.
#[tokio::test]
async fn storage_states() {
    let s = Server::start(&["--disable-scheduler"]);
    let c = s.client().await;
    let path = "/apis/migration.k8s.io/v1alpha1/storagestates";
    let kind = "StorageState";
    creates(
        &c,
        path,
        vec![
            case(
                "a null group is the core group; a create's status is dropped and started anew",
                json!({"metadata": {"name": "pods"}, "spec": {"resource": {"group": null, "resource": "pods"}},
                       "status": {"persistedStorageVersionHashes": [null], "currentStorageVersionHash": null,
                                  "lastHeartbeatTime": null, "currentStorageVersionHashes": [null]}}),
                Want::Ok(vec![
                    has("/spec/resource", json!({"resource": "pods"})),
                    has("/status", json!({"persistedStorageVersionHashes": ["Unknown"]})),
                ]),
            ),
            case(
                "a null spec is the zero spec",
                json!({"metadata": {"name": "x"}, "spec": null}),
                Want::Invalid(vec!["spec.resource.resource: Required value"]),
            ),
            case(
                "a list for a string",
                json!({"metadata": {"name": "y"}, "spec": {"resource": {"resource": ["pods"]}}}),
                wrong_type(kind, "spec.resource.resource", "invalid type: sequence, expected a string"),
            ),
            case(
                "an array for spec",
                json!({"metadata": {"name": "z"}, "spec": []}),
                array_for(kind, "spec", "struct StorageStateSpec"),
            ),
            case(
                "an array for metadata",
                json!({"metadata": [], "spec": {"resource": {"resource": "pods"}}}),
                array_for(kind, "metadata", "struct ObjectMeta"),
            ),
            case(
                "an array for spec.resource, its fields in order",
                json!({"metadata": {"name": "w"}, "spec": {"resource": ["", "w"]}}),
                array_for(kind, "spec.resource", "struct GroupResource"),
            ),
        ],
    )
    .await;
    updates(
        &c,
        &format!("{path}/pods/status"),
        vec![
            case(
                "null hashes are empty strings, which our rules refuse",
                json!({"status": {"persistedStorageVersionHashes": ["h", null],
                                  "currentStorageVersionHashes": [{"reporterID": null, "currentStorageVersionHash": "h"}]}}),
                Want::Invalid(vec![
                    "status.persistedStorageVersionHashes[1]: Required value",
                    "status.currentStorageVersionHashes[0].reporterID: Required value",
                ]),
            ),
            case(
                "a wrong time",
                json!({"status": {"lastHeartbeatTime": 5}}),
                wrong_type(kind, "status.lastHeartbeatTime", "invalid type: integer `5`, expected a timestamp string"),
            ),
            case(
                "an array for a reporter's entry",
                json!({"status": {"currentStorageVersionHashes": [["r", "h"]]}}),
                array_for(kind, "status.currentStorageVersionHashes[0]", "struct ReportedStorageVersionHash"),
            ),
            strict(
                "an unknown field in a reporter's entry",
                json!({"status": {"currentStorageVersionHashes": [{"reporterID": "r", "currentStorageVersionHash": "h", "x": 1}]}}),
                unknown(kind, "v1alpha1", "status.currentStorageVersionHashes[0].x"),
            ),
        ],
    )
    .await;
    updates(
        &c,
        &format!("{path}/pods"),
        vec![case(
            "a main-resource update keeps the stored status",
            json!({"status": {"persistedStorageVersionHashes": [null]}}),
            Want::Ok(vec![has("/status/persistedStorageVersionHashes", json!(["Unknown"]))]),
        )],
    )
    .await;
}

/// storagemigration.k8s.io StorageVersionMigration, v1 and v1beta1. Types: kubernetes/kubernetes
/// staging/src/k8s.io/api/storagemigration/v1/types.go (spec.resource a metav1.GroupResource value, status a value
/// with []metav1.Condition and a resourceVersion string). Validation: pkg/apis/storagemigration/validation
/// (`resource is required to be set`, apimachinery's `ValidateConditions` with the GA wording); the strategy
/// (pkg/registry/storagemigration/storagemigration/strategy.go) resets status on create and keeps it on update.
#[tokio::test]
async fn storagemigration_k8s_io_storage_version_migrations() {
    let s = Server::start(&["--disable-scheduler"]);
    let c = s.client().await;
    let kind = "StorageVersionMigration";
    for version in ["v1", "v1beta1"] {
        let path = format!("/apis/storagemigration.k8s.io/{version}/storageversionmigrations");
        let name = |n: &str| format!("{n}-{version}");
        creates(
            &c,
            &path,
            vec![
                case(
                    "null group and resource are empty strings",
                    json!({"metadata": {"name": name("a")}, "spec": {"resource": {"group": null, "resource": null}}}),
                    Want::Invalid(vec!["spec.resource.resource: Required value: resource is required to be set"]),
                ),
                case(
                    "a null spec is the zero spec",
                    json!({"metadata": {"name": name("b")}, "spec": null}),
                    Want::Invalid(vec!["spec.resource.resource: Required value: resource is required to be set"]),
                ),
                case(
                    "a create's status is dropped before validation",
                    json!({"metadata": {"name": name("c")}, "spec": {"resource": {"group": null, "resource": "pods"}},
                           "status": {"resourceVersion": null, "conditions": [null, {"lastTransitionTime": null}]}}),
                    // Dropped to the empty status, which kube-apiserver writes as `{}` (a Go struct).
                    Want::Ok(vec![
                        has("/spec/resource", json!({"group": "", "resource": "pods"})),
                        has("/status", json!({})),
                    ]),
                ),
                case(
                    "a string for a GroupResource",
                    json!({"metadata": {"name": name("d")}, "spec": {"resource": "apps/deployments"}}),
                    wrong_type(
                        kind,
                        "spec.resource",
                        "invalid type: string \"apps/deployments\", expected struct GroupResource",
                    ),
                ),
                strict(
                    "an unknown field in a condition of a dropped status is still unknown",
                    json!({"metadata": {"name": name("e")}, "spec": {"resource": {"resource": "pods"}},
                           "status": {"conditions": [{"type": "Running", "bogus": true}]}}),
                    unknown(kind, version, "status.conditions[0].bogus"),
                ),
                case(
                    "an array for spec",
                    json!({"metadata": {"name": name("f")}, "spec": []}),
                    array_for(kind, "spec", "struct StorageVersionMigrationSpec"),
                ),
                case(
                    "an array for metadata",
                    json!({"metadata": [name("g")], "spec": {"resource": {"resource": "pods"}}}),
                    array_for(kind, "metadata", "struct ObjectMeta"),
                ),
                case(
                    "an array for spec.resource, its fields in order",
                    json!({"metadata": {"name": name("h")}, "spec": {"resource": ["apps", "deployments"]}}),
                    array_for(kind, "spec.resource", "struct GroupResource"),
                ),
                case(
                    "an array for a condition of a dropped status is still a decode error",
                    json!({"metadata": {"name": name("i")}, "spec": {"resource": {"resource": "pods"}},
                           "status": {"conditions": [["Running", "True"]]}}),
                    array_for(kind, "status.conditions[0]", "struct Condition"),
                ),
            ],
        )
        .await;
        updates(
            &c,
            &format!("{path}/{}/status", name("c")),
            vec![
                case(
                    "a null condition is the zero condition, each of its fields reported",
                    json!({"status": {"resourceVersion": null, "conditions": [null]}}),
                    Want::Invalid(vec![
                        "status.conditions[0].type: Required value: is required",
                        "status.conditions[0].status: Required value",
                        "status.conditions[0].lastTransitionTime: Required value",
                        "status.conditions[0].reason: Required value",
                    ]),
                ),
                case(
                    "a number for the observed generation's place takes no string",
                    json!({"status": {"conditions": [{"observedGeneration": "1"}]}}),
                    wrong_type(
                        kind,
                        "status.conditions[0].observedGeneration",
                        "invalid type: string \"1\", expected i64",
                    ),
                ),
            ],
        )
        .await;
        updates(
            &c,
            &format!("{path}/{}", name("c")),
            vec![case(
                "a main-resource update keeps the stored (empty) status",
                json!({"status": {"resourceVersion": null, "conditions": [null]}}),
                Want::Ok(vec![has("/status", json!({}))]),
            )],
        )
        .await;
    }
}

/// core.gardener.cloud ShootState, v1beta1 and v1alpha1. Types: gardener/gardener
/// pkg/apis/core/v1beta1/types_shootstate.go (v1alpha1 alike): values are GardenerResourceData's name, type, data
/// (a RawExtension, whose null stays null) and labels, ExtensionResourceState's kind and resources,
/// NamedResourceReference's name and resourceRef, CrossVersionObjectReference's and ResourceData's strings;
/// pointers are an extension's name, purpose and state. Validation: pkg/api/core/validation/shootstate.go and
/// utils.go (Invalid for an empty gardener name or extension kind, Required for references' fields). No status.
#[tokio::test]
async fn shoot_states() {
    let s = Server::start(&["--disable-scheduler"]);
    let c = s.client().await;
    let kind = "ShootState";
    for version in ["v1beta1", "v1alpha1"] {
        let path = format!("/apis/core.gardener.cloud/{version}/namespaces/garden-a/shootstates");
        let state = |name: &str, spec: Value| json!({"metadata": {"name": format!("{name}-{version}")}, "spec": spec});
        creates(
            &c,
            &path,
            vec![
                case(
                    "a null gardener entry is the zero entry, its name empty",
                    state("a", json!({"gardener": [null]})),
                    Want::Invalid(vec![
                        "spec.gardener[0].name: Invalid value: \"\": name of data required to generate resources cannot be empty",
                    ]),
                ),
                case(
                    "null type, data and label value are zero values",
                    state("b", json!({"gardener": [{"name": "ca", "type": null, "data": null, "labels": {"a": null}}]})),
                    Want::Ok(vec![has("/spec/gardener", json!([{"name": "ca", "type": "", "data": null, "labels": {"a": ""}}]))]),
                ),
                case(
                    "a null kind is empty; null name, purpose and state are unset pointers (an empty purpose is not)",
                    state("c", json!({"extensions": [{"kind": null, "name": null, "purpose": null, "state": null},
                                                     {"kind": "Worker", "purpose": ""}]})),
                    Want::Invalid(vec![
                        "spec.extensions[0].kind: Invalid value: \"\": extension resource kind cannot be empty",
                        "spec.extensions[1].purpose: Invalid value: \"\": extension resource purpose cannot be empty",
                    ]),
                ),
                case(
                    "a null resource is the zero ResourceData: every reference check at once",
                    state("d", json!({"resources": [null]})),
                    Want::Invalid(vec![
                        "spec.resources[0].apiVersion: Required value: must provide an apiVersion",
                        "spec.resources[0].kind: Required value: must provide a kind",
                        "spec.resources[0]: Unsupported value: \"/, Kind=\": supported values: \"/v1, Kind=Secret\", \"/v1, Kind=ConfigMap\"",
                        "spec.resources[0].name: Required value: must provide a name",
                    ]),
                ),
                case(
                    "a null resourceRef is the zero reference (reported at spec.resources, as Gardener does)",
                    state("e", json!({"extensions": [{"kind": "Worker", "resources": [{"name": "r", "resourceRef": null}]}]})),
                    Want::Invalid(vec![
                        "spec.resources[0].resourceRef.apiVersion: Required value: must provide an apiVersion",
                        "spec.resources[0].resourceRef.kind: Required value: must provide a kind",
                        "spec.resources[0].resourceRef: Unsupported value: \"/, Kind=\": supported values: \"/v1, Kind=Secret\", \"/v1, Kind=ConfigMap\"",
                        "spec.resources[0].resourceRef.name: Required value: must provide a name",
                    ]),
                ),
                case(
                    "null metadata and spec",
                    json!({"metadata": null, "spec": null}),
                    Want::Invalid(vec!["metadata.name: Required value: name or generateName is required"]),
                ),
                case(
                    "a list for a map",
                    state("f", json!({"gardener": [{"name": "ca", "labels": ["a"]}]})),
                    wrong_type(kind, "spec.gardener[0].labels", "invalid type: sequence, expected a map"),
                ),
                strict(
                    "an unknown field in an extension",
                    state("g", json!({"extensions": [{"kind": "Worker", "bogus": 1}]})),
                    unknown(kind, version, "spec.extensions[0].bogus"),
                ),
                case("an array for spec", state("h", json!([])), array_for(kind, "spec", "struct ShootStateSpec")),
                case(
                    "an array for metadata",
                    json!({"metadata": [], "spec": {}}),
                    array_for(kind, "metadata", "struct ObjectMeta"),
                ),
                case(
                    "an array for a gardener entry, its fields in order",
                    state("i", json!({"gardener": [["ca", "secret"]]})),
                    array_for(kind, "spec.gardener[0]", "struct GardenerResourceData"),
                ),
                case(
                    "an array for an extension's resource reference",
                    state("j", json!({"extensions": [{"kind": "Worker", "resources": [{"name": "r", "resourceRef": ["Secret", "s", "v1"]}]}]})),
                    array_for(kind, "spec.extensions[0].resources[0].resourceRef", "struct CrossVersionObjectReference"),
                ),
            ],
        )
        .await;
    }
}

/// core/v1 Event. Types: k8s.io/api/core/v1 types.go (involvedObject and source struct values, the times, count
/// and strings values; series and related pointers). Validation: pkg/apis/core/validation/events.go
/// (`legacyValidateEvent` for core/v1: an event about an object with no namespace belongs in "" or "default").
#[tokio::test]
async fn core_events() {
    let s = Server::start(&["--disable-scheduler"]);
    let c = s.client().await;
    let kind = "Event";
    let event = |name: &str| json!({"metadata": {"name": name}});
    let with = |mut e: Value, fields: Value| {
        json_patch::merge(&mut e, &fields);
        put_nulls(&mut e, &fields);
        e
    };
    creates(
        &c,
        "/api/v1/namespaces/default/events",
        vec![
            case(
                "null involvedObject, source, times, count and series are zero or unset; in default that is valid",
                with(
                    event("a"),
                    json!({"involvedObject": null, "source": null, "firstTimestamp": null, "lastTimestamp": null,
                           "count": null, "series": null, "related": null, "eventTime": null, "reason": null,
                           "reportingComponent": null, "metadata": {"labels": {"app": null}}}),
                ),
                Want::Ok(vec![has("/involvedObject", json!({})), has("/metadata/labels", json!({"app": ""}))]),
            ),
            case(
                "with an eventTime, null reporting fields, action and reason are empty, each required (the reporting \
                 controller named as core/v1 names it)",
                with(
                    event("e"),
                    json!({"eventTime": "2026-11-21T03:00:00.000000Z", "reportingComponent": null,
                           "reportingInstance": null, "action": null, "reason": null}),
                ),
                Want::InvalidIncluding(vec![
                    "reportingComponent: Required value",
                    "reportingInstance: Required value",
                    "action: Required value",
                    "reason: Required value",
                ]),
            ),
            case(
                "a string for a count",
                with(event("b"), json!({"count": "2"})),
                wrong_type(kind, "count", "invalid type: string \"2\", expected i32"),
            ),
            strict(
                "an unknown field in the involved object",
                with(event("c"), json!({"involvedObject": {"kind": "Pod", "bogus": 1}})),
                unknown(kind, "v1", "involvedObject.bogus"),
            ),
            case(
                "an array for the involved object (k8s-openapi's ObjectReference)",
                with(event("f"), json!({"involvedObject": ["Pod", "p"]})),
                array_for(kind, "involvedObject", "ObjectReference"),
            ),
            case(
                "an array for metadata",
                json!({"metadata": ["g"], "involvedObject": {"namespace": "default"}}),
                array_for(kind, "metadata", "struct ObjectMeta"),
            ),
            case(
                "an array for an owner reference in metadata",
                json!({"metadata": {"name": "h", "ownerReferences": [["v1", "Pod", "p", "u"]]}}),
                array_for(kind, "metadata.ownerReferences[0]", "OwnerReference"),
            ),
        ],
    )
    .await;
    creates(
        &c,
        "/api/v1/namespaces/ns-a/events",
        vec![case(
            "a null involvedObject has no namespace, which an event outside default may not have",
            with(event("d"), json!({"involvedObject": null})),
            Want::Invalid(vec!["involvedObject.namespace: Invalid value: \"\": does not match event.namespace"]),
        )],
    )
    .await;
}

/// events.k8s.io/v1 Event. Types: k8s.io/api/events/v1 types.go (eventTime, regarding, deprecatedSource and the
/// deprecated times and count are values; series and related pointers; a series' count and lastObservedTime
/// values). Validation: pkg/apis/core/validation/events.go `ValidateEventCreate` for the new API
/// (`validateV1EventSeries`, eventTime, action and reason required).
#[tokio::test]
async fn events_k8s_io_events() {
    let s = Server::start(&["--disable-scheduler"]);
    let c = s.client().await;
    let kind = "Event";
    let event = |name: &str, fields: Value| {
        let mut e = json!({"metadata": {"name": name}, "eventTime": "2026-11-21T03:00:00.000000Z",
            "reportingController": "example.com/c", "reportingInstance": "i", "action": "Do", "reason": "R",
            "type": "Normal"});
        json_patch::merge(&mut e, &fields);
        put_nulls(&mut e, &fields);
        e
    };
    creates(
        &c,
        "/apis/events.k8s.io/v1/namespaces/default/events",
        vec![
            case(
                "null series fields are zero: a count below 2 and no last observation",
                event("a", json!({"series": {"count": null, "lastObservedTime": null}})),
                Want::Invalid(vec![
                    "series.count: Invalid value: \"\": should be at least 2",
                    "series.lastObservedTime: Required value",
                ]),
            ),
            case(
                "null action, reason and eventTime are zero values, each required",
                event("b", json!({"action": null, "reason": null, "eventTime": null})),
                Want::Invalid(vec!["eventTime: Required value"]),
            ),
            case(
                "null action and reason with an eventTime",
                event("c", json!({"action": null, "reason": null})),
                Want::Invalid(vec!["action: Required value", "reason: Required value"]),
            ),
            case(
                "null series, regarding, related, note and deprecated fields are zero or unset",
                event(
                    "d",
                    json!({"series": null, "regarding": null, "related": null, "note": null,
                           "deprecatedSource": null, "deprecatedFirstTimestamp": null, "deprecatedCount": null}),
                ),
                Want::Ok(vec![absent("/series"), absent("/related"), absent("/note")]),
            ),
            case(
                "a string for a count",
                event("e", json!({"deprecatedCount": "1"})),
                wrong_type(kind, "deprecatedCount", "invalid type: string \"1\", expected i32"),
            ),
            strict(
                "an unknown field in a series",
                event("f", json!({"series": {"count": 2, "lastObservedTime": "2026-11-21T03:00:00.000000Z", "x": 1}})),
                unknown(kind, "v1", "series.x"),
            ),
            case(
                "an array for a series, its fields in order",
                event("g", json!({"series": [2, "2026-11-21T03:00:00.000000Z"]})),
                array_for(kind, "series", "struct EventSeries"),
            ),
            case(
                "an array for regarding (k8s-openapi's ObjectReference)",
                event("h", json!({"regarding": ["Pod"]})),
                array_for(kind, "regarding", "ObjectReference"),
            ),
            case(
                "an array for metadata",
                event("i", json!({"metadata": []})),
                array_for(kind, "metadata", "struct ObjectMeta"),
            ),
        ],
    )
    .await;
}

/// core/v1 Namespace. Types: k8s.io/api/core/v1 types.go (spec and status struct values, spec.finalizers a slice
/// of strings, a condition's type and status values). Validation: pkg/apis/core/validation/validation.go
/// `ValidateNamespace` (each finalizer a qualified name, reported at `spec.finalizers`); the strategy
/// (pkg/registry/core/namespace/strategy.go) sets status to Active on create and keeps it on update.
#[tokio::test]
async fn namespaces() {
    let s = Server::start(&["--disable-scheduler"]);
    let c = s.client().await;
    let path = "/api/v1/namespaces";
    let kind = "Namespace";
    creates(
        &c,
        path,
        vec![
            case(
                "null spec and status are zero values; the create's status is Active whatever it carried",
                json!({"metadata": {"name": "n1", "labels": {"a": null}}, "spec": null,
                       "status": {"phase": null, "conditions": [null, {"type": null}]}}),
                Want::Ok(vec![
                    has("/spec/finalizers", json!(["kubernetes"])),
                    has("/status", json!({"phase": "Active"})),
                    has("/metadata/labels/a", json!("")),
                ]),
            ),
            case(
                "a null finalizer is \"\", not a qualified name nor a standard finalizer",
                json!({"metadata": {"name": "n2"}, "spec": {"finalizers": [null]}}),
                Want::InvalidIncluding(vec![
                    "spec.finalizers: Invalid value: \"\": name part must be non-empty",
                    "spec.finalizers: Invalid value: \"\": name is neither a standard finalizer name nor is it fully qualified",
                ]),
            ),
            case(
                "a string for a list",
                json!({"metadata": {"name": "n3"}, "spec": {"finalizers": "kubernetes"}}),
                wrong_type(kind, "spec.finalizers", "invalid type: string \"kubernetes\", expected a sequence"),
            ),
            strict(
                "an unknown field in a condition of a dropped status is still unknown",
                json!({"metadata": {"name": "n4"}, "status": {"conditions": [{"type": "T", "bogus": 1}]}}),
                unknown(kind, "v1", "status.conditions[0].bogus"),
            ),
            case(
                "an array for spec, its finalizers in it",
                json!({"metadata": {"name": "n5"}, "spec": [["kubernetes"]]}),
                array_for(kind, "spec", "struct NamespaceSpec"),
            ),
            case("an array for metadata", json!({"metadata": ["n6"]}), array_for(kind, "metadata", "struct ObjectMeta")),
            case(
                "an array for a condition of a dropped status is still a decode error",
                json!({"metadata": {"name": "n7"}, "status": {"conditions": [["T", "True"]]}}),
                array_for(kind, "status.conditions[0]", "struct NamespaceCondition"),
            ),
        ],
    )
    .await;
    updates(
        &c,
        &format!("{path}/n1"),
        vec![case(
            "a main-resource update keeps the stored status",
            json!({"status": {"phase": null, "conditions": [null]}}),
            Want::Ok(vec![has("/status", json!({"phase": "Active"}))]),
        )],
    )
    .await;
}
