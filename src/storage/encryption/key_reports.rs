//! The replicas' [`KeyReport`]s in etcd: one key per replica, `<--etcd-prefix>/encryption-key-reports/<replica>`
//! (outside the keys of any served resource, like the leader-election key), written at start before the replica
//! serves, then again every interval (its heartbeat). A stopping replica leaves its report to expire (three
//! intervals): a process cannot tell a rolling restart with the old config from a scale-down, and only the first
//! must never be missed. Every replica reads them all
//! about once a second into its [`WriteGate`], so that a replica that loaded a new key learns within a second that
//! the others read it. A KMS v2 provider's new key_id is published within a second too.

use super::replicas::{KeyReport, WriteGate};
use super::{EncryptionConfig, EncryptionConfigHandle};
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use k8s_openapi::jiff::Timestamp;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the others' reports are read (the heartbeat is written every interval).
const REFRESH: Duration = Duration::from_secs(1);

/// Reading or writing the reports failed.
#[derive(Debug, thiserror::Error)]
pub enum KeyReportError {
    #[error("encryption key reports in etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("encoding the encryption key report: {0}")]
    Encode(#[from] serde_json::Error),
}

/// `<prefix>/encryption-key-reports/`
pub fn reports_prefix(etcd_prefix: &str) -> String {
    format!("{}/encryption-key-reports/", etcd_prefix.trim_end_matches('/'))
}

/// This replica's reporting: publishes its report and keeps its [`WriteGate`] current.
pub struct KeyReporter {
    client: etcd_client::Client,
    prefix: String,
    replica: String,
    gate: Arc<WriteGate>,
    interval: Duration,
    /// Reloads of the config: the report follows at once.
    configs: tokio::sync::watch::Receiver<Arc<EncryptionConfig>>,
}

impl KeyReporter {
    /// Publishes `replica`'s report of the config in use and reads the others' once, so that the first write
    /// already knows what every live replica reads. `interval`: the heartbeat period; reports older than three
    /// count no more.
    pub async fn start(
        client: etcd_client::Client,
        etcd_prefix: &str,
        replica: &str,
        config: &EncryptionConfigHandle,
        interval: Duration,
    ) -> Result<KeyReporter, KeyReportError> {
        let configs = config.subscribe();
        let gate = Arc::new(WriteGate::new(KeyReport::of(replica, &config.current(), Timestamp::now())));
        let mut r = KeyReporter {
            client,
            prefix: reports_prefix(etcd_prefix),
            replica: replica.to_string(),
            gate,
            interval,
            configs,
        };
        r.publish().await?;
        r.refresh().await?;
        Ok(r)
    }

    pub fn gate(&self) -> Arc<WriteGate> {
        self.gate.clone()
    }

    /// Writes this replica's report with a fresh heartbeat.
    async fn publish(&mut self) -> Result<(), KeyReportError> {
        let mut report = self.gate.own().report.clone();
        report.last_heartbeat_time = Timestamp::now().to_string();
        let key = format!("{}{}", self.prefix, self.replica);
        self.client.put(key, serde_json::to_vec(&report)?, None).await?;
        Ok(())
    }

    /// Reads every report into the gate; logs when what this replica writes changes.
    async fn refresh(&mut self) -> Result<(), KeyReportError> {
        let resp = self.client.get(self.prefix.as_str(), Some(GetOptions::new().with_prefix())).await?;
        let mut reports = Vec::new();
        let now = Timestamp::now();
        for kv in resp.kvs() {
            match serde_json::from_slice::<KeyReport>(kv.value()) {
                Ok(r) if !r.is_live(now, self.interval) => self.delete_expired(kv).await,
                Ok(r) => reports.push(r),
                Err(e) => tracing::warn!(key = %String::from_utf8_lossy(kv.key()), error = %e,
                    "encryption: ignoring an encryption key report that does not parse"),
            }
        }
        let before = self.gate.replicas();
        self.gate.set_reports(reports, Timestamp::now(), self.interval);
        let after = self.gate.replicas();
        // Heartbeats aside: which replicas, with which keys.
        let keys = |rs: &[super::replicas::Replica]| {
            rs.iter().map(|r| (r.report.replica.clone(), r.report.resources.clone())).collect::<Vec<_>>()
        };
        if keys(&before) != keys(&after) {
            self.log_replicas();
        }
        Ok(())
    }

    /// Removes the report of a replica gone for three intervals (every process reports under a new name), unless
    /// it changed since it was read.
    async fn delete_expired(&mut self, kv: &etcd_client::KeyValue) {
        let key = kv.key().to_vec();
        let txn = Txn::new()
            .when([Compare::mod_revision(key.clone(), CompareOp::Equal, kv.mod_revision())])
            .and_then([TxnOp::delete(key, None)]);
        match self.client.txn(txn).await {
            Ok(r) if r.succeeded() => tracing::info!(report = %String::from_utf8_lossy(kv.key()),
                "encryption: removed the key report of a replica silent for three intervals"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "encryption: removing an expired key report failed"),
        }
    }

    fn log_replicas(&self) {
        let replicas = self.gate.replicas();
        let live: Vec<&str> = replicas.iter().map(|r| r.report.replica.as_str()).collect();
        let own = self.gate.own();
        for entry in &own.report.resources {
            let (Some(configured), Some(pattern)) = (entry.keys.first(), entry.resources.first()) else { continue };
            // A representative storage key of the entry for the log line; the write path decides per key.
            let key = sample_key(pattern);
            let writes = own.effective_writer(&key, &replicas);
            if &writes != configured {
                tracing::warn!(resources = ?entry.resources, configured = %configured, writes = %writes, replicas = ?live,
                    "encryption: not every live replica reads the configured write key yet; writing with a key all of them read");
            } else {
                tracing::info!(resources = ?entry.resources, writes = %writes, replicas = ?live,
                    "encryption: every live replica reads the configured write key");
            }
        }
    }

    /// Heartbeat every interval, the others' reports every second, until the task is aborted.
    pub fn spawn(mut self) -> tokio::task::JoinHandle<()> {
        self.log_replicas();
        tokio::spawn(async move {
            let mut published = Instant::now();
            let mut reloads_end = false;
            loop {
                let reloaded = tokio::select! {
                    changed = self.configs.changed(), if !reloads_end => {
                        reloads_end = changed.is_err();
                        !reloads_end
                    }
                    _ = tokio::time::sleep(REFRESH.min(self.interval)) => false,
                };
                let config = self.configs.borrow_and_update().clone();
                // A KMS v2 provider's new key_id changes what this replica writes with, though no file changed.
                let new_key_id = config.write_key_id_hashes() != self.gate.own().report.write_key_ids;
                if reloaded || new_key_id {
                    self.gate.set_own(KeyReport::of(&self.replica, &config, Timestamp::now()));
                    self.log_replicas();
                }
                if reloaded || new_key_id || published.elapsed() >= self.interval {
                    match self.publish().await {
                        Ok(()) => published = Instant::now(),
                        Err(e) => {
                            tracing::warn!(error = %e, "encryption: publishing this replica's key report failed; retrying")
                        }
                    }
                }
                if let Err(e) = self.refresh().await {
                    tracing::warn!(error = %e, "encryption: reading the replicas' key reports failed; keeping the last ones");
                }
            }
        })
    }
}

/// `/registry/<group>/<resource>/` for `<resource>.<group>` (`/registry/<resource>/` for the core group); for
/// `*.<group>` and `*.*` some key of the group.
fn sample_key(pattern: &str) -> String {
    match pattern.split_once('.') {
        Some(("*", "*")) => "/registry/".to_string(),
        Some(("*", group)) => format!("/registry/{group}/"),
        Some((resource, group)) => format!("/registry/{group}/{resource}/"),
        None => format!("/registry/{pattern}/"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_live_beside_the_served_keys() {
        assert_eq!(reports_prefix("/registry"), "/registry/encryption-key-reports/");
        assert_eq!(reports_prefix("/custom/"), "/custom/encryption-key-reports/");
        assert_eq!(sample_key("shootstates.core.gardener.cloud"), "/registry/core.gardener.cloud/shootstates/");
        assert_eq!(sample_key("secrets"), "/registry/secrets/");
    }
}
