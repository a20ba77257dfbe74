//! `--runtime-config`: turns API groups of this server off, in kube-apiserver's syntax (`<group>/<version>=false`,
//! comma-separated or repeated; an empty value means true).
//!
//! Where another server already serves one of our groups (gardener-apiserver serves `core.gardener.cloud` in a
//! Gardener landscape), this server runs beside it without that group: it serves it neither locally nor through
//! the aggregator, and the cluster check does not count the other server's APIService against it. A group is on or
//! off whole (the deploy kit decides per group: `server::cluster_check`), and the groups the scheduler keeps its own
//! state in stay on while the scheduler runs.

use crate::registry::strategy::Strategy;
use std::collections::BTreeMap;
use std::sync::Arc;

/// One `--runtime-config` entry: a group version and whether it is served.
pub type RuntimeConfigEntry = (String, bool);

/// Why `--runtime-config` was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RuntimeConfigError {
    #[error("--runtime-config: expected <group>/<version>[=true|false], got {0:?}")]
    Syntax(String),
    #[error("--runtime-config: this server serves no {key} (it serves {served})")]
    NotServed { key: String, served: String },
    #[error("--runtime-config: {group} is turned off for {off} but not for {on}: this server serves a group whole or not at all")]
    Partly { group: String, off: String, on: String },
    #[error(
        "--runtime-config: {group} cannot be turned off while the scheduler runs ({why}); add --disable-scheduler"
    )]
    NeededByTheScheduler { group: String, why: &'static str },
}

/// Parses one flag value: `a/v1=false,b/v2` (clap calls this once per occurrence of the flag).
pub fn parse_runtime_config(s: &str) -> Result<Vec<RuntimeConfigEntry>, RuntimeConfigError> {
    s.split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|entry| {
            let (key, value) = entry.split_once('=').unwrap_or((entry, ""));
            let on = match value.trim() {
                "" | "true" => true,
                "false" => false,
                _ => return Err(RuntimeConfigError::Syntax(entry.to_string())),
            };
            let key = key.trim();
            match key.split_once('/') {
                Some((g, v)) if !g.is_empty() && !v.is_empty() && !v.contains('/') => Ok((key.to_string(), on)),
                _ => Err(RuntimeConfigError::Syntax(entry.to_string())),
            }
        })
        .collect()
}

/// Whether the scheduler keeps its own state in `group` (it cannot be turned off while the scheduler runs).
pub fn needed_by_the_scheduler(group: &str) -> bool {
    SCHEDULER_GROUPS.iter().any(|(g, _)| *g == group)
}

/// The groups the scheduler cannot run without, and why.
const SCHEDULER_GROUPS: &[(&str, &str)] = &[
    ("migration.k8s.io", "it records its StorageStates and StorageVersionMigrations there"),
    ("storagemigration.k8s.io", "it runs that group's StorageVersionMigrations"),
];

/// `kinds` without those of the groups `entries` turn off (the last entry for a key wins, as for kube-apiserver).
pub fn served_kinds(
    kinds: Vec<Arc<dyn Strategy>>,
    entries: &[RuntimeConfigEntry],
    scheduler: bool,
) -> Result<Vec<Arc<dyn Strategy>>, RuntimeConfigError> {
    let group_versions = crate::server::manifests::apiservice::group_versions(&kinds);
    let mut wanted: BTreeMap<&str, bool> = BTreeMap::new();
    for (key, on) in entries {
        let known = group_versions.iter().any(|(g, vs)| vs.iter().any(|v| format!("{g}/{v}") == *key));
        if !known {
            let served: Vec<String> =
                group_versions.iter().flat_map(|(g, vs)| vs.iter().map(move |v| format!("{g}/{v}"))).collect();
            return Err(RuntimeConfigError::NotServed { key: key.clone(), served: served.join(", ") });
        }
        wanted.insert(key, *on);
    }
    let mut off_groups = Vec::new();
    for (group, versions) in &group_versions {
        let state = |v: &&str| wanted.get(format!("{group}/{v}").as_str()).copied().unwrap_or(true);
        let (off, on): (Vec<&str>, Vec<&str>) = versions.iter().partition(|v| !state(v));
        match (off.is_empty(), on.is_empty()) {
            (true, _) => continue,
            (false, false) => {
                return Err(RuntimeConfigError::Partly {
                    group: group.to_string(),
                    off: off.join(", "),
                    on: on.join(", "),
                })
            }
            (false, true) => {}
        }
        if let Some((_, why)) = SCHEDULER_GROUPS.iter().find(|(g, _)| g == group).filter(|_| scheduler) {
            return Err(RuntimeConfigError::NeededByTheScheduler { group: group.to_string(), why });
        }
        off_groups.push(*group);
    }
    if !off_groups.is_empty() {
        tracing::info!(groups = ?off_groups, "--runtime-config: these API groups are turned off (not served)");
    }
    Ok(kinds.into_iter().filter(|k| !off_groups.contains(&k.info().group)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<Arc<dyn Strategy>> {
        crate::api::kinds(&Default::default()).expect("kinds")
    }

    fn groups(kinds: &[Arc<dyn Strategy>]) -> Vec<&'static str> {
        let mut g: Vec<&str> = kinds.iter().map(|k| k.info().group).collect();
        g.sort();
        g.dedup();
        g
    }

    fn parse(s: &str) -> Vec<RuntimeConfigEntry> {
        parse_runtime_config(s).expect("parses")
    }

    #[test]
    fn values_are_read_as_kube_apiserver_reads_them() {
        assert_eq!(parse("a.io/v1=false,b.io/v2"), [("a.io/v1".to_string(), false), ("b.io/v2".to_string(), true)]);
        assert_eq!(parse("a.io/v1=true"), [("a.io/v1".to_string(), true)]);
        assert!(parse("").is_empty());
        for bad in ["a.io/v1=no", "a.io", "/v1=false", "a.io/=false", "a/b/c=false"] {
            assert!(matches!(parse_runtime_config(bad), Err(RuntimeConfigError::Syntax(_))), "{bad}");
        }
    }

    #[test]
    fn a_group_turned_off_whole_is_not_served() {
        let off = parse("core.gardener.cloud/v1alpha1=false,core.gardener.cloud/v1beta1=false");
        let kinds = served_kinds(all(), &off, true).expect("served");
        assert_eq!(groups(&kinds), ["migration.k8s.io", "storagemigration.k8s.io"]);
        // The last entry for a key wins: turned on again.
        let mut again = off.clone();
        again.extend(parse("core.gardener.cloud/v1alpha1=true,core.gardener.cloud/v1beta1"));
        assert_eq!(groups(&served_kinds(all(), &again, true).expect("served")), groups(&all()));
    }

    #[test]
    fn half_a_group_unknown_versions_and_the_schedulers_groups_are_refused() {
        let partly = served_kinds(all(), &parse("core.gardener.cloud/v1beta1=false"), true).err().expect("refused");
        assert_eq!(
            partly.to_string(),
            "--runtime-config: core.gardener.cloud is turned off for v1beta1 but not for v1alpha1: this server serves a group whole or not at all"
        );
        let unknown = served_kinds(all(), &parse("apps/v1=false"), true).err().expect("refused");
        assert!(matches!(unknown, RuntimeConfigError::NotServed { .. }), "{unknown}");
        assert!(unknown.to_string().contains("migration.k8s.io/v1alpha1"), "{unknown}");
        let needed = served_kinds(all(), &parse("migration.k8s.io/v1alpha1=false"), true).err().expect("refused");
        assert!(matches!(needed, RuntimeConfigError::NeededByTheScheduler { .. }), "{needed}");
        let without_scheduler = served_kinds(all(), &parse("migration.k8s.io/v1alpha1=false"), false).expect("ok");
        assert!(!groups(&without_scheduler).contains(&"migration.k8s.io"));
    }
}
