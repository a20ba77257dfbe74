//! Key rotation with several replicas on one etcd, safer than kube-apiserver's two-edit procedure: a replica that has
//! loaded a new write key keeps writing with a key every live replica reads until every live replica reports that
//! it reads the new one. So one edit of the config on every replica, in any order, never writes a value that another
//! replica cannot read.
//!
//! Every replica publishes a [`KeyReport`]: per `resources` entry of its config, the patterns and its keys in config
//! order (the first writes). Liveness is the HA StorageState protocol's (seed 002): a report whose heartbeat is older
//! than [`GC_INTERVALS`] intervals no longer counts (a stopped or crashed replica holds the new key back that long;
//! unlike the StorageState reports, a graceful stop does not withdraw it, see [`super::key_reports`]). This module
//! is pure; the I/O is in [`super::key_reports`].
//!
//! - The **effective writer** of a storage key on a replica is the first of its keys for that key which every live
//!   replica reads (plaintext, `identity`, is always readable); its configured writer when none is.
//! - The **agreed writer** of a storage key is the effective writer of every live replica when they are all the same:
//!   the key-rotation trigger starts the migration of a resource only when every live replica writes with its new
//!   key, as the storage-version trigger waits for every replica to serve a new storage version.

use super::pattern::Pattern;
use super::EncryptionConfig;
use k8s_openapi::jiff::Timestamp;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Reports older than this many intervals do not count (the HA StorageState protocol's garbage collection).
pub const GC_INTERVALS: u32 = 3;

/// The label of plaintext, which every replica reads.
pub const IDENTITY: &str = "identity";

/// What one replica publishes about its config (never a secret: key names and providers only).
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct KeyReport {
    pub replica: String,
    /// RFC 3339; refreshed every interval.
    pub last_heartbeat_time: String,
    /// One entry per `resources` entry of the config, in its order (the first that matches a key applies).
    pub resources: Vec<ResourceKeys>,
    /// The key_id hash (`sha256:<hex>`) each KMS v2 provider of the config writes with, by its label
    /// (`kms:v2:<name>`): a provider reads every key_id, so this is not what reads, only what writes; the
    /// key-rotation trigger waits until every live replica writes with the new key_id. Absent from the reports of
    /// replicas without KMS v2 providers (and of older versions).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub write_key_ids: std::collections::BTreeMap<String, String>,
}

/// One `resources` entry: its patterns and its keys (`aesgcm:v1:key2`, `identity`), the first one writing.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ResourceKeys {
    pub resources: Vec<String>,
    pub keys: Vec<String>,
}

impl KeyReport {
    /// The report of `replica` running `config`.
    pub fn of(replica: &str, config: &EncryptionConfig, now: Timestamp) -> KeyReport {
        let resources = config
            .rules
            .iter()
            .map(|(patterns, t)| ResourceKeys {
                resources: patterns.iter().map(render).collect(),
                keys: t.order.clone(),
            })
            .collect();
        KeyReport {
            replica: replica.to_string(),
            last_heartbeat_time: now.to_string(),
            resources,
            write_key_ids: config.write_key_id_hashes(),
        }
    }

    /// Whether the heartbeat is at most [`GC_INTERVALS`] intervals old (one that does not parse is not).
    pub fn is_live(&self, now: Timestamp, interval: Duration) -> bool {
        let Ok(heartbeat) = self.last_heartbeat_time.parse::<Timestamp>() else { return false };
        let window =
            i64::try_from(interval.as_millis()).unwrap_or(i64::MAX / 4).saturating_mul(i64::from(GC_INTERVALS));
        now.as_millisecond().saturating_sub(heartbeat.as_millisecond()) <= window
    }
}

fn render(p: &Pattern) -> String {
    match p {
        Pattern::All => "*.*".to_string(),
        Pattern::Group(g) => format!("*.{g}"),
        Pattern::Resource { resource, group } if group.is_empty() => resource.clone(),
        Pattern::Resource { resource, group } => format!("{resource}.{group}"),
    }
}

/// A report with its patterns parsed, ready to answer for storage keys.
#[derive(Clone, Debug)]
pub struct Replica {
    pub report: KeyReport,
    rules: Vec<(Vec<Pattern>, Vec<String>)>,
}

impl Replica {
    /// A pattern that does not parse (a newer version's syntax) matches nothing: that replica's entry is skipped as
    /// its own config loader would have refused it.
    pub fn new(report: KeyReport) -> Replica {
        let rules = report
            .resources
            .iter()
            .map(|r| (r.resources.iter().filter_map(|p| Pattern::parse(p).ok()).collect(), r.keys.clone()))
            .collect();
        Replica { report, rules }
    }

    /// This replica's keys for `key`, the first writing; empty when no entry covers it (plaintext).
    fn keys_for(&self, key: &str) -> &[String] {
        self.rules.iter().find(|(ps, _)| ps.iter().any(|p| p.matches(key))).map(|(_, k)| k.as_slice()).unwrap_or(&[])
    }

    fn reads(&self, key: &str, label: &str) -> bool {
        label == IDENTITY || self.keys_for(key).iter().any(|k| k == label)
    }

    /// The key this replica's writes of `key` use when `replicas` (itself included or not) are the live ones.
    pub fn effective_writer(&self, key: &str, replicas: &[Replica]) -> String {
        let keys = self.keys_for(key);
        keys.iter()
            .find(|k| replicas.iter().all(|r| r.reads(key, k)))
            .or(keys.first())
            .cloned()
            .unwrap_or_else(|| IDENTITY.to_string())
    }

    /// [`Self::effective_writer`] with a KMS v2 provider's key_id: `kms:v2:<name>:sha256:…` when this replica
    /// reports one, as [`EncryptionConfig::write_key_id_label_for_resource`] names the write key.
    pub fn effective_write_key_id(&self, key: &str, replicas: &[Replica]) -> String {
        let writer = self.effective_writer(key, replicas);
        match self.report.write_key_ids.get(&writer) {
            Some(hash) => format!("{writer}:{hash}"),
            None => writer,
        }
    }

    /// The configured writer of `key` (the first key), whatever the other replicas read.
    pub fn configured_writer(&self, key: &str) -> String {
        self.keys_for(key).first().cloned().unwrap_or_else(|| IDENTITY.to_string())
    }
}

/// The key every replica of `replicas` writes `key` with, when they all write with the same one.
pub fn agreed_writer(replicas: &[Replica], key: &str) -> Option<String> {
    let mut writers = replicas.iter().map(|r| r.effective_writer(key, replicas));
    let first = writers.next()?;
    writers.all(|w| w == first).then_some(first)
}

/// This replica's own report and the live reports of the others, as the write path consults them.
pub struct WriteGate {
    own: RwLock<Arc<Replica>>,
    /// Every live replica, this one included (its own report is always counted, live or not).
    replicas: RwLock<Arc<Vec<Replica>>>,
}

impl WriteGate {
    pub fn new(own: KeyReport) -> WriteGate {
        let own = Replica::new(own);
        WriteGate { replicas: RwLock::new(Arc::new(vec![own.clone()])), own: RwLock::new(Arc::new(own)) }
    }

    pub fn own(&self) -> Arc<Replica> {
        self.own.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Every live replica, this one first.
    pub fn replicas(&self) -> Arc<Vec<Replica>> {
        self.replicas.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A new own report (a config loaded anew); counted at once.
    pub fn set_own(&self, report: KeyReport) {
        let own = Replica::new(report);
        let others: Vec<Replica> =
            self.replicas().iter().filter(|r| r.report.replica != own.report.replica).cloned().collect();
        *self.own.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(own);
        self.set_others(others);
    }

    /// The reports read from the store: those of others that are live at `now` count from now on.
    pub fn set_reports(&self, reports: Vec<KeyReport>, now: Timestamp, interval: Duration) {
        let me = self.own().report.replica.clone();
        let others =
            reports.into_iter().filter(|r| r.replica != me && r.is_live(now, interval)).map(Replica::new).collect();
        self.set_others(others);
    }

    fn set_others(&self, others: Vec<Replica>) {
        let mut all = vec![(*self.own()).clone()];
        all.extend(others);
        *self.replicas.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(all);
    }

    /// The key this replica writes `key` with now, by its published report.
    pub fn writer_for(&self, key: &str) -> String {
        self.own().effective_writer(key, &self.replicas())
    }

    /// The key `config` (the config in use, which the published report follows within a second of a reload)
    /// writes `key` with: its first key for `key` that every other live replica reads, else its configured writer.
    pub fn writer_in(&self, config: &EncryptionConfig, key: &str) -> String {
        let keys = &config.transformer(key).order;
        let replicas = self.replicas();
        let others = &replicas[1.min(replicas.len())..];
        keys.iter()
            .find(|k| others.iter().all(|r| r.reads(key, k)))
            .or(keys.first())
            .cloned()
            .unwrap_or_else(|| IDENTITY.to_string())
    }

    /// The key each live replica writes `key` with, a KMS v2 provider with its key_id, this one first (the rotation
    /// trigger migrates once they are all its configured key).
    pub fn writers_of(&self, key: &str) -> Vec<String> {
        let replicas = self.replicas();
        replicas.iter().map(|r| r.effective_write_key_id(key, &replicas)).collect()
    }

    /// The key every live replica writes `key` with, when they agree.
    pub fn agreed_writer(&self, key: &str) -> Option<String> {
        agreed_writer(&self.replicas(), key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "/registry/core.gardener.cloud/shootstates/ns/a";
    const OTHER: &str = "/registry/core.gardener.cloud/other/ns/a";
    const I: Duration = Duration::from_secs(10);

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).expect("ts")
    }

    fn report(id: &str, keys: &[&str], at: i64) -> KeyReport {
        KeyReport {
            replica: id.into(),
            last_heartbeat_time: t(at).to_string(),
            resources: vec![ResourceKeys {
                resources: vec!["shootstates.core.gardener.cloud".into()],
                keys: keys.iter().map(|k| k.to_string()).collect(),
            }],
            write_key_ids: Default::default(),
        }
    }

    const K1: &str = "aesgcm:v1:key1";
    const K2: &str = "aesgcm:v1:key2";

    #[test]
    fn a_new_key_writes_only_once_every_replica_reads_it() {
        let gate = WriteGate::new(report("a", &[K2, K1], 0));
        // Alone: the new key writes.
        assert_eq!(gate.writer_for(KEY), K2);
        // b reads only key1: a keeps writing key1, and the replicas agree on it.
        gate.set_reports(vec![report("b", &[K1], 0)], t(1), I);
        assert_eq!(gate.writer_for(KEY), K1);
        assert_eq!(gate.agreed_writer(KEY).as_deref(), Some(K1));
        assert_eq!(gate.writers_of(KEY), [K1, K1]);
        // b loaded the same edit: both write key2.
        gate.set_reports(vec![report("b", &[K2, K1], 1)], t(2), I);
        assert_eq!(gate.writer_for(KEY), K2);
        assert_eq!(gate.agreed_writer(KEY).as_deref(), Some(K2));
        // Resources no entry covers stay plaintext.
        assert_eq!(gate.writer_for(OTHER), IDENTITY);
    }

    #[test]
    fn the_config_in_use_writes_with_what_the_others_read() {
        let yaml = |keys: &str| {
            format!(
                "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
                 - resources: [shootstates.core.gardener.cloud]\n  providers:\n{keys}"
            )
        };
        let k1 = "  - aesgcm: {keys: [{name: key1, secret: MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=}]}\n";
        let k2 = "  - aesgcm: {keys: [{name: key2, secret: ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=}]}\n";
        let old = EncryptionConfig::from_yaml(&yaml(k1)).expect("config");
        let new = EncryptionConfig::from_yaml(&yaml(&format!("{k2}{k1}"))).expect("config");
        let gate = WriteGate::new(KeyReport::of("a", &old, t(0)));
        gate.set_reports(vec![report("b", &[K1], 0)], t(1), I);
        // Reloaded, before the report follows: the others are what count.
        assert_eq!(gate.writer_in(&new, KEY), K1);
        gate.set_reports(vec![report("b", &[K2, K1], 0)], t(1), I);
        assert_eq!(gate.writer_in(&new, KEY), K2);
        assert_eq!(gate.writer_in(&old, KEY), K1);
        assert_eq!(gate.writer_in(&new, OTHER), IDENTITY);
    }

    #[test]
    fn reading_a_key_second_lets_the_other_replica_write_it() {
        // b has the new key second (read only): a may write it; b itself still writes key1.
        let gate = WriteGate::new(report("a", &[K2, K1], 0));
        gate.set_reports(vec![report("b", &[K1, K2], 0)], t(1), I);
        assert_eq!(gate.writer_for(KEY), K2);
        assert_eq!(gate.agreed_writer(KEY), None, "a writes key2, b key1");
    }

    #[test]
    fn a_silent_replica_stops_counting_after_three_intervals() {
        let gate = WriteGate::new(report("a", &[K2, K1], 0));
        gate.set_reports(vec![report("b", &[K1], 0)], t(30), I);
        assert_eq!(gate.writer_for(KEY), K1, "three intervals old: still live");
        gate.set_reports(vec![report("b", &[K1], 0)], t(31), I);
        assert_eq!(gate.writer_for(KEY), K2, "older: no longer counted");
        // Its own (older) report in the store never replaces the live one.
        gate.set_reports(vec![report("a", &[K1], -100)], t(31), I);
        assert_eq!(gate.own().report.resources[0].keys, [K2, K1]);
    }

    #[test]
    fn without_a_common_key_the_configured_writer_writes() {
        let gate = WriteGate::new(report("a", &[K2], 0));
        gate.set_reports(vec![report("b", &[K1], 0)], t(1), I);
        assert_eq!(gate.writer_for(KEY), K2);
        // identity in the list is a common "key": plaintext is readable by all.
        let gate = WriteGate::new(report("a", &[K2, IDENTITY], 0));
        gate.set_reports(vec![report("b", &[K1], 0)], t(1), I);
        assert_eq!(gate.writer_for(KEY), IDENTITY);
    }

    #[test]
    fn reports_of_a_config_name_its_keys_in_order() {
        let yaml = "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n\
                    - resources: [shootstates.core.gardener.cloud, '*.example.com']\n  providers:\n  \
                    - aesgcm: {keys: [{name: key2, secret: MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=}]}\n  \
                    - aescbc: {keys: [{name: key1, secret: MDEyMzQ1Njc4OWFiY2RlZg==}]}\n  - identity: {}\n";
        let config = EncryptionConfig::from_yaml(yaml).expect("config");
        let r = KeyReport::of("a", &config, t(0));
        assert_eq!(r.resources.len(), 1);
        assert_eq!(r.resources[0].resources, ["shootstates.core.gardener.cloud", "*.example.com"]);
        assert_eq!(r.resources[0].keys, ["aesgcm:v1:key2", "aescbc:v1:key1", IDENTITY]);
        let back: KeyReport = serde_json::from_str(&serde_json::to_string(&r).expect("json")).expect("parse");
        assert_eq!(back, r);
        assert!(!serde_json::to_string(&r).expect("json").contains("MDEy"), "no secret in a report");
    }

    #[test]
    fn a_kms_key_id_counts_for_the_rotation_but_not_for_reading() {
        const KMS: &str = "kms:v2:vault";
        let with = |id: &str, hash: Option<&str>, at: i64| {
            let mut r = report(id, &[KMS], at);
            r.write_key_ids = hash.map(|h| (KMS.to_string(), h.to_string())).into_iter().collect();
            r
        };
        let gate = WriteGate::new(with("a", Some("sha256:02"), 0));
        gate.set_reports(vec![with("b", Some("sha256:01"), 0)], t(1), I);
        // Both read every key_id of the provider: each writes with its own seed.
        assert_eq!(gate.writer_for(KEY), KMS);
        assert_eq!(gate.writers_of(KEY), ["kms:v2:vault:sha256:02", "kms:v2:vault:sha256:01"]);
        // b has not had a Status yet: no key_id, which the trigger never takes for a new one.
        gate.set_reports(vec![with("b", None, 1)], t(2), I);
        assert_eq!(gate.writers_of(KEY), ["kms:v2:vault:sha256:02", KMS]);
        gate.set_reports(vec![with("b", Some("sha256:02"), 2)], t(3), I);
        assert_eq!(gate.writers_of(KEY), ["kms:v2:vault:sha256:02"; 2]);
        // A report without the field (an older replica) parses.
        let old = r#"{"replica":"c","lastHeartbeatTime":"2024-01-01T00:00:00Z","resources":[]}"#;
        assert!(serde_json::from_str::<KeyReport>(old).expect("parse").write_key_ids.is_empty());
        assert!(!serde_json::to_string(&report("d", &[K1], 0)).expect("json").contains("writeKeyIds"));
    }
}
