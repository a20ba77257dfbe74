use super::*;
use crate::storage::embedded::{EmbeddedOptions, EmbeddedStorage};
use crate::storage::{ListOptions, Storage};
use bytes::Bytes;
use std::sync::Arc;

fn open(dir: &Path) -> Arc<EmbeddedStorage> {
    EmbeddedStorage::open(dir, EmbeddedOptions::default()).expect("open")
}

/// A store with three objects, one updated and one deleted: revision 5.
async fn filled(dir: &Path) -> Arc<EmbeddedStorage> {
    let s = open(dir);
    for k in ["a", "b", "c"] {
        s.create(&format!("/registry/g/r/ns/{k}"), Bytes::from(format!("v-{k}"))).await.expect("create");
    }
    s.update("/registry/g/r/ns/a", Bytes::from_static(b"v-a2"), 1).await.expect("update");
    s.delete("/registry/g/r/ns/c", None).await.expect("delete");
    s
}

fn snapshot(s: &EmbeddedStorage, dir: &Path) -> SnapshotInfo {
    write_snapshot(&s.begin_read().expect("read"), dir, Utc::now()).expect("snapshot")
}

#[tokio::test]
async fn a_restored_store_has_the_objects_revisions_and_counts_of_the_snapshot() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let s = filled(&tmp.path().join("data")).await;
    let info = snapshot(&s, &tmp.path().join("snaps"));
    assert_eq!((info.revision, info.objects), (5, 2));
    // Later writes are not in it.
    s.create("/registry/g/r/ns/d", Bytes::from_static(b"later")).await.expect("create");
    let before = s
        .list("/registry/g/r/", ListOptions { start_after: None, limit: 0, revision: Some(5), ..Default::default() })
        .await;
    let before = before.expect("list").items;
    drop(s);

    let verified = verify(&info.path).expect("verify");
    assert_eq!((verified.revision, verified.objects, verified.checksum.clone()), (5, 2, info.checksum.clone()));
    let restored_dir = tmp.path().join("restored");
    restore(&info.path, &restored_dir).expect("restore");
    let r = open(&restored_dir);
    assert_eq!(r.current_revision(), 5);
    let list = r
        .list("/registry/g/r/", ListOptions { start_after: None, limit: 1, revision: None, ..Default::default() })
        .await;
    let list = list.expect("list");
    assert_eq!((list.remaining, list.items[0].clone()), (1, before[0].clone()), "counts rebuilt");
    let all = r
        .list("/registry/g/r/", ListOptions { start_after: None, limit: 0, revision: None, ..Default::default() })
        .await;
    assert_eq!(all.expect("list").items, before);
    // The next write takes the revision after the snapshot's.
    let kv = r.create("/registry/g/r/ns/e", Bytes::from_static(b"e")).await.expect("create");
    assert_eq!(kv.mod_revision, 6);
}

#[tokio::test]
async fn an_empty_store_snapshots_and_restores() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let s = open(&tmp.path().join("data"));
    let info = snapshot(&s, &tmp.path().join("snaps"));
    assert_eq!((info.revision, info.objects), (0, 0));
    restore(&info.path, &tmp.path().join("restored")).expect("restore");
    assert_eq!(open(&tmp.path().join("restored")).current_revision(), 0);
}

fn refusal(path: &Path) -> String {
    verify(path).expect_err("refused").to_string()
}

#[tokio::test]
async fn damaged_files_are_refused_with_what_is_wrong() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let s = filled(&tmp.path().join("data")).await;
    let info = snapshot(&s, &tmp.path().join("snaps"));
    let good = std::fs::read(&info.path).expect("read");
    let bad = tmp.path().join("bad.snap");
    let check = |bytes: &[u8], expected: &str| {
        std::fs::write(&bad, bytes).expect("write");
        let why = refusal(&bad);
        assert!(why.contains(expected), "{expected:?} not in {why:?}");
        let target = tmp.path().join("target");
        let why = restore(&bad, &target).expect_err("restore refused").to_string();
        assert!(why.contains(expected), "{expected:?} not in {why:?}");
        assert!(!target.exists(), "a refused restore leaves nothing");
    };
    check(&good[..good.len() - 10], "truncated snapshot");
    check(&good[..20], "truncated snapshot");
    // The last byte of the last value, then the header's revision.
    for at in [good.len() - 33, 12] {
        let mut flipped = good.clone();
        flipped[at] ^= 0x01;
        check(&flipped, "checksum mismatch");
    }
    let mut longer = good.clone();
    longer.push(0);
    check(&longer, "longer than its header");
    check(b"SQLite format 3\0 and more bytes than a header takes", "not a migration-apiserver snapshot");
    // The first record's key length made huge, the checksum recomputed: refused as corrupt, nothing allocated.
    let mut huge = good.clone();
    huge[format::HEADER_LEN as usize..][..4].copy_from_slice(&u32::MAX.to_le_bytes());
    reseal(&mut huge);
    check(&huge, "key length 4294967295 of record 1 is impossible");
    let mut version = good.clone();
    version[8] = 9;
    check(&version, "format version 9 is not supported");
    check(b"", "not a migration-apiserver snapshot");
}

/// Recomputes the checksum of a snapshot whose body was changed, as a writer that got it wrong would have.
fn reseal(bytes: &mut [u8]) {
    use sha2::Digest;
    let header_len = format::HEADER_LEN as usize;
    let end = bytes.len() - format::CHECKSUM_LEN as usize;
    let header = format::parse_header(&bytes[..header_len], bytes.len() as u64).expect("header");
    let checksum = format::checksum(&header, sha2::Sha256::digest(&bytes[header_len..end]).into());
    bytes[end..].copy_from_slice(&checksum);
}

#[tokio::test]
async fn restore_refuses_a_directory_that_is_not_empty() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let s = filled(&tmp.path().join("data")).await;
    let info = snapshot(&s, &tmp.path().join("snaps"));
    let target = tmp.path().join("target");
    std::fs::create_dir_all(&target).expect("mkdir");
    std::fs::write(target.join("keep"), b"x").expect("write");
    let why = restore(&info.path, &target).expect_err("refused").to_string();
    assert!(why.contains("is not empty"), "{why}");
    assert_eq!(std::fs::read(target.join("keep")).expect("kept"), b"x");
    // An empty one is fine.
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).expect("mkdir");
    restore(&info.path, &empty).expect("restore");
}

#[tokio::test]
async fn retention_removes_the_oldest_and_temporary_files_are_not_snapshots() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let s = filled(&tmp.path().join("data")).await;
    let dir = tmp.path().join("snaps");
    let t0 = Utc::now();
    let names: Vec<String> = (0..4)
        .map(|i| write_snapshot(&s.begin_read().expect("read"), &dir, t0 + chrono::Duration::seconds(i)).expect("snap"))
        .map(|i| i.name)
        .collect();
    std::fs::write(dir.join(format!(".{}{TEMP_SUFFIX}", file_name(t0, 9))), b"partial").expect("temp");
    let listed: Vec<String> = list(&dir).expect("list").into_iter().map(|l| l.name).collect();
    assert_eq!(listed, names);
    assert_eq!(prune(&dir, 2).expect("prune"), names[..2].to_vec());
    let listed: Vec<String> = list(&dir).expect("list").into_iter().map(|l| l.name).collect();
    assert_eq!(listed, names[2..].to_vec());
    remove_temporary(&dir).expect("clean");
    assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 2);
}
