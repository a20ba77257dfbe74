//! The storage-version trigger (seed 002): keeps one StorageState per resource of the target that publishes a storageVersionHash,
//! and requests a StorageVersionMigration whenever the objects of a resource may be stored in a version other than
//! the current one. It never migrates anything itself: the migrator runs the StorageVersionMigrations it creates.
//!
//! It has two halves, as seed 002's HA extension describes:
//! - the reporter (every replica): every `--discovery-interval` it reads its own target's legacy discovery and
//!   reports each hash into `status.currentStorageVersionHashes` under its reporterID ([`report`], the rules are in
//!   [`super::report`]): new StorageStates start with persisted ["Unknown"], a new hash is appended to persisted;
//! - the decider (the leader only, [`Decider`]): a kube-runtime controller over reflector stores of the
//!   StorageStates and migrations, which decides about a StorageState from the reports ([`decide`]) when it
//!   changes, when a migration of its resource changes, and at its periodic round (the reconcile's requeue, every
//!   interval): it starts a migration when the stored objects may be in another version and the reports agree,
//!   cancels unfinished ones when they diverge, sets persisted = [current] once the latest migration of the
//!   current hash Succeeded, and at start-up resets StorageStates whose heartbeat is older than two intervals to
//!   persisted ["Unknown"] (changes may have been missed).
//!
//! With one replica (the embedded store) this is the KEP's original trigger: the change is acted on at the poll
//! that sees it.
//!
//! Starting a migration supersedes any unfinished one of the same resource (Failed, reason `Superseded`) instead of
//! deleting it; finished migrations beyond `--migration-history` per resource are deleted, oldest first.
//!
//! The decisions are pure functions ([`decide`], [`to_supersede`], [`to_prune`], [`migratable_resources`]); the rest
//! is I/O. Requests to the target go through a Kubernetes client (a cluster, or this server in-process); our own
//! objects go through [`OwnObjects`] (`kube::Api`s over this server's in-process client, or a remote one in the
//! `migrate` command): API requests like any client's.

use crate::scheduler::trigger_kit::*;

mod reporter;
pub use reporter::*;
mod decisions;
pub use decisions::*;
mod trigger;
pub use trigger::*;

#[cfg(test)]
mod tests;
