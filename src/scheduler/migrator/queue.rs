//! Which migrations may run now, decided over every unfinished migration of both APIs: oldest first (Running ones,
//! being resumed, before pending ones), at most one per resource, at most `--migration-concurrency` at once. The
//! controller's reconcile of one migration starts it only when this plan over all of them says so, so that the
//! order holds whichever migration kube-runtime reconciles first.

use super::*;
use crate::api::storage_version_migration::GroupVersionResource;
use std::collections::{BTreeMap, HashSet};

/// The metrics' resource label of a migration: an in-tree migration names no version (its version is resolved
/// when it starts), so its label has none.
pub(super) fn queue_label(m: &Migration) -> String {
    let r = m.resource();
    let gvr = m.requested_gvr().unwrap_or(GroupVersionResource {
        group: r.group,
        version: String::new(),
        resource: r.resource,
    });
    resource_label(&gvr)
}

/// What the controller knows beyond the migrations themselves.
pub(super) struct Occupancy<'a> {
    /// Migrations whose worker runs: each holds its resource and a place among the `capacity`.
    pub(super) running: &'a HashSet<MigrationKey>,
    /// Migrations waiting out a backoff after transient errors: each keeps its resource from younger migrations,
    /// but holds no place among the `capacity` (it runs no worker).
    pub(super) backing_off: &'a HashSet<MigrationKey>,
    pub(super) capacity: usize,
}

/// The plan over all migrations: which start now, and how many of each resource label run (or start now) or wait.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Plan {
    pub(super) start: Vec<MigrationKey>,
    pub(super) pending: BTreeMap<String, i64>,
    pub(super) running: BTreeMap<String, i64>,
}

/// The plan over `unfinished` (every migration that is neither finished nor known to have ended, in any order).
pub(super) fn plan(unfinished: &[&Migration], o: &Occupancy<'_>) -> Plan {
    let mut order: Vec<&Migration> = unfinished.to_vec();
    order.sort_by_key(|m| (!m.is_running(), m.meta().creation_timestamp.clone(), m.api(), m.name().to_string()));
    let mut out = Plan::default();
    let running: Vec<&&Migration> = order.iter().filter(|m| o.running.contains(&m.key())).collect();
    let mut busy: HashSet<ResourceKey> = running.iter().map(|m| m.resource()).collect();
    for m in &running {
        *out.running.entry(queue_label(m)).or_default() += 1;
    }
    let places = o.capacity.max(1).saturating_sub(running.len());
    for m in order.iter().filter(|m| !o.running.contains(&m.key())) {
        let resource = m.resource();
        let free = out.start.len() < places && !busy.contains(&resource);
        if free && !o.backing_off.contains(&m.key()) {
            out.start.push(m.key());
            *out.running.entry(queue_label(m)).or_default() += 1;
        } else {
            *out.pending.entry(queue_label(m)).or_default() += 1;
        }
        // A younger migration of the same resource waits for this one, even when this one waits for a place or
        // backs off.
        busy.insert(resource);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn migration(api: &str, name: &str, created: &str, resource: &str, running: bool) -> Migration {
        let conditions = match (api, running) {
            (_, false) => serde_json::json!([]),
            ("ours", true) => serde_json::json!([{"type": "Running", "status": "True"}]),
            (_, true) => serde_json::json!([{"type": "Running", "status": "True", "reason": "R", "message": "",
                "lastTransitionTime": created}]),
        };
        let metadata = serde_json::json!({"name": name, "uid": name, "creationTimestamp": created});
        match api {
            "ours" => Migration::Ours(
                serde_json::from_value(serde_json::json!({"metadata": metadata,
                    "spec": {"resource": {"group": "g", "version": "v1", "resource": resource}},
                    "status": {"conditions": conditions}}))
                .expect("ours"),
            ),
            _ => Migration::InTree(
                serde_json::from_value(serde_json::json!({"metadata": metadata,
                    "spec": {"resource": {"group": "g", "resource": resource}},
                    "status": {"conditions": conditions}}))
                .expect("in-tree"),
            ),
        }
    }

    fn t(s: u32) -> String {
        format!("2026-01-01T00:00:{s:02}Z")
    }

    fn names(p: &Plan) -> Vec<&str> {
        p.start.iter().map(|k| k.name.as_str()).collect()
    }

    fn occupancy<'a>(
        running: &'a HashSet<MigrationKey>,
        backing_off: &'a HashSet<MigrationKey>,
        n: usize,
    ) -> Occupancy<'a> {
        Occupancy { running, backing_off, capacity: n }
    }

    #[test]
    fn one_migration_per_resource_oldest_first_across_both_apis() {
        let all = [
            migration("in-tree", "b-new", &t(3), "bs", false),
            migration("ours", "a-young", &t(2), "as", false),
            migration("in-tree", "a-old", &t(1), "as", false),
            migration("ours", "c", &t(4), "cs", false),
        ];
        let refs: Vec<&Migration> = all.iter().collect();
        let none = HashSet::new();
        // Capacity for all: the younger migration of `as` waits for the older one of the other API.
        let p = plan(&refs, &occupancy(&none, &none, 10));
        assert_eq!(names(&p), ["a-old", "b-new", "c"]);
        assert_eq!(p.pending.values().sum::<i64>(), 1);
        // A running migration of `bs` holds its resource; capacity 2 leaves one place.
        let running = HashSet::from([all[0].key()]);
        let p = plan(&refs, &occupancy(&running, &none, 2));
        assert_eq!(names(&p), ["a-old"]);
        assert_eq!(p.running.values().sum::<i64>(), 2, "the running one and the one it starts");
        // A migration being resumed (Running) goes before older pending ones.
        let all = [migration("ours", "old", &t(1), "xs", false), migration("in-tree", "new", &t(5), "ys", true)];
        let refs: Vec<&Migration> = all.iter().collect();
        assert_eq!(names(&plan(&refs, &occupancy(&none, &none, 1))), ["new"]);
    }

    #[test]
    fn backing_off_holds_no_place_but_keeps_its_resource_from_younger_migrations() {
        let all = [
            migration("ours", "old", &t(1), "xs", false),
            migration("in-tree", "new", &t(5), "ys", true),
            migration("in-tree", "newer", &t(6), "ys", false),
        ];
        let refs: Vec<&Migration> = all.iter().collect();
        let (none, backing_off) = (HashSet::new(), HashSet::from([all[1].key()]));
        let p = plan(&refs, &occupancy(&none, &backing_off, 1));
        assert_eq!(names(&p), ["old"], "its place goes to the next one; `newer` waits for `new`");
        assert_eq!(p.pending.values().sum::<i64>(), 2);
        // Its backoff over, it is first again (Running before pending).
        assert_eq!(names(&plan(&refs, &occupancy(&none, &none, 1))), ["new"]);
    }
}
