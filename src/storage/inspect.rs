//! `migration-apiserver storage inspect`: what the embedded store holds, key by key, with each value's encryption
//! and stored apiVersion, so that operators can verify encryption at rest. Never prints values.

use super::embedded::EmbeddedStorage;
use super::encryption::kms::{stored_key_id_hash, stored_key_label};
use super::encryption::{resource_of_key, Encoding, EncryptionConfig};
use super::{ListOptions, Storage, StorageError};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// One stored key.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct InspectEntry {
    pub key: String,
    /// The revision that last modified the key (the object's resourceVersion).
    pub revision: u64,
    /// `identity`, or the prefix's `<provider>:<version>:<keyname>` (e.g. `aesgcm:v1:key1`, `kms:v2:<name>`).
    pub encryption: String,
    /// A KMS v2 value's key_id, hashed as upstream logs it (`sha256:<hex>`): which of the plugin's keys encrypted its
    /// seed. Read from the stored object, no plugin needed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_id_hash: Option<String>,
    /// The stored object's apiVersion; `<encrypted>` when it is encrypted and no config was given, `<error>` when it
    /// cannot be decrypted with the given config.
    pub api_version: String,
    /// Bytes as stored (prefix, nonce and ciphertext included).
    pub size: usize,
    /// With a config: whether a rewrite would change the stored encoding (old key, old provider, plaintext).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale: Option<bool>,
    /// With a config: why the value cannot be decrypted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The keys under `prefix` in the store in `data_dir` (the server must be stopped). With `config`, values are
/// decrypted in memory to read their apiVersion (not those of KMS v2 providers, whose plugins only the async
/// [`inspect_checked`] asks).
pub fn inspect(data_dir: &Path, config: Option<&EncryptionConfig>, prefix: &str) -> anyhow::Result<Vec<InspectEntry>> {
    Ok(describe(EmbeddedStorage::scan(data_dir, prefix)?, config, &|_| Ok(()), &Default::default()))
}

/// How the layer above reads a plaintext value: `Err` with why it cannot (set as the entry's `error`).
pub type ReadCheck<'a> = &'a dyn Fn(&[u8]) -> Result<(), Box<dyn std::error::Error>>;

/// [`inspect`] (or [`inspect_etcd`] with `etcd`) with every plaintext value also given to `check`.
pub async fn inspect_checked(
    data_dir: &Path,
    etcd: Option<&super::etcd::EtcdArgs>,
    config: Option<&EncryptionConfig>,
    prefix: &str,
    check: ReadCheck<'_>,
) -> anyhow::Result<Vec<InspectEntry>> {
    let stored = match etcd {
        Some(etcd) => scan_etcd(etcd, prefix).await?,
        None => EmbeddedStorage::scan(data_dir, prefix)?,
    };
    let unavailable = prepare_kms(config, &stored).await;
    Ok(describe(stored, config, check, &unavailable))
}

/// With KMS v2 providers: their plugins are asked for the DEK sources of the values, as the server would (one
/// Decrypt per seed). Returns why each value whose DEK source could not be had is unreadable.
async fn prepare_kms(
    config: Option<&EncryptionConfig>,
    stored: &[super::KeyValue],
) -> std::collections::HashMap<String, String> {
    let mut unavailable = std::collections::HashMap::new();
    let Some(config) = config.filter(|c| c.has_kms()) else { return unavailable };
    config.start_kms().await;
    for kv in stored {
        if let Err(e) = config.prepare(&kv.key, &kv.value).await {
            unavailable.insert(kv.key.clone(), e.to_string());
        }
    }
    unavailable
}

/// The same for keys read from etcd (`storage inspect --etcd-servers`).
pub async fn inspect_etcd(
    etcd: &super::etcd::EtcdArgs,
    config: Option<&EncryptionConfig>,
    prefix: &str,
) -> anyhow::Result<Vec<InspectEntry>> {
    let stored = scan_etcd(etcd, prefix).await?;
    let unavailable = prepare_kms(config, &stored).await;
    Ok(describe(stored, config, &|_| Ok(()), &unavailable))
}

async fn scan_etcd(etcd: &super::etcd::EtcdArgs, prefix: &str) -> anyhow::Result<Vec<super::KeyValue>> {
    let client = etcd.connect().await?;
    let opts = super::etcd::EtcdOptions {
        history: super::HistoryLimit::events(1),
        max_value_bytes: usize::MAX,
        compaction_interval: std::time::Duration::ZERO,
    };
    let store = super::etcd::EtcdStorage::open(client, &etcd.prefix, opts).await?;
    Ok(store.scan(prefix).await?)
}

fn describe(
    stored: Vec<super::KeyValue>,
    config: Option<&EncryptionConfig>,
    check: ReadCheck,
    unavailable: &std::collections::HashMap<String, String>,
) -> Vec<InspectEntry> {
    stored
        .into_iter()
        .map(|kv| {
            let encoding = Encoding::of(&kv.value);
            let key_id_hash = match &encoding {
                Encoding::Encrypted { provider, len, .. } if provider == "kms" => stored_key_id_hash(&kv.value[*len..]),
                _ => None,
            };
            let mut entry = InspectEntry {
                encryption: encoding.label(),
                key_id_hash,
                api_version: String::new(),
                size: kv.value.len(),
                revision: kv.mod_revision,
                key: kv.key.clone(),
                stale: None,
                error: None,
            };
            match (config, encoding) {
                (None, Encoding::Identity) => {
                    entry.api_version = api_version(&kv.value);
                    entry.error = check(&kv.value).err().map(|e| e.to_string());
                }
                (None, _) => entry.api_version = "<encrypted>".into(),
                (Some(_), _) if unavailable.contains_key(&kv.key) => {
                    entry.api_version = "<error>".into();
                    entry.error = unavailable.get(&kv.key).cloned();
                }
                (Some(c), _) => match c.decrypt(&kv.key, &kv.value) {
                    Ok(d) => {
                        entry.api_version = api_version(&d.value);
                        entry.stale = Some(d.stale);
                        entry.error = check(&d.value).err().map(|e| e.to_string());
                    }
                    Err(e) => {
                        entry.api_version = "<error>".into();
                        entry.error = Some(e.to_string());
                    }
                },
            }
            entry
        })
        .collect()
}

/// `apiVersion` of a JSON object, without keeping (or printing) anything else of it.
fn api_version(plain: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(rename = "apiVersion")]
        api_version: Option<String>,
    }
    match serde_json::from_slice::<Head>(plain) {
        Ok(Head { api_version: Some(v) }) if !v.is_empty() => v,
        _ => "<unknown>".into(),
    }
}

/// How many stored values each resource has under each key: resource (`shootstates.core.gardener.cloud`, `secrets`)
/// -> key label as [`stored_key_label`] gives it (`identity`, `aesgcm:v1:key1`, `kms:v2:<name>:sha256:…` with the
/// key_id's hash, `malformed`) -> count. Keys outside `/registry/` are not counted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ValueCounts(pub BTreeMap<String, BTreeMap<String, u64>>);

impl ValueCounts {
    /// The counts of `values` (as [`EmbeddedStorage::scan`] or a scan of etcd return them).
    pub fn of<'a>(values: impl IntoIterator<Item = &'a super::KeyValue>) -> Self {
        let mut counts = Self::default();
        for kv in values {
            counts.add(&kv.key, &kv.value);
        }
        counts
    }

    /// Counts one stored value.
    pub fn add(&mut self, key: &str, stored: &[u8]) {
        if let Some(resource) = resource_of_key(key) {
            *self.0.entry(resource).or_default().entry(stored_key_label(stored)).or_default() += 1;
        }
    }

    /// The values of `resource` stored under `label`.
    pub fn get(&self, resource: &str, label: &str) -> u64 {
        self.0.get(resource).and_then(|by_key| by_key.get(label)).copied().unwrap_or(0)
    }

    /// `(resource, label, count)`, sorted by resource, then label.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.0.iter().flat_map(|(r, by_key)| by_key.iter().map(move |(l, n)| (r.as_str(), l.as_str(), *n)))
    }
}

/// Values read per page by [`count_values`], and their bytes at most (values of 100 KiB would make a page of 1000
/// take 100 MiB).
const COUNT_PAGE: usize = 1000;
const COUNT_PAGE_BYTES: usize = 4 << 20;

/// [`ValueCounts`] of the values under `prefix` of a live store (the raw store, below encryption: values as stored),
/// read page by page at the latest revision, so that it runs beside the requests being served. Only each value's
/// prefix is looked at; the cost is reading every value once: for 10^5 values of a few KB, 100 pages and a few
/// hundred milliseconds of one core, with one page (at most [`COUNT_PAGE_BYTES`]) in memory at a time.
pub async fn count_values(store: &dyn Storage, prefix: &str) -> Result<ValueCounts, StorageError> {
    let mut counts = ValueCounts::default();
    let mut start_after = None;
    loop {
        let opts = ListOptions {
            start_after: start_after.take(),
            limit: COUNT_PAGE,
            revision: None,
            max_bytes: COUNT_PAGE_BYTES,
        };
        let page = store.list(prefix, opts).await?;
        for kv in &page.items {
            counts.add(&kv.key, &kv.value);
        }
        match (page.more, page.items.last()) {
            (true, Some(last)) => start_after = Some(last.key.clone()),
            _ => return Ok(counts),
        }
    }
}

/// A kubectl-style table: KEY, REVISION, ENCRYPTION, APIVERSION, SIZE.
pub fn table(entries: &[InspectEntry]) -> String {
    let header = ["KEY", "REVISION", "ENCRYPTION", "APIVERSION", "SIZE"];
    let rows: Vec<[String; 5]> = entries
        .iter()
        .map(|e| {
            [e.key.clone(), e.revision.to_string(), e.encryption.clone(), e.api_version.clone(), e.size.to_string()]
        })
        .collect();
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[String]| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                l.push_str(&format!("{c:<w$}   ", w = widths[i]));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&header.map(String::from));
    for r in &rows {
        line(r);
    }
    out
}

/// The entries whose values cannot be read as a table: KEY, REVISION, ERROR (what `storage inspect --unreadable`
/// prints, and what to delete with `ignoreStoreReadErrorWithClusterBreakingPotential`).
pub fn unreadable_table(entries: &[InspectEntry]) -> String {
    let width = entries.iter().map(|e| e.key.chars().count()).max().unwrap_or(0).max(3);
    let mut out = format!("{:<width$}   REVISION   ERROR\n", "KEY");
    for e in entries.iter().filter(|e| e.error.is_some()) {
        let error = e.error.as_deref().unwrap_or_default();
        out.push_str(&format!("{:<width$}   {:<8}   {error}\n", e.key, e.revision));
    }
    out
}

/// `{"items": [...]}` as pretty JSON.
pub fn json(entries: &[InspectEntry]) -> String {
    let v = serde_json::json!({ "items": entries });
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

/// How many stored values of one resource one key encrypts (`storage inspect --summary`).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SummaryRow {
    /// `<resource>.<group>`, `<resource>` for the core group.
    pub resource: String,
    /// `identity`, `aesgcm`, `aescbc`, `secretbox`, or `malformed`.
    pub provider: String,
    /// The key name (empty for identity and malformed values); a KMS v2 provider's name.
    pub key: String,
    /// A KMS v2 provider's key_id, hashed (`sha256:<hex>`): the values under each key_id are counted apart, so that an
    /// old key_id can be retired in the KMS once no value uses it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub key_id_hash: String,
    pub values: u64,
}

/// The resource a storage key belongs to: `/registry/<group>/<resource>/...` (a group has a dot) or
/// `/registry/<resource>/...` (the core group).
fn resource_of(key: &str) -> String {
    let mut parts = key.strip_prefix("/registry/").unwrap_or(key).split('/');
    let first = parts.next().unwrap_or_default();
    match (first.contains('.'), parts.next()) {
        (true, Some(resource)) => format!("{resource}.{first}"),
        _ => first.to_string(),
    }
}

/// Counts per resource, provider, key and (KMS v2) key_id, sorted.
pub fn summary(entries: &[InspectEntry]) -> Vec<SummaryRow> {
    let mut counts: std::collections::BTreeMap<(String, String, String, String), u64> = Default::default();
    for e in entries {
        let (provider, key) = match e.encryption.split(':').collect::<Vec<_>>()[..] {
            [provider, _version, key] => (provider.to_string(), key.to_string()),
            _ => (e.encryption.clone(), String::new()),
        };
        let key_id_hash = e.key_id_hash.clone().unwrap_or_default();
        *counts.entry((resource_of(&e.key), provider, key, key_id_hash)).or_insert(0) += 1;
    }
    counts
        .into_iter()
        .map(|((resource, provider, key, key_id_hash), values)| SummaryRow {
            resource,
            provider,
            key,
            key_id_hash,
            values,
        })
        .collect()
}

/// The summary as a kubectl-style table: RESOURCE, PROVIDER, KEY, VALUES; with KMS v2 values, KEY ID HASH after KEY.
pub fn summary_table(rows: &[SummaryRow]) -> String {
    let kms = rows.iter().any(|r| !r.key_id_hash.is_empty());
    let pick = |cells: [String; 5]| -> Vec<String> {
        cells.into_iter().enumerate().filter(|(i, _)| kms || *i != 3).map(|(_, c)| c).collect()
    };
    let header = pick(["RESOURCE", "PROVIDER", "KEY", "KEY ID HASH", "VALUES"].map(String::from));
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            pick([r.resource.clone(), r.provider.clone(), r.key.clone(), r.key_id_hash.clone(), r.values.to_string()])
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &cells {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(&header).chain(&cells) {
        let line: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// `{"items": [...]}` of the summary as pretty JSON.
pub fn summary_json(rows: &[SummaryRow]) -> String {
    let v = serde_json::json!({ "items": rows });
    serde_json::to_string_pretty(&v).unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::embedded::{EmbeddedOptions, EmbeddedStorage};
    use crate::storage::encryption::EncryptedStorage;
    use crate::storage::Storage;
    use bytes::Bytes;

    const CONFIG: &str = r#"apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
- resources: ["storagestates.migration.k8s.io"]
  providers:
  - aesgcm:
      keys:
      - name: key1
        secret: AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=
"#;

    #[tokio::test]
    async fn lists_encryption_and_api_version_without_values() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = br#"{"apiVersion":"migration.k8s.io/v1alpha1","kind":"StorageState","spec":"TOPSECRET"}"#;
        {
            let inner = EmbeddedStorage::open(dir.path(), EmbeddedOptions::default()).expect("open");
            let s = EncryptedStorage::new(inner.clone(), EncryptionConfig::from_yaml(CONFIG).expect("config"));
            s.create("/registry/migration.k8s.io/storagestates/a", Bytes::from_static(secret)).await.expect("create");
            // Not matched by the config: identity.
            s.create("/registry/migration.k8s.io/storageversionmigrations/m", Bytes::from_static(secret))
                .await
                .expect("create");
            inner.create("/registry/other/x", Bytes::from_static(b"not json")).await.expect("create");
        }
        let without = inspect(dir.path(), None, "/registry/migration.k8s.io/").expect("inspect");
        assert_eq!(without.len(), 2);
        assert_eq!(without[0].key, "/registry/migration.k8s.io/storagestates/a");
        assert_eq!(
            (without[0].encryption.as_str(), without[0].api_version.as_str()),
            ("aesgcm:v1:key1", "<encrypted>")
        );
        assert_eq!(without[0].revision, 1);
        assert_eq!(without[0].size, "k8s:enc:aesgcm:v1:key1:".len() + 12 + secret.len() + 16);
        assert_eq!(
            (without[1].encryption.as_str(), without[1].api_version.as_str()),
            ("identity", "migration.k8s.io/v1alpha1")
        );

        let config = EncryptionConfig::from_yaml(CONFIG).expect("config");
        let with = inspect(dir.path(), Some(&config), "/registry/").expect("inspect");
        assert_eq!(with.len(), 3);
        assert_eq!((with[0].api_version.as_str(), with[0].stale), ("migration.k8s.io/v1alpha1", Some(false)));
        assert_eq!(with[2].api_version, "<unknown>");
        let out = table(&with) + &json(&with);
        assert!(!out.contains("TOPSECRET") && !out.contains("StorageState"), "{out}");
        let mut lines = table(&with)
            .lines()
            .map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
            .collect::<Vec<_>>()
            .into_iter();
        assert_eq!(lines.next().expect("header"), ["KEY", "REVISION", "ENCRYPTION", "APIVERSION", "SIZE"]);
        assert_eq!(
            lines.next().expect("row")[..4],
            ["/registry/migration.k8s.io/storagestates/a", "1", "aesgcm:v1:key1", "migration.k8s.io/v1alpha1"]
        );

        // A config without the key: the entry says so, the rest still lists.
        let other = EncryptionConfig::from_yaml(&CONFIG.replace("key1", "key2")).expect("config");
        let e = inspect(dir.path(), Some(&other), "/registry/").expect("inspect");
        assert_eq!(e[0].api_version, "<error>");
        assert!(e[0].error.as_deref().is_some_and(|m| m.contains("aesgcm:v1:key1")), "{:?}", e[0].error);

        assert!(inspect(&dir.path().join("missing"), None, "/").is_err());
    }

    #[test]
    fn summary_counts_per_resource_provider_and_key() {
        let entry = |key: &str, encryption: &str| InspectEntry {
            key: key.into(),
            revision: 1,
            encryption: encryption.into(),
            key_id_hash: None,
            api_version: String::new(),
            size: 0,
            stale: None,
            error: None,
        };
        let entries = [
            entry("/registry/core.gardener.cloud/shootstates/ns/a", "aesgcm:v1:key2"),
            entry("/registry/core.gardener.cloud/shootstates/ns/b", "aesgcm:v1:key1"),
            entry("/registry/core.gardener.cloud/shootstates/ns/c", "aesgcm:v1:key2"),
            entry("/registry/namespaces/ns", "identity"),
        ];
        let rows = summary(&entries);
        let row = |r: &str, p: &str, k: &str, n| SummaryRow {
            resource: r.into(),
            provider: p.into(),
            key: k.into(),
            key_id_hash: String::new(),
            values: n,
        };
        assert_eq!(
            rows,
            [
                row("namespaces", "identity", "", 1),
                row("shootstates.core.gardener.cloud", "aesgcm", "key1", 1),
                row("shootstates.core.gardener.cloud", "aesgcm", "key2", 2),
            ]
        );
        let table = summary_table(&rows);
        let lines: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(lines[0], ["RESOURCE", "PROVIDER", "KEY", "VALUES"]);
        assert_eq!(lines[3], ["shootstates.core.gardener.cloud", "aesgcm", "key2", "2"]);
        let json: serde_json::Value = serde_json::from_str(&summary_json(&rows)).expect("json");
        assert_eq!(json["items"][2]["values"], 2);
        assert_eq!(json["items"][0]["key"], "");
        assert!(json["items"][0].get("keyIdHash").is_none(), "{json}");

        // KMS v2 values: one row per key_id, and a KEY ID HASH column.
        let kms = |key: &str, hash: &str| InspectEntry { key_id_hash: Some(hash.into()), ..entry(key, "kms:v2:vault") };
        let entries = [
            kms("/registry/core.gardener.cloud/shootstates/ns/a", "sha256:02"),
            kms("/registry/core.gardener.cloud/shootstates/ns/b", "sha256:01"),
            kms("/registry/core.gardener.cloud/shootstates/ns/c", "sha256:02"),
        ];
        let rows = summary(&entries);
        assert_eq!(
            rows.iter()
                .map(|r| (r.provider.as_str(), r.key.as_str(), r.key_id_hash.as_str(), r.values))
                .collect::<Vec<_>>(),
            [("kms", "vault", "sha256:01", 1), ("kms", "vault", "sha256:02", 2)]
        );
        let table = summary_table(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            ["RESOURCE", "PROVIDER", "KEY", "KEY", "ID", "HASH", "VALUES"]
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            ["shootstates.core.gardener.cloud", "kms", "vault", "sha256:02", "2"]
        );
        let json: serde_json::Value = serde_json::from_str(&summary_json(&rows)).expect("json");
        assert_eq!(json["items"][1]["keyIdHash"], "sha256:02");
    }

    #[tokio::test]
    async fn refuses_a_store_in_use() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _open = EmbeddedStorage::open(dir.path(), EmbeddedOptions::default()).expect("open");
        let e = inspect(dir.path(), None, "/").expect_err("in use");
        assert!(e.to_string().contains("stop it first"), "{e}");
    }
}
