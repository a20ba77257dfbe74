//! Tests of [`super`] (embedded.rs), in a file of their own to keep that one readable.

use super::*;
use std::collections::HashSet;

fn opts(history: usize) -> EmbeddedOptions {
    EmbeddedOptions { history: HistoryLimit::events(history), max_value_bytes: 1024, ..EmbeddedOptions::default() }
}

fn open(dir: &Path, history: usize) -> Arc<EmbeddedStorage> {
    EmbeddedStorage::open(dir, opts(history)).expect("open")
}

fn b(s: &str) -> Bytes {
    Bytes::from(s.to_owned())
}

fn page(start_after: Option<&str>, limit: usize, revision: Option<Revision>) -> ListOptions {
    ListOptions { start_after: start_after.map(str::to_owned), limit, revision, ..Default::default() }
}

fn keys(r: &ListResult) -> Vec<&str> {
    r.items.iter().map(|kv| kv.key.as_str()).collect()
}

async fn next_event(rx: &mut mpsc::Receiver<WatchItem>) -> Arc<Event> {
    match tokio::time::timeout(Duration::from_secs(10), rx.recv()).await {
        Ok(Some(WatchItem::Event(e))) => e,
        other => panic!("expected an event, got {other:?}"),
    }
}

#[tokio::test]
async fn create_get_update_delete() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path(), 100);
    assert_eq!(s.current_revision(), 0);
    assert_eq!(s.get("/a").await, Ok(None));

    let a = s.create("/a", b("1")).await.expect("create");
    assert_eq!((a.create_revision, a.mod_revision), (1, 1));
    assert_eq!(s.create("/a", b("x")).await, Err(StorageError::AlreadyExists { key: "/a".into() }));
    assert_eq!(s.get("/a").await, Ok(Some(a.clone())));

    let a2 = s.update("/a", b("2"), 1).await.expect("update");
    assert_eq!((a2.create_revision, a2.mod_revision, a2.value.clone()), (1, 2, b("2")));
    assert_eq!(s.update("/a", b("3"), 1).await, Err(StorageError::Conflict { key: "/a".into(), current: 2 }));
    assert_eq!(s.update("/nope", b("3"), 1).await, Err(StorageError::NotFound { key: "/nope".into() }));
    assert_eq!(s.delete("/a", Some(1)).await, Err(StorageError::Conflict { key: "/a".into(), current: 2 }));
    // Failed preconditions consume no revision.
    assert_eq!(s.current_revision(), 2);

    let big = Bytes::from(vec![0u8; 1025]);
    assert_eq!(s.create("/big", big).await, Err(StorageError::TooLarge { size: 1025, limit: 1024 }));

    let d = s.delete("/a", Some(2)).await.expect("delete");
    assert_eq!((d.create_revision, d.mod_revision, d.value.clone()), (1, 3, b("2")));
    assert_eq!(s.get("/a").await, Ok(None));
    assert_eq!(s.delete("/a", None).await, Err(StorageError::NotFound { key: "/a".into() }));

    let a = s.create("/a", b("again")).await.expect("recreate");
    assert_eq!((a.create_revision, a.mod_revision), (4, 4));
    let d = s.delete("/a", None).await.expect("unconditional delete");
    assert_eq!(d.mod_revision, 5);
    assert_eq!(s.current_revision(), 5);
    assert_eq!(s.progress_revision(), 5);
}

#[tokio::test]
async fn revisions_continue_after_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = open(dir.path(), 100);
        s.create("/a", b("1")).await.expect("create");
        s.create("/b", b("1")).await.expect("create");
        s.update("/a", b("2"), 1).await.expect("update");
    }
    let s = open(dir.path(), 100);
    assert_eq!(s.current_revision(), 3);
    assert_eq!(s.progress_revision(), 3);
    let a = s.get("/a").await.expect("get").expect("present");
    assert_eq!((a.create_revision, a.mod_revision, a.value), (1, 3, b("2")));
    let c = s.create("/c", b("1")).await.expect("create");
    assert_eq!(c.mod_revision, 4);
    // History before the reopen is gone, but watching from the open revision works.
    assert!(matches!(s.watch("/", 2).await, Err(StorageError::Expired { requested: 2, oldest: 3 })));
    let mut rx = s.watch("/", 3).await.expect("watch");
    assert_eq!(next_event(&mut rx).await.revision, 4);
}

#[tokio::test]
async fn list_paging() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path(), 100);
    for k in ["/p/a", "/p/b", "/p/c", "/p/d", "/p/e", "/q/a", "/o/z"] {
        s.create(k, b(k)).await.expect("create");
    }
    let all = s.list("/p/", page(None, 0, None)).await.expect("list");
    assert_eq!(keys(&all), ["/p/a", "/p/b", "/p/c", "/p/d", "/p/e"]);
    assert_eq!((all.revision, all.more, all.remaining), (7, false, 0));
    assert_eq!(all.items[2].value, b("/p/c"));

    let p1 = s.list("/p/", page(None, 2, None)).await.expect("list");
    assert_eq!(keys(&p1), ["/p/a", "/p/b"]);
    assert_eq!((p1.more, p1.remaining), (true, 3));
    let p2 = s.list("/p/", page(Some("/p/b"), 2, None)).await.expect("list");
    assert_eq!(keys(&p2), ["/p/c", "/p/d"]);
    assert_eq!((p2.more, p2.remaining), (true, 1));
    let p3 = s.list("/p/", page(Some("/p/d"), 2, None)).await.expect("list");
    assert_eq!(keys(&p3), ["/p/e"]);
    assert_eq!((p3.more, p3.remaining), (false, 0));
    let exact = s.list("/p/", page(None, 5, None)).await.expect("list");
    assert_eq!((exact.items.len(), exact.more), (5, false));

    // A continue key before the prefix starts at the prefix; one after it yields nothing.
    let before = s.list("/p/", page(Some("/a"), 0, None)).await.expect("list");
    assert_eq!(before.items.len(), 5);
    let after = s.list("/p/", page(Some("/z"), 0, None)).await.expect("list");
    assert!(after.items.is_empty() && !after.more);
    let none = s.list("/nothing/", page(None, 0, None)).await.expect("list");
    assert!(none.items.is_empty());
    let everything = s.list("", page(None, 0, None)).await.expect("list");
    assert_eq!(everything.items.len(), 7);
}

#[tokio::test]
async fn a_page_stops_at_its_byte_limit_with_the_item_that_reaches_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path(), 100);
    for k in ["/r/1", "/r/2", "/r/3", "/r/4"] {
        s.create(k, b("12345")).await.expect("create");
    }
    let page = s.list("/r/", ListOptions { max_bytes: 6, ..Default::default() }).await.expect("list");
    assert_eq!((keys(&page), page.more, page.remaining), (vec!["/r/1", "/r/2"], true, 2));
    let rest =
        s.list("/r/", ListOptions { start_after: Some("/r/2".into()), max_bytes: 100, ..Default::default() }).await;
    assert_eq!(keys(&rest.expect("list")), ["/r/3", "/r/4"]);
}

#[tokio::test]
async fn consistent_list_at_old_revision() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path(), 100);
    for k in ["/p/a", "/p/b", "/p/c", "/p/d", "/p/e"] {
        s.create(k, b("old")).await.expect("create");
    }
    s.create("/q/x", b("other")).await.expect("create");

    let p1 = s.list("/p/", page(None, 2, None)).await.expect("list");
    assert_eq!(keys(&p1), ["/p/a", "/p/b"]);
    assert_eq!((p1.revision, p1.remaining), (6, 3));

    s.update("/p/c", b("new"), 3).await.expect("update");
    s.delete("/p/d", None).await.expect("delete");
    s.create("/p/bb", b("new")).await.expect("create");
    s.create("/p/f", b("new")).await.expect("create");
    s.update("/p/a", b("new"), 1).await.expect("update");
    s.update("/p/e", b("new"), 5).await.expect("update");
    s.delete("/p/e", None).await.expect("delete");
    s.create("/p/e", b("newer")).await.expect("create");
    s.create("/q/y", b("other")).await.expect("create");

    let p2 = s.list("/p/", page(Some("/p/b"), 2, Some(p1.revision))).await.expect("list");
    assert_eq!(p2.revision, 6);
    assert_eq!(keys(&p2), ["/p/c", "/p/d"]);
    assert!(p2.items.iter().all(|kv| kv.value == b("old")));
    assert_eq!((p2.items[0].create_revision, p2.items[0].mod_revision), (3, 3));
    assert_eq!((p2.more, p2.remaining), (true, 1));
    let p3 = s.list("/p/", page(Some("/p/d"), 2, Some(6))).await.expect("list");
    assert_eq!(keys(&p3), ["/p/e"]);
    assert_eq!((p3.items[0].value.clone(), p3.items[0].mod_revision), (b("old"), 5));
    assert!(!p3.more);
    let whole = s.list("/p/", page(None, 0, Some(6))).await.expect("list");
    assert_eq!(keys(&whole), ["/p/a", "/p/b", "/p/c", "/p/d", "/p/e"]);

    let latest = s.list("/p/", page(None, 0, None)).await.expect("list");
    assert_eq!(latest.revision, 15);
    assert_eq!(keys(&latest), ["/p/a", "/p/b", "/p/bb", "/p/c", "/p/e", "/p/f"]);
    // A revision at or beyond the snapshot reads the latest.
    let same = s.list("/p/", page(None, 0, Some(15))).await.expect("list");
    assert_eq!(keys(&same), keys(&latest));
    // An intermediate revision: after the delete of d (8) and the create of bb (9).
    let mid = s.list("/p/", page(None, 0, Some(9))).await.expect("list");
    assert_eq!(keys(&mid), ["/p/a", "/p/b", "/p/bb", "/p/c", "/p/e"]);
    assert_eq!(mid.items[3].value, b("new"));
}

/// A continue page reads the snapshot its first page pinned: consistent at the first page's revision however many
/// writes followed, even when they overflowed the history, and its `remaining` without counting again.
#[tokio::test]
async fn continue_pages_read_the_pinned_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path(), 2);
    for i in 0..10 {
        s.create(&format!("/p/{i:02}"), b("old")).await.expect("create");
    }
    let p1 = s.list("/p/", page(None, 3, None)).await.expect("list");
    assert_eq!((p1.revision, p1.more, p1.remaining), (10, true, 7));
    for i in 0..10 {
        s.update(&format!("/p/{i:02}"), b("new"), i + 1).await.expect("update");
    }
    s.delete("/p/05", None).await.expect("delete");
    s.create("/p/035", b("new")).await.expect("create");
    // Rolling back through the history is impossible now: only the snapshot can answer.
    assert!(matches!(s.list("/p/", page(None, 0, Some(11))).await, Err(StorageError::Expired { .. })));

    let p2 = s.list("/p/", page(Some("/p/02"), 3, Some(10))).await.expect("continue");
    assert_eq!(keys(&p2), ["/p/03", "/p/04", "/p/05"]);
    assert!(p2.items.iter().all(|kv| kv.value == b("old") && kv.mod_revision < 11));
    assert_eq!((p2.revision, p2.more, p2.remaining), (10, true, 4));
    let p3 = s.list("/p/", page(Some("/p/05"), 10, Some(10))).await.expect("continue");
    assert_eq!(keys(&p3), ["/p/06", "/p/07", "/p/08", "/p/09"]);
    assert_eq!((p3.more, p3.remaining), (false, 0));
    // A page whose start no earlier page ended at counts for itself.
    let odd = s.list("/p/", page(Some("/p/07"), 1, Some(10))).await.expect("continue");
    assert_eq!((keys(&odd), odd.remaining), (vec!["/p/08"], 1));
    // The latest state is untouched by the snapshot.
    let latest = s.list("/p/", page(None, 0, None)).await.expect("list");
    assert_eq!(latest.items.len(), 10);
    assert!(latest.items.iter().all(|kv| kv.value == b("new")));
}

/// A first page's `remaining` comes from the per-prefix counts, which follow creates and deletes, survive a reopen,
/// and are computed once for a store written before they existed.
#[tokio::test]
async fn first_pages_take_remaining_from_the_counts() {
    let dir = tempfile::tempdir().expect("tempdir");
    let remaining = |s: Arc<EmbeddedStorage>, prefix: &'static str| async move {
        let page = s.list(prefix, page(None, 1, None)).await.expect("list");
        (page.items.len(), page.remaining)
    };
    {
        let s = open(dir.path(), 100);
        for ns in ["a", "b"] {
            for i in 0..5 {
                s.create(&format!("/r/g/x/{ns}/{i}"), b("v")).await.expect("create");
            }
        }
        s.create("/r/g/y/one", b("v")).await.expect("create");
        s.delete("/r/g/x/a/0", None).await.expect("delete");
        s.update("/r/g/x/a/1", b("w"), 2).await.expect("update");
        assert_eq!(remaining(s.clone(), "/r/g/x/").await, (1, 8));
        assert_eq!(remaining(s.clone(), "/r/g/x/a/").await, (1, 3));
        assert_eq!(remaining(s.clone(), "/r/g/").await, (1, 9));
        assert_eq!(remaining(s.clone(), "/r/g/z/").await, (0, 0));
        // Not a directory-like prefix: counted by walking, the same answer.
        assert_eq!(remaining(s.clone(), "/r/g/x/a").await, (1, 3));
    }
    // A store from before the counts: its counts are computed when it is opened.
    {
        let db = Database::create(dir.path().join("store.redb")).expect("redb");
        let txn = db.begin_write().expect("write");
        txn.delete_table(counts::COUNTS).expect("drop counts");
        txn.open_table(META).expect("meta").remove("counted").expect("unmark");
        txn.commit().expect("commit");
    }
    let s = open(dir.path(), 100);
    assert_eq!(remaining(s.clone(), "/r/g/x/").await, (1, 8));
    assert_eq!(remaining(s.clone(), "/r/g/x/b/").await, (1, 4));
    s.delete("/r/g/x/b/4", None).await.expect("delete");
    assert_eq!(remaining(s.clone(), "/r/g/x/b/").await, (1, 3));
}

/// At most `MAX_PINNED` snapshots are kept: the least recently used goes, and its continue token falls back to
/// the history (expired here).
#[tokio::test]
async fn pinned_snapshots_are_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path(), 1);
    for k in ["/p/a", "/p/b", "/p/c"] {
        s.create(k, b("v")).await.expect("create");
    }
    let mut revisions = Vec::new();
    for _ in 0..=snapshots::MAX_PINNED {
        let first = s.list("/p/", page(None, 1, None)).await.expect("list");
        revisions.push(first.revision);
        let current = s.get("/p/c").await.expect("get").expect("present");
        s.update("/p/c", b("v"), current.mod_revision).await.expect("update");
    }
    let (oldest, newest) = (revisions[0], revisions[revisions.len() - 1]);
    let evicted = s.list("/p/", page(Some("/p/a"), 1, Some(oldest))).await;
    assert!(matches!(evicted, Err(StorageError::Expired { .. })), "{:?}", evicted.map(|r| r.revision));
    let kept = s.list("/p/", page(Some("/p/a"), 1, Some(newest))).await.expect("continue");
    assert_eq!((keys(&kept), kept.revision), (vec!["/p/b"], newest));
}

#[tokio::test]
async fn expired_after_history_overflows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path(), 10);
    for i in 0..30 {
        s.create(&format!("/k/{i:02}"), b("v")).await.expect("create");
    }
    assert_eq!(s.hub().compacted_revision(), 20);
    let err = s.list("/k/", page(None, 5, Some(5))).await.err();
    assert_eq!(err, Some(StorageError::Expired { requested: 5, oldest: 20 }));
    assert!(matches!(s.watch("/k/", 19).await, Err(StorageError::Expired { requested: 19, oldest: 20 })));
    let ok = s.list("/k/", page(None, 0, Some(25))).await.expect("list");
    assert_eq!((ok.items.len(), ok.revision), (25, 25));
    let mut rx = s.watch("/k/", 20).await.expect("watch");
    assert_eq!(next_event(&mut rx).await.revision, 21);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_replay_and_live_without_gaps() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path(), 100_000);
    s.create("/w/first", b("v")).await.expect("create");
    s.create("/other/x", b("v")).await.expect("create");
    let mut from_start = s.watch("/w/", 0).await.expect("watch");

    let writers: Vec<_> = (0..8)
        .map(|t| {
            let s = s.clone();
            tokio::spawn(async move {
                for i in 0..100 {
                    let key = format!("/w/{t}/{i}");
                    let kv = s.create(&key, b("1")).await.expect("create");
                    s.update(&key, b("2"), kv.mod_revision).await.expect("update");
                }
            })
        })
        .collect();
    // Start another watcher mid-way, from a revision that is partly replayed.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mid = s.progress_revision();
    let mut from_mid = s.watch("/w/", mid).await.expect("watch");
    for w in writers {
        w.await.expect("writer");
    }
    s.delete("/w/first", None).await.expect("delete");
    let end = s.current_revision();
    assert_eq!(end, 2 + 8 * 100 * 2 + 1);

    let mut expected = 1;
    while expected <= end {
        let e = next_event(&mut from_start).await;
        if expected == 2 {
            expected = 3; // "/other/x" is outside the prefix.
        }
        assert_eq!(e.revision, expected);
        expected += 1;
    }
    let mut expected = mid + 1;
    while expected <= end {
        assert_eq!(next_event(&mut from_mid).await.revision, expected);
        expected += 1;
    }
    let last = next_event(&mut s.watch("/w/first", end - 1).await.expect("watch")).await;
    assert_eq!(last.kind, EventKind::Deleted);
    assert_eq!(last.value, b("v"));
    assert_eq!(last.prev.as_ref().map(|p| p.mod_revision), Some(1));
    assert!(from_start.try_recv().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_that_never_reads_does_not_block_writers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path(), 100);
    let mut stuck = s.watch("/", 0).await.expect("watch");
    let mut live = s.watch("/", 0).await.expect("watch");
    let reader = tokio::spawn(async move {
        let mut n = 0;
        while let Some(item) = live.recv().await {
            match item {
                WatchItem::Event(_) => n += 1,
                WatchItem::Error(e) => panic!("live watcher failed: {e}"),
            }
            if n == 3000 {
                break;
            }
        }
        n
    });
    let writers: Vec<_> = (0..30)
        .map(|t| {
            let s = s.clone();
            tokio::spawn(async move {
                for i in 0..100 {
                    s.create(&format!("/k/{t}/{i}"), b("v")).await.expect("create");
                }
            })
        })
        .collect();
    let all = async {
        for w in writers {
            w.await.expect("writer");
        }
    };
    tokio::time::timeout(Duration::from_secs(60), all).await.expect("writers finished");
    assert_eq!(tokio::time::timeout(Duration::from_secs(10), reader).await.expect("reader").expect("join"), 3000);

    let mut events = 0;
    let mut error = None;
    while let Some(item) = stuck.recv().await {
        match item {
            WatchItem::Event(_) => events += 1,
            WatchItem::Error(e) => error = Some(e),
        }
    }
    assert_eq!(events, crate::storage::hub::DEFAULT_WATCH_BUFFER);
    assert!(matches!(error, Some(StorageError::Expired { .. })), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_gives_distinct_revisions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = open(dir.path(), 100_000);
    let tasks: Vec<_> = (0..64)
        .map(|t| {
            let s = s.clone();
            tokio::spawn(async move {
                let mut revs = Vec::new();
                for i in 0..50 {
                    revs.push(s.create(&format!("/g/{t}/{i}"), b("v")).await.expect("create").mod_revision);
                }
                // Conflicting creates in the same batches fail without consuming revisions.
                assert!(s.create(&format!("/g/{t}/0"), b("v")).await.is_err());
                revs
            })
        })
        .collect();
    let mut seen = HashSet::new();
    for t in tasks {
        for r in t.await.expect("task") {
            assert!(seen.insert(r), "revision {r} handed out twice");
        }
    }
    assert_eq!(seen.len(), 3200);
    assert_eq!(seen.iter().max(), Some(&3200));
    assert_eq!(s.current_revision(), 3200);
    let listed = s.list("/g/", page(None, 0, None)).await.expect("list");
    assert_eq!(listed.items.len(), 3200);
}

#[test]
fn a_store_open_elsewhere_is_in_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _first = EmbeddedStorage::open(dir.path(), EmbeddedOptions::default()).expect("open");
    let Err(e) = EmbeddedStorage::open(dir.path(), EmbeddedOptions::default()) else { panic!("opened twice") };
    let want = format!("the data directory {} is in use by another process", dir.path().display());
    assert!(e.to_string().contains(&want), "{e}");
}

/// `cargo test --release --lib bench_creates -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn bench_creates() {
    const TASKS: usize = 64;
    const TOTAL: usize = 20_000;
    let base = std::env::var_os("BENCH_DIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::tempdir_in(base).expect("tempdir");
    let s = EmbeddedStorage::open(dir.path(), EmbeddedOptions::default()).expect("open");
    let value = Bytes::from(vec![b'x'; 1024]);
    let start = std::time::Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (s, value) = (s.clone(), value.clone());
            tokio::spawn(async move {
                for i in (t..TOTAL).step_by(TASKS) {
                    s.create(&format!("/registry/bench/ns/obj-{i}"), value.clone()).await.expect("create");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(s.current_revision(), TOTAL as u64);
    println!("{TOTAL} durable creates by {TASKS} tasks in {secs:.2}s: {:.0} creates/s", TOTAL as f64 / secs);
}
