//! Tests of [`EncryptionConfigHandle`]: the hash, reloads, and the refusal of configs that drop keys in use.

use super::*;
use crate::storage::embedded::{EmbeddedOptions, EmbeddedStorage};
use crate::storage::Storage;
use handle::keys_in_use;

const KEY1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
const KEY2: &str = "ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";
const SHOOTSTATES: &str = "shootstates.core.gardener.cloud";

/// A config for shootstates with aesgcm `keys` (name, secret), the first one writing.
fn yaml(keys: &[(&str, &str)]) -> String {
    let mut s = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: \
         [\"{SHOOTSTATES}\"]\n  providers:\n  - aesgcm:\n      keys:\n"
    );
    for (name, secret) in keys {
        s += &format!("      - name: {name}\n        secret: {secret}\n");
    }
    s + "  - identity: {}\n"
}

fn config(keys: &[(&str, &str)]) -> EncryptionConfig {
    EncryptionConfig::from_yaml(&yaml(keys)).expect("config")
}

fn key(i: usize) -> String {
    format!("/registry/core.gardener.cloud/shootstates/garden/s{i}")
}

#[test]
fn the_hash_is_kube_apiservers_over_the_files_bytes() {
    // sha256("abc"), FIPS 180-2 appendix B.1.
    let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    assert_eq!(content_hash(b"abc"), format!("k8s:enc:unstable:1:{abc}"));
    let text = yaml(&[("key1", KEY1)]);
    assert_eq!(EncryptionConfig::from_yaml(&text).expect("config").hash(), content_hash(text.as_bytes()));
    // Whitespace alone changes it.
    let spaced = format!("{text}\n");
    assert_ne!(EncryptionConfig::from_yaml(&spaced).expect("config").hash(), content_hash(text.as_bytes()));
}

#[test]
fn write_keys_and_resources_of_keys() {
    let c = config(&[("key2", KEY2), ("key1", KEY1)]);
    assert_eq!(c.write_key_for_resource(SHOOTSTATES), "aesgcm:v1:key2");
    assert_eq!(c.write_key_for_resource("secrets"), "identity");
    assert!(c.reads_for_resource(SHOOTSTATES, "aesgcm:v1:key1"));
    assert!(!c.reads_for_resource("secrets", "aesgcm:v1:key1"));
    assert!(c.reads_for_resource("secrets", "identity"));
    assert_eq!(resource_of_key(&key(1)).as_deref(), Some(SHOOTSTATES));
    assert_eq!(resource_of_key("/registry/secrets/ns/a").as_deref(), Some("secrets"));
    assert_eq!(resource_of_key("/leases/x"), None);
}

#[tokio::test]
async fn a_reload_applies_to_the_next_request_and_refuses_to_drop_keys_in_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inner: Arc<dyn Storage> = EmbeddedStorage::open(dir.path(), EmbeddedOptions::default()).expect("open");
    let store = EncryptedStorage::new(inner.clone(), config(&[("key1", KEY1)]));
    let handle = store.handle().clone();
    let mut seen = handle.subscribe();
    for i in 0..3 {
        store.create(&key(i), Bytes::from_static(b"{}")).await.expect("create");
    }
    let counts = handle.count().await.expect("count");
    assert_eq!(counts.get(SHOOTSTATES, "aesgcm:v1:key1"), 3, "{counts:?}");

    // key2 only: key1 encrypts 3 values and writes; refused, key1 still in use.
    let e = handle.reload(config(&[("key2", KEY2)])).await.expect_err("drops key1");
    assert_eq!(
        e.to_string().split(": ").nth(1).and_then(|m| m.split(';').next()),
        Some(r#"key "aesgcm:v1:key1" still encrypts 3 stored values of shootstates.core.gardener.cloud and writes it"#),
        "{e}"
    );
    assert_eq!(handle.current().write_key_for_resource(SHOOTSTATES), "aesgcm:v1:key1");
    assert!(!seen.has_changed().expect("open"));

    // key2 first, key1 second: accepted; new writes use key2, old values read.
    let next = config(&[("key2", KEY2), ("key1", KEY1)]);
    let hash = next.hash().to_string();
    handle.reload(next).await.expect("reload");
    assert!(seen.has_changed().expect("open"));
    assert_eq!(seen.borrow_and_update().hash(), hash);
    store.create(&key(3), Bytes::from_static(b"{}")).await.expect("create");
    let raw = inner.get(&key(3)).await.expect("get").expect("stored");
    assert!(raw.value.starts_with(b"k8s:enc:aesgcm:v1:key2:"));
    assert_eq!(store.get(&key(0)).await.expect("get").expect("stored").value, Bytes::from_static(b"{}"));

    // Dropping key1 now: refused for the 3 values, not because of writes.
    let e = handle.reload(config(&[("key2", KEY2)])).await.expect_err("key1 still encrypts");
    assert!(matches!(&e, ReloadError::KeysInUse(k) if k.len() == 1 && k[0].values == 3 && !k[0].writes), "{e}");
    // Rewritten: accepted.
    for i in 0..3 {
        let kv = store.get(&key(i)).await.expect("get").expect("stored");
        store.update(&key(i), kv.value, kv.mod_revision).await.expect("rewrite");
    }
    handle.reload(config(&[("key2", KEY2)])).await.expect("nothing uses key1");
    // Dropping the write key of a resource without values is refused too: writes in flight use it.
    let e = handle.reload(config(&[("key1", KEY1)])).await.expect_err("key2 writes and encrypts");
    assert!(e.to_string().contains(r#"key "aesgcm:v1:key2" still encrypts 4 stored values"#), "{e}");
}

#[tokio::test]
async fn a_start_is_checked_against_the_stored_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inner: Arc<dyn Storage> = EmbeddedStorage::open(dir.path(), EmbeddedOptions::default()).expect("open");
    let store = EncryptedStorage::new(inner.clone(), config(&[("key1", KEY1)]));
    store.create(&key(0), Bytes::from_static(b"{}")).await.expect("create");
    store.handle().check_start().await.expect("key1 reads");
    let restarted = EncryptionConfigHandle::new(config(&[("key2", KEY2)]), inner);
    let e = restarted.check_start().await.expect_err("key1 missing");
    assert!(e.to_string().contains(r#"key "aesgcm:v1:key1" still encrypts 1 stored values of shootstates"#), "{e}");
}

#[test]
fn a_config_dropping_a_kms_provider_still_in_use_is_refused_per_key_id() {
    let kms = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: \
         [\"{SHOOTSTATES}\"]\n  providers:\n  - kms:\n      apiVersion: v2\n      name: vault\n      \
         endpoint: unix:///@never-started\n  - aesgcm:\n      keys:\n      - name: key1\n        secret: {KEY1}\n"
    );
    let with_kms = EncryptionConfig::from_yaml(&kms).expect("config");
    let without = config(&[("key1", KEY1)]);
    let (old, new) = (kms::key_id_label("kms:v2:vault", "key-1"), kms::key_id_label("kms:v2:vault", "key-2"));
    let mut counts = crate::storage::inspect::ValueCounts::default();
    let by_key = counts.0.entry(SHOOTSTATES.to_string()).or_default();
    by_key.insert(old.clone(), 3);
    by_key.insert(new.clone(), 2);
    // The provider reads every key_id: keeping it keeps both.
    assert_eq!(keys_in_use(&with_kms, &counts, Some(&with_kms)), []);
    // Dropping it: each key_id's values are named, and the provider still writes.
    let refused = keys_in_use(&without, &counts, Some(&with_kms));
    let mut named: Vec<(&str, u64, bool)> = refused.iter().map(|k| (k.key.as_str(), k.values, k.writes)).collect();
    named.sort();
    let mut expected = [(old.as_str(), 3, false), (new.as_str(), 2, false), ("kms:v2:vault", 0, true)];
    expected.sort();
    assert_eq!(named, expected);
    let message = ReloadError::KeysInUse(refused).to_string();
    assert!(message.contains(&format!("key {old:?} still encrypts 3 stored values of {SHOOTSTATES}")), "{message}");
}
