//! core/v1 Namespaces in protobuf (`application/vnd.kubernetes.protobuf`) and YAML, standalone, as kube-apiserver
//! serves them: real kubectl (whose typed client sends and asks for protobuf on `kubectl create namespace`), and raw
//! requests whose bodies are built and read with k8s-pb's upstream-generated messages, the envelope also read by
//! `protoc --decode_raw`, which knows nothing of Kubernetes. Other kinds and other content types stay as they were.

mod common;
use common::requests::*;
use common::*;

use axum::http::Method;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
use prost::Message;
use serde_json::Value;

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
const NAMESPACES: &str = "/api/v1/namespaces";

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `k8s\0` and a runtime.Unknown around `raw`.
fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta { api_version: Some(api_version.into()), kind: Some(kind.into()) }),
        raw: Some(raw),
        content_encoding: None,
        content_type: None,
    };
    [b"k8s\0".to_vec(), unknown.encode_to_vec()].concat()
}

/// The Unknown of an enveloped answer.
fn unwrap(body: &[u8]) -> Unknown {
    let rest = body.strip_prefix(b"k8s\0").unwrap_or_else(|| panic!("no k8s\\0 magic: {body:?}"));
    Unknown::decode(rest).expect("runtime.Unknown")
}

fn kind_of(u: &Unknown) -> (String, String) {
    let tm = u.type_meta.clone().unwrap_or_default();
    (tm.api_version.unwrap_or_default(), tm.kind.unwrap_or_default())
}

fn namespace_body(name: &str) -> Vec<u8> {
    let ns = core::Namespace {
        metadata: Some(meta::ObjectMeta {
            name: Some(name.into()),
            labels: [("team".to_string(), "gardener".to_string())].into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    envelope("v1", "Namespace", ns.encode_to_vec())
}

/// An answer in protobuf: its content type, then the object of `kind`.
fn decoded<M: Message + Default>(r: &Resp, code: u16, kind: &str) -> M {
    assert_eq!(r.status, code, "{}", r.text());
    assert_eq!(r.header("content-type").as_deref(), Some(PROTOBUF));
    let u = unwrap(&r.body);
    assert_eq!(kind_of(&u), ("v1".to_string(), kind.to_string()));
    M::decode(u.raw.unwrap_or_default().as_slice()).expect(kind)
}

/// A Status answered in protobuf: code, reason and message.
fn status(r: &Resp, code: u16) -> (i32, String, String) {
    let s: meta::Status = decoded(r, code, "Status");
    assert_eq!(s.status.as_deref(), Some("Failure"));
    (s.code.unwrap_or_default(), s.reason.unwrap_or_default(), s.message.unwrap_or_default())
}

/// What protoc, with no schema, reads in an enveloped answer (without the magic).
fn decode_raw(body: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("protoc")
        .arg("--decode_raw")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("protoc");
    child.stdin.take().expect("stdin").write_all(&body[4..]).expect("write");
    let out = child.wait_with_output().expect("protoc output");
    assert!(out.status.success(), "protoc --decode_raw failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Must-show: `kubectl create namespace` (protobuf both ways), its AlreadyExists (a protobuf Status), `get -o yaml`,
/// `get ns`, `delete namespace`.
#[test]
fn kubectl_creates_reads_and_deletes_namespaces() {
    let s = Server::start(&[]);
    assert_eq!(s.kubectl_ok(&["create", "namespace", "garden-dev"]), "namespace/garden-dev created\n");
    let out = s.kubectl(&["create", "namespace", "garden-dev"]);
    assert!(!out.status.success());
    assert_eq!(stderr(&out), "Error from server (AlreadyExists): namespaces \"garden-dev\" already exists\n");
    // A 422 with its causes, read by kubectl from the protobuf Status's details.
    let out = s.kubectl(&["create", "namespace", "Bad_Name"]);
    let err = stderr(&out);
    assert!(
        err.starts_with("The Namespace \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 label"),
        "{err}"
    );

    let yaml = s.kubectl_ok(&["get", "ns", "garden-dev", "-o", "yaml"]);
    let ns: Value = serde_yaml_ng::from_str(&yaml).expect("yaml");
    assert_eq!((ns["apiVersion"].as_str(), ns["kind"].as_str()), (Some("v1"), Some("Namespace")), "{yaml}");
    assert_eq!(ns["metadata"]["name"], "garden-dev", "{yaml}");
    assert_eq!(ns["metadata"]["labels"]["kubernetes.io/metadata.name"], "garden-dev", "{yaml}");
    assert_eq!(ns["spec"]["finalizers"], serde_json::json!(["kubernetes"]), "{yaml}");
    assert_eq!(ns["status"]["phase"], "Active", "{yaml}");
    assert!(ns["metadata"]["uid"].as_str().is_some_and(|u| !u.is_empty()), "{yaml}");
    assert!(ns["metadata"]["creationTimestamp"].as_str().is_some_and(|t| t.ends_with('Z')), "{yaml}");

    let table = s.kubectl_ok(&["get", "ns"]);
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["NAME", "STATUS", "AGE"], "{table}");
    assert!(rows.iter().any(|r| r[..2] == ["garden-dev", "Active"]), "{table}");

    assert_eq!(s.kubectl_ok(&["delete", "namespace", "garden-dev"]), "namespace \"garden-dev\" deleted\n");
    let out = s.kubectl(&["get", "ns", "garden-dev"]);
    assert_eq!(stderr(&out), "Error from server (NotFound): namespaces \"garden-dev\" not found\n");
}

/// Create, get, list and watch in protobuf, checked against the JSON answers for the same objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_lists_and_watches_in_protobuf() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let headers = [("content-type", PROTOBUF), ("accept", PROTOBUF)];
    let r = call(&c, Method::POST, NAMESPACES, &headers, namespace_body("garden-pb")).await;
    let created: core::Namespace = decoded(&r, 201, "Namespace");
    let m = created.metadata.clone().unwrap_or_default();
    assert_eq!(m.name.as_deref(), Some("garden-pb"));
    assert_eq!(m.labels.get("team").map(String::as_str), Some("gardener"));
    assert_eq!(m.labels.get("kubernetes.io/metadata.name").map(String::as_str), Some("garden-pb"));
    assert_eq!(created.spec.clone().unwrap_or_default().finalizers, ["kubernetes"]);
    assert_eq!(created.status.clone().unwrap_or_default().phase.as_deref(), Some("Active"));
    let fields = m.managed_fields.first().and_then(|e| e.fields_v1.clone()).and_then(|f| f.raw).expect("fieldsV1");
    let fields: Value = serde_json::from_slice(&fields).expect("fieldsV1 is JSON text");
    assert!(fields["f:metadata"]["f:labels"]["f:team"].is_object(), "{fields}");
    let raw = decode_raw(&r.body);
    assert!(raw.starts_with("1 {\n  1: \"v1\"\n  2: \"Namespace\"\n}\n2 {"), "{raw}");

    // The same object in JSON: the same identity, times in whole seconds.
    let json = get(&c, &format!("{NAMESPACES}/garden-pb")).await.ok(200);
    let r = get_accept(&c, &format!("{NAMESPACES}/garden-pb"), PROTOBUF).await;
    let got: core::Namespace = decoded(&r, 200, "Namespace");
    let gm = got.metadata.clone().unwrap_or_default();
    assert_eq!(gm.uid.as_deref(), json["metadata"]["uid"].as_str());
    assert_eq!(gm.resource_version.as_deref(), json["metadata"]["resourceVersion"].as_str());
    let created_at = chrono::DateTime::parse_from_rfc3339(json["metadata"]["creationTimestamp"].as_str().expect("ts"))
        .expect("rfc3339")
        .timestamp();
    assert_eq!(gm.creation_timestamp.and_then(|t| t.seconds), Some(created_at));
    assert_eq!(got, created);

    let r = get_accept(&c, NAMESPACES, &format!("{PROTOBUF}, application/json")).await;
    let list: core::NamespaceList = decoded(&r, 200, "NamespaceList");
    let names: Vec<_> = list.items.iter().filter_map(|n| n.metadata.as_ref()?.name.clone()).collect();
    assert!(names.contains(&"garden-pb".to_string()), "{names:?}");
    let rv = list.metadata.and_then(|m| m.resource_version).expect("list resourceVersion");

    // A watch from the list: length-delimited WatchEvent frames, each object enveloped.
    post(
        &c,
        NAMESPACES,
        &serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "garden-later"}}),
    )
    .await
    .ok(201);
    let r = get_accept(&c, &format!("{NAMESPACES}?watch=true&resourceVersion={rv}&timeoutSeconds=2"), PROTOBUF).await;
    assert_eq!(r.header("content-type").as_deref(), Some("application/vnd.kubernetes.protobuf;stream=watch"));
    let mut events = Vec::new();
    let mut rest = r.body.as_slice();
    while rest.len() >= 4 {
        let len = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let event = meta::WatchEvent::decode(&rest[4..4 + len]).expect("WatchEvent");
        let object = unwrap(&event.object.and_then(|o| o.raw).expect("object"));
        assert_eq!(kind_of(&object), ("v1".to_string(), "Namespace".to_string()));
        let ns = core::Namespace::decode(object.raw.unwrap_or_default().as_slice()).expect("Namespace");
        events.push((event.r#type.unwrap_or_default(), ns.metadata.and_then(|m| m.name).unwrap_or_default()));
        rest = &rest[4 + len..];
    }
    assert!(rest.is_empty(), "a partial frame: {rest:?}");
    assert_eq!(events, [("ADDED".to_string(), "garden-later".to_string())]);
}

/// Deletes with protobuf DeleteOptions, errors as protobuf Status when protobuf is preferred, 415 for the content
/// types that are not served, 400 for a malformed body, and our own kinds JSON-only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_errors_and_other_content_types() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let headers = [("content-type", PROTOBUF), ("accept", &format!("{PROTOBUF}, application/json"))];
    let created: core::Namespace =
        decoded(&call(&c, Method::POST, NAMESPACES, &headers, namespace_body("garden-del")).await, 201, "Namespace");
    let path = format!("{NAMESPACES}/garden-del");

    let options = |uid: &str| {
        let o = meta::DeleteOptions {
            preconditions: Some(meta::Preconditions { uid: Some(uid.into()), resource_version: None }),
            ..Default::default()
        };
        envelope("v1", "DeleteOptions", o.encode_to_vec())
    };
    let r = call(&c, Method::DELETE, &path, &headers, options("not-the-uid")).await;
    let (code, reason, message) = status(&r, 409);
    assert_eq!((code, reason.as_str()), (409, "Conflict"), "{message}");
    assert!(message.contains("Precondition failed: UID in precondition: not-the-uid"), "{message}");
    let uid = created.metadata.and_then(|m| m.uid).expect("uid");
    let gone: core::Namespace =
        decoded(&call(&c, Method::DELETE, &path, &headers, options(&uid)).await, 200, "Namespace");
    assert_eq!(gone.metadata.and_then(|m| m.name).as_deref(), Some("garden-del"));

    let r = get_accept(&c, &path, PROTOBUF).await;
    assert_eq!(status(&r, 404), (404, "NotFound".into(), "namespaces \"garden-del\" not found".into()));
    // Preferring JSON, or asking for a Table (JSON only), the Status is JSON.
    let r = get_accept(&c, &path, &format!("application/json, {PROTOBUF}")).await;
    r.status_err(404, "NotFound");
    get_accept(&c, &path, "application/json;as=Table;v=v1;g=meta.k8s.io").await.status_err(404, "NotFound");

    // Other content types keep their 415 (kube-apiserver's message: the media types a Namespace is read in).
    for ct in ["application/cbor", "text/plain"] {
        let r = call(&c, Method::POST, NAMESPACES, &[("content-type", ct)], b"x".to_vec()).await;
        let st = r.status_err(415, "UnsupportedMediaType");
        assert_eq!(
            st["message"],
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf"
        );
    }
    // Malformed protobuf: 400, never a panic.
    for body in
        [b"k8s\0\x0a\xff".to_vec(), b"{\"metadata\":{}}".to_vec(), envelope("v1", "Namespace", vec![0x0a, 0x7f])]
    {
        let r = call(&c, Method::POST, NAMESPACES, &[("content-type", PROTOBUF)], body).await;
        let st = r.status_err(400, "BadRequest");
        let message = st["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("the object provided is unrecognized (must be of type Namespace): ")
                || message.starts_with("Namespace in version \"v1\" cannot be handled as a Namespace: "),
            "{message}"
        );
    }
    // Our own kinds are JSON-only, as custom resources and aggregated servers are.
    let shoots = "/apis/core.gardener.cloud/v1beta1/namespaces/garden-a/shootstates";
    let r = call(&c, Method::POST, shoots, &[("content-type", PROTOBUF)], namespace_body("x")).await;
    r.status_err(415, "UnsupportedMediaType");
    get_accept(&c, shoots, PROTOBUF).await.status_err(406, "NotAcceptable");
    let r = get_accept(&c, shoots, &format!("{PROTOBUF}, application/json")).await;
    assert_eq!(r.header("content-type").as_deref(), Some("application/json"), "{}", r.text());
}

/// YAML, the third form kube-apiserver serves built-in kinds in: bodies, objects, lists and errors; not watches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_lists_and_errors_in_yaml() {
    const YAML: &str = "application/yaml";
    let s = Server::start(&[]);
    let c = s.client().await;
    let body = b"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: garden-yaml\n  labels: {team: gardener}\n";
    let r = call(&c, Method::POST, NAMESPACES, &[("content-type", YAML), ("accept", YAML)], body.to_vec()).await;
    assert_eq!((r.status, r.header("content-type").as_deref()), (201, Some(YAML)), "{}", r.text());
    let ns: Value = serde_yaml_ng::from_slice(&r.body).expect("yaml");
    assert_eq!(ns["metadata"]["name"], "garden-yaml", "{ns}");
    assert_eq!(ns["metadata"]["labels"]["team"], "gardener", "{ns}");
    assert_eq!(ns["status"]["phase"], "Active", "{ns}");

    let r = get_accept(&c, NAMESPACES, YAML).await;
    assert_eq!((r.status, r.header("content-type").as_deref()), (200, Some(YAML)), "{}", r.text());
    let list: Value = serde_yaml_ng::from_slice(&r.body).expect("yaml");
    assert_eq!(list["kind"], "NamespaceList", "{list}");
    assert!(list["items"].as_array().is_some_and(|items| items.iter().any(|i| i["metadata"]["name"] == "garden-yaml")));

    let r = get_accept(&c, &format!("{NAMESPACES}/nope"), YAML).await;
    assert_eq!((r.status, r.header("content-type").as_deref()), (404, Some(YAML)), "{}", r.text());
    let st: Value = serde_yaml_ng::from_slice(&r.body).expect("yaml");
    assert_eq!((st["kind"].as_str(), st["reason"].as_str()), (Some("Status"), Some("NotFound")), "{st}");

    // A watch has no YAML form: 406, itself in YAML as the client asked.
    let r = get_accept(&c, &format!("{NAMESPACES}?watch=true&timeoutSeconds=1"), YAML).await;
    assert_eq!((r.status, r.header("content-type").as_deref()), (406, Some(YAML)), "{}", r.text());
    let st: Value = serde_yaml_ng::from_slice(&r.body).expect("yaml");
    assert_eq!(st["reason"], "NotAcceptable", "{st}");
    // YAML that is not YAML: 400.
    let r = call(&c, Method::POST, NAMESPACES, &[("content-type", YAML)], b"a: [b".to_vec()).await;
    let st = r.status_err(400, "BadRequest");
    let message = st["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(
            "the object provided is unrecognized (must be of type Namespace): error converting YAML to JSON: yaml: "
        ),
        "{message}"
    );
}
