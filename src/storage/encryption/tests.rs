//! Tests of the encryption configuration, its ciphers and [`EncryptedStorage`].

use super::*;
use crate::storage::embedded::{EmbeddedOptions, EmbeddedStorage};
use crate::storage::EventKind;
use crate::storage::{ListOptions, Storage, WatchItem};
use std::time::Duration;
use tokio::sync::mpsc;

const KEY1: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="; // bytes 0..32
const KEY: &str = "/registry/core.gardener.cloud/shootstates/garden/s1";
const PLAIN: &[u8] = br#"{"apiVersion":"core.gardener.cloud/v1beta1","kind":"ShootState"}"#;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn config(providers: &str) -> EncryptionConfig {
    let yaml = format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: \
             [\"*.*\"]\n  providers:\n{providers}"
    );
    EncryptionConfig::from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

fn keys(provider: &str, keys: &[(&str, &str)]) -> String {
    let mut s = format!("  - {provider}:\n      keys:\n");
    for (name, secret) in keys {
        s += &format!("      - name: {name}\n        secret: {secret}\n");
    }
    s
}

fn err(yaml: &str) -> String {
    match EncryptionConfig::from_yaml(yaml) {
        Ok(_) => panic!("accepted:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

/// Known answer (computed independently with Python's `cryptography`): AES-256-GCM with key 00..1f,
/// nonce 64..6f, AAD = the storage key. kube-apiserver's layout: prefix || nonce || ciphertext || tag.
#[test]
fn aesgcm_known_answer_with_the_storage_key_as_aad() {
    let c = config(&keys("aesgcm", &[("key1", KEY1)]));
    let t = c.transformer(KEY);
    let w = t.writer.as_ref().expect("writer");
    let nonce: Vec<u8> = (100..112).collect();
    let expected_ct =
        hex("3339bf1610bf33ec4d0b3086f85f489e2db06324ec0d8116c2bfc93ad5c0c927e18d6fb67d70fe709cc25a13df29a3a17f79a2c5\
             73222e478ea2d8b79be487f726ac00a4547cb3c418dcb84ba3cf9948");
    let mut expected = b"k8s:enc:aesgcm:v1:key1:".to_vec();
    expected.extend_from_slice(&nonce);
    expected.extend_from_slice(&expected_ct);
    assert_eq!(w.encrypt_with_nonce(KEY, PLAIN, &nonce).expect("encrypt"), expected);
    let d = c.decrypt(KEY, &Bytes::from(expected.clone())).expect("decrypt");
    assert_eq!((d.value.as_ref(), d.stale), (PLAIN, false));

    // The AAD binds the value to its key: copied elsewhere, it does not decrypt.
    let moved = c.decrypt("/registry/core.gardener.cloud/shootstates/garden/s2", &Bytes::from(expected));
    let e = moved.expect_err("decrypts under another key");
    assert!(e.to_string().contains("key \"key1\""), "{e}");

    // Random nonces: two encryptions differ, both decrypt.
    let a = c.encrypt(KEY, PLAIN).expect("encrypt");
    let b = c.encrypt(KEY, PLAIN).expect("encrypt");
    assert_ne!(a, b);
    assert_eq!(a.len(), "k8s:enc:aesgcm:v1:key1:".len() + 12 + PLAIN.len() + 16);
    assert_eq!(c.decrypt(KEY, &a).expect("decrypt").value.as_ref(), PLAIN);
}

/// Known answer (Python `cryptography`): AES-256-CBC, IV c8..d7, PKCS#7.
#[test]
fn aescbc_known_answer_and_round_trips() {
    let c = config(&keys("aescbc", &[("k", KEY1)]));
    let w = c.transformer(KEY).writer.clone().expect("writer");
    let iv: Vec<u8> = (200..216).collect();
    let mut expected = b"k8s:enc:aescbc:v1:k:".to_vec();
    expected.extend_from_slice(&iv);
    expected.extend_from_slice(&hex(
        "c04c42b36a57be22518c3d1a5243629434f819e0ea93a0ac064dcf5288855fcdfeef712a82b311a8b5cca0519eba22ce67a78e16\
             ecc8b48df104846fb9ff08d3db28beafd767526918cfea97c0aefd56",
    ));
    assert_eq!(w.encrypt_with_nonce(KEY, PLAIN, &iv).expect("encrypt"), expected);
    assert_eq!(c.decrypt(KEY, &Bytes::from(expected)).expect("decrypt").value.as_ref(), PLAIN);

    for size in [16usize, 24, 32] {
        let c = config(&keys("aescbc", &[("k", &b64(&vec![7u8; size]))]));
        for len in [0usize, 1, 15, 16, 17, 1000] {
            let plain = vec![b'x'; len];
            let stored = c.encrypt(KEY, &plain).expect("encrypt");
            assert!(stored.starts_with(b"k8s:enc:aescbc:v1:k:"));
            assert!((stored.len() - "k8s:enc:aescbc:v1:k:".len() - 16).is_multiple_of(16));
            assert_eq!(c.decrypt(KEY, &stored).expect("decrypt").value.as_ref(), plain.as_slice());
        }
    }
    // Truncated or tampered ciphertext is an error, not garbage.
    let stored = c.encrypt(KEY, PLAIN).expect("encrypt");
    assert!(c.decrypt(KEY, &stored.slice(..stored.len() - 3)).is_err());
}

/// NaCl's own secretbox test vector (tests/secretbox.c: "firstkey", "nonce", the 131-byte message).
#[test]
fn secretbox_known_answer_and_round_trips() {
    let key = hex("1b27556473e985d462cd51197a9a46c76009549eac6474f206c4ee0844f68389");
    let nonce = hex("69696ee955b62b73cd62bda875fc73d68219e0036b7a0b37");
    let plain =
        hex("be075fc53c81f2d5cf141316ebeb0c7b5228c52a4c62cbd44b66849b64244ffce5ecbaaf33bd751a1ac728d45e6c61296cdc3c01\
             233561f41db66cce314adb310e3be8250c46f06dceea3a7fa1348057e2f6556ad6b1318a024a838f21af1fde048977eb48f59ffd\
             4924ca1c60902e52f0a089bc76897040e082f937763848645e0705");
    let boxed =
        hex("f3ffc7703f9400e52a7dfb4b3d3305d98e993b9f48681273c29650ba32fc76ce48332ea7164d96a4476fb8c531a1186ac0dfc17c\
             98dce87b4da7f011ec48c97271d2c20f9b928fe2270d6fb863d51738b48eeee314a7cc8ab932164548e526ae90224368517acfea\
             bd6bb3732bc0e9da99832b61ca01b6de56244a9e88d5f9b37973f622a43d14a6599b1f654cb45a74e355a5");
    let c = config(&keys("secretbox", &[("sb", &b64(&key))]));
    let w = c.transformer(KEY).writer.clone().expect("writer");
    let mut expected = b"k8s:enc:secretbox:v1:sb:".to_vec();
    expected.extend_from_slice(&nonce);
    expected.extend_from_slice(&boxed);
    assert_eq!(w.encrypt_with_nonce(KEY, &plain, &nonce).expect("encrypt"), expected);
    assert_eq!(c.decrypt(KEY, &Bytes::from(expected)).expect("decrypt").value.as_ref(), plain.as_slice());

    let stored = c.encrypt(KEY, PLAIN).expect("encrypt");
    assert_eq!(stored.len(), "k8s:enc:secretbox:v1:sb:".len() + 24 + 16 + PLAIN.len());
    assert_eq!(c.decrypt(KEY, &stored).expect("decrypt").value.as_ref(), PLAIN);
    let mut tampered = stored.to_vec();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    assert!(c.decrypt(KEY, &Bytes::from(tampered)).is_err());
}

#[test]
fn aesgcm_key_sizes() {
    for size in [16usize, 24, 32] {
        let c = config(&keys("aesgcm", &[("k", &b64(&vec![9u8; size]))]));
        let stored = c.encrypt(KEY, PLAIN).expect("encrypt");
        assert_eq!(c.decrypt(KEY, &stored).expect("decrypt").value.as_ref(), PLAIN);
    }
}

#[test]
fn rotation_staleness_and_unknown_keys() {
    let key2 = b64(&[2u8; 32]);
    let old = config(&keys("aesgcm", &[("key1", KEY1)]));
    let rotated = config(&keys("aesgcm", &[("key2", &key2), ("key1", KEY1)]));
    let by_key1 = old.encrypt(KEY, PLAIN).expect("encrypt");
    let d = rotated.decrypt(KEY, &by_key1).expect("old key still reads");
    assert_eq!((d.value.as_ref(), d.stale), (PLAIN, true));
    let by_key2 = rotated.encrypt(KEY, PLAIN).expect("encrypt");
    assert!(by_key2.starts_with(b"k8s:enc:aesgcm:v1:key2:"));
    assert!(!rotated.decrypt(KEY, &by_key2).expect("decrypt").stale);

    // Plaintext reads under any config; it is stale where something encrypts.
    let plain = Bytes::from_static(PLAIN);
    assert!(rotated.decrypt(KEY, &plain).expect("plaintext").stale);
    let identity_first = config(&format!("  - identity: {{}}\n{}", keys("aesgcm", &[("key1", KEY1)])));
    assert!(!identity_first.decrypt(KEY, &plain).expect("plaintext").stale);
    assert_eq!(identity_first.encrypt(KEY, PLAIN).expect("identity").as_ref(), PLAIN);
    // ... and an encrypted value is decrypted by a later provider, and stale (identity writes).
    let d = identity_first.decrypt(KEY, &by_key1).expect("decrypt");
    assert_eq!((d.value.as_ref(), d.stale), (PLAIN, true));

    // Another provider type of the same list reads too.
    let mixed = config(&format!("{}{}", keys("secretbox", &[("sb", &key2)]), keys("aescbc", &[("cbc", KEY1)])));
    let by_cbc = config(&keys("aescbc", &[("cbc", KEY1)])).encrypt(KEY, PLAIN).expect("encrypt");
    assert!(mixed.decrypt(KEY, &by_cbc).expect("decrypt").stale);

    // A key the config does not have: a clear error naming it, never garbage.
    let only2 = config(&keys("aesgcm", &[("key2", &key2)]));
    let e = only2.decrypt(KEY, &by_key1).expect_err("unknown key");
    assert!(matches!(&e, StorageError::Internal(m) if m.contains("aesgcm:v1:key1") && m.contains(KEY)), "{e}");
    // Same name, different secret: authentication fails, with the key name.
    let wrong = config(&keys("aesgcm", &[("key1", &key2)]));
    let e = wrong.decrypt(KEY, &by_key1).expect_err("wrong secret");
    assert!(e.to_string().contains("\"key1\"") && e.to_string().contains("wrong key"), "{e}");
    let e = old.decrypt(KEY, &Bytes::from_static(b"k8s:enc:aesgcm")).expect_err("malformed");
    assert!(e.to_string().contains("prefix"), "{e}");
}

#[test]
fn resource_matching() {
    let yaml = format!(
        r#"apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: [shootstates.core.gardener.cloud]
  providers:
{}- resources: ["*.migration.k8s.io"]
  providers:
{}- resources: [secrets]
  providers:
{}- resources: ["*.*"]
  providers:
  - identity: {{}}
"#,
        keys("aesgcm", &[("gcm", KEY1)]),
        keys("secretbox", &[("sb", KEY1)]),
        keys("aescbc", &[("cbc", KEY1)])
    );
    let c = EncryptionConfig::from_yaml(&yaml).expect("config");
    assert_eq!(c.writer_for("/registry/core.gardener.cloud/shootstates/garden/a"), "aesgcm:v1:gcm");
    assert_eq!(c.writer_for("/registry/core.gardener.cloud/shoots/garden/a"), "identity");
    assert_eq!(c.writer_for("/registry/core.gardener.cloud/shootstatesx/garden/a"), "identity");
    assert_eq!(c.writer_for("/registry/migration.k8s.io/storagestates/a"), "secretbox:v1:sb");
    assert_eq!(c.writer_for("/registry/migration.k8s.io/storageversionmigrations/a"), "secretbox:v1:sb");
    assert_eq!(c.writer_for("/registry/secrets/default/a"), "aescbc:v1:cbc");
    assert_eq!(c.writer_for("/registry/other.io/things/a"), "identity");
    // No matching entry at all: identity, and encrypted data is an error rather than garbage.
    let only = config(&keys("aesgcm", &[("k", KEY1)]));
    assert_eq!(only.writer_for("/elsewhere"), "aesgcm:v1:k");
    let narrow = EncryptionConfig::from_yaml(&yaml.replace("\"*.*\"", "nothing.example.com")).expect("config");
    assert_eq!(narrow.writer_for("/registry/other.io/things/a"), "identity");
    let stored = narrow.encrypt("/registry/core.gardener.cloud/shootstates/garden/a", PLAIN).expect("encrypt");
    assert!(narrow.decrypt("/registry/other.io/things/a", &stored).is_err());
    // First matching entry wins.
    let first = EncryptionConfig::from_yaml(&format!(
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n- resources: \
             [\"*.*\"]\n  providers:\n  - identity: {{}}\n- resources: [storagestates.migration.k8s.io]\n  \
             providers:\n{}",
        keys("aesgcm", &[("k", KEY1)])
    ))
    .expect("config");
    assert_eq!(first.writer_for("/registry/migration.k8s.io/storagestates/a"), "identity");
}

#[test]
fn invalid_configs_are_rejected_clearly() {
    let head = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\n";
    let with = |providers: &str| format!("{head}resources:\n- resources: [\"*.*\"]\n  providers:\n{providers}");
    let e = err(&with(&keys("aesgcm", &[("key1", "not base64!")])));
    assert!(e.contains("resources[0].providers[0].aesgcm.keys[0].secret") && e.contains("base64"), "{e}");
    let e = err(&with(&keys("aesgcm", &[("key1", &b64(&[1u8; 20]))])));
    assert!(e.contains("16, 24 or 32 bytes, got 20") && e.contains("key1"), "{e}");
    let e = err(&with(&keys("secretbox", &[("sb", &b64(&[1u8; 16]))])));
    assert!(e.contains("must be 32 bytes, got 16"), "{e}");
    let e = err(&with("  - aesgsm:\n      keys: []\n"));
    assert!(e.contains("unknown field `aesgsm`"), "{e}");
    let e = err(&with("  - kms:\n      name: x\n      endpoint: unix:///tmp/x.sock\n"));
    assert!(e.contains("resources[0].providers[0].kms.apiVersion: KMSv1 is deprecated"), "{e}");
    let e = err(&format!("{head}resources:\n- resources: [\"*.*\"]\n  providers: []\n"));
    assert!(e.contains("resources[0].providers: must list at least one provider"), "{e}");
    let e = err(&format!("{head}resources:\n- resources: [\"*.*\"]\n"));
    assert!(e.contains("at least one provider"), "{e}");
    let e = err(&format!("{head}resources: []\n"));
    assert!(e.contains("resources"), "{e}");
    let e = err(&with("  - aesgcm:\n      keys: []\n"));
    assert!(e.contains("aesgcm.keys: must list at least one key"), "{e}");
    let e = err(&with(&keys("aesgcm", &[("a:b", KEY1)])));
    assert!(e.contains("must not contain ':'"), "{e}");
    let e = err(&with(&keys("aesgcm", &[("k", KEY1), ("k", KEY1)])));
    assert!(e.contains("used twice"), "{e}");
    let e =
        err(&with(&format!("  - identity: {{}}\n    aesgcm:\n      keys:\n      - name: k\n        secret: {KEY1}\n")));
    assert!(e.contains("exactly one of"), "{e}");
    let e = err(&with(&keys("aesgcm", &[("", KEY1)])));
    assert!(e.contains("keys[0].name: is required"), "{e}");
    let e = err(&with("  - identity: {}\n").replace("EncryptionConfiguration", "Something"));
    assert!(e.contains("kind: must be EncryptionConfiguration"), "{e}");
    let e = err(&with("  - identity: {}\n").replace("/v1\n", "/v9\n"));
    assert!(e.contains("apiVersion"), "{e}");
    let e = err(&format!("{head}resources:\n- resources: [\"Secrets\"]\n  providers:\n  - identity: {{}}\n"));
    assert!(e.contains("lowercase"), "{e}");
    let e = err(&format!("{head}resources:\n- resources: [\"s*.core\"]\n  providers:\n  - identity: {{}}\n"));
    assert!(e.contains("not a resource"), "{e}");
    let e = err("resources: [");
    assert!(e.starts_with("parsing the encryption provider config"), "{e}");
    // Debug output never shows secrets.
    let c = config(&keys("aesgcm", &[("key1", KEY1)]));
    let dbg = format!("{c:?}");
    assert!(dbg.contains("aesgcm:v1:key1") && !dbg.contains(KEY1), "{dbg}");
}

#[test]
fn encoding_of_stored_values() {
    assert_eq!(Encoding::of(b"{\"a\":1}"), Encoding::Identity);
    assert_eq!(Encoding::of(b"k8s:enc:aesgcm:v1:key1:\x00:\x01").label(), "aesgcm:v1:key1");
    assert!(matches!(Encoding::of(b"k8s:enc:aesgcm:v1:key1:xyz"), Encoding::Encrypted { len: 23, .. }));
    assert_eq!(Encoding::of(b"k8s:enc:aesgcm:v1"), Encoding::Malformed);
    assert_eq!(Encoding::of(b"k8s:enc:aesgcm::key:"), Encoding::Malformed);
}

async fn next(rx: &mut mpsc::Receiver<WatchItem>) -> WatchItem {
    tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("in time").expect("open")
}

#[tokio::test]
async fn encrypted_storage_over_the_embedded_backend() {
    let dir = tempfile::tempdir().expect("tempdir");
    let inner = EmbeddedStorage::open(dir.path(), EmbeddedOptions::default()).expect("open");
    let rotated = || config(&keys("aesgcm", &[("key2", &b64(&[2u8; 32])), ("key1", KEY1)]));
    let s = EncryptedStorage::new(inner.clone(), config(&keys("aesgcm", &[("key1", KEY1)])));
    let mut watch = s.watch("/registry/", 0).await.expect("watch");

    let kv = s.create(KEY, Bytes::from_static(PLAIN)).await.expect("create");
    assert_eq!((kv.value.as_ref(), kv.stale, kv.mod_revision), (PLAIN, false, 1));
    let raw = inner.get(KEY).await.expect("get").expect("present");
    assert!(raw.value.starts_with(b"k8s:enc:aesgcm:v1:key1:"));
    assert!(!raw.value.windows(9).any(|w| w == b"ShootStat"));
    assert_eq!(s.get(KEY).await.expect("get"), Some(kv.clone()));
    let updated = s.update(KEY, Bytes::from_static(b"{\"v\":2}"), 1).await.expect("update");
    assert_eq!(updated.mod_revision, 2);
    let listed =
        s.list("/registry/", ListOptions { start_after: None, limit: 0, revision: None, ..Default::default() }).await;
    assert_eq!(listed.expect("list").items[0].value.as_ref(), b"{\"v\":2}");
    // A consistent list at an older revision reads the (encrypted) history too.
    let old = s
        .list("/registry/", ListOptions { start_after: None, limit: 0, revision: Some(1), ..Default::default() })
        .await;
    assert_eq!(old.expect("list").items[0].value.as_ref(), PLAIN);

    match next(&mut watch).await {
        WatchItem::Event(e) => assert_eq!((e.kind, e.value.as_ref()), (EventKind::Created, PLAIN)),
        other => panic!("{other:?}"),
    }
    match next(&mut watch).await {
        WatchItem::Event(e) => {
            assert_eq!(e.value.as_ref(), b"{\"v\":2}");
            assert_eq!(e.prev.as_ref().map(|p| p.value.as_ref()), Some(PLAIN));
        }
        other => panic!("{other:?}"),
    }

    // After rotation, the value reads as stale; rewriting it makes it current.
    let s2 = EncryptedStorage::new(inner.clone(), rotated());
    let cur = s2.get(KEY).await.expect("get").expect("present");
    assert!(cur.stale);
    s2.update(KEY, cur.value.clone(), cur.mod_revision).await.expect("rewrite");
    assert!(!s2.get(KEY).await.expect("get").expect("present").stale);
    let raw = inner.get(KEY).await.expect("get").expect("present");
    assert!(raw.value.starts_with(b"k8s:enc:aesgcm:v1:key2:"));

    // A reader without key2: a Corrupt error naming the key for the get, the list and the watch.
    let s1 = EncryptedStorage::new(inner.clone(), config(&keys("aesgcm", &[("key1", KEY1)])));
    let e = s1.get(KEY).await.expect_err("undecryptable");
    assert!(e.to_string().contains("aesgcm:v1:key2"), "{e}");
    assert!(s1
        .list("/registry/", ListOptions { start_after: None, limit: 0, revision: None, ..Default::default() })
        .await
        .is_err());
    let mut w1 = s1.watch("/registry/", 2).await.expect("watch");
    assert!(matches!(next(&mut w1).await, WatchItem::Error(StorageError::Corrupt(_))));

    let deleted = s2.delete(KEY, None).await.expect("delete");
    assert_eq!(deleted.value.as_ref(), b"{\"v\":2}");
}
