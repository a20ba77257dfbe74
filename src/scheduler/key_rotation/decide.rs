//! The key-rotation trigger's decisions: pure functions of what a StorageState records, the configured write key,
//! the write key every live replica uses, the migrations of the resource and, after a migration, the counted keys.

use crate::api::storage_state::{EncryptionKeyCount, StorageStateStatus};
use crate::api::storage_version_migration::{StorageVersionMigration, CONDITION_SUCCEEDED};
use crate::scheduler::trigger_kit::{is_finished, latest, requested_at};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;

/// `status.encryptionKeyRotation` while values may use another key than the write key.
pub const ROTATING: &str = "Rotating";
/// `status.encryptionKeyRotation` once the count found every value under the write key.
pub const FINISHED: &str = "Finished";
/// `status.encryptionKeyRotation` when values under other keys were counted and no migration is under way.
pub const INCOMPLETE: &str = "Incomplete";

/// What the trigger knows of one resource.
#[derive(Clone, Copy, Debug)]
pub struct Observed<'a> {
    /// The write key of this replica's encryption config for the resource (`identity` when plaintext).
    pub configured: &'a str,
    /// The write key each live replica uses for the resource (with one replica: this one's). A rotation starts
    /// only once they all write with the configured key.
    pub replicas: &'a [String],
    /// The StorageState's status (None before the first report).
    pub status: Option<&'a StorageStateStatus>,
    /// The migrations of the resource.
    pub migrations: &'a [&'a StorageVersionMigration],
}

/// What to do about one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No write key recorded yet: record the configured one and count the stored values (no migration: only a
    /// change of the write key starts one).
    Record,
    /// The live replicas do not all write with the configured key yet: nothing changes.
    WaitForReplicas,
    /// The write key changed: record the new one, then migrate the resource.
    Rotate {
        from: String,
        to: String,
    },
    /// Rotating, and no migration was requested since the write key changed (e.g. the process stopped between the
    /// two): migrate.
    Migrate,
    /// A migration requested since the write key changed is running.
    Wait,
    /// The latest migration since the change Succeeded: count the stored values to finish the rotation.
    Count,
    /// The latest migration since the change Failed: left to the operator (a migration requested by hand counts).
    Failed {
        migration: String,
    },
    Nothing,
}

/// The decision for one resource.
pub fn decide(o: &Observed) -> Decision {
    if o.replicas.is_empty() || o.replicas.iter().any(|k| k != o.configured) {
        return Decision::WaitForReplicas;
    }
    let Some(recorded) = o.status.and_then(|s| s.encryption_write_key.as_deref()) else {
        return Decision::Record;
    };
    if recorded != o.configured {
        return Decision::Rotate { from: recorded.to_string(), to: o.configured.to_string() };
    }
    let status = o.status.expect("a recorded write key has a status");
    if status.encryption_key_rotation.as_deref() != Some(ROTATING) {
        return Decision::Nothing;
    }
    let since = status.encryption_write_key_time.as_ref().map(|t| t.0.as_second()).unwrap_or(i64::MIN);
    // Every migration requested since the key changed rewrites every value with it (the write path encrypts
    // with the current key); Time has whole seconds, so the second of the change counts.
    let since_change: Vec<&StorageVersionMigration> =
        o.migrations.iter().copied().filter(|m| requested_at(m).is_some_and(|r| r.as_second() >= since)).collect();
    match latest(&since_change) {
        None => Decision::Migrate,
        Some(m) if !is_finished(m) => Decision::Wait,
        Some(m) if m.is_true(CONDITION_SUCCEEDED) => Decision::Count,
        Some(m) => Decision::Failed { migration: m.metadata.name.clone().unwrap_or_default() },
    }
}

/// The status once the write key changed to `to`: the new key joins the keys in use until the count.
pub fn rotating_status(previous: &StorageStateStatus, to: &str, now: Timestamp) -> StorageStateStatus {
    let mut s = previous.clone();
    s.encryption_write_key = Some(to.to_string());
    s.encryption_write_key_time = Some(Time(now));
    if !s.persisted_encryption_keys.iter().any(|k| k == to) {
        s.persisted_encryption_keys.push(to.to_string());
    }
    s.encryption_key_rotation = Some(ROTATING.to_string());
    s
}

/// The status after counting the stored values (`counts`: values per key label) with `write_key` configured:
/// the keys in use are exactly the counted ones, the write key first; Finished when no value uses another key.
pub fn counted_status(
    previous: &StorageStateStatus,
    write_key: &str,
    counts: &BTreeMap<String, u64>,
    now: Timestamp,
) -> StorageStateStatus {
    let mut s = previous.clone();
    if s.encryption_write_key.as_deref() != Some(write_key) {
        s.encryption_write_key = Some(write_key.to_string());
        s.encryption_write_key_time = Some(Time(now));
    }
    let used: Vec<&String> = counts.iter().filter(|(_, n)| **n > 0).map(|(k, _)| k).collect();
    let others: Vec<String> = used.iter().filter(|k| **k != write_key).map(|k| k.to_string()).collect();
    s.persisted_encryption_keys = std::iter::once(write_key.to_string()).chain(others.iter().cloned()).collect();
    s.encryption_key_counts = counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| EncryptionKeyCount { key: k.clone(), values: *n })
        .collect();
    s.encryption_keys_count_time = Some(Time(now));
    s.encryption_key_rotation = Some(if others.is_empty() { FINISHED } else { INCOMPLETE }.to_string());
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::storage_version_migration::MigrationCondition;
    use crate::api::storage_version_migration::CONDITION_FAILED;
    use crate::scheduler::trigger_kit::ANNOTATION_REQUESTED_AT;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const KEY1: &str = "aesgcm:v1:key1";
    const KEY2: &str = "aesgcm:v1:key2";

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).expect("timestamp")
    }

    fn migration(name: &str, second: i64, condition: Option<&str>) -> StorageVersionMigration {
        let mut m = StorageVersionMigration {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: Some([(ANNOTATION_REQUESTED_AT.to_string(), at(second).to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        if let Some(c) = condition {
            let cond = MigrationCondition {
                type_: c.into(),
                status: "True".into(),
                last_update_time: Some(Time(at(second + 1))),
                reason: Some("Test".into()),
                message: None,
            };
            m.status = Some(crate::api::storage_version_migration::StorageVersionMigrationStatus {
                conditions: vec![cond],
                ..Default::default()
            });
        }
        m
    }

    fn recorded(key: &str, second: i64, rotation: Option<&str>) -> StorageStateStatus {
        StorageStateStatus {
            encryption_write_key: Some(key.into()),
            encryption_write_key_time: Some(Time(at(second))),
            encryption_key_rotation: rotation.map(String::from),
            ..Default::default()
        }
    }

    fn decide_with(
        configured: &str,
        replicas: &[&str],
        status: Option<&StorageStateStatus>,
        ms: &[StorageVersionMigration],
    ) -> Decision {
        let replicas: Vec<String> = replicas.iter().map(|s| s.to_string()).collect();
        let ms: Vec<&StorageVersionMigration> = ms.iter().collect();
        decide(&Observed { configured, replicas: &replicas, status, migrations: &ms })
    }

    #[test]
    fn first_sight_records_without_migrating() {
        assert_eq!(decide_with(KEY1, &[KEY1], None, &[]), Decision::Record);
        assert_eq!(decide_with(KEY1, &[KEY1], Some(&StorageStateStatus::default()), &[]), Decision::Record);
    }

    #[test]
    fn a_changed_write_key_rotates_and_an_unchanged_one_does_nothing() {
        let s = recorded(KEY1, 100, Some(FINISHED));
        assert_eq!(decide_with(KEY2, &[KEY2], Some(&s), &[]), Decision::Rotate { from: KEY1.into(), to: KEY2.into() });
        // A read key added or removed, or whitespace: the write key is the same.
        assert_eq!(decide_with(KEY1, &[KEY1], Some(&s), &[]), Decision::Nothing);
        // Enabling encryption is a change of the write key too.
        let plain = recorded("identity", 100, Some(FINISHED));
        assert_eq!(
            decide_with(KEY1, &[KEY1], Some(&plain), &[]),
            Decision::Rotate { from: "identity".into(), to: KEY1.into() }
        );
    }

    #[test]
    fn waits_until_every_live_replica_writes_with_the_configured_key() {
        let s = recorded(KEY1, 100, Some(FINISHED));
        assert_eq!(decide_with(KEY2, &[KEY2, KEY1], Some(&s), &[]), Decision::WaitForReplicas);
        assert_eq!(decide_with(KEY2, &[], Some(&s), &[]), Decision::WaitForReplicas);
        assert_eq!(
            decide_with(KEY2, &[KEY2, KEY2], Some(&s), &[]),
            Decision::Rotate { from: KEY1.into(), to: KEY2.into() }
        );
    }

    #[test]
    fn follows_the_migrations_requested_since_the_change() {
        let s = recorded(KEY2, 100, Some(ROTATING));
        // Only one from before the change: migrate.
        let old = migration("old", 90, Some(CONDITION_SUCCEEDED));
        assert_eq!(decide_with(KEY2, &[KEY2], Some(&s), std::slice::from_ref(&old)), Decision::Migrate);
        let running = migration("new", 100, None);
        assert_eq!(decide_with(KEY2, &[KEY2], Some(&s), &[old.clone(), running]), Decision::Wait);
        let done = migration("new", 101, Some(CONDITION_SUCCEEDED));
        assert_eq!(decide_with(KEY2, &[KEY2], Some(&s), &[old.clone(), done.clone()]), Decision::Count);
        let failed = migration("newer", 102, Some(CONDITION_FAILED));
        assert_eq!(
            decide_with(KEY2, &[KEY2], Some(&s), &[old, done, failed]),
            Decision::Failed { migration: "newer".into() }
        );
        // Finished: nothing more.
        let finished = recorded(KEY2, 100, Some(FINISHED));
        assert_eq!(decide_with(KEY2, &[KEY2], Some(&finished), &[]), Decision::Nothing);
    }

    #[test]
    fn statuses_list_the_keys_in_use() {
        let mut before = recorded(KEY1, 100, Some(FINISHED));
        before.persisted_encryption_keys = vec![KEY1.into()];
        before.current_storage_version_hash = Some("h".into());
        let rotating = rotating_status(&before, KEY2, at(200));
        assert_eq!(rotating.persisted_encryption_keys, [KEY1, KEY2]);
        assert_eq!(rotating.encryption_key_rotation.as_deref(), Some(ROTATING));
        assert_eq!(rotating.encryption_write_key_time, Some(Time(at(200))));
        // The storage-version fields are kept.
        assert_eq!(rotating.current_storage_version_hash.as_deref(), Some("h"));

        let counts: BTreeMap<String, u64> = [(KEY2.to_string(), 7), (KEY1.to_string(), 0)].into();
        let done = counted_status(&rotating, KEY2, &counts, at(300));
        assert_eq!(done.persisted_encryption_keys, [KEY2]);
        assert_eq!(done.encryption_key_counts, [EncryptionKeyCount { key: KEY2.into(), values: 7 }]);
        assert_eq!(done.encryption_key_rotation.as_deref(), Some(FINISHED));
        // The change time stays the one of the change.
        assert_eq!(done.encryption_write_key_time, Some(Time(at(200))));

        let left: BTreeMap<String, u64> = [(KEY2.to_string(), 6), ("identity".to_string(), 1)].into();
        let incomplete = counted_status(&rotating, KEY2, &left, at(300));
        assert_eq!(incomplete.persisted_encryption_keys, [KEY2, "identity"]);
        assert_eq!(incomplete.encryption_key_rotation.as_deref(), Some(INCOMPLETE));

        // No values at all: nothing to rotate.
        let empty = counted_status(&StorageStateStatus::default(), KEY1, &BTreeMap::new(), at(1));
        assert_eq!(
            (empty.persisted_encryption_keys, empty.encryption_key_rotation.as_deref()),
            (vec![KEY1.to_string()], Some(FINISHED))
        );
    }
}
