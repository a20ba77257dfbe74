//! The etcd backend's watch cache against a real etcd: consistent reads across replicas (a read on one replica
//! after a write acknowledged by another sees it), reads after writes elsewhere in etcd (the progress-request
//! path), reads answered by the cache (its `storage_cache_reads_total` metric), and reads while the cache is not
//! ready (before it is filled, while it is rebuilt after etcd compacted past its watch) answered by etcd.

mod common;
use common::etcd::Etcd;
use common::objects::{item_names, rv, svm_api, svm_object as svm};
use common::*;

use kube::api::{DeleteParams, ListParams, PostParams, ResourceExt};
use migration_apiserver::storage::etcd::{EtcdOptions, EtcdStorage};
use migration_apiserver::storage::{HistoryLimit, KeyValue, ListOptions, Storage, StorageError, WatchItem};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Storage reads a server answered from its watch cache and from etcd (`storage_cache_reads_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Reads {
    cache: u64,
    etcd: u64,
}

async fn reads(c: &kube::Client) -> Reads {
    let req = http::Request::get("/metrics").body(Vec::new()).expect("request");
    let text = c.request_text(req).await.expect("/metrics");
    let sum = |source: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with("storage_cache_reads_total{") && l.contains(&format!("source=\"{source}\"")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    assert!(text.contains("storage_cache_reads_total{"), "the etcd backend counts its reads: {text}");
    Reads { cache: sum("cache"), etcd: sum("etcd") }
}

/// Polls (deadline) until the server answers a GET from its watch cache (filled after start, in the background).
async fn wait_cache_serving(c: &kube::Client) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let before = reads(c).await;
        let _ = svm_api(c).get_opt("probe-the-cache").await.expect("get");
        if reads(c).await.cache > before.cache {
            return;
        }
        assert!(Instant::now() < deadline, "the watch cache never answered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_read_on_one_replica_sees_writes_acknowledged_by_another() {
    let etcd = Etcd::start();
    let a = Server::start_on_etcd(&etcd, &[]);
    let b = Server::start_on_etcd(&etcd, &[]);
    let (ca, cb) = (a.client().await, b.client().await);
    wait_cache_serving(&ca).await;
    wait_cache_serving(&cb).await;
    let before = (reads(&ca).await, reads(&cb).await);
    let pp = PostParams::default();
    for i in 0..40 {
        // Writes alternate between the replicas; the other one reads right after the acknowledgement.
        let (writer, reader) = if i % 2 == 0 { (&ca, &cb) } else { (&cb, &ca) };
        let name = format!("rw-{i}");
        let made = svm_api(writer).create(&pp, &svm(&name)).await.expect("create");
        let got =
            svm_api(reader).get(&name).await.unwrap_or_else(|e| panic!("round {i}: created object not read: {e}"));
        assert_eq!(rv(&got), rv(&made), "round {i}");
        let list = svm_api(reader).list(&ListParams::default()).await.expect("list");
        assert!(item_names(&list).contains(&name), "round {i}: {:?}", item_names(&list));
        assert!(rv(&list) >= rv(&made), "round {i}: list at {} before the write at {}", rv(&list), rv(&made));
        // An update: the reader gets its resourceVersion and content at once.
        let mut changed = made.clone();
        changed.labels_mut().insert("round".into(), i.to_string());
        let updated = svm_api(writer).replace(&name, &pp, &changed).await.expect("update");
        let got = svm_api(reader).get(&name).await.expect("get");
        assert_eq!((rv(&got), got.labels().get("round")), (rv(&updated), Some(&i.to_string())), "round {i}");
        // A delete of the previous round's object (made by the reader): gone at once for the reader.
        if i > 0 {
            let gone = format!("rw-{}", i - 1);
            svm_api(writer).delete(&gone, &DeleteParams::default()).await.expect("delete");
            assert!(svm_api(reader).get_opt(&gone).await.expect("get").is_none(), "round {i}: {gone} still read");
            let list = svm_api(reader).list(&ListParams::default()).await.expect("list");
            assert!(!item_names(&list).contains(&gone), "round {i}: {gone} still listed");
        }
    }
    // Those reads were the watch caches' (each replica made at least 20 rounds of reads).
    let after = (reads(&ca).await, reads(&cb).await);
    for (name, b, a) in [("A", before.0, after.0), ("B", before.1, after.1)] {
        eprintln!("replica {name}: {b:?} -> {a:?}");
        assert!(a.cache - b.cache >= 80, "replica {name}: {b:?} -> {a:?}");
    }
}

/// etcd 3.4.31+ and 3.5.13+ send a requested progress notification only after the events queued before it.
fn orders_progress(version: &str) -> bool {
    let v: Vec<u64> = version.split('.').filter_map(|p| p.parse().ok()).collect();
    matches!(v[..], [3, 4, p, ..] if p >= 31)
        || matches!(v[..], [3, 5, p, ..] if p >= 13)
        || matches!(v[..], [3, m, ..] if m >= 6)
        || matches!(v[..], [m, ..] if m > 3)
}

#[tokio::test]
async fn writes_elsewhere_in_etcd_do_not_hold_reads_back() {
    let etcd = Etcd::start();
    let a = Server::start_on_etcd(&etcd, &[]);
    let b = Server::start_on_etcd(&etcd, &[]);
    let (ca, cb) = (a.client().await, b.client().await);
    wait_cache_serving(&cb).await;
    let mut ec = etcd.client().await;
    let etcd_version = ec.status().await.expect("etcd status").version().to_string();
    let ordered = orders_progress(&etcd_version);
    let pp = PostParams::default();
    for i in 0..10 {
        // A write outside the prefix moves etcd's revision and brings the watch caches no event: a consistent read
        // on B must learn from etcd that nothing of ours is pending (a requested progress notification), at
        // once, from the cache: not after the 3 s bound, and not by falling back to etcd.
        let put = ec.put(format!("/elsewhere/{i}"), "x", None).await.expect("put elsewhere");
        let moved = put.header().expect("header").revision() as u64;
        let before = reads(&cb).await;
        let t = Instant::now();
        let list = svm_api(&cb).list(&ListParams::default()).await.expect("list");
        let took = t.elapsed();
        let after = reads(&cb).await;
        assert!(rv(&list) >= moved, "round {i}: list at {}, etcd at {moved}", rv(&list));
        assert!(took < Duration::from_millis(1500), "round {i}: the read waited {took:?}");
        // Where etcd orders requested progress notifications after queued events, the cache answers; an older
        // etcd's cannot be trusted (etcd-io/etcd#15220), and the read goes to etcd at once.
        let expected = if ordered { (1, 0) } else { (0, 1) };
        assert_eq!((after.cache - before.cache, after.etcd - before.etcd), expected, "round {i}: {etcd_version}");
        // Another write elsewhere, then one through A: B reads A's write at once.
        ec.put(format!("/elsewhere/{i}"), "y", None).await.expect("put elsewhere");
        let made = svm_api(&ca).create(&pp, &svm(&format!("after-elsewhere-{i}"))).await.expect("create on A");
        let t = Instant::now();
        let got = svm_api(&cb).get(&made.name_any()).await.expect("B reads A's write");
        assert_eq!(rv(&got), rv(&made));
        assert!(t.elapsed() < Duration::from_millis(1500), "round {i}: the read waited {:?}", t.elapsed());
    }
}

#[tokio::test]
async fn the_watch_cache_answers_gets_lists_and_continue_pages() {
    let etcd = Etcd::start();
    let s = Server::start_on_etcd(&etcd, &[]);
    let c = s.client().await;
    let api = svm_api(&c);
    for i in 0..5 {
        api.create(&PostParams::default(), &svm(&format!("m-{i}"))).await.expect("create");
    }
    wait_cache_serving(&c).await;
    let before = reads(&c).await;
    for i in 0..10 {
        api.get(&format!("m-{}", i % 5)).await.expect("get");
    }
    for _ in 0..5 {
        assert_eq!(api.list(&ListParams::default()).await.expect("list").items.len(), 5);
    }
    // A chunked list: every page from the cache while nothing is written (the cache is at the first page's
    // revision), with the remaining count.
    let first = api.list(&ListParams::default().limit(2)).await.expect("page");
    assert_eq!(first.metadata.remaining_item_count, Some(3));
    let mut seen = item_names(&first);
    let mut token = first.metadata.continue_.clone();
    while let Some(t) = token {
        let page = api.list(&ListParams::default().limit(2).continue_token(&t)).await.expect("page");
        assert_eq!(rv(&page), rv(&first), "pages at the first page's revision");
        seen.extend(item_names(&page));
        token = page.metadata.continue_.clone();
    }
    assert_eq!(seen, (0..5).map(|i| format!("m-{i}")).collect::<Vec<_>>());
    let after = reads(&c).await;
    assert_eq!((after.cache - before.cache, after.etcd - before.etcd), (10 + 5 + 3, 0), "{before:?} -> {after:?}");

    // A write between pages: the continuation reads etcd at the first page's revision (a consistent snapshot
    // without the new object).
    let first = api.list(&ListParams::default().limit(3)).await.expect("page");
    api.create(&PostParams::default(), &svm("m-late")).await.expect("create");
    // The cache has seen the write (a resourceVersion=0 list is served from it, however far behind it is): the
    // acknowledgement of the create comes from etcd, and the cache's watch may not have delivered it yet.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !item_names(&api.list(&ListParams::default().match_any()).await.expect("list")).contains(&"m-late".into()) {
        assert!(Instant::now() < deadline, "the watch cache never saw m-late");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let before = reads(&c).await;
    let t = first.metadata.continue_.clone().expect("continue");
    let rest = api.list(&ListParams::default().limit(10).continue_token(&t)).await.expect("rest");
    assert_eq!(item_names(&rest), ["m-3", "m-4"]);
    assert_eq!(rv(&rest), rv(&first));
    assert_eq!(reads(&c).await.etcd - before.etcd, 1, "an older revision is etcd's to serve");
    assert!(item_names(&api.list(&ListParams::default()).await.expect("list")).contains(&"m-late".to_string()));
}

const TEST_PREFIX: &str = "/registry/cache-test/";

async fn open(etcd: &Etcd) -> Arc<EtcdStorage> {
    let opts =
        EtcdOptions { history: HistoryLimit::default(), max_value_bytes: 2 << 20, compaction_interval: Duration::ZERO };
    EtcdStorage::open(etcd.client().await, "/registry", opts).await.expect("open")
}

fn all() -> ListOptions {
    ListOptions { start_after: None, limit: 0, revision: None, ..Default::default() }
}

/// Only what etcd stores: the revision a list was read at differs between the cache and etcd.
fn stored(items: &[KeyValue]) -> Vec<(String, Vec<u8>, u64, u64)> {
    items.iter().map(|kv| (kv.key.clone(), kv.value.to_vec(), kv.create_revision, kv.mod_revision)).collect()
}

async fn wait_ready(store: &EtcdStorage) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !store.cache_ready() {
        assert!(Instant::now() < deadline, "the watch cache was never filled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_before_the_cache_is_filled_are_answered_by_etcd() {
    let etcd = Etcd::start();
    let mut ec = etcd.client().await;
    // Enough keys that filling the cache takes dozens of range requests.
    let value = "v".repeat(200);
    for chunk in 0..160 {
        let puts: Vec<_> = (0..125)
            .map(|i| etcd_client::TxnOp::put(format!("{TEST_PREFIX}k-{:05}", chunk * 125 + i), value.clone(), None))
            .collect();
        ec.txn(etcd_client::Txn::new().and_then(puts)).await.expect("txn");
    }
    let store = open(&etcd).await;
    assert!(!store.cache_ready(), "20000 keys cannot have been listed yet");
    let got = store.get(&format!("{TEST_PREFIX}k-00042")).await.expect("get").expect("found");
    assert_eq!(&got.value[..], value.as_bytes());
    assert_eq!(store.cache_reads().etcd, 1, "not ready: etcd answers");
    let from_etcd = store.list(TEST_PREFIX, all()).await.expect("list");
    assert_eq!(from_etcd.items.len(), 20_000);

    wait_ready(&store).await;
    let before = store.cache_reads();
    assert_eq!(store.get(&format!("{TEST_PREFIX}k-00042")).await.expect("get"), Some(got));
    let from_cache = store.list(TEST_PREFIX, all()).await.expect("list");
    assert_eq!(stored(&from_cache.items), stored(&from_etcd.items));
    let page = store
        .list(
            TEST_PREFIX,
            ListOptions { start_after: Some(format!("{TEST_PREFIX}k-19990")), limit: 5, ..Default::default() },
        )
        .await
        .expect("page");
    assert_eq!((page.items.len(), page.more, page.remaining), (5, true, 4));
    assert_eq!(store.cache_reads().cache - before.cache, 3, "ready: the cache answers");
}

/// A TCP relay between the backend and etcd that the test can cut: cutting closes every relayed connection and
/// refuses new ones until it is mended, so the backend loses etcd while the test still reaches it directly.
struct Relay {
    endpoint: String,
    cut: Arc<std::sync::atomic::AtomicBool>,
    conns: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(upstream: u16) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (c, cs) = (cut.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                if c.load(std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
                cs.lock().unwrap().push(task);
            }
        });
        Relay { endpoint, cut, conns, accept }
    }

    fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        for task in self.conns.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    fn mend(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_is_rebuilt_when_etcd_compacted_past_its_watch() {
    let etcd = Etcd::start();
    let relay = Relay::start(etcd.client_port).await;
    let opts =
        EtcdOptions { history: HistoryLimit::default(), max_value_bytes: 2 << 20, compaction_interval: Duration::ZERO };
    let client = etcd_client::Client::connect([relay.endpoint.as_str()], None).await.expect("client");
    let store = EtcdStorage::open(client, "/registry", opts).await.expect("open");
    let key = |n: usize| format!("{TEST_PREFIX}k-{n}");
    store.create(&key(0), "zero".into()).await.expect("create");
    wait_ready(&store).await;
    let mut watch = store.watch(TEST_PREFIX, store.current_revision()).await.expect("watch");

    // The backend loses etcd; meanwhile another client writes, deletes and compacts: the watch feed cannot
    // resume where it was.
    relay.cut();
    let mut ec = etcd.client().await;
    ec.put(key(1), "one", None).await.expect("put");
    ec.delete(key(0), None).await.expect("delete");
    let put = ec.put(key(2), "two", None).await.expect("put");
    ec.compact(put.header().expect("header").revision(), None).await.expect("compact");
    relay.mend();

    // Reads are right at once (from etcd while the cache lags or is rebuilt).
    let got = store.get(&key(2)).await.expect("get").expect("the write is read");
    assert_eq!(got.value, "two".as_bytes());
    assert_eq!(store.get(&key(0)).await.expect("get"), None, "the delete is read");
    // The watch expires (its events are gone from etcd), and the cache is rebuilt with etcd's state.
    let item = tokio::time::timeout(Duration::from_secs(30), watch.recv()).await.expect("the watch ends in time");
    assert!(matches!(item, Some(WatchItem::Error(StorageError::Expired { .. }))), "{item:?}");
    wait_ready(&store).await;
    let before = store.cache_reads();
    let listed = store.list(TEST_PREFIX, all()).await.expect("list");
    let keys: Vec<&str> = listed.items.iter().map(|kv| kv.key.as_str()).collect();
    assert_eq!(keys, [key(1), key(2)]);
    assert_eq!(store.get(&key(2)).await.expect("get"), Some(got));
    assert_eq!(store.get(&key(0)).await.expect("get"), None);
    assert_eq!(store.cache_reads().cache - before.cache, 3, "the rebuilt cache answers");
    // And it follows etcd again: a write after the rebuild is read from it.
    let made = store.create(&key(3), "three".into()).await.expect("create");
    assert_eq!(store.get(&key(3)).await.expect("get"), Some(made));
    assert_eq!(store.cache_reads().cache - before.cache, 4);
}
