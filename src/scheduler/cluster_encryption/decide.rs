//! The trigger's decisions, pure: from what the Leases and scrapes showed, the mounted copy, and what was recorded
//! per resource, what to record and which resources to migrate.

use super::config::{ConfigCopy, CopyError};
use super::observe::{same_hash, Observation};
use std::collections::BTreeMap;

/// What was recorded for one resource (its StorageState's annotations).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    /// The config hash every live kube-apiserver shared when the trigger last acted.
    pub hash: Option<String>,
    /// The write key of the copy then (with a copy only).
    pub write_key: Option<String>,
}

/// What to do about one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The record to write (unchanged when equal to the one read).
    pub record: Recorded,
    /// Request a migration, for this reason.
    pub migrate: Option<String>,
}

/// The outcome of one round: the observation in words (for the StorageStates and the logs), and per resource what
/// to do; no steps while the apiservers do not all answer with one hash (and, with a copy, the copy's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub observed: String,
    /// Whether `observed` is a reason to wait (a warning) rather than agreement.
    pub waiting: bool,
    pub steps: BTreeMap<String, Step>,
}

/// The copy, as read this round: `None` without `--cluster-encryption-provider-config`.
pub type CopyRead<'a> = Option<Result<&'a ConfigCopy, &'a CopyError>>;

fn wait(observed: String) -> Plan {
    Plan { observed, waiting: true, steps: BTreeMap::new() }
}

/// Decides a round. `resources` maps each resource's StorageState name to its (resource, group) and record.
pub fn plan(obs: &Observation, copy: CopyRead<'_>, resources: &BTreeMap<String, (String, String, Recorded)>) -> Plan {
    if obs.reports.is_empty() && obs.missing.is_empty() {
        return wait(format!(
            "no live kube-apiserver identity Lease (label {}) in {}",
            super::observe::IDENTITY_LABEL,
            super::observe::IDENTITY_NAMESPACE
        ));
    }
    if !obs.missing.is_empty() {
        let missing: Vec<&str> = obs.missing.iter().map(String::as_str).collect();
        return wait(format!(
            "{} of {} live kube-apiservers did not answer in {} scrapes of /metrics (or export no {}): {}",
            missing.len(),
            missing.len() + obs.reports.len(),
            obs.scrapes,
            super::observe::LAST_CONFIG_INFO,
            missing.join(", ")
        ));
    }
    let mut by_hash: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (id, hash) in &obs.reports {
        by_hash.entry(hash.as_str()).or_default().push(id.as_str());
    }
    if by_hash.len() > 1 {
        let groups: Vec<String> = by_hash.iter().map(|(h, ids)| format!("{h} ({})", ids.join(", "))).collect();
        return wait(format!("the live kube-apiservers report different encryption configs: {}", groups.join("; ")));
    }
    let Some((shared, _)) = by_hash.into_iter().next() else { return wait("no reports".into()) };
    let n = obs.reports.len();
    match copy {
        None => Plan {
            observed: format!("all {n} live kube-apiservers report {shared}"),
            waiting: false,
            steps: resources
                .iter()
                .map(|(name, (_, _, rec))| {
                    let new = rec.hash.as_deref().is_none_or(|h| !same_hash(h, shared));
                    let why = format!("encryption config {shared} loaded by all {n} kube-apiservers");
                    let record = Recorded { hash: Some(shared.to_string()), write_key: rec.write_key.clone() };
                    (name.clone(), Step { record, migrate: new.then_some(why) })
                })
                .collect(),
        },
        Some(Err(e)) => wait(e.to_string()),
        Some(Ok(c)) if !same_hash(&c.hash, shared) => wait(format!(
            "all {n} live kube-apiservers report {shared}, the mounted copy is {}: waiting until they load the copy",
            c.hash
        )),
        Some(Ok(c)) => Plan {
            observed: format!("all {n} live kube-apiservers report {shared}, the mounted copy's hash"),
            waiting: false,
            steps: resources
                .iter()
                .map(|(name, (resource, group, rec))| {
                    let key = c.write_key(resource, group);
                    let why = match rec.write_key.as_deref() {
                        Some(old) if old == key => None,
                        Some(old) => Some(format!("write key changed from {old} to {key}")),
                        None => Some(format!("write key {key} first observed")),
                    };
                    let record = Recorded { hash: Some(shared.to_string()), write_key: Some(key) };
                    (name.clone(), Step { record, migrate: why })
                })
                .collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn obs(reports: &[(&str, &str)], missing: &[&str]) -> Observation {
        Observation {
            reports: reports.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(),
            missing: missing.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>(),
            scrapes: 7,
            ..Default::default()
        }
    }

    fn secrets(rec: Recorded) -> BTreeMap<String, (String, String, Recorded)> {
        BTreeMap::from([("secrets".to_string(), ("secrets".to_string(), String::new(), rec))])
    }

    #[test]
    fn waits_for_every_live_apiserver_and_one_hash() {
        let r = secrets(Recorded::default());
        let p = plan(&obs(&[("a", "sha256:1")], &["b"]), None, &r);
        assert!(p.waiting && p.steps.is_empty());
        assert!(
            p.observed.contains("1 of 2 live kube-apiservers did not answer in 7 scrapes")
                && p.observed.ends_with(": b")
        );
        let p = plan(&obs(&[("a", "sha256:1"), ("b", "sha256:2"), ("c", "sha256:2")], &[]), None, &r);
        assert!(p.waiting && p.observed.contains("sha256:1 (a); sha256:2 (b, c)"), "{}", p.observed);
        assert!(plan(&obs(&[], &[]), None, &r).waiting);
    }

    #[test]
    fn without_a_copy_every_new_shared_hash_migrates_once() {
        let o = obs(&[("a", "sha256:2"), ("b", "sha256:2")], &[]);
        let p = plan(&o, None, &secrets(Recorded { hash: Some("sha256:1".into()), write_key: None }));
        let step = &p.steps["secrets"];
        assert!(step.migrate.as_deref().is_some_and(|w| w.contains("sha256:2 loaded by all 2")));
        assert_eq!(step.record.hash.as_deref(), Some("sha256:2"));
        let again = plan(&o, None, &secrets(step.record.clone()));
        assert_eq!(again.steps["secrets"].migrate, None);
    }

    #[test]
    fn with_a_copy_only_a_changed_write_key_migrates() {
        let yaml = |first: &str, second: &str| {
            format!("resources:\n  - resources: [secrets]\n    providers:\n      - aescbc:\n          keys:\n            - {{name: {first}, secret: eA==}}\n            - {{name: {second}, secret: eA==}}\n")
        };
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("c.yaml");
        std::fs::write(&path, yaml("key1", "key2")).expect("write");
        let c1 = ConfigCopy::read(&path).expect("copy");
        let rec = Recorded { hash: Some(c1.hash.clone()), write_key: Some("aescbc:v1:key1".into()) };
        // key2 added second: a new hash, the same write key.
        std::fs::write(&path, yaml("key1", "key3")).expect("write");
        let c2 = ConfigCopy::read(&path).expect("copy");
        let p = plan(&obs(&[("a", &c2.hash)], &[]), Some(Ok(&c2)), &secrets(rec.clone()));
        assert_eq!(p.steps["secrets"].migrate, None);
        // The apiservers still report the old file: wait.
        let p = plan(&obs(&[("a", &c1.hash)], &[]), Some(Ok(&c2)), &secrets(rec.clone()));
        assert!(p.waiting && p.observed.contains("the mounted copy is"));
        // key3 first.
        std::fs::write(&path, yaml("key3", "key1")).expect("write");
        let c3 = ConfigCopy::read(&path).expect("copy");
        let p = plan(&obs(&[("a", &c3.hash)], &[]), Some(Ok(&c3)), &secrets(rec));
        assert_eq!(
            p.steps["secrets"].migrate.as_deref(),
            Some("write key changed from aescbc:v1:key1 to aescbc:v1:key3")
        );
    }
}
