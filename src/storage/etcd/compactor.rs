//! Compaction of etcd's history, shared by all replicas on one etcd (kube-apiserver's algorithm).

use super::rev;
use etcd_client::{Compare, CompareOp, KvClient, Txn, TxnOp, TxnOpResponse};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Compacts etcd's history like kube-apiserver: every interval, one replica (the one whose transaction on the
/// shared compaction key wins) compacts to the revision recorded one interval earlier, so at least one interval
/// of history stays for watches and paged lists.
pub(super) struct Compactor {
    pub(super) kv: KvClient,
    pub(super) key: String,
    pub(super) compacted: Arc<AtomicU64>,
}

impl Compactor {
    pub(super) async fn run(mut self, interval: Duration) {
        let (mut version, mut recorded) = (0i64, 0i64);
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            tick.tick().await;
            match self.round(version, recorded).await {
                Ok((v, r)) => (version, recorded) = (v, r),
                Err(e) => tracing::warn!(error = %e, "etcd compaction failed"),
            }
        }
    }

    /// One round: records the current revision if nobody else did since `version`; compacts to `recorded`.
    async fn round(&mut self, version: i64, recorded: i64) -> std::result::Result<(i64, i64), etcd_client::Error> {
        let txn = Txn::new()
            .when([Compare::version(self.key.clone(), CompareOp::Equal, version)])
            .and_then([TxnOp::put(self.key.clone(), Vec::<u8>::new(), None)])
            .or_else([TxnOp::get(self.key.clone(), None)]);
        let resp = self.kv.txn(txn).await?;
        let current = resp.header().map_or(0, |h| h.revision());
        if !resp.succeeded() {
            // Another replica compacts this round; follow its count.
            let theirs = match resp.op_responses().into_iter().next() {
                Some(TxnOpResponse::Get(get)) => get.kvs().first().map_or(0, |kv| kv.version()),
                _ => 0,
            };
            return Ok((theirs, current));
        }
        if recorded > 0 {
            self.kv.compact(recorded, None).await?;
            self.compacted.fetch_max(rev(recorded), Ordering::AcqRel);
            tracing::info!(revision = recorded, "compacted etcd history");
        }
        Ok((version + 1, current))
    }
}
