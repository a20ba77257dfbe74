//! Memory stays bounded however large the objects and collections. A LIST without a limit, or a page larger than
//! 2 MiB, is streamed: its answer is written while the objects are read, a few megabytes at a time, so that the
//! server's memory holds a few pages however large the collection (and however slowly the client reads), not the
//! answer. The answer is byte for byte what pages of 10, each answered whole, give, in every form: JSON and Table from
//! the stored bytes; JSON, Table and PartialObjectMetadataList from parsed objects (a label selector, another
//! version); protobuf (Namespaces). On etcd the LIST is served from the watch cache, which holds every object by
//! design: there the bound comes on top of the cache. A watch's initial events, a migration (which lists metadata
//! only), a snapshot and its restore are bounded too.
//!
//! Memory is the server's own account of it (`/proc/<pid>/status`): its peak (VmHWM, reset with
//! `/proc/<pid>/clear_refs` before the LIST) minus its resident size (VmRSS) before.

mod common;
use axum::http::Method;
use common::requests::{call, get_accept};
use common::shootstates::shootstate;
use common::*;
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::json;
use std::time::Duration;

const SHOOTSTATES: &str = "/apis/core.gardener.cloud/v1beta1/shootstates";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// `n` ShootStates in namespace `garden`, each holding `size` bytes of data, created 8 at a time.
async fn create(s: &Server, n: usize, size: usize) {
    let c = s.client().await;
    let codes: Vec<u16> = futures::stream::iter(0..n)
        .map(|i| {
            let c = c.clone();
            // Different in every object, as real certificates and keys are.
            let data = format!("{i:08}").repeat(size / 8);
            let mut body = shootstate("v1beta1", "garden", &format!("s-{i:05}"), json!({"key": data}));
            body["metadata"]["labels"] = json!({"half": if i % 2 == 0 { "yes" } else { "no" }});
            async move {
                let path = "/apis/core.gardener.cloud/v1beta1/namespaces/garden/shootstates";
                let headers = [("content-type", "application/json")];
                call(&c, Method::POST, path, &headers, body.to_string().into_bytes()).await.status
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    assert!(codes.iter().all(|c| *c == 201), "creates: {:?}", codes.iter().filter(|c| **c != 201).collect::<Vec<_>>());
}

/// A `kB` figure of /proc/<pid>/status.
fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status");
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field}"));
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("kB")
}

/// The server's peak RSS from now on: resets VmHWM to the current RSS (`clear_refs` 5); returns that RSS in bytes.
fn reset_peak(pid: u32) -> u64 {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("clear_refs");
    status_kb(pid, "VmRSS:") * 1024
}

/// The LIST of every ShootState as `accept`, its body read `delay` apart per 64 KiB (a slow client) or at once.
async fn list_body(s: &Server, query: &str, accept: &str, delay: Option<Duration>) -> Vec<u8> {
    list_answer(s, &format!("{SHOOTSTATES}{query}"), accept, delay).await.1
}

/// [`list_body`] with whether the answer was streamed: sent without a Content-Length, as it was written.
async fn list_answer(s: &Server, path: &str, accept: &str, delay: Option<Duration>) -> (bool, Vec<u8>) {
    let c = s.client().await;
    let req = common::requests::request(Method::GET, path, &[("accept", accept)], vec![]);
    let resp = c.send(req).await.expect("LIST");
    assert_eq!(resp.status(), 200);
    let streamed = resp.headers().get("content-length").is_none();
    let mut body = resp.into_body();
    let mut out = Vec::new();
    let mut unread = 0;
    while let Some(frame) = body.frame().await {
        let data = frame.expect("the answer").into_data().unwrap_or_default();
        unread += data.len();
        out.extend_from_slice(&data);
        if let Some(d) = delay.filter(|_| unread >= 64 * 1024) {
            unread = 0;
            tokio::time::sleep(d).await;
        }
    }
    (streamed, out)
}

/// The resourceVersion of the list at `path` now.
async fn revision(s: &Server, path: &str) -> String {
    let list = get_accept(&s.client().await, &format!("{path}?limit=1"), "application/json").await.json();
    list["metadata"]["resourceVersion"].as_str().expect("resourceVersion").to_string()
}

/// `answer` with a Table's Age cells emptied: they are written when the answer is, so two answers a second apart
/// differ there ("9s" and "10s") and nowhere else. Other answers are left as they are.
fn without_ages(answer: &[u8]) -> Vec<u8> {
    // A protobuf answer has no Table.
    let Ok(text) = std::str::from_utf8(answer) else { return answer.to_vec() };
    let list: serde_json::Value = serde_json::from_str(text).expect("JSON");
    let Some(columns) = list["columnDefinitions"].as_array() else { return answer.to_vec() };
    let age = columns.iter().position(|c| c["name"] == "Age").expect("an Age column");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    // Each row's cells are written as `"cells":[...]`; the Age cell is the `age`-th, a quoted duration.
    while let Some(at) = rest.find("\"cells\":[") {
        let (head, tail) = rest.split_at(at + "\"cells\":[".len());
        out.push_str(head);
        let end = tail.find(']').expect("the cells' end");
        let mut cells: Vec<&str> = tail[..end].split(',').collect();
        cells[age] = "\"\"";
        out.push_str(&cells.join(","));
        rest = &tail[end..];
    }
    out.push_str(rest);
    out.into_bytes()
}

/// A page of a JSON list (or Table), its items as they were written.
#[derive(serde::Deserialize)]
struct Page<'a> {
    #[serde(borrow, default)]
    items: Vec<&'a serde_json::value::RawValue>,
    #[serde(borrow, default)]
    rows: Vec<&'a serde_json::value::RawValue>,
    metadata: PageMeta,
}

#[derive(serde::Deserialize)]
struct PageMeta {
    #[serde(rename = "continue", default)]
    continue_token: String,
}

/// The items of the list at `path` as `accept` at `rv`, read in pages of 10, each small enough to be answered
/// whole (not streamed): each item's bytes as its page wrote them.
async fn paged_items(s: &Server, path: &str, query: &str, accept: &str, rv: &str) -> Vec<Vec<u8>> {
    let mut next = format!("{path}?limit=10&resourceVersion={rv}&resourceVersionMatch=Exact{query}");
    let mut items = Vec::new();
    loop {
        let (streamed, body) = list_answer(s, &next, accept, None).await;
        assert!(!streamed, "{next}: a page of 10 was streamed");
        let page: Page = serde_json::from_slice(&body).expect("a page of JSON");
        items.extend(page.items.iter().chain(&page.rows).map(|i| i.get().as_bytes().to_vec()));
        if page.metadata.continue_token.is_empty() {
            return items;
        }
        let token = page.metadata.continue_token.replace('+', "%2B").replace('/', "%2F").replace('=', "%3D");
        next = format!("{path}?limit=10&continue={token}{query}");
    }
}

/// The streamed answer of `path` as `accept` (more than its first page and the 2 MiB read whole) is, byte for byte
/// (a Table's Age cells aside), its head (apiVersion, kind, the list's metadata at `rv`) and the items that small
/// pages, each answered whole, give; and so is the page of a limit above the count, now streamed too.
async fn assert_streamed_as_single_page(s: &Server, path: &str, query: &str, accept: &str, rv: &str) -> Vec<u8> {
    let exact = format!("{path}?resourceVersion={rv}&resourceVersionMatch=Exact{query}");
    let (was_streamed, streamed) = list_answer(s, &exact, accept, None).await;
    assert!(was_streamed, "{accept} {query}: the LIST without a limit was not streamed");
    let list: serde_json::Value = serde_json::from_slice(&streamed).expect("JSON");
    assert_eq!(list["metadata"], json!({"resourceVersion": rv}), "{accept} {query}");
    let array = if list.get("rows").is_some() { "\"rows\":[" } else { "\"items\":[" };
    let head_len = streamed.windows(array.len()).position(|w| w == array.as_bytes()).expect("the items") + array.len();
    let mut expected = streamed[..head_len].to_vec();
    expected.extend_from_slice(&paged_items(s, path, query, accept, rv).await.join(&b','));
    expected.extend_from_slice(b"]}");
    let (was_streamed, whole) = list_answer(s, &format!("{exact}&limit=100000"), accept, None).await;
    assert!(was_streamed, "{accept} {query}: the page of all was not streamed");
    for (what, answer) in [("without a limit", &streamed), ("with a limit above the count", &whole)] {
        assert!(
            without_ages(answer) == without_ages(&expected),
            "{accept} {query}: the answer {what} differs from the pages' ({} and {} bytes)",
            answer.len(),
            expected.len()
        );
    }
    streamed
}

/// Every form of a list answer, from the stored bytes (JSON, Table) and from parsed objects (a label selector, which
/// here keeps half; another version, converted; PartialObjectMetadata).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_is_the_single_page_answer_byte_for_byte() {
    let s = Server::start(&["--disable-scheduler"]);
    create(&s, 300, 16 * 1024).await;
    let rv = revision(&s, SHOOTSTATES).await;
    const METADATA: &str = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io";
    let half = "&labelSelector=half%3Dyes";
    let v1alpha1 = "/apis/core.gardener.cloud/v1alpha1/shootstates";
    let forms = [
        (SHOOTSTATES, "", "application/json", "items", 300),
        (SHOOTSTATES, "", TABLE, "rows", 300),
        (SHOOTSTATES, half, "application/json", "items", 150),
        (SHOOTSTATES, half, TABLE, "rows", 150),
        (SHOOTSTATES, "", METADATA, "items", 300),
        (v1alpha1, "", "application/json", "items", 300),
    ];
    for (path, query, accept, array, count) in forms {
        let streamed = assert_streamed_as_single_page(&s, path, query, accept, &rv).await;
        let list: serde_json::Value = serde_json::from_slice(&streamed).expect("JSON");
        assert_eq!(list[array].as_array().expect("items").len(), count, "{path} {query} {accept}");
    }
    // A page of 250 (4 MiB, streamed): its continue token and remainingItemCount, written before its objects, are
    // those of a page read whole, and the next page holds the rest.
    let names = |list: &serde_json::Value| -> Vec<String> {
        list["items"].as_array().expect("items").iter().map(|o| o["metadata"]["name"].to_string()).collect()
    };
    let page_of = |body: Vec<u8>| serde_json::from_slice::<serde_json::Value>(&body).expect("JSON");
    let exact = format!("{SHOOTSTATES}?resourceVersion={rv}&resourceVersionMatch=Exact");
    let (was_streamed, first) = list_answer(&s, &format!("{exact}&limit=250"), "application/json", None).await;
    assert!(was_streamed, "the page of 250 was not streamed");
    let first = page_of(first);
    assert_eq!(first["metadata"]["remainingItemCount"], 50);
    let token = first["metadata"]["continue"].as_str().expect("a continue token").replace('=', "%3D");
    let (_, rest) =
        list_answer(&s, &format!("{SHOOTSTATES}?limit=250&continue={token}"), "application/json", None).await;
    let rest = page_of(rest);
    assert_eq!(rest["metadata"].get("continue"), None, "{}", rest["metadata"]);
    let whole = page_of(list_answer(&s, &exact, "application/json", None).await.1);
    assert_eq!([names(&first), names(&rest)].concat(), names(&whole));
}

/// In protobuf (served for the core Namespace): the envelope gives the list's length first, and the streamed
/// answer (without a limit, or with one above the count) is byte for byte the list of the items that pages of 10,
/// each answered whole, give, in the envelope kube-apiserver writes (built here with k8s-pb's upstream messages).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_protobuf_answer_is_the_single_page_answer_byte_for_byte() {
    use k8s_pb::api::core::v1::NamespaceList;
    use k8s_pb::apimachinery::pkg::apis::meta::v1::ListMeta;
    use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
    use prost::Message;
    let s = Server::start(&["--disable-scheduler"]);
    let c = s.client().await;
    let codes: Vec<u16> = futures::stream::iter(0..300)
        .map(|i| {
            let c = c.clone();
            // 16 KiB of annotations each: 300 of them are more than the 2 MiB read whole.
            let body = json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": format!("ns-{i:03}"), "annotations": {"note": format!("{i:08}").repeat(2048)}}});
            async move {
                let headers = [("content-type", "application/json")];
                call(&c, Method::POST, "/api/v1/namespaces", &headers, body.to_string().into_bytes()).await.status
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    assert!(codes.iter().all(|c| *c == 201), "creates: {codes:?}");
    let rv = revision(&s, "/api/v1/namespaces").await;
    const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
    let list_of = |body: &[u8]| {
        let body = body.strip_prefix(b"k8s\0").expect("the magic");
        let unknown = Unknown::decode(body).expect("runtime.Unknown");
        NamespaceList::decode(unknown.raw.unwrap_or_default().as_slice()).expect("NamespaceList")
    };
    // The oracle: the items of pages of 10, each answered whole, in the envelope kube-apiserver writes.
    let (mut items, mut next) =
        (Vec::new(), format!("/api/v1/namespaces?limit=10&resourceVersion={rv}&resourceVersionMatch=Exact"));
    loop {
        let (streamed, body) = list_answer(&s, &next, PROTOBUF, None).await;
        assert!(!streamed, "{next}: a page of 10 was streamed");
        let page = list_of(&body);
        items.extend(page.items);
        match page.metadata.and_then(|m| m.r#continue).filter(|t| !t.is_empty()) {
            Some(token) => next = format!("/api/v1/namespaces?limit=10&continue={}", token.replace('=', "%3D")),
            None => break,
        }
    }
    // Go's generated code writes a ListMeta's string fields even when empty: selfLink and continue too.
    let meta = ListMeta {
        self_link: Some(String::new()),
        resource_version: Some(rv.clone()),
        r#continue: Some(String::new()),
        remaining_item_count: None,
    };
    let list = NamespaceList { metadata: Some(meta), items };
    let unknown = Unknown {
        type_meta: Some(TypeMeta { api_version: Some("v1".into()), kind: Some("NamespaceList".into()) }),
        raw: Some(list.encode_to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    };
    let expected = [b"k8s\0".to_vec(), unknown.encode_to_vec()].concat();
    let exact = format!("/api/v1/namespaces?resourceVersion={rv}&resourceVersionMatch=Exact");
    for query in ["", "&limit=100000"] {
        let (streamed, answer) = list_answer(&s, &format!("{exact}{query}"), PROTOBUF, None).await;
        assert!(streamed, "{query}: not streamed");
        assert!(answer == expected, "{query}: {} bytes, the pages' {} bytes", answer.len(), expected.len());
    }
    let ours = list
        .items
        .iter()
        .filter(|n| n.metadata.as_ref().and_then(|m| m.name.as_deref()).is_some_and(|n| n.starts_with("ns-")));
    assert_eq!(ours.count(), 300);
}

/// The bound: a LIST whose answer is over 4x what the server may hold for it (a quarter of the answer) raises the
/// server's peak RSS by less than that quarter, fast client or slow. The Table holds the objects too
/// (`includeObject=Object`), so that its answer is as large; so does the JSON of objects a label selector matched.
async fn assert_bounded(s: &Server, objects: usize, delay: Option<Duration>) {
    let pid = s.pid().expect("pid");
    // A label selector that every object matches: the objects are parsed, then written.
    let selected = "?labelSelector=half%20in%20(yes%2Cno)";
    // A page of all but a few objects: its continue token comes first, its objects after.
    let forms = [
        ("application/json", ""),
        (TABLE, "?includeObject=Object"),
        ("application/json", selected),
        ("application/json", "?limit=1000"),
    ];
    for (accept, query) in forms {
        let before = reset_peak(pid);
        let body = list_body(s, query, accept, delay).await;
        let peak = status_kb(pid, "VmHWM:") * 1024;
        let grown = peak.saturating_sub(before);
        eprintln!(
            "{accept}{query}: {objects} objects, an answer of {} MiB: peak RSS +{} MiB",
            body.len() >> 20,
            grown >> 20
        );
        assert!(
            grown < body.len() as u64 / 4,
            "{accept}: the peak RSS grew by {grown} bytes for an answer of {} bytes",
            body.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpaginated_list_holds_a_few_pages_not_the_answer() {
    let s = Server::start(&["--disable-scheduler", "--storage-cache-size", "16Mi"]);
    create(&s, 1200, 100 * 1024).await;
    assert_bounded(&s, 1200, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_slowly_holds_no_more() {
    let s = Server::start(&["--disable-scheduler", "--storage-cache-size", "16Mi"]);
    create(&s, 1200, 100 * 1024).await;
    assert_bounded(&s, 1200, Some(Duration::from_millis(2))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_the_list_from_the_watch_cache_adds_the_same_bound() {
    let etcd = common::etcd::Etcd::start();
    let s = Server::start_on_etcd(&etcd, &["--disable-scheduler"]);
    create(&s, 1200, 100 * 1024).await;
    assert_bounded(&s, 1200, None).await;
}

/// A watch with `sendInitialEvents=true` reads its initial events as the streamed LIST does: the server's peak grows
/// by less than a quarter of what it sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_sends_its_initial_events_without_holding_them_all() {
    // The events a watch holds ready for its client are parsed objects, so its bound is larger than a LIST's: a
    // larger collection keeps the answer over 4x of it.
    let s = Server::start(&["--disable-scheduler", "--storage-cache-size", "16Mi"]);
    create(&s, 1600, 100 * 1024).await;
    let pid = s.pid().expect("pid");
    let before = reset_peak(pid);
    let c = s.client().await;
    let query = "?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan";
    let req = common::requests::request(Method::GET, &format!("{SHOOTSTATES}{query}"), &[], vec![]);
    let resp = c.send(req).await.expect("watch");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let (mut sent, mut line, mut added) = (0usize, Vec::new(), 0);
    'events: while let Some(frame) = body.frame().await {
        let data = frame.expect("the watch").into_data().unwrap_or_default();
        sent += data.len();
        for b in data {
            if b != b'\n' {
                line.push(b);
                continue;
            }
            let event: serde_json::Value = serde_json::from_slice(&line).expect("an event");
            line.clear();
            match event["type"].as_str() {
                Some("ADDED") => added += 1,
                Some("BOOKMARK") => break 'events,
                other => panic!("{other:?}: {event}"),
            }
        }
    }
    assert_eq!(added, 1600);
    let grown = (status_kb(pid, "VmHWM:") * 1024).saturating_sub(before);
    eprintln!("initial events: {} MiB sent, peak RSS +{} MiB", sent >> 20, grown >> 20);
    assert!(grown < sent as u64 / 4, "the peak RSS grew by {grown} bytes for {sent} bytes of initial events");
}

/// Every ShootState's name and resourceVersion.
async fn versions(s: &Server) -> std::collections::BTreeMap<String, String> {
    const METADATA: &str = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io";
    let list: serde_json::Value = serde_json::from_slice(&list_body(s, "", METADATA, None).await).expect("JSON");
    let items = list["items"].as_array().expect("items").iter();
    items.map(|o| (o["metadata"]["name"].to_string(), o["metadata"]["resourceVersion"].to_string())).collect()
}

/// The server's peak RSS growth while `work` runs.
async fn peak_growth(s: &Server, work: impl std::future::Future<Output = ()>) -> u64 {
    let pid = s.pid().expect("pid");
    let before = reset_peak(pid);
    work.await;
    (status_kb(pid, "VmHWM:") * 1024).saturating_sub(before)
}

/// The migrator lists the objects' metadata only (a PartialObjectMetadataList, in chunks of at most about 4 MiB), not
/// chunks of 500 whole objects: migrating 1200 ShootStates of 100 KiB raises the peak RSS of the standalone server,
/// which migrates its own objects, by less than a quarter of them (it was twice their size), and the same no-op
/// writes by a client (16 at once, as the migrator writes) by less than an eighth. The objects are already in the
/// storage version and key, so that neither rewrites them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_of_large_objects_holds_their_metadata_not_their_data() {
    let args = [
        "--storage-cache-size",
        "4Mi",
        "--watch-history-bytes",
        "8Mi",
        "--migration-adaptive=false",
        "--migration-qps",
        "0",
    ];
    let (migrated, written) = (Server::start(&args), Server::start(&args));
    create(&migrated, 1200, 100 * 1024).await;
    create(&written, 1200, 100 * 1024).await;
    let stored = list_body(&migrated, "", "application/json", None).await.len() as u64;

    let rvs = versions(&written).await;
    let c = written.client().await;
    let by_client = peak_growth(&written, async {
        let codes: Vec<u16> = futures::stream::iter(rvs.iter())
            .map(|(name, rv)| {
                let c = c.clone();
                let path = format!(
                    "/apis/core.gardener.cloud/v1beta1/namespaces/garden/shootstates/{}?fieldManager=test",
                    name.trim_matches('"')
                );
                let body = format!(r#"{{"metadata":{{"resourceVersion":{rv}}}}}"#).into_bytes();
                async move {
                    let headers = [("content-type", "application/merge-patch+json")];
                    call(&c, Method::PATCH, &path, &headers, body).await.status
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
        assert!(codes.iter().all(|c| *c == 200), "no-op writes: {codes:?}");
    })
    .await;

    let by_migration = peak_growth(&migrated, async {
        let name = common::request_shootstate_migration(&migrated);
        eventually("the migration to succeed", Duration::from_secs(120), || {
            let m = migrated.kubectl_json(&["get", "storageversionmigrations.migration.k8s.io", &name, "-o", "json"]);
            let conditions = m["status"]["conditions"].as_array().cloned().unwrap_or_default();
            conditions.iter().any(|c| c["type"] == "Succeeded" && c["status"] == "True").then_some(())
        });
    })
    .await;
    eprintln!(
        "{} MiB of ShootStates: peak RSS +{} MiB migrated, +{} MiB written by a client",
        stored >> 20,
        by_migration >> 20,
        by_client >> 20
    );
    assert!(by_client < stored / 8, "the peak RSS grew by {by_client} bytes for a client's no-op writes");
    assert!(by_migration < stored / 4, "the peak RSS grew by {by_migration} bytes migrating {stored} bytes of objects");
}

/// A snapshot of the store, taken while serving, writes one object at a time (through a buffer of 1 MiB): the
/// server's peak RSS grows by less than a quarter of the objects. Its restore (offline, `storage snapshot restore`)
/// writes them in one transaction whose pages the store flushes as they fill: its peak RSS stays under a quarter of
/// them above what it has restoring an empty store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_and_its_restore_hold_a_few_objects_not_the_store() {
    let mut s = Server::start(&["--disable-scheduler", "--storage-cache-size", "4Mi"]);
    create(&s, 1200, 100 * 1024).await;
    let stored = list_body(&s, "", "application/json", None).await.len() as u64;
    let mut snapshot = None;
    let grown = peak_growth(&s, async {
        let out = s.kubectl_ok(&["create", "--raw", "/storage/snapshots", "-f", "/dev/null"]);
        snapshot = Some(serde_json::from_str::<serde_json::Value>(&out).expect("the snapshot's JSON"));
    })
    .await;
    let name = snapshot.expect("a snapshot")["name"].as_str().expect("name").to_string();
    eprintln!("a snapshot of {} MiB of ShootStates: peak RSS +{} MiB", stored >> 20, grown >> 20);
    assert!(grown < stored / 4, "the peak RSS grew by {grown} bytes taking a snapshot of {stored} bytes");
    s.stop();

    let file = s.data_dir().join("snapshots").join(&name);
    let restored = s.dir.join("restored");
    let full = restore_peak_rss(&file, &restored);
    // The same restore of an empty store: what the process costs without objects.
    let empty = Server::start(&["--disable-scheduler"]);
    let out = empty.kubectl_ok(&["create", "--raw", "/storage/snapshots", "-f", "/dev/null"]);
    let name =
        serde_json::from_str::<serde_json::Value>(&out).expect("JSON")["name"].as_str().expect("name").to_string();
    let base = restore_peak_rss(&empty.data_dir().join("snapshots").join(name), &empty.dir.join("restored"));
    eprintln!("restoring it: peak RSS {} MiB, an empty store's {} MiB", full >> 20, base >> 20);
    assert!(full < base + stored / 4, "restoring {stored} bytes peaked at {full} bytes, an empty store at {base}");
}

/// The peak RSS (bytes) of `storage snapshot restore <file> --data-dir <dir>`, from the kernel's account of the
/// child (wait4's ru_maxrss).
#[allow(clippy::zombie_processes)] // reaped by wait4, which std's wait() cannot replace: it gives no rusage
fn restore_peak_rss(file: &std::path::Path, dir: &std::path::Path) -> u64 {
    let child = std::process::Command::new(BIN)
        .args(["storage", "snapshot", "restore"])
        .arg(file)
        .arg("--data-dir")
        .arg(dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("storage snapshot restore");
    let (mut status, mut usage) = (0, unsafe { std::mem::zeroed::<libc::rusage>() });
    // SAFETY: waits for our own child, with pointers to locals that outlive the call.
    let waited = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    assert_eq!(waited, child.id() as libc::pid_t, "wait4");
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the restore failed: {status}");
    usage.ru_maxrss as u64 * 1024
}

/// A memory cgroup of the server's own, made under the test's (cgroup v2's `memory.max`, or v1's
/// `memory.limit_in_bytes`), when this machine lets the tests make one. The server goes back to the test's cgroup,
/// and the cgroup is removed, when it is dropped.
struct MemoryCgroup {
    dir: std::path::PathBuf,
    parent: std::path::PathBuf,
    pid: u32,
}

impl MemoryCgroup {
    /// `pid` in a new cgroup limited to `limit` bytes; None where cgroups cannot be made or written here.
    fn limit(pid: u32, limit: u64) -> Option<MemoryCgroup> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        // v2: "0::/path" with the memory controller; v1: "N:memory:/path".
        let (parent, limit_file) = match own.lines().find_map(|l| l.strip_prefix("0::")) {
            Some(path)
                if std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").is_ok_and(|c| c.contains("memory")) =>
            {
                (std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')), "memory.max")
            }
            _ => {
                let path = own.lines().find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()))?;
                (
                    std::path::Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')),
                    "memory.limit_in_bytes",
                )
            }
        };
        let dir = parent.join(format!("memory-bounds-{pid}"));
        std::fs::create_dir(&dir).ok()?;
        let cgroup = MemoryCgroup { dir, parent, pid };
        let written = std::fs::write(cgroup.dir.join(limit_file), limit.to_string())
            .and_then(|()| std::fs::write(cgroup.dir.join("cgroup.procs"), pid.to_string()));
        written.ok().map(|()| cgroup)
    }

    /// Whether the kernel killed a process of the cgroup for memory (v2's memory.events, v1's memory.oom_control).
    fn oom_killed(&self) -> bool {
        let events = std::fs::read_to_string(self.dir.join("memory.events"))
            .or_else(|_| std::fs::read_to_string(self.dir.join("memory.oom_control")))
            .unwrap_or_default();
        events.lines().any(|l| l.strip_prefix("oom_kill ").is_some_and(|n| n.trim() != "0"))
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.parent.join("cgroup.procs"), self.pid.to_string());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Under a memory limit below the answer's size (where this machine lets the test set one), the unpaginated LIST
/// completes, as JSON and as a Table, and the server is not killed: it never holds the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpaginated_list_completes_under_a_memory_limit_below_its_size() {
    let mut s = Server::start(&["--disable-scheduler", "--storage-cache-size", "16Mi"]);
    create(&s, 1200, 100 * 1024).await;
    // Started again, so that the limit is about the LIST, not about what the creates left behind.
    s.restart();
    let pid = s.pid().expect("pid");
    let limit = 96 << 20;
    let Some(cgroup) = MemoryCgroup::limit(pid, limit) else {
        eprintln!("no memory cgroup can be made here: the limit is not tested");
        return;
    };
    for (accept, array) in [("application/json", "items"), (TABLE, "rows")] {
        let body = list_body(&s, "?includeObject=Object", accept, None).await;
        assert!(body.len() as u64 > limit, "{accept}: an answer of {} bytes is not above the limit", body.len());
        let list: serde_json::Value = serde_json::from_slice(&body).expect("the whole answer");
        assert_eq!(list[array].as_array().expect("items").len(), 1200, "{accept}");
        eprintln!("{accept}: an answer of {} MiB under a limit of {} MiB", body.len() >> 20, limit >> 20);
    }
    assert!(!cgroup.oom_killed(), "the kernel killed the server for memory");
    assert_eq!(s.pid(), Some(pid));
    assert!(std::path::Path::new(&format!("/proc/{pid}")).exists(), "the server is gone");
}
