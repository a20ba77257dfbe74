//! Encryption at rest, as kube-apiserver does it: the `EncryptionConfiguration` file (`--encryption-provider-config`),
//! its providers (aesgcm, aescbc, secretbox, identity) with kube-apiserver's on-disk format, and [`EncryptedStorage`],
//! the transformer between the registry and a backend.
//!
//! Stored values are `k8s:enc:<provider>:v1:<keyname>:` followed by
//! - aesgcm: a 12-byte random nonce, then the AES-GCM ciphertext and tag; the additional authenticated data is the
//!   storage key, so a value copied to another key does not decrypt;
//! - aescbc: a 16-byte random IV, then the AES-CBC ciphertext of the PKCS#7-padded value;
//! - secretbox: a 24-byte random nonce, then NaCl's secretbox (Poly1305 tag, then XSalsa20 ciphertext);
//! - kms (apiVersion v2): `k8s:enc:kms:v2:<name>:` and a protobuf `EncryptedObject` ([`kms`]), its data key derived
//!   from a seed that the KMS plugin encrypts.
//!
//! A value without the `k8s:enc:` prefix is plaintext (identity). Per resource, the first provider and its first key
//! write; every key of every provider listed for the resource reads. A value not written by the current writer is
//! marked [`KeyValue::stale`], so that a no-op rewrite re-encrypts it (key rotation, enabling encryption).

mod storage;
pub use storage::EncryptedStorage;
mod handle;
pub use handle::{EncryptionConfigHandle, KeyInUse, ReloadError};
mod pattern;
use pattern::Pattern;
mod cipher;
pub mod key_reports;
pub mod kms;
pub mod replicas;

use super::{CorruptValue, KeyValue, Result, StorageError};
use base64::Engine;
use bytes::Bytes;
use cipher::DataKey;
use kms::KmsProvider;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// What every encrypted value starts with.
pub const ENCRYPTED_PREFIX: &str = "k8s:enc:";

const API_VERSION: &str = "apiserver.config.k8s.io/v1";
const KIND: &str = "EncryptionConfiguration";

/// An invalid or unreadable `--encryption-provider-config`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading the encryption provider config {path}: {message}")]
    Read { path: String, message: String },
    #[error("parsing the encryption provider config: {0}")]
    Parse(String),
    #[error("invalid encryption provider config: {field}: {message}")]
    Invalid { field: String, message: String },
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { field: field.into(), message: message.into() }
}

// --- The file format (kube-apiserver's apiserver.config.k8s.io/v1 EncryptionConfiguration) ---

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileConfig {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(default)]
    resources: Vec<FileResources>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileResources {
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    providers: Vec<FileProvider>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileProvider {
    aesgcm: Option<FileKeys>,
    aescbc: Option<FileKeys>,
    secretbox: Option<FileKeys>,
    identity: Option<FileIdentity>,
    kms: Option<kms::FileKms>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileKeys {
    #[serde(default)]
    keys: Vec<FileKey>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileKey {
    #[serde(default)]
    name: String,
    #[serde(default)]
    secret: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileIdentity {}

// --- Providers and keys ---

/// The encrypting providers (identity is the absence of one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provider {
    AesGcm,
    AesCbc,
    Secretbox,
}

impl Provider {
    pub fn name(self) -> &'static str {
        match self {
            Provider::AesGcm => "aesgcm",
            Provider::AesCbc => "aescbc",
            Provider::Secretbox => "secretbox",
        }
    }
}

/// How a stored value is encoded, from its prefix alone (no key needed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// No `k8s:enc:` prefix: plaintext.
    Identity,
    /// `k8s:enc:<provider>:<version>:<key>:`; `len` is the prefix length.
    Encrypted { provider: String, version: String, key: String, len: usize },
    /// Starts with `k8s:enc:` but the rest of the prefix is not well-formed.
    Malformed,
}

impl Encoding {
    pub fn of(value: &[u8]) -> Encoding {
        let Some(rest) = value.strip_prefix(ENCRYPTED_PREFIX.as_bytes()) else {
            return Encoding::Identity;
        };
        // Provider, version and key name are short colon-terminated fields; never look far into the ciphertext.
        let mut fields = Vec::with_capacity(3);
        let mut start = 0;
        for (i, &b) in rest.iter().enumerate().take(512) {
            if b == b':' {
                match std::str::from_utf8(&rest[start..i]) {
                    Ok(f) if !f.is_empty() => fields.push(f.to_owned()),
                    _ => return Encoding::Malformed,
                }
                start = i + 1;
                if fields.len() == 3 {
                    let key = fields.pop().unwrap_or_default();
                    let version = fields.pop().unwrap_or_default();
                    let provider = fields.pop().unwrap_or_default();
                    return Encoding::Encrypted { provider, version, key, len: ENCRYPTED_PREFIX.len() + start };
                }
            }
        }
        Encoding::Malformed
    }

    /// `identity`, `aesgcm:v1:key1`, or `malformed`: what `storage inspect` prints.
    pub fn label(&self) -> String {
        match self {
            Encoding::Identity => "identity".into(),
            Encoding::Encrypted { provider, version, key, .. } => format!("{provider}:{version}:{key}"),
            Encoding::Malformed => "malformed".into(),
        }
    }
}

/// A key that encrypts values: one named key of aesgcm, aescbc or secretbox, or a KMS v2 provider.
enum Key {
    Local(Box<DataKey>),
    Kms(Arc<KmsProvider>),
}

impl Key {
    /// `aesgcm:v1:key1`, `kms:v2:<name>`.
    fn label(&self) -> String {
        match self {
            Key::Local(k) => k.label(),
            Key::Kms(p) => p.label(),
        }
    }

    fn encrypt(&self, key: &str, plaintext: &[u8]) -> Result<Vec<u8>> {
        match self {
            Key::Local(k) => k.encrypt(key, plaintext),
            Key::Kms(p) => p.encrypt(key, plaintext),
        }
    }
}

#[cfg(test)]
impl Key {
    /// A local key's stored form with a given nonce (the tests' known-answer vectors).
    fn encrypt_with_nonce(&self, key: &str, plaintext: &[u8], nonce: &[u8]) -> Result<Vec<u8>> {
        match self {
            Key::Local(k) => k.encrypt_with_nonce(key, plaintext, nonce),
            Key::Kms(_) => Err(StorageError::Internal("a KMS provider's writes take no nonce".into())),
        }
    }
}

/// The providers of one `resources` entry: the writer and every key that reads.
struct Transformer {
    /// The first provider's first key; `None` when identity writes.
    writer: Option<Arc<Key>>,
    /// By `<provider>:v1:<name>` (`kms:v2:<name>`).
    readers: HashMap<String, Arc<Key>>,
    /// Every key's label (`identity` for plaintext) in config order, the writer first: what the replica reports
    /// to the others ([`replicas`]).
    order: Vec<String>,
}

impl Transformer {
    fn identity() -> Self {
        Self { writer: None, readers: HashMap::new(), order: Vec::new() }
    }
}

/// The result of reading a stored value.
#[derive(Debug, PartialEq, Eq)]
pub struct Decrypted {
    pub value: Bytes,
    /// Not written by the current writer for its resource: a rewrite would change the stored encoding.
    pub stale: bool,
    /// A KMS v2 value under another key_id (or DEK source type) than its provider writes with now: stale whichever
    /// provider the replicas agree to write with ([`storage::EncryptedStorage`] with a write gate).
    pub key_id_stale: bool,
}

/// A parsed, validated `EncryptionConfiguration`.
pub struct EncryptionConfig {
    rules: Vec<(Vec<Pattern>, Transformer)>,
    identity: Transformer,
    /// The KMS v2 providers in config order: `kms-provider-<i>` of the `kms-providers` health check.
    kms: Vec<Arc<KmsProvider>>,
    /// [`EncryptionConfig::hash`].
    hash: String,
}

impl std::fmt::Debug for EncryptionConfig {
    // Never print keys.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncryptionConfig").field("resources", &self.describe()).finish()
    }
}

impl EncryptionConfig {
    pub fn from_file(path: &Path) -> std::result::Result<Self, ConfigError> {
        let bytes = std::fs::read(path)
            .map_err(|e| ConfigError::Read { path: path.display().to_string(), message: e.to_string() })?;
        Self::from_bytes(&bytes)
    }

    /// The config in a file's bytes (its [`Self::hash`] is theirs).
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<Self, ConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|e| ConfigError::Parse(format!("not UTF-8: {e}")))?;
        Self::from_yaml(text)
    }

    pub fn from_yaml(text: &str) -> std::result::Result<Self, ConfigError> {
        let file: FileConfig = serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        match file.kind.as_deref() {
            Some(KIND) => {}
            other => return Err(invalid("kind", format!("must be {KIND}, got {:?}", other.unwrap_or_default()))),
        }
        match file.api_version.as_deref() {
            Some(API_VERSION) => {}
            other => {
                return Err(invalid(
                    "apiVersion",
                    format!("must be {API_VERSION}, got {:?}", other.unwrap_or_default()),
                ))
            }
        }
        if file.resources.is_empty() {
            return Err(invalid("resources", "must list at least one resources entry"));
        }
        let mut kms = Vec::new();
        let rules =
            file.resources.iter().enumerate().map(|(i, entry)| rule(&format!("resources[{i}]"), entry, &mut kms));
        Ok(Self {
            rules: rules.collect::<std::result::Result<_, _>>()?,
            identity: Transformer::identity(),
            kms,
            hash: content_hash(text.as_bytes()),
        })
    }

    /// The hash of the file's bytes, as kube-apiserver computes the one it exposes in
    /// `apiserver_encryption_config_controller_last_config_info{hash}` (k8s.io/apiserver
    /// `pkg/server/options/encryptionconfig/config.go`, `computeEncryptionConfigHash`):
    /// `k8s:enc:unstable:1:<hex of sha256>`. Any edit of the file changes it, whitespace included.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// What writes the values of `resource` (`shootstates.core.gardener.cloud`, `secrets` for the core group):
    /// `identity` or e.g. `aesgcm:v1:key1`, the label [`Encoding::label`] prints for a value it writes.
    pub fn write_key_for_resource(&self, resource: &str) -> String {
        self.writer_for(&resource_key_prefix(resource))
    }

    /// Whether a value of `resource` encrypted with the key `label` (`aesgcm:v1:key1`; a KMS v2 provider with or
    /// without its key_id, `kms:v2:<name>[:sha256:…]`: the provider reads every key_id) can be read. Plaintext
    /// (`identity`) always can.
    pub fn reads_for_resource(&self, resource: &str, label: &str) -> bool {
        let label = kms::provider_label(label);
        label == "identity" || self.transformer(&resource_key_prefix(resource)).readers.contains_key(label)
    }

    /// The resources the file names one by one (not by `*.<group>` or `*.*`).
    pub fn named_resources(&self) -> Vec<String> {
        let named = self.rules.iter().flat_map(|(ps, _)| ps.iter().filter(|p| matches!(p, Pattern::Resource { .. })));
        named.map(pattern_name).collect()
    }

    fn transformer(&self, key: &str) -> &Transformer {
        self.rules.iter().find(|(ps, _)| ps.iter().any(|p| p.matches(key))).map(|(_, t)| t).unwrap_or(&self.identity)
    }

    /// What writes the values of `key`: `identity` or e.g. `aesgcm:v1:key1`.
    pub fn writer_for(&self, key: &str) -> String {
        self.transformer(key).writer.as_ref().map(|w| w.label()).unwrap_or_else(|| "identity".into())
    }

    /// One line per resources entry (patterns and the writer), for logs. Never includes secrets.
    pub fn describe(&self) -> Vec<String> {
        self.rules
            .iter()
            .map(|(ps, t)| {
                let names: Vec<String> = ps.iter().map(pattern_name).collect();
                let writer = t.writer.as_ref().map(|w| w.label()).unwrap_or_else(|| "identity".into());
                format!("{} -> {writer}", names.join(","))
            })
            .collect()
    }

    /// The stored form of `plaintext` under the storage key `key`.
    pub fn encrypt(&self, key: &str, plaintext: &[u8]) -> Result<Bytes> {
        match &self.transformer(key).writer {
            None => Ok(Bytes::copy_from_slice(plaintext)),
            Some(w) => w.encrypt(key, plaintext).map(Bytes::from),
        }
    }

    /// The stored form of `plaintext` under `key` written with the key labelled `writer` (`identity`: plaintext),
    /// one of this config's keys for `key` that every replica reads ([`replicas::WriteGate`]); the configured writer
    /// when the config has no such key for `key`.
    pub fn encrypt_with(&self, key: &str, plaintext: &[u8], writer: &str) -> Result<Bytes> {
        let t = self.transformer(key);
        if writer == replicas::IDENTITY && t.order.iter().any(|k| k == writer) {
            return Ok(Bytes::copy_from_slice(plaintext));
        }
        match t.readers.get(writer) {
            Some(dk) => dk.encrypt(key, plaintext).map(Bytes::from),
            None => self.encrypt(key, plaintext),
        }
    }

    /// The plaintext of a value stored under `key`, and whether its stored encoding is out of date. A value whose
    /// prefix names a key this configuration does not have for the resource is an `Internal` error naming that key.
    pub fn decrypt(&self, key: &str, stored: &Bytes) -> Result<Decrypted> {
        let t = self.transformer(key);
        let encoding = Encoding::of(stored);
        match &encoding {
            Encoding::Identity => {
                Ok(Decrypted { value: stored.clone(), stale: t.writer.is_some(), key_id_stale: false })
            }
            Encoding::Malformed => Err(StorageError::Internal(format!(
                "cannot decrypt {key}: the stored value starts with {ENCRYPTED_PREFIX:?} but has no valid \
                 <provider>:<version>:<key>: prefix"
            ))),
            Encoding::Encrypted { len, .. } => {
                let label = encoding.label();
                let Some(dk) = t.readers.get(&label) else {
                    return Err(StorageError::Internal(format!(
                        "cannot decrypt {key}: it is encrypted with {label}, and the encryption provider config has \
                         no such key for this resource"
                    )));
                };
                let written_by_writer = t.writer.as_ref().is_some_and(|w| Arc::ptr_eq(w, dk));
                let (plain, key_id_stale) = match &**dk {
                    Key::Local(k) => (k.decrypt(key, &stored[*len..])?, false),
                    // Stale too when written under another key_id than the provider's write key_id.
                    Key::Kms(p) => p.decrypt(key, &stored[*len..])?,
                };
                Ok(Decrypted { value: Bytes::from(plain), stale: key_id_stale || !written_by_writer, key_id_stale })
            }
        }
    }

    /// The plaintext of a stored key-value; a value that does not decrypt is [`StorageError::Corrupt`].
    fn decrypt_kv(&self, kv: KeyValue) -> Result<KeyValue> {
        self.try_decrypt_kv(kv).map_err(|v| StorageError::Corrupt(vec![v]))
    }

    fn try_decrypt_kv(&self, mut kv: KeyValue) -> std::result::Result<KeyValue, CorruptValue> {
        let d = self
            .decrypt(&kv.key, &kv.value)
            .map_err(|e| CorruptValue { key: kv.key.clone(), message: e.to_string() })?;
        kv.value = d.value;
        kv.stale = kv.stale || d.stale;
        Ok(kv)
    }
}

/// `k8s:enc:unstable:1:<hex of sha256(bytes)>`: see [`EncryptionConfig::hash`].
pub fn content_hash(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("k8s:enc:unstable:1:{:x}", sha2::Sha256::digest(bytes))
}

/// A pattern as the file writes it.
fn pattern_name(p: &Pattern) -> String {
    match p {
        Pattern::All => "*.*".to_string(),
        Pattern::Group(g) => format!("*.{g}"),
        Pattern::Resource { resource, group } if group.is_empty() => resource.clone(),
        Pattern::Resource { resource, group } => format!("{resource}.{group}"),
    }
}

/// The storage key prefix of `resource` (`shootstates.core.gardener.cloud` -> `/registry/core.gardener.cloud/
/// shootstates/`, `secrets` -> `/registry/secrets/`), as the registry lays keys out.
pub fn resource_key_prefix(resource: &str) -> String {
    match resource.split_once('.') {
        Some((resource, group)) => format!("/registry/{group}/{resource}/"),
        None => format!("/registry/{resource}/"),
    }
}

/// The resource a storage key belongs to, as [`resource_key_prefix`] lays them out: `/registry/<group>/<resource>/..`
/// (a group has a dot) is `<resource>.<group>`, `/registry/<resource>/..` is `<resource>`; `None` outside
/// `/registry/`.
pub fn resource_of_key(key: &str) -> Option<String> {
    let mut parts = key.strip_prefix("/registry/")?.split('/');
    let first = parts.next().filter(|f| !f.is_empty())?;
    if !first.contains('.') {
        return Some(first.to_string());
    }
    let resource = parts.next().filter(|r| !r.is_empty())?;
    Some(format!("{resource}.{first}"))
}

/// One resources entry: the resources it covers and how they are transformed.
fn rule(
    field: &str,
    entry: &FileResources,
    kms: &mut Vec<Arc<KmsProvider>>,
) -> std::result::Result<(Vec<Pattern>, Transformer), ConfigError> {
    if entry.resources.is_empty() {
        return Err(invalid(format!("{field}.resources"), "must list at least one resource"));
    }
    let mut patterns = Vec::new();
    for (j, r) in entry.resources.iter().enumerate() {
        let p = Pattern::parse(r).map_err(|m| invalid(format!("{field}.resources[{j}]"), m.to_string()))?;
        if patterns.contains(&p) {
            return Err(invalid(format!("{field}.resources[{j}]"), format!("{r:?} is listed twice")));
        }
        patterns.push(p);
    }
    if entry.providers.is_empty() {
        return Err(invalid(format!("{field}.providers"), "must list at least one provider"));
    }
    let mut t = Transformer::identity();
    for (j, p) in entry.providers.iter().enumerate() {
        add_provider(&mut t, &format!("{field}.providers[{j}]"), j == 0, p, kms)?;
    }
    Ok((patterns, t))
}

/// A provider's keys as readers of `t`; the first key of the first provider also writes. Identity adds nothing: it
/// reads plaintext (always readable) and, when first, writes it.
fn add_provider(
    t: &mut Transformer,
    field: &str,
    first: bool,
    p: &FileProvider,
    kms: &mut Vec<Arc<KmsProvider>>,
) -> std::result::Result<(), ConfigError> {
    let set = [p.aesgcm.is_some(), p.aescbc.is_some(), p.secretbox.is_some(), p.identity.is_some(), p.kms.is_some()];
    if set.iter().filter(|s| **s).count() != 1 {
        return Err(invalid(field, "exactly one of kms, aesgcm, aescbc, secretbox or identity ({}) must be set"));
    }
    if let Some(k) = &p.kms {
        let names: Vec<String> = kms.iter().map(|p| p.name().to_string()).collect();
        let checked = k.check(&format!("{field}.kms"), &names).map_err(|(f, m)| invalid(f, m))?;
        let timings = kms::timings::Timings::from_env().map_err(|m| invalid(format!("{field}.kms"), m))?;
        let provider = Arc::new(KmsProvider::new(&checked.name, checked.address, checked.timeout, timings));
        kms.push(provider.clone());
        let key = Arc::new(Key::Kms(provider));
        if first {
            t.writer = Some(key.clone());
        }
        t.order.push(key.label());
        t.readers.insert(key.label(), key);
        return Ok(());
    }
    let (provider, keys) = match (&p.aesgcm, &p.aescbc, &p.secretbox) {
        (Some(k), _, _) => (Provider::AesGcm, k),
        (_, Some(k), _) => (Provider::AesCbc, k),
        (_, _, Some(k)) => (Provider::Secretbox, k),
        _ => {
            t.order.push(replicas::IDENTITY.to_string());
            return Ok(());
        }
    };
    let field = format!("{field}.{}.keys", provider.name());
    if keys.keys.is_empty() {
        return Err(invalid(field, "must list at least one key"));
    }
    for (k, key) in keys.keys.iter().enumerate() {
        let dk = Arc::new(Key::Local(Box::new(data_key(&format!("{field}[{k}]"), provider, key, t)?)));
        if first && k == 0 {
            t.writer = Some(dk.clone());
        }
        t.order.push(dk.label());
        t.readers.insert(dk.label(), dk);
    }
    Ok(())
}

/// A key of `provider`, checked, and not yet among `t`'s readers.
fn data_key(
    field: &str,
    provider: Provider,
    key: &FileKey,
    t: &Transformer,
) -> std::result::Result<DataKey, ConfigError> {
    if key.name.is_empty() {
        return Err(invalid(format!("{field}.name"), "is required"));
    }
    if key.name.contains(':') || key.name.chars().any(char::is_whitespace) {
        return Err(invalid(format!("{field}.name"), format!("{:?} must not contain ':' or whitespace", key.name)));
    }
    if key.secret.is_empty() {
        return Err(invalid(format!("{field}.secret"), "is required"));
    }
    let secret = base64::engine::general_purpose::STANDARD
        .decode(key.secret.trim())
        .map_err(|e| invalid(format!("{field}.secret"), format!("is not valid base64 (key {:?}): {e}", key.name)))?;
    let dk = DataKey::new(provider, &key.name, &secret)
        .map_err(|m| invalid(format!("{field}.secret"), format!("{m} (key {:?})", key.name)))?;
    if t.readers.contains_key(&dk.label()) {
        return Err(invalid(
            format!("{field}.name"),
            format!("{:?} is used twice for {} in this resources entry", key.name, provider.name()),
        ));
    }
    Ok(dk)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod reload_tests;
