//! The limits on requests in flight (`--max-requests-inflight`, `--max-mutating-requests-inflight`), as
//! kube-apiserver's max-in-flight filter sets them: above a limit the request gets the filter's 429 at once, with
//! `Retry-After: 1`, and kubectl retries through it; a LIST takes a seat per 100 objects it returns, so that a
//! second huge LIST is refused while GETs still pass; `system:masters` is never refused; the metrics say so.
//!
//! Seats are held on purpose, as a client holds them: a write whose body is still arriving (curl uploading from a
//! pipe the test has not closed) holds its mutating seat until the test closes the pipe; a LIST that waits for a
//! resourceVersion not yet reached holds its seats until the test writes (or, after 3 s, the server answers 504: the
//! read scenario is then run again).

mod common;
use axum::http::Method;
use common::requests::{call, get, HeldUpload, Resp};
use common::*;
use futures::StreamExt as _;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

const STORAGE_STATES: &str = "/apis/migration.k8s.io/v1alpha1/storagestates";
const ALICE_TOKEN: &str = "alice-token";
const WAIT: Duration = Duration::from_secs(30);

/// A server where alice (a token, not system:masters) may do everything, with these limits.
fn server(read_only: &str, mutating: &str) -> (Server, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, format!("{ALICE_TOKEN},alice,uid-alice,\"devs\"\n")).expect("tokens");
    let s = Server::start(&[
        "--token-auth-file",
        tokens.to_str().expect("utf-8"),
        "--authorization-mode",
        "AlwaysAllow",
        "--max-requests-inflight",
        read_only,
        "--max-mutating-requests-inflight",
        mutating,
    ]);
    // alice's kubeconfig: the admin's cluster, her token.
    let admin = std::fs::read_to_string(s.kubeconfig()).expect("kubeconfig");
    let cluster = admin.split("users:").next().expect("clusters");
    let alice = format!(
        "{cluster}users:\n- name: alice\n  user:\n    token: {ALICE_TOKEN}\ncontexts:\n- name: alice\n  context:\n    cluster: migration-apiserver\n    user: alice\ncurrent-context: alice\n"
    );
    let path = s.cert_dir().join("alice").join("kubeconfig");
    std::fs::create_dir_all(path.parent().expect("dir")).expect("dir");
    std::fs::write(&path, alice).expect("alice's kubeconfig");
    (s, path, dir)
}

/// A client of `kubeconfig` that reports a 429 as it comes.
async fn client_without_retries(kubeconfig: &Path) -> kube::Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let mut cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.expect("config");
    cfg.default_retry = false;
    kube::Client::try_from(cfg).expect("client")
}

/// The StorageState of resource `name` of group example.com, named `<name>.example.com`.
fn storage_state(name: &str) -> Value {
    json!({"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageState",
           "metadata": {"name": format!("{name}.example.com")},
           "spec": {"resource": {"group": "example.com", "resource": name}}})
}

/// `n` StorageStates `s-<i>`, created by the administrator in one kubectl call.
fn create_storage_states(s: &Server, n: usize) {
    let stream: String = (0..n).map(|i| format!("{}\n", storage_state(&format!("s-{i:04}")))).collect();
    s.kubectl_ok_stdin(&["create", "-f", "-"], &stream);
}

/// A sample of the server's /metrics, read by the administrator (never limited): the line starting with `prefix`
/// that carries every one of `labels`.
fn sample(s: &Server, prefix: &str, labels: &[&str]) -> Option<f64> {
    let text = s.kubectl_ok(&["get", "--raw", "/metrics"]);
    let line = text.lines().find(|l| l.starts_with(prefix) && labels.iter().all(|label| l.contains(label)))?;
    line.rsplit(' ').next()?.parse().ok()
}

fn in_flight(s: &Server, kind: &str) -> f64 {
    let label = format!("request_kind=\"{kind}\"");
    sample(s, "apiserver_current_inflight_requests{", &[&label]).unwrap_or(0.0)
}

/// The filter's answer, exactly as kube-apiserver's (Go's http.Error with Retry-After).
fn assert_too_many_requests(r: &Resp) {
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.text(), "Too many requests, please try again later.\n");
    assert_eq!(r.header("content-type").as_deref(), Some("text/plain; charset=utf-8"));
    assert_eq!(r.header("x-content-type-options").as_deref(), Some("nosniff"));
    assert_eq!(r.header("retry-after").as_deref(), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_write_makes_the_next_one_429_and_kubectl_retries_through_it() {
    let (s, alice_kubeconfig, _dir) = server("400", "1");
    let alice = client_without_retries(&alice_kubeconfig).await;
    let admin = s.client_without_retries().await;

    // alice's upload holds the one mutating seat.
    let held = HeldUpload::start(&format!("{}{STORAGE_STATES}", s.url()), &s.cert_dir().join("ca.crt"), ALICE_TOKEN);
    eventually("the upload to hold the mutating seat", WAIT, || (in_flight(&s, "mutating") >= 1.0).then_some(()));

    // Her next write is refused at once; a read and the administrator's write are not.
    let body = serde_json::to_vec(&storage_state("refused")).expect("json");
    let refused = call(&alice, Method::POST, STORAGE_STATES, &[("content-type", "application/json")], body).await;
    assert_too_many_requests(&refused);
    assert_eq!(get(&alice, STORAGE_STATES).await.status, 200, "reads have their own limit");
    let body = serde_json::to_vec(&storage_state("by-admin")).expect("json");
    let by_admin = call(&admin, Method::POST, STORAGE_STATES, &[("content-type", "application/json")], body).await;
    assert_eq!(by_admin.status, 201, "system:masters is not limited: {}", by_admin.text());

    // kubectl as alice meets the 429, waits Retry-After and tries again: once the upload is done, it succeeds.
    let kubectl = {
        let kubeconfig = alice_kubeconfig.clone();
        std::thread::spawn(move || {
            kubectl_with(&kubeconfig, &["create", "-f", "-"], Some(&storage_state("by-kubectl").to_string()))
        })
    };
    let post_429 = ["verb=\"POST\"", "resource=\"storagestates\"", "code=\"429\""];
    eventually("kubectl's create to be refused", WAIT, || {
        (sample(&s, "apiserver_request_total{", &post_429)? >= 2.0).then_some(())
    });
    assert_eq!(held.finish(&storage_state("uploaded")), "201");
    let out = kubectl.join().expect("kubectl");
    assert!(out.status.success(), "kubectl: {}", String::from_utf8_lossy(&out.stderr));
    let names = s.kubectl_ok(&["get", "storagestates", "-o", "name"]);
    for name in ["uploaded", "by-admin", "by-kubectl"] {
        assert!(names.contains(&format!("/{name}.example.com\n")), "{name} in {names}");
    }
    assert!(!names.contains("/refused.example.com\n"), "{names}");

    // Counted as kube-apiserver counts them: the request metric with code 429, and the terminations.
    let terminations = sample(&s, "apiserver_request_terminations_total{", &post_429).expect("terminations");
    assert!(terminations >= 2.0, "{terminations}");
    assert_eq!(sample(&s, "apiserver_request_total{", &post_429), Some(terminations));
}

/// One attempt at the read scenario; None when the held LIST ended (504 after 3 s) before the test released it.
async fn huge_list_held(s: &Server, alice: &kube::Client, admin: &kube::Client) -> Option<()> {
    let rv = get(admin, STORAGE_STATES).await.json()["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .parse::<u64>()
        .expect("a number");
    // alice's LIST of all 300 waits for the next write: it holds 3 of the 5 read seats.
    let waiting = {
        let alice = alice.clone();
        let path = format!("{STORAGE_STATES}?resourceVersion={}&resourceVersionMatch=NotOlderThan", rv + 1);
        tokio::spawn(async move { get(&alice, &path).await })
    };
    let admitted = async {
        while in_flight(s, "readOnly") < 3.0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // The server answers the waiting LIST after 3 s; by then it must have been seen.
    tokio::time::timeout(Duration::from_secs(3), admitted).await.ok()?;

    // A second huge LIST does not fit; a GET and the administrator's LIST do.
    let second = get(alice, STORAGE_STATES).await;
    if waiting.is_finished() {
        return None;
    }
    assert_too_many_requests(&second);
    let one = get(alice, &format!("{STORAGE_STATES}/s-0000.example.com")).await;
    assert_eq!(one.status, 200, "{}", one.text());
    assert_eq!(get(admin, STORAGE_STATES).await.status, 200, "system:masters is not limited");
    let small = get(alice, &format!("{STORAGE_STATES}?limit=50")).await;
    assert_eq!(small.status, 200, "a LIST of 50 takes one seat: {}", small.text());
    if waiting.is_finished() {
        return None;
    }

    // A write releases the waiting LIST, whose answer is then whole.
    let created = common::requests::post(admin, STORAGE_STATES, &storage_state(&format!("release-{rv}"))).await;
    assert_eq!(created.status, 201, "{}", created.text());
    let answer = waiting.await.expect("the waiting LIST");
    if answer.status == 504 {
        return None;
    }
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(answer.json()["items"].as_array().expect("items").len() >= 300);
    Some(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_huge_list_gets_429_while_gets_and_small_lists_pass() {
    let (s, alice_kubeconfig, _dir) = server("5", "200");
    create_storage_states(&s, 300);
    let alice = client_without_retries(&alice_kubeconfig).await;
    let admin = s.client_without_retries().await;
    let mut attempts = 0;
    while huge_list_held(&s, &alice, &admin).await.is_none() {
        attempts += 1;
        assert!(attempts < 5, "the held LIST expired before the test could use it, {attempts} times");
    }
    // Each refusal counted as kube-apiserver counts it.
    let list_429 = ["verb=\"LIST\"", "resource=\"storagestates\"", "code=\"429\""];
    let terminations = sample(&s, "apiserver_request_terminations_total{", &list_429).expect("terminations");
    assert!(terminations >= 1.0, "{terminations}");
    assert_eq!(sample(&s, "apiserver_request_total{", &list_429), Some(terminations));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_are_not_counted_and_zero_means_no_limit() {
    // One read seat, which an open watch does not take: alice's GET passes while her watch is open.
    let (s, alice_kubeconfig, _dir) = server("1", "0");
    create_storage_states(&s, 1);
    let alice = client_without_retries(&alice_kubeconfig).await;
    let gvk = kube::core::GroupVersionKind::gvk("migration.k8s.io", "v1alpha1", "StorageState");
    let resource = kube::core::ApiResource::from_gvk_with_plural(&gvk, "storagestates");
    let api: kube::Api<kube::core::DynamicObject> = kube::Api::all_with(alice.clone(), &resource);
    let mut events = api.watch(&Default::default(), "0").await.expect("watch").boxed();
    let first = tokio::time::timeout(WAIT, futures::StreamExt::next(&mut events)).await.expect("an event in time");
    assert!(matches!(first, Some(Ok(kube::core::WatchEvent::Added(_)))), "{first:?}");
    let one = get(&alice, &format!("{STORAGE_STATES}/s-0000.example.com")).await;
    assert_eq!(one.status, 200, "the open watch holds no seat: {}", one.text());

    // No mutating limit (0): twenty writes at once all pass.
    let writes = (0..20).map(|i| {
        let alice = alice.clone();
        async move { common::requests::post(&alice, STORAGE_STATES, &storage_state(&format!("w-{i}"))).await.status }
    });
    let codes = futures::future::join_all(writes).await;
    assert!(codes.iter().all(|c| *c == 201), "{codes:?}");
    drop(events);
}
