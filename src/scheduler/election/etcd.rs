//! The election lock on etcd (the server keeps its data in etcd, no cluster to hold a Lease): a key under
//! `--etcd-prefix` that exists only while its holder keeps an etcd lease alive.
//!
//! Acquiring grants a lease with the lease duration as TTL and creates the key attached to it in one transaction
//! that succeeds only when the key does not exist (create_revision == 0). Renewing is a keep-alive of that lease plus
//! a check that the key is still attached to it. etcd deletes the key when the lease expires, measured on etcd's
//! clock from the last keep-alive it received: a holder killed with SIGKILL loses the key `lease duration` after
//! its last renewal, and a holder cut off from etcd stops leading after the renew deadline, before that.
//! Releasing revokes the lease, which deletes the key at once.

use super::{LeaderLock, LockError};
use etcd_client::{Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, PutOptions, Txn, TxnOp, TxnOpResponse};
use k8s_openapi::jiff::Timestamp;
use std::time::Duration;

pub struct EtcdLock {
    client: etcd_client::Client,
    key: String,
    identity: String,
    ttl_seconds: i64,
    held: Option<Held>,
    holder: Option<String>,
}

struct Held {
    lease: i64,
    keep_alive: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
}

/// What the key holds: who leads and since when (for `etcdctl get` and logs; the lease is what counts).
#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EtcdLeaderRecord {
    pub holder_identity: String,
    pub lease_duration_seconds: i64,
    pub acquire_time: String,
}

/// The key of the lock named `name`: `<prefix>/leader-election/<name>` (outside the keys of any served resource).
pub fn key(prefix: &str, name: &str) -> String {
    format!("{}/leader-election/{name}", prefix.trim_end_matches('/'))
}

/// etcd leases have whole seconds; a lease never ends earlier than the configured duration.
pub fn ttl_seconds(lease_duration: Duration) -> i64 {
    i64::try_from(lease_duration.as_millis().div_ceil(1000)).unwrap_or(i64::MAX).max(1)
}

impl EtcdLock {
    pub fn new(
        client: etcd_client::Client,
        prefix: &str,
        name: &str,
        identity: &str,
        lease_duration: Duration,
    ) -> Self {
        EtcdLock {
            client,
            key: key(prefix, name),
            identity: identity.to_string(),
            ttl_seconds: ttl_seconds(lease_duration),
            held: None,
            holder: None,
        }
    }

    fn record(&self) -> String {
        serde_json::to_string(&EtcdLeaderRecord {
            holder_identity: self.identity.clone(),
            lease_duration_seconds: self.ttl_seconds,
            acquire_time: Timestamp::now().to_string(),
        })
        .unwrap_or_default()
    }

    async fn acquire(&mut self) -> Result<bool, LockError> {
        let lease = self.client.lease_grant(self.ttl_seconds, None).await?.id();
        let txn = Txn::new()
            .when([Compare::create_revision(self.key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(self.key.as_str(), self.record(), Some(PutOptions::new().with_lease(lease)))])
            .or_else([TxnOp::get(self.key.as_str(), None)]);
        let resp = match self.client.txn(txn).await {
            Ok(r) => r,
            Err(e) => {
                let _ = self.client.lease_revoke(lease).await;
                return Err(e.into());
            }
        };
        if resp.succeeded() {
            self.held = Some(Held { lease, keep_alive: None });
            self.holder = Some(self.identity.clone());
            return Ok(true);
        }
        // Someone holds it: note who, and give our unused lease back.
        for op in resp.op_responses() {
            if let TxnOpResponse::Get(g) = op {
                self.holder = g
                    .kvs()
                    .first()
                    .and_then(|kv| serde_json::from_slice::<EtcdLeaderRecord>(kv.value()).ok())
                    .map(|r| r.holder_identity);
            }
        }
        let _ = self.client.lease_revoke(lease).await;
        Ok(false)
    }

    /// One keep-alive of the held lease: Ok(false) when it expired, or the key is no longer attached to it.
    async fn renew(&mut self) -> Result<bool, LockError> {
        let Some(held) = self.held.as_mut() else { return Ok(false) };
        // A fresh keep-alive stream every time: an attempt cut off at the renew deadline may have left an answer
        // buffered in the old one, which a later renewal would take for its own.
        held.keep_alive = None;
        held.keep_alive = Some(self.client.lease_keep_alive(held.lease).await?);
        let lease = held.lease;
        let ttl = match keep_alive_once(held.keep_alive.as_mut()).await {
            Ok(ttl) => ttl,
            Err(e) => {
                // A broken stream is reopened at the next attempt (the lease may still be alive on etcd).
                held.keep_alive = None;
                return Err(e);
            }
        };
        if ttl <= 0 {
            self.held = None;
            return Ok(false);
        }
        let check = Txn::new().when([Compare::lease(self.key.as_str(), CompareOp::Equal, lease)]);
        let ours = self.client.txn(check).await?.succeeded();
        if !ours {
            // Deleted by hand, or etcd restored from a backup: give the lease up and compete again.
            self.held = None;
            let _ = self.client.lease_revoke(lease).await;
        }
        Ok(ours)
    }
}

async fn keep_alive_once(ka: Option<&mut (LeaseKeeper, LeaseKeepAliveStream)>) -> Result<i64, LockError> {
    let Some((keeper, stream)) = ka else { return Err(LockError::KeepAliveClosed) };
    keeper.keep_alive().await?;
    match stream.message().await? {
        Some(resp) => Ok(resp.ttl()),
        None => Err(LockError::KeepAliveClosed),
    }
}

#[async_trait::async_trait]
impl LeaderLock for EtcdLock {
    async fn try_acquire_or_renew(&mut self) -> Result<bool, LockError> {
        if self.held.is_some() {
            return self.renew().await;
        }
        self.acquire().await
    }

    async fn release(&mut self) -> Result<(), LockError> {
        if let Some(held) = self.held.take() {
            self.client.lease_revoke(held.lease).await?;
            self.holder = None;
        }
        Ok(())
    }

    fn holder(&self) -> Option<String> {
        self.holder.clone()
    }

    fn describe(&self) -> String {
        format!("etcd key {}", self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_and_ttl() {
        assert_eq!(key("/registry", "migration-apiserver"), "/registry/leader-election/migration-apiserver");
        assert_eq!(key("/registry/", "x"), "/registry/leader-election/x");
        assert_eq!(ttl_seconds(Duration::from_secs(15)), 15);
        assert_eq!(ttl_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(ttl_seconds(Duration::from_millis(1)), 1);
    }
}
