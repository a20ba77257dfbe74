//! The trigger's decisions about KMS v2 key_id rotations, pure: a KMS rotating its key changes nothing in the
//! EncryptionConfiguration (no new config hash), only the key_id each kube-apiserver's plugin reports
//! ([`super::key_id_metrics`]). Per resource and per provider that writes it:
//! - every live kube-apiserver must report one key_id hash for the provider; while they differ (or one reports
//!   none) nothing starts and the resource's KMS observation names who reports what (the recorded key_id marks the
//!   laggards);
//! - a key_id hash all report that differs from the recorded one starts the passive-migration margin: kube-apiserver
//!   migrates passively, and the KEP (3299, "key_id and rotation") has the cluster's data rewritten 3 + N + M
//!   minutes after the KEK change (3 minutes of cached write state, N for the plugins to pick the key up, M of
//!   buffer), by when every apiserver writes with the new key or fails writes. When the margin has passed since all
//!   of them reported it first, the resource is migrated once and the new key_id recorded;
//! - a key_id first observed is recorded without a migration: the first sight of the resource's write key (with a
//!   copy) or of the config hash (without) already rewrites it.

use super::observe::Observation;
use k8s_openapi::jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A new key_id hash every live kube-apiserver reports for a provider, and since when (whole seconds): the
/// migration waits for the margin from then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    pub key_id: String,
    pub since: Timestamp,
}

/// What was recorded for one resource about its KMS v2 providers (its StorageState's annotations).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KmsRecorded {
    /// Provider -> the key_id hash the trigger last acted on (migrated for, or first observed).
    pub key_ids: BTreeMap<String, String>,
    /// Provider -> the new key_id hash waiting for the margin.
    pub pending: BTreeMap<String, Pending>,
}

/// What the stored values of a resource may be encrypted with, per provider: the key_id it writes with now, and
/// whether others may still be in use (a rotation not yet migrated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyIdsInUse {
    /// The key_id hash every live kube-apiserver writes with, or the recorded one while they differ.
    pub writing: String,
    /// Other key_id hashes values may be under: the recorded one during a rotation, those some apiservers report.
    pub others: BTreeSet<String>,
}

/// What to do about one resource's KMS v2 providers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KmsStep {
    /// The KMS v2 providers writing the resource.
    pub providers: BTreeSet<String>,
    pub record: KmsRecorded,
    /// Request a migration, for this reason.
    pub migrate: Option<String>,
    /// The observation per provider, in words (empty when no KMS v2 provider writes the resource).
    pub observed: String,
    /// Provider -> its key_ids in use.
    pub in_use: BTreeMap<String, KeyIdsInUse>,
    /// The earliest time a pending rotation may be migrated.
    pub waiting_until: Option<Timestamp>,
}

impl KmsStep {
    /// Whether values of the resource may be under a key_id other than the one written now.
    pub fn rotating(&self) -> bool {
        self.in_use.values().any(|k| !k.others.is_empty())
    }
}

/// `10m`, `90s`, `1m30s`: the margin as the flag takes it.
pub fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 60, s % 60) {
        (0, s) => format!("{s}s"),
        (m, 0) => format!("{m}m"),
        (m, s) => format!("{m}m{s}s"),
    }
}

/// Decides the KMS part of a round, once every live kube-apiserver answered with one config hash. `writers` maps
/// each resource's StorageState name to the KMS v2 providers that write it (with a copy: its first provider when
/// that is `kms` v2; without: every provider any apiserver reports) and its record.
pub fn plan(
    obs: &Observation,
    writers: &BTreeMap<String, (BTreeSet<String>, KmsRecorded)>,
    now: Timestamp,
    margin: Duration,
) -> BTreeMap<String, KmsStep> {
    writers
        .iter()
        .map(|(name, (providers, rec))| {
            let mut step = KmsStep { providers: providers.clone(), ..Default::default() };
            let mut observed = Vec::new();
            let mut reasons = Vec::new();
            for provider in providers {
                let d = decide_provider(obs, provider, rec, now, margin);
                observed.push(d.observed);
                reasons.extend(d.migrate);
                if let Some(k) = d.recorded {
                    step.record.key_ids.insert(provider.clone(), k);
                }
                if let Some(p) = d.pending {
                    let until = until(&p, margin);
                    step.waiting_until = Some(step.waiting_until.map_or(until, |u| u.min(until)));
                    step.record.pending.insert(provider.clone(), p);
                }
                step.in_use.extend(d.in_use.map(|k| (provider.clone(), k)));
            }
            step.observed = observed.join("; ");
            step.migrate = (!reasons.is_empty()).then(|| reasons.join("; "));
            (name.clone(), step)
        })
        .collect()
}

fn until(p: &Pending, margin: Duration) -> Timestamp {
    let ms = i64::try_from(margin.as_millis()).unwrap_or(i64::MAX);
    Timestamp::from_millisecond(p.since.as_millisecond().saturating_add(ms)).unwrap_or(Timestamp::MAX)
}

/// The decision about one provider of one resource.
struct ProviderDecision {
    observed: String,
    recorded: Option<String>,
    pending: Option<Pending>,
    migrate: Option<String>,
    in_use: Option<KeyIdsInUse>,
}

fn decide_provider(
    obs: &Observation,
    provider: &str,
    rec: &KmsRecorded,
    now: Timestamp,
    margin: Duration,
) -> ProviderDecision {
    let recorded = rec.key_ids.get(provider);
    let mut by_key_id: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut silent = Vec::new();
    for id in obs.reports.keys() {
        match obs.key_ids.get(id).and_then(|k| k.get(provider)) {
            Some(k) => by_key_id.entry(k.as_str()).or_default().push(id.as_str()),
            None => silent.push(id.as_str()),
        }
    }
    let n = obs.reports.len();
    let one = if silent.is_empty() && by_key_id.len() == 1 { by_key_id.keys().next().copied() } else { None };
    let Some(shared) = one else {
        return unsettled(provider, recorded, &by_key_id, &silent, n);
    };
    let settled = |observed: String, migrate: Option<String>| ProviderDecision {
        observed,
        recorded: Some(shared.to_string()),
        pending: None,
        migrate,
        in_use: Some(KeyIdsInUse { writing: shared.to_string(), others: BTreeSet::new() }),
    };
    let all = format!("kms provider {provider}: all {n} live kube-apiservers report key_id hash {shared}");
    match recorded {
        None => settled(format!("{all}, first observed"), None),
        Some(r) if r == shared => settled(all, None),
        Some(r) => {
            // The margin counts from the first round that saw all of them report it (kept across rounds).
            let since = match rec.pending.get(provider) {
                Some(p) if p.key_id == shared => p.since,
                _ => Timestamp::from_second(now.as_second()).unwrap_or(now),
            };
            let pending = Pending { key_id: shared.to_string(), since };
            let until = until(&pending, margin);
            if now >= until {
                let why = format!(
                    "kms provider {provider}: key_id hash changed from {r} to {shared}, reported by all {n} \
                     kube-apiservers since {since}"
                );
                return settled(format!("{all} since {since}; migrating from {r}"), Some(why));
            }
            ProviderDecision {
                observed: format!(
                    "{all} since {since} (recorded: {r}): waiting until {until} (the passive-migration margin, {}) \
                     before migrating",
                    format_duration(margin)
                ),
                recorded: Some(r.clone()),
                pending: Some(pending),
                migrate: None,
                in_use: Some(KeyIdsInUse { writing: shared.to_string(), others: BTreeSet::from([r.clone()]) }),
            }
        }
    }
}

/// While the live kube-apiservers report different key_ids, or some none: keep the record, drop a pending rotation
/// (the margin counts from when all report the key_id), and name who reports what.
fn unsettled(
    provider: &str,
    recorded: Option<&String>,
    by_key_id: &BTreeMap<&str, Vec<&str>>,
    silent: &[&str],
    n: usize,
) -> ProviderDecision {
    let mut groups: Vec<String> = by_key_id
        .iter()
        .map(|(k, ids)| {
            let which = if recorded.is_some_and(|r| r == k) { "the recorded " } else { "" };
            format!("{which}{k} ({})", ids.join(", "))
        })
        .collect();
    if !silent.is_empty() {
        groups.push(format!("no key_id reported ({})", silent.join(", ")));
    }
    let in_use = recorded.map(|r| KeyIdsInUse {
        writing: r.clone(),
        others: by_key_id.keys().filter(|k| **k != r.as_str()).map(|k| k.to_string()).collect(),
    });
    ProviderDecision {
        observed: format!(
            "kms provider {provider}: waiting for all {n} live kube-apiservers to report one key_id hash: {}",
            groups.join("; ")
        ),
        recorded: recorded.cloned(),
        pending: None,
        migrate: None,
        in_use,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "sha256:6b86b273ff34fce19d6b804eff5a3f5747ada4eaa22f1d49c01e52ddb7875b4b";
    const NEW: &str = "sha256:d4735e3a265e16eee03f59718b9b5d03019c07d8b6c51f90da3a666eec13ab35";
    const MARGIN: Duration = Duration::from_secs(600);

    /// Every identity answered; `key_ids` per identity for provider `vault` (None: no series).
    fn obs(key_ids: &[(&str, Option<&str>)]) -> Observation {
        Observation {
            reports: key_ids.iter().map(|(id, _)| (id.to_string(), "sha256:config".to_string())).collect(),
            key_ids: key_ids
                .iter()
                .map(|(id, k)| (id.to_string(), k.iter().map(|k| ("vault".to_string(), k.to_string())).collect()))
                .collect(),
            ..Default::default()
        }
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("time")
    }

    fn recorded(key_id: Option<&str>, pending: Option<(&str, i64)>) -> KmsRecorded {
        KmsRecorded {
            key_ids: key_id.iter().map(|k| ("vault".to_string(), k.to_string())).collect(),
            pending: pending
                .iter()
                .map(|(k, s)| ("vault".to_string(), Pending { key_id: k.to_string(), since: at(*s) }))
                .collect(),
        }
    }

    fn step(o: &Observation, rec: KmsRecorded, now: i64) -> KmsStep {
        let writers = BTreeMap::from([("shootstates".to_string(), (BTreeSet::from(["vault".to_string()]), rec))]);
        plan(o, &writers, at(now), MARGIN).remove("shootstates").expect("step")
    }

    #[test]
    fn apiservers_moving_one_by_one_hold_the_rotation_and_are_named() {
        let rec = recorded(Some(OLD), None);
        for moved in [&["a"][..], &["a", "b"]] {
            let o = obs(&[("a", Some(NEW)), ("b", Some(if moved.len() == 2 { NEW } else { OLD })), ("c", Some(OLD))]);
            let s = step(&o, rec.clone(), 1_000);
            assert_eq!(s.migrate, None);
            assert_eq!(s.record, rec, "nothing pending while they differ");
            let laggards = if moved.len() == 2 { "c" } else { "b, c" };
            assert!(s.observed.contains(&format!("the recorded {OLD} ({laggards})")), "{}", s.observed);
            assert!(s.observed.contains(&format!("{NEW} ({})", moved.join(", "))), "{}", s.observed);
            assert_eq!(s.in_use["vault"].writing, OLD);
            assert!(s.rotating());
        }
        // One without any series for the provider holds it too.
        let s = step(&obs(&[("a", Some(NEW)), ("b", None)]), recorded(Some(OLD), Some((NEW, 900))), 1_000);
        assert!(s.observed.ends_with("no key_id reported (b)"), "{}", s.observed);
        assert!(s.record.pending.is_empty(), "a pending rotation starts over once all report it again");
    }

    #[test]
    fn all_on_a_new_key_id_wait_for_the_margin_then_migrate_once() {
        let o = obs(&[("a", Some(NEW)), ("b", Some(NEW))]);
        let s = step(&o, recorded(Some(OLD), None), 1_000);
        assert_eq!(s.migrate, None);
        assert_eq!(s.record, recorded(Some(OLD), Some((NEW, 1_000))));
        assert_eq!(s.waiting_until, Some(at(1_600)));
        assert!(
            s.observed.contains("waiting until 1970-01-01T00:26:40Z (the passive-migration margin, 10m)"),
            "{}",
            s.observed
        );
        assert_eq!(s.in_use["vault"], KeyIdsInUse { writing: NEW.into(), others: BTreeSet::from([OLD.into()]) });
        // Later rounds keep the first time; the margin passed: one migration, the new key_id recorded.
        let s = step(&o, recorded(Some(OLD), Some((NEW, 1_000))), 1_599);
        assert_eq!((s.migrate, s.waiting_until), (None, Some(at(1_600))));
        let s = step(&o, recorded(Some(OLD), Some((NEW, 1_000))), 1_600);
        assert_eq!(
            s.migrate.as_deref(),
            Some(format!("kms provider vault: key_id hash changed from {OLD} to {NEW}, reported by all 2 kube-apiservers since 1970-01-01T00:16:40Z").as_str())
        );
        assert_eq!(s.record, recorded(Some(NEW), None));
        assert!(!s.rotating());
        let again = step(&o, s.record, 1_700);
        assert_eq!(again.migrate, None);
        assert_eq!(again.observed, format!("kms provider vault: all 2 live kube-apiservers report key_id hash {NEW}"));
    }

    #[test]
    fn a_pending_key_id_replaced_by_another_starts_over_and_a_first_one_is_recorded() {
        let third = "sha256:third";
        let s = step(&obs(&[("a", Some(third))]), recorded(Some(OLD), Some((NEW, 1_000))), 2_000);
        assert_eq!(s.record.pending["vault"], Pending { key_id: third.into(), since: at(2_000) });
        assert_eq!(s.migrate, None);
        let s = step(&obs(&[("a", Some(NEW))]), KmsRecorded::default(), 2_000);
        assert_eq!((s.migrate, s.record), (None, recorded(Some(NEW), None)));
        assert!(s.observed.ends_with("first observed"));
    }

    #[test]
    fn without_kms_providers_nothing_is_recorded() {
        let writers = BTreeMap::from([("secrets".to_string(), (BTreeSet::new(), recorded(Some(OLD), None)))]);
        let s = plan(&obs(&[("a", Some(NEW))]), &writers, at(0), MARGIN).remove("secrets").expect("step");
        assert_eq!(s, KmsStep::default());
        assert_eq!(format_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(format_duration(Duration::from_secs(2)), "2s");
    }
}
