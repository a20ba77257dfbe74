//! The stored format against kube-apiserver's own recorded values, and its checks.

use super::*;
use base64::Engine;

const PREFIX: &[u8] = b"k8s:enc:kms:v2:kms-provider:";
/// The etcd key of upstream's TestKMSv2ProviderLegacyData values: the associated data of their encryption.
const LEGACY_KEY_PREFIX: &str = "/43da1478-5e9c-4ef3-a92a-2b19d540c8a5/registry/secrets/kms-v2-legacy-data/";
/// Written by kube-apiserver v1.27.0: type 0 (an AES-GCM key as DEK source).
const V1_27_AES_GCM_KEY: &[u8] = include_bytes!("testdata/v1.27-aes-gcm-key.bin");
/// Written by kube-apiserver v1.28.0: type 1 (an HKDF seed as DEK source).
const V1_28_HKDF_SEED: &[u8] = include_bytes!("testdata/v1.28-hkdf-seed.bin");

/// upstream's base64 mock plugin "encrypts" by base64-encoding, so the DEK source is the base64 decoding.
fn mock_plugin_decrypt(o: &EncryptedObject) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(&o.encrypted_dek_source).expect("base64 DEK source")
}

fn decrypt_legacy(stored: &[u8], name: &str) -> (EncryptedObject, Vec<u8>) {
    let o = decode(stored.strip_prefix(PREFIX).expect("prefix")).expect("decode");
    let source = DataKeySource::new(o.encrypted_dek_source_type, mock_plugin_decrypt(&o)).expect("DEK source");
    let aad = format!("{LEGACY_KEY_PREFIX}{name}");
    let plain = source.open(&o.encrypted_data, aad.as_bytes()).expect("decrypt");
    (o, plain)
}

fn local_kek_annotations() -> HashMap<String, Vec<u8>> {
    HashMap::from([("local-kek.kms.kubernetes.io".to_string(), b"encrypted-local-kek".to_vec())])
}

#[test]
fn decrypts_the_type_0_value_kube_apiserver_1_27_wrote() {
    let (o, plain) = decrypt_legacy(V1_27_AES_GCM_KEY, "dek-source-aes-gcm-key");
    assert_eq!(o.encrypted_dek_source_type, EncryptedDekSourceType::AesGcmKey as i32);
    assert_eq!(o.key_id, "1");
    assert_eq!(o.encrypted_dek_source, b"gafIvwT0ASoKdZ/D1L2SlH73LUMj5qa3hroljfS51wc=");
    assert_eq!(o.annotations, local_kek_annotations());
    assert_eq!(plain.len(), 366);
    assert!(plain.starts_with(b"k8s\0"), "protobuf magic");
    assert!(plain.windows(7).any(|w| w == b"api_key"));
    // The same bytes under another key (the associated data) do not decrypt.
    let source = DataKeySource::new(0, mock_plugin_decrypt(&o)).expect("DEK source");
    assert!(source.open(&o.encrypted_data, b"/registry/secrets/kms-v2-legacy-data/other").is_err());
}

#[test]
fn decrypts_the_type_1_value_kube_apiserver_1_28_wrote() {
    let (o, plain) = decrypt_legacy(V1_28_HKDF_SEED, "dek-source-hkdf-sha256-xnonce-aes-gcm-seed");
    assert_eq!(o.encrypted_dek_source_type, EncryptedDekSourceType::HkdfSha256XnonceAesGcmSeed as i32);
    assert_eq!(o.key_id, "1");
    assert_eq!(o.encrypted_dek_source, b"/+WnKXQEM/AhXICYRNBeGk+WSuB+7OBuSYJTbP66Zyc=");
    assert_eq!(o.annotations, local_kek_annotations());
    assert_eq!(plain.len(), 405);
    assert!(plain.starts_with(b"k8s\0"), "protobuf magic");
    assert!(plain.windows(42).any(|w| w == b"dek-source-hkdf-sha256-xnonce-aes-gcm-seed"));
}

#[test]
fn what_is_written_reads_back_and_only_under_its_key() {
    let seed = DataKeySource::random_seed().expect("seed");
    let data = seed.seal(b"plaintext", b"/registry/a").expect("seal");
    assert_eq!(data.len(), 32 + 12 + b"plaintext".len() + 16);
    assert_eq!(seed.open(&data, b"/registry/a").expect("open"), b"plaintext");
    assert!(seed.open(&data, b"/registry/b").is_err());
    // Each write derives its own key: the same plaintext never encrypts the same way twice.
    assert_ne!(seed.seal(b"plaintext", b"/registry/a").expect("seal"), data);
    assert!(seed.open(&data[..40], b"/registry/a").is_err(), "too short is an error, not a panic");
}

#[test]
fn key_id_hashes_are_upstreams() {
    assert_eq!(key_id_hash("1"), "sha256:6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b");
    assert_eq!(key_id_hash("2"), "sha256:d4735e3a265e16eee03f59718b9b5d03019c07d8b6c51f90da3a666eec13ab35");
    assert_eq!(key_id_hash(""), "");
}

#[test]
fn invalid_objects_are_refused_on_decode_and_encode() {
    let valid = || EncryptedObject {
        encrypted_data: vec![1],
        key_id: "k".into(),
        encrypted_dek_source: vec![2],
        annotations: HashMap::new(),
        encrypted_dek_source_type: 1,
    };
    assert!(encode(&valid()).is_ok());
    let cases: Vec<(EncryptedObject, &str)> = vec![
        (EncryptedObject { encrypted_dek_source_type: 2, ..valid() }, "unknown encryptedDEKSourceType: 2"),
        (EncryptedObject { encrypted_data: vec![], ..valid() }, "encrypted data is empty"),
        (EncryptedObject { encrypted_dek_source: vec![], ..valid() }, "encrypted DEK source is empty"),
        (EncryptedObject { encrypted_dek_source: vec![0; 1025], ..valid() }, "1025 bytes, which exceeds"),
        (EncryptedObject { key_id: String::new(), ..valid() }, "keyID is empty"),
        (EncryptedObject { key_id: "k".repeat(1025), ..valid() }, "keyID is 1025 bytes"),
        (
            EncryptedObject { annotations: HashMap::from([("nodots".into(), vec![])]), ..valid() },
            "annotations: Invalid value: \"nodots\"",
        ),
        (
            EncryptedObject { annotations: HashMap::from([("a.b".into(), vec![0; 32 * 1024])]), ..valid() },
            "total size of annotations is 32771",
        ),
    ];
    for (o, want) in cases {
        let e = encode(&o).expect_err(want);
        assert!(e.contains(want), "{e} should contain {want}");
        let e = decode(&o.encode_to_vec()).expect_err(want);
        assert!(e.contains(want), "{e} should contain {want}");
    }
    assert!(decode(b"\xff\xff").expect_err("garbage").contains("failed to unmarshal"));
}

#[test]
fn cache_keys_differ_in_each_part_and_ignore_annotation_order() {
    let a = local_kek_annotations();
    let base = cache_key(1, b"src", "k", &a);
    assert_ne!(base, cache_key(0, b"src", "k", &a));
    assert_ne!(base, cache_key(1, b"src2", "k", &a));
    assert_ne!(base, cache_key(1, b"src", "k2", &a));
    assert_ne!(base, cache_key(1, b"src", "k", &HashMap::new()));
    let mut two = a.clone();
    two.insert("b.example.com".into(), b"x".to_vec());
    let mut two_again = HashMap::new();
    two_again.insert("b.example.com".into(), b"x".to_vec());
    two_again.extend(a);
    assert_eq!(cache_key(1, b"src", "k", &two), cache_key(1, b"src", "k", &two_again));
}
