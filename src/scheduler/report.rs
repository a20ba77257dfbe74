//! The HA storage-state protocol of seed 002 ("Extended API proposal for HA cluster"), the part every replica runs:
//! each replica reports the storage version hash its own target serves in its element of
//! `status.currentStorageVersionHashes` (reporterID, hash, lastHeartbeatTime), adds the hash to
//! `persistedStorageVersionHashes` when it is new, and drops the elements of reporters silent for three intervals.
//! Only the leader decides from the reports ([`reports`], used by the trigger's decisions).
//!
//! With one replica (the embedded store: nobody else writes these StorageStates) the list holds exactly this
//! process' element, as the KEP says of a non-HA setup: elements of earlier processes are dropped at once instead
//! of after three intervals.

use crate::api::storage_state::{ReportedStorageVersionHash, StorageStateStatus, UNKNOWN_HASH};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeSet;
use std::time::Duration;

/// Reporters whose heartbeat is older than this many intervals are removed (the KEP's garbage collection).
pub const GC_INTERVALS: u32 = 3;

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

fn age_ms(hb: Option<&Time>, now: Timestamp) -> i64 {
    match hb {
        Some(t) => now.as_millisecond().saturating_sub(t.0.as_millisecond()),
        None => i64::MAX,
    }
}

/// The status after `reporter` observed `hash` at `now`. `shared`: other replicas write these StorageStates too
/// (etcd); otherwise this process is the only reporter.
///
/// - its element is added or updated; with `shared`, elements older than [`GC_INTERVALS`] intervals are removed,
///   without it every other element is;
/// - `hash` is appended to persisted unless listed (a new StorageState starts with ["Unknown"], the KEP's
///   default; "Unknown" already covers the current hash, so that is not appended to it);
/// - currentStorageVersionHash is the hash all reports agree on (unchanged while they disagree: the last one all
///   replicas served), lastHeartbeatTime the time of this report.
pub fn reported_status(
    previous: Option<&StorageStateStatus>,
    reporter: &str,
    hash: &str,
    now: Timestamp,
    interval: Duration,
    shared: bool,
) -> StorageStateStatus {
    let mut s = previous.cloned().unwrap_or_default();
    let recorded = s.current_storage_version_hash.clone().filter(|h| !h.is_empty());
    if s.persisted_storage_version_hashes.is_empty() || recorded.is_none() {
        // New (or never reported): nothing is known about the stored objects.
        s.persisted_storage_version_hashes = vec![UNKNOWN_HASH.to_string()];
    } else {
        let listed = s.persisted_storage_version_hashes.iter().any(|h| h == hash);
        let covered =
            recorded.as_deref() == Some(hash) && s.persisted_storage_version_hashes.iter().any(|h| h == UNKNOWN_HASH);
        if !listed && !covered {
            s.persisted_storage_version_hashes.push(hash.to_string());
        }
    }
    let gc = millis(interval).saturating_mul(i64::from(GC_INTERVALS));
    s.current_storage_version_hashes
        .retain(|r| r.reporter_id != reporter && shared && age_ms(r.last_heartbeat_time.as_ref(), now) <= gc);
    s.current_storage_version_hashes.push(ReportedStorageVersionHash {
        reporter_id: reporter.to_string(),
        current_storage_version_hash: hash.to_string(),
        last_heartbeat_time: Some(Time(now)),
    });
    s.current_storage_version_hashes.sort_by(|a, b| a.reporter_id.cmp(&b.reporter_id));
    let hashes: BTreeSet<&str> =
        s.current_storage_version_hashes.iter().map(|r| r.current_storage_version_hash.as_str()).collect();
    if hashes.len() == 1 || recorded.is_none() {
        s.current_storage_version_hash = Some(hash.to_string());
    }
    s.last_heartbeat_time = Some(Time(now));
    s
}

/// What the reports of one StorageState say, for the leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reports {
    /// Nobody reported yet.
    None,
    /// Every report shows `hash`. `fresh`: none is older than one interval. `reporters`: who reported.
    Agree { hash: String, fresh: bool, reporters: BTreeSet<String> },
    /// The replicas serve different storage versions (a rolling upgrade or a rollback is under way).
    Diverge { hashes: BTreeSet<String> },
}

/// The reports of `status` at `now`.
pub fn reports(status: &StorageStateStatus, now: Timestamp, interval: Duration) -> Reports {
    let rs = &status.current_storage_version_hashes;
    let hashes: BTreeSet<String> = rs.iter().map(|r| r.current_storage_version_hash.clone()).collect();
    match hashes.len() {
        0 => Reports::None,
        1 => Reports::Agree {
            hash: hashes.into_iter().next().unwrap_or_default(),
            fresh: rs.iter().all(|r| age_ms(r.last_heartbeat_time.as_ref(), now) <= millis(interval)),
            reporters: rs.iter().map(|r| r.reporter_id.clone()).collect(),
        },
        _ => Reports::Diverge { hashes },
    }
}

/// Removes `reporter`'s element (a replica that stops gracefully), so that its silence does not hold the leader's
/// decisions back for three intervals. None when it had none.
pub fn withdrawn_status(status: &StorageStateStatus, reporter: &str) -> Option<StorageStateStatus> {
    if !status.current_storage_version_hashes.iter().any(|r| r.reporter_id == reporter) {
        return None;
    }
    let mut s = status.clone();
    s.current_storage_version_hashes.retain(|r| r.reporter_id != reporter);
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    const I: Duration = Duration::from_secs(600);

    fn t(min: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + min * 60).expect("ts")
    }

    fn entry(id: &str, hash: &str, min: i64) -> ReportedStorageVersionHash {
        ReportedStorageVersionHash {
            reporter_id: id.into(),
            current_storage_version_hash: hash.into(),
            last_heartbeat_time: Some(Time(t(min))),
        }
    }

    #[test]
    fn first_report_creates_unknown_and_current() {
        let s = reported_status(None, "a", "v1", t(0), I, true);
        assert_eq!(s.persisted_storage_version_hashes, [UNKNOWN_HASH]);
        assert_eq!(s.current_storage_version_hash.as_deref(), Some("v1"));
        assert_eq!(s.current_storage_version_hashes, [entry("a", "v1", 0)]);
        assert_eq!(s.last_heartbeat_time, Some(Time(t(0))));
        // Reporting the same hash again appends nothing: Unknown covers it.
        let s = reported_status(Some(&s), "a", "v1", t(10), I, true);
        assert_eq!(s.persisted_storage_version_hashes, [UNKNOWN_HASH]);
        assert_eq!(s.current_storage_version_hashes, [entry("a", "v1", 10)]);
        // A new hash is appended, also to Unknown.
        let s = reported_status(Some(&s), "a", "v2", t(20), I, true);
        assert_eq!(s.persisted_storage_version_hashes, [UNKNOWN_HASH, "v2"]);
    }

    #[test]
    fn shared_reports_merge_and_current_is_the_agreed_hash() {
        let mut s = StorageStateStatus {
            persisted_storage_version_hashes: vec!["v1".into()],
            current_storage_version_hash: Some("v1".into()),
            current_storage_version_hashes: vec![entry("a", "v1", 0), entry("b", "v1", 0), entry("c", "v1", 0)],
            ..Default::default()
        };
        s = reported_status(Some(&s), "a", "v2", t(10), I, true);
        assert_eq!(s.persisted_storage_version_hashes, ["v1", "v2"]);
        assert_eq!(s.current_storage_version_hash.as_deref(), Some("v1"), "no agreement: the last agreed hash");
        s = reported_status(Some(&s), "b", "v2", t(20), I, true);
        s = reported_status(Some(&s), "c", "v2", t(20), I, true);
        assert_eq!(s.current_storage_version_hash.as_deref(), Some("v2"));
        assert_eq!(s.persisted_storage_version_hashes, ["v1", "v2"], "listed once");
        let all: BTreeSet<String> = ["a", "b", "c"].iter().map(|r| r.to_string()).collect();
        assert_eq!(reports(&s, t(20), I), Reports::Agree { hash: "v2".into(), fresh: true, reporters: all });
    }

    #[test]
    fn silent_reporters_are_collected_after_three_intervals() {
        let s = StorageStateStatus {
            persisted_storage_version_hashes: vec!["v1".into()],
            current_storage_version_hash: Some("v1".into()),
            current_storage_version_hashes: vec![entry("old", "v1", 0), entry("b", "v1", 25)],
            ..Default::default()
        };
        // 30 minutes: exactly three intervals, kept; later, removed.
        let kept = reported_status(Some(&s), "a", "v1", t(30), I, true);
        assert_eq!(kept.current_storage_version_hashes.len(), 3);
        let gone = reported_status(Some(&s), "a", "v1", t(31), I, true);
        assert_eq!(gone.current_storage_version_hashes, [entry("a", "v1", 31), entry("b", "v1", 25)]);
        // One replica: only its own element, at once.
        let single = reported_status(Some(&s), "a", "v1", t(1), I, false);
        assert_eq!(single.current_storage_version_hashes, [entry("a", "v1", 1)]);
    }

    #[test]
    fn freshness_and_divergence() {
        let s = |es: Vec<ReportedStorageVersionHash>| StorageStateStatus {
            current_storage_version_hashes: es,
            ..Default::default()
        };
        assert_eq!(reports(&s(vec![]), t(0), I), Reports::None);
        let both = s(vec![entry("a", "v2", 10), entry("b", "v2", 0)]);
        let reporters: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
        assert_eq!(
            reports(&both, t(10), I),
            Reports::Agree { hash: "v2".into(), fresh: true, reporters: reporters.clone() }
        );
        // b's report is 10 minutes and a second old: no longer fresh.
        let later = t(10).checked_add(std::time::Duration::from_secs(1)).expect("ts");
        assert_eq!(reports(&both, later, I), Reports::Agree { hash: "v2".into(), fresh: false, reporters });
        let split = s(vec![entry("a", "v2", 10), entry("b", "v1", 10)]);
        assert_eq!(reports(&split, t(10), I), Reports::Diverge { hashes: ["v1".to_string(), "v2".to_string()].into() });
    }

    #[test]
    fn withdrawing_removes_only_our_element() {
        let s = StorageStateStatus {
            current_storage_version_hashes: vec![entry("a", "v1", 0), entry("b", "v1", 0)],
            ..Default::default()
        };
        assert_eq!(withdrawn_status(&s, "a").expect("changed").current_storage_version_hashes, [entry("b", "v1", 0)]);
        assert!(withdrawn_status(&s, "c").is_none());
    }
}
