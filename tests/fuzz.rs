//! Seeded mutation fuzzing of everything that parses client input: the parsers directly (many iterations), and
//! the running server over TLS (bad input gets a 4xx Status, never a 5xx, a hang or a crash).

mod common;
use common::*;
use migration_apiserver::api::kinds;
use migration_apiserver::registry::admission::AdmissionWrite;
use migration_apiserver::registry::continue_token::ContinueToken;
use migration_apiserver::registry::decode::parse_json;
use migration_apiserver::registry::selectors::{FieldSelector, LabelSelector};
use migration_apiserver::registry::strategy::Admit;
use migration_apiserver::registry::{Registry, Subresource};
use migration_apiserver::request_info::RequestInfo;
use migration_apiserver::server::negotiate::negotiate;
use migration_apiserver::server::query::QueryParams;
use migration_apiserver::storage::embedded::{EmbeddedOptions, EmbeddedStorage};
use serde_json::Value;
use std::time::Duration;

/// xorshift64*: deterministic, so a failure reproduces from its iteration number.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const SEEDS: &[&str] = &[
    r#"{"apiVersion":"migration.k8s.io/v1alpha1","kind":"StorageState","metadata":{"name":"deployments.apps","labels":{"a":"b"}},"spec":{"resource":{"group":"apps","resource":"deployments"}},"status":{"persistedStorageVersionHashes":["Unknown"],"lastHeartbeatTime":"2024-01-01T00:00:00Z"}}"#,
    r#"{"apiVersion":"migration.k8s.io/v1alpha1","kind":"StorageVersionMigration","metadata":{"generateName":"m-","finalizers":["x/y"]},"spec":{"resource":{"group":"","version":"v1","resource":"pods"},"continueToken":"abc"},"status":{"conditions":[{"type":"Running","status":"True","reason":"A:B","lastUpdateTime":"2024-01-01T00:00:00Z"}],"migratedObjects":3}}"#,
    r#"[{"op":"replace","path":"/spec/continueToken","value":"x"},{"op":"test","path":"/metadata/name","value":"a"}]"#,
    "env in (prod, dev),tier!=web,!x,y",
    "metadata.name=a,metadata.namespace!=b",
];

const SHOOT_STATE: &str = r#"{"apiVersion":"core.gardener.cloud/v1beta1","kind":"ShootState","metadata":{"name":"s","namespace":"garden-a","managedFields":[{"manager":"m","fieldsV1":{"f:spec":{}}}]},"spec":{"gardener":[{"name":"ca","type":"secret","labels":{"a":"b"},"data":{"k":["v",1,null]}}],"extensions":[{"kind":"Infrastructure","name":"i","purpose":"","state":{"a":{}},"resources":[{"name":"r","resourceRef":{"apiVersion":"v1","kind":"Secret","name":"s"}}]}],"resources":[{"kind":"Secret","name":"r","apiVersion":"v1","data":{}}]}}"#;

const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"null",
    b"-1",
    b"1e999",
    b"\\u0000",
    b"\xff",
    b"(",
    b")",
    b"!",
    b"=",
    b" in ",
    b"\"metadata\"",
    b"{\"a\":1}",
    b"true",
];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(6) {
        let pos = rng.below(v.len() + 1);
        match rng.below(5) {
            0 if !v.is_empty() => {
                let end = (pos + rng.below(16)).min(v.len());
                v.drain(pos.min(v.len())..end);
            }
            1 => {
                let t = TOKENS[rng.below(TOKENS.len())];
                v.splice(pos..pos, t.iter().copied());
            }
            2 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            3 => {
                // Duplicate a slice (deep nesting, repeated keys).
                let a = rng.below(v.len() + 1);
                let b = (a + rng.below(64)).min(v.len());
                let chunk = v[a..b].to_vec();
                v.splice(pos..pos, chunk);
            }
            _ => v.truncate(pos),
        }
    }
    v
}

#[test]
fn parsers_never_panic() {
    let strategies = kinds(&Default::default()).expect("kinds");
    let mut rng = Rng(0x9E3779B97F4A7C15);
    for i in 0..30_000 {
        let seed = SEEDS[i % SEEDS.len()].as_bytes();
        let input = mutate(&mut rng, seed);
        let text = String::from_utf8_lossy(&input);
        let _ = LabelSelector::parse(&text).map(|s| s.matches(None));
        let _ = FieldSelector::parse(&text, migration_apiserver::api::event::FIELD_LABELS);
        let _ = ContinueToken::decode(&text);
        let _ = negotiate(Some(&text), true);
        let _ = QueryParams::parse(Some(&text));
        let info = RequestInfo::parse(&http::Method::GET, &text, Some(&text));
        let _ = (info.is_served_form(), RequestInfo::parse(&http::Method::DELETE, &format!("/apis/{text}"), None));
        if let Ok((value, _dups)) = parse_json(&input) {
            for s in &strategies {
                // The typed steps of a create (decode, defaults, preparation, validation), of a /status update
                // and of defaulting; only the decode may fail.
                let namespace = value.pointer("/metadata/namespace").and_then(Value::as_str);
                match s.admit(namespace, Admit { object: &value, old: None }) {
                    Ok(_) => {
                        let _ = s.admit(namespace, Admit { object: &value, old: Some((&value, Subresource::Status)) });
                        let _ = s.cells(&value, chrono::Utc::now());
                        let _ = s.defaulted(&value, true);
                    }
                    Err(e) => assert!(e.code == 400, "decode error must be 400, got {e:?} for input #{i}"),
                }
            }
        }
    }
    // Deep nesting is refused, not a stack overflow.
    let deep = "[".repeat(100_000);
    assert_eq!(parse_json(deep.as_bytes()).unwrap_err().code, 400);
}

/// Admission reads objects as kube-apiserver sends them, whatever their text: no panic; a failure is a 400 (or
/// validation's 422); a patch is a JSON Patch that applies to the object as sent, after which defaulting has
/// nothing more to add.
#[test]
fn admission_patches_apply_to_what_was_sent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let storage = EmbeddedStorage::open(dir.path(), EmbeddedOptions::default()).expect("store");
    let registry = Registry::new(storage, kinds(&Default::default()).expect("kinds"), Default::default());
    let resources: Vec<_> = [
        ("migration.k8s.io", "v1alpha1", "StorageState"),
        ("migration.k8s.io", "v1alpha1", "StorageVersionMigration"),
        ("core.gardener.cloud", "v1beta1", "ShootState"),
    ]
    .into_iter()
    .map(|(g, v, k)| (registry.resource_for_kind(g, v, k).expect("served"), v))
    .collect();
    let seeds = [SEEDS[0], SEEDS[1], SHOOT_STATE];
    let mut rng = Rng(0x2F0E1EBA9EA36930);
    let (mut objects, mut patched) = (0, 0);
    for i in 0..50_000 {
        let input = mutate(&mut rng, seeds[i % seeds.len()].as_bytes());
        // kube-apiserver sends objects that are JSON.
        let Some((text, sent)) =
            std::str::from_utf8(&input).ok().and_then(|t| Some((t, serde_json::from_str::<Value>(t).ok()?)))
        else {
            continue;
        };
        objects += 1;
        for (res, version) in &resources {
            let validated = res.admission_validate(version, Some("garden-a"), AdmissionWrite::create(text));
            if let Err(e) = &validated {
                assert!(e.code == 400 || e.code == 422, "input #{i}: {e:?}");
            }
            let defaulted = res.admission_default(version, AdmissionWrite::create(text));
            let patch = match defaulted {
                Ok(d) => d.patch,
                Err(e) => {
                    assert_eq!(e.code, 400, "input #{i}: {e:?}");
                    continue;
                }
            };
            let Some(patch) = patch else { continue };
            let patch: json_patch::Patch = serde_json::from_slice(&patch).expect("a JSON Patch");
            let mut object = sent.clone();
            json_patch::patch(&mut object, &patch).unwrap_or_else(|e| panic!("input #{i} {text}: {e} ({patch:?})"));
            let again = res.admission_default(version, AdmissionWrite::create(&object.to_string()));
            assert_eq!(again.expect("defaults again").patch, None, "input #{i}: {text}");
            patched += 1;
        }
    }
    // Most mutations break the JSON; enough survive to reach defaulting, and many of those get a patch (only
    // StorageState has defaults: its status).
    assert!(objects > 2_000 && patched > 200, "{objects} objects, {patched} patched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_answers_bad_input_with_4xx() {
    let s = Server::start(&[]);
    let client = s.client().await;
    let mut rng = Rng(0xD1B54A32D192ED03);
    let paths = [
        "/apis/migration.k8s.io/v1alpha1/storagestates",
        "/apis/migration.k8s.io/v1alpha1/storageversionmigrations",
        "/apis/migration.k8s.io/v1alpha1/storageversionmigrations/m1",
        "/apis/migration.k8s.io/v1alpha1/storageversionmigrations/m1/status",
    ];
    // Something to update and patch.
    let svm = SEEDS[1].replace("\"generateName\":\"m-\"", "\"name\":\"m1\"");
    let req =
        http::Request::post(paths[1]).header("content-type", "application/json").body(svm.into_bytes()).expect("req");
    client.request_text(req).await.expect("create m1");
    let (mut ok, mut client_errors) = (0, 0);
    for i in 0..600 {
        let seed = SEEDS[i % 3].as_bytes();
        // One request in five is the valid seed itself, so the success paths run too.
        let body = if i % 5 == 0 { seed.to_vec() } else { mutate(&mut rng, seed) };
        let path = paths[rng.below(paths.len())];
        let (method, ct) = match rng.below(4) {
            0 => ("POST", "application/json"),
            1 => ("PUT", "application/json"),
            2 => ("PATCH", "application/merge-patch+json"),
            _ => ("PATCH", "application/json-patch+json"),
        };
        let q = [
            "",
            "?fieldValidation=Strict",
            "?dryRun=All",
            "?limit=-1&continue=%ff",
            "?labelSelector=a%20in%20(",
            "?fieldValidation=Bogus",
        ][rng.below(6)];
        let req = http::Request::builder()
            .method(method)
            .uri(format!("{path}{q}"))
            .header("content-type", ct)
            .body(body)
            .expect("request");
        let resp = tokio::time::timeout(Duration::from_secs(10), client.send(req.map(kube::client::Body::from)))
            .await
            .unwrap_or_else(|_| panic!("request #{i} hung"))
            .expect("transport");
        let code = resp.status().as_u16();
        assert!(code < 500, "request #{i} {method} {path}{q}: got {code}");
        if code < 400 {
            ok += 1;
        } else {
            client_errors += 1;
            let body = http_body_util::BodyExt::collect(resp.into_body()).await.expect("body").to_bytes();
            let status: serde_json::Value =
                serde_json::from_slice(&body).unwrap_or_else(|_| panic!("#{i}: not a Status: {body:?}"));
            assert_eq!(status["kind"], "Status", "#{i}");
            assert_eq!(status["code"].as_u64(), Some(code as u64), "#{i}");
        }
    }
    assert!(client_errors > 0 && ok > 0, "fuzzing exercised both paths: ok={ok} errors={client_errors}");
    // Still healthy.
    let out = s.kubectl(&["get", "--raw", "/readyz"]);
    assert!(out.status.success());
}

/// The seeds of one fuzz target: the files of `tests/fuzz/corpus/<target>/` (committed, so that every run starts
/// from the same inputs and a new finding is kept by adding its input there).
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz/corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    let seeds: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).expect("seed")).collect();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

/// The request decoders (query parameters, path, patch and body) of the running server, each fed mutations of its
/// corpus, for a bounded number of requests and time: every answer is a Status below 500 (or a stream), never a
/// panic, a hang or a poisoned resource; afterwards the resource still reads whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_decoders_on_their_corpora() {
    const NS: &str = "/apis/core.gardener.cloud/v1beta1/namespaces/garden-a/shootstates";
    let s = Server::start(&[]);
    let client = s.client_without_retries().await;
    let seed_object = String::from_utf8(corpus("body")[1].clone())
        .expect("utf-8")
        .replace("\"generateName\":\"s-\"", "\"name\":\"a\"");
    let req =
        http::Request::post(NS).header("content-type", "application/json").body(seed_object.into_bytes()).expect("req");
    client.request_text(req).await.expect("create a");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut rng = Rng(0xA0761D6478BD642F);
    let mut sent = 0;
    for target in ["query", "path", "patch", "body"] {
        let seeds = corpus(target);
        for i in 0..250 {
            if std::time::Instant::now() > deadline {
                break;
            }
            let seed = &seeds[i % seeds.len()];
            let input = if i % 7 == 0 { seed.clone() } else { mutate(&mut rng, seed) };
            // Paths and queries travel as URI text: bytes a URI cannot carry are percent-encoded.
            let uri_text: String = input
                .iter()
                .map(|b| match b {
                    b'!'..=b'~' if *b != b'#' => (*b as char).to_string(),
                    _ => format!("%{b:02X}"),
                })
                .collect();
            let (method, uri, content_type, body) = match target {
                "query" => ("GET", format!("{NS}?{uri_text}"), "", Vec::new()),
                "path" => ("GET", format!("/apis/{uri_text}"), "", Vec::new()),
                "patch" => {
                    let ct = if input.first() == Some(&b'[') {
                        "application/json-patch+json"
                    } else {
                        "application/merge-patch+json"
                    };
                    ("PATCH", format!("{NS}/a"), ct, input)
                }
                _ => ("POST", NS.to_string(), "application/json", input),
            };
            let Ok(req) =
                http::Request::builder().method(method).uri(&uri).header("content-type", content_type).body(body)
            else {
                continue; // not a URI at all: no request can carry it
            };
            sent += 1;
            let resp = tokio::time::timeout(Duration::from_secs(10), client.send(req.map(kube::client::Body::from)))
                .await
                .unwrap_or_else(|_| panic!("{target} #{i} hung: {method} {uri}"))
                .expect("transport");
            let code = resp.status().as_u16();
            assert!(code < 500 || code == 504, "{target} #{i} {method} {uri}: {code}");
            if code >= 400 {
                let body = http_body_util::BodyExt::collect(resp.into_body()).await.expect("body").to_bytes();
                let status: Value =
                    serde_json::from_slice(&body).unwrap_or_else(|_| panic!("{target} #{i}: not a Status: {body:?}"));
                assert_eq!(
                    (status["kind"].as_str(), status["code"].as_u64()),
                    (Some("Status"), Some(code as u64)),
                    "{target} #{i}"
                );
            }
        }
    }
    assert!(sent > 500, "{sent} requests sent");
    // Nothing that was accepted poisoned the resource.
    let list = s.kubectl_ok(&["get", "shootstates", "-A", "-o", "json"]);
    assert!(list.contains("\"items\""));
    assert!(!s.log().contains("panicked"), "{}", s.log());
}

/// A Namespace in Kubernetes' protobuf envelope (`k8s\0` + runtime.Unknown), as kubectl's typed client sends it.
fn protobuf_namespace(name: &str) -> Vec<u8> {
    use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
    use prost::Message;
    let ns = k8s_pb::api::core::v1::Namespace {
        metadata: Some(meta::ObjectMeta {
            name: Some(name.into()),
            labels: [("a".to_string(), "b".to_string())].into(),
            finalizers: vec!["x/y".into()],
            ..Default::default()
        }),
        spec: Some(k8s_pb::api::core::v1::NamespaceSpec { finalizers: vec!["kubernetes".into()] }),
        ..Default::default()
    };
    let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown {
        type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
            api_version: Some("v1".into()),
            kind: Some("Namespace".into()),
        }),
        raw: Some(ns.encode_to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    [b"k8s\0".to_vec(), unknown.encode_to_vec()].concat()
}

/// Protobuf bodies (Namespaces, and DeleteOptions) mutated byte by byte: the decoders never panic and refuse with
/// 400; through the running server, a create, update or delete answers below 500 with a JSON Status on failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_namespace_bodies() {
    use migration_apiserver::registry::strategy::Kind;
    use migration_apiserver::server::protobuf::{decode_delete_options, decode_object, ProtoKind};
    let info = migration_apiserver::api::namespace::Namespace::info();
    let kind = ProtoKind::of(info).expect("Namespace has a protobuf form");
    let seed = protobuf_namespace("garden-fuzz");
    let mut rng = Rng(0x8BB84B93962EACC9);
    for i in 0..20_000 {
        let input = mutate(&mut rng, &seed);
        if let Err(e) = decode_object(kind, info, "v1", &input) {
            assert_eq!(e.code, 400, "#{i}: {}", e.message);
        }
        if let Err(e) = decode_delete_options(&input) {
            assert_eq!(e.code, 400, "#{i}: {}", e.message);
        }
    }

    let s = Server::start(&[]);
    let client = s.client_without_retries().await;
    let (mut ok, mut client_errors) = (0, 0);
    for i in 0..300 {
        let body = if i % 5 == 0 { protobuf_namespace(&format!("ns-{i}")) } else { mutate(&mut rng, &seed) };
        let (method, uri) = match rng.below(3) {
            0 => ("POST", "/api/v1/namespaces".to_string()),
            1 => ("PUT", "/api/v1/namespaces/garden-fuzz".to_string()),
            _ => ("DELETE", format!("/api/v1/namespaces/ns-{}", i / 5 * 5)),
        };
        let req = http::Request::builder()
            .method(method)
            .uri(&uri)
            .header("content-type", "application/vnd.kubernetes.protobuf")
            .body(body)
            .expect("request");
        let resp = tokio::time::timeout(Duration::from_secs(10), client.send(req.map(kube::client::Body::from)))
            .await
            .unwrap_or_else(|_| panic!("#{i} hung: {method} {uri}"))
            .expect("transport");
        let code = resp.status().as_u16();
        assert!(code < 500, "#{i} {method} {uri}: {code}");
        if code >= 400 {
            client_errors += 1;
            let body = http_body_util::BodyExt::collect(resp.into_body()).await.expect("body").to_bytes();
            let status: Value =
                serde_json::from_slice(&body).unwrap_or_else(|_| panic!("#{i}: not a Status: {body:?}"));
            assert_eq!((status["kind"].as_str(), status["code"].as_u64()), (Some("Status"), Some(code as u64)), "#{i}");
        } else {
            ok += 1;
        }
    }
    assert!(ok > 0 && client_errors > 0, "both paths exercised: ok={ok} errors={client_errors}");
    assert!(s.kubectl(&["get", "namespaces"]).status.success());
    assert!(!s.log().contains("panicked"), "{}", s.log());
}

/// Snapshot files (`storage snapshot verify` / `restore` read what an operator points them at): a damaged file is
/// refused with an error, never a panic or a huge allocation, and only the file as written verifies.
#[tokio::test]
async fn snapshot_files_never_panic_and_only_the_original_verifies() {
    use migration_apiserver::storage::backup;
    use migration_apiserver::storage::Storage;
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("data");
    {
        let s = EmbeddedStorage::open(&data, EmbeddedOptions::default()).expect("store");
        for (i, seed) in SEEDS.iter().enumerate() {
            s.create(&format!("/registry/g/r/ns/o{i}"), bytes::Bytes::from(seed.to_string())).await.expect("create");
        }
    }
    let info = backup::save_offline(&data, &tmp.path().join("snaps")).expect("snapshot");
    let original = std::fs::read(&info.path).expect("read");
    let file = tmp.path().join("fuzzed.snap");
    let mut rng = Rng(0xD1B54A32D192ED03);
    for i in 0..3_000 {
        let input = mutate(&mut rng, &original);
        std::fs::write(&file, &input).expect("write");
        let verified = backup::verify(&file);
        assert!(verified.is_err() || input == original, "mutation #{i} verified");
        if i % 100 == 0 {
            // A restore reads the same records and must refuse the same files, leaving nothing behind.
            let target = tmp.path().join(format!("restored-{i}"));
            let restored = backup::restore(&file, &target);
            assert_eq!(restored.is_ok(), verified.is_ok(), "mutation #{i}");
            if restored.is_err() {
                let left: Vec<_> = std::fs::read_dir(&target).map(|d| d.flatten().collect()).unwrap_or_default();
                assert!(left.is_empty(), "mutation #{i} left {left:?}");
            }
        }
    }
}
