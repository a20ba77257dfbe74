//! A KMS v2 provider's key_id as part of a key's identity. For a local key the label (`aesgcm:v1:key1`) says which
//! key encrypted a value; for a KMS v2 provider `kms:v2:<name>` says only which plugin did: the plugin's key behind
//! it changes when Status reports a new key_id (KEP-3299: the KMS rotated its key-encryption key). So wherever a
//! key must be told from the one before it (the StorageStates' write key and counts, `storage inspect --summary`,
//! what each replica writes with), a KMS v2 key is `kms:v2:<name>:<key_id hash>`, with upstream's hash of the
//! key_id (`sha256:<hex>`, as its metrics and logs show it; the key_id itself may name the KMS key and is never
//! shown). Reads need no key_id: a provider reads every key_id its plugin still decrypts.

use super::{envelope, Encoding, EncryptionConfig, Key};
use crate::storage::encryption::resource_key_prefix;
use std::collections::BTreeMap;
use tokio::sync::watch;

/// The start of every KMS v2 label: `kms:v2:<name>`.
const KMS_LABEL: &str = "kms:v2:";

/// `kms:v2:<name>:<key_id hash>` of the provider labelled `provider` (`kms:v2:<name>`) with `key_id`.
pub fn key_id_label(provider: &str, key_id: &str) -> String {
    format!("{provider}:{}", envelope::key_id_hash(key_id))
}

/// The provider's label of a key label: `kms:v2:<name>` of `kms:v2:<name>:sha256:…`; any other label as it is.
/// (A KMS provider's name has no `:`, which the config's check enforces.)
pub fn provider_label(label: &str) -> &str {
    let Some(rest) = label.strip_prefix(KMS_LABEL) else { return label };
    match rest.find(':') {
        Some(i) => &label[..KMS_LABEL.len() + i],
        None => label,
    }
}

/// The key label of a stored value, with the key_id for a KMS v2 value (read from its `EncryptedObject`, where it
/// is not encrypted: no plugin call): `identity`, `aesgcm:v1:key1`, `kms:v2:<name>:sha256:…`, or `malformed`. A
/// KMS v2 value whose object does not decode keeps its provider's label (reading it reports why).
pub fn stored_key_label(stored: &[u8]) -> String {
    let encoding = Encoding::of(stored);
    let label = encoding.label();
    match &encoding {
        Encoding::Encrypted { provider, version, len, .. } if provider == "kms" && version == "v2" => {
            match stored_key_id_hash(&stored[*len..]) {
                Some(hash) => format!("{label}:{hash}"),
                None => label,
            }
        }
        _ => label,
    }
}

/// The key_id hash of a KMS v2 value's `EncryptedObject` (after the prefix), if it decodes and has a key_id.
pub fn stored_key_id_hash(object: &[u8]) -> Option<String> {
    envelope::decode(object).ok().map(|o| envelope::key_id_hash(&o.key_id)).filter(|h| !h.is_empty())
}

impl EncryptionConfig {
    /// What writes `resource` now, a KMS v2 provider with its key_id: `identity`, `aesgcm:v1:key1` or
    /// `kms:v2:<name>:sha256:…`. `None` while the KMS v2 provider that writes has no key_id yet (before its first
    /// good Status and Encrypt): what it will write with is not known.
    pub fn write_key_id_label_for_resource(&self, resource: &str) -> Option<String> {
        match self.transformer(&resource_key_prefix(resource)).writer.as_deref() {
            None => Some(super::super::replicas::IDENTITY.to_string()),
            Some(Key::Local(k)) => Some(k.label()),
            Some(Key::Kms(p)) => p.write_key_id().map(|id| key_id_label(&p.label(), &id)),
        }
    }

    /// The key_id hash each KMS v2 provider writes with, by its label (`kms:v2:<name>`); providers without a key_id
    /// yet are left out. What a replica reports beside its keys ([`super::super::replicas::KeyReport`]).
    pub fn write_key_id_hashes(&self) -> BTreeMap<String, String> {
        self.kms.iter().filter_map(|p| p.write_key_id().map(|id| (p.label(), envelope::key_id_hash(&id)))).collect()
    }

    /// Wakes when a KMS v2 provider of this config adopts a new key_id.
    pub fn key_id_changes(&self) -> KeyIdChanges {
        KeyIdChanges(self.kms.iter().map(|p| p.subscribe_key_id()).collect())
    }
}

/// The key_id changes of a config's KMS v2 providers ([`EncryptionConfig::key_id_changes`]).
pub struct KeyIdChanges(Vec<watch::Receiver<Option<String>>>);

impl KeyIdChanges {
    /// Returns at the next change of any provider's key_id since the last call (or since
    /// [`EncryptionConfig::key_id_changes`]); never, without KMS v2 providers or once they are all dropped.
    pub async fn changed(&mut self) {
        let live: Vec<_> = self.0.iter_mut().filter(|r| r.has_changed().is_ok()).collect();
        if live.is_empty() {
            return std::future::pending().await;
        }
        let changes = live.into_iter().map(|r| Box::pin(async move { r.changed().await.is_ok() }));
        let (changed, _, _) = futures::future::select_all(changes).await;
        if !changed {
            // That provider is gone (its config replaced): the caller moves on to the next config's changes.
            std::future::pending::<()>().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_id_labels_name_the_provider_and_the_hash_of_the_key_id() {
        let label = key_id_label("kms:v2:vault", "key-1");
        assert_eq!(label, format!("kms:v2:vault:{}", envelope::key_id_hash("key-1")));
        assert!(label.starts_with("kms:v2:vault:sha256:") && !label.contains("key-1"), "{label}");
        assert_eq!(provider_label(&label), "kms:v2:vault");
        assert_eq!(provider_label("kms:v2:vault"), "kms:v2:vault");
        assert_eq!(provider_label("aesgcm:v1:key1"), "aesgcm:v1:key1");
        assert_eq!(provider_label("identity"), "identity");
    }

    #[test]
    fn a_stored_value_is_labelled_with_its_key_id() {
        let object = super::super::proto::EncryptedObject {
            encrypted_data: vec![1, 2, 3],
            key_id: "key-2".into(),
            encrypted_dek_source: vec![4; 32],
            annotations: Default::default(),
            encrypted_dek_source_type: super::super::proto::EncryptedDekSourceType::HkdfSha256XnonceAesGcmSeed as i32,
        };
        let mut stored = b"k8s:enc:kms:v2:vault:".to_vec();
        stored.extend(envelope::encode(&object).expect("encode"));
        assert_eq!(stored_key_label(&stored), key_id_label("kms:v2:vault", "key-2"));
        // Not a KMS v2 object after the prefix: the provider's label, the read says why.
        assert_eq!(stored_key_label(b"k8s:enc:kms:v2:vault:\xff\xff"), "kms:v2:vault");
        assert_eq!(stored_key_label(b"k8s:enc:aesgcm:v1:key1:\x00\x01"), "aesgcm:v1:key1");
        assert_eq!(stored_key_label(b"{}"), "identity");
    }
}
