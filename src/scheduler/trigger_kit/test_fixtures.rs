//! Fixtures of migrations and discovery documents, for the tests of the trigger's shared pieces and of the
//! triggers.

use super::*;
use crate::api::storage_version_migration::{GroupVersionResource, MigrationCondition, StorageVersionMigration};
use k8s_openapi::jiff::Timestamp;

pub(crate) const A: &str = "hashA=";
pub(crate) const B: &str = "hashB=";

pub(crate) fn ts(s: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + s).expect("timestamp")
}

pub(crate) fn gvr() -> GroupVersionResource {
    GroupVersionResource {
        group: "core.gardener.cloud".into(),
        version: "v1beta1".into(),
        resource: "shootstates".into(),
    }
}

/// A migration requested at `at` for `hash`, with the True condition `phase` (or none: pending).
pub(crate) fn svm(name: &str, hash: &str, at: i64, phase: Option<(&str, &str)>) -> StorageVersionMigration {
    let mut m = desired_migration(&gvr(), Some(hash), ts(at));
    m.metadata.name = Some(name.into());
    if let Some((type_, reason)) = phase {
        m.status = Some(crate::api::storage_version_migration::StorageVersionMigrationStatus {
            conditions: vec![MigrationCondition {
                type_: type_.into(),
                status: "True".into(),
                reason: Some(reason.into()),
                ..Default::default()
            }],
            ..Default::default()
        });
    }
    m
}
