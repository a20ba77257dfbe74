//! Which kube-apiservers are live (their identity Leases) and which encryption config each one has loaded (its
//! `/metrics`).

use super::config::{digest_of, sha256_label};
use super::key_id_metrics::parse_status_key_ids;
use super::prometheus_text::samples;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// The label of every kube-apiserver's identity Lease (pkg/controlplane: `apiserver.kubernetes.io/identity`,
/// value `kube-apiserver`), in kube-system.
pub const IDENTITY_LABEL: &str = "apiserver.kubernetes.io/identity=kube-apiserver";
pub const IDENTITY_NAMESPACE: &str = "kube-system";
/// The metric kube-apiserver 1.34+ exports for the loaded encryption config.
pub const LAST_CONFIG_INFO: &str = "apiserver_encryption_config_controller_last_config_info";

/// The names of the live identity Leases. A Lease is the identity of one kube-apiserver: its name is the
/// apiserver's ID (pkg/controlplane's identity lease controller: leaseName = APIServerID, holderIdentity =
/// APIServerID + "_" + a UUID). It is live while renewTime + leaseDurationSeconds is not before `now`; one without
/// either is expired (pkg/controlplane/apiserver/leasegc's isLeaseExpired, which deletes such Leases).
pub fn live_identities(leases: &[Lease], now: Timestamp) -> BTreeSet<String> {
    leases
        .iter()
        .filter(|l| {
            let Some(spec) = l.spec.as_ref() else { return false };
            let (Some(renew), Some(seconds)) = (spec.renew_time.as_ref(), spec.lease_duration_seconds) else {
                return false;
            };
            let expires_ms = renew.0.as_millisecond().saturating_add(i64::from(seconds) * 1000);
            expires_ms >= now.as_millisecond()
        })
        .filter_map(|l| l.metadata.name.clone())
        .collect()
}

/// The `apiserver_id_hash` label kube-apiserver puts on its metrics for its ID: `sha256:` and the hex SHA-256 of
/// the ID (k8s.io/apiserver pkg/server/options/encryptionconfig/metrics getHash).
pub fn id_hash(apiserver_id: &str) -> String {
    sha256_label(apiserver_id.as_bytes())
}

/// The `(apiserver_id_hash, hash)` pairs of every `last_config_info` sample with value 1 in a Prometheus text
/// exposition.
pub fn parse_last_config_info(text: &str) -> Vec<(String, String)> {
    samples(text, LAST_CONFIG_INFO)
        .filter(|(_, value)| *value == 1.0)
        .filter_map(|(labels, _)| Some((labels.get("apiserver_id_hash")?.clone(), labels.get("hash")?.clone())))
        .collect()
}

/// What the scrapes found: the config hash each live identity reports (and the key_id hash per KMS v2 provider in
/// the same scrape), and those that did not answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// Live identity -> the hash it reports.
    pub reports: BTreeMap<String, String>,
    /// Live identity that answered -> KMS v2 provider name -> the key_id hash its plugin's Status reported last.
    pub key_ids: BTreeMap<String, BTreeMap<String, String>>,
    /// Live identities no scrape reached (behind a load balancer), or that export no `last_config_info`.
    pub missing: BTreeSet<String>,
    /// Scrapes made.
    pub scrapes: u32,
}

/// Merges one scrape's samples into `obs` for the identities still missing: the config hash from `samples`, and
/// the key_ids of the same apiserver from `key_ids` (apiserver_id_hash -> provider -> key_id hash), read together
/// so that an apiserver's two answers come from one moment.
pub fn merge_scrape(
    obs: &mut Observation,
    by_id_hash: &BTreeMap<String, String>,
    samples: &[(String, String)],
    key_ids: &BTreeMap<String, BTreeMap<String, String>>,
) {
    for (id_hash, hash) in samples {
        if let Some(identity) = by_id_hash.get(id_hash) {
            if obs.missing.remove(identity) {
                obs.reports.insert(identity.clone(), hash.clone());
                obs.key_ids.insert(identity.clone(), key_ids.get(id_hash).cloned().unwrap_or_default());
            }
        }
    }
}

/// Scrapes the cluster's `/metrics` until every identity of `live` has answered or `attempts` scrapes were made
/// (behind a load balancer each scrape reaches one apiserver). A failed scrape counts as an attempt. Each scrape
/// asks for its connection to be closed after it: a TCP load balancer spreads connections, not requests, and the
/// client's reused HTTP/1.1 connection would otherwise take every scrape of a round to the same apiserver (two real
/// kube-apiservers behind a round-robin proxy: 780 scrapes of one against 20 of the other, and rounds that never
/// heard the second).
pub async fn scrape(client: &kube::Client, live: &BTreeSet<String>, attempts: u32, timeout: Duration) -> Observation {
    let by_id_hash: BTreeMap<String, String> = live.iter().map(|id| (id_hash(id), id.clone())).collect();
    let mut obs = Observation { missing: live.clone(), ..Default::default() };
    while !obs.missing.is_empty() && obs.scrapes < attempts {
        obs.scrapes += 1;
        let request = match axum::http::Request::get("/metrics").header("connection", "close").body(Vec::new()) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "cluster key rotation: building the /metrics request");
                break;
            }
        };
        match tokio::time::timeout(timeout, client.request_text(request)).await {
            Ok(Ok(text)) => {
                let key_ids = parse_status_key_ids(&text);
                merge_scrape(&mut obs, &by_id_hash, &parse_last_config_info(&text), &key_ids)
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "cluster key rotation: scraping /metrics"),
            Err(_) => tracing::debug!("cluster key rotation: scraping /metrics timed out"),
        }
    }
    obs
}

/// Whether two reported hashes name the same file contents.
pub fn same_hash(a: &str, b: &str) -> bool {
    digest_of(a) == digest_of(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    fn lease(name: &str, renewed: i64, seconds: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(Timestamp::from_second(renewed).expect("time"))),
                lease_duration_seconds: seconds,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn live_means_renewed_within_its_duration() {
        let now = Timestamp::from_second(1_000).expect("time");
        let leases = [lease("a", 990, Some(3600)), lease("b", 900, Some(60)), lease("c", 999, None)];
        assert_eq!(live_identities(&leases, now), BTreeSet::from(["a".to_string()]));
    }

    #[test]
    fn samples_with_escapes_and_other_metrics() {
        let text = "# HELP x\n# TYPE apiserver_encryption_config_controller_last_config_info gauge\n\
apiserver_encryption_config_controller_last_config_info{apiserver_id_hash=\"sha256:aa\",hash=\"sha256:bb\"} 1\n\
apiserver_encryption_config_controller_last_config_info_other{apiserver_id_hash=\"x\",hash=\"y\"} 1\n\
apiserver_encryption_config_controller_last_config_info{hash=\"sha256:c\\\"d\", apiserver_id_hash=\"sha256:ee\"} 1\n\
apiserver_encryption_config_controller_last_config_info{apiserver_id_hash=\"sha256:ff\",hash=\"sha256:old\"} 0\n";
        assert_eq!(
            parse_last_config_info(text),
            [("sha256:aa".to_string(), "sha256:bb".to_string()), ("sha256:ee".into(), "sha256:c\"d".into())]
        );
    }

    #[test]
    fn identities_are_matched_by_their_id_hash() {
        let live = BTreeSet::from(["apiserver-a".to_string(), "apiserver-b".to_string()]);
        let by: BTreeMap<String, String> = live.iter().map(|i| (id_hash(i), i.clone())).collect();
        let mut obs = Observation { missing: live, ..Default::default() };
        let vault = BTreeMap::from([("vault".to_string(), "sha256:k".to_string())]);
        let key_ids = BTreeMap::from([(id_hash("apiserver-a"), vault.clone()), ("sha256:gone".into(), vault.clone())]);
        let samples = [(id_hash("apiserver-a"), "sha256:1".into()), ("sha256:gone".into(), "x".into())];
        merge_scrape(&mut obs, &by, &samples, &key_ids);
        assert_eq!(obs.reports, BTreeMap::from([("apiserver-a".to_string(), "sha256:1".to_string())]));
        assert_eq!(obs.key_ids, BTreeMap::from([("apiserver-a".to_string(), vault)]));
        assert_eq!(obs.missing, BTreeSet::from(["apiserver-b".to_string()]));
    }
}
