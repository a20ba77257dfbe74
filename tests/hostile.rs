//! Hostile input, tried as an attacker would: one authorized writer cannot take a resource away from everyone else.
//! What is written can always be read back; a stored object that cannot be read (corruption, a lost encryption
//! key, data of another writer) takes only itself down and can be removed through the API; no client-given number
//! panics a request; and the request checks are as strict as kube-apiserver's.

mod common;
use common::requests::*;
use common::status::cause_pairs;
use common::*;

use axum::http::Method;
use serde_json::{json, Value};
use std::time::Duration;

const NS: &str = "/apis/core.gardener.cloud/v1beta1/namespaces/garden-a/shootstates";
const ALL: &str = "/apis/core.gardener.cloud/v1beta1/shootstates";
const KEY_PREFIX: &str = "/registry/core.gardener.cloud/shootstates/garden-a/";
/// The nesting limit of stored objects (`registry::decode::MAX_NESTING_DEPTH`).
const MAX_DEPTH: usize = 100;

/// A JSON value of `levels` objects nested in one another.
fn nested(levels: usize) -> Value {
    (1..levels).fold(json!({}), |inner, _| json!({ "a": inner }))
}

fn shoot_state(name: &str, data: Value) -> Value {
    json!({"apiVersion": "core.gardener.cloud/v1beta1", "kind": "ShootState",
           "metadata": {"name": name, "namespace": "garden-a"},
           "spec": {"gardener": [{"name": "ca", "type": "secret", "data": data}]}})
}

/// The depth at which `spec.gardener[0].data` sits: object, spec, gardener, [0], data.
const DATA_LEVEL: usize = 5;

fn assert_too_deep(r: &Resp) {
    let s = r.status_err(422, "Invalid");
    let message = s["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("nest at most {MAX_DEPTH} levels deep")), "{s}");
    assert_eq!(s["details"]["causes"][0]["reason"], "FieldValueForbidden", "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_objects_are_refused_by_every_write_path_and_nothing_is_stored() {
    let s = Server::start(&[]);
    let c = s.client().await;
    let too_deep = nested(MAX_DEPTH - DATA_LEVEL + 2);

    // create: refused, nothing stored
    assert_too_deep(&post(&c, NS, &shoot_state("deep", too_deep.clone())).await);
    get(&c, &format!("{NS}/deep")).await.status_err(404, "NotFound");
    // the deepest that may be stored is stored, and reads back
    let fits = nested(MAX_DEPTH - DATA_LEVEL + 1);
    let created = post(&c, NS, &shoot_state("a", fits.clone())).await.ok(201);
    let rv = created["metadata"]["resourceVersion"].clone();
    assert_eq!(get(&c, &format!("{NS}/a")).await.ok(200)["spec"]["gardener"][0]["data"], fits);

    // update (PUT)
    let mut replaced = shoot_state("a", too_deep.clone());
    replaced["metadata"]["resourceVersion"] = rv.clone();
    assert_too_deep(&put(&c, &format!("{NS}/a"), &replaced).await);
    // merge patch
    let merge = json!({"spec": {"gardener": [{"name": "ca", "data": too_deep.clone()}]}});
    assert_too_deep(&merge_patch(&c, &format!("{NS}/a"), &merge).await);
    // JSON patch: the attack was two acknowledged patches, each shallow enough to parse, that together nest past
    // what the reader takes. The first is within the limit; the second is refused.
    let shallow = json!([{"op": "replace", "path": "/spec/gardener/0/data", "value": nested(60)}]);
    let patched = json_patch(&c, &format!("{NS}/a"), &shallow).await.ok(200);
    let rv = patched["metadata"]["resourceVersion"].clone();
    let deeper = format!("/spec/gardener/0/data{}", "/a".repeat(59));
    let second = json!([{"op": "add", "path": deeper, "value": nested(60)}]);
    let r = json_patch(&c, &format!("{NS}/a"), &second).await;
    assert_too_deep(&r);
    let field = r.json()["details"]["causes"][0]["field"].as_str().unwrap_or_default().to_string();
    assert!(field.starts_with("spec.gardener[0].data.a.a"), "{field}");
    // A copy of what is there into itself nests it twice as deep.
    let copy = json!([{"op": "copy", "from": "/spec/gardener/0/data", "path": deeper}]);
    assert_too_deep(&json_patch(&c, &format!("{NS}/a"), &copy).await);
    // /status of a kind with a status: a JSON patch deep under status is refused before it is applied.
    let svm = json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
        "metadata": {"name": "m"}, "spec": {"resource": {"group": "apps", "version": "v1", "resource": "deployments"}}});
    let svm_path = "/apis/migration.k8s.io/v1alpha1/storageversionmigrations";
    post(&c, svm_path, &svm).await.ok(201);
    let status_patch = json!([{"op": "add", "path": "/status", "value": {"x": nested(MAX_DEPTH)}}]);
    assert_too_deep(&json_patch(&c, &format!("{svm_path}/m/status"), &status_patch).await);

    // Nothing of the refused writes was stored: the object is as the last accepted write left it, and the
    // resource reads whole, list, table list and watch.
    let now = get(&c, &format!("{NS}/a")).await.ok(200);
    assert_eq!(now["metadata"]["resourceVersion"], rv);
    assert_eq!(now["spec"]["gardener"][0]["data"], nested(60));
    assert_eq!(get(&c, ALL).await.ok(200)["items"].as_array().map(Vec::len), Some(1));
    s.kubectl_ok(&["get", "shootstates", "-A"]);
    let watch = get(&c, &format!("{ALL}?watch=true&timeoutSeconds=1")).await;
    assert_eq!(watch.status, 200, "{}", watch.text());
    assert!(watch.text().contains("\"ADDED\""), "{}", watch.text());
}

/// The fields of the causes, every one of them UnexpectedServerResponse.
fn causes(status: &Value) -> Vec<String> {
    let causes = cause_pairs(status);
    for (reason, _) in &causes {
        assert_eq!(reason, "UnexpectedServerResponse", "{status}");
    }
    causes.into_iter().map(|(_, field)| field).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_object_takes_only_itself_down_and_can_be_removed() {
    if etcd_backend_selected() {
        return; // written straight into the embedded store
    }
    let mut s = tokio::task::spawn_blocking(|| Server::start(&[])).await.expect("start");
    let c = s.client().await;
    for name in ["a", "b"] {
        post(&c, NS, &shoot_state(name, json!({"k": "v"}))).await.ok(201);
    }
    // Two objects no reader can take: bytes that are not JSON, and text nested deeper than the reader allows
    // (what an older build could write).
    let (bad, deep) = (format!("{KEY_PREFIX}bad"), format!("{KEY_PREFIX}deep"));
    let deep_text = serde_json::to_vec(&shoot_state("deep", nested(130))).expect("json");
    let mut s = tokio::task::spawn_blocking(move || {
        s.stop();
        s.write_raw(&bad, b"\x00\x01 not json");
        s.write_raw(&deep, &deep_text);
        s
    })
    .await
    .expect("write");

    // `storage inspect --unreadable` names them, and only them (the server is stopped).
    let out = std::process::Command::new(BIN)
        .args(["storage", "inspect", "--unreadable", "--data-dir"])
        .arg(s.data_dir())
        .output()
        .expect("inspect");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text} {}", String::from_utf8_lossy(&out.stderr));
    let keys: Vec<&str> = text.lines().skip(1).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(keys, [format!("{KEY_PREFIX}bad"), format!("{KEY_PREFIX}deep")], "{text}");
    assert!(text.contains("does not decode as JSON"), "{text}");

    let s = tokio::task::spawn_blocking(move || {
        s.restart();
        s
    })
    .await
    .expect("restart");
    let c = s.client().await;

    // Other objects read as before.
    assert_eq!(get(&c, &format!("{NS}/a")).await.ok(200)["spec"]["gardener"][0]["data"], json!({"k": "v"}));
    // The unreadable one: a 500 naming its key.
    let st = get(&c, &format!("{NS}/bad")).await.status_err(500, "InternalError");
    assert!(st["message"].as_str().unwrap_or_default().contains(&format!("Key: {KEY_PREFIX}bad")), "{st}");
    // Lists (plain, table, with a selector, across namespaces) and watches name every unreadable object.
    for path in [NS.to_string(), ALL.to_string(), format!("{ALL}?labelSelector=x%3Dy")] {
        let st = get(&c, &path).await.status_err(500, "StorageReadError");
        assert_eq!(st["message"], "failed to read one or more shootstates from the storage", "{st}");
        assert_eq!(causes(&st), [format!("{KEY_PREFIX}bad"), format!("{KEY_PREFIX}deep")], "{path}: {st}");
    }
    let table = "application/json;as=Table;v=v1;g=meta.k8s.io";
    get_accept(&c, NS, table).await.status_err(500, "StorageReadError");
    get(&c, &format!("{NS}?watch=true")).await.status_err(500, "StorageReadError");
    // kubectl shows the message.
    let out = s.kubectl(&["get", "shootstates", "-n", "garden-a"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("failed to read one or more shootstates"), "{out:?}");
    // A plain delete cannot read it either.
    delete(&c, &format!("{NS}/bad"), None).await.status_err(500, "InternalError");

    // A watch from the current revision (no initial list) sees the unsafe delete as an ERROR naming the key.
    let labeled = merge_patch(&c, &format!("{NS}/b"), &json!({"metadata": {"labels": {"x": "1"}}})).await.ok(200);
    let rv = labeled["metadata"]["resourceVersion"].as_str().unwrap_or("").to_string();
    let watch = {
        let c = c.clone();
        tokio::spawn(async move { get(&c, &format!("{NS}?watch=true&resourceVersion={rv}&timeoutSeconds=10")).await })
    };
    let unsafe_delete = json!({"kind": "DeleteOptions", "apiVersion": "v1",
        "ignoreStoreReadErrorWithClusterBreakingPotential": true});
    // Not for an object that reads: that one stays (kube-apiserver's 422 and words).
    let st = delete(&c, &format!("{NS}/a"), Some(&unsafe_delete)).await.status_err(422, "Invalid");
    assert_eq!(
        st["message"],
        "shootstates.core.gardener.cloud \"a\" is invalid: ignoreStoreReadErrorWithClusterBreakingPotential: Invalid \
         value: true: is exclusively used to delete corrupt object(s), try again by removing this option"
    );
    get(&c, &format!("{NS}/a")).await.ok(200);
    let done = delete(&c, &format!("{NS}/bad"), Some(&unsafe_delete)).await.ok(200);
    assert_eq!((done["kind"].as_str(), done["status"].as_str()), (Some("Status"), Some("Success")), "{done}");
    assert_eq!(done["details"], json!({"name": "bad", "kind": "ShootState"}), "{done}");
    let events = watch.await.expect("watch");
    let error =
        events.text().lines().map(|l| serde_json::from_str::<Value>(l).expect("event")).find(|e| e["type"] == "ERROR");
    let error = error.unwrap_or_else(|| panic!("no ERROR event: {}", events.text()));
    assert_eq!(error["object"]["reason"], "StorageReadError", "{error}");
    assert_eq!(causes(&error["object"]), [format!("{KEY_PREFIX}bad")]);
    get(&c, &format!("{NS}/bad")).await.status_err(404, "NotFound");

    // The query-parameter form works too, as the README gives it to kubectl; then the resource lists whole again.
    let path = format!("{NS}/deep?ignoreStoreReadErrorWithClusterBreakingPotential=true");
    let (s, out) = tokio::task::spawn_blocking(move || {
        let out = s.kubectl_ok(&["delete", "--raw", &path]);
        (s, out)
    })
    .await
    .expect("kubectl");
    assert!(out.contains("Success"), "{out}");
    let names: Vec<String> = get(&c, ALL).await.ok(200)["items"]
        .as_array()
        .map(|items| items.iter().map(|i| i["metadata"]["name"].as_str().unwrap_or("").to_string()).collect())
        .unwrap_or_default();
    assert_eq!(names, ["a", "b"]);
    assert!(!s.log().contains("panicked"), "{}", s.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_numbers_never_panic_a_request() {
    let s = Server::start(&[]);
    // The 504 of a resourceVersion not reached yet is an answer here, not something to retry.
    let c = s.client_without_retries().await;
    post(&c, NS, &shoot_state("a", json!({}))).await.ok(201);
    // A lifetime that is no int64 is kube-apiserver's 400; the largest int64, past what the clock holds, is a
    // watch without end, not a panic: it answers and streams.
    let st =
        get(&c, &format!("{NS}?watch=true&timeoutSeconds=18446744073709551615")).await.status_err(400, "BadRequest");
    assert_eq!(st["message"], "strconv.ParseInt: parsing \"18446744073709551615\": value out of range");
    let path = format!("{NS}?watch=true&timeoutSeconds=9223372036854775807");
    let req = request(Method::GET, &path, &[], vec![]);
    let resp = tokio::time::timeout(Duration::from_secs(20), c.send(req)).await.expect("answer").expect("send");
    assert_eq!(resp.status().as_u16(), 200, "a watch of no end");
    let mut body = resp.into_body();
    let first = tokio::time::timeout(Duration::from_secs(20), http_body_util::BodyExt::frame(&mut body))
        .await
        .expect("an event")
        .expect("a frame")
        .expect("data");
    let line = String::from_utf8_lossy(first.data_ref().expect("data")).to_string();
    assert!(line.contains("\"ADDED\""), "{line}");
    drop(body);
    for q in [
        "timeoutSeconds=9223372036854775807",
        "timeoutSeconds=-1",
        "limit=18446744073709551615",
        "limit=-9223372036854775808",
        "resourceVersion=18446744073709551615",
        "resourceVersion=99999999999999999999999",
    ] {
        let path = format!("{NS}?watch=true&{q}");
        let req = request(Method::GET, &path, &[], vec![]);
        let resp = tokio::time::timeout(Duration::from_secs(20), c.send(req)).await.expect("answer").expect("send");
        // 504 is a resourceVersion the store has not reached (as kube-apiserver answers it), never a 500.
        assert_ne!(resp.status().as_u16(), 500, "{q}");
        let r = get(&c, &format!("{NS}?{q}")).await;
        assert!(r.status < 500 || r.status == 504, "{q}: {} {}", r.status, r.text());
    }
    // A list at an exact revision the store has not reached is the 504 kube-apiserver gives, not the present.
    let r = get(&c, &format!("{NS}?resourceVersion=9223372036854775807&resourceVersionMatch=Exact")).await;
    // Current is 2: the create in garden-a created the namespace first (standalone, namespaces are provisioned).
    assert_eq!(r.status_err(504, "Timeout")["message"], "Too large resource version: 9223372036854775807, current: 2");
    assert!(!s.log().contains("panicked"), "{}", s.log());
    assert!(s.kubectl(&["get", "--raw", "/readyz"]).status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_where_kube_apiserver_is_strict() {
    let s = Server::start(&[]);
    let c = s.client().await;
    // apiVersion and kind are strings.
    let mut numbered = shoot_state("n", json!({}));
    numbered["apiVersion"] = json!(5);
    let st = post(&c, NS, &numbered).await.status_err(400, "BadRequest");
    // kube-apiserver's words: its decoder reads apiVersion and kind first, and quotes the start of the body.
    let body = serde_json::to_string(&numbered).expect("json");
    assert_eq!(
        st["message"],
        format!(
            "the object provided is unrecognized (must be of type ShootState): couldn't get version/kind; json parse \
             error: json: cannot unmarshal number into Go struct field .apiVersion of type string ({} ...)",
            &body[..30]
        )
    );
    let mut kind = shoot_state("n", json!({}));
    kind["kind"] = json!(true);
    post(&c, NS, &kind).await.status_err(400, "BadRequest");
    // metadata of the wrong type is refused too.
    let mut meta = shoot_state("n", json!({}));
    meta["metadata"] = json!({"name": 5});
    post(&c, NS, &meta).await.status_err(400, "BadRequest");
    get(&c, &format!("{NS}/n")).await.status_err(404, "NotFound");

    // Every dryRun value is checked, for every write: nothing is written.
    let st = call(
        &c,
        Method::POST,
        &format!("{NS}?dryRun=All&dryRun=bogus"),
        &[("content-type", "application/json")],
        serde_json::to_vec(&shoot_state("d", json!({}))).expect("json"),
    )
    .await
    .status_err(422, "Invalid");
    assert_eq!(
        st["message"],
        r#"CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: ["All","bogus"]: supported values: "All""#
    );
    get(&c, &format!("{NS}/d")).await.status_err(404, "NotFound");
    post(&c, NS, &shoot_state("d", json!({}))).await.ok(201);
    let patch = serde_json::to_vec(&json!({"metadata": {"labels": {"a": "b"}}})).expect("json");
    let st = call(
        &c,
        Method::PATCH,
        &format!("{NS}/d?dryRun=x"),
        &[("content-type", "application/merge-patch+json")],
        patch,
    )
    .await
    .status_err(422, "Invalid");
    assert!(st["message"].as_str().unwrap_or_default().starts_with("PatchOptions.meta.k8s.io"), "{st}");
    let body = json!({"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All", "Nope"]});
    let st = delete(&c, &format!("{NS}/d"), Some(&body)).await.status_err(422, "Invalid");
    assert!(st["message"].as_str().unwrap_or_default().starts_with("DeleteOptions.meta.k8s.io"), "{st}");
    assert_eq!(get(&c, &format!("{NS}/d")).await.ok(200)["metadata"]["labels"], Value::Null);

    // includeObject takes None, Object and Metadata only.
    let table = "application/json;as=Table;v=v1;g=meta.k8s.io";
    let st = get_accept(&c, &format!("{NS}?includeObject=bogus"), table).await.status_err(400, "BadRequest");
    assert_eq!(
        st["message"],
        "Unable to convert to Table as requested: includeObject: Invalid value: \"bogus\": must be 'Metadata', \
         'Object', 'None', or empty"
    );
    get_accept(&c, &format!("{NS}?includeObject=Metadata"), table).await.ok(200);

    // Namespace and name path segments name one key: `.`, `..` and `%` are refused, an empty segment is no path.
    for (path, message) in [
        (format!("{ALL}/../x"), None),
        (
            "/apis/core.gardener.cloud/v1beta1/namespaces/../shootstates".to_string(),
            Some("Namespace parameter invalid: \"..\": may not be '..'"),
        ),
        (
            "/apis/core.gardener.cloud/v1beta1/namespaces/./shootstates".to_string(),
            Some("Namespace parameter invalid: \".\": may not be '.'"),
        ),
        (format!("{NS}/.."), Some("Name parameter invalid: \"..\": may not be '..'")),
        (format!("{NS}/a%2Fb"), Some("Name parameter invalid: \"a%2Fb\": may not contain '%'")),
    ] {
        let r = get(&c, &path).await;
        match message {
            Some(m) => assert_eq!(r.status_err(400, "BadRequest")["message"], m, "{path}"),
            None => assert!(r.status == 400 || r.status == 404, "{path}: {}", r.text()),
        }
    }
    get(&c, "/apis/core.gardener.cloud/v1beta1/namespaces//shootstates").await.status_err(404, "NotFound");

    // Every error is a Status, 405 included: the webhooks asked with GET, a fixed path asked with POST.
    for (method, path) in [(Method::GET, "/validate"), (Method::GET, "/mutate"), (Method::POST, "/version")] {
        call(&c, method, path, &[], vec![]).await.status_err(405, "MethodNotAllowed");
    }
    let head = call(&c, Method::HEAD, NS, &[], vec![]).await;
    assert_eq!(head.status, 405);
    assert_eq!(head.header("content-type").as_deref(), Some("application/json"));
}
